//! What a create or an update passes before it reaches the store
//! (upstream's `rest.BeforeCreate` and `BeforeUpdate`, with the admission
//! chain): the type checked against the URL, the body decoded through the
//! kind's strategy (unknown fields refused, warned about or dropped), the
//! namespace's lifecycle, the metadata only the server sets, the
//! status/spec split, defaulting, admission and validation.

use serde_json::{json, Value};

use super::Call;
use crate::apiserver::admission::{self, Operation};
use crate::apiserver::meta::{self, metadata_mut, name_of};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::strategy::{check_name, DecodeError};

/// Metadata fields only the server sets.
const SERVER_OWNED: &[&str] =
    &["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "selfLink"];

/// Checks apiVersion and kind against the URL, filling them in when absent.
fn check_type(call: &Call, obj: &mut Value) -> ApiResult<()> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request("the body of the request must be an object"));
    };
    let want_av = call.resource.api_version();
    match m.get("apiVersion").and_then(Value::as_str) {
        Some(av) if av != want_av => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )))
        }
        _ => {}
    }
    match m.get("kind").and_then(Value::as_str) {
        Some(k) if k != call.resource.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                call.resource.kind
            )))
        }
        _ => {}
    }
    if m.get("metadata").is_some_and(|v| !v.is_object() && !v.is_null()) {
        let kind = &call.resource.kind;
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{}\" cannot be handled as a {kind}: json: cannot unmarshal {} into Go struct field {kind}.metadata of type v1.ObjectMeta",
            call.resource.version,
            if m.get("metadata").is_some_and(Value::is_array) { "array" } else { "value" },
        )));
    }
    m.insert("apiVersion".into(), json!(want_av));
    m.insert("kind".into(), json!(call.resource.kind));
    Ok(())
}

/// Decodes through the typed strategy; unknown fields are refused, warned
/// about or dropped as `fieldValidation` says (Strict is kubectl's default).
fn decode(call: &mut Call, obj: &Value) -> ApiResult<Value> {
    let decoded = call.resource.strategy.decode(obj);
    fields_checked(call, decoded)
}

/// `decode` of an update's new object against the stored `old` one.
fn decode_update(call: &mut Call, new: Value, old: &Value) -> ApiResult<Value> {
    let decoded = call.resource.strategy.decode_update(new, old);
    fields_checked(call, decoded)
}

/// A decode's answer: its error as upstream words it, its unknown fields
/// refused or warned about.
fn fields_checked(call: &mut Call, decoded: Result<(Value, Vec<String>), DecodeError>) -> ApiResult<Value> {
    let r = call.resource.clone();
    let (decoded, unknown) = decoded.map_err(|e| {
        ApiError::bad_request(format!("{} in version \"{}\" cannot be handled as a {}: {e}", r.kind, r.version, r.kind))
    })?;
    if !unknown.is_empty() {
        match call.param("fieldValidation").unwrap_or("Warn") {
            "Strict" => {
                let list: Vec<String> =
                    unknown.iter().map(|f| format!("unknown field \"{}\"", f.trim_start_matches('.'))).collect();
                return Err(ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                    r.kind,
                    r.version,
                    r.kind,
                    list.join(", ")
                )));
            }
            "Ignore" => {}
            _ => {
                for f in &unknown {
                    call.warn(format!("unknown field \"{}\"", f.trim_start_matches('.')));
                }
            }
        }
    }
    Ok(decoded)
}

/// The namespace must exist and not be terminating (NamespaceLifecycle).
pub(super) async fn check_namespace(call: &Call, creating: bool) -> ApiResult<()> {
    let Some(ns) = call.namespace() else { return Ok(()) };
    if !call.resource.namespaced {
        return Ok(());
    }
    // The cache first; a namespace created a moment ago may not be in it yet.
    let namespace = match call.api.caches.namespaces.get(&format!("Namespace/{ns}")) {
        Some(o) => Some(o),
        None => {
            call.api.storage.get(&format!("/registry/namespaces/{ns}")).await?.map(|s| std::sync::Arc::new(s.object))
        }
    };
    match namespace {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(o) if creating && o.pointer("/metadata/deletionTimestamp").is_some() => Err(ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
            call.resource.plural,
            call.path.name.as_deref().unwrap_or_default()
        ))),
        Some(_) => Ok(()),
    }
}

/// Whether two objects are the same but for metadata and status (and
/// apiVersion and kind): what a generation counts, compared in place.
fn same_spec<'a>(a: &'a Value, b: &'a Value) -> bool {
    const NOT_SPEC: [&str; 4] = ["metadata", "status", "apiVersion", "kind"];
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    let spec = |m: &'a serde_json::Map<String, Value>| m.iter().filter(|(k, _)| !NOT_SPEC.contains(&k.as_str()));
    spec(a).count() == spec(b).count() && spec(a).all(|(k, v)| b.get(k) == Some(v))
}

/// Runs the strategy's validation, names included.
fn validate(call: &Call, obj: &mut Value, old: Option<&Value>) -> ApiResult<()> {
    let r = &call.resource;
    let name = name_of(obj).to_string();
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            message: "name or generateName is required".into(),
            field: "metadata.name".into(),
        });
    } else {
        for problem in check_name(r.strategy.name_rule(), &name) {
            causes.push(Cause::invalid("metadata.name", format!("Invalid value: {name:?}: {problem}")));
        }
    }
    if r.namespaced && meta::namespace_of(obj).is_none() {
        causes.push(Cause::required("metadata.namespace"));
    }
    causes.extend(crate::apiserver::validation::object_meta_maps(obj));
    causes.extend(r.strategy.validate(obj));
    causes.extend(r.strategy.validate_change(call.path.subresource.as_deref(), obj, old));
    if !causes.is_empty() {
        return Err(ApiError::invalid(&r.group, &r.kind, &name, causes));
    }
    Ok(())
}

/// Prepares a new object: type, namespace, name, server-owned metadata,
/// initial status, defaults and validation.
pub async fn admit_create(call: &mut Call, mut obj: Value) -> ApiResult<Value> {
    check_type(call, &mut obj)?;
    let r = call.resource.clone();
    if r.namespaced {
        let path_ns = call.namespace().map(str::to_string);
        let body_ns = meta::namespace_of(&obj).map(str::to_string);
        match (path_ns, body_ns) {
            (Some(p), Some(b)) if p != b => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            (Some(p), _) => {
                metadata_mut(&mut obj).insert("namespace".into(), json!(p));
            }
            (None, _) => return Err(ApiError::bad_request("the namespace of the object is required on create")),
        }
    } else {
        metadata_mut(&mut obj).remove("namespace");
    }
    let mut obj = decode(call, &obj)?;
    {
        let m = metadata_mut(&mut obj);
        for k in SERVER_OWNED {
            m.remove(*k);
        }
        m.remove("resourceVersion");
        let name = m.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if name.is_empty() {
            if let Some(prefix) = m.get("generateName").and_then(Value::as_str).filter(|p| !p.is_empty()) {
                let generated = meta::generate_name(prefix);
                m.insert("name".into(), json!(generated));
            }
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
        if r.strategy.tracks_generation() {
            m.insert("generation".into(), json!(1));
        }
    }
    if r.status {
        match r.strategy.initial_status(&obj) {
            Some(s) => obj["status"] = s,
            None => {
                if let Some(m) = obj.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    r.strategy.default(&mut obj);
    admission::mutate(call, &mut obj, None, Operation::Create).await?;
    r.strategy.default(&mut obj);
    validate(call, &mut obj, None)?;
    admission::validate(call, &obj, None, Operation::Create).await?;
    Ok(obj)
}

/// Prepares an update of `old` to `new` for the main resource or `status`.
pub async fn admit_update(call: &mut Call, mut new: Value, old: &Value) -> ApiResult<Value> {
    check_type(call, &mut new)?;
    let r = call.resource.clone();
    let name = call.path.name.clone().unwrap_or_default();
    match meta::str_at(&new, &["metadata", "name"]) {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => {}
    }
    if r.namespaced {
        match (meta::namespace_of(&new), call.namespace()) {
            (Some(b), Some(p)) if b != p => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
    }
    let mut new = decode_update(call, new, old)?;
    // status (and a CSR's approval) write the status part only; other
    // subresources write what their kind says.
    let status_only = matches!(call.path.subresource.as_deref(), Some("status") | Some("approval"));
    if let Some(sub) = call.path.subresource.as_deref().filter(|_| !status_only) {
        new = r.strategy.subresource_update(sub, new, old);
    }
    if status_only {
        // Only the status changes, and for a built-in kind its metadata
        // too (labels, annotations, finalizers: upstream's status
        // strategies reset the spec and a few metadata fields only); a
        // custom resource's metadata stays as it was, as upstream's.
        let mut merged = old.clone();
        merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        if let Some(m) = merged.as_object_mut() {
            if m.get("status").is_some_and(Value::is_null) {
                m.remove("status");
            }
        }
        if !r.strategy.is_custom() {
            if let Some(mut meta) = new.get("metadata").cloned() {
                for field in status_keeps_metadata(&r.group, &r.kind) {
                    match old.pointer(&format!("/metadata/{field}")) {
                        Some(v) => meta[*field] = v.clone(),
                        None => {
                            if let Some(m) = meta.as_object_mut() {
                                m.remove(*field);
                            }
                        }
                    }
                }
                merged["metadata"] = meta;
            }
        }
        // What else the kind's status (or a CSR's approval) keeps of the old object.
        new = r.strategy.subresource_update(call.path.subresource.as_deref().unwrap_or_default(), merged, old);
    } else if r.status {
        // A patch leaves the old status in place: copied only when it moved.
        match old.get("status") {
            Some(s) if new.get("status") != Some(s) => new["status"] = s.clone(),
            Some(_) => {}
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    {
        let no_meta = serde_json::Map::new();
        let old_meta = old.get("metadata").and_then(Value::as_object).unwrap_or(&no_meta);
        let m = metadata_mut(&mut new);
        m.insert("name".into(), json!(name));
        if let Some(ns) = old_meta.get("namespace") {
            m.insert("namespace".into(), ns.clone());
        }
        for k in SERVER_OWNED.iter().chain(&["managedFields"]) {
            match old_meta.get(*k) {
                Some(v) if m.get(*k) == Some(v) => None,
                Some(v) => m.insert(k.to_string(), v.clone()),
                None => m.remove(*k),
            };
        }
    }
    r.strategy.default(&mut new);
    if r.strategy.tracks_generation() && !status_only && !same_spec(&new, old) {
        let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0) + 1;
        metadata_mut(&mut new).insert("generation".into(), json!(g));
    }
    admission::mutate(call, &mut new, Some(old), Operation::Update).await?;
    r.strategy.default(&mut new);
    validate(call, &mut new, Some(old))?;
    admission::validate(call, &new, Some(old), Operation::Update).await?;
    Ok(new)
}

/// The metadata fields a status update of a built-in kind cannot change
/// (upstream's status strategies: a pod's owners, a Deployment's labels).
fn status_keeps_metadata(group: &str, kind: &str) -> &'static [&'static str] {
    match (group, kind) {
        ("", "Pod") => &["ownerReferences"],
        ("apps", "Deployment") => &["labels"],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::same_spec;
    use serde_json::json;

    #[test]
    fn a_spec_is_all_but_metadata_status_and_type() {
        let a = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"}, "spec": {"replicas": 1}, "status": {}});
        let relabelled =
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"replicas": 1}, "status": {"ready": 1}});
        assert!(same_spec(&a, &relabelled));
        assert!(!same_spec(&a, &json!({"metadata": {}, "spec": {"replicas": 2}})));
        assert!(!same_spec(&a, &json!({"spec": {"replicas": 1}, "template": {}})), "a field more");
        assert!(!same_spec(&json!({"spec": {}, "template": {}}), &json!({"spec": {}})), "a field less");
        assert!(same_spec(&json!({"data": {"k": "v"}}), &json!({"metadata": {"uid": "u"}, "data": {"k": "v"}})));
    }
}
