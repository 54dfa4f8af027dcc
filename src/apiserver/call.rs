//! One resource request as the handlers, admission and the review APIs
//! see it (`Call`): who asks, for which resource and path, with which
//! query and headers; how its body is decoded and its answer encoded.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::auth::{DecisionRecord, User};
use super::field_order;
use super::patch::managed_fields;
use super::patch::patch_meta::SchemaNode;
use super::request::ResourcePath;
use super::resource::Resource;
use super::status::{ApiError, ApiResult};
use super::storage::Stored;
use super::watch_cache::object::Omit;
use super::Api;

/// The largest body accepted, as upstream's 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Where an update's old object came from. The watch cache's copy saves
/// a store read, as upstream's GuaranteedUpdate takes the cacher's object
/// as its first guess. It may be behind the store, so a write from it is
/// guarded by its revision, and whatever it decides alone (a failed
/// precondition, a write that would change nothing) is decided again
/// from the store's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Store,
}

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
    /// Where the authorization decision goes for the audit log (when auditing).
    pub decision: Option<DecisionRecord>,
    /// The query string as sent (connect subresources pass it on).
    pub raw_query: Option<String>,
    /// The client's connection once upgraded (exec, attach, port-forward, proxies).
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// What the client leaves out of the objects it lists and watches.
    pub omit: Omit,
}

/// A request extension that only the in-process transport sets, for the
/// shared informers (`in_process::client_for_informers`): lists and watches
/// served from the watch cache leave managedFields out, which those
/// informers drop anyway (`client::transform`). No HTTP request can carry it.
#[derive(Debug, Clone, Copy)]
pub struct OmitManagedFields;

impl Call {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// A boolean parameter as upstream reads it: present and not "false" or "0".
    pub fn flag(&self, key: &str) -> bool {
        super::request::parse_bool(self.query.get(key).map(String::as_str))
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

    /// The object the request's path names as the watch cache holds it,
    /// else as the store does (NotFound when neither has it). It may be
    /// behind the store: only for a write whose revision check catches
    /// that, and which reads again then.
    pub async fn load_object_cached_first(&self) -> ApiResult<Stored> {
        let name = self.path.name.as_deref().unwrap_or_default();
        let key = self.resource.key(self.namespace(), name);
        let stored = self
            .api
            .watch_cache
            .get_or_read(&self.resource, &key)
            .await?
            .ok_or_else(|| ApiError::not_found(&self.resource.group, &self.resource.plural, name))?;
        self.served(stored).await
    }

    /// A stored object in the served form of the request's resource.
    pub async fn served(&self, stored: Stored) -> ApiResult<Stored> {
        if !self.resource.converts() {
            return Ok(stored);
        }
        let mut served = self.served_all(vec![stored]).await?;
        served.pop().ok_or_else(|| ApiError::internal("a conversion returned no object"))
    }

    /// Stored objects in the served form of the request's resource, in
    /// one conversion.
    pub async fn served_all(&self, stored: Vec<Stored>) -> ApiResult<Vec<Stored>> {
        if !self.resource.converts() {
            return Ok(stored);
        }
        let revs: Vec<i64> = stored.iter().map(|s| s.rev).collect();
        let objects = self.resource.from_storage(stored.into_iter().map(|s| s.object).collect()).await?;
        if objects.len() != revs.len() {
            return Err(ApiError::internal(format!(
                "a conversion returned {} objects, expected {}",
                objects.len(),
                revs.len()
            )));
        }
        let served = objects.into_iter().zip(revs).map(|(mut object, rev)| {
            super::storage::set_resource_version(&mut object, rev);
            Stored { object, rev }
        });
        Ok(served.collect())
    }

    /// The object an update starts from, and where it came from: the
    /// cached one when asked for and the cache holds it (not for a dry
    /// run), else the store's.
    pub async fn load_old(&self, want: Origin) -> ApiResult<(Stored, Origin)> {
        if want == Origin::Cache && !self.dry_run() {
            let key = self.resource.key(self.namespace(), self.path.name.as_deref().unwrap_or_default());
            if let Some(obj) = self.api.watch_cache.cached(&self.resource, &key) {
                return Ok((self.served(Stored { object: obj.value(), rev: obj.rev }).await?, Origin::Cache));
            }
        }
        Ok((self.load_object().await?, Origin::Store))
    }

    /// The object the request's path names, or NotFound.
    pub async fn load_object(&self) -> ApiResult<Stored> {
        let name = self.path.name.as_deref().unwrap_or_default();
        let key = self.resource.key(self.namespace(), name);
        let stored = self
            .api
            .storage
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::not_found(&self.resource.group, &self.resource.plural, name))?;
        self.served(stored).await
    }

    pub fn namespace(&self) -> Option<&str> {
        self.path.namespace.as_deref()
    }

    pub fn accept(&self) -> &str {
        self.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("application/json")
    }

    /// A JSON (or YAML, when asked) answer.
    pub fn respond(&self, code: StatusCode, body: &Value) -> Response {
        let resp = if wants_yaml(self.accept()) {
            match serde_yaml_ng::to_string(&field_order::Ordered(body)) {
                Ok(y) => (code, [(header::CONTENT_TYPE, "application/yaml")], y).into_response(),
                Err(e) => ApiError::internal(e.to_string()).into_response(),
            }
        } else {
            (code, [(header::CONTENT_TYPE, "application/json")], field_order::to_json(body)).into_response()
        };
        self.with_warnings(resp)
    }

    /// Whether the client asked for YAML (JSON answers are then encoded
    /// again by `respond`).
    pub fn wants_yaml(&self) -> bool {
        wants_yaml(self.accept())
    }

    /// An answer already encoded as JSON (a write's, from the bytes it
    /// stored); None when the client asked for YAML.
    pub fn respond_json_bytes(&self, code: StatusCode, json: Vec<u8>) -> Option<Response> {
        (!self.wants_yaml()).then(|| self.respond_json_body(code, axum::body::Body::from(json)))
    }

    /// An answer whose JSON is put together as it is sent (lists from the
    /// watch cache), for a client that did not ask for YAML.
    pub fn respond_json_body(&self, code: StatusCode, json: axum::body::Body) -> Response {
        self.with_warnings((code, [(header::CONTENT_TYPE, "application/json")], json).into_response())
    }

    /// Adds a warning for the answer's `Warning` headers, once however
    /// often a retried write meets it (as upstream's recorder does).
    pub fn warn(&mut self, text: String) {
        if !self.warnings.contains(&text) {
            self.warnings.push(text);
        }
    }

    fn with_warnings(&self, mut resp: Response) -> Response {
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
