//! The certificate and token controllers of `ferrok server`, driven with
//! kubectl, openssl and `ferrok token` as a user drives them: CSRs signed
//! once approved (the certificate then authenticates as its subject),
//! kubelet client CSRs approved after a SubjectAccessReview, CSRs a signer
//! refuses marked Failed, finished CSRs cleaned up; legacy service-account
//! token Secrets filled (the token then authenticates until the Secret
//! goes); kube-public/cluster-info signed with each bootstrap token that
//! may sign; expired bootstrap tokens deleted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::{create, eventually, kubectl, ApiServer};
use serde_json::{json, Value};

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(data: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(data.trim()).expect("base64")
}

fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A P-256 key `<name>.key` and a request `<name>.csr` for `subject`.
fn request(dir: &Path, name: &str, subject: &str, sans: Option<&str>) -> String {
    let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
    let mut args = vec!["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    args.extend(["-keyout", &key, "-subj", subject, "-out", &csr]);
    let san = sans.map(|s| format!("subjectAltName={s}"));
    if let Some(san) = &san {
        args.extend(["-addext", san]);
    }
    openssl(dir, &args);
    std::fs::read_to_string(dir.join(csr)).expect("csr")
}

fn csr_manifest(name: &str, signer: &str, usages: &[&str], expiration: Option<i64>, pem: &str) -> String {
    let mut spec = json!({"request": b64(pem.as_bytes()), "signerName": signer, "usages": usages});
    if let Some(seconds) = expiration {
        spec["expirationSeconds"] = json!(seconds);
    }
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
           "metadata": {"name": name}, "spec": spec})
    .to_string()
}

fn get_json(s: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend(args);
    all.extend(["-o", "json"]);
    let (ok, out) = kubectl(s, &all);
    ok.then(|| serde_json::from_str(&out).expect("json"))
}

fn csr(s: &ApiServer, name: &str) -> Value {
    get_json(s, &["csr", name]).unwrap_or_else(|| panic!("csr {name} is gone"))
}

fn condition<'a>(csr: &'a Value, type_: &str) -> Option<&'a Value> {
    csr["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Waits for the request's certificate, PEM.
fn issued(s: &ApiServer, name: &str) -> String {
    let mut pem = String::new();
    eventually(&format!("a certificate for {name}"), || {
        match csr(s, name)["status"]["certificate"].as_str() {
            Some(c) => pem = String::from_utf8(unb64(c)).expect("utf-8"),
            None => return false,
        }
        true
    });
    pem
}

fn ca_file(s: &ApiServer) -> PathBuf {
    s.dir.path().join("server").join("tls").join("server-ca.crt")
}

/// A kubeconfig for `s` whose user is what `credentials` give
/// (`kubectl config set-credentials` flags).
fn kubeconfig(s: &ApiServer, file: &str, credentials: &[&str]) -> PathBuf {
    let path = s.dir.path().join(file);
    let run = |args: &[&str]| {
        let out = Command::new("kubectl").arg("--kubeconfig").arg(&path).args(args).output().expect("kubectl");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let server = format!("--server=https://127.0.0.1:{}", s.port);
    let ca = format!("--certificate-authority={}", ca_file(s).display());
    run(&["config", "set-cluster", "c", &server, &ca, "--embed-certs"]);
    let mut set = vec!["config", "set-credentials", "u"];
    set.extend(credentials);
    run(&set);
    run(&["config", "set-context", "c", "--cluster=c", "--user=u"]);
    run(&["config", "use-context", "c"]);
    path
}

/// `kubectl auth whoami` through `config`: the user name and groups, or
/// the error.
fn whoami(s: &ApiServer, config: &Path) -> Result<(String, Vec<String>), String> {
    let out = Command::new("kubectl")
        .env("HOME", s.dir.path())
        .arg("--kubeconfig")
        .arg(config)
        .args(["auth", "whoami", "-o", "json"])
        .output()
        .expect("kubectl");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let review: Value = serde_json::from_slice(&out.stdout).expect("json");
    let info = &review["status"]["userInfo"];
    let groups = info["groups"].as_array().map(|g| g.iter().filter_map(|x| x.as_str().map(str::to_string)).collect());
    Ok((info["username"].as_str().unwrap_or_default().to_string(), groups.unwrap_or_default()))
}

/// The certificate's notAfter, in Unix seconds.
fn not_after(dir: &Path, pem: &str) -> i64 {
    std::fs::write(dir.join("cert.pem"), pem).expect("write");
    let end = openssl(dir, &["x509", "-in", "cert.pem", "-noout", "-enddate"]);
    let when = end.trim().trim_start_matches("notAfter=");
    let out = Command::new("date").args(["-u", "-d", when, "+%s"]).output().expect("date");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("seconds")
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64
}

fn today() -> String {
    let out = Command::new("date").args(["-u", "+%F"]).output().expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn an_approved_client_request_is_signed_and_its_certificate_authenticates() {
    let s = ApiServer::start();
    let dir = s.dir.path();
    let pem = request(dir, "alice", "/O=team-a/O=team-b/CN=alice", None);
    create(&s, &csr_manifest("alice", "kubernetes.io/kube-apiserver-client", &["client auth"], Some(3600), &pem));
    let (ok, out) = kubectl(&s, &["certificate", "approve", "alice"]);
    assert!(ok, "{out}");
    let cert = issued(&s, "alice");
    assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
    let (_, row) = kubectl(&s, &["get", "csr", "alice", "--no-headers"]);
    assert!(row.contains("Approved,Issued"), "{row}");

    // expirationSeconds: an hour from the signing (short lives are not
    // shortened by the five minutes of backdating).
    let end = not_after(dir, &cert);
    assert!((end - (now() + 3600)).abs() < 120, "notAfter {end}, expected about {}", now() + 3600);
    // Signed by the CA the API server trusts for clients.
    openssl(dir, &["verify", "-CAfile", "server/tls/client-ca.crt", "cert.pem"]);

    // The certificate and its key are alice, in both her groups.
    std::fs::write(dir.join("alice.crt"), &cert).expect("write");
    let config = kubeconfig(
        &s,
        "alice.yaml",
        &[
            &format!("--client-certificate={}", dir.join("alice.crt").display()),
            &format!("--client-key={}", dir.join("alice.key").display()),
        ],
    );
    let (user, groups) = whoami(&s, &config).expect("alice authenticates");
    assert_eq!(user, "alice");
    for g in ["team-a", "team-b", "system:authenticated"] {
        assert!(groups.iter().any(|x| x == g), "{g} missing from {groups:?}");
    }

    // Without expirationSeconds: the signing duration (a year, less the backdating).
    let pem = request(dir, "bob", "/CN=bob", None);
    create(&s, &csr_manifest("bob", "kubernetes.io/kube-apiserver-client", &["client auth"], None, &pem));
    assert!(kubectl(&s, &["certificate", "approve", "bob"]).0);
    let end = not_after(dir, &issued(&s, "bob"));
    let year = now() + 365 * 24 * 3600 - 300;
    assert!((end - year).abs() < 120, "notAfter {end}, expected about {year}");
}

#[test]
fn a_request_its_signer_refuses_fails() {
    let s = ApiServer::start();
    let dir = s.dir.path();
    let pem = request(dir, "server", "/CN=web", None);
    let manifest = csr_manifest("wrong-usages", "kubernetes.io/kube-apiserver-client", &["server auth"], None, &pem);
    create(&s, &manifest);
    // A kubelet client request for a user that is not a node.
    let pem = request(dir, "notnode", "/O=system:nodes/CN=carol", None);
    let usages = ["digital signature", "client auth"];
    create(&s, &csr_manifest("not-a-node", "kubernetes.io/kube-apiserver-client-kubelet", &usages, None, &pem));
    // Signing is not approving: nothing happens before approval.
    assert!(condition(&csr(&s, "wrong-usages"), "Failed").is_none());
    assert!(kubectl(&s, &["certificate", "approve", "wrong-usages", "not-a-node"]).0);
    for (name, message) in [
        ("wrong-usages", "invalid usage for client certificate: server auth"),
        ("not-a-node", "subject common name does not begin with system:node:"),
    ] {
        eventually(&format!("{name} to fail"), || condition(&csr(&s, name), "Failed").is_some());
        let c = csr(&s, name);
        let failed = condition(&c, "Failed").expect("failed");
        assert_eq!(failed["status"], "True");
        assert_eq!(failed["reason"], "SignerValidationFailure");
        assert_eq!(failed["message"], message);
        assert!(c["status"].get("certificate").is_none(), "{c}");
        let (_, row) = kubectl(&s, &["get", "csr", name, "--no-headers"]);
        assert!(row.contains("Approved,Failed"), "{row}");
    }
}

#[test]
fn kubelet_client_requests_are_approved_after_a_subject_access_review() {
    let s = ApiServer::start();
    let dir = s.dir.path();
    // As kubeadm grants them: nodes renew their own certificates, new nodes
    // (bootstrap token users) ask for theirs.
    let role = |name: &str, sub: &str| {
        format!(
            r#"{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{{"name":"{name}"}},
                "rules":[{{"apiGroups":["certificates.k8s.io"],"resources":["certificatesigningrequests/{sub}"],"verbs":["create"]}}]}}"#
        )
    };
    create(&s, &role("test:selfnodeclient", "selfnodeclient"));
    create(&s, &role("test:nodeclient", "nodeclient"));
    for (binding, role, group) in [
        ("test:renewal", "test:selfnodeclient", "system:nodes"),
        ("test:new-nodes", "test:nodeclient", "system:bootstrappers"),
    ] {
        let (ok, out) = kubectl(
            &s,
            &["create", "clusterrolebinding", binding, &format!("--clusterrole={role}"), &format!("--group={group}")],
        );
        assert!(ok, "{out}");
    }
    let usages = ["digital signature", "client auth"];

    // A node renewing its own client certificate.
    let pem = request(dir, "edge-1", "/O=system:nodes/CN=system:node:edge-1", None);
    let manifest = csr_manifest("renewal", "kubernetes.io/kube-apiserver-client-kubelet", &usages, None, &pem);
    std::fs::write(dir.join("renewal.json"), manifest).expect("write");
    let (ok, out) = kubectl(
        &s,
        &[
            "create",
            "-f",
            &dir.join("renewal.json").display().to_string(),
            "--as=system:node:edge-1",
            "--as-group=system:nodes",
        ],
    );
    assert!(ok, "{out}");
    let cert = issued(&s, "renewal");
    let c = csr(&s, "renewal");
    assert_eq!(c["spec"]["username"], "system:node:edge-1");
    let approved = condition(&c, "Approved").expect("approved");
    assert_eq!(approved["reason"], "AutoApproved");
    assert_eq!(approved["message"], "Auto approving self kubelet client certificate after SubjectAccessReview.");
    std::fs::write(dir.join("edge-1.crt"), &cert).expect("write");
    let config = kubeconfig(
        &s,
        "edge-1.yaml",
        &[
            &format!("--client-certificate={}", dir.join("edge-1.crt").display()),
            &format!("--client-key={}", dir.join("edge-1.key").display()),
        ],
    );
    let (user, groups) = whoami(&s, &config).expect("the node authenticates");
    assert_eq!(user, "system:node:edge-1");
    assert!(groups.iter().any(|g| g == "system:nodes"), "{groups:?}");

    // A new node, with a bootstrap token.
    let token = "abcdef.0123456789abcdef";
    let out = Command::new(common::ferrok_bin())
        .args(["token", "create", token, "--data-dir"])
        .arg(dir)
        .args(["--server", &format!("https://127.0.0.1:{}", s.port)])
        .output()
        .expect("ferrok token");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config = kubeconfig(&s, "bootstrap.yaml", &[&format!("--token={token}")]);
    let pem = request(dir, "edge-2", "/O=system:nodes/CN=system:node:edge-2", None);
    let manifest = csr_manifest("new-node", "kubernetes.io/kube-apiserver-client-kubelet", &usages, None, &pem);
    std::fs::write(dir.join("new-node.json"), manifest).expect("write");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&config)
        .args(["create", "-f"])
        .arg(dir.join("new-node.json"))
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    issued(&s, "new-node");
    let c = csr(&s, "new-node");
    assert_eq!(c["spec"]["username"], "system:bootstrap:abcdef");
    let approved = condition(&c, "Approved").expect("approved");
    assert_eq!(approved["message"], "Auto approving kubelet client certificate after SubjectAccessReview.");
}

#[test]
fn finished_requests_are_cleaned_up() {
    let s = ApiServer::start();
    let dir = s.dir.path();
    let pem = request(dir, "r", "/CN=r", None);
    for name in ["denied-now", "denied-long-ago"] {
        create(&s, &csr_manifest(name, "example.com/signer", &["client auth"], None, &pem));
    }
    let deny = |name: &str, seconds_ago: i64| {
        let mut c = csr(&s, name);
        let at = Command::new("date")
            .args(["-u", "-d", &format!("@{}", now() - seconds_ago), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .expect("date");
        let at = String::from_utf8_lossy(&at.stdout).trim().to_string();
        c["status"] = json!({"conditions": [{"type": "Denied", "status": "True", "reason": "Test",
                                              "message": "no", "lastUpdateTime": at}]});
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, c.to_string()).expect("write");
        let path = format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/approval");
        let (ok, out) = kubectl(&s, &["replace", "--raw", &path, "-f", &file.display().to_string()]);
        assert!(ok, "{out}");
    };
    deny("denied-now", 0);
    // Denied two hours ago: past the hour denied requests are kept.
    deny("denied-long-ago", 2 * 3600);
    eventually("the old denied request to go", || get_json(&s, &["csr", "denied-long-ago"]).is_none());
    assert!(get_json(&s, &["csr", "denied-now"]).is_some(), "a request denied a moment ago is kept");
}

#[test]
fn legacy_token_secrets_are_filled_and_authenticate_while_they_exist() {
    let s = ApiServer::start();
    assert!(kubectl(&s, &["create", "namespace", "legacy"]).0);
    assert!(kubectl(&s, &["create", "serviceaccount", "builder", "-n", "legacy"]).0);
    let token_secret = |name: &str, account: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
               "metadata": {"name": name, "namespace": "legacy",
                            "annotations": {"kubernetes.io/service-account.name": account}}})
        .to_string()
    };
    create(&s, &token_secret("builder-token", "builder"));
    let mut secret = Value::Null;
    eventually("the token", || {
        secret = get_json(&s, &["secret", "builder-token", "-n", "legacy"]).expect("secret");
        secret["data"]["token"].is_string()
    });
    let data = &secret["data"];
    assert_eq!(unb64(data["namespace"].as_str().expect("namespace")), b"legacy");
    assert_eq!(unb64(data["ca.crt"].as_str().expect("ca.crt")), std::fs::read(ca_file(&s)).expect("ca"));
    let sa = get_json(&s, &["sa", "builder", "-n", "legacy"]).expect("sa");
    assert_eq!(secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"], sa["metadata"]["uid"]);
    let token = String::from_utf8(unb64(data["token"].as_str().expect("token"))).expect("utf-8");
    // A legacy token: its issuer, the Secret named, no expiry.
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).expect("payload"))
            .expect("b64"),
    )
    .expect("claims");
    assert_eq!(claims["iss"], "kubernetes/serviceaccount");
    assert_eq!(claims["kubernetes.io/serviceaccount/secret.name"], "builder-token");
    assert_eq!(claims["sub"], "system:serviceaccount:legacy:builder");
    assert!(claims.get("exp").is_none(), "{claims}");

    let config = kubeconfig(&s, "builder.yaml", &[&format!("--token={token}")]);
    let (user, groups) = whoami(&s, &config).expect("the token authenticates");
    assert_eq!(user, "system:serviceaccount:legacy:builder");
    assert!(groups.iter().any(|g| g == "system:serviceaccounts:legacy"), "{groups:?}");
    // The use is recorded, by date, on the Secret; and since when uses are.
    eventually("the last-used label", || {
        let secret = get_json(&s, &["secret", "builder-token", "-n", "legacy"]).expect("secret");
        secret["metadata"]["labels"]["kubernetes.io/legacy-token-last-used"] == today().as_str()
    });
    let tracking = get_json(&s, &["cm", "kube-apiserver-legacy-service-account-token-tracking", "-n", "kube-system"])
        .expect("the tracking ConfigMap");
    assert_eq!(tracking["data"]["since"], today().as_str());

    // Deleting the Secret revokes the token.
    assert!(kubectl(&s, &["delete", "secret", "builder-token", "-n", "legacy"]).0);
    let refused = whoami(&s, &config).expect_err("a deleted token is refused");
    assert!(refused.contains("Unauthorized") || refused.contains("logged in"), "{refused}");

    // A token for an account that does not exist is deleted; deleting an
    // account deletes its tokens.
    create(&s, &token_secret("ghost-token", "ghost"));
    create(&s, &token_secret("builder-token-2", "builder"));
    eventually("builder's second token", || {
        get_json(&s, &["secret", "builder-token-2", "-n", "legacy"]).is_some_and(|s| s["data"]["token"].is_string())
    });
    eventually("the ghost's token to go", || get_json(&s, &["secret", "ghost-token", "-n", "legacy"]).is_none());
    assert!(kubectl(&s, &["delete", "serviceaccount", "builder", "-n", "legacy"]).0);
    eventually("builder's token to go", || get_json(&s, &["secret", "builder-token-2", "-n", "legacy"]).is_none());
}

/// `ferrok token <args>` against `s`.
fn ferrok_token(s: &ApiServer, args: &[&str]) {
    let out = Command::new(common::ferrok_bin())
        .arg("token")
        .args(args)
        .arg("--data-dir")
        .arg(s.dir.path())
        .args(["--server", &format!("https://127.0.0.1:{}", s.port)])
        .output()
        .expect("ferrok token");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn cluster_info_is_signed_with_each_signing_bootstrap_token() {
    let s = ApiServer::start();
    let cluster_info = || get_json(&s, &["cm", "cluster-info", "-n", "kube-public"]).expect("cluster-info");
    // The kubeconfig kubeadm publishes: this server and its CA, no user.
    eventually("cluster-info", || get_json(&s, &["cm", "cluster-info", "-n", "kube-public"]).is_some());
    let content = cluster_info()["data"]["kubeconfig"].as_str().expect("kubeconfig").to_string();
    assert!(content.contains(&format!(":{}\n", s.port)), "{content}");
    let ca = b64(&std::fs::read(ca_file(&s)).expect("ca"));
    assert!(content.contains(&format!("certificate-authority-data: {ca}\n")), "{content}");

    ferrok_token(&s, &["create", "aaaaaa.0123456789aaaaaa", "--usages", "authentication"]);
    ferrok_token(&s, &["create", "abcdef.0123456789abcdef"]);
    let key = "jws-kubeconfig-abcdef";
    eventually("the token's signature", || cluster_info()["data"][key].is_string());
    let data = cluster_info()["data"].clone();
    assert!(data.get("jws-kubeconfig-aaaaaa").is_none(), "a token without signing usage signed: {data}");
    // A detached HS256 JWS of the kubeconfig keyed by the token secret.
    let sig = data[key].as_str().expect("signature");
    let (header, signature) = sig.split_once("..").expect("detached");
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header_json: Value = serde_json::from_slice(&url.decode(header).expect("b64")).expect("header");
    assert_eq!(header_json, json!({"alg": "HS256", "kid": "abcdef"}));
    let input = format!("{header}.{}", url.encode(data["kubeconfig"].as_str().expect("kubeconfig")));
    let hmac_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"0123456789abcdef");
    ring::hmac::verify(&hmac_key, input.as_bytes(), &url.decode(signature).expect("b64"))
        .expect("the signature checks");

    // The token's deletion takes its signature away.
    ferrok_token(&s, &["delete", "abcdef"]);
    eventually("the signature to go", || cluster_info()["data"].get(key).is_none());
}

#[test]
fn expired_bootstrap_tokens_are_deleted() {
    let s = ApiServer::start();
    ferrok_token(&s, &["create", "forevr.0123456789abcdef", "--ttl", "0"]);
    ferrok_token(&s, &["create", "brief0.0123456789abcdef", "--ttl", "3s"]);
    let past = json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
                      "metadata": {"name": "bootstrap-token-past00", "namespace": "kube-system"},
                      "stringData": {"token-id": "past00", "token-secret": "0123456789abcdef",
                                     "expiration": "2020-01-01T00:00:00Z", "usage-bootstrap-authentication": "true"}});
    create(&s, &past.to_string());
    let gone = |name: &str| get_json(&s, &["secret", name, "-n", "kube-system"]).is_none();
    eventually("the long-expired token to go", || gone("bootstrap-token-past00"));
    eventually("the brief token to go when it expires", || gone("bootstrap-token-brief0"));
    assert!(!gone("bootstrap-token-forevr"), "a token without expiration is kept");
}

#[test]
fn requests_are_checked_and_approval_and_issuance_stay_apart() {
    let s = ApiServer::start();
    let dir = s.dir.path();
    // Not a request: refused at create.
    let bogus = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                       "metadata": {"name": "bogus"},
                       "spec": {"request": "eA==", "signerName": "example.com/s", "usages": ["client auth"]}});
    std::fs::write(dir.join("bogus.json"), bogus.to_string()).expect("write");
    let (ok, out) = kubectl(&s, &["create", "-f", &dir.join("bogus.json").display().to_string()]);
    assert!(!ok && out.contains("spec.request") && out.contains("CERTIFICATE REQUEST"), "{out}");
    // No client certificate for system:masters through the API.
    let pem = request(dir, "root", "/O=system:masters/CN=mallory", None);
    let manifest = csr_manifest("masters", "kubernetes.io/kube-apiserver-client", &["client auth"], None, &pem);
    std::fs::write(dir.join("masters.json"), manifest).expect("write");
    let (ok, out) = kubectl(&s, &["create", "-f", &dir.join("masters.json").display().to_string()]);
    assert!(
        !ok && out
            .contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"),
        "{out}"
    );
    let pem = request(dir, "short", "/CN=short", None);
    let manifest = csr_manifest("short", "example.com/s", &["client auth"], Some(60), &pem);
    std::fs::write(dir.join("short.json"), manifest).expect("write");
    let (ok, out) = kubectl(&s, &["create", "-f", &dir.join("short.json").display().to_string()]);
    assert!(!ok && out.contains("may not specify a duration less than 600 seconds"), "{out}");

    // Approving needs `approve` on the signer, besides the approval subresource.
    let pem = request(dir, "dave", "/CN=dave", None);
    create(&s, &csr_manifest("dave", "example.com/dave-signer", &["client auth"], None, &pem));
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "approver"},
                      "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list"]},
                                {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update"]}]});
    create(&s, &role.to_string());
    assert!(kubectl(&s, &["create", "clusterrolebinding", "approver", "--clusterrole=approver", "--user=dave"]).0);
    let (ok, out) = kubectl(&s, &["certificate", "approve", "dave", "--as=dave"]);
    assert!(
        !ok && out.contains("user not permitted to approve requests with signerName \"example.com/dave-signer\""),
        "{out}"
    );
    let signers = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "signer-approver"},
                         "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["example.com/*"], "verbs": ["approve"]}]});
    create(&s, &signers.to_string());
    assert!(
        kubectl(
            &s,
            &["create", "clusterrolebinding", "signer-approver", "--clusterrole=signer-approver", "--user=dave"]
        )
        .0
    );
    let (ok, out) = kubectl(&s, &["certificate", "approve", "dave", "--as=dave"]);
    assert!(ok, "{out}");
    let c = csr(&s, "dave");
    let approved = condition(&c, "Approved").expect("approved");
    assert!(approved["lastUpdateTime"].is_string() && approved["lastTransitionTime"].is_string(), "{approved}");

    // status neither approves nor takes approval away; a certificate, once
    // there, stays.
    let put_status = |body: &Value| {
        let file = dir.join("status.json");
        std::fs::write(&file, body.to_string()).expect("write");
        let path = "/apis/certificates.k8s.io/v1/certificatesigningrequests/dave/status";
        kubectl(&s, &["replace", "--raw", path, "-f", &file.display().to_string()])
    };
    let mut pending = csr(&s, "dave");
    pending["status"]["conditions"] = json!([]);
    let (ok, out) = put_status(&pending);
    assert!(!ok && out.contains("updates may not remove a condition of type \"Approved\""), "{out}");
    let ca = std::fs::read_to_string(ca_file(&s)).expect("ca");
    let mut issued = csr(&s, "dave");
    issued["status"]["certificate"] = json!(b64(ca.as_bytes()));
    let (ok, out) = put_status(&issued);
    assert!(ok, "{out}");
    let mut reissued = csr(&s, "dave");
    reissued["status"]["certificate"] =
        json!(b64(std::fs::read(dir.join("server/tls/client-ca.crt")).expect("ca").as_slice()));
    let (ok, out) = put_status(&reissued);
    assert!(!ok && out.contains("updates may not modify existing certificate content"), "{out}");
}
