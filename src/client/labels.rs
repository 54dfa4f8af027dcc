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

/// What `from_query` cannot read, naming the part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("invalid requirement {0:?}")]
    InvalidRequirement(String),
    #[error("unknown operator {operator:?} in {part:?}")]
    UnknownOperator { operator: String, part: String },
    #[error("unclosed value list in {0:?}")]
    UnclosedValues(String),
}

/// A selector in the string form of `to_query` (a Scale's
/// `status.selector`, a `labelSelector=` parameter) read back: `a=b`,
/// `a==b`, `a!=b`, `a in (b,c)`, `a notin (b)`, `a`, `!a`. What it cannot
/// read is an error naming the part.
pub fn from_query(s: &str) -> Result<LabelSelector, QueryError> {
    let mut selector = LabelSelector::default();
    let mut add = |key: &str, operator: &str, values: Option<Vec<String>>| {
        selector.match_expressions.get_or_insert_with(Vec::new).push(LabelSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values,
        })
    };
    for part in split_requirements(s) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let valid_key = |k: &str| !k.is_empty() && !k.contains(|c: char| c.is_whitespace() || "=!(),".contains(c));
        if let Some(key) = part.strip_prefix('!') {
            let key = key.trim();
            if !valid_key(key) {
                return Err(QueryError::InvalidRequirement(part.to_string()));
            }
            add(key, "DoesNotExist", None);
        } else if let Some((key, value)) = part.split_once("!=") {
            add(key.trim(), "NotIn", Some(vec![value.trim().to_string()]));
        } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) || value.contains(|c: char| c.is_whitespace() || "=!(),".contains(c)) {
                return Err(QueryError::InvalidRequirement(part.to_string()));
            }
            selector.match_labels.get_or_insert_with(BTreeMap::new).insert(key.to_string(), value.to_string());
        } else if let Some(open) = part.find('(') {
            let (head, rest) = part.split_at(open);
            let mut words = head.split_whitespace();
            let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
                return Err(QueryError::InvalidRequirement(part.to_string()));
            };
            let operator = match op {
                "in" => "In",
                "notin" => "NotIn",
                _ => return Err(QueryError::UnknownOperator { operator: op.to_string(), part: part.to_string() }),
            };
            let Some(inner) = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')) else {
                return Err(QueryError::UnclosedValues(part.to_string()));
            };
            let values = inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect();
            add(key, operator, Some(values));
        } else if valid_key(part) {
            add(part, "Exists", None);
        } else {
            return Err(QueryError::InvalidRequirement(part.to_string()));
        }
    }
    Ok(selector)
}

/// The requirements of a selector string: its parts split at the commas
/// outside parentheses.
fn split_requirements(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
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
        let back = from_query(&to_query(&sel)).unwrap();
        assert_eq!(to_query(&back), to_query(&sel));
        let sel = from_query("a==b, c!=d,e").unwrap();
        assert!(matches(&sel, Some(&labels(&[("a", "b"), ("e", "")]))));
        assert!(!matches(&sel, Some(&labels(&[("a", "b"), ("c", "d"), ("e", "")]))));
        assert!(from_query("a in (b").is_err());
        assert!(from_query("a b").is_err());
        assert!(from_query("").unwrap().match_labels.is_none());
    }
}
