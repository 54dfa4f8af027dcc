//! Answers written in upstream's field order: an object starts with
//! `kind`, `apiVersion`, `metadata`, then `spec` and `status` (Go's struct
//! order), not the alphabetical order a JSON map would give. Clients quote
//! bodies in their errors and some tests compare text; lists and watch
//! events order their objects the same way.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

/// The keys an API object leads with, in upstream's order.
const LEADING: &[&str] = &["kind", "apiVersion", "metadata", "spec", "status"];
/// The keys of a watch event, in upstream's order.
const EVENT: &[&str] = &["type", "object"];
/// A `Status`'s keys (metav1.Status's field order), its details' and their causes'.
const STATUS: &[&str] = &["kind", "apiVersion", "metadata", "status", "message", "reason", "details", "code"];
const STATUS_DETAILS: &[&str] = &["name", "group", "kind", "uid", "causes", "retryAfterSeconds"];
const STATUS_CAUSE: &[&str] = &["reason", "message", "field"];

/// A value serialized with its API objects in upstream's field order.
pub struct Ordered<'a>(pub &'a Value);

/// An API object: leading keys first, then the rest as stored, with list
/// items and a watch event's object ordered alike.
struct Object<'a>(&'a serde_json::Map<String, Value>);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => Object(m).serialize(serializer),
            other => other.serialize(serializer),
        }
    }
}

impl Serialize for Object<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let is_event = m.len() == 2 && m.contains_key("type") && m.get("object").is_some_and(Value::is_object);
        let is_status = m.get("kind").and_then(Value::as_str) == Some("Status");
        let leading = match (is_event, is_status) {
            (true, _) => EVENT,
            (false, true) => STATUS,
            (false, false) => LEADING,
        };
        let mut out = serializer.serialize_map(Some(m.len()))?;
        for key in leading {
            if let Some(v) = m.get(*key) {
                match (is_status, *key, v) {
                    (true, "details", Value::Object(d)) => out.serialize_entry(key, &Details(d))?,
                    _ => out.serialize_entry(key, &Child(key, v))?,
                }
            }
        }
        for (k, v) in m {
            if !leading.contains(&k.as_str()) {
                out.serialize_entry(k, &Child(k, v))?;
            }
        }
        out.end()
    }
}

/// A map whose listed keys come first, in that order.
fn serialize_in_order<S: Serializer>(
    serializer: S,
    m: &serde_json::Map<String, Value>,
    order: &[&str],
) -> Result<S::Ok, S::Error> {
    let mut out = serializer.serialize_map(Some(m.len()))?;
    for key in order {
        if let Some(v) = m.get(*key) {
            out.serialize_entry(key, &StatusChild(key, v))?;
        }
    }
    for (k, v) in m {
        if !order.contains(&k.as_str()) {
            out.serialize_entry(k, v)?;
        }
    }
    out.end()
}

/// A `Status`'s details, in upstream's field order.
struct Details<'a>(&'a serde_json::Map<String, Value>);

impl Serialize for Details<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_in_order(serializer, self.0, STATUS_DETAILS)
    }
}

/// A field of a Status's details: its causes in upstream's field order.
struct StatusChild<'a>(&'a str, &'a Value);

impl Serialize for StatusChild<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match (self.0, self.1) {
            ("causes", Value::Array(causes)) => serializer.collect_seq(causes.iter().map(Cause)),
            (_, v) => v.serialize(serializer),
        }
    }
}

struct Cause<'a>(&'a Value);

impl Serialize for Cause<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => serialize_in_order(serializer, m, STATUS_CAUSE),
            other => other.serialize(serializer),
        }
    }
}

/// A field's value: the objects of `items` and a watch event's `object`
/// are API objects themselves.
struct Child<'a>(&'a str, &'a Value);

impl Serialize for Child<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match (self.0, self.1) {
            ("object", Value::Object(m)) => Object(m).serialize(serializer),
            ("items", Value::Array(items)) => serializer.collect_seq(items.iter().map(|i| match i {
                Value::Object(m) => ItemOrValue::Item(Object(m)),
                other => ItemOrValue::Value(other),
            })),
            (_, v) => v.serialize(serializer),
        }
    }
}

enum ItemOrValue<'a> {
    Item(Object<'a>),
    Value(&'a Value),
}

impl Serialize for ItemOrValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ItemOrValue::Item(o) => o.serialize(serializer),
            ItemOrValue::Value(v) => v.serialize(serializer),
        }
    }
}

/// `v` as JSON text in upstream's field order.
pub fn to_json(v: &Value) -> String {
    serde_json::to_string(&Ordered(v)).unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_lists_and_events_lead_with_kind_and_api_version() {
        let pod = json!({"status": {}, "spec": {"a": 1}, "metadata": {"name": "p"}, "apiVersion": "v1", "kind": "Pod", "zeta": 1});
        assert_eq!(
            to_json(&pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"},"spec":{"a":1},"status":{},"zeta":1}"#
        );
        let list = json!({"apiVersion": "v1", "items": [pod.clone()], "kind": "PodList", "metadata": {}});
        assert!(to_json(&list).starts_with(
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"kind":"Pod","apiVersion":"v1""#
        ));
        let event = json!({"type": "ADDED", "object": pod});
        assert!(to_json(&event).starts_with(r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1""#));
    }

    #[test]
    fn a_status_is_in_metav1_status_field_order() {
        let status = json!({
            "code": 422, "details": {"causes": [{"field": "f", "message": "m", "reason": "r"}], "kind": "pods", "name": "p"},
            "reason": "Invalid", "message": "bad", "status": "Failure", "metadata": {}, "apiVersion": "v1", "kind": "Status",
        });
        assert_eq!(
            to_json(&status),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"bad","reason":"Invalid","details":{"name":"p","kind":"pods","causes":[{"reason":"r","message":"m","field":"f"}]},"code":422}"#
        );
    }
}
