//! The pod network across hosts, as k3s' embedded flannel makes it: each
//! node's pods live in its podCIDR, and every other node learns how to
//! reach them from the Nodes themselves (their podCIDR, InternalIP and,
//! for VXLAN, the annotations each node publishes about its end). The
//! Nodes come from the process's shared informer, never polled; a Node added, changed or deleted adds,
//! replaces or removes exactly its own entries, and at each (re)list the
//! entries no Node explains any more are removed.
//!
//! Backends (`--flannel-backend`): `vxlan` (default; `vxlan.rs`), `host-gw`
//! (`host_gw.rs`) and `none` (the user brings their own). The kernel is
//! driven with iproute2 (`ip.rs`), only when something changes.

pub mod annotations;
pub mod host_gw;
pub mod ip;
pub mod plan;
pub mod vxlan;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::client::informer_factory::SharedInformerFactory;
use crate::net::Ipv4Net;
pub use ip::Underlay;
use plan::{Local, PeerEntries, Skip, Stale};

/// `--flannel-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlannelBackend {
    #[default]
    Vxlan,
    HostGw,
    None,
}

impl FlannelBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            FlannelBackend::Vxlan => "vxlan",
            FlannelBackend::HostGw => "host-gw",
            FlannelBackend::None => "none",
        }
    }
}

impl std::fmt::Display for FlannelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--flannel-backend` ferrok does not have.
#[derive(Debug, thiserror::Error)]
#[error("unknown flannel backend {0:?} (vxlan, host-gw or none)")]
pub struct UnknownBackend(String);

impl std::str::FromStr for FlannelBackend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        match s {
            "vxlan" => Ok(FlannelBackend::Vxlan),
            "host-gw" => Ok(FlannelBackend::HostGw),
            "none" => Ok(FlannelBackend::None),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("`{0}` is not installed (Debian package: iproute2)")]
    Missing(String),
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    #[error("the overlay's interface: {0}")]
    NoUnderlay(String),
    #[error(
        "route {pod_cidr} via {via}: {via} is not on a directly connected subnet; host-gw needs every node on one \
         layer-2 network (use --flannel-backend=vxlan otherwise)"
    )]
    NotDirectlyConnected { pod_cidr: String, via: String },
}

/// What the overlay of one node runs with.
#[derive(Debug, Clone)]
pub struct OverlayConfig {
    pub node_name: String,
    pub backend: FlannelBackend,
    pub cluster_cidr: Ipv4Net,
    /// The interface and address that carry the overlay (see `underlay`).
    pub underlay: Option<Underlay>,
}

/// Finds the overlay's interface: `--flannel-iface`, else the one holding
/// the node's first IPv4 InternalIP. None for `none`, or (logged) when
/// there is no such interface: the node then reaches no other node's pods.
pub async fn underlay(backend: FlannelBackend, iface: Option<&str>, node_ips: &[IpAddr]) -> Option<Underlay> {
    if backend == FlannelBackend::None {
        return None;
    }
    let node_ip = node_ips.iter().find_map(|ip| match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    });
    match ip::underlay(iface, node_ip).await {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::error!(error = %e, "no pod network to other nodes");
            None
        }
    }
}

/// The MTU pods' interfaces get: the VXLAN device's, so that encapsulated
/// packets fit the underlay; the default otherwise.
pub fn pod_mtu(backend: FlannelBackend, underlay: Option<&Underlay>) -> Option<u32> {
    match (backend, underlay) {
        (FlannelBackend::Vxlan, Some(u)) => Some(vxlan::mtu(u)),
        _ => None,
    }
}

/// Runs the overlay until the Node informer's stream ends: waits for this
/// node's podCIDR (`pod_cidr`, set by the pod network), sets up the
/// backend's device, publishes this node's annotations (through
/// `client`), and keeps every other Node's entries in step with the API.
/// The cluster-wide Node informer of `informers` is started only when a
/// backend runs.
pub async fn run(
    client: kube::Client,
    informers: SharedInformerFactory,
    config: OverlayConfig,
    mut pod_cidr: watch::Receiver<Option<Ipv4Net>>,
) {
    if config.backend == FlannelBackend::None {
        return;
    }
    let Some(underlay) = config.underlay.clone() else { return };
    let own = loop {
        if let Some(c) = *pod_cidr.borrow_and_update() {
            break c;
        }
        if pod_cidr.changed().await.is_err() {
            return;
        }
    };
    let mut overlay = Overlay {
        client,
        local: Local {
            node_name: config.node_name.clone(),
            backend: config.backend,
            cluster_cidr: config.cluster_cidr,
            pod_cidr: Some(own),
        },
        underlay,
        annotations: BTreeMap::new(),
        peers: BTreeMap::new(),
        skipped: BTreeMap::new(),
    };
    overlay.set_up(own).await;
    let (_, mut stream) = informers.informer::<Node>().subscribe().into_watch_events();
    let mut listing: Option<Vec<Arc<Node>>> = None;
    // A failed annotation patch is tried again after a while.
    let mut republish: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let retry = async {
            match republish.as_mut() {
                Some(s) => s.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = stream.next() => match event {
                None => return,
                Some(Ok(watcher::Event::Init)) => listing = Some(Vec::new()),
                Some(Ok(watcher::Event::InitApply(node))) => listing.get_or_insert_with(Vec::new).push(node),
                Some(Ok(watcher::Event::InitDone)) => {
                    let nodes = listing.take().unwrap_or_default();
                    if let Some(own) = nodes.iter().find(|n| overlay.is_own(n)) {
                        republish = overlay.publish_if_needed(own).await;
                    }
                    overlay.resync(&nodes).await;
                }
                Some(Ok(watcher::Event::Apply(node))) => {
                    if overlay.is_own(&node) {
                        republish = overlay.publish_if_needed(&node).await;
                    } else {
                        overlay.apply(&node).await;
                    }
                }
                Some(Ok(watcher::Event::Delete(node))) => overlay.delete(&node).await,
                Some(Err(e)) => tracing::debug!(error = %e, "node watch error (overlay)"),
            },
            _ = retry => {
                republish = None;
                if let Err(e) = annotations::publish(&overlay.client, &overlay.local.node_name, &overlay.annotations).await {
                    tracing::warn!(error = %e, "cannot publish the node's flannel annotations; retrying");
                    republish = Some(Box::pin(tokio::time::sleep(Duration::from_secs(5))));
                }
            }
            changed = pod_cidr.changed() => {
                if changed.is_err() {
                    return;
                }
                let new = *pod_cidr.borrow_and_update();
                if let Some(c) = new.filter(|c| Some(*c) != overlay.local.pod_cidr) {
                    overlay.local.pod_cidr = Some(c);
                    overlay.set_up(c).await;
                    republish = Some(Box::pin(tokio::time::sleep(Duration::ZERO)));
                }
            }
        }
    }
}

struct Overlay {
    client: kube::Client,
    local: Local,
    underlay: Underlay,
    /// What this node publishes about itself.
    annotations: BTreeMap<String, String>,
    /// The entries in place for each peer Node, by name.
    peers: BTreeMap<String, PeerEntries>,
    /// Why a Node got no entries (logged when it changes).
    skipped: BTreeMap<String, Skip>,
}

impl Overlay {
    fn is_own(&self, node: &Node) -> bool {
        node.metadata.name.as_deref() == Some(self.local.node_name.as_str())
    }

    /// The backend's device for this node's podCIDR, and the annotations
    /// that tell peers about it.
    async fn set_up(&mut self, own: Ipv4Net) {
        let mac = match self.local.backend {
            FlannelBackend::Vxlan => match vxlan::ensure_device(&self.underlay, own).await {
                Ok(mac) => Some(mac),
                Err(e) => {
                    tracing::error!(error = %e, "cannot set up the VXLAN device");
                    None
                }
            },
            FlannelBackend::HostGw => {
                // A node moved from VXLAN to host-gw: the device and all
                // that hangs on it go.
                if let Err(e) = vxlan::remove_device().await {
                    tracing::warn!(error = %e, "cannot remove the VXLAN device");
                }
                None
            }
            FlannelBackend::None => None,
        };
        self.annotations = annotations::desired(self.local.backend, mac.as_deref(), self.underlay.address);
        tracing::info!(
            backend = %self.local.backend, interface = %self.underlay.interface, address = %self.underlay.address,
            pod_cidr = %own, vtep_mac = mac.as_deref().unwrap_or("-"), "pod network to other nodes set up"
        );
    }

    /// Patches this node's annotations when the Node lacks them; a timer
    /// to try again when that fails.
    async fn publish_if_needed(&self, own: &Node) -> Option<Pin<Box<tokio::time::Sleep>>> {
        if self.annotations.is_empty() || !annotations::differs(own, &self.annotations) {
            return None;
        }
        match annotations::publish(&self.client, &self.local.node_name, &self.annotations).await {
            Ok(()) => {
                tracing::debug!("flannel annotations published");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish the node's flannel annotations; retrying");
                Some(Box::pin(tokio::time::sleep(Duration::from_secs(5))))
            }
        }
    }

    /// What `node` needs, with the reason logged when it gets nothing.
    fn plan(&mut self, node: &Node) -> Option<PeerEntries> {
        let name = node.metadata.name.clone().unwrap_or_default();
        match plan::peer(&self.local, node) {
            Ok(p) => {
                self.skipped.remove(&name);
                p
            }
            Err(skip) => {
                if self.skipped.get(&name) != Some(&skip) {
                    tracing::info!(node = %name, reason = %skip, "no pod route to this node");
                    self.skipped.insert(name, skip);
                }
                None
            }
        }
    }

    /// After a (re)list: every peer's entries in place, and whatever this
    /// node owns that no Node explains removed.
    async fn resync(&mut self, nodes: &[Arc<Node>]) {
        let mut peers = BTreeMap::new();
        for n in nodes {
            if let Some(p) = self.plan(n) {
                peers.insert(n.metadata.name.clone().unwrap_or_default(), p);
            }
        }
        let device = (self.local.backend == FlannelBackend::Vxlan).then_some(vxlan::DEVICE);
        match ip::kernel_state(device).await {
            Ok(kernel) => {
                let stale = plan::stale(&self.local, &peers, &kernel);
                if !stale.is_empty() {
                    tracing::info!(?stale, "removing pod network entries no Node explains");
                }
                remove(&stale).await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the kernel's routes"),
        }
        for (name, p) in &peers {
            self.install(name, p).await;
        }
        self.skipped.retain(|name, _| nodes.iter().any(|n| n.metadata.name.as_deref() == Some(name.as_str())));
        self.peers = peers;
    }

    /// A peer added or changed: its entries replaced, only when they differ.
    async fn apply(&mut self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let new = self.plan(node);
        let old = self.peers.get(&name);
        if new.as_ref() == old {
            return;
        }
        if let Some(old) = old {
            remove(&plan::superseded(old, new.as_ref())).await;
        }
        match new {
            Some(p) => {
                self.install(&name, &p).await;
                self.peers.insert(name, p);
            }
            None => {
                self.peers.remove(&name);
            }
        }
    }

    async fn delete(&mut self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.skipped.remove(&name);
        if let Some(old) = self.peers.remove(&name) {
            tracing::info!(node = %name, pod_cidr = %old.route.dst, "node gone; removing its pod route");
            remove(&plan::superseded(&old, None)).await;
        }
    }

    /// Failures are logged; the entries count as in place so that the
    /// same error is not repeated on every status update of the Node (the
    /// next change of the Node, or the next relist, tries again).
    async fn install(&self, name: &str, peer: &PeerEntries) {
        let result = match self.local.backend {
            FlannelBackend::Vxlan => vxlan::install(peer).await,
            FlannelBackend::HostGw => host_gw::install(peer).await,
            FlannelBackend::None => Ok(()),
        };
        match result {
            Ok(()) => tracing::debug!(node = %name, route = ?peer.route, "pod route in place"),
            Err(e) => tracing::error!(node = %name, error = %e, "cannot route to this node's pods"),
        }
    }
}

/// Removes routes, neighbours and forwarding entries (already gone is fine).
async fn remove(stale: &Stale) {
    for dst in &stale.routes {
        if let Err(e) = ip::ip_delete(&["route", "del", &dst.to_string()]).await {
            tracing::warn!(error = %e, "cannot remove a pod route");
        }
    }
    for n in &stale.neighbours {
        if let Err(e) = ip::ip_delete(&["neigh", "del", &n.to_string(), "dev", vxlan::DEVICE]).await {
            tracing::warn!(error = %e, "cannot remove a VXLAN neighbour");
        }
    }
    for mac in &stale.fdb {
        if let Err(e) = ip::bridge_delete(&["fdb", "del", mac, "dev", vxlan::DEVICE, "self"]).await {
            tracing::warn!(error = %e, "cannot remove a VXLAN forwarding entry");
        }
    }
}
