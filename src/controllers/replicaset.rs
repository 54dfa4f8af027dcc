//! ReplicaSetController: keeps `spec.replicas` active pods for every
//! ReplicaSet. It owns its pods through a controller ownerReference
//! (`blockOwnerDeletion`), creates missing ones from the template with the
//! generateName `<replicaset>-` in slow-start batches (1, 2, 4, …), deletes
//! surplus ones in upstream's order, adopts orphans its selector matches and
//! releases pods that no longer match. Expectations keep a lagging pod cache
//! from causing a second round of creations or deletions. Status and the
//! SuccessfulCreate / SuccessfulDelete / FailedCreate / FailedDelete events
//! are upstream's.
//!
//! The same controller, run over ReplicationControllers (`run::<
//! ReplicationController>`, as `replication-controller`), is upstream's
//! ReplicationManager: the kind is a `ReplicaOwner` (`owner.rs`,
//! `replication.rs`), and nothing else differs.

mod owner;
mod ranking;
mod replication;
mod status;

pub use owner::ReplicaOwner;

use std::sync::Arc;
use std::time::Instant;

use crate::controllers::work_queue::{applier, Action};
use futures_util::future::join_all;
use futures_util::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use self::status::{calculate_status, next_availability, status_equal};
use super::controller_utils::{controller_of, controller_ref, is_pod_active, pod_from_template, sync_retry_backoff};
use super::expectations::Expectations;
use super::informers::controlled_by;
use super::queue_metrics::QueueMetrics;
use super::ref_manager;
use super::ControllerError;
use crate::backoff::Backoff;
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::labels;

/// At most this many pods are created or deleted in one sync (upstream's burstReplicas).
const BURST_REPLICAS: i32 = 500;
/// The first slow-start batch of creations.
const SLOW_START_INITIAL_BATCH: i32 = 1;

struct Context<K: ReplicaOwner> {
    client: kube::Client,
    backoff: Backoff,
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    orphan_pods: Index<Pod>,
    replicasets_by_namespace: Index<K>,
    recorder: EventRecorder,
    expectations: Expectations,
}

/// Why managing replicas failed: the ReplicaFailure reason and message.
type ManageError = (String, String);

fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The message an API error carries, as upstream prints it.
pub(crate) fn error_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl<K: ReplicaOwner> Context<K> {
    /// The ReplicaSets a pod event concerns: its controller, or for an
    /// orphan every ReplicaSet in its namespace whose selector matches it.
    fn replicasets_for(&self, pod: &Pod) -> Vec<ObjectRef<K>> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        if let Some(c) = controller_of(&pod.metadata) {
            if K::is_kind(&c.api_version, &c.kind) {
                return vec![ObjectRef::new(&c.name).within(&ns)];
            }
            return Vec::new();
        }
        self.replicasets_by_namespace
            .get(&ns)
            .iter()
            .filter(|rs| {
                rs.selector()
                    .is_some_and(|s| !labels::is_empty(&s) && labels::matches(&s, pod.metadata.labels.as_ref()))
            })
            .map(|rs| ObjectRef::from_obj(rs.as_ref()))
            .collect()
    }

    fn on_pod_event(&self, event: &Event<Arc<Pod>>) -> Vec<ObjectRef<K>> {
        match event {
            Event::Apply(p) | Event::InitApply(p) => self.replicasets_for(p),
            Event::Delete(p) => {
                let owners = self.replicasets_for(p);
                let name = p.metadata.name.as_deref().unwrap_or_default();
                for o in &owners {
                    self.expectations
                        .observe_deletion(&key_of(o.namespace.as_deref().unwrap_or_default(), &o.name), name);
                }
                owners
            }
            Event::Init | Event::InitDone => Vec::new(),
        }
    }

    /// None when the cache lacks the pod, else whether it is terminating.
    fn seen(&self, namespace: &str, name: &str) -> Option<bool> {
        self.pods.get(&ObjectRef::new(name).within(namespace)).map(|p| p.metadata.deletion_timestamp.is_some())
    }
}

async fn reconcile<K: ReplicaOwner>(rs: Arc<K>, ctx: Arc<Context<K>>) -> Result<Action, ControllerError> {
    if crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await.is_err() {
        return Err(ControllerError::Invalid("the pod cache stopped".into()));
    }
    let ns = rs.meta().namespace.clone().unwrap_or_default();
    let name = rs.meta().name.clone().unwrap_or_default();
    let key = key_of(&ns, &name);
    let now = k8s_openapi::jiff::Timestamp::now();
    // Its own pods, and the orphans of its namespace it may adopt.
    let uid = rs.meta().uid.clone().unwrap_or_default();
    let active: Vec<Arc<Pod>> = controlled_by(&ctx.pods_by_owner, &ns, &uid)
        .into_iter()
        .chain(ctx.orphan_pods.get(&ns))
        .filter(|p| is_pod_active(p))
        .collect();
    let owned = match rs.selector() {
        Some(selector) => ref_manager::claim_pods(&ctx.client, &*rs, &selector, active).await?,
        None => Vec::new(),
    };
    let needs_sync = ctx.expectations.satisfied(&key, |n| ctx.seen(&ns, n));
    let manage = if needs_sync && rs.meta().deletion_timestamp.is_none() {
        manage_replicas(&ctx, &rs, &owned, &key).await
    } else {
        Ok(())
    };
    let new_status = calculate_status(&*rs, &owned, &manage, now);
    if !rs.replica_status().is_some_and(|s| status_equal(&s, &new_status)) {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
        let updated = rs.with_replica_status(new_status);
        match api.replace_status(&name, &PostParams::default(), &updated).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    if let Err((_, message)) = manage {
        return Err(ControllerError::Invalid(message));
    }
    Ok(match next_availability(&*rs, &owned, now) {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

async fn create_pod<K: ReplicaOwner>(ctx: &Context<K>, rs: &K) -> Result<String, kube::Error> {
    let ns = rs.meta().namespace.clone().unwrap_or_default();
    let name = rs.meta().name.clone().unwrap_or_default();
    let template = rs.template().cloned().unwrap_or_default();
    let mut pod = pod_from_template(&template, &ns, controller_ref(rs));
    pod.metadata.generate_name = Some(format!("{name}-"));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api.create(&PostParams::default(), &pod).await {
        Ok(created) => {
            let pod_name = created.metadata.name.unwrap_or_default();
            ctx.recorder.publish(rs, EventType::Normal, "SuccessfulCreate", &format!("Created pod: {pod_name}"));
            Ok(pod_name)
        }
        Err(e) => {
            ctx.recorder.publish(
                rs,
                EventType::Warning,
                "FailedCreate",
                &format!("Error creating: {}", error_message(&e)),
            );
            Err(e)
        }
    }
}

async fn delete_pod<K: ReplicaOwner>(ctx: &Context<K>, rs: &K, pod: &Pod) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            ctx.recorder.publish(rs, EventType::Normal, "SuccessfulDelete", &format!("Deleted pod: {name}"));
            Ok(())
        }
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => {
            ctx.recorder.publish(
                rs,
                EventType::Warning,
                "FailedDelete",
                &format!("Error deleting: {}", error_message(&e)),
            );
            Err(e)
        }
    }
}

/// Creates or deletes pods so that `pods` (the active ones it owns) come to
/// `spec.replicas`.
async fn manage_replicas<K: ReplicaOwner>(
    ctx: &Context<K>,
    rs: &K,
    pods: &[Arc<Pod>],
    key: &str,
) -> Result<(), ManageError> {
    let diff = pods.len() as i32 - rs.desired_replicas();
    if diff < 0 {
        let mut remaining = (-diff).min(BURST_REPLICAS);
        let mut batch = SLOW_START_INITIAL_BATCH;
        while remaining > 0 {
            let n = batch.min(remaining);
            let results = join_all((0..n).map(|_| create_pod(ctx, rs))).await;
            let mut failure = None;
            let mut names = Vec::new();
            for r in results {
                match r {
                    Ok(name) => names.push(name),
                    Err(e) => {
                        failure.get_or_insert(error_message(&e));
                    }
                }
            }
            ctx.expectations.expect_creates(key, names);
            if let Some(message) = failure {
                return Err(("FailedCreate".into(), message));
            }
            remaining -= n;
            batch *= 2;
        }
    } else if diff > 0 {
        let victims = ranking::pods_to_delete(pods, diff.min(BURST_REPLICAS) as usize);
        ctx.expectations.expect_deletes(key, victims.iter().filter_map(|p| p.metadata.name.clone()));
        let results = join_all(victims.iter().map(|p| delete_pod(ctx, rs, p))).await;
        let mut failure = None;
        for (pod, r) in victims.iter().zip(results) {
            if let Err(e) = r {
                ctx.expectations.observe_deletion(key, pod.metadata.name.as_deref().unwrap_or_default());
                failure.get_or_insert(error_message(&e));
            }
        }
        if let Some(message) = failure {
            return Err(("FailedDelete".into(), message));
        }
    }
    Ok(())
}

fn object_key<K: ReplicaOwner>(rs: &K) -> String {
    key_of(rs.meta().namespace.as_deref().unwrap_or_default(), rs.meta().name.as_deref().unwrap_or_default())
}

/// A sync, after which the object's retry delay starts afresh if it succeeded.
async fn sync_and_forget<K: ReplicaOwner>(rs: Arc<K>, ctx: Arc<Context<K>>) -> Result<Action, ControllerError> {
    let key = object_key(&*rs);
    let result = reconcile(rs, ctx.clone()).await;
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

fn error_policy<K: ReplicaOwner>(rs: Arc<K>, err: &ControllerError, ctx: Arc<Context<K>>) -> Action {
    let key = object_key(&*rs);
    tracing::debug!(kind = K::QUEUE, object = %key, error = %err, "sync failed; retrying");
    Action::requeue(ctx.backoff.next(&key, Instant::now()))
}

/// Runs the controller over every `K` (ReplicaSets, or ReplicationControllers),
/// writing through `client` and recording Events as `component`
/// (`replicaset-controller`, `replication-controller`).
pub async fn run<K: ReplicaOwner>(client: kube::Client, informers: SharedInformerFactory, component: &str) {
    let (rs_reader, own) = informers.informer::<K>().subscribe().trigger_self();
    let pod_informer = informers.informer::<Pod>().subscribe();
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods: pod_informer.store.clone(),
        pods_by_owner: informers.by_controller(),
        orphan_pods: informers.orphans_by_namespace(),
        replicasets_by_namespace: informers.by_namespace(),
        backoff: sync_retry_backoff(),
        recorder: EventRecorder::new(client.clone(), component),
        expectations: Expectations::default(),
    });
    // Only the pods of a ReplicaSet, or that one may adopt, are sent here.
    let filter_ctx = ctx.clone();
    let (_, pod_events) = pod_informer.only(move |p| !filter_ctx.replicasets_for(p).is_empty()).into_watch_events();
    let pod_ctx = ctx.clone();
    let pods = pod_events
        .map_ok(move |ev| {
            let refs = pod_ctx.on_pod_event(&ev);
            stream::iter(refs.into_iter().map(|r| Ok(ReconcileRequest::from(r))))
        })
        .try_flatten();
    let queue = QueueMetrics::new(K::QUEUE, rs_reader.clone());
    applier(
        queue.timed(sync_and_forget),
        queue.retried(error_policy),
        ctx,
        rs_reader,
        queue.requests(stream::select(own, pods)),
    )
    .for_each(|r| {
        if let Err(e) = r {
            tracing::trace!(kind = K::QUEUE, error = %e, "replica controller");
        }
        std::future::ready(())
    })
    .await;
}
