//! What this node enforces, worked out from the cluster's policies, pods
//! and namespaces: for each policy that selects a pod here, a list of
//! matches (peer × port) over named address sets. Pods coming and going
//! change only the sets' contents; the matches change only with policies.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use sha2::{Digest, Sha256};

use super::model::{Namespaces, Peer, PodInfo, Policy, PortNumber, Protocol, Rule};
use crate::client::labels;
use crate::net::Ipv4Net;

/// The cluster as the policies see it.
#[derive(Debug, Default, Clone)]
pub struct Cluster {
    /// Pods by namespace/name.
    pub pods: HashMap<String, PodInfo>,
    /// Namespaces' labels by name.
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Policies by namespace/name.
    pub policies: BTreeMap<String, Policy>,
}

/// The contents of one named set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetContent {
    /// Pod addresses.
    Addresses(BTreeSet<Ipv4Addr>),
    /// Pod address, protocol and port (named ports resolved on pods).
    AddressPorts(BTreeSet<(Ipv4Addr, Protocol, u16)>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerMatch {
    Any,
    /// The peer's address is in this set.
    Set(String),
    Block {
        cidr: Ipv4Net,
        except: Vec<Ipv4Net>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortMatch {
    Any,
    Protocol(Protocol),
    Range(Protocol, u16, u16),
    /// The destination address, protocol and port are in this set.
    Named(String),
}

/// One allowed combination of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub peer: PeerMatch,
    pub port: PortMatch,
}

/// One policy's rules of one direction, for the pods of `target` (a set of
/// this node's pods the policy selects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRules {
    /// A short stable id of the policy (namespace/name hashed).
    pub id: String,
    pub target: String,
    pub matches: Vec<Match>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub sets: BTreeMap<String, SetContent>,
    pub ingress: Vec<PolicyRules>,
    pub egress: Vec<PolicyRules>,
    /// This node's pods isolated for ingress / egress.
    pub ingress_isolated: BTreeSet<Ipv4Addr>,
    pub egress_isolated: BTreeSet<Ipv4Addr>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

/// A short stable name part for a key (nftables names stay short).
pub fn short_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect()
}

fn selector_key(s: &LabelSelector) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Cluster {
    fn namespace_matches(&self, namespaces: &Namespaces, ns: &str) -> bool {
        match namespaces {
            Namespaces::Own(own) => own == ns,
            Namespaces::Matching(sel) => self.namespaces.get(ns).is_some_and(|l| labels::matches(sel, Some(l))),
        }
    }

    fn pods_of(&self, namespaces: &Namespaces, pods: &LabelSelector, node: Option<&str>) -> Vec<&PodInfo> {
        self.pods
            .values()
            .filter(|p| node.is_none_or(|n| p.node == n))
            .filter(|p| self.namespace_matches(namespaces, &p.namespace) && labels::matches(pods, Some(&p.labels)))
            .collect()
    }
}

/// A pod peer's set name and the pods in it (None for other peers).
type PeerPods = Option<(String, Vec<PodInfo>)>;

/// Builds the sets as the rules ask for them, sharing equal ones.
struct Builder<'a> {
    cluster: &'a Cluster,
    node: &'a str,
    plan: Plan,
}

impl Builder<'_> {
    /// The set of pods matching, all over the cluster or on this node only.
    fn pod_set(&mut self, namespaces: &Namespaces, pods: &LabelSelector, local: bool) -> (String, Vec<PodInfo>) {
        let key = match namespaces {
            Namespaces::Own(ns) => format!("own:{ns}"),
            Namespaces::Matching(sel) => format!("ns:{}", selector_key(sel)),
        };
        let scope = if local { "local" } else { "all" };
        let name = format!("np-{}", short_hash(&format!("pods|{scope}|{key}|{}", selector_key(pods))));
        let found: Vec<PodInfo> =
            self.cluster.pods_of(namespaces, pods, local.then_some(self.node)).into_iter().cloned().collect();
        self.plan
            .sets
            .entry(name.clone())
            .or_insert_with(|| SetContent::Addresses(found.iter().map(|p| p.ip).collect()));
        (name, found)
    }

    /// The set of (address, protocol, port) of `pods`' container ports named `port`.
    fn named_set(&mut self, of: &str, pods: &[PodInfo], port: &str, protocol: Protocol) -> String {
        let name = format!("np-{}", short_hash(&format!("named|{of}|{port}|{}", protocol.nft())));
        let elements = pods
            .iter()
            .flat_map(|p| {
                p.ports.iter().filter(|n| n.name == port && n.protocol == protocol).map(|n| (p.ip, protocol, n.port))
            })
            .collect();
        self.plan.sets.entry(name.clone()).or_insert(SetContent::AddressPorts(elements));
        name
    }

    fn policy(&mut self, policy: &Policy, direction: Direction) {
        let rules = match direction {
            Direction::Ingress => policy.ingress.as_ref(),
            Direction::Egress => policy.egress.as_ref(),
        };
        let Some(rules) = rules else { return };
        let own = Namespaces::Own(policy.namespace.clone());
        let (target, selected) = self.pod_set(&own, &policy.pod_selector, true);
        // The policy's chain exists even while it selects none of this
        // node's pods, so that a pod coming changes only set elements.
        let isolated = match direction {
            Direction::Ingress => &mut self.plan.ingress_isolated,
            Direction::Egress => &mut self.plan.egress_isolated,
        };
        isolated.extend(selected.iter().map(|p| p.ip));
        let mut matches = Vec::new();
        for rule in rules {
            self.rule(rule, direction, &target, &selected, &mut matches);
        }
        let id = short_hash(&format!("{}/{}", policy.namespace, policy.name));
        let chain = PolicyRules { id, target, matches };
        match direction {
            Direction::Ingress => self.plan.ingress.push(chain),
            Direction::Egress => self.plan.egress.push(chain),
        }
    }

    fn rule(&mut self, rule: &Rule, direction: Direction, target: &str, selected: &[PodInfo], out: &mut Vec<Match>) {
        // Each peer with the pods it stands for (egress named ports are
        // resolved on those).
        let mut peers: Vec<(PeerMatch, PeerPods)> = Vec::new();
        match &rule.peers {
            None => peers.push((PeerMatch::Any, None)),
            Some(list) => {
                for p in list {
                    match p {
                        Peer::Pods { namespaces, pods } => {
                            let (name, found) = self.pod_set(namespaces, pods, false);
                            peers.push((PeerMatch::Set(name.clone()), Some((name, found))));
                        }
                        Peer::IpBlock { cidr, except } => {
                            peers.push((PeerMatch::Block { cidr: *cidr, except: except.clone() }, None))
                        }
                        Peer::Nothing => {}
                    }
                }
            }
        }
        for (peer, peer_pods) in peers {
            let ports = match &rule.ports {
                None => vec![PortMatch::Any],
                Some(ports) => ports
                    .iter()
                    .map(|p| match &p.port {
                        PortNumber::All => PortMatch::Protocol(p.protocol),
                        PortNumber::Range(a, b) => PortMatch::Range(p.protocol, *a, *b),
                        PortNumber::Named(n) => {
                            let set = match (direction, &peer_pods) {
                                // Ingress: the selected pod's own port.
                                (Direction::Ingress, _) => self.named_set(target, selected, n, p.protocol),
                                // Egress: the peer pod's port.
                                (Direction::Egress, Some((name, pods))) => self.named_set(name, pods, n, p.protocol),
                                (Direction::Egress, None) => {
                                    let any = Namespaces::Matching(LabelSelector::default());
                                    let (all, pods) = self.pod_set(&any, &LabelSelector::default(), false);
                                    self.named_set(&all, &pods, n, p.protocol)
                                }
                            };
                            PortMatch::Named(set)
                        }
                    })
                    .collect(),
            };
            out.extend(ports.into_iter().map(|port| Match { peer: peer.clone(), port }));
        }
    }
}

/// Works out what node `node` enforces.
pub fn plan(cluster: &Cluster, node: &str) -> Plan {
    let mut b = Builder { cluster, node, plan: Plan::default() };
    for policy in cluster.policies.values() {
        b.policy(policy, Direction::Ingress);
        b.policy(policy, Direction::Egress);
    }
    b.plan
}

#[cfg(test)]
pub(crate) mod eval {
    //! What the rendered rules decide, computed on the plan: the semantics
    //! tests ask this instead of reading nft text.
    use super::*;

    pub struct Packet {
        pub src: Ipv4Addr,
        pub dst: Ipv4Addr,
        pub protocol: Protocol,
        pub port: u16,
    }

    fn in_set(plan: &Plan, set: &str, ip: Ipv4Addr) -> bool {
        matches!(plan.sets.get(set), Some(SetContent::Addresses(a)) if a.contains(&ip))
    }

    fn matches(plan: &Plan, m: &Match, peer: Ipv4Addr, p: &Packet) -> bool {
        let peer_ok = match &m.peer {
            PeerMatch::Any => true,
            PeerMatch::Set(s) => in_set(plan, s, peer),
            PeerMatch::Block { cidr, except } => cidr.contains(&peer) && !except.iter().any(|e| e.contains(&peer)),
        };
        let port_ok = match &m.port {
            PortMatch::Any => true,
            PortMatch::Protocol(proto) => *proto == p.protocol,
            PortMatch::Range(proto, a, b) => *proto == p.protocol && (*a..=*b).contains(&p.port),
            PortMatch::Named(s) => {
                matches!(plan.sets.get(s), Some(SetContent::AddressPorts(e)) if e.contains(&(p.dst, p.protocol, p.port)))
            }
        };
        peer_ok && port_ok
    }

    fn direction(
        plan: &Plan,
        policies: &[PolicyRules],
        isolated: &BTreeSet<Ipv4Addr>,
        pod: Ipv4Addr,
        peer: Ipv4Addr,
        p: &Packet,
    ) -> bool {
        !isolated.contains(&pod)
            || policies
                .iter()
                .any(|pr| in_set(plan, &pr.target, pod) && pr.matches.iter().any(|m| matches(plan, m, peer, p)))
    }

    /// Whether this node lets the packet through (both ends checked where
    /// they are this node's pods).
    pub fn allowed(plan: &Plan, p: &Packet) -> bool {
        direction(plan, &plan.egress, &plan.egress_isolated, p.src, p.dst, p)
            && direction(plan, &plan.ingress, &plan.ingress_isolated, p.dst, p.src, p)
    }
}
