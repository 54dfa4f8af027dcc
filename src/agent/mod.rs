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
mod startup;
pub mod static_pods;
pub mod stats;
pub mod status_manager;
#[cfg(test)]
pub mod testing;
pub mod volume_manager;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, PostParams};
use tokio::sync::Notify;

pub use config::{AgentConfig, KubeletConfig, KubeletTls};
use containerd::Containerd;
use startup::{create_drop_folders, start_container_runtime, NodeStartup};

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
    async fn pull(&self, reference: &str) -> Result<(), images::PullError> {
        Ok(self.0.runtime.images.pull_for_node(reference).await?)
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
    create_drop_folders(&config)?;
    let runtime = start_container_runtime(&config).await?;
    let mut node = NodeStartup { config, client, informers, cri: runtime.cri.clone(), tasks: Vec::new() };
    let registered = node.register(labeler.as_ref(), &runtime.handler_names).await;
    let node_uid = registered.node.metadata.uid.clone().unwrap_or_default();
    let status_trigger = Arc::new(Notify::new());
    node.start_lease_and_status(registered.node, registered.inputs, node_uid.clone(), &status_trigger);
    // Every part of ferrok's nftables table is registered here, before the
    // first load, so that it is loaded whole in one transaction.
    let nft = crate::network::nftables::TableWriter::start();
    let pod_cidr = node.start_pod_network(&nft, &runtime.paths, &status_trigger).await;
    node.start_network_policy(&nft);
    node.start_service_proxy(&nft);
    node.ensure_runtime_classes(runtime.handler_names.clone());
    let services = node.informers.informer::<Service>().store();
    let events = events::Events::new(node.client.clone(), &node.config.node_name);
    let host = crate::host::resolv_conf::ResolvConf::host(node.config.resolv_conf.as_deref());
    node.start_cluster_dns(&host, pod_cidr);
    let (kubelet, wiring) = node.new_kubelet(events, host, &runtime, registered.node_allocatable, services);
    let images_dir = node.import_images(&kubelet, &status_trigger).await?;
    let workers =
        node.start_pod_workers(&kubelet, &runtime, wiring.index, wiring.probe_updates, registered.pressure).await?;
    node.start_pod_sources(kubelet, workers, wiring.mirrors, node_uid);
    Ok(Agent { containerd: runtime.containerd, images_dir: Some(images_dir), tasks: node.tasks })
}
