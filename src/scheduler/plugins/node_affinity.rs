//! NodeAffinity: `spec.nodeSelector` and required node affinity filter
//! nodes; preferred node affinity terms score them by weight.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PreferredSchedulingTerm};

use crate::client::scheduling;

use crate::scheduler::framework::{
    default_normalize, node_event_passes, ClusterEvent, CycleState, EventKind, FilterPlugin, ScorePlugin, Snapshot,
    Status,
};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub const ERR_REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// A node selector term against a node.
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    scheduling::term_matches(term, node.labels(), &node.name)
}

/// nodeSelector and required node affinity, as upstream's
/// `GetRequiredNodeAffinity(pod).Match(node)`.
pub fn required_matches(pod: &PodInfo, node: &NodeInfo) -> bool {
    pod.pod.spec.as_ref().is_none_or(|spec| scheduling::required_node_affinity_matches(spec, node.labels(), &node.name))
}

pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    /// Nothing to filter for a pod with neither a nodeSelector nor required
    /// node affinity: left out of Filter, as upstream's PreFilter does.
    fn pre_filter(&self, _state: &mut CycleState, pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        let spec = pod.pod.spec.as_ref();
        let selector = spec.and_then(|s| s.node_selector.as_ref()).is_some_and(|s| !s.is_empty());
        let required = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .is_some_and(|a| a.required_during_scheduling_ignored_during_execution.is_some());
        if selector || required {
            Status::success()
        } else {
            Status::skip()
        }
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if required_matches(pod, node) {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON)
        }
    }

    fn registers(&self, kind: EventKind) -> bool {
        kind == EventKind::Node
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_event_passes(self, pod, event)
    }
}

fn preferred(pod: &PodInfo) -> &[PreferredSchedulingTerm] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_deref())
        .unwrap_or_default()
}

impl ScorePlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    /// No preferred terms: every node would score 0 (upstream skips it too).
    fn pre_score(&self, _state: &mut CycleState, pod: &PodInfo, _nodes: &[&NodeInfo], _snapshot: &Snapshot) -> Status {
        if preferred(pod).is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        preferred(pod)
            .iter()
            .filter(|t| t.weight != 0 && term_matches(&t.preference, node))
            .map(|t| i64::from(t.weight))
            .sum()
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [i64]) {
        default_normalize(scores, false);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    use super::*;
    use crate::scheduler::framework::Code;
    use crate::scheduler::plugins::node_resources_fit::ScoringStrategy;
    use crate::scheduler::profile::Profile;

    fn node(name: &str, disk: &str, spec: serde_json::Value) -> NodeInfo {
        let n: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"disk": disk}}, "spec": spec,
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
            .unwrap();
        NodeInfo::new(Arc::new(n))
    }

    fn pod(spec: serde_json::Value) -> PodInfo {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default", "uid": "p"},
            "spec": spec}))
        .unwrap();
        PodInfo::new(Arc::new(p))
    }

    /// The feasible node names, and whether NodeAffinity was left out.
    fn feasible(pod: &PodInfo, nodes: &[NodeInfo]) -> (Vec<String>, bool) {
        let profile = Profile::new("default-scheduler", ScoringStrategy::LeastAllocated);
        let snapshot = Snapshot { nodes };
        let mut state = CycleState::default();
        profile.pre_filter(&mut state, pod, &snapshot).expect("pre_filter");
        let found = profile.find_feasible(&state, pod, &snapshot, 0, &HashMap::new());
        let names = found.nodes.iter().map(|i| nodes[*i].name.clone()).collect();
        (names, state.skips_filter("NodeAffinity"))
    }

    #[test]
    fn filter_is_skipped_only_for_pods_without_selector_or_required_affinity() {
        let mut cordoned = node("c", "ssd", json!({"unschedulable": true}));
        let nodes = vec![
            node("ssd", "ssd", json!({})),
            node("hdd", "hdd", json!({})),
            node("tainted", "ssd", json!({"taints": [{"key": "k", "effect": "NoSchedule"}]})),
            cordoned.clone(),
        ];
        assert_eq!(feasible(&pod(json!({})), &nodes), (vec!["ssd".to_string(), "hdd".to_string()], true));
        assert!(feasible(&pod(json!({"nodeSelector": {}})), &nodes).1, "an empty selector selects all");
        assert_eq!(feasible(&pod(json!({"nodeSelector": {"disk": "ssd"}})), &nodes), (vec!["ssd".to_string()], false));
        let required = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]}]}}}});
        assert_eq!(feasible(&pod(required), &nodes), (vec!["hdd".to_string()], false));
        // Taints and cordoning are read from the node as it is now.
        let tolerating = pod(json!({"tolerations": [{"key": "k", "operator": "Exists"}]}));
        assert_eq!(feasible(&tolerating, &nodes).0, ["ssd", "hdd", "tainted"]);
        let uncordoned: Node = serde_json::from_value(json!({"metadata": {"name": "c", "labels": {"disk": "ssd"}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
        .unwrap();
        cordoned.set_node(Arc::new(uncordoned));
        let nodes = vec![nodes[2].clone(), cordoned];
        assert_eq!(feasible(&pod(json!({})), &nodes).0, ["c"]);
    }

    #[test]
    fn scoring_is_skipped_without_preferred_terms() {
        let (plain, nodes) = (pod(json!({})), [node("a", "ssd", json!({}))]);
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let snapshot = Snapshot { nodes: &nodes };
        assert_eq!(NodeAffinity.pre_score(&mut CycleState::default(), &plain, &refs, &snapshot).code, Code::Skip);
        let preferred = pod(json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
            [{"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}));
        assert!(NodeAffinity.pre_score(&mut CycleState::default(), &preferred, &refs, &snapshot).is_success());
        assert_eq!(NodeAffinity.score(&CycleState::default(), &preferred, &nodes[0]), 5);
    }
}
