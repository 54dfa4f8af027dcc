//! The review APIs, answered without storing anything:
//! SelfSubjectAccessReview (`kubectl auth can-i`), SubjectAccessReview,
//! LocalSubjectAccessReview, SelfSubjectRulesReview (`can-i --list`),
//! SelfSubjectReview (`kubectl auth whoami`), TokenReview, and TokenRequest
//! on `serviceaccounts/<name>/token` (`kubectl create token`).

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::{decode_body, Call};
use crate::apiserver::auth::rbac::Attributes;
use crate::apiserver::auth::token::Claims;
use crate::apiserver::auth::User;
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, ApiResult, Cause};

fn attributes(spec: &Value, namespace_override: Option<&str>) -> Option<Attributes> {
    if let Some(r) = spec.get("resourceAttributes") {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        return Some(Attributes {
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            subresource: s("subresource"),
            namespace: namespace_override.map(str::to_string).unwrap_or_else(|| s("namespace")),
            name: s("name"),
            path: None,
        });
    }
    spec.get("nonResourceAttributes").map(|n| Attributes {
        verb: n.get("verb").and_then(Value::as_str).unwrap_or_default().to_string(),
        path: Some(n.get("path").and_then(Value::as_str).unwrap_or_default().to_string()),
        ..Default::default()
    })
}

fn decision(call: &Call, user: &User, attrs: &Attributes) -> Value {
    if call.api.allowed(user, attrs) {
        json!({"allowed": true, "reason": "allowed by RBAC"})
    } else {
        json!({"allowed": false})
    }
}

fn answer(call: &Call, mut body: Value, status: Value) -> Response {
    body["status"] = status;
    body["apiVersion"] = json!(call.resource.api_version());
    body["kind"] = json!(call.resource.kind);
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = json!({});
    }
    body["metadata"]["creationTimestamp"] = Value::Null;
    call.respond(StatusCode::CREATED, &body)
}

fn user_from_spec(spec: &Value) -> User {
    let groups = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|g| g.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    User { name: spec.get("user").and_then(Value::as_str).unwrap_or_default().to_string(), groups }
}

/// Serves a create on a review resource.
pub async fn create(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let obj = decode_body(&call.headers, &body)?;
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let kind = call.resource.kind.clone();
    match kind.as_str() {
        "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview" => {
            let ns = if kind == "LocalSubjectAccessReview" { call.namespace().map(str::to_string) } else { None };
            let attrs = attributes(&spec, ns.as_deref()).ok_or_else(|| {
                ApiError::invalid(
                    &call.resource.group,
                    &kind,
                    "",
                    vec![Cause::invalid(
                        "spec.resourceAttributes",
                        "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
                    )],
                )
            })?;
            let user = if kind == "SelfSubjectAccessReview" { call.user.clone() } else { user_from_spec(&spec) };
            let status = decision(call, &user, &attrs);
            Ok(answer(call, obj, status))
        }
        "SelfSubjectRulesReview" => {
            let ns = spec.get("namespace").and_then(Value::as_str).unwrap_or_default();
            let status = if call.user.in_group("system:masters") {
                json!({"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}], "incomplete": false})
            } else {
                let rules = call.api.rbac.rules_for(&call.user, ns);
                let resource_rules: Vec<Value> =
                    rules.iter().filter(|r| r.get("resources").is_some()).cloned().collect();
                let non_resource: Vec<Value> =
                    rules.iter().filter(|r| r.get("nonResourceURLs").is_some()).cloned().collect();
                json!({"resourceRules": resource_rules, "nonResourceRules": non_resource, "incomplete": false})
            };
            Ok(answer(call, obj, status))
        }
        "SelfSubjectReview" => {
            let status = json!({"userInfo": {"username": call.user.name, "groups": call.user.groups}});
            Ok(answer(call, obj, status))
        }
        "TokenReview" => {
            let token = spec.get("token").and_then(Value::as_str).unwrap_or_default();
            let status = match call.api.authenticate_token(token).await {
                Some(u) => {
                    json!({"authenticated": true, "user": {"username": u.name, "groups": u.groups}, "audiences": spec.get("audiences").cloned().unwrap_or(json!([]))})
                }
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            Ok(answer(call, obj, status))
        }
        other => Err(ApiError::method_not_allowed(format!("create is not supported on {other}"))),
    }
}

/// `serviceaccounts/<name>/token`: a TokenRequest.
pub async fn token_request(call: &mut Call, body: Bytes) -> ApiResult<Response> {
    let req = decode_body(&call.headers, &body)?;
    let sa = call.load_object().await?;
    crate::apiserver::admission::node_restriction::admit_token_request(call, &req).await?;
    let ns = call.namespace().unwrap_or_default().to_string();
    let name = call.path.name.clone().unwrap_or_default();
    let signer =
        call.api.tokens.as_ref().ok_or_else(|| ApiError::internal("service-account tokens are not configured"))?;
    let seconds = req.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            &name,
            vec![Cause::invalid(
                "spec.expirationSeconds",
                format!("Invalid value: {seconds}: may not specify a duration less than 10 minutes"),
            )],
        ));
    }
    let seconds = seconds.min(2 * 365 * 24 * 3600);
    let audiences: Vec<String> = req
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| vec![signer.issuer().to_string()]);
    let now = meta::unix_now();
    let claims = Claims {
        namespace: ns.clone(),
        name: name.clone(),
        uid: sa.object.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string(),
        audiences: audiences.clone(),
        expires: now + seconds,
    };
    let token = signer
        .issue(&claims, now, req.pointer("/spec/boundObjectRef").cloned())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let out = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": req.pointer("/spec/boundObjectRef")},
        "status": {"token": token, "expirationTimestamp": meta::rfc3339(now + seconds)},
    });
    Ok(call.respond(StatusCode::CREATED, &out))
}
