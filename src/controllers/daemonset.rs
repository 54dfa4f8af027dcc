//! DaemonSetController: one pod per eligible Node, pinned to it by node
//! affinity (the scheduler binds it), replaced by RollingUpdate within
//! maxUnavailable and maxSurge or by OnDelete, tracked through
//! ControllerRevisions whose hash the pods carry.
//!
//! A pass follows upstream's syncDaemonSet: claim orphans and construct the
//! history (shared with StatefulSets, in `history`), `manage` (which Nodes
//! need a pod, which pods go), `rolling_update`, create and delete
//! (`sync_nodes`), `update_daemonset_status`, then cleanupHistory. Where a
//! daemon pod belongs is `nodes` (upstream's daemon util).

mod manage;
mod nodes;
mod status;
mod update;

use std::collections::HashSet;
use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};

use self::manage::{manage, nodes_to_daemon_pods, sync_nodes};
use self::nodes::{add_default_tolerations, placement};
use self::status::{count, update_daemonset_status};
use self::update::rolling_update;
use super::controller_utils::{is_pod_available, look_again_for_available};
use super::expectations::Expectations;
use super::history::{History, RevisionedOwner};
use super::informers::{self, controlled_by, wait_synced};
use super::ControllerError;
use crate::client::events::EventRecorder;
use crate::client::indexer::{controller_uid, Index};
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::predicates::node_heartbeat_only;

const REVISION_LABEL: &str = "controller-revision-hash";
const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    orphan_pods: Index<Pod>,
    nodes: Store<Node>,
    revisions: Store<ControllerRevision>,
    revisions_by_owner: Index<ControllerRevision>,
    expectations: Expectations,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let pods = informers.informer::<Pod>().subscribe();
    let revisions = informers.informer::<ControllerRevision>().subscribe();
    let (sets, set_events) = informers.informer::<DaemonSet>().subscribe().trigger_self();
    let (pods, pod_events) =
        pods.trigger_owner_or_selecting(sets.clone(), |s: &DaemonSet| s.spec.as_ref().map(|s| &s.selector));
    let (revisions, revision_events) = revisions.trigger_owner::<DaemonSet>();
    let (all_sets, pods_on) = (sets.clone(), informers.pods_by_node());
    let (nodes, node_events) = informers
        .informer::<Node>()
        .subscribe()
        .skip_updates(node_heartbeat_only)
        .trigger_with::<DaemonSet, _>(move |node: &Node| daemonsets_for_node(&all_sets, &pods_on, node));
    let recorder = EventRecorder::new(client.clone(), "daemonset-controller");
    let ctx = Arc::new(Context {
        client,
        pods,
        pods_by_owner: informers.by_controller(),
        orphan_pods: informers.orphans_by_namespace(),
        nodes,
        revisions,
        revisions_by_owner: informers.by_controller(),
        expectations: Expectations::default(),
        recorder,
    });
    informers::run("daemonset", sets, vec![set_events, pod_events, revision_events, node_events], reconcile, ctx).await;
}

/// The DaemonSets a Node change concerns (upstream's addNode/updateNode):
/// those whose pods run on it, and those that should run there.
fn daemonsets_for_node(sets: &Store<DaemonSet>, pods_by_node: &Index<Pod>, node: &Node) -> Vec<ObjectRef<DaemonSet>> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let with_pods: HashSet<String> = pods_by_node.get(name).iter().flat_map(|p| controller_uid(&**p)).collect();
    sets.state()
        .iter()
        .filter(|ds| {
            ds.metadata.uid.as_ref().is_some_and(|u| with_pods.contains(u)) || {
                let mut spec = ds.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap_or_default();
                add_default_tolerations(&mut spec);
                let p = placement(&spec, node);
                p.should_run || p.should_continue_running
            }
        })
        .map(|ds| ObjectRef::from_obj(&**ds))
        .collect()
}

fn revision_hash(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.as_ref()?.get(REVISION_LABEL).map(String::as_str)
}

/// Whether a daemon pod counts as available at one instant: not being
/// deleted, and ready for minReadySeconds.
struct Availability {
    min_ready: i32,
    now: Timestamp,
}

impl Availability {
    fn of(&self, pod: &Pod) -> bool {
        pod.metadata.deletion_timestamp.is_none() && is_pod_available(pod, self.min_ready, self.now)
    }
}

/// Upstream's syncDaemonSet, step by step.
async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.pods).await?;
    wait_synced(&ctx.nodes).await?;
    wait_synced(&ctx.revisions).await?;
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    if ds.metadata.deletion_timestamp.is_some() {
        ctx.expectations.remove(&uid);
        return Ok(Action::await_change());
    }
    let Some(spec) = ds.spec.as_ref() else { return Ok(Action::await_change()) };
    let owner = RevisionedOwner {
        client: &ctx.client,
        owner: &*ds,
        selector: &spec.selector,
        template: &spec.template,
        hash_label: REVISION_LABEL,
        collision_count: ds.status.as_ref().and_then(|s| s.collision_count),
        orphan_pods: &ctx.orphan_pods,
        revisions_by_owner: &ctx.revisions_by_owner,
    };
    let Some(history) = owner.claim_and_construct_history().await? else { return Ok(Action::await_change()) };
    let hash = history.update.metadata.labels.as_ref().and_then(|l| l.get(REVISION_LABEL)).cloned().unwrap_or_default();

    let template = daemon_pod_template(&spec.template);
    let pod_spec = template.spec.clone().unwrap_or_default();
    let all_nodes = ctx.nodes.state();
    let owned = controlled_by(&ctx.pods_by_owner, &ns, &uid);
    let (nodes, orphaned) = nodes_to_daemon_pods(&all_nodes, &owned, &pod_spec);
    let seen =
        |pod: &str| ctx.pods.get(&ObjectRef::new(pod).within(&ns)).map(|p| p.metadata.deletion_timestamp.is_some());
    let synced = ctx.expectations.satisfied(&uid, seen);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let availability = Availability { min_ready, now: Timestamp::now() };

    let mut plan = manage(&nodes, orphaned, &hash, &availability);
    let counts = count(&nodes, &hash, &availability);
    let strategy = spec.update_strategy.as_ref();
    if synced && strategy.and_then(|s| s.type_.as_deref()) != Some("OnDelete") {
        rolling_update(strategy.and_then(|s| s.rolling_update.as_ref()), counts.desired, &mut plan, &availability);
    }
    if synced {
        sync_nodes(&ctx, &ds, &template, &hash, plan.create_on, plan.delete).await?;
    }
    update_daemonset_status(&ctx, &ds, &counts, history.collision_count).await?;
    history.cleanup(&live_revisions(&history, &name, &owned), spec.revision_history_limit).await?;
    Ok(if plan.look_again || counts.look_again {
        Action::requeue(look_again_for_available(min_ready))
    } else {
        Action::await_change()
    })
}

/// The template as daemon pods get it: with the tolerations upstream adds.
fn daemon_pod_template(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut template = template.clone();
    let mut pod_spec = template.spec.clone().unwrap_or_default();
    add_default_tolerations(&mut pod_spec);
    template.spec = Some(pod_spec);
    template
}

/// The revisions cleanupHistory keeps: the update revision and those the
/// DaemonSet's pods carry.
fn live_revisions(history: &History, name: &str, owned: &[Arc<Pod>]) -> HashSet<String> {
    let mut live: HashSet<String> = HashSet::new();
    live.insert(history.update_name());
    for pod in owned {
        if let Some(h) = revision_hash(pod) {
            live.insert(format!("{name}-{h}"));
        }
    }
    live
}
