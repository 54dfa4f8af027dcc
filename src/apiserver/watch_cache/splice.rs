//! The cache's JSON of an object made from its stored JSON without
//! decoding it whole. The store holds each object as a compact JSON map
//! with sorted keys (serde_json's encoding of a `Value`) and no
//! resourceVersion; the cache's form differs only at the top (upstream's
//! leading keys first, the cache's apiVersion and kind) and in metadata
//! (the resourceVersion, at its sorted place). So the top-level values
//! and metadata's are copied as they are, and what selectors and the
//! cache's key read is parsed alone, everything else skipped unbuilt.
//!
//! For bytes in the store's own encoding the result is the same, byte for
//! byte, as decoding the object and encoding it with `field_order` (the
//! tests compare both). Anything else (keys out of order or repeated, a
//! top level that `field_order` orders below it, control bytes) is left
//! to that slower path.

use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::apiserver::json_entries::{Entries, Key};
use crate::apiserver::storage::{assemble, Assembled};

/// What the cache makes of a stored object.
pub struct Spliced {
    /// The object as the cache sends it.
    pub json: Vec<u8>,
    /// Where in `json` its metadata's managedFields entry is (`assemble`).
    pub managed_fields: Option<Range<usize>>,
    /// Where in `json` its metadata's map is (`assemble`).
    pub metadata: Option<Range<usize>>,
    /// The object cut down to the paths asked for (missing ones absent),
    /// on which those paths read as on the whole object.
    pub view: Value,
}

/// Paths into an object as a tree: the keys (or array indexes) to follow.
#[derive(Debug, Default)]
pub struct Paths {
    /// Everything under this point is wanted.
    whole: bool,
    next: Vec<(&'static str, Paths)>,
}

impl Paths {
    pub fn new<'p>(paths: impl IntoIterator<Item = &'p [&'static str]>) -> Paths {
        let mut root = Paths::default();
        for path in paths {
            let mut here = &mut root;
            for step in path {
                let i = match here.next.iter().position(|(s, _)| s == step) {
                    Some(i) => i,
                    None => {
                        here.next.push((step, Paths::default()));
                        here.next.len() - 1
                    }
                };
                here = &mut here.next[i].1;
            }
            here.whole = true;
        }
        root
    }

    fn step(&self, key: &str) -> Option<&Paths> {
        self.next.iter().find(|(s, _)| *s == key).map(|(_, p)| p)
    }
}

/// `stored` as the cache's JSON at revision `rev`, with apiVersion and kind
/// set, and the view of it that `paths` select. None when the bytes are
/// not in the store's encoding.
pub fn splice(stored: &[u8], rev: i64, api_version: &str, kind: &str, paths: &Paths) -> Option<Spliced> {
    if stored.iter().any(|b| *b < 0x20) {
        return None;
    }
    let top: Entries = serde_json::from_slice(stored).ok()?;
    if !top.sorted() {
        return None;
    }
    let metadata = match top.get("metadata").map(RawValue::get) {
        Some(raw) if raw.starts_with('{') => Some(Entries::of(raw).filter(Entries::sorted)?),
        _ => None,
    };
    let meta = metadata.as_ref().map(slices);
    let Assembled { json, managed_fields, metadata } =
        assemble(&slices(&top), meta.as_deref(), rev, api_version, kind)?;
    let mut view = Map::new();
    for (key, raw) in &top.0 {
        if let Some(wanted) = paths.step(key) {
            view.insert(key.to_string(), project(raw, wanted).ok()?);
        }
    }
    Some(Spliced { json, managed_fields, metadata, view: Value::Object(view) })
}

fn slices<'a>(entries: &'a Entries<'_>) -> Vec<(&'a str, &'a [u8])> {
    entries.0.iter().map(|(k, v)| (&**k, v.get().as_bytes())).collect()
}

/// `raw` cut down to `paths`.
fn project(raw: &RawValue, paths: &Paths) -> serde_json::Result<Value> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Project(paths).deserialize(&mut de)
}

/// Parses a value keeping only what `Paths` lead to: maps keep the keys on
/// a path, arrays the indexes on one (the others become null, so indexes
/// stay), and everything else is skipped without being built.
struct Project<'p>(&'p Paths);

impl<'de> DeserializeSeed<'de> for Project<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.whole {
            return serde::Deserialize::deserialize(d);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Project<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(Key(k)) = map.next_key()? {
            match self.0.step(&k) {
                Some(next) => {
                    out.insert(k.into_owned(), map.next_value_seed(Project(next))?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let wanted = self.0.step(&out.len().to_string());
            let item = match wanted {
                Some(next) => seq.next_element_seed(Project(next))?,
                None => seq.next_element::<IgnoredAny>()?.map(|_| Value::Null),
            };
            match item {
                Some(v) => out.push(v),
                None => break,
            }
        }
        while out.last().is_some_and(Value::is_null) {
            out.pop();
        }
        Ok(Value::Array(out))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::selector::selectable_fields::{field_paths, selector_view, LABELS};
    use crate::apiserver::storage::{set_resource_version, Encoded};

    /// What the store holds of `object`: its encoding without resourceVersion.
    fn stored(object: &Value) -> Vec<u8> {
        let mut o = object.clone();
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        serde_json::to_vec(&o).unwrap()
    }

    /// The slow path: decode, set the resourceVersion, apiVersion and kind,
    /// encode in upstream's field order.
    fn decoded(bytes: &[u8], rev: i64, api_version: &str, kind: &str) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(bytes).unwrap();
        set_resource_version(&mut v, rev);
        let m = v.as_object_mut().unwrap();
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
        crate::apiserver::field_order::to_json(&v).into_bytes()
    }

    fn paths(kind: &str) -> Paths {
        Paths::new(std::iter::once(LABELS).chain(field_paths(kind)))
    }

    fn samples() -> Vec<(&'static str, Value)> {
        vec![
            (
                "Pod",
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1", "resourceVersion": "3",
                        "labels": {"app": "web", "tier": "a\"b\\c\u{1}</script>"},
                        "annotations": {"note": "héllo ☃ \u{7f}"},
                        "managedFields": [{"manager": "kubectl", "operation": "Update",
                            "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}}}}}}],
                        "creationTimestamp": "2026-11-28T10:00:00Z"},
                    "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m"}}}], "hostNetwork": false,
                        "priority": 0, "terminationGracePeriodSeconds": 30},
                    "status": {"phase": "Running", "podIPs": [{"ip": "10.42.0.5"}, {"ip": "fd00::5"}],
                        "conditions": [{"type": "Ready", "status": "True"}], "ratio": 0.1, "big": 1e300,
                        "neg": -0.0, "max": u64::MAX, "min": i64::MIN}
                }),
            ),
            ("Pod", json!({"metadata": {"name": "bare", "namespace": "ns"}, "spec": {}})),
            (
                "ConfigMap",
                json!({"metadata": {"name": "cm", "namespace": "ns", "uid": "z"}, "data": {"k": "v"}, "binaryData": {"b": "AA=="}, "immutable": true}),
            ),
            ("ConfigMap", json!({"metadata": {}, "data": {}})),
            (
                "Event",
                json!({"metadata": {"name": "e", "namespace": "ns"}, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Scheduled", "type": "Normal", "source": {"component": "s"}, "count": 1}),
            ),
            ("Widget", json!({"metadata": null, "spec": [1, 2, {"a": null}], "zeta": "z", "alpha": []})),
            ("Widget", json!({"apiVersion": "old/v1", "kind": "Old", "spec": "x"})),
            (
                "Node",
                json!({"metadata": {"name": "n", "resourceVersion": "9", "zz": 1}, "spec": {"unschedulable": true}}),
            ),
        ]
    }

    #[test]
    fn the_cache_json_is_byte_for_byte_the_decoded_objects_encoding() {
        for (kind, object) in samples() {
            // As ferrok stores it, and as another writer might, its
            // resourceVersion kept (which the cache's replaces).
            for bytes in [stored(&object), serde_json::to_vec(&object).unwrap()] {
                let spliced = splice(&bytes, 42, "example.com/v1", kind, &paths(kind)).expect("the store's encoding");
                let want = decoded(&bytes, 42, "example.com/v1", kind);
                assert_eq!(String::from_utf8_lossy(&spliced.json), String::from_utf8_lossy(&want), "{kind}: {object}");
                // The metadata range holds metadata's value, as encoded.
                let whole: Value = serde_json::from_slice(&want).unwrap();
                match (whole.get("metadata"), spliced.metadata) {
                    (Some(m), Some(at)) => assert_eq!(
                        String::from_utf8_lossy(&spliced.json[at]),
                        crate::apiserver::field_order::to_json(m),
                        "{kind}: {object}"
                    ),
                    (None, None) => {}
                    (Some(m), None) if !m.is_object() => {}
                    (m, at) => panic!("{kind}: metadata {m:?} found at {at:?}"),
                }
            }
        }
    }

    #[test]
    fn selectors_and_keys_read_the_view_as_the_whole_object() {
        for (kind, object) in samples() {
            let bytes = stored(&object);
            let spliced = splice(&bytes, 42, "v1", kind, &paths(kind)).unwrap();
            let whole: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(selector_view(&spliced.view, kind), selector_view(&whole, kind), "{kind}");
            for f in crate::apiserver::selector::selectable_fields::of("", kind).0 {
                assert_eq!(f.value_in(&spliced.view), f.value_in(&whole), "{kind} {}", f.label);
            }
        }
        // Only the paths are built: no managed fields, containers or annotations.
        let (_, pod) = &samples()[0];
        let view = splice(&stored(pod), 1, "v1", "Pod", &paths("Pod")).unwrap().view;
        assert_eq!(view["status"]["podIPs"], json!([{"ip": "10.42.0.5"}]));
        assert!(view["metadata"].get("managedFields").is_none());
        assert!(view["spec"].get("containers").is_none());
        assert_eq!(view["metadata"]["labels"]["app"], "web");
    }

    #[test]
    fn bytes_not_in_the_stores_encoding_take_the_slow_path() {
        let paths = paths("ConfigMap");
        let refused = |s: &str| splice(s.as_bytes(), 1, "v1", "ConfigMap", &paths).is_none();
        assert!(refused(r#"{"metadata":{},"data":{},"apiVersion":"v1"}"#), "top-level keys out of order");
        assert!(refused(r#"{"data":{},"data":{}}"#), "a repeated key");
        assert!(refused(r#"{"metadata":{"uid":"a","name":"b"}}"#), "metadata out of order");
        assert!(refused("{\"data\":\n{}}"), "a newline would break a watch line");
        assert!(refused(r#"{"items":[]}"#), "field_order orders items");
        assert!(refused(r#"["not an object"]"#));
        assert!(refused("{\"data\":"), "not JSON");
        assert!(!refused(r#"{"data":{"b":1,"a":2}}"#), "nested order is kept as stored");
    }

    #[test]
    fn the_answer_is_what_splice_makes_of_the_stored_bytes() {
        let objects = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d", "resourceVersion": "7",
                "labels": {"a\"b": "\u{e9}\n"}, "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Pending"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"annotations": {}, "zz": 1}, "data": {"k": "v"},
                "binaryData": {}, "immutable": true}),
            json!({"metadata": {}, "apiVersion": "v1", "kind": "Event", "reason": "x", "count": u64::MAX, "f": -0.0}),
            json!({"metadata": "odd", "spec": 1}),
            json!({"kind": "List", "items": []}),
        ];
        for object in objects {
            let encoded = Encoded::of(&object).expect("encode");
            let spliced = splice(&encoded.bytes, 42, "v9", "Kind", &Paths::default()).map(|s| s.json);
            assert_eq!(encoded.answer(42, "v9", "Kind"), spliced, "{object}");
            assert!(!String::from_utf8_lossy(&encoded.bytes).contains("resourceVersion"));
        }
        assert!(Encoded::of(&json!([1])).expect("encode").answer(1, "v1", "K").is_none());
    }
}
