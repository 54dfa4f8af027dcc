//! The API server's watch cache (upstream's Cacher): per resource, created
//! on first use and kept, one store watch feeds the current objects, a
//! window of recent events and the revision the cache has reached. Lists
//! and watches are served from it: each object is decoded (and decrypted)
//! once and encoded once, whatever the number of clients that read it.
//!
//! - `cacher`: one resource's cache and the reflector that fills it;
//! - `object`: what it holds, with the shared encodings;
//! - `snapshot`: the objects in key order, shared by the lists in flight;
//! - `list_writes`: a run of a snapshot's JSON joined into writes, shared too;
//! - `splice`: the cache's JSON made from the stored JSON without decoding it;
//! - `window`: the recent events a watch may resume from;
//! - `watcher`: watchers' filters and bounded buffers;
//! - `consistent_read`: waiting for a revision before reading.

pub mod cacher;
pub mod consistent_read;
pub mod list_writes;
pub mod object;
pub mod snapshot;
pub mod splice;
pub mod watcher;
pub mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::apiserver::resource::Resource;
use crate::apiserver::selector::selectable_fields;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Storage, Stored};
use crate::sync::LockExt;
pub use cacher::{Cacher, Shape};

/// Events a watch can resume from, per resource, unless told otherwise
/// (`--default-watch-cache-size`). Upstream keeps between 100 and 102,400,
/// sized so the window spans 75 s of changes; a fixed count keeps the
/// memory predictable on a small machine: 4,096 events cover a minute of a
/// busy edge cluster and about 4 s of a 1,000 changes/s burst, beyond which
/// a client relists (410 Gone), as it would upstream.
pub const DEFAULT_WINDOW: usize = 4096;

/// The caches of every resource that has been listed or watched.
pub struct WatchCache {
    storage: Storage,
    /// Events per window; 0 turns the cache off (every read goes to the store).
    window_size: usize,
    cachers: Mutex<HashMap<String, Arc<Cacher>>>,
}

impl WatchCache {
    pub fn new(storage: Storage, window_size: usize) -> Self {
        WatchCache { storage, window_size, cachers: Mutex::new(HashMap::new()) }
    }

    /// The cache of `r`, created (and filled) on first use; None when the
    /// cache is off, or for Events, which upstream does not cache either
    /// (`DefaultWatchCacheSizes`): many, written once, read rarely.
    pub fn cacher(&self, r: &Resource) -> Option<Arc<Cacher>> {
        if self.window_size == 0 || is_event(r) {
            return None;
        }
        let prefix = r.key_prefix();
        let mut cachers = self.cachers.locked();
        if let Some(c) = cachers.get(&prefix) {
            return Some(c.clone());
        }
        let index = (r.group.is_empty() && r.kind == "Pod")
            .then(|| selectable_fields::of("", "Pod").0.iter().find(|f| f.label == NODE_NAME).copied())
            .flatten();
        let shape = Shape {
            prefix: prefix.clone(),
            namespaced: r.namespaced,
            api_version: r.cache_api_version(),
            kind: r.kind.clone(),
            index,
        };
        let c = Cacher::start(self.storage.clone(), shape, self.window_size);
        cachers.insert(prefix, c.clone());
        Some(c)
    }
}

impl WatchCache {
    /// The object at `key` of `r` as the cache holds it, else as the store
    /// does. The cached one may be behind the store: a first guess for a
    /// write that checks the revision it read (upstream's GuaranteedUpdate
    /// takes the cached object the same way), or a read that, like
    /// upstream's listers, may lag.
    pub async fn get_or_read(&self, r: &Resource, key: &str) -> ApiResult<Option<Stored>> {
        if let Some(obj) = self.cached(r, key) {
            return Ok(Some(Stored { object: obj.value(), rev: obj.rev }));
        }
        self.storage.get(key).await
    }

    /// The object at `key` of `r` as the cache holds it, not decoded.
    pub fn cached(&self, r: &Resource, key: &str) -> Option<Arc<object::CachedObject>> {
        self.cacher(r).and_then(|c| c.get(key))
    }
}

/// Events of either group (`events` and `events.k8s.io/events`).
fn is_event(r: &Resource) -> bool {
    r.plural == "events" && (r.group.is_empty() || r.group == "events.k8s.io")
}

/// The field kubelets select their pods by, which the pods' cache indexes.
pub const NODE_NAME: &str = "spec.nodeName";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn events_of_both_groups_are_not_cached() {
        let r = Registry::builtin();
        let get = |group: &str, version: &str, plural: &str| r.get(group, version, plural).expect(plural);
        assert!(is_event(&get("", "v1", "events")));
        assert!(is_event(&get("events.k8s.io", "v1", "events")));
        assert!(!is_event(&get("", "v1", "pods")));
        assert!(!is_event(&get("", "v1", "configmaps")));
    }
}
