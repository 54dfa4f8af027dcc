//! Kind-specific behaviour of the built-in resources: defaulting,
//! validation, initial status and `kubectl get` columns, one file per kind
//! (or family of kinds). Kinds without a file here use the generic rules.
//! `metrics` defines the `metrics.k8s.io` kinds, served computed.

mod admission;
mod apiextensions;
mod apiregistration;
mod autoscaling;
mod autoscaling_v1;
mod autoscaling_v1_metrics;
mod certificates;
mod cluster;
mod core;
mod events;
pub mod metrics;
mod networking;
mod pod;
mod pod_ephemeral;
mod policy;
mod quantities;
mod rbac;
mod storage;
mod workloads;

pub use self::admission::*;
pub use self::apiextensions::*;
pub use self::apiregistration::*;
pub use self::autoscaling::*;
pub use self::autoscaling_v1::*;
pub use self::cluster::*;
pub use self::core::*;
pub use self::events::*;
pub use self::networking::*;
pub use self::pod::*;
pub use self::policy::*;
pub use self::rbac::*;
pub use self::storage::*;
pub use self::workloads::*;

use serde_json::{json, Value};

use super::meta;
use super::strategy::Hooks;
use super::table::Column;

/// An integer at `path`, or 0.
pub(crate) fn int(obj: &Value, path: &[&str]) -> i64 {
    meta::at(obj, path).and_then(Value::as_i64).unwrap_or(0)
}

/// The length of an array or object at `path`, or 0.
pub(crate) fn len(obj: &Value, path: &[&str]) -> usize {
    match meta::at(obj, path) {
        Some(Value::Array(a)) => a.len(),
        Some(Value::Object(m)) => m.len(),
        _ => 0,
    }
}

/// The strings of an array at `path` (other elements skipped).
pub(crate) fn str_list<'a>(obj: &'a Value, path: &[&str]) -> Vec<&'a str> {
    meta::at(obj, path)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// How long ago the timestamp at `path` was, as kubectl prints ages.
pub(crate) fn since(obj: &Value, path: &[&str]) -> Option<String> {
    meta::str_at(obj, path).and_then(meta::parse_rfc3339).map(|t| meta::human_duration(meta::unix_now() - t))
}

/// The columns of kinds upstream has no printer for: its default table
/// convertor shows NAME and CREATED AT (the creation time, RFC 3339 in UTC).
pub(crate) fn created_at_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column { name: "Created At", kind: "date", ..Column::age() }],
        cells: |o| {
            let t = meta::str_at(o, &["metadata", "creationTimestamp"]).and_then(meta::parse_rfc3339);
            vec![json!(t.map(meta::rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".into()))]
        },
        ..Hooks::default()
    }
}

/// `"<none>"` for empty strings, as kubectl tables print them.
pub(crate) fn or_none(s: &str) -> Value {
    Value::String(if s.is_empty() { "<none>".into() } else { s.to_string() })
}

/// Sets `obj[key] = value` when missing; `obj` must be an object.
pub(crate) fn default_field(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut() {
        m.entry(key.to_string()).or_insert(value);
    }
}

/// A label selector as `kubectl get -o wide` prints it.
pub fn selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel else { return "<none>".into() };
    let mut parts = Vec::new();
    if let Some(Value::Object(m)) = sel.get("matchLabels") {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    if let Some(Value::Array(exprs)) = sel.get("matchExpressions") {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str).unwrap_or_default() {
                "In" => parts.push(format!("{key} in ({})", values.join(","))),
                "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
                "Exists" => parts.push(key.to_string()),
                "DoesNotExist" => parts.push(format!("!{key}")),
                _ => {}
            }
        }
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

/// A plain map selector (Service, ReplicationController) as a string.
pub fn map_selector_string(sel: Option<&Value>) -> String {
    match sel {
        Some(Value::Object(m)) if !m.is_empty() => {
            m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(",")
        }
        _ => "<none>".into(),
    }
}
