//! The window of recent events a watch can start from (upstream's
//! watchCache ring buffer): every event after `start` is held, in revision
//! order, up to a number of events; the oldest go first.

use std::collections::VecDeque;
use std::sync::Arc;

use super::object::CachedEvent;

/// A watch from a revision the window no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    /// The oldest revision a watch may start from.
    pub oldest: i64,
}

pub struct Window {
    events: VecDeque<Arc<CachedEvent>>,
    capacity: usize,
    /// Every event with a revision above this one is in the window.
    start: i64,
    /// Whether an event ever left the window since the last relist.
    trimmed: bool,
}

impl Window {
    pub fn new(capacity: usize, start: i64) -> Self {
        Window { events: VecDeque::new(), capacity: capacity.max(1), start, trimmed: false }
    }

    /// Empties the window: it holds every event after `start` again.
    pub fn reset(&mut self, start: i64) {
        self.events.clear();
        self.start = start;
        self.trimmed = false;
    }

    pub fn push(&mut self, ev: Arc<CachedEvent>) {
        if self.events.len() >= self.capacity {
            if let Some(old) = self.events.pop_front() {
                // Events of one revision (a transaction) may be split:
                // the revision itself is then no longer complete.
                self.start = self.start.max(old.rev);
                self.trimmed = true;
            }
        }
        self.events.push_back(ev);
    }

    /// Whether events left the window since it was last reset (until then,
    /// a revision older than `start` is simply from before the cache).
    pub fn trimmed(&self) -> bool {
        self.trimmed
    }

    pub fn start(&self) -> i64 {
        self.start
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events after `rev`, when the window holds all of them.
    pub fn since(&self, rev: i64) -> Result<Vec<Arc<CachedEvent>>, TooOld> {
        if rev < self.start {
            return Err(TooOld { oldest: self.start });
        }
        let from = self.events.partition_point(|e| e.rev <= rev);
        Ok(self.events.range(from..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::watch_cache::object::{CachedObject, EventType};

    fn ev(rev: i64) -> Arc<CachedEvent> {
        let form = crate::apiserver::watch_cache::object::Form::new("v1", "ConfigMap", None);
        let obj = Arc::new(CachedObject::new(format!("/k/{rev}"), rev, serde_json::json!({}), &form));
        Arc::new(CachedEvent::new(EventType::Added, obj, None))
    }

    #[test]
    fn holds_the_newest_events_and_knows_where_it_starts() {
        let mut w = Window::new(3, 10);
        assert_eq!(w.since(10).map(|v| v.len()), Ok(0));
        assert_eq!(w.since(9).err(), Some(TooOld { oldest: 10 }));
        for rev in 11..=14 {
            w.push(ev(rev));
        }
        assert!(w.trimmed());
        assert_eq!(w.start(), 11);
        assert_eq!(w.since(10).err(), Some(TooOld { oldest: 11 }));
        let revs: Vec<i64> = w.since(12).unwrap().iter().map(|e| e.rev).collect();
        assert_eq!(revs, vec![13, 14]);
        assert_eq!(w.since(14).map(|v| v.len()), Ok(0));
        w.reset(20);
        assert!(!w.trimmed() && w.is_empty());
    }
}
