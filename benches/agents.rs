//! Agents: how long `ferrok agent` takes from start to a Ready node (first
//! join, then a restart), the agent's resident memory at rest, and pod to
//! pod throughput and latency on one node, across nodes on one segment
//! and across the router (tests/common/cluster.rs), with the VXLAN
//! backend and with host-gw. Prints figures; it is not a pass/fail test.
//! Needs root and what `scripts/deps` installs.
//!
//! `cargo bench --bench agents [-- --mib 100 --pings 10]`

#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::time::{Duration, Instant};

use tcommon::cluster::Cluster;
use tcommon::node::{Node, BUSYBOX};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone()).unwrap_or_else(|| default.to_string())
}

/// Starts `agent` and times it to a Ready node.
fn time_to_ready(server: &Node, agent: &mut Node) -> Duration {
    let started = Instant::now();
    agent.spawn();
    loop {
        let ready = server.get(&["node", &agent.name], r#"{.status.conditions[?(@.type=="Ready")].status}"#);
        if ready == "True" {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{} not Ready\n{}", agent.name, agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pod on `node` serving a `mib` MiB file over HTTP on 8080.
fn serving_pod(server: &Node, node: &str, name: &str, mib: u32) {
    server.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{bench: agents}}}}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: \"{BUSYBOX}\", command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/small && dd if=/dev/zero of=/www/big bs=1M count={mib} 2>/dev/null && exec httpd -f -p 8080 -h /www\"]}}\n"
    ));
}

fn pod_ip(server: &Node, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = server.get(&["pod", name], "{.status.phase} {.status.podIP}");
        if let Some(ip) = out.strip_prefix("Running ").filter(|ip| !ip.is_empty()) {
            return ip.to_string();
        }
        assert!(Instant::now() < deadline, "{name} not running: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// From pod `from` (on `node`) to `ip`: MiB/s of a `mib` MiB GET, and the
/// average ping round trip in ms.
fn measure(node: &Node, from: &str, ip: &str, mib: u32, pings: u32) -> (f64, f64) {
    let exec = |script: &str| {
        let started = Instant::now();
        let (ok, out) = node.try_exec("default", from, "c", script);
        assert!(ok, "{script}: {out}");
        (started.elapsed(), out)
    };
    // Wait for the server's file, then take the exec overhead off the transfer.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !node.try_exec("default", from, "c", &format!("wget -q -O- http://{ip}:8080/small")).0 {
        assert!(Instant::now() < deadline, "{ip} does not serve");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (small, _) = exec(&format!("wget -q -O /dev/null http://{ip}:8080/small"));
    let (big, _) = exec(&format!("wget -q -O /dev/null http://{ip}:8080/big"));
    let secs = big.saturating_sub(small).as_secs_f64().max(1e-3);
    let (_, out) = exec(&format!("ping -c {pings} -i 0.2 {ip}"));
    // "round-trip min/avg/max = 0.061/0.083/0.120 ms"
    let avg = out
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    (f64::from(mib) / secs, avg)
}

fn network(backend: &str, routed: bool, mib: u32, pings: u32) {
    let flag = format!("--flannel-backend={backend}");
    let mut cluster = Cluster::start(&[&flag]);
    let mut a = cluster.lan_agent(&[]);
    let ready = time_to_ready(cluster.server(), &mut a);
    println!("agent start to Ready ({backend}, first join): {} ms", ready.as_millis());
    a.wait_ready(Duration::from_secs(30));
    let mut b = routed.then(|| cluster.routed_agent(&[]));
    if let Some(b) = b.as_mut() {
        let ready = time_to_ready(cluster.server(), b);
        println!("agent start to Ready ({backend}, behind the router, first join): {} ms", ready.as_millis());
        b.wait_ready(Duration::from_secs(30));
    }
    let server = cluster.server();
    serving_pod(server, &server.name, "client", mib);
    serving_pod(server, &server.name, "same-node", mib);
    serving_pod(server, &a.name, "on-segment", mib);
    if let Some(b) = &b {
        serving_pod(server, &b.name, "behind-router", mib);
    }
    let mut targets = vec![("one node", "same-node"), ("across the segment", "on-segment")];
    if b.is_some() {
        targets.push(("across the router", "behind-router"));
    }
    pod_ip(server, "client");
    for (what, pod) in targets {
        let ip = pod_ip(server, pod);
        let (mibs, rtt) = measure(server, "client", &ip, mib, pings);
        println!("pod to pod {what} ({backend}): {mibs:.0} MiB/s, ping avg {rtt:.3} ms");
    }
    // At rest: the agent's memory after the pods settle.
    std::thread::sleep(Duration::from_secs(20));
    if let Some(pid) = a.pid() {
        println!("agent resident memory at rest (2 pods): {:.1} MiB", tcommon::rss_mib(pid));
    }
    // A restart of a joined agent (its Node deleted first, so that Ready is new).
    a.stop(false);
    server.ok(&["delete", "node", &a.name]);
    let ready = time_to_ready(server, &mut a);
    println!("agent restart to Ready ({backend}): {} ms", ready.as_millis());
    cluster.agents.push(a);
    cluster.agents.extend(b);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mib: u32 = arg("--mib", "100").parse().expect("--mib");
    let pings: u32 = arg("--pings", "10").parse().expect("--pings");
    network("vxlan", true, mib, pings);
    network("host-gw", false, mib, pings);
}
