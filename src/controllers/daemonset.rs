//! DaemonSetController: one pod per eligible Node, pinned to it by node
//! affinity (the scheduler binds it), replaced by RollingUpdate within
//! maxUnavailable and maxSurge or by OnDelete, tracked through
//! ControllerRevisions whose hash the pods carry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::controller_utils::{
    controller_ref, is_pod_available, is_pod_ready, look_again_for_available, pod_from_template, pod_phase,
};
use super::daemonset_nodes::{add_default_tolerations, pin_to_node, placement, target_node};
use super::expectations::Expectations;
use super::history::{self, NewRevision};
use super::informers::{self, controlled_by, wait_synced};
use super::{ref_manager, ControllerError};
use crate::client::events::{EventRecorder, EventType};
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

/// An int-or-percent of `total`, rounded up as upstream's daemon util does.
pub fn scaled(value: Option<&IntOrString>, total: i32) -> i32 {
    match value {
        None => 0,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            i32::try_from((pct * i64::from(total) + 99) / 100).unwrap_or(i32::MAX)
        }
    }
}

fn revision_hash(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.as_ref()?.get(REVISION_LABEL).map(String::as_str)
}

/// Oldest first, as upstream orders a node's daemon pods.
fn by_age(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp).then(a.metadata.name.cmp(&b.metadata.name))
    });
}

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
    let orphans = ref_manager::orphans(&ctx.orphan_pods, &ns, &spec.selector);
    if !orphans.is_empty() {
        // The adopted pods come back as watch events and another pass.
        ref_manager::adopt(&ctx.client, &ns, &orphans, &controller_ref(&*ds)).await?;
        return Ok(Action::await_change());
    }
    let status = ds.status.clone().unwrap_or_default();

    let revisions_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let revisions = history::sorted(controlled_by(&ctx.revisions_by_owner, &ns, &uid));
    let mut collision_count = status.collision_count.unwrap_or(0);
    let update = NewRevision {
        api: &revisions_api,
        owner_name: &name,
        owner_ref: controller_ref(&*ds),
        labels: spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default(),
        hash_label: REVISION_LABEL,
        data: history::template_patch(&spec.template),
        revisions: &revisions,
    }
    .ensure(&mut collision_count)
    .await?;
    let hash = update.metadata.labels.as_ref().and_then(|l| l.get(REVISION_LABEL)).cloned().unwrap_or_default();

    // The template as daemon pods get it, and where it fits.
    let mut template: PodTemplateSpec = spec.template.clone();
    let mut pod_spec = template.spec.clone().unwrap_or_default();
    add_default_tolerations(&mut pod_spec);
    template.spec = Some(pod_spec.clone());
    let nodes = ctx.nodes.state();
    let mut node_pods: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    let owned = controlled_by(&ctx.pods_by_owner, &ns, &uid);
    let mut orphaned: Vec<Arc<Pod>> = Vec::new();
    for pod in &owned {
        match target_node(pod) {
            Some(n) => node_pods.entry(n).or_default().push(pod.clone()),
            None => orphaned.push(pod.clone()),
        }
    }
    let node_names: HashSet<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    for (node, pods) in &node_pods {
        if !node_names.contains(node) {
            orphaned.extend(pods.iter().cloned());
        }
    }

    let seen =
        |pod: &str| ctx.pods.get(&ObjectRef::new(pod).within(&ns)).map(|p| p.metadata.deletion_timestamp.is_some());
    let synced = ctx.expectations.satisfied(&uid, seen);
    let now = k8s_openapi::jiff::Timestamp::now();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let available = |p: &Pod| p.metadata.deletion_timestamp.is_none() && is_pod_available(p, min_ready, now);

    let mut create_on: Vec<String> = Vec::new();
    let mut delete: Vec<Arc<Pod>> = Vec::new();
    let mut counts = Counts::default();
    let mut requeue: Option<Duration> = None;
    // Rolling update bookkeeping: nodes with old pods, and unavailability.
    let mut old_on: BTreeMap<String, OldAndNew> = BTreeMap::new();
    let mut unavailable = 0;
    for node in &nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let place = placement(&pod_spec, node);
        let mut pods = node_pods.get(&node_name).cloned().unwrap_or_default();
        by_age(&mut pods);
        let live: Vec<Arc<Pod>> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).cloned().collect();
        if place.should_run {
            counts.desired += 1;
            if let Some(first) = live.first() {
                counts.current += 1;
                if is_pod_ready(first) {
                    counts.ready += 1;
                    if available(first) {
                        counts.available += 1;
                    } else {
                        requeue = Some(look_again_for_available(min_ready));
                    }
                }
                if live.iter().any(|p| revision_hash(p) == Some(hash.as_str())) {
                    counts.updated += 1;
                }
            }
        } else if !live.is_empty() {
            counts.misscheduled += 1;
        }
        if place.should_run || (place.should_continue_running && !live.is_empty()) {
            let failed: Vec<_> = live.iter().filter(|p| pod_phase(p) == "Failed").cloned().collect();
            delete.extend(failed.iter().cloned());
            let running: Vec<_> = live.iter().filter(|p| pod_phase(p) != "Failed").cloned().collect();
            if running.is_empty() {
                if place.should_run && failed.is_empty() && pods.is_empty() {
                    create_on.push(node_name.clone());
                }
                if place.should_run {
                    unavailable += 1;
                }
                continue;
            }
            // More than one daemon pod: keep the oldest of each revision.
            let (new, old): (Vec<_>, Vec<_>) =
                running.iter().cloned().partition(|p| revision_hash(p) == Some(hash.as_str()));
            if new.len() > 1 {
                delete.extend(new[1..].iter().cloned());
            }
            let new_pod = new.first().cloned();
            // A surged pod is not the node's oldest (counted above), yet the
            // old pod goes only once it has waited out minReadySeconds.
            if new_pod.as_ref().is_some_and(|p| is_pod_ready(p) && !available(p)) {
                requeue = Some(look_again_for_available(min_ready));
            }
            if !new_pod.as_ref().is_some_and(|p| available(p)) && !old.iter().any(|p| available(p)) {
                unavailable += 1;
            }
            if !old.is_empty() {
                old_on.insert(node_name.clone(), (old, new_pod));
            }
        } else {
            delete.extend(live);
        }
    }
    delete.extend(orphaned.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()));

    // RollingUpdate over the nodes still running old pods.
    let strategy = spec.update_strategy.as_ref();
    let rolling = strategy.and_then(|s| s.type_.as_deref()) != Some("OnDelete");
    if rolling && synced {
        let ru = strategy.and_then(|s| s.rolling_update.as_ref());
        let max_surge = scaled(ru.and_then(|r| r.max_surge.as_ref()), counts.desired);
        let mut max_unavailable = scaled(ru.and_then(|r| r.max_unavailable.as_ref()), counts.desired);
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        let mut surged = old_on.values().filter(|(_, new)| new.is_some()).count() as i32;
        for (node, (old, new)) in &old_on {
            let old_available = old.iter().any(|p| available(p));
            match new {
                // A new pod exists: the old ones go once it is available
                // (or at once if none of them was available either).
                Some(n) if available(n) || !old_available => delete.extend(old.iter().cloned()),
                Some(_) => {}
                None if !old_available => delete.extend(old.iter().cloned()),
                None if max_surge > 0 => {
                    if surged < max_surge {
                        surged += 1;
                        create_on.push(node.clone());
                    }
                }
                None => {
                    if unavailable < max_unavailable {
                        unavailable += 1;
                        delete.extend(old.iter().cloned());
                    }
                }
            }
        }
    }

    if synced {
        let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        for node in create_on {
            let mut pod = pod_from_template(&template, &ns, controller_ref(&*ds));
            pod.metadata.generate_name = Some(format!("{name}-"));
            let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.insert(REVISION_LABEL.into(), hash.clone());
            labels.insert(TEMPLATE_GENERATION_LABEL.into(), ds.metadata.generation.unwrap_or(0).to_string());
            if let Some(s) = pod.spec.as_mut() {
                pin_to_node(s, &node);
            }
            match pods_api.create(&PostParams::default(), &pod).await {
                Ok(created) => {
                    let pod_name = created.metadata.name.clone().unwrap_or_default();
                    ctx.expectations.expect_create(&uid, &pod_name);
                    ctx.recorder.publish(
                        &*ds,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created pod: {pod_name}"),
                    );
                }
                Err(e) => {
                    ctx.recorder.publish(&*ds, EventType::Warning, "FailedCreate", &format!("Error creating: {e}"));
                    return Err(e.into());
                }
            }
        }
        let mut deleted = HashSet::new();
        for pod in delete {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            if !deleted.insert(pod_name.clone()) {
                continue;
            }
            ctx.expectations.expect_delete(&uid, &pod_name);
            match pods_api.delete(&pod_name, &DeleteParams::default()).await {
                Ok(_) => ctx.recorder.publish(
                    &*ds,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!("Deleted pod: {pod_name}"),
                ),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    ctx.recorder.publish(&*ds, EventType::Warning, "FailedDelete", &format!("Error deleting: {e}"));
                    return Err(e.into());
                }
            }
        }
    }

    let new_status = json!({
        "observedGeneration": ds.metadata.generation,
        "desiredNumberScheduled": counts.desired,
        "currentNumberScheduled": counts.current,
        "numberMisscheduled": counts.misscheduled,
        "numberReady": counts.ready,
        "updatedNumberScheduled": counts.updated,
        "numberAvailable": counts.available,
        "numberUnavailable": counts.desired - counts.available,
        "collisionCount": collision_count,
    });
    let old = serde_json::to_value(&status).unwrap_or_default();
    let changed = new_status.as_object().into_iter().flatten().any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v);
    if changed {
        let sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
        match sets.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": new_status}))).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }

    let mut live: HashSet<String> = HashSet::new();
    live.insert(update.metadata.name.clone().unwrap_or_default());
    for pod in &owned {
        if let Some(h) = revision_hash(pod) {
            live.insert(format!("{name}-{h}"));
        }
    }
    history::truncate(&revisions_api, &revisions, &live, spec.revision_history_limit.unwrap_or(10)).await?;
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// A node's daemon pods of older revisions, and its pod of the current one.
type OldAndNew = (Vec<Arc<Pod>>, Option<Arc<Pod>>);

#[derive(Default)]
struct Counts {
    desired: i32,
    current: i32,
    misscheduled: i32,
    ready: i32,
    updated: i32,
    available: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_percent_rounds_up() {
        assert_eq!(scaled(Some(&IntOrString::String("25%".into())), 5), 2);
        assert_eq!(scaled(Some(&IntOrString::String("10%".into())), 10), 1);
        assert_eq!(scaled(Some(&IntOrString::Int(3)), 10), 3);
        assert_eq!(scaled(None, 10), 0);
    }
}
