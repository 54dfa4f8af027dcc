//! How commits reach the watch streams: each stream subscribes with the key
//! ranges its watchers cover, and the writer hands a commit only to the
//! streams with a watcher on one of its keys. A stream with nothing in a
//! commit is not woken for it (with a watch stream per watch cache and per
//! API-server cache, most commits concern one or two of sixty).
//!
//! A stream that was not handed a commit still knows it is level with it:
//! `Subscription::level` answers the newest revision handed out, and every
//! commit up to it that the stream wants is already in its queue, because
//! the writer queues a commit and records its revision under one lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::Committed;
use crate::store::KeyRange;
use crate::sync::LockExt;

/// The streams' subscriptions, fed by the writer.
pub struct Fanout {
    inner: Mutex<Inner>,
    /// Commits a stream may have queued before it counts as behind.
    backlog: usize,
}

struct Inner {
    /// The newest revision handed out.
    rev: i64,
    next_id: u64,
    subscribers: HashMap<u64, Subscriber>,
}

struct Subscriber {
    ranges: Vec<KeyRange>,
    queue: mpsc::Sender<Arc<Committed>>,
    /// A commit it wanted found its queue full and was dropped.
    lagged: Arc<AtomicBool>,
}

impl Subscriber {
    fn wants(&self, commit: &Committed) -> bool {
        commit.events.iter().any(|ev| {
            let key = ev.kv.as_ref().map_or(&[][..], |kv| kv.key.as_slice());
            self.ranges.iter().any(|r| r.contains(key))
        })
    }
}

impl Fanout {
    pub fn new(rev: i64, backlog: usize) -> Fanout {
        Fanout { inner: Mutex::new(Inner { rev, next_id: 0, subscribers: HashMap::new() }), backlog }
    }

    /// Whether any stream is subscribed (the writer makes no events otherwise).
    pub fn has_subscribers(&self) -> bool {
        !self.inner.locked().subscribers.is_empty()
    }

    /// Queues `commit` for every stream with a watcher on one of its keys,
    /// and records its revision as handed out.
    pub fn publish(&self, commit: Committed) {
        let mut inner = self.inner.locked();
        let commit = Arc::new(commit);
        for sub in inner.subscribers.values() {
            if sub.wants(&commit) {
                match sub.queue.try_send(commit.clone()) {
                    Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => sub.lagged.store(true, Ordering::Release),
                }
            }
        }
        inner.rev = inner.rev.max(commit.rev);
    }

    /// Records a commit whose events were not made (no stream was
    /// subscribed when its batch began): a stream that subscribed since
    /// cannot know what it missed, so it is told it lagged and re-reads
    /// from the log.
    pub fn uncollected(&self, rev: i64) {
        let mut inner = self.inner.locked();
        for sub in inner.subscribers.values() {
            sub.lagged.store(true, Ordering::Release);
        }
        inner.rev = inner.rev.max(rev);
    }

    /// A subscription with no ranges yet.
    pub fn subscribe(self: &Arc<Self>) -> Subscription {
        let (tx, rx) = mpsc::channel(self.backlog);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut inner = self.inner.locked();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.insert(id, Subscriber { ranges: Vec::new(), queue: tx, lagged: lagged.clone() });
        Subscription { fanout: self.clone(), id, queue: rx, lagged }
    }
}

/// One stream's subscription; dropping it unsubscribes.
pub struct Subscription {
    fanout: Arc<Fanout>,
    id: u64,
    queue: mpsc::Receiver<Arc<Committed>>,
    lagged: Arc<AtomicBool>,
}

/// What a subscription receives.
pub enum Received {
    Commit(Arc<Committed>),
    /// Commits it wanted were dropped: its queue was full.
    Lagged,
    /// The queue closed. The fanout keeps each queue's sender until the
    /// subscription is dropped, so this answers only a fanout that is gone.
    Closed,
}

impl Subscription {
    /// The next commit for this stream.
    pub async fn recv(&mut self) -> Received {
        if self.take_lagged() {
            return Received::Lagged;
        }
        match self.queue.recv().await {
            Some(commit) => Received::Commit(commit),
            None => Received::Closed,
        }
    }

    /// A commit already queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Arc<Committed>> {
        self.queue.try_recv().ok()
    }

    /// Whether commits it wanted were dropped since it last asked.
    pub fn take_lagged(&self) -> bool {
        self.lagged.swap(false, Ordering::AcqRel)
    }

    /// Sets the ranges this stream's watchers cover and answers the newest
    /// revision handed out: every commit up to it with a key in the old
    /// ranges is already queued, and every later one with a key in the new
    /// ranges will be.
    pub fn set_ranges(&self, ranges: Vec<KeyRange>) -> i64 {
        let mut inner = self.fanout.inner.locked();
        if let Some(sub) = inner.subscribers.get_mut(&self.id) {
            sub.ranges = ranges;
        }
        inner.rev
    }

    /// The newest revision handed out: every commit up to it that this
    /// stream wants is already queued.
    pub fn level(&self) -> i64 {
        self.fanout.inner.locked().rev
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.fanout.inner.locked().subscribers.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::proto::{Event, KeyValue};

    fn commit(rev: i64, keys: &[&str]) -> Committed {
        let events = keys
            .iter()
            .map(|k| Event {
                kv: Some(KeyValue { key: k.as_bytes().to_vec(), mod_revision: rev, ..Default::default() }),
                ..Default::default()
            })
            .collect();
        Committed { rev, events }
    }

    #[tokio::test]
    async fn a_commit_reaches_only_the_streams_with_a_watcher_on_its_keys() {
        let fanout = Arc::new(Fanout::new(1, 4));
        let mut pods = fanout.subscribe();
        let mut nodes = fanout.subscribe();
        let idle = fanout.subscribe();
        assert_eq!(pods.set_ranges(vec![KeyRange::new(b"/registry/pods/", b"/registry/pods0")]), 1);
        nodes.set_ranges(vec![KeyRange::new(b"/registry/minions/", b"/registry/minions0")]);
        assert!(fanout.has_subscribers());
        fanout.publish(commit(2, &["/registry/pods/default/a"]));
        fanout.publish(commit(3, &["/registry/minions/n1", "/registry/pods/default/b"]));
        fanout.publish(commit(4, &[]));
        let Received::Commit(c) = pods.recv().await else { panic!("pods: commit 2") };
        assert_eq!(c.rev, 2);
        let Received::Commit(c) = pods.recv().await else { panic!("pods: commit 3") };
        assert_eq!(c.rev, 3);
        assert!(pods.try_recv().is_none(), "commit 4 held no event");
        let Received::Commit(c) = nodes.recv().await else { panic!("nodes: commit 3") };
        assert_eq!(c.rev, 3);
        assert!(nodes.try_recv().is_none(), "commit 2 held no node");
        assert_eq!(idle.level(), 4, "level with every revision handed out");
        drop((idle, nodes));
        assert!(fanout.has_subscribers());
        drop(pods);
        assert!(!fanout.has_subscribers());
    }

    #[tokio::test]
    async fn a_full_queue_is_told_it_lagged_and_then_gets_what_is_queued() {
        let fanout = Arc::new(Fanout::new(0, 2));
        let mut sub = fanout.subscribe();
        sub.set_ranges(vec![KeyRange::new(b"k", b"")]);
        for rev in 1..=3 {
            fanout.publish(commit(rev, &["k"]));
        }
        assert!(matches!(sub.recv().await, Received::Lagged));
        assert_eq!(sub.level(), 3);
        let Received::Commit(c) = sub.recv().await else { panic!("queued commit") };
        assert_eq!(c.rev, 1);
        assert_eq!(sub.try_recv().map(|c| c.rev), Some(2));
        assert!(sub.try_recv().is_none());
        fanout.uncollected(4);
        assert!(matches!(sub.recv().await, Received::Lagged), "a commit made without events");
        assert_eq!(sub.level(), 4);
    }
}
