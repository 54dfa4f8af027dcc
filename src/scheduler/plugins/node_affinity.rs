//! NodeAffinity: `spec.nodeSelector` and required node affinity filter
//! nodes; preferred node affinity terms score them by weight.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PreferredSchedulingTerm};

use crate::client::scheduling;

use crate::scheduler::framework::{
    default_normalize, node_event_passes, ClusterEvent, CycleState, EventKind, FilterPlugin, ScorePlugin, Status,
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
