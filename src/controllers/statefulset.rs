//! StatefulSetController: pods with stable names `<set>-<ordinal>` and
//! stable claims, created in order (OrderedReady: ordinal i only once 0..i
//! are Running and Ready; scale down from the highest ordinal, one at a
//! time) or all at once (Parallel); updates by RollingUpdate (highest
//! ordinal first, down to the partition) or OnDelete, tracked through
//! ControllerRevisions.
//!
//! A pass follows upstream's defaultStatefulSetControl: claim orphans and
//! construct the history (shared with DaemonSets, in `history`),
//! `SetRevisions` (getStatefulSetRevisions), `update_statefulset` (scale and
//! rolling update, in `update`, through `pod_control`),
//! `update_statefulset_status`, then truncateHistory. A pod's identity
//! (name, labels, claims) is `pods` (upstream's stateful_set_utils).

mod pod_control;
mod pods;
mod status;
mod update;

use std::collections::HashSet;
use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::runtime::reflector::{ObjectRef, Store};

use self::pods::{is_running_and_ready, ordinal_of, revision_of};
use self::status::{update_statefulset_status, SetStatus};
use self::update::{update_statefulset, SetPods, UpdatePolicy};
use super::controller_utils::{is_pod_available, look_again_for_available};
use super::expectations::Expectations;
use super::history::{self, History, RevisionedOwner};
use super::informers::{self, controlled_by, wait_synced};
use super::ControllerError;
use crate::client::events::EventRecorder;
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    orphan_pods: Index<Pod>,
    revisions: Store<ControllerRevision>,
    revisions_by_owner: Index<ControllerRevision>,
    expectations: Expectations,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let pods = informers.informer::<Pod>().subscribe();
    let revisions = informers.informer::<ControllerRevision>().subscribe();
    let (sets, set_events) = informers.informer::<StatefulSet>().subscribe().trigger_self();
    let (pods, pod_events) =
        pods.trigger_owner_or_selecting(sets.clone(), |s: &StatefulSet| s.spec.as_ref().map(|s| &s.selector));
    let (revisions, revision_events) = revisions.trigger_owner::<StatefulSet>();
    let recorder = EventRecorder::new(client.clone(), "statefulset-controller");
    let ctx = Arc::new(Context {
        client,
        pods,
        pods_by_owner: informers.by_controller(),
        orphan_pods: informers.orphans_by_namespace(),
        revisions,
        revisions_by_owner: informers.by_controller(),
        expectations: Expectations::default(),
        recorder,
    });
    informers::run("statefulset", sets, vec![set_events, pod_events, revision_events], reconcile, ctx).await;
}

/// Upstream's syncStatefulSet and performUpdate, step by step.
async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.pods).await?;
    wait_synced(&ctx.revisions).await?;
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    if set.metadata.deletion_timestamp.is_some() {
        ctx.expectations.remove(&uid);
        return Ok(Action::await_change());
    }
    let seen =
        |pod: &str| ctx.pods.get(&ObjectRef::new(pod).within(&ns)).map(|p| p.metadata.deletion_timestamp.is_some());
    if !ctx.expectations.satisfied(&uid, seen) {
        return Ok(while_expecting(&ctx, &set));
    }
    let Some(spec) = set.spec.as_ref() else { return Ok(Action::await_change()) };
    let status = set.status.clone().unwrap_or_default();
    let owner = RevisionedOwner {
        client: &ctx.client,
        owner: &*set,
        selector: &spec.selector,
        template: &spec.template,
        hash_label: history::REVISION_HASH_LABEL,
        collision_count: status.collision_count,
        orphan_pods: &ctx.orphan_pods,
        revisions_by_owner: &ctx.revisions_by_owner,
    };
    let Some(history) = owner.claim_and_construct_history().await? else { return Ok(Action::await_change()) };
    let revisions = SetRevisions::of(&history, &status, spec);
    let name = set.metadata.name.clone().unwrap_or_default();
    let pods = SetPods::by_ordinal(&name, spec, controlled_by(&ctx.pods_by_owner, &ns, &uid));
    let policy = UpdatePolicy::of(spec);

    update_statefulset(&ctx, &set, &revisions, &pods, &policy).await?;
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let status = SetStatus::compute(&pods, &revisions, &policy, min_ready, history.collision_count);
    update_statefulset_status(&ctx, &set, &status).await?;
    // Keep revisions pods use, the current and update ones, and
    // revisionHistoryLimit others.
    let mut live: HashSet<String> = pods.slots.values().filter_map(|p| revision_of(p).map(str::to_string)).collect();
    live.insert(status.current_revision);
    live.insert(status.update_revision);
    history.cleanup(&live, spec.revision_history_limit).await?;
    Ok(if status.look_again { Action::requeue(look_again_for_available(min_ready)) } else { Action::await_change() })
}

/// While the cache has not yet seen this controller's own creates and
/// deletes: nothing to do but wait. A requeue handed back earlier is
/// dropped when another request was already waiting (kube's scheduler
/// keeps only the waiting one), so the minReadySeconds look-again is kept
/// through the wait, as the Job keeps its deadline's.
fn while_expecting(ctx: &Context, set: &StatefulSet) -> Action {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let name = set.metadata.name.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let min_ready = set.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let now = k8s_openapi::jiff::Timestamp::now();
    let becoming_available = controlled_by(&ctx.pods_by_owner, &ns, &uid).iter().any(|p| {
        ordinal_of(&name, p.metadata.name.as_deref().unwrap_or_default()).is_some()
            && is_running_and_ready(p)
            && !is_pod_available(p, min_ready, now)
    });
    if becoming_available {
        Action::requeue(look_again_for_available(min_ready))
    } else {
        Action::await_change()
    }
}

/// Upstream's getStatefulSetRevisions: the revision pods are updated to,
/// the one they were at (the status' currentRevision), and its template.
struct SetRevisions {
    current: String,
    update: String,
    current_template: PodTemplateSpec,
    /// The spec's template, which the update revision holds.
    update_template: PodTemplateSpec,
    /// The status' currentReplicas as read.
    current_replicas: i32,
}

impl SetRevisions {
    fn of(history: &History, status: &StatefulSetStatus, spec: &StatefulSetSpec) -> Self {
        let current = history.named_or_update(status.current_revision.as_ref());
        SetRevisions {
            current: current.metadata.name.clone().unwrap_or_default(),
            update: history.update_name(),
            current_template: history::template_of(&current).unwrap_or_else(|| spec.template.clone()),
            update_template: spec.template.clone(),
            current_replicas: status.current_replicas.unwrap_or(0),
        }
    }
}
