//! DeploymentController: rolls a Deployment's pod template out through
//! ReplicaSets, as kube-controller-manager does. The ReplicaSet whose
//! template equals the Deployment's (ignoring `pod-template-hash`) is the new
//! one, all others are old; RollingUpdate moves replicas from the old to the
//! new within maxSurge / maxUnavailable, Recreate scales the old to zero
//! first. Revisions live in `deployment.kubernetes.io/revision` annotations,
//! so `kubectl rollout history|undo` work; paused Deployments only scale
//! (proportionally) and clean up; the Progressing and Available conditions
//! and the status counters follow upstream.
//!
//! Files: `sync` (finding and creating ReplicaSets, scaling), `rolling`,
//! `recreate`, `progress` (status and conditions), `history` (revision
//! annotations and revisionHistoryLimit cleanup), `util` (arithmetic).

mod history;
mod progress;
mod recreate;
mod rolling;
mod sync;
mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controllers::work_queue::{applier, Action};
use futures_util::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use super::controller_utils::{controller_of, pod_phase, sync_retry_backoff};
use super::ControllerError;
use crate::backoff::Backoff;
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::labels;
use crate::controllers::queue_metrics::QueueMetrics;

struct Context {
    client: kube::Client,
    backoff: Backoff,
    replicasets: Store<ReplicaSet>,
    /// ReplicaSets by controller, and those without one (which it may adopt).
    replicasets_by_owner: Index<ReplicaSet>,
    orphan_replicasets: Index<ReplicaSet>,
    /// Pods, for Recreate: new pods wait until every old one is gone.
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    deployments_by_namespace: Index<Deployment>,
    recorder: EventRecorder,
}

impl Context {
    /// The Deployments a ReplicaSet event concerns: its controller, or for
    /// an orphan every Deployment in its namespace whose selector matches.
    fn deployments_for(&self, rs: &ReplicaSet) -> Vec<ObjectRef<Deployment>> {
        let ns = rs.metadata.namespace.clone().unwrap_or_default();
        if let Some(c) = controller_of(&rs.metadata) {
            if c.kind == "Deployment" && c.api_version.starts_with("apps/") {
                return vec![ObjectRef::new(&c.name).within(&ns)];
            }
            return Vec::new();
        }
        self.deployments_by_namespace
            .get(&ns)
            .iter()
            .filter(|d| {
                let selector = d.spec.as_ref().map(|s| &s.selector);
                selector.is_some_and(|s| !labels::is_empty(s) && labels::matches(s, rs.metadata.labels.as_ref()))
            })
            .map(|d| ObjectRef::from_obj(d.as_ref()))
            .collect()
    }

    /// The Deployment whose ReplicaSet controlled a pod that is gone or
    /// finished (what a Recreate rollout waits for).
    fn deployments_for_pod(&self, event: &Event<Arc<Pod>>) -> Vec<ObjectRef<Deployment>> {
        let pod = match event {
            Event::Delete(p) => p,
            Event::Apply(p) if matches!(pod_phase(p), "Succeeded" | "Failed") => p,
            _ => return Vec::new(),
        };
        let Some(owner) = controller_of(&pod.metadata).filter(|c| c.kind == "ReplicaSet") else { return Vec::new() };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        match self.replicasets.get(&ObjectRef::new(&owner.name).within(&ns)) {
            Some(rs) => self.deployments_for(&rs),
            None => Vec::new(),
        }
    }
}

/// One sync of one Deployment: the working copy and what the sync learnt.
struct DeploymentSync<'a> {
    ctx: &'a Context,
    d: Deployment,
    /// When to look again if nothing else happens (the progress deadline).
    requeue: Option<Duration>,
    /// The revision annotation as the API server has it.
    stored_revision: Option<String>,
}

impl DeploymentSync<'_> {
    fn namespace(&self) -> String {
        self.d.metadata.namespace.clone().unwrap_or_default()
    }

    fn name(&self) -> String {
        self.d.metadata.name.clone().unwrap_or_default()
    }

    fn replicasets_api(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace())
    }

    fn event(&self, kind: EventType, reason: &str, message: &str) {
        self.ctx.recorder.publish(&self.d, kind, reason, message);
    }

    /// Writes the working copy's status and revision annotation. Upstream
    /// writes both through the status subresource; ferrok's status
    /// subresource keeps metadata as it was, so the annotation goes first
    /// as a metadata-only patch (which leaves the generation alone).
    async fn update_status(&mut self) -> Result<(), ControllerError> {
        let api: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), &self.namespace());
        let revision = |d: &Deployment| d.metadata.annotations.as_ref().and_then(|a| a.get(util::REVISION)).cloned();
        let want = revision(&self.d);
        let mut current = self.d.clone();
        if want.is_some() && want != self.stored_revision {
            let patch = serde_json::json!({"metadata": {"annotations": {util::REVISION: want},
                "resourceVersion": self.d.metadata.resource_version}});
            current = api.patch(&self.name(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
            current.status = self.d.status.clone();
        }
        self.d = api.replace_status(&self.name(), &PostParams::default(), &current).await?;
        self.stored_revision = revision(&self.d);
        Ok(())
    }

    async fn update_replicaset(&self, rs: &ReplicaSet) -> Result<ReplicaSet, ControllerError> {
        let name = rs.metadata.name.clone().unwrap_or_default();
        Ok(self.replicasets_api().replace(&name, &PostParams::default(), rs).await?)
    }
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if crate::client::cache_sync::wait_for_cache_sync(&ctx.replicasets).await.is_err()
        || crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await.is_err()
    {
        return Err(ControllerError::Invalid("the replica set cache stopped".into()));
    }
    let stored_revision = d.metadata.annotations.as_ref().and_then(|a| a.get(util::REVISION)).cloned();
    let mut s = DeploymentSync { ctx: &ctx, d: (*d).clone(), requeue: None, stored_revision };
    let selector = d.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    if labels::is_empty(&selector) {
        s.event(
            EventType::Warning,
            "SelectingAll",
            "This deployment is selecting all pods. A non-empty selector is required.",
        );
        let observed = d.status.as_ref().and_then(|st| st.observed_generation);
        if observed < d.metadata.generation {
            s.d.status.get_or_insert_with(Default::default).observed_generation = d.metadata.generation;
            s.update_status().await?;
        }
        return Ok(Action::await_change());
    }
    let rs_list = s.claim_replicasets().await?;
    if d.metadata.deletion_timestamp.is_some() {
        s.sync_status_only(&rs_list).await?;
        return Ok(Action::await_change());
    }
    s.check_paused_conditions().await?;
    // A paused Deployment only scales; so does any Deployment whose size changed.
    if util::is_paused(&s.d) || s.is_scaling_event(&rs_list) {
        s.sync(&rs_list).await?;
    } else if util::is_rolling(&s.d) {
        s.rollout_rolling(&rs_list).await?;
    } else {
        s.rollout_recreate(&rs_list).await?;
    }
    Ok(match s.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

fn object_key(obj: &Deployment) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A sync, after which the object's retry delay starts afresh if it succeeded.
async fn sync_and_forget(d: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let key = object_key(&d);
    let result = reconcile(d, ctx.clone()).await;
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

fn error_policy(d: Arc<Deployment>, err: &ControllerError, ctx: Arc<Context>) -> Action {
    let key = object_key(&d);
    tracing::debug!(deployment = %key, error = %err, "deployment sync failed; retrying");
    Action::requeue(ctx.backoff.next(&key, Instant::now()))
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (d_reader, own) = informers.informer::<Deployment>().subscribe().trigger_self();
    let (rs_reader, rs_events) = informers.informer::<ReplicaSet>().subscribe().into_watch_events();
    // Only the pods of ReplicaSets are sent here (`deployments_for_pod`).
    let (pod_reader, pod_events) = informers
        .informer::<Pod>()
        .subscribe()
        .only(|p| controller_of(&p.metadata).is_some_and(|c| c.kind == "ReplicaSet"))
        .into_watch_events();
    let ctx = Arc::new(Context {
        client: client.clone(),
        replicasets: rs_reader,
        replicasets_by_owner: informers.by_controller(),
        orphan_replicasets: informers.orphans_by_namespace(),
        pods: pod_reader,
        pods_by_owner: informers.by_controller(),
        deployments_by_namespace: informers.by_namespace(),
        backoff: sync_retry_backoff(),
        recorder: EventRecorder::new(client.clone(), "deployment-controller"),
    });
    let rs_ctx = ctx.clone();
    let replicasets = rs_events
        .map_ok(move |ev| {
            let refs = match &ev {
                Event::Apply(rs) | Event::InitApply(rs) | Event::Delete(rs) => rs_ctx.deployments_for(rs),
                Event::Init | Event::InitDone => Vec::new(),
            };
            stream::iter(refs.into_iter().map(|r| Ok(ReconcileRequest::from(r))))
        })
        .try_flatten();
    let pod_ctx = ctx.clone();
    let pods = pod_events
        .map_ok(move |ev| {
            let refs = pod_ctx.deployments_for_pod(&ev);
            stream::iter(refs.into_iter().map(|r| Ok(ReconcileRequest::from(r))))
        })
        .try_flatten();
    let queue = QueueMetrics::new("deployment", d_reader.clone());
    applier(
        queue.timed(sync_and_forget),
        queue.retried(error_policy),
        ctx,
        d_reader,
        queue.requests(stream::select(own, stream::select(replicasets, pods))),
    )
    .for_each(|r| {
        if let Err(e) = r {
            tracing::trace!(error = %e, "deployment controller");
        }
        std::future::ready(())
    })
    .await;
}
