//! `ferrok server`: the control plane. Opens the store (embedded SQLite or
//! an external etcd), ensures the PKI, bootstraps the cluster's built-in
//! objects, writes the admin kubeconfig and serves the Kubernetes API.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::apiserver::auth::User;
use crate::apiserver::{self, allocator::Cidr, Api, ApiConfig};
use crate::pki::{write_kubeconfig, Pki, PkiOptions};
use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::sqlite::{SqliteOptions, SqliteStore};
use crate::store::{grpc, Store};

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Folder for ferrok's state.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Port of the Kubernetes API (HTTPS).
    #[arg(long, default_value_t = 6443)]
    pub https_listen_port: u16,
    /// Address the API listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// Address other nodes and the `kubernetes` Service reach this server on
    /// (default: the host's first non-loopback IPv4 address).
    #[arg(long)]
    pub advertise_address: Option<IpAddr>,
    /// More names or addresses for the serving certificate (repeatable, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub tls_san: Vec<String>,
    /// Where to write the admin kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub write_kubeconfig: Option<PathBuf>,
    /// File mode of the kubeconfig, in octal (e.g. 644).
    #[arg(long, value_parser = parse_mode)]
    pub write_kubeconfig_mode: Option<u32>,
    /// Pod network.
    #[arg(long, default_value = "10.42.0.0/16")]
    pub cluster_cidr: Cidr,
    /// Service network; its first address is the `kubernetes` Service.
    #[arg(long, default_value = "10.43.0.0/16")]
    pub service_cidr: Cidr,
    /// Address of the cluster DNS service.
    #[arg(long, default_value = "10.43.0.10")]
    pub cluster_dns: IpAddr,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Shared secret nodes join with (generated when not given).
    #[arg(long, env = "FERROK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Run the control plane only, without the node role on this host.
    #[arg(long)]
    pub disable_agent: bool,
    /// This host's node name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Use this external etcd (comma-separated URLs) instead of the embedded store.
    #[arg(long, value_name = "URLS")]
    pub datastore_endpoint: Option<String>,
    /// CA bundle that signs the external etcd's serving certificates
    #[arg(long, value_name = "FILE")]
    pub datastore_cafile: Option<PathBuf>,
    /// Client certificate for the external etcd
    #[arg(long, value_name = "FILE")]
    pub datastore_certfile: Option<PathBuf>,
    /// Key of --datastore-certfile
    #[arg(long, value_name = "FILE")]
    pub datastore_keyfile: Option<PathBuf>,
    /// Also serve the store as an etcd v3 endpoint at this URL (http://host:port).
    #[arg(long, value_name = "URL")]
    pub datastore_listen: Option<String>,
    /// How often the store is compacted (to the revision seen one interval
    /// earlier), as kube-apiserver's flag; 0 turns compaction off.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = super::duration::parse_or_zero)]
    pub etcd_compaction_interval: std::time::Duration,
    /// How long Events are kept after their last write.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::duration::parse)]
    pub event_ttl: std::time::Duration,
    /// Events each resource's watch cache keeps for watches to resume from
    /// (lists and watches are served from the cache); 0 turns the cache off
    /// and every read goes to the store.
    #[arg(long, value_name = "EVENTS", default_value_t = crate::apiserver::watch_cache::DEFAULT_WINDOW)]
    pub default_watch_cache_size: usize,
    /// Space quota of the embedded store in bytes, as etcd's flag: past it,
    /// writes fail with etcd's NOSPACE alarm until it is disarmed. 0 is
    /// etcd's default (2 GiB); a negative value turns the quota off.
    #[arg(long, value_name = "BYTES", default_value_t = 0, allow_negative_numbers = true)]
    pub quota_backend_bytes: i64,
    /// Argument for the embedded scheduler, as `key=value` (repeatable);
    /// `config=FILE` reads a KubeSchedulerConfiguration (profiles).
    #[arg(long, value_name = "KEY=VALUE")]
    pub kube_scheduler_arg: Vec<String>,
    /// Where the audit log is written; `-` is standard output. Auditing
    /// needs --audit-policy-file too.
    #[arg(long, value_name = "PATH")]
    pub audit_log_path: Option<PathBuf>,
    /// Argument for the embedded controller manager, as `key=value`
    /// (repeatable): `terminated-pod-gc-threshold=N` (default 12500).
    #[arg(long, value_name = "KEY=VALUE")]
    pub kube_controller_manager_arg: Vec<String>,
    /// The audit policy (audit.k8s.io/v1 Policy, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub audit_policy_file: Option<PathBuf>,
    /// Size in megabytes past which the audit log is rotated (0: 100).
    #[arg(long, value_name = "MB", default_value_t = 0)]
    pub audit_log_maxsize: u64,
    /// Rotated audit logs kept (0: all, unless too old).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub audit_log_maxbackup: usize,
    /// Days a rotated audit log is kept (0: no limit).
    #[arg(long, value_name = "DAYS", default_value_t = 0)]
    pub audit_log_maxage: u64,
    /// Encrypt Secrets at rest: makes `<data-dir>/server/cred/encryption-config.json`
    /// (a new key) or turns it on; `ferrok secrets-encrypt` manages it.
    #[arg(long)]
    pub secrets_encryption: bool,
    /// The cipher of a key that --secrets-encryption makes (aescbc, secretbox).
    #[arg(long, value_name = "PROVIDER", default_value = "aescbc")]
    pub secrets_encryption_provider: apiserver::encryption::config::Cipher,
    #[command(flatten)]
    pub snapshots: super::etcd_snapshot::schedule::SnapshotServerArgs,
    /// Do not run a packaged part (k3s' names; repeatable, comma-separated):
    /// coredns, servicelb, local-storage, metrics-server (traefik: accepted, ferrok has none).
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_enum)]
    pub disable: Vec<super::components::Component>,
    /// Where local-path volumes are made (default: <data-dir>/storage).
    #[arg(long, value_name = "DIR")]
    pub default_local_storage_path: Option<PathBuf>,
    #[command(flatten)]
    pub node: super::node_args::NodeArgs,
    /// Config file (YAML; keys are the long flag names).
    #[arg(long, value_name = "FILE", env = "FERROK_CONFIG_FILE", default_value = "/etc/ferrok/config.yaml")]
    pub config: PathBuf,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode like 600 or 644"))
}

use crate::host::{host_ip, hostname};

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

/// The encryption configuration in the data dir, made or turned on first
/// with `--secrets-encryption`; a file present is always used (what it
/// sealed must stay readable). On a shared datastore, the cluster's
/// configuration (see `encryption::cluster`).
async fn secrets_encryption(
    args: &ServerArgs,
    data_dir: &std::path::Path,
    shared: Option<Arc<apiserver::encryption::cluster::SharedConfig>>,
) -> anyhow::Result<Arc<apiserver::encryption::Encryption>> {
    use apiserver::encryption::{cluster, config, Encryption};
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

/// `--terminated-pod-gc-threshold` from `--kube-controller-manager-arg`s.
fn controller_manager_args(args: &[String]) -> anyhow::Result<usize> {
    let mut threshold = crate::controllers::pod_gc::DEFAULT_TERMINATED_POD_THRESHOLD;
    for arg in args {
        match arg.trim_start_matches("--").split_once('=') {
            Some(("terminated-pod-gc-threshold", n)) => {
                threshold = n.parse().with_context(|| {
                    format!("--kube-controller-manager-arg {arg:?}: the threshold must be a number of pods")
                })?;
            }
            _ => {
                anyhow::bail!("--kube-controller-manager-arg {arg:?}: only terminated-pod-gc-threshold=N is understood")
            }
        }
    }
    Ok(threshold)
}

/// The scheduler's profiles from `--kube-scheduler-arg config=FILE`.
fn scheduler_profiles(args: &[String]) -> anyhow::Result<Vec<crate::scheduler::profile::Profile>> {
    let mut profiles = crate::scheduler::default_profiles();
    for arg in args {
        match arg.split_once('=') {
            Some(("config", file)) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("--kube-scheduler-arg config: cannot read {file}"))?;
                profiles = crate::scheduler::config::profiles_from(&text)
                    .with_context(|| format!("--kube-scheduler-arg config: {file}"))?;
            }
            _ => anyhow::bail!("--kube-scheduler-arg {arg:?}: only config=FILE is understood"),
        }
    }
    Ok(profiles)
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut shutdown = super::ShutdownSignal::install();
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    std::fs::create_dir_all(&data_dir).with_context(|| format!("--data-dir: cannot create {}", data_dir.display()))?;
    let advertise_ip = args.advertise_address.unwrap_or_else(host_ip);
    let node_name = args.node_name.clone().unwrap_or_else(hostname).to_lowercase();
    if args.snapshots.resetting() {
        return args.snapshots.cluster_reset(&data_dir, args.datastore_endpoint.as_deref());
    }
    let enabled = super::components::Enabled::from_disabled(&args.disable);
    let local_storage = args.default_local_storage_path.clone().unwrap_or_else(|| data_dir.join("storage"));
    if !local_storage.is_absolute() {
        anyhow::bail!("--default-local-storage-path {}: must be an absolute path", local_storage.display());
    }
    if enabled.local_storage {
        std::fs::create_dir_all(&local_storage)
            .with_context(|| format!("--default-local-storage-path: cannot create {}", local_storage.display()))?;
    }
    let manifests = crate::controllers::manifests::manifests_dir(&data_dir);
    std::fs::create_dir_all(&manifests).with_context(|| format!("cannot create {}", manifests.display()))?;
    use crate::controllers::manifests::packaged;
    packaged::install(&manifests, packaged::LOCAL_STORAGE, enabled.local_storage)
        .with_context(|| format!("cannot write the packaged manifests in {}", manifests.display()))?;

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
            let mut opts = SqliteOptions::new(super::etcd_snapshot::embedded_db(&data_dir));
            opts.sync = crate::store::sqlite::SyncMode::Full;
            opts.quota_backend_bytes = args.quota_backend_bytes;
            let s = SqliteStore::open(opts)
                .with_context(|| format!("cannot open the datastore in {}", data_dir.display()))?;
            sqlite = Some(s.clone());
            s
        }
    };
    let datastore = match &sqlite {
        Some(_) => super::etcd_snapshot::Datastore::Embedded(super::etcd_snapshot::embedded_db(&data_dir)),
        None => super::etcd_snapshot::Datastore::External(store.clone()),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    if let Some(url) = &args.datastore_listen {
        let listeners = grpc::bind(std::slice::from_ref(url)).await.context("--datastore-listen")?;
        let store = store.clone();
        let stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) =
                grpc::serve(store, listeners, grpc::TlsFiles::default(), crate::store::DEFAULT_MAX_REQUEST_BYTES, stop)
                    .await
            {
                tracing::error!(error = %e, "the etcd face stopped");
            }
        }));
    }

    let mut sans = args.tls_san.clone();
    sans.push(hostname());
    sans.push(advertise_ip.to_string());
    let tls_dir = data_dir.join("server").join("tls");
    let token_file = data_dir.join("server").join("token");
    // Servers sharing an external datastore share one PKI (the embedded
    // store has one server only).
    let token = match &args.datastore_endpoint {
        Some(_) => {
            Some(super::datastore_pki::shared_pki(store.as_ref(), &tls_dir, &token_file, args.token.clone()).await?)
        }
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

    let (server_ca, client_ca) = pki.load_cas().context("the certificate authorities")?;
    let server_ca_bundle =
        std::fs::read(&pki.server_ca_cert).with_context(|| format!("cannot read {}", pki.server_ca_cert.display()))?;
    let join_token = apiserver::supervisor::server_token::ServerToken::new(
        pki.token.clone(),
        token_file,
        &server_ca_bundle,
        args.datastore_endpoint.as_ref().map(|_| store.clone()),
    );
    let node_join = apiserver::supervisor::node_join::JoinAuthority::new(
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
                local_storage.to_string_lossy().into_owned()
            } else {
                String::new()
            },
        },
        pki.server_ca_cert.parent().map(Path::to_path_buf),
    );
    let shared_encryption = args.datastore_endpoint.as_ref().map(|_| {
        let token = join_token.clone();
        apiserver::encryption::cluster::SharedConfig::new(store.clone(), move || token.current(), &node_name)
    });
    let encryption =
        secrets_encryption(&args, &data_dir, shared_encryption.clone()).await.context("secrets encryption")?;
    let config = ApiConfig {
        advertise: format!("{advertise_ip}:{}", args.https_listen_port),
        advertise_ip,
        https_port: args.https_listen_port,
        service_cidr: args.service_cidr,
        cluster_domain: args.cluster_domain.clone(),
        cluster_dns: enabled.dns.then_some(args.cluster_dns),
        join_token: Some(join_token),
        event_ttl: args.event_ttl,
        watch_cache_size: args.default_watch_cache_size,
        audit: auditor(&args).context("audit")?,
        kubelet: Some(
            apiserver::kubelet_client::KubeletConnector::new(
                &pki.server_ca_cert,
                &pki.kubelet_client_cert,
                &pki.kubelet_client_key,
            )
            .context("the kubelet client")?,
        ),
        node_join: Some(node_join),
        encryption: Some(encryption.clone()),
        front_proxy: Some(Arc::new(
            apiserver::aggregator::FrontProxy::load(
                &pki.request_header_ca_cert,
                &pki.proxy_client_cert,
                &pki.proxy_client_key,
            )
            .context("the front proxy's client certificate")?,
        )),
    };
    let issuer = format!("https://kubernetes.default.svc.{}", args.cluster_domain);
    let tokens =
        apiserver::auth::token::TokenSigner::load(&pki.service_account_key, issuer).context("service-account key")?;
    let api = Api::new(store.clone(), config, Some(tokens));
    if !enabled.metrics {
        // No metrics.k8s.io: neither served nor announced (its APIService goes).
        api.registry.remove("metrics.k8s.io", "nodes");
        api.registry.remove("metrics.k8s.io", "pods");
    }
    let addr = SocketAddr::new(args.bind_address, args.https_listen_port);
    let listener = apiserver::serve::bind(addr).await.context("--https-listen-port")?;
    let tls = apiserver::serve::tls_config(&pki.serving_cert, &pki.serving_key, &pki.client_ca_cert).context("TLS")?;
    tasks.push(tokio::spawn(apiserver::serve::serve(listener, tls, apiserver::router(api.clone()), stop_rx.clone())));
    use apiserver::health::hooks;
    apiserver::controlplane::system_objects::run(&api).await.map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    // The kubernetes Service's endpoints: this server and every other live one.
    let endpoints = apiserver::controlplane::endpoint_reconciler::LeaseEndpointReconciler::start(api.clone())
        .await
        .map_err(|e| anyhow::anyhow!("the kubernetes endpoints: {e}"))?;
    tasks.push(tokio::spawn(endpoints.run(stop_rx.clone())));
    api.health.hook_finished(hooks::BOOTSTRAP_CONTROLLER);
    apiserver::auth::default_policy::run(&api.storage).await.map_err(|e| anyhow::anyhow!("default RBAC roles: {e}"))?;
    apiserver::controlplane::legacy_token_tracking::ensure(&api.storage)
        .await
        .map_err(|e| anyhow::anyhow!("legacy token tracking: {e}"))?;
    let client_ca = std::fs::read_to_string(&pki.client_ca_cert).context("client CA")?;
    let front_proxy = api
        .aggregator
        .front_proxy()
        .map(|f| apiserver::controlplane::cluster_authentication_trust::RequestHeader::front_proxy(f.ca_pem.clone()));
    apiserver::controlplane::cluster_authentication_trust::publish(&api.storage, &client_ca, front_proxy.as_ref())
        .await
        .map_err(|e| anyhow::anyhow!("extension-apiserver-authentication: {e}"))?;
    // Followers of the store run until the process stops; they are aborted.
    let mut followers = api.start_caches().await.map_err(|e| anyhow::anyhow!("loading the API caches: {e}"))?;
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
    followers.extend(apiserver::controlplane::compactor::start(store.clone(), args.etcd_compaction_interval));
    followers.extend(args.snapshots.start(datastore, &data_dir, &node_name));
    if let Some(shared) = shared_encryption {
        followers.push(tokio::spawn(apiserver::encryption::cluster::follow(encryption.clone(), shared)));
    }
    followers.push(tokio::spawn(apiserver::encryption::reencrypt::reencrypt_at_start(store.clone(), encryption)));
    let controller_config = Arc::new(crate::controllers::ControllerConfig {
        server_ca_pem: Arc::new(std::fs::read_to_string(&pki.server_ca_cert).context("server CA")?),
        cluster_cidr: (args.cluster_cidr.base, args.cluster_cidr.prefix),
        node_cidr_mask: 24,
        servicelb: enabled.servicelb,
        cluster_dns: enabled.dns,
        local_storage: enabled.local_storage.then(|| local_storage.clone()),
        terminated_pod_gc_threshold: controller_manager_args(&args.kube_controller_manager_arg)?,
        signing: Arc::new(crate::controllers::certificates::signer::SigningConfig {
            client_ca: crate::controllers::certificates::signer::CaFiles {
                cert: pki.client_ca_cert.clone(),
                key: pki.client_ca_key.clone(),
            },
            server_ca: crate::controllers::certificates::signer::CaFiles {
                cert: pki.server_ca_cert.clone(),
                key: pki.server_ca_key.clone(),
            },
            duration: crate::controllers::certificates::signer::DEFAULT_DURATION,
        }),
        service_account_key: Arc::new(
            crate::pki::service_account_key::ServiceAccountKey::load(&pki.service_account_key)
                .context("service-account key")?,
        ),
    });
    // The auto-deploy folder, on every server, with the server's own rights.
    {
        let (client, dir, server) =
            (apiserver::in_process::client(api.clone(), User::supervisor()), manifests.clone(), node_name.clone());
        followers.push(tokio::spawn(async move { crate::controllers::manifests::run(client, dir, &server).await }));
    }
    // kube-public/cluster-info names this server and the CA, for the bootstrap signer to sign.
    {
        let client = apiserver::in_process::client(api.clone(), User::supervisor());
        let server = format!("https://{}", api.config.advertise);
        let ca = std::fs::read_to_string(&pki.server_ca_cert).context("server CA")?;
        followers.push(tokio::spawn(async move {
            if let Err(e) = super::cluster_info::publish(client, &server, &ca).await {
                tracing::warn!(error = %e, "cannot publish kube-public/cluster-info");
            }
        }));
    }
    // Node passwords follow their Nodes, on every server (deletes are idempotent).
    followers.push(tokio::spawn(crate::controllers::node_password::run(apiserver::in_process::client(
        api.clone(),
        User::supervisor(),
    ))));
    let manager = apiserver::in_process::client(api.clone(), User::controller_manager());
    // One informer per kind for the controllers and the scheduler alike.
    let informers = crate::client::informer_factory::SharedInformerFactory::new(
        apiserver::in_process::client_for_informers(api.clone(), User::controller_manager()),
    );
    let election = crate::client::leader::LeaderElection::new(manager.clone(), "kube-controller-manager", &node_name);
    let for_controllers = api.clone();
    let client_for: crate::client::ClientFor = Arc::new(move |name: &str| {
        apiserver::in_process::client(for_controllers.clone(), User::controller_service_account(name))
    });
    let for_manager = informers.clone();
    // The node role (its network, its shared watches) reads from the same informers.
    let for_node = informers.clone();
    followers
        .push(tokio::spawn(election.run(move || {
            crate::controllers::start(for_manager.clone(), client_for.clone(), controller_config.clone())
        })));
    let profiles: Vec<_> = scheduler_profiles(&args.kube_scheduler_arg)?.into_iter().map(Arc::new).collect();
    let scheduler = apiserver::in_process::client(api.clone(), User::scheduler());
    let election = crate::client::leader::LeaderElection::new(scheduler.clone(), "kube-scheduler", &node_name);
    followers.push(tokio::spawn(election.run(move || {
        vec![tokio::spawn(crate::scheduler::run(scheduler.clone(), informers.clone(), profiles.clone()))]
    })));

    let kubeconfig = args.write_kubeconfig.clone().unwrap_or_else(|| {
        if super::is_root() && args.data_dir.is_none() {
            PathBuf::from("/etc/ferrok/ferrok.yaml")
        } else {
            data_dir.join("kubeconfig.yaml")
        }
    });
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
    write_kubeconfig(
        &kubeconfig,
        args.write_kubeconfig_mode.unwrap_or(0o600),
        &format!("https://127.0.0.1:{}", args.https_listen_port),
        &read(&pki.server_ca_cert)?,
        &read(&pki.admin_cert)?,
        &read(&pki.admin_key)?,
    )
    .context("--write-kubeconfig")?;
    tracing::info!(
        addr = %addr, kubeconfig = %kubeconfig.display(), node = %node_name,
        ready_ms = started.elapsed().as_millis() as u64, "ferrok server is ready"
    );
    let agent = if args.disable_agent {
        None
    } else {
        let config = args.node.agent_config(
            &data_dir,
            &node_name,
            advertise_ip,
            true,
            &args.cluster_dns,
            &args.cluster_domain,
            &args.cluster_cidr,
            &args.service_cidr,
            args.data_dir.is_none(),
        )?;
        let tls = crate::agent::KubeletTls {
            cert: config.dir.join("serving-kubelet.crt"),
            key: config.dir.join("serving-kubelet.key"),
            client_ca: pki.client_ca_cert.clone(),
        };
        crate::pki::ensure_kubelet_serving(
            &data_dir.join("server").join("tls"),
            &tls.cert,
            &tls.key,
            &node_name,
            &config.node_ips,
        )
        .context("the kubelet's serving certificate")?;
        let config = crate::agent::AgentConfig { kubelet_tls: Some(tls), dns_server: enabled.dns, ..config };
        if enabled.local_storage {
            // Released local-path volumes of this node: their directories, then the volumes.
            followers.push(tokio::spawn(crate::agent::local_path::run(
                apiserver::in_process::client(api.clone(), User::node(&node_name)),
                for_node.clone(),
                node_name.clone(),
                local_storage.clone(),
            )));
        }
        let client = apiserver::in_process::client(api.clone(), User::node(&node_name));
        let labeler = apiserver::in_process::client(api.clone(), User::supervisor());
        Some(crate::agent::start(config, client, Some(labeler), for_node).await.context("the node role")?)
    };

    shutdown.wait().await;
    api.health.shutdown_initiated();
    // The listeners close first (this server's address leaves the
    // `kubernetes` EndpointSlice and agents move to another server), then
    // the node role stops, and whatever has not ended 5 s later is dropped.
    let _ = stop_tx.send(true);
    if let Some(agent) = agent {
        agent.stop().await;
    }
    for f in followers {
        f.abort();
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), futures_util::future::join_all(tasks)).await;
    if let Some(a) = &api.config.audit {
        a.shutdown().await;
    }
    if let Some(s) = sqlite {
        s.close().await;
    }
    Ok(())
}
