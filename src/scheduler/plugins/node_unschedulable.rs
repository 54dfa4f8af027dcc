//! NodeUnschedulable: cordoned nodes (`spec.unschedulable`) take only pods
//! that tolerate the `node.kubernetes.io/unschedulable:NoSchedule` taint.

use k8s_openapi::api::core::v1::Taint;

use super::taint_toleration::{tolerates, tolerations};
use crate::scheduler::framework::{node_event_passes, ClusterEvent, CycleState, EventKind, FilterPlugin, Status};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub struct NodeUnschedulable;

impl FilterPlugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if !node.unschedulable {
            return Status::success();
        }
        let taint =
            Taint { key: "node.kubernetes.io/unschedulable".into(), effect: "NoSchedule".into(), ..Default::default() };
        if tolerations(pod).iter().any(|t| tolerates(t, &taint)) {
            Status::success()
        } else {
            Status::unresolvable("node(s) were unschedulable")
        }
    }

    fn registers(&self, kind: EventKind) -> bool {
        kind == EventKind::Node
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_event_passes(self, pod, event)
    }
}
