//! NodeResourcesFit: a pod fits where the node's allocatable covers what its
//! pods already request plus this pod's requests; nodes score by the
//! LeastAllocated (default) or MostAllocated strategy over CPU and memory.

use crate::scheduler::framework::{
    ClusterEvent, CycleState, EventKind, FilterPlugin, ScorePlugin, Status, MAX_NODE_SCORE,
};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoringStrategy {
    LeastAllocated,
    MostAllocated,
}

pub struct NodeResourcesFit {
    pub strategy: ScoringStrategy,
}

/// Every resource the node lacks for the pod, in upstream's words.
pub fn insufficient(pod: &PodInfo, node: &NodeInfo) -> Vec<String> {
    let mut reasons = Vec::new();
    let (alloc, used, want) = (&node.allocatable, &node.requested, &pod.requests);
    if used.pods + 1 > alloc.pods {
        reasons.push("Too many pods".to_string());
    }
    if want.is_zero() {
        return reasons;
    }
    if want.milli_cpu > 0 && want.milli_cpu > alloc.milli_cpu - used.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if want.memory > 0 && want.memory > alloc.memory - used.memory {
        reasons.push("Insufficient memory".into());
    }
    if want.ephemeral_storage > 0 && want.ephemeral_storage > alloc.ephemeral_storage - used.ephemeral_storage {
        reasons.push("Insufficient ephemeral-storage".into());
    }
    for (name, amount) in &want.scalar {
        let free = alloc.scalar.get(name).copied().unwrap_or(0) - used.scalar.get(name).copied().unwrap_or(0);
        if *amount > 0 && *amount > free {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    reasons
}

impl FilterPlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let reasons = insufficient(pod, node);
        if reasons.is_empty() {
            Status::success()
        } else {
            Status { code: crate::scheduler::framework::Code::Unschedulable, reasons, plugin: "" }
        }
    }

    /// A node event helps where the pod fits now; any placed pod leaving
    /// frees at least a pod slot; a pod placed never helps.
    fn registers(&self, kind: EventKind) -> bool {
        kind != EventKind::AssignedPodAdded
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        match event {
            ClusterEvent::Node(node) => insufficient(pod, node).is_empty(),
            ClusterEvent::AssignedPodDeleted(_) => true,
            ClusterEvent::AssignedPodAdded(_) => false,
        }
    }
}

fn least_allocated(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

fn most_allocated(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 {
        return 0;
    }
    requested.min(capacity) * MAX_NODE_SCORE / capacity
}

impl ScorePlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let f = match self.strategy {
            ScoringStrategy::LeastAllocated => least_allocated,
            ScoringStrategy::MostAllocated => most_allocated,
        };
        let cpu = f(node.non_zero_requested.milli_cpu + pod.non_zero_requests.milli_cpu, node.allocatable.milli_cpu);
        let memory = f(node.non_zero_requested.memory + pod.non_zero_requests.memory, node.allocatable.memory);
        // CPU and memory weigh 1 each, as upstream's default resources.
        (cpu + memory) / 2
    }
}

/// NodeResourcesBalancedAllocation: nodes where CPU and memory would be used
/// in similar fractions score higher.
pub struct BalancedAllocation;

impl ScorePlugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let fraction = |requested: i64, capacity: i64| {
            if capacity == 0 {
                0.0
            } else {
                (requested as f64 / capacity as f64).min(1.0)
            }
        };
        let cpu = fraction(node.requested.milli_cpu + pod.requests.milli_cpu, node.allocatable.milli_cpu);
        let memory = fraction(node.requested.memory + pod.requests.memory, node.allocatable.memory);
        // The standard deviation of two fractions is half their distance.
        let std = (cpu - memory).abs() / 2.0;
        ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_scores() {
        assert_eq!(least_allocated(0, 4000), 100);
        assert_eq!(least_allocated(3000, 4000), 25);
        assert_eq!(least_allocated(5000, 4000), 0);
        assert_eq!(most_allocated(3000, 4000), 75);
        assert_eq!(most_allocated(1, 0), 0);
    }
}
