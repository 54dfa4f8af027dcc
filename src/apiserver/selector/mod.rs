//! Label and field selectors as list and watch requests give them
//! (upstream's `labels` and `fields` packages): the label selector syntax
//! (`label_parser`), and the fields each kind can be selected by
//! (`selectable_fields`).

pub mod label_parser;
pub mod selectable_fields;

use serde_json::Value;

use label_parser::Operator;
use selectable_fields::SelectableField;

use super::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses a `labelSelector` parameter; a bad one is upstream's 400
    /// with the parser's words.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let parsed = label_parser::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let reqs = parsed
            .into_iter()
            .map(|r| {
                let first = r.values.first().cloned().unwrap_or_default();
                let number = first.parse().unwrap_or_default();
                let op = match r.op {
                    Operator::In => Op::In(r.values),
                    Operator::NotIn => Op::NotIn(r.values),
                    Operator::Equals | Operator::DoubleEquals => Op::Eq(first),
                    Operator::NotEquals => Op::NotEq(first),
                    Operator::GreaterThan => Op::Gt(number),
                    Operator::LessThan => Op::Lt(number),
                    Operator::Exists => Op::Exists,
                    Operator::DoesNotExist => Op::NotExists,
                };
                Requirement { key: r.key, op }
            })
            .collect();
        Ok(LabelSelector { reqs })
    }

    /// From a `metav1.LabelSelector` object (matchLabels, matchExpressions).
    pub fn from_object(sel: &Value) -> Self {
        let mut reqs = Vec::new();
        if let Some(Value::Object(m)) = sel.get("matchLabels") {
            for (k, v) in m {
                reqs.push(Requirement { key: k.clone(), op: Op::Eq(v.as_str().unwrap_or_default().into()) });
            }
        }
        if let Some(Value::Array(exprs)) = sel.get("matchExpressions") {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str).unwrap_or_default() {
                    "In" => Op::In(values),
                    "NotIn" => Op::NotIn(values),
                    "Exists" => Op::Exists,
                    _ => Op::NotExists,
                };
                reqs.push(Requirement { key, op });
            }
        }
        LabelSelector { reqs }
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: Option<&Value>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            match &r.op {
                Op::Eq(x) => v == Some(x.as_str()),
                Op::NotEq(x) => v != Some(x.as_str()),
                Op::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::NotIn(xs) => !v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
                Op::Gt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
                Op::Lt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
            }
        })
    }

    /// Whether an object's labels match.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.get("metadata").and_then(|m| m.get("labels")))
    }
}

/// A field selector: `metadata.name=x,spec.nodeName!=y`, each label one
/// the kind can be selected by.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(SelectableField, bool, String)>,
}

impl FieldSelector {
    /// Parses `s` for a kind of `group`: a label the kind has no field for
    /// is refused, as upstream's field label conversion refuses it.
    pub fn parse(s: &str, group: &str, kind: &str) -> Result<Self, ApiError> {
        let (fields, refusal) = selectable_fields::of(group, kind);
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (label, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{s}'; can't understand '{part}'")));
            };
            let label = label.trim();
            // Pods still accept the v1 clients' spec.host for spec.nodeName.
            let label = if label == "spec.host" && group.is_empty() && kind == "Pod" { "spec.nodeName" } else { label };
            let Some(field) = fields.iter().find(|f| f.label == label) else {
                return Err(ApiError::bad_request(selectable_fields::unsupported(label, refusal)));
            };
            reqs.push((*field, equal, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(field, equal, want)| (field.value_in(obj) == *want) == *equal)
    }

    /// The value `label` must equal, when the selector requires one
    /// (`spec.nodeName=n1`): what an index can look up.
    pub fn required(&self, label: &str) -> Option<&str> {
        self.reqs.iter().find(|(f, equal, _)| *equal && f.label == label).map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let labels = json!({"app": "web", "tier": "front", "n": "5"});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&labels));
        assert!(m("app=web"));
        assert!(m("app==web,tier!=back"));
        assert!(m("app in (web, api),!missing"));
        assert!(!m("app notin (web)"));
        assert!(m("tier"));
        assert!(m("n>3") && !m("n<3"));
        assert!(m(""));
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(!m("n notin (5)") && m("missing notin (x)") && m("missing!=x"));
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let f = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", "", "Pod").unwrap();
        assert!(f.matches(&pod));
        assert!(!FieldSelector::parse("metadata.name=q", "", "Pod").unwrap().matches(&pod));
        assert!(FieldSelector::parse("nonsense", "", "Pod").is_err());
        let unknown = FieldSelector::parse("spec.bogus=1", "", "Pod").unwrap_err();
        assert_eq!((unknown.code, unknown.message.as_str()), (400, "field label not supported: spec.bogus"));
        // A defaulted field matches objects that never set it.
        let node = json!({"metadata": {"name": "n"}, "spec": {}});
        assert!(FieldSelector::parse("spec.unschedulable=false", "", "Node").unwrap().matches(&node));
        assert!(FieldSelector::parse("metadata.namespace=x", "", "Node").is_err());
    }
}
