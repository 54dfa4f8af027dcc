//! delete and deletecollection: preconditions, graceful deletion
//! (finalizers, a pod's grace period) and the propagation policy the
//! garbage collector follows.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::read::typed;
use super::write::write_error;
use super::{decode_body, Call};
use crate::apiserver::admission::{self, Operation};
use crate::apiserver::meta::{self, metadata_mut, name_of};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::storage::{set_resource_version, Stored, WriteError};

/// The DeleteOptions of a request: body or query.
fn delete_options(call: &Call, body: &Bytes) -> ApiResult<Value> {
    let mut opts = if body.is_empty() { json!({}) } else { decode_body(&call.headers, body)? };
    if let Some(g) = call.param("gracePeriodSeconds").and_then(|g| g.parse::<i64>().ok()) {
        opts["gracePeriodSeconds"] = json!(g);
    }
    if let Some(p) = call.param("propagationPolicy") {
        opts["propagationPolicy"] = json!(p);
    }
    Ok(opts)
}

/// At most this many attempts when the object keeps changing under a
/// delete (upstream retries without a limit; a writer that changes the
/// object this often is a bug of its own).
const DELETE_ATTEMPTS: usize = 64;

/// Why one attempt at a delete did not finish.
enum Attempt {
    /// The object changed since it was read: try again from this version.
    Changed(Stored),
    Failed(ApiError),
}

impl From<ApiError> for Attempt {
    fn from(e: ApiError) -> Self {
        Attempt::Failed(e)
    }
}

/// Deletes one stored object, gracefully when it has finalizers or is a
/// pod on a node; returns the answer body and code. As upstream's store
/// does, a write that races the delete is not the client's concern: the
/// preconditions are checked again against the newer object and the
/// delete is tried again, so a delete answers 409 only for a failed
/// precondition.
pub async fn delete_object(call: &Call, mut old: Stored, opts: &Value) -> ApiResult<(StatusCode, Value)> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match delete_once(call, old, opts).await {
            Ok(done) => return Ok(done),
            Err(Attempt::Failed(e)) => return Err(e),
            Err(Attempt::Changed(current)) if attempts < DELETE_ATTEMPTS => old = current,
            Err(Attempt::Changed(current)) => {
                let name = name_of(&current.object).to_string();
                return Err(write_error(call, &name, WriteError::Changed(Some(current))));
            }
        }
    }
}

/// What a write to the store failed with, for one attempt of a delete.
async fn attempt_error(call: &Call, name: &str, e: WriteError) -> Attempt {
    match e {
        // The newer object as the call serves it (stored in another version or not).
        WriteError::Changed(Some(current)) => match call.served(current).await {
            Ok(current) => Attempt::Changed(current),
            Err(e) => Attempt::Failed(e),
        },
        other => Attempt::Failed(write_error(call, name, other)),
    }
}

async fn delete_once(call: &Call, old: Stored, opts: &Value) -> Result<(StatusCode, Value), Attempt> {
    let r = &call.resource;
    let name = name_of(&old.object).to_string();
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str) {
        if old.object.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return Err(Attempt::Failed(ApiError::conflict(
                &r.group,
                &r.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old.object.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default()
                ),
            )));
        }
    }
    if let Some(rv) = opts.pointer("/preconditions/resourceVersion").and_then(Value::as_str) {
        if rv != old.rev.to_string() {
            return Err(Attempt::Failed(ApiError::conflict(
                &r.group,
                &r.plural,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rev
                ),
            )));
        }
    }
    admission::validate(call, &old.object, Some(&old.object), Operation::Delete).await?;
    let rules = r.strategy.delete_rules();
    let finalizers =
        old.object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    let grace = (rules.grace_period)(&old.object, opts.get("gracePeriodSeconds").and_then(Value::as_i64));
    // Foreground and Orphan propagation hand the object to the garbage
    // collector through a finalizer, as upstream does; Background (the
    // default) deletes now and leaves the dependents to the collector.
    let orphan_dependents = opts.get("orphanDependents").and_then(Value::as_bool).and_then(|o| o.then_some("Orphan"));
    let policy = opts.get("propagationPolicy").and_then(Value::as_str).or(orphan_dependents);
    let propagation_finalizer = match policy {
        Some("Foreground") => Some("foregroundDeletion"),
        Some("Orphan") => Some("orphan"),
        Some("Background") | None => None,
        Some(other) => {
            let message =
                format!("Unsupported value: {other:?}: supported values: \"Background\", \"Foreground\", \"Orphan\"");
            let cause = Cause { reason: "FieldValueNotSupported", message, field: "propagationPolicy".into() };
            return Err(Attempt::Failed(ApiError::invalid(&r.group, "DeleteOptions", &name, vec![cause])));
        }
    };
    let graceful = finalizers || rules.terminate.is_some() || grace.is_some() || propagation_finalizer.is_some();
    if !graceful {
        if !call.dry_run() {
            let key = r.key(meta::namespace_of(&old.object), &name);
            if let Err(e) = call.api.storage.delete(&key, old.rev).await {
                return Err(attempt_error(call, &name, e).await);
            }
        }
        return Ok((StatusCode::OK, typed(call, old.object)));
    }
    if old.object.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok((StatusCode::OK, typed(call, old.object)));
    }
    let mut new = old.object.clone();
    let now = meta::unix_now();
    let m = metadata_mut(&mut new);
    let grace = grace.unwrap_or(0);
    m.insert("deletionTimestamp".into(), json!(meta::rfc3339(now + grace)));
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if let Some(f) = propagation_finalizer {
        let list = m.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(a) = list.as_array_mut() {
            if !a.iter().any(|x| x == f) {
                a.push(json!(f));
            }
        }
    }
    if let Some(terminate) = rules.terminate {
        terminate(&mut new);
    }
    if call.dry_run() {
        return Ok((StatusCode::OK, typed(call, new)));
    }
    let key = r.key(meta::namespace_of(&old.object), &name);
    let stored_form = r.to_storage(&new).await?;
    let rev = match call.api.storage.update(&key, stored_form.as_ref().unwrap_or(&new), old.rev).await {
        Ok(rev) => rev,
        Err(e) => return Err(attempt_error(call, &name, e).await),
    };
    set_resource_version(&mut new, rev);
    Ok((StatusCode::OK, typed(call, new)))
}

pub async fn delete(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let opts = delete_options(call, &body)?;
    let old = call.load_object().await?;
    let (code, out) = delete_object(call, old, &opts).await?;
    Ok(call.respond(code, &out))
}

pub async fn delete_collection(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let opts = delete_options(call, &body)?;
    let labels = crate::apiserver::selector::LabelSelector::parse(call.param("labelSelector").unwrap_or_default())?;
    let fields = crate::apiserver::selector::FieldSelector::parse(
        call.param("fieldSelector").unwrap_or_default(),
        &call.resource.group,
        &call.resource.kind,
    )?;
    let prefix = call.resource.list_prefix(call.namespace());
    let (items, _) = call.api.storage.list_all(&prefix).await?;
    // Selectors read the served form.
    let served = call.served_all(items).await?;
    let picked = served.into_iter().filter(|s| labels.matches_object(&s.object) && fields.matches(&s.object));
    let mut deleted = Vec::new();
    for stored in picked {
        match delete_object(call, stored, &opts).await {
            Ok((_, obj)) => deleted.push(obj),
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let r = &call.resource;
    let list = json!({"kind": r.list_kind, "apiVersion": r.api_version(), "metadata": {}, "items": deleted});
    Ok(call.respond(StatusCode::OK, &list))
}
