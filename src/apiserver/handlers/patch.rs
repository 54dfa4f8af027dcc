//! PATCH in its four forms: JSON patch, JSON merge patch, strategic merge
//! patch and server-side apply. A patch is applied to the stored object
//! and the result goes through the same admission as an update; a write
//! that loses a race with another is retried on the newer object.

use axum::body::Bytes;
use axum::http::header;
use axum::response::Response;
use serde_json::{json, Value};

use super::admit::{admit_create, admit_update};
use super::read::scale_of;
use super::write::{
    check_resource_version, or_stale, replicas_of, set_replicas, store_new, store_update, NewName, Updated,
};
use super::{decode_body, Call};
use crate::apiserver::call::Origin;
use crate::apiserver::patch::patch_meta::SchemaNode;
use crate::apiserver::patch::strategic::{strategic_merge, MergeRules};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{meta, patch::managed_fields};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Json,
    Merge,
    Strategic,
    Apply,
}

fn kind_of(call: &Call) -> ApiResult<Kind> {
    let ct = call.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    match ct.split(';').next().unwrap_or_default().trim() {
        "application/json-patch+json" => Ok(Kind::Json),
        "application/merge-patch+json" => Ok(Kind::Merge),
        "application/strategic-merge-patch+json" => Ok(Kind::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Kind::Apply),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// A JSON patch (RFC 6902) applied to a copy of `doc`. The copy is thrown
/// away on error, so the crate's undo (which panics when an undo step
/// fails, as a `move` into itself makes it) is never needed.
pub fn apply_json_patch(doc: &Value, patch: &Value) -> ApiResult<Value> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
        ApiError::bad_request(format!("the server rejected our request due to an error in our request: {e}"))
    })?;
    let mut doc = doc.clone();
    json_patch::patch_unsafe(&mut doc, &ops).map_err(|e| {
        ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}"))
    })?;
    Ok(doc)
}

fn apply_patch(kind: Kind, doc: &Value, patch: &Value, schema: SchemaNode) -> ApiResult<Value> {
    let mut doc = doc.clone();
    match kind {
        Kind::Json => doc = apply_json_patch(&doc, patch)?,
        Kind::Merge => json_patch::merge(&mut doc, patch),
        Kind::Strategic | Kind::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the body of a strategic merge patch must be an object"));
            }
            strategic_merge(&mut doc, patch, schema, MergeRules::Strategic);
        }
    }
    Ok(doc)
}

/// An apply configuration is an object whose metadata, when given, is an
/// object too (upstream decodes it into an Unstructured first).
fn check_apply_body(call: &Call, patch: &Value) -> ApiResult<()> {
    let shape = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if !patch.is_object() {
        return Err(ApiError::bad_request(format!(
            "error decoding YAML: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            shape(patch)
        )));
    }
    match patch.get("metadata") {
        None | Some(Value::Object(_)) => Ok(()),
        Some(other) => {
            let r = &call.resource;
            Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: json: cannot unmarshal {} into Go struct field {}.metadata of type v1.ObjectMeta",
                r.kind, r.version, r.kind, shape(other), r.kind
            )))
        }
    }
}

pub async fn patch(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let kind = kind_of(call)?;
    let patch = decode_body(&call.headers, &body)?;
    if kind == Kind::Apply && call.param("fieldManager").is_none() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    if kind == Kind::Apply {
        check_apply_body(call, &patch)?;
    }
    if kind == Kind::Strategic && call.resource.strategy.is_custom() {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let force = call.flag("force");
    let manager = call.manager();
    let api_version = call.resource.api_version();
    let schema = call.resource.strategy.patch_schema();
    let writer = managed_fields::Writer {
        manager: &manager,
        api_version: &api_version,
        schema: SchemaNode::of(schema.as_deref()),
    };
    let mut want = Origin::Cache;
    for _ in 0..16 {
        let (current, origin) = match call.load_old(want).await {
            Ok(c) => c,
            Err(e) if e.code == 404 && kind == Kind::Apply => {
                // Apply creates what does not exist yet.
                let mut obj = patch.clone();
                if let Some(name) = call.path.name.clone() {
                    meta::metadata_mut(&mut obj).insert("name".into(), json!(name));
                }
                let obj = managed_fields::apply(None, &obj, &writer, force)?;
                let obj = admit_create(call, obj).await?;
                return Ok(store_new(call, obj, NewName::Given).await?.response(call));
            }
            Err(e) => return Err(e),
        };
        let patched = if kind == Kind::Apply {
            managed_fields::apply(Some(&current.object), &patch, &writer, force)
        } else {
            apply_patch(kind, &current.object, &patch, writer.schema)
        };
        let rv = meta::str_at(&patch, &["metadata", "resourceVersion"]);
        let patched = patched.and_then(|p| check_resource_version(call, rv, current.rev).map(|()| p));
        let Some(patched) = or_stale(patched, origin)? else {
            want = Origin::Store;
            continue;
        };
        // Apply computed the managedFields; other patches have them recorded below.
        let managed = if kind == Kind::Apply { patched.pointer("/metadata/managedFields").cloned() } else { None };
        let Some(mut new) = or_stale(admit_update(call, patched, &current.object).await, origin)? else {
            want = Origin::Store;
            continue;
        };
        if kind == Kind::Apply {
            if let Some(m) = managed {
                meta::metadata_mut(&mut new).insert("managedFields".into(), m);
            }
        } else {
            let sub = call.path.subresource.clone();
            call.record_update(Some(&current.object), &mut new, sub.as_deref());
        }
        match store_update(call, new, &current, origin).await {
            Ok(Updated::Done(written)) => return Ok(written.response(call)),
            Ok(Updated::Stale) => want = Origin::Store,
            Err(e)
                if e.code == 409
                    && e.reason == "Conflict"
                    && meta::str_at(&patch, &["metadata", "resourceVersion"]).is_none() =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(409, "Conflict", "the patch could not be applied after repeated conflicts"))
}

pub async fn patch_scale(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let kind = kind_of(call)?;
    let patch = decode_body(&call.headers, &body)?;
    let current = call.load_object().await?;
    let scale = scale_of(call, &current.object);
    let patched = apply_patch(kind, &scale, &patch, SchemaNode::none())?;
    let replicas = replicas_of(&patched)?;
    set_replicas(call, replicas, None).await
}
