//! `pods/binding`: how the scheduler (or anyone with the right) assigns a
//! pod to a node.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::assign_pod;
use super::write::write_error;
use super::{decode_body, Call};
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::storage::WriteError;

/// `POST namespaces/<ns>/bindings`: the same as `pods/<name>/binding` for
/// the pod the Binding's `metadata.name` names.
pub async fn bind_named(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let binding = decode_body(&call.headers, &body)?;
    let name = meta::str_at(&binding, &["metadata", "name"]).unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid("", "Binding", "", vec![Cause::required("metadata.name")]));
    }
    let pods = call.api.registry.get("", "v1", "pods").ok_or_else(|| ApiError::internal("pods are not served"))?;
    call.resource = pods;
    call.path.plural = "pods".into();
    call.path.name = Some(name);
    call.path.subresource = Some("binding".into());
    bind(call, body).await
}

/// `pods/binding`: sets spec.nodeName of a pod that has none.
pub async fn bind(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let binding = decode_body(&call.headers, &body)?;
    let target = meta::str_at(&binding, &["target", "name"]).unwrap_or_default().to_string();
    if target.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            call.path.name.as_deref().unwrap_or_default(),
            vec![Cause::required("target.name")],
        ));
    }
    let name = call.path.name.clone().unwrap_or_default();
    let key = call.resource.key(call.namespace(), &name);
    let now = meta::now_rfc3339();
    // The cached pod first, assigned without decoding it; when the store
    // has a newer one, that one (as upstream's GuaranteedUpdate does with
    // its cached first guess).
    let cached = if call.dry_run() { None } else { call.api.watch_cache.cached(&call.resource, &key) };
    let assignment = cached.as_ref().and_then(|pod| {
        assign_pod::assign(&pod.json(&call.resource.api_version(), &call.resource.kind), &target, &now)
    });
    let mut old = match (assignment, cached) {
        (Some(Err(refused)), _) => return Err(refused.error(&name)),
        (Some(Ok(stored)), Some(pod)) => match call.api.storage.update_encoded(&key, stored, pod.rev).await {
            Ok(_) => return Ok(created(call)),
            Err(WriteError::Changed(Some(current))) => current,
            Err(e) => return Err(write_error(call, &name, e)),
        },
        _ => call.load_object_cached_first().await?,
    };
    for attempt in 0.. {
        let (mut new, rev) = (old.object, old.rev);
        assign_pod::assign_decoded(&mut new, &target, &now).map_err(|refused| refused.error(&name))?;
        if call.dry_run() {
            break;
        }
        match call.api.storage.update(&key, &new, rev).await {
            Ok(_) => break,
            Err(WriteError::Changed(Some(current))) if attempt < 3 => old = current,
            Err(e) => return Err(write_error(call, &name, e)),
        }
    }
    Ok(created(call))
}

fn created(call: &Call) -> Response {
    call.respond(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}
