//! create and update, and the scale subresource (delete is in `delete`);
//! and how a prepared object is stored: a new one (names generated again
//! when taken), an update (retried from the store's copy when the watch
//! cache's was stale), the conflicts a write can meet, and its answer.
//! Every write goes through `admit_create` or `admit_update` (`admit`:
//! defaulting, metadata rules, the status/spec split, validation) before
//! it reaches the store.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::admit::{admit_create, admit_update, check_namespace};
use super::read::{object_response, scale_of, wants_metadata};
use super::{decode_body, Call};
use crate::apiserver::call::Origin;
use crate::apiserver::meta::{self, metadata_mut, name_of};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::storage::{set_resource_version, Encoded, Stored, WriteError};
use crate::apiserver::table::wants_table;

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
    let typed: k8s_openapi::api::autoscaling::v1::Scale = crate::decode::from_value(scale)
        .map_err(|e| ApiError::bad_request(format!("Scale in version \"v1\" cannot be handled as a Scale: {e}")))?;
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
