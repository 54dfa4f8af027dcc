//! API errors as `metav1.Status` objects, with upstream's codes and reasons.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::store::StoreError;

/// One field that failed validation.
#[derive(Debug, Clone)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause { reason: "FieldValueInvalid", message: message.into(), field: field.into() }
    }

    pub fn required(field: impl Into<String>) -> Self {
        Cause { reason: "FieldValueRequired", message: "Required value".into(), field: field.into() }
    }

    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause { reason: "FieldValueForbidden", message: message.into(), field: field.into() }
    }
}

/// Field errors as upstream's aggregate prints them: `field: message`, in
/// brackets when there are several (`[a: x, b: y]`).
pub fn summary(causes: &[Cause]) -> String {
    let list: Vec<String> = causes
        .iter()
        .map(|c| if c.field.is_empty() { c.message.clone() } else { format!("{}: {}", c.field, c.message) })
        .collect();
    if list.len() == 1 {
        list[0].clone()
    } else {
        format!("[{}]", list.join(", "))
    }
}

/// An error answer of the API.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// group, kind and name for `details`.
    pub group: String,
    pub kind: String,
    pub name: String,
    pub causes: Vec<Cause>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            group: String::new(),
            kind: String::new(),
            name: String::new(),
            causes: Vec::new(),
            retry_after: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.group = group.into();
        self.kind = kind.into();
        self.name = name.into();
        self
    }

    /// `pods "x" not found`, as upstream words it: resource[.group] "name".
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found")).with_details(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists"))
            .with_details(group, plural, name)
    }

    /// An update against a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"))
            .with_details(group, plural, name)
    }

    /// `Pod "x" is invalid: [spec.containers: Required value, ...]`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let summary = summary(&causes);
        let mut e =
            Self::new(422, "Invalid", format!("{kind}{} \"{name}\" is invalid: {summary}", group_suffix(group)))
                .with_details(group, kind, name);
        e.causes = causes;
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// `pods "x" is forbidden: why` (`pods is forbidden: why` without a
    /// name), as upstream's `NewForbidden` words it.
    pub fn forbidden_object(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, plural);
        let message = if name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} \"{name}\" is forbidden: {why}")
        };
        Self::new(403, "Forbidden", message).with_details(group, plural, name)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/apply-patch+yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json; got {content_type:?}"))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {}", message.into()))
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty() {
            // StatusReasonUnknown is "", which upstream leaves out.
            if let Some(m) = status.as_object_mut() {
                m.remove("reason");
            }
        }
        let mut details = serde_json::Map::new();
        if !self.name.is_empty() {
            details.insert("name".into(), json!(self.name));
        }
        if !self.group.is_empty() {
            details.insert("group".into(), json!(self.group));
        }
        if !self.kind.is_empty() {
            details.insert("kind".into(), json!(self.kind));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(secs) = self.retry_after {
            details.insert("retryAfterSeconds".into(), json!(secs));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn group_suffix(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!(".{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // Upstream's field order, and the newline its encoder ends with.
        let mut body = crate::apiserver::field_order::to_json(&self.to_status());
        body.push('\n');
        let mut resp = (code, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Compacted { .. } => ApiError::gone("The resourceVersion for the provided watch is too old."),
            StoreError::FutureRevision => {
                let mut e = ApiError::timeout("Too large resource version");
                e.retry_after = Some(1);
                e
            }
            StoreError::RequestTooLarge => ApiError::too_large(),
            StoreError::Closed => ApiError::service_unavailable("the datastore is shutting down"),
            // Upstream passes etcd's error through as it is: a 500 with no
            // reason, whose message is etcd's own.
            StoreError::NoSpace => ApiError::new(500, "", e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_like_upstream() {
        let e = ApiError::not_found("", "pods", "web");
        assert_eq!(e.message, "pods \"web\" not found");
        assert_eq!(e.to_status()["details"]["kind"], "pods");
        let e = ApiError::not_found("apps", "deployments", "web");
        assert_eq!(e.message, "deployments.apps \"web\" not found");
        let e = ApiError::invalid("", "ConfigMap", "x", vec![Cause::required("metadata.name")]);
        assert_eq!(e.message, "ConfigMap \"x\" is invalid: metadata.name: Required value");
        assert_eq!(e.to_status()["code"], 422);
    }
}
