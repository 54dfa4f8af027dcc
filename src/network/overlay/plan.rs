//! What the other Nodes mean for this node's kernel: for each peer with a
//! podCIDR, the route to it and, with VXLAN, the neighbour and forwarding
//! entries that carry it; and, against what the kernel holds, which of the
//! entries this node owns no Node explains any more. Pure: no I/O here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Node;

use super::annotations;
use super::FlannelBackend;
use crate::net::Ipv4Net;
use crate::network::cni::BRIDGE;

/// A route to a peer's podCIDR: through its address on a directly
/// connected subnet (host-gw), or onlink through the VXLAN device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub dst: Ipv4Net,
    pub via: Ipv4Addr,
    /// `dev <vxlan device> onlink` (VXLAN); host-gw routes let the kernel
    /// pick the connected interface.
    pub onlink: bool,
}

/// A permanent neighbour entry on the VXLAN device: the peer's VTEP
/// address (its podCIDR's network address) and its VTEP MAC.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Neighbour {
    pub ip: Ipv4Addr,
    pub mac: String,
}

/// A forwarding entry on the VXLAN device: frames for `mac` go to `dst`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fdb {
    pub mac: String,
    pub dst: Ipv4Addr,
}

/// Everything one peer Node needs on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntries {
    pub route: Route,
    pub neighbour: Option<Neighbour>,
    pub fdb: Option<Fdb>,
}

/// Why a Node gets no entries (logged once per change).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("no podCIDR yet")]
    NoPodCidr,
    #[error("podCIDR {0:?} is not an IPv4 network")]
    BadPodCidr(String),
    #[error("podCIDR {0} is outside the cluster CIDR {1}")]
    OutsideCluster(Ipv4Net, Ipv4Net),
    #[error("podCIDR {0} is this node's own")]
    SameAsOwn(Ipv4Net),
    #[error("no IPv4 InternalIP")]
    NoInternalIp,
    #[error("no flannel VXLAN annotations yet (backend-type, backend-data, public-ip)")]
    NoVtep,
}

/// What this node is, for planning.
#[derive(Debug, Clone)]
pub struct Local {
    pub node_name: String,
    pub backend: FlannelBackend,
    pub cluster_cidr: Ipv4Net,
    pub pod_cidr: Option<Ipv4Net>,
}

/// The first IPv4 InternalIP of a Node.
pub fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
}

/// A Node's IPv4 podCIDR (`spec.podCIDR`, else the first IPv4 of `podCIDRs`).
pub fn pod_cidr(node: &Node) -> Result<Ipv4Net, Skip> {
    let spec = node.spec.as_ref().ok_or(Skip::NoPodCidr)?;
    let mut candidates: Vec<&str> = spec.pod_cidr.iter().map(String::as_str).collect();
    candidates.extend(spec.pod_cidrs.iter().flatten().map(String::as_str));
    let first = *candidates.first().ok_or(Skip::NoPodCidr)?;
    candidates
        .iter()
        .find_map(|c| crate::net::parse_pod_cidr(c).ok())
        .ok_or_else(|| Skip::BadPodCidr(first.to_string()))
}

/// What a peer Node needs on this node; `Ok(None)` for the node itself.
pub fn peer(local: &Local, node: &Node) -> Result<Option<PeerEntries>, Skip> {
    if node.metadata.name.as_deref() == Some(local.node_name.as_str()) {
        return Ok(None);
    }
    let cidr = pod_cidr(node)?;
    if !local.cluster_cidr.contains(&cidr) {
        return Err(Skip::OutsideCluster(cidr, local.cluster_cidr));
    }
    if local.pod_cidr == Some(cidr) {
        return Err(Skip::SameAsOwn(cidr));
    }
    match local.backend {
        FlannelBackend::None => Ok(None),
        FlannelBackend::HostGw => {
            let via = internal_ip(node).ok_or(Skip::NoInternalIp)?;
            Ok(Some(PeerEntries { route: Route { dst: cidr, via, onlink: false }, neighbour: None, fdb: None }))
        }
        FlannelBackend::Vxlan => {
            let vtep = annotations::vxlan_peer(node).ok_or(Skip::NoVtep)?;
            // The peer's VTEP address is its podCIDR's network address.
            let ip = cidr.network();
            Ok(Some(PeerEntries {
                route: Route { dst: cidr, via: ip, onlink: true },
                neighbour: Some(Neighbour { ip, mac: vtep.mac.clone() }),
                fdb: Some(Fdb { mac: vtep.mac, dst: vtep.public_ip }),
            }))
        }
    }
}

/// A route the kernel holds in the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: Ipv4Net,
    pub via: Option<Ipv4Addr>,
    pub dev: String,
}

/// What the kernel holds that this node may own.
#[derive(Debug, Clone, Default)]
pub struct KernelState {
    pub routes: Vec<KernelRoute>,
    /// Neighbours on the VXLAN device.
    pub neighbours: Vec<Neighbour>,
    /// Forwarding entries on the VXLAN device.
    pub fdb: Vec<Fdb>,
}

/// Entries to remove because no peer explains them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stale {
    pub routes: Vec<Ipv4Net>,
    pub neighbours: Vec<Ipv4Addr>,
    pub fdb: Vec<String>,
}

impl Stale {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.neighbours.is_empty() && self.fdb.is_empty()
    }
}

/// Which of the kernel's entries this node owns without a peer to explain
/// them: routes into the cluster CIDR (other than the node's own podCIDR
/// and the pods' bridge), neighbours and forwarding entries on the VXLAN
/// device. An entry whose key a peer still wants is left to be replaced.
pub fn stale(local: &Local, peers: &BTreeMap<String, PeerEntries>, kernel: &KernelState) -> Stale {
    let dsts: BTreeSet<Ipv4Net> = peers.values().map(|p| p.route.dst).collect();
    let ips: BTreeSet<Ipv4Addr> = peers.values().filter_map(|p| p.neighbour.as_ref().map(|n| n.ip)).collect();
    let macs: BTreeSet<&str> = peers.values().filter_map(|p| p.fdb.as_ref().map(|f| f.mac.as_str())).collect();
    let cluster = local.cluster_cidr;
    let mut out = Stale::default();
    for r in &kernel.routes {
        let inside = cluster.contains(&r.dst);
        if !inside || Some(r.dst) == local.pod_cidr || r.dev == BRIDGE || dsts.contains(&r.dst) {
            continue;
        }
        if !out.routes.contains(&r.dst) {
            out.routes.push(r.dst);
        }
    }
    out.neighbours = kernel.neighbours.iter().map(|n| n.ip).filter(|ip| !ips.contains(ip)).collect();
    out.fdb = kernel.fdb.iter().map(|f| f.mac.clone()).filter(|m| !macs.contains(m.as_str())).collect();
    out
}

/// What changed for one peer: the old entries to remove before the new
/// ones are put in place (an entry whose key stays is replaced instead).
pub fn superseded(old: &PeerEntries, new: Option<&PeerEntries>) -> Stale {
    let mut out = Stale::default();
    if new.is_none_or(|n| n.route.dst != old.route.dst) {
        out.routes.push(old.route.dst);
    }
    if let Some(o) = &old.neighbour {
        if new.and_then(|n| n.neighbour.as_ref()).is_none_or(|n| n.ip != o.ip) {
            out.neighbours.push(o.ip);
        }
    }
    if let Some(o) = &old.fdb {
        if new.and_then(|n| n.fdb.as_ref()).is_none_or(|n| n.mac != o.mac) {
            out.fdb.push(o.mac.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    fn net(s: &str) -> Ipv4Net {
        crate::net::parse_pod_cidr(s).unwrap()
    }

    fn node(name: &str, cidr: Option<&str>, ip: Option<&str>, vtep: Option<(&str, &str)>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.spec = Some(NodeSpec {
            pod_cidr: cidr.map(str::to_string),
            pod_cidrs: cidr.map(|c| vec![c.to_string()]),
            ..Default::default()
        });
        n.status = Some(NodeStatus {
            addresses: ip.map(|ip| {
                vec![
                    NodeAddress { type_: "Hostname".into(), address: name.into() },
                    NodeAddress { type_: "InternalIP".into(), address: ip.into() },
                ]
            }),
            ..Default::default()
        });
        if let Some((mac, public)) = vtep {
            n.metadata.annotations =
                Some(annotations::desired(FlannelBackend::Vxlan, Some(mac), public.parse().unwrap()));
        }
        n
    }

    fn local(backend: FlannelBackend) -> Local {
        Local { node_name: "a".into(), backend, cluster_cidr: net("10.42.0.0/16"), pod_cidr: Some(net("10.42.0.0/24")) }
    }

    #[test]
    fn host_gw_routes_to_each_peer_through_its_internal_ip() {
        let l = local(FlannelBackend::HostGw);
        let b = node("b", Some("10.42.1.0/24"), Some("192.168.1.12"), None);
        let p = peer(&l, &b).unwrap().unwrap();
        assert_eq!(p.route, Route { dst: net("10.42.1.0/24"), via: "192.168.1.12".parse().unwrap(), onlink: false });
        assert_eq!((p.neighbour, p.fdb), (None, None));
        // The node itself needs nothing; peers without what is needed are skipped.
        assert_eq!(peer(&l, &node("a", Some("10.42.0.0/24"), Some("192.168.1.11"), None)), Ok(None));
        assert_eq!(peer(&l, &node("c", None, Some("192.168.1.13"), None)), Err(Skip::NoPodCidr));
        assert_eq!(peer(&l, &node("c", Some("10.42.2.0/24"), None, None)), Err(Skip::NoInternalIp));
        assert!(matches!(
            peer(&l, &node("c", Some("10.99.0.0/24"), Some("192.168.1.13"), None)),
            Err(Skip::OutsideCluster(..))
        ));
        assert!(matches!(
            peer(&l, &node("c", Some("10.0.0.0/8"), Some("192.168.1.13"), None)),
            Err(Skip::OutsideCluster(..))
        ));
        assert!(matches!(
            peer(&l, &node("c", Some("10.42.0.0/24"), Some("192.168.1.13"), None)),
            Err(Skip::SameAsOwn(..))
        ));
    }

    #[test]
    fn vxlan_needs_route_neighbour_and_fdb_from_the_annotations() {
        let l = local(FlannelBackend::Vxlan);
        let b = node("b", Some("10.42.1.0/24"), Some("192.168.1.12"), Some(("02:aa:bb:cc:dd:01", "172.16.0.12")));
        let p = peer(&l, &b).unwrap().unwrap();
        let vtep: Ipv4Addr = "10.42.1.0".parse().unwrap();
        assert_eq!(p.route, Route { dst: net("10.42.1.0/24"), via: vtep, onlink: true });
        assert_eq!(p.neighbour, Some(Neighbour { ip: vtep, mac: "02:aa:bb:cc:dd:01".into() }));
        // Encapsulated frames go to the public IP, not the InternalIP.
        assert_eq!(p.fdb, Some(Fdb { mac: "02:aa:bb:cc:dd:01".into(), dst: "172.16.0.12".parse().unwrap() }));
        assert_eq!(peer(&l, &node("c", Some("10.42.2.0/24"), Some("192.168.1.13"), None)), Err(Skip::NoVtep));
        // A host-gw peer publishes no VTEP: not reachable over VXLAN.
        let mut hg = node("d", Some("10.42.3.0/24"), Some("192.168.1.14"), None);
        hg.metadata.annotations =
            Some(annotations::desired(FlannelBackend::HostGw, None, "192.168.1.14".parse().unwrap()));
        assert_eq!(peer(&l, &hg), Err(Skip::NoVtep));
        assert_eq!(peer(&local(FlannelBackend::None), &b), Ok(None));
    }

    #[test]
    fn podcidrs_is_read_when_podcidr_is_absent() {
        let mut n = node("b", None, Some("192.168.1.12"), None);
        n.spec.as_mut().unwrap().pod_cidrs = Some(vec!["fd00::/64".into(), "10.42.7.0/24".into()]);
        assert_eq!(pod_cidr(&n), Ok(net("10.42.7.0/24")));
    }

    #[test]
    fn stale_entries_are_those_no_peer_explains() {
        let l = local(FlannelBackend::Vxlan);
        let b = node("b", Some("10.42.1.0/24"), Some("192.168.1.12"), Some(("02:00:00:00:00:01", "192.168.1.12")));
        let mut peers = BTreeMap::new();
        peers.insert("b".to_string(), peer(&l, &b).unwrap().unwrap());
        let route = |dst: &str, via: Option<&str>, dev: &str| KernelRoute {
            dst: net(dst),
            via: via.map(|v| v.parse().unwrap()),
            dev: dev.into(),
        };
        let kernel = KernelState {
            routes: vec![
                route("0.0.0.0/0", Some("192.168.1.1"), "eth0"),
                route("192.168.1.0/24", None, "eth0"),
                route("10.42.0.0/24", None, BRIDGE),
                route("10.42.1.0/24", Some("10.42.1.0"), "ferrok.1"),
                route("10.42.9.0/24", Some("10.42.9.0"), "ferrok.1"),
                route("10.42.8.0/24", Some("192.168.1.18"), "eth0"),
                route("10.43.0.0/16", None, BRIDGE),
            ],
            neighbours: vec![
                Neighbour { ip: "10.42.1.0".parse().unwrap(), mac: "02:00:00:00:00:01".into() },
                Neighbour { ip: "10.42.9.0".parse().unwrap(), mac: "02:00:00:00:00:09".into() },
            ],
            fdb: vec![
                Fdb { mac: "02:00:00:00:00:01".into(), dst: "192.168.1.12".parse().unwrap() },
                Fdb { mac: "02:00:00:00:00:09".into(), dst: "192.168.1.19".parse().unwrap() },
            ],
        };
        let s = stale(&l, &peers, &kernel);
        assert_eq!(s.routes, vec![net("10.42.9.0/24"), net("10.42.8.0/24")]);
        assert_eq!(s.neighbours, vec!["10.42.9.0".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(s.fdb, vec!["02:00:00:00:00:09".to_string()]);
        // With no peers at all, every owned entry goes, the own podCIDR stays.
        let s = stale(&l, &BTreeMap::new(), &kernel);
        assert_eq!(s.routes.len(), 3);
        assert_eq!((s.neighbours.len(), s.fdb.len()), (2, 2));
    }

    #[test]
    fn a_changed_peer_supersedes_only_what_moved() {
        let l = local(FlannelBackend::Vxlan);
        let old = peer(&l, &node("b", Some("10.42.1.0/24"), None, Some(("02:00:00:00:00:01", "192.168.1.12"))))
            .unwrap()
            .unwrap();
        // A new MAC (the peer's device was remade): the old fdb entry goes,
        // the route and neighbour are replaced in place.
        let new = peer(&l, &node("b", Some("10.42.1.0/24"), None, Some(("02:00:00:00:00:02", "192.168.1.12"))))
            .unwrap()
            .unwrap();
        let s = superseded(&old, Some(&new));
        assert_eq!(s, Stale { routes: vec![], neighbours: vec![], fdb: vec!["02:00:00:00:00:01".into()] });
        // A new podCIDR: everything keyed by it moves.
        let moved = peer(&l, &node("b", Some("10.42.2.0/24"), None, Some(("02:00:00:00:00:01", "192.168.1.12"))))
            .unwrap()
            .unwrap();
        let s = superseded(&old, Some(&moved));
        assert_eq!((s.routes.len(), s.neighbours.len(), s.fdb.len()), (1, 1, 0));
        // Deleted: all of it.
        let s = superseded(&old, None);
        assert_eq!((s.routes.len(), s.neighbours.len(), s.fdb.len()), (1, 1, 1));
    }
}
