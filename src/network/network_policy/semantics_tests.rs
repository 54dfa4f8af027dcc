//! Upstream's NetworkPolicy semantics, checked on the plan a node works out
//! (through the same evaluation the rendered chains perform).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::model::{NamedPort, PodInfo, Policy, Protocol};
use super::plan::eval::{allowed, Packet};
use super::plan::{plan, Cluster, Plan};

const NODE: &str = "n1";

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 42, 0, last)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

struct World {
    cluster: Cluster,
}

impl World {
    fn new() -> World {
        let mut cluster = Cluster::default();
        cluster.namespaces.insert("default".into(), labels(&[("kubernetes.io/metadata.name", "default")]));
        cluster.namespaces.insert("prod".into(), labels(&[("team", "a"), ("kubernetes.io/metadata.name", "prod")]));
        cluster.namespaces.insert("dev".into(), labels(&[("team", "b"), ("kubernetes.io/metadata.name", "dev")]));
        World { cluster }
    }

    fn pod(&mut self, ns: &str, last: u8, l: &[(&str, &str)]) -> &mut World {
        self.pod_on(ns, last, l, NODE, vec![])
    }

    fn pod_on(&mut self, ns: &str, last: u8, l: &[(&str, &str)], node: &str, ports: Vec<NamedPort>) -> &mut World {
        let info = PodInfo { namespace: ns.into(), labels: labels(l), ip: ip(last), node: node.into(), ports };
        self.cluster.pods.insert(format!("{ns}/p{last}"), info);
        self
    }

    fn policy(&mut self, ns: &str, name: &str, spec: serde_json::Value) -> &mut World {
        let np: NetworkPolicy =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
                .unwrap();
        self.cluster.policies.insert(format!("{ns}/{name}"), Policy::from_api(&np).unwrap());
        self
    }

    fn plan(&self) -> Plan {
        plan(&self.cluster, NODE)
    }

    fn tcp(&self, src: u8, dst: u8, port: u16) -> bool {
        allowed(&self.plan(), &Packet { src: ip(src), dst: ip(dst), protocol: Protocol::Tcp, port })
    }

    fn packet(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: Protocol, port: u16) -> bool {
        allowed(&self.plan(), &Packet { src, dst, protocol, port })
    }
}

fn named(name: &str, port: u16) -> NamedPort {
    NamedPort { name: name.into(), protocol: Protocol::Tcp, port }
}

#[test]
fn no_policy_allows_everything_and_an_empty_ingress_list_denies_all() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("app", "client")]);
    assert!(w.tcp(3, 2, 80));
    w.policy("default", "deny", serde_json::json!({"podSelector": {}}));
    assert!(!w.tcp(3, 2, 80));
    assert!(!w.tcp(2, 3, 80), "an empty podSelector selects every pod of the namespace");
    // Egress is not isolated by an ingress-only policy.
    assert!(w.plan().egress_isolated.is_empty());
}

#[test]
fn a_policy_only_isolates_pods_it_selects_in_its_namespace() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("app", "client")]).pod("prod", 4, &[("app", "web")]);
    w.policy("default", "deny-web", serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}}}));
    assert!(!w.tcp(3, 2, 80));
    assert!(w.tcp(2, 3, 80));
    assert!(w.tcp(3, 4, 80), "a pod with the same labels in another namespace is not selected");
}

#[test]
fn allowed_is_the_union_of_the_policies() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("app", "a")]).pod("default", 4, &[("app", "b")]);
    w.policy("default", "deny", serde_json::json!({"podSelector": {}}));
    w.policy(
        "default",
        "a",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
    );
    assert!(w.tcp(3, 2, 80));
    assert!(!w.tcp(4, 2, 80));
    w.policy("default", "b", serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["b"]}]}}]}]}));
    assert!(w.tcp(3, 2, 80) && w.tcp(4, 2, 80));
}

#[test]
fn pod_selector_peers_are_in_the_policy_namespace_only() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("role", "c")]).pod("prod", 4, &[("role", "c")]);
    w.policy(
        "default",
        "p",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}]}]}),
    );
    assert!(w.tcp(3, 2, 80));
    assert!(!w.tcp(4, 2, 80));
}

#[test]
fn namespace_selector_alone_and_together_with_a_pod_selector() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("prod", 3, &[("role", "c")]).pod("prod", 4, &[("role", "other")]).pod(
        "dev",
        5,
        &[("role", "c")],
    );
    w.policy(
        "default",
        "ns",
        serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]}),
    );
    assert!(w.tcp(3, 2, 80) && w.tcp(4, 2, 80));
    assert!(!w.tcp(5, 2, 80));
    // Both in one peer: AND.
    w.policy("default", "ns", serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"role": "c"}}}]}]}));
    assert!(w.tcp(3, 2, 80));
    assert!(!w.tcp(4, 2, 80) && !w.tcp(5, 2, 80));
    // Two peers: OR.
    w.policy("default", "ns", serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}, {"podSelector": {"matchLabels": {"role": "c"}}}]}]}));
    assert!(w.tcp(3, 2, 80) && w.tcp(4, 2, 80));
    assert!(!w.tcp(5, 2, 80), "the podSelector peer is the policy's namespace only");
    // An empty namespaceSelector: every namespace.
    w.policy(
        "default",
        "ns",
        serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
    );
    assert!(w.tcp(5, 2, 80));
}

#[test]
fn a_namespace_relabelled_changes_only_set_contents() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("dev", 5, &[]);
    w.policy(
        "default",
        "ns",
        serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]}),
    );
    let before = w.plan();
    assert!(!w.tcp(5, 2, 80));
    w.cluster.namespaces.insert("dev".into(), labels(&[("team", "a")]));
    let after = w.plan();
    assert!(w.tcp(5, 2, 80));
    assert_eq!(before.ingress, after.ingress, "the rules stay; only the sets change");
    assert_ne!(before.sets, after.sets);
}

#[test]
fn ip_block_with_except() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]);
    w.policy(
        "default",
        "ipb",
        serde_json::json!({"podSelector": {},
        "ingress": [{"from": [{"ipBlock": {"cidr": "10.42.0.0/24", "except": ["10.42.0.128/25"]}}]}]}),
    );
    assert!(w.tcp(9, 2, 80));
    assert!(!w.tcp(200, 2, 80));
    assert!(!w.packet(Ipv4Addr::new(192, 168, 1, 1), ip(2), Protocol::Tcp, 80));
}

#[test]
fn ports_protocols_and_end_port() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[]);
    w.policy("default", "ports", serde_json::json!({"podSelector": {},
        "ingress": [{"ports": [{"port": 80}, {"protocol": "UDP", "port": 5000, "endPort": 5010}, {"protocol": "SCTP"}]}]}));
    assert!(w.tcp(3, 2, 80));
    assert!(!w.tcp(3, 2, 81));
    assert!(!w.tcp(3, 2, 5005), "the range is UDP's");
    assert!(w.packet(ip(3), ip(2), Protocol::Udp, 5010));
    assert!(!w.packet(ip(3), ip(2), Protocol::Udp, 5011));
    assert!(w.packet(ip(3), ip(2), Protocol::Sctp, 1234), "a protocol without a port: all its ports");
}

#[test]
fn a_rule_with_peers_and_ports_needs_both() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("role", "c")]).pod("default", 4, &[]);
    w.policy(
        "default",
        "p",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}], "ports": [{"port": 80}]}]}),
    );
    assert!(w.tcp(3, 2, 80));
    assert!(!w.tcp(3, 2, 81));
    assert!(!w.tcp(4, 2, 80));
}

#[test]
fn named_ports_resolve_on_the_selected_pod_for_ingress() {
    let mut w = World::new();
    w.pod_on("default", 2, &[("app", "web")], NODE, vec![named("http", 8080)]);
    w.pod_on("default", 3, &[("app", "web")], NODE, vec![named("http", 9090)]);
    w.pod("default", 4, &[]);
    w.policy(
        "default",
        "named",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"ports": [{"port": "http"}]}]}),
    );
    assert!(w.tcp(4, 2, 8080) && w.tcp(4, 3, 9090));
    assert!(!w.tcp(4, 2, 9090) && !w.tcp(4, 3, 8080), "each pod's own number for the name");
    w.policy(
        "default",
        "named",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"ports": [{"port": "http", "protocol": "UDP"}]}]}),
    );
    assert!(!w.tcp(4, 2, 8080), "the protocol must match the container port's");
}

#[test]
fn named_ports_resolve_on_the_peer_pod_for_egress() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "client")]);
    w.pod_on("default", 3, &[("app", "db")], "n2", vec![named("sql", 5432)]);
    w.pod_on("default", 4, &[("app", "cache")], "n2", vec![named("sql", 6000)]);
    w.policy(
        "default",
        "e",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "client"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": "sql"}]}]}),
    );
    assert!(w.tcp(2, 3, 5432));
    assert!(!w.tcp(2, 3, 6000));
    assert!(!w.tcp(2, 4, 6000), "the cache is not a peer of the rule");
    // No `to`: the name resolves on any pod.
    w.policy(
        "default",
        "e",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "client"}},
        "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "sql"}]}]}),
    );
    assert!(w.tcp(2, 4, 6000) && w.tcp(2, 3, 5432));
    assert!(!w.tcp(2, 3, 6000));
}

#[test]
fn egress_default_deny_and_allow() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "client")]).pod("default", 3, &[("app", "web")]);
    w.policy("default", "deny-egress", serde_json::json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    assert!(!w.tcp(2, 3, 80));
    assert!(!w.packet(ip(2), Ipv4Addr::new(10, 201, 1, 1), Protocol::Tcp, 443));
    assert!(w.plan().ingress_isolated.is_empty(), "egress only");
    w.policy(
        "default",
        "allow",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "client"}},
        "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    );
    assert!(w.tcp(2, 3, 80));
    assert!(!w.tcp(3, 2, 80), "web is still isolated for egress");
    // The allow policy also isolates client for ingress (Ingress by default).
    assert!(w.plan().ingress_isolated.contains(&ip(2)));
}

#[test]
fn only_this_nodes_pods_are_enforced_but_peers_are_anywhere() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]);
    w.pod_on("default", 3, &[("app", "web")], "n2", vec![]);
    w.pod_on("prod", 4, &[("role", "c")], "n2", vec![]);
    w.policy(
        "default",
        "p",
        serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "c"}}}]}]}),
    );
    let plan = w.plan();
    assert!(plan.ingress_isolated.contains(&ip(2)));
    assert!(!plan.ingress_isolated.contains(&ip(3)), "the other node enforces for its own pods");
    assert!(w.tcp(4, 2, 80), "a peer on another node is in the peer set");
    assert!(!w.tcp(3, 2, 80));
}

#[test]
fn equal_selectors_share_one_set() {
    let mut w = World::new();
    w.pod("default", 2, &[("app", "web")]).pod("default", 3, &[("role", "c")]);
    for name in ["a", "b"] {
        w.policy(
            "default",
            name,
            serde_json::json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}]}]}),
        );
    }
    let plan = w.plan();
    // Target (local) and peer (cluster-wide) sets, shared by both policies.
    assert_eq!(plan.sets.len(), 2, "{:?}", plan.sets.keys());
    assert_eq!(plan.ingress.len(), 2);
    assert_ne!(plan.ingress[0].id, plan.ingress[1].id);
}
