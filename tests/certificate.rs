//! `ferrok certificate check|rotate` on a real server's data dir: every
//! certificate listed with its expiry, an expired one failing the check,
//! rotated leaves backed up and issued anew at the next start, with the
//! CAs (and so the clients' trust) unchanged.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::ApiServer;

fn certificate(data: &Path, args: &[&str]) -> Output {
    Command::new(common::ferrok_bin())
        .arg("certificate")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("ferrok certificate")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The line of `check` for `file`.
fn line(table: &str, file: &str) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(file))
        .unwrap_or_else(|| panic!("no line for {file} in\n{table}"))
        .to_string()
}

/// A client certificate for `cn` valid from 2020 until `not_after`.
fn certificate_until(cn: &str, not_after: time::OffsetDateTime) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = not_after;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.self_signed(&key).expect("self-signed").pem()
}

#[test]
fn check_lists_expiry_and_rotate_issues_new_leaves() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    let tls = data.join("server").join("tls");

    let out = certificate(&data, &["check"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("FILENAME"), "{table}");
    let ca = line(&table, "server/tls/server-ca.crt");
    assert!(ca.contains("CN=ferrok-server-ca@") && ca.contains("CertSign") && ca.ends_with("OK"), "{ca}");
    let admin = line(&table, "server/tls/client-admin.crt");
    assert!(admin.contains("CN=system:admin,O=system:masters") && admin.contains("ClientAuth"), "{admin}");
    // Issued a moment ago for 365 days (the residual time is floored).
    assert!((admin.contains(" 364d ") || admin.contains(" 365d ")) && admin.ends_with("OK"), "{admin}");
    let serving = line(&table, "server/tls/serving-kube-apiserver.crt");
    assert!(serving.contains("ServerAuth") && serving.ends_with("OK"), "{serving}");

    // One certificate near expiry, one expired: a warning, and a failed check.
    let soon = certificate_until(
        "soon",
        time::OffsetDateTime::now_utc() + time::Duration::days(30) - time::Duration::hours(1),
    );
    std::fs::write(tls.join("extra-soon.crt"), soon).expect("write");
    let out = certificate(&data, &["check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let l = line(&stdout(&out), "server/tls/extra-soon.crt");
    assert!(l.contains(" 29d ") && l.ends_with("WARNING: renewed at the next start"), "{l}");
    std::fs::write(tls.join("extra-gone.crt"), certificate_until("gone", rcgen::date_time_ymd(2021, 1, 1)))
        .expect("write");
    let out = certificate(&data, &["check"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let l = line(&stdout(&out), "server/tls/extra-gone.crt");
    assert!(l.contains("expired") && l.ends_with("EXPIRED"), "{l}");
    assert_eq!(stderr(&out).trim(), "error: 1 certificate(s) have expired; see above");
    for f in ["extra-soon.crt", "extra-gone.crt"] {
        std::fs::remove_file(tls.join(f)).expect("rm");
    }

    // Rotation: the leaves move to a backup, the CAs stay.
    let old_admin = std::fs::read_to_string(tls.join("client-admin.crt")).expect("admin cert");
    let old_serving = std::fs::read_to_string(tls.join("serving-kube-apiserver.crt")).expect("serving cert");
    let old_ca = std::fs::read_to_string(tls.join("server-ca.crt")).expect("ca");
    let (dir, port) = server.stop();
    let out = certificate(dir.path(), &["rotate", "--service", "admin,api-server"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("restart ferrok"), "{}", stdout(&out));
    assert!(!tls.join("client-admin.crt").exists() && !tls.join("client-admin.key").exists());
    assert!(!tls.join("serving-kube-apiserver.crt").exists());
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("tls-backup-"))
        .collect();
    assert_eq!(backups.len(), 1);
    let kept = std::fs::read_to_string(backups[0].path().join("server/tls/client-admin.crt")).expect("backup");
    assert_eq!(kept, old_admin);

    // The next start issues new leaves from the same CAs; kubectl works with them.
    let server = ApiServer::start_in(dir, port);
    let new_admin = std::fs::read_to_string(tls.join("client-admin.crt")).expect("admin cert");
    assert_ne!(new_admin, old_admin);
    assert_ne!(std::fs::read_to_string(tls.join("serving-kube-apiserver.crt")).expect("serving"), old_serving);
    assert_eq!(std::fs::read_to_string(tls.join("server-ca.crt")).expect("ca"), old_ca);
    let (ok, out) = common::kubectl(&server, &["get", "namespace", "default", "-o", "name"]);
    assert!(ok, "{out}");
    assert!(certificate(&data, &["check"]).status.success());

    // Bad input: one line each, naming what is wrong.
    let out = certificate(&data, &["rotate", "--service", "etcd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'etcd'") && stderr(&out).contains("--service"), "{}", stderr(&out));
    let empty = tempfile::tempdir().expect("tempdir");
    let out = certificate(empty.path(), &["check"]);
    assert!(!out.status.success());
    assert!(stderr(&out).trim().starts_with("error: --data-dir: no certificates in"), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim().lines().count(), 1);
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", stderr(&out));
}

/// A new self-signed EC CA `<name>.crt`/`<name>.key` in `dir`.
fn openssl_ca(dir: &Path, name: &str, cn: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "365",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn kubectl_with(kubeconfig: &Path) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "namespace", "default", "-o", "name"])
        .output()
        .expect("kubectl")
}

/// `curl` of /readyz trusting only the CAs of `ca_file`.
fn curl_ok(port: u16, ca_file: &Path) -> bool {
    Command::new("curl")
        .args(["-sf", "--cacert"])
        .arg(ca_file)
        .arg(format!("https://127.0.0.1:{port}/cacerts"))
        .output()
        .expect("curl")
        .status
        .success()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn rotate_ca_keeps_the_old_trust_unless_forced() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    let tls = data.join("server").join("tls");
    let keep = tempfile::tempdir().expect("tempdir");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let old_kubeconfig = keep.path().join("old-kubeconfig.yaml");
    std::fs::copy(server.kubeconfig(), &old_kubeconfig).expect("copy kubeconfig");
    let root_ca = keep.path().join("root-ca.crt");
    std::fs::copy(tls.join("server-ca.crt"), &root_ca).expect("copy CA");
    let old_token = read(&data.join("server/token")).trim().to_string();
    let secret = old_token.rsplit(':').next().expect("secret").to_string();
    assert_eq!(old_token, format!("K10{}::server:{secret}", sha256_hex(read(&root_ca).as_bytes())));

    // Bad input changes nothing.
    let out = certificate(&data, &["rotate-ca", "--path", "/nonexistent/ca"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).trim(), "error: --path: /nonexistent/ca is not a folder");
    let stranger = tempfile::tempdir().expect("tempdir");
    openssl_ca(stranger.path(), "server-ca", "someone-else");
    let port_flag = format!("https://127.0.0.1:{}", server.port);
    let rotate_ca = |extra: &[&str]| {
        let mut args = vec!["rotate-ca", "--server", port_flag.as_str()];
        args.extend_from_slice(extra);
        certificate(&data, &args)
    };
    let stranger_path = stranger.path().to_str().expect("path").to_string();
    let out = rotate_ca(&["--path", &stranger_path]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("server-ca.crt: the new CA is neither signed nor cross-signed by the current CA"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(read(&tls.join("server-ca.crt")), read(&root_ca));

    // A new server CA made with openssl and cross-signed by the current one.
    let new = tempfile::tempdir().expect("tempdir");
    openssl_ca(new.path(), "new", "edge-server-ca-2");
    std::fs::write(
        new.path().join("ca.ext"),
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )
    .expect("ext");
    openssl(new.path(), &["req", "-new", "-key", "new.key", "-subj", "/CN=edge-server-ca-2", "-out", "new.csr"]);
    let (old_crt, old_key) = (tls.join("server-ca.crt"), tls.join("server-ca.key"));
    openssl(
        new.path(),
        &[
            "x509",
            "-req",
            "-in",
            "new.csr",
            "-CA",
            old_crt.to_str().unwrap(),
            "-CAkey",
            old_key.to_str().unwrap(),
            "-CAcreateserial",
            "-days",
            "365",
            "-extfile",
            "ca.ext",
            "-out",
            "cross.crt",
        ],
    );
    let staged = new.path().join("staged");
    std::fs::create_dir(&staged).expect("mkdir");
    std::fs::write(
        staged.join("server-ca.crt"),
        read(&new.path().join("new.crt")) + &read(&new.path().join("cross.crt")),
    )
    .expect("write");
    std::fs::copy(new.path().join("new.key"), staged.join("server-ca.key")).expect("copy key");
    let out = rotate_ca(&["--path", staged.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("server-ca.crt: written"), "{}", stdout(&out));
    assert!(stderr(&out).contains("Restart every server, then every agent"), "{}", stderr(&out));
    let bundle = read(&tls.join("server-ca.crt"));
    assert!(bundle.ends_with(&read(&root_ca)), "the old CA closes the new bundle");
    // Until restarted, the server keeps serving with its old certificates.
    assert!(kubectl_with(&old_kubeconfig).status.success());

    // After a restart: leaves from the new CA, sent with the cross-signed
    // certificate; clients that trust only the old CA, or only the new
    // one, both reach the server; the old admin certificate still works.
    let (dir, port) = server.stop();
    let server = ApiServer::start_in(dir, port);
    let serving = read(&tls.join("serving-kube-apiserver.crt"));
    assert_eq!(serving.matches("BEGIN CERTIFICATE").count(), 2, "leaf and cross-signed CA:\n{serving}");
    assert!(curl_ok(port, &root_ca), "trusting only the old CA");
    assert!(curl_ok(port, &new.path().join("new.crt")), "trusting only the new CA");
    let out = kubectl_with(&old_kubeconfig);
    assert!(out.status.success(), "the old kubeconfig: {}", stderr(&out));
    assert!(kubectl_with(&server.kubeconfig()).status.success());
    // The join token names the new bundle; its secret is unchanged.
    let token = read(&data.join("server/token")).trim().to_string();
    assert_eq!(token, format!("K10{}::server:{secret}", sha256_hex(bundle.as_bytes())));

    // Again, with CAs the server makes itself (both, cross-signed).
    let out = rotate_ca(&[]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("client-ca.crt: written"), "{}", stdout(&out));
    let (dir, port) = server.stop();
    let server = ApiServer::start_in(dir, port);
    assert!(curl_ok(port, &root_ca), "two rotations later, the first CA still vouches");
    let out = kubectl_with(&old_kubeconfig);
    assert!(out.status.success(), "the first kubeconfig: {}", stderr(&out));
    assert!(kubectl_with(&server.kubeconfig()).status.success());

    // Forced to an unrelated CA: the old trust is gone, the new kubeconfig works.
    let out = rotate_ca(&["--path", &stranger_path, "--force"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("nodes must join again"), "{}", stderr(&out));
    let (dir, port) = server.stop();
    let server = ApiServer::start_in(dir, port);
    assert!(!curl_ok(port, &root_ca), "a forced rotation breaks the old trust");
    assert!(curl_ok(port, &stranger.path().join("server-ca.crt")));
    assert!(!kubectl_with(&old_kubeconfig).status.success());
    assert!(kubectl_with(&server.kubeconfig()).status.success());
    let token = read(&data.join("server/token")).trim().to_string();
    assert_eq!(token, format!("K10{}::server:{secret}", sha256_hex(read(&tls.join("server-ca.crt")).as_bytes())));
}
