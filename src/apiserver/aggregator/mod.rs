//! The aggregation layer (upstream's kube-aggregator): an APIService whose
//! `spec.service` names a Service is served by another API server behind
//! it. Requests for its group and version are authenticated and authorized
//! here, then passed on to one of the Service's ready endpoints over TLS
//! (checked against the APIService's `caBundle`, unless
//! `insecureSkipTLSVerify`), presenting the front proxy's client
//! certificate and the caller in the request headers the other server
//! trusts from it (`X-Remote-User`, `X-Remote-Group`), as upstream's
//! `--enable-aggregator-routing` does. The group is listed in discovery
//! beside the built-in ones, and the availability check keeps each
//! APIService's `Available` condition and its discovery document.

pub mod availability;
pub mod proxy;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

use super::meta;
use super::registry::version_priority;
use super::storage::{Followed, Follower, Stored};
use super::Api;
use crate::sync::RwLockExt;

/// Where APIServices are stored.
pub const PREFIX: &str = "/registry/apiregistration.k8s.io/apiservices/";
/// The Service port of an APIService that names none.
const DEFAULT_PORT: u16 = 443;

#[derive(Debug, thiserror::Error)]
pub enum AggregatorError {
    #[error("{path}: {message}")]
    Pem { path: String, message: String },
    #[error("front proxy TLS: {0}")]
    Tls(String),
}

/// The front proxy's client certificate, presented to every aggregated
/// API server, and the CA that signed it (published for them).
pub struct FrontProxy {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The request-header CA, PEM.
    pub ca_pem: String,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrontProxy")
    }
}

impl FrontProxy {
    pub fn load(
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<FrontProxy, AggregatorError> {
        let pem = |path: &std::path::Path, e: &dyn std::fmt::Display| AggregatorError::Pem {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| pem(cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem(cert, &e))?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem(key, &e))?;
        let ca_pem = std::fs::read_to_string(ca).map_err(|e| pem(ca, &e))?;
        Ok(FrontProxy { chain, key: key_der, ca_pem })
    }
}

/// An APIService served by another API server.
#[derive(Clone)]
pub struct Remote {
    /// The APIService's name (`v1alpha1.wardle.example.com`).
    pub name: String,
    pub group: String,
    pub version: String,
    pub group_priority: i64,
    pub version_priority: i64,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    /// TLS towards it: its CA bundle (or no check) and the front proxy's certificate.
    tls: Arc<rustls::ClientConfig>,
    /// TLS of the availability check: the front proxy's certificate, any
    /// serving certificate taken (upstream's check is best effort).
    check_tls: Arc<rustls::ClientConfig>,
}

impl Remote {
    /// The name its serving certificate must carry.
    fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// An aggregated group as discovery lists it.
pub struct RemoteGroup {
    pub name: String,
    /// Its versions, preferred first.
    pub versions: Vec<String>,
}

/// The APIServices served elsewhere, and their discovery documents.
#[derive(Default)]
pub struct Aggregator {
    front_proxy: Option<Arc<FrontProxy>>,
    remotes: RwLock<HashMap<String, Remote>>,
    /// The last `APIResourceList` each remote answered discovery with.
    discovery: RwLock<HashMap<String, Value>>,
    /// Told when the set of remotes changes (the availability check runs then).
    changed: tokio::sync::Notify,
    /// TLS of `https:` pod and service proxies, made at the first use.
    proxy_tls: std::sync::OnceLock<Arc<rustls::ClientConfig>>,
}

impl Aggregator {
    pub fn new(front_proxy: Option<Arc<FrontProxy>>) -> Aggregator {
        Aggregator { front_proxy, ..Default::default() }
    }

    pub fn front_proxy(&self) -> Option<&FrontProxy> {
        self.front_proxy.as_deref()
    }

    /// The TLS settings of `https:` pod and service proxies, as upstream's
    /// proxy transport: the other side's certificate is not checked (a pod
    /// serves whatever it likes), the front proxy's client certificate is
    /// presented.
    pub fn proxy_tls(&self) -> Result<Arc<rustls::ClientConfig>, AggregatorError> {
        if let Some(c) = self.proxy_tls.get() {
            return Ok(c.clone());
        }
        let config = self.tls_config(&Value::Null, true)?;
        Ok(self.proxy_tls.get_or_init(|| config).clone())
    }

    /// The remote serving `group`/`version`, if another server does.
    pub fn remote_for(&self, group: &str, version: &str) -> Option<Remote> {
        let remotes = self.remotes.read_locked();
        remotes.values().find(|r| r.group == group && r.version == version).cloned()
    }

    pub fn remotes(&self) -> Vec<Remote> {
        self.remotes.read_locked().values().cloned().collect()
    }

    /// Whether another server serves some version of `group`.
    pub fn serves_group(&self, group: &str) -> bool {
        self.remotes.read_locked().values().any(|r| r.group == group)
    }

    /// The aggregated groups, by group priority (highest first), their
    /// versions by version priority, then by Kubernetes' version order.
    pub fn groups(&self) -> Vec<RemoteGroup> {
        let remotes = self.remotes();
        let mut by_group: HashMap<&str, Vec<&Remote>> = HashMap::new();
        for r in &remotes {
            by_group.entry(r.group.as_str()).or_default().push(r);
        }
        let mut groups: Vec<(i64, RemoteGroup)> = by_group
            .into_iter()
            .map(|(name, mut versions)| {
                versions.sort_by(|a, b| {
                    b.version_priority
                        .cmp(&a.version_priority)
                        .then_with(|| version_priority(&b.version).cmp(&version_priority(&a.version)))
                });
                let priority = versions.iter().map(|r| r.group_priority).max().unwrap_or(0);
                let versions = versions.iter().map(|r| r.version.clone()).collect();
                (priority, RemoteGroup { name: name.to_string(), versions })
            })
            .collect();
        groups.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
        groups.into_iter().map(|(_, g)| g).collect()
    }

    /// The discovery document `group`/`version` last answered with.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let name = self.remote_for(group, version)?.name;
        self.discovery.read_locked().get(&name).cloned()
    }

    fn set_discovery(&self, name: &str, list: Option<Value>) {
        let mut discovery = self.discovery.write_locked();
        match list {
            Some(l) => discovery.insert(name.to_string(), l),
            None => discovery.remove(name),
        };
    }

    fn put(&self, apiservice: &Value) {
        let name = meta::name_of(apiservice).to_string();
        let remote = self.remote_of(apiservice);
        let mut remotes = self.remotes.write_locked();
        match remote {
            Some(r) => remotes.insert(name, r),
            None => remotes.remove(&name),
        };
        drop(remotes);
        self.changed.notify_one();
    }

    fn remove(&self, apiservice: &Value) {
        let name = meta::name_of(apiservice);
        self.remotes.write_locked().remove(name);
        self.set_discovery(name, None);
        self.changed.notify_one();
    }

    fn replace_all(&self, apiservices: &[Stored]) {
        let remotes: HashMap<String, Remote> = apiservices
            .iter()
            .filter_map(|s| Some((meta::name_of(&s.object).to_string(), self.remote_of(&s.object)?)))
            .collect();
        *self.remotes.write_locked() = remotes;
        self.changed.notify_one();
    }

    /// A remote from an APIService with a service; None for a local one
    /// (or one whose TLS settings cannot be used, logged).
    fn remote_of(&self, apiservice: &Value) -> Option<Remote> {
        let spec = apiservice.get("spec")?;
        let service = spec.get("service").filter(|s| s.is_object())?;
        let name = meta::name_of(apiservice).to_string();
        let insecure = spec["insecureSkipTLSVerify"].as_bool() == Some(true);
        let tls = match self.tls_config(spec, insecure).and_then(|t| Ok((t, self.tls_config(spec, true)?))) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(apiservice = %name, error = %e, "cannot make the TLS settings of an APIService");
                return None;
            }
        };
        Some(Remote {
            group: spec["group"].as_str().unwrap_or_default().to_string(),
            version: spec["version"].as_str().unwrap_or_default().to_string(),
            group_priority: spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
            version_priority: spec["versionPriority"].as_i64().unwrap_or(0),
            namespace: service["namespace"].as_str().unwrap_or_default().to_string(),
            service: service["name"].as_str().unwrap_or_default().to_string(),
            port: service["port"].as_u64().and_then(|p| u16::try_from(p).ok()).unwrap_or(DEFAULT_PORT),
            tls: tls.0,
            check_tls: tls.1,
            name,
        })
    }

    fn tls_config(&self, spec: &Value, insecure: bool) -> Result<Arc<rustls::ClientConfig>, AggregatorError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| AggregatorError::Tls(e.to_string()))?;
        let builder = if insecure {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(proxy::NoVerification(provider)))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            if let Some(bundle) = spec["caBundle"].as_str() {
                use base64::Engine;
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(bundle)
                    .map_err(|e| AggregatorError::Tls(format!("caBundle: {e}")))?;
                for c in CertificateDer::pem_slice_iter(&pem) {
                    let c = c.map_err(|e| AggregatorError::Tls(format!("caBundle: {e}")))?;
                    roots.add(c).map_err(|e| AggregatorError::Tls(format!("caBundle: {e}")))?;
                }
            }
            builder.with_root_certificates(roots)
        };
        let mut config = match &self.front_proxy {
            Some(fp) => builder
                .with_client_auth_cert(fp.chain.clone(), fp.key.clone_key())
                .map_err(|e| AggregatorError::Tls(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Reads the stored APIServices, then follows them, and runs the
/// availability check beside.
pub async fn start(api: Arc<Api>) -> Result<Vec<tokio::task::JoinHandle<()>>, super::status::ApiError> {
    let mut follower = Follower::new(api.storage.clone(), PREFIX);
    api.aggregator.replace_all(&follower.list().await?);
    let follow = tokio::spawn({
        let api = api.clone();
        async move {
            loop {
                match follower.next().await {
                    Followed::Listed(all) => api.aggregator.replace_all(&all),
                    Followed::Put(s) => api.aggregator.put(&s.object),
                    Followed::Deleted(s) => api.aggregator.remove(&s.object),
                }
            }
        }
    });
    Ok(vec![follow, tokio::spawn(availability::run(api))])
}
