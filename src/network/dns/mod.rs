//! Cluster DNS served by ferrok itself, on every node, in place of a
//! CoreDNS pod: names of the cluster domain from an index fed by the
//! process's shared Service and EndpointSlice informers, everything else forwarded to the host's
//! resolvers through a bounded cache. It listens on UDP and TCP port 53 of
//! the node's pod-network gateway (the first address of its podCIDR); the
//! `kube-dns` Service's EndpointSlice lists those addresses, one per node,
//! and the service proxy sends the cluster DNS address to the local one.
//!
//! - `records`: the index from API objects to records;
//! - `resolver`: what a query gets (index, cache or upstream);
//! - `forward`: asking the host's nameservers; `cache`: their answers;
//! - `server`: the UDP and TCP listeners.

pub mod cache;
pub mod forward;
pub mod records;
pub mod resolver;
pub mod server;
mod views;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::Resource;
use tokio::sync::watch;

use crate::client::informer::WatchEvents;
use crate::client::informer_factory::SharedInformerFactory;
use crate::net::{Ipv4Net, NthAddr};
use crate::sync::RwLockExt;
use records::RecordIndex;
use resolver::Resolver;

/// The DNS port.
pub const PORT: u16 = 53;

/// What a node's cluster DNS is started with.
#[derive(Debug, Clone)]
pub struct ClusterDnsConfig {
    pub node_name: String,
    /// `--cluster-domain`.
    pub cluster_domain: String,
    /// The host's nameservers, where other names are forwarded.
    pub upstreams: Vec<SocketAddr>,
    /// 53 unless a test or benchmark says otherwise.
    pub port: u16,
    /// How many forwarded answers are cached at most.
    pub cache_capacity: usize,
    /// Where to listen instead of the node's pod-network gateway.
    pub listen: Option<IpAddr>,
}

impl ClusterDnsConfig {
    /// A node's cluster DNS: its host's resolv.conf nameservers upstream
    /// (never the cluster DNS addresses themselves), port 53 on its gateway.
    pub fn for_node(
        node_name: &str,
        cluster_domain: &str,
        host: &crate::host::resolv_conf::ResolvConf,
        cluster_dns: &[IpAddr],
    ) -> ClusterDnsConfig {
        ClusterDnsConfig {
            node_name: node_name.to_string(),
            cluster_domain: cluster_domain.to_string(),
            upstreams: forward::upstreams(&host.nameservers, cluster_dns),
            port: PORT,
            cache_capacity: cache::DEFAULT_CAPACITY,
            listen: None,
        }
    }
}

/// Starts the cluster DNS: the subscriptions to `informers` feeding its
/// index and the listeners, once `pod_cidr` (from the node's pod network, which makes the
/// bridge with the gateway address first) says where. The tasks run until
/// aborted.
pub fn spawn(
    informers: &SharedInformerFactory,
    config: ClusterDnsConfig,
    pod_cidr: watch::Receiver<Option<Ipv4Net>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let index = Arc::new(RwLock::new(RecordIndex::new(&config.cluster_domain)));
    if config.upstreams.is_empty() {
        tracing::warn!("cluster DNS: the host names no nameserver; only cluster names will resolve");
    }
    let resolver = Arc::new(Resolver::new(
        index.clone(),
        cache::ResponseCache::new(config.cache_capacity),
        forward::Forwarder::new(config.upstreams.clone()),
    ));
    let (_, service_events) = informers.informer::<Service>().subscribe().into_watch_events();
    let (_, slice_events) = informers.informer::<EndpointSlice>().subscribe().into_watch_events();
    let services = tokio::spawn(watch_into(service_events, index.clone()));
    let slices = tokio::spawn(watch_into(slice_events, index));
    let listeners = tokio::spawn(async move {
        let ip = match config.listen {
            Some(ip) => ip,
            None => IpAddr::V4(node_gateway(pod_cidr).await),
        };
        server::run(SocketAddr::new(ip, config.port), resolver).await;
    });
    vec![services, slices, listeners]
}

/// The node's pod-network gateway: the first address of its podCIDR,
/// once the node has one.
async fn node_gateway(mut pod_cidr: watch::Receiver<Option<Ipv4Net>>) -> std::net::Ipv4Addr {
    loop {
        if let Some(cidr) = *pod_cidr.borrow_and_update() {
            return cidr.nth(1);
        }
        if pod_cidr.changed().await.is_err() {
            // The pod network has stopped: so has the node.
            std::future::pending::<()>().await;
        }
    }
}

fn key<K: Resource>(obj: &K) -> (String, String) {
    (obj.meta().namespace.clone().unwrap_or_default(), obj.meta().name.clone().unwrap_or_default())
}

/// What a watch of one kind does to the index.
trait Indexed: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static {
    fn apply(index: &mut RecordIndex, obj: &Self);
    fn delete(index: &mut RecordIndex, obj: &Self);
    fn retain(index: &mut RecordIndex, keep: &BTreeSet<(String, String)>);
}

impl Indexed for Service {
    fn apply(index: &mut RecordIndex, obj: &Self) {
        index.apply_service(obj)
    }
    fn delete(index: &mut RecordIndex, obj: &Self) {
        let (ns, name) = key(obj);
        index.delete_service(&ns, &name)
    }
    fn retain(index: &mut RecordIndex, keep: &BTreeSet<(String, String)>) {
        index.retain_services(keep)
    }
}

impl Indexed for EndpointSlice {
    fn apply(index: &mut RecordIndex, obj: &Self) {
        index.apply_slice(obj)
    }
    fn delete(index: &mut RecordIndex, obj: &Self) {
        let (ns, name) = key(obj);
        index.delete_slice(&ns, &name)
    }
    fn retain(index: &mut RecordIndex, keep: &BTreeSet<(String, String)>) {
        index.retain_slices(keep)
    }
}

async fn watch_into<K>(mut stream: WatchEvents<K>, index: Arc<RwLock<RecordIndex>>)
where
    K: Indexed<DynamicType = ()>,
{
    // The objects of a relist; what is not among them is gone.
    let mut listed = BTreeSet::new();
    while let Some(event) = stream.next().await {
        let mut index = index.write_locked();
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(obj)) => {
                listed.insert(key(&*obj));
                K::apply(&mut index, &obj);
            }
            Ok(watcher::Event::InitDone) => {
                K::retain(&mut index, &listed);
                listed.clear();
                tracing::debug!(names = index.len(), kind = %K::kind(&()), "cluster DNS index synced");
            }
            Ok(watcher::Event::Apply(obj)) => K::apply(&mut index, &obj),
            Ok(watcher::Event::Delete(obj)) => K::delete(&mut index, &obj),
            Err(e) => tracing::debug!(error = %e, "cluster DNS: watch error"),
        }
    }
}
