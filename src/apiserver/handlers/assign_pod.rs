//! What a binding writes, made from the watch cache's JSON of the pod
//! without decoding it: `spec.nodeName` set and the `PodScheduled`
//! condition replaced, in the store's encoding (keys sorted, no
//! resourceVersion). Every other value is copied as the cache holds it,
//! which is the store's own encoding of it. The result is the same, byte
//! for byte, as decoding the pod, changing it and encoding it again (the
//! tests compare both); when the JSON is not as the cache makes it, the
//! binding takes that slower path.

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::apiserver::json_entries::{write_str, Entries, MapWriter};
use crate::apiserver::meta;
use crate::apiserver::status::ApiError;

/// Why a pod cannot be assigned.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The pod is already assigned, to this node.
    AlreadyAssigned(String),
    /// The pod has a deletionTimestamp.
    BeingDeleted,
}

impl Refusal {
    /// The Conflict upstream answers with, for the pod `name`.
    pub fn error(&self, name: &str) -> ApiError {
        let message = match self {
            Refusal::AlreadyAssigned(node) => format!("pod {name} is already assigned to node {node:?}"),
            Refusal::BeingDeleted => format!("pod {name} is being deleted, cannot be assigned to a host"),
        };
        ApiError::conflict("", "pods", name, &message)
    }
}

/// The decoded path: `pod` assigned to `node` at `now`, in place.
pub fn assign_decoded(pod: &mut Value, node: &str, now: &str) -> Result<(), Refusal> {
    if let Some(n) = meta::str_at(pod, &["spec", "nodeName"]).filter(|n| !n.is_empty()) {
        return Err(Refusal::AlreadyAssigned(n.to_string()));
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(Refusal::BeingDeleted);
    }
    pod["spec"]["nodeName"] = json!(node);
    let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let status = &mut pod["status"];
    match status.get_mut("conditions").and_then(Value::as_array_mut) {
        Some(conds) => {
            conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            conds.push(cond);
        }
        None => status["conditions"] = json!([cond]),
    }
    Ok(())
}

/// The pod of `cached` (its JSON in the watch cache) assigned to `node` at
/// `now`, as the store is to hold it; None when the JSON is not in the
/// shape the cache writes.
pub fn assign(cached: &[u8], node: &str, now: &str) -> Option<Result<Vec<u8>, Refusal>> {
    let mut top = Entries::of(std::str::from_utf8(cached).ok()?)?;
    // The cache leads with kind and apiVersion; the store sorts every key.
    top.0.sort_by(|a, b| a.0.cmp(&b.0));
    if !top.sorted() {
        return None;
    }
    // Refusals in the order the decoded path checks them.
    let assigned = top.get("spec").and_then(|s| Entries::of(s.get())).and_then(|s| s.get("nodeName"));
    if let Some(Value::String(n)) = assigned.and_then(|n| serde_json::from_str(n.get()).ok()) {
        if !n.is_empty() {
            return Some(Err(Refusal::AlreadyAssigned(n)));
        }
    }
    let meta = top.get("metadata").and_then(|m| Entries::of(m.get()));
    if meta.as_ref().is_some_and(|m| m.get("deletionTimestamp").is_some()) {
        return Some(Err(Refusal::BeingDeleted));
    }
    // metadata without its resourceVersion; one that is not a map is kept
    // as it is, as the store's encoder keeps it.
    let metadata = match (top.get("metadata"), &meta) {
        (Some(_), Some(m)) if m.sorted() => {
            let mut without = Vec::new();
            m.write_changed(&mut without, &[("resourceVersion", None)]);
            Some(without)
        }
        (Some(raw), _) if raw.get().starts_with('{') => return None,
        _ => None,
    };
    let spec = spec(top.get("spec"), node)?;
    let status = status(top.get("status"), now)?;
    let mut changes = Vec::with_capacity(3);
    if let Some(m) = &metadata {
        changes.push(("metadata", Some(m.as_slice())));
    }
    changes.push(("spec", Some(spec.as_slice())));
    changes.push(("status", Some(status.as_slice())));
    let mut out = Vec::with_capacity(cached.len() + 128);
    top.write_changed(&mut out, &changes);
    Some(Ok(out))
}

/// The spec with `nodeName` set (a missing or null spec becomes one with
/// only that, as indexing a `Value` makes it).
fn spec(raw: Option<&RawValue>, node: &str) -> Option<Vec<u8>> {
    let mut name = Vec::new();
    write_str(&mut name, node);
    with_entry(raw, "nodeName", &name)
}

/// The status with its PodScheduled condition replaced by one of `now`.
fn status(raw: Option<&RawValue>, now: &str) -> Option<Vec<u8>> {
    let mut cond = Vec::new();
    let mut c = MapWriter::new(&mut cond);
    c.entry("lastProbeTime", b"null");
    let mut at = Vec::new();
    write_str(&mut at, now);
    c.entry("lastTransitionTime", &at);
    c.entry("status", b"\"True\"");
    c.entry("type", b"\"PodScheduled\"");
    c.end();
    let existing = raw.and_then(|r| Entries::of(r.get())).and_then(|s| s.get("conditions"));
    let kept: Vec<&RawValue> = match existing.map(|c| serde_json::from_str::<Vec<&RawValue>>(c.get())) {
        Some(Ok(conditions)) => conditions.into_iter().filter(|c| !is_pod_scheduled(c)).collect(),
        // Not an array: replaced, as `status["conditions"] = [cond]` does.
        Some(Err(_)) | None => Vec::new(),
    };
    let mut list = vec![b'['];
    for c in kept {
        list.extend_from_slice(c.get().as_bytes());
        list.push(b',');
    }
    list.extend_from_slice(&cond);
    list.push(b']');
    with_entry(raw, "conditions", &list)
}

fn is_pod_scheduled(condition: &RawValue) -> bool {
    Entries::of(condition.get())
        .and_then(|c| c.get("type"))
        .and_then(|t| serde_json::from_str::<Value>(t.get()).ok())
        .is_some_and(|t| t == "PodScheduled")
}

/// The map `raw` (none or null: an empty one) with `key` set to `value` at
/// its sorted place; None when `raw` is another JSON value or not sorted.
fn with_entry(raw: Option<&RawValue>, key: &str, value: &[u8]) -> Option<Vec<u8>> {
    let entries = match raw.map(RawValue::get) {
        None | Some("null") => Entries(Vec::new()),
        Some(json) => Entries::of(json).filter(Entries::sorted)?,
    };
    let mut out = Vec::with_capacity(raw.map_or(0, |r| r.get().len()) + value.len() + 16);
    entries.write_changed(&mut out, &[(key, Some(value))]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The slow path: the cached pod decoded, changed as the binding
    /// changes it, and encoded for the store.
    fn decoded(cached: &[u8], node: &str, now: &str) -> Result<Vec<u8>, Refusal> {
        let mut new: Value = serde_json::from_slice(cached).unwrap();
        assign_decoded(&mut new, node, now)?;
        Ok(crate::apiserver::storage::encode(&new).unwrap())
    }

    /// The pod as the watch cache holds it.
    fn cached(pod: &Value) -> Vec<u8> {
        crate::apiserver::field_order::to_json(pod).into_bytes()
    }

    #[test]
    fn the_bound_pod_is_byte_for_byte_what_decoding_and_encoding_make() {
        let pods = [
            json!({"kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7", "uid": "u",
                    "labels": {"a": "b\"c"}, "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
                "spec": {"containers": [{"name": "c", "image": "busybox"}], "schedulerName": "default-scheduler", "zeta": 0.5},
                "status": {"phase": "Pending", "qosClass": "BestEffort",
                    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                                   {"type": "Other", "status": "True"}, "odd"]}}),
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "bare", "resourceVersion": "1"}}),
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "n"}, "spec": null, "status": null}),
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "n"}, "spec": {"nodeName": ""},
                "status": {"conditions": "not a list", "phase": "Pending"}, "extra": {"é": "☃"}}),
            json!({"apiVersion": "v1", "metadata": {"name": "n"}, "aaa": 1, "spec": {}, "status": {}}),
        ];
        for pod in pods {
            let cached = cached(&pod);
            let got = assign(&cached, "node-1", "2026-11-28T10:00:00Z").expect("the cache's shape");
            let want = decoded(&cached, "node-1", "2026-11-28T10:00:00Z");
            let show = |a: &Result<Vec<u8>, Refusal>| match a {
                Ok(b) => String::from_utf8_lossy(b).into_owned(),
                Err(refused) => format!("{refused:?}"),
            };
            assert_eq!(show(&got), show(&want), "{pod}");
        }
    }

    #[test]
    fn an_assigned_or_deleted_pod_is_refused() {
        let assigned = cached(&json!({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "node-2"}}));
        assert_eq!(assign(&assigned, "node-1", "t"), Some(Err(Refusal::AlreadyAssigned("node-2".into()))));
        let deleted =
            cached(&json!({"kind": "Pod", "metadata": {"name": "p", "deletionTimestamp": "2026-11-28T10:00:00Z"}}));
        assert_eq!(assign(&deleted, "node-1", "t"), Some(Err(Refusal::BeingDeleted)));
        assert_eq!(assign(br#"{"kind":"Pod","kind":"Pod"}"#, "n", "t"), None, "a repeated key");
        assert_eq!(assign(br#"{"metadata":{"uid":"u","name":"p"}}"#, "n", "t"), None, "metadata out of order");
        assert_eq!(assign(br#"{"spec":"text"}"#, "n", "t"), None, "a spec that is not a map");
    }
}
