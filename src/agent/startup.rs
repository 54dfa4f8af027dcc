//! The node role's start-up steps, in the order `start` takes them: the
//! drop folders, the container runtime, the Node's registration, Lease and
//! status, the pod network, network policy and service proxy, cluster DNS,
//! the kubelet and its managers, the images folder, the pod workers and
//! the pods' sources (static pods, then the API).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector;

use crate::client::informer_factory::SharedInformerFactory;
use tokio::sync::{mpsc, watch, Notify};

use super::containerd::{self, Containerd, ContainerdConfig, ContainerdPaths};
use super::cri::{self, Cri};
use super::{
    dns, events, housekeeping, image_manager, images, kubelet, kuberuntime, lifecycle, node_lease, node_status, pleg,
    pod_config, pod_network, pod_workers, prober, server, static_pods, status_manager, volume_manager, AgentConfig,
    AgentError, NodePuller,
};

/// The folders a user drops files into (static pod manifests, image
/// tarballs) exist from the start.
pub(super) fn create_drop_folders(config: &AgentConfig) -> Result<(), AgentError> {
    for dir in [config.dir.join("pod-manifests"), config.dir.join("images")] {
        std::fs::create_dir_all(&dir).map_err(|e| AgentError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// The container runtime as the node runs it.
pub(super) struct ContainerRuntime {
    /// Our own containerd (none with `--container-runtime-endpoint`).
    pub containerd: Option<Containerd>,
    pub cri: Cri,
    pub paths: ContainerdPaths,
    pub pause_image: String,
    pub registries: Arc<images::registries::Registries>,
    pub version: cri::api::VersionResponse,
    pub handler_names: Vec<String>,
}

/// Writes registries.yaml (k3s' format) as containerd's hosts.toml files,
/// starts containerd (or connects to `--container-runtime-endpoint`),
/// waits until it is ready, and imports the built-in pause image.
pub(super) async fn start_container_runtime(config: &AgentConfig) -> Result<ContainerRuntime, AgentError> {
    let external = config.runtime_endpoint.is_some();
    let (handlers, cni_bin_dir) = containerd::check_host(external)?;
    let paths = ContainerdPaths::new(&config.dir);
    let pause_image = config.pause_image.clone().unwrap_or_else(|| images::PAUSE_IMAGE.to_string());
    let registries = Arc::new(images::registries::Registries::load(&config.dir.join("etc").join("registries.yaml"))?);
    registries.write_hosts(&paths.certs_d)?;
    let (containerd, cri) = match &config.runtime_endpoint {
        Some(endpoint) => (None, Cri::connect(&cri::socket_path(endpoint)?)?),
        None => {
            let cd = Containerd::start(&ContainerdConfig {
                paths: paths.clone(),
                sandbox_image: pause_image.clone(),
                handlers: handlers.clone(),
                cni_bin_dir,
                max_container_log_line_size: 16 * 1024,
            })
            .await?;
            let cri = Cri::connect(cd.socket())?;
            (Some(cd), cri)
        }
    };
    let version = cri.wait_ready(Duration::from_secs(30)).await?;
    tracing::info!(runtime = %version.runtime_name, version = %version.runtime_version, "container runtime ready");
    let handler_names: Vec<String> = handlers.iter().map(|h| h.name.clone()).collect();
    if config.pause_image.is_none() && images::ensure_pause_image(&cri, &pause_image).await? {
        tracing::info!(image = %pause_image, "built-in pause image imported");
    }
    Ok(ContainerRuntime { containerd, cri, paths, pause_image, registries, version, handler_names })
}

/// The Node as registered, and what its status loop works from.
pub(super) struct Registered {
    pub node: Node,
    pub inputs: node_status::StatusInputs,
    /// Where eviction reports the node's pressure conditions.
    pub pressure: watch::Sender<node_status::NodePressure>,
    /// The allocatable the API holds for the node, kept by the status loop.
    pub node_allocatable: watch::Receiver<BTreeMap<String, Quantity>>,
}

/// What the pod workers are wired to besides the kubelet.
pub(super) struct KubeletWiring {
    pub index: Arc<pleg::ContainerIndex>,
    pub mirrors: Arc<static_pods::Mirrors>,
    pub probe_updates: mpsc::UnboundedReceiver<prober::ProbeUpdate>,
}

/// What the start-up steps share: the configuration, the API client, the
/// process's one informer factory (the watches the node can share), the
/// container runtime, and the tasks started so far (aborted by `stop`).
pub(super) struct NodeStartup {
    pub config: Arc<AgentConfig>,
    pub client: kube::Client,
    pub informers: SharedInformerFactory,
    pub cri: Cri,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl NodeStartup {
    /// Registers the Node with its first status, retrying until the API
    /// server takes it.
    pub async fn register(&self, labeler: Option<&kube::Client>, handler_names: &[String]) -> Registered {
        let (pressure, pressure_rx) = watch::channel(node_status::NodePressure::default());
        let (node_allocatable_tx, node_allocatable) = watch::channel(node_status::resources(&self.config).1);
        let inputs = node_status::StatusInputs {
            config: self.config.clone(),
            cri: self.cri.clone(),
            handlers: handler_names.to_vec(),
            pressure: pressure_rx,
            allocatable: node_allocatable_tx,
        };
        let first_status = node_status::current_status(&inputs).await;
        let node = loop {
            match node_status::register(&self.client, labeler, &self.config, first_status.clone()).await {
                Ok(n) => break n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot register the node yet; retrying");
                    tokio::time::sleep(node_status::REGISTER_RETRY).await;
                }
            }
        };
        Registered { node, inputs, pressure, node_allocatable }
    }

    /// The node's Lease, renewed, and its status, written when it changes
    /// or `status_trigger` fires.
    pub fn start_lease_and_status(
        &mut self,
        node: Node,
        inputs: node_status::StatusInputs,
        node_uid: String,
        status_trigger: &Arc<Notify>,
    ) {
        let (client, config) = (&self.client, &self.config);
        self.tasks.push(tokio::spawn(node_lease::run(
            client.clone(),
            config.node_name.clone(),
            node_uid,
            config.kubelet.node_lease_duration_seconds,
        )));
        let own_node = node_status::own_node_changes(&self.informers, config);
        self.tasks.push(tokio::spawn(node_status::run(client.clone(), inputs, node, status_trigger.clone(), own_node)));
    }

    /// The pod network (CNI configuration once the node has its podCIDR)
    /// and the routes to the other nodes' pods. Returns the podCIDR as it
    /// becomes known.
    pub async fn start_pod_network(
        &mut self,
        nft: &crate::network::nftables::TableWriter,
        paths: &ContainerdPaths,
        status_trigger: &Arc<Notify>,
    ) -> watch::Receiver<Option<crate::net::Ipv4Net>> {
        use crate::network::overlay;
        let config = &self.config;
        let (pod_cidr_tx, pod_cidr) = watch::channel(None);
        let underlay =
            overlay::underlay(config.flannel_backend, config.flannel_iface.as_deref(), &config.node_ips).await;
        self.tasks.push(tokio::spawn(pod_network::run(
            node_status::own_node_changes(&self.informers, config),
            self.cri.clone(),
            pod_network::PodNetwork {
                conf_dir: paths.cni_conf_dir.clone(),
                ipam_dir: config.dir.join("cni").join("ipam"),
                cluster_cidr: config.cluster_cidr,
                service_cidr: config.service_cidr,
                nft: nft.part("node"),
                mtu: overlay::pod_mtu(config.flannel_backend, underlay.as_ref()),
            },
            status_trigger.clone(),
            pod_cidr_tx,
        )));
        // Routes to the other nodes' pods, once this node has its podCIDR.
        self.tasks.push(tokio::spawn(overlay::run(
            self.client.clone(),
            self.informers.clone(),
            overlay::OverlayConfig {
                node_name: config.node_name.clone(),
                backend: config.flannel_backend,
                cluster_cidr: config.cluster_cidr,
                underlay,
            },
            pod_cidr.clone(),
        )));
        pod_cidr
    }

    /// NetworkPolicies for the pods on this node.
    pub fn start_network_policy(&mut self, nft: &crate::network::nftables::TableWriter) {
        use crate::network::network_policy::{run, NetworkPolicyConfig};
        let config = &self.config;
        let cluster_dns = config
            .cluster_dns
            .iter()
            .filter_map(|ip| match ip {
                std::net::IpAddr::V4(v4) => Some(*v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        let policy = NetworkPolicyConfig { node_name: config.node_name.clone(), cluster_dns };
        self.tasks.push(tokio::spawn(run(self.informers.clone(), policy, nft.part("network-policy"))));
    }

    /// The service proxy (Services' virtual IPs) on nftables.
    pub fn start_service_proxy(&mut self, nft: &crate::network::nftables::TableWriter) {
        use crate::network::service_proxy;
        let dataplane = service_proxy::nftables::NftablesDataplane::new(nft.part("services"), self.config.cluster_cidr);
        self.tasks.push(tokio::spawn(service_proxy::run(
            self.informers.clone(),
            self.config.node_name.clone(),
            dataplane,
        )));
    }

    /// RuntimeClasses for the runtime's handlers.
    pub fn ensure_runtime_classes(&mut self, handler_names: Vec<String>) {
        let client = self.client.clone();
        self.tasks.push(tokio::spawn(async move { super::ensure_runtime_classes(&client, &handler_names).await }));
    }

    /// Cluster DNS: this node's own, on its pod-network gateway, port 53.
    pub fn start_cluster_dns(
        &mut self,
        host: &crate::host::resolv_conf::ResolvConf,
        pod_cidr: watch::Receiver<Option<crate::net::Ipv4Net>>,
    ) {
        use crate::network::dns;
        let config = &self.config;
        if config.dns_server {
            let dns_config =
                dns::ClusterDnsConfig::for_node(&config.node_name, &config.cluster_domain, host, &config.cluster_dns);
            self.tasks.extend(dns::spawn(&self.informers, dns_config, pod_cidr));
        }
    }

    /// The kubelet: its runtime manager (images, probes, hooks, DNS), its
    /// volume manager and its status manager.
    pub fn new_kubelet(
        &self,
        events: events::Events,
        host: crate::host::resolv_conf::ResolvConf,
        runtime: &ContainerRuntime,
        node_allocatable: watch::Receiver<BTreeMap<String, Quantity>>,
        services: reflector::Store<Service>,
    ) -> (Arc<kubelet::Kubelet>, KubeletWiring) {
        let (_, allocatable) = node_status::resources(&self.config);
        let index = Arc::new(pleg::ContainerIndex::default());
        let mirrors = Arc::new(static_pods::Mirrors::default());
        let (probe_manager, probe_updates) =
            prober::ProbeManager::new(self.cri.clone(), Arc::new(events.recorder().clone()));
        let probes = Arc::new(kubelet::prober_results::KubeletProber { manager: probe_manager });
        let runtime_manager = self.new_runtime_manager(&events, host, runtime, &index, &probes);
        let volumes = self.new_volume_manager(&allocatable);
        let kubelet = Arc::new(kubelet::Kubelet {
            client: self.client.clone(),
            config: self.config.clone(),
            runtime: runtime_manager,
            status: status_manager::StatusManager::start(self.client.clone()),
            events,
            runtime_name: runtime.version.runtime_name.clone(),
            host_ips: self.config.node_ips.iter().map(|ip| ip.to_string()).collect(),
            allocatable,
            node_allocatable,
            services,
            volumes,
            probes,
            mirrors: mirrors.clone(),
        });
        (kubelet, KubeletWiring { index, mirrors, probe_updates })
    }

    /// The runtime manager: pods' sandboxes and containers through CRI,
    /// with the image manager (and the node's registry credentials), crash
    /// back-off, lifecycle hooks, probes and the pods' DNS.
    pub fn new_runtime_manager(
        &self,
        events: &events::Events,
        host: crate::host::resolv_conf::ResolvConf,
        runtime: &ContainerRuntime,
        index: &Arc<pleg::ContainerIndex>,
        probes: &Arc<kubelet::prober_results::KubeletProber>,
    ) -> Arc<kuberuntime::manager::RuntimeManager> {
        let (config, cri) = (&self.config, &self.cri);
        let memory_capacity = crate::host::meminfo("MemTotal").unwrap_or(0) as i64;
        let image_manager =
            image_manager::ImageManager::new(Arc::new(cri.clone()), self.client.clone(), events.clone());
        image_manager.set_node_credentials(runtime.registries.clone());
        Arc::new(kuberuntime::manager::RuntimeManager {
            cri: Arc::new(cri.clone()),
            client: self.client.clone(),
            events: events.clone(),
            images: image_manager,
            index: index.clone(),
            crash_backoff: crate::backoff::Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
            hooks: Some(Arc::new(lifecycle::CriHooks { cri: cri.clone() })),
            probes: Some(probes.clone()),
            dns: dns::DnsSettings {
                cluster_dns: config.cluster_dns.clone(),
                cluster_domain: config.cluster_domain.clone(),
                host,
            },
            pods_dir: config.dir.join("pods"),
            pod_logs_dir: config.pod_logs_dir.clone(),
            cgroup_root: config.kubelet.cgroup_root.clone(),
            memory_capacity,
        })
    }

    /// The volume manager, told the node's allocatable (for downward-API
    /// resource values without limits).
    pub fn new_volume_manager(&self, allocatable: &BTreeMap<String, Quantity>) -> volume_manager::VolumeManager {
        let config = &self.config;
        let volumes =
            volume_manager::VolumeManager::new(self.client.clone(), config.dir.join("pods"), config.node_name.clone());
        let quantity = |name: &str, milli: bool| {
            allocatable.get(name).and_then(|q| {
                if milli {
                    crate::quantity::milli_value(q)
                } else {
                    crate::quantity::value(q)
                }
            })
        };
        volumes.set_node_allocatable(volume_manager::NodeAllocatable {
            cpu_millis: quantity("cpu", true).unwrap_or(0),
            memory_bytes: quantity("memory", false).unwrap_or(0),
            ephemeral_storage_bytes: quantity("ephemeral-storage", false).unwrap_or(0),
        });
        volumes
    }

    /// Tarballs in the images folder are imported before any pod starts,
    /// then whenever one lands there; the node's image list (for the
    /// scheduler's ImageLocality) then has them.
    pub async fn import_images(
        &self,
        kubelet: &Arc<kubelet::Kubelet>,
        status_trigger: &Notify,
    ) -> Result<images::ImagesDirTask, AgentError> {
        let puller = Arc::new(NodePuller(kubelet.clone()));
        let (images_dir, imported) =
            images::ImagesDir::for_agent(&self.config.dir, self.cri.clone(), Some(puller)).start().await?;
        for (file, outcome) in imported {
            match outcome {
                Ok(o) => tracing::debug!(file = %file.display(), outcome = ?o, "images folder"),
                Err(e) => tracing::warn!(file = %file.display(), error = %e, "cannot import image file"),
            }
        }
        status_trigger.notify_one();
        Ok(images_dir)
    }

    /// The pod workers, woken by the PLEG and by probe results; the
    /// kubelet's HTTPS endpoint; and housekeeping (eviction, garbage
    /// collection).
    pub async fn start_pod_workers(
        &mut self,
        kubelet: &Arc<kubelet::Kubelet>,
        runtime: &ContainerRuntime,
        index: Arc<pleg::ContainerIndex>,
        mut probe_updates: mpsc::UnboundedReceiver<prober::ProbeUpdate>,
        pressure: watch::Sender<node_status::NodePressure>,
    ) -> Result<Arc<pod_workers::PodWorkers>, AgentError> {
        let workers = pod_workers::PodWorkers::new(kubelet.clone());
        {
            let workers = workers.clone();
            self.tasks.push(tokio::spawn(pleg::run(self.cri.clone(), index, move |event| match event {
                pleg::PodLifecycleEvent::ContainerDied { pod_uid, container_id } => {
                    workers.container_died(&pod_uid, &container_id)
                }
                pleg::PodLifecycleEvent::Relist => workers.wake_all(),
            })));
        }
        {
            let workers = workers.clone();
            self.tasks.push(tokio::spawn(async move {
                while let Some(update) = probe_updates.recv().await {
                    workers.wake(&update.pod_uid);
                }
            }));
        }
        if let Some(tls) = &self.config.kubelet_tls {
            self.tasks.push(server::start(kubelet.clone(), self.cri.clone(), tls, self.config.kubelet.port).await?);
        }
        self.tasks.extend(housekeeping::spawn(
            kubelet.clone(),
            workers.clone(),
            self.cri.clone(),
            pressure,
            runtime.paths.root.clone(),
            runtime.pause_image.clone(),
        ));
        Ok(workers)
    }

    /// The pods the workers run: static pods first (so the API's first
    /// list does not take their containers for leftovers of deleted pods),
    /// with their mirror pods, then the pods bound to this node.
    pub fn start_pod_sources(
        &mut self,
        kubelet: Arc<kubelet::Kubelet>,
        workers: Arc<pod_workers::PodWorkers>,
        mirrors: Arc<static_pods::Mirrors>,
        node_uid: String,
    ) {
        let (client, config) = (&self.client, &self.config);
        let manifests = config.dir.join("pod-manifests");
        let recheck = Arc::new(Notify::new());
        for pod in static_pods::read_all(&manifests, &config.node_name) {
            workers.update(Arc::new(pod));
        }
        self.tasks.push(tokio::spawn(static_pods::run(
            client.clone(),
            manifests,
            config.node_name.clone(),
            node_uid,
            workers.clone(),
            mirrors.clone(),
            recheck.clone(),
        )));
        self.tasks.push(tokio::spawn(pod_config::run(
            client.clone(),
            config.node_name.clone(),
            kubelet,
            workers,
            pod_config::MirrorHooks { mirrors, recheck },
        )));
    }
}
