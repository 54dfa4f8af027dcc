//! DefaultPreemption: when a pod fits nowhere, find a node where evicting
//! lower-priority pods would let it fit, respecting PodDisruptionBudgets,
//! as upstream's PostFilter: a dry run on every node whose failure removing
//! pods could resolve, the fewest and least important victims chosen, then
//! the victims deleted (with their own grace period) and the node nominated.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::framework::{Code, CycleState, NodeFailure, Status};
use super::node_info::{NodeInfo, PodInfo};
use super::profile::{fit_error_message, Profile};
use crate::client::events::{EventRecorder, EventType};
use crate::client::labels;

const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
/// How `find_candidate`'s answer starts when the pod may not preempt now.
pub const NOT_ELIGIBLE: &str = "preemption: not eligible";

/// Why preemption finds no node: the message users see after the fit
/// error ("preemption: 0/3 nodes are available: ...").
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoCandidate {
    /// The pod may not preempt now: a pod on its nominated node is terminating.
    #[error("{NOT_ELIGIBLE} due to a terminating pod on the nominated node.")]
    NotEligible,
    /// No node would fit the pod once victims were gone: each node's reason.
    #[error("preemption: {}", no_node_text(.all_nodes, .statuses))]
    NoNode { all_nodes: usize, statuses: Vec<NodeFailure> },
}

fn no_node_text(all_nodes: &usize, statuses: &[NodeFailure]) -> String {
    fit_error_message(*all_nodes, statuses)
}

/// A node where the pod would fit once `victims` are gone.
#[derive(Debug)]
pub struct Candidate {
    pub node: String,
    /// Most important first.
    pub victims: Vec<Arc<PodInfo>>,
    pub pdb_violations: usize,
    /// Lower-priority pods nominated to this node, whose nomination is
    /// cleared (filled in by the scheduler, which knows the queue).
    pub lower_priority_nominated: Vec<Arc<PodInfo>>,
}

/// When a pod started (its creation when it has not): later is less important.
fn start_time(pod: &PodInfo) -> Option<k8s_openapi::jiff::Timestamp> {
    let status = pod.pod.status.as_ref().and_then(|s| s.start_time.as_ref());
    status.or(pod.pod.metadata.creation_timestamp.as_ref()).map(|t| t.0)
}

/// Upstream's MoreImportantPod ordering: higher priority, then earlier start.
fn more_important_first(a: &Arc<PodInfo>, b: &Arc<PodInfo>) -> std::cmp::Ordering {
    b.priority.cmp(&a.priority).then_with(|| match (start_time(a), start_time(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    })
}

/// Splits pods into those whose eviction would violate a PDB and the rest,
/// spending each budget's `disruptionsAllowed` in order.
fn split_by_pdb(pods: Vec<Arc<PodInfo>>, pdbs: &[Arc<PodDisruptionBudget>]) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i32> = pdbs.iter().map(|p| p.status.as_ref().map_or(0, |s| s.disruptions_allowed)).collect();
    let (mut violating, mut other) = (Vec::new(), Vec::new());
    for pod in pods {
        let mut violated = false;
        if pod.labels().is_some_and(|l| !l.is_empty()) {
            for (i, pdb) in pdbs.iter().enumerate() {
                if pdb.metadata.namespace.as_deref() != Some(pod.namespace.as_str()) {
                    continue;
                }
                // A PDB with no or an empty selector selects nothing.
                let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else { continue };
                if labels::is_empty(selector) || !labels::matches(selector, pod.labels()) {
                    continue;
                }
                let name = pod.pod.metadata.name.as_deref().unwrap_or_default();
                let disrupted = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
                if disrupted.is_some_and(|d| d.contains_key(name)) {
                    continue;
                }
                allowed[i] -= 1;
                if allowed[i] < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(pod);
        } else {
            other.push(pod);
        }
    }
    (violating, other)
}

/// Removes (or puts back) a pod on the copied node, keeping every filter
/// plugin's PreFilter state in step.
fn remove(profile: &Profile, state: &mut CycleState, pod: &PodInfo, node: &mut NodeInfo, victim: &Arc<PodInfo>) {
    node.remove_pod(&victim.uid);
    for f in &profile.filters {
        f.remove_pod(state, pod, victim, node);
    }
}

fn add(profile: &Profile, state: &mut CycleState, pod: &PodInfo, node: &mut NodeInfo, victim: &Arc<PodInfo>) {
    node.add_pod(victim.clone());
    for f in &profile.filters {
        f.add_pod(state, pod, victim, node);
    }
}

/// The fewest victims on `node` that let the pod fit: every lower-priority
/// pod goes, then as many as possible are reprieved, most important first,
/// PDB-protected ones before the rest.
fn select_victims(
    profile: &Profile,
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
    pdbs: &[Arc<PodDisruptionBudget>],
    nominated: &[Arc<PodInfo>],
) -> Result<(Vec<Arc<PodInfo>>, usize), Status> {
    let mut node = node.clone();
    let mut state = state.clone();
    let mut potential: Vec<Arc<PodInfo>> = node.pods.iter().filter(|p| p.priority < pod.priority).cloned().collect();
    if potential.is_empty() {
        return Err(Status::unresolvable(NO_VICTIMS));
    }
    for v in &potential {
        remove(profile, &mut state, pod, &mut node, v);
    }
    let status = profile.filter_with_nominated(&state, pod, &node, nominated);
    if !status.is_success() {
        return Err(status);
    }
    potential.sort_by(more_important_first);
    let (violating, other) = split_by_pdb(potential, pdbs);
    let mixed = !violating.is_empty() && !other.is_empty();
    let mut victims = Vec::new();
    let mut violations = 0;
    for (protected, v) in violating.iter().map(|v| (true, v)).chain(other.iter().map(|v| (false, v))) {
        add(profile, &mut state, pod, &mut node, v);
        if !profile.filter_with_nominated(&state, pod, &node, nominated).is_success() {
            remove(profile, &mut state, pod, &mut node, v);
            victims.push(v.clone());
            violations += usize::from(protected);
        }
    }
    if mixed {
        victims.sort_by(more_important_first);
    }
    if victims.is_empty() {
        let name = &node.name;
        return Err(Status::error(format!("expected at least one victim pod on node {name:?}")));
    }
    Ok((victims, violations))
}

/// Whether the pod may preempt: not while a lower-priority pod on the node
/// it was nominated to is still terminating (its earlier preemption is
/// still under way).
fn eligible(pod: &PodInfo, nodes: &[NodeInfo], failures: &[NodeFailure]) -> bool {
    let Some(nominated) =
        pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).filter(|n| !n.is_empty())
    else {
        return true;
    };
    let unresolvable = failures
        .iter()
        .find(|f| f.node == nominated)
        .is_some_and(|f| f.status.code == Code::UnschedulableAndUnresolvable);
    if unresolvable {
        return true;
    }
    let Some(node) = nodes.iter().find(|n| n.name == nominated) else { return true };
    !node.pods.iter().any(|p| p.pod.metadata.deletion_timestamp.is_some() && p.priority < pod.priority)
}

/// A sort key: the candidate upstream's pickOneNodeForPreemption prefers
/// is the smallest.
type PickKey = (usize, i32, i64, usize, Reverse<Option<k8s_openapi::jiff::Timestamp>>);

fn pick_key(c: &Candidate) -> PickKey {
    let highest = c.victims.first().map_or(i32::MIN, |v| v.priority);
    // Offset so that negative priorities still add up to a positive sum.
    let sum = c.victims.iter().map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1).sum();
    // The earliest start among the most important victims; the latest wins
    // (a pod without a start time counts as just started).
    let earliest = c
        .victims
        .iter()
        .filter(|v| v.priority == highest)
        .map(|v| start_time(v).unwrap_or_else(k8s_openapi::jiff::Timestamp::now))
        .min();
    (c.pdb_violations, highest, sum, c.victims.len(), Reverse(earliest))
}

/// How many candidates are enough, as upstream's defaults
/// (minCandidateNodesPercentage 10, minCandidateNodesAbsolute 100).
fn candidates_to_find(potential: usize) -> usize {
    (potential / 10).max(100).min(potential)
}

/// Chooses where to preempt, or says why nowhere.
/// `nominated`: pods nominated to each node by earlier preemptions.
pub fn find_candidate(
    profile: &Profile,
    state: &CycleState,
    pod: &Arc<PodInfo>,
    nodes: &[NodeInfo],
    failures: &[NodeFailure],
    pdbs: &[Arc<PodDisruptionBudget>],
    nominated: &HashMap<String, Vec<Arc<PodInfo>>>,
) -> Result<Candidate, NoCandidate> {
    if !eligible(pod, nodes, failures) {
        return Err(NoCandidate::NotEligible);
    }
    let mut statuses: Vec<NodeFailure> = Vec::new();
    let mut candidates: Vec<Candidate> = Vec::new();
    let codes: HashMap<&str, Code> = failures.iter().map(|f| (f.node.as_str(), f.status.code)).collect();
    let potential = nodes.iter().filter(|n| codes.get(n.name.as_str()) == Some(&Code::Unschedulable)).count();
    let enough = candidates_to_find(potential);
    for node in nodes {
        if codes.get(node.name.as_str()) != Some(&Code::Unschedulable) {
            let status = Status::unresolvable(NOT_HELPFUL);
            statuses.push(NodeFailure { node: node.name.clone(), status });
            continue;
        }
        // Enough candidates, one of them violating no PDB: stop looking.
        if candidates.len() >= enough && candidates.iter().any(|c| c.pdb_violations == 0) {
            break;
        }
        let on_node = nominated.get(&node.name).map(Vec::as_slice).unwrap_or_default();
        match select_victims(profile, state, pod, node, pdbs, on_node) {
            Ok((victims, pdb_violations)) => candidates.push(Candidate {
                node: node.name.clone(),
                victims,
                pdb_violations,
                lower_priority_nominated: Vec::new(),
            }),
            Err(status) => statuses.push(NodeFailure { node: node.name.clone(), status }),
        }
    }
    if candidates.is_empty() {
        return Err(NoCandidate::NoNode { all_nodes: nodes.len(), statuses });
    }
    let best = candidates.iter().enumerate().min_by_key(|(i, c)| (pick_key(c), *i)).map_or(0, |(i, _)| i);
    Ok(candidates.swap_remove(best))
}

/// Deletes the victims (each marked `DisruptionTarget` first, with a
/// Preempted event) and clears the nomination of lower-priority pods
/// nominated to the node; the scheduler then nominates the node for `pod`.
pub async fn preempt(
    client: &kube::Client,
    recorder: &EventRecorder,
    pod: &PodInfo,
    candidate: &Candidate,
) -> Result<(), kube::Error> {
    let scheduler =
        pod.pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()).unwrap_or(super::DEFAULT_SCHEDULER_NAME);
    for victim in &candidate.victims {
        let api: Api<Pod> = Api::namespaced(client.clone(), &victim.namespace);
        let name = victim.pod.metadata.name.as_deref().unwrap_or_default();
        let condition = serde_json::json!({"status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
            "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
        }]}});
        let gone = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
        match api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&condition)).await {
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        match api.delete(name, &DeleteParams::default()).await {
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        tracing::info!(preemptor = %pod.key, victim = %victim.key, node = %candidate.node, "preempted");
        let message = format!("Preempted by pod {} on node {}", pod.uid, candidate.node);
        recorder.publish(victim.pod.as_ref(), EventType::Normal, "Preempted", &message);
    }
    for other in &candidate.lower_priority_nominated {
        let api: Api<Pod> = Api::namespaced(client.clone(), &other.namespace);
        let name = other.pod.metadata.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({"status": {"nominatedNodeName": null}});
        if let Err(e) = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::debug!(pod = %other.key, error = %e, "cannot clear nominatedNodeName");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugins::node_resources_fit::ScoringStrategy;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> NodeInfo {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}
        }))
        .unwrap();
        NodeInfo::new(Arc::new(n))
    }

    fn pod(name: &str, cpu: &str, priority: i32, started: &str) -> Arc<PodInfo> {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": name}},
            "spec": {"priority": priority, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"startTime": started}
        }))
        .unwrap();
        Arc::new(PodInfo::new(Arc::new(p)))
    }

    fn pdb(app: &str, allowed: i32) -> Arc<PodDisruptionBudget> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": app, "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": app}}},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
            }))
            .unwrap(),
        )
    }

    fn attempt(
        nodes: &[NodeInfo],
        pod: &Arc<PodInfo>,
        pdbs: &[Arc<PodDisruptionBudget>],
    ) -> Result<Candidate, NoCandidate> {
        let profile = Profile::new("default-scheduler", ScoringStrategy::LeastAllocated);
        let mut state = CycleState::default();
        let snapshot = super::super::framework::Snapshot { nodes };
        profile.pre_filter(&mut state, pod, &snapshot).unwrap();
        let feasible = profile.find_feasible(&state, pod, &snapshot, 0, &Default::default());
        assert!(feasible.nodes.is_empty());
        find_candidate(&profile, &state, pod, nodes, &feasible.failures, pdbs, &Default::default())
    }

    const T1: &str = "2026-01-01T00:00:00Z";
    const T2: &str = "2026-01-02T00:00:00Z";

    #[test]
    fn evicts_the_fewest_least_important_pods() {
        let mut a = node("a", "4");
        a.add_pod(pod("a-low", "2", 1, T1));
        a.add_pod(pod("a-lower", "1", 0, T1));
        a.add_pod(pod("a-high", "1", 100, T1));
        let mut b = node("b", "4");
        b.add_pod(pod("b-mid", "3", 5, T1));
        b.add_pod(pod("b-high", "1", 100, T1));
        let c = attempt(&[a.clone(), b.clone()], &pod("p", "2", 10, T1), &[]).unwrap();
        // On a, a-low alone frees 2 cpu (a-lower is reprieved); its priority
        // 1 beats b's victim at 5.
        assert_eq!(c.node, "a");
        assert_eq!(c.victims.iter().map(|v| v.uid.as_str()).collect::<Vec<_>>(), ["a-low"]);
        // A PDB protecting a-low sends the preemption to b.
        let c = attempt(&[a, b], &pod("p", "2", 10, T1), &[pdb("a-low", 0)]).unwrap();
        assert_eq!(c.node, "b");
        assert_eq!(c.pdb_violations, 0);
    }

    #[test]
    fn room_nominated_to_a_more_important_pod_is_not_taken() {
        let mut a = node("a", "4");
        a.add_pod(pod("low", "2", 1, T1));
        let nominated = HashMap::from([("a".to_string(), vec![pod("nominee", "4", 20, T1)])]);
        let profile = Profile::new("default-scheduler", ScoringStrategy::LeastAllocated);
        let incoming = pod("p", "2", 10, T1);
        let nodes = [a];
        let snapshot = super::super::framework::Snapshot { nodes: &nodes };
        let mut state = CycleState::default();
        profile.pre_filter(&mut state, &incoming, &snapshot).unwrap();
        let feasible = profile.find_feasible(&state, &incoming, &snapshot, 0, &nominated);
        assert!(feasible.nodes.is_empty());
        let err = find_candidate(&profile, &state, &incoming, &nodes, &feasible.failures, &[], &nominated).unwrap_err();
        assert_eq!(err.to_string(), "preemption: 0/1 nodes are available: 1 Insufficient cpu.");
    }

    #[test]
    fn enough_candidates_as_upstream() {
        assert_eq!(candidates_to_find(3), 3);
        assert_eq!(candidates_to_find(500), 100);
        assert_eq!(candidates_to_find(5000), 500);
    }

    #[test]
    fn later_started_victims_are_preferred() {
        let mut a = node("a", "2");
        a.add_pod(pod("old", "2", 1, T1));
        let mut b = node("b", "2");
        b.add_pod(pod("new", "2", 1, T2));
        let c = attempt(&[a, b], &pod("p", "2", 10, T1), &[]).unwrap();
        assert_eq!(c.node, "b");
    }

    #[test]
    fn messages_when_preemption_cannot_help() {
        let mut a = node("a", "2");
        a.add_pod(pod("same", "2", 10, T1));
        let mut b = node("b", "1");
        b.add_pod(pod("tiny", "500m", 0, T1));
        let err = attempt(&[a.clone(), b], &pod("p", "2", 10, T1), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "preemption: 0/2 nodes are available: 1 Insufficient cpu, 1 No preemption victims found for incoming pod."
        );
        let tainted: Node = serde_json::from_value(json!({
            "metadata": {"name": "t"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "8", "pods": "110"}}
        }))
        .unwrap();
        let err = attempt(&[a, NodeInfo::new(Arc::new(tainted))], &pod("p", "4", 10, T1), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn preemption_sees_anti_affinity_victims() {
        let mut a = node("a", "8");
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "p", "labels": {"app": "web"}},
            "spec": {"priority": 10, "containers": [{"name": "c"}], "affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}}
        }))
        .unwrap();
        let mut low: Pod = (*pod("low", "1", 0, T1).pod).clone();
        low.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        a.add_pod(Arc::new(PodInfo::new(Arc::new(low))));
        a.add_pod(pod("bystander", "1", 0, T1));
        let c = attempt(&[a], &Arc::new(PodInfo::new(Arc::new(p))), &[]).unwrap();
        assert_eq!(c.victims.iter().map(|v| v.uid.as_str()).collect::<Vec<_>>(), ["low"]);
    }
}
