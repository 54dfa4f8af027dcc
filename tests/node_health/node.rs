//! A stand-in for the lead's `common::node::Node` until it lands on main:
//! `ferrok server` with its node role in a network namespace of its own
//! (its CNI bridge, nftables table and ports touch nothing else), a busybox
//! image built here and imported with `ctr` (also used as the pause
//! image), kubectl run inside the namespace. Dropping it deletes the pods,
//! stops the server, kills what is left in the namespace and removes it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const IMAGE: &str = "docker.io/ferrok/health-busybox:test";
const APPLETS: &[&str] = &["sh", "sleep", "usleep", "echo", "cat", "dd", "head", "true", "mkdir", "ls", "rm", "seq"];

/// Thresholds that hold on the test machine, whose root file system keeps
/// most free blocks reserved (statvfs reports about 9 % available): with
/// upstream's defaults (nodefs.available<10%) every node would be under
/// disk pressure, and image GC (high threshold 85 %) would remove images.
pub const QUIET_DISK: &[&str] = &[
    "--kubelet-arg",
    "eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
    "--kubelet-arg",
    "image-gc-high-threshold=100",
];

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// An OCI image-layout tarball of one layer: /bin/busybox and its applets,
/// and /etc/image-name (so images of different names differ).
pub fn busybox_image(dir: &Path, name: &str) -> PathBuf {
    let dir = dir.join(name.replace(['/', ':'], "_"));
    let rootfs = dir.join("rootfs");
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc").join("image-name"), name).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let layer_path = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer_path)
        .arg("."));
    let layer = std::fs::read(&layer_path).unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["sleep", "1000000000"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    })
    .to_string();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config.as_bytes()), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()}],
    })
    .to_string();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest.as_bytes()), "size": manifest.len(),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "test"},
        }],
    })
    .to_string();
    let layout = dir.join("layout");
    let blobs = layout.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [&layer[..], config.as_bytes(), manifest.as_bytes()] {
        std::fs::write(blobs.join(&sha256(blob)["sha256:".len()..]), blob).unwrap();
    }
    std::fs::write(layout.join("index.json"), index).unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let tarball = dir.join("image.tar");
    run(Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&tarball).arg("."));
    tarball
}

pub struct Node {
    pub dir: tempfile::TempDir,
    pub ns: String,
    pub name: String,
    child: Option<Child>,
}

fn random_suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{:x}{:x}", std::process::id(), nanos % 0xfffff)
}

impl Node {
    /// Starts a server with its node role and `extra` flags; returns once the node is Ready.
    pub fn start(extra: &[&str]) -> Node {
        assert!(unsafe { libc::geteuid() } == 0, "the node tests need root");
        let suffix = random_suffix();
        let ns = format!("fh-{suffix}");
        let name = format!("health-{suffix}");
        run(Command::new("ip").args(["netns", "add", &ns]));
        let ip = |args: &str| {
            let mut full = vec!["-n", ns.as_str()];
            full.extend(args.split(' '));
            run(Command::new("ip").args(&full));
        };
        ip("link set lo up");
        ip("link add eth0 type veth peer name eth1");
        ip("addr add 192.168.77.2/24 dev eth0");
        ip("link set eth0 up");
        ip("link set eth1 up");
        ip("route add default via 192.168.77.1 dev eth0");
        let dir = tempfile::Builder::new().prefix("fh").tempdir_in("/tmp").unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        // nsenter, not `ip netns exec`: that one mounts a fresh /sys, hiding the cgroup mounts from runc.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_ferrok"))
            .args(["server", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--node-name", &name, "--node-ip", "192.168.77.2", "--pause-image", IMAGE])
            .args(extra)
            .env("RUST_LOG", "info,ferrok::agent=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ferrok server");
        let mut node = Node { dir, ns, name, child: Some(child) };
        node.import_image();
        node.wait_ready();
        node
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn server_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn socket(&self) -> PathBuf {
        self.data().join("agent").join("containerd").join("containerd.sock")
    }

    /// Runs `ctr` in CRI's namespace of the node's containerd.
    pub fn ctr(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("ctr");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// Builds and imports another busybox image under `name`.
    pub fn import(&self, name: &str) {
        let tar = busybox_image(self.dir.path(), name);
        let (ok, out) = self.ctr(&["images", "import", &tar.to_string_lossy()]);
        assert!(ok, "import {name}: {out}");
    }

    fn import_image(&mut self) {
        let tar = busybox_image(self.dir.path(), IMAGE);
        let socket = self.socket();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.server_exited() {
                panic!("ferrok server exited with {status}: {}", self.server_log());
            }
            if socket.exists() {
                let out = Command::new("ctr")
                    .arg("--address")
                    .arg(&socket)
                    .args(["-n", "k8s.io", "images", "import"])
                    .arg(&tar)
                    .output()
                    .expect("ctr");
                if out.status.success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "containerd did not come up: {}", self.server_log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(status) = self.server_exited() {
                panic!("ferrok server exited with {status}: {}", self.server_log());
            }
            let path = "{.status.conditions[?(@.type==\"Ready\")].status}";
            let (ok, out) = self.kubectl(&["get", "node", &self.name.clone(), "-o", &format!("jsonpath={path}")]);
            if ok && out.trim() == "True" {
                return;
            }
            assert!(Instant::now() < deadline, "node not Ready: {out}\n{}", self.server_log());
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn server_log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let start = text.len().saturating_sub(6000);
        let mut i = start;
        while !text.is_char_boundary(i) {
            i += 1;
        }
        text[i..].to_string()
    }

    /// kubectl inside the node's namespace; success, and stdout then stderr.
    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("nsenter")
            .args([&format!("--net=/run/netns/{}", self.ns), "--", "kubectl"])
            .env("KUBECONFIG", self.data().join("kubeconfig.yaml"))
            .env("HOME", self.dir.path())
            .args(args)
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// `kubectl apply -f -`.
    pub fn apply(&self, yaml: &str) {
        use std::io::Write;
        let mut child = Command::new("nsenter")
            .args([&format!("--net=/run/netns/{}", self.ns), "--", "kubectl", "apply", "-f", "-"])
            .env("KUBECONFIG", self.data().join("kubeconfig.yaml"))
            .env("HOME", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("kubectl");
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "apply failed: {yaml}");
    }

    /// A jsonpath of an object, "" when absent.
    pub fn get(&self, args: &[&str], path: &str) -> String {
        let mut full: Vec<&str> = vec!["get"];
        full.extend(args);
        let jp = format!("jsonpath={path}");
        full.extend(["-o", jp.as_str()]);
        let (ok, out) = self.kubectl(&full);
        if ok {
            out
        } else {
            String::new()
        }
    }

    /// Where the node keeps pod logs.
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.data().join("agent").join("logs").join("pods")
    }

    /// Polls `check` until it holds, failing with the server's log after `limit`.
    pub fn eventually(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n--- server log tail ---\n{}",
                self.server_log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Pods first, through the node itself, so sandboxes and their networks go.
        let _ = self.kubectl(&["delete", "pods", "--all", "-A", "--grace-period=0", "--force", "--wait=false"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let (_, out) = self.kubectl(&["get", "pods", "-A", "--no-headers"]);
            if out.trim().is_empty() || out.contains("No resources") {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child (nsenter execs the server).
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        // Whatever is left in the namespace (shims, pod processes).
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.ns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(p) = pid.parse::<i32>() {
                    // SAFETY: the processes of the namespace this test made.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let root = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut ours: Vec<&str> =
            mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|m| m.starts_with(&root)).collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}
