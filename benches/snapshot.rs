//! Snapshot and restore of the embedded store (`ferrok etcd-snapshot save`,
//! `ferrok server --cluster-reset --cluster-reset-restore-path`): how long
//! they take for a store holding `--objects` objects (default 10,000
//! ConfigMap-sized JSON values of `--value-bytes`, default 1,024, each
//! written `--updates` times, default 2, so the log holds history), with
//! the store idle and while a writer keeps writing (its put latencies
//! printed for both phases). It prints figures; it is not a pass/fail test.
//!
//! ```text
//! cargo bench --profile dev --bench snapshot
//! cargo bench --profile dev --bench snapshot -- --objects 50000
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrok::store::proto::{PutRequest, RangeRequest};
use ferrok::store::sqlite::backup;
use ferrok::store::sqlite::{SqliteOptions, SqliteStore, SyncMode};
use ferrok::store::Store;

struct Options {
    objects: u64,
    value_bytes: usize,
    updates: u64,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let number = |flag: &str, default: u64| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    Options {
        objects: number("--objects", 10_000).max(1),
        value_bytes: number("--value-bytes", 1024) as usize,
        updates: number("--updates", 2).max(1),
    }
}

fn mib(path: &Path) -> f64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

fn value(i: u64, round: u64, bytes: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","namespace":"default","generation":{round}}},"data":{{"v":""#
    );
    let mut v = head.into_bytes();
    v.resize(bytes.saturating_sub(3).max(v.len()), b'x');
    v.extend_from_slice(br#""}}"#);
    v
}

/// Every object written `updates` times, 512 puts in flight at once (the
/// store commits them in groups, one revision each).
async fn fill(store: &Arc<SqliteStore>, o: &Options) {
    let started = Instant::now();
    let keys: Vec<u64> = (0..o.objects).collect();
    for round in 0..o.updates {
        for chunk in keys.chunks(512) {
            let puts = chunk.iter().map(|&i| {
                let key = format!("/registry/configmaps/default/cm-{i:06}").into_bytes();
                store.put(PutRequest { key, value: value(i, round, o.value_bytes), ..Default::default() })
            });
            for res in futures_util::future::join_all(puts).await {
                res.expect("fill put");
            }
        }
    }
    println!(
        "filled {} objects ({} bytes each, {} writes each) in {:.1} s",
        o.objects,
        o.value_bytes,
        o.updates,
        started.elapsed().as_secs_f64()
    );
}

/// Puts one after another until `stop`; the latencies, sorted, in µs.
async fn writer(store: Arc<SqliteStore>, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut out = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let key = format!("/registry/configmaps/busy/cm-{}", n % 100).into_bytes();
        if store.put(PutRequest { key, value: vec![b'w'; 512], ..Default::default() }).await.is_err() {
            break;
        }
        out.push(started.elapsed().as_micros() as u64);
        n += 1;
    }
    out.sort_unstable();
    out
}

fn latencies(v: &[u64]) -> String {
    if v.is_empty() {
        return "no writes".into();
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    format!("{} puts, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", v.len(), at(0.5), at(0.99), at(1.0))
}

async fn save(db: &Path, to: &Path) -> (backup::SnapshotInfo, Duration) {
    let (db, to) = (db.to_path_buf(), to.to_path_buf());
    let started = Instant::now();
    let info = tokio::task::spawn_blocking(move || backup::save(&db, &to)).await.expect("join").expect("save");
    (info, started.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db").join("state.db");
    let mut opts = SqliteOptions::new(&db);
    opts.sync = SyncMode::Full;
    opts.quota_backend_bytes = -1;
    let store = SqliteStore::open(opts.clone()).expect("open the store");
    fill(&store, &o).await;
    println!("store: {:.1} MiB (+ WAL {:.1} MiB)", mib(&db), mib(&db.with_extension("db-wal")));

    // Idle: the server running but not writing.
    let idle = dir.path().join("idle.snapshot");
    let (info, took) = save(&db, &idle).await;
    println!(
        "save, idle store:        {:>7.0} ms  (revision {}, {:.1} MiB)",
        took.as_secs_f64() * 1000.0,
        info.revision,
        info.size as f64 / (1024.0 * 1024.0)
    );

    // Busy: a writer puts one object after another meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let alone = tokio::spawn(writer(store.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let alone = alone.await.expect("writer");
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(writer(store.clone(), stop.clone()));
    let busy = dir.path().join("busy.snapshot");
    let (info, took) = save(&db, &busy).await;
    stop.store(true, Ordering::Relaxed);
    let during = during.await.expect("writer");
    println!("save, while writing:     {:>7.0} ms  (revision {})", took.as_secs_f64() * 1000.0, info.revision);
    println!("writer alone (2 s):      {}", latencies(&alone));
    println!("writer during the save:  {}", latencies(&during));

    let started = Instant::now();
    let checked = backup::check(&busy).expect("check");
    println!("check (quick_check):     {:>7.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    assert_eq!(checked, info);

    // Restore: the server stopped, its store replaced, then opened again.
    store.close().await;
    drop(store);
    let started = Instant::now();
    let restored = backup::restore(&busy, &db).expect("restore");
    let restore_took = started.elapsed();
    let store = SqliteStore::open(opts).expect("reopen");
    let resp = store
        .range(RangeRequest {
            key: b"/registry/configmaps/".to_vec(),
            range_end: b"/registry/configmaps0".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await
        .expect("count");
    let usable = started.elapsed();
    println!(
        "restore:                 {:>7.0} ms  (revision {} -> {}), store open and counted {} keys after {:.0} ms",
        restore_took.as_secs_f64() * 1000.0,
        restored.snapshot_revision,
        restored.revision,
        resp.count,
        usable.as_secs_f64() * 1000.0
    );
    store.close().await;
}
