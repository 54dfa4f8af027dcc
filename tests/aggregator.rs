//! The aggregation layer: an APIService backed by a Service is served by
//! another API server. The test runs a small aggregated API server of its
//! own (HTTPS, trusting only client certificates of the request-header CA
//! that `extension-apiserver-authentication` publishes, as a real one
//! does) behind a selector-less Service, and drives the group through
//! ferrok with kubectl: discovery, requests with the caller in the front
//! proxy's headers, RBAC before the proxy, and the APIService's
//! `Available` condition.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use common::{kubectl, ApiServer};
use serde_json::{json, Value};

const GROUP: &str = "wardle.example.com";

/// The host's first global IPv4 address: an endpoint may not be loopback.
fn host_ip() -> IpAddr {
    let out =
        std::process::Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]).output().expect("ip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().nth(3)?.split('/').next()?.parse().ok())
        .expect("a global IPv4 address on this host")
}

/// What the aggregated server saw of each request: path, user, groups.
type Seen = Arc<Mutex<Vec<(String, String, Vec<String>)>>>;

/// A CA and a serving certificate for `name`, as PEM.
fn serving_pair(name: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "wardle-ca");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).expect("leaf");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// Serves the wardle group on `addr` over TLS, taking only clients with a
/// certificate of `client_ca` named `allowed`; answers discovery and a
/// flunder list naming the caller from `X-Remote-User`.
async fn aggregated_server(client_ca: &str, allowed: &str, seen: Seen) -> (SocketAddr, String) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (ca_pem, cert_pem, key_pem) = serving_pair("wardle-api.default.svc");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
        roots.add(c.expect("client CA")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("verifier");
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().expect("chain");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((host_ip(), 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let allowed = allowed.to_string();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            let allowed = allowed.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                // The front proxy's certificate must carry an allowed name.
                let cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first().cloned())
                    .and_then(|c| {
                        use x509_parser::prelude::FromDer;
                        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&c).ok()?;
                        let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
                        Some(cn)
                    })
                    .unwrap_or_default();
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    let trusted = cn == allowed;
                    async move {
                        let header = |n: &str| -> Vec<String> {
                            req.headers()
                                .get_all(n)
                                .iter()
                                .filter_map(|v| v.to_str().ok())
                                .map(str::to_string)
                                .collect()
                        };
                        let user = header("x-remote-user").first().cloned().unwrap_or_default();
                        let groups = header("x-remote-group");
                        let path = req.uri().path().to_string();
                        seen.lock().unwrap().push((path.clone(), user.clone(), groups));
                        let (code, body) = if !trusted {
                            (401, json!({"kind": "Status", "code": 401}))
                        } else if path == format!("/apis/{GROUP}/v1alpha1") {
                            (
                                200,
                                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/v1alpha1"),
                                "resources": [
                                    {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
                                     "verbs": ["get", "list", "create", "delete"], "shortNames": ["fl"]},
                                    {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder",
                                     "verbs": ["get", "update"]}]}),
                            )
                        } else if path.ends_with("/flunders") {
                            (
                                200,
                                json!({"kind": "FlunderList", "apiVersion": format!("{GROUP}/v1alpha1"), "metadata": {},
                                "items": [{"kind": "Flunder", "apiVersion": format!("{GROUP}/v1alpha1"),
                                           "metadata": {"name": format!("seen-by-{user}"), "namespace": "default"}}]}),
                            )
                        } else {
                            (404, json!({"kind": "Status", "code": 404}))
                        };
                        let resp = hyper::Response::builder()
                            .status(code)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(axum::body::Bytes::from(body.to_string())))
                            .expect("response");
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, ca_pem)
}

fn ok(s: &ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?}: {out}");
    out
}

fn apply_json(s: &ApiServer, v: &Value) {
    common::apply(s, &v.to_string());
}

fn available(s: &ApiServer, name: &str) -> (String, String) {
    let out = kubectl(
        s,
        &["get", "apiservice", name, "-o", "jsonpath={.status.conditions[?(@.type==\"Available\")].status} {.status.conditions[?(@.type==\"Available\")].reason}"],
    )
    .1;
    let mut parts = out.split_whitespace();
    (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_apiservice_with_a_service_is_served_by_the_other_server() {
    let s = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    // What every aggregated server reads first: whom to trust for the user headers.
    let raw = ok(&s, &["get", "configmap", "-n", "kube-system", "extension-apiserver-authentication", "-o", "json"]);
    let cm: Value = serde_json::from_str(&raw).expect("configmap");
    let client_ca =
        cm["data"]["requestheader-client-ca-file"].as_str().expect("requestheader-client-ca-file").to_string();
    let allowed: Vec<String> =
        serde_json::from_str(cm["data"]["requestheader-allowed-names"].as_str().expect("allowed names")).expect("json");
    assert_eq!(allowed, ["system:auth-proxy"]);
    for (key, want) in [
        ("requestheader-username-headers", json!(["X-Remote-User"])),
        ("requestheader-group-headers", json!(["X-Remote-Group"])),
        ("requestheader-extra-headers-prefix", json!(["X-Remote-Extra-"])),
    ] {
        let got: Value = serde_json::from_str(cm["data"][key].as_str().expect(key)).expect("json");
        assert_eq!(got, want, "{key}");
    }

    let seen: Seen = Arc::default();
    let (addr, ca_pem) = aggregated_server(&client_ca, &allowed[0], seen.clone()).await;
    apply_json(
        &s,
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "wardle-api", "namespace": "default"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": addr.port()}]}}),
    );
    apply_json(
        &s,
        &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "wardle-api-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "wardle-api"}},
                "addressType": "IPv4", "ports": [{"name": "https", "port": addr.port(), "protocol": "TCP"}],
                "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}]}),
    );
    use base64::Engine;
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca_pem);
    apply_json(
        &s,
        &json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": format!("v1alpha1.{GROUP}")},
                "spec": {"group": GROUP, "version": "v1alpha1", "caBundle": bundle, "groupPriorityMinimum": 2000, "versionPriority": 200,
                         "service": {"namespace": "default", "name": "wardle-api", "port": 443}}}),
    );

    // A request through ferrok reaches the other server as its caller.
    let path = format!("/apis/{GROUP}/v1alpha1/namespaces/default/flunders");
    common::eventually("the aggregated group answers", || kubectl(&s, &["get", "--raw", &path]).0);
    let list: Value = serde_json::from_str(&ok(&s, &["get", "--raw", &path])).expect("list");
    assert_eq!(list["items"][0]["metadata"]["name"], "seen-by-system:admin", "{list}");
    let (_, user, groups) =
        seen.lock().unwrap().iter().rev().find(|(p, _, _)| *p == path).cloned().expect("the request reached it");
    assert_eq!(user, "system:admin");
    assert!(groups.contains(&"system:masters".to_string()) && groups.contains(&"system:authenticated".to_string()));

    // Discovery lists the group (legacy and aggregated), so kubectl finds it by name.
    let groups: Value = serde_json::from_str(&ok(&s, &["get", "--raw", "/apis"])).expect("groups");
    let wardle =
        groups["groups"].as_array().expect("groups").iter().find(|g| g["name"] == GROUP).cloned().expect("wardle");
    assert_eq!(wardle["preferredVersion"]["version"], "v1alpha1");
    common::eventually("kubectl finds flunders", || {
        let (ok, out) = kubectl(&s, &["api-resources", "--api-group", GROUP]);
        ok && out.contains("flunders") && out.contains("fl ")
    });
    let got = ok(&s, &["get", "flunders", "-o", "name"]);
    assert_eq!(got.trim(), format!("flunder.{GROUP}/seen-by-system:admin"));
    common::eventually("the APIService is Available", || {
        available(&s, &format!("v1alpha1.{GROUP}")) == ("True".into(), "Passed".into())
    });

    // services/proxy with https: TLS to the endpoint, the front proxy's
    // certificate presented (the server takes no other client).
    let via_proxy = ok(
        &s,
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/services/https:wardle-api:443/proxy/apis/{GROUP}/v1alpha1"),
        ],
    );
    assert!(via_proxy.contains("APIResourceList"), "{via_proxy}");
    let (plain, out) =
        kubectl(&s, &["get", "--raw", "/api/v1/namespaces/default/services/gopher:wardle-api:443/proxy/"]);
    assert!(!plain && out.contains("unsupported scheme"), "{out}");

    // RBAC is checked here before the request goes on; a forged user header is dropped.
    let before = seen.lock().unwrap().len();
    let (allowed_bob, out) = kubectl(&s, &["get", "--raw", &path, "--as", "bob"]);
    assert!(!allowed_bob && out.contains("forbidden"), "{out}");
    assert_eq!(seen.lock().unwrap().len(), before, "a forbidden request never reached the other server");
    let client = common::kube_client(&s.kubeconfig()).await;
    let req = axum::http::Request::get(&path).header("X-Remote-User", "evil").body(Vec::new()).expect("request");
    let text = client.request_text(req).await.expect("forged header");
    assert!(text.contains("seen-by-system:admin"), "{text}");

    // An APIService whose Service is missing is not available, with upstream's reason.
    apply_json(
        &s,
        &json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": "v1.ghost.example.com"},
                "spec": {"group": "ghost.example.com", "version": "v1", "insecureSkipTLSVerify": true, "groupPriorityMinimum": 10, "versionPriority": 10,
                         "service": {"namespace": "default", "name": "ghost"}}}),
    );
    common::eventually("the ghost APIService is refused", || {
        available(&s, "v1.ghost.example.com") == ("False".into(), "ServiceNotFound".into())
    });
    let (ok_ghost, out) = kubectl(&s, &["get", "--raw", "/apis/ghost.example.com/v1/things"]);
    assert!(!ok_ghost && out.contains("ServiceUnavailable"), "{out}");

    // Deleted, the group is gone from discovery.
    ok(&s, &["delete", "apiservice", &format!("v1alpha1.{GROUP}")]);
    common::eventually("the group leaves discovery", || !ok(&s, &["get", "--raw", "/apis"]).contains(GROUP));
}
