//! Shared informers for workload controllers, as kube-controller-manager
//! wires them: one watch-fed cache per kind, whose events both fill the
//! cache and enqueue the owning object (the controllerRef), so a
//! controller reconciles from its caches and each kind is watched once.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use futures_util::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{applier, Action, Config, ReconcileRequest};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::controller_utils::controller_of;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::labels;

/// A reconcile request, or why the watch feeding it failed.
pub type Trigger<K> = BoxStream<'static, Result<ReconcileRequest<K>, watcher::Error>>;

/// A watch-fed cache of one kind and the stream of objects it saw change
/// (including deletions); the stream must be polled for the cache to fill.
pub struct Informer<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    events: BoxStream<'static, Result<K, watcher::Error>>,
}

/// Starts an informer over `api`.
pub fn informer<K>(api: Api<K>, config: watcher::Config) -> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events =
        reflector::reflector(writer, watcher::watcher(api, config).modify(forget_managed_fields).default_backoff())
            .touched_objects()
            .boxed();
    Informer { store, events }
}

/// One watch and one cache of a kind feeding several controllers, as
/// client-go's shared informers do: every subscriber sees every change.
/// Subscribe first, then `start` the watch.
pub struct SharedInformer<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    subscribers: Vec<mpsc::UnboundedSender<K>>,
    events: BoxStream<'static, Result<K, watcher::Error>>,
}

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        let Informer { store, events } = informer(api, config);
        SharedInformer { store, subscribers: Vec::new(), events }
    }

    /// A view of the shared cache with its own stream of changes.
    pub fn subscribe(&mut self) -> Informer<K> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers.push(tx);
        Informer { store: self.store.clone(), events: UnboundedReceiverStream::new(rx).map(Ok).boxed() }
    }

    /// Runs the watch, handing each change to every subscriber.
    pub fn start(self) -> tokio::task::JoinHandle<()> {
        let SharedInformer { subscribers, events, .. } = self;
        tokio::spawn(events.for_each(move |event| {
            match event {
                Ok(obj) => {
                    for s in &subscribers {
                        let _ = s.send(obj.clone());
                    }
                }
                Err(e) => tracing::debug!(kind = %K::kind(&()), error = %e, "shared informer watch error; retrying"),
            }
            std::future::ready(())
        }))
    }
}

pub use crate::client::forget_managed_fields;

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache and the stream of changed objects, for controllers that
    /// build their own triggers (as from `reflected`).
    pub fn into_parts(self) -> (Store<K>, BoxStream<'static, Result<K, watcher::Error>>) {
        (self.store, self.events)
    }

    /// Requests for the objects themselves.
    pub fn trigger_self(self) -> (Store<K>, Trigger<K>) {
        let requests = self.events.map_ok(|o| ReconcileRequest::from(ObjectRef::from_obj(&o))).boxed();
        (self.store, requests)
    }

    /// Requests for each object's controller of kind `Owner`.
    pub fn trigger_owner<Owner>(self) -> (Store<K>, Trigger<Owner>)
    where
        Owner: Resource<DynamicType = ()> + 'static,
    {
        let requests = self
            .events
            .try_filter_map(|o| {
                let meta = o.meta();
                let owner = controller_of(meta)
                    .filter(|r| r.kind == Owner::kind(&()) && r.api_version == Owner::api_version(&()))
                    .map(|r| {
                        let mut oref = ObjectRef::<Owner>::new(&r.name);
                        if let Some(ns) = &meta.namespace {
                            oref = oref.within(ns);
                        }
                        ReconcileRequest::from(oref)
                    });
                std::future::ready(Ok(owner))
            })
            .boxed();
        (self.store, requests)
    }

    /// Requests for each object's controller of kind `Owner`, or when it
    /// has none, for every `Owner` in `owners` whose selector matches it
    /// (which may adopt it).
    pub fn trigger_owner_or_selecting<Owner>(
        self,
        owners: Store<Owner>,
        selector: fn(&Owner) -> Option<&LabelSelector>,
    ) -> (Store<K>, Trigger<Owner>)
    where
        Owner: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.trigger_with(move |o: &K| {
            let meta = o.meta();
            if let Some(r) = controller_of(meta) {
                if r.kind != Owner::kind(&()) || r.api_version != Owner::api_version(&()) {
                    return Vec::new();
                }
                let mut oref = ObjectRef::<Owner>::new(&r.name);
                if let Some(ns) = &meta.namespace {
                    oref = oref.within(ns);
                }
                return vec![oref];
            }
            owners
                .state()
                .iter()
                .filter(|w| w.meta().namespace == meta.namespace)
                .filter(|w| {
                    selector(w).is_some_and(|s| !labels::is_empty(s) && labels::matches(s, meta.labels.as_ref()))
                })
                .map(|w| ObjectRef::from_obj(&**w))
                .collect()
        })
    }

    /// Requests mapped from each object by `map` (e.g. every DaemonSet for a Node).
    pub fn trigger_with<Owner, I>(self, map: impl Fn(&K) -> I + Send + 'static) -> (Store<K>, Trigger<Owner>)
    where
        Owner: Resource<DynamicType = ()> + 'static,
        I: IntoIterator<Item = ObjectRef<Owner>>,
        I::IntoIter: Send + 'static,
    {
        let requests = self
            .events
            .map_ok(move |o| stream::iter(map(&o).into_iter().map(|r| Ok(ReconcileRequest::from(r)))))
            .try_flatten()
            .boxed();
        (self.store, requests)
    }
}

/// Runs `reconcile` over the objects in `store`, fed by `triggers`, until
/// the streams end; failures are logged and retried after `retry`.
pub async fn run<K, Ctx, F, Fut>(
    name: &'static str,
    store: Store<K>,
    triggers: Vec<Trigger<K>>,
    reconcile: F,
    ctx: Arc<Ctx>,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Action, ControllerError>> + Send + 'static,
{
    let queue = QueueMetrics::new(name, store.clone());
    let requests = queue.requests(stream::select_all(triggers));
    let error_policy = queue.retried(move |obj: Arc<K>, err: &ControllerError, _ctx: Arc<Ctx>| {
        tracing::warn!(controller = name, object = ?obj.meta().name, error = %err, "reconcile failed; retrying");
        Action::requeue(Duration::from_secs(2))
    });
    drain(name, applier(queue.timed(reconcile), error_policy, ctx, store, requests, Config::default())).await;
}

/// Waits until every given cache has its first full list.
pub async fn wait_synced<K: Resource + Clone + 'static>(store: &Store<K>) -> Result<(), ControllerError>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    crate::client::cache_sync::wait_for_cache_sync(store)
        .await
        .map_err(|_| ControllerError::Invalid("informer stopped".into()))
}

/// Objects in `store` within `namespace` controlled by `uid`.
pub fn controlled_by<K>(store: &Store<K>, namespace: &str, uid: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.state_filter(|o| {
        o.meta().namespace.as_deref() == Some(namespace) && super::controller_utils::is_controlled_by(o.meta(), uid)
    })
}

/// A cache of `api` and the stream of objects touched (applied or deleted),
/// for `Controller::watches_stream`: the store is written before the
/// trigger fires, so a reconcile caused by a change always sees it.
pub fn reflected<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    informer(api, config).into_parts()
}
