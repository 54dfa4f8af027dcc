//! A commit's WAL sync, off the writer's thread. While one batch's sync
//! runs, the writer applies and commits the next, and that batch's sync
//! starts at once on another thread instead of waiting for the first to
//! end: the disk serves flushes side by side, so a commit waits for one
//! sync, not for the rest of the one before it and then its own. A batch
//! is answered, and its events handed to the watchers, only once a sync
//! that began after its commit has ended, so nothing is told that a power
//! loss could take back. Batches settle in the order they committed, one
//! thread at a time, and one sync serves every batch committed before it
//! began.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::Done;
use crate::store::proto::Event;
use crate::store::sqlite::{Committed, Shared};
use crate::store::{Result, StoreError};

/// Threads that sync and settle: syncs that may run at once.
const SYNC_THREADS: usize = 3;

/// A committed batch, and what is owed once it is durable.
pub(super) struct Batch {
    pub rev: i64,
    pub compact_rev: i64,
    /// None when the batch made no events (no watch stream was subscribed).
    pub events: Option<Vec<Event>>,
    pub done: Vec<Done>,
    /// Answered with `rev`: `physical` compactions now swept, finished
    /// defragments.
    pub heads: Vec<oneshot::Sender<Result<i64>>>,
    /// The WAL whose sync this commit left undone; None when it synced
    /// before it returned, or wrote nothing.
    pub wal: Option<Arc<std::fs::File>>,
}

impl Batch {
    /// Makes the batch seen: its revision, its events, its answers. When
    /// its sync failed, every caller is told so (the commit is in the
    /// database, so it is published all the same: reads and watches agree).
    fn settle(self, shared: &Shared, failed: Option<&str>) {
        shared.publish_head(self.rev, self.compact_rev);
        match self.events {
            Some(events) => shared.fanout.publish(Committed { rev: self.rev, events }),
            None => shared.fanout.uncollected(self.rev),
        }
        for d in self.done {
            d.answer(shared, failed);
        }
        for reply in self.heads {
            let _ = reply.send(unless(failed, Ok(self.rev)));
        }
    }
}

/// `res`, or the failed sync's error.
pub(super) fn unless<T>(failed: Option<&str>, res: Result<T>) -> Result<T> {
    match failed {
        Some(why) => Err(StoreError::Internal(why.to_string())),
        None => res,
    }
}

/// The batches between commit and settling, numbered in commit order.
#[derive(Default)]
struct Queue {
    /// Committed and not yet settled, the oldest first.
    pending: VecDeque<(u64, Batch)>,
    /// The number the next batch queued gets.
    next: u64,
    /// Every batch numbered below this has a sync that began after it.
    sync_started: u64,
    /// Every batch numbered below this is durable: such a sync has ended.
    synced: u64,
    /// Batches numbered below `.0` are told that a sync failed with `.1`
    /// (unless a later sync that began after them ended well first).
    failed: Option<(u64, String)>,
    /// A thread is settling batches it took from `pending`.
    settling: bool,
    /// Batches queued and not yet settled, those being settled included.
    in_flight: usize,
    /// Sync threads still running.
    alive: usize,
    closed: bool,
}

impl Queue {
    /// A sync to start, when some batch has a WAL that no sync begun
    /// after its commit covers: every WAL the unsettled batches left
    /// unsynced (in practice one file), and the number it makes durable
    /// below.
    fn sync_to_start(&mut self) -> Option<(u64, Vec<Arc<std::fs::File>>)> {
        if self.sync_started == self.next {
            return None;
        }
        let upto = self.next;
        let waiting = |seq: u64| seq >= self.sync_started;
        let news = self.pending.iter().any(|(seq, b)| waiting(*seq) && b.wal.is_some());
        self.sync_started = upto;
        if !news {
            return None;
        }
        let mut wals: Vec<Arc<std::fs::File>> = Vec::new();
        for wal in self.pending.iter().filter(|(seq, _)| *seq >= self.synced).filter_map(|(_, b)| b.wal.as_ref()) {
            if !wals.iter().any(|w| Arc::ptr_eq(w, wal)) {
                wals.push(wal.clone());
            }
        }
        Some((upto, wals))
    }

    /// Takes the oldest batches that may settle now, in order, each with
    /// the failure to tell it; none while another thread settles (order).
    fn ready(&mut self) -> Vec<(Batch, Option<String>)> {
        let mut out = Vec::new();
        if self.settling {
            return out;
        }
        while let Some((seq, batch)) = self.pending.front() {
            let failed = self.failed.as_ref().filter(|(below, _)| *seq < *below && *seq >= self.synced);
            if *seq >= self.synced && failed.is_none() && batch.wal.is_some() {
                break;
            }
            let why = failed.map(|(_, why)| why.clone());
            if let Some((_, batch)) = self.pending.pop_front() {
                out.push((batch, why));
            }
        }
        self.settling = !out.is_empty();
        out
    }
}

/// The threads that sync and settle batches.
pub(super) struct WalSync {
    shared: Arc<Shared>,
    queue: Arc<(Mutex<Queue>, Condvar)>,
    handles: Vec<JoinHandle<()>>,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl WalSync {
    pub fn start(shared: Arc<Shared>) -> std::io::Result<Self> {
        let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let mut sync = WalSync { shared, queue, handles: Vec::with_capacity(SYNC_THREADS) };
        for _ in 0..SYNC_THREADS {
            let (shared, queue) = (sync.shared.clone(), sync.queue.clone());
            lock(&sync.queue.0).alive += 1;
            match std::thread::Builder::new().name("store-sync".into()).spawn(move || run(&shared, &queue)) {
                Ok(handle) => sync.handles.push(handle),
                Err(e) => {
                    lock(&sync.queue.0).alive -= 1;
                    return Err(e);
                }
            }
        }
        Ok(sync)
    }

    /// Settles `batch` once it is durable: at once, on this thread, when it
    /// needs no sync and nothing is in flight; otherwise after a sync.
    pub fn settle(&self, batch: Batch) {
        let (queue, wake) = &*self.queue;
        let mut q = lock(queue);
        if q.closed || q.alive == 0 {
            // Finished, or the threads are gone: sync and settle here.
            drop(q);
            settle_here(&self.shared, batch);
            return;
        }
        if batch.wal.is_none() && q.in_flight == 0 {
            drop(q);
            batch.settle(&self.shared, None);
            return;
        }
        let seq = q.next;
        q.next += 1;
        q.in_flight += 1;
        q.pending.push_back((seq, batch));
        drop(q);
        wake.notify_one();
    }

    /// Settles everything queued and stops the threads; later batches are
    /// synced and settled on the caller's thread.
    pub fn finish(&mut self) {
        lock(&self.queue.0).closed = true;
        self.queue.1.notify_all();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for WalSync {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Counts a sync thread out when it ends, however it ends: a thread that
/// panicked while settling gives the order back, so the others go on (its
/// batches' callers see their answer dropped).
struct Alive<'a> {
    queue: &'a (Mutex<Queue>, Condvar),
    /// Batches this thread took to settle and has not finished.
    settling: std::cell::Cell<usize>,
}

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.queue.0);
        q.alive -= 1;
        let held = self.settling.get();
        if held > 0 {
            q.settling = false;
            q.in_flight -= held;
            tracing::error!(batches = held, "a store sync thread stopped while settling commits");
        }
        drop(q);
        self.queue.1.notify_all();
    }
}

fn run(shared: &Shared, queue: &(Mutex<Queue>, Condvar)) {
    let alive = Alive { queue, settling: std::cell::Cell::new(0) };
    let (mutex, wake) = queue;
    let mut q = lock(mutex);
    loop {
        // Answers first: a thread whose sync just ended settles what it
        // made durable before it starts another.
        let ready = q.ready();
        if !ready.is_empty() {
            drop(q);
            let n = ready.len();
            alive.settling.set(n);
            for (batch, failed) in ready {
                batch.settle(shared, failed.as_deref());
            }
            q = lock(mutex);
            alive.settling.set(0);
            q.settling = false;
            q.in_flight -= n;
            continue;
        }
        if let Some((upto, wals)) = q.sync_to_start() {
            drop(q);
            let res = sync(shared, &wals);
            q = lock(mutex);
            match res {
                Ok(()) => q.synced = q.synced.max(upto),
                Err(why) => {
                    let below = q.failed.as_ref().map_or(upto, |(b, _)| upto.max(*b));
                    q.failed = Some((below, why));
                }
            }
            continue;
        }
        if q.closed && q.in_flight == 0 {
            return;
        }
        q = wake.wait(q).unwrap_or_else(|poisoned| poisoned.into_inner());
    }
}

/// Syncs each WAL in `wals`; the error to tell the batches when one fails.
fn sync(shared: &Shared, wals: &[Arc<std::fs::File>]) -> std::result::Result<(), String> {
    #[cfg(test)]
    let _held = shared.sync_hold.lock();
    #[cfg(not(test))]
    let _ = shared;
    for wal in wals {
        if let Err(e) = wal.sync_data() {
            tracing::error!(error = %e, "WAL sync failed: the commits it carried are not known to be durable");
            return Err(format!("the WAL sync failed: {e}"));
        }
    }
    Ok(())
}

/// Syncs `batch`'s WAL and settles it on this thread.
fn settle_here(shared: &Shared, batch: Batch) {
    let wals: Vec<Arc<std::fs::File>> = batch.wal.iter().cloned().collect();
    let failed = sync(shared, &wals).err();
    batch.settle(shared, failed.as_deref());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rev: i64, wal: Option<&Arc<std::fs::File>>) -> Batch {
        Batch { rev, compact_rev: 0, events: None, done: Vec::new(), heads: Vec::new(), wal: wal.cloned() }
    }

    fn queue(q: &mut Queue, b: Batch) {
        q.pending.push_back((q.next, b));
        q.next += 1;
        q.in_flight += 1;
    }

    fn revs(ready: &[(Batch, Option<String>)]) -> Vec<i64> {
        ready.iter().map(|(b, _)| b.rev).collect()
    }

    fn wal() -> (tempfile::TempDir, Arc<std::fs::File>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = std::fs::File::create(dir.path().join("wal")).expect("create");
        (dir, Arc::new(file))
    }

    #[test]
    fn a_commit_starts_its_sync_while_the_one_before_still_runs_and_they_settle_in_order() {
        let (_dir, w) = wal();
        let mut q = Queue::default();
        queue(&mut q, batch(1, Some(&w)));
        let (first, wals) = q.sync_to_start().expect("the first sync");
        assert_eq!((first, wals.len()), (1, 1));
        assert!(q.sync_to_start().is_none(), "nothing new to sync");
        queue(&mut q, batch(2, Some(&w)));
        queue(&mut q, batch(3, None));
        let (second, _) = q.sync_to_start().expect("the second commit's sync starts before the first ends");
        assert_eq!(second, 3);
        assert!(q.ready().is_empty(), "nothing is durable yet; the batch without a WAL waits its turn");
        // The second sync ends first: it began after every batch before it.
        q.synced = q.synced.max(second);
        let ready = q.ready();
        assert_eq!(revs(&ready), vec![1, 2, 3]);
        assert!(ready.iter().all(|(_, failed)| failed.is_none()));
        assert!(q.settling, "the thread that took them settles them");
        assert!(q.ready().is_empty(), "no other thread settles meanwhile");
        q.settling = false;
        // The first sync's end changes nothing.
        q.synced = q.synced.max(first);
        assert_eq!(q.synced, 3);
        assert!(q.ready().is_empty());
    }

    #[test]
    fn a_failed_sync_is_told_to_the_batches_it_covered_and_no_others() {
        let (_dir, w) = wal();
        let mut q = Queue::default();
        queue(&mut q, batch(1, Some(&w)));
        let (upto, _) = q.sync_to_start().expect("sync");
        queue(&mut q, batch(2, Some(&w)));
        q.failed = Some((upto, "the WAL sync failed: EIO".into()));
        let ready = q.ready();
        assert_eq!(revs(&ready), vec![1]);
        assert_eq!(ready[0].1.as_deref(), Some("the WAL sync failed: EIO"));
        q.settling = false;
        assert!(q.ready().is_empty(), "the next batch waits for a sync of its own");
        let (upto, wals) = q.sync_to_start().expect("its sync");
        assert_eq!(wals.len(), 1);
        q.synced = upto;
        let ready = q.ready();
        assert_eq!(revs(&ready), vec![2]);
        assert!(ready[0].1.is_none());
    }

    #[test]
    fn batches_without_a_wal_to_sync_settle_once_those_before_them_have() {
        let mut q = Queue::default();
        queue(&mut q, batch(1, None));
        queue(&mut q, batch(2, None));
        assert!(q.sync_to_start().is_none(), "nothing to sync");
        assert_eq!(revs(&q.ready()), vec![1, 2]);
    }
}
