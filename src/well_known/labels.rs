//! Node labels a kubelet may set on its own Node, as upstream's kubelet
//! well-known labels list them and NodeRestriction enforces them: the
//! node role keeps back what it may not set, the API server refuses it.

/// Label namespace no kubelet may set: the administrator's, for
/// placement the nodes cannot claim for themselves.
const NODE_RESTRICTION_LABELS: &str = "node-restriction.kubernetes.io";

/// The labels a kubelet sets on its own Node (upstream's `kubeletapis`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];
/// Label namespaces a kubelet may use freely.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn label_namespace(key: &str) -> &str {
    key.split_once('/').map(|(ns, _)| ns).unwrap_or_default()
}

fn in_domain(namespace: &str, domain: &str) -> bool {
    namespace == domain || namespace.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.'))
}

/// Whether a kubelet may set this label on its Node, as upstream's
/// `IsKubeletLabel` and NodeRestriction's forbidden labels decide.
pub fn kubelet_may_set_label(key: &str) -> bool {
    let ns = label_namespace(key);
    if in_domain(ns, NODE_RESTRICTION_LABELS) {
        return false;
    }
    let kubernetes = in_domain(ns, "kubernetes.io") || in_domain(ns, "k8s.io");
    !kubernetes || KUBELET_LABELS.contains(&key) || KUBELET_LABEL_NAMESPACES.iter().any(|d| in_domain(ns, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_labels() {
        for ok in [
            "kubernetes.io/hostname",
            "kubernetes.io/arch",
            "beta.kubernetes.io/os",
            "node.kubernetes.io/instance-type",
            "node.kubernetes.io/anything",
            "topology.kubernetes.io/zone",
            "kubelet.kubernetes.io/x",
            "site",
            "example.com/rack",
        ] {
            assert!(kubelet_may_set_label(ok), "{ok}");
        }
        for bad in [
            "node-restriction.kubernetes.io/trusted",
            "x.node-restriction.kubernetes.io/a",
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/other",
            "topology.kubernetes.io/rack",
            "k8s.io/x",
            "foo.k8s.io/y",
        ] {
            assert!(!kubelet_may_set_label(bad), "{bad}");
        }
        // A domain that merely ends in the same letters is not a subdomain.
        assert!(kubelet_may_set_label("notkubernetes.io/x"));
    }
}
