//! The requests the Kubernetes apiserver sends to etcd, sent by a gRPC client
//! to real etcd 3.4, to `ferrok datastore`, and to `ferrok datastore
//! --datastore-endpoint` in front of real etcd; the three must answer alike.

mod common;

use std::time::Duration;

use common::*;
use ferrok::store::proto::compare::{CompareResult, CompareTarget, TargetUnion};
use ferrok::store::proto::kv_client::KvClient;
use ferrok::store::proto::lease_client::LeaseClient;
use ferrok::store::proto::watch_client::WatchClient;
use ferrok::store::proto::*;
use futures_util::StreamExt;
use tonic::transport::Channel;

fn put_op(key: &str, value: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.into(),
            value: value.to_vec(),
            ..Default::default()
        })),
    }
}

fn range_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest { key: key.into(), ..Default::default() })),
    }
}

fn delete_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
            prev_kv: true,
        })),
    }
}

fn mod_rev_is(key: &str, rev: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.into(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::ModRevision(rev)),
    }
}

fn version_is(key: &str, version: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Version as i32,
        key: key.into(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::Version(version)),
    }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// A readable line for each answer, without what differs between servers.
fn kvs(kvs: &[KeyValue]) -> String {
    kvs.iter()
        .map(|kv| {
            format!(
                "{}={}@c{}m{}v{}",
                String::from_utf8_lossy(&kv.key),
                if kv.value.len() > 64 {
                    format!("<{} bytes>", kv.value.len())
                } else {
                    String::from_utf8_lossy(&kv.value).into_owned()
                },
                kv.create_revision,
                kv.mod_revision,
                kv.version
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn rev(h: &Option<ResponseHeader>) -> i64 {
    h.as_ref().map_or(-1, |h| h.revision)
}

fn txn_line(r: &TxnResponse) -> String {
    let mut parts = vec![format!("succeeded={} rev={}", r.succeeded, rev(&r.header))];
    for op in &r.responses {
        match &op.response {
            Some(response_op::Response::ResponseRange(g)) => {
                parts.push(format!("range[{}] count={}", kvs(&g.kvs), g.count))
            }
            Some(response_op::Response::ResponsePut(p)) => parts.push(format!(
                "put prev={}",
                p.prev_kv.as_ref().map(|k| kvs(std::slice::from_ref(k))).unwrap_or_default()
            )),
            Some(response_op::Response::ResponseDeleteRange(d)) => {
                parts.push(format!("delete {} prev[{}]", d.deleted, kvs(&d.prev_kvs)))
            }
            Some(response_op::Response::ResponseTxn(_)) => parts.push("txn".into()),
            None => parts.push("none".into()),
        }
    }
    parts.join("; ")
}

fn status_line(s: &tonic::Status) -> String {
    format!("error {:?}: {}", s.code(), s.message())
}

fn watch_line(w: &WatchResponse) -> String {
    let events: Vec<String> = w
        .events
        .iter()
        .map(|e| {
            format!(
                "{} {} prev[{}]",
                if e.r#type == 0 { "PUT" } else { "DELETE" },
                kvs(e.kv.as_slice()),
                kvs(e.prev_kv.as_slice())
            )
        })
        .collect();
    format!(
        "watch id={} created={} canceled={} compact={} reason={:?} rev={} events=[{}]",
        w.watch_id,
        w.created,
        w.canceled,
        w.compact_revision,
        w.cancel_reason,
        rev(&w.header),
        events.join(", ")
    )
}

async fn txn(kv: &mut KvClient<Channel>, req: TxnRequest) -> String {
    match kv.txn(req).await {
        Ok(r) => txn_line(&r.into_inner()),
        Err(s) => status_line(&s),
    }
}

/// Everything the apiserver does to etcd, as a transcript.
async fn apiserver_session(url: String) -> Vec<String> {
    let ch = channel(&url).await;
    let mut kv = KvClient::new(ch.clone());
    let mut out = Vec::new();
    let key = "/registry/configmaps/default/cm1";

    // create: compare mod_revision = 0, put.
    let create = TxnRequest { compare: vec![mod_rev_is(key, 0)], success: vec![put_op(key, b"v1")], failure: vec![] };
    out.push(txn(&mut kv, create.clone()).await);
    out.push(txn(&mut kv, create).await);
    // update: compare mod_revision = rv, put, else range.
    let update = |rv: i64, v: &[u8]| TxnRequest {
        compare: vec![mod_rev_is(key, rv)],
        success: vec![put_op(key, v)],
        failure: vec![range_op(key)],
    };
    out.push(txn(&mut kv, update(2, b"v2")).await);
    out.push(txn(&mut kv, update(2, b"stale")).await);
    // delete: compare mod_revision = rv, delete, else range.
    let delete = |rv: i64| TxnRequest {
        compare: vec![mod_rev_is(key, rv)],
        success: vec![delete_op(key)],
        failure: vec![range_op(key)],
    };
    out.push(txn(&mut kv, delete(2)).await);
    out.push(txn(&mut kv, delete(3)).await);
    out.push(txn(&mut kv, delete(3)).await);

    // list with paging: limit, count and more, then continue at a fixed revision.
    for i in 0..5 {
        let k = format!("/registry/pods/ns/p{i}");
        let create =
            TxnRequest { compare: vec![mod_rev_is(&k, 0)], success: vec![put_op(&k, b"pod")], failure: vec![] };
        out.push(txn(&mut kv, create).await);
    }
    let prefix = "/registry/pods/ns/";
    let page = kv
        .range(RangeRequest { key: prefix.into(), range_end: prefix_end(prefix), limit: 2, ..Default::default() })
        .await
        .expect("list")
        .into_inner();
    out.push(format!("page1 [{}] more={} count={} rev={}", kvs(&page.kvs), page.more, page.count, rev(&page.header)));
    let list_rev = rev(&page.header);
    // A write between pages must not show in the next page at list_rev.
    out.push(
        txn(
            &mut kv,
            TxnRequest { compare: vec![], success: vec![put_op("/registry/pods/ns/p2", b"changed")], failure: vec![] },
        )
        .await,
    );
    let mut next = page.kvs.last().map(|k| k.key.clone()).unwrap_or_default();
    next.push(0);
    let page = kv
        .range(RangeRequest {
            key: next,
            range_end: prefix_end(prefix),
            limit: 2,
            revision: list_rev,
            ..Default::default()
        })
        .await
        .expect("list page 2")
        .into_inner();
    out.push(format!("page2 [{}] more={} count={} rev={}", kvs(&page.kvs), page.more, page.count, rev(&page.header)));
    let count = kv
        .range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            count_only: true,
            ..Default::default()
        })
        .await
        .expect("count")
        .into_inner();
    out.push(format!("count={} kvs={}", count.count, count.kvs.len()));
    let keys = kv
        .range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            keys_only: true,
            limit: 3,
            ..Default::default()
        })
        .await
        .expect("keys")
        .into_inner();
    out.push(format!("keys [{}] more={} count={}", kvs(&keys.kvs), keys.more, keys.count));

    // watch from rv+1 with prev_kv and progress notify.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut watch = WatchClient::new(ch.clone());
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            start_revision: list_rev + 1,
            progress_notify: true,
            prev_kv: true,
            ..Default::default()
        })),
    })
    .await
    .expect("send create");
    let mut events = watch.watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("watch").into_inner();
    let created = events.next().await.expect("created").expect("created ok");
    out.push(watch_line(&created));
    let first = events.next().await.expect("catch-up").expect("catch-up ok");
    out.push(watch_line(&first));
    out.push(
        txn(&mut kv, TxnRequest { compare: vec![], success: vec![delete_op("/registry/pods/ns/p0")], failure: vec![] })
            .await,
    );
    let live = events.next().await.expect("live").expect("live ok");
    out.push(watch_line(&live));
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(WatchProgressRequest {})),
    })
    .await
    .expect("progress");
    let progress = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("progress in time");
    out.push(watch_line(&progress.expect("progress").expect("progress ok")));

    // The compactor's handshake on compact_rev_key, then the compaction.
    let ck = "compact_rev_key";
    let handshake = |version: i64, rev: i64| TxnRequest {
        compare: vec![version_is(ck, version)],
        success: vec![put_op(ck, rev.to_string().as_bytes())],
        failure: vec![range_op(ck)],
    };
    out.push(txn(&mut kv, handshake(0, 10)).await);
    out.push(txn(&mut kv, handshake(0, 10)).await);
    out.push(match kv.compact(CompactionRequest { revision: 10, physical: false }).await {
        Ok(r) => format!("compacted rev={}", rev(&r.into_inner().header)),
        Err(s) => status_line(&s),
    });
    out.push(match kv.compact(CompactionRequest { revision: 10, physical: false }).await {
        Ok(_) => "compacted twice".into(),
        Err(s) => status_line(&s),
    });
    out.push(match kv.range(RangeRequest { key: key.into(), revision: 5, ..Default::default() }).await {
        Ok(_) => "read below compaction".into(),
        Err(s) => status_line(&s),
    });
    // A watch from a compacted revision: created, then canceled with the compact revision.
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            start_revision: 3,
            ..Default::default()
        })),
    })
    .await
    .expect("send old create");
    for _ in 0..2 {
        let r = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("compacted watch in time");
        out.push(watch_line(&r.expect("compacted response").expect("ok")));
    }
    // Cancelling the live watcher.
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: created.watch_id,
        })),
    })
    .await
    .expect("cancel");
    let r = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("cancel in time");
    out.push(watch_line(&r.expect("cancel response").expect("ok")));
    out
}

/// Values near the limits and requests etcd refuses.
async fn limits_session(url: String) -> Vec<String> {
    let ch = channel(&url).await;
    let mut kv = KvClient::new(ch.clone());
    let mut out = Vec::new();
    let big = vec![b'x'; 1_400_000];
    let put = |k: &str, v: &[u8]| PutRequest { key: k.into(), value: v.to_vec(), ..Default::default() };
    out.push(match kv.put(put("big", &big)).await {
        Ok(r) => format!("put big rev={}", rev(&r.into_inner().header)),
        Err(s) => status_line(&s),
    });
    out.push(match kv.range(RangeRequest { key: b"big".to_vec(), ..Default::default() }).await {
        Ok(r) => format!("get big [{}]", kvs(&r.into_inner().kvs)),
        Err(s) => status_line(&s),
    });
    let too_big = vec![b'x'; 1_600_000];
    out.push(match kv.put(put("huge", &too_big)).await {
        Ok(_) => "put huge accepted".into(),
        Err(s) => status_line(&s),
    });
    out.push(match kv.put(put("", b"x")).await {
        Ok(_) => "empty key accepted".into(),
        Err(s) => status_line(&s),
    });
    out.push(match kv.range(RangeRequest::default()).await {
        Ok(_) => "empty range accepted".into(),
        Err(s) => status_line(&s),
    });
    out.push(
        txn(
            &mut kv,
            TxnRequest { compare: vec![], success: vec![put_op("d", b"1"), put_op("d", b"2")], failure: vec![] },
        )
        .await,
    );
    out.push(
        txn(
            &mut kv,
            TxnRequest {
                compare: vec![],
                success: (0..129).map(|i| put_op(&format!("k{i}"), b"v")).collect(),
                failure: vec![],
            },
        )
        .await,
    );
    out.push(
        match kv.put(PutRequest { key: b"l".to_vec(), value: b"v".to_vec(), lease: 12345, ..Default::default() }).await
        {
            Ok(_) => "unknown lease accepted".into(),
            Err(s) => status_line(&s),
        },
    );
    out.push(match kv.put(PutRequest { key: b"nokey".to_vec(), ignore_value: true, ..Default::default() }).await {
        Ok(_) => "ignore_value on a missing key accepted".into(),
        Err(s) => status_line(&s),
    });
    out.push(match kv.range(RangeRequest { key: b"big".to_vec(), revision: 1000, ..Default::default() }).await {
        Ok(_) => "future read accepted".into(),
        Err(s) => status_line(&s),
    });
    out.push(match kv.compact(CompactionRequest { revision: 1000, physical: false }).await {
        Ok(_) => "future compaction accepted".into(),
        Err(s) => status_line(&s),
    });
    let mut lease = LeaseClient::new(ch);
    out.push(match lease.lease_revoke(LeaseRevokeRequest { id: 999 }).await {
        Ok(_) => "unknown lease revoked".into(),
        Err(s) => status_line(&s),
    });
    out.push(match lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 77 }).await {
        Ok(r) => format!("granted id={} ttl={}", r.get_ref().id, r.get_ref().ttl),
        Err(s) => status_line(&s),
    });
    out.push(match lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 77 }).await {
        Ok(_) => "lease granted twice".into(),
        Err(s) => status_line(&s),
    });
    out.push(match lease.lease_grant(LeaseGrantRequest { ttl: 9_000_000_001, id: 0 }).await {
        Ok(_) => "huge ttl accepted".into(),
        Err(s) => status_line(&s),
    });
    out
}

type Session = fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>> + Send>>;

async fn compare_three(name: &str, session: Session) {
    let etcd = start_etcd().await;
    let etcd2 = start_etcd().await;
    let ferrok = start_ferrok(&[]).await;
    let proxy = start_ferrok(&["--datastore-endpoint", &etcd2.url()]).await;
    let a = session(etcd.url()).await;
    let b = session(ferrok.url()).await;
    let c = session(proxy.url()).await;
    for (label, other) in [("ferrok", &b), ("ferrok --datastore-endpoint etcd", &c)] {
        let diffs: Vec<String> = a
            .iter()
            .zip(other.iter())
            .filter(|(x, y)| x != y)
            .map(|(x, y)| format!("  etcd:   {x}\n  {label}: {y}"))
            .collect();
        assert_eq!(a.len(), other.len(), "{name}: transcripts differ in length");
        assert!(diffs.is_empty(), "{name}: {label} differs from etcd:\n{}", diffs.join("\n"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_requests_match_etcd() {
    compare_three("apiserver", |url| Box::pin(apiserver_session(url))).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_and_bad_requests_match_etcd() {
    compare_three("limits", |url| Box::pin(limits_session(url))).await;
}
