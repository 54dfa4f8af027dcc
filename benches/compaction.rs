//! Compaction stall: how long does a writer wait while the embedded store
//! compacts and vacuums a large log? The store is filled with `--revisions`
//! updates to `--keys` keys, then one writer puts a small value in a loop,
//! each put timed, first alone (the baseline) and then while a compaction
//! to head runs its sweep, its incremental vacuum and its WAL checkpoint
//! (a physical Compact, then Defragment, which waits for the vacuum). It
//! prints the writer's latencies for both phases and the file sizes; it is
//! not a pass/fail test.
//!
//! ```text
//! cargo bench --profile dev --bench compaction                       # 200k revisions
//! cargo bench --profile dev --bench compaction -- --revisions 50000 --sync full
//! ```
//! Flags: `--revisions N` (default 200000), `--keys N` (default 1000),
//! `--value-bytes N` (default 512), `--sync full|normal` (default full, as
//! `ferrok server`), `--baseline-secs N` (default 3).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrok::store::proto::{CompactionRequest, PutRequest, RangeRequest};
use ferrok::store::sqlite::{SqliteOptions, SqliteStore, SyncMode};
use ferrok::store::Store;

struct Options {
    revisions: u64,
    keys: u64,
    value_bytes: usize,
    sync: SyncMode,
    baseline: Duration,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let number = |flag: &str, default: u64| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    Options {
        revisions: number("--revisions", 200_000),
        keys: number("--keys", 1000).max(1),
        value_bytes: number("--value-bytes", 512) as usize,
        sync: if value("--sync").as_deref() == Some("normal") { SyncMode::Normal } else { SyncMode::Full },
        baseline: Duration::from_secs(number("--baseline-secs", 3)),
    }
}

fn mib(path: &Path) -> String {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn sizes(db: &Path) -> String {
    let wal = db.with_extension("db-wal");
    format!("db {}, wal {}", mib(db), mib(&wal))
}

/// Latencies in microseconds, sorted.
struct Latencies(Vec<u64>);

impl Latencies {
    fn line(&self) -> String {
        let v = &self.0;
        if v.is_empty() {
            return "no writes".into();
        }
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        format!(
            "{} puts, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            v.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        )
    }
}

/// Puts to a probe key one after another until `stop`, timing each.
async fn probe(store: Arc<SqliteStore>, stop: Arc<AtomicBool>) -> Latencies {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let put = PutRequest { key: b"/probe".to_vec(), value: vec![b'p'; 256], ..Default::default() };
        if let Err(e) = store.put(put).await {
            eprintln!("probe put failed: {e}");
            break;
        }
        out.push(started.elapsed().as_micros() as u64);
    }
    out.sort_unstable();
    Latencies(out)
}

async fn fill(store: &Arc<SqliteStore>, o: &Options) {
    const WRITERS: u64 = 16;
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            let (keys, revisions, bytes) = (o.keys, o.revisions, o.value_bytes);
            tokio::spawn(async move {
                let mut i = w;
                while i < revisions {
                    let key = format!("/registry/bench/key-{:06}", i % keys).into_bytes();
                    let put = PutRequest { key, value: vec![b'v'; bytes], ..Default::default() };
                    if let Err(e) = store.put(put).await {
                        eprintln!("fill put failed: {e}");
                        return;
                    }
                    i += WRITERS;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    println!("filled {} revisions over {} keys in {:.1} s", o.revisions, o.keys, started.elapsed().as_secs_f64());
}

async fn head(store: &SqliteStore) -> i64 {
    let resp = store.range(RangeRequest { key: b"/probe".to_vec(), ..Default::default() }).await;
    resp.ok().and_then(|r| r.header).map_or(0, |h| h.revision)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("state.db");
    let mut opts = SqliteOptions::new(&db);
    opts.sync = o.sync;
    opts.quota_backend_bytes = -1;
    let store = SqliteStore::open(opts).expect("open the store");
    println!("compaction stall: sync {:?}, value {} bytes", o.sync, o.value_bytes);
    fill(&store, &o).await;
    println!("after fill: {}", sizes(&db));

    let stop = Arc::new(AtomicBool::new(false));
    let baseline = tokio::spawn(probe(store.clone(), stop.clone()));
    tokio::time::sleep(o.baseline).await;
    stop.store(true, Ordering::Relaxed);
    let baseline = baseline.await.expect("baseline probe");
    println!("writer alone:              {}", baseline.line());

    let target = head(&store).await;
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(probe(store.clone(), stop.clone()));
    let started = Instant::now();
    let compacted = store.compact(CompactionRequest { revision: target, physical: true }).await;
    let swept = started.elapsed();
    let defragged = store.defragment().await;
    let vacuumed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let during = during.await.expect("probe during compaction");
    if let Err(e) = compacted.as_ref().map(|_| ()).and(defragged.as_ref().map(|_| ())) {
        println!("compaction failed: {e}");
    }
    println!(
        "compaction to {target}: sweep {:.1} s, sweep + vacuum + checkpoint {:.1} s",
        swept.as_secs_f64(),
        vacuumed.as_secs_f64()
    );
    println!("writer during compaction:  {}", during.line());
    println!("after compaction: {}", sizes(&db));
    store.close().await;
}
