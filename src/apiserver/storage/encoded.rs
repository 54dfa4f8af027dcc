//! The stored form of an object, written with where its top-level values
//! and metadata's lie in the bytes: the answer to a write (the cache's JSON
//! at the new revision) is then put together from the same bytes after the
//! commit, without parsing them again as `splice` must for bytes it reads.
//! `assemble` puts the cache's JSON together from an object's entries for
//! both: for the write's answer here, and for the watch cache's `splice`.

use std::ops::Range;

use serde_json::Value;

use crate::apiserver::json_entries::{write_changed_finding, write_str};
use crate::apiserver::status::{ApiError, ApiResult};

/// The keys an object leads with in the cache's JSON, in that order; the
/// rest follow in the stored (sorted) order.
const LEADING: [&str; 5] = ["kind", "apiVersion", "metadata", "spec", "status"];

/// An object in the stored encoding (`encode`) and its layout.
pub(crate) struct Encoded {
    pub bytes: Vec<u8>,
    /// Each top-level key and where its value lies; None when the object
    /// is not a map.
    top: Option<Vec<(String, Range<usize>)>>,
    /// The same for metadata's entries, when metadata is a map.
    metadata: Option<Vec<(String, Range<usize>)>>,
}

impl Encoded {
    /// Everything but the resourceVersion, written straight from `object`
    /// (no copy of it): compact, every map's keys sorted.
    pub fn of(object: &Value) -> ApiResult<Encoded> {
        let Value::Object(fields) = object else {
            let bytes = serde_json::to_vec(object).map_err(cannot_encode)?;
            return Ok(Encoded { bytes, top: None, metadata: None });
        };
        let mut bytes = Vec::with_capacity(1024);
        let mut top = Vec::with_capacity(fields.len());
        let mut metadata = None;
        bytes.push(b'{');
        for (key, value) in fields {
            if !top.is_empty() {
                bytes.push(b',');
            }
            write_str(&mut bytes, key);
            bytes.push(b':');
            let start = bytes.len();
            match value {
                Value::Object(meta) if key == "metadata" => {
                    let mut entries = Vec::with_capacity(meta.len());
                    bytes.push(b'{');
                    for (k, v) in meta.iter().filter(|(k, _)| k.as_str() != "resourceVersion") {
                        if !entries.is_empty() {
                            bytes.push(b',');
                        }
                        write_str(&mut bytes, k);
                        bytes.push(b':');
                        let at = bytes.len();
                        serde_json::to_writer(&mut bytes, v).map_err(cannot_encode)?;
                        entries.push((k.clone(), at..bytes.len()));
                    }
                    bytes.push(b'}');
                    metadata = Some(entries);
                }
                _ => serde_json::to_writer(&mut bytes, value).map_err(cannot_encode)?,
            }
            top.push((key.clone(), start..bytes.len()));
        }
        bytes.push(b'}');
        Ok(Encoded { bytes, top: Some(top), metadata })
    }

    /// The cache's JSON of the object at `rev`: what `splice` makes of the
    /// bytes, byte for byte. None where `splice` would be None.
    pub fn answer(&self, rev: i64, api_version: &str, kind: &str) -> Option<Vec<u8>> {
        let top = self.slices(self.top.as_deref()?);
        let metadata = self.metadata.as_deref().map(|m| self.slices(m));
        assemble(&top, metadata.as_deref(), rev, api_version, kind).map(|a| a.json)
    }

    fn slices<'a>(&'a self, entries: &'a [(String, Range<usize>)]) -> Vec<(&'a str, &'a [u8])> {
        entries.iter().map(|(k, r)| (k.as_str(), &self.bytes[r.clone()])).collect()
    }
}

fn cannot_encode(e: serde_json::Error) -> ApiError {
    ApiError::internal(format!("cannot encode object: {e}"))
}

/// An object's JSON as the cache sends it.
pub struct Assembled {
    pub json: Vec<u8>,
    /// The bytes of metadata's `managedFields` entry with one comma beside
    /// it: what is cut out for a reader that drops managedFields
    /// (`CachedObject::json_for`). None when metadata has none.
    pub managed_fields: Option<Range<usize>>,
    /// The bytes of metadata's map (what a metadata-only watch sends).
    /// None when the object has no metadata map.
    pub metadata: Option<Range<usize>>,
}

/// The cache's JSON at `rev` put together from an object's stored entries:
/// `top`, its top-level keys and values (sorted, as stored), and `metadata`,
/// metadata's own when it is a map (sorted; a metadata that is not a map is
/// copied as it is, as `set_resource_version` leaves it). apiVersion and
/// kind are set and the resourceVersion goes at its sorted place. None for
/// a top level that `field_order` orders below it (`items`, `object`).
pub fn assemble(
    top: &[(&str, &[u8])],
    metadata: Option<&[(&str, &[u8])]>,
    rev: i64,
    api_version: &str,
    kind: &str,
) -> Option<Assembled> {
    if top.iter().any(|(k, _)| *k == "items" || *k == "object") {
        return None;
    }
    let size = top.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>() + 64;
    let mut json = Vec::with_capacity(size);
    json.extend_from_slice(b"{\"kind\":");
    write_str(&mut json, kind);
    json.extend_from_slice(b",\"apiVersion\":");
    write_str(&mut json, api_version);
    let value = |key: &str| top.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let mut managed_fields = None;
    let mut metadata_at = None;
    for lead in &LEADING[2..] {
        let Some(raw) = value(lead) else { continue };
        json.push(b',');
        write_str(&mut json, lead);
        json.push(b':');
        let start = json.len();
        match metadata.filter(|_| *lead == "metadata") {
            Some(entries) => managed_fields = with_resource_version(&mut json, entries, rev),
            None => json.extend_from_slice(raw),
        }
        if *lead == "metadata" && json.get(start) == Some(&b'{') {
            metadata_at = Some(start..json.len());
        }
    }
    for (key, raw) in top.iter().filter(|(k, _)| !LEADING.contains(k)) {
        json.push(b',');
        write_str(&mut json, key);
        json.push(b':');
        json.extend_from_slice(raw);
    }
    json.push(b'}');
    Some(Assembled { json, managed_fields, metadata: metadata_at })
}

/// Metadata's sorted entries with `resourceVersion` set to `rev` at its
/// sorted place; answers where its managedFields entry went
/// (`write_changed_finding`).
fn with_resource_version(out: &mut Vec<u8>, entries: &[(&str, &[u8])], rev: i64) -> Option<Range<usize>> {
    let version = format!("\"{rev}\"");
    let changes = [("resourceVersion", Some(version.as_bytes()))];
    write_changed_finding(out, entries.iter().copied(), &changes, Some("managedFields"))
}
