//! The node role, measured: time from `ferrok server` on an empty data dir
//! to a Ready node; pod startup (creation to Running, seen through a watch)
//! for 30 pods created at once and for 100 created one after another; the
//! resident memory of ferrok with 0 and 30 running pods (containerd and the
//! shims reported apart); ferrok's CPU over a minute of rest with 30 pods.
//! Prints figures; it is not a pass/fail test. Needs root and what
//! `scripts/deps` installs (containerd, runc, CNI plugins, busybox).
//!
//! `cargo bench --bench node [-- --burst N --serial N --idle SECONDS]`

mod common;
#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use tcommon::node::{Node as TestNode, BUSYBOX};
use tcommon::rss_mib;
use tokio::sync::Mutex;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).and_then(|w| w[1].parse().ok()).unwrap_or(default)
}

async fn client(node: &TestNode) -> kube::Client {
    tcommon::kube_client(&node.kubeconfig()).await
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Starts a node and returns it with the time from spawn to a Ready Node.
async fn start_timed() -> (TestNode, Duration) {
    // Room for the 30 + 100 pods of the two startup runs (maxPods is 110).
    let mut node = TestNode::new(&["--kubelet-arg", "max-pods=250"]);
    let started = Instant::now();
    node.spawn();
    loop {
        if node.write_host_kubeconfig() {
            if let Ok(config) = kube::config::Kubeconfig::read_from(node.kubeconfig()) {
                if let Ok(config) = kube::Config::from_custom_kubeconfig(config, &Default::default()).await {
                    if let Ok(c) = kube::Client::try_from(config) {
                        if let Ok(n) = Api::<Node>::all(c).get(&node.name).await {
                            if node_ready(&n) {
                                return (node, started.elapsed());
                            }
                        }
                    }
                }
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no Ready node after 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"bench": "node"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX, "command": ["sleep", "100000"],
                            "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}]
        }
    }))
    .expect("pod")
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Watches the namespace and records when each pod is first seen Running.
fn watch_running(c: kube::Client, ns: &str) -> Arc<Mutex<HashMap<String, Instant>>> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let api: Api<Pod> = Api::namespaced(c, ns);
    let record = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            // The watcher resumes after an error by itself.
            let pods = match event {
                Ok(Event::Apply(p) | Event::InitApply(p)) => vec![p],
                Ok(_) => continue,
                Err(e) => {
                    eprintln!("pod watch: {e}");
                    continue;
                }
            };
            let now = Instant::now();
            for p in pods {
                if running(&p) {
                    record.lock().await.entry(p.metadata.name.clone().unwrap_or_default()).or_insert(now);
                }
            }
        }
    });
    seen
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn report(what: &str, mut lat: Vec<Duration>) {
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what}: n={} p50={:.0} ms p99={:.0} ms max={:.0} ms",
        lat.len(),
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 1.0))
    );
}

async fn wait_all(seen: &Mutex<HashMap<String, Instant>>, names: &[String], limit: Duration, node: &TestNode) {
    let deadline = Instant::now() + limit;
    loop {
        {
            let seen = seen.lock().await;
            if names.iter().all(|n| seen.contains_key(n)) {
                return;
            }
        }
        if Instant::now() >= deadline {
            let pods = node.kubectl(&["get", "pods", "-A", "-o", "wide"]).1;
            let events = node.kubectl(&["get", "events", "-A"]).1;
            let log: Vec<String> =
                node.log().lines().filter(|l| !l.contains("apiserver: request")).map(String::from).collect();
            panic!(
                "pods not Running in {limit:?}\n{pods}\n{events}\n{}",
                log[log.len().saturating_sub(60)..].join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pids of processes whose command line contains `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(needle) {
            out.push(pid);
        }
    }
    out
}

fn memory_line(what: &str, node: &TestNode) {
    let ferrok = node.pid().map(rss_mib).unwrap_or(0.0);
    let config = node.dir.path().join("agent/etc/containerd/config.toml");
    let containerd: f64 = pids_with(&format!("--config\0{}", config.display())).into_iter().map(rss_mib).sum();
    let sock = node.socket();
    let shims: Vec<u32> = pids_with(&format!("{}", sock.display()))
        .into_iter()
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains("containerd-shim")
        })
        .collect();
    let shim_rss: f64 = shims.iter().map(|p| rss_mib(*p)).sum();
    println!(
        "resident memory, {what}: ferrok {ferrok:.1} MiB; containerd {containerd:.1} MiB; {} shims {shim_rss:.1} MiB",
        shims.len()
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let burst = arg("--burst", 30) as usize;
        let serial = arg("--serial", 100) as usize;
        let idle = arg("--idle", 60);

        // Time to a Ready node, three fresh starts.
        let mut times = Vec::new();
        for _ in 0..2 {
            let (n, t) = start_timed().await;
            times.push(t);
            drop(n);
        }
        let (node, t) = start_timed().await;
        times.push(t);
        let ms: Vec<String> = times.iter().map(|t| format!("{:.0} ms", t.as_secs_f64() * 1000.0)).collect();
        println!("empty data dir to a Ready node: {}", ms.join(", "));

        let c = client(&node).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        memory_line("0 pods, at rest", &node);

        // Pods created at once.
        let seen = watch_running(c.clone(), "default");
        let api: Api<Pod> = Api::namespaced(c.clone(), "default");
        let names: Vec<String> = (0..burst).map(|i| format!("burst-{i}")).collect();
        let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let mut tasks = Vec::new();
        for n in &names {
            let (api, n, created) = (api.clone(), n.clone(), created.clone());
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                api.create(&PostParams::default(), &pod(&n)).await.expect("create");
                created.lock().await.insert(n, t);
            }));
        }
        for t in tasks {
            t.await.expect("create task");
        }
        wait_all(&seen, &names, Duration::from_secs(300), &node).await;
        let lat: Vec<Duration> = {
            let seen = seen.lock().await;
            let created = created.lock().await;
            names.iter().map(|n| seen[n].duration_since(created[n])).collect()
        };
        report(&format!("pod startup, {burst} created at once"), lat);
        tokio::time::sleep(Duration::from_secs(10)).await;
        memory_line(&format!("{burst} running pods"), &node);

        // Idle CPU with the pods running.
        if let Some(pid) = node.pid() {
            let hz = 100.0; // USER_HZ on Linux
            let before = common::cpu_ticks(pid);
            tokio::time::sleep(Duration::from_secs(idle)).await;
            let used = (common::cpu_ticks(pid) - before) as f64 / hz;
            println!(
                "ferrok CPU at rest with {burst} pods over {idle} s: {:.2} % of a core",
                used / idle as f64 * 100.0
            );
        }

        // Pods one after another.
        let ns = "serial";
        let nsapi: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
        let _ = nsapi
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns"),
            )
            .await;
        let seen = watch_running(c.clone(), ns);
        let api: Api<Pod> = Api::namespaced(c.clone(), ns);
        let mut lat = Vec::new();
        for i in 0..serial {
            let name = format!("serial-{i}");
            let t = Instant::now();
            api.create(&PostParams::default(), &pod(&name)).await.expect("create");
            wait_all(&seen, std::slice::from_ref(&name), Duration::from_secs(60), &node).await;
            lat.push(seen.lock().await[&name].duration_since(t));
        }
        report(&format!("pod startup, {serial} created one after another"), lat);
        memory_line(&format!("{} running pods", burst + serial), &node);
        drop(node);
    });
}
