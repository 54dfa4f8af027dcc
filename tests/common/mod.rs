//! Shared by the integration tests: starting real etcd and the real ferrok
//! binary on free ports with temporary data dirs, and running etcdctl.

#![allow(dead_code)]

pub mod cluster;
pub mod fake_dns;
pub mod images;
pub mod install;
pub mod node;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ferrok::store::proto::kv_client::KvClient;
use ferrok::store::proto::RangeRequest;
use tonic::transport::Channel;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local addr").port()
}

/// A server process killed when dropped.
pub struct Proc {
    pub child: Child,
    pub endpoint: String,
    pub dir: tempfile::TempDir,
    pub name: &'static str,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn url(&self) -> String {
        format!("http://{}", self.endpoint)
    }

    pub async fn kv(&self) -> KvClient<Channel> {
        KvClient::new(channel(&self.url()).await)
    }
}

pub async fn channel(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_string()).expect("url").connect().await.expect("connect")
}

fn require(bin: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let p = Path::new(dir).join(bin);
        if p.is_file() {
            return p;
        }
    }
    panic!("{bin} is not installed: run scripts/deps first (tests never skip a missing dependency)");
}

async fn wait_ready(proc: &mut Proc) {
    if let Err(status) = ready_or_exited(proc).await {
        panic!("{} exited early with {status}", proc.name);
    }
}

/// Waits until `proc` answers a range request; its exit status if it ends first.
async fn ready_or_exited(proc: &mut Proc) -> Result<(), std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = proc.url();
    loop {
        if let Ok(Some(status)) = proc.child.try_wait() {
            return Err(status);
        }
        if let Ok(ep) = tonic::transport::Endpoint::from_shared(url.clone()) {
            if let Ok(ch) = ep.connect().await {
                let req = RangeRequest { key: b"ready-check".to_vec(), ..Default::default() };
                if KvClient::new(ch).range(req).await.is_ok() {
                    return Ok(());
                }
            }
        }
        assert!(Instant::now() < deadline, "{} did not become ready on {url}", proc.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A real etcd 3.4 (Debian's etcd-server) on free ports.
pub async fn start_etcd() -> Proc {
    start_etcd_on("127.0.0.1").await
}

/// etcd with its data in `dir` on the given client and peer ports (the
/// same ones again restart the same member).
pub async fn start_etcd_in(dir: tempfile::TempDir, client: u16, peer: u16) -> Proc {
    match spawn_etcd(dir, "127.0.0.1", client, peer).await {
        Ok(p) => p,
        Err(why) => panic!("{why}"),
    }
}

/// A real etcd serving clients on `host` (an address of this machine, such
/// as the host side of a test network namespace, so servers inside
/// namespaces reach it), on a free port, its peer port on loopback.
pub async fn start_etcd_on(host: &str) -> Proc {
    // A port found free may be taken by another process before etcd binds
    // it: then etcd exits, and it starts again on other ports.
    let mut last = String::new();
    for _ in 0..3 {
        match spawn_etcd(tempfile::tempdir().expect("tempdir"), host, free_port(), free_port()).await {
            Ok(p) => return p,
            Err(why) => last = why,
        }
    }
    panic!("{last}");
}

/// etcd started and ready, or why it exited (the end of its log).
async fn spawn_etcd(dir: tempfile::TempDir, host: &str, client: u16, peer: u16) -> Result<Proc, String> {
    let etcd = require("etcd");
    let log_path = dir.path().join("etcd.log");
    let log = std::fs::File::create(&log_path).expect("etcd log");
    let child = Command::new(etcd)
        .args(["--name", "default", "--data-dir"])
        .arg(dir.path().join("etcd"))
        .args(["--listen-client-urls", &format!("http://{host}:{client}")])
        .args(["--advertise-client-urls", &format!("http://{host}:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start etcd");
    let mut p = Proc { child, endpoint: format!("{host}:{client}"), dir, name: "etcd" };
    match ready_or_exited(&mut p).await {
        Ok(()) => Ok(p),
        Err(status) => {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            Err(format!("etcd exited early with {status}: {}", tail.into_iter().rev().collect::<Vec<_>>().join("\n")))
        }
    }
}

/// The binary under test: this build's, or `FERROK_BIN` when set (the
/// benchmarks run a release copy that a rebuild cannot replace mid-run).
pub fn ferrok_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| std::env::var("FERROK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ferrok").to_string()))
}

/// `ferrok datastore` on a free port, in `dir` (a new temporary dir when None).
pub async fn start_ferrok_in(dir: Option<tempfile::TempDir>, extra: &[&str]) -> Proc {
    let dir = dir.unwrap_or_else(|| tempfile::tempdir().expect("tempdir"));
    let port = free_port();
    let log = std::fs::File::create(dir.path().join(format!("ferrok-{port}.log"))).expect("log file");
    let child = Command::new(ferrok_bin())
        .arg("datastore")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start ferrok");
    let mut p = Proc { child, endpoint: format!("127.0.0.1:{port}"), dir, name: "ferrok" };
    wait_ready(&mut p).await;
    p
}

pub async fn start_ferrok(extra: &[&str]) -> Proc {
    start_ferrok_in(None, extra).await
}

/// Runs etcdctl (v3 API) against `endpoint`; stdin is fed when given.
/// Lines etcd 3.4's client logs as JSON (`{"level"...`) are dropped.
pub fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = Command::new(require("etcdctl"));
    cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={endpoint}")).args(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run etcdctl");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes()).expect("write stdin");
    }
    let out: Output = child.wait_with_output().expect("etcdctl output");
    let clean = |b: &[u8]| {
        String::from_utf8_lossy(b).lines().filter(|l| !l.starts_with("{\"level\"")).collect::<Vec<_>>().join("\n")
    };
    (out.status.success(), clean(&out.stdout), clean(&out.stderr))
}

/// `ferrok server` (control plane only) on a free port, killed when dropped.
pub struct ApiServer {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            print_server_logs(self.dir.path());
        }
    }
}

/// The tail of each server log in `dir`, for a test that failed (the data
/// dir goes with the test).
fn print_server_logs(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.flatten().map(|e| e.path()) {
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("server-") && n.ends_with(".log")) {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("--- last lines of {} ---", path.display());
            for line in &lines[lines.len().saturating_sub(80)..] {
                eprintln!("{line}");
            }
        }
    }
}

/// A `kube` client from a kubeconfig file the server wrote.
pub async fn kube_client(kubeconfig: &std::path::Path) -> kube::Client {
    kube::Client::try_from(kube_config(kubeconfig).await).expect("client")
}

/// A client that hands back a 429, 503 or 504 as it comes: kube's default
/// client retries them with back-off, for minutes.
pub async fn kube_client_without_retry(kubeconfig: &std::path::Path) -> kube::Client {
    let mut config = kube_config(kubeconfig).await;
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

async fn kube_config(kubeconfig: &std::path::Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config")
}

impl ApiServer {
    pub fn start_in(dir: tempfile::TempDir, port: u16) -> ApiServer {
        ApiServer::start_with(dir, port, &[])
    }

    /// A server with more flags (`--datastore-endpoint`, `--kube-scheduler-arg`, ...).
    pub fn start_with(dir: tempfile::TempDir, port: u16, extra: &[&str]) -> ApiServer {
        ApiServer::start_with_env(dir, port, extra, &[])
    }

    /// A server with more flags and environment variables.
    pub fn start_with_env(dir: tempfile::TempDir, port: u16, extra: &[&str], env: &[(&str, &str)]) -> ApiServer {
        // One log per start (a restarted server keeps its first log).
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let log = std::fs::File::create(dir.path().join(format!("server-{}.log", started.as_nanos()))).expect("log");
        let child = Command::new(ferrok_bin())
            .args(["server", "--disable-agent", "--data-dir"])
            .arg(dir.path())
            .args(["--https-listen-port", &port.to_string(), "--bind-address", "127.0.0.1"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ferrok server");
        let mut s = ApiServer { child, dir, port };
        s.wait_ready();
        s
    }

    pub fn start() -> ApiServer {
        ApiServer::start_in(tempfile::tempdir().expect("tempdir"), free_port())
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig.yaml")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                print_server_logs(self.dir.path());
                panic!("ferrok server exited early: {status}");
            }
            if self.kubeconfig().exists() {
                let out =
                    Command::new("curl").args(["-sk", &format!("https://127.0.0.1:{}/readyz", self.port)]).output();
                if out.is_ok_and(|o| o.stdout == b"ok") {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "ferrok server did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops with SIGTERM and hands back the data dir.
    pub fn stop(mut self) -> (tempfile::TempDir, u16) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "server exited with {status} on SIGTERM");
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
        (dir, self.port)
    }
}

/// Runs kubectl against `s`; success and stdout followed by stderr.
pub fn kubectl(s: &ApiServer, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(args)
        .output()
        .expect("kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// `kubectl <verb> -f -` with `body` on stdin; asserts that it succeeds.
fn kubectl_stdin(s: &ApiServer, verb: &str, body: &str) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args([verb, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kubectl");
    child.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("write");
    assert!(child.wait().expect("wait").success(), "{verb} failed: {body}");
}

/// `kubectl apply -f -`.
pub fn apply(s: &ApiServer, body: &str) {
    kubectl_stdin(s, "apply", body)
}

/// `kubectl create -f -`.
pub fn create(s: &ApiServer, body: &str) {
    kubectl_stdin(s, "create", body)
}

/// A process's resident memory in MiB (0 when it is gone), for benchmarks.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Polls `check` until it holds, failing the test after `limit`.
pub fn eventually_within(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `check` for up to 20 s.
pub fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(20), check)
}

/// The raw answer to `method uri` with a JSON `body`, sent as `accept` wants.
pub async fn raw(client: &kube::Client, method: &str, uri: &str, accept: &str, body: &str) -> (u16, Vec<u8>) {
    raw_as(client, method, uri, "application/json", accept, body).await
}

/// `raw` with a body of `content_type`.
pub async fn raw_as(
    client: &kube::Client,
    method: &str,
    uri: &str,
    content_type: &str,
    accept: &str,
    body: &str,
) -> (u16, Vec<u8>) {
    use http_body_util::BodyExt;
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("Accept", accept)
        .header("Content-Type", content_type)
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .expect("request");
    let resp = client.send(req).await.unwrap_or_else(|e| panic!("{method} {uri}: {e}"));
    let code = resp.status().as_u16();
    (code, resp.into_body().collect().await.expect("body").to_bytes().to_vec())
}
