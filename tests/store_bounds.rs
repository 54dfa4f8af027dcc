//! The store stays bounded: the API server compacts it every
//! `--etcd-compaction-interval` (seen through `--datastore-listen` as etcd
//! clients see it), Events expire after `--event-ttl` through store leases,
//! and a space quota turns writes away with etcd's NOSPACE error while
//! reads, deletes and compaction go on.

mod common;

use std::time::{Duration, Instant};

use common::{eventually_within, free_port, kubectl, ApiServer};
use ferrok::store::proto::kv_client::KvClient;
use ferrok::store::proto::RangeRequest;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use tonic::transport::Channel;

/// A server with its store also served to etcd clients; the etcd URL.
fn start(extra: &[&str]) -> (ApiServer, String) {
    let url = format!("http://127.0.0.1:{}", free_port());
    let mut args = vec!["--datastore-listen", url.as_str()];
    args.extend_from_slice(extra);
    (ApiServer::start_with(tempfile::tempdir().expect("tempdir"), free_port(), &args), url)
}

async fn kv(url: &str) -> KvClient<Channel> {
    KvClient::new(common::channel(url).await)
}

async fn client(s: &ApiServer) -> kube::Client {
    common::kube_client(&s.kubeconfig()).await
}

fn config_map(name: &str, bytes: usize) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.data = Some([("data".to_string(), "x".repeat(bytes))].into_iter().collect());
    cm
}

/// Polls an async condition every 100 ms until `limit`.
async fn eventually_async<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `etcdctl endpoint status -w json`'s one status.
fn endpoint_status(url: &str) -> serde_json::Value {
    let (ok, out, err) = common::etcdctl(url, &["endpoint", "status", "-w", "json"], None);
    assert!(ok, "etcdctl endpoint status: {out} {err}");
    let mut all: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    all[0]["Status"].take()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_compacts_the_store_every_interval() {
    let (s, url) = start(&["--etcd-compaction-interval", "2s"]);
    let mut kv = kv(&url).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&s).await, "default");
    for i in 0..5 {
        cms.create(&PostParams::default(), &config_map(&format!("page-{i}"), 10)).await.expect("create");
    }
    // A paged list: its continue token reads at the first page's revision.
    let (ok, first) = kubectl(&s, &["get", "--raw", "/api/v1/namespaces/default/configmaps?limit=2"]);
    assert!(ok, "{first}");
    let page: serde_json::Value = serde_json::from_str(&first).expect("list JSON");
    let token = page["metadata"]["continue"].as_str().expect("a continue token").to_string();
    let listed_at: i64 = page["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("rv");
    let next = format!("/api/v1/namespaces/default/configmaps?limit=2&continue={token}");
    let (ok, second) = kubectl(&s, &["get", "--raw", &next]);
    assert!(ok, "the next page is served before compaction: {second}");

    // Writes after the list; two intervals later the list's revision is gone.
    cms.create(&PostParams::default(), &config_map("after", 10)).await.expect("create");
    eventually_async("the list's revision to be compacted", Duration::from_secs(30), || {
        let mut kv = kv.clone();
        async move {
            let old =
                RangeRequest { key: b"/registry/configmaps/".to_vec(), revision: listed_at, ..Default::default() };
            match kv.range(old).await {
                Ok(_) => false,
                Err(status) => {
                    assert_eq!(status.message(), "etcdserver: mvcc: required revision has been compacted");
                    true
                }
            }
        }
    })
    .await;
    let (ok, expired) = kubectl(&s, &["get", "--raw", &next]);
    assert!(
        !ok && expired.contains("Error from server (Expired)"),
        "a compacted continue token is 410 Expired: {expired}"
    );
    let (ok, fresh) = kubectl(&s, &["get", "configmaps", "-o", "name", "--chunk-size=2"]);
    assert!(ok && fresh.contains("configmap/page-4") && fresh.contains("configmap/after"), "{fresh}");

    // The servers' handshake key, as upstream's: its version counts the rounds.
    let key = RangeRequest { key: b"compact_rev_key".to_vec(), ..Default::default() };
    let handshake = kv.range(key).await.expect("range").into_inner();
    assert!(handshake.kvs.first().is_some_and(|kv| kv.version >= 2), "{handshake:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn events_expire_after_the_event_ttl() {
    let (s, url) = start(&["--event-ttl", "3s"]);
    let mut kv = kv(&url).await;
    let event = r#"{"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "short-lived", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Tested", "message": "gone soon", "type": "Normal"}"#;
    common::create(&s, event);
    let (ok, out) = kubectl(&s, &["get", "event", "short-lived", "-o", "name"]);
    assert!(ok, "{out}");
    // Stored with a lease attached, as upstream writes Events.
    let key = RangeRequest { key: b"/registry/events/default/short-lived".to_vec(), ..Default::default() };
    let stored = kv.range(key.clone()).await.expect("range").into_inner();
    assert!(stored.kvs.first().is_some_and(|kv| kv.lease != 0), "{stored:?}");
    eventually_within("the Event to expire", Duration::from_secs(30), || {
        let (ok, out) = kubectl(&s, &["get", "event", "short-lived", "-o", "name"]);
        !ok && out.contains("NotFound")
    });
    assert!(kv.range(key).await.expect("range").into_inner().kvs.is_empty());
    // Other objects carry no lease.
    let ns = RangeRequest { key: b"/registry/namespaces/default".to_vec(), ..Default::default() };
    assert!(kv.range(ns).await.expect("range").into_inner().kvs.iter().all(|kv| kv.lease == 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_store_refuses_writes_and_keeps_reads_and_deletes() {
    let (s, url) = start(&["--quota-backend-bytes", "12000000", "--etcd-compaction-interval", "0"]);
    let cms: Api<ConfigMap> = Api::namespaced(client(&s).await, "default");
    let mut created = Vec::new();
    let refused = loop {
        let name = format!("big-{}", created.len());
        match cms.create(&PostParams::default(), &config_map(&name, 700_000)).await {
            Ok(_) => created.push(name),
            Err(e) => break e,
        }
        assert!(created.len() < 40, "the quota never tripped");
    };
    let kube::Error::Api(status) = refused else { panic!("not a Status: {refused}") };
    assert_eq!(status.code, 500);
    assert_eq!(status.message, "etcdserver: mvcc: database space exceeded");
    assert!(status.reason.is_empty(), "upstream's Status has no reason here: {:?}", status.reason);
    let (ok, out) = kubectl(&s, &["create", "configmap", "small", "--from-literal=a=b"]);
    assert!(!ok && out.contains("etcdserver: mvcc: database space exceeded"), "{out}");

    // Reads and deletes go on; the alarm shows as etcd shows it.
    let first = &created[0];
    cms.get(first).await.expect("a read under NOSPACE");
    let (ok, out) = kubectl(&s, &["get", "configmaps", "-o", "name"]);
    assert!(ok && out.contains(first.as_str()), "{out}");
    let (ok, alarms, err) = common::etcdctl(&url, &["alarm", "list"], None);
    assert!(ok && alarms.contains("alarm:NOSPACE"), "{alarms} {err}");
    for name in &created {
        cms.delete(name, &DeleteParams::default()).await.expect("a delete under NOSPACE");
    }

    // The operator's recovery: compact, disarm; writes come back.
    // `endpoint status` as etcd 3.4's etcdctl sends it (the URL as :authority).
    let status = endpoint_status(&url);
    assert_eq!(status["errors"], serde_json::json!([alarms.trim_end_matches('\n')]), "{status}");
    let head = status["header"]["revision"].as_i64().expect("revision").to_string();
    let (ok, out, err) = common::etcdctl(&url, &["compact", &head, "--physical"], None);
    assert!(ok, "compaction under NOSPACE: {out} {err}");
    let (ok, out) = kubectl(&s, &["create", "configmap", "small", "--from-literal=a=b"]);
    assert!(!ok, "the alarm holds until disarmed: {out}");
    let (ok, out, err) = common::etcdctl(&url, &["alarm", "disarm"], None);
    assert!(ok, "{out} {err}");
    let (ok, alarms, err) = common::etcdctl(&url, &["alarm", "list"], None);
    assert!(ok && alarms.is_empty(), "{alarms} {err}");
    assert!(endpoint_status(&url).get("errors").is_none(), "no errors once disarmed");
    let (ok, out) = kubectl(&s, &["create", "configmap", "small", "--from-literal=a=b"]);
    assert!(ok, "{out}");
}
