//! Running the curl-pipe installer (`install.sh`) as a user would, but
//! relocated: everything it writes under a temporary root
//! (`INSTALL_FERROK_ROOT`), its release served from a local
//! `python3 -m http.server`, and the ferrok it installs started in a
//! network namespace of its own (`fk-inst-N`) the way the generated OpenRC
//! script starts it. Shared by `tests/install.rs` and `benches/install.rs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository's top folder.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn install_sh() -> PathBuf {
    repo().join("install.sh")
}

/// The architecture name of release files (`ferrok-amd64`).
pub fn release_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        _ => "arm",
    }
}

/// A copy of `from` at `to`: a hard link when they share a file system.
/// A link keeps its own path in `/proc/<pid>/exe`, so the installed ferrok
/// is told apart from other tests' runs of the same build.
pub fn copy_binary(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).expect("copy the binary");
    }
}

/// Every path under `root`, relative to it.
pub fn listing(root: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap_or(&p).to_string_lossy().into_owned());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, root, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// A release folder (`ferrok-<arch>`, `sha256sum-<arch>.txt`) served over
/// HTTP on a free loopback port.
pub struct Release {
    pub dir: tempfile::TempDir,
    pub url: String,
    server: Child,
}

impl Release {
    /// Serves `binary` with its checksum, or with `wrong_checksum` when given.
    pub fn serve(binary: &Path, wrong_checksum: Option<&str>) -> Release {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = format!("ferrok-{}", release_arch());
        copy_binary(binary, &dir.path().join(&name));
        let sum = match wrong_checksum {
            Some(s) => s.to_string(),
            None => {
                let out = Command::new("sha256sum").arg(dir.path().join(&name)).output().expect("sha256sum");
                String::from_utf8_lossy(&out.stdout).split_whitespace().next().expect("a checksum").to_string()
            }
        };
        std::fs::write(dir.path().join(format!("sha256sum-{}.txt", release_arch())), format!("{sum}  {name}\n"))
            .expect("checksum file");
        let port = super::free_port();
        let server = Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1", &port.to_string()])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "http.server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Release { dir, url, server }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Runs install.sh with `env` (and nothing else of the installer's from
/// this process' environment), under `root`.
pub fn run_install(root: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg(install_sh()).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("INSTALL_FERROK_") || k.starts_with("FERROK_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("INSTALL_FERROK_ROOT", root).envs(env.iter().copied()).stdin(Stdio::null());
    cmd.output().expect("run install.sh")
}

pub fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// An empty network namespace `fk-inst-<n>`: loopback, and a veth pair
/// (both ends inside) with 10.203.<n>.2/24 on `fkhost` and the default
/// route, so that ferrok finds a host address. Nothing in it reaches outside.
pub struct Netns {
    pub name: String,
    pub n: u8,
}

fn ip(args: &[&str]) -> (bool, String) {
    let out = Command::new("ip").args(args).output().expect("ip");
    (out.status.success(), text(&out))
}

impl Netns {
    pub fn new() -> Netns {
        for n in 1..=250u8 {
            let name = format!("fk-inst-{n}");
            if !ip(&["netns", "add", &name]).0 {
                continue;
            }
            let ns = Netns { name, n };
            ns.must(&["ip", "link", "set", "lo", "up"]);
            ns.must(&["ip", "link", "add", "fkhost", "type", "veth", "peer", "name", "fkpeer"]);
            ns.must(&["ip", "addr", "add", &format!("10.203.{n}.2/24"), "dev", "fkhost"]);
            ns.must(&["ip", "link", "set", "fkpeer", "up"]);
            ns.must(&["ip", "link", "set", "fkhost", "up"]);
            ns.must(&["ip", "route", "add", "default", "via", &format!("10.203.{n}.1"), "dev", "fkhost"]);
            return ns;
        }
        panic!("no free network namespace fk-inst-1 … fk-inst-250");
    }

    /// A second namespace linked to this one: this one's `fkpeer` moves
    /// there with 10.203.<n>.3/24 and a default route through this one
    /// (10.203.<n>.2), as a second host on its network.
    pub fn neighbour(&self) -> Netns {
        for m in 1..=250u8 {
            let name = format!("fk-inst-{m}");
            if !ip(&["netns", "add", &name]).0 {
                continue;
            }
            let ns = Netns { name, n: m };
            ns.must(&["ip", "link", "set", "lo", "up"]);
            self.must(&["ip", "link", "set", "fkpeer", "netns", &ns.name]);
            let n = self.n;
            ns.must(&["ip", "addr", "add", &format!("10.203.{n}.3/24"), "dev", "fkpeer"]);
            ns.must(&["ip", "link", "set", "fkpeer", "up"]);
            ns.must(&["ip", "route", "add", "default", "via", &format!("10.203.{n}.2"), "dev", "fkpeer"]);
            return ns;
        }
        panic!("no free network namespace fk-inst-1 … fk-inst-250");
    }

    /// A program inside the namespace (network only: the host's mounts).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.name)).arg(program);
        cmd
    }

    /// Runs `args` in the namespace: success and stdout+stderr.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let out = self.command(args[0]).args(&args[1..]).output().expect("nsenter");
        (out.status.success(), text(&out))
    }

    pub fn must(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args);
        assert!(ok, "{args:?} in {}: {out}", self.name);
        out
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The installed service, started as its OpenRC script would start it:
/// the script sourced (its environment file with it), then
/// `$command $command_args` with the output in `$output_log`.
pub struct Service {
    pub child: Child,
}

impl Service {
    pub fn start_openrc(netns: &Netns, script: &Path) -> Service {
        let child = netns
            .command("sh")
            .arg("-c")
            .arg(r#". "$0" && eval "exec \"\$command\" $command_args" >>"$output_log" 2>&1"#)
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the service");
        Service { child }
    }

    /// Whether ferrok has exited (reaping it).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubectl (the host's) in the namespace against the install's admin kubeconfig.
pub fn kubectl(netns: &Netns, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = netns
        .command("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp")))
        .output()
        .expect("kubectl");
    (out.status.success(), text(&out))
}

/// Waits until node `name` is Ready; false when `limit` passes or ferrok exits.
pub fn wait_node_ready(netns: &Netns, service: &mut Service, kubeconfig: &Path, name: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
    while Instant::now() < deadline {
        if service.exited() {
            return false;
        }
        if kubeconfig.exists() && kubectl(netns, kubeconfig, &["get", "node", name, "-o", ready]).1.trim() == "True" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Processes whose executable or command line lies under `dir`.
pub fn processes_under(dir: &Path) -> Vec<(u32, String)> {
    let dir = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.filter_map(Result::ok) {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else { continue };
        let exe =
            std::fs::read_link(p.path().join("exe")).map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(p.path().join("cmdline")).unwrap_or_default()).replace('\0', " ");
        let status = std::fs::read_to_string(p.path().join("status")).unwrap_or_default();
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        if !zombie && (exe.starts_with(&dir) || cmdline.contains(&dir)) {
            out.push((pid, cmdline));
        }
    }
    out
}

/// INSTALL_FERROK_EXEC for a server in namespace `netns`: its node name,
/// a cgroup root of its own, and the eviction thresholds the test machines
/// need (most of their free disk is reserved).
pub fn server_exec(netns: &Netns) -> String {
    node_exec("server", netns)
}

/// INSTALL_FERROK_EXEC for `server` or `agent` in namespace `netns`.
pub fn node_exec(command: &str, netns: &Netns) -> String {
    format!(
        "{command} --node-name {} --kubelet-arg cgroup-root={} \
         --kubelet-arg eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1% \
         --kubelet-arg image-gc-high-threshold=100",
        node_name(netns),
        cgroup_root(netns)
    )
}

pub fn node_name(netns: &Netns) -> String {
    format!("inst-{}", netns.n)
}

pub fn cgroup_root(netns: &Netns) -> String {
    format!("/ferrok-inst-{}", netns.n)
}
