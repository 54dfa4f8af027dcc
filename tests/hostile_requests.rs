//! Bad input never breaks a request: a real server, driven over HTTPS by
//! the `kube` client, answers malformed values with upstream's 400 or 422
//! (never a silent default), and a few thousand hostile requests
//! (multi-byte generateNames, wrong-shaped apply bodies, truncated
//! protobuf, garbage selectors and query strings) all get an answer below
//! 500 on a connection that stays up.

mod common;
#[path = "common/hostile.rs"]
mod hostile;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use hostile::Rng;
use http_body_util::BodyExt;
use serde_json::{json, Value};

async fn client(server: &ApiServer) -> kube::Client {
    common::kube_client(&server.kubeconfig()).await
}

/// One request; the status and body, or the transport error (a dropped connection).
async fn send(
    c: &kube::Client,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(u16, Value), String> {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("Content-Type", content_type)
        .body(kube::client::Body::from(body))
        .map_err(|e| e.to_string())?;
    let resp = c.send(req).await.map_err(|e| format!("{method} {uri}: {e}"))?;
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.map_err(|e| format!("{method} {uri} body: {e}"))?.to_bytes();
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()))))
}

async fn json_req(c: &kube::Client, method: &str, uri: &str, body: &Value) -> (u16, Value) {
    let ct = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    send(c, method, uri, ct, body.to_string().into_bytes()).await.expect("answer")
}

fn message(v: &Value) -> &str {
    v["message"].as_str().unwrap_or_default()
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_values_get_upstreams_errors() {
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = client(&server).await;

    // generateName with a multi-byte character across byte 58 (where the
    // prefix is cut): the cut keeps whole characters, the name is valid.
    let prefix = hostile::straddling(70, 58, 'é');
    let (code, body) = json_req(
        &c,
        "POST",
        CMS,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": prefix}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let generated = body["metadata"]["name"].as_str().unwrap_or_default();
    assert!(generated.starts_with(&"a".repeat(57)) && generated.len() == 62, "{body}");
    // One that stays in the name is a 422 naming metadata.name.
    let (code, body) =
        json_req(&c, "POST", CMS, &json!({"metadata": {"generateName": hostile::straddling(20, 10, '日')}})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name", "{body}");
    let (code, body) =
        json_req(&c, "POST", CMS, &json!({"metadata": {"generateName": "web-"}, "data": {"k": "v"}})).await;
    assert_eq!(code, 201, "{body}");
    // Upstream's field order on the wire.
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    let req = axum::http::Request::get(format!("{CMS}/{name}")).body(Vec::new()).expect("request");
    let text = c.request_text(req).await.expect("get");
    assert!(text.starts_with(r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"#), "{text}");

    // A non-integer replicas is a 400, as upstream's decoder refuses it.
    for replicas in [json!("abc"), json!(1.5), json!({"n": 1})] {
        let deploy = json!({"metadata": {"name": "d"}, "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let (code, body) = json_req(&c, "POST", "/apis/apps/v1/namespaces/default/deployments", &deploy).await;
        assert_eq!(code, 400, "{replicas}: {body}");
        assert!(message(&body).contains("spec.replicas"), "{body}");
    }

    // A quantity that does not parse is a 400 naming it, as upstream's decoder.
    let pod = json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "c", "image": "i",
        "resources": {"limits": {"cpu": "lots"}}}]}});
    let (code, body) = json_req(&c, "POST", PODS, &pod).await;
    assert_eq!(code, 400, "{body}");
    assert!(message(&body).contains("quantities must match the regular expression"), "{body}");
    // An unknown enum value from a client is a 422 naming the field.
    let pod = json!({"metadata": {"name": "e"}, "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "i"}]}});
    let (code, body) = json_req(&c, "POST", PODS, &pod).await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["details"]["causes"].as_array().is_some_and(|c| c.iter().any(|c| c["field"] == "spec.restartPolicy")),
        "{body}"
    );

    // Labels and annotations are checked as upstream's ValidateObjectMeta checks them.
    let cm = json!({"metadata": {"name": "badlabel", "labels": {"a b": "ok", "app": "-x"}}});
    let (code, body) = json_req(&c, "POST", CMS, &cm).await;
    assert_eq!(code, 422, "{body}");
    let causes = body["details"]["causes"].as_array().cloned().unwrap_or_default();
    assert_eq!(causes.len(), 2, "{body}");
    assert!(causes.iter().all(|c| c["field"] == "metadata.labels"), "{body}");
    assert!(message(&body).contains("metadata.labels: Invalid value: \"a b\": name part must consist"), "{body}");
    let cm = json!({"metadata": {"name": "badnote", "annotations": {"x/y/z": ""}}});
    assert_eq!(json_req(&c, "POST", CMS, &cm).await.0, 422);

    // Query strings: unparsable integers are 400s with upstream's text.
    for (query, want) in [
        ("limit=abc", "strconv.ParseInt: parsing \"abc\": invalid syntax"),
        ("timeoutSeconds=x", "strconv.ParseInt: parsing \"x\": invalid syntax"),
        ("labelSelector=a%20in%20b", "unable to parse requirement: found 'b' expected: '('"),
        ("labelSelector=%3D%3D", "found '==', expected: !, identifier, or 'end of string'"),
        ("labelSelector=a%20in%20(b", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("labelSelector=app%3D-x", "unable to parse requirement: values[0][app]: Invalid value: \"-x\": a valid label"),
        ("labelSelector=a%24b", "unable to parse requirement: <nil>: Invalid value: \"a$b\": name part must"),
        ("fieldSelector=spec.bogus%3D1", "field label not supported: spec.bogus"),
        ("fieldSelector=nonsense", "invalid selector"),
    ] {
        let (code, body) = send(&c, "GET", &format!("{PODS}?{query}"), "", Vec::new()).await.expect("answer");
        assert_eq!(code, 400, "{query}: {body}");
        assert!(message(&body).contains(want), "{query}: {body}");
    }
    let (code, body) = send(&c, "GET", &format!("{PODS}?resourceVersion=1&resourceVersionMatch=Sometimes"), "", vec![])
        .await
        .expect("answer");
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")), "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "resourceVersionMatch", "{body}");
    let (code, body) =
        send(&c, "POST", &format!("{CMS}?dryRun=Maybe"), "application/json", b"{}".to_vec()).await.expect("answer");
    assert_eq!((code, body["details"]["causes"][0]["field"].as_str()), (422, Some("dryRun")), "{body}");
    // watch=maybe is a watch, as upstream reads booleans ("false" and "0" only are false).
    let (code, _) = send(&c, "GET", &format!("{CMS}?watch=maybe&timeoutSeconds=1"), "", vec![]).await.expect("answer");
    assert_eq!(code, 200);

    // deletecollection with an unparsable selector deletes nothing.
    for bad in ["labelSelector=a%20in%20b", "fieldSelector=data.k%3Dv", "fieldSelector=what"] {
        let (code, body) = send(&c, "DELETE", &format!("{CMS}?{bad}"), "", vec![]).await.expect("answer");
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let (code, list) = json_req(&c, "GET", CMS, &Value::Null).await;
    assert_eq!(code, 200);
    assert!(list["items"].as_array().is_some_and(|i| i.iter().any(|cm| cm["metadata"]["name"] == name.as_str())));

    // A field selector on a defaulted field matches objects that never set it.
    let (code, body) = json_req(&c, "POST", "/api/v1/nodes", &json!({"metadata": {"name": "n-plain"}})).await;
    assert_eq!(code, 201, "{body}");
    let (_, nodes) = json_req(&c, "GET", "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse", &Value::Null).await;
    assert!(nodes["items"].as_array().is_some_and(|i| i.iter().any(|n| n["metadata"]["name"] == "n-plain")), "{nodes}");
    let (code, _) =
        send(&c, "GET", "/api/v1/nodes?fieldSelector=metadata.namespace%3Dx", "", vec![]).await.expect("answer");
    assert_eq!(code, 400, "Node has no metadata.namespace field label upstream");

    // Wrong-shaped apply bodies: 400s.
    let apply = |body: Value| {
        let c = c.clone();
        async move {
            send(
                &c,
                "PATCH",
                &format!("{CMS}/applied?fieldManager=t"),
                "application/apply-patch+yaml",
                body.to_string().into_bytes(),
            )
            .await
            .expect("answer")
        }
    };
    for body in [json!([1, 2]), json!("text"), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": "x"})] {
        let (code, answer) = apply(body.clone()).await;
        assert_eq!(code, 400, "{body}: {answer}");
    }
    let (code, answer) =
        apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": "x"})).await;
    assert_eq!(code, 400, "{answer}");

    // Subresources upstream serves for reading.
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    assert_eq!(json_req(&c, "POST", PODS, &pod).await.0, 201);
    for sub in ["status", "ephemeralcontainers", "resize"] {
        let (code, body) = json_req(&c, "GET", &format!("{PODS}/p/{sub}"), &Value::Null).await;
        assert_eq!((code, body["kind"].as_str()), (200, Some("Pod")), "{sub}: {body}");
    }

    // Strategic merge patch merges a Service's ports by port, as its schema says.
    let svc = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
    assert_eq!(json_req(&c, "POST", "/api/v1/namespaces/default/services", &svc).await.0, 201);
    let patch = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
    let (code, body) = send(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/services/s",
        "application/strategic-merge-patch+json",
        patch.to_string().into_bytes(),
    )
    .await
    .expect("answer");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"]["ports"].as_array().map(Vec::len), Some(2), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategic_merge_patch_is_refused_for_custom_resources() {
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = client(&server).await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    let (code, body) = json_req(&c, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd).await;
    assert_eq!(code, 201, "{body}");
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}});
    let mut created = (0, Value::Null);
    for _ in 0..200 {
        created = json_req(&c, "POST", widgets, &w).await;
        if created.0 != 404 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(created.0, 201, "{}", created.1);
    let (code, body) = send(
        &c,
        "PATCH",
        &format!("{widgets}/w"),
        "application/strategic-merge-patch+json",
        br#"{"spec":{"size":2}}"#.to_vec(),
    )
    .await
    .expect("answer");
    assert_eq!((code, body["reason"].as_str()), (415, Some("UnsupportedMediaType")), "{body}");
    let (code, body) = json_req(&c, "PATCH", &format!("{widgets}/w"), &json!({"spec": {"size": 2}})).await;
    assert_eq!((code, body["spec"]["size"].as_i64()), (200, Some(2)), "{body}");
}

/// One hostile request, chosen by `rng`.
async fn hostile_request(c: &kube::Client, rng: &mut Rng) -> Result<u16, String> {
    let kinds = [
        (CMS, "v1", "ConfigMap"),
        (PODS, "v1", "Pod"),
        ("/apis/apps/v1/namespaces/default/deployments", "apps/v1", "Deployment"),
        ("/api/v1/namespaces/default/secrets", "v1", "Secret"),
    ];
    let (base, av, kind) = *rng.pick(&kinds);
    let target = format!("{base}/fz-{}", rng.below(20));
    let obj = hostile::object_like(rng, av, kind);
    let (code, _) = match rng.below(9) {
        0 => send(c, "POST", base, "application/json", hostile::mutate(rng, obj.to_string().as_bytes())).await?,
        1 => send(c, "POST", base, "application/json", obj.to_string().into_bytes()).await?,
        2 => send(c, "POST", base, "application/vnd.kubernetes.protobuf", hostile::protobuf(rng)).await?,
        3 => {
            let mut named = obj;
            if let Some(m) = named.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("name");
                m.insert(
                    "generateName".into(),
                    json!(hostile::straddling(60 + rng.below(10), 55 + rng.below(8), *rng.pick(&['é', '日', '😀']))),
                );
            }
            send(c, "POST", base, "application/json", named.to_string().into_bytes()).await?
        }
        4 => {
            send(
                c,
                "PATCH",
                &format!("{target}?fieldManager=fz&force={}", rng.chance(50)),
                "application/apply-patch+yaml",
                obj.to_string().into_bytes(),
            )
            .await?
        }
        5 => {
            let ct = *rng.pick(&[
                "application/strategic-merge-patch+json",
                "application/merge-patch+json",
                "application/json-patch+json",
            ]);
            let patch = if ct.contains("json-patch") {
                json!([{"op": "replace", "path": hostile::string(rng), "value": hostile::value(rng, 2)}])
            } else {
                hostile::value(rng, 3)
            };
            send(c, "PATCH", &target, ct, patch.to_string().into_bytes()).await?
        }
        6 => {
            send(c, "PUT", &target, "application/yaml", serde_yaml_ng::to_string(&obj).unwrap_or_default().into_bytes())
                .await?
        }
        7 => {
            let q = |s: String| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
            let params = format!(
                "labelSelector={}&fieldSelector={}&limit={}&timeoutSeconds={}&watch={}",
                q(hostile::selector(rng)),
                q(hostile::selector(rng)),
                q(hostile::string(rng)),
                q(hostile::string(rng)),
                q(rng.pick(&["false", "0", "", "maybe"]).to_string()),
            );
            let method = if rng.chance(20) { "DELETE" } else { "GET" };
            send(c, method, &format!("{base}?{params}"), "", Vec::new()).await?
        }
        _ => send(c, "DELETE", &target, "application/json", hostile::value(rng, 2).to_string().into_bytes()).await?,
    };
    Ok(code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_hostile_requests_never_drop_a_connection_or_answer_5xx() {
    const REQUESTS: usize = 3000;
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = client(&server).await;
    let results: Vec<(u64, Result<u16, String>)> = futures_util::stream::iter(0..REQUESTS as u64)
        .map(|seed| {
            let c = c.clone();
            async move {
                let mut rng = Rng::new(0xbad_0000 + seed);
                // Every request is answered (a watch's timeoutSeconds is hostile too): a hang is a failure.
                let answer = tokio::time::timeout(Duration::from_secs(20), hostile_request(&c, &mut rng))
                    .await
                    .unwrap_or_else(|_| Err("no answer within 20s".to_string()));
                (seed, answer)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let dropped: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    let errors: Vec<_> = results.iter().filter(|(_, r)| matches!(r, Ok(c) if *c >= 500)).collect();
    let mut by_code = std::collections::BTreeMap::new();
    for (_, r) in &results {
        if let Ok(code) = r {
            *by_code.entry(*code).or_insert(0) += 1;
        }
    }
    eprintln!("{REQUESTS} hostile requests: answers by code {by_code:?}");
    assert!(dropped.is_empty(), "{} requests lost their connection, first: {:?}", dropped.len(), dropped.first());
    assert!(errors.is_empty(), "{} requests answered 5xx, first: {:?}", errors.len(), errors.first());
    // And the server still serves.
    let (code, _) = json_req(&c, "GET", CMS, &Value::Null).await;
    assert_eq!(code, 200);
}
