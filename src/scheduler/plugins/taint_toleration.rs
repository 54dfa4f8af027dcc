//! TaintToleration: a pod fits a node only if it tolerates the node's
//! NoSchedule and NoExecute taints; nodes with fewer untolerated
//! PreferNoSchedule taints score higher.

use k8s_openapi::api::core::v1::{Taint, Toleration};

pub use crate::client::scheduling::tolerates;

use crate::scheduler::framework::{
    default_normalize, node_event_passes, ClusterEvent, CycleState, EventKind, FilterPlugin, ScorePlugin, Status,
};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub fn tolerations(pod: &PodInfo) -> &[Toleration] {
    pod.pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default()
}

pub fn taints(node: &NodeInfo) -> &[Taint] {
    &node.taints
}

pub struct TaintToleration;

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let tolerations = tolerations(pod);
        let untolerated = taints(node).iter().find(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") && !tolerations.iter().any(|tol| tolerates(tol, t))
        });
        match untolerated {
            Some(t) => Status::unresolvable(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or_default()
            )),
            None => Status::success(),
        }
    }

    fn registers(&self, kind: EventKind) -> bool {
        kind == EventKind::Node
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_event_passes(self, pod, event)
    }
}

impl ScorePlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        // Only tolerations that apply to PreferNoSchedule count here.
        let tolerations: Vec<&Toleration> = tolerations(pod)
            .iter()
            .filter(|t| t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "PreferNoSchedule"))
            .collect();
        taints(node)
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule" && !tolerations.iter().any(|tol| tolerates(tol, t)))
            .count() as i64
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [i64]) {
        default_normalize(scores, true);
    }
}
