//! metav1.LabelSelector as controllers and the scheduler use it: matching a
//! selector against an object's labels, and writing it as the string form
//! that list and watch requests take.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Whether `labels` satisfy `selector`. An empty selector matches everything,
/// as upstream's `LabelSelectorAsSelector` makes it.
pub fn matches(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let by_label = selector.match_labels.as_ref().is_none_or(|m| matches_map(m, labels));
    by_label && selector.match_expressions.iter().flatten().all(|r| requirement(r, labels.and_then(|l| l.get(&r.key))))
}

/// Whether `labels` hold every pair of `selector`: a map selector, as a
/// Service's and matchLabels are (empty matches everything).
pub fn matches_map(selector: &BTreeMap<String, String>, labels: Option<&BTreeMap<String, String>>) -> bool {
    selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn requirement(r: &LabelSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether the selector selects nothing at all (`null` in upstream terms is
/// `None` here; callers decide what a missing selector means).
pub fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// The selector as a `labelSelector=` query string: `a=b,c in (d,e),!f`.
pub fn to_query(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector.match_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    for r in selector.match_expressions.iter().flatten() {
        let values = r.values.as_deref().unwrap_or_default().join(",");
        parts.push(match r.operator.as_str() {
            "In" => format!("{} in ({values})", r.key),
            "NotIn" => format!("{} notin ({values})", r.key),
            "Exists" => r.key.clone(),
            _ => format!("!{}", r.key),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selectors_match_as_upstream() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "edge"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["a"]}
            ]
        }))
        .unwrap();
        assert!(matches(&sel, Some(&labels(&[("app", "web"), ("tier", "front")]))));
        assert!(matches(&sel, Some(&labels(&[("app", "web"), ("tier", "edge"), ("zone", "b")]))));
        assert!(!matches(&sel, Some(&labels(&[("app", "web"), ("tier", "front"), ("canary", "1")]))));
        assert!(!matches(&sel, Some(&labels(&[("app", "web"), ("tier", "front"), ("zone", "a")]))));
        assert!(!matches(&sel, None));
        assert!(matches(&LabelSelector::default(), None));
        assert_eq!(to_query(&sel), "app=web,tier in (front,edge),!canary,zone notin (a)");
    }
}
