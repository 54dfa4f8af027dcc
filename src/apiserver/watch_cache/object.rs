//! What the cache holds: each object encoded once, as the JSON every list
//! and watch sends, and the little of it that selectors read, also as
//! JSON. Decoded objects are not kept: a `serde_json::Value` weighs several
//! times its JSON (each of its maps is a B-tree node of about 600 bytes,
//! however few keys it holds), which for 10,000 pods made the selector
//! views alone 130 MiB (heaptrack). The few readers that need an object
//! whole (tables, metadata-only reads) or its selector view (a watch or
//! list with selectors) decode the JSON again.

use std::sync::Arc;

use axum::body::Bytes;
use serde_json::Value;

use super::splice::{splice, Paths};
use crate::apiserver::selector::selectable_fields::{field_paths, selector_view, SelectableField, LABELS};
use crate::apiserver::storage::set_resource_version;

/// How a cache's objects are encoded: the apiVersion and kind its JSON
/// carries, the kind whose selectable fields are kept, and the field the
/// cache indexes.
#[derive(Clone)]
pub struct Form {
    /// None: each object keeps the apiVersion it was stored in (custom
    /// resources, stored in whichever version was the storage version).
    pub api_version: Option<Arc<str>>,
    pub kind: Arc<str>,
    pub index: Option<SelectableField>,
    /// What the cache reads of an object besides its JSON: the paths of
    /// its labels, selectable fields and indexed field.
    paths: Arc<Paths>,
}

impl Form {
    pub fn new(api_version: &str, kind: &str, index: Option<SelectableField>) -> Form {
        Form::of(Some(api_version), kind, index)
    }

    /// `new`, or with `None` a form whose objects keep their stored apiVersion.
    pub fn of(api_version: Option<&str>, kind: &str, index: Option<SelectableField>) -> Form {
        let indexed = index.iter().flat_map(|f| [f.path, f.fallback]);
        let paths = Paths::new(std::iter::once(LABELS).chain(field_paths(kind)).chain(indexed));
        Form { api_version: api_version.map(Arc::from), kind: kind.into(), index, paths: Arc::new(paths) }
    }

    /// The apiVersion an object's cached JSON carries: the form's, or the
    /// one `stored` reads from the object.
    fn api_version_for(&self, stored: impl FnOnce() -> Option<String>) -> Arc<str> {
        match &self.api_version {
            Some(v) => v.clone(),
            None => Arc::from(stored().unwrap_or_default()),
        }
    }
}

/// The apiVersion of a stored object's JSON, read without building the rest.
fn stored_api_version(stored: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(rename = "apiVersion", borrow, default)]
        api_version: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Head>(stored).ok()?.api_version.map(|v| v.into_owned())
}

/// One object as the cache holds it.
pub struct CachedObject {
    pub key: String,
    pub rev: i64,
    /// The value of the cache's indexed field (pods' spec.nodeName).
    pub index: Option<Box<str>>,
    /// What label and field selectors read (`selectable_fields::selector_view`),
    /// as JSON.
    attrs: Box<[u8]>,
    /// The object as upstream's JSON (field order, apiVersion and kind of
    /// `form`, `metadata.resourceVersion` set).
    json: Bytes,
    /// Where `json` holds metadata's managedFields entry (`Assembled`), for
    /// readers that drop them.
    managed_fields: Option<(u32, u32)>,
    /// Where `json` holds metadata's map, for metadata-only readers.
    metadata: Option<(u32, u32)>,
    api_version: Arc<str>,
}

impl CachedObject {
    /// `object` as the store gave it (resourceVersion set), encoded once.
    pub fn new(key: String, rev: i64, object: Value, form: &Form) -> Self {
        let (attrs, index) = Self::read_by_selectors(&object, form);
        let api_version = form.api_version_for(|| object["apiVersion"].as_str().map(str::to_string));
        let json = encode(object, &api_version, &form.kind);
        let metadata = find_metadata(&json);
        CachedObject { key, rev, index, attrs, json, managed_fields: None, metadata, api_version }
    }

    /// An object from its stored JSON at `rev`, keyed by `key_of` (which
    /// reads its name and namespace): spliced into the cache's JSON
    /// (`splice`), or decoded and encoded when the bytes are not in the
    /// store's own encoding.
    pub fn from_stored(
        stored: &[u8],
        rev: i64,
        form: &Form,
        key_of: impl Fn(&Value) -> String,
    ) -> serde_json::Result<Self> {
        let api_version = form.api_version_for(|| stored_api_version(stored));
        let Some(spliced) = splice(stored, rev, &api_version, &form.kind, &form.paths) else {
            let mut object: Value = serde_json::from_slice(stored)?;
            set_resource_version(&mut object, rev);
            return Ok(Self::new(key_of(&object), rev, object, form));
        };
        let (attrs, index) = Self::read_by_selectors(&spliced.view, form);
        let mut json = spliced.json;
        json.shrink_to_fit();
        let at = |r: std::ops::Range<usize>| Some((u32::try_from(r.start).ok()?, u32::try_from(r.end).ok()?));
        Ok(CachedObject {
            key: key_of(&spliced.view),
            rev,
            index,
            attrs,
            json: Bytes::from(json),
            managed_fields: spliced.managed_fields.and_then(at),
            metadata: spliced.metadata.and_then(at),
            api_version,
        })
    }

    /// The selector view and the indexed field's value of `object` (whole,
    /// or cut down to `form`'s paths).
    fn read_by_selectors(object: &Value, form: &Form) -> (Box<[u8]>, Option<Box<str>>) {
        let attrs = serde_json::to_vec(&selector_view(object, &form.kind)).unwrap_or_default().into_boxed_slice();
        (attrs, form.index.map(|f| f.value_in(object).into_boxed_str()))
    }

    /// What selectors read of the object: a small stand-in on which label
    /// and field selectors answer as on the whole object.
    pub fn attrs(&self) -> Value {
        serde_json::from_slice(&self.attrs).unwrap_or(Value::Null)
    }

    /// The object as JSON for `api_version`: the shared bytes for the
    /// cache's own apiVersion, made anew for another.
    pub fn json(&self, api_version: &str, kind: &str) -> Bytes {
        if *self.api_version == *api_version {
            return self.json.clone();
        }
        encode(self.value(), api_version, kind)
    }

    /// `json`, without metadata's managedFields for a reader that drops
    /// them (`Omit::ManagedFields`) when the cache knows where they are.
    pub fn json_for(&self, api_version: &str, kind: &str, omit: Omit) -> Bytes {
        if !self.is_in(api_version) {
            return self.json(api_version, kind);
        }
        match self.json_slices(omit) {
            [whole, []] if whole.len() == self.json.len() => self.json.clone(),
            [before, after] => {
                let mut out = Vec::with_capacity(before.len() + after.len());
                out.extend_from_slice(before);
                out.extend_from_slice(after);
                Bytes::from(out)
            }
        }
    }

    /// Whether the cache holds the object's JSON in `api_version`.
    pub fn is_in(&self, api_version: &str) -> bool {
        *self.api_version == *api_version
    }

    /// The apiVersion the cache holds the object's JSON in.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// `json_for` in the cache's own apiVersion as two borrowed slices to
    /// write one after the other: the JSON before metadata's managedFields
    /// entry and after it, or the whole and nothing. A list copies these
    /// into its answer without taking a share of the bytes.
    pub fn json_slices(&self, omit: Omit) -> [&[u8]; 2] {
        self.slices(0, self.json.len(), omit)
    }

    /// `json[start..end]` as two slices: the bytes before metadata's
    /// managedFields entry and after it when `omit` drops them and the
    /// entry lies within, else the whole and nothing.
    fn slices(&self, start: usize, end: usize, omit: Omit) -> [&[u8]; 2] {
        match self.managed_fields.map(|(s, e)| (s as usize, e as usize)) {
            Some((cut, resume)) if omit == Omit::ManagedFields && start < cut && resume < end => {
                [&self.json[start..cut], &self.json[resume..end]]
            }
            _ => [&self.json[start..end], &[]],
        }
    }

    /// The object's event line (`event_line`) for a watcher of
    /// `api_version`: written straight from the cache's bytes in its own
    /// apiVersion, whatever `omit` leaves out; encoded anew for another.
    pub fn event_line(&self, as_type: EventType, api_version: &str, kind: &str, omit: Omit) -> Bytes {
        if !self.is_in(api_version) {
            return event_line(as_type, &[&self.json(api_version, kind)]);
        }
        event_line(as_type, &self.json_slices(omit))
    }

    /// The whole object, decoded again from its JSON.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// The object's metadata as its JSON holds it, not decoded, as two
    /// slices to write one after the other (`json_slices`): the bytes a
    /// metadata-only watch sends (the garbage collector and the quota
    /// controller watch so, and would otherwise decode each change whole),
    /// without the managedFields entry for a reader that drops them.
    pub fn metadata_slices(&self, omit: Omit) -> [&[u8]; 2] {
        match self.metadata {
            Some((start, end)) => self.slices(start as usize, end as usize, omit),
            None => [b"{}", &[]],
        }
    }

    /// The object's metadata decoded, nothing else of it built (what
    /// metadata-only lists send).
    pub fn metadata(&self, omit: Omit) -> Value {
        let decoded = match self.metadata_slices(omit) {
            [whole, []] => serde_json::from_slice(whole),
            [before, after] => serde_json::from_slice(&[before, after].concat()),
        };
        decoded.unwrap_or_default()
    }

    /// The length of its JSON.
    pub fn encoded_len(&self) -> usize {
        self.json.len()
    }
}

/// Where `json` holds its top-level metadata map, found by parsing it once
/// (as `storage::assemble` records it).
fn find_metadata(json: &[u8]) -> Option<(u32, u32)> {
    #[derive(serde::Deserialize)]
    struct MetadataOnly<'a> {
        #[serde(borrow, default)]
        metadata: Option<&'a serde_json::value::RawValue>,
    }
    let raw = serde_json::from_slice::<MetadataOnly>(json).ok()?.metadata?.get();
    if !raw.starts_with('{') {
        return None;
    }
    let start = (raw.as_ptr() as usize).checked_sub(json.as_ptr() as usize)?;
    Some((u32::try_from(start).ok()?, u32::try_from(start + raw.len()).ok()?))
}

fn encode(mut typed: Value, api_version: &str, kind: &str) -> Bytes {
    if let Some(m) = typed.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.to_string()));
        m.insert("kind".into(), Value::String(kind.to_string()));
    }
    // The encoder grows its buffer by doubling; what the cache keeps is
    // trimmed to the JSON's length (Bytes keeps a Vec's whole capacity).
    let mut json = crate::apiserver::field_order::to_json(&typed).into_bytes();
    json.shrink_to_fit();
    Bytes::from(json)
}

/// What a reader leaves out of the objects it lists and watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Omit {
    Nothing,
    /// metadata.managedFields: the shared informers of ferrok's own
    /// controllers and scheduler drop them on arrival (upstream's
    /// kube-controller-manager and kube-scheduler do the same with an
    /// informer transform), so they are not sent to them.
    ManagedFields,
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
}

impl CachedEvent {
    pub fn new(kind: EventType, object: Arc<CachedObject>, prev: Option<Arc<CachedObject>>) -> Self {
        CachedEvent { kind, rev: object.rev, object, prev }
    }

    /// The event as a line of a JSON watch, shown as `as_type`: the
    /// object's shared JSON with the event's few bytes around it (a copy
    /// per watcher, as TLS makes anyway, instead of a line kept per event).
    pub fn line(&self, as_type: EventType, api_version: &str, kind: &str, omit: Omit) -> Bytes {
        self.object.event_line(as_type, api_version, kind, omit)
    }
}

/// `{"type":"ADDED","object":<json>}` and a newline, the object's JSON
/// given as parts to write one after the other.
pub fn event_line(as_type: EventType, object_json: &[&[u8]]) -> Bytes {
    let head = format!("{{\"type\":\"{}\",\"object\":", as_type.as_str());
    let len = object_json.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Vec::with_capacity(head.len() + len + 2);
    out.extend_from_slice(head.as_bytes());
    for part in object_json {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// A watch event line of the PartialObjectMetadata around metadata
/// already encoded (`CachedObject::metadata_slices`).
pub fn partial_event_line(as_type: EventType, [before, after]: [&[u8]; 2]) -> Bytes {
    const HEAD: &[u8] = br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;
    event_line(as_type, &[HEAD, before, after, b"}"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn form() -> Form {
        Form::new("v1", "ConfigMap", None)
    }

    #[test]
    fn encodings_are_made_once_and_match_the_generic_path() {
        let obj = json!({"metadata": {"name": "a", "resourceVersion": "5", "labels": {"x": "y"}}, "data": {"k": "v"}});
        let cached = Arc::new(CachedObject::new("/registry/configmaps/ns/a".into(), 5, obj.clone(), &form()));
        let first = cached.json("v1", "ConfigMap");
        let second = cached.json("v1", "ConfigMap");
        assert_eq!(first.as_ptr(), second.as_ptr(), "shared, not made again");
        let mut typed = obj;
        typed["apiVersion"] = json!("v1");
        typed["kind"] = json!("ConfigMap");
        assert_eq!(first, Bytes::from(crate::apiserver::field_order::to_json(&typed)));
        assert_eq!(cached.value(), typed, "decoded back whole");
        assert_eq!(cached.metadata(Omit::Nothing), typed["metadata"], "the metadata alone");
        assert_eq!(
            cached.attrs(),
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}}),
            "only what selectors read"
        );
        assert_eq!(
            cached.metadata_slices(Omit::Nothing).concat(),
            serde_json::to_vec(&typed["metadata"]).unwrap(),
            "the metadata's own bytes"
        );
        let partial = json!({"type": "MODIFIED", "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": typed["metadata"]}});
        assert_eq!(
            String::from_utf8_lossy(&partial_event_line(EventType::Modified, cached.metadata_slices(Omit::Nothing))),
            crate::apiserver::field_order::to_json(&partial) + "\n",
            "a metadata-only event as the generic path writes it"
        );
        let ev = CachedEvent::new(EventType::Added, cached, None);
        let line = ev.line(EventType::Added, "v1", "ConfigMap", Omit::Nothing);
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

    #[test]
    fn metadata_that_is_not_a_map_reads_as_an_empty_one() {
        for obj in [json!({"metadata": null, "data": {}}), json!({"data": {}}), json!({"metadata": "x"})] {
            let stored = serde_json::to_vec(&obj).unwrap();
            let spliced = CachedObject::from_stored(&stored, 7, &form(), |_| "/k".into()).unwrap();
            let encoded = CachedObject::new("/k".into(), 7, obj.clone(), &form());
            for cached in [spliced, encoded] {
                assert_eq!(cached.metadata_slices(Omit::ManagedFields).concat(), b"{}", "{obj}");
                assert_eq!(cached.metadata(Omit::Nothing), json!({}), "{obj}");
            }
        }
    }

    #[test]
    fn managed_fields_are_cut_out_only_for_readers_that_drop_them() {
        let entry = json!([{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:data": {"f:k": {}}}}]);
        let objects = [
            json!({"data": {"k": "v"}, "metadata": {"annotations": {"managedFields": "[]"}, "creationTimestamp": "2026-01-01T00:00:00Z",
                "managedFields": entry, "name": "a", "namespace": "ns"}}),
            json!({"metadata": {"managedFields": entry, "name": "a"}}),
            json!({"metadata": {"managedFields": [], "name": "a", "uid": "u"}}),
            json!({"metadata": {"name": "a"}}),
        ];
        for obj in objects {
            let stored = serde_json::to_vec(&obj).unwrap();
            let cached = CachedObject::from_stored(&stored, 7, &form(), |_| "/k".into()).unwrap();
            let mut typed = obj.clone();
            typed["apiVersion"] = json!("v1");
            typed["kind"] = json!("ConfigMap");
            typed["metadata"]["resourceVersion"] = json!("7");
            let whole = crate::apiserver::field_order::to_json(&typed);
            assert_eq!(String::from_utf8_lossy(&cached.json_for("v1", "ConfigMap", Omit::Nothing)), whole, "{obj}");
            typed["metadata"].as_object_mut().unwrap().remove("managedFields");
            let without = crate::apiserver::field_order::to_json(&typed);
            let omitted = cached.json_for("v1", "ConfigMap", Omit::ManagedFields);
            assert_eq!(String::from_utf8_lossy(&omitted), without, "{obj}");
            let back: Value = serde_json::from_slice(&omitted).unwrap();
            assert_eq!(back["metadata"]["annotations"], obj["metadata"]["annotations"], "other fields kept: {obj}");
            // A list copies the same bytes from the borrowed slices.
            assert!(cached.is_in("v1") && !cached.is_in("v2"));
            for (omit, expected) in [(Omit::Nothing, &whole), (Omit::ManagedFields, &without)] {
                assert_eq!(String::from_utf8_lossy(&cached.json_slices(omit).concat()), *expected, "{obj}");
                // A watch's line is written from the same slices.
                let line = cached.event_line(EventType::Modified, "v1", "ConfigMap", omit);
                assert_eq!(
                    String::from_utf8_lossy(&line),
                    format!("{{\"type\":\"MODIFIED\",\"object\":{expected}}}\n")
                );
            }
            // Metadata-only readers get the same cut of metadata alone.
            for (omit, expected) in [(Omit::Nothing, &whole), (Omit::ManagedFields, &without)] {
                let expected: Value = serde_json::from_str(expected).unwrap();
                let metadata = crate::apiserver::field_order::to_json(&expected["metadata"]);
                assert_eq!(String::from_utf8_lossy(&cached.metadata_slices(omit).concat()), metadata, "{obj}");
                assert_eq!(cached.metadata(omit), expected["metadata"], "{obj}");
            }
            // Another apiVersion is encoded anew, managedFields and all.
            let other: Value =
                serde_json::from_slice(&cached.json_for("v2", "ConfigMap", Omit::ManagedFields)).unwrap();
            assert_eq!(other["metadata"].get("managedFields"), obj["metadata"].get("managedFields"), "{obj}");
        }
    }
}
