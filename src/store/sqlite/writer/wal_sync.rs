//! A commit's WAL sync, off the writer's thread. While one batch's sync
//! runs, the writer applies and commits the next; a batch is answered, and
//! its events handed to the watchers, only once a sync that began after its
//! commit has ended, so nothing is told that a power loss could take back.
//! Batches settle in the order they committed, and one sync serves every
//! batch committed before it began.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::Done;
use crate::store::proto::Event;
use crate::store::sqlite::{Committed, Shared};
use crate::store::{Result, StoreError};

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

/// The thread that syncs and settles batches.
pub(super) struct WalSync {
    shared: Arc<Shared>,
    queue: Option<mpsc::Sender<Batch>>,
    /// Batches queued and not yet settled.
    in_flight: Arc<AtomicUsize>,
    handle: Option<JoinHandle<()>>,
}

impl WalSync {
    pub fn start(shared: Arc<Shared>) -> std::io::Result<Self> {
        let (queue, batches) = mpsc::channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (shared, in_flight) = (shared.clone(), in_flight.clone());
            std::thread::Builder::new().name("store-sync".into()).spawn(move || run(&shared, &batches, &in_flight))?
        };
        Ok(WalSync { shared, queue: Some(queue), in_flight, handle: Some(handle) })
    }

    /// Settles `batch` once it is durable: at once, on this thread, when it
    /// needs no sync and none is under way; otherwise after the sync.
    pub fn settle(&self, batch: Batch) {
        if batch.wal.is_none() && self.in_flight.load(Ordering::Acquire) == 0 {
            batch.settle(&self.shared, None);
            return;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let refused = match &self.queue {
            Some(queue) => queue.send(batch).err().map(|mpsc::SendError(batch)| batch),
            None => Some(batch),
        };
        // The thread is gone (finished, or it panicked): sync here.
        if let Some(batch) = refused {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            settle_group(&self.shared, vec![batch]);
        }
    }

    /// Settles everything queued and stops the thread; later batches are
    /// synced and settled on the caller's thread.
    pub fn finish(&mut self) {
        self.queue = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for WalSync {
    fn drop(&mut self) {
        self.finish();
    }
}

fn run(shared: &Shared, batches: &mpsc::Receiver<Batch>, in_flight: &AtomicUsize) {
    while let Ok(first) = batches.recv() {
        let mut group = vec![first];
        group.extend(batches.try_iter());
        let n = group.len();
        settle_group(shared, group);
        in_flight.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Syncs each WAL the group left unsynced (in practice one), then settles
/// the group in order.
fn settle_group(shared: &Shared, group: Vec<Batch>) {
    let mut synced: Vec<&Arc<std::fs::File>> = Vec::new();
    let mut failed = None;
    #[cfg(test)]
    let _held = shared.sync_hold.lock();
    for wal in group.iter().filter_map(|b| b.wal.as_ref()) {
        if synced.iter().any(|s| Arc::ptr_eq(s, wal)) {
            continue;
        }
        synced.push(wal);
        if let Err(e) = wal.sync_data() {
            tracing::error!(error = %e, "WAL sync failed: the commits it carried are not known to be durable");
            failed = Some(format!("the WAL sync failed: {e}"));
            break;
        }
    }
    for batch in group {
        batch.settle(shared, failed.as_deref());
    }
}
