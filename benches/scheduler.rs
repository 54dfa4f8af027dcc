//! Scheduler benchmark in the manner of upstream's scheduler_perf
//! SchedulingBasic: 1,000 Node objects, then 10,000 pods (100m CPU, 500Mi
//! each) created by 16 clients; prints how fast they are bound (overall and
//! in the steady middle), then the time from creating a 100-replica
//! Deployment to all its pods bound, and the server's resident memory.
//! Prints figures; it is not a pass/fail test.
//!
//! `cargo bench --bench scheduler [-- --nodes N --pods N]`

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::client;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use tokio::sync::Mutex;

async fn start() -> (common::Server, kube::Client) {
    let (server, client, _) = common::start_with(&[]).await;
    (server, client)
}

fn rss_mib(pid: u32) -> (f64, f64) {
    let (rss, hwm) = common::rss_kib(pid);
    (rss as f64 / 1024.0, hwm as f64 / 1024.0)
}

fn node(i: usize) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("node-{i}"), "labels": {
            "kubernetes.io/hostname": format!("node-{i}"),
            "topology.kubernetes.io/zone": format!("zone-{}", i % 3)
        }},
        "status": {
            "capacity": {"cpu": "4", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    }))
    .expect("node")
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("pod-{i}"), "labels": {"app": "basic"}},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}}}]}
    }))
    .expect("pod")
}

/// Runs `count` creations over `clients` connections.
async fn create_all<F, Fut>(kubeconfig: &std::path::Path, clients: usize, count: usize, op: F) -> Duration
where
    F: Fn(kube::Client, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let kc = client(kubeconfig).await.expect("client");
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while i < count {
                if let Err(e) = op(kc.clone(), i).await {
                    eprintln!("create {i}: {e}");
                }
                i += clients;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    started.elapsed()
}

/// Watches pods in `namespace` and records when each first has a node.
fn track_bindings(c: kube::Client, namespace: &str) -> Arc<Mutex<Vec<Instant>>> {
    let bound = Arc::new(Mutex::new(Vec::new()));
    let api: Api<Pod> = Api::namespaced(c, namespace);
    let out = bound.clone();
    tokio::spawn(async move {
        let mut seen = HashSet::new();
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let pods = match ev {
                Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for p in pods {
                let has_node = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                if has_node && seen.insert(p.metadata.uid.clone().unwrap_or_default()) {
                    out.lock().await.push(Instant::now());
                }
            }
        }
    });
    bound
}

async fn wait_bound(bound: &Arc<Mutex<Vec<Instant>>>, want: usize, limit: Duration) -> bool {
    let started = Instant::now();
    while bound.lock().await.len() < want {
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let nodes = arg("--nodes", 1000);
    let pods = arg("--pods", 10_000);
    let (server, c) = start().await;
    let kubeconfig = server.dir.path().join("kubeconfig.yaml");
    let pid = server.child.id();

    let took = create_all(&kubeconfig, 16, nodes, |c, i| async move {
        Api::<Node>::all(c).create(&PostParams::default(), &node(i)).await.map(|_| ())
    })
    .await;
    println!("{nodes} nodes created in {:.2} s", took.as_secs_f64());

    let bound = track_bindings(c.clone(), "default");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (server_before, bench_before) = (common::cpu_ticks(pid), common::cpu_ticks(std::process::id()));
    let took = create_all(&kubeconfig, 16, pods, |c, i| async move {
        Api::<Pod>::namespaced(c, "default").create(&PostParams::default(), &pod(i)).await.map(|_| ())
    })
    .await;
    println!("{pods} pods created in {:.2} s ({:.0}/s)", took.as_secs_f64(), pods as f64 / took.as_secs_f64());
    if !wait_bound(&bound, pods, Duration::from_secs(300)).await {
        println!("only {} of {pods} pods bound within 300 s", bound.lock().await.len());
        return;
    }
    let (server_used, bench_used) =
        (common::cpu_ticks(pid) - server_before, common::cpu_ticks(std::process::id()) - bench_before);
    let times = bound.lock().await.clone();
    let total = times.last().map(|t| t.duration_since(started)).unwrap_or_default();
    println!(
        "SchedulingBasic: {pods} pods on {nodes} nodes all bound {:.2} s after the first create: {:.0} pods/s",
        total.as_secs_f64(),
        pods as f64 / total.as_secs_f64()
    );
    // Steady state: the middle 80% of bindings, as scheduler_perf's
    // throughput collector ignores the ramp-up and tail.
    let (lo, hi) = (times.len() / 10, times.len() * 9 / 10);
    if hi > lo {
        let span = times[hi].duration_since(times[lo]).as_secs_f64();
        println!("  steady (10th..90th percentile of bindings): {:.0} pods/s", (hi - lo) as f64 / span);
    }
    // CPU per pod moves far less than pods/s on a shared machine: clock
    // ticks are 10 ms of one core.
    println!(
        "  CPU per pod, first create to last binding: server {:.0} µs, this bench's clients {:.0} µs",
        server_used as f64 * 10_000.0 / pods as f64,
        bench_used as f64 * 10_000.0 / pods as f64
    );
    let (rss, peak) = rss_mib(pid);
    println!("  server RSS {rss:.1} MiB (peak {peak:.1} MiB) holding {nodes} nodes and {pods} pods");
    // Heap and stacks, against the executable's mapped code and data.
    let mib = |name: &str| common::status_kib(pid, name) as f64 / 1024.0;
    println!("    of which anonymous {:.1} MiB, file-backed {:.1} MiB", mib("RssAnon:"), mib("RssFile:"));
    // The same cluster at rest, in three windows from the last binding on
    // (its nodes send no heartbeats, so this stays within their 40 s grace).
    for window in 0..3 {
        let before = common::cpu_ticks(pid);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let used = common::cpu_ticks(pid) - before;
        let from = window * 5;
        println!("  idle CPU {from}..{} s after: {:.2} % of one core", from + 5, used as f64 / 5.0);
    }

    // A 100-replica Deployment in its own namespace.
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "deploy"}})).expect("ns");
    let _ = Api::all(c.clone()).create(&PostParams::default(), &ns).await;
    let bound = track_bindings(c.clone(), "deploy");
    let deploy: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 100, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web",
                "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}}]}}}
    }))
    .expect("deployment");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    Api::<Deployment>::namespaced(c.clone(), "deploy").create(&PostParams::default(), &deploy).await.expect("create");
    if wait_bound(&bound, 100, Duration::from_secs(60)).await {
        println!("Deployment of 100 replicas: all pods bound {:.0} ms after create", started.elapsed().as_millis());
    } else {
        println!("Deployment of 100 replicas: only {} pods bound within 60 s", bound.lock().await.len());
    }
    drop(server);
    // The scheduler alone: 10,000 pods wait in the queue (no node yet),
    // then the nodes appear and every pod is placed and bound.
    {
        let (server, c) = start().await;
        let kubeconfig = server.dir.path().join("kubeconfig.yaml");
        let bound = track_bindings(c.clone(), "default");
        create_all(&kubeconfig, 16, pods, |c, i| async move {
            Api::<Pod>::namespaced(c, "default").create(&PostParams::default(), &pod(i)).await.map(|_| ())
        })
        .await;
        // Let the queue settle: every pod has been tried once and waits.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = Instant::now();
        create_all(&kubeconfig, 16, nodes, |c, i| async move {
            Api::<Node>::all(c).create(&PostParams::default(), &node(i)).await.map(|_| ())
        })
        .await;
        if wait_bound(&bound, pods, Duration::from_secs(300)).await {
            let took = started.elapsed().as_secs_f64();
            println!(
                "Queued then placed: {pods} waiting pods bound {took:.2} s after the first of {nodes} nodes appeared: {:.0} pods/s",
                pods as f64 / took
            );
        } else {
            println!("Queued then placed: only {} of {pods} pods bound within 300 s", bound.lock().await.len());
        }
    }
    // Watch tasks of the dropped servers' clients would keep the runtime
    // waiting; the figures are printed.
    std::process::exit(0);
}
