//! The Node authorizer, as upstream's `--authorization-mode=Node`: a
//! kubelet (user `system:node:<name>` in group `system:nodes`) may read the
//! secrets, config maps, persistent volume claims and volumes, resource
//! claims and service-account tokens of the pods bound to its node, and
//! nothing else of those kinds; (ferrok's addition) read, watch one at a
//! time and delete the local-path volumes pinned to it, which its node
//! role removes once released (NodeRestriction: released ones only); its Lease only in kube-node-lease; and what
//! the `system:node` rules give every node (read services, nodes and pods,
//! write Nodes, pod status, events, mirror pods, CSRs, the review APIs…).
//! Which Node or pod a write touches is the NodeRestriction admission
//! plugin's business (`admission::node_restriction`).
//!
//! The authorizer answers Allow or "no opinion" (with upstream's reason);
//! with no opinion, RBAC decides.

use std::sync::OnceLock;

use serde_json::Value;

use super::node_graph::{self, NodeGraph};
use super::rbac::{rule, rule_allows, Attributes};
use super::User;
use crate::well_known::users::{NODES_GROUP, NODE_USER_PREFIX};

/// Where node Leases live.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node a user is the kubelet of: `system:node:<name>` in `system:nodes`
/// (upstream's default node identifier).
pub fn node_identity(user: &User) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    (user.in_group(NODES_GROUP) && !name.is_empty()).then_some(name)
}

/// What the Node authorizer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDecision {
    Allow,
    /// Upstream's DecisionNoOpinion, with its reason (empty when it has none).
    NoOpinion(String),
}

fn no(reason: impl Into<String>) -> NodeDecision {
    NodeDecision::NoOpinion(reason.into())
}

/// The rules every node has, as upstream's `NodeRules` (the `system:node`
/// ClusterRole, which upstream leaves unbound). Secrets, config maps,
/// claims, volumes, service-account tokens, leases and CSINodes are
/// decided by the graph and by name instead.
pub fn node_rules() -> &'static [Value] {
    static RULES: OnceLock<Vec<Value>> = OnceLock::new();
    RULES.get_or_init(|| {
        const READ: &[&str] = &["get", "list", "watch"];
        vec![
            // Delegated authentication and authorization of the kubelet API.
            rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
            rule(&["authorization.k8s.io"], &["subjectaccessreviews", "localsubjectaccessreviews"], &["create"]),
            // Service environment variables.
            rule(&[""], &["services"], READ),
            // Its Node and its status (NodeRestriction: its own only).
            rule(&[""], &["nodes"], &["create", "get", "list", "watch"]),
            rule(&[""], &["nodes/status"], &["update", "patch"]),
            rule(&[""], &["nodes"], &["update", "patch"]),
            rule(&[""], &["events"], &["create", "update", "patch"]),
            rule(&[""], &["pods"], READ),
            // Mirror pods, pod status and evictions (NodeRestriction: its pods only).
            rule(&[""], &["pods"], &["create", "delete"]),
            rule(&[""], &["pods/status"], &["update", "patch"]),
            rule(&[""], &["pods/eviction"], &["create"]),
            rule(&[""], &["endpoints"], &["get"]),
            // Client certificate rotation.
            rule(&["certificates.k8s.io"], &["certificatesigningrequests"], &["create", "get", "list", "watch"]),
            rule(&["storage.k8s.io"], &["csidrivers"], READ),
            rule(&["node.k8s.io"], &["runtimeclasses"], READ),
        ]
    })
}

/// Upstream's `authorizeReadNamespacedObject`: get, or list and watch of
/// one object (`fieldSelector=metadata.name=…`), of something a pod of the
/// node references.
fn read_namespaced(node: &str, kind: &str, a: &Attributes, graph: &NodeGraph) -> NodeDecision {
    if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
        return no("can only read resources of this type");
    }
    if !a.subresource.is_empty() {
        return no("cannot read subresource");
    }
    if a.namespace.is_empty() {
        return no("can only read namespaced object of this type");
    }
    related(node, kind, a, graph)
}

/// Upstream's `authorizeGet`: get only, no subresource.
fn get_only(node: &str, kind: &str, a: &Attributes, graph: &NodeGraph) -> NodeDecision {
    if a.verb != "get" {
        return no("can only get individual resources of this type");
    }
    if !a.subresource.is_empty() {
        return no("cannot get subresource");
    }
    related(node, kind, a, graph)
}

fn unrelated(node: &str) -> NodeDecision {
    no(format!("no relationship found between node '{node}' and this object"))
}

fn related(node: &str, kind: &str, a: &Attributes, graph: &NodeGraph) -> NodeDecision {
    if a.name.is_empty() {
        return no("No Object name found");
    }
    let found = match kind {
        "persistentvolumes" => graph.volume_used_by_node(node, &a.name),
        _ => graph.referenced_by_node(node, kind, &a.namespace, &a.name),
    };
    if found {
        NodeDecision::Allow
    } else {
        unrelated(node)
    }
}

/// Whether the Node authorizer allows the kubelet of `node` the request.
pub fn authorize(node: &str, a: &Attributes, graph: &NodeGraph) -> NodeDecision {
    if a.path.is_some() {
        return no("");
    }
    match (a.group.as_str(), a.resource.as_str()) {
        ("", node_graph::SECRETS) | ("", node_graph::CONFIG_MAPS) => read_namespaced(node, &a.resource, a, graph),
        ("", node_graph::CLAIMS) if a.subresource == "status" => {
            if !matches!(a.verb.as_str(), "update" | "patch") {
                return no("can only get/update/patch this type");
            }
            related(node, node_graph::CLAIMS, a, graph)
        }
        ("", node_graph::CLAIMS) => get_only(node, node_graph::CLAIMS, a, graph),
        ("", "persistentvolumes") => volume(node, a, graph),
        ("resource.k8s.io", node_graph::RESOURCE_CLAIMS) => get_only(node, node_graph::RESOURCE_CLAIMS, a, graph),
        ("", node_graph::SERVICE_ACCOUNTS) => {
            if a.verb != "create" || a.name.is_empty() {
                return no("can only create tokens for individual service accounts");
            }
            if a.subresource != "token" {
                return no("can only create token subresource of serviceaccount");
            }
            related(node, node_graph::SERVICE_ACCOUNTS, a, graph)
        }
        ("coordination.k8s.io", "leases") => lease(node, a),
        ("storage.k8s.io", "csinodes") => csi_node(node, a),
        _ if node_rules().iter().any(|r| rule_allows(r, a)) => NodeDecision::Allow,
        _ => no(""),
    }
}

/// A volume a pod of the node uses: get only. A local-path volume pinned to
/// the node: get, list and watch by name, and delete (NodeRestriction
/// checks that it is released).
fn volume(node: &str, a: &Attributes, graph: &NodeGraph) -> NodeDecision {
    let local = matches!(a.verb.as_str(), "get" | "list" | "watch" | "delete")
        && a.subresource.is_empty()
        && !a.name.is_empty()
        && graph.local_volume_of_node(node, &a.name);
    if local {
        return NodeDecision::Allow;
    }
    get_only(node, "persistentvolumes", a, graph)
}

fn lease(node: &str, a: &Attributes) -> NodeDecision {
    if !matches!(a.verb.as_str(), "get" | "create" | "update" | "patch" | "delete") {
        return no("can only get, create, update, patch, or delete a node lease");
    }
    if a.namespace != NODE_LEASE_NAMESPACE {
        return no(format!("can only access leases in the \"{NODE_LEASE_NAMESPACE}\" system namespace"));
    }
    // A create names its lease in the body: NodeRestriction checks it.
    if a.verb != "create" && a.name != node {
        return no("can only access node lease with the same name as the requesting node");
    }
    NodeDecision::Allow
}

fn csi_node(node: &str, a: &Attributes) -> NodeDecision {
    if !matches!(a.verb.as_str(), "get" | "create" | "update" | "patch" | "delete") {
        return no("can only get, create, update, patch, or delete a CSINode");
    }
    if !a.subresource.is_empty() {
        return no("cannot authorize CSINode subresources");
    }
    if a.verb != "create" && a.name != node {
        return no("can only access CSINode with the same name as the requesting node");
    }
    NodeDecision::Allow
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::cache::PrefixCache;
    use serde_json::json;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            path: None,
        }
    }

    type Caches =
        (std::sync::Arc<PrefixCache<node_graph::PodEdges>>, std::sync::Arc<PrefixCache>, std::sync::Arc<PrefixCache>);

    fn graph_with(objects: &[Value]) -> Caches {
        let p = PrefixCache::projected("/registry/pods/", node_graph::parse_pod_edges);
        let v = PrefixCache::projected("/registry/persistentvolumes/", node_graph::parse_volume_edges);
        for obj in objects {
            if obj["kind"] == "PersistentVolume" {
                v.apply_for_test(obj)
            } else {
                p.apply_for_test(obj)
            }
        }
        (p, PrefixCache::projected("/registry/persistentvolumeclaims/", node_graph::parse_claim_edges), v)
    }

    #[test]
    fn only_kubelets_are_nodes() {
        let user = |name: &str, groups: &[&str]| User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        assert_eq!(node_identity(&user("system:node:n1", &["system:nodes"])), Some("n1"));
        assert_eq!(node_identity(&user("system:node:n1", &["system:authenticated"])), None);
        assert_eq!(node_identity(&user("system:node:", &["system:nodes"])), None);
        assert_eq!(node_identity(&user("alice", &["system:nodes"])), None);
    }

    #[test]
    fn secrets_follow_the_pods_of_the_node() {
        let pod = json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1",
            "serviceAccountName": "robot",
            "containers": [{"envFrom": [{"secretRef": {"name": "mine"}}]}]}});
        let (pods, claims, volumes) = graph_with(&[pod]);
        let g = NodeGraph { pods: &pods, claims: &claims, volumes: &volumes };
        let get = |node: &str, name: &str| authorize(node, &attrs("get", "", "secrets", "", "ns", name), &g);
        assert_eq!(get("n1", "mine"), NodeDecision::Allow);
        assert_eq!(get("n1", "other"), unrelated("n1"));
        assert_eq!(get("n2", "mine"), unrelated("n2"));
        // A list of everything has no name; a list of one object does.
        assert_eq!(authorize("n1", &attrs("list", "", "secrets", "", "ns", ""), &g), no("No Object name found"));
        assert_eq!(authorize("n1", &attrs("watch", "", "secrets", "", "ns", "mine"), &g), NodeDecision::Allow);
        assert_eq!(
            authorize("n1", &attrs("update", "", "secrets", "", "ns", "mine"), &g),
            no("can only read resources of this type")
        );
        let token =
            |node: &str, sa: &str| authorize(node, &attrs("create", "", "serviceaccounts", "token", "ns", sa), &g);
        assert_eq!(token("n1", "robot"), NodeDecision::Allow);
        assert_eq!(token("n1", "default"), unrelated("n1"));
        assert_eq!(token("n2", "robot"), unrelated("n2"));
    }

    #[test]
    fn leases_and_static_rules() {
        let (pods, claims, volumes) = graph_with(&[]);
        let g = NodeGraph { pods: &pods, claims: &claims, volumes: &volumes };
        let lease = |verb: &str, ns: &str, name: &str| {
            authorize("n1", &attrs(verb, "coordination.k8s.io", "leases", "", ns, name), &g)
        };
        assert_eq!(lease("update", "kube-node-lease", "n1"), NodeDecision::Allow);
        assert_eq!(lease("create", "kube-node-lease", ""), NodeDecision::Allow);
        assert!(matches!(lease("update", "kube-node-lease", "n2"), NodeDecision::NoOpinion(_)));
        assert!(matches!(lease("get", "kube-system", "n1"), NodeDecision::NoOpinion(_)));
        assert!(matches!(lease("list", "kube-node-lease", ""), NodeDecision::NoOpinion(_)));
        let allowed = |verb: &str, group: &str, resource: &str, sub: &str| {
            authorize("n1", &attrs(verb, group, resource, sub, "ns", "x"), &g) == NodeDecision::Allow
        };
        assert!(allowed("patch", "", "nodes", "status",));
        assert!(allowed("update", "", "pods", "status"));
        assert!(allowed("create", "", "pods", "eviction"));
        assert!(allowed("create", "", "events", ""));
        assert!(allowed("get", "node.k8s.io", "runtimeclasses", ""));
        assert!(allowed("create", "authorization.k8s.io", "subjectaccessreviews", ""));
        assert!(!allowed("update", "", "pods", ""));
        assert!(!allowed("delete", "", "nodes", ""));
        assert!(!allowed("get", "rbac.authorization.k8s.io", "roles", ""));
        assert!(!allowed("create", "node.k8s.io", "runtimeclasses", ""));
    }

    #[test]
    fn a_node_reads_and_deletes_only_its_local_path_volumes() {
        let pv = |name: &str, node: &str| {
            json!({"kind": "PersistentVolume", "metadata": {"name": name,
                "annotations": {"pv.kubernetes.io/provisioned-by": "rancher.io/local-path"}},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})
        };
        let (pods, claims, volumes) = graph_with(&[pv("pvc-mine", "n1"), pv("pvc-theirs", "n2")]);
        let g = NodeGraph { pods: &pods, claims: &claims, volumes: &volumes };
        let ask = |verb: &str, name: &str| authorize("n1", &attrs(verb, "", "persistentvolumes", "", "", name), &g);
        for verb in ["get", "list", "watch", "delete"] {
            assert_eq!(ask(verb, "pvc-mine"), NodeDecision::Allow, "{verb}");
        }
        assert_eq!(ask("delete", "pvc-theirs"), no("can only get individual resources of this type"));
        assert_eq!(ask("get", "pvc-theirs"), unrelated("n1"));
        assert_eq!(ask("list", ""), no("can only get individual resources of this type"));
        assert_eq!(ask("update", "pvc-mine"), no("can only get individual resources of this type"));
    }
}
