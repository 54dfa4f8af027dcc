//! NodePorts: a pod asking for host ports fits only where they are free.

use crate::scheduler::framework::{ClusterEvent, CycleState, EventKind, FilterPlugin, Status};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub struct NodePorts;

/// Two host ports clash on the same protocol and port when their addresses
/// are the same or either is the wildcard.
pub fn conflicts(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

impl FilterPlugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let clash = pod.host_ports.iter().any(|want| node.used_ports.iter().any(|used| conflicts(want, used)));
        if clash {
            Status::unschedulable("node(s) didn't have free ports for the requested pod ports")
        } else {
            Status::success()
        }
    }

    /// A node event helps where the ports are free; a pod leaving helps
    /// when it held a port this pod wants.
    fn registers(&self, kind: EventKind) -> bool {
        kind != EventKind::AssignedPodAdded
    }

    fn is_schedulable_after(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        match event {
            ClusterEvent::Node(node) => self.filter(&CycleState::default(), pod, node).is_success(),
            ClusterEvent::AssignedPodDeleted(gone) => {
                gone.host_ports.iter().any(|held| pod.host_ports.iter().any(|want| conflicts(want, held)))
            }
            ClusterEvent::AssignedPodAdded(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::conflicts;

    #[test]
    fn wildcard_addresses_clash_with_all() {
        let p = |proto: &str, ip: &str, port| (proto.to_string(), ip.to_string(), port);
        assert!(conflicts(&p("TCP", "0.0.0.0", 80), &p("TCP", "10.0.0.1", 80)));
        assert!(!conflicts(&p("TCP", "10.0.0.2", 80), &p("TCP", "10.0.0.1", 80)));
        assert!(!conflicts(&p("UDP", "0.0.0.0", 80), &p("TCP", "0.0.0.0", 80)));
    }
}
