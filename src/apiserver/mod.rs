//! The Kubernetes API over HTTPS: TLS with client certificates, discovery,
//! health, and the registry-driven resource handlers over the store.

// ApiError carries a whole metav1.Status; errors are the slow path, and
// boxing every one would only add an allocation where it matters least.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod aggregator;
pub mod allocator;
pub mod audit;
pub mod auth;
pub mod bootstrap;
pub mod builtin_schemas;
pub mod ca_rotation;
pub mod cache;
pub mod call;
pub mod cluster_authentication_trust;
pub mod compactor;
pub mod component_status;
pub mod crd;
pub mod discovery;
pub mod encryption;
pub mod endpoint_reconciler;
pub mod field_order;
pub mod handlers;
pub mod health;
pub mod in_process;
pub mod json_entries;
pub mod kinds;
pub mod kubelet;
pub mod label_parser;
pub mod lease_manager;
pub mod legacy_token_tracking;
pub mod managed_fields;
pub mod meta;
pub mod metrics;
pub mod node_join;
pub mod openapi;
pub mod patch_meta;
pub mod protobuf;
pub mod recover;
pub mod registry;
pub mod request;
pub mod resource;
pub mod resource_metrics;
pub mod selectable_fields;
pub mod selector;
pub mod serve;
pub mod server_token;
pub mod service_endpoint;
pub mod service_ip_repair;
pub mod status;
pub mod storage;
pub mod strategic;
pub mod strategy;
pub mod table;
pub mod validation;
pub mod watch_cache;
pub mod webhook_client;

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Router;

use auth::User;
use registry::Registry;
use request::Target;
use status::ApiError;
use storage::Storage;

/// What the API server needs to know about the cluster.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// host:port clients reach this server on (discovery's serverAddress).
    pub advertise: String,
    pub advertise_ip: IpAddr,
    pub https_port: u16,
    pub service_cidr: allocator::Cidr,
    pub cluster_domain: String,
    /// `--cluster-dns`: the `kube-dns` Service's cluster IP.
    pub cluster_dns: Option<IpAddr>,
    /// The node join token, accepted as a bearer token for bootstrapping.
    pub join_token: Option<Arc<server_token::ServerToken>>,
    /// How long Events live after their last write (`--event-ttl`).
    pub event_ttl: std::time::Duration,
    /// The audit policy and log (`--audit-policy-file`, `--audit-log-path`).
    pub audit: Option<Arc<audit::Auditor>>,
    /// How kubelets are reached (logs, exec, port-forward, nodes/proxy).
    pub kubelet: Option<kubelet::KubeletConnector>,
    /// Signs the certificates of joining nodes (`/cacerts`, `/v1-ferrok/…`).
    pub node_join: Option<Arc<node_join::JoinAuthority>>,
    /// Resources encrypted at rest (`--secrets-encryption`), and the keys.
    pub encryption: Option<Arc<encryption::Encryption>>,
    /// Events each resource's watch cache keeps (`--default-watch-cache-size`); 0: no cache.
    pub watch_cache_size: usize,
    /// The front proxy's certificate towards aggregated API servers.
    pub front_proxy: Option<Arc<aggregator::FrontProxy>>,
}

/// Where Events live, for both API groups that serve them; they expire.
const EVENT_PREFIXES: &[&str] = &[kinds::EVENTS_KEY_PREFIX];

/// The API server's shared state.
pub struct Api {
    pub registry: Registry,
    pub storage: Storage,
    /// Lists and watches are served from here.
    pub watch_cache: watch_cache::WatchCache,
    pub config: ApiConfig,
    pub caches: cache::Caches,
    pub openapi: openapi::DocumentCache,
    pub rbac: auth::rbac::RbacCache,
    /// Signs and checks service-account tokens.
    pub tokens: Option<auth::token::TokenSigner>,
    pub health: health::Health,
    /// Serialises the ResourceQuota admission of creates per namespace.
    pub quota_locks: admission::resource_quota::QuotaLocks,
    /// The APIServices other servers serve, and how to reach them.
    pub aggregator: aggregator::Aggregator,
}

impl Api {
    pub fn new(
        store: Arc<dyn crate::store::Store>,
        config: ApiConfig,
        tokens: Option<auth::token::TokenSigner>,
    ) -> Arc<Api> {
        let storage = Storage::new(store.clone())
            .with_ttl(EVENT_PREFIXES, config.event_ttl)
            .with_encryption(config.encryption.clone());
        let registry = Registry::builtin();
        let services: Arc<dyn resource::BeginWrite> =
            Arc::new(allocator::ServiceAllocator::new(config.service_cidr, storage.clone()));
        registry.decorate("", "services", |r| r.begin_write = Some(services.clone()));
        let caches = cache::Caches::default();
        let rbac = auth::rbac::RbacCache::new(caches.rbac.clone());
        Arc::new(Api {
            aggregator: aggregator::Aggregator::new(config.front_proxy.clone()),
            openapi: openapi::DocumentCache::default(),
            caches,
            rbac,
            registry,
            health: health::Health::new(store),
            watch_cache: watch_cache::WatchCache::new(storage.clone(), config.watch_cache_size),
            storage,
            config,
            tokens,
            quota_locks: Default::default(),
        })
    }

    /// Whether `user` may do what `attrs` describe, and why: system:masters
    /// may do anything (upstream's privileged-group authorizer, which gives
    /// no reason); a kubelet what the Node authorizer allows; everyone (a
    /// kubelet too, when the Node authorizer has no opinion) as RBAC allows,
    /// as upstream's `--authorization-mode=Node,RBAC`. A refusal carries the
    /// Node authorizer's reason, if it gave one.
    pub fn decide(&self, user: &User, attrs: &auth::rbac::Attributes) -> auth::Decision {
        if user.in_group("system:masters") {
            return auth::Decision { allowed: true, reason: String::new() };
        }
        let mut refusal = String::new();
        if let Some(node) = auth::node_authorizer::node_identity(user) {
            let graph = auth::node_graph::NodeGraph {
                pods: &self.caches.node_pods,
                claims: &self.caches.node_claims,
                volumes: &self.caches.node_volumes,
            };
            match auth::node_authorizer::authorize(node, attrs, &graph) {
                auth::node_authorizer::NodeDecision::Allow => {
                    return auth::Decision { allowed: true, reason: String::new() }
                }
                auth::node_authorizer::NodeDecision::NoOpinion(reason) => refusal = reason,
            }
        }
        match self.rbac.allowed_by(user, attrs) {
            Some(by) => auth::Decision { allowed: true, reason: format!("RBAC: allowed by {by}") },
            None => auth::Decision { allowed: false, reason: refusal },
        }
    }

    /// `decide`; but a kubelet refused an object its pods' graph does not
    /// (yet) lead to is asked again as the graph's caches change, for up to
    /// half a second: the kubelet may have seen its new pod on its own watch
    /// before the authorizer's cache did (upstream's kubelets retry instead).
    async fn decide_for_node_graph(&self, user: &User, attrs: &auth::rbac::Attributes) -> auth::Decision {
        let Some(_) = auth::node_authorizer::node_identity(user) else { return self.decide(user, attrs) };
        let (mut pods, mut claims, mut volumes) = (
            self.caches.node_pods.subscribe(),
            self.caches.node_claims.subscribe(),
            self.caches.node_volumes.subscribe(),
        );
        let mut decision = self.decide(user, attrs);
        let deadline = tokio::time::sleep(std::time::Duration::from_millis(500));
        tokio::pin!(deadline);
        while !decision.allowed && decision.reason.starts_with("no relationship found") {
            tokio::select! {
                _ = &mut deadline => break,
                r = pods.changed() => if r.is_err() { break },
                r = claims.changed() => if r.is_err() { break },
                r = volumes.changed() => if r.is_err() { break },
            }
            decision = self.decide(user, attrs);
        }
        decision
    }

    /// `decide`, recorded for the audit log when `record` is given.
    pub fn allowed_recorded(
        &self,
        user: &User,
        attrs: &auth::rbac::Attributes,
        record: Option<&auth::DecisionRecord>,
    ) -> bool {
        let decision = self.decide(user, attrs);
        if let Some(r) = record {
            r.set(&decision);
        }
        decision.allowed
    }

    pub fn allowed(&self, user: &User, attrs: &auth::rbac::Attributes) -> bool {
        self.decide(user, attrs).allowed
    }

    /// The user a bearer token names: a service-account token whose
    /// account still exists with the same uid.
    pub async fn authenticate_token(&self, token: &str) -> Option<User> {
        if let Some(join) = &self.config.join_token {
            // The node join token, whole (K10<ca hash>::server:<secret>) or its secret.
            if join.matches(token) {
                return Some(User {
                    name: "system:ferrok:node-bootstrap".into(),
                    groups: vec![
                        "system:bootstrappers".into(),
                        "system:bootstrappers:ferrok".into(),
                        "system:authenticated".into(),
                    ],
                });
            }
        }
        if let Some(user) = auth::bootstrap_token::authenticate(&self.storage, token, meta::unix_now()).await {
            return Some(user);
        }
        if let Some(user) = auth::legacy_token::authenticate(self, token).await {
            return Some(user);
        }
        let signer = self.tokens.as_ref()?;
        let claims = signer.verify(token, meta::unix_now()).ok()?;
        let key = format!("/registry/serviceaccounts/{}/{}", claims.namespace, claims.name);
        let sa = self.storage.get(&key).await.ok()??;
        let uid = sa.object.pointer("/metadata/uid").and_then(serde_json::Value::as_str).unwrap_or_default();
        if !claims.uid.is_empty() && uid != claims.uid {
            return None;
        }
        Some(User {
            name: format!("system:serviceaccount:{}:{}", claims.namespace, claims.name),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", claims.namespace),
                "system:authenticated".into(),
            ],
        })
    }

    /// Authorization: members of system:masters may do anything; RBAC for
    /// everyone else.
    pub async fn authorize(&self, call: &call::Call, verb: &str) -> Result<(), ApiError> {
        let r = &call.resource;
        let mut name = call.path.name.clone().unwrap_or_default();
        if name.is_empty() && matches!(verb, "list" | "watch") {
            // A list or watch of one object names it, as upstream's request info does.
            name = call.param("fieldSelector").and_then(request::selected_name).unwrap_or_default();
        }
        let attrs = auth::rbac::Attributes {
            verb: verb.to_string(),
            group: r.group.clone(),
            resource: r.plural.clone(),
            subresource: call.path.subresource.clone().unwrap_or_default(),
            namespace: call.namespace().unwrap_or_default().to_string(),
            name,
            path: None,
        };
        let decision = self.decide_for_node_graph(&call.user, &attrs).await;
        if let Some(record) = call.decision.as_ref() {
            record.set(&decision);
        }
        if decision.allowed {
            return Ok(());
        }
        let because = if decision.reason.is_empty() { String::new() } else { format!(": {}", decision.reason) };
        let scope = match call.namespace() {
            Some(ns) => format!(" in the namespace \"{ns}\""),
            None => " at the cluster scope".into(),
        };
        let resource = match &call.path.subresource {
            Some(s) => format!("{}/{s}", r.plural),
            None => r.plural.clone(),
        };
        let name = call.path.name.as_deref().map(|n| format!("{resource} \"{n}\"")).unwrap_or_else(|| resource.clone());
        let qualified =
            if r.group.is_empty() { name } else { name.replacen(&resource, &format!("{resource}.{}", r.group), 1) };
        let mut e = ApiError::forbidden(format!(
            "{qualified} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\"{scope}{because}",
            call.user.name, r.group
        ));
        e.kind = r.plural.clone();
        e.group = r.group.clone();
        e.name = call.path.name.clone().unwrap_or_default();
        Err(e)
    }
}

/// The router: health and version for anyone, everything else for
/// authenticated users.
pub fn router(api: Arc<Api>) -> Router {
    let auditor = api.config.audit.clone();
    let router = Router::new().fallback(handle).with_state(api).layer(axum::middleware::from_fn(recover::catch_panics));
    match auditor {
        Some(a) => router.layer(axum::middleware::from_fn_with_state(a, audit::audit)),
        None => router,
    }
}

/// `Impersonate-User` and `Impersonate-Group` (kubectl --as, --as-group):
/// allowed when the caller may `impersonate` those users and groups.
fn impersonate(
    api: &Api,
    user: &User,
    headers: &axum::http::HeaderMap,
    record: Option<&auth::DecisionRecord>,
) -> Result<Option<User>, ApiError> {
    let Some(name) = headers.get("Impersonate-User").and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let groups: Vec<String> =
        headers.get_all("Impersonate-Group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    let check = |resource: &str, target: &str| {
        let attrs = auth::rbac::Attributes {
            verb: "impersonate".into(),
            resource: resource.into(),
            name: target.into(),
            ..Default::default()
        };
        if api.allowed_recorded(user, &attrs, record) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("{resource} \"{target}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" in API group \"\" at the cluster scope", user.name)))
        }
    };
    let (resource, target) = match name.strip_prefix("system:serviceaccount:") {
        Some(_) => ("serviceaccounts", name),
        None => ("users", name),
    };
    check(resource, target)?;
    for g in &groups {
        check("groups", g)?;
    }
    let mut all = groups;
    if let Some(rest) = name.strip_prefix("system:serviceaccount:") {
        let ns = rest.split(':').next().unwrap_or_default();
        all.push("system:serviceaccounts".into());
        all.push(format!("system:serviceaccounts:{ns}"));
    }
    all.push("system:authenticated".into());
    Ok(Some(User { name: name.to_string(), groups: all }))
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
    let mut user = parts.extensions.get::<User>().cloned().unwrap_or_else(User::anonymous);
    if let Some(token) =
        parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
    {
        match api.authenticate_token(token.trim()).await {
            Some(u) => user = u,
            None => return ApiError::unauthorized().into_response(),
        }
    }
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
    if encryption::endpoint::handles(&path) {
        let record = parts.extensions.get::<auth::DecisionRecord>();
        return encryption::endpoint::serve(&api, &user, &parts.method, &path, query.as_deref(), record).await;
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
    let audit_slot = parts.extensions.get::<audit::AuditSlot>();
    match impersonate(&api, &user, &parts.headers, parts.extensions.get::<auth::DecisionRecord>()) {
        Ok(Some(as_user)) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, Some(&as_user));
            }
            user = as_user
        }
        Ok(None) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, None);
            }
        }
        Err(e) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, None);
            }
            return e.into_response();
        }
    }
    if let Some(slot) = parts.extensions.get::<recover::RequestUser>() {
        slot.set(&user.name);
    }
    let bytes = match axum::body::to_bytes(body, call::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => return ApiError::too_large().into_response(),
    };
    if let Some(slot) = audit_slot {
        slot.set_body(&bytes);
    }
    tracing::debug!(method = %parts.method, %path, user = %user.name, "request");
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
