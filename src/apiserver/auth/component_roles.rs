//! The roles of the control-plane components that act as users of their
//! own: `system:kube-scheduler` and `system:volume-scheduler` (bound to the
//! user `system:kube-scheduler`) and `system:kube-controller-manager`
//! (bound to the user of that name), as upstream's bootstrap policy grants;
//! and `system:ferrok:node`, bound to the group `system:nodes`.

use serde_json::{json, Value};

use super::rbac::rule;

const READ: &[&str] = &["get", "list", "watch"];

fn named(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "resourceNames": names, "verbs": verbs})
}

pub fn kube_scheduler() -> Vec<Value> {
    vec![
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        named(&["coordination.k8s.io"], &["leases"], &["kube-scheduler"], &["get", "update"]),
        rule(&[""], &["nodes"], READ),
        rule(&[""], &["pods"], &["delete", "get", "list", "watch"]),
        rule(&[""], &["bindings", "pods/binding"], &["create"]),
        rule(&[""], &["pods/status"], &["patch", "update"]),
        rule(&[""], &["replicationcontrollers", "services"], READ),
        rule(&["apps", "extensions"], &["replicasets"], READ),
        rule(&["apps"], &["statefulsets"], READ),
        rule(&["policy"], &["poddisruptionbudgets"], READ),
        rule(&[""], &["persistentvolumeclaims", "persistentvolumes"], READ),
        rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
        rule(&["storage.k8s.io"], &["csinodes"], READ),
        rule(&[""], &["namespaces"], READ),
        rule(&["storage.k8s.io"], &["csidrivers"], READ),
        rule(&["storage.k8s.io"], &["csistoragecapacities"], READ),
    ]
}

pub fn volume_scheduler() -> Vec<Value> {
    vec![
        rule(&[""], &["persistentvolumes"], &["get", "list", "patch", "update", "watch"]),
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        rule(&[""], &["persistentvolumeclaims"], &["get", "list", "patch", "update", "watch"]),
    ]
}

/// What the controller manager itself does under its own name: the shared
/// informers (list and watch of everything), its leader-election Lease,
/// and the service accounts its controllers act as. Each controller's
/// writes go through its own `system:controller:<name>` role.
pub fn kube_controller_manager() -> Vec<Value> {
    vec![
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        named(&["coordination.k8s.io"], &["leases"], &["kube-controller-manager"], &["get", "update"]),
        rule(&[""], &["secrets", "serviceaccounts"], &["create"]),
        rule(&[""], &["secrets"], &["delete"]),
        rule(&[""], &["configmaps", "namespaces", "secrets", "serviceaccounts"], &["get"]),
        rule(&[""], &["secrets", "serviceaccounts"], &["update"]),
        rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
        rule(&["*"], &["*"], &["list", "watch"]),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
    ]
}

/// What ferrok's node role needs beyond a kubelet's rights, for the parts
/// k3s runs under identities of their own: the service proxy (kube-proxy's
/// `system:node-proxier`: services, endpoint slices, nodes), cluster DNS
/// (services, endpoint slices) and network-policy enforcement (k3s'
/// kube-router: pods, namespaces, network policies, in every namespace);
/// and the RuntimeClasses of its runtime handlers, which it creates (only
/// plain ones named after their handler: NodeRestriction). Services,
/// nodes and pods every kubelet may read already (the Node authorizer's
/// rules). The reads are cluster-wide: these parts program every Service
/// and every pod's policy, not only the node's own pods. Nothing here
/// reaches secrets, config maps or another node's writes.
pub fn ferrok_node() -> Vec<Value> {
    vec![
        rule(&[""], &["namespaces"], READ),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
        rule(&["networking.k8s.io"], &["networkpolicies"], READ),
        rule(&["node.k8s.io"], &["runtimeclasses"], &["create"]),
    ]
}
