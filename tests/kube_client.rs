//! `ferrok server` driven by the `kube` crate: typed CRUD, server-side
//! apply with conflicts, watch from a resourceVersion, and status errors.

mod common;

use common::{raw, raw_as};

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};

/// A server and a `kube` client for it.
async fn start() -> (common::ApiServer, kube::Client) {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;
    (server, client)
}

fn cm(name: &str, value: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.data = Some([("k".to_string(), value.to_string())].into_iter().collect());
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_crud_watch_and_errors() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms.create(&PostParams::default(), &cm("a", "1")).await.expect("create");
    let rv = created.metadata.resource_version.clone().expect("resourceVersion");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());

    let err = cms.create(&PostParams::default(), &cm("a", "1")).await.expect_err("duplicate");
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("{other:?}"),
    }
    match cms.get("nope").await.expect_err("missing") {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (404, "NotFound", "configmaps \"nope\" not found")
        ),
        other => panic!("{other:?}"),
    }

    // Watch from the create's resourceVersion sees what comes after it.
    let stream = cms.watch(&WatchParams::default(), &rv).await.expect("watch");
    let mut stream = stream.boxed();
    // And a metadata-only watch (the garbage collector's kind) beside it.
    let mut metadata_only = cms.watch_metadata(&WatchParams::default(), &rv).await.expect("metadata watch").boxed();
    let mut updated = created.clone();
    updated.data = Some([("k".to_string(), "2".to_string())].into_iter().collect());
    let replaced = cms.replace("a", &PostParams::default(), &updated).await.expect("replace");
    assert!(replaced.metadata.resource_version.as_deref() != Some(rv.as_str()));
    // The old resourceVersion now conflicts.
    match cms.replace("a", &PostParams::default(), &updated).await.expect_err("stale") {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("{other:?}"),
    }
    cms.delete("a", &DeleteParams::default()).await.expect("delete");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("event in time")
            .expect("event")
            .expect("open");
        // kube-root-ca.crt is written by a controller whenever it starts.
        let controller_made = |m: &kube::api::ObjectMeta| m.name.as_deref() == Some("kube-root-ca.crt");
        match ev {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) if controller_made(&o.metadata) => {
            }
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.data.unwrap_or_default()["k"])),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.metadata.name.unwrap_or_default())),
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.metadata.name.unwrap_or_default())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["MODIFIED 2".to_string(), "DELETED a".to_string()]);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(5), metadata_only.try_next())
            .await
            .expect("metadata event in time")
            .expect("metadata event")
            .expect("open");
        let (kind, m) = match ev {
            WatchEvent::Modified(m) => ("MODIFIED", m),
            WatchEvent::Deleted(m) => ("DELETED", m),
            WatchEvent::Added(m) => ("ADDED", m),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("{e:?}"),
        };
        if m.metadata.name.as_deref() != Some("a") {
            continue;
        }
        let types = m.types.clone().expect("apiVersion and kind");
        assert_eq!((types.api_version.as_str(), types.kind.as_str()), ("meta.k8s.io/v1", "PartialObjectMetadata"));
        assert_eq!(m.metadata.uid, created.metadata.uid, "the object's own metadata");
        // Only ferrok's own informers are spared managedFields.
        assert!(m.metadata.managed_fields.as_ref().is_some_and(|f| !f.is_empty()), "managedFields kept: {m:?}");
        seen.push(format!("{kind} {}", m.metadata.resource_version.unwrap_or_default()));
    }
    let replaced_rv = replaced.metadata.resource_version.clone().unwrap_or_default();
    assert_eq!(seen[0], format!("MODIFIED {replaced_rv}"), "{seen:?}");
    assert!(seen[1].starts_with("DELETED "), "{seen:?}");

    // Labelled, so that kube-root-ca.crt (made by a controller) stays out of the pages.
    for i in 0..5 {
        let mut c = cm(&format!("p{i}"), "x");
        c.metadata.labels = Some([("paged".to_string(), "yes".to_string())].into_iter().collect());
        cms.create(&PostParams::default(), &c).await.expect("create");
    }
    let page = cms.list(&ListParams::default().labels("paged=yes").limit(2)).await.expect("list");
    assert_eq!(page.items.len(), 2);
    let token = page.metadata.continue_.as_deref().expect("continue");
    let rest =
        cms.list(&ListParams::default().labels("paged=yes").limit(10).continue_token(token)).await.expect("list");
    assert_eq!(rest.items.len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_and_conflicts() {
    let (_server, client) = start().await;
    let deploys: Api<Deployment> = Api::namespaced(client, "default");
    let manifest = |replicas: i32| {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "busybox:1.36"}]}}
            }
        })
    };
    let applied = deploys.patch("web", &PatchParams::apply("alice"), &Patch::Apply(manifest(2))).await.expect("apply");
    assert_eq!(applied.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let fields = applied.metadata.managed_fields.clone().unwrap_or_default();
    assert!(fields.iter().any(|f| f.manager.as_deref() == Some("alice") && f.operation.as_deref() == Some("Apply")));
    let err = deploys.patch("web", &PatchParams::apply("bob"), &Patch::Apply(manifest(3))).await.expect_err("conflict");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains("conflict with \"alice\"") && s.message.contains(".spec.replicas"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    let forced = deploys
        .patch("web", &PatchParams::apply("bob").force(), &Patch::Apply(manifest(3)))
        .await
        .expect("forced apply");
    assert_eq!(forced.spec.as_ref().and_then(|s| s.replicas), Some(3));
    let merged = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "x"}}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(merged.metadata.labels.unwrap_or_default().get("team").map(String::as_str), Some("x"));
    assert_eq!(merged.metadata.generation, Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_answers_with_the_bytes_a_get_reads() {
    let (_server, client) = start().await;
    // The answer to a create is made from what was stored; a get reads the
    // object back through the watch cache. The two are the same bytes:
    // field order, apiVersion and kind, resourceVersion, escapes. (No
    // scheduler writes the pod's status in between: its scheduler is nobody.)
    let objects = [
        (
            "/api/v1/namespaces/default/configmaps",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"answer","labels":{"a":"b"}},
               "data":{"text":"caf\u00e9 \"quoted\" \\ tab\t ☃","z":"last","a":"first"}}"#,
        ),
        (
            "/api/v1/namespaces/default/pods",
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"answer","annotations":{"x":"y"}},
               "spec":{"schedulerName":"nobody","containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"0.5"}}}]}}"#,
        ),
    ];
    for (collection, body) in objects {
        let (code, created) = raw(&client, "POST", collection, "application/json", body).await;
        let text = String::from_utf8_lossy(&created).into_owned();
        assert_eq!(code, 201, "{text}");
        let v: serde_json::Value = serde_json::from_slice(&created).expect("JSON");
        assert!(text.starts_with(r#"{"kind":"#), "kind leads: {text}");
        assert!(v.pointer("/metadata/resourceVersion").and_then(|r| r.as_str()).is_some_and(|r| r != "0"), "{text}");
        let (code, read) = raw(&client, "GET", &format!("{collection}/answer"), "application/json", "").await;
        assert_eq!(code, 200);
        assert_eq!(text, String::from_utf8_lossy(&read), "the create's answer and a get of {collection}/answer");
    }
    // Other forms of the answer are made from the object as before.
    let table = "application/json;as=Table;g=meta.k8s.io;v=v1";
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"as-table"}}"#;
    let (code, answer) = raw(&client, "POST", "/api/v1/namespaces/default/configmaps", table, body).await;
    let v: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!((code, v["kind"].as_str()), (201, Some("Table")), "{v}");
    let yaml = "application/yaml";
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"as-yaml"}}"#;
    let (code, answer) = raw(&client, "POST", "/api/v1/namespaces/default/configmaps", yaml, body).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(code == 201 && text.contains("name: as-yaml") && !text.starts_with('{'), "{code} {text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_update_answers_with_the_bytes_a_get_reads() {
    let (_server, client) = start().await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let pods = "/api/v1/namespaces/default/pods";
    const MERGE: &str = "application/merge-patch+json";
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"answer"},"data":{"a":"1"}}"#;
    assert_eq!(raw(&client, "POST", cms, "application/json", body).await.0, 201);
    let body = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"answer"},
        "spec":{"schedulerName":"nobody","containers":[{"name":"c","image":"busybox"}]}}"#;
    assert_eq!(raw(&client, "POST", pods, "application/json", body).await.0, 201);
    // Like a create's, the answer to a write that stored something is put
    // together from the stored bytes, and a get reads the same bytes back:
    // field order, escapes, the resourceVersion the write was stored at.
    let put = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"answer"},
        "data":{"a":"2","text":"caf\u00e9 \"quoted\" \\ tab\t ☃"}}"#;
    let writes = [
        ("PUT", format!("{cms}/answer"), "application/json", put.to_string()),
        ("PATCH", format!("{cms}/answer"), MERGE, r#"{"data":{"b":"3"}}"#.to_string()),
        (
            "PATCH",
            format!("{cms}/answer"),
            "application/json-patch+json",
            r#"[{"op":"add","path":"/metadata/labels","value":{"x":"y"}}]"#.to_string(),
        ),
        ("PATCH", format!("{pods}/answer/status"), MERGE, r#"{"status":{"message":"written"}}"#.to_string()),
    ];
    let mut last_rv = 0;
    for (method, uri, content_type, body) in writes {
        let (code, answer) = raw_as(&client, method, &uri, content_type, "application/json", &body).await;
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert_eq!(code, 200, "{method} {uri}: {text}");
        assert!(text.starts_with(r#"{"kind":"#), "{method} {uri}: kind leads: {text}");
        let v: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
        let rv: i64 =
            v.pointer("/metadata/resourceVersion").and_then(|r| r.as_str()).and_then(|r| r.parse().ok()).unwrap_or(0);
        assert!(rv > last_rv, "{method} {uri}: resourceVersion {rv} after {last_rv}: {text}");
        last_rv = rv;
        let object = uri.trim_end_matches("/status");
        let (code, read) = raw(&client, "GET", object, "application/json", "").await;
        assert_eq!(code, 200);
        assert_eq!(text, String::from_utf8_lossy(&read), "the answer to {method} {uri} and a get of {object}");
    }
    let (_, read) = raw(&client, "GET", &format!("{cms}/answer"), "application/json", "").await;
    let v: serde_json::Value = serde_json::from_slice(&read).expect("JSON");
    assert_eq!(v["data"], serde_json::json!({"a": "2", "b": "3", "text": "caf\u{e9} \"quoted\" \\ tab\t ☃"}));
    assert_eq!(v["metadata"]["labels"], serde_json::json!({"x": "y"}));
    let cm_rv = v["metadata"]["resourceVersion"].clone();
    // A write with nothing to change answers the object as it is; a Table
    // is made from the object.
    let same = r#"{"data":{"b":"3"}}"#;
    let (code, answer) = raw_as(&client, "PATCH", &format!("{cms}/answer"), MERGE, "application/json", same).await;
    let v: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!((code, &v["metadata"]["resourceVersion"]), (200, &cm_rv), "{v}");
    let table = "application/json;as=Table;g=meta.k8s.io;v=v1";
    let (code, answer) =
        raw_as(&client, "PATCH", &format!("{cms}/answer"), MERGE, table, r#"{"data":{"c":"4"}}"#).await;
    let v: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!((code, v["kind"].as_str()), (200, Some("Table")), "{v}");
}
