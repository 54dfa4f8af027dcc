//! create and update, and the scale subresource (delete is in `delete`).
//! Every write goes through `admit_create` or `admit_update` (defaulting,
//! metadata rules, the status/spec split, validation) before it reaches
//! the store.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::read::{object_response, scale_of, wants_metadata};
use super::{decode_body, Call};
use crate::apiserver::admission::{self, Operation};
use crate::apiserver::call::Origin;
use crate::apiserver::meta::{self, metadata_mut, name_of};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::storage::{set_resource_version, Encoded, Stored, WriteError};
use crate::apiserver::strategy::check_name;
use crate::apiserver::table::wants_table;

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
fn fields_checked(call: &mut Call, decoded: Result<(Value, Vec<String>), String>) -> ApiResult<Value> {
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
async fn check_namespace(call: &Call, creating: bool) -> ApiResult<()> {
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

pub async fn create(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let obj = decode_body(&call.headers, &body)?;
    check_namespace(call, true).await?;
    // A name given wins over generateName, as upstream: it is never
    // replaced when taken (409), only a generated one is.
    let named = obj.pointer("/metadata/name").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let mut obj = admit_create(call, obj).await?;
    if let Some(m) = obj.pointer_mut("/metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    call.record_update(None, &mut obj, None);
    let name = if named { NewName::Given } else { NewName::Generated };
    Ok(store_new(call, obj, name).await?.response(call))
}

/// Where a new object's name came from: a name given is never replaced,
/// a generated one is generated again when taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewName {
    Given,
    Generated,
}

/// A written object as `store_new` or `store_update` left it.
pub struct Written {
    code: StatusCode,
    /// resourceVersion set.
    object: Value,
    /// The stored encoding and its revision (None on a dry run, a write
    /// with nothing to change, or a delete), from which the answer is put
    /// together instead of encoding the object again.
    stored: Option<(Encoded, i64)>,
}

impl Written {
    /// An answer encoded from the object itself.
    fn unstored(code: StatusCode, object: Value) -> Self {
        Written { code, object, stored: None }
    }

    /// The object written, resourceVersion set.
    pub fn object(&self) -> &Value {
        &self.object
    }

    /// The answer to the write: the stored JSON put together in the
    /// answer's form (apiVersion and kind first, the resourceVersion set), the
    /// object encoded when the client asked for a Table, metadata only,
    /// YAML, or the bytes are not in the store's encoding.
    pub fn response(self, call: &Call) -> Response {
        let plain_json = !wants_metadata(call.accept()) && !wants_table(call.accept());
        if let Some((stored, rev)) = self.stored.as_ref().filter(|_| plain_json) {
            let (api_version, kind) = (call.resource.api_version(), &call.resource.kind);
            if let Some(json) = stored.answer(*rev, &api_version, kind) {
                if let Some(resp) = call.respond_json_bytes(self.code, json) {
                    return resp;
                }
            }
        }
        object_response(call, self.code, self.object)
    }
}

/// The bytes `obj` is stored as: its own, or its storage form's when the
/// resource is stored in another version (that form is given back too).
async fn encode_for_storage(call: &Call, obj: &Value) -> ApiResult<(Encoded, Option<Value>)> {
    match call.resource.to_storage(obj).await? {
        Some(stored) => Ok((Encoded::of(&stored)?, Some(stored))),
        None => Ok((Encoded::of(obj)?, None)),
    }
}

/// What a write answers: the object written, from the bytes stored when
/// they are its own; an object stored in another version is read back
/// from its storage form, as upstream decodes what it stored (a
/// conversion that loses a field shows in the answer).
async fn written(
    call: &Call,
    code: StatusCode,
    mut obj: Value,
    encoded: Encoded,
    converted: Option<Value>,
    rev: i64,
) -> ApiResult<Written> {
    let Some(stored_form) = converted else {
        set_resource_version(&mut obj, rev);
        return Ok(Written { code, object: obj, stored: Some((encoded, rev)) });
    };
    let served = call.served(Stored { object: stored_form, rev }).await?;
    Ok(Written { code, object: served.object, stored: None })
}

/// Stores a prepared new object (retrying generated names that collide).
pub async fn store_new(call: &Call, mut obj: Value, name_from: NewName) -> ApiResult<Written> {
    let r = &call.resource;
    let key = r.key(meta::namespace_of(&obj), name_of(&obj));
    let _held = r.begin_write(&mut obj, &key, None).await?;
    if call.dry_run() {
        return Ok(Written::unstored(StatusCode::CREATED, obj));
    }
    for _ in 0..8 {
        let name = name_of(&obj).to_string();
        let key = r.key(meta::namespace_of(&obj), &name);
        let (encoded, converted) = encode_for_storage(call, &obj).await?;
        match call.api.storage.create_encoded(&key, encoded.bytes.clone()).await {
            Ok(rev) => return written(call, StatusCode::CREATED, obj, encoded, converted, rev).await,
            Err(WriteError::Exists) => {
                let prefix = obj.pointer("/metadata/generateName").and_then(Value::as_str).map(str::to_string);
                match prefix {
                    Some(p) if name_from == NewName::Generated && !p.is_empty() => {
                        metadata_mut(&mut obj).insert("name".into(), json!(meta::generate_name(&p)));
                    }
                    _ => return Err(ApiError::already_exists(&r.group, &r.plural, &name)),
                }
            }
            Err(WriteError::Changed(_)) => return Err(ApiError::internal("unexpected precondition failure on create")),
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::new(500, "AlreadyExists", "could not find a free generated name"))
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

/// What `store_update` did.
pub enum Updated {
    /// Written (or nothing to write): the answer.
    Done(Written),
    /// The old object came from the watch cache and the store has a newer
    /// one (or the write would have changed nothing, which only the store's
    /// copy can tell): read the store and try again.
    Stale,
}

/// Writes an admitted update; an object whose deletion waited only on
/// finalizers that are now gone is deleted instead.
pub async fn store_update(call: &Call, new: Value, old: &Stored, origin: Origin) -> ApiResult<Updated> {
    or_stale(write_update(call, new, old, origin).await, origin).map(|u| u.unwrap_or(Updated::Stale))
}

/// A step of an update from the watch cache's copy that failed is taken
/// again from the store's (None: read the store and try again), as
/// upstream's GuaranteedUpdate does: the error may be the stale copy's.
pub fn or_stale<T>(step: ApiResult<T>, origin: Origin) -> ApiResult<Option<T>> {
    match step {
        Err(_) if origin == Origin::Cache => Ok(None),
        step => step.map(Some),
    }
}

async fn write_update(call: &Call, mut new: Value, old: &Stored, origin: Origin) -> ApiResult<Updated> {
    let r = &call.resource;
    let name = name_of(&new).to_string();
    let key = r.key(meta::namespace_of(&new), &name);
    let _held = r.begin_write(&mut new, &key, Some(&old.object)).await?;
    let finished = new.pointer("/metadata/deletionTimestamp").is_some()
        && new.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(|f| f.is_empty())
        && !(r.strategy.delete_rules().waits)(&new);
    if call.dry_run() {
        return Ok(Updated::Done(Written::unstored(StatusCode::OK, new)));
    }
    if finished {
        return match call.api.storage.delete(&key, old.rev).await {
            Ok(_) => Ok(Updated::Done(Written::unstored(StatusCode::OK, new))),
            Err(e) => Err(write_error(call, &name, e)),
        };
    }
    if new == old.object {
        if origin == Origin::Cache {
            return Ok(Updated::Stale);
        }
        return Ok(Updated::Done(Written::unstored(StatusCode::OK, old.object.clone())));
    }
    let (encoded, converted) = encode_for_storage(call, &new).await?;
    match call.api.storage.update_encoded(&key, encoded.bytes.clone(), old.rev).await {
        Ok(rev) => Ok(Updated::Done(written(call, StatusCode::OK, new, encoded, converted, rev).await?)),
        Err(e) => Err(write_error(call, &name, e)),
    }
}

pub fn write_error(call: &Call, name: &str, e: WriteError) -> ApiError {
    let r = &call.resource;
    match e {
        WriteError::Changed(None) => ApiError::not_found(&r.group, &r.plural, name),
        WriteError::Changed(Some(_)) => modified(call, name),
        WriteError::Exists => ApiError::already_exists(&r.group, &r.plural, name),
        WriteError::Api(e) => e,
    }
}

/// Upstream's 409 for a write that lost a race or named an older
/// `resourceVersion`.
fn modified(call: &Call, name: &str) -> ApiError {
    let r = &call.resource;
    ApiError::conflict(
        &r.group,
        &r.plural,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// A `resourceVersion` precondition (when `rv` is set) against the
/// revision of the object the write starts from.
pub fn check_resource_version(call: &Call, rv: Option<&str>, current: i64) -> ApiResult<()> {
    match rv.filter(|v| !v.is_empty()) {
        Some(v) if v != current.to_string() => Err(modified(call, call.path.name.as_deref().unwrap_or_default())),
        _ => Ok(()),
    }
}

pub async fn update(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let new = decode_body(&call.headers, &body)?;
    let rv = meta::str_at(&new, &["metadata", "resourceVersion"]).map(str::to_string);
    for want in [Origin::Cache, Origin::Store] {
        let (old, origin) = call.load_old(want).await?;
        if or_stale(check_resource_version(call, rv.as_deref(), old.rev), origin)?.is_none() {
            continue;
        }
        let Some(mut new) = or_stale(admit_update(call, new.clone(), &old.object).await, origin)? else { continue };
        let sub = call.path.subresource.clone();
        call.record_update(Some(&old.object), &mut new, sub.as_deref());
        if let Updated::Done(written) = store_update(call, new, &old, origin).await? {
            return Ok(written.response(call));
        }
    }
    Err(ApiError::internal("an update from the store's copy was answered as stale"))
}

pub async fn update_scale(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let scale = decode_body(&call.headers, &body)?;
    let replicas = replicas_of(&scale)?;
    set_replicas(call, replicas, meta::str_at(&scale, &["metadata", "resourceVersion"]).map(str::to_string)).await
}

/// `spec.replicas` of an `autoscaling/v1` Scale body, decoded as upstream
/// does: absent is 0 (Go's zero value); anything but an int32 is refused.
pub fn replicas_of(scale: &Value) -> ApiResult<i64> {
    let typed: k8s_openapi::api::autoscaling::v1::Scale = serde_path_to_error::deserialize(scale).map_err(|e| {
        ApiError::bad_request(format!(
            "Scale in version \"v1\" cannot be handled as a Scale: {}: {}",
            e.path(),
            e.inner()
        ))
    })?;
    Ok(typed.spec.and_then(|s| s.replicas).map(i64::from).unwrap_or(0))
}

/// Sets spec.replicas through the scale subresource. Without a
/// resourceVersion precondition a write that lost a race with another
/// writer (a controller updating status) is retried on the newer object,
/// as upstream's GuaranteedUpdate does.
pub async fn set_replicas(call: &mut Call, replicas: i64, rv: Option<String>) -> ApiResult<Response> {
    let name = call.path.name.clone().unwrap_or_default();
    let pinned = rv.as_deref().is_some_and(|v| !v.is_empty());
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            &name,
            vec![Cause::invalid(
                "spec.replicas",
                format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            )],
        ));
    }
    let mut want = Origin::Cache;
    for _ in 0..16 {
        let (old, origin) = call.load_old(want).await?;
        if or_stale(check_resource_version(call, rv.as_deref(), old.rev), origin)?.is_none() {
            want = Origin::Store;
            continue;
        }
        let mut new = old.object.clone();
        match new.get_mut("spec") {
            Some(Value::Object(spec)) => {
                spec.insert("replicas".into(), json!(replicas));
            }
            _ => new["spec"] = json!({ "replicas": replicas }),
        }
        call.path.subresource = None;
        let Some(mut new) = or_stale(admit_update(call, new, &old.object).await, origin)? else {
            want = Origin::Store;
            continue;
        };
        call.record_update(Some(&old.object), &mut new, Some("scale"));
        match store_update(call, new, &old, origin).await {
            Ok(Updated::Done(written)) => return Ok(call.respond(StatusCode::OK, &scale_of(call, written.object()))),
            Ok(Updated::Stale) => want = Origin::Store,
            Err(e) if e.code == 409 && e.reason == "Conflict" && !pinned => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(409, "Conflict", "the scale could not be applied after repeated conflicts"))
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
