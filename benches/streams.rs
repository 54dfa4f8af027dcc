//! The streams of the kubelet API, measured through the API server with
//! real kubectl: latency of `kubectl exec POD -- true` (new kubectl over
//! WebSocket and kubectl 1.27 over SPDY), the throughput of one 100 MiB
//! download through `kubectl port-forward` against the same download
//! straight from the pod's IP, and ferrok's resident memory with 20 exec
//! sessions held open. Prints figures; it is not a pass/fail test. Needs
//! root and what `scripts/deps` installs.
//!
//! `cargo bench --bench streams [-- --runs N --sessions N]`

#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tcommon::node::{Node, BUSYBOX};
use tcommon::rss_mib;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).and_then(|w| w[1].parse().ok()).unwrap_or(default)
}

/// `kubectl.1.NN` beside the file `kubectl` links to.
fn kubectl_version(minor: u32) -> PathBuf {
    let real = std::fs::canonicalize(which("kubectl")).expect("kubectl");
    real.parent().expect("folder").join(format!("kubectl.1.{minor}"))
}

fn which(bin: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| PathBuf::from(d).join(bin))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{bin} not on PATH"))
}

fn kubectl(node: &Node, bin: &str) -> Command {
    let mut c = Command::new(bin);
    c.env("KUBECONFIG", node.kubeconfig()).env("HOME", node.dir.path());
    c
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn exec_latency(node: &Node, bin: &str, label: &str, runs: u64) {
    let mut lat = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = kubectl(node, bin).args(["exec", "bench", "--", "true"]).output().expect("kubectl exec");
        assert!(out.status.success(), "exec failed: {}", String::from_utf8_lossy(&out.stderr));
        lat.push(t.elapsed());
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "kubectl exec POD -- true, {label}: n={runs} p50={:.0} ms p99={:.0} ms max={:.0} ms",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 1.0))
    );
}

/// Downloads `url` with curl (in `netns` when given): MiB/s.
fn download(url: &str, netns: Option<&str>) -> f64 {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let out = c.args(["-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", url]).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut f = text.split_whitespace().map(|v| v.parse::<f64>().unwrap_or(0.0));
    let (size, time) = (f.next().unwrap_or(0.0), f.next().unwrap_or(0.0));
    assert!(
        size >= 100.0 * 1024.0 * 1024.0,
        "short download from {url}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    size / 1024.0 / 1024.0 / time
}

fn main() {
    let runs = arg("--runs", 50);
    let sessions = arg("--sessions", 20) as usize;
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: bench, namespace: default}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www && dd if=/dev/urandom of=/www/blob bs=1M count=100 2>/dev/null && touch /www/ready && exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      exec: {{command: ["test", "-f", "/www/ready"]}}
      periodSeconds: 1
"#
    ));
    node.eventually("the bench pod is ready", 120, || {
        node.get(&["pod", "bench"], "{.status.conditions[?(@.type==\"Ready\")].status}") == "True"
    });

    exec_latency(&node, "kubectl", "kubectl 1.32 (WebSocket)", runs);
    let old = kubectl_version(27);
    exec_latency(&node, old.to_str().expect("path"), "kubectl 1.27 (SPDY)", runs);

    // Port-forward against a direct download in the node's namespace.
    let ip = node.get(&["pod", "bench"], "{.status.podIP}");
    let direct = download(&format!("http://{ip}:8080/blob"), Some(&node.netns));
    for (bin, label) in
        [("kubectl".to_string(), "kubectl 1.32 (WebSocket tunnel)"), (old.display().to_string(), "kubectl 1.27 (SPDY)")]
    {
        let port = tcommon::free_port();
        let mut pf: Child = kubectl(&node, &bin)
            .args(["port-forward", "pod/bench", &format!("{port}:8080")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl port-forward");
        let url = format!("http://127.0.0.1:{port}/ready");
        node.eventually("port-forward answers", 30, || {
            Command::new("curl").args(["-sf", "-o", "/dev/null", &url]).status().is_ok_and(|s| s.success())
        });
        let forwarded = download(&format!("http://127.0.0.1:{port}/blob"), None);
        println!(
            "100 MiB download, {label}: port-forward {forwarded:.0} MiB/s; direct to the pod IP {direct:.0} MiB/s ({:.0} %)",
            forwarded / direct * 100.0
        );
        let _ = pf.kill();
        let _ = pf.wait();
    }

    // Memory with open exec sessions.
    let pid = node.pid().expect("server pid");
    std::thread::sleep(Duration::from_secs(5));
    let before = rss_mib(pid);
    let mut held: Vec<Child> = (0..sessions)
        .map(|_| {
            kubectl(&node, "kubectl")
                .args(["exec", "-i", "bench", "--", "cat"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("kubectl exec -i")
        })
        .collect();
    node.eventually("all sessions run", 60, || {
        let out = kubectl(&node, "kubectl").args(["exec", "bench", "--", "sh", "-c", "pidof cat | wc -w"]).output();
        out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<usize>().ok()) == Some(sessions)
    });
    let during = rss_mib(pid);
    println!("ferrok resident memory: {before:.1} MiB before, {during:.1} MiB with {sessions} open exec sessions");
    for c in &mut held {
        drop(c.stdin.take());
    }
    for mut c in held {
        let _ = c.wait();
    }
}
