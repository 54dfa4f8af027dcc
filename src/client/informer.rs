//! client-go's SharedIndexInformer: one watch of a kind (list, then watch,
//! relisting when the watch breaks) writing one cache (`Store`, whose
//! objects are `Arc`s, so every reader shares each object), keeping its
//! indexes up to date, and telling every subscriber each change.
//!
//! Subscribers may come and go while the watch runs (the controller
//! manager and the scheduler start under separate leader elections): one
//! subscribing after the first list is handed the cache's current objects
//! first, as client-go's `AddEventHandler` replays them. The store, the
//! indexes and the subscriber list change under one lock, so a subscriber
//! sees each change exactly once, after the cache holds it.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::indexer::{Index, IndexFunc, Indexer};
use crate::sync::LockExt;

/// What a subscriber is told, in the order the watch saw it.
#[derive(Debug)]
pub enum Change<K> {
    /// A (re)list starts: the objects that follow are the whole collection.
    Relist,
    /// An object of the list.
    Listed(Arc<K>),
    /// The list is complete and in the cache.
    Synced,
    /// An object created or updated, with what the cache held before.
    Applied { old: Option<Arc<K>>, new: Arc<K> },
    /// An object deleted (its last state).
    Deleted(Arc<K>),
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Relist => Change::Relist,
            Change::Listed(o) => Change::Listed(o.clone()),
            Change::Synced => Change::Synced,
            Change::Applied { old, new } => Change::Applied { old: old.clone(), new: new.clone() },
            Change::Deleted(o) => Change::Deleted(o.clone()),
        }
    }
}

impl<K> Change<K> {
    /// The object this change is about, if any.
    pub fn object(&self) -> Option<&Arc<K>> {
        match self {
            Change::Listed(o) | Change::Deleted(o) | Change::Applied { new: o, .. } => Some(o),
            Change::Relist | Change::Synced => None,
        }
    }
}

/// An informer's changes as kube's watcher events of the cached objects.
pub type WatchEvents<K> = BoxStream<'static, Result<Event<Arc<K>>, watcher::Error>>;

/// Which objects' changes a subscriber wants (`Informer::only`).
type Only<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// A subscriber's `Only`, set after it subscribed, shared with its `Informer`.
type OnlySlot<K> = Arc<Mutex<Option<Only<K>>>>;

struct Subscriber<K> {
    tx: mpsc::UnboundedSender<Change<K>>,
    /// Joined while a list was under way, after its start: it is handed the
    /// whole cache when the list completes.
    replay_at_sync: bool,
    only: OnlySlot<K>,
}

impl<K> Subscriber<K> {
    /// Hands over `change` unless `Informer::only` refuses its object (an
    /// update: both the old and the new one); false when the subscriber
    /// went away.
    fn tell(&self, change: &Change<K>) -> bool {
        let wanted = match &*self.only.locked() {
            Some(only) => kept(only.as_ref(), change),
            None => true,
        };
        if wanted {
            self.tx.send(change.clone()).is_ok()
        } else {
            !self.tx.is_closed()
        }
    }
}

/// Whether `keep` lets `change` through: list boundaries always, an update
/// when it keeps the old object or the new one (an object leaving what a
/// subscriber follows is news to it), any other change by its object.
fn kept<K>(keep: &(dyn Fn(&K) -> bool + Send + Sync), change: &Change<K>) -> bool {
    match change {
        Change::Applied { old: Some(old), new } => keep(new) || keep(old),
        other => other.object().is_none_or(|o| keep(o)),
    }
}

struct Shared<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    indexer: Indexer<K>,
    /// The subscribers; its lock also orders writes of the store and the
    /// indexes against subscriptions.
    subscribers: Mutex<Vec<Subscriber<K>>>,
}

/// One watch and one indexed cache of a kind for the whole process.
pub struct SharedIndexInformer<K: Resource<DynamicType = ()> + 'static> {
    shared: Arc<Shared<K>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for SharedIndexInformer<K> {
    fn clone(&self) -> Self {
        SharedIndexInformer { shared: self.shared.clone() }
    }
}

/// A subscription: the shared cache and this subscriber's own stream of
/// changes (which must be polled, or its changes queue up).
pub struct Informer<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    changes: BoxStream<'static, Change<K>>,
    only: OnlySlot<K>,
}

impl<K> SharedIndexInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching `api` (each object cut down to what in-process
    /// readers use, `transform`); runs for the life of the process.
    pub fn start(api: Api<K>, config: watcher::Config) -> Self {
        Self::start_when(api, config, std::future::ready(()))
    }

    /// `start`, with the watch begun only once `wanted` completes: for a
    /// kind that is read only when some object asks for it. The store and
    /// subscriptions exist at once; the store stays unsynced (and its
    /// subscribers hear nothing) until the watch has listed.
    pub fn start_when(
        api: Api<K>,
        config: watcher::Config,
        wanted: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        let (store, writer) = reflector::store();
        let shared =
            Arc::new(Shared { store: store.clone(), indexer: Indexer::default(), subscribers: Mutex::new(Vec::new()) });
        let events = super::typed_watcher::watch(api, config)
            .map(|event| event.map(|event| event.modify(super::transform::transform)))
            .boxed();
        let running = shared.clone();
        tokio::spawn(async move {
            wanted.await;
            run(running, writer, events).await;
        });
        SharedIndexInformer { shared }
    }
}

async fn run<K>(
    shared: Arc<Shared<K>>,
    mut writer: reflector::store::Writer<K>,
    mut events: BoxStream<'static, Result<Event<K>, watcher::Error>>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => shared.apply(&mut writer, event),
            Err(e) => tracing::debug!(kind = %K::kind(&()), error = %e, "informer watch failed; retrying"),
        }
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Writes one watch event into the cache and the indexes, then tells
    /// every subscriber (dropping those that went away).
    fn apply(&self, writer: &mut reflector::store::Writer<K>, event: Event<K>) {
        let mut subscribers = self.subscribers.locked();
        let change = match &event {
            Event::Init => {
                writer.apply_watcher_event(&event);
                subscribers.iter_mut().for_each(|s| s.replay_at_sync = false);
                Change::Relist
            }
            Event::InitApply(_) => {
                // Into the writer's buffer; subscribers are handed the
                // listed objects at the end, as the cache holds them (the
                // same Arcs, not copies of their own).
                writer.apply_watcher_event(&event);
                return;
            }
            Event::InitDone => {
                let before = self.store.state();
                writer.apply_watcher_event(&event);
                let state = self.store.state();
                self.indexer.rebuild(&state);
                // What the new list lacks was deleted while the watch was
                // down: told as deletions, as client-go's Replace does, or
                // a controller waiting for one would wait for ever.
                let gone: Vec<Arc<K>> =
                    before.into_iter().filter(|o| self.store.get(&ObjectRef::from_obj(&**o)).is_none()).collect();
                subscribers.retain_mut(|s| {
                    if std::mem::take(&mut s.replay_at_sync) {
                        replay(&s.tx, &state)
                    } else {
                        listed(&s.tx, &state) && gone.iter().all(|o| s.tx.send(Change::Deleted(o.clone())).is_ok())
                    }
                });
                return;
            }
            Event::Apply(obj) => {
                let key = ObjectRef::from_obj(obj);
                let old = self.store.get(&key);
                writer.apply_watcher_event(&event);
                let Some(new) = self.store.get(&key) else { return };
                self.indexer.update(&key, old.as_deref(), Some(&new));
                Change::Applied { old, new }
            }
            Event::Delete(obj) => {
                let key = ObjectRef::from_obj(obj);
                let old = self.store.get(&key);
                writer.apply_watcher_event(&event);
                self.indexer.update(&key, old.as_deref(), None);
                Change::Deleted(Arc::new(obj.clone()))
            }
        };
        subscribers.retain(|s| s.tell(&change));
    }
}

/// Hands `tx` the whole collection as a list; false when it went away.
fn replay<K>(tx: &mpsc::UnboundedSender<Change<K>>, state: &[Arc<K>]) -> bool {
    tx.send(Change::Relist).is_ok() && listed(tx, state)
}

/// Hands `tx` the objects of a list it was told of, and its end.
fn listed<K>(tx: &mpsc::UnboundedSender<Change<K>>, state: &[Arc<K>]) -> bool {
    state.iter().all(|o| tx.send(Change::Listed(o.clone())).is_ok()) && tx.send(Change::Synced).is_ok()
}

impl<K> SharedIndexInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The shared cache.
    pub fn store(&self) -> Store<K> {
        self.shared.store.clone()
    }

    /// A new subscriber: the cache and a stream of every change from now
    /// (from the current objects, replayed as a list, when the cache has
    /// already synced).
    pub fn subscribe(&self) -> Informer<K> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subscribers = self.shared.subscribers.locked();
        let synced = super::cache_sync::has_synced(&self.shared.store);
        if synced && !replay(&tx, &self.shared.store.state()) {
            tracing::debug!(kind = %K::kind(&()), "subscriber went away before its replay");
        }
        let only = OnlySlot::default();
        subscribers.push(Subscriber { tx, replay_at_sync: !synced, only: only.clone() });
        Informer { store: self.shared.store.clone(), changes: UnboundedReceiverStream::new(rx).boxed(), only }
    }

    /// The index `name` of the cache, computed by `func` (registered on
    /// first use, from the objects cached then; kept up to date with every
    /// change after).
    pub fn index(&self, name: &'static str, func: IndexFunc<K>) -> Index<K> {
        let _ordered = self.shared.subscribers.locked();
        self.shared.indexer.add(name, func, &self.shared.store.state());
        Index::new(name, func, self.shared.store.clone(), self.shared.indexer.clone())
    }
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The changes themselves, for a consumer that needs the old object or
    /// the list boundaries.
    pub fn into_changes(self) -> (Store<K>, BoxStream<'static, Change<K>>) {
        (self.store, self.changes)
    }

    /// Drops updates for which `ignore(old, new)` holds (controller-runtime's
    /// update predicates), e.g. a Node's heartbeat for a controller that
    /// does not read it.
    pub fn skip_updates(self, ignore: fn(&K, &K) -> bool) -> Self {
        let changes = self
            .changes
            .filter(move |c| {
                let skip = matches!(c, Change::Applied { old: Some(old), new } if ignore(old, new));
                std::future::ready(!skip)
            })
            .boxed();
        Informer { store: self.store, changes, only: self.only }
    }

    /// Passes on the objects (listed, applied, deleted) for which `keep`
    /// holds, and no other (an update passes when `keep` holds for its old
    /// or its new object); each of several calls must hold. An update or
    /// deletion is judged as the informer applies it, so one this
    /// subscriber would drop is never queued and wakes nothing: with a
    /// dozen controllers on the pod informer, most pod changes concern one
    /// or two of them. `keep` runs under the informer's lock: it may read
    /// caches, and must not subscribe. Listed objects (rare: a list) are
    /// judged as they are read, like the changes queued before this call.
    pub fn only(self, keep: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        let keep: Only<K> = Arc::new(keep);
        let mut slot = self.only.locked();
        *slot = Some(match slot.take() {
            Some(before) => {
                let and = keep.clone();
                Arc::new(move |o: &K| before(o) && and(o))
            }
            None => keep.clone(),
        });
        drop(slot);
        let changes = self.changes.filter(move |c| std::future::ready(kept(keep.as_ref(), c))).boxed();
        Informer { store: self.store, changes, only: self.only }
    }

    /// `into_shared_parts`, where an update for which `moved(old, new)`
    /// holds passes on the old object too, first: for a mapper that must
    /// also reach what the old object mapped to (the Services a pod's old
    /// labels matched, when it is relabelled out of them).
    pub fn into_shared_parts_and_old(self, moved: fn(&K, &K) -> bool) -> (Store<K>, BoxStream<'static, Arc<K>>) {
        let touched = self
            .changes
            .flat_map(move |c| {
                let objects = match c {
                    Change::Applied { old: Some(old), new } if moved(&old, &new) => vec![old, new],
                    other => other.object().cloned().into_iter().collect(),
                };
                futures_util::stream::iter(objects)
            })
            .boxed();
        (self.store, touched)
    }

    /// The cache and the stream of objects touched (listed, applied or
    /// deleted), as the cache holds them (shared, not copied), for
    /// `Controller::for_shared_stream` and `watches_shared_stream`: the
    /// cache is written before the object is seen, so a reconcile it causes
    /// sees it.
    pub fn into_shared_parts(self) -> (Store<K>, BoxStream<'static, Arc<K>>) {
        let touched = self.changes.filter_map(|c| std::future::ready(c.object().cloned())).boxed();
        (self.store, touched)
    }

    /// `into_shared_parts` with each object copied, for
    /// `Controller::watches_stream` (a kind with few objects; a pod stream
    /// should stay shared: a copy of every pod event for each of ten
    /// controllers was about 5 % of the server's CPU while pods were
    /// created, perf).
    pub fn into_parts(self) -> (Store<K>, BoxStream<'static, Result<K, watcher::Error>>) {
        let (store, touched) = self.into_shared_parts();
        (store, touched.map(|o| Ok((*o).clone())).boxed())
    }

    /// The cache and its changes as kube's watcher events (Init, InitApply,
    /// InitDone for a list; Apply and Delete after), of the cached objects.
    pub fn into_watch_events(self) -> (Store<K>, WatchEvents<K>) {
        let events = self
            .changes
            .map(|c| {
                Ok(match c {
                    Change::Relist => Event::Init,
                    Change::Listed(o) => Event::InitApply(o),
                    Change::Synced => Event::InitDone,
                    Change::Applied { new, .. } => Event::Apply(new),
                    Change::Deleted(o) => Event::Delete(o),
                })
            })
            .boxed();
        (self.store, events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            data: Some([("k".to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    fn informer() -> (SharedIndexInformer<ConfigMap>, reflector::store::Writer<ConfigMap>) {
        let (store, writer) = reflector::store();
        let shared = Arc::new(Shared { store, indexer: Indexer::default(), subscribers: Mutex::new(Vec::new()) });
        (SharedIndexInformer { shared }, writer)
    }

    fn drain(rx: &mut BoxStream<'static, Change<ConfigMap>>) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(Some(c)) = rx.next().now_or_never() {
            seen.push(match c {
                Change::Relist => "relist".to_string(),
                Change::Listed(o) => format!("listed {}", o.metadata.name.as_deref().unwrap_or_default()),
                Change::Synced => "synced".into(),
                Change::Applied { old, new } => format!(
                    "applied {} old={}",
                    new.metadata.name.as_deref().unwrap_or_default(),
                    old.and_then(|o| o.data.as_ref()?.get("k").cloned()).unwrap_or_default()
                ),
                Change::Deleted(o) => format!("deleted {}", o.metadata.name.as_deref().unwrap_or_default()),
            });
        }
        seen
    }

    use futures_util::FutureExt;

    /// A subscriber from the start sees the list once; one joining during
    /// the list gets the whole cache when it completes; one joining after
    /// gets it at once; every one sees later changes with the old object.
    #[tokio::test]
    async fn late_subscribers_get_the_cache_replayed_and_every_change_once() {
        let (inf, mut writer) = informer();
        let (_, mut early) = inf.subscribe().into_changes();
        inf.shared.apply(&mut writer, Event::Init);
        inf.shared.apply(&mut writer, Event::InitApply(cm("a", "1")));
        let (_, mut during) = inf.subscribe().into_changes();
        inf.shared.apply(&mut writer, Event::InitApply(cm("b", "1")));
        inf.shared.apply(&mut writer, Event::InitDone);
        let (store, mut late) = inf.subscribe().into_changes();
        inf.shared.apply(&mut writer, Event::Apply(cm("a", "2")));
        inf.shared.apply(&mut writer, Event::Delete(cm("b", "1")));
        // Each is handed the whole list at its end, from the cache (in no
        // particular order), then every change once: the early subscriber,
        // the one subscribing during the list and the late one alike.
        for seen in [drain(&mut early), drain(&mut during), drain(&mut late)] {
            assert_eq!(seen[0], "relist");
            let mut listed = seen[1..3].to_vec();
            listed.sort();
            assert_eq!(listed, ["listed a", "listed b"]);
            assert_eq!(seen[3..], ["synced", "applied a old=1", "deleted b"]);
        }
        assert_eq!(store.state().len(), 1);
    }

    /// An object missing from a relist was deleted while the watch was
    /// down: subscribers that knew it are told of its deletion.
    #[tokio::test]
    async fn a_relist_tells_of_objects_deleted_meanwhile() {
        let (inf, mut writer) = informer();
        let (_, mut rx) = inf.subscribe().into_changes();
        for ev in [Event::Init, Event::InitApply(cm("a", "1")), Event::InitApply(cm("b", "1")), Event::InitDone] {
            inf.shared.apply(&mut writer, ev);
        }
        drain(&mut rx);
        for ev in [Event::Init, Event::InitApply(cm("a", "2")), Event::InitDone] {
            inf.shared.apply(&mut writer, ev);
        }
        assert_eq!(drain(&mut rx), ["relist", "listed a", "synced", "deleted b"]);
        // One subscribing afterwards never knew b.
        let (store, mut late) = inf.subscribe().into_changes();
        assert_eq!(drain(&mut late), ["relist", "listed a", "synced"]);
        assert_eq!(store.state().len(), 1);
    }

    #[tokio::test]
    async fn listed_objects_are_the_cached_ones_not_copies() {
        let (inf, mut writer) = informer();
        let (store, mut rx) = inf.subscribe().into_changes();
        inf.shared.apply(&mut writer, Event::Init);
        inf.shared.apply(&mut writer, Event::InitApply(cm("a", "1")));
        assert!(rx.next().now_or_never().is_some_and(|c| matches!(c, Some(Change::Relist))));
        assert!(rx.next().now_or_never().is_none(), "nothing before the list ends");
        inf.shared.apply(&mut writer, Event::InitDone);
        let Some(Some(Change::Listed(a))) = rx.next().now_or_never() else { panic!("a listed object") };
        let cached = store.get(&ObjectRef::from_obj(&*a)).expect("cached");
        assert!(Arc::ptr_eq(&a, &cached));
    }

    /// A subscription with `only` is handed the list and a's changes, and
    /// none of b's; another subscription still sees everything.
    #[tokio::test]
    async fn only_the_kept_objects_are_queued() {
        let (inf, mut writer) = informer();
        let named_a = |o: &ConfigMap| o.metadata.name.as_deref() == Some("a");
        let (_, mut rx) = inf.subscribe().only(named_a).into_changes();
        let (_, mut all) = inf.subscribe().into_changes();
        for ev in [Event::Init, Event::InitApply(cm("a", "1")), Event::InitApply(cm("b", "1")), Event::InitDone] {
            inf.shared.apply(&mut writer, ev);
        }
        inf.shared.apply(&mut writer, Event::Apply(cm("b", "2")));
        inf.shared.apply(&mut writer, Event::Apply(cm("a", "2")));
        inf.shared.apply(&mut writer, Event::Delete(cm("b", "2")));
        let mut seen = drain(&mut rx);
        seen[1..3].sort();
        assert_eq!(seen, ["relist", "listed a", "synced", "applied a old=1"]);
        assert_eq!(drain(&mut all).len(), 7, "the other subscriber sees everything");
        // A subscriber that went away is dropped even when it wants nothing.
        let (_, gone) = inf.subscribe().only(|_| false).into_changes();
        drop(gone);
        inf.shared.apply(&mut writer, Event::Apply(cm("b", "3")));
        assert_eq!(inf.shared.subscribers.locked().len(), 2);
    }

    /// The sender's side of `only`: a change of an object not kept is not
    /// queued at all, unless it is an update of one that was; list
    /// boundaries always are.
    #[test]
    fn a_change_not_kept_is_never_queued() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let keep: Only<ConfigMap> = Arc::new(|o: &ConfigMap| o.metadata.name.as_deref() == Some("a"));
        let s = Subscriber { tx, replay_at_sync: false, only: Arc::new(Mutex::new(Some(keep))) };
        let (a, b) = (Arc::new(cm("a", "1")), Arc::new(cm("b", "1")));
        for change in [
            Change::Relist,
            Change::Listed(b.clone()),
            Change::Synced,
            Change::Applied { old: None, new: b.clone() },
            Change::Deleted(b),
            Change::Applied { old: None, new: a.clone() },
            // a, renamed b: it leaves what is kept, which is news.
            Change::Applied { old: Some(a.clone()), new: Arc::new(cm("b", "2")) },
            Change::Deleted(a),
        ] {
            assert!(s.tell(&change));
        }
        let mut queued = Vec::new();
        while let Ok(c) = rx.try_recv() {
            queued.push(match c {
                Change::Relist => "relist".to_string(),
                Change::Synced => "synced".to_string(),
                other => format!("{:?}", other.object().and_then(|o| o.metadata.name.clone())),
            });
        }
        assert_eq!(queued, ["relist", "synced", "Some(\"a\")", "Some(\"b\")", "Some(\"a\")"]);
    }

    fn same_data(old: &ConfigMap, new: &ConfigMap) -> bool {
        old.data == new.data
    }

    #[tokio::test]
    async fn skipped_updates_are_not_seen() {
        let (inf, mut writer) = informer();
        let (_, mut rx) = inf.subscribe().skip_updates(same_data).into_changes();
        inf.shared.apply(&mut writer, Event::Init);
        inf.shared.apply(&mut writer, Event::InitDone);
        inf.shared.apply(&mut writer, Event::Apply(cm("a", "1")));
        let mut relabelled = cm("a", "1");
        relabelled.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        inf.shared.apply(&mut writer, Event::Apply(relabelled));
        inf.shared.apply(&mut writer, Event::Apply(cm("a", "2")));
        assert_eq!(drain(&mut rx), ["relist", "synced", "applied a old=", "applied a old=1"]);
    }
}
