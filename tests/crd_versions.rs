//! CustomResourceDefinitions with several versions and defaults, as
//! upstream's apiextensions-apiserver serves them: defaults added to a CRD
//! show on objects read afterwards (get, list, watch) without being
//! written back; a CRD with `strategy: None` serves the objects written in
//! either version in the other; a CRD with `strategy: Webhook` has a
//! conversion webhook of the test's own (HTTPS on 127.0.0.1, reached by
//! `clientConfig.url` with a `caBundle`) convert what is read and written
//! in another version than the stored one, one ConversionReview for a
//! list; a storage version change leaves older objects in their version
//! and grows `status.storedVersions`; a failing webhook gives upstream's
//! errors; a CRD's updates never leave its resource unserved.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use common::ApiServer;
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// A request's code and JSON answer (Null when it is not JSON).
async fn call(client: &kube::Client, method: &str, uri: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (code, bytes) = common::raw(client, method, uri, "application/json", &body).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `call` that must answer 2xx.
async fn ok(client: &kube::Client, method: &str, uri: &str, body: &Value) -> Value {
    let (code, answer) = call(client, method, uri, body).await;
    assert!((200..300).contains(&code), "{method} {uri}: {code} {answer}");
    answer
}

/// Polls `check` (which reads through `client`) until it holds, for up to 20 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a CRD and waits until each of `versions` serves its resource.
async fn create_crd(client: &kube::Client, crd: &Value, versions: &[&str]) {
    ok(client, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).await;
    let (group, plural) = (crd["spec"]["group"].as_str().unwrap(), crd["spec"]["names"]["plural"].as_str().unwrap());
    for v in versions {
        let uri = format!("/apis/{group}/{v}/namespaces/default/{plural}");
        eventually(&format!("{uri} to be served"), || async { call(client, "GET", &uri, &Value::Null).await.0 == 200 })
            .await;
    }
}

/// The lines of a watch, read as they come.
struct Watch {
    body: kube::client::Body,
    buf: Vec<u8>,
}

impl Watch {
    async fn start(client: &kube::Client, uri: &str) -> Watch {
        let req = axum::http::Request::builder()
            .uri(uri)
            .header("Accept", "application/json")
            .body(kube::client::Body::empty())
            .expect("request");
        let resp = client.send(req).await.expect("watch");
        assert_eq!(resp.status(), 200, "watch {uri}");
        Watch { body: resp.into_body(), buf: Vec::new() }
    }

    /// The next event, within 20 s.
    async fn next(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return serde_json::from_slice(&line).expect("a JSON event");
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.expect("an event in time");
            let frame = frame.expect("the watch goes on").expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_apply_on_read_and_are_not_written_back() {
    let server = ApiServer::start();
    let client = common::kube_client(&server.kubeconfig()).await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.defaults.example.com"},
        "spec": {"group": "defaults.example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}}]}
    });
    create_crd(&client, &crd, &["v1"]).await;
    let gadgets = "/apis/defaults.example.com/v1/namespaces/default/gadgets";
    let crd_uri = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.defaults.example.com";
    let created = ok(
        &client,
        "POST",
        gadgets,
        &json!({"apiVersion": "defaults.example.com/v1", "kind": "Gadget",
        "metadata": {"name": "g1"}}),
    )
    .await;
    assert!(created.get("a").is_none(), "{created}");
    let rv = created["metadata"]["resourceVersion"].clone();

    let patch = |ops: Value| {
        let client = client.clone();
        async move {
            let (code, body) = common::raw_as(
                &client,
                "PATCH",
                crd_uri,
                "application/json-patch+json",
                "application/json",
                &ops.to_string(),
            )
            .await;
            assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        }
    };
    patch(json!([{"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/a/default", "value": "A"}]))
        .await;
    let g1 = format!("{gadgets}/g1");
    // The CRD's update never takes its resource away (the GETs never fail).
    eventually("g1 defaulted on read", || async { ok(&client, "GET", &g1, &Value::Null).await["a"] == "A" }).await;
    let read = ok(&client, "GET", &g1, &Value::Null).await;
    assert_eq!(read["metadata"]["resourceVersion"], rv, "a default applied on read is not a write: {read}");
    let list = ok(&client, "GET", gadgets, &Value::Null).await;
    assert_eq!(list["items"][0]["a"], "A", "{list}");
    let mut watch = Watch::start(&client, &format!("{gadgets}?watch=1&resourceVersion=0&timeoutSeconds=30")).await;
    let added = watch.next().await;
    assert_eq!((added["type"].as_str(), &added["object"]["a"]), (Some("ADDED"), &json!("A")), "{added}");

    // Created now, the default is stored with it.
    let g2 = ok(
        &client,
        "POST",
        gadgets,
        &json!({"apiVersion": "defaults.example.com/v1", "kind": "Gadget",
        "metadata": {"name": "g2"}}),
    )
    .await;
    assert_eq!(g2["a"], "A", "{g2}");
    let event = watch.next().await;
    assert_eq!((event["type"].as_str(), &event["object"]["a"]), (Some("ADDED"), &json!("A")), "{event}");

    // Without the default of a, only g2 (which stored it) keeps it; b's new default shows on both.
    patch(json!([
        {"op": "remove", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/a/default"},
        {"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/b/default", "value": "B"}
    ]))
    .await;
    let g2_uri = format!("{gadgets}/g2");
    eventually("g2 defaulted for b", || async { ok(&client, "GET", &g2_uri, &Value::Null).await["b"] == "B" }).await;
    assert_eq!(ok(&client, "GET", &g2_uri, &Value::Null).await["a"], "A");
    let g1_now = ok(&client, "GET", &g1, &Value::Null).await;
    assert!(g1_now.get("a").is_none() && g1_now["b"] == "B", "g1's default was never stored: {g1_now}");
    assert_eq!(g1_now["metadata"]["resourceVersion"], rv);
    let list = ok(&client, "GET", gadgets, &Value::Null).await;
    assert!(list["items"].as_array().unwrap().iter().all(|g| g["b"] == "B"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategy_none_serves_each_version_in_the_other() {
    let server = ApiServer::start();
    let client = common::kube_client(&server.kubeconfig()).await;
    let version = |name: &str, storage: bool, own: &str| {
        json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {"type": "object",
            "properties": {"shared": {"type": "string"}, own: {"type": "string"}}}}})
    };
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.none.example.com"},
        "spec": {"group": "none.example.com", "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [version("v1", true, "old"), version("v2", false, "new")]}
    });
    create_crd(&client, &crd, &["v1", "v2"]).await;
    let crd_read = ok(
        &client,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.none.example.com",
        &Value::Null,
    )
    .await;
    assert_eq!(crd_read["spec"]["conversion"], json!({"strategy": "None"}), "upstream's default");
    assert_eq!(crd_read["status"]["storedVersions"], json!(["v1"]));
    let (v1, v2) =
        ("/apis/none.example.com/v1/namespaces/default/things", "/apis/none.example.com/v2/namespaces/default/things");

    ok(
        &client,
        "POST",
        v1,
        &json!({"apiVersion": "none.example.com/v1", "kind": "Thing",
        "metadata": {"name": "t1", "labels": {"l": "x"}}, "shared": "s1", "old": "o1"}),
    )
    .await;
    let t1 = ok(&client, "GET", &format!("{v2}/t1"), &Value::Null).await;
    assert_eq!(t1["apiVersion"], "none.example.com/v2");
    assert_eq!((&t1["shared"], &t1["metadata"]["labels"]["l"]), (&json!("s1"), &json!("x")), "{t1}");
    assert!(t1.get("old").is_none(), "what v2 does not know is pruned: {t1}");

    // Written through v2, stored as v1: v2's own field does not survive.
    let created = ok(
        &client,
        "POST",
        v2,
        &json!({"apiVersion": "none.example.com/v2", "kind": "Thing",
        "metadata": {"name": "t2"}, "shared": "s2", "new": "n2"}),
    )
    .await;
    assert_eq!(
        (&created["apiVersion"], &created["shared"]),
        (&json!("none.example.com/v2"), &json!("s2")),
        "{created}"
    );
    assert!(created.get("new").is_none(), "the answer is read back from the stored v1 object: {created}");
    let t2 = ok(&client, "GET", &format!("{v1}/t2"), &Value::Null).await;
    assert_eq!((&t2["apiVersion"], &t2["shared"]), (&json!("none.example.com/v1"), &json!("s2")), "{t2}");

    for (uri, api_version) in [(v1, "none.example.com/v1"), (v2, "none.example.com/v2")] {
        let list = ok(&client, "GET", uri, &Value::Null).await;
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{list}");
        assert!(items.iter().all(|i| i["apiVersion"] == api_version), "{list}");
        let mut watch = Watch::start(&client, &format!("{uri}?watch=1&resourceVersion=0&timeoutSeconds=30")).await;
        for _ in 0..2 {
            let event = watch.next().await;
            assert_eq!(event["object"]["apiVersion"], api_version, "{event}");
        }
    }
    // An update through v2 keeps what v1 stored of it (none of v2's own).
    let mut t1 = ok(&client, "GET", &format!("{v2}/t1"), &Value::Null).await;
    t1["shared"] = json!("s1b");
    ok(&client, "PUT", &format!("{v2}/t1"), &t1).await;
    let t1 = ok(&client, "GET", &format!("{v1}/t1"), &Value::Null).await;
    assert_eq!((&t1["shared"], &t1["old"]), (&json!("s1b"), &Value::Null), "{t1}");

    // v2 becomes the storage version: a JSON patch through v2 starts from
    // the stored v1 object converted to v2, and the result is stored in v2.
    let crd_uri = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.none.example.com";
    let mut crd_now = ok(&client, "GET", crd_uri, &Value::Null).await;
    crd_now["spec"]["versions"] = json!([version("v1", false, "old"), version("v2", true, "new")]);
    let crd_now = ok(&client, "PUT", crd_uri, &crd_now).await;
    assert_eq!(crd_now["status"]["storedVersions"], json!(["v1", "v2"]));
    let probes = std::sync::atomic::AtomicUsize::new(0);
    eventually("v2 to store what it is sent", || async {
        let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = json!({"apiVersion": "none.example.com/v2", "kind": "Thing",
            "metadata": {"name": format!("probe-{n}")}, "new": "kept"});
        ok(&client, "POST", v2, &probe).await["new"] == "kept"
    })
    .await;
    let patch =
        json!([{"op": "add", "path": "/new", "value": "n1"}, {"op": "replace", "path": "/shared", "value": "s1c"}]);
    let (code, bytes) = common::raw_as(
        &client,
        "PATCH",
        &format!("{v2}/t1"),
        "application/json-patch+json",
        "application/json",
        &patch.to_string(),
    )
    .await;
    let patched: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    assert_eq!(code, 200, "{patched}");
    assert_eq!(
        (&patched["apiVersion"], &patched["shared"], &patched["new"]),
        (&json!("none.example.com/v2"), &json!("s1c"), &json!("n1")),
        "{patched}"
    );
    let t1 = ok(&client, "GET", &format!("{v2}/t1"), &Value::Null).await;
    assert_eq!(t1["new"], "n1", "stored in v2, which knows it: {t1}");
}

/// What the test's conversion webhook does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Convert,
    Fail,
    WrongUid,
    Rename,
}

/// One ConversionReview the webhook answered: its apiVersion, the
/// desired apiVersion and the names of the objects.
type Reviews = Arc<Mutex<Vec<(String, String, Vec<String>)>>>;

/// The conversion agnhost's crd-conversion-webhook does: v1's `hostPort`
/// is v2's `host` and `port`.
fn convert(mut obj: Value, to: &str) -> Value {
    let m = obj.as_object_mut().expect("an object");
    if to.ends_with("/v2") {
        if let Some(Value::String(hp)) = m.remove("hostPort") {
            let (host, port) = hp.split_once(':').unwrap_or((&hp, ""));
            m.insert("host".into(), json!(host));
            m.insert("port".into(), json!(port));
        }
    } else if let (Some(Value::String(host)), Some(Value::String(port))) = (m.remove("host"), m.remove("port")) {
        m.insert("hostPort".into(), json!(format!("{host}:{port}")));
    }
    m.insert("apiVersion".into(), json!(to));
    obj
}

/// The webhook's answer to one review.
fn answer(review: &Value, mode: Mode) -> Value {
    let request = &review["request"];
    let to = request["desiredAPIVersion"].as_str().unwrap_or_default();
    let uid = if mode == Mode::WrongUid { json!("not-the-request") } else { request["uid"].clone() };
    let objects: Vec<Value> = request["objects"].as_array().cloned().unwrap_or_default();
    let mut converted: Vec<Value> = objects.into_iter().map(|o| convert(o, to)).collect();
    if mode == Mode::Rename {
        for o in &mut converted {
            o["metadata"]["name"] = json!("renamed");
        }
    }
    let response = match mode {
        Mode::Fail => {
            json!({"uid": uid, "result": {"status": "Failure", "message": "conversion refused for the test"}})
        }
        _ => json!({"uid": uid, "result": {"status": "Success"}, "convertedObjects": converted}),
    };
    json!({"apiVersion": review["apiVersion"], "kind": "ConversionReview", "response": response})
}

/// Serves the conversion webhook on 127.0.0.1 over HTTPS; its URL and CA (PEM).
async fn conversion_webhook(mode: Arc<Mutex<Mode>>, reviews: Reviews) -> (String, String) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "conversion-webhook-ca");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    let cert = params.signed_by(&key, &rcgen::Issuer::from_params(&ca_params, &ca_key)).expect("leaf");
    let chain = CertificateDer::pem_slice_iter(cert.pem().as_bytes()).collect::<Result<Vec<_>, _>>().expect("chain");
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, mode, reviews) = (acceptor.clone(), mode.clone(), reviews.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (mode, reviews) = (mode.clone(), reviews.clone());
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let review: Value = serde_json::from_slice(&body).unwrap_or_default();
                        let names = review["request"]["objects"]
                            .as_array()
                            .map(|a| {
                                a.iter().map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string()).collect()
                            })
                            .unwrap_or_default();
                        let desired = review["request"]["desiredAPIVersion"].as_str().unwrap_or("").to_string();
                        let version = review["apiVersion"].as_str().unwrap_or("").to_string();
                        reviews.lock().unwrap().push((version, desired, names));
                        let mode = *mode.lock().unwrap();
                        let resp = hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(axum::body::Bytes::from(answer(&review, mode).to_string())))
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
    (format!("https://127.0.0.1:{port}/crdconvert"), ca.pem())
}

fn webhook_versions(storage: &str) -> Value {
    let version = |name: &str, props: Value| {
        json!({"name": name, "served": true, "storage": name == storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": props}}})
    };
    json!([
        version("v1", json!({"hostPort": {"type": "string"}})),
        version("v2", json!({"host": {"type": "string"}, "port": {"type": "string"}}))
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_webhook_converts_what_is_read_and_written_in_another_version() {
    let mode = Arc::new(Mutex::new(Mode::Convert));
    let reviews: Reviews = Arc::default();
    let (url, ca) = conversion_webhook(mode.clone(), reviews.clone()).await;
    let server = ApiServer::start();
    let client = common::kube_client(&server.kubeconfig()).await;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let crd_name = "widgets.conv.example.com";
    let crd_uri = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}");
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {"group": "conv.example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": webhook_versions("v1"),
            "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1", "v1beta1"],
                "clientConfig": {"url": url, "caBundle": ca_bundle}}}}
    });
    create_crd(&client, &crd, &["v1", "v2"]).await;
    let (v1, v2) = (
        "/apis/conv.example.com/v1/namespaces/default/widgets",
        "/apis/conv.example.com/v2/namespaces/default/widgets",
    );
    let widget = |name: &str, hp: &str| json!({"apiVersion": "conv.example.com/v1", "kind": "Widget", "metadata": {"name": name}, "hostPort": hp});
    let reviews_since = |n: usize| reviews.lock().unwrap()[n..].to_vec();
    let seen = || reviews.lock().unwrap().len();

    // Written and read in the storage version: no review.
    ok(&client, "POST", v1, &widget("w1", "localhost:8080")).await;
    ok(&client, "GET", &format!("{v1}/w1"), &Value::Null).await;
    assert!(reviews_since(0).is_empty(), "{:?}", reviews_since(0));

    let before = seen();
    let w1 = ok(&client, "GET", &format!("{v2}/w1"), &Value::Null).await;
    assert_eq!(
        (&w1["apiVersion"], &w1["host"], &w1["port"]),
        (&json!("conv.example.com/v2"), &json!("localhost"), &json!("8080")),
        "{w1}"
    );
    assert!(w1.get("hostPort").is_none(), "{w1}");
    let asked = reviews_since(before);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].0, "apiextensions.k8s.io/v1", "the first review version the CRD lists");
    assert_eq!(asked[0].1, "conv.example.com/v2");

    // A list: one review for all the objects that need it.
    ok(&client, "POST", v1, &widget("w2", "example.com:443")).await;
    let before = seen();
    let list = ok(&client, "GET", v2, &Value::Null).await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{list}");
    assert!(items.iter().all(|i| i["apiVersion"] == "conv.example.com/v2" && i.get("host").is_some()), "{list}");
    let asked = reviews_since(before);
    assert_eq!(asked.len(), 1, "one review for the list: {asked:?}");
    assert_eq!(asked[0].2, vec!["w1".to_string(), "w2".to_string()]);

    // A watch: its first objects in one review, then each change converted.
    let before = seen();
    let mut watch = Watch::start(&client, &format!("{v2}?watch=1&resourceVersion=0&timeoutSeconds=30")).await;
    for _ in 0..2 {
        let event = watch.next().await;
        assert_eq!(
            (event["type"].as_str(), &event["object"]["apiVersion"]),
            (Some("ADDED"), &json!("conv.example.com/v2")),
            "{event}"
        );
    }
    assert_eq!(reviews_since(before).len(), 1, "{:?}", reviews_since(before));
    let mut w2 = ok(&client, "GET", &format!("{v1}/w2"), &Value::Null).await;
    w2["hostPort"] = json!("example.com:8443");
    ok(&client, "PUT", &format!("{v1}/w2"), &w2).await;
    let event = watch.next().await;
    assert_eq!((event["type"].as_str(), &event["object"]["port"]), (Some("MODIFIED"), &json!("8443")), "{event}");

    // Created through v2: converted to the storage version before it is stored.
    let before = seen();
    let created = ok(
        &client,
        "POST",
        v2,
        &json!({"apiVersion": "conv.example.com/v2", "kind": "Widget",
        "metadata": {"name": "w3"}, "host": "10.0.0.1", "port": "53"}),
    )
    .await;
    assert_eq!((&created["host"], &created["port"]), (&json!("10.0.0.1"), &json!("53")), "{created}");
    let asked = reviews_since(before);
    assert_eq!(asked.first().map(|r| r.1.as_str()), Some("conv.example.com/v1"), "{asked:?}");
    let w3 = ok(&client, "GET", &format!("{v1}/w3"), &Value::Null).await;
    assert_eq!(w3["hostPort"], "10.0.0.1:53", "{w3}");

    // The storage version moves to v2: older objects stay v1, storedVersions grows.
    let mut crd_now = ok(&client, "GET", &crd_uri, &Value::Null).await;
    crd_now["spec"]["versions"] = webhook_versions("v2");
    let updated = ok(&client, "PUT", &crd_uri, &crd_now).await;
    assert_eq!(updated["status"]["storedVersions"], json!(["v1", "v2"]), "{updated}");
    let mut attempt = 0;
    eventually("a write through v1 to be stored as v2", || {
        attempt += 1;
        let name = format!("w4-{attempt}");
        let client = client.clone();
        let reviews = reviews.clone();
        async move {
            let before = reviews.lock().unwrap().len();
            ok(&client, "POST", v1, &widget(&name, "new.example.com:80")).await;
            let stored_as_v2 = reviews.lock().unwrap()[before..].iter().any(|r| r.1 == "conv.example.com/v2");
            if !stored_as_v2 {
                ok(&client, "DELETE", &format!("{v1}/{name}"), &Value::Null).await;
            }
            stored_as_v2
        }
    })
    .await;
    for (uri, api_version, converted) in [(v1, "conv.example.com/v1", 1), (v2, "conv.example.com/v2", 3)] {
        let before = seen();
        let list = ok(&client, "GET", uri, &Value::Null).await;
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 4, "{list}");
        assert!(items.iter().all(|i| i["apiVersion"] == api_version), "{list}");
        let asked = reviews_since(before);
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].2.len(), converted, "only the objects stored in another version: {asked:?}");
    }

    // A stored version cannot leave spec.versions.
    let mut crd_now = ok(&client, "GET", &crd_uri, &Value::Null).await;
    crd_now["spec"]["versions"] = json!([webhook_versions("v2")[1]]);
    let (code, refused) = call(&client, "PUT", &crd_uri, &crd_now).await;
    assert_eq!(code, 422, "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(r#"status.storedVersions[0]: Invalid value: "v1": must appear in spec.versions"#),
        "{message}"
    );

    // A webhook that fails, or answers wrongly, as upstream reports it.
    let w1_v2 = format!("{v2}/w1");
    for (m, why) in [
        (Mode::Fail, "failed: conversion refused for the test"),
        (Mode::WrongUid, r#"failed: expected response.uid="#),
        (Mode::Rename, "returned invalid object at index 0: must have the same name: w1 != renamed"),
    ] {
        *mode.lock().unwrap() = m;
        let (code, status) = call(&client, "GET", &w1_v2, &Value::Null).await;
        assert_eq!((code, status["reason"].as_str()), (500, Some("InternalError")), "{m:?}: {status}");
        let message = status["message"].as_str().unwrap_or_default();
        let want = format!("Internal error occurred: conversion webhook for conv.example.com/v1, Kind=Widget {why}");
        assert!(message.starts_with(&want), "{m:?}: {message}");
    }
    *mode.lock().unwrap() = Mode::Fail;
    let (code, status) = call(&client, "GET", v2, &Value::Null).await;
    assert_eq!(code, 500, "a list fails with its review: {status}");
    let (code, status) = call(&client, "POST", v1, &widget("w5", "a:1")).await;
    assert_eq!(code, 500, "a write through v1 is converted to v2 for storage: {status}");
    assert!(call(&client, "GET", &format!("{v1}/w5"), &Value::Null).await.0 == 404, "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crds_updates_never_take_its_resource_away() {
    let server = ApiServer::start();
    let client = common::kube_client(&server.kubeconfig()).await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "probes.race.example.com"},
        "spec": {"group": "race.example.com", "scope": "Cluster",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"a": {"type": "string"}}}}}]}
    });
    ok(&client, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd).await;
    let probes = "/apis/race.example.com/v1/probes";
    eventually("probes to be served", || async { call(&client, "GET", probes, &Value::Null).await.0 == 200 }).await;
    ok(
        &client,
        "POST",
        probes,
        &json!({"apiVersion": "race.example.com/v1", "kind": "Probe", "metadata": {"name": "p"}}),
    )
    .await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (client, done) = (client.clone(), done.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (code, body) = call(&client, "GET", &format!("{probes}/p"), &Value::Null).await;
                    if code != 200 {
                        failures.push(format!("{code} {body}"));
                    }
                }
                failures
            })
        })
        .collect();
    let crd_uri = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/probes.race.example.com";
    for i in 0..40 {
        let ops = json!([{"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/a/default",
            "value": format!("A{i}")}]);
        let (code, body) = common::raw_as(
            &client,
            "PATCH",
            crd_uri,
            "application/json-patch+json",
            "application/json",
            &ops.to_string(),
        )
        .await;
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    }
    eventually("the last default to show", || async {
        ok(&client, "GET", &format!("{probes}/p"), &Value::Null).await["a"] == "A39"
    })
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        let failures = reader.await.expect("reader");
        assert!(failures.is_empty(), "reads failed while the CRD changed: {failures:?}");
    }
}
