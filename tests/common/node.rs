//! A whole single-node cluster for the tests: `ferrok server` with its
//! node role, in a network namespace of its own (its own bridge, routes and
//! nftables), a cgroup root of its own and a temporary data dir, with the
//! busybox test image in its images folder. Dropping it stops the server
//! and removes everything it made: containers and their shims, mounts,
//! cgroups and the namespace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::images::busybox_oci_tar;

/// The test image every node has (imported from its images folder).
pub const BUSYBOX: &str = "docker.io/library/busybox:1";

/// What a test node runs: `ferrok server` (control plane and node), or
/// `ferrok agent` joined to a server.
#[derive(Debug, Clone)]
pub enum Role {
    Server,
    Agent {
        /// `https://ip:port` of the server.
        server: String,
        /// The server's token file.
        token_file: PathBuf,
        /// The server's admin kubeconfig for the test's kubectl (reachable from the host).
        admin_kubeconfig: PathBuf,
    },
}

pub struct Node {
    pub child: Option<Child>,
    pub role: Role,
    pub dir: tempfile::TempDir,
    pub name: String,
    pub netns: String,
    /// The node's address inside its namespace (the API server listens there).
    pub ip: String,
    /// The host side of the namespace's link.
    pub host_ip: String,
    pub port: u16,
    pub cgroup_root: String,
    pub extra: Vec<String>,
    /// Extra environment for the ferrok process.
    pub env: Vec<(String, String)>,
    log_count: u32,
}

fn run(cmd: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn must(cmd: &str, args: &[&str]) -> String {
    let (ok, out) = run(cmd, args);
    assert!(ok, "{cmd} {args:?} failed: {out}");
    out
}

/// A new, empty network namespace `fk-<n>` with its loopback up.
pub fn alloc_netns() -> (String, u8) {
    for n in 1..=250u8 {
        let name = format!("fk-{n}");
        if !run("ip", &["netns", "add", &name]).0 {
            continue;
        }
        must("ip", &["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        return (name, n);
    }
    panic!("no free test network namespace fk-1 … fk-250");
}

/// `ip netns exec <netns> <args…>` that must succeed.
pub fn netns_exec(netns: &str, args: &[&str]) -> String {
    let mut a = vec!["netns", "exec", netns];
    a.extend_from_slice(args);
    must("ip", &a)
}

/// A network namespace `fk-<n>` with a veth link to the host
/// (10.201.<n>.1 on the host, 10.201.<n>.2 inside).
fn make_netns() -> (String, u8) {
    for n in 1..=250u8 {
        let name = format!("fk-{n}");
        if !run("ip", &["netns", "add", &name]).0 {
            continue;
        }
        let host_if = format!("fkh{n}");
        let ns_if = format!("fkn{n}");
        let _ = run("ip", &["link", "del", &host_if]);
        must("ip", &["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if]);
        must("ip", &["link", "set", &ns_if, "netns", &name]);
        must("ip", &["addr", "add", &format!("10.201.{n}.1/24"), "dev", &host_if]);
        must("ip", &["link", "set", &host_if, "up"]);
        let ns = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &name];
            a.extend_from_slice(args);
            must("ip", &a);
        };
        ns(&["ip", "link", "set", "lo", "up"]);
        ns(&["ip", "addr", "add", &format!("10.201.{n}.2/24"), "dev", &ns_if]);
        ns(&["ip", "link", "set", &ns_if, "up"]);
        ns(&["ip", "route", "add", "default", "via", &format!("10.201.{n}.1")]);
        return (name, n);
    }
    panic!("no free test network namespace fk-1 … fk-250");
}

impl Node {
    /// Starts a node with extra `ferrok server` flags and waits until it is Ready.
    pub fn start(extra: &[&str]) -> Node {
        let mut node = Node::new(extra);
        node.launch();
        node
    }

    /// Starts the server of a node made with `new`, and waits until it is Ready.
    pub fn launch(&mut self) {
        self.spawn();
        self.wait_ready(Duration::from_secs(60));
    }

    /// A node's data dir (with the busybox image in its images folder) and
    /// network namespace, its server not started yet.
    pub fn new(extra: &[&str]) -> Node {
        let (netns, n) = make_netns();
        Node::in_netns(Role::Server, netns, n, &format!("10.201.{n}.2"), &format!("10.201.{n}.1"), extra)
    }

    /// A node (server or agent) in a network namespace made by the caller,
    /// where it has address `ip` and reaches the test's host through `host_ip`.
    pub fn in_netns(role: Role, netns: String, n: u8, ip: &str, host_ip: &str, extra: &[&str]) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let images = dir.path().join("agent").join("images");
        std::fs::create_dir_all(&images).expect("images dir");
        busybox_oci_tar(&images.join("busybox.tar"), BUSYBOX);
        let port = 6443;
        Node {
            child: None,
            role,
            name: format!("node-{n}"),
            netns,
            ip: ip.to_string(),
            host_ip: host_ip.to_string(),
            port,
            cgroup_root: format!("/ferrok-test-{n}"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            dir,
            log_count: 0,
        }
    }

    /// Starts the server without waiting (benchmarks time the rest).
    pub fn spawn(&mut self) {
        self.log_count += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("server-{}.log", self.log_count))).expect("log");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns)).arg(super::ferrok_bin());
        match &self.role {
            Role::Server => {
                cmd.args(["server", "--data-dir"])
                    .arg(self.dir.path())
                    .args(["--https-listen-port", &self.port.to_string()]);
            }
            Role::Agent { server, token_file, .. } => {
                cmd.args(["agent", "--data-dir"])
                    .arg(self.dir.path())
                    .args(["--server", server, "--token-file"])
                    .arg(token_file);
            }
        }
        cmd.args(["--node-name", &self.name])
            .args(["--kubelet-arg", &format!("cgroup-root={}", self.cgroup_root)])
            // The test machines keep most free blocks reserved (statvfs says about
            // 9 % available): upstream's default thresholds (nodefs.available<10%,
            // image GC above 85 %) would put every test node under disk pressure.
            // Tests that want pressure pass their own thresholds after these.
            .args(["--kubelet-arg", "eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%"])
            .args(["--kubelet-arg", "image-gc-high-threshold=100"])
            .args(&self.extra)
            .env("RUST_LOG", "warn,ferrok=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("start ferrok"));
    }

    /// The server's pid (nsenter execs ferrok in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.log_count {
            out += &std::fs::read_to_string(self.dir.path().join(format!("server-{i}.log"))).unwrap_or_default();
        }
        out
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig-host.yaml")
    }

    /// The admin kubeconfig, pointed at the node's address in its namespace.
    pub fn write_host_kubeconfig(&self) -> bool {
        if let Role::Agent { admin_kubeconfig, .. } = &self.role {
            return std::fs::copy(admin_kubeconfig, self.kubeconfig()).is_ok();
        }
        let Ok(text) = std::fs::read_to_string(self.dir.path().join("kubeconfig.yaml")) else { return false };
        let text =
            text.replace(&format!("https://127.0.0.1:{}", self.port), &format!("https://{}:{}", self.ip, self.port));
        std::fs::write(self.kubeconfig(), text).is_ok()
    }

    pub fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("ferrok exited early: {status}\n{}", self.log());
            }
            if self.write_host_kubeconfig() {
                let (ok, out) = self.kubectl(&[
                    "get",
                    "node",
                    &self.name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                // After a restart the Node is still Ready from before: the
                // kubelet's port answering tells that this run is serving.
                if ok && out.trim() == "True" && self.kubelet_listening() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "node did not become Ready\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether the kubelet's port (10250) on the node's address accepts a
    /// connection (always true for a server without the node role).
    fn kubelet_listening(&self) -> bool {
        if self.extra.iter().any(|a| a == "--disable-agent") {
            return true;
        }
        let Ok(ip) = self.ip.parse::<std::net::IpAddr>() else { return false };
        std::net::TcpStream::connect_timeout(&(ip, 10250).into(), Duration::from_millis(200)).is_ok()
    }

    /// kubectl (the default one) against this node: success and stdout+stderr.
    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        self.kubectl_with("kubectl", args)
    }

    pub fn kubectl_with(&self, kubectl: &str, args: &[&str]) -> (bool, String) {
        let out = Command::new(kubectl)
            .env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .args(args)
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// kubectl that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed: {out}");
        out
    }

    /// `kubectl apply -f -` with `body`.
    pub fn apply(&self, body: &str) {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "apply failed: {}\n{body}", String::from_utf8_lossy(&out.stderr));
    }

    /// A JSONPath of an object (`get pod x -o jsonpath=…`).
    pub fn get(&self, what: &[&str], path: &str) -> String {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        let jp = format!("jsonpath={path}");
        args.extend(["-o", &jp]);
        self.kubectl(&args).1
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent").join("containerd").join("containerd.sock")
    }

    /// `ctr` against the node's containerd, in CRI's namespace.
    pub fn ctr(&self, args: &[&str]) -> String {
        let sock = self.socket();
        let mut a = vec!["-a", sock.to_str().unwrap_or_default(), "-n", "k8s.io"];
        a.extend_from_slice(args);
        must("ctr", &a)
    }

    /// Ids of the containers and sandboxes containerd holds.
    pub fn runtime_containers(&self) -> Vec<String> {
        self.ctr(&["containers", "ls", "-q"]).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
    }

    /// Pids of containers' processes (every process in the node's cgroups).
    pub fn container_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let base = Path::new("/sys/fs/cgroup/memory").join(self.cgroup_root.trim_start_matches('/'));
        collect_pids(&base, &mut pids);
        pids.sort();
        pids.dedup();
        pids
    }

    /// Stops the server: SIGTERM (pods keep running) or SIGKILL.
    pub fn stop(&mut self, kill: bool) {
        if let Some(mut child) = self.child.take() {
            // One that ended already (a failed start) has nothing to say about SIGTERM.
            let exited_before = matches!(child.try_wait(), Ok(Some(_)));
            let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, sig) };
            let status = child.wait().expect("wait");
            if !kill && !exited_before && !std::thread::panicking() {
                assert!(status.success(), "server exited with {status} on SIGTERM\n{}", self.log());
            }
        }
    }

    /// Restarts the server on the same data dir.
    pub fn restart(&mut self, kill: bool) {
        self.stop(kill);
        self.spawn();
        self.wait_ready(Duration::from_secs(60));
    }

    fn teardown(&mut self) {
        self.stop(false);
        // What the server leaves running on purpose: containers and shims.
        for _ in 0..3 {
            let pids = self.container_pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) on processes in this test's own cgroups.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Shims (named by their containerd's socket) and, after a SIGKILL
        // of the node, the containerd it left: whatever names the data dir.
        let dir = self.dir.path().to_string_lossy().into_owned();
        if let Ok(procs) = std::fs::read_dir("/proc") {
            for p in procs.filter_map(Result::ok) {
                let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else { continue };
                let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                if cmdline.contains("containerd") && cmdline.contains(dir.as_str()) {
                    // SAFETY: a process of this test's own node.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        unmount_under(self.dir.path());
        // The host's end of the link first, while fk-<n> is still ours: once
        // the namespace is gone another test may take fk-<n> and its fkh<n>.
        let n = self.netns.trim_start_matches("fk-");
        let _ = run("ip", &["link", "del", &format!("fkh{n}")]);
        let _ = run("ip", &["netns", "del", &self.netns]);
        if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
            for e in entries.filter_map(Result::ok) {
                remove_cgroup(&e.path().join(self.cgroup_root.trim_start_matches('/')));
            }
        }
    }
}

fn collect_pids(dir: &Path, out: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out);
            }
        }
    }
}

fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Mount points under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().to_string();
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.len()));
    out
}

fn unmount_under(dir: &Path) {
    for m in mounts_under(dir) {
        let _ = run("umount", &["-l", &m]);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Node {
    /// The runtime id of a pod's container (`containerd://` stripped).
    pub fn container_id(&self, ns: &str, pod: &str, container: &str) -> String {
        let path = format!(
            "{{.status.containerStatuses[?(@.name==\"{container}\")].containerID}}{{.status.initContainerStatuses[?(@.name==\"{container}\")].containerID}}"
        );
        self.get(&["pod", "-n", ns, pod], &path).trim().trim_start_matches("containerd://").to_string()
    }

    /// Runs a command in a running container with `kubectl exec` (the path
    /// users take); its stdout and stderr. `ctr tasks exec` lost the
    /// output of a command that exits right after writing it, now and
    /// then (containerd's FIFO copy racing the exit).
    pub fn exec(&self, ns: &str, pod: &str, container: &str, script: &str) -> String {
        let (ok, out) = self.try_exec(ns, pod, container, script);
        assert!(ok, "exec in {ns}/{pod} ({container}) failed: {out}");
        out
    }

    /// `exec` that may fail: success and stdout+stderr.
    pub fn try_exec(&self, ns: &str, pod: &str, container: &str, script: &str) -> (bool, String) {
        self.kubectl(&["exec", "-n", ns, pod, "-c", container, "--", "sh", "-c", script])
    }

    /// Runs a program on the node's host (inside its network namespace);
    /// success and stdout+stderr.
    pub fn on_host(&self, args: &[&str]) -> (bool, String) {
        let mut a = vec!["netns", "exec", &self.netns];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// The pods the stream tests drive, running: `box` (httpd on 8080, an
    /// echo server on 9090) and `shell` (a shell with stdin and a tty).
    pub fn run_stream_pods(&self) {
        self.apply(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: box, namespace: default}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www && echo hello from httpd > /www/index.html && httpd -p 8080 -h /www && exec nc -ll -p 9090 -e cat"]
---
apiVersion: v1
kind: Pod
metadata: {{name: shell, namespace: default}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh"]
    stdin: true
    tty: true
"#
        ));
        for pod in ["box", "shell"] {
            super::eventually_within(&format!("{pod} running"), Duration::from_secs(90), || {
                self.get(&["pod", pod], "{.status.phase}") == "Running"
            });
        }
    }

    /// Polls `check` every 200 ms until it holds, for up to `secs` seconds.
    pub fn eventually(&self, what: &str, secs: u64, check: impl FnMut() -> bool) {
        self.eventually_across(what, secs, &[], check)
    }

    /// `eventually`, and on a timeout also the pod-network state and the
    /// warnings of the other `nodes` (agents) the check depends on.
    pub fn eventually_across(&self, what: &str, secs: u64, nodes: &[&Node], mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !check() {
            if Instant::now() >= deadline {
                let pods = self.kubectl(&["get", "pods", "-A", "-o", "wide"]).1;
                let events = self.kubectl(&["get", "events", "-A"]).1;
                let log: String = self
                    .log()
                    .lines()
                    .filter(|l| !l.contains("ferrok::apiserver: request"))
                    .collect::<Vec<_>>()
                    .join("\n");
                let others: String =
                    std::iter::once(self).chain(nodes.iter().copied()).map(Node::network_report).collect();
                panic!("timed out waiting for {what}\n--- pods ---\n{pods}\n--- events ---\n{}\n{others}--- server log tail ---\n{}", tail(&events, 40), tail(&log, 40));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node's pod bridge addresses, and its log's pod-network lines and
    /// warnings, for a failure message.
    pub fn network_report(&self) -> String {
        let bridge = self.on_host(&["ip", "-4", "-br", "addr", "show", "dev", "ferrok0"]).1;
        let log: Vec<String> = self
            .log()
            .lines()
            .filter(|l| {
                l.contains("pod_cidr") || l.contains("podCIDR") || l.contains(" WARN ") || l.contains(" ERROR ")
            })
            .map(str::to_string)
            .collect();
        format!("--- {} ({}): {}\n{}\n", self.name, self.netns, bridge.trim(), tail(&log.join("\n"), 15))
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Node {
    /// A control-plane-only server (`--disable-agent`, no images) in a
    /// network namespace of its own, not started yet; `extra` as for `new`.
    pub fn new_server(extra: &[&str]) -> Node {
        let (netns, n) = make_netns();
        let mut all = vec!["--disable-agent"];
        all.extend_from_slice(extra);
        let mut node = Node::in_netns(Role::Server, netns, n, &format!("10.201.{n}.2"), &format!("10.201.{n}.1"), &all);
        node.name = format!("server-{n}");
        node
    }

    /// Waits until the API server answers `/readyz` (a server without its
    /// node role has no Node to become Ready).
    pub fn wait_api_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("ferrok server exited early: {status}\n{}", self.log());
            }
            if self.write_host_kubeconfig() {
                let (ok, out) = self.kubectl(&["get", "--raw", "/readyz"]);
                if ok && out.trim() == "ok" {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the API server did not become ready\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for a server expected to fail at start to exit; its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the server was not started");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ferrok server did not exit\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
