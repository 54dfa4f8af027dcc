//! The service proxy's nftables driver, shaped as upstream's nftables
//! kube-proxy: service addresses are elements of verdict maps (so a lookup
//! costs the same with ten services or ten thousand), each service port
//! has chains of its own (`int-` for its cluster IPs, `ext-` for node
//! ports, external and load-balancer addresses, `svc-`/`svl-` choosing
//! among all or only this node's endpoints) and each endpoint a `sep-`
//! chain that does the DNAT. A change rewrites only the objects of the
//! services that changed, in one transaction.
//!
//! Object names carry the service port (`namespace/name/protocol/port`),
//! so `nft list table inet ferrok` reads like the cluster.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::dataplane::{Change, Dataplane, DataplaneError};
use super::model::{Endpoint, ServicePort};
use crate::net::Ipv4Net;
use crate::network::nftables::{Part, TABLE};

const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// Every cluster IP: traffic to one on a port no service has is refused.
const CLUSTER_IPS: &str = "cluster-ips";
/// The packet mark that asks for masquerade on the way out.
const MASQ_MARK: &str = "0x4000";

/// The nftables objects that belong to one Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// Set name → declaration (the ClientIP affinity sets).
    sets: BTreeMap<String, String>,
    /// Chain name → rules.
    chains: BTreeMap<String, Vec<String>>,
    /// (map, key) → verdict; for a plain set, the verdict is empty.
    elements: BTreeMap<(&'static str, String), String>,
}

/// The table's static objects: maps, hooks, masquerade and reject. A TCP
/// connection to a service without endpoints is refused with a reset: the
/// kernel rate-limits ICMP errors per client (one a second), so with ICMP
/// alone a client's first attempts go unanswered (seen in tests/services.rs);
/// other protocols get ICMP port unreachable.
fn base() -> String {
    format!(
        "\tmap {SERVICE_IPS} {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n\
         \tmap {SERVICE_NODEPORTS} {{ type inet_proto . inet_service : verdict; }}\n\
         \tmap {NO_ENDPOINT_SERVICES} {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n\
         \tmap {NO_ENDPOINT_NODEPORTS} {{ type inet_proto . inet_service : verdict; }}\n\
         \tchain mark-for-masquerade {{ meta mark set meta mark | {MASQ_MARK}; }}\n\
         \tchain masquerading {{ meta mark & {MASQ_MARK} == 0 return; meta mark set meta mark ^ {MASQ_MARK}; masquerade fully-random; }}\n\
         \tchain services {{\n\
         \t\tip daddr . meta l4proto . th dport vmap @{SERVICE_IPS}\n\
         \t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @{SERVICE_NODEPORTS}\n\
         \t}}\n\
         \tchain nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; jump services; }}\n\
         \tchain nat-output {{ type nat hook output priority -100; policy accept; jump services; }}\n\
         \tchain nat-postrouting {{ type nat hook postrouting priority srcnat; policy accept; jump masquerading; }}\n\
         \tchain endpoints-check {{\n\
         \t\tip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}\n\
         \t\tfib daddr type local meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}\n\
         \t}}\n\
         \tset {CLUSTER_IPS} {{ type ipv4_addr; }}\n\
         \tchain cluster-ips-check {{ ip daddr @{CLUSTER_IPS} goto reject-chain; }}\n\
         \tchain filter-input {{ type filter hook input priority -110; policy accept; ct state new jump endpoints-check; }}\n\
         \tchain filter-forward {{ type filter hook forward priority -110; policy accept; ct state new jump endpoints-check; ct state new jump cluster-ips-check; }}\n\
         \tchain filter-output {{ type filter hook output priority -110; policy accept; ct state new jump endpoints-check; }}\n\
         \tchain filter-output-post-dnat {{ type filter hook output priority -90; policy accept; ct state new jump cluster-ips-check; }}\n\
         \tchain reject-chain {{ meta l4proto tcp reject with tcp reset; reject; }}\n"
    )
}

fn ip_key(ip: impl std::fmt::Display, p: &ServicePort, port: u16) -> String {
    format!("{ip} . {} . {port}", p.protocol.nft())
}

fn endpoint_name(p: &ServicePort, e: &Endpoint) -> String {
    format!("{}__{}/{}", p.id, e.ip, e.port)
}

/// Rules that pick one of `endpoints` (sticky per client with affinity).
fn balance(p: &ServicePort, endpoints: &[Endpoint]) -> Vec<String> {
    let mut rules = Vec::new();
    if p.affinity_timeout.is_some() {
        for e in endpoints {
            let n = endpoint_name(p, e);
            rules.push(format!("ip saddr @aff-{n} goto sep-{n}"));
        }
    }
    match endpoints {
        [] => rules.push("drop".to_string()),
        [e] => rules.push(format!("goto sep-{}", endpoint_name(p, e))),
        _ => {
            let arms: Vec<String> =
                endpoints.iter().enumerate().map(|(i, e)| format!("{i} : goto sep-{}", endpoint_name(p, e))).collect();
            rules.push(format!("numgen random mod {} vmap {{ {} }}", endpoints.len(), arms.join(", ")));
        }
    }
    rules
}

/// Adds one service port's objects to `out`.
pub fn render_port(p: &ServicePort, cluster_cidr: Ipv4Net, out: &mut Objects) {
    let id = &p.id;
    let internal = if p.internal_local { &p.local_endpoints } else { &p.cluster_endpoints };
    let mut uses_cluster = false;
    let mut uses_local = false;
    for ip in &p.cluster_ips {
        out.elements.insert((CLUSTER_IPS, ip.to_string()), String::new());
    }
    if internal.is_empty() {
        // Nothing to send to: refused, as upstream; a Local policy with
        // endpoints elsewhere only drops.
        let verdict = if p.cluster_endpoints.is_empty() { "goto reject-chain" } else { "drop" };
        for ip in &p.cluster_ips {
            out.elements.insert((NO_ENDPOINT_SERVICES, ip_key(ip, p, p.port)), verdict.to_string());
        }
    } else {
        let target = if p.internal_local { "svl" } else { "svc" };
        uses_local |= p.internal_local;
        uses_cluster |= !p.internal_local;
        out.chains.insert(
            format!("int-{id}"),
            vec![format!("ip saddr != {cluster_cidr} jump mark-for-masquerade"), format!("goto {target}-{id}")],
        );
        for ip in &p.cluster_ips {
            out.elements.insert((SERVICE_IPS, ip_key(ip, p, p.port)), format!("goto int-{id}"));
        }
    }
    if p.node_port.is_some() || !p.external_ips.is_empty() {
        let verdict = if p.cluster_endpoints.is_empty() {
            "goto reject-chain".to_string()
        } else {
            uses_cluster = true;
            let rules = if p.external_local {
                uses_local = true;
                vec![
                    // Pods and the node itself reach every endpoint; traffic
                    // from outside only this node's, with its source kept.
                    format!("ip saddr {cluster_cidr} goto svc-{id}"),
                    "fib saddr type local jump mark-for-masquerade".to_string(),
                    format!("fib saddr type local goto svc-{id}"),
                    format!("goto svl-{id}"),
                ]
            } else {
                vec!["jump mark-for-masquerade".to_string(), format!("goto svc-{id}")]
            };
            out.chains.insert(format!("ext-{id}"), rules);
            format!("goto ext-{id}")
        };
        let (ips_map, ports_map) = if p.cluster_endpoints.is_empty() {
            (NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS)
        } else {
            (SERVICE_IPS, SERVICE_NODEPORTS)
        };
        for ip in &p.external_ips {
            out.elements.insert((ips_map, ip_key(ip, p, p.port)), verdict.clone());
        }
        if let Some(np) = p.node_port {
            out.elements.insert((ports_map, format!("{} . {np}", p.protocol.nft())), verdict);
        }
    }
    let mut endpoints: Vec<Endpoint> = Vec::new();
    if uses_cluster {
        out.chains.insert(format!("svc-{id}"), balance(p, &p.cluster_endpoints));
        endpoints.extend(&p.cluster_endpoints);
    }
    if uses_local {
        out.chains.insert(format!("svl-{id}"), balance(p, &p.local_endpoints));
        endpoints.extend(p.local_endpoints.iter().filter(|e| !endpoints.contains(e)).collect::<Vec<_>>());
    }
    for e in &endpoints {
        let n = endpoint_name(p, e);
        let mut rules = vec![format!("ip saddr {} jump mark-for-masquerade", e.ip)];
        if let Some(timeout) = p.affinity_timeout {
            out.sets.insert(format!("aff-{n}"), format!("type ipv4_addr; flags dynamic,timeout; timeout {timeout}s;"));
            rules.push(format!("update @aff-{n} {{ ip saddr }}"));
        }
        rules.push(format!("meta l4proto {} dnat ip to {}:{}", p.protocol.nft(), e.ip, e.port));
        out.chains.insert(format!("sep-{n}"), rules);
    }
}

/// The objects of a whole Service.
pub fn render_service(ports: &[ServicePort], cluster_cidr: Ipv4Net) -> Objects {
    let mut out = Objects::default();
    for p in ports {
        render_port(p, cluster_cidr, &mut out);
    }
    out
}

/// The commands that turn `old` into `new`, in an order the kernel accepts
/// in one transaction: references go before what they point at is deleted,
/// and what is pointed at exists before the reference is added.
pub fn diff(old: &Objects, new: &Objects, text: &mut String) {
    let t = TABLE;
    let changed_chains: Vec<&String> = new
        .chains
        .iter()
        .filter(|(n, rules)| old.chains.get(*n).is_some_and(|o| o != *rules))
        .map(|(n, _)| n)
        .collect();
    let removed_chains: Vec<&String> = old.chains.keys().filter(|n| !new.chains.contains_key(*n)).collect();
    let changed_sets: Vec<&String> =
        new.sets.iter().filter(|(n, d)| old.sets.get(*n).is_some_and(|o| o != *d)).map(|(n, _)| n).collect();
    for name in changed_chains.iter().chain(&removed_chains) {
        let _ = writeln!(text, "flush chain inet {t} {name}");
    }
    for ((map, key), verdict) in &old.elements {
        if new.elements.get(&(*map, key.clone())) != Some(verdict) {
            let _ = writeln!(text, "delete element inet {t} {map} {{ {key} }}");
        }
    }
    for name in &removed_chains {
        let _ = writeln!(text, "delete chain inet {t} {name}");
    }
    for name in old.sets.keys().filter(|n| !new.sets.contains_key(*n)).chain(changed_sets.iter().copied()) {
        let _ = writeln!(text, "delete set inet {t} {name}");
    }
    for (name, decl) in &new.sets {
        if old.sets.get(name) != Some(decl) {
            let _ = writeln!(text, "add set inet {t} {name} {{ {decl} }}");
        }
    }
    for name in new.chains.keys().filter(|n| !old.chains.contains_key(*n)) {
        let _ = writeln!(text, "add chain inet {t} {name}");
    }
    for (name, rules) in &new.chains {
        if old.chains.get(name) != Some(rules) {
            for rule in rules {
                let _ = writeln!(text, "add rule inet {t} {name} {rule}");
            }
        }
    }
    for ((map, key), verdict) in &new.elements {
        if old.elements.get(&(*map, key.clone())) != Some(verdict) {
            let _ = writeln!(text, "add element inet {t} {map} {{ {} }}", element(key, verdict));
        }
    }
}

fn element(key: &str, verdict: &str) -> String {
    if verdict.is_empty() {
        key.to_string()
    } else {
        format!("{key} : {verdict}")
    }
}

/// The whole part: the static objects and every Service's, as one block.
pub fn render_full<'a>(services: impl Iterator<Item = &'a Objects>) -> String {
    let mut sets = String::new();
    let mut chains = String::new();
    let mut elements: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for o in services {
        for (name, decl) in &o.sets {
            let _ = writeln!(sets, "\tset {name} {{ {decl} }}");
        }
        for (name, rules) in &o.chains {
            let _ = writeln!(chains, "\tchain {name} {{\n\t\t{}\n\t}}", rules.join("\n\t\t"));
        }
        for ((map, key), verdict) in &o.elements {
            elements.entry(map).or_default().push(element(key, verdict));
        }
    }
    let mut text = format!("table inet {TABLE} {{\n{}{sets}{chains}}}\n", base());
    for (map, items) in elements {
        // Large maps in pieces, to keep each command of the script modest.
        for chunk in items.chunks(1000) {
            let _ = writeln!(text, "add element inet {TABLE} {map} {{ {} }}", chunk.join(", "));
        }
    }
    text
}

/// The service proxy's dataplane on nftables. It keeps nothing rendered:
/// the objects a Service had are rendered again from its old ports when it
/// changes (rendering is cheap; memory on a small device is not).
pub struct NftablesDataplane {
    part: Part,
    cluster_cidr: Ipv4Net,
}

impl NftablesDataplane {
    pub fn new(part: Part, cluster_cidr: Ipv4Net) -> NftablesDataplane {
        NftablesDataplane { part, cluster_cidr }
    }
}

#[async_trait::async_trait]
impl Dataplane for NftablesDataplane {
    async fn full(&mut self, services: &BTreeMap<String, Vec<ServicePort>>) -> Result<(), DataplaneError> {
        let rendered: Vec<Objects> = services.values().map(|ports| render_service(ports, self.cluster_cidr)).collect();
        let text = render_full(rendered.iter());
        drop(rendered);
        let started = std::time::Instant::now();
        let bytes = text.len();
        self.part.full(text).await?;
        tracing::info!(bytes, ms = started.elapsed().as_millis() as u64, "nftables: services loaded in full");
        Ok(())
    }

    async fn update(&mut self, changes: &[Change]) -> Result<(), DataplaneError> {
        let mut text = String::new();
        for change in changes {
            let old = render_service(&change.old, self.cluster_cidr);
            let new = render_service(&change.new, self.cluster_cidr);
            diff(&old, &new, &mut text);
        }
        if !text.is_empty() {
            let started = std::time::Instant::now();
            let bytes = text.len();
            self.part.update(text).await?;
            tracing::debug!(bytes, us = started.elapsed().as_micros() as u64, "nftables: services updated");
        }
        Ok(())
    }

    fn resync_requests(&self) -> tokio::sync::watch::Receiver<u64> {
        self.part.resync_requests()
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::Protocol;
    use super::*;
    use std::net::Ipv4Addr;

    fn cidr() -> Ipv4Net {
        crate::net::parse_pod_cidr("10.42.0.0/16").unwrap()
    }

    fn port(endpoints: &[&str]) -> ServicePort {
        let eps: Vec<Endpoint> = endpoints.iter().map(|ip| Endpoint { ip: ip.parse().unwrap(), port: 8080 }).collect();
        ServicePort {
            id: "shop/web/tcp/http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            cluster_ips: vec![Ipv4Addr::new(10, 43, 0, 5)],
            node_port: None,
            external_ips: vec![],
            affinity_timeout: None,
            external_local: false,
            internal_local: false,
            local_endpoints: eps.clone(),
            cluster_endpoints: eps,
        }
    }

    #[test]
    fn a_cluster_ip_goes_through_its_chains_to_the_endpoints() {
        let o = render_service(&[port(&["10.42.0.7", "10.42.0.8"])], cidr());
        assert_eq!(o.elements[&(SERVICE_IPS, "10.43.0.5 . tcp . 80".to_string())], "goto int-shop/web/tcp/http");
        assert_eq!(
            o.chains["svc-shop/web/tcp/http"],
            ["numgen random mod 2 vmap { 0 : goto sep-shop/web/tcp/http__10.42.0.7/8080, 1 : goto sep-shop/web/tcp/http__10.42.0.8/8080 }"]
        );
        assert_eq!(
            o.chains["sep-shop/web/tcp/http__10.42.0.7/8080"],
            ["ip saddr 10.42.0.7 jump mark-for-masquerade", "meta l4proto tcp dnat ip to 10.42.0.7:8080"]
        );
        assert_eq!(o.chains["int-shop/web/tcp/http"][0], "ip saddr != 10.42.0.0/16 jump mark-for-masquerade");
    }

    #[test]
    fn no_endpoints_is_a_reject_and_affinity_makes_sets() {
        let o = render_service(&[port(&[])], cidr());
        assert_eq!(o.elements[&(NO_ENDPOINT_SERVICES, "10.43.0.5 . tcp . 80".to_string())], "goto reject-chain");
        assert!(o.chains.is_empty());
        let mut p = port(&["10.42.0.7"]);
        p.affinity_timeout = Some(60);
        let o = render_service(&[p], cidr());
        assert_eq!(
            o.sets["aff-shop/web/tcp/http__10.42.0.7/8080"],
            "type ipv4_addr; flags dynamic,timeout; timeout 60s;"
        );
        assert_eq!(
            o.chains["svc-shop/web/tcp/http"][0],
            "ip saddr @aff-shop/web/tcp/http__10.42.0.7/8080 goto sep-shop/web/tcp/http__10.42.0.7/8080"
        );
    }

    #[test]
    fn external_traffic_policy_local_keeps_the_source_for_outside_clients() {
        let mut p = port(&["10.42.0.7", "10.42.1.7"]);
        p.local_endpoints = vec![Endpoint { ip: Ipv4Addr::new(10, 42, 0, 7), port: 8080 }];
        p.node_port = Some(30080);
        p.external_local = true;
        let o = render_service(&[p], cidr());
        assert_eq!(o.elements[&(SERVICE_NODEPORTS, "tcp . 30080".to_string())], "goto ext-shop/web/tcp/http");
        let ext = &o.chains["ext-shop/web/tcp/http"];
        assert_eq!(ext.last().unwrap(), "goto svl-shop/web/tcp/http");
        assert!(!ext.contains(&"jump mark-for-masquerade".to_string()));
        assert_eq!(o.chains["svl-shop/web/tcp/http"], ["goto sep-shop/web/tcp/http__10.42.0.7/8080"]);
    }

    #[test]
    fn an_update_touches_only_what_changed() {
        let old = render_service(&[port(&["10.42.0.7", "10.42.0.8"])], cidr());
        let new = render_service(&[port(&["10.42.0.7"])], cidr());
        let mut text = String::new();
        diff(&old, &new, &mut text);
        assert_eq!(
            text,
            "flush chain inet ferrok svc-shop/web/tcp/http\n\
             flush chain inet ferrok sep-shop/web/tcp/http__10.42.0.8/8080\n\
             delete chain inet ferrok sep-shop/web/tcp/http__10.42.0.8/8080\n\
             add rule inet ferrok svc-shop/web/tcp/http goto sep-shop/web/tcp/http__10.42.0.7/8080\n"
        );
        let mut text = String::new();
        diff(&new, &new, &mut text);
        assert!(text.is_empty());
    }
}
