//! The one generic path every resource request takes: parse the path, find
//! the resource in the registry, check the verb, and hand over to the read,
//! write or patch handler. Bodies come in as JSON or YAML; answers go out as
//! JSON, YAML or a Table.

mod binding;
mod computed;
mod eviction;
pub(crate) mod options;
mod patch;
mod read;
mod write;

pub use patch::apply_json_patch;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::auth::User;
use super::field_order;
use super::managed_fields;
use super::patch_meta::SchemaNode;
use super::registry::Resource;
use super::request::ResourcePath;
use super::status::{ApiError, ApiResult};
use super::Api;

/// The largest body accepted, as upstream's 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Everything a handler needs to know about one request.
pub struct Call {
    pub api: Arc<Api>,
    pub user: User,
    pub resource: Arc<Resource>,
    pub path: ResourcePath,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    /// Warnings for the `Warning` header (unknown fields with fieldValidation=Warn).
    pub warnings: Vec<String>,
}

impl Call {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// A boolean parameter as upstream reads it: present and not "false" or "0".
    pub fn flag(&self, key: &str) -> bool {
        options::parse_bool(self.query.get(key).map(String::as_str))
    }

    pub fn dry_run(&self) -> bool {
        self.param("dryRun") == Some("All")
    }

    /// Who is writing: `fieldManager`, else the client's program name.
    pub fn manager(&self) -> String {
        if let Some(m) = self.param("fieldManager") {
            return m.to_string();
        }
        let agent = self.headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
        agent.split('/').next().unwrap_or("unknown").to_string()
    }

    /// Records a non-apply write in `metadata.managedFields`.
    pub fn record_update(&self, old: Option<&Value>, new: &mut Value, subresource: Option<&str>) {
        let schema = self.resource.strategy.patch_schema();
        let (manager, api_version) = (self.manager(), self.resource.api_version());
        let writer = managed_fields::Writer {
            manager: &manager,
            api_version: &api_version,
            schema: SchemaNode::of(schema.as_deref()),
        };
        managed_fields::record_update(old, new, &writer, subresource);
    }

    pub fn namespace(&self) -> Option<&str> {
        self.path.namespace.as_deref()
    }

    pub fn accept(&self) -> &str {
        self.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("application/json")
    }

    /// A JSON (or YAML, when asked) answer.
    pub fn respond(&self, code: StatusCode, body: &Value) -> Response {
        let mut resp = if wants_yaml(self.accept()) {
            match serde_yaml_ng::to_string(&field_order::Ordered(body)) {
                Ok(y) => (code, [(header::CONTENT_TYPE, "application/yaml")], y).into_response(),
                Err(e) => ApiError::internal(e.to_string()).into_response(),
            }
        } else {
            (code, [(header::CONTENT_TYPE, "application/json")], field_order::to_json(body)).into_response()
        };
        for w in &self.warnings {
            if let Ok(v) = header::HeaderValue::from_str(&format!("299 - {}", serde_json::Value::String(w.clone()))) {
                resp.headers_mut().append(header::WARNING, v);
            }
        }
        resp
    }
}

fn wants_yaml(accept: &str) -> bool {
    let first = accept.split(',').next().unwrap_or_default().trim();
    first.starts_with("application/yaml")
}

/// The query string's parameters; of a repeated one the first counts, as
/// upstream's conversions take `values[0]`.
pub fn parse_query(raw: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in
        raw.map(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).unwrap_or_default()).unwrap_or_default()
    {
        out.entry(k).or_insert(v);
    }
    out
}

/// Decodes a request body as JSON, YAML or Kubernetes protobuf, by its content type.
pub fn decode_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<Value> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::too_large());
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    let media = ct.split(';').next().unwrap_or_default().trim();
    let value: Value = match media {
        "application/json"
        | ""
        | "*/*"
        | "application/json-patch+json"
        | "application/merge-patch+json"
        | "application/strategic-merge-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}")))?,
        "application/yaml" | "application/apply-patch+yaml" | "text/yaml" | "application/x-yaml" => {
            serde_yaml_ng::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("the body of the request could not be decoded as YAML: {e}"))
            })?
        }
        "application/vnd.kubernetes.protobuf" => super::protobuf::decode(body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded as protobuf: {e}"))
        })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    Ok(value)
}

/// Serves one resource request.
pub async fn serve(
    api: Arc<Api>,
    user: User,
    path: ResourcePath,
    method: Method,
    headers: HeaderMap,
    query: Option<&str>,
    body: Bytes,
) -> Response {
    let Some(resource) = api.registry.get(&path.group, &path.version, &path.plural) else {
        return ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response();
    };
    let call = Call { api, user, resource, path, query: parse_query(query), headers, warnings: Vec::new() };
    match dispatch(call, method, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn dispatch(mut call: Call, method: Method, body: Bytes) -> ApiResult<Response> {
    let r = call.resource.clone();
    if call.path.namespace.is_some() && !r.namespaced {
        return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
    }
    let watching = call.path.watch_prefix || call.flag("watch");
    let sub = call.path.subresource.clone();
    if let Some(sub) = &sub {
        let known = (sub == "status" && r.status)
            || (sub == "scale" && r.scale.is_some())
            || r.subresources.iter().any(|s| s == sub);
        if !known {
            return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
        }
    }
    let Some(verb) = super::request::verb(&method, call.path.name.is_some(), watching) else {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    };
    // Only the verbs discovery lists (a namespace has no deletecollection,
    // a status no create): upstream routes no others.
    if !super::discovery::serves_verb(&r, sub.as_deref(), verb) {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    call.api.authorize(&call, verb)?;
    options::check(&call, verb)?;
    if r.computed {
        return computed::serve(&mut call, verb).await;
    }
    if r.ephemeral {
        return match verb {
            // The legacy `bindings` collection: pods/binding of the pod the body names.
            "create" if r.group.is_empty() && r.plural == "bindings" => binding::bind_named(&mut call, body).await,
            "create" => crate::apiserver::auth::reviews::create(&mut call, body).await,
            _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported on {}", r.plural))),
        };
    }
    match (verb, sub.as_deref()) {
        // Subresources that read as the whole object, as upstream serves them.
        ("get", None | Some("status") | Some("approval") | Some("ephemeralcontainers") | Some("resize")) => {
            read::get(&call).await
        }
        ("get", Some("scale")) => read::get_scale(&call).await,
        ("list", None) => read::list(&call).await,
        ("watch", None) => read::watch(call).await,
        ("create", None) => write::create(&mut call, body).await,
        ("create", Some("binding")) => binding::bind(&mut call, body).await,
        ("create", Some("token")) => crate::apiserver::auth::reviews::token_request(&mut call, body).await,
        (
            "update",
            None | Some("status") | Some("approval") | Some("finalize") | Some("ephemeralcontainers") | Some("resize"),
        ) => write::update(&mut call, body).await,
        ("create", Some("eviction")) => eviction::evict(&mut call, body).await,
        ("update", Some("scale")) => write::update_scale(&mut call, body).await,
        ("patch", None | Some("status") | Some("approval") | Some("ephemeralcontainers") | Some("resize")) => {
            patch::patch(&mut call, body).await
        }
        ("patch", Some("scale")) => patch::patch_scale(&mut call, body).await,
        ("delete", None) => write::delete(&mut call, body).await,
        ("deletecollection", None) => write::delete_collection(&mut call, body).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "{verb} is not supported on {}{}",
            r.plural,
            sub.map(|s| format!("/{s}")).unwrap_or_default()
        ))),
    }
}

/// The object a request's path names, or NotFound.
pub async fn load_object(call: &Call) -> ApiResult<crate::apiserver::storage::Stored> {
    read::load(call).await
}
