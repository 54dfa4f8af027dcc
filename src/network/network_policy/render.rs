//! The plan as nftables objects of ferrok's table (all named `np-…`), and
//! the two texts the table writer takes: a full declaration, and the
//! commands that turn one ruleset into another (set elements when pods
//! change; chains flushed and refilled only when policies change).
//!
//! The chains, per hook:
//! - `np-ingress` (forward): traffic to this node's pods isolated for
//!   ingress goes through `np-ingress-policies`, which jumps to each
//!   policy's chain for the pods it selects (`np-i-<id>`); an allowing
//!   match accepts (which ends this base chain only), the end drops.
//! - `np-egress` (forward) and `np-egress-host` (input: pods to the node
//!   itself, where the cluster DNS answers): the same for traffic from this
//!   node's pods isolated for egress, through `np-egress-policies` and
//!   `np-e-<id>`.
//!
//! Replies of allowed connections pass (`ct state established,related`).
//! Traffic from the node to its pods (output hook) is never filtered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::Ipv4Addr;

use super::plan::{Match, PeerMatch, Plan, PolicyRules, PortMatch, SetContent};
use crate::network::nftables::TABLE;

pub const INGRESS_ISOLATED: &str = "np-ingress-isolated";
pub const EGRESS_ISOLATED: &str = "np-egress-isolated";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    pub kind: &'static str,
    pub elements: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    /// Chains are declared in ascending level (jump targets first).
    pub level: u8,
    /// `type filter hook … ;` for base chains.
    pub base: Option<String>,
    pub rules: Vec<String>,
}

/// This part's objects in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub sets: BTreeMap<String, NftSet>,
    pub chains: BTreeMap<String, NftChain>,
}

const ADDR: &str = "ipv4_addr";
const ADDR_PORT: &str = "ipv4_addr . inet_proto . inet_service";

fn addresses(ips: &BTreeSet<Ipv4Addr>) -> BTreeSet<String> {
    ips.iter().map(Ipv4Addr::to_string).collect()
}

fn cidr_list(cidrs: &[crate::net::Ipv4Net]) -> String {
    cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The nft expression of a match; `peer_field` is `saddr` (ingress) or
/// `daddr` (egress). Named ports are always the destination's.
fn match_text(m: &Match, peer_field: &str) -> String {
    let mut parts = Vec::new();
    match &m.peer {
        PeerMatch::Any => {}
        PeerMatch::Set(s) => parts.push(format!("ip {peer_field} @{s}")),
        PeerMatch::Block { cidr, except } => {
            parts.push(format!("ip {peer_field} {cidr}"));
            if !except.is_empty() {
                parts.push(format!("ip {peer_field} != {{ {} }}", cidr_list(except)));
            }
        }
    }
    match &m.port {
        PortMatch::Any => {}
        PortMatch::Protocol(p) => parts.push(format!("meta l4proto {}", p.nft())),
        PortMatch::Range(p, a, b) if a == b => parts.push(format!("meta l4proto {} th dport {a}", p.nft())),
        PortMatch::Range(p, a, b) => parts.push(format!("meta l4proto {} th dport {a}-{b}", p.nft())),
        PortMatch::Named(s) => parts.push(format!("ip daddr . meta l4proto . th dport @{s}")),
    }
    parts.push("accept".into());
    parts.join(" ")
}

fn policy_chains(
    rs: &mut Ruleset,
    policies: &[PolicyRules],
    prefix: &str,
    dispatch: &str,
    pod_field: &str,
    peer_field: &str,
) {
    let mut jumps = Vec::new();
    for p in policies {
        let chain = format!("{prefix}{}", p.id);
        let rules = p.matches.iter().map(|m| match_text(m, peer_field)).collect();
        rs.chains.insert(chain.clone(), NftChain { level: 0, base: None, rules });
        jumps.push(format!("ip {pod_field} @{} jump {chain}", p.target));
    }
    if let Some(d) = rs.chains.get_mut(dispatch) {
        d.rules.extend(jumps);
        d.rules.push("drop".into());
    }
}

fn base(hook: &str) -> Option<String> {
    Some(format!("type filter hook {hook} priority filter; policy accept;"))
}

/// The objects for `plan`. `cluster_dns` are the cluster DNS Service
/// addresses: pods isolated for egress still reach them on port 53.
pub fn ruleset(plan: &Plan, cluster_dns: &[Ipv4Addr]) -> Ruleset {
    let mut rs = Ruleset::default();
    for (name, content) in &plan.sets {
        let set = match content {
            SetContent::Addresses(a) => NftSet { kind: ADDR, elements: addresses(a) },
            SetContent::AddressPorts(e) => NftSet {
                kind: ADDR_PORT,
                elements: e.iter().map(|(ip, p, port)| format!("{ip} . {} . {port}", p.nft())).collect(),
            },
        };
        rs.sets.insert(name.clone(), set);
    }
    rs.sets.insert(INGRESS_ISOLATED.into(), NftSet { kind: ADDR, elements: addresses(&plan.ingress_isolated) });
    rs.sets.insert(EGRESS_ISOLATED.into(), NftSet { kind: ADDR, elements: addresses(&plan.egress_isolated) });

    let mut egress_head = Vec::new();
    if !cluster_dns.is_empty() {
        let dns = cluster_dns.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>().join(", ");
        // The cluster DNS is part of the node and has no pod a policy could
        // select; it stays reachable (see the module's documentation).
        egress_head.push(format!("ct original ip daddr {{ {dns} }} meta l4proto {{ tcp, udp }} th dport 53 accept"));
    }
    let regular = |rules| NftChain { level: 1, base: None, rules };
    rs.chains.insert("np-ingress-policies".into(), regular(Vec::new()));
    rs.chains.insert("np-egress-policies".into(), regular(egress_head));
    policy_chains(&mut rs, &plan.ingress, "np-i-", "np-ingress-policies", "daddr", "saddr");
    policy_chains(&mut rs, &plan.egress, "np-e-", "np-egress-policies", "saddr", "daddr");

    let established = "ct state established,related accept".to_string();
    let hook = |hook: &str, field: &str, set: &str, to: &str| NftChain {
        level: 2,
        base: base(hook),
        rules: vec![established.clone(), format!("ip {field} @{set} jump {to}")],
    };
    rs.chains.insert("np-ingress".into(), hook("forward", "daddr", INGRESS_ISOLATED, "np-ingress-policies"));
    rs.chains.insert("np-egress".into(), hook("forward", "saddr", EGRESS_ISOLATED, "np-egress-policies"));
    rs.chains.insert("np-egress-host".into(), hook("input", "saddr", EGRESS_ISOLATED, "np-egress-policies"));
    rs
}

fn elements(set: &BTreeSet<String>) -> String {
    set.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn chains_by_level(rs: &Ruleset) -> Vec<(&String, &NftChain)> {
    let mut chains: Vec<_> = rs.chains.iter().collect();
    chains.sort_by_key(|(name, c)| (c.level, name.as_str()));
    chains
}

/// Declares every object of the ruleset (a `table inet ferrok { … }` block).
pub fn full(rs: &Ruleset) -> String {
    let mut out = format!("table inet {TABLE} {{\n");
    for (name, set) in &rs.sets {
        let _ = write!(out, "\tset {name} {{\n\t\ttype {};\n", set.kind);
        if !set.elements.is_empty() {
            let _ = writeln!(out, "\t\telements = {{ {} }}", elements(&set.elements));
        }
        out.push_str("\t}\n");
    }
    for (name, chain) in chains_by_level(rs) {
        let _ = writeln!(out, "\tchain {name} {{");
        if let Some(b) = &chain.base {
            let _ = writeln!(out, "\t\t{b}");
        }
        for r in &chain.rules {
            let _ = writeln!(out, "\t\t{r}");
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
    out
}

/// The commands that turn `old` into `new`; empty when they are the same.
pub fn diff(old: &Ruleset, new: &Ruleset) -> String {
    let mut out = String::new();
    let t = format!("inet {TABLE}");
    for (name, set) in &new.sets {
        match old.sets.get(name) {
            None => {
                let _ = writeln!(out, "add set {t} {name} {{ type {}; }}", set.kind);
                if !set.elements.is_empty() {
                    let _ = writeln!(out, "add element {t} {name} {{ {} }}", elements(&set.elements));
                }
            }
            Some(before) => {
                let gone: BTreeSet<String> = before.elements.difference(&set.elements).cloned().collect();
                let came: BTreeSet<String> = set.elements.difference(&before.elements).cloned().collect();
                if !gone.is_empty() {
                    let _ = writeln!(out, "delete element {t} {name} {{ {} }}", elements(&gone));
                }
                if !came.is_empty() {
                    let _ = writeln!(out, "add element {t} {name} {{ {} }}", elements(&came));
                }
            }
        }
    }
    for (name, chain) in chains_by_level(new) {
        match old.chains.get(name) {
            None => {
                match &chain.base {
                    Some(b) => {
                        let _ = writeln!(out, "add chain {t} {name} {{ {b} }}");
                    }
                    None => {
                        let _ = writeln!(out, "add chain {t} {name}");
                    }
                }
                for r in &chain.rules {
                    let _ = writeln!(out, "add rule {t} {name} {r}");
                }
            }
            Some(before) if before.rules != chain.rules => {
                let _ = writeln!(out, "flush chain {t} {name}");
                for r in &chain.rules {
                    let _ = writeln!(out, "add rule {t} {name} {r}");
                }
            }
            Some(_) => {}
        }
    }
    // What is gone goes last, once nothing refers to it any more.
    for (name, _) in chains_by_level(old).into_iter().rev() {
        if !new.chains.contains_key(name) {
            let _ = writeln!(out, "flush chain {t} {name}\ndelete chain {t} {name}");
        }
    }
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            let _ = writeln!(out, "delete set {t} {name}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::Protocol;
    use super::*;

    fn cidr(s: &str) -> crate::net::Ipv4Net {
        crate::net::parse_v4(s, 0..=32).unwrap()
    }

    fn plan_with(matches: Vec<Match>) -> Plan {
        let mut plan = Plan::default();
        plan.sets.insert("np-t".into(), SetContent::Addresses([Ipv4Addr::new(10, 42, 0, 5)].into()));
        plan.sets.insert("np-p".into(), SetContent::Addresses(BTreeSet::new()));
        plan.sets.insert(
            "np-n".into(),
            SetContent::AddressPorts([(Ipv4Addr::new(10, 42, 0, 5), Protocol::Tcp, 8080)].into()),
        );
        plan.ingress.push(PolicyRules { id: "abc".into(), target: "np-t".into(), matches });
        plan.ingress_isolated.insert(Ipv4Addr::new(10, 42, 0, 5));
        plan
    }

    #[test]
    fn matches_render_as_nft_expressions() {
        let m = |peer, port| Match { peer, port };
        let block =
            PeerMatch::Block { cidr: cidr("10.0.0.0/8"), except: vec![cidr("10.1.0.0/16"), cidr("10.2.0.0/16")] };
        assert_eq!(match_text(&m(PeerMatch::Any, PortMatch::Any), "saddr"), "accept");
        assert_eq!(
            match_text(&m(PeerMatch::Set("np-p".into()), PortMatch::Range(Protocol::Udp, 53, 53)), "saddr"),
            "ip saddr @np-p meta l4proto udp th dport 53 accept"
        );
        assert_eq!(
            match_text(&m(block, PortMatch::Range(Protocol::Tcp, 8000, 8100)), "daddr"),
            "ip daddr 10.0.0.0/8 ip daddr != { 10.1.0.0/16, 10.2.0.0/16 } meta l4proto tcp th dport 8000-8100 accept"
        );
        assert_eq!(
            match_text(&m(PeerMatch::Any, PortMatch::Named("np-n".into())), "saddr"),
            "ip daddr . meta l4proto . th dport @np-n accept"
        );
        assert_eq!(
            match_text(&m(PeerMatch::Any, PortMatch::Protocol(Protocol::Sctp)), "saddr"),
            "meta l4proto sctp accept"
        );
    }

    #[test]
    fn full_declares_sets_before_the_chains_that_use_them() {
        let rs = ruleset(
            &plan_with(vec![Match { peer: PeerMatch::Set("np-p".into()), port: PortMatch::Any }]),
            &[Ipv4Addr::new(10, 43, 0, 10)],
        );
        let text = full(&rs);
        assert!(text.starts_with("table inet ferrok {\n"));
        let pos = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} missing in\n{text}"));
        assert!(pos("set np-t {") < pos("chain np-i-abc {"));
        assert!(pos("chain np-i-abc {") < pos("chain np-ingress-policies {"));
        assert!(pos("chain np-ingress-policies {") < pos("chain np-ingress {"));
        assert!(text.contains("elements = { 10.42.0.5 . tcp . 8080 }"));
        assert!(text.contains("ip daddr @np-t jump np-i-abc\n\t\tdrop\n"));
        assert!(text.contains("type filter hook input priority filter; policy accept;"));
        assert!(text.contains("ct original ip daddr { 10.43.0.10 } meta l4proto { tcp, udp } th dport 53 accept"));
        for name in rs.sets.keys().chain(rs.chains.keys()) {
            assert!(name.starts_with("np-"), "{name} is not in this part's namespace");
        }
    }

    #[test]
    fn a_pod_change_is_only_set_elements() {
        let before = ruleset(&plan_with(vec![]), &[]);
        let mut plan = plan_with(vec![]);
        plan.sets.insert("np-t".into(), SetContent::Addresses([Ipv4Addr::new(10, 42, 0, 6)].into()));
        plan.ingress_isolated = [Ipv4Addr::new(10, 42, 0, 6)].into();
        let after = ruleset(&plan, &[]);
        let d = diff(&before, &after);
        assert_eq!(
            d,
            "delete element inet ferrok np-ingress-isolated { 10.42.0.5 }\n\
             add element inet ferrok np-ingress-isolated { 10.42.0.6 }\n\
             delete element inet ferrok np-t { 10.42.0.5 }\n\
             add element inet ferrok np-t { 10.42.0.6 }\n"
        );
        assert_eq!(diff(&after, &after), "");
    }

    #[test]
    fn a_policy_change_refills_chains_and_removes_what_is_gone() {
        let before = ruleset(&plan_with(vec![]), &[]);
        let after = ruleset(&Plan::default(), &[]);
        let d = diff(&before, &after);
        assert!(
            d.contains("flush chain inet ferrok np-ingress-policies\nadd rule inet ferrok np-ingress-policies drop\n")
        );
        let flush = d.find("flush chain inet ferrok np-ingress-policies").unwrap();
        let delete_chain = d.find("delete chain inet ferrok np-i-abc").unwrap();
        let delete_set = d.find("delete set inet ferrok np-t").unwrap();
        assert!(flush < delete_chain && delete_chain < delete_set, "{d}");
        let back = diff(&after, &before);
        assert!(
            back.contains("add set inet ferrok np-t { type ipv4_addr; }\nadd element inet ferrok np-t { 10.42.0.5 }\n")
        );
        assert!(back.find("add chain inet ferrok np-i-abc").unwrap() < back.find("jump np-i-abc").unwrap());
    }
}
