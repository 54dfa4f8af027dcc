//! Ephemeral containers of a pod: what upstream's validation checks of
//! `spec.ephemeralContainers` (validateEphemeralContainers), the
//! `pods/ephemeralcontainers` subresource's strategy
//! (EphemeralContainersStrategy: only spec.ephemeralContainers is written,
//! and existing ones may be neither changed nor removed), and the rules
//! that keep them out of pod creates and plain pod updates.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{check_name, NameRule};
use crate::well_known::annotations::CONFIG_MIRROR;

/// The subresource ephemeral containers are added through.
pub const SUBRESOURCE: &str = "ephemeralcontainers";

/// Fields of an ephemeral container that must stay unset (upstream's
/// allowedEphemeralContainerFields marks these false), in the order of
/// the type's fields.
const FORBIDDEN_FIELDS: &[&str] = &[
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

/// Upstream's wording of a pod update that touches what may not change.
const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_zero),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
    }
}

fn names_of<'a>(spec: Option<&'a Value>, key: &str) -> impl Iterator<Item = &'a str> {
    spec.and_then(|s| s.get(key))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
}

/// upstream's validateEphemeralContainers, for `spec` at `path` ("spec").
pub fn validate_ephemeral_containers(spec: Option<&Value>, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(list) = spec.and_then(|s| s.get("ephemeralContainers")).and_then(Value::as_array) else {
        return causes;
    };
    let others: HashSet<&str> = names_of(spec, "containers").chain(names_of(spec, "initContainers")).collect();
    let mut all = others.clone();
    for (i, ec) in list.iter().enumerate() {
        let at = format!("{path}.ephemeralContainers[{i}]");
        let name = ec.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            causes.push(Cause::required(format!("{at}.name")));
        } else if let Some(problem) = check_name(NameRule::Label, name).into_iter().next() {
            causes.push(Cause::invalid(format!("{at}.name"), format!("Invalid value: {name:?}: {problem}")));
        } else if !all.insert(name) {
            causes.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {name:?}"),
                field: format!("{at}.name"),
            });
        }
        if ec.get("image").and_then(Value::as_str).unwrap_or_default().is_empty() {
            causes.push(Cause::required(format!("{at}.image")));
        }
        if let Some(target) = ec.get("targetContainerName").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            if !others.contains(target) {
                causes.push(Cause {
                    reason: "FieldValueNotFound",
                    message: format!("Not found: {target:?}"),
                    field: format!("{at}.targetContainerName"),
                });
            }
        }
        for field in FORBIDDEN_FIELDS {
            if ec.get(*field).is_some_and(|v| !is_zero(v)) {
                causes.push(Cause::forbidden(
                    format!("{at}.{field}"),
                    "Forbidden: cannot be set for an Ephemeral Container",
                ));
            }
        }
        let mounts = ec.get("volumeMounts").and_then(Value::as_array).into_iter().flatten();
        for (j, m) in mounts.enumerate() {
            for field in ["subPath", "subPathExpr"] {
                if m.get(field).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                    causes.push(Cause::forbidden(
                        format!("{at}.volumeMounts[{j}].{field}"),
                        "Forbidden: cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
    causes
}

/// Upstream's dropNonEphemeralContainerUpdates with ResetObjectMetaForStatus:
/// the stored pod with only spec.ephemeralContainers taken from the request.
pub fn ephemeral_containers_update(new: Value, old: &Value) -> Value {
    let mut merged = old.clone();
    let list = new.pointer("/spec/ephemeralContainers").cloned();
    if let Some(spec) = merged.get_mut("spec").and_then(Value::as_object_mut) {
        match list {
            Some(l) if !l.is_null() => {
                spec.insert("ephemeralContainers".into(), l);
            }
            _ => {
                spec.remove("ephemeralContainers");
            }
        }
    }
    // Metadata stays the stored one (upstream resets labels, annotations,
    // finalizers and owners; the generic path settles the rest).
    merged
}

fn ephemeral_list(pod: &Value) -> Vec<Value> {
    pod.pointer("/spec/ephemeralContainers").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// A short description of how two containers differ, field by field.
fn diff(old: &Value, new: &Value) -> String {
    let (empty, mut keys) = (serde_json::Map::new(), Vec::new());
    let a = old.as_object().unwrap_or(&empty);
    let b = new.as_object().unwrap_or(&empty);
    for k in a.keys().chain(b.keys()) {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    let mut out = String::new();
    for k in keys {
        match (a.get(&k), b.get(&k)) {
            (x, y) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    out.push_str(&format!("-\t{k}: {x}\n"));
                }
                if let Some(y) = y {
                    out.push_str(&format!("+\t{k}: {y}\n"));
                }
            }
        }
    }
    out
}

/// upstream's ValidatePodEphemeralContainersUpdate, after the new pod's own
/// validation: static pods take none, and existing ones stay as they are.
fn validate_ephemeral_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mirror =
        old.pointer("/metadata/annotations").and_then(Value::as_object).is_some_and(|a| a.contains_key(CONFIG_MIRROR));
    if mirror {
        return vec![Cause::forbidden("[]", "Forbidden: static pods do not support ephemeral containers")];
    }
    let new_list = ephemeral_list(new);
    let mut causes = Vec::new();
    for o in ephemeral_list(old) {
        let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
        match new_list.iter().find(|n| n.get("name").and_then(Value::as_str) == Some(name)) {
            None => causes.push(Cause::forbidden(
                "spec.ephemeralContainers",
                format!("Forbidden: existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(n) if *n != o => causes.push(Cause::forbidden(
                format!("spec.ephemeralContainers[{name}]"),
                format!("Forbidden: existing ephemeral containers {name:?} may not be changed\n{}", diff(&o, n)),
            )),
            Some(_) => {}
        }
    }
    causes
}

/// The pod's change rules around ephemeral containers: none on create,
/// none changed by a plain update, only additions through the subresource.
pub fn validate_pod_change(subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    match (subresource, old) {
        (None, None) if !ephemeral_list(new).is_empty() => {
            vec![Cause::forbidden("spec.ephemeralContainers", "Forbidden: cannot be set on create")]
        }
        (None, Some(old)) if ephemeral_list(new) != ephemeral_list(old) => {
            let body = diff(
                &json!({"ephemeralContainers": ephemeral_list(old)}),
                &json!({"ephemeralContainers": ephemeral_list(new)}),
            );
            vec![Cause::forbidden("spec", format!("Forbidden: {POD_UPDATE_FORBIDDEN}\n{body}"))]
        }
        (Some(SUBRESOURCE), Some(old)) => validate_ephemeral_update(new, old),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ephemeral: Value) -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "app", "image": "i"}], "initContainers": [{"name": "init", "image": "i"}],
                     "ephemeralContainers": ephemeral},
            "status": {"phase": "Running"}
        })
    }

    fn fields(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn ephemeral_containers_are_checked_as_upstream() {
        let p = pod(json!([
            {"name": "d1", "image": "i", "targetContainerName": "app", "resources": {}},
            {"name": "app", "image": "i"},
            {"name": "d3", "targetContainerName": "nope", "ports": [{"containerPort": 80}],
             "readinessProbe": {"exec": {"command": ["true"]}}, "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "x"}]},
            {"name": "d4", "image": "i", "targetContainerName": "d1"}
        ]));
        let causes = validate_ephemeral_containers(p.get("spec"), "spec");
        assert_eq!(
            fields(&causes),
            [
                "spec.ephemeralContainers[1].name",
                "spec.ephemeralContainers[2].image",
                "spec.ephemeralContainers[2].targetContainerName",
                "spec.ephemeralContainers[2].ports",
                "spec.ephemeralContainers[2].readinessProbe",
                "spec.ephemeralContainers[2].volumeMounts[0].subPath",
                "spec.ephemeralContainers[3].targetContainerName",
            ]
        );
        assert_eq!(causes[0].message, "Duplicate value: \"app\"");
        assert_eq!(causes[2].message, "Not found: \"nope\"");
        assert_eq!(causes[3].message, "Forbidden: cannot be set for an Ephemeral Container");
        assert!(validate_ephemeral_containers(pod(json!([{"name": "d", "image": "i"}])).get("spec"), "spec").is_empty());
    }

    #[test]
    fn the_subresource_writes_ephemeral_containers_alone() {
        let old = pod(json!([]));
        let mut new = pod(json!([{"name": "d", "image": "i"}]));
        new["spec"]["containers"][0]["image"] = json!("other");
        new["metadata"]["labels"] = json!({});
        new["status"] = json!({});
        let merged = ephemeral_containers_update(new, &old);
        assert_eq!(merged["spec"]["containers"][0]["image"], "i");
        assert_eq!(merged["metadata"]["labels"]["a"], "b");
        assert_eq!(merged["status"]["phase"], "Running");
        assert_eq!(merged["spec"]["ephemeralContainers"][0]["name"], "d");
    }

    #[test]
    fn existing_ephemeral_containers_stay() {
        let old = pod(json!([{"name": "d", "image": "i"}]));
        let added = pod(json!([{"name": "d", "image": "i"}, {"name": "e", "image": "i"}]));
        assert!(validate_pod_change(Some(SUBRESOURCE), &added, Some(&old)).is_empty());
        let changed = pod(json!([{"name": "d", "image": "j"}]));
        let causes = validate_pod_change(Some(SUBRESOURCE), &changed, Some(&old));
        assert_eq!(fields(&causes), ["spec.ephemeralContainers[d]"]);
        assert!(causes[0].message.starts_with("Forbidden: existing ephemeral containers \"d\" may not be changed\n"));
        let removed = pod(json!([]));
        let causes = validate_pod_change(Some(SUBRESOURCE), &removed, Some(&old));
        assert_eq!(fields(&causes), ["spec.ephemeralContainers"]);
        let mut mirror = old.clone();
        mirror["metadata"]["annotations"] = json!({CONFIG_MIRROR: "x"});
        let causes = validate_pod_change(Some(SUBRESOURCE), &added, Some(&mirror));
        assert_eq!(causes[0].message, "Forbidden: static pods do not support ephemeral containers");
        // Not on create, not through the pod itself.
        assert_eq!(fields(&validate_pod_change(None, &old, None)), ["spec.ephemeralContainers"]);
        assert_eq!(fields(&validate_pod_change(None, &added, Some(&old))), ["spec"]);
        assert!(validate_pod_change(None, &old, Some(&old)).is_empty());
        assert!(validate_pod_change(Some("status"), &added, Some(&old)).is_empty());
    }
}
