//! client-go's work queue metrics for the controllers driven by
//! `work_queue`'s `Controller` or `applier`: the
//! requests are counted as they enter (from the primary watch and from each
//! mapped trigger), each sync is timed, and each failed sync is a retry.
//! The queues carry upstream's names (`deployment`, `endpoint`, …).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use crate::controllers::work_queue::Action;
use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

use super::ControllerError;
use crate::metrics::workqueue::WorkQueueMetrics;

/// The metrics of one controller's queue, keyed as client-go keys objects
/// (`namespace/name`), counting only requests for objects the controller's
/// cache holds (the others are dropped unseen by the queue).
pub struct QueueMetrics<K: Resource<DynamicType = ()> + 'static> {
    metrics: Arc<WorkQueueMetrics>,
    store: Store<K>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for QueueMetrics<K> {
    fn clone(&self) -> Self {
        QueueMetrics { metrics: self.metrics.clone(), store: self.store.clone() }
    }
}

fn key_of(r: &ObjectRef<impl Resource<DynamicType = ()>>) -> String {
    match r.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", r.name),
        _ => r.name.clone(),
    }
}

impl<K> QueueMetrics<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    pub fn new(name: &'static str, store: Store<K>) -> Self {
        QueueMetrics { metrics: WorkQueueMetrics::named(name), store }
    }

    fn add(&self, r: &ObjectRef<K>) {
        if self.store.get(r).is_some() {
            self.metrics.add(&key_of(r));
        }
    }

    /// A request entering the queue: counted while the cache takes its
    /// initial list (it shows none of it yet), else when the cache holds it.
    fn count(&self, r: &ObjectRef<K>) {
        if self.listing() {
            self.metrics.add(&key_of(r));
        } else {
            self.add(r);
        }
    }

    /// Whether the cache is still taking its initial list (and shows none
    /// of it yet).
    fn listing(&self) -> bool {
        !crate::client::cache_sync::has_synced(&self.store)
    }

    /// The controller's own watch: each object seen is a request for itself.
    /// Objects of the initial list are counted although the cache shows
    /// them only once the list is complete.
    pub fn primary<E>(
        &self,
        events: impl Stream<Item = Result<K, E>> + Send + 'static,
    ) -> impl Stream<Item = Result<K, E>> + Send + 'static {
        let this = self.clone();
        events.inspect(move |e| {
            if let Ok(obj) = e {
                this.count(&ObjectRef::from_obj(obj));
            }
        })
    }

    /// `primary` of a stream of cached objects (`Informer::into_shared_parts`).
    pub fn primary_shared(
        &self,
        objects: impl Stream<Item = Arc<K>> + Send + 'static,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let this = self.clone();
        objects.inspect(move |obj| this.count(&ObjectRef::from_obj(&**obj)))
    }

    /// Requests already made (for an `applier` fed directly); those made
    /// during the initial list are counted, as `primary` counts them.
    pub fn requests<E>(
        &self,
        requests: impl Stream<Item = Result<ReconcileRequest<K>, E>> + Send + 'static,
    ) -> impl Stream<Item = Result<ReconcileRequest<K>, E>> + Send + 'static {
        let this = self.clone();
        requests.inspect(move |r| {
            if let Ok(r) = r {
                this.count(&r.obj_ref);
            }
        })
    }

    /// Requests made by a trigger of the controller's own
    /// (`Controller::reconcile_on`).
    pub fn triggered(
        &self,
        requests: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let this = self.clone();
        requests.inspect(move |r| this.add(r))
    }

    /// A trigger mapping another kind's objects to requests of this one.
    pub fn mapped<Other, I>(
        &self,
        map: impl Fn(Other) -> I + Send + Sync + 'static,
    ) -> impl Fn(Other) -> Vec<ObjectRef<K>> + Send + Sync + 'static
    where
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let this = self.clone();
        move |o| {
            let refs: Vec<ObjectRef<K>> = map(o).into_iter().collect();
            refs.iter().for_each(|r| this.add(r));
            refs
        }
    }

    /// `reconcile`, timed as the work of its key.
    pub fn timed<Ctx, F, Fut>(
        &self,
        reconcile: F,
    ) -> impl FnMut(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, ControllerError>>
    where
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut,
        Fut: Future<Output = Result<Action, ControllerError>> + Send + 'static,
    {
        let metrics = self.metrics.clone();
        move |obj, ctx| {
            let key = key_of(&ObjectRef::from_obj(&*obj));
            let metrics = metrics.clone();
            let sync = reconcile(obj, ctx);
            Box::pin(async move {
                let _timer = metrics.start(&key);
                sync.await
            })
        }
    }

    /// `error_policy`, counting each failure as a retry.
    pub fn retried<Ctx>(
        &self,
        error_policy: impl Fn(Arc<K>, &ControllerError, Arc<Ctx>) -> Action,
    ) -> impl Fn(Arc<K>, &ControllerError, Arc<Ctx>) -> Action {
        let metrics = self.metrics.clone();
        move |obj, err, ctx| {
            metrics.retry();
            error_policy(obj, err, ctx)
        }
    }
}

/// Drains a controller's output, logging what the queue itself reports.
pub async fn drain<T, E: Debug>(name: &'static str, results: impl Stream<Item = Result<T, E>>) {
    results
        .for_each(|r| {
            if let Err(e) = r {
                tracing::trace!(controller = name, error = ?e, "controller queue");
            }
            std::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn requests_for_cached_objects_are_adds_and_syncs_are_timed() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Apply(cm("a")));
        let q = QueueMetrics::new("queue-metrics-test", store);
        let map = q.mapped(|name: String| vec![ObjectRef::<ConfigMap>::new(&name).within("ns")]);
        assert_eq!(map("a".into()).len(), 1);
        map("absent".into());
        let m = WorkQueueMetrics::named("queue-metrics-test");
        assert_eq!((m.adds(), m.depth()), (1, 1));
        let mut sync = q.timed(|_: Arc<ConfigMap>, _: Arc<()>| async { Ok(Action::await_change()) });
        assert!(sync(Arc::new(cm("a")), Arc::new(())).await.is_ok());
        assert_eq!(m.depth(), 0);
        let retried = q.retried(|_: Arc<ConfigMap>, _: &ControllerError, _: Arc<()>| Action::await_change());
        retried(Arc::new(cm("a")), &ControllerError::Invalid("x".into()), Arc::new(()));
        let mut out = String::new();
        crate::metrics::workqueue::write_all(&mut out);
        assert!(out.contains("workqueue_retries_total{name=\"queue-metrics-test\"} 1\n"), "{out}");
        assert!(out.contains("workqueue_work_duration_seconds_count{name=\"queue-metrics-test\"} 1\n"), "{out}");
    }
}
