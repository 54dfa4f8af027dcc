//! The watchers of one cache: what each wants to see, and its bounded
//! buffer. A watcher whose buffer is full is ended (upstream's cacheWatcher
//! is closed "due to unresponsiveness"): its client re-watches from the
//! last resourceVersion it saw, and nobody else waits for it.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::object::{CachedEvent, CachedObject, EventType};

/// Events a watcher may have waiting (upstream's buffer for watchers the
/// cache does not trigger by an index is 1,000 events).
pub const BUFFER_EVENTS: usize = 1000;
/// Bytes of events a watcher may have waiting (measured as their JSON):
/// large objects end a stuck watcher before 1,000 of them pile up.
pub const BUFFER_BYTES: usize = 8 << 20;

/// What a watcher is sent.
pub enum Delivery {
    Event(EventType, Arc<CachedEvent>),
    /// Everything up to this revision has been sent.
    Bookmark(i64),
}

/// Whether an object's labels and fields match a watch's selectors.
pub type Predicate = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// What a watcher sees of the resource.
#[derive(Clone)]
pub struct Filter {
    /// Keys under this prefix (a namespace, or all), or exactly this key.
    pub key: String,
    pub exact: bool,
    /// The selectors; None: everything in `key`.
    pub predicate: Option<Predicate>,
    /// The value of the cache's indexed field the selectors require
    /// (pods' spec.nodeName for a kubelet): other events are skipped at once.
    pub trigger: Option<String>,
}

impl Filter {
    fn in_scope(&self, key: &str) -> bool {
        if self.exact {
            key == self.key
        } else {
            key.starts_with(&self.key)
        }
    }

    /// Whether an object (for an initial list) is seen by this watcher.
    pub fn admits(&self, obj: &CachedObject) -> bool {
        self.in_scope(&obj.key) && self.selects(obj)
    }

    /// `admits` for an object already known to be under the filter's
    /// prefix: only an exact key and the selectors are left to check.
    pub fn admits_in_scope(&self, obj: &CachedObject) -> bool {
        (!self.exact || obj.key == self.key) && self.selects(obj)
    }

    fn selects(&self, obj: &CachedObject) -> bool {
        self.predicate.as_ref().is_none_or(|p| p(&obj.attrs()))
    }

    /// How this watcher sees the event of `views`, if at all: with
    /// selectors, an object that starts to match is ADDED and one that
    /// stops matching is DELETED, as upstream.
    pub fn sees(&self, views: &Views) -> Option<EventType> {
        let ev = views.ev;
        if !self.in_scope(&ev.object.key) {
            return None;
        }
        if let Some(want) = &self.trigger {
            let hit = |o: &CachedObject| o.index.as_deref() == Some(want.as_str());
            if !hit(&ev.object) && !ev.prev.as_deref().is_some_and(hit) {
                return None;
            }
        }
        let Some(p) = &self.predicate else { return Some(ev.kind) };
        match ev.kind {
            EventType::Added | EventType::Deleted => p(views.now()).then_some(ev.kind),
            EventType::Modified => {
                let now = p(views.now());
                let before = views.before().is_some_and(|o| p(o));
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
        }
    }
}

/// An event and its objects' selector views, decoded on first use and at
/// most once however many watchers' selectors read them.
pub struct Views<'a> {
    ev: &'a CachedEvent,
    now: OnceCell<Value>,
    before: OnceCell<Option<Value>>,
}

impl<'a> Views<'a> {
    pub fn of(ev: &'a CachedEvent) -> Self {
        Views { ev, now: OnceCell::new(), before: OnceCell::new() }
    }

    fn now(&self) -> &Value {
        self.now.get_or_init(|| self.ev.object.attrs())
    }

    fn before(&self) -> Option<&Value> {
        self.before.get_or_init(|| self.ev.prev.as_ref().map(|p| p.attrs())).as_ref()
    }
}

/// The cache's end of a watcher.
struct Slot {
    filter: Filter,
    bookmarks: bool,
    tx: mpsc::Sender<(Delivery, usize)>,
    queued: Arc<AtomicUsize>,
}

/// The watcher's end: deliveries in order; None when the cache ended it.
pub struct Inbox {
    rx: mpsc::Receiver<(Delivery, usize)>,
    queued: Arc<AtomicUsize>,
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Delivery> {
        let (d, size) = self.rx.recv().await?;
        self.queued.fetch_sub(size, Ordering::Relaxed);
        Some(d)
    }

    /// A delivery already waiting, if any.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        let (d, size) = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(size, Ordering::Relaxed);
        Some(d)
    }
}

#[derive(Default)]
pub struct Watchers {
    slots: HashMap<u64, Slot>,
    next_id: u64,
}

impl Watchers {
    pub fn add(&mut self, filter: Filter, bookmarks: bool) -> Inbox {
        let (tx, rx) = mpsc::channel(BUFFER_EVENTS);
        let queued = Arc::new(AtomicUsize::new(0));
        self.next_id += 1;
        self.slots.insert(self.next_id, Slot { filter, bookmarks, tx, queued: queued.clone() });
        Inbox { rx, queued }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn any_bookmarks(&self) -> bool {
        self.slots.values().any(|s| s.bookmarks)
    }

    /// Ends every watcher: their clients re-watch (and, when their
    /// revision is gone, relist).
    pub fn end_all(&mut self) {
        self.slots.clear();
    }

    /// Hands `ev` to every watcher that sees it; a watcher whose buffer is
    /// full, or whose client went away, is ended.
    pub fn dispatch(&mut self, ev: &Arc<CachedEvent>) {
        let size = ev.object.encoded_len().max(1);
        let views = Views::of(ev);
        self.slots.retain(|id, slot| {
            let Some(as_type) = slot.filter.sees(&views) else { return !slot.tx.is_closed() };
            if slot.queued.load(Ordering::Relaxed) + size > BUFFER_BYTES {
                tracing::debug!(watcher = id, "ending a watcher that does not read (buffer bytes full)");
                return false;
            }
            match slot.tx.try_send((Delivery::Event(as_type, ev.clone()), size)) {
                Ok(()) => {
                    slot.queued.fetch_add(size, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::debug!(watcher = id, "ending a watcher that does not read (buffer full)");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// A bookmark to the watchers that asked for them; one whose buffer is
    /// full simply misses it (it is behind anyway).
    pub fn bookmark(&mut self, rev: i64) {
        self.slots.retain(|_, slot| {
            if slot.bookmarks {
                if let Err(mpsc::error::TrySendError::Closed(_)) = slot.tx.try_send((Delivery::Bookmark(rev), 0)) {
                    return false;
                }
            }
            !slot.tx.is_closed()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(key: &str, rev: i64, node: &str) -> Arc<CachedObject> {
        let index = crate::apiserver::selector::selectable_fields::of("", "Pod")
            .0
            .iter()
            .find(|f| f.label == "spec.nodeName")
            .copied();
        let form = super::super::object::Form::new("v1", "Pod", index);
        Arc::new(CachedObject::new(key.into(), rev, json!({"spec": {"nodeName": node}}), &form))
    }

    fn node_of(v: &Value) -> Option<String> {
        v.pointer("/spec/nodeName").and_then(Value::as_str).map(str::to_string)
    }

    fn sees(f: &Filter, ev: &CachedEvent) -> Option<EventType> {
        f.sees(&Views::of(ev))
    }

    #[test]
    fn selectors_turn_modifications_into_adds_and_deletes() {
        let on = |n: &'static str| -> Predicate { Arc::new(move |v: &Value| node_of(v).as_deref() == Some(n)) };
        let f = Filter { key: "/p/".into(), exact: false, predicate: Some(on("a")), trigger: Some("a".into()) };
        let moved_in = CachedEvent::new(EventType::Modified, pod("/p/x", 2, "a"), Some(pod("/p/x", 1, "")));
        let moved_out = CachedEvent::new(EventType::Modified, pod("/p/x", 3, "b"), Some(pod("/p/x", 2, "a")));
        let elsewhere = CachedEvent::new(EventType::Added, pod("/p/y", 4, "b"), None);
        let other_prefix = CachedEvent::new(EventType::Added, pod("/q/y", 5, "a"), None);
        assert_eq!(sees(&f, &moved_in), Some(EventType::Added));
        assert_eq!(sees(&f, &moved_out), Some(EventType::Deleted));
        assert_eq!(sees(&f, &elsewhere), None);
        assert_eq!(sees(&f, &other_prefix), None);
    }

    #[tokio::test]
    async fn a_watcher_that_does_not_read_is_ended_and_others_go_on() {
        let mut w = Watchers::default();
        let all = Filter { key: "/p/".into(), exact: false, predicate: None, trigger: None };
        let mut stuck = w.add(all.clone(), false);
        let mut reader = w.add(all, false);
        let mut got = 0;
        for rev in 1..=(BUFFER_EVENTS as i64 + 10) {
            let ev = Arc::new(CachedEvent::new(EventType::Added, pod(&format!("/p/{rev}"), rev, "a"), None));
            w.dispatch(&ev);
            while let Ok(Some(_)) = tokio::time::timeout(std::time::Duration::ZERO, reader.recv()).await {
                got += 1;
            }
        }
        assert_eq!(got, BUFFER_EVENTS + 10, "the reading watcher got every event");
        assert_eq!(w.len(), 1, "the stuck one was ended");
        let mut drained = 0;
        while stuck.recv().await.is_some() {
            drained += 1;
        }
        assert_eq!(drained, BUFFER_EVENTS, "it gets what was buffered, then its end");
    }
}
