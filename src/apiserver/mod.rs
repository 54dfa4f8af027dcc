//! The Kubernetes API over HTTPS: TLS with client certificates, discovery,
//! health, and the registry-driven resource handlers over the store.
//!
//! Read from the top: `serve` (the listener) hands each request to
//! `router`, which passes it through `filters` (authentication,
//! impersonation, authorization over `auth`'s authorizers) to discovery,
//! health, OpenAPI or `handlers`, the one generic resource path. `Api`
//! below is what they share.

// ApiError carries a whole metav1.Status; errors are the slow path, and
// boxing every one would only add an allocation where it matters least.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod aggregator;
pub mod allocator;
pub mod audit;
pub mod auth;
pub mod builtin_schemas;
pub mod cache;
pub mod call;
pub mod component_status;
pub mod controlplane;
pub mod crd;
pub mod discovery;
pub mod encryption;
pub mod field_order;
pub mod filters;
pub mod handlers;
pub mod health;
pub mod in_process;
pub mod json_entries;
pub mod kinds;
pub mod kubelet_client;
pub mod meta;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod proxy;
pub mod registry;
pub mod request;
pub mod resource;
pub mod router;
pub mod selector;
pub mod serve;
pub mod status;
pub mod storage;
pub mod strategy;
pub mod supervisor;
pub mod table;
pub mod validation;
pub mod watch_cache;
pub mod webhook_client;

use std::net::IpAddr;
use std::sync::Arc;

use registry::Registry;
use status::ApiError;
use storage::Storage;

pub use router::router;

/// What the API server needs to know about the cluster.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// host:port clients reach this server on (discovery's serverAddress).
    pub advertise: String,
    pub advertise_ip: IpAddr,
    pub https_port: u16,
    pub service_cidr: crate::net::Ipv4Net,
    pub cluster_domain: String,
    /// `--cluster-dns`: the `kube-dns` Service's cluster IP.
    pub cluster_dns: Option<IpAddr>,
    /// The node join token, accepted as a bearer token for bootstrapping.
    pub join_token: Option<Arc<supervisor::server_token::ServerToken>>,
    /// How long Events live after their last write (`--event-ttl`).
    pub event_ttl: std::time::Duration,
    /// The audit policy and log (`--audit-policy-file`, `--audit-log-path`).
    pub audit: Option<Arc<audit::Auditor>>,
    /// How kubelets are reached (logs, exec, port-forward, nodes/proxy).
    pub kubelet: Option<kubelet_client::KubeletConnector>,
    /// Signs the certificates of joining nodes (`/cacerts`, `/v1-ferrok/…`).
    pub node_join: Option<Arc<supervisor::node_join::JoinAuthority>>,
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
    /// What the Node authorizer's graph is read from.
    pub node_graph: auth::graph_populator::NodeGraphCaches,
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
            node_graph: Default::default(),
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

    /// Loads the API server's watch-fed caches (admission's and
    /// authorization's) and starts following them.
    pub async fn start_caches(&self) -> Result<Vec<tokio::task::JoinHandle<()>>, ApiError> {
        let mut tasks = self.caches.start(&self.storage).await?;
        tasks.extend(self.node_graph.start(&self.storage).await?);
        Ok(tasks)
    }

    /// Every watch-fed cache has loaded once (readiness' `informer-sync`).
    pub fn caches_synced(&self) -> bool {
        self.caches.synced() && self.node_graph.synced()
    }
}
