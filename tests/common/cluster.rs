//! Several nodes on one machine: a `ferrok server` and `ferrok agent`s,
//! each in a network namespace of its own, wired as a small site network.
//!
//! ```text
//!  test host ──veth── router ns ──bridge "lan" (10.210.R.0/24)── server (.2), agent A (.3)
//!  10.201.R.1         10.201.R.2 └─veth (10.211.R.0/24)─────────── agent B (.2), another subnet
//! ```
//! The router forwards between the two subnets, so agent B reaches the
//! others only through it (no shared L2: VXLAN has to carry its pods'
//! traffic), while the server and agent A share one segment (host-gw works
//! between them). The test host reaches every node through the router.

use std::process::Command;

use super::node::{alloc_netns, netns_exec, Node, Role};

pub struct Cluster {
    /// The router's namespace.
    pub router: String,
    r: u8,
    next_lan: u8,
    /// The servers, the first one the agents join through.
    pub servers: Vec<Node>,
    pub agents: Vec<Node>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A veth pair from `from_ns` (named `from_if`) into `to_ns` (named `to_if`).
fn veth(from_ns: &str, from_if: &str, to_ns: &str, to_if: &str) {
    netns_exec(from_ns, &["ip", "link", "add", from_if, "type", "veth", "peer", "name", to_if]);
    netns_exec(from_ns, &["ip", "link", "set", to_if, "netns", to_ns]);
    netns_exec(from_ns, &["ip", "link", "set", from_if, "up"]);
    netns_exec(to_ns, &["ip", "link", "set", to_if, "up"]);
}

impl Cluster {
    /// The router, the server (with `server_extra` flags) Ready, no agents yet.
    pub fn start(server_extra: &[&str]) -> Cluster {
        Cluster::start_with(server_extra, &[])
    }

    /// `start`, with extra environment for the server.
    pub fn start_with(server_extra: &[&str], server_env: &[(&str, &str)]) -> Cluster {
        let mut cluster = Cluster::router();
        cluster.add_server(server_extra, server_env);
        cluster
    }

    /// The router and its networks, no node yet.
    pub fn router() -> Cluster {
        let (router, r) = alloc_netns();
        // The test host's link to the router.
        let host_if = format!("fkh{r}");
        let _ = Command::new("ip").args(["link", "del", &host_if]).output();
        // The peer is born in the router's namespace: a name like "uplink"
        // in the host's would collide with another test's router.
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", "uplink", "netns", &router]);
        ip(&["addr", "add", &format!("10.201.{r}.1/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        netns_exec(&router, &["ip", "addr", "add", &format!("10.201.{r}.2/24"), "dev", "uplink"]);
        netns_exec(&router, &["ip", "link", "set", "uplink", "up"]);
        netns_exec(&router, &["ip", "link", "add", "lan", "type", "bridge"]);
        netns_exec(&router, &["ip", "addr", "add", &format!("10.210.{r}.1/24"), "dev", "lan"]);
        netns_exec(&router, &["ip", "link", "set", "lan", "up"]);
        netns_exec(&router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        netns_exec(&router, &["ip", "route", "add", "default", "via", &format!("10.201.{r}.1")]);
        for net in [format!("10.210.{r}.0/24"), format!("10.211.{r}.0/24")] {
            ip(&["route", "replace", &net, "via", &format!("10.201.{r}.2")]);
        }
        Cluster { router, r, next_lan: 2, servers: Vec::new(), agents: Vec::new() }
    }

    /// The test host's address as the nodes reach it (through the router).
    pub fn host_ip(&self) -> String {
        format!("10.201.{}.1", self.r)
    }

    /// The first server.
    pub fn server(&self) -> &Node {
        &self.servers[0]
    }

    /// Another server on the segment, started and Ready.
    pub fn add_server(&mut self, extra: &[&str], env: &[(&str, &str)]) -> &mut Node {
        let host = self.next_lan;
        self.next_lan += 1;
        let mut server = lan_node(&self.router, self.r, host, Role::Server, extra);
        server.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        server.launch();
        self.servers.push(server);
        self.servers.last_mut().expect("just pushed")
    }

    /// A node on a subnet of its own behind the router.
    fn routed_node(&mut self, role: Role, extra: &[&str]) -> Node {
        let (netns, n) = alloc_netns();
        let r = self.r;
        let port = format!("sub{n}");
        veth(&self.router, &port, &netns, "eth0");
        netns_exec(&self.router, &["ip", "addr", "add", &format!("10.211.{r}.1/24"), "dev", &port]);
        netns_exec(&netns, &["ip", "addr", "add", &format!("10.211.{r}.2/24"), "dev", "eth0"]);
        netns_exec(&netns, &["ip", "route", "add", "default", "via", &format!("10.211.{r}.1")]);
        Node::in_netns(role, netns, n, &format!("10.211.{r}.2"), &format!("10.211.{r}.1"), extra)
    }

    fn agent_role(&self) -> Role {
        let server = self.server();
        Role::Agent {
            server: format!("https://{}:{}", server.ip, server.port),
            token_file: server.dir.path().join("server").join("token"),
            admin_kubeconfig: server.kubeconfig(),
        }
    }

    /// An agent on the server's segment, not started.
    pub fn lan_agent(&mut self, extra: &[&str]) -> Node {
        let host = self.next_lan;
        self.next_lan += 1;
        lan_node(&self.router, self.r, host, self.agent_role(), extra)
    }

    /// An agent on another subnet, behind the router, not started (one per cluster).
    pub fn routed_agent(&mut self, extra: &[&str]) -> Node {
        let role = self.agent_role();
        self.routed_node(role, extra)
    }
}

/// A node on the router's bridge at 10.210.R.<host>.
fn lan_node(router: &str, r: u8, host: u8, role: Role, extra: &[&str]) -> Node {
    let (netns, n) = alloc_netns();
    let addr = format!("10.210.{r}.{host}");
    let port = format!("lan{n}");
    veth(router, &port, &netns, "eth0");
    netns_exec(router, &["ip", "link", "set", &port, "master", "lan"]);
    netns_exec(&netns, &["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
    netns_exec(&netns, &["ip", "route", "add", "default", "via", &format!("10.210.{r}.1")]);
    Node::in_netns(role, netns, n, &addr, &format!("10.210.{r}.1"), extra)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Agents first (their pods), then the servers, then the router.
        self.agents.clear();
        self.servers.clear();
        // The host's end of the uplink before the namespace (see Node's teardown).
        let _ = Command::new("ip").args(["link", "del", &format!("fkh{}", self.r)]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.router]).output();
    }
}
