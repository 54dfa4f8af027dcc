//! How the controllers turn the shared informers' changes (from
//! `crate::client::informer_factory`) into reconcile requests: for the
//! object itself, for its controller (the controllerRef), or mapped; and
//! the loop that runs a reconcile over them.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{applier, Action};
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::controller_utils::controller_of;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::indexer::Index;
use crate::client::labels;

/// A reconcile request, or why the watch feeding it failed.
pub type Trigger<K> = BoxStream<'static, Result<ReconcileRequest<K>, watcher::Error>>;

pub use crate::client::informer::{Informer, SharedIndexInformer};

/// A private informer over `api` (for a watch no other component shares:
/// a selector of its own, or a kind only one controller reads).
pub fn informer<K>(api: Api<K>, config: watcher::Config) -> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    SharedIndexInformer::start(api, config).subscribe()
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Requests for the objects themselves.
    pub fn trigger_self(self) -> (Store<K>, Trigger<K>) {
        let (store, events) = self.into_shared_parts();
        let requests = events.map(|o| Ok(ReconcileRequest::from(ObjectRef::from_obj(&*o)))).boxed();
        (store, requests)
    }

    /// Requests for each object's controller of kind `Owner`.
    pub fn trigger_owner<Owner>(self) -> (Store<K>, Trigger<Owner>)
    where
        Owner: Resource<DynamicType = ()> + 'static,
    {
        let (store, events) = self.only(|o| controlled_by_kind::<K, Owner>(o).is_some()).into_shared_parts();
        let requests = events
            .filter_map(|o| {
                let meta = o.meta();
                let owner = controlled_by_kind::<K, Owner>(&o).map(|r| {
                    let mut oref = ObjectRef::<Owner>::new(&r.name);
                    if let Some(ns) = &meta.namespace {
                        oref = oref.within(ns);
                    }
                    ReconcileRequest::from(oref)
                });
                std::future::ready(owner.map(Ok))
            })
            .boxed();
        (store, requests)
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
    /// Objects that `map` maps to nothing are not sent (`Informer::only`).
    pub fn trigger_with<Owner, I>(self, map: impl Fn(&K) -> I + Send + Sync + 'static) -> (Store<K>, Trigger<Owner>)
    where
        Owner: Resource<DynamicType = ()> + 'static,
        I: IntoIterator<Item = ObjectRef<Owner>>,
        I::IntoIter: Send + 'static,
    {
        let map = Arc::new(map);
        let maps_to_any = map.clone();
        let (store, events) = self.only(move |o| maps_to_any(o).into_iter().next().is_some()).into_shared_parts();
        let requests =
            events.flat_map(move |o| stream::iter(map(&o).into_iter().map(|r| Ok(ReconcileRequest::from(r))))).boxed();
        (store, requests)
    }
}

/// The controller reference of `o` when its kind is `Owner`.
fn controlled_by_kind<K: Resource, Owner: Resource<DynamicType = ()>>(
    o: &K,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    controller_of(o.meta()).filter(|r| r.kind == Owner::kind(&()) && r.api_version == Owner::api_version(&()))
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
    drain(name, applier(queue.timed(reconcile), error_policy, ctx, store, requests)).await;
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

/// Objects within `namespace` controlled by `uid`, looked up in the
/// controller index (no scan of the whole cache).
pub fn controlled_by<K>(by_controller: &Index<K>, namespace: &str, uid: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    by_controller.get(uid).into_iter().filter(|o| o.meta().namespace.as_deref() == Some(namespace)).collect()
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
