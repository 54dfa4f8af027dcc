//! The API server's watch cache, driven over HTTPS with the `kube` client
//! and kubectl: resourceVersion semantics of lists (unset sees a write
//! just made, 0, NotOlderThan, Exact, paging), watches resumed from the
//! window, 410 Gone past the window and after compaction, a watch resumed
//! after a restart, the slow-watcher limit, selectors (spec.nodeName),
//! lists side by side sharing their writes, and updates and patches that
//! start from the cache's copy of the object.

mod common;

use std::time::{Duration, Instant};

use common::{kube_client, kube_client_without_retry, ApiServer};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

fn cm(name: &str, data: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": data}})).expect("configmap")
}

async fn create(cms: &Api<ConfigMap>, name: &str, data: &str) -> i64 {
    let made = cms.create(&PostParams::default(), &cm(name, data)).await.expect("create");
    made.metadata.resource_version.expect("rv").parse().expect("rv number")
}

/// GET `path`: status code, Retry-After, and body as JSON.
async fn get(client: &kube::Client, path: &str) -> (u16, Option<String>, Value) {
    let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
    let resp = client.send(req).await.expect("send");
    let code = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, retry, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The tests of this file run one at a time: each drives thousands of
/// objects, and side by side on two cores their timings stop meaning much.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until the root-CA publisher has written `kube-root-ca.crt` in
/// `default`, so that it does not arrive in the middle of a watch.
async fn root_ca_published(client: &kube::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !names(&get(client, CMS).await.2).iter().any(|n| n == "kube-root-ca.crt") {
        assert!(Instant::now() < deadline, "no kube-root-ca.crt in default");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rv_of(list: &Value) -> i64 {
    list["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("list resourceVersion")
}

/// A watch read line by line.
struct Watch {
    body: kube::client::Body,
    buf: Vec<u8>,
}

impl Watch {
    async fn open(client: &kube::Client, path: &str) -> Watch {
        let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
        let resp = client.send(req).await.expect("watch");
        assert_eq!(resp.status().as_u16(), 200, "watch {path}");
        Watch { body: resp.into_body(), buf: Vec::new() }
    }

    /// The next event, None at the end of the stream; fails after `limit`.
    async fn next(&mut self, limit: Duration) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("event JSON"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = tokio::time::timeout(left, self.body.frame()).await.expect("an event in time")?;
            if let Ok(data) = frame.expect("frame").into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// (type, name) of the next `n` events that are not bookmarks.
    async fn take(&mut self, n: usize) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while out.len() < n {
            let ev = self.next(Duration::from_secs(20)).await.expect("more events");
            let t = ev["type"].as_str().unwrap_or_default().to_string();
            if t == "BOOKMARK" {
                continue;
            }
            out.push((t, ev["object"]["metadata"]["name"].as_str().unwrap_or_default().to_string()));
        }
        out
    }
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

/// A server with a watch cache window of 4,096 events.
fn cached_server() -> ApiServer {
    ApiServer::start_with(
        tempfile::tempdir().expect("tempdir"),
        common::free_port(),
        &["--default-watch-cache-size", "4096"],
    )
}

#[tokio::test]
async fn lists_follow_upstreams_resource_version_semantics() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Unset: a consistent read sees every write made before it.
    for i in 0..20 {
        let name = format!("w{i}");
        create(&cms, &name, "x").await;
        let (code, _, list) = get(&client, CMS).await;
        assert_eq!(code, 200);
        assert!(names(&list).contains(&name), "a list right after the create sees {name}");
    }
    // A write elsewhere moves the store on; a consistent read still answers
    // (the idle resource's cache is confirmed current by progress).
    let (_, _, before) = get(&client, CMS).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "default");
    let s: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
    let srv: i64 = secrets
        .create(&PostParams::default(), &s)
        .await
        .expect("secret")
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    let started = Instant::now();
    let (_, _, after) = get(&client, CMS).await;
    assert!(rv_of(&after) >= srv, "the consistent list is at the store's revision {srv}: {}", rv_of(&after));
    assert!(started.elapsed() < Duration::from_secs(1), "and did not wait for a timeout: {:?}", started.elapsed());
    assert_eq!(names(&before), names(&after));

    // 0: whatever the cache has (here: everything).
    let (code, _, zero) = get(&client, &format!("{CMS}?resourceVersion=0")).await;
    assert_eq!(code, 200);
    assert!(names(&zero).contains(&"w19".to_string()));
    // Served from the cache, the objects keep their managedFields (only
    // ferrok's own informers are sent them without).
    let w19 = zero["items"].as_array().and_then(|items| items.iter().find(|i| i["metadata"]["name"] == "w19"));
    let managers = w19.map(|o| o["metadata"]["managedFields"].clone()).unwrap_or_default();
    assert!(managers.as_array().is_some_and(|m| !m.is_empty()), "managedFields from the cache: {managers}");

    // N not yet reached: upstream's 504 "Too large resource version" after ~3 s.
    // Asked by a client that does not retry (this test took 6 minutes so).
    let once = kube_client_without_retry(&server.kubeconfig()).await;
    let future = rv_of(&after) + 1000;
    let started = Instant::now();
    let (code, retry, status) = get(&once, &format!("{CMS}?resourceVersion={future}")).await;
    assert_eq!(code, 504, "{status}");
    assert_eq!(status["reason"], "Timeout");
    assert!(status["message"].as_str().unwrap_or_default().starts_with("Too large resource version"), "{status}");
    assert_eq!(retry.as_deref(), Some("1"));
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(10), "it waited ~3 s first: {waited:?}");
    // N reached: served at once, at N or newer.
    let (code, _, list) = get(&client, &format!("{CMS}?resourceVersion={srv}&resourceVersionMatch=NotOlderThan")).await;
    assert_eq!(code, 200);
    assert!(rv_of(&list) >= srv);

    // Exact: the state at that revision.
    let at = rv_of(&after);
    create(&cms, "later", "x").await;
    let (code, _, exact) = get(&client, &format!("{CMS}?resourceVersion={at}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 200);
    assert_eq!(rv_of(&exact), at);
    assert!(!names(&exact).contains(&"later".to_string()));

    // Paging: the pages are one snapshot, whatever is written in between.
    let (_, _, first) = get(&client, &format!("{CMS}?limit=5")).await;
    assert_eq!(names(&first).len(), 5);
    let total = names(&get(&client, CMS).await.2).len() as i64;
    assert_eq!(first["metadata"]["remainingItemCount"], json!(total - 5));
    let token = first["metadata"]["continue"].as_str().expect("continue").to_string();
    create(&cms, "zz-after-first-page", "x").await;
    cms.delete("w9", &DeleteParams::default()).await.expect("delete");
    let mut all = names(&first);
    let mut token = Some(token);
    while let Some(t) = token {
        let (code, _, page) = get(&client, &format!("{CMS}?limit=5&continue={t}")).await;
        assert_eq!(code, 200, "{page}");
        assert_eq!(rv_of(&page), rv_of(&first), "every page at the first page's revision");
        all.extend(names(&page));
        token = page["metadata"]["continue"].as_str().map(str::to_string);
    }
    assert!(all.contains(&"w9".to_string()) && !all.contains(&"zz-after-first-page".to_string()), "{all:?}");
    assert_eq!(all.len() as i64, total);
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted, "key order");

    // Table and metadata-only answers come from the cache too.
    let req = axum::http::Request::get(CMS)
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(kube::client::Body::empty())
        .expect("request");
    let body = client.send(req).await.expect("table").into_body().collect().await.expect("body").to_bytes();
    let table: Value = serde_json::from_slice(&body).expect("table JSON");
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"].as_array().map(Vec::len), Some(total as usize));
}

/// A list of many objects is sent as the cache's parts joined while they
/// are written: its length is told up front, and its items are the
/// store's, byte for byte once decoded.
#[tokio::test]
async fn a_large_list_from_the_cache_has_its_length_and_the_stores_items() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // About 500 KiB: several of the body's 64 KiB writes.
    let data = "d".repeat(2000);
    for i in 0..250 {
        create(&cms, &format!("big-{i:03}"), &data).await;
    }
    let req = axum::http::Request::get(CMS).body(kube::client::Body::empty()).expect("request");
    let resp = client.send(req).await.expect("list");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
    let length: Option<usize> =
        resp.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(body.len() > 500_000, "{} bytes", body.len());
    assert_eq!(length, Some(body.len()), "Content-Length is the body's length");
    let cached: Value = serde_json::from_slice(&body).expect("the list is JSON");
    assert_eq!(cached["kind"], "ConfigMapList");
    assert_eq!(cached["apiVersion"], "v1");
    let rv = rv_of(&cached);
    let (code, _, stored) = get(&client, &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 200, "{stored}");
    assert_eq!(names(&cached).iter().filter(|n| n.starts_with("big-")).count(), 250);
    assert_eq!(cached["items"], stored["items"], "the cache's list holds the store's objects at {rv}");

    // The lists share one array of the objects, changed in place between
    // lists: deletes, updates and creates anywhere in key order. A list
    // begun before deletes and read after them, frame by frame, is the
    // state it began at (whether the server still holds the array then
    // depends on the socket buffers; the array let go while held is
    // `snapshot.rs`'s unit test).
    let held = client
        .send(axum::http::Request::get(CMS).body(kube::client::Body::empty()).expect("request"))
        .await
        .expect("held list");
    let mut held = held.into_body();
    let first = held.frame().await.expect("a frame").expect("body");
    for i in (0..250).step_by(7) {
        cms.delete(&format!("big-{i:03}"), &DeleteParams::default()).await.expect("delete");
    }
    let mut rest = first.into_data().map(|d| d.to_vec()).unwrap_or_default();
    while let Some(f) = held.frame().await {
        rest.extend(f.expect("body").into_data().map(|d| d.to_vec()).unwrap_or_default());
    }
    let held: Value = serde_json::from_slice(&rest).expect("the held list is JSON");
    assert_eq!(held["items"], cached["items"], "a list sent while objects were deleted is the state it began at");
    for round in 0..3 {
        for i in (round..250).step_by(11).filter(|i| i % 7 != 0) {
            let patch = json!({"data": {"k": format!("round-{round}")}});
            cms.patch(&format!("big-{i:03}"), &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
        }
        for i in (round..250).step_by(13) {
            create(&cms, &format!("big-{i:03}-{round}"), "new").await;
        }
        let (_, _, listed) = get(&client, CMS).await;
        let rv = rv_of(&listed);
        let (_, _, stored) = get(&client, &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact")).await;
        assert_eq!(names(&listed), names(&stored), "round {round}: the cache's list has the store's objects at {rv}");
        assert_eq!(listed["items"], stored["items"], "round {round}: and their contents");
    }
}

/// Lists side by side share the writes of their objects' JSON
/// (`list_writes.rs`): each client, on its own connection, still gets
/// the whole list, the same items as the others and the store's objects.
#[tokio::test]
async fn lists_side_by_side_get_the_whole_list_each() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let client = kube_client(&server.kubeconfig()).await;
    root_ca_published(&client).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // About 600 KiB: ten shared writes.
    let data = "s".repeat(2000);
    for i in 0..300 {
        create(&cms, &format!("side-{i:03}"), &data).await;
    }
    let mut lists = Vec::new();
    for c in 0..8 {
        let client = kube_client(&server.kubeconfig()).await;
        lists.push(tokio::spawn(async move {
            let mut bodies = Vec::new();
            for path in [CMS, "/api/v1/configmaps", CMS] {
                let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
                let resp = client.send(req).await.expect("list");
                assert_eq!(resp.status().as_u16(), 200, "client {c}");
                let length: Option<usize> =
                    resp.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
                let body = resp.into_body().collect().await.expect("body").to_bytes();
                assert_eq!(length, Some(body.len()), "client {c}: Content-Length is the body's length");
                bodies.push(body);
            }
            bodies
        }));
    }
    // Each list as JSON (its head's resourceVersion may move on with
    // other resources' writes; its items may not).
    let mut answers: Vec<Vec<Value>> = Vec::new();
    for (c, l) in lists.into_iter().enumerate() {
        let bodies = l.await.expect("lister");
        answers.push(
            bodies.iter().map(|b| serde_json::from_slice(b).unwrap_or_else(|e| panic!("client {c}: {e}"))).collect(),
        );
    }
    for (c, lists) in answers.iter().enumerate() {
        assert_eq!(lists[0]["items"], lists[2]["items"], "client {c}: the same list twice");
        for (l, list) in lists.iter().enumerate() {
            assert_eq!(list["items"], answers[0][l]["items"], "client {c}, list {l}: what client 0 got");
        }
    }
    let listed = &answers[0][0];
    let rv = rv_of(listed);
    let (code, _, stored) = get(&client, &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 200, "{stored}");
    assert_eq!(names(listed).iter().filter(|n| n.starts_with("side-")).count(), 300);
    assert_eq!(listed["items"], stored["items"], "the store's objects at {rv}");
    assert!(names(&answers[0][1]).len() > 300, "every namespace's ConfigMaps: {}", names(&answers[0][1]).len());
}

#[tokio::test]
async fn watches_resume_from_the_window_and_older_revisions_are_gone() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ApiServer::start_with(
        dir,
        common::free_port(),
        &["--default-watch-cache-size", "20", "--etcd-compaction-interval", "0"],
    );
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    root_ca_published(&client).await;
    let (_, _, list) = get(&client, CMS).await;
    let r0 = rv_of(&list);
    for i in 0..5 {
        create(&cms, &format!("a{i}"), "x").await;
    }
    cms.delete("a1", &DeleteParams::default()).await.expect("delete");
    // Resumed from r0: every change after it, in order, once.
    let mut w = Watch::open(&client, &format!("{CMS}?watch=1&resourceVersion={r0}&timeoutSeconds=30")).await;
    let seen = w.take(6).await;
    let want: Vec<(String, String)> = (0..5)
        .map(|i| ("ADDED".to_string(), format!("a{i}")))
        .chain([("DELETED".to_string(), "a1".to_string())])
        .collect();
    assert_eq!(seen, want);
    // and the ones made while it watches.
    create(&cms, "b0", "x").await;
    assert_eq!(w.take(1).await, vec![("ADDED".to_string(), "b0".to_string())]);

    // Past the window (20 events): 410 with upstream's message.
    for i in 0..25 {
        create(&cms, &format!("c{i}"), "x").await;
    }
    assert_eq!(w.take(25).await.len(), 25, "the live watch got all of them");
    let mut old = Watch::open(&client, &format!("{CMS}?watch=1&resourceVersion={r0}")).await;
    let ev = old.next(Duration::from_secs(10)).await.expect("an error event");
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(ev["object"]["message"].as_str().unwrap_or_default().starts_with("too old resource version: "), "{ev}");
    assert!(old.next(Duration::from_secs(5)).await.is_none(), "and the stream ends");

    // sendInitialEvents: the current state, then the initial-events-end bookmark.
    let mut wl = Watch::open(
        &client,
        &format!("{CMS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"),
    )
    .await;
    let mut added = 0;
    loop {
        let ev = wl.next(Duration::from_secs(10)).await.expect("event");
        if ev["type"] == "BOOKMARK" {
            assert_eq!(ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
            break;
        }
        assert_eq!(ev["type"], "ADDED");
        added += 1;
    }
    assert_eq!(added, names(&get(&client, CMS).await.2).len());

    // One named object.
    let mut one = Watch::open(&client, &format!("{CMS}?watch=1&fieldSelector=metadata.name%3Dc3")).await;
    assert_eq!(one.take(1).await, vec![("ADDED".to_string(), "c3".to_string())]);
    cms.delete("c4", &DeleteParams::default()).await.expect("delete");
    cms.delete("c3", &DeleteParams::default()).await.expect("delete");
    assert_eq!(one.take(1).await, vec![("DELETED".to_string(), "c3".to_string())]);
}

#[tokio::test]
async fn a_watch_from_before_the_cache_is_served_until_compacted() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let server =
        ApiServer::start_with(dir, port, &["--default-watch-cache-size", "4096", "--etcd-compaction-interval", "0"]);
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    root_ca_published(&client).await;
    let (_, _, list) = get(&client, CMS).await;
    let last_seen = rv_of(&list);
    create(&cms, "while-away", "x").await;

    // A new process on the same data dir: the client resumes from the last
    // revision it saw and gets what it missed, then what comes after.
    let (dir, port) = server.stop();
    let server =
        ApiServer::start_with(dir, port, &["--default-watch-cache-size", "4096", "--etcd-compaction-interval", "0"]);
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (_, _, _) = get(&client, CMS).await;
    let mut w = Watch::open(&client, &format!("{CMS}?watch=1&resourceVersion={last_seen}&timeoutSeconds=60")).await;
    assert_eq!(w.take(1).await, vec![("ADDED".to_string(), "while-away".to_string())]);
    create(&cms, "after-restart", "x").await;
    assert_eq!(w.take(1).await, vec![("ADDED".to_string(), "after-restart".to_string())]);
    drop(w);

    // (A watch compacted while it runs is 410 too: compaction starts only now.)
    let (dir, port) = server.stop();
    let server =
        ApiServer::start_with(dir, port, &["--default-watch-cache-size", "4096", "--etcd-compaction-interval", "1s"]);
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Once the store has compacted that history, the same watch is 410.
    let deadline = Instant::now() + Duration::from_secs(30);
    for tick in 0.. {
        create(&cms, &format!("tick-{tick}"), "x").await;
        let mut again =
            Watch::open(&client, &format!("{CMS}?watch=1&resourceVersion={last_seen}&timeoutSeconds=1")).await;
        let first = again.next(Duration::from_secs(10)).await;
        if let Some(ev) = first.filter(|e| e["type"] == "ERROR") {
            assert_eq!(ev["object"]["code"], 410, "{ev}");
            break;
        }
        assert!(Instant::now() < deadline, "the watch never became 410 after compaction");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_watcher_that_does_not_read_is_ended_and_the_others_get_everything() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let client = kube_client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    root_ca_published(&client).await;
    let (_, _, list) = get(&client, CMS).await;
    let r0 = rv_of(&list);
    // Each on its own connection.
    let stuck_client = kube_client(&server.kubeconfig()).await;
    let mut stuck = Watch::open(&stuck_client, &format!("{CMS}?watch=1&resourceVersion={r0}&timeoutSeconds=300")).await;
    let mut reader = Watch::open(&client, &format!("{CMS}?watch=1&resourceVersion={r0}&timeoutSeconds=300")).await;
    let n = 120;
    let big = "x".repeat(256 << 10);
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            for i in 0..n {
                create(&cms, &format!("big-{i:03}"), &big).await;
            }
        })
    };
    let got = reader.take(n).await;
    writer.await.expect("writer");
    let want: Vec<(String, String)> = (0..n).map(|i| ("ADDED".to_string(), format!("big-{i:03}"))).collect();
    assert_eq!(got, want, "the reading watcher got every event, in order");
    // The stuck one got a prefix, then the end of its stream (long before
    // its timeout).
    let mut stuck_got = 0;
    while let Some(ev) = stuck.next(Duration::from_secs(20)).await {
        assert_eq!(ev["object"]["metadata"]["name"], format!("big-{stuck_got:03}"), "a prefix, in order");
        stuck_got += 1;
    }
    assert!(stuck_got < n, "the stuck watcher was ended ({stuck_got} of {n} events)");
}

#[tokio::test]
async fn selectors_and_the_node_name_index() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let client = kube_client(&server.kubeconfig()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, node: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "a"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod")
    };
    const PODS: &str = "/api/v1/pods";
    let mut w = Watch::open(&client, &format!("{PODS}?watch=1&fieldSelector=spec.nodeName%3Dn1")).await;
    for (name, node) in [("p1", "n1"), ("p2", "n2"), ("p3", "n1")] {
        pods.create(&PostParams::default(), &pod(name, node)).await.expect("create pod");
    }
    assert_eq!(w.take(2).await, vec![("ADDED".into(), "p1".into()), ("ADDED".into(), "p3".into())]);
    let (_, _, on_n1) = get(&client, &format!("{PODS}?fieldSelector=spec.nodeName%3Dn1")).await;
    assert_eq!(names(&on_n1), vec!["p1", "p3"]);
    let (_, _, paged) = get(&client, &format!("{PODS}?fieldSelector=spec.nodeName%3Dn1&limit=1")).await;
    assert_eq!(names(&paged), vec!["p1"]);
    let token = paged["metadata"]["continue"].as_str().expect("continue");
    let (_, _, rest) = get(&client, &format!("{PODS}?fieldSelector=spec.nodeName%3Dn1&limit=1&continue={token}")).await;
    assert_eq!(names(&rest), vec!["p3"]);
    let (_, _, not_n1) = get(&client, &format!("{PODS}?fieldSelector=spec.nodeName!%3Dn1")).await;
    assert_eq!(names(&not_n1), vec!["p2"]);
    pods.delete("p2", &DeleteParams::default().grace_period(0)).await.expect("delete");
    pods.delete("p1", &DeleteParams::default().grace_period(0)).await.expect("delete");
    assert_eq!(w.take(1).await, vec![("DELETED".into(), "p1".into())], "p2 is on n2, not seen");

    // A label that stops or starts matching: DELETED and ADDED for the watcher.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut lw = Watch::open(&client, &format!("{CMS}?watch=1&labelSelector=tier%3Dweb")).await;
    let labelled = |tier: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "l", "labels": {"tier": tier}}})).expect("cm")
    };
    cms.create(&PostParams::default(), &labelled("db")).await.expect("create");
    cms.replace("l", &PostParams::default(), &{
        let mut c = cms.get("l").await.expect("get");
        c.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
        c
    })
    .await
    .expect("relabel");
    assert_eq!(lw.take(1).await, vec![("ADDED".into(), "l".into())]);
    cms.replace("l", &PostParams::default(), &{
        let mut c = cms.get("l").await.expect("get");
        c.metadata.labels = Some([("tier".to_string(), "db".to_string())].into());
        c
    })
    .await
    .expect("relabel");
    assert_eq!(lw.take(1).await, vec![("DELETED".into(), "l".into())]);
}

/// Updates and patches start from the cache's copy of the object (as
/// upstream's GuaranteedUpdate does) and fall back to the store's when
/// it was behind: writers racing on one object lose no write, a patch
/// without a resourceVersion never fails for a race it lost, and a
/// precondition on an old resourceVersion is still refused.
#[tokio::test]
async fn writers_racing_on_one_object_lose_nothing() {
    let _serial = SERIAL.lock().await;
    let server = cached_server();
    let kubeconfig = server.kubeconfig();
    let client = kube_client(&kubeconfig).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create(&cms, "shared", "0").await;
    let (writers, rounds) = (8usize, 20usize);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let cms: Api<ConfigMap> = Api::namespaced(kube_client_without_retry(&kubeconfig).await, "default");
        tasks.push(tokio::spawn(async move {
            let (mut refused, mut seen) = (0, 0i64);
            // What this writer was answered never goes back in time.
            let mut saw = |cm: &ConfigMap, what: &str| {
                let rv: i64 = cm.metadata.resource_version.as_deref().and_then(|r| r.parse().ok()).expect("rv");
                assert!(rv >= seen, "writer {w}: {what} answered revision {rv} after {seen}");
                seen = rv;
                rv
            };
            for i in 0..rounds {
                // A merge patch: retried by the server on the newer object.
                let key = format!("p{w}-{i}");
                let patch = json!({"data": {key.clone(): "x"}});
                for what in ["patch", "the same patch again"] {
                    let got = cms
                        .patch("shared", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                        .await
                        .unwrap_or_else(|e| panic!("writer {w}: {what} {i}: {e}"));
                    saw(&got, what);
                    assert!(
                        got.data.unwrap_or_default().contains_key(&key),
                        "writer {w}: {what} {i} answered without it"
                    );
                }
                // A key every writer sets: when the cache's copy already
                // has this writer's value, only the store's can tell
                // whether the patch has anything to do.
                saw(&cms.get("shared").await.expect("get"), "get");
                let turn = json!({"data": {"turn": w.to_string()}});
                let got = cms
                    .patch("shared", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&turn))
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}: turn {i}: {e}"));
                saw(&got, "turn");
                assert_eq!(got.data.unwrap_or_default().get("turn"), Some(&w.to_string()), "writer {w}: turn {i}");
                // A read-modify-write with the resourceVersion it read:
                // refused (409) only when another writer came between.
                let key = format!("u{w}-{i}");
                loop {
                    let mut cm = cms.get("shared").await.expect("get");
                    let read = saw(&cm, "get");
                    cm.data.get_or_insert_with(Default::default).insert(key.clone(), "x".into());
                    match cms.replace("shared", &PostParams::default(), &cm).await {
                        Ok(cm) => {
                            saw(&cm, "update");
                            break;
                        }
                        Err(kube::Error::Api(e)) if e.code == 409 => refused += 1,
                        Err(e) => panic!("writer {w}: update {i}: {e}"),
                    }
                    let now = cms.get("shared").await.expect("get");
                    assert!(saw(&now, "get") > read, "writer {w}: update {i} at the current revision {read} refused");
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.expect("writer");
    }
    let data = cms.get("shared").await.expect("get").data.unwrap_or_default();
    let missing: Vec<String> = (0..writers)
        .flat_map(|w| (0..rounds).flat_map(move |i| [format!("p{w}-{i}"), format!("u{w}-{i}")]))
        .filter(|k| !data.contains_key(k))
        .collect();
    assert!(missing.is_empty(), "lost writes: {missing:?} ({refused} updates refused on the way)");

    // An update or a patch naming an old resourceVersion is refused.
    let old = cms.get("shared").await.expect("get");
    let old_rv = old.metadata.resource_version.clone().expect("rv");
    cms.patch("shared", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&json!({"data": {"k": "1"}})))
        .await
        .expect("patch");
    match cms.replace("shared", &PostParams::default(), &old).await {
        Err(kube::Error::Api(e)) => assert_eq!((e.code, e.reason.as_str()), (409, "Conflict")),
        other => panic!("an update at an old resourceVersion: {other:?}"),
    }
    let pinned = json!({"metadata": {"resourceVersion": old_rv}, "data": {"k": "2"}});
    match cms.patch("shared", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&pinned)).await {
        Err(kube::Error::Api(e)) => assert_eq!((e.code, e.reason.as_str()), (409, "Conflict")),
        other => panic!("a patch at an old resourceVersion: {other:?}"),
    }
    // The same patch with nothing left to change answers the stored object.
    let again = json!({"data": {"k": "1"}});
    let same =
        cms.patch("shared", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&again)).await.expect("patch");
    let now = cms.get("shared").await.expect("get");
    assert_eq!(same.metadata.resource_version, now.metadata.resource_version);
    assert_eq!(same.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("1"));
}

/// The cache held behind the store (each change waits 300 ms before the
/// cache applies it): an update or a pinned patch at the store's
/// revision is not refused for the cache's older one, and a patch that
/// the cache's copy already shows is still written when the store's copy
/// has changed since.
#[tokio::test]
async fn writes_from_a_cache_behind_the_store_are_decided_by_the_store() {
    let _serial = SERIAL.lock().await;
    let server = ApiServer::start_with_env(
        tempfile::tempdir().expect("tempdir"),
        common::free_port(),
        &["--default-watch-cache-size", "4096"],
        &[("FERROK_TEST_WATCH_CACHE_LAG_MS", "300")],
    );
    let client = kube_client_without_retry(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let params = kube::api::PatchParams::default();
    let set = |v: &str| json!({"data": {"k": v}});
    let rv =
        |cm: &ConfigMap| -> i64 { cm.metadata.resource_version.as_deref().and_then(|r| r.parse().ok()).expect("rv") };
    // Waits until the cache holds revision `at`.
    let caught_up = |at: i64| {
        let client = client.clone();
        async move {
            let path = format!("{CMS}?resourceVersion={at}&resourceVersionMatch=NotOlderThan&limit=1");
            let deadline = Instant::now() + Duration::from_secs(60);
            while get(&client, &path).await.0 != 200 {
                assert!(Instant::now() < deadline, "the cache never reached {at}");
            }
        }
    };
    let made = create(&cms, "lagging", "0").await;
    caught_up(made).await;

    // An update at the revision a GET (the store) gave, while the cache
    // still holds the one before.
    let r1 = rv(&cms.patch("lagging", &params, &kube::api::Patch::Merge(&set("1"))).await.expect("patch"));
    let mut cm = cms.get("lagging").await.expect("get");
    assert_eq!(rv(&cm), r1);
    cm.data.get_or_insert_with(Default::default).insert("k".into(), "2".into());
    let updated = cms.replace("lagging", &PostParams::default(), &cm).await.expect("update at the store's revision");
    let r2 = rv(&updated);
    assert!(r2 > r1);

    // A patch pinned to the store's revision.
    let mut pinned = set("3");
    pinned["metadata"] = json!({"resourceVersion": r2.to_string()});
    let r3 = rv(&cms.patch("lagging", &params, &kube::api::Patch::Merge(&pinned)).await.expect("pinned patch"));
    assert!(r3 > r2);

    // The cache's copy says k=2 (r2), the store's k=3 (r3): setting k=2
    // is a write, not an answer from the cache's copy.
    caught_up(r2).await;
    let got = cms.patch("lagging", &params, &kube::api::Patch::Merge(&set("2"))).await.expect("patch");
    assert!(rv(&got) > r3, "answered revision {} after {r3}", rv(&got));
    assert_eq!(got.data.clone().unwrap_or_default().get("k").map(String::as_str), Some("2"));
    caught_up(rv(&got)).await;
    let now = cms.get("lagging").await.expect("get");
    assert_eq!((rv(&now), now.data.unwrap_or_default().get("k").cloned()), (rv(&got), Some("2".to_string())));
}

/// On etcd (the test machine's is 3.4.23, which answers a requested
/// progress notification ahead of events still on their way), the cache
/// never takes such an answer for events it has not seen: each writer's
/// consistent list right after its write shows that write, and once the
/// writes stop the cache holds every object as last written, at a revision
/// past the last write.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_on_etcd_reads_its_writes_and_loses_no_event() {
    let _serial = SERIAL.lock().await;
    let etcd = common::start_etcd().await;
    let endpoint = format!("http://{}", etcd.endpoint);
    let server = ApiServer::start_with(
        tempfile::tempdir().expect("tempdir"),
        common::free_port(),
        &["--datastore-endpoint", &endpoint, "--default-watch-cache-size", "4096"],
    );
    let kubeconfig = server.kubeconfig();
    let (writers, rounds) = (16usize, 200usize);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = kube_client_without_retry(&kubeconfig).await;
        tasks.push(tokio::spawn(async move {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let name = format!("w{w}");
            let mut last = create(&cms, &name, "0").await;
            for i in 1..=rounds {
                let patch = json!({"data": {"k": i.to_string()}});
                let got = cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
                last = got.metadata.resource_version.as_deref().and_then(|r| r.parse().ok()).expect("rv");
                // A consistent list (resourceVersion unset) sees the write.
                let (code, _, list) = get(&client, CMS).await;
                assert_eq!(code, 200, "list: {list}");
                let mine = list["items"].as_array().into_iter().flatten().find(|cm| cm["metadata"]["name"] == name);
                let seen = mine.map(|cm| cm["data"]["k"].clone());
                assert_eq!(seen, Some(json!(i.to_string())), "writer {w}: round {i} written at {last}, then listed");
            }
            last
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.expect("writer"));
    }
    // The cache (resourceVersion=0 is always served from it) reaches the
    // last write and holds every object as written.
    let client = kube_client(&kubeconfig).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let list = loop {
        let (code, _, list) = get(&client, &format!("{CMS}?resourceVersion=0")).await;
        assert_eq!(code, 200, "list: {list}");
        if rv_of(&list) >= last {
            break list;
        }
        assert!(Instant::now() < deadline, "the cache never reached {last}: {}", rv_of(&list));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for w in 0..writers {
        let cm = list["items"].as_array().into_iter().flatten().find(|cm| cm["metadata"]["name"] == format!("w{w}"));
        assert_eq!(cm.map(|cm| cm["data"]["k"].clone()), Some(json!(rounds.to_string())), "w{w} in the cache");
    }
}
