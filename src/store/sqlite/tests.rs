//! Unit tests of the embedded backend against a temporary database.

use super::*;

mod history;
mod wal_sync;

/// A store as `ferrok server` opens it: FULL sync, so its writer goes
/// through `wal_vfs` (the tests that build their own options run NORMAL).
async fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = SqliteOptions::new(dir.path().join("state.db"));
    opts.sync = SyncMode::Full;
    let store = SqliteStore::open(opts).expect("open");
    (dir, store)
}

/// The one integer `sql` answers, read on one of the store's readers.
async fn query_i64(s: &SqliteStore, sql: &'static str) -> i64 {
    s.read(move |conn, _| Ok(conn.query_row(sql, [], |r| r.get(0))?)).await.unwrap()
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest { key: key.into(), value: value.into(), ..Default::default() }
}

#[tokio::test]
async fn fresh_store_is_at_revision_one() {
    let (_dir, s) = store().await;
    let resp = s.range(RangeRequest { key: b"a".to_vec(), ..Default::default() }).await.unwrap();
    assert_eq!(resp.header.unwrap().revision, 1);
    assert!(resp.kvs.is_empty());
}

fn kv_put(key: &str, value: &str) -> RequestOp {
    RequestOp { request: Some(request_op::Request::RequestPut(put(key, value))) }
}

fn cmp(key: &str, target: compare::CompareTarget, result: compare::CompareResult, u: compare::TargetUnion) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key: key.into(),
        range_end: Vec::new(),
        target_union: Some(u),
    }
}

async fn get(s: &SqliteStore, key: &str, rev: i64) -> RangeResponse {
    s.range(RangeRequest { key: key.into(), revision: rev, ..Default::default() }).await.expect("range")
}

#[tokio::test]
async fn concurrent_writes_get_one_revision_each() {
    let (_dir, s) = store().await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.put(put(&format!("k{i}"), "v")).await.expect("put").header.unwrap().revision
        }));
    }
    let mut revs = Vec::new();
    for t in tasks {
        revs.push(t.await.expect("task"));
    }
    revs.sort_unstable();
    assert_eq!(revs, (2..202).collect::<Vec<_>>());
    let all = s
        .range(RangeRequest { key: b"k".to_vec(), range_end: b"l".to_vec(), count_only: true, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(all.count, 200);
}

#[tokio::test]
async fn compares_follow_etcd_on_missing_keys() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let (_dir, s) = store().await;
    s.put(put("a", "1")).await.unwrap();
    let run = |compare: Compare| {
        let s = s.clone();
        async move {
            s.txn(TxnRequest { compare: vec![compare], success: vec![], failure: vec![] }).await.expect("txn").succeeded
        }
    };
    // A missing key compares as a zero key, except on its value.
    assert!(run(cmp("missing", T::Version, R::Equal, U::Version(0))).await);
    assert!(run(cmp("missing", T::Create, R::Equal, U::CreateRevision(0))).await);
    assert!(!run(cmp("missing", T::Value, R::Equal, U::Value(Vec::new()))).await);
    assert!(run(cmp("a", T::Value, R::Greater, U::Value(b"0".to_vec()))).await);
    assert!(run(cmp("a", T::Mod, R::Less, U::ModRevision(3))).await);
    assert!(run(cmp("a", T::Value, R::NotEqual, U::Value(b"2".to_vec()))).await);
    // A compare over a range holds only if it holds for every key in it.
    s.put(put("b", "1")).await.unwrap();
    let mut over = cmp("a", T::Value, R::Equal, U::Value(b"1".to_vec()));
    over.range_end = b"c".to_vec();
    assert!(run(over.clone()).await);
    s.put(put("b", "2")).await.unwrap();
    assert!(!run(over).await);
}

#[tokio::test]
async fn failed_txn_writes_nothing_and_keeps_the_revision() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let (_dir, s) = store().await;
    let resp = s
        .txn(TxnRequest {
            compare: vec![cmp("x", T::Version, R::Equal, U::Version(5))],
            success: vec![kv_put("x", "1")],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: b"x".to_vec(),
                    ..Default::default()
                })),
            }],
        })
        .await
        .unwrap();
    assert!(!resp.succeeded);
    assert_eq!(resp.header.unwrap().revision, 1);
    // A txn that only reads does not bump the revision either.
    let resp = s.txn(TxnRequest { compare: vec![], success: vec![], failure: vec![] }).await.unwrap();
    assert_eq!(resp.header.unwrap().revision, 1);
    // A nested txn writes at the revision of its parent.
    let inner = TxnRequest { compare: vec![], success: vec![kv_put("n1", "1"), kv_put("n2", "2")], failure: vec![] };
    let resp = s
        .txn(TxnRequest {
            compare: vec![],
            success: vec![kv_put("outer", "o"), RequestOp { request: Some(request_op::Request::RequestTxn(inner)) }],
            failure: vec![],
        })
        .await
        .unwrap();
    assert_eq!(resp.header.unwrap().revision, 2);
    assert_eq!(get(&s, "n2", 0).await.kvs[0].mod_revision, 2);
}

#[tokio::test]
async fn history_reads_and_deletes() {
    let (_dir, s) = store().await;
    s.put(put("h", "1")).await.unwrap(); // 2
    s.put(put("h", "2")).await.unwrap(); // 3
    s.delete_range(DeleteRangeRequest { key: b"h".to_vec(), ..Default::default() }).await.unwrap(); // 4
    s.put(put("h", "3")).await.unwrap(); // 5
    assert_eq!(get(&s, "h", 2).await.kvs[0].value, b"1");
    assert_eq!(get(&s, "h", 3).await.kvs[0].version, 2);
    assert!(get(&s, "h", 4).await.kvs.is_empty());
    let now = get(&s, "h", 0).await;
    assert_eq!((now.kvs[0].create_revision, now.kvs[0].version), (5, 1));
    assert_eq!(get(&s, "h", 3).await.header.unwrap().revision, 5);
}

#[tokio::test]
async fn physical_compaction_removes_superseded_rows() {
    let (_dir, s) = store().await;
    for i in 0..50 {
        s.put(put(&format!("c{}", i % 5), &i.to_string())).await.unwrap();
    }
    s.delete_range(DeleteRangeRequest { key: b"c0".to_vec(), ..Default::default() }).await.unwrap();
    let head = get(&s, "c1", 0).await.header.unwrap().revision;
    s.compact(CompactionRequest { revision: head, physical: true }).await.unwrap();
    let rows = query_i64(&s, "SELECT count(*) FROM log").await;
    // c1..c4 keep their newest row; c0's tombstone and history are gone,
    // and with the tombstone c0's entry.
    assert_eq!(rows, 4);
    assert_eq!(query_i64(&s, "SELECT count(*) FROM current").await, 4);
    assert_eq!(get(&s, "c4", head).await.kvs[0].value, b"49");
    assert!(get(&s, "c0", 0).await.kvs.is_empty());
    let err =
        s.range(RangeRequest { key: b"c1".to_vec(), revision: head - 1, ..Default::default() }).await.unwrap_err();
    assert!(matches!(err, StoreError::Compacted { .. }));
}

/// The meta row is written only when compaction moves; the revision after
/// a restart is still the newest one made, whether it was made after the
/// last compaction (rows in the log) or its rows were compacted away (a
/// tombstone at the head).
#[tokio::test]
async fn the_revision_survives_a_restart_without_a_meta_row_per_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let reopen = |s: Arc<SqliteStore>| {
        let path = path.clone();
        async move {
            s.close().await;
            SqliteStore::open(SqliteOptions::new(path)).expect("reopen")
        }
    };
    let s = SqliteStore::open(SqliteOptions::new(path.clone())).expect("open");
    // An older ferrok, which would read a stale revision, refuses the file.
    let version = query_i64(&s, "PRAGMA user_version").await;
    assert_eq!(version, 4);
    for i in 0..10 {
        s.put(put("a", &i.to_string())).await.unwrap();
    }
    let head = get(&s, "a", 0).await.header.unwrap().revision;
    assert_eq!(head, 11);
    let s = reopen(s).await;
    assert_eq!(get(&s, "a", 0).await.header.unwrap().revision, head, "writes since the last meta row");
    assert_eq!(s.put(put("b", "1")).await.unwrap().header.unwrap().revision, head + 1);

    // The head is a tombstone that a physical compaction removes.
    s.delete_range(DeleteRangeRequest { key: b"b".to_vec(), ..Default::default() }).await.unwrap();
    let head = head + 2;
    s.compact(CompactionRequest { revision: head, physical: true }).await.unwrap();
    let newest = query_i64(&s, "SELECT max(id) FROM log").await;
    assert!(schema::rev_of(newest) < head, "the head's rows are gone");
    let s = reopen(s).await;
    assert_eq!(get(&s, "a", 0).await.header.unwrap().revision, head, "a compacted head");
    assert_eq!(s.put(put("c", "1")).await.unwrap().header.unwrap().revision, head + 1);
}

#[tokio::test]
async fn compaction_in_many_steps_keeps_the_newest_rows_and_lets_writes_through() {
    let (_dir, s) = store().await;
    // Several batches' worth of rows, each step cut short by its budget.
    for i in 0..3000 {
        s.put(put(&format!("k{}", i % 10), &i.to_string())).await.unwrap();
    }
    let head = get(&s, "k0", 0).await.header.unwrap().revision;
    let compaction = {
        let s = s.clone();
        tokio::spawn(async move { s.compact(CompactionRequest { revision: head, physical: true }).await })
    };
    // Writes made while it sweeps: above the compact revision, all kept.
    for i in 0..20 {
        s.put(put(&format!("w{i}"), "during")).await.unwrap();
    }
    compaction.await.unwrap().unwrap();
    s.defragment().await.unwrap();
    let (rows, free): (i64, i64) = s
        .read(|conn, _| {
            let rows = conn.query_row("SELECT count(*) FROM log", [], |r| r.get(0))?;
            let free = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
            Ok((rows, free))
        })
        .await
        .unwrap();
    assert_eq!(rows, 10 + 20);
    assert_eq!(free, 0, "the vacuum handed every free page back");
    assert_eq!(get(&s, "k9", 0).await.kvs[0].value, b"2999");
    assert_eq!(get(&s, "w19", 0).await.kvs[0].value, b"during");
}

async fn watch(s: &SqliteStore, create: WatchCreateRequest) -> (mpsc::Sender<WatchRequest>, WatchResponseStream) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) }).await.unwrap();
    let stream = s.watch(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))).await.unwrap();
    (tx, stream)
}

async fn next(stream: &mut WatchResponseStream) -> WatchResponse {
    use futures_util::StreamExt;
    tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("in time").expect("open").expect("ok")
}

#[tokio::test]
async fn watch_catches_up_then_follows_commits() {
    let (_dir, s) = store().await;
    for i in 0..1500 {
        s.put(put(&format!("w/{}", i % 10), &i.to_string())).await.unwrap();
    }
    let create = WatchCreateRequest {
        key: b"w/".to_vec(),
        range_end: b"w0".to_vec(),
        start_revision: 2,
        prev_kv: true,
        ..Default::default()
    };
    let (_tx, mut stream) = watch(&s, create).await;
    assert!(next(&mut stream).await.created);
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            for i in 1500..1600 {
                s.put(put(&format!("w/{}", i % 10), &i.to_string())).await.unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    while seen.len() < 1600 {
        for ev in next(&mut stream).await.events {
            let kv = ev.kv.unwrap();
            if kv.mod_revision > 11 {
                assert!(ev.prev_kv.is_some(), "prev_kv missing at {}", kv.mod_revision);
            }
            seen.push(kv.mod_revision);
        }
    }
    writer.await.unwrap();
    assert_eq!(seen, (2..1602).collect::<Vec<_>>());
}

#[tokio::test]
async fn watch_filters_and_progress() {
    let (_dir, s) = store().await;
    let create = WatchCreateRequest {
        key: b"f".to_vec(),
        filters: vec![watch_create_request::FilterType::Noput as i32],
        ..Default::default()
    };
    let (tx, mut stream) = watch(&s, create).await;
    assert!(next(&mut stream).await.created);
    s.put(put("f", "1")).await.unwrap();
    s.delete_range(DeleteRangeRequest { key: b"f".to_vec(), ..Default::default() }).await.unwrap();
    let resp = next(&mut stream).await;
    assert_eq!(resp.events.len(), 1);
    assert_eq!(resp.events[0].r#type, EventType::Delete as i32);
    assert_eq!(resp.events[0].kv.as_ref().unwrap().mod_revision, 3);
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(WatchProgressRequest {})),
    })
    .await
    .unwrap();
    let progress = next(&mut stream).await;
    assert_eq!((progress.watch_id, progress.header.unwrap().revision), (-1, 3));
}

/// A stream whose watchers' keys no commit touches is not handed those
/// commits, yet its progress answer, a new watcher's start and its created
/// header still stand at the store's revision.
#[tokio::test]
async fn a_stream_not_handed_commits_is_still_level_with_the_store() {
    let (_dir, s) = store().await;
    let (tx, mut stream) = watch(&s, WatchCreateRequest { key: b"quiet".to_vec(), ..Default::default() }).await;
    assert!(next(&mut stream).await.created);
    for i in 0..5 {
        s.put(put(&format!("busy{i}"), "x")).await.unwrap();
    }
    let head = s.put(put("busy", "last")).await.unwrap().header.unwrap().revision;
    let create = WatchCreateRequest { key: b"busy".to_vec(), watch_id: 7, ..Default::default() };
    tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) }).await.unwrap();
    let created = next(&mut stream).await;
    assert!(created.created);
    assert_eq!(created.header.unwrap().revision, head, "created at the store's revision");
    let next_rev = s.put(put("busy", "after")).await.unwrap().header.unwrap().revision;
    let resp = next(&mut stream).await;
    assert_eq!(resp.watch_id, 7);
    let revs: Vec<i64> = resp.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision).collect();
    assert_eq!(revs, vec![next_rev], "only what came after the watch began");
    let head = s.put(put("busy-not", "x")).await.unwrap().header.unwrap().revision;
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(WatchProgressRequest {})),
    })
    .await
    .unwrap();
    let progress = next(&mut stream).await;
    assert_eq!((progress.watch_id, progress.header.unwrap().revision), (-1, head), "progress at the store's revision");
}

#[tokio::test]
async fn watch_fragments_large_responses() {
    let (_dir, s) = store().await;
    let mut opts = SqliteOptions::new(_dir.path().join("frag.db"));
    opts.max_request_bytes = 1024;
    let s2 = SqliteStore::open(opts).unwrap();
    drop(s);
    for i in 0..20 {
        s2.put(put(&format!("g{i:02}"), &"x".repeat(200))).await.unwrap();
    }
    let create = WatchCreateRequest {
        key: b"g".to_vec(),
        range_end: b"h".to_vec(),
        start_revision: 1,
        fragment: true,
        ..Default::default()
    };
    let (_tx, mut stream) = watch(&s2, create).await;
    assert!(next(&mut stream).await.created);
    let mut parts = 0;
    let mut events = 0;
    loop {
        let r = next(&mut stream).await;
        parts += 1;
        events += r.events.len();
        if !r.fragment {
            break;
        }
    }
    assert!(parts > 1, "20 events of 200 bytes came in one response");
    assert_eq!(events, 20);
}

#[tokio::test]
async fn expired_lease_deletes_its_keys_and_tells_watchers() {
    let (_dir, s) = store().await;
    let lease = s.lease_grant(LeaseGrantRequest { ttl: 1, id: 0 }).await.unwrap();
    assert_eq!(lease.ttl, 2, "the minimum TTL applies");
    s.put(PutRequest { key: b"e".to_vec(), value: b"v".to_vec(), lease: lease.id, ..Default::default() })
        .await
        .unwrap();
    let (_tx, mut stream) = watch(&s, WatchCreateRequest { key: b"e".to_vec(), ..Default::default() }).await;
    assert!(next(&mut stream).await.created);
    let started = std::time::Instant::now();
    let resp = next(&mut stream).await;
    let waited = started.elapsed();
    assert_eq!(resp.events[0].r#type, EventType::Delete as i32);
    assert!(waited > Duration::from_millis(1500) && waited < Duration::from_millis(3500), "expired after {waited:?}");
    let ttl = s.lease_time_to_live(LeaseTimeToLiveRequest { id: lease.id, keys: false }).await.unwrap();
    assert_eq!(ttl.ttl, -1);
    let err = s.lease_revoke(LeaseRevokeRequest { id: lease.id }).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseNotFound));
}

#[tokio::test]
async fn quota_raises_nospace_and_disarm_lets_writes_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = SqliteOptions::new(dir.path().join("state.db"));
    opts.quota_backend_bytes = 512 * 1024;
    let s = SqliteStore::open(opts).expect("open");
    let big = "x".repeat(8 * 1024);
    let mut written = 0;
    let err = loop {
        match s.put(put(&format!("k{written}"), &big)).await {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 1000, "the quota never tripped");
    };
    assert!(matches!(err, StoreError::NoSpace), "{err}");
    assert_eq!(err.to_string(), "etcdserver: mvcc: database space exceeded");
    let alarms = s.alarm(AlarmRequest::default()).await.expect("alarm list").alarms;
    assert_eq!(alarms, vec![AlarmMember { member_id: s.shared.member_id, alarm: AlarmType::Nospace as i32 }]);
    let status = s.status().await.expect("status");
    assert_eq!(status.errors, vec![format!("memberID:{} alarm:NOSPACE ", s.shared.member_id)]);
    // Small writes fail too while the alarm is raised; reads, deletes and
    // compaction go on.
    assert!(matches!(s.put(put("small", "v")).await, Err(StoreError::NoSpace)));
    assert!(matches!(s.lease_grant(LeaseGrantRequest { ttl: 10, id: 0 }).await, Err(StoreError::NoSpace)));
    assert_eq!(get(&s, "k0", 0).await.kvs.len(), 1);
    let deleted = s
        .delete_range(DeleteRangeRequest { key: b"k".to_vec(), range_end: b"l".to_vec(), prev_kv: false })
        .await
        .expect("delete under NOSPACE");
    assert_eq!(deleted.deleted, written);
    let head = deleted.header.expect("header").revision;
    s.compact(CompactionRequest { revision: head, physical: true }).await.expect("compact under NOSPACE");
    assert!(matches!(s.put(put("small", "v")).await, Err(StoreError::NoSpace)), "the alarm stays until disarmed");
    let disarm = AlarmRequest {
        action: alarm_request::AlarmAction::Deactivate as i32,
        member_id: s.shared.member_id,
        alarm: AlarmType::Nospace as i32,
    };
    assert_eq!(s.alarm(disarm).await.expect("disarm").alarms.len(), 1);
    s.put(put("small", "v")).await.expect("a write after the disarm");
    s.defragment().await.expect("defragment");
    assert!(s.status().await.expect("status").errors.is_empty());
    // The alarm is stored: it is still raised after a restart.
    s.alarm(AlarmRequest {
        action: alarm_request::AlarmAction::Activate as i32,
        member_id: s.shared.member_id,
        alarm: AlarmType::Nospace as i32,
    })
    .await
    .expect("raise");
    s.close().await;
    let s = SqliteStore::open(SqliteOptions::new(dir.path().join("state.db"))).expect("reopen");
    assert!(matches!(s.put(put("small", "v")).await, Err(StoreError::NoSpace)));
}

/// The apiserver's create (mod_rev = 0 ? put) and update (mod_rev = rev ?
/// put : range) from many clients at once, so that they share group
/// commits, with some that fail (a missing lease, a stale revision) in the
/// same batches: every success gets its own revision, the put after the
/// compare sees the key's current row (version, create revision), and a
/// failure leaves neither a revision nor an event behind.
#[tokio::test]
async fn grouped_creates_and_updates_keep_revisions_versions_and_events() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    use futures_util::StreamExt;
    use tokio_stream::wrappers::ReceiverStream;
    let (_dir, s) = store().await;
    let (req_tx, req_rx) = mpsc::channel(1);
    let mut events = s.watch(Box::pin(ReceiverStream::new(req_rx))).await.expect("watch");
    let create = WatchCreateRequest { key: b"k".to_vec(), range_end: b"l".to_vec(), ..Default::default() };
    req_tx
        .send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) })
        .await
        .expect("send");
    assert!(events.next().await.expect("created").expect("created").created);
    let txn = |key: String, rev: i64, lease: i64| {
        let s = s.clone();
        async move {
            let put = PutRequest { key: key.clone().into(), value: b"v".to_vec(), lease, ..Default::default() };
            let range = RangeRequest { key: key.clone().into(), ..Default::default() };
            s.txn(TxnRequest {
                compare: vec![cmp(&key, T::Mod, R::Equal, U::ModRevision(rev))],
                success: vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }],
                failure: vec![RequestOp { request: Some(request_op::Request::RequestRange(range)) }],
            })
            .await
        }
    };
    let mut tasks = Vec::new();
    for i in 0..64 {
        // Every fourth create names a lease that does not exist.
        let lease = if i % 4 == 3 { 12345 } else { 0 };
        tasks.push(tokio::spawn(txn(format!("k{i:02}"), 0, lease)));
    }
    let mut created = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.expect("task") {
            Ok(resp) => {
                assert!(resp.succeeded);
                created.push((i, resp.header.expect("header").revision));
            }
            Err(e) => {
                assert_eq!(i % 4, 3, "{e}");
                assert!(matches!(e, StoreError::LeaseNotFound), "{e}");
            }
        }
    }
    let mut revs: Vec<i64> = created.iter().map(|c| c.1).collect();
    revs.sort_unstable();
    assert_eq!(revs, (2..50).collect::<Vec<_>>(), "one revision per successful create, no gaps");
    // Updates: half at the right revision, half stale.
    let mut tasks = Vec::new();
    for &(i, rev) in &created {
        let at = if i % 2 == 0 { rev } else { rev - 1 };
        tasks.push((i, rev, tokio::spawn(txn(format!("k{i:02}"), at, 0))));
    }
    for (i, rev, t) in tasks {
        let resp = t.await.expect("task").expect("txn");
        assert_eq!(resp.succeeded, i % 2 == 0, "k{i:02}");
        let kv = get(&s, &format!("k{i:02}"), 0).await.kvs.remove(0);
        assert_eq!(kv.create_revision, rev);
        assert_eq!(kv.version, if i % 2 == 0 { 2 } else { 1 });
    }
    let updated = created.iter().filter(|c| c.0 % 2 == 0).count() as i64;
    let head = get(&s, "k00", 0).await.header.expect("header").revision;
    assert_eq!(head, 49 + updated);
    // The watcher saw every successful write once, in revision order.
    let mut seen = Vec::new();
    while (seen.len() as i64) < head - 1 {
        let resp = events.next().await.expect("events").expect("events");
        seen.extend(resp.events.iter().map(|e| e.kv.as_ref().expect("kv").mod_revision));
    }
    assert_eq!(seen, (2..=head).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_run_a_few_at_once_on_connections_kept_for_the_next() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (dir, s) = store().await;
    drop(s);
    let readers = Arc::new(Readers::new(dir.path().join("state.db")));
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let reads = (0..4 * MAX_READERS).map(|_| {
        let (readers, running, most) = (readers.clone(), running.clone(), most.clone());
        tokio::spawn(async move {
            readers
                .run(move |conn| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    let one: i64 = conn.query_row("SELECT 1", [], |r| r.get(0))?;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(one)
                })
                .await
        })
    });
    for read in futures_util::future::join_all(reads).await {
        assert_eq!(read.expect("task").expect("read"), 1);
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most > 1, "reads run side by side ({most})");
    assert!(most <= MAX_READERS, "at most {MAX_READERS} reads at once, saw {most}");
    // A connection is opened only when every open one is busy, so as many
    // were opened as ran at once, and all of them are kept.
    assert_eq!(readers.idle().len(), most, "their connections are kept for the next reads");
}
