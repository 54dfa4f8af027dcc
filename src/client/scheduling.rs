//! The scheduling predicates the scheduler and controllers share, as
//! upstream's component-helpers: whether a toleration tolerates a taint, and
//! whether a pod's nodeSelector and required node affinity admit a node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration};

/// Upstream's `Toleration.ToleratesTaint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if toleration.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        _ => false,
    }
}

/// One node selector requirement against a label (or field) value.
fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(number), values.first().and_then(|s| number(s))) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// A term matches when all its label and field requirements do; a term with
/// none matches nothing, as upstream.
pub fn term_matches(term: &NodeSelectorTerm, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement(r, Some(name)))
}

/// nodeSelector and required node affinity, as upstream's
/// `GetRequiredNodeAffinity(pod).Match(node)`.
pub fn required_node_affinity_matches(spec: &PodSpec, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
    let selector_ok = spec.node_selector.iter().flatten().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    let affinity_ok = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
        .is_none_or(|s| s.node_selector_terms.iter().any(|t| term_matches(t, labels, name)));
    selector_ok && affinity_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(json: serde_json::Value) -> Toleration {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn tolerations_as_upstream() {
        let taint =
            Taint { key: "k".into(), value: Some("v".into()), effect: "NoSchedule".into(), ..Default::default() };
        assert!(tolerates(&tol(serde_json::json!({"key": "k", "value": "v"})), &taint));
        assert!(tolerates(&tol(serde_json::json!({"operator": "Exists"})), &taint));
        assert!(!tolerates(&tol(serde_json::json!({"key": "k", "value": "w"})), &taint));
        assert!(!tolerates(&tol(serde_json::json!({"key": "k", "operator": "Exists", "effect": "NoExecute"})), &taint));
    }

    #[test]
    fn node_affinity_terms() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [],
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["2"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
            ]}}}
        }))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(required_node_affinity_matches(&spec, Some(&labels(&[("disk", "ssd"), ("cores", "4")])), "a"));
        assert!(required_node_affinity_matches(&spec, Some(&labels(&[("disk", "ssd")])), "special"));
        assert!(!required_node_affinity_matches(&spec, Some(&labels(&[("disk", "ssd"), ("cores", "2")])), "a"));
        assert!(!required_node_affinity_matches(&spec, Some(&labels(&[("cores", "4")])), "a"));
    }
}
