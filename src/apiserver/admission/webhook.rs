//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook: the matching
//! webhooks of the stored configurations are called over HTTPS with an
//! `admission.k8s.io/v1` AdmissionReview; mutating ones may answer with a
//! JSON patch. A webhook behind a Service is reached at one of the
//! Service's ready endpoints, with the Service's DNS name for TLS.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::Operation;
use crate::apiserver::call::Call;
use crate::apiserver::selector::LabelSelector;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::webhook_client;

fn matches_list(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|a| a.iter().any(|v| v == "*" || v.as_str() == Some(want)))
}

fn rule_matches(rule: &Value, call: &Call, op: Operation) -> bool {
    let r = &call.resource;
    let resource = match &call.path.subresource {
        Some(s) => format!("{}/{s}", r.plural),
        None => r.plural.clone(),
    };
    let ops_ok = matches_list(&rule["operations"], op.as_str());
    let groups_ok = matches_list(&rule["apiGroups"], &r.group);
    let versions_ok = matches_list(&rule["apiVersions"], &r.version);
    let resources_ok = rule["resources"].as_array().is_some_and(|a| {
        a.iter().filter_map(Value::as_str).any(|x| {
            x == "*"
                || x == resource
                || (call.path.subresource.is_some()
                    && (x == "*/*" || x == format!("*/{}", call.path.subresource.as_deref().unwrap_or_default())))
                || (x == format!("{}/*", r.plural) && call.path.subresource.is_some())
        })
    });
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Namespaced" => r.namespaced,
        "Cluster" => !r.namespaced,
        _ => true,
    };
    ops_ok && groups_ok && versions_ok && resources_ok && scope_ok
}

async fn namespace_labels(call: &Call) -> Option<Value> {
    let ns = call.namespace()?;
    let obj = match call.api.caches.namespaces.get(&format!("Namespace/{ns}")) {
        Some(o) => o,
        None => std::sync::Arc::new(call.api.storage.get(&format!("/registry/namespaces/{ns}")).await.ok()??.object),
    };
    obj.pointer("/metadata/labels").cloned()
}

/// Why a review got no usable answer, as upstream's webhook errors say it.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    /// The client config names nothing that can be called.
    #[error("could not get REST client: {0}")]
    Client(#[source] webhook_client::CallError),
    #[error("failed to call webhook: {0}")]
    Call(#[source] webhook_client::CallError),
    #[error("failed to call webhook: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("received invalid webhook response: webhook response was absent")]
    NoResponse,
}

impl From<webhook_client::CallError> for ReviewError {
    fn from(e: webhook_client::CallError) -> ReviewError {
        match e {
            webhook_client::CallError::Config(_) => ReviewError::Client(e),
            other => ReviewError::Call(other),
        }
    }
}

/// POSTs a review and returns the answer's `response`.
async fn send(call: &Call, client_config: &Value, review: &Value, timeout: Duration) -> Result<Value, ReviewError> {
    let target = webhook_client::target(&call.api.storage, client_config).await?;
    let ca = client_config.get("caBundle").and_then(Value::as_str);
    let bytes = webhook_client::post(&target, ca, review, timeout).await?;
    let v: Value = serde_json::from_slice(&bytes)?;
    v.get("response").filter(|r| r.is_object()).cloned().ok_or(ReviewError::NoResponse)
}

fn review(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> Value {
    let r = &call.resource;
    // A connect request reviews its options object (PodAttachOptions, ...)
    // under the name in its path.
    let (kind, name) = match op {
        Operation::Connect => {
            (json!({"group": "", "version": "v1", "kind": obj["kind"]}), call.path.name.as_deref().unwrap_or_default())
        }
        _ => (json!({"group": r.group, "version": r.version, "kind": r.kind}), crate::apiserver::meta::name_of(obj)),
    };
    let gvr = json!({"group": r.group, "version": r.version, "resource": r.plural});
    let mut req = json!({
        "uid": crate::apiserver::meta::new_uid(),
        "kind": kind, "resource": gvr, "requestKind": kind, "requestResource": gvr,
        "name": name,
        "operation": op.as_str(),
        "userInfo": {"username": call.user.name, "groups": call.user.groups},
        "object": if op == Operation::Delete { Value::Null } else { obj.clone() },
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": call.dry_run(),
    });
    if let Some(ns) = call.namespace() {
        req["namespace"] = json!(ns);
    }
    if let Some(s) = &call.path.subresource {
        req["subResource"] = json!(s);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

/// The object the webhooks review: mutating webhooks may patch it,
/// validating webhooks only read it (so it needs no copy).
pub enum Reviewed<'a> {
    Mutable(&'a mut Value),
    ReadOnly(&'a Value),
}

impl Reviewed<'_> {
    fn get(&self) -> &Value {
        match self {
            Reviewed::Mutable(obj) => obj,
            Reviewed::ReadOnly(obj) => obj,
        }
    }
}

/// Calls every matching webhook of one kind: mutating ones for a
/// `Reviewed::Mutable` object, validating ones for a read-only one.
pub async fn call_all(call: &Call, mut obj: Reviewed<'_>, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    let mutating = matches!(obj, Reviewed::Mutable(_));
    // Webhooks never gate their own configuration, so they cannot lock the cluster.
    if call.resource.group == "admissionregistration.k8s.io" || call.resource.ephemeral {
        return Ok(());
    }
    let configs =
        if mutating { call.api.caches.mutating_webhooks.all() } else { call.api.caches.validating_webhooks.all() };
    if configs.is_empty() {
        return Ok(());
    }
    let ns_labels = namespace_labels(call).await;
    for config in configs {
        for hook in config["webhooks"].as_array().cloned().unwrap_or_default() {
            let name = hook["name"].as_str().unwrap_or_default().to_string();
            if !hook["rules"].as_array().is_some_and(|rs| rs.iter().any(|r| rule_matches(r, call, op))) {
                continue;
            }
            if let Some(sel) = hook.get("namespaceSelector").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
                if call.resource.namespaced && !LabelSelector::from_object(sel).matches(ns_labels.as_ref()) {
                    continue;
                }
            }
            if let Some(sel) = hook.get("objectSelector").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
                // An options object has no labels to select.
                if op == Operation::Connect {
                    continue;
                }
                let labels = obj.get().pointer("/metadata/labels").or(old.and_then(|o| o.pointer("/metadata/labels")));
                if !LabelSelector::from_object(sel).matches(labels) {
                    continue;
                }
            }
            if call.dry_run() && !matches!(hook["sideEffects"].as_str(), Some("None") | Some("NoneOnDryRun")) {
                return Err(ApiError::bad_request(format!("admission webhook \"{name}\" does not support dry run")));
            }
            let fail_open = hook["failurePolicy"].as_str() == Some("Ignore");
            let timeout = Duration::from_secs(hook["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30));
            let outcome = send(call, &hook["clientConfig"], &review(call, obj.get(), old, op), timeout).await;
            let response = match outcome {
                Ok(r) => r,
                Err(e) if fail_open => {
                    tracing::warn!(webhook = %name, error = %e, "admission webhook failed; ignored by its failurePolicy");
                    continue;
                }
                Err(e) => return Err(ApiError::internal(format!("failed calling webhook \"{name}\": {e}"))),
            };
            if response["allowed"].as_bool() != Some(true) {
                return Err(denial(&name, &response["status"]));
            }
            if let Reviewed::Mutable(obj) = &mut obj {
                if let Some(patch) = response["patch"].as_str() {
                    let raw = base64::engine::general_purpose::STANDARD.decode(patch).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent a patch that is not base64: {e}"))
                    })?;
                    let ops: json_patch::Patch = serde_json::from_slice(&raw).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent an invalid JSON patch: {e}"))
                    })?;
                    json_patch::patch(obj, &ops).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent a patch that does not apply: {e}"))
                    })?;
                    if decodes_as_resource(call, op) {
                        // Read back as the resource's type, as upstream
                        // decodes a webhook's result: what the type (or a
                        // custom resource's schema) does not know is dropped.
                        let (decoded, _) = call.resource.strategy.decode(obj).map_err(|e| {
                            ApiError::internal(format!("webhook \"{name}\" made an object that does not decode: {e}"))
                        })?;
                        **obj = decoded;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether the reviewed object is one of the resource's own (not a
/// connect request's options, nor another kind a subresource takes).
fn decodes_as_resource(call: &Call, op: Operation) -> bool {
    op != Operation::Connect && matches!(call.path.subresource.as_deref(), None | Some("status"))
}

/// A webhook's refusal as upstream's ToStatusErr makes it: the webhook's
/// own code (400 when it gave none under 400) and reason, its message, or
/// else its reason, after who denied the request.
fn denial(name: &str, status: &Value) -> ApiError {
    let code = status["code"].as_u64().and_then(|c| u16::try_from(c).ok()).filter(|c| *c >= 400).unwrap_or(400);
    let text = |key: &str| status[key].as_str().filter(|s| !s.is_empty());
    let denied = format!("admission webhook \"{name}\" denied the request");
    let message = match text("message").or_else(|| text("reason")) {
        Some(why) => format!("{denied}: {why}"),
        None => format!("{denied} without explanation"),
    };
    // The reason is kept when it is one of metav1's (a free-form one, which
    // upstream passes on as it is, is left out).
    const REASONS: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    let reason = text("reason").and_then(|r| REASONS.iter().find(|k| **k == r).copied()).unwrap_or("");
    ApiError::new(code, reason, message)
}
