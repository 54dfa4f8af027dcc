//! The pod network across hosts (`--flannel-backend`), for real: `ferrok
//! server` in its own network namespace, a second Node made with kubectl
//! (its podCIDR, InternalIP and flannel annotations, pointing at the host
//! side of the namespace's link), and the kernel's routes, neighbours and
//! forwarding entries read inside the namespace as the Node comes, changes
//! and goes. No traffic is sent anywhere. Needs root, iproute2 and the
//! packages `scripts/deps` installs; nothing here skips itself.

mod common;

use common::node::Node;

const PEER: &str = "overlay-peer";
const PEER_CIDR: &str = "10.42.200.0/24";
const PEER_VTEP: &str = "10.42.200.0";

/// The fake peer Node: its podCIDR, and (VXLAN) the annotations a ferrok
/// or k3s node would publish, with a made-up MAC.
fn peer_node(node: &Node, mac: Option<&str>) {
    let annotations = match mac {
        Some(mac) => format!(
            r#"
  annotations:
    flannel.alpha.coreos.com/backend-type: vxlan
    flannel.alpha.coreos.com/backend-data: '{{"VNI":1,"VtepMAC":"{mac}"}}'
    flannel.alpha.coreos.com/public-ip: {ip}
    flannel.alpha.coreos.com/kube-subnet-manager: "true""#,
            ip = node.host_ip
        ),
        None => String::new(),
    };
    node.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {PEER}{annotations}\nspec:\n  podCIDR: {PEER_CIDR}\n  podCIDRs: [{PEER_CIDR}]\n"
    ));
    internal_ip(node, &node.host_ip);
}

fn internal_ip(node: &Node, ip: &str) {
    let status = format!(r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{ip}"}}]}}}}"#);
    node.ok(&["patch", "node", PEER, "--subresource=status", "--type=merge", "-p", &status]);
}

/// `ip …` (or `bridge …`) inside the node's namespace; its output.
fn host(node: &Node, args: &[&str]) -> String {
    let (ok, out) = node.on_host(args);
    assert!(ok, "{args:?}: {out}");
    out
}

fn peer_route(node: &Node) -> String {
    host(node, &["ip", "-4", "route", "show", PEER_CIDR]).trim().to_string()
}

fn neighbours(node: &Node) -> String {
    host(node, &["ip", "-4", "neigh", "show", "dev", "ferrok.1"])
}

fn fdb(node: &Node) -> String {
    host(node, &["bridge", "fdb", "show", "dev", "ferrok.1"])
}

fn link_json(node: &Node, dev: &str) -> serde_json::Value {
    let out = host(node, &["ip", "-j", "-d", "link", "show", "dev", dev]);
    serde_json::from_str::<Vec<serde_json::Value>>(&out).expect("ip -j")[0].clone()
}

fn annotation(node: &Node, name: &str, key: &str) -> String {
    node.get(&["node", name], &format!("{{.metadata.annotations.{}}}", key.replace('.', "\\.")))
}

#[test]
fn vxlan_entries_follow_the_peer_node() {
    let mut node = Node::start(&["--flannel-backend=vxlan"]);
    let ns_if = format!("fkn{}", node.netns.trim_start_matches("fk-"));

    // The VXLAN device: flannel's settings, the underlay's MTU less 50,
    // and the pods' CNI config with the same MTU.
    node.eventually("the VXLAN device", 30, || node.on_host(&["ip", "link", "show", "ferrok.1"]).0);
    let dev = link_json(&node, "ferrok.1");
    let underlay_mtu = link_json(&node, &ns_if)["mtu"].as_u64().expect("mtu");
    assert_eq!(dev["mtu"].as_u64(), Some(underlay_mtu - 50), "{dev}");
    let data = &dev["linkinfo"]["info_data"];
    assert_eq!((data["id"].as_u64(), data["port"].as_u64()), (Some(1), Some(8472)), "{dev}");
    assert_eq!(data["learning"].as_bool(), Some(false), "{dev}");
    assert_eq!(data["local"].as_str(), Some(node.ip.as_str()), "{dev}");
    let own_cidr = node.get(&["node", &node.name], "{.spec.podCIDR}");
    let vtep_addr = own_cidr.split('/').next().unwrap_or_default().to_string();
    let addrs = host(&node, &["ip", "-4", "addr", "show", "dev", "ferrok.1"]);
    assert!(addrs.contains(&format!("inet {vtep_addr}/32")), "{addrs}");
    let conflist = node.dir.path().join("agent/etc/cni/net.d/10-ferrok.conflist");
    let conf: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&conflist).expect("conflist")).unwrap();
    assert_eq!(conf["plugins"][0]["mtu"].as_u64(), Some(underlay_mtu - 50), "{conf}");

    // The node publishes its end with flannel's annotations.
    let mac = dev["address"].as_str().expect("mac").to_string();
    node.eventually("the node's flannel annotations", 30, || {
        annotation(&node, &node.name, "flannel.alpha.coreos.com/backend-type") == "vxlan"
    });
    let data: serde_json::Value =
        serde_json::from_str(&annotation(&node, &node.name, "flannel.alpha.coreos.com/backend-data")).unwrap();
    assert_eq!(data, serde_json::json!({"VNI": 1, "VtepMAC": mac}));
    assert_eq!(annotation(&node, &node.name, "flannel.alpha.coreos.com/public-ip"), node.ip);
    assert_eq!(annotation(&node, &node.name, "flannel.alpha.coreos.com/kube-subnet-manager"), "true");

    // A peer appears: route onlink through the device to its VTEP address,
    // its VTEP MAC for that address, and its public IP for that MAC.
    peer_node(&node, Some("02:00:0a:2a:c8:01"));
    node.eventually("the peer's route", 30, || {
        peer_route(&node).contains(&format!("via {PEER_VTEP} dev ferrok.1 onlink"))
    });
    node.eventually("the peer's neighbour", 10, || {
        neighbours(&node).contains(&format!("{PEER_VTEP} lladdr 02:00:0a:2a:c8:01 PERMANENT"))
    });
    node.eventually("the peer's forwarding entry", 10, || {
        fdb(&node).contains(&format!("02:00:0a:2a:c8:01 dst {} self permanent", node.host_ip))
    });

    // Its device is remade with another MAC: the entries follow.
    node.ok(&[
        "annotate",
        "node",
        PEER,
        "--overwrite",
        r#"flannel.alpha.coreos.com/backend-data={"VNI":1,"VtepMAC":"02:00:0a:2a:c8:02"}"#,
    ]);
    node.eventually("the peer's new MAC", 30, || {
        neighbours(&node).contains(&format!("{PEER_VTEP} lladdr 02:00:0a:2a:c8:02 PERMANENT"))
            && fdb(&node).contains("02:00:0a:2a:c8:02 dst")
            && !fdb(&node).contains("02:00:0a:2a:c8:01")
    });
    assert!(peer_route(&node).contains("dev ferrok.1 onlink"), "{}", peer_route(&node));

    // It goes: everything it had goes.
    node.ok(&["delete", "node", PEER]);
    node.eventually("the peer's entries removed", 30, || {
        peer_route(&node).is_empty() && !neighbours(&node).contains(PEER_VTEP) && !fdb(&node).contains("02:00:0a:2a")
    });

    // Entries no Node explains are removed at start; the device (and so the
    // MAC peers know) survives the restart.
    host(
        &node,
        &[
            "ip",
            "neigh",
            "replace",
            "10.42.201.0",
            "lladdr",
            "02:00:0a:2a:c9:01",
            "dev",
            "ferrok.1",
            "nud",
            "permanent",
        ],
    );
    host(
        &node,
        &[
            "bridge",
            "fdb",
            "replace",
            "02:00:0a:2a:c9:01",
            "dev",
            "ferrok.1",
            "dst",
            &node.host_ip,
            "self",
            "permanent",
        ],
    );
    host(&node, &["ip", "route", "replace", "10.42.201.0/24", "via", "10.42.201.0", "dev", "ferrok.1", "onlink"]);
    node.restart(false);
    node.eventually("stale entries removed", 30, || {
        host(&node, &["ip", "-4", "route", "show", "10.42.201.0/24"]).trim().is_empty()
            && !neighbours(&node).contains("10.42.201.0")
            && !fdb(&node).contains("02:00:0a:2a:c9:01")
    });
    assert_eq!(link_json(&node, "ferrok.1")["address"].as_str(), Some(mac.as_str()));
}

#[test]
fn host_gw_routes_through_the_peers_internal_ip() {
    let node = Node::start(&["--flannel-backend=host-gw"]);
    let ns_if = format!("fkn{}", node.netns.trim_start_matches("fk-"));
    node.eventually("the node's flannel annotations", 30, || {
        annotation(&node, &node.name, "flannel.alpha.coreos.com/backend-type") == "host-gw"
    });
    assert_eq!(annotation(&node, &node.name, "flannel.alpha.coreos.com/public-ip"), node.ip);
    assert!(!node.on_host(&["ip", "link", "show", "ferrok.1"]).0, "no VXLAN device with host-gw");
    let conflist = node.dir.path().join("agent/etc/cni/net.d/10-ferrok.conflist");
    let conf: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&conflist).expect("conflist")).unwrap();
    assert!(conf["plugins"][0].get("mtu").is_none(), "{conf}");

    peer_node(&node, None);
    node.eventually("the peer's route", 30, || {
        peer_route(&node).contains(&format!("via {} dev {ns_if}", node.host_ip))
    });

    // Its InternalIP changes (still on the link's subnet; nothing is sent
    // to it): the route follows.
    let (subnet, _) = node.host_ip.rsplit_once('.').expect("an IPv4 address");
    let other = format!("{subnet}.3");
    internal_ip(&node, &other);
    node.eventually("the route through the new address", 30, || {
        peer_route(&node).contains(&format!("via {other} dev {ns_if}"))
    });

    // An address on no connected subnet: no route, and a clear error.
    internal_ip(&node, "192.0.2.7");
    node.eventually("the route removed", 30, || peer_route(&node).is_empty());
    node.eventually("the error logged", 10, || node.log().contains("is not on a directly connected subnet"));

    internal_ip(&node, &node.host_ip);
    node.eventually("the route back", 30, || !peer_route(&node).is_empty());
    node.ok(&["delete", "node", PEER]);
    node.eventually("the route removed with the node", 30, || peer_route(&node).is_empty());
}
