//! Expectations, as upstream's ControllerExpectations: after creating or
//! deleting pods, a ReplicaSet does not manage its replicas again until its
//! pod cache has seen those creations and deletions, so a lagging cache
//! never makes it create or delete twice. Here an expectation names the
//! pods, and is met by looking at the cache itself.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unmet expectation holds before it is given up on.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Pending {
    creates: HashSet<String>,
    deletes: HashSet<String>,
    since: Option<Instant>,
}

/// Pending creations and deletions per controller key (`namespace/name`).
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

/// What the cache says of a pod name.
pub enum Seen {
    Absent,
    Present,
    Terminating,
}

impl Expectations {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Pending>) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    pub fn expect_creations(&self, key: &str, names: impl IntoIterator<Item = String>) {
        self.with(|m| {
            let p = m.entry(key.to_string()).or_default();
            p.creates.extend(names);
            p.since = Some(Instant::now());
        });
    }

    pub fn expect_deletions(&self, key: &str, names: impl IntoIterator<Item = String>) {
        self.with(|m| {
            let p = m.entry(key.to_string()).or_default();
            p.deletes.extend(names);
            p.since = Some(Instant::now());
        });
    }

    /// A pod named `name` was deleted: it will never show up as created.
    pub fn observe_deletion(&self, key: &str, name: &str) {
        self.with(|m| {
            if let Some(p) = m.get_mut(key) {
                p.creates.remove(name);
                p.deletes.remove(name);
            }
        });
    }

    /// Whether every expected creation and deletion is visible in the cache
    /// (`seen` looks a pod name up), or the expectations have expired.
    pub fn satisfied(&self, key: &str, seen: impl Fn(&str) -> Seen) -> bool {
        self.with(|m| {
            let Some(p) = m.get_mut(key) else { return true };
            p.creates.retain(|n| matches!(seen(n), Seen::Absent));
            p.deletes.retain(|n| matches!(seen(n), Seen::Present));
            let done = p.creates.is_empty() && p.deletes.is_empty();
            let expired = p.since.is_some_and(|s| s.elapsed() > EXPECTATION_TIMEOUT);
            if done || expired {
                m.remove(key);
                return true;
            }
            false
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn met_when_the_cache_shows_them() {
        let e = Expectations::default();
        e.expect_creations("ns/rs", ["a".to_string(), "b".to_string()]);
        assert!(!e.satisfied("ns/rs", |n| if n == "a" { Seen::Present } else { Seen::Absent }));
        assert!(e.satisfied("ns/rs", |_| Seen::Present));
        e.expect_deletions("ns/rs", ["a".to_string()]);
        assert!(!e.satisfied("ns/rs", |_| Seen::Present));
        assert!(e.satisfied("ns/rs", |_| Seen::Terminating));
        e.expect_creations("ns/rs", ["c".to_string()]);
        e.observe_deletion("ns/rs", "c");
        assert!(e.satisfied("ns/rs", |_| Seen::Absent));
    }
}
