//! Where each request goes, by its path (upstream's handler chain and
//! path recorder): health and version for anyone; `/metrics`, ferrok's
//! own endpoints (`/v1-ferrok/…`, `/cacerts`) each with its own checks;
//! everything else for authenticated users, through impersonation: a
//! group another server serves (the aggregator), discovery, the
//! resources (`handlers`), and OpenAPI.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::auth::{self, User};
use super::filters::{authentication, impersonation, recover};
use super::request::{self, Target};
use super::status::ApiError;
use super::supervisor::{node_join, secrets_encrypt};
use super::{aggregator, audit, call, discovery, handlers, health, metrics, openapi, Api};

/// The router: the filters around the one handler that dispatches by path.
pub fn router(api: Arc<Api>) -> Router {
    let auditor = api.config.audit.clone();
    let router = Router::new().fallback(handle).with_state(api).layer(axum::middleware::from_fn(recover::catch_panics));
    match auditor {
        Some(a) => router.layer(axum::middleware::from_fn_with_state(a, audit::audit)),
        None => router,
    }
}

/// `GET /metrics` for callers RBAC lets `get` that path (upstream's
/// `system:monitoring`); 403 for everyone else, anonymous included.
async fn serve_metrics(
    api: &Api,
    user: &User,
    method: &axum::http::Method,
    record: Option<&auth::DecisionRecord>,
) -> Response {
    if method != axum::http::Method::GET {
        return ApiError::method_not_allowed("the server does not allow this method on the requested resource")
            .into_response();
    }
    let attrs = auth::rbac::Attributes { verb: "get".into(), path: Some("/metrics".into()), ..Default::default() };
    if !api.allowed_recorded(user, &attrs, record) {
        return ApiError::forbidden(format!("forbidden: User \"{}\" cannot get path \"/metrics\"", user.name))
            .into_response();
    }
    metrics::serve(api).await
}

async fn handle(State(api): State<Arc<Api>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let user = match authentication::authenticate(&api, &parts).await {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(str::to_string);
    let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    match path.as_str() {
        "/healthz" | "/livez" | "/readyz" => return health::serve(&api, &path, query.as_deref()).await,
        "/version" | "/version/" => return discovery::version(),
        _ => {}
    }
    if path == "/metrics" {
        return serve_metrics(&api, &user, &parts.method, parts.extensions.get::<auth::DecisionRecord>()).await;
    }
    if secrets_encrypt::handles(&path) {
        let record = parts.extensions.get::<auth::DecisionRecord>();
        return secrets_encrypt::serve(&api, &user, &parts.method, &path, query.as_deref(), record).await;
    }
    if node_join::handles(&path) {
        let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
            return ApiError::too_large().into_response();
        };
        return node_join::serve(&api, &user, &parts.method, &path, &parts.headers, &bytes).await;
    }
    if user.is_anonymous() {
        return ApiError::unauthorized().into_response();
    }
    if health::Endpoint::from_path(&path).is_some() {
        // One check alone (`/readyz/etcd`): for authenticated users.
        return health::serve(&api, &path, query.as_deref()).await;
    }
    let user = match impersonation::acting_user(&api, user, &parts) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    if let Some(slot) = parts.extensions.get::<recover::RequestUser>() {
        slot.set(&user.name);
    }
    let bytes = match axum::body::to_bytes(body, call::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => return ApiError::too_large().into_response(),
    };
    if let Some(slot) = parts.extensions.get::<audit::AuditSlot>() {
        slot.set_body(&bytes);
    }
    // The request log keeps the target it has always had.
    tracing::debug!(target: "ferrok::apiserver", method = %parts.method, %path, user = %user.name, "request");
    let target = request::parse(&path);
    // A group and version another server serves (an APIService with a service).
    let remote = match &target {
        Target::Resources { group, version } => api.aggregator.remote_for(group, version),
        Target::Resource(p) => api.aggregator.remote_for(&p.group, &p.version),
        _ => None,
    };
    if let Some(remote) = remote {
        let resource = match target {
            Target::Resource(p) => Some(p),
            _ => None,
        };
        return aggregator::proxy::serve(api.clone(), remote, user, resource, parts, bytes).await;
    }
    match target {
        Target::CoreVersions => {
            discovery::core_versions(&api.registry, &api.aggregator, &accept, &api.config.advertise)
        }
        Target::Groups => discovery::groups(&api.registry, &api.aggregator, &accept),
        Target::Group(g) => discovery::group(&api.registry, &api.aggregator, &g),
        Target::Resources { group, version } => discovery::resources(&api.registry, &group, &version),
        Target::Resource(p) => {
            let started = std::time::Instant::now();
            let served = api.registry.get(&p.group, &p.version, &p.plural).is_some();
            let apply = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("application/apply-patch"));
            let content_type = if apply { "application/apply-patch+yaml" } else { "" };
            let path = p.clone();
            let method = parts.method.clone();
            let resp = handlers::serve(api.clone(), user, p, parts, bytes).await;
            let labels = metrics::RequestLabels::of(&path, &method, query.as_deref(), content_type, served);
            metrics::global().observe_request(&labels, resp.status().as_u16(), started.elapsed());
            resp
        }
        Target::Other if path == "/openapi/v2" => openapi::serve_swagger(api.clone(), &parts.headers).await,
        Target::Other => match openapi::serve(&api.registry, &api.openapi, &path) {
            Some(resp) => resp,
            None => ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response(),
        },
    }
}
