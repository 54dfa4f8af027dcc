//! ControllerExpectations, as upstream's controller_utils has them: after a
//! controller creates or deletes pods it waits until its cache has seen
//! those changes before acting again, so a stale cache never makes it
//! create the same pod twice. Expectations lapse after five minutes, as
//! upstream's do, in case a watch event was lost.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockExt;

const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Pending {
    adds: HashSet<String>,
    deletes: HashSet<String>,
    since: Option<Instant>,
}

/// Per-controller expectations, keyed by the owner's uid; pods by name.
#[derive(Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    /// Records that `owner` created the pod `name`.
    pub fn expect_create(&self, owner: &str, name: &str) {
        self.with(owner, |p| {
            p.adds.insert(name.to_string());
        });
    }

    /// Records that `owner` deleted the pod `name`.
    pub fn expect_delete(&self, owner: &str, name: &str) {
        self.with(owner, |p| {
            p.deletes.insert(name.to_string());
        });
    }

    /// Records pods `owner` created in one batch.
    pub fn expect_creates(&self, owner: &str, names: impl IntoIterator<Item = String>) {
        self.with(owner, |p| p.adds.extend(names));
    }

    /// Records pods `owner` deleted in one batch.
    pub fn expect_deletes(&self, owner: &str, names: impl IntoIterator<Item = String>) {
        self.with(owner, |p| p.deletes.extend(names));
    }

    /// A create that failed will never be observed.
    pub fn forget_create(&self, owner: &str, name: &str) {
        self.with(owner, |p| {
            p.adds.remove(name);
        });
    }

    /// The pod `name` is gone (its deletion was seen, or failed and will
    /// never be seen): neither its creation nor its deletion is awaited.
    pub fn observe_deletion(&self, owner: &str, name: &str) {
        let mut map = self.pending.locked();
        if let Some(p) = map.get_mut(owner) {
            p.adds.remove(name);
            p.deletes.remove(name);
        }
    }

    /// Each new expectation restarts the timeout, as upstream's do.
    fn with(&self, owner: &str, f: impl FnOnce(&mut Pending)) {
        let mut map = self.pending.locked();
        let p = map.entry(owner.to_string()).or_default();
        p.since = Some(Instant::now());
        f(p);
    }

    /// Whether every expected change is visible: `seen(name)` is None when
    /// the cache lacks the pod, else whether it is being deleted.
    pub fn satisfied(&self, owner: &str, seen: impl Fn(&str) -> Option<bool>) -> bool {
        let mut map = self.pending.locked();
        let Some(p) = map.get_mut(owner) else { return true };
        p.adds.retain(|n| seen(n).is_none());
        p.deletes.retain(|n| seen(n) == Some(false));
        let expired = p.since.is_some_and(|s| s.elapsed() > EXPECTATIONS_TIMEOUT);
        if expired || (p.adds.is_empty() && p.deletes.is_empty()) {
            map.remove(owner);
            return true;
        }
        false
    }

    /// Forgets an owner that is gone.
    pub fn remove(&self, owner: &str) {
        self.pending.locked().remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_creates_and_deletes_to_be_seen() {
        let e = Expectations::default();
        assert!(e.satisfied("u", |_| None));
        e.expect_create("u", "a");
        e.expect_delete("u", "b");
        assert!(!e.satisfied("u", |n| (n == "b").then_some(false)));
        assert!(!e.satisfied("u", |n| (n == "a" || n == "b").then_some(false)));
        assert!(e.satisfied("u", |n| (n == "a" || n == "b").then_some(n == "b")));
        e.expect_creates("u", ["c".to_string()]);
        e.observe_deletion("u", "c");
        assert!(e.satisfied("u", |_| None));
    }
}
