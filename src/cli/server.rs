//! `ferrok server`: the control plane. Opens the store (embedded SQLite or
//! an external etcd), ensures the PKI, bootstraps the cluster's built-in
//! objects, writes the admin kubeconfig and serves the Kubernetes API.
//!
//! `run` reads as the server's start-up, step by step; the steps live in
//! `control_plane` (store, PKI, API server and its own loops),
//! `controllers` (the server loops, the controller manager and the
//! scheduler) and `node` (the node role on the server's own host).

mod control_plane;
mod controllers;
mod node;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::control_plane::{
    api_config, bootstrap_control_plane, ensure_pki, join_authorities, open_datastore, serve_datastore,
    start_api_loops, start_api_server, start_encryption, start_store_loops, Datastore,
};
use self::controllers::{controller_config, start_controllers, start_scheduler, start_server_loops};
use self::node::start_node;
use super::components::Enabled;
use crate::apiserver::{self, Api};
use crate::host::{host_ip, hostname};
use crate::net::Ipv4Net;
use crate::pki::{write_kubeconfig, Pki};

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
    #[arg(long, default_value = "10.42.0.0/16", value_parser = crate::net::parse_cluster_range)]
    pub cluster_cidr: Ipv4Net,
    /// Service network; its first address is the `kubernetes` Service.
    #[arg(long, default_value = "10.43.0.0/16", value_parser = crate::net::parse_cluster_range)]
    pub service_cidr: Ipv4Net,
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

/// What the first steps settle and the later ones read.
struct Setup {
    args: ServerArgs,
    data_dir: PathBuf,
    advertise_ip: IpAddr,
    node_name: String,
    enabled: Enabled,
    local_storage: PathBuf,
    /// The auto-deploy manifests folder.
    manifests: PathBuf,
}

/// What runs until shutdown: `tasks` end when `stop` turns true and are
/// waited for; `followers` (of the store) run until they are aborted.
struct Running {
    stop_tx: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
    followers: Vec<JoinHandle<()>>,
}

/// Starts the server step by step (each step below says what it does),
/// then runs until SIGTERM or SIGINT and stops it.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut shutdown = super::ShutdownSignal::install();
    let data_dir = prepare_data_dir(&args)?;
    let advertise_ip = args.advertise_address.unwrap_or_else(host_ip);
    let node_name = args.node_name.clone().unwrap_or_else(hostname).to_lowercase();
    if args.snapshots.resetting() {
        return args.snapshots.cluster_reset(&data_dir, args.datastore_endpoint.as_deref());
    }
    let enabled = Enabled::from_disabled(&args.disable);
    let local_storage = prepare_local_storage(&args, &data_dir, enabled)?;
    let manifests = install_packaged_manifests(&data_dir, enabled)?;
    let s = Setup { args, data_dir, advertise_ip, node_name, enabled, local_storage, manifests };

    let Datastore { store, sqlite, snapshots } = open_datastore(&s)?;
    let (stop_tx, stop) = watch::channel(false);
    let mut running = Running { stop_tx, stop, tasks: Vec::new(), followers: Vec::new() };
    serve_datastore(&s, &store, &mut running).await?;
    let (pki, token_file) = ensure_pki(&s, &store).await?;
    let (join_token, node_join) = join_authorities(&s, &pki, token_file, &store)?;
    let at_rest = start_encryption(&s, &store, &join_token).await?;
    let config = api_config(&s, &pki, join_token, node_join, at_rest.encryption.clone())?;
    let (api, addr) = start_api_server(&s, &store, &pki, config, &mut running).await?;
    bootstrap_control_plane(&api, &pki, &mut running).await?;
    start_api_loops(&api, &mut running).await?;
    start_store_loops(&s, &store, snapshots, at_rest, &mut running);
    let controller_config = controller_config(&s, &pki)?;
    start_server_loops(&s, &api, &pki, &mut running)?;
    let informers = start_controllers(&s, &api, controller_config, &mut running);
    start_scheduler(&s, &api, informers.clone(), &mut running)?;
    let kubeconfig = write_admin_kubeconfig(&s, &pki)?;
    tracing::info!(
        addr = %addr, kubeconfig = %kubeconfig.display(), node = %s.node_name,
        ready_ms = started.elapsed().as_millis() as u64, "ferrok server is ready"
    );
    let agent = start_node(&s, &api, &pki, informers, &mut running).await?;

    shutdown.wait().await;
    shut_down(&api, running, agent, sqlite).await;
    Ok(())
}

/// Creates the data dir (`--data-dir`, or the default for this user).
fn prepare_data_dir(args: &ServerArgs) -> anyhow::Result<PathBuf> {
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    std::fs::create_dir_all(&data_dir).with_context(|| format!("--data-dir: cannot create {}", data_dir.display()))?;
    Ok(data_dir)
}

/// Where local-path volumes go (`--default-local-storage-path`, or
/// `<data-dir>/storage`), created when local storage is on.
fn prepare_local_storage(args: &ServerArgs, data_dir: &std::path::Path, enabled: Enabled) -> anyhow::Result<PathBuf> {
    let local_storage = args.default_local_storage_path.clone().unwrap_or_else(|| data_dir.join("storage"));
    if !local_storage.is_absolute() {
        anyhow::bail!("--default-local-storage-path {}: must be an absolute path", local_storage.display());
    }
    if enabled.local_storage {
        std::fs::create_dir_all(&local_storage)
            .with_context(|| format!("--default-local-storage-path: cannot create {}", local_storage.display()))?;
    }
    Ok(local_storage)
}

/// Creates the auto-deploy manifests folder and writes the packaged
/// manifests into it (local storage's, when it is on); returns the folder.
fn install_packaged_manifests(data_dir: &std::path::Path, enabled: Enabled) -> anyhow::Result<PathBuf> {
    use crate::controllers::manifests::{manifests_dir, packaged};
    let manifests = manifests_dir(data_dir);
    std::fs::create_dir_all(&manifests).with_context(|| format!("cannot create {}", manifests.display()))?;
    packaged::install(&manifests, packaged::LOCAL_STORAGE, enabled.local_storage)
        .with_context(|| format!("cannot write the packaged manifests in {}", manifests.display()))?;
    Ok(manifests)
}

/// Writes the admin kubeconfig (`--write-kubeconfig`, or the default
/// place) pointing at this server on 127.0.0.1; returns where.
fn write_admin_kubeconfig(s: &Setup, pki: &Pki) -> anyhow::Result<PathBuf> {
    let kubeconfig = s.args.write_kubeconfig.clone().unwrap_or_else(|| {
        if super::is_root() && s.args.data_dir.is_none() {
            PathBuf::from("/etc/ferrok/ferrok.yaml")
        } else {
            s.data_dir.join("kubeconfig.yaml")
        }
    });
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
    write_kubeconfig(
        &kubeconfig,
        s.args.write_kubeconfig_mode.unwrap_or(0o600),
        &format!("https://127.0.0.1:{}", s.args.https_listen_port),
        &read(&pki.server_ca_cert)?,
        &read(&pki.admin_cert)?,
        &read(&pki.admin_key)?,
    )
    .context("--write-kubeconfig")?;
    Ok(kubeconfig)
}

/// Stops the server: the listeners close first (this server's address
/// leaves the `kubernetes` EndpointSlice and agents move to another
/// server), then the node role stops, and whatever has not ended 5 s later
/// is dropped; then the audit log is flushed and the embedded store closed.
async fn shut_down(
    api: &Api,
    running: Running,
    agent: Option<crate::agent::Agent>,
    sqlite: Option<Arc<crate::store::sqlite::SqliteStore>>,
) {
    api.health.shutdown_initiated();
    let _ = running.stop_tx.send(true);
    if let Some(agent) = agent {
        agent.stop().await;
    }
    for f in running.followers {
        f.abort();
    }
    let _ =
        tokio::time::timeout(std::time::Duration::from_secs(5), futures_util::future::join_all(running.tasks)).await;
    if let Some(a) = &api.config.audit {
        a.shutdown().await;
    }
    if let Some(s) = sqlite {
        s.close().await;
    }
}
