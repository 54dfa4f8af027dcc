//! What the service proxy programs, read from a Service and its
//! EndpointSlices as upstream kube-proxy reads them: one [`ServicePort`]
//! per port of the Service, with the addresses it answers on and the
//! endpoints its traffic may go to (cluster-wide and on this node).

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub use crate::network::protocol::Protocol;

/// One endpoint a service port may send traffic to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// One port of a Service, as this node serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `namespace/name/protocol/port-name` (the port number when unnamed):
    /// stable, readable, and unique per service port.
    pub id: String,
    pub protocol: Protocol,
    pub port: u16,
    pub cluster_ips: Vec<Ipv4Addr>,
    pub node_port: Option<u16>,
    /// ExternalIPs and load-balancer ingress addresses.
    pub external_ips: Vec<Ipv4Addr>,
    /// `sessionAffinity: ClientIP` and its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// Usable endpoints anywhere in the cluster, and on this node.
    pub cluster_endpoints: Vec<Endpoint>,
    pub local_endpoints: Vec<Endpoint>,
}

/// The default ClientIP affinity timeout (three hours), as upstream.
const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// The service ports of `svc` with endpoints from its `slices`; none for
/// a Service the proxy does not program (headless, ExternalName).
pub fn service_ports<'a>(
    svc: &Service,
    slices: impl Iterator<Item = &'a EndpointSlice> + Clone,
    node_name: &str,
) -> Vec<ServicePort> {
    let Some(spec) = svc.spec.as_ref() else { return Vec::new() };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let cluster_ips: Vec<Ipv4Addr> =
        spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter()).filter_map(|ip| ip.parse().ok()).fold(
            Vec::new(),
            |mut v, ip| {
                if !v.contains(&ip) {
                    v.push(ip);
                }
                v
            },
        );
    if cluster_ips.is_empty() {
        return Vec::new();
    }
    let namespace = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let mut external_ips: Vec<Ipv4Addr> = spec.external_ips.iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    if spec.type_.as_deref() == Some("LoadBalancer") {
        for i in ingress.into_iter().flatten() {
            // An ingress with ipMode Proxy is reached through its load balancer, not short-circuited here.
            if i.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(ip) = i.ip.as_deref().and_then(|ip| ip.parse().ok()) {
                if !external_ips.contains(&ip) {
                    external_ips.push(ip);
                }
            }
        }
    }
    let external = matches!(spec.type_.as_deref(), Some("NodePort") | Some("LoadBalancer")) || !external_ips.is_empty();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let mut out = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else { continue };
        let Ok(port) = u16::try_from(p.port) else { continue };
        let port_name = p.name.clone().unwrap_or_default();
        let label = if port_name.is_empty() { port.to_string() } else { port_name.clone() };
        let (cluster_endpoints, local_endpoints) = endpoints(slices.clone(), &port_name, protocol, node_name);
        out.push(ServicePort {
            id: format!("{namespace}/{name}/{}/{label}", protocol.nft()),
            protocol,
            port,
            cluster_ips: cluster_ips.clone(),
            node_port: p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0),
            external_ips: external_ips.clone(),
            affinity_timeout,
            external_local: external && spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            cluster_endpoints,
            local_endpoints,
        });
    }
    out
}

/// The usable endpoints of a port, cluster-wide and on this node: the ready
/// ones, or when there are none, the serving ones that are terminating
/// (upstream's fallback, so connections drain during a rollout).
fn endpoints<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    port_name: &str,
    protocol: Protocol,
    node_name: &str,
) -> (Vec<Endpoint>, Vec<Endpoint>) {
    // (endpoint, ready, serving, local)
    let mut all: Vec<(Endpoint, bool, bool, bool)> = Vec::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else { continue };
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<Ipv4Addr>().ok()) else { continue };
            let c = ep.conditions.as_ref();
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            // Upstream reads a missing ready condition as ready.
            let ready = c.and_then(|c| c.ready).unwrap_or(true) && !terminating;
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let local = ep.node_name.as_deref() == Some(node_name);
            let e = Endpoint { ip, port };
            if !all.iter().any(|(x, ..)| *x == e) {
                all.push((e, ready, serving, local));
            }
        }
    }
    let pick = |only_local: bool| {
        let candidates = || all.iter().filter(move |(.., local)| !only_local || *local);
        let ready: Vec<Endpoint> = candidates().filter(|(_, r, ..)| *r).map(|(e, ..)| *e).collect();
        let mut chosen =
            if ready.is_empty() { candidates().filter(|(_, _, s, _)| *s).map(|(e, ..)| *e).collect() } else { ready };
        chosen.sort();
        chosen
    };
    (pick(false), pick(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec})).unwrap()
    }

    fn slice(endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop"},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn a_cluster_ip_service_with_ready_endpoints() {
        let s = svc(json!({"clusterIP": "10.43.0.5", "ports": [{"name": "http", "port": 80}]}));
        let sl = slice(json!([
            {"addresses": ["10.42.0.7"], "conditions": {"ready": true}, "nodeName": "n1"},
            {"addresses": ["10.42.1.7"], "conditions": {"ready": false}, "nodeName": "n2"},
            {"addresses": ["10.42.0.8"], "nodeName": "n2"},
        ]));
        let ports = service_ports(&s, [&sl].into_iter(), "n1");
        assert_eq!(ports.len(), 1);
        let p = &ports[0];
        assert_eq!(p.id, "shop/web/tcp/http");
        assert_eq!(p.cluster_ips, [Ipv4Addr::new(10, 43, 0, 5)]);
        let ips: Vec<_> = p.cluster_endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(ips, ["10.42.0.7", "10.42.0.8"]);
        assert_eq!(p.local_endpoints, [Endpoint { ip: Ipv4Addr::new(10, 42, 0, 7), port: 8080 }]);
        assert!(p.node_port.is_none() && !p.external_local && p.affinity_timeout.is_none());
    }

    #[test]
    fn terminating_serving_endpoints_are_the_fallback() {
        let s = svc(json!({"clusterIP": "10.43.0.5", "ports": [{"name": "http", "port": 80}]}));
        let sl = slice(json!([
            {"addresses": ["10.42.0.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.42.0.9"], "conditions": {"ready": false, "serving": false, "terminating": true}},
        ]));
        let p = &service_ports(&s, [&sl].into_iter(), "n1")[0];
        assert_eq!(p.cluster_endpoints, [Endpoint { ip: Ipv4Addr::new(10, 42, 0, 7), port: 8080 }]);
        let sl = slice(json!([
            {"addresses": ["10.42.0.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.42.0.9"], "conditions": {"ready": true}},
        ]));
        let p = &service_ports(&s, [&sl].into_iter(), "n1")[0];
        assert_eq!(p.cluster_endpoints, [Endpoint { ip: Ipv4Addr::new(10, 42, 0, 9), port: 8080 }]);
    }

    #[test]
    fn load_balancer_ingress_node_ports_and_policies() {
        let mut s = svc(json!({"type": "LoadBalancer", "clusterIP": "10.43.0.5", "externalIPs": ["192.0.2.9"],
            "externalTrafficPolicy": "Local", "sessionAffinity": "ClientIP",
            "ports": [{"port": 53, "protocol": "UDP", "nodePort": 30053}]}));
        s.status = serde_json::from_value(
            json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "192.0.2.2", "ipMode": "Proxy"}]}}),
        )
        .unwrap();
        let p = &service_ports(&s, std::iter::empty(), "n1")[0];
        assert_eq!(p.id, "shop/web/udp/53");
        assert_eq!(p.node_port, Some(30053));
        assert_eq!(p.external_ips, [Ipv4Addr::new(192, 0, 2, 9), Ipv4Addr::new(192, 0, 2, 1)]);
        assert!(p.external_local);
        assert_eq!(p.affinity_timeout, Some(10_800));
    }

    #[test]
    fn headless_and_external_name_services_are_not_programmed() {
        let s = svc(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert!(service_ports(&s, std::iter::empty(), "n1").is_empty());
        let s = svc(json!({"type": "ExternalName", "externalName": "example.org"}));
        assert!(service_ports(&s, std::iter::empty(), "n1").is_empty());
    }
}
