//! What the API-level benchmarks share: a `ferrok server` on a free port in
//! a temporary data dir, clients from its kubeconfig, and the server's
//! resident memory. Each bench uses part of it.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig.yaml")
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// (VmRSS, VmHWM) of `pid` in KiB.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"))
}

/// A KiB figure of `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`, `RssFile:`).
pub fn status_kib(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user and system) `pid` has used, in clock ticks (1/100 s).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// A client with the admin kubeconfig at `kubeconfig`, one connection of its own.
pub async fn client(kubeconfig: &std::path::Path) -> Result<kube::Client, kube::Error> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}

/// Starts `ferrok server --disable-agent` with `extra` flags and waits until
/// /version answers; returns the server, a client, and how long that took.
pub async fn start_with(extra: &[&str]) -> (Server, kube::Client, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let bin = std::env::var("FERROK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ferrok").to_string());
    let child = Command::new(bin)
        .args(["server", "--disable-agent", "--bind-address", "127.0.0.1", "--data-dir"])
        .arg(dir.path())
        .args(["--https-listen-port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ferrok server");
    let server = Server { child, dir };
    let kubeconfig = server.kubeconfig();
    let started = Instant::now();
    loop {
        if kubeconfig.exists() {
            if let Ok(c) = client(&kubeconfig).await {
                if c.apiserver_version().await.is_ok() {
                    return (server, c, started.elapsed());
                }
            }
        }
        assert!(started.elapsed() < Duration::from_secs(20), "server did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `p` quantile (0..=1) of sorted latencies, in milliseconds.
pub fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// When a phase began, and the CPU the server and this bench had used by then.
pub struct Meter {
    started: Instant,
    server: u32,
    ticks: (u64, u64),
}

impl Meter {
    pub fn start(server: u32) -> Self {
        Meter { started: Instant::now(), server, ticks: (cpu_ticks(server), cpu_ticks(std::process::id())) }
    }
}

/// Waits for the clients' tasks (each returning its latencies) and prints
/// the phase's rate, p50 and p99 on one line, with the CPU per operation
/// of the server and of this bench's clients (which share the machine's
/// cores with it).
pub async fn report_phase(
    label: &str,
    clients: usize,
    meter: Meter,
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
) {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let elapsed = meter.started.elapsed();
    let server = cpu_ticks(meter.server) - meter.ticks.0;
    let bench = cpu_ticks(std::process::id()) - meter.ticks.1;
    all.sort();
    let ops = all.len().max(1) as f64;
    let per_op = |ticks: u64| ticks as f64 * 10_000.0 / ops;
    println!(
        "{label:<28} clients={clients:<3} ops={:<6} {:>8.0} ops/s  p50 {:>7.2} ms  p99 {:>7.2} ms  CPU/op server {:>6.0} µs, clients {:>6.0} µs",
        all.len(),
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        per_op(server),
        per_op(bench),
    );
}
