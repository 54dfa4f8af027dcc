//! This node's part of the pod network: once the node IPAM controller has
//! given the Node a podCIDR, the pods' bridge is made with its gateway
//! address, the CNI config for it is written (which makes containerd report
//! NetworkReady) and the node's part of ferrok's nftables table (the pods'
//! outbound masquerade) is rendered.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use tokio::sync::Notify;

use super::cri::{self, Cri};
use crate::client::informer::WatchEvents;
use crate::net::Ipv4Net;
use crate::network::bridge;
use crate::network::cni;
use crate::network::nftables::{self, NodeRules};

pub struct PodNetwork {
    pub conf_dir: PathBuf,
    pub ipam_dir: PathBuf,
    pub cluster_cidr: Ipv4Net,
    pub service_cidr: Ipv4Net,
    /// The node's part of ferrok's nftables table.
    pub nft: nftables::Part,
    /// The pods' MTU (the VXLAN device's with that backend).
    pub mtu: Option<u32>,
}

/// Follows the Node (`own_node`, its changes) until it has a podCIDR and
/// sets the network up for it (again when it changes); `ready` is notified once the runtime says
/// its network is ready. `pod_cidr` tells the node's other network parts.
pub async fn run(
    own_node: WatchEvents<Node>,
    cri: Cri,
    net: PodNetwork,
    ready: Arc<Notify>,
    pod_cidr: tokio::sync::watch::Sender<Option<Ipv4Net>>,
) {
    let mut current: Option<Ipv4Net> = None;
    let mut stream = own_node;
    let mut resync = net.nft.resync_requests();
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            changed = resync.changed() => {
                if changed.is_err() {
                    return;
                }
                if let Some(cidr) = current {
                    render(&net, cidr).await;
                }
                continue;
            }
        };
        let node = match event {
            None => return,
            Some(Ok(watcher::Event::Apply(n))) | Some(Ok(watcher::Event::InitApply(n))) => n,
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "node watch error");
                continue;
            }
        };
        let Some(cidr) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()) else { continue };
        let cidr = match crate::net::parse_pod_cidr(cidr) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the node's podCIDR is not usable");
                continue;
            }
        };
        if current == Some(cidr) {
            continue;
        }
        if let Some(old) = current {
            tracing::warn!(%old, new = %cidr, "the node's podCIDR changed; pods on the old one lose their network");
        }
        if let Err(e) = bridge::ensure(cidr, net.service_cidr).await {
            tracing::error!(error = %e, "cannot set up the pods' bridge");
            continue;
        }
        if let Err(e) = cni::ensure(&net.conf_dir, cidr, &net.ipam_dir, net.mtu) {
            tracing::error!(error = %e, "cannot write the CNI config");
            continue;
        }
        pod_cidr.send_replace(Some(cidr));
        render(&net, cidr).await;
        tracing::info!(pod_cidr = %cidr, "pod network configured");
        current = Some(cidr);
        wait_network_ready(&cri).await;
        ready.notify_one();
    }
}

/// The node's part of the nftables table.
async fn render(net: &PodNetwork, pod_cidr: Ipv4Net) {
    let rules = NodeRules { cluster_cidr: net.cluster_cidr, pod_cidr };
    if let Err(e) = net.nft.full(nftables::render_node(&rules)).await {
        tracing::error!(error = %e, "cannot load ferrok's nftables table");
    }
}

/// containerd picks the CNI config up from its folder within moments.
async fn wait_network_ready(cri: &Cri) {
    for _ in 0..200 {
        if let Ok(status) = cri.status().await {
            if cri::condition(&status, "NetworkReady").is_some_and(|c| c.status) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
