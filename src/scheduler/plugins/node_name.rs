//! NodeName: a pod that names its node fits only there.

use crate::scheduler::framework::{node_event_passes, ClusterEvent, CycleState, EventKind, FilterPlugin, Status};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub struct NodeName;

impl FilterPlugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match pod.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) {
            Some(wanted) if wanted != node.name => Status::unresolvable("node(s) didn't match the requested node name"),
            _ => Status::success(),
        }
    }

    fn registers(&self, kind: EventKind) -> bool {
        kind == EventKind::Node
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_event_passes(self, pod, event)
    }
}
