//! Watch-fed caches of small, often-read sets of objects (RBAC objects,
//! namespaces, webhook configurations, quotas, limit ranges, priority and
//! storage classes): loaded once, then kept current from the store's watch,
//! so that authorization and admission read memory instead of the store on
//! every request. (The Node authorizer's own caches, projections of pods,
//! claims and volumes, are `auth::graph_populator`'s.)

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use serde_json::Value;

use super::status::ApiError;
use super::storage::{whole, Change, Decoded, Decoding, Parse, Storage};
use crate::sync::RwLockExt;

/// What a cache holds of each object, as its parse makes it of the stored
/// JSON: the JSON value, or a leaner form for a cache of many objects.
pub trait Cached: Decoded + Send + Sync + Sized + 'static {
    /// `Kind/namespace/name` (or `Kind/name`).
    fn id(&self) -> String;
    fn namespace(&self) -> Option<&str>;
    /// The key the cache also indexes the object by (a pod's node), so
    /// that `any_with_key` visits only the objects that have it; none by
    /// default.
    fn index_key(&self) -> Option<&str> {
        None
    }
}

impl Cached for Value {
    fn id(&self) -> String {
        id_of(self)
    }

    fn namespace(&self) -> Option<&str> {
        self.pointer("/metadata/namespace").and_then(Value::as_str)
    }
}

/// Every object under one key prefix, by `Kind/namespace/name` (or `Kind/name`).
pub struct PrefixCache<T: Cached = Value> {
    prefix: String,
    /// Shared, so that readers take a snapshot without copying objects.
    objects: RwLock<Objects<T>>,
    /// What is kept of each object, made from its stored JSON.
    parse: Parse<T>,
    /// Bumped at every change applied, for readers that wait for one.
    changes: tokio::sync::watch::Sender<u64>,
    /// The first load has finished (upstream's informer HasSynced).
    synced: std::sync::atomic::AtomicBool,
}

/// The objects by id, and by `Cached::index_key` for those that have one.
struct Objects<T> {
    by_id: HashMap<String, Arc<T>>,
    by_key: HashMap<Box<str>, Vec<Arc<T>>>,
}

impl<T> Default for Objects<T> {
    fn default() -> Self {
        Objects { by_id: HashMap::new(), by_key: HashMap::new() }
    }
}

impl<T: Cached> Objects<T> {
    fn insert(&mut self, id: String, obj: Arc<T>) {
        if let Some(key) = obj.index_key() {
            self.by_key.entry(key.into()).or_default().push(obj.clone());
        }
        if let Some(old) = self.by_id.insert(id, obj) {
            self.unindex(&old);
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(old) = self.by_id.remove(id) {
            self.unindex(&old);
        }
    }

    fn unindex(&mut self, old: &Arc<T>) {
        let Some(key) = old.index_key() else { return };
        if let Some(list) = self.by_key.get_mut(key) {
            list.retain(|o| !Arc::ptr_eq(o, old));
            if list.is_empty() {
                self.by_key.remove(key);
            }
        }
    }
}

pub fn id_of(obj: &Value) -> String {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

impl PrefixCache {
    pub fn new(prefix: &str) -> Arc<Self> {
        Arc::new(PrefixCache {
            prefix: prefix.to_string(),
            objects: RwLock::default(),
            parse: whole,
            changes: tokio::sync::watch::Sender::new(0),
            synced: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl<T: Cached> PrefixCache<T> {
    /// A cache that keeps only what `parse` makes of each object's JSON
    /// (which must keep `kind`, `metadata.name` and `metadata.namespace`),
    /// in the form `T`, for sets too large to hold whole or to decode whole
    /// at every change.
    pub fn projected(prefix: &str, parse: Parse<T>) -> Arc<Self> {
        Arc::new(PrefixCache {
            prefix: prefix.to_string(),
            objects: RwLock::default(),
            parse,
            changes: tokio::sync::watch::Sender::new(0),
            synced: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether the first load has finished (upstream's informer HasSynced).
    pub fn has_synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A receiver told of every change applied from now on.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether any cached object satisfies `pred` (nothing is copied).
    pub fn any(&self, mut pred: impl FnMut(&T) -> bool) -> bool {
        self.objects.read_locked().by_id.values().any(|o| pred(o))
    }

    /// Whether any cached object whose `Cached::index_key` is `key`
    /// satisfies `pred` (only those objects are visited).
    pub fn any_with_key(&self, key: &str, mut pred: impl FnMut(&T) -> bool) -> bool {
        let objects = self.objects.read_locked();
        objects.by_key.get(key).is_some_and(|list| list.iter().any(|o| pred(o)))
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.objects.read_locked().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every cached object, in no particular order (shared, not copied).
    pub fn all(&self) -> Vec<Arc<T>> {
        self.objects.read_locked().by_id.values().cloned().collect()
    }

    /// The objects of one namespace.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<T>> {
        let objects = self.objects.read_locked();
        objects.by_id.values().filter(|o| o.namespace() == Some(namespace)).cloned().collect()
    }

    /// Whether one namespace has any object (nothing is copied).
    pub fn any_in_namespace(&self, namespace: &str) -> bool {
        self.objects.read_locked().by_id.values().any(|o| o.namespace() == Some(namespace))
    }

    pub fn get(&self, id: &str) -> Option<Arc<T>> {
        self.objects.read_locked().by_id.get(id).cloned()
    }

    /// Adds `obj` as if the store had sent it.
    #[cfg(test)]
    pub(crate) fn apply_for_test(&self, obj: &Value) {
        let object = serde_json::to_vec(obj).and_then(|b| (self.parse)(&b)).expect("a parsable object");
        self.apply(Change::Added(super::storage::Stored { object, rev: 1 }))
    }

    /// Removes `obj` as if the store had sent its deletion.
    #[cfg(test)]
    pub(crate) fn delete_for_test(&self, obj: &Value) {
        let object = serde_json::to_vec(obj).and_then(|b| (self.parse)(&b)).expect("a parsable object");
        self.apply(Change::Deleted(super::storage::Stored { object, rev: 1 }))
    }

    fn apply(&self, change: Change<T>) {
        let mut objects = self.objects.write_locked();
        match change {
            Change::Added(s) | Change::Modified { new: s, .. } => objects.insert(s.object.id(), Arc::new(s.object)),
            Change::Deleted(s) => objects.remove(&s.object.id()),
            Change::Progress(_) => return,
        }
        drop(objects);
        self.changes.send_modify(|n| *n += 1);
    }

    async fn load(&self, storage: &Storage) -> Result<i64, ApiError> {
        let (items, rev) = storage.list_all_parsed(&self.prefix, self.parse).await?;
        let mut all = Objects::default();
        for s in items {
            all.insert(s.object.id(), Arc::new(s.object));
        }
        *self.objects.write_locked() = all;
        self.changes.send_modify(|n| *n += 1);
        self.synced.store(true, std::sync::atomic::Ordering::Release);
        Ok(rev)
    }

    /// Loads the objects, then follows changes in a task.
    pub async fn start(self: &Arc<Self>, storage: Storage) -> Result<tokio::task::JoinHandle<()>, ApiError> {
        let rev = self.load(&storage).await?;
        let this = self.clone();
        Ok(tokio::spawn(async move { this.follow(storage, rev).await }))
    }

    async fn follow(&self, storage: Storage, mut from: i64) {
        loop {
            match storage
                .watch(&self.prefix, false, from, std::time::Duration::from_secs(3600), Decoding::projected(self.parse))
                .await
            {
                Ok(changes) => {
                    let mut changes = Box::pin(changes);
                    while let Some(change) = changes.next().await {
                        match change {
                            Ok(c) => {
                                if let Change::Added(s) | Change::Deleted(s) | Change::Modified { new: s, .. } = &c {
                                    from = s.rev;
                                }
                                self.apply(c);
                            }
                            Err(e) => {
                                tracing::warn!(prefix = %self.prefix, error = %e, "cache watch ended; reloading");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(prefix = %self.prefix, error = %e, "cannot watch"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match self.load(&storage).await {
                Ok(rev) => from = rev,
                Err(e) => tracing::error!(prefix = %self.prefix, error = %e, "cannot reload"),
            }
        }
    }
}

/// The caches the API server keeps.
pub struct Caches {
    pub rbac: Arc<PrefixCache>,
    pub namespaces: Arc<PrefixCache>,
    pub mutating_webhooks: Arc<PrefixCache>,
    pub validating_webhooks: Arc<PrefixCache>,
    pub resource_quotas: Arc<PrefixCache>,
    pub limit_ranges: Arc<PrefixCache>,
    pub priority_classes: Arc<PrefixCache>,
    pub storage_classes: Arc<PrefixCache>,
}

impl Default for Caches {
    fn default() -> Self {
        Caches {
            rbac: PrefixCache::new("/registry/rbac.authorization.k8s.io/"),
            namespaces: PrefixCache::new("/registry/namespaces/"),
            mutating_webhooks: PrefixCache::new(
                "/registry/admissionregistration.k8s.io/mutatingwebhookconfigurations/",
            ),
            validating_webhooks: PrefixCache::new(
                "/registry/admissionregistration.k8s.io/validatingwebhookconfigurations/",
            ),
            resource_quotas: PrefixCache::new("/registry/resourcequotas/"),
            limit_ranges: PrefixCache::new("/registry/limitranges/"),
            priority_classes: PrefixCache::new("/registry/scheduling.k8s.io/priorityclasses/"),
            storage_classes: PrefixCache::new("/registry/storage.k8s.io/storageclasses/"),
        }
    }
}

impl Caches {
    fn all(&self) -> [&Arc<PrefixCache>; 8] {
        [
            &self.rbac,
            &self.namespaces,
            &self.mutating_webhooks,
            &self.validating_webhooks,
            &self.resource_quotas,
            &self.limit_ranges,
            &self.priority_classes,
            &self.storage_classes,
        ]
    }

    /// Loads every cache and starts following them.
    pub async fn start(&self, storage: &Storage) -> Result<Vec<tokio::task::JoinHandle<()>>, ApiError> {
        let mut tasks = Vec::new();
        for c in self.all() {
            tasks.push(c.start(storage.clone()).await?);
        }
        Ok(tasks)
    }

    /// Every cache has loaded once (readiness' `informer-sync`).
    pub fn synced(&self) -> bool {
        self.all().iter().all(|c| c.has_synced())
    }
}
