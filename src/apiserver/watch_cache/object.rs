//! What the cache holds: each object decoded once, and its JSON made once
//! (lazily) and shared by every list and watch that sends it.

use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use serde_json::Value;

/// One object as the cache holds it: its key, revision and decoded value
/// (with `metadata.resourceVersion` filled in).
pub struct CachedObject {
    pub key: String,
    pub rev: i64,
    pub object: Value,
    /// The object as JSON with apiVersion and kind, made on first use.
    json: OnceLock<Encoded>,
}

/// An encoding, and the apiVersion it was made for.
struct Encoded {
    api_version: String,
    bytes: Bytes,
}

impl CachedObject {
    pub fn new(key: String, rev: i64, object: Value) -> Self {
        CachedObject { key, rev, object, json: OnceLock::new() }
    }

    /// The object as upstream's JSON (field order, apiVersion and kind set);
    /// made once per object for the apiVersion most clients read it in.
    pub fn json(&self, api_version: &str, kind: &str) -> Bytes {
        if let Some(e) = self.json.get() {
            if e.api_version == api_version {
                return e.bytes.clone();
            }
            return encode(&self.object, api_version, kind);
        }
        let bytes = encode(&self.object, api_version, kind);
        let _ = self.json.set(Encoded { api_version: api_version.to_string(), bytes: bytes.clone() });
        bytes
    }

    /// The length of the JSON made so far (0 when none was made).
    pub fn encoded_len(&self) -> usize {
        self.json.get().map_or(0, |e| e.bytes.len())
    }

    pub fn name(&self) -> &str {
        self.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
    }
}

fn encode(object: &Value, api_version: &str, kind: &str) -> Bytes {
    let mut typed = object.clone();
    if let Some(m) = typed.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.to_string()));
        m.insert("kind".into(), Value::String(kind.to_string()));
    }
    Bytes::from(crate::apiserver::field_order::to_json(&typed))
}

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A change as the store reported it, decoded once.
pub struct CachedEvent {
    pub kind: EventType,
    pub rev: i64,
    /// The object after the change; for a delete, its last state with the
    /// delete's resourceVersion.
    pub object: Arc<CachedObject>,
    /// The object before the change (selectors look at both).
    pub prev: Option<Arc<CachedObject>>,
    /// `{"type":…,"object":…}` lines, per type a watcher may see this
    /// event as (a selector turns a MODIFIED into an ADDED or DELETED).
    lines: [OnceLock<Bytes>; 3],
}

impl CachedEvent {
    pub fn new(kind: EventType, object: Arc<CachedObject>, prev: Option<Arc<CachedObject>>) -> Self {
        CachedEvent { kind, rev: object.rev, object, prev, lines: Default::default() }
    }

    /// The event as a line of a JSON watch, shown as `as_type`; made once.
    pub fn line(&self, as_type: EventType, api_version: &str, kind: &str) -> Bytes {
        let made = |obj: &CachedObject| event_line(as_type, &obj.json(api_version, kind));
        let slot = &self.lines[as_type.index()];
        if let Some(line) = slot.get() {
            if self.object.json.get().is_some_and(|e| e.api_version == api_version) {
                return line.clone();
            }
            return made(&self.object);
        }
        let line = made(&self.object);
        if self.object.json.get().is_some_and(|e| e.api_version == api_version) {
            let _ = slot.set(line.clone());
        }
        line
    }
}

/// `{"type":"ADDED","object":<json>}` and a newline.
pub fn event_line(as_type: EventType, object_json: &[u8]) -> Bytes {
    let head = format!("{{\"type\":\"{}\",\"object\":", as_type.as_str());
    let mut out = Vec::with_capacity(head.len() + object_json.len() + 2);
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(object_json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn encodings_are_made_once_and_match_the_generic_path() {
        let obj = json!({"metadata": {"name": "a", "resourceVersion": "5"}, "data": {"k": "v"}});
        let cached = Arc::new(CachedObject::new("/registry/configmaps/ns/a".into(), 5, obj.clone()));
        let first = cached.json("v1", "ConfigMap");
        let second = cached.json("v1", "ConfigMap");
        assert_eq!(first.as_ptr(), second.as_ptr(), "shared, not made again");
        let mut typed = obj;
        typed["apiVersion"] = json!("v1");
        typed["kind"] = json!("ConfigMap");
        assert_eq!(first, Bytes::from(crate::apiserver::field_order::to_json(&typed)));
        let ev = CachedEvent::new(EventType::Added, cached, None);
        let line = ev.line(EventType::Added, "v1", "ConfigMap");
        assert_eq!(line.as_ptr(), ev.line(EventType::Added, "v1", "ConfigMap").as_ptr());
        let back: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(back["type"], "ADDED");
        assert_eq!(back["object"]["kind"], "ConfigMap");
        let event = json!({"type": "ADDED", "object": typed});
        assert_eq!(
            String::from_utf8_lossy(&line).trim_end(),
            crate::apiserver::field_order::to_json(&event),
            "the same bytes as the uncached watch"
        );
    }
}
