//! NodeIpamController (upstream's RangeAllocator): every Node gets a
//! podCIDR, a `/node_cidr_mask` slice of the cluster CIDR, written to
//! `spec.podCIDR` and `spec.podCIDRs`. The set of slices in use is rebuilt
//! from the Nodes in the cache on every reconcile (plus allocations whose
//! write the cache has not seen yet), so restarts and deletions need no
//! bookkeeping: a deleted Node's slice is free as soon as it leaves the cache.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;

use super::queue_metrics::{drain, QueueMetrics};
use super::{ControllerConfig, ControllerError};
use crate::client::events::{EventRecorder, EventType};
use crate::net::{IpNet, Ipv4Net, NthAddr};
use crate::sync::LockExt;

/// The cluster CIDR cut into equal slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidrSet {
    cluster: Ipv4Net,
    node_prefix: u8,
}

impl CidrSet {
    pub fn new(cluster: Ipv4Net, node_prefix: u8) -> Result<CidrSet, ControllerError> {
        let prefix = cluster.prefix_len();
        if node_prefix > 32 || node_prefix < prefix || node_prefix - prefix > 24 {
            return Err(ControllerError::Invalid(format!("cannot cut {cluster} into /{node_prefix} node CIDRs")));
        }
        Ok(CidrSet { cluster: cluster.trunc(), node_prefix })
    }

    /// How many node CIDRs there are.
    pub fn len(&self) -> u32 {
        1 << (self.node_prefix - self.cluster.prefix_len())
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The `index`th slice as `a.b.c.d/n`.
    pub fn cidr(&self, index: u32) -> String {
        format!("{}/{}", self.cluster.nth(index * self.step()), self.node_prefix)
    }

    /// The number of addresses in a slice.
    fn step(&self) -> u32 {
        if self.node_prefix == 32 {
            1
        } else {
            1u32 << (32 - self.node_prefix)
        }
    }

    /// Which slice `cidr` is, when it is one of ours (its host bits clear).
    pub fn index_of(&self, cidr: &str) -> Option<u32> {
        let Ok(IpNet::V4(net)) = crate::net::parse_as_written(cidr) else { return None };
        if net.prefix_len() != self.node_prefix {
            return None;
        }
        let offset = net.addr().to_bits().checked_sub(self.cluster.network().to_bits())?;
        let index = offset / self.step();
        (offset % self.step() == 0 && index < self.len()).then_some(index)
    }

    /// The first slice not in `used`.
    pub fn first_free(&self, used: &BTreeSet<u32>) -> Option<u32> {
        (0..self.len()).find(|i| !used.contains(i))
    }
}

struct Context {
    client: kube::Client,
    cidrs: CidrSet,
    nodes: Store<Node>,
    /// Allocations written but perhaps not yet in the cache: node → index.
    pending: Mutex<BTreeMap<String, u32>>,
    recorder: EventRecorder,
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    let mut out: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if let Some(c) = spec.and_then(|s| s.pod_cidr.clone()) {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// What a reconcile does for a node without a podCIDR (as far as the
/// object it was handed knows).
#[derive(Debug, PartialEq, Eq)]
enum Allocation {
    /// The cache has caught up with an earlier allocation: nothing to do.
    Done,
    /// Write this slice (a new one, or the one already chosen for the node).
    Write(u32),
    /// No slice is free.
    Exhausted,
}

/// Chooses the node's slice from the cache and the allocations written but
/// not yet seen in it.
fn allocate(name: &str, cached: &[Arc<Node>], cidrs: &CidrSet, pending: &mut BTreeMap<String, u32>) -> Allocation {
    let named = |c: &Node| c.metadata.name.as_deref() == Some(name);
    // The reconciled object can be older than the cache read here: once
    // the cache shows the node's podCIDR, its slice counts as used, and a
    // second allocation would move the node to another (which the API
    // server refuses, as upstream).
    if cached.iter().any(|c| named(c) && !pod_cidrs(c).is_empty()) {
        pending.remove(name);
        return Allocation::Done;
    }
    // Forget pending allocations the cache has caught up with, or whose node is gone.
    pending.retain(|n, _| cached.iter().any(|c| c.metadata.name.as_deref() == Some(n) && pod_cidrs(c).is_empty()));
    if let Some(i) = pending.get(name) {
        return Allocation::Write(*i);
    }
    let mut used: BTreeSet<u32> = cached.iter().flat_map(|n| pod_cidrs(n)).filter_map(|c| cidrs.index_of(&c)).collect();
    used.extend(pending.values().copied());
    match cidrs.first_free(&used) {
        Some(i) => {
            pending.insert(name.to_string(), i);
            Allocation::Write(i)
        }
        None => Allocation::Exhausted,
    }
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if node.metadata.deletion_timestamp.is_some() || !pod_cidrs(&node).is_empty() {
        return Ok(Action::await_change());
    }
    let index = {
        let mut pending = ctx.pending.locked();
        match allocate(&name, &ctx.nodes.state(), &ctx.cidrs, &mut pending) {
            Allocation::Done => return Ok(Action::await_change()),
            Allocation::Write(i) => Some(i),
            Allocation::Exhausted => None,
        }
    };
    let Some(index) = index else {
        ctx.recorder.publish(
            &*node,
            EventType::Normal,
            "CIDRNotAvailable",
            &format!("Node {name} status is now: CIDRNotAvailable"),
        );
        tracing::warn!(node = %name, "no podCIDR is free in the cluster CIDR");
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let cidr = ctx.cidrs.cidr(index);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
    match nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::info!(node = %name, %cidr, "allocated podCIDR"),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.pending.locked().remove(&name);
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

fn error_policy(_node: Arc<Node>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "node IPAM reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    config: Arc<ControllerConfig>,
) {
    let cidrs = match CidrSet::new(config.cluster_cidr, config.node_cidr_mask) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "node IPAM disabled");
            return;
        }
    };
    let (nodes, node_events) = informers
        .informer::<Node>()
        .subscribe()
        .skip_updates(crate::client::predicates::node_heartbeat_only)
        .into_parts();
    let queue = QueueMetrics::new("cidrallocator_node", nodes.clone());
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "node-ipam-controller"),
        client,
        cidrs,
        nodes: nodes.clone(),
        pending: Mutex::new(BTreeMap::new()),
    });
    let results = Controller::for_stream(queue.primary(node_events), nodes).run(
        queue.timed(reconcile),
        queue.retried(error_policy),
        ctx,
    );
    drain("cidrallocator_node", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        crate::net::parse_v4(s, 0..=32).unwrap()
    }

    #[test]
    fn cuts_the_cluster_cidr_into_node_cidrs() {
        let set = CidrSet::new(net("10.42.0.0/16"), 24).unwrap();
        assert_eq!(set.len(), 256);
        assert_eq!(set.cidr(0), "10.42.0.0/24");
        assert_eq!(set.cidr(255), "10.42.255.0/24");
        assert_eq!(set.index_of("10.42.7.0/24"), Some(7));
        assert_eq!(set.index_of("10.42.7.1/24"), None);
        assert_eq!(set.index_of("10.43.0.0/24"), None);
        assert_eq!(set.index_of("10.42.7.0/25"), None);
        let used: BTreeSet<u32> = [0, 1, 3].into_iter().collect();
        assert_eq!(set.first_free(&used), Some(2));
        let tiny = CidrSet::new(net("10.0.0.0/30"), 31).unwrap();
        assert_eq!(tiny.first_free(&[0, 1].into_iter().collect()), None);
        assert!(CidrSet::new(net("10.0.0.0/24"), 16).is_err());
    }

    fn node(name: &str, cidr: Option<&str>) -> Arc<Node> {
        let spec = cidr.map(|c| serde_json::json!({"podCIDR": c, "podCIDRs": [c]})).unwrap_or_default();
        Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap())
    }

    #[test]
    fn a_node_keeps_its_slice_while_the_cache_catches_up() {
        let set = CidrSet::new(net("10.42.0.0/16"), 24).unwrap();
        let mut pending = BTreeMap::new();
        let server = node("server", Some("10.42.0.0/24"));
        // Two agents register at once: each gets its own slice, and asking
        // again before the cache has the write gives the same one.
        let cache = vec![server.clone(), node("a", None), node("b", None)];
        assert_eq!(allocate("a", &cache, &set, &mut pending), Allocation::Write(1));
        assert_eq!(allocate("b", &cache, &set, &mut pending), Allocation::Write(2));
        assert_eq!(allocate("a", &cache, &set, &mut pending), Allocation::Write(1));
        // The cache has a's write, but this reconcile was handed the object
        // from before it (the CI failure): a is done, not moved to slice 3.
        let cache = vec![server.clone(), node("a", Some("10.42.1.0/24")), node("b", None)];
        assert_eq!(allocate("a", &cache, &set, &mut pending), Allocation::Done);
        assert_eq!(allocate("b", &cache, &set, &mut pending), Allocation::Write(2));
        // A deleted node's slice is free again.
        let cache = vec![server, node("b", Some("10.42.2.0/24")), node("c", None)];
        assert_eq!(allocate("c", &cache, &set, &mut pending), Allocation::Write(1));
        let tiny = CidrSet::new(net("10.0.0.0/31"), 31).unwrap();
        assert_eq!(
            allocate("z", &[node("y", Some("10.0.0.0/31"))], &tiny, &mut BTreeMap::new()),
            Allocation::Exhausted
        );
    }
}
