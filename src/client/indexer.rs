//! client-go's Indexer: secondary keys of a shared cache (pods by node, by
//! controller, objects by namespace), kept up to date by the informer that
//! writes the cache, so a controller looks up the few objects it needs
//! instead of scanning every one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

use crate::sync::RwLockExt;

/// The keys an object is indexed under.
pub type IndexFunc<K> = fn(&K) -> Vec<String>;

/// Pods by `spec.nodeName` (client-go's `spec.nodeName` index).
pub const POD_NODE_NAME: &str = "spec.nodeName";
/// Objects by the UID of their controller ownerReference.
pub const CONTROLLER_UID: &str = "controllerUID";
/// Objects by namespace (client-go's `NamespaceIndex`).
pub const NAMESPACE: &str = "namespace";
/// Objects without a controller (orphans a workload may adopt), by namespace.
pub const ORPHAN_NAMESPACE: &str = "orphanNamespace";

/// The node a pod is bound to, if any.
pub fn pod_node_name(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).into_iter().collect()
}

/// The UID of the object's controller, if it has one.
pub fn controller_uid<K: Resource>(obj: &K) -> Vec<String> {
    obj.meta().owner_references.iter().flatten().filter(|o| o.controller == Some(true)).map(|o| o.uid.clone()).collect()
}

/// The object's namespace (none for a cluster-scoped one).
pub fn namespace<K: Resource>(obj: &K) -> Vec<String> {
    obj.meta().namespace.clone().into_iter().collect()
}

/// The namespace of an object that has no controller.
pub fn orphan_namespace<K: Resource>(obj: &K) -> Vec<String> {
    let meta = obj.meta();
    if meta.owner_references.iter().flatten().any(|o| o.controller == Some(true)) {
        return Vec::new();
    }
    meta.namespace.clone().into_iter().collect()
}

/// `key` without its resourceVersion and uid (`extra`, which lookups
/// ignore): two fewer strings held per object in every index.
fn bare<K: Resource<DynamicType = ()>>(key: &ObjectRef<K>) -> ObjectRef<K> {
    let name = ObjectRef::new(&key.name);
    match &key.namespace {
        Some(ns) => name.within(ns),
        None => name,
    }
}

struct Entry<K: Resource<DynamicType = ()> + 'static> {
    func: IndexFunc<K>,
    keys: HashMap<String, HashSet<ObjectRef<K>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Entry<K> {
    fn insert(&mut self, key: &ObjectRef<K>, obj: &K) {
        for value in (self.func)(obj) {
            self.keys.entry(value).or_default().insert(bare(key));
        }
    }

    fn remove(&mut self, key: &ObjectRef<K>, obj: &K) {
        for value in (self.func)(obj) {
            if let Some(set) = self.keys.get_mut(&value) {
                set.remove(key);
                if set.is_empty() {
                    self.keys.remove(&value);
                }
            }
        }
    }
}

/// Every index of one cache.
pub struct Indexer<K: Resource<DynamicType = ()> + 'static> {
    indexes: Arc<RwLock<HashMap<&'static str, Entry<K>>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Indexer<K> {
    fn clone(&self) -> Self {
        Indexer { indexes: self.indexes.clone() }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Default for Indexer<K> {
    fn default() -> Self {
        Indexer { indexes: Arc::new(RwLock::new(HashMap::new())) }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Indexer<K> {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<&'static str, Entry<K>>> {
        self.indexes.write_locked()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<&'static str, Entry<K>>> {
        self.indexes.read_locked()
    }

    /// Adds the index `name` (unless present), built from `state`.
    pub fn add(&self, name: &'static str, func: IndexFunc<K>, state: &[Arc<K>]) {
        let mut indexes = self.write();
        if indexes.contains_key(name) {
            return;
        }
        let mut entry = Entry { func, keys: HashMap::new() };
        for obj in state {
            entry.insert(&ObjectRef::from_obj(&**obj), obj);
        }
        indexes.insert(name, entry);
    }

    /// Moves the object under `key` from its old keys to its new ones.
    pub fn update(&self, key: &ObjectRef<K>, old: Option<&K>, new: Option<&K>) {
        let mut indexes = self.write();
        for entry in indexes.values_mut() {
            if let Some(old) = old {
                entry.remove(key, old);
            }
            if let Some(new) = new {
                entry.insert(key, new);
            }
        }
    }

    /// Builds every index afresh from a new list.
    pub fn rebuild(&self, state: &[Arc<K>]) {
        let mut indexes = self.write();
        for entry in indexes.values_mut() {
            entry.keys.clear();
            for obj in state {
                entry.insert(&ObjectRef::from_obj(&**obj), obj);
            }
        }
    }

    fn refs(&self, name: &str, value: &str) -> Vec<ObjectRef<K>> {
        self.read().get(name).and_then(|e| e.keys.get(value)).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }
}

/// One index of a shared cache.
pub struct Index<K: Resource<DynamicType = ()> + 'static> {
    name: &'static str,
    func: IndexFunc<K>,
    store: Store<K>,
    indexer: Indexer<K>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Index<K> {
    fn clone(&self) -> Self {
        Index { name: self.name, func: self.func, store: self.store.clone(), indexer: self.indexer.clone() }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Index<K> {
    pub(crate) fn new(name: &'static str, func: IndexFunc<K>, store: Store<K>, indexer: Indexer<K>) -> Self {
        Index { name, func, store, indexer }
    }

    /// The cached objects indexed under `value` (as the cache holds them
    /// now: an object whose keys changed meanwhile is left out).
    pub fn get(&self, value: &str) -> Vec<Arc<K>> {
        self.indexer
            .refs(self.name, value)
            .iter()
            .filter_map(|r| self.store.get(r))
            .filter(|o| (self.func)(o).iter().any(|v| v == value))
            .collect()
    }

    /// The cache this indexes.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn pod(name: &str, node: Option<&str>, owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                owner_references: owner
                    .map(|uid| vec![OwnerReference { uid: uid.into(), controller: Some(true), ..Default::default() }]),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: node.map(str::to_string), ..Default::default() }),
            status: None,
        }
    }

    /// Writes `event` into the cache and the indexes as the informer does.
    fn apply(writer: &mut reflector::store::Writer<Pod>, store: &Store<Pod>, indexer: &Indexer<Pod>, ev: Event<Pod>) {
        let (key, deleted) = match &ev {
            Event::Apply(p) => (ObjectRef::from_obj(p), false),
            Event::Delete(p) => (ObjectRef::from_obj(p), true),
            _ => {
                writer.apply_watcher_event(&ev);
                indexer.rebuild(&store.state());
                return;
            }
        };
        let old = store.get(&key);
        writer.apply_watcher_event(&ev);
        let new = if deleted { None } else { store.get(&key) };
        indexer.update(&key, old.as_deref(), new.as_deref());
    }

    fn names(pods: Vec<Arc<Pod>>) -> Vec<String> {
        let mut n: Vec<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn pods_by_node_and_by_controller_follow_every_change() {
        let (store, mut writer) = reflector::store::<Pod>();
        let indexer = Indexer::default();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("a", Some("n1"), Some("rs1"))));
        writer.apply_watcher_event(&Event::InitApply(pod("b", None, Some("rs1"))));
        writer.apply_watcher_event(&Event::InitApply(pod("c", Some("n2"), None)));
        writer.apply_watcher_event(&Event::InitDone);
        indexer.add(POD_NODE_NAME, pod_node_name, &store.state());
        indexer.add(CONTROLLER_UID, controller_uid::<Pod>, &store.state());
        let by_node = Index::new(POD_NODE_NAME, pod_node_name, store.clone(), indexer.clone());
        let by_owner = Index::new(CONTROLLER_UID, controller_uid::<Pod>, store.clone(), indexer.clone());
        assert_eq!(names(by_node.get("n1")), ["a"]);
        assert_eq!(names(by_owner.get("rs1")), ["a", "b"]);
        // b is bound; a is released by its owner; c is deleted.
        apply(&mut writer, &store, &indexer, Event::Apply(pod("b", Some("n1"), Some("rs1"))));
        apply(&mut writer, &store, &indexer, Event::Apply(pod("a", Some("n1"), None)));
        apply(&mut writer, &store, &indexer, Event::Delete(pod("c", Some("n2"), None)));
        assert_eq!(names(by_node.get("n1")), ["a", "b"]);
        assert_eq!(names(by_node.get("n2")), Vec::<String>::new());
        assert_eq!(names(by_owner.get("rs1")), ["b"]);
        // The index holds no key for what is gone.
        assert!(!indexer.read()[POD_NODE_NAME].keys.contains_key("n2"));
        assert!(!indexer.read()[CONTROLLER_UID].keys.values().any(|s| s.iter().any(|r| r.name == "a")));
        // A relist without b leaves it out.
        apply(&mut writer, &store, &indexer, Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("a", Some("n1"), None)));
        apply(&mut writer, &store, &indexer, Event::InitDone);
        assert_eq!(names(by_node.get("n1")), ["a"]);
        assert_eq!(names(by_owner.get("rs1")), Vec::<String>::new());
    }
}
