//! Label and field selectors as list and watch requests give them.

use serde_json::Value;

use super::selectable_fields::{self, SelectableField};
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

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 317 && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |why: &str| ApiError::bad_request(format!("unable to parse requirement: {why}"));
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                Requirement { key: key.trim().into(), op: Op::NotExists }
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement { key: k.trim().into(), op: Op::NotEq(v.trim().into()) }
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement { key: k.trim().into(), op: Op::Eq(v.trim().into()) }
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement { key: k.trim().into(), op: Op::Eq(v.trim().into()) }
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Requirement { key: k.trim().into(), op: Op::NotIn(set_values(v).ok_or_else(|| bad(part))?) }
            } else if let Some((k, v)) = part.split_once(" in ") {
                Requirement { key: k.trim().into(), op: Op::In(set_values(v).ok_or_else(|| bad(part))?) }
            } else if let Some((k, v)) = part.split_once('>') {
                Requirement { key: k.trim().into(), op: Op::Gt(v.trim().parse().map_err(|_| bad(part))?) }
            } else if let Some((k, v)) = part.split_once('<') {
                Requirement { key: k.trim().into(), op: Op::Lt(v.trim().parse().map_err(|_| bad(part))?) }
            } else {
                Requirement { key: part.into(), op: Op::Exists }
            };
            if !valid_key(&req.key) {
                return Err(bad(&format!("invalid label key {:?}", req.key)));
            }
            reqs.push(req);
        }
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
