//! Auditing (`--audit-log-path`, `--audit-policy-file`), as upstream's
//! `WithAudit` filter: every request is looked up in the policy and, at the
//! level it names, written as audit.k8s.io/v1 Events at RequestReceived,
//! ResponseStarted (watches and other long-running requests) and
//! ResponseComplete. The layer is only installed when auditing is on.

pub mod backend;
pub mod event;
pub mod policy;
pub mod rotate;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::Value;

use super::auth::User;
use super::request::{self, Target};
use crate::sync::LockExt;
use backend::Backend;
use event::{Event, ObjectReference, ResponseStatus, UserInfo};
use policy::{Attributes, Decision, Level, Policy, ResourceAttributes, Stage};

/// Subresources whose responses stream for as long as the client stays.
const LONG_RUNNING_SUBRESOURCES: &[&str] = &["log", "exec", "attach", "portforward", "proxy"];

/// Response bodies larger than this are not recorded (upstream records
/// objects, not gigabyte lists).
const MAX_RECORDED_BODY: usize = 3 * 1024 * 1024;

/// The policy and where its Events go.
pub struct Auditor {
    pub policy: Policy,
    backend: Arc<Backend>,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditor").field("rules", &self.policy.rules.len()).field("backend", &self.backend).finish()
    }
}

impl Auditor {
    pub fn new(policy: Policy, backend: Arc<Backend>) -> Arc<Auditor> {
        Arc::new(Auditor { policy, backend })
    }

    /// Writes what is queued; Events after this are dropped.
    pub async fn shutdown(&self) {
        self.backend.shutdown().await
    }
}

/// The address a request came from (set by the HTTPS listener).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

#[derive(Default)]
struct Known {
    user: Option<User>,
    impersonated: Option<User>,
    body: Option<Bytes>,
}

/// What only the handler learns (the bearer token's user, impersonation,
/// the request body), handed back to the audit layer.
#[derive(Clone, Default)]
pub struct AuditSlot(Arc<Mutex<Known>>);

impl AuditSlot {
    /// The authenticated user, and the one it impersonates if any.
    pub fn set_user(&self, user: &User, impersonated: Option<&User>) {
        let mut k = self.0.locked();
        k.user = Some(user.clone());
        k.impersonated = impersonated.cloned();
    }

    pub fn set_body(&self, body: &Bytes) {
        self.0.locked().body = Some(body.clone());
    }

    fn take(&self) -> Known {
        std::mem::take(&mut *self.0.locked())
    }
}

/// What the request is, read off its method and path.
struct RequestInfo {
    verb: String,
    resource: Option<request::ResourcePath>,
    long_running: bool,
}

fn request_info(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
    let non_resource =
        || RequestInfo { verb: method.as_str().to_ascii_lowercase(), resource: None, long_running: false };
    let Target::Resource(p) = request::parse(path) else {
        return non_resource();
    };
    let watch_param = query
        .map(|q| {
            serde_urlencoded::from_str::<Vec<(String, String)>>(q)
                .unwrap_or_default()
                .into_iter()
                .any(|(k, v)| k == "watch" && super::request::parse_bool(Some(&v)))
        })
        .unwrap_or(false);
    let watching = p.watch_prefix || watch_param;
    let verb = request::verb(method, p.name.is_some(), watching)
        .map(str::to_string)
        .unwrap_or_else(|| method.as_str().to_ascii_lowercase());
    let long_running =
        verb == "watch" || p.subresource.as_deref().is_some_and(|s| LONG_RUNNING_SUBRESOURCES.contains(&s));
    RequestInfo { verb, resource: Some(p), long_running }
}

fn user_info(u: &User) -> UserInfo {
    UserInfo { username: u.name.clone(), groups: u.groups.clone() }
}

fn source_ips(req: &Request) -> Vec<String> {
    let mut ips: Vec<String> = req
        .headers()
        .get("X-Forwarded-For")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    if let Some(PeerAddr(peer)) = req.extensions().get::<PeerAddr>() {
        let ip = peer.ip().to_string();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

/// A body in whichever encoding `content_type` names (JSON, YAML,
/// Kubernetes protobuf), as the JSON the log records.
fn decode(content_type: Option<&HeaderValue>, bytes: &Bytes) -> Option<Value> {
    if bytes.is_empty() || bytes.len() > MAX_RECORDED_BODY {
        return None;
    }
    let mut headers = axum::http::HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(header::CONTENT_TYPE, ct.clone());
    }
    super::call::decode_body(&headers, bytes).ok()
}

/// Emits ResponseComplete when a streamed body ends or its client goes.
struct CompleteOnDrop {
    backend: Arc<Backend>,
    event: Option<Event>,
}

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        if let Some(mut e) = self.event.take() {
            e.stage = Stage::ResponseComplete.as_str();
            e.stage_timestamp = super::meta::now_rfc3339_micro();
            self.backend.process(e);
        }
    }
}

/// The audit layer.
pub async fn audit(State(auditor): State<Arc<Auditor>>, mut req: Request, next: Next) -> Response {
    let received = super::meta::now_rfc3339_micro();
    let audit_id = req
        .headers()
        .get("Audit-ID")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .unwrap_or_else(super::meta::new_uid);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let request_uri = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| path.clone());
    let user_agent =
        req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let ips = source_ips(&req);
    let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
    let connection_user = req.extensions().get::<User>().cloned().unwrap_or_else(User::anonymous);
    let slot = AuditSlot::default();
    req.extensions_mut().insert(slot.clone());
    let authorization = crate::apiserver::auth::DecisionRecord::default();
    req.extensions_mut().insert(authorization.clone());

    let mut response = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&audit_id) {
        response.headers_mut().insert("Audit-Id", v);
    }

    let known = slot.take();
    let user = known.user.unwrap_or(connection_user);
    let acting = known.impersonated.as_ref().unwrap_or(&user);
    let info = request_info(&method, &path, query.as_deref());
    let resource_attrs = info.resource.as_ref().map(|p| ResourceAttributes {
        group: &p.group,
        resource: &p.plural,
        subresource: p.subresource.as_deref().unwrap_or_default(),
        namespace: p.namespace.as_deref().unwrap_or_default(),
        name: p.name.as_deref().unwrap_or_default(),
    });
    let decision = auditor.policy.decide(&Attributes {
        user: &acting.name,
        groups: &acting.groups,
        verb: &info.verb,
        resource: resource_attrs,
        path: &path,
    });
    if decision.level == Level::None {
        return response;
    }

    let code = response.status().as_u16();
    let mut annotations = serde_json::Map::new();
    // The authorizer's own decision and reason; requests no authorizer saw
    // (discovery, which every authenticated user may read) read as allowed.
    let decided = authorization
        .get()
        .unwrap_or_else(|| crate::apiserver::auth::Decision { allowed: code != 403, reason: String::new() });
    if code != 401 {
        let word = if decided.allowed { "allow" } else { "forbid" };
        annotations.insert("authorization.k8s.io/decision".into(), word.into());
        annotations.insert("authorization.k8s.io/reason".into(), decided.reason.into());
    }
    // A create names its object in the body: decoded for the objectRef at
    // every level, recorded from Request up.
    let decoded = (decision.level >= Level::Request || info.verb == "create")
        .then(|| known.body.as_ref().and_then(|b| decode(content_type.as_ref(), b)))
        .flatten();
    let created_name = decoded
        .as_ref()
        .and_then(|o| o.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let request_object = decoded.filter(|_| decision.level >= Level::Request).map(|mut v| {
        if decision.omit_managed_fields {
            event::omit_managed_fields(&mut v);
        }
        v
    });
    let object_ref = info.resource.as_ref().map(|p| ObjectReference {
        resource: p.plural.clone(),
        namespace: p.namespace.clone().unwrap_or_default(),
        name: p.name.clone().unwrap_or_else(|| created_name.clone()),
        api_group: p.group.clone(),
        api_version: p.version.clone(),
        subresource: p.subresource.clone().unwrap_or_default(),
    });
    let mut event = Event {
        kind: "Event",
        api_version: "audit.k8s.io/v1",
        level: decision.level.as_str(),
        audit_id,
        stage: Stage::RequestReceived.as_str(),
        request_uri,
        verb: info.verb.clone(),
        user: user_info(&user),
        impersonated_user: known.impersonated.as_ref().map(user_info),
        source_ips: ips,
        user_agent,
        object_ref,
        response_status: None,
        request_object: None,
        response_object: None,
        request_received_timestamp: received.clone(),
        stage_timestamp: received,
        annotations: Default::default(),
    };
    if decision.records(Stage::RequestReceived) {
        auditor.backend.process(event.clone());
    }
    event.annotations = annotations;
    event.request_object = request_object;
    event.response_status = Some(ResponseStatus { code, ..Default::default() });

    if info.long_running {
        return long_running(&auditor, &decision, event, response);
    }
    let (response, body) = if decision.level == Level::RequestResponse || code >= 400 {
        buffer_body(response).await
    } else {
        (response, None)
    };
    if let Some(body) = body {
        if code >= 400 {
            if let Some(status) = body.as_object().filter(|o| o.get("kind") == Some(&Value::from("Status"))) {
                let text = |k: &str| status.get(k).and_then(Value::as_str).map(str::to_string);
                event.response_status = Some(ResponseStatus {
                    status: text("status"),
                    message: text("message"),
                    reason: text("reason"),
                    code,
                    ..Default::default()
                });
            }
        }
        if decision.level == Level::RequestResponse {
            let mut body = body;
            if decision.omit_managed_fields {
                event::omit_managed_fields(&mut body);
            }
            event.response_object = Some(body);
        }
    }
    if decision.records(Stage::ResponseComplete) {
        event.stage = Stage::ResponseComplete.as_str();
        event.stage_timestamp = super::meta::now_rfc3339_micro();
        auditor.backend.process(event);
    }
    response
}

/// A response whose body is in memory, read as JSON (and put back).
async fn buffer_body(response: Response) -> (Response, Option<Value>) {
    let size = axum::body::HttpBody::size_hint(response.body()).exact();
    if size.is_none_or(|s| s as usize > MAX_RECORDED_BODY) {
        return (response, None);
    }
    let (parts, body) = response.into_parts();
    match axum::body::to_bytes(body, MAX_RECORDED_BODY).await {
        Ok(bytes) => {
            let value = decode(parts.headers.get(header::CONTENT_TYPE), &bytes);
            (Response::from_parts(parts, Body::from(bytes)), value)
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot read a response body for the audit log");
            (Response::from_parts(parts, Body::empty()), None)
        }
    }
}

/// ResponseStarted now, ResponseComplete when the stream ends.
fn long_running(auditor: &Auditor, decision: &Decision, mut event: Event, response: Response) -> Response {
    if decision.records(Stage::ResponseStarted) {
        event.stage = Stage::ResponseStarted.as_str();
        event.stage_timestamp = super::meta::now_rfc3339_micro();
        auditor.backend.process(event.clone());
    }
    if !decision.records(Stage::ResponseComplete) {
        return response;
    }
    let guard = CompleteOnDrop { backend: auditor.backend.clone(), event: Some(event) };
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _keep = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_info_reads_verbs_as_upstream() {
        let i = request_info(&Method::GET, "/api/v1/namespaces/a/pods", Some("watch=true"));
        assert_eq!((i.verb.as_str(), i.long_running), ("watch", true));
        let i = request_info(&Method::GET, "/api/v1/namespaces/a/pods/p/log", None);
        assert_eq!((i.verb.as_str(), i.long_running), ("get", true));
        let i = request_info(&Method::DELETE, "/apis/apps/v1/namespaces/a/deployments", None);
        assert_eq!(i.verb, "deletecollection");
        let i = request_info(&Method::GET, "/healthz", None);
        assert!(i.resource.is_none() && i.verb == "get");
    }
}
