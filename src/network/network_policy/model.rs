//! NetworkPolicies, pods and namespaces in the form the enforcement works
//! on: upstream's defaulting applied (policyTypes, protocol TCP), peers and
//! ports classified, and only what a policy decision reads kept of a pod.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::net::Ipv4Net;
pub use crate::network::protocol::Protocol;

/// Which namespaces a pod peer is looked for in.
#[derive(Debug, Clone, PartialEq)]
pub enum Namespaces {
    /// The policy's own namespace (a peer with only a podSelector).
    Own(String),
    /// Every namespace whose labels match (an empty selector: all of them).
    Matching(LabelSelector),
}

/// One `from`/`to` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Peer {
    /// Pods matching `pods` in `namespaces` (podSelector, namespaceSelector
    /// or both; a missing podSelector beside a namespaceSelector is all pods).
    Pods { namespaces: Namespaces, pods: LabelSelector },
    /// Addresses in `cidr` but none of `except` (IPv4, as pods' addresses;
    /// any prefix, /0 to /32).
    IpBlock { cidr: Ipv4Net, except: Vec<Ipv4Net> },
    /// A peer that cannot match anything (an IPv6 block, an empty peer).
    Nothing,
}

/// The port part of a NetworkPolicyPort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortNumber {
    /// No port: every port of the protocol.
    All,
    /// `port`, or `port`..=`endPort`.
    Range(u16, u16),
    /// A container port's name, resolved on the destination pod.
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub protocol: Protocol,
    pub port: PortNumber,
}

/// One ingress or egress rule; `None` lists mean "every peer" / "every port".
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub peers: Option<Vec<Peer>>,
    pub ports: Option<Vec<Port>>,
}

/// A NetworkPolicy after defaulting. A direction that is `Some` isolates
/// the selected pods for it; an empty list there allows nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: LabelSelector,
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
}

impl Policy {
    pub fn from_api(np: &NetworkPolicy) -> Option<Policy> {
        let namespace = np.metadata.namespace.clone()?;
        let name = np.metadata.name.clone()?;
        let spec = np.spec.clone().unwrap_or_default();
        let (ingress_type, egress_type) = match &spec.policy_types {
            Some(types) if !types.is_empty() => {
                (types.iter().any(|t| t == "Ingress"), types.iter().any(|t| t == "Egress"))
            }
            // Upstream's defaulting: Ingress always, Egress when it has rules.
            _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
        };
        let ingress = ingress_type.then(|| {
            spec.ingress.iter().flatten().map(|r| rule(&namespace, r.from.as_deref(), r.ports.as_deref())).collect()
        });
        let egress = egress_type.then(|| {
            spec.egress.iter().flatten().map(|r| rule(&namespace, r.to.as_deref(), r.ports.as_deref())).collect()
        });
        Some(Policy { pod_selector: spec.pod_selector.unwrap_or_default(), namespace, name, ingress, egress })
    }
}

fn rule(namespace: &str, peers: Option<&[NetworkPolicyPeer]>, ports: Option<&[NetworkPolicyPort]>) -> Rule {
    // An empty or missing list means "all", as upstream documents.
    let peers = peers.filter(|p| !p.is_empty()).map(|p| p.iter().map(|p| peer(namespace, p)).collect());
    let ports = ports.filter(|p| !p.is_empty()).map(|p| p.iter().filter_map(port).collect());
    Rule { peers, ports }
}

fn peer(namespace: &str, p: &NetworkPolicyPeer) -> Peer {
    if let Some(block) = &p.ip_block {
        // Pods here have IPv4 addresses only: an IPv6 block (as junk)
        // matches nothing, and an IPv6 exception takes nothing out of an
        // IPv4 block.
        let ipv4 = |s: &str| crate::net::parse_v4(s, 0..=32).ok();
        let Some(cidr) = ipv4(&block.cidr) else { return Peer::Nothing };
        let except = block.except.iter().flatten().filter_map(|e| ipv4(e)).collect();
        return Peer::IpBlock { cidr, except };
    }
    match (&p.namespace_selector, &p.pod_selector) {
        (Some(ns), pods) => {
            Peer::Pods { namespaces: Namespaces::Matching(ns.clone()), pods: pods.clone().unwrap_or_default() }
        }
        (None, Some(pods)) => Peer::Pods { namespaces: Namespaces::Own(namespace.to_string()), pods: pods.clone() },
        (None, None) => Peer::Nothing,
    }
}

/// None for a protocol nftables cannot match (validation refuses those).
fn port(p: &NetworkPolicyPort) -> Option<Port> {
    let protocol = Protocol::parse(p.protocol.as_deref())?;
    let port = match &p.port {
        None => PortNumber::All,
        Some(IntOrString::Int(n)) => {
            let start = u16::try_from(*n).ok()?;
            let end = p.end_port.and_then(|e| u16::try_from(e).ok()).filter(|e| *e >= start).unwrap_or(start);
            PortNumber::Range(start, end)
        }
        Some(IntOrString::String(s)) => match s.parse::<u16>() {
            Ok(n) => PortNumber::Range(n, n),
            Err(_) => PortNumber::Named(s.clone()),
        },
    };
    Some(Port { protocol, port })
}

/// A container port with a name, for named ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// What a policy decision reads of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub ip: Ipv4Addr,
    pub node: String,
    pub ports: Vec<NamedPort>,
}

impl PodInfo {
    /// None for pods policies do not see: no IPv4 address yet, on the
    /// host's network, or finished (their address may be someone else's).
    pub fn from_api(pod: &Pod) -> Option<PodInfo> {
        let spec = pod.spec.as_ref()?;
        if spec.host_network == Some(true) {
            return None;
        }
        let status = pod.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let ip = status
            .pod_ips
            .iter()
            .flatten()
            .map(|i| i.ip.as_str())
            .chain(status.pod_ip.as_deref())
            .find_map(|s| s.parse::<Ipv4Addr>().ok())?;
        let ports = spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: p.name.clone()?,
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                    port: u16::try_from(p.container_port).ok()?,
                })
            })
            .collect();
        Some(PodInfo {
            namespace: pod.metadata.namespace.clone()?,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip,
            node: spec.node_name.clone().unwrap_or_default(),
            ports,
        })
    }
}

/// A namespace's labels.
pub fn namespace_labels(ns: &Namespace) -> BTreeMap<String, String> {
    ns.metadata.labels.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: serde_json::Value) -> Policy {
        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"}, "spec": spec
        }))
        .unwrap();
        Policy::from_api(&np).unwrap()
    }

    #[test]
    fn policy_types_default_as_upstream() {
        let p = policy(serde_json::json!({"podSelector": {}}));
        assert_eq!(p.ingress, Some(vec![]), "ingress is always isolated by default");
        assert_eq!(p.egress, None, "no egress rules: not isolated for egress");
        let p = policy(serde_json::json!({"podSelector": {}, "egress": [{}]}));
        assert!(p.ingress.is_some() && p.egress.is_some());
        let p = policy(serde_json::json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]}));
        assert_eq!(p.ingress, None, "ingress rules are ignored when policyTypes leaves Ingress out");
        assert_eq!(p.egress, Some(vec![]), "Egress with no rules denies all egress");
    }

    #[test]
    fn peers_are_classified() {
        let p = policy(serde_json::json!({"podSelector": {}, "ingress": [{"from": [
            {"podSelector": {"matchLabels": {"a": "b"}}},
            {"namespaceSelector": {}},
            {"namespaceSelector": {"matchLabels": {"t": "x"}}, "podSelector": {"matchLabels": {"a": "b"}}},
            {"ipBlock": {"cidr": "10.0.0.7/8", "except": ["10.1.0.0/16"]}},
            {"ipBlock": {"cidr": "fd00::/64"}}
        ]}]}));
        let peers = p.ingress.unwrap()[0].peers.clone().unwrap();
        assert!(matches!(&peers[0], Peer::Pods { namespaces: Namespaces::Own(n), .. } if n == "ns"));
        assert!(
            matches!(&peers[1], Peer::Pods { namespaces: Namespaces::Matching(_), pods } if pods == &LabelSelector::default())
        );
        assert!(matches!(&peers[2], Peer::Pods { namespaces: Namespaces::Matching(s), pods }
            if s.match_labels.is_some() && pods.match_labels.is_some()));
        assert_eq!(
            peers[3],
            Peer::IpBlock {
                cidr: crate::net::parse_v4("10.0.0.0/8", 0..=32).unwrap(),
                except: vec![crate::net::parse_v4("10.1.0.0/16", 0..=32).unwrap()]
            }
        );
        assert_eq!(peers[4], Peer::Nothing);
    }

    #[test]
    fn ip_blocks_of_either_family_parse_and_only_ipv4_is_kept() {
        let p = policy(serde_json::json!({"podSelector": {}, "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64", "10.1.2.3/16", "junk"]}},
            {"ipBlock": {"cidr": "fd00::/64", "except": ["fd00::/96"]}},
            {"ipBlock": {"cidr": "10.0.0.0/33"}},
            {"ipBlock": {"cidr": "0.0.0.0/0"}}
        ]}]}));
        let peers = p.ingress.unwrap()[0].peers.clone().unwrap();
        let net = |s: &str| crate::net::parse_v4(s, 0..=32).unwrap();
        assert_eq!(peers[0], Peer::IpBlock { cidr: net("10.0.0.0/8"), except: vec![net("10.1.0.0/16")] });
        assert_eq!(peers[1], Peer::Nothing);
        assert_eq!(peers[2], Peer::Nothing);
        assert_eq!(peers[3], Peer::IpBlock { cidr: net("0.0.0.0/0"), except: vec![] });
    }

    #[test]
    fn ports_default_to_tcp_and_take_end_port_and_names() {
        let p = policy(serde_json::json!({"podSelector": {}, "ingress": [{"ports": [
            {"port": 80},
            {"protocol": "UDP", "port": 8000, "endPort": 8100},
            {"port": "http"},
            {"protocol": "SCTP"},
        ]}, {"from": [], "ports": []}]}));
        let rules = p.ingress.unwrap();
        assert_eq!(
            rules[0].ports.clone().unwrap(),
            vec![
                Port { protocol: Protocol::Tcp, port: PortNumber::Range(80, 80) },
                Port { protocol: Protocol::Udp, port: PortNumber::Range(8000, 8100) },
                Port { protocol: Protocol::Tcp, port: PortNumber::Named("http".into()) },
                Port { protocol: Protocol::Sctp, port: PortNumber::All },
            ]
        );
        assert_eq!(rules[1], Rule { peers: None, ports: None }, "empty lists mean all peers and all ports");
    }

    #[test]
    fn pods_without_address_or_on_the_host_network_are_left_out() {
        let pod = |extra: serde_json::Value| -> Option<PodInfo> {
            let mut v = serde_json::json!({
                "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                    {"name": "http", "containerPort": 8080}, {"containerPort": 9}]}]},
                "status": {"phase": "Running", "podIP": "10.42.0.5"}
            });
            json_patch(&mut v, extra);
            PodInfo::from_api(&serde_json::from_value(v).unwrap())
        };
        let p = pod(serde_json::json!({})).unwrap();
        assert_eq!(p.ip, Ipv4Addr::new(10, 42, 0, 5));
        assert_eq!(p.ports, vec![NamedPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }]);
        assert!(pod(serde_json::json!({"status": {"podIP": null}})).is_none());
        assert!(pod(serde_json::json!({"spec": {"hostNetwork": true}})).is_none());
        assert!(pod(serde_json::json!({"status": {"phase": "Succeeded"}})).is_none());
    }

    fn json_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
        if let (Some(t), serde_json::Value::Object(p)) = (target.as_object_mut(), &patch) {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) if v.is_object() => json_patch(existing, v.clone()),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
}
