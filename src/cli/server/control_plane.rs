//! The control plane's start-up steps: the store (and its etcd face), the
//! PKI, the join authorities, encryption at rest, the API server, the
//! cluster's built-in objects, and the loops that follow the store.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::{Running, ServerArgs, Setup};
use crate::apiserver::auth::User;
use crate::apiserver::encryption::cluster::SharedConfig;
use crate::apiserver::encryption::Encryption;
use crate::apiserver::supervisor::{node_join::JoinAuthority, server_token::ServerToken};
use crate::apiserver::{self, Api, ApiConfig};
use crate::cli::etcd_snapshot;
use crate::net::NthAddr;
use crate::pki::{Pki, PkiOptions};
use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::sqlite::{SqliteOptions, SqliteStore};
use crate::store::{grpc, Store};

/// The store the server runs on.
pub(super) struct Datastore {
    pub store: Arc<dyn Store>,
    /// The embedded store, closed at shutdown.
    pub sqlite: Option<Arc<SqliteStore>>,
    /// What snapshots are taken of.
    pub snapshots: etcd_snapshot::Datastore,
}

/// Secrets encryption at rest, and on a shared datastore the cluster's
/// configuration it follows.
pub(super) struct EncryptionAtRest {
    pub encryption: Arc<Encryption>,
    pub shared: Option<Arc<SharedConfig>>,
}

/// Connects to the external etcd (`--datastore-endpoint`) or opens the
/// embedded store in the data dir.
pub(super) fn open_datastore(s: &Setup) -> anyhow::Result<Datastore> {
    let (args, data_dir) = (&s.args, &s.data_dir);
    let mut sqlite = None;
    let store: Arc<dyn Store> = match &args.datastore_endpoint {
        Some(endpoints) => EtcdStore::connect(&EtcdOptions::from_flags(
            endpoints,
            args.datastore_cafile.clone(),
            args.datastore_certfile.clone(),
            args.datastore_keyfile.clone(),
        ))
        .context("--datastore-endpoint")?,
        None => {
            let mut opts = SqliteOptions::new(etcd_snapshot::embedded_db(data_dir));
            opts.sync = crate::store::sqlite::SyncMode::Full;
            opts.quota_backend_bytes = args.quota_backend_bytes;
            let s = SqliteStore::open(opts)
                .with_context(|| format!("cannot open the datastore in {}", data_dir.display()))?;
            sqlite = Some(s.clone());
            s
        }
    };
    let snapshots = match &sqlite {
        Some(_) => etcd_snapshot::Datastore::Embedded(etcd_snapshot::embedded_db(data_dir)),
        None => etcd_snapshot::Datastore::External(store.clone()),
    };
    Ok(Datastore { store, sqlite, snapshots })
}

/// Serves the store as an etcd v3 endpoint (`--datastore-listen`), if asked.
pub(super) async fn serve_datastore(s: &Setup, store: &Arc<dyn Store>, running: &mut Running) -> anyhow::Result<()> {
    let Some(url) = &s.args.datastore_listen else { return Ok(()) };
    let listeners = grpc::bind(std::slice::from_ref(url)).await.context("--datastore-listen")?;
    let store = store.clone();
    let stop = running.stop.clone();
    running.tasks.push(tokio::spawn(async move {
        if let Err(e) =
            grpc::serve(store, listeners, grpc::TlsFiles::default(), crate::store::DEFAULT_MAX_REQUEST_BYTES, stop)
                .await
        {
            tracing::error!(error = %e, "the etcd face stopped");
        }
    }));
    Ok(())
}

/// Makes or loads the certificates, keys and join token; servers sharing
/// an external datastore share one PKI (the embedded store has one server
/// only). Returns the PKI and the token file.
pub(super) async fn ensure_pki(s: &Setup, store: &Arc<dyn Store>) -> anyhow::Result<(Pki, PathBuf)> {
    let args = &s.args;
    let mut sans = args.tls_san.clone();
    sans.push(crate::host::hostname());
    sans.push(s.advertise_ip.to_string());
    let tls_dir = s.data_dir.join("server").join("tls");
    let token_file = s.data_dir.join("server").join("token");
    let token = match &args.datastore_endpoint {
        Some(_) => Some(
            crate::cli::datastore_pki::shared_pki(store.as_ref(), &tls_dir, &token_file, args.token.clone()).await?,
        ),
        None => args.token.clone(),
    };
    let pki = Pki::ensure(&PkiOptions {
        dir: tls_dir,
        token_file: token_file.clone(),
        sans,
        cluster_domain: args.cluster_domain.clone(),
        service_ip: Some(IpAddr::V4(args.service_cidr.nth(1))),
        token,
    })
    .context("cannot prepare the certificates")?;
    Ok((pki, token_file))
}

/// The server's join token and the authority that admits joining nodes
/// (and hands them the cluster's settings).
pub(super) fn join_authorities(
    s: &Setup,
    pki: &Pki,
    token_file: PathBuf,
    store: &Arc<dyn Store>,
) -> anyhow::Result<(Arc<ServerToken>, Arc<JoinAuthority>)> {
    let (args, enabled) = (&s.args, s.enabled);
    let (server_ca, client_ca) = pki.load_cas().context("the certificate authorities")?;
    let server_ca_bundle =
        std::fs::read(&pki.server_ca_cert).with_context(|| format!("cannot read {}", pki.server_ca_cert.display()))?;
    let join_token = ServerToken::new(
        pki.token.clone(),
        token_file,
        &server_ca_bundle,
        args.datastore_endpoint.as_ref().map(|_| store.clone()),
    );
    let node_join = JoinAuthority::new(
        server_ca_bundle,
        server_ca,
        client_ca,
        crate::client::node_join::NodeJoinConfig {
            cluster_cidr: args.cluster_cidr.to_string(),
            service_cidr: args.service_cidr.to_string(),
            cluster_dns: args.cluster_dns.to_string(),
            cluster_domain: args.cluster_domain.clone(),
            client_ca: std::fs::read_to_string(&pki.client_ca_cert)
                .with_context(|| format!("cannot read {}", pki.client_ca_cert.display()))?,
            flannel_backend: args.node.flannel_backend.unwrap_or_default().to_string(),
            disable_cluster_dns: !enabled.dns,
            local_storage_path: if enabled.local_storage {
                s.local_storage.to_string_lossy().into_owned()
            } else {
                String::new()
            },
        },
        pki.server_ca_cert.parent().map(Path::to_path_buf),
    );
    Ok((join_token, node_join))
}

/// Secrets encryption at rest: the data dir's configuration, or on a
/// shared datastore the cluster's.
pub(super) async fn start_encryption(
    s: &Setup,
    store: &Arc<dyn Store>,
    join_token: &Arc<ServerToken>,
) -> anyhow::Result<EncryptionAtRest> {
    let shared = s.args.datastore_endpoint.as_ref().map(|_| {
        let token = join_token.clone();
        SharedConfig::new(store.clone(), move || token.current(), &s.node_name)
    });
    let encryption = secrets_encryption(&s.args, &s.data_dir, shared.clone()).await.context("secrets encryption")?;
    Ok(EncryptionAtRest { encryption, shared })
}

/// The encryption configuration in the data dir, made or turned on first
/// with `--secrets-encryption`; a file present is always used (what it
/// sealed must stay readable). On a shared datastore, the cluster's
/// configuration (see `encryption::cluster`).
async fn secrets_encryption(
    args: &ServerArgs,
    data_dir: &Path,
    shared: Option<Arc<SharedConfig>>,
) -> anyhow::Result<Arc<Encryption>> {
    use apiserver::encryption::{cluster, config};
    let path = config::path_in(data_dir);
    match &shared {
        Some(shared) => {
            let enable = args.secrets_encryption.then_some(args.secrets_encryption_provider);
            cluster::join(&path, enable, shared).await?;
        }
        None => {
            if args.secrets_encryption && config::ensure_enabled(&path, args.secrets_encryption_provider)? {
                tracing::info!(file = %path.display(), "secrets encryption turned on");
            }
        }
    }
    let encryption = Encryption::load(&path)?;
    if let Some(shared) = shared {
        encryption.set_shared(shared);
    }
    if encryption.config().is_some() && !encryption.enabled() {
        tracing::info!(file = %path.display(), "secrets encryption is disabled: Secrets are written in plain");
    }
    Ok(encryption)
}

/// The API server's configuration: addresses, networks, the join
/// authorities, auditing, the kubelet client, encryption and the front proxy.
pub(super) fn api_config(
    s: &Setup,
    pki: &Pki,
    join_token: Arc<ServerToken>,
    node_join: Arc<JoinAuthority>,
    encryption: Arc<Encryption>,
) -> anyhow::Result<ApiConfig> {
    let (args, advertise_ip) = (&s.args, s.advertise_ip);
    Ok(ApiConfig {
        advertise: format!("{advertise_ip}:{}", args.https_listen_port),
        advertise_ip,
        https_port: args.https_listen_port,
        service_cidr: args.service_cidr,
        cluster_domain: args.cluster_domain.clone(),
        cluster_dns: s.enabled.dns.then_some(args.cluster_dns),
        join_token: Some(join_token),
        event_ttl: args.event_ttl,
        watch_cache_size: args.default_watch_cache_size,
        audit: auditor(args).context("audit")?,
        kubelet: Some(
            apiserver::kubelet_client::KubeletConnector::new(
                &pki.server_ca_cert,
                &pki.kubelet_client_cert,
                &pki.kubelet_client_key,
            )
            .context("the kubelet client")?,
        ),
        node_join: Some(node_join),
        encryption: Some(encryption),
        front_proxy: Some(Arc::new(
            apiserver::aggregator::FrontProxy::load(
                &pki.request_header_ca_cert,
                &pki.proxy_client_cert,
                &pki.proxy_client_key,
            )
            .context("the front proxy's client certificate")?,
        )),
    })
}

/// The auditor `--audit-policy-file` and `--audit-log-path` ask for, if any.
fn auditor(args: &ServerArgs) -> anyhow::Result<Option<Arc<apiserver::audit::Auditor>>> {
    use apiserver::audit::{backend, policy::Policy, rotate::RotateOptions, Auditor};
    let (Some(path), Some(policy)) = (&args.audit_log_path, &args.audit_policy_file) else {
        if args.audit_log_path.is_some() {
            tracing::warn!("--audit-log-path without --audit-policy-file: nothing is audited");
        }
        return Ok(None);
    };
    let policy = Policy::load(policy)?;
    let sink = if path.as_os_str() == "-" {
        backend::Sink::Stdout
    } else {
        backend::Sink::File {
            path: path.clone(),
            rotate: RotateOptions {
                max_size: args.audit_log_maxsize.saturating_mul(1024 * 1024),
                max_backups: args.audit_log_maxbackup,
                max_age: std::time::Duration::from_secs(args.audit_log_maxage.saturating_mul(86_400)),
            },
        }
    };
    Ok(Some(Auditor::new(policy, backend::Backend::start(sink)?)))
}

/// The API server: its service-account token signer, without
/// metrics.k8s.io when metrics are off, serving HTTPS on
/// `--bind-address`:`--https-listen-port` until `stop`. Returns it and
/// the address it listens on.
pub(super) async fn start_api_server(
    s: &Setup,
    store: &Arc<dyn Store>,
    pki: &Pki,
    config: ApiConfig,
    running: &mut Running,
) -> anyhow::Result<(Arc<Api>, SocketAddr)> {
    let issuer = format!("https://kubernetes.default.svc.{}", s.args.cluster_domain);
    let tokens =
        apiserver::auth::token::TokenSigner::load(&pki.service_account_key, issuer).context("service-account key")?;
    let api = Api::new(store.clone(), config, Some(tokens));
    if !s.enabled.metrics {
        // No metrics.k8s.io: neither served nor announced (its APIService goes).
        api.registry.remove("metrics.k8s.io", "nodes");
        api.registry.remove("metrics.k8s.io", "pods");
    }
    let addr = SocketAddr::new(s.args.bind_address, s.args.https_listen_port);
    let listener = apiserver::serve::bind(addr).await.context("--https-listen-port")?;
    let tls = apiserver::serve::tls_config(&pki.serving_cert, &pki.serving_key, &pki.client_ca_cert).context("TLS")?;
    let serve = apiserver::serve::serve(listener, tls, apiserver::router(api.clone()), running.stop.clone());
    running.tasks.push(tokio::spawn(serve));
    Ok((api, addr))
}

/// The cluster's built-in objects, the `kubernetes` Service's endpoints,
/// the default RBAC roles, legacy token tracking and the
/// extension-apiserver-authentication ConfigMap.
pub(super) async fn bootstrap_control_plane(api: &Arc<Api>, pki: &Pki, running: &mut Running) -> anyhow::Result<()> {
    use apiserver::controlplane::{cluster_authentication_trust as trust, endpoint_reconciler};
    use apiserver::health::hooks;
    apiserver::controlplane::system_objects::run(api).await.map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    // The kubernetes Service's endpoints: this server and every other live one.
    let endpoints = endpoint_reconciler::LeaseEndpointReconciler::start(api.clone())
        .await
        .map_err(|e| anyhow::anyhow!("the kubernetes endpoints: {e}"))?;
    running.tasks.push(tokio::spawn(endpoints.run(running.stop.clone())));
    api.health.hook_finished(hooks::BOOTSTRAP_CONTROLLER);
    apiserver::auth::default_policy::run(&api.storage).await.map_err(|e| anyhow::anyhow!("default RBAC roles: {e}"))?;
    apiserver::controlplane::legacy_token_tracking::ensure(&api.storage)
        .await
        .map_err(|e| anyhow::anyhow!("legacy token tracking: {e}"))?;
    let client_ca = std::fs::read_to_string(&pki.client_ca_cert).context("client CA")?;
    let front_proxy = api.aggregator.front_proxy().map(|f| trust::RequestHeader::front_proxy(f.ca_pem.clone()));
    trust::publish(&api.storage, &client_ca, front_proxy.as_ref())
        .await
        .map_err(|e| anyhow::anyhow!("extension-apiserver-authentication: {e}"))?;
    Ok(())
}

/// The API server's caches and its own loops (cluster-IP repair, the
/// aggregated ClusterRoles, CustomResourceDefinitions, APIServices), with
/// the health hooks each of them finishes.
pub(super) async fn start_api_loops(api: &Arc<Api>, running: &mut Running) -> anyhow::Result<()> {
    use apiserver::health::hooks;
    // Followers of the store run until the process stops; they are aborted.
    let followers = &mut running.followers;
    followers.extend(api.start_caches().await.map_err(|e| anyhow::anyhow!("loading the API caches: {e}"))?);
    // The IPAddresses of the Services' cluster IPs (upstream's allocator and RepairIPAddress).
    followers.push(tokio::spawn(apiserver::controlplane::service_ip_repair::RepairIpAddress::new(api.clone()).run()));
    // admin, edit and view are written without rules: they hold their
    // aggregated ones before the server counts as ready (the controller
    // keeps them current from then on).
    {
        use crate::controllers::clusterrole_aggregation as aggregation;
        let client = apiserver::in_process::client(api.clone(), User::controller_service_account(aggregation::NAME));
        aggregation::aggregate_all(client).await.map_err(|e| anyhow::anyhow!("aggregated ClusterRoles: {e}"))?;
    }
    api.health.hook_finished(hooks::RBAC_BOOTSTRAP_ROLES);
    api.health.hook_finished(hooks::START_INFORMERS);
    followers.push(
        apiserver::crd::start(api.clone())
            .await
            .map_err(|e| anyhow::anyhow!("loading CustomResourceDefinitions: {e}"))?,
    );
    api.health.hook_finished(hooks::APIEXTENSIONS_CONTROLLERS);
    api.health.hook_finished(hooks::CRD_INFORMER_SYNCED);
    followers.extend(
        apiserver::aggregator::start(api.clone()).await.map_err(|e| anyhow::anyhow!("loading APIServices: {e}"))?,
    );
    Ok(())
}

/// The loops over the store itself: compaction, scheduled snapshots, the
/// shared encryption configuration, and re-encryption at start.
pub(super) fn start_store_loops(
    s: &Setup,
    store: &Arc<dyn Store>,
    snapshots: etcd_snapshot::Datastore,
    at_rest: EncryptionAtRest,
    running: &mut Running,
) {
    let followers = &mut running.followers;
    followers.extend(apiserver::controlplane::compactor::start(store.clone(), s.args.etcd_compaction_interval));
    followers.extend(s.args.snapshots.start(snapshots, &s.data_dir, &s.node_name));
    if let Some(shared) = at_rest.shared {
        followers.push(tokio::spawn(apiserver::encryption::cluster::follow(at_rest.encryption.clone(), shared)));
    }
    followers
        .push(tokio::spawn(apiserver::encryption::reencrypt::reencrypt_at_start(store.clone(), at_rest.encryption)));
}
