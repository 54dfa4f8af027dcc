//! What a change to a Service leaves behind in the kernel's connection
//! tracking, and its removal. UDP has no connection to end: while an entry
//! lives, a client's datagrams keep going where the entry's DNAT sent the
//! first one, to an endpoint that may be gone. As upstream kube-proxy does,
//! entries NATed to a removed endpoint are deleted, and so are the entries
//! to a service address made while it had no endpoints at all.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use super::model::{Protocol, ServicePort};
use crate::network::conntrack::{self, ConntrackError, IpFamily};
use crate::network::ctnetlink::Flow;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// Datagrams to `dst:port` that were NATed to `endpoint`, now gone.
    Nat { dst: Ipv4Addr, port: u16, endpoint: Ipv4Addr },
    /// Datagrams to node port `port` that were NATed to `endpoint`, now gone.
    NodePortNat { port: u16, endpoint: Ipv4Addr },
    /// Datagrams to `dst:port` from before it had any endpoint.
    Service { dst: Ipv4Addr, port: u16 },
}

/// The stale entries a change of one Service's ports from `old` to `new` leaves.
pub fn stale_udp(old: &[ServicePort], new: &[ServicePort]) -> Vec<Stale> {
    let mut out = Vec::new();
    let new_by_id: HashMap<&str, &ServicePort> = new.iter().map(|p| (p.id.as_str(), p)).collect();
    let old_by_id: HashMap<&str, &ServicePort> = old.iter().map(|p| (p.id.as_str(), p)).collect();
    let addresses = |p: &ServicePort| p.cluster_ips.iter().chain(&p.external_ips).copied().collect::<Vec<_>>();
    let endpoint_ips = |p: &ServicePort| {
        let mut ips: Vec<Ipv4Addr> = p.cluster_endpoints.iter().chain(&p.local_endpoints).map(|e| e.ip).collect();
        ips.sort();
        ips.dedup();
        ips
    };
    for p in old.iter().filter(|p| p.protocol == Protocol::Udp) {
        let still = new_by_id.get(p.id.as_str()).map(|q| endpoint_ips(q)).unwrap_or_default();
        for endpoint in endpoint_ips(p).into_iter().filter(|e| !still.contains(e)) {
            for dst in addresses(p) {
                out.push(Stale::Nat { dst, port: p.port, endpoint });
            }
            if let Some(port) = p.node_port {
                out.push(Stale::NodePortNat { port, endpoint });
            }
        }
    }
    for q in new.iter().filter(|q| q.protocol == Protocol::Udp && !q.cluster_endpoints.is_empty()) {
        let had = old_by_id.get(q.id.as_str()).is_some_and(|p| !p.cluster_endpoints.is_empty());
        if !had {
            for dst in addresses(q) {
                out.push(Stale::Service { dst, port: q.port });
            }
        }
    }
    out
}

fn matches(stale: &Stale, flow: &Flow) -> bool {
    let o = &flow.original;
    match *stale {
        Stale::Nat { dst, port, endpoint } => {
            o.dst == IpAddr::V4(dst) && o.dst_port == port && flow.reply.src == IpAddr::V4(endpoint)
        }
        Stale::NodePortNat { port, endpoint } => o.dst_port == port && flow.reply.src == IpAddr::V4(endpoint),
        Stale::Service { dst, port } => o.dst == IpAddr::V4(dst) && o.dst_port == port,
    }
}

/// Deletes the entries, reading the table once; how many went.
pub async fn delete(stale: Vec<Stale>) -> Result<usize, ConntrackError> {
    if stale.is_empty() {
        return Ok(0);
    }
    conntrack::in_background(move || {
        conntrack::delete_udp_where(IpFamily::V4, |flow| stale.iter().any(|s| matches(s, flow)))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::super::model::Endpoint;
    use super::*;

    fn port(protocol: Protocol, endpoints: &[&str]) -> ServicePort {
        let eps: Vec<Endpoint> = endpoints.iter().map(|ip| Endpoint { ip: ip.parse().unwrap(), port: 53 }).collect();
        ServicePort {
            id: "kube-system/dns/udp/dns".into(),
            protocol,
            port: 53,
            cluster_ips: vec![Ipv4Addr::new(10, 43, 0, 10)],
            node_port: Some(30053),
            external_ips: vec![],
            affinity_timeout: None,
            external_local: false,
            internal_local: false,
            local_endpoints: vec![],
            cluster_endpoints: eps,
        }
    }

    #[test]
    fn a_removed_udp_endpoint_is_stale_for_every_address_and_the_node_port() {
        let old = [port(Protocol::Udp, &["10.42.0.5", "10.42.0.6"])];
        let new = [port(Protocol::Udp, &["10.42.0.6"])];
        let gone: Ipv4Addr = "10.42.0.5".parse().unwrap();
        assert_eq!(
            stale_udp(&old, &new),
            [
                Stale::Nat { dst: Ipv4Addr::new(10, 43, 0, 10), port: 53, endpoint: gone },
                Stale::NodePortNat { port: 30053, endpoint: gone }
            ]
        );
        // TCP connections end on their own.
        assert!(stale_udp(&[port(Protocol::Tcp, &["10.42.0.5"])], &[port(Protocol::Tcp, &[])]).is_empty());
    }

    #[test]
    fn a_service_that_gets_its_first_endpoint_forgets_refused_datagrams() {
        let old = [port(Protocol::Udp, &[])];
        let new = [port(Protocol::Udp, &["10.42.0.5"])];
        assert_eq!(stale_udp(&old, &new), [Stale::Service { dst: Ipv4Addr::new(10, 43, 0, 10), port: 53 }]);
        assert_eq!(stale_udp(&new, &new), []);
    }
}
