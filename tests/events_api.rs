//! events.k8s.io/v1 and core/v1 Events are one set of objects, as
//! upstream serves them: what one API writes the other reads, lists (with
//! each API's field selectors), watches, patches and deletes, the fields
//! renamed between them (`regarding`/`involvedObject`, `note`/`message`,
//! `reportingController`/`reportingComponent`, ...); events.k8s.io/v1
//! creates are checked as upstream checks them; both expire after
//! `--event-ttl`. Driven by the `kube` crate against `ferrok server`.

mod common;

use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::events::v1 as events;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

async fn start(extra: &'static [&'static str]) -> (common::ApiServer, kube::Client) {
    let server = tokio::task::spawn_blocking(move || {
        common::ApiServer::start_with(tempfile::tempdir().expect("tempdir"), common::free_port(), extra)
    })
    .await
    .expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;
    (server, client)
}

async fn namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<core::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    namespaces.create(&PostParams::default(), &ns).await.expect("create namespace");
}

/// The Event the conformance suite makes (test/e2e/instrumentation/events.go).
fn new_event(ns: &str, name: &str, label: &str) -> events::Event {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {label: "true"}},
        "regarding": {"namespace": ns},
        "eventTime": "2017-09-19T13:49:16.000000Z",
        "note": format!("This is {name}"),
        "action": "Do",
        "reason": "Test",
        "type": "Normal",
        "reportingController": "test-controller",
        "reportingInstance": "test-node"
    }))
    .expect("event")
}

fn names<K: kube::Resource>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.meta().name.clone().unwrap_or_default()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_made_through_one_api_is_read_patched_and_deleted_through_both() {
    let (_server, client) = start(&[]).await;
    let ns = "ev";
    namespace(&client, ns).await;
    let v1: Api<events::Event> = Api::namespaced(client.clone(), ns);
    let v1_all: Api<events::Event> = Api::all(client.clone());
    let core_events: Api<core::Event> = Api::namespaced(client.clone(), ns);

    v1.create(&PostParams::default(), &new_event(ns, "event-test", "testevent-constant")).await.expect("create");
    let labelled = ListParams::default().labels("testevent-constant=true");
    assert_eq!(names(&v1_all.list(&labelled).await.expect("list").items), ["event-test"]);
    assert_eq!(names(&v1.list(&labelled).await.expect("list").items), ["event-test"]);

    // The core API reads it, its `source` selector falling back to the
    // reporting controller, and its fields under the core names.
    let by_source = core_events.list(&ListParams::default().fields("source=test-controller")).await.expect("list");
    assert_eq!(names(&by_source.items), ["event-test"]);
    let as_core = &by_source.items[0];
    assert_eq!(as_core.message.as_deref(), Some("This is event-test"));
    assert_eq!(as_core.reporting_component.as_deref(), Some("test-controller"));
    assert_eq!(as_core.involved_object.namespace.as_deref(), Some(ns));
    assert_eq!(as_core.action.as_deref(), Some("Do"));
    let by_controller =
        v1.list(&ListParams::default().fields("reportingController=test-controller")).await.expect("list");
    assert_eq!(names(&by_controller.items), ["event-test"]);
    let none = v1.list(&ListParams::default().fields("reportingController=other")).await.expect("list");
    assert!(none.items.is_empty());

    // A strategic merge patch of the note, then an update with a series:
    // each read back exactly as written.
    let mut want = v1.get("event-test").await.expect("get");
    v1.patch("event-test", &PatchParams::default(), &Patch::Strategic(json!({"note": "patched"})))
        .await
        .expect("patch");
    let mut got = v1.get("event-test").await.expect("get");
    want.note = Some("patched".into());
    for e in [&mut want, &mut got] {
        e.metadata.resource_version = None;
        e.metadata.managed_fields = None;
    }
    assert_eq!(got, want);
    assert_eq!(core_events.get("event-test").await.expect("get").message.as_deref(), Some("patched"));
    want.series = serde_json::from_value(json!({"count": 100, "lastObservedTime": "2017-09-19T13:49:16.000000Z"}))
        .expect("series");
    v1.replace("event-test", &PostParams::default(), &want).await.expect("update");
    let mut got = v1.get("event-test").await.expect("get");
    got.metadata.resource_version = None;
    got.metadata.managed_fields = None;
    assert_eq!(got, want);
    let series = core_events.get("event-test").await.expect("get").series.expect("series");
    assert_eq!(series.count, Some(100));

    v1.delete("event-test", &DeleteParams::default()).await.expect("delete");
    assert!(v1.list(&labelled).await.expect("list").items.is_empty());
    assert!(core_events.get_opt("event-test").await.expect("get").is_none());

    // The other way: a core Event read through events.k8s.io/v1, selected
    // by the new names of its fields.
    let core_event: core::Event = serde_json::from_value(json!({
        "metadata": {"name": "from-core"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": ns},
        "reason": "Pulled", "message": "pulled the image", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": "2024-01-01T00:00:00Z", "lastTimestamp": "2024-01-01T00:01:00Z", "count": 3
    }))
    .expect("event");
    core_events.create(&PostParams::default(), &core_event).await.expect("create");
    let found = v1.list(&ListParams::default().fields("regarding.name=web,reason=Pulled")).await.expect("list");
    assert_eq!(names(&found.items), ["from-core"]);
    let e = &found.items[0];
    assert_eq!(e.note.as_deref(), Some("pulled the image"));
    assert_eq!(e.regarding.as_ref().and_then(|r| r.kind.as_deref()), Some("Pod"));
    assert_eq!(e.deprecated_count, Some(3));
    assert_eq!(e.deprecated_source.as_ref().and_then(|s| s.host.as_deref()), Some("node-1"));
    assert!(e.deprecated_first_timestamp.is_some() && e.deprecated_last_timestamp.is_some());
    let (code, body) =
        common::raw(&client, "GET", &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events/from-core"), "*/*", "")
            .await;
    let raw: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!((code, &raw["apiVersion"], &raw["kind"]), (200, &json!("events.k8s.io/v1"), &json!("Event")));
    assert!(raw.get("involvedObject").is_none() && raw.get("message").is_none(), "{raw}");
    // The core selectors do not apply to events.k8s.io/v1, as upstream.
    let refused = v1.list(&ListParams::default().fields("involvedObject.name=web")).await.unwrap_err();
    assert!(matches!(&refused, kube::Error::Api(s) if s.code == 400), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn watches_and_collection_deletes_span_both_apis() {
    let (_server, client) = start(&[]).await;
    let ns = "watched";
    namespace(&client, ns).await;
    let v1: Api<events::Event> = Api::namespaced(client.clone(), ns);
    let core_events: Api<core::Event> = Api::namespaced(client.clone(), ns);

    // A watch of events.k8s.io/v1, selecting by `regarding.name`, sees a
    // core Event about that object, in its own form.
    let params = WatchParams::default().fields("regarding.name=target").timeout(20);
    let mut watch = v1.watch(&params, "0").await.expect("watch").boxed();
    for (name, about) in [("other", "elsewhere"), ("about-target", "target")] {
        let e: core::Event = serde_json::from_value(json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": "ConfigMap", "name": about, "namespace": ns},
            "reason": "Changed", "message": format!("{about} changed"), "type": "Normal"
        }))
        .expect("event");
        core_events.create(&PostParams::default(), &e).await.expect("create");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let seen = loop {
        assert!(Instant::now() < deadline, "no watch event");
        match tokio::time::timeout(Duration::from_secs(20), watch.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(e)))) => break e,
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => continue,
            other => panic!("unexpected watch item: {other:?}"),
        }
    };
    assert_eq!(seen.metadata.name.as_deref(), Some("about-target"));
    assert_eq!(seen.note.as_deref(), Some("target changed"));
    // And its deletion through the core API.
    core_events.delete("about-target", &DeleteParams::default()).await.expect("delete");
    match tokio::time::timeout(Duration::from_secs(20), watch.try_next()).await {
        Ok(Ok(Some(WatchEvent::Deleted(e)))) => assert_eq!(e.metadata.name.as_deref(), Some("about-target")),
        other => panic!("unexpected watch item: {other:?}"),
    }

    // A collection deleted through events.k8s.io/v1 by label is gone from both.
    for name in ["test-event-1", "test-event-2", "test-event-3"] {
        v1.create(&PostParams::default(), &new_event(ns, name, "testevent-set")).await.expect("create");
    }
    let set = ListParams::default().labels("testevent-set=true");
    assert_eq!(v1.list(&set).await.expect("list").items.len(), 3);
    assert_eq!(core_events.list(&set).await.expect("list").items.len(), 3);
    v1.delete_collection(&DeleteParams::default(), &set).await.expect("delete collection");
    assert!(v1.list(&set).await.expect("list").items.is_empty());
    assert!(core_events.list(&set).await.expect("list").items.is_empty());
    assert_eq!(names(&core_events.list(&ListParams::default()).await.expect("list").items), ["other"]);
}

async fn refused(client: &kube::Client, path: &str, body: serde_json::Value) -> Vec<String> {
    let (code, out) = common::raw(client, "POST", path, "application/json", &body.to_string()).await;
    let status: serde_json::Value = serde_json::from_slice(&out).expect("status");
    assert_eq!((code, &status["reason"]), (422, &json!("Invalid")), "{status}");
    let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
    causes
        .iter()
        .map(|c| format!("{}: {}", c["field"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or("")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_are_validated_as_upstream_validates_them() {
    let (_server, client) = start(&[]).await;
    let ns = "checked";
    namespace(&client, ns).await;
    let v1_path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events");
    let core_path = format!("/api/v1/namespaces/{ns}/events");

    // events.k8s.io/v1 asks for what a new Event says about itself, and
    // none of the fields it deprecates.
    let causes = refused(
        &client,
        &v1_path,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "bare"},
            "regarding": {"namespace": ns}, "type": "Sometimes", "deprecatedCount": 2,
            "series": {"count": 1, "lastObservedTime": "2024-01-01T00:00:00.000000Z"}}),
    )
    .await;
    for want in [
        "eventTime: Required value",
        "type: Invalid value: \"\": has invalid value: Sometimes",
        "count: Invalid value: \"\": needs to be unset",
        "series.count: Invalid value: \"\": should be at least 2",
    ] {
        assert!(causes.iter().any(|c| c == want), "{want} not in {causes:?}");
    }
    let causes = refused(
        &client,
        &v1_path,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "unreported"},
            "regarding": {"namespace": ns}, "eventTime": "2024-01-01T00:00:00.000000Z", "type": "Normal",
            "reportingInstance": "x".repeat(129)}),
    )
    .await;
    for want in [
        "reportingController: Required value",
        "reportingInstance: Invalid value: \"\": can have at most 128 characters",
        "action: Required value",
        "reason: Required value",
    ] {
        assert!(causes.iter().any(|c| c == want), "{want} not in {causes:?}");
    }
    // A core Event of the old kind names an object of its own namespace.
    let causes = refused(
        &client,
        &core_path,
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "astray"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "elsewhere"}, "reason": "R"}),
    )
    .await;
    assert_eq!(causes, ["involvedObject.namespace: Invalid value: \"elsewhere\": does not match event.namespace"]);
    // ... while the core API takes an Event without the new fields.
    let (code, out) = common::raw(
        &client,
        "POST",
        &core_path,
        "application/json",
        &json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "plain"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns}, "reason": "R"})
        .to_string(),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn events_of_both_apis_expire_after_the_event_ttl() {
    let (_server, client) = start(&["--event-ttl", "3s"]).await;
    let ns = "brief";
    namespace(&client, ns).await;
    let v1: Api<events::Event> = Api::namespaced(client.clone(), ns);
    let core_events: Api<core::Event> = Api::namespaced(client.clone(), ns);
    v1.create(&PostParams::default(), &new_event(ns, "new-api", "l")).await.expect("create");
    let old: core::Event = serde_json::from_value(json!({
        "metadata": {"name": "old-api"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
        "reason": "R", "message": "m"
    }))
    .expect("event");
    core_events.create(&PostParams::default(), &old).await.expect("create");
    assert_eq!(names(&core_events.list(&ListParams::default()).await.expect("list").items), ["new-api", "old-api"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = v1.list(&ListParams::default()).await.expect("list").items;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still there after the TTL: {:?}", names(&left));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
