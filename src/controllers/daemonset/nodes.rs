//! Which Nodes a DaemonSet's pod belongs on, as upstream's daemon
//! controller decides it: the template's nodeSelector and required node
//! affinity, and the Node's taints against the pod's tolerations, with the
//! tolerations upstream adds to every daemon pod. Daemon pods are pinned to
//! their Node by a required node affinity on `metadata.name`.

use crate::client::scheduling::{self, tolerates};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Toleration,
};

/// Whether a pod should be created on the node, and whether one already
/// there may stay (NoSchedule taints keep new pods off, NoExecute evicts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub should_run: bool,
    pub should_continue_running: bool,
}

/// The tolerations upstream adds to every daemon pod.
pub fn add_default_tolerations(spec: &mut PodSpec) {
    let mut defaults = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        defaults.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in defaults {
        if tolerations.iter().any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect)) {
            continue;
        }
        tolerations.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        });
    }
}

/// Pins the pod to `node` through a required `metadata.name` matchFields term.
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        match_expressions: None,
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution =
        Some(NodeSelector { node_selector_terms: vec![term] });
}

/// The Node a daemon pod is on or pinned to.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.clone().filter(|n| !n.is_empty()) {
        return Some(n);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| r.values.as_ref()?.first().cloned())
}

/// The template's nodeSelector and required node affinity admit `node`.
pub fn fits_node_selection(spec: &PodSpec, node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    scheduling::required_node_affinity_matches(spec, node.metadata.labels.as_ref(), name)
}

/// Where the daemon pod made from `spec` (with default tolerations) belongs.
pub fn placement(spec: &PodSpec, node: &Node) -> Placement {
    if !fits_node_selection(spec, node) {
        return Placement { should_run: false, should_continue_running: false };
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = |effect: &str| {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| t.effect == effect)
            .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
    };
    if untolerated("NoExecute") {
        return Placement { should_run: false, should_continue_running: false };
    }
    Placement { should_run: !untolerated("NoSchedule"), should_continue_running: true }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use kube::api::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint { key: k.to_string(), effect: e.to_string(), ..Default::default() })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn selectors_taints_and_default_tolerations() {
        let mut spec = PodSpec::default();
        add_default_tolerations(&mut spec);
        let plain = node("a", &[], &[]);
        assert!(placement(&spec, &plain).should_run);
        let not_ready = node("b", &[], &[("node.kubernetes.io/not-ready", "NoExecute")]);
        assert!(placement(&spec, &not_ready).should_run);
        let tainted = node("c", &[], &[("dedicated", "NoSchedule")]);
        assert_eq!(placement(&spec, &tainted), Placement { should_run: false, should_continue_running: true });
        let evicting = node("d", &[], &[("dedicated", "NoExecute")]);
        assert!(!placement(&spec, &evicting).should_continue_running);
        spec.node_selector = Some([("disk".to_string(), "ssd".to_string())].into_iter().collect());
        assert!(!placement(&spec, &plain).should_run);
        assert!(placement(&spec, &node("e", &[("disk", "ssd")], &[])).should_run);
        pin_to_node(&mut spec, "e");
        assert!(!placement(&spec, &node("f", &[("disk", "ssd")], &[])).should_run);
        let pod = Pod { spec: Some(spec), ..Default::default() };
        assert_eq!(target_node(&pod).as_deref(), Some("e"));
    }
}
