//! Update predicates for informer subscriptions (controller-runtime's
//! predicates): which updates a component may ignore. A node's kubelet
//! rewrites its Node's condition heartbeats and renews its Lease every few
//! seconds; only node lifecycle reads those, and every other component
//! that watches Nodes or Leases skips them.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;

/// `new` differs from `old` only in resourceVersion, managedFields and the
/// conditions' `lastHeartbeatTime` (a heartbeat).
pub fn node_heartbeat_only(old: &Node, new: &Node) -> bool {
    fn without_heartbeat(node: &Node) -> Node {
        let mut n = node.clone();
        n.metadata.resource_version = None;
        n.metadata.managed_fields = None;
        if let Some(conditions) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.iter_mut().for_each(|c| c.last_heartbeat_time = None);
        }
        n
    }
    without_heartbeat(old) == without_heartbeat(new)
}

/// `new` differs from `old` only in resourceVersion, managedFields and
/// `spec.renewTime` (a renewal by the same holder).
pub fn lease_renewal_only(old: &Lease, new: &Lease) -> bool {
    fn without_renewal(lease: &Lease) -> Lease {
        let mut l = lease.clone();
        l.metadata.resource_version = None;
        l.metadata.managed_fields = None;
        if let Some(spec) = l.spec.as_mut() {
            spec.renew_time = None;
        }
        l
    }
    without_renewal(old) == without_renewal(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use k8s_openapi::jiff::Timestamp;

    fn node(rv: &str, heartbeat: i64, ready: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.resource_version = Some(rv.into());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(Time(Timestamp::from_second(heartbeat).unwrap())),
                last_transition_time: Some(Time(Timestamp::from_second(1).unwrap())),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    #[test]
    fn a_node_heartbeat_is_only_a_heartbeat() {
        let old = node("1", 10, "True");
        assert!(node_heartbeat_only(&old, &node("2", 20, "True")));
        assert!(!node_heartbeat_only(&old, &node("2", 20, "False")));
        let mut tainted = node("2", 20, "True");
        tainted.spec = Some(NodeSpec { unschedulable: Some(true), ..Default::default() });
        assert!(!node_heartbeat_only(&old, &tainted));
        let mut labelled = node("2", 10, "True");
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(!node_heartbeat_only(&old, &labelled));
    }

    #[test]
    fn a_lease_renewal_is_only_a_renewal() {
        let lease = |rv: &str, holder: &str, at: i64| {
            let mut l = Lease::default();
            l.metadata.resource_version = Some(rv.into());
            l.spec = Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(Timestamp::from_second(at).unwrap())),
                ..Default::default()
            });
            l
        };
        assert!(lease_renewal_only(&lease("1", "a", 1), &lease("2", "a", 2)));
        assert!(!lease_renewal_only(&lease("1", "a", 1), &lease("2", "b", 2)));
    }
}
