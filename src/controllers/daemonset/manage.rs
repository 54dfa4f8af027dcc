//! Upstream's `manage` and `syncNodes` for a DaemonSet: the DaemonSet's
//! pods by Node, what each Node needs (a pod created, failed or extra pods
//! deleted, pods of older revisions noted for the rolling update), and the
//! creates and deletes that carry it out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplateSpec};
use kube::api::{Api, DeleteParams, PostParams};

use super::nodes::{pin_to_node, placement, target_node, Placement};
use super::{revision_hash, Availability, Context, REVISION_LABEL, TEMPLATE_GENERATION_LABEL};
use crate::client::events::EventType;
use crate::controllers::controller_utils::{controller_ref, is_pod_ready, pod_from_template, pod_phase};
use crate::controllers::ControllerError;

/// A Node as one pass sees it: where the daemon pod belongs, and the
/// DaemonSet's pods there, oldest first.
pub(super) struct NodeState {
    pub name: String,
    pub place: Placement,
    /// Every pod on the Node, terminating ones too.
    pub pods: Vec<Arc<Pod>>,
    /// Those not being deleted.
    pub live: Vec<Arc<Pod>>,
}

/// A Node's daemon pods of older revisions, and its pod of the current one.
pub(super) type OldAndNew = (Vec<Arc<Pod>>, Option<Arc<Pod>>);

/// What `manage` (and then `rolling_update`) decided.
#[derive(Default)]
pub(super) struct Plan {
    /// Nodes that get a new daemon pod.
    pub create_on: Vec<String>,
    /// Pods to delete (a pod may appear twice; it is deleted once).
    pub delete: Vec<Arc<Pod>>,
    /// Nodes still running pods of older revisions.
    pub old_on: BTreeMap<String, OldAndNew>,
    /// Nodes whose daemon pod is unavailable.
    pub unavailable: i32,
    /// A surged pod is waiting out minReadySeconds.
    pub look_again: bool,
}

/// Upstream's getNodesToDaemonPods: the DaemonSet's pods by the Node they
/// are on or pinned to, beside where `pod_spec` belongs on each Node; and
/// the pods whose Node is unknown or gone.
pub(super) fn nodes_to_daemon_pods(
    nodes: &[Arc<Node>],
    owned: &[Arc<Pod>],
    pod_spec: &PodSpec,
) -> (Vec<NodeState>, Vec<Arc<Pod>>) {
    let mut node_pods: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    let mut orphaned: Vec<Arc<Pod>> = Vec::new();
    for pod in owned {
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
    let states = nodes
        .iter()
        .map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            let mut pods = node_pods.get(&name).cloned().unwrap_or_default();
            by_age(&mut pods);
            let live = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).cloned().collect();
            NodeState { place: placement(pod_spec, node), name, pods, live }
        })
        .collect();
    (states, orphaned)
}

/// Oldest first, as upstream orders a node's daemon pods.
fn by_age(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp).then(a.metadata.name.cmp(&b.metadata.name))
    });
}

/// Upstream's manage: what every Node needs, then the pods whose Node is
/// gone deleted.
pub(super) fn manage(nodes: &[NodeState], orphaned: Vec<Arc<Pod>>, hash: &str, availability: &Availability) -> Plan {
    let mut plan = Plan::default();
    for node in nodes {
        pods_should_be_on_node(node, hash, availability, &mut plan);
    }
    plan.delete.extend(orphaned.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()));
    plan
}

/// Upstream's podsShouldBeOnNode for one Node: a pod created where none
/// runs, failed pods and all but the oldest of each revision deleted, pods
/// off a Node they may not stay on deleted.
fn pods_should_be_on_node(node: &NodeState, hash: &str, availability: &Availability, plan: &mut Plan) {
    let place = node.place;
    if !(place.should_run || (place.should_continue_running && !node.live.is_empty())) {
        plan.delete.extend(node.live.iter().cloned());
        return;
    }
    let failed: Vec<_> = node.live.iter().filter(|p| pod_phase(p) == "Failed").cloned().collect();
    plan.delete.extend(failed.iter().cloned());
    let running: Vec<_> = node.live.iter().filter(|p| pod_phase(p) != "Failed").cloned().collect();
    if running.is_empty() {
        if place.should_run && failed.is_empty() && node.pods.is_empty() {
            plan.create_on.push(node.name.clone());
        }
        if place.should_run {
            plan.unavailable += 1;
        }
        return;
    }
    // More than one daemon pod: keep the oldest of each revision.
    let (new, old): (Vec<_>, Vec<_>) = running.iter().cloned().partition(|p| revision_hash(p) == Some(hash));
    if new.len() > 1 {
        plan.delete.extend(new[1..].iter().cloned());
    }
    let new_pod = new.first().cloned();
    // A surged pod is not the node's oldest (counted in the status), yet
    // the old pod goes only once it has waited out minReadySeconds.
    if new_pod.as_ref().is_some_and(|p| is_pod_ready(p) && !availability.of(p)) {
        plan.look_again = true;
    }
    if !new_pod.as_ref().is_some_and(|p| availability.of(p)) && !old.iter().any(|p| availability.of(p)) {
        plan.unavailable += 1;
    }
    if !old.is_empty() {
        plan.old_on.insert(node.name.clone(), (old, new_pod));
    }
}

/// Upstream's syncNodes: creates a pod on each of `create_on`, then
/// deletes `delete`, recording what it expects to see.
pub(super) async fn sync_nodes(
    ctx: &Context,
    ds: &DaemonSet,
    template: &PodTemplateSpec,
    hash: &str,
    create_on: Vec<String>,
    delete: Vec<Arc<Pod>>,
) -> Result<(), ControllerError> {
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ds.metadata.namespace.as_deref().unwrap_or_default());
    for node in create_on {
        create_daemon_pod(ctx, ds, &pods_api, template, hash, &node).await?;
    }
    let mut deleted = HashSet::new();
    for pod in delete {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        if deleted.insert(pod_name.clone()) {
            delete_daemon_pod(ctx, ds, &pods_api, &pod_name).await?;
        }
    }
    Ok(())
}

/// Creates the daemon pod of revision `hash` pinned to `node`.
async fn create_daemon_pod(
    ctx: &Context,
    ds: &DaemonSet,
    pods_api: &Api<Pod>,
    template: &PodTemplateSpec,
    hash: &str,
    node: &str,
) -> Result<(), ControllerError> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let mut pod = pod_from_template(template, &ns, controller_ref(ds));
    pod.metadata.generate_name = Some(format!("{}-", ds.metadata.name.as_deref().unwrap_or_default()));
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(REVISION_LABEL.into(), hash.to_string());
    labels.insert(TEMPLATE_GENERATION_LABEL.into(), ds.metadata.generation.unwrap_or(0).to_string());
    if let Some(s) = pod.spec.as_mut() {
        pin_to_node(s, node);
    }
    match pods_api.create(&PostParams::default(), &pod).await {
        Ok(created) => {
            let pod_name = created.metadata.name.clone().unwrap_or_default();
            ctx.expectations.expect_create(ds.metadata.uid.as_deref().unwrap_or_default(), &pod_name);
            ctx.recorder.publish(ds, EventType::Normal, "SuccessfulCreate", &format!("Created pod: {pod_name}"));
            Ok(())
        }
        Err(e) => {
            ctx.recorder.publish(ds, EventType::Warning, "FailedCreate", &format!("Error creating: {e}"));
            Err(e.into())
        }
    }
}

/// Deletes a daemon pod (one already gone is fine).
async fn delete_daemon_pod(
    ctx: &Context,
    ds: &DaemonSet,
    pods_api: &Api<Pod>,
    pod_name: &str,
) -> Result<(), ControllerError> {
    ctx.expectations.expect_delete(ds.metadata.uid.as_deref().unwrap_or_default(), pod_name);
    match pods_api.delete(pod_name, &DeleteParams::default()).await {
        Ok(_) => {
            ctx.recorder.publish(ds, EventType::Normal, "SuccessfulDelete", &format!("Deleted pod: {pod_name}"));
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            ctx.recorder.publish(ds, EventType::Warning, "FailedDelete", &format!("Error deleting: {e}"));
            Err(e.into())
        }
    }
}
