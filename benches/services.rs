//! The service proxy at scale: how long a change to an EndpointSlice takes
//! to become live traffic, with 0, 1,000 and 10,000 other Services of three
//! endpoints each; the size and time of the nftables transactions; and
//! ferrok's resident memory at those sizes. Prints figures; it is not a
//! pass/fail test. Needs root and what `scripts/deps` installs.
//!
//! The probe is a NodePort Service whose EndpointSlice the benchmark
//! rewrites: an endpoint appears (an httpd pod), then goes. From outside
//! the node, a TCP connect to the node port succeeds once the endpoint is
//! programmed and is refused (TCP reset) once it is gone; the latency is
//! from the API write to the first connect that shows the change.
//!
//! `cargo bench --bench services [-- --runs N --sizes 0,1000,10000]`

#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tcommon::node::{Node, BUSYBOX};
use tcommon::rss_mib;

const PROBE_NODE_PORT: u16 = 30999;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone()).unwrap_or_else(|| default.to_string())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn client(node: &Node) -> kube::Client {
    let config = kube::config::Kubeconfig::read_from(node.kubeconfig()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await.expect("config");
    kube::Client::try_from(config).expect("client")
}

/// Creates services `from..to`, each with an EndpointSlice of three
/// endpoints (addresses in the cluster CIDR that no pod has: no traffic is
/// ever sent to them).
async fn create_services(client: &kube::Client, from: usize, to: usize) {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    futures_util::stream::iter(from..to)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                let name = format!("s{i}");
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"ports": [{"name": "http", "port": 80}]}
                }))
                .expect("service");
                services.create(&PostParams::default(), &svc).await.expect("create service");
                let ip = |k: usize| format!("10.42.{}.{}", 100 + (i * 3 + k) / 250 % 150, 1 + (i * 3 + k) % 250);
                let slice: EndpointSlice = serde_json::from_value(json!({
                    "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                    "endpoints": (0..3).map(|k| json!({"addresses": [ip(k)], "conditions": {"ready": true}})).collect::<Vec<_>>(),
                }))
                .expect("slice");
                slices.create(&PostParams::default(), &slice).await.expect("create slice");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Connects to the probe's node port until `open` says what is wanted.
fn wait_for(addr: SocketAddr, open: bool, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let ok = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
        if ok == open {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    None
}

async fn set_probe(slices: &Api<EndpointSlice>, backend: Option<&str>) -> Instant {
    let endpoints: Vec<serde_json::Value> =
        backend.into_iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    let patch = json!({"endpoints": endpoints});
    let t = Instant::now();
    slices.patch("probe-1", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch probe slice");
    t
}

/// The numbers in the node's log lines that carry `what`.
fn log_figures(node: &Node, what: &str, field: &str) -> Vec<u64> {
    node.log()
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split(&format!("{field}=")).nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::main]
async fn main() {
    let runs: usize = arg("--runs", "40").parse().expect("--runs");
    let sizes: Vec<usize> = arg("--sizes", "0,1000,10000").split(',').map(|s| s.parse().expect("--sizes")).collect();
    let mut node = Node::start(&[]);
    assert!(node.write_host_kubeconfig(), "host kubeconfig");
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: backend}}
spec:
  containers:
  - {{name: c, image: "{BUSYBOX}", command: ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"]}}
---
apiVersion: v1
kind: Service
metadata: {{name: probe}}
spec: {{type: NodePort, ports: [{{name: http, port: 80, nodePort: {PROBE_NODE_PORT}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: probe-1, labels: {{kubernetes.io/service-name: probe}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: []
"#
    ));
    node.eventually("the backend running", 90, || node.get(&["pod", "backend"], "{.status.phase}") == "Running");
    let backend = node.get(&["pod", "backend"], "{.status.podIP}");
    let client = client(&node).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let addr: SocketAddr = format!("{}:{PROBE_NODE_PORT}", node.ip).parse().expect("probe address");
    println!(
        "service proxy: {runs} endpoint changes per size, probed by TCP connects to a node port from outside the node"
    );
    println!(
        "{:>8}  {:>13}  {:>13}  {:>15}  {:>15}  {:>13}  {:>14}",
        "others", "add p50 ms", "add p99 ms", "remove p50 ms", "remove p99 ms", "update bytes", "ferrok RSS MiB"
    );
    let mut existing = 0;
    for &size in &sizes {
        if size > existing {
            let t = Instant::now();
            create_services(&client, existing, size).await;
            eprintln!("created {} services with their slices in {:.1} s", size - existing, t.elapsed().as_secs_f64());
            existing = size;
        }
        // Warm up, and let the proxy catch up with the creations.
        set_probe(&slices, Some(&backend)).await;
        wait_for(addr, true, Duration::from_secs(120)).expect("the probe never opened");
        let updates_before = log_figures(&node, "nftables: services updated", "bytes").len();
        let (mut add, mut remove) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = set_probe(&slices, None).await;
            wait_for(addr, false, Duration::from_secs(30)).expect("the probe never closed");
            remove.push(t.elapsed());
            let t = set_probe(&slices, Some(&backend)).await;
            wait_for(addr, true, Duration::from_secs(30)).expect("the probe never opened");
            add.push(t.elapsed());
        }
        add.sort();
        remove.sort();
        let bytes = log_figures(&node, "nftables: services updated", "bytes");
        let bytes = &bytes[updates_before.min(bytes.len())..];
        let avg_bytes = bytes.iter().sum::<u64>() as f64 / bytes.len().max(1) as f64;
        let rss = node.pid().map(rss_mib).unwrap_or(0.0);
        println!(
            "{:>8}  {:>13.1}  {:>13.1}  {:>15.1}  {:>15.1}  {:>13.0}  {:>14.1}",
            size,
            ms(percentile(&add, 0.5)),
            ms(percentile(&add, 0.99)),
            ms(percentile(&remove, 0.5)),
            ms(percentile(&remove, 0.99)),
            avg_bytes,
            rss
        );
    }
    // The whole table in one transaction, as at every start. The rules stay
    // while ferrok is down, so the probe says nothing here: wait for the
    // restarted server's own full load in its log.
    let fulls_before = log_figures(&node, "nftables: services loaded in full", "bytes").len();
    node.stop(false);
    node.launch();
    let deadline = Instant::now() + Duration::from_secs(300);
    while log_figures(&node, "nftables: services loaded in full", "bytes").len() <= fulls_before {
        assert!(Instant::now() < deadline, "no full load after the restart");
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for(addr, true, Duration::from_secs(120)).expect("the probe after a restart");
    let ms_full = log_figures(&node, "nftables: services loaded in full", "ms");
    let bytes_full = log_figures(&node, "nftables: services loaded in full", "bytes");
    if let (Some(ms), Some(bytes)) = (ms_full.last(), bytes_full.last()) {
        println!(
            "full load at start with {} other services: one nft transaction of {:.0} KiB in {ms} ms",
            existing,
            *bytes as f64 / 1024.0
        );
    }
}
