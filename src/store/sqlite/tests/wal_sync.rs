//! A commit's sync off the writer's thread (`writer::wal_sync`): nothing
//! is answered or read from a commit before its sync, and the writer goes
//! on meanwhile.

use super::*;

/// What `sql` counts in the database file, as a connection of its own
/// sees it (the store's reads wait for the newest commit's sync).
fn count_in_file(dir: &tempfile::TempDir, sql: &str, params: impl rusqlite::Params) -> i64 {
    let conn = Connection::open_with_flags(dir.path().join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open");
    conn.query_row(sql, params, |r| r.get(0)).expect("count")
}

/// Whether a commit of `key` is in the database file.
fn committed(dir: &tempfile::TempDir, key: &str) -> bool {
    count_in_file(dir, "SELECT count(*) FROM log WHERE key = ?1", [key.as_bytes()]) > 0
}

/// Polls `cond` for up to ten seconds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 10 s");
}

/// Holds `wal_sync` back from syncing until the returned sender is dropped;
/// a thread of its own holds the lock (no guard across an await).
fn hold_syncs(s: &SqliteStore) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, holding) = std::sync::mpsc::channel();
    let holder = std::thread::spawn({
        let shared = s.shared.clone();
        move || {
            let _hold = shared.sync_hold.lock().expect("hold");
            let _ = held.send(());
            let _ = released.recv();
        }
    });
    holding.recv().expect("syncs held");
    (release, holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_told_and_read_only_once_its_wal_is_synced_and_the_next_commits_meanwhile() {
    let (dir, s) = store().await;
    s.put(put("a", "1")).await.expect("put a");
    let (release, holder) = hold_syncs(&s);
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.put(put("b", "2")).await }
    });
    eventually("b committed", || committed(&dir, "b")).await;
    let read = tokio::spawn({
        let s = s.clone();
        async move { s.range(RangeRequest { key: b"b".to_vec(), ..Default::default() }).await }
    });
    let second = tokio::spawn({
        let s = s.clone();
        async move { s.put(put("c", "3")).await }
    });
    eventually("c committed while b's sync waits", || committed(&dir, "c")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished(), "b's put is not answered before its sync");
    assert!(!second.is_finished(), "nor c's");
    assert!(!read.is_finished(), "a read that sees b does not answer before b's sync");
    drop(release);
    holder.join().expect("holder");
    let b = first.await.expect("task").expect("put b").header.expect("header").revision;
    let c = second.await.expect("task").expect("put c").header.expect("header").revision;
    assert_eq!((b, c), (3, 4));
    let read = read.await.expect("task").expect("range");
    assert!(read.header.expect("header").revision >= b);
    assert_eq!(read.kvs.len(), 1, "the read answers with b");
}

/// A physical compaction is answered after the batch that asked for it is
/// durable, even when the sweep (a transaction of its own, synced in place)
/// ends first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_compaction_is_answered_after_the_commits_before_it() {
    let (dir, s) = store().await;
    for i in 0..20 {
        s.put(put(&format!("k{}", i % 2), &i.to_string())).await.expect("put");
    }
    let head = get(&s, "k0", 0).await.header.expect("header").revision;
    let (release, holder) = hold_syncs(&s);
    let compacted = tokio::spawn({
        let s = s.clone();
        async move { s.compact(CompactionRequest { revision: head, physical: true }).await }
    });
    eventually("the sweep done", || count_in_file(&dir, "SELECT count(*) FROM log", []) == 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!compacted.is_finished(), "not answered while the compaction's own batch waits for its sync");
    drop(release);
    holder.join().expect("holder");
    compacted.await.expect("task").expect("compact");
}
