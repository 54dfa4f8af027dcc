//! The stored form of an object, written with where its top-level values
//! and metadata's lie in the bytes: the answer to a write (the cache's JSON
//! at the new revision) is then put together from the same bytes after the
//! commit, without parsing them again as `splice` must for bytes it reads.

use std::ops::Range;

use serde_json::Value;

use crate::apiserver::json_entries::write_str;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::watch_cache::splice::assemble;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::watch_cache::splice::{splice, Paths};
    use serde_json::json;

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
