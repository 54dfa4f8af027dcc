//! The node role: what upstream's kubelet does, in ferrok's process. It
//! registers the Node and renews its Lease, supervises containerd, imports
//! images, and runs one worker per pod bound here, driving it through CRI
//! and reporting its status through the API. `ferrok server` runs it for
//! its own host; `ferrok agent` runs it alone against a remote server.
//!
//! The pieces carry the kubelet's names: `pod_workers`, `status_manager`,
//! `pleg`, `prober`, `volume_manager`, `image_manager`, `eviction`, `cri`,
//! `logs`. The `kubelet` syncs one pod (the steps its pod worker calls);
//! eviction and garbage collection are handed what they need through
//! narrow traits (wired in `housekeeping`), and import neither back.

pub mod config;
pub mod container_gc;
pub mod containerd;
pub mod credentials;
pub mod cri;
pub mod dns;
pub mod env;
pub mod events;
pub mod eviction;
pub mod housekeeping;
pub mod image_gc;
pub mod image_manager;
pub mod images;
pub mod kubelet;
pub mod kuberuntime;
pub mod lifecycle;
pub mod local_path;
pub mod logs;
pub mod node_join;
pub mod node_lease;
pub mod node_status;
pub mod pleg;
pub mod pod_config;
pub mod pod_network;
pub mod pod_status;
pub mod pod_util;
pub mod pod_workers;
pub mod predicate_admission;
pub mod prober;
pub mod server;
pub mod static_pods;
pub mod stats;
pub mod status_manager;
#[cfg(test)]
pub mod testing;
pub mod volume_manager;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, PostParams};
use tokio::sync::{watch, Notify};

pub use config::{AgentConfig, KubeletConfig, KubeletTls};
use containerd::{Containerd, ContainerdConfig, ContainerdPaths};
use cri::Cri;

use crate::client::informer_factory::SharedInformerFactory;

/// The node's registry credentials (registries.yaml) for the image manager.
impl image_manager::NodeCredentials for images::registries::Registries {
    fn auth_for(&self, image: &str) -> Option<cri::api::AuthConfig> {
        images::registries::Registries::auth_for(self, image)
    }
}

/// The images folder's pull lists go through the image manager.
struct NodePuller(Arc<kubelet::Kubelet>);

#[async_trait::async_trait]
impl images::Puller for NodePuller {
    async fn pull(&self, reference: &str) -> Result<(), String> {
        self.0.runtime.images.pull_for_node(reference).await
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Containerd(#[from] containerd::ContainerdError),
    #[error("container runtime: {0}")]
    Cri(#[from] cri::CriError),
    #[error("cannot register the node: {0}")]
    Register(#[from] node_status::NodeStatusError),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Registries(#[from] images::registries::RegistriesError),
    #[error("images: {0}")]
    Images(#[from] images::ImageError),
    #[error(transparent)]
    KubeletApi(#[from] server::ServerError),
}

/// A running node role; `stop` ends it and stops containerd (pods keep running).
pub struct Agent {
    containerd: Option<Containerd>,
    images_dir: Option<images::ImagesDirTask>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Agent {
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(d) = self.images_dir {
            d.stop().await;
        }
        if let Some(c) = self.containerd {
            c.stop().await;
        }
    }
}

/// RuntimeClasses for the node's handlers, as k3s ships them.
async fn ensure_runtime_classes(client: &kube::Client, handlers: &[String]) {
    let api: Api<RuntimeClass> = Api::all(client.clone());
    for h in handlers {
        let rc = RuntimeClass {
            metadata: kube::api::ObjectMeta { name: Some(h.clone()), ..Default::default() },
            handler: h.clone(),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &rc).await {
            Ok(_) => tracing::info!(handler = %h, "RuntimeClass created"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => tracing::warn!(handler = %h, error = %e, "cannot create RuntimeClass"),
        }
    }
}

/// Starts the node role: containerd, the Node and its Lease, the pod
/// network, and the pod workers fed from the API. Returns once the node is
/// registered; the rest runs in the background until `stop`.
///
/// `labeler`, when given, sets the Node labels a kubelet may not set on
/// itself (see `node_status::register`). The node's network and the
/// watches it can share come from `informers`, the process's one factory.
pub async fn start(
    config: AgentConfig,
    client: kube::Client,
    labeler: Option<kube::Client>,
    informers: SharedInformerFactory,
) -> Result<Agent, AgentError> {
    let config = Arc::new(config);
    let external = config.runtime_endpoint.is_some();
    // The folders a user drops files into exist from the start.
    for dir in [config.dir.join("pod-manifests"), config.dir.join("images")] {
        std::fs::create_dir_all(&dir).map_err(|e| AgentError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    let (handlers, cni_bin_dir) = containerd::check_host(external)?;
    let paths = ContainerdPaths::new(&config.dir);
    let pause_image = config.pause_image.clone().unwrap_or_else(|| images::PAUSE_IMAGE.to_string());
    // registries.yaml (k3s' format) becomes containerd's hosts.toml files.
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

    let (pressure_tx, pressure_rx) = watch::channel(node_status::NodePressure::default());
    let (node_allocatable_tx, node_allocatable) = watch::channel(node_status::resources(&config).1);
    let inputs = node_status::StatusInputs {
        config: config.clone(),
        cri: cri.clone(),
        handlers: handler_names.clone(),
        pressure: pressure_rx,
        allocatable: node_allocatable_tx,
    };
    let first_status = node_status::current_status(&inputs).await;
    let node = loop {
        match node_status::register(&client, labeler.as_ref(), &config, first_status.clone()).await {
            Ok(n) => break n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register the node yet; retrying");
                tokio::time::sleep(node_status::REGISTER_RETRY).await;
            }
        }
    };
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    let node_uid_for_mirrors = node_uid.clone();
    let mut tasks = Vec::new();
    let status_trigger = Arc::new(Notify::new());
    tasks.push(tokio::spawn(node_lease::run(
        client.clone(),
        config.node_name.clone(),
        node_uid,
        config.kubelet.node_lease_duration_seconds,
    )));
    let own_node = node_status::own_node_changes(&informers, &config);
    tasks.push(tokio::spawn(node_status::run(client.clone(), inputs, node, status_trigger.clone(), own_node)));
    // Every part of ferrok's nftables table is registered here, before the
    // first load, so that it is loaded whole in one transaction.
    let nft = crate::network::nftables::TableWriter::start();
    let (pod_cidr_tx, pod_cidr) = watch::channel(None);
    let underlay =
        crate::network::overlay::underlay(config.flannel_backend, config.flannel_iface.as_deref(), &config.node_ips)
            .await;
    tasks.push(tokio::spawn(pod_network::run(
        node_status::own_node_changes(&informers, &config),
        cri.clone(),
        pod_network::PodNetwork {
            conf_dir: paths.cni_conf_dir.clone(),
            ipam_dir: config.dir.join("cni").join("ipam"),
            cluster_cidr: config.cluster_cidr,
            service_cidr: config.service_cidr,
            nft: nft.part("node"),
            mtu: crate::network::overlay::pod_mtu(config.flannel_backend, underlay.as_ref()),
        },
        status_trigger.clone(),
        pod_cidr_tx,
    )));
    // Routes to the other nodes' pods, once this node has its podCIDR.
    tasks.push(tokio::spawn(crate::network::overlay::run(
        client.clone(),
        informers.clone(),
        crate::network::overlay::OverlayConfig {
            node_name: config.node_name.clone(),
            backend: config.flannel_backend,
            cluster_cidr: config.cluster_cidr,
            underlay,
        },
        pod_cidr.clone(),
    )));
    tasks.push(tokio::spawn(crate::network::network_policy::run(
        informers.clone(),
        crate::network::network_policy::NetworkPolicyConfig {
            node_name: config.node_name.clone(),
            cluster_dns: config
                .cluster_dns
                .iter()
                .filter_map(|ip| match ip {
                    std::net::IpAddr::V4(v4) => Some(*v4),
                    std::net::IpAddr::V6(_) => None,
                })
                .collect(),
        },
        nft.part("network-policy"),
    )));
    {
        use crate::network::service_proxy;
        let dataplane = service_proxy::nftables::NftablesDataplane::new(nft.part("services"), config.cluster_cidr);
        tasks.push(tokio::spawn(service_proxy::run(informers.clone(), config.node_name.clone(), dataplane)));
    }
    {
        let client = client.clone();
        tasks.push(tokio::spawn(async move { ensure_runtime_classes(&client, &handler_names).await }));
    }
    let services = informers.informer::<Service>().store();
    let events = events::Events::new(client.clone(), &config.node_name);
    let (_, allocatable) = node_status::resources(&config);
    let memory_capacity = crate::host::meminfo("MemTotal").unwrap_or(0) as i64;
    let host = crate::host::resolv_conf::ResolvConf::host(config.resolv_conf.as_deref());
    // Cluster DNS: this node's own, on its pod-network gateway, port 53.
    if config.dns_server {
        tasks.extend(crate::network::dns::spawn(
            &informers,
            crate::network::dns::ClusterDnsConfig::for_node(
                &config.node_name,
                &config.cluster_domain,
                &host,
                &config.cluster_dns,
            ),
            pod_cidr,
        ));
    }
    let index = Arc::new(pleg::ContainerIndex::default());
    let mirrors = Arc::new(static_pods::Mirrors::default());
    let (probe_manager, mut probe_updates) =
        prober::ProbeManager::new(cri.clone(), Arc::new(events.recorder().clone()));
    let probes = Arc::new(kubelet::prober_results::KubeletProber { manager: probe_manager });
    let image_manager = image_manager::ImageManager::new(Arc::new(cri.clone()), client.clone(), events.clone());
    image_manager.set_node_credentials(registries.clone());
    let runtime = Arc::new(kuberuntime::manager::RuntimeManager {
        cri: Arc::new(cri.clone()),
        client: client.clone(),
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
    });
    let volumes = volume_manager::VolumeManager::new(client.clone(), config.dir.join("pods"), config.node_name.clone());
    let quantity =
        |name: &str, milli: bool| {
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
    let kubelet = Arc::new(kubelet::Kubelet {
        client: client.clone(),
        config: config.clone(),
        runtime,
        status: status_manager::StatusManager::start(client.clone()),
        events,
        runtime_name: version.runtime_name.clone(),
        host_ips: config.node_ips.iter().map(|ip| ip.to_string()).collect(),
        allocatable,
        node_allocatable,
        services,
        volumes,
        probes,
        mirrors: mirrors.clone(),
    });
    // Tarballs in the images folder are imported before any pod starts,
    // then whenever one lands there.
    let (images_dir, imported) =
        images::ImagesDir::for_agent(&config.dir, cri.clone(), Some(Arc::new(NodePuller(kubelet.clone()))))
            .start()
            .await?;
    for (file, outcome) in imported {
        match outcome {
            Ok(o) => tracing::debug!(file = %file.display(), outcome = ?o, "images folder"),
            Err(e) => tracing::warn!(file = %file.display(), error = %e, "cannot import image file"),
        }
    }
    // The node's image list (for the scheduler's ImageLocality) now has them.
    status_trigger.notify_one();
    let workers = pod_workers::PodWorkers::new(kubelet.clone());
    {
        let workers = workers.clone();
        tasks.push(tokio::spawn(pleg::run(cri.clone(), index, move |event| match event {
            pleg::PodLifecycleEvent::ContainerDied { pod_uid, container_id } => {
                workers.container_died(&pod_uid, &container_id)
            }
            pleg::PodLifecycleEvent::Relist => workers.wake_all(),
        })));
    }
    {
        let workers = workers.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(update) = probe_updates.recv().await {
                workers.wake(&update.pod_uid);
            }
        }));
    }
    if let Some(tls) = &config.kubelet_tls {
        tasks.push(server::start(kubelet.clone(), cri.clone(), tls, config.kubelet.port).await?);
    }
    tasks.extend(housekeeping::spawn(
        kubelet.clone(),
        workers.clone(),
        cri.clone(),
        pressure_tx,
        paths.root.clone(),
        pause_image,
    ));
    // Static pods first, so the API's first list does not take their
    // containers for leftovers of deleted pods.
    let manifests = config.dir.join("pod-manifests");
    let recheck = Arc::new(Notify::new());
    for pod in static_pods::read_all(&manifests, &config.node_name) {
        workers.update(Arc::new(pod));
    }
    tasks.push(tokio::spawn(static_pods::run(
        client.clone(),
        manifests,
        config.node_name.clone(),
        node_uid_for_mirrors,
        workers.clone(),
        mirrors.clone(),
        recheck.clone(),
    )));
    tasks.push(tokio::spawn(pod_config::run(
        client.clone(),
        config.node_name.clone(),
        kubelet,
        workers,
        pod_config::MirrorHooks { mirrors, recheck },
    )));
    Ok(Agent { containerd, images_dir: Some(images_dir), tasks })
}
