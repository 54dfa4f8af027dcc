//! `pods/eviction`: a delete that PodDisruptionBudgets may refuse.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::delete::delete_object;
use super::{decode_body, Call};
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, ApiResult, Cause};

/// `pods/eviction`: deletes the pod unless a PodDisruptionBudget that
/// selects it allows no more disruptions.
pub async fn evict(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let eviction = decode_body(&call.headers, &body)?;
    let pod = call.load_object().await?;
    let ns = call.namespace().unwrap_or_default().to_string();
    let labels = pod.object.pointer("/metadata/labels").cloned();
    let pdbs = call
        .api
        .storage
        .list(
            &format!("/registry/policy/poddisruptionbudgets/{ns}/"),
            None,
            0,
            crate::apiserver::storage::ReadAt::Latest,
        )
        .await?;
    let terminal =
        matches!(pod.object.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded") | Some("Failed"));
    for pdb in pdbs.items {
        let selector = pdb.object.pointer("/spec/selector").cloned().unwrap_or(json!({}));
        if terminal || !crate::apiserver::selector::LabelSelector::from_object(&selector).matches(labels.as_ref()) {
            continue;
        }
        let allowed = pdb.object.pointer("/status/disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0);
        // A budget the DisruptionController has not caught up with allows nothing yet.
        let observed = pdb.object.pointer("/status/observedGeneration").and_then(Value::as_i64).unwrap_or(0);
        let generation = pdb.object.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        if observed < generation {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
            e.causes = vec![Cause {
                reason: "DisruptionBudget",
                message: format!(
                    "The disruption budget {} is still being processed by the server.",
                    meta::name_of(&pdb.object)
                ),
                field: String::new(),
            }];
            e.retry_after = Some(10);
            return Err(e);
        }
        if allowed < 1 {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
            e.causes = vec![Cause {
                reason: "DisruptionBudget",
                message: format!(
                    "The disruption budget {} needs {} healthy pods and has {} currently",
                    meta::name_of(&pdb.object),
                    pdb.object.pointer("/status/desiredHealthy").and_then(Value::as_i64).unwrap_or(0),
                    pdb.object.pointer("/status/currentHealthy").and_then(Value::as_i64).unwrap_or(0)
                ),
                field: String::new(),
            }];
            e.retry_after = Some(10);
            return Err(e);
        }
        // Count this disruption against the budget before deleting.
        let mut updated = pdb.object.clone();
        updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
        // Until the pod is gone, the DisruptionController must not count it
        // healthy again (it drops the entry after two minutes).
        if !updated["status"]["disruptedPods"].is_object() {
            updated["status"]["disruptedPods"] = json!({});
        }
        updated["status"]["disruptedPods"][meta::name_of(&pod.object)] = json!(meta::now_rfc3339());
        let key = format!("/registry/policy/poddisruptionbudgets/{ns}/{}", meta::name_of(&pdb.object));
        call.api.storage.update(&key, &updated, pdb.rev).await.map_err(|_| {
            ApiError::conflict(
                "policy",
                "poddisruptionbudgets",
                meta::name_of(&pdb.object),
                "the disruption budget changed; retry the eviction",
            )
        })?;
    }
    let opts = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
    call.path.subresource = None;
    delete_object(call, pod, &opts).await?;
    Ok(call.respond(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
