//! The node's containerd: a child process with a config ferrok writes under
//! the data dir (its own root, state, socket and runc root, so several
//! nodes can share a host), logged to `agent/containerd/containerd.log`,
//! restarted when it dies and stopped with SIGTERM. Pods do not depend on
//! it staying up: their shims outlive it, and a new containerd reattaches.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Where containerd keeps its files for one node.
#[derive(Debug, Clone)]
pub struct ContainerdPaths {
    /// `<data-dir>/agent/containerd`: content, snapshots, metadata, the log.
    pub root: PathBuf,
    /// `<data-dir>/agent/etc/containerd/config.toml`.
    pub config: PathBuf,
    /// The gRPC socket (CRI and containerd's own API).
    pub socket: PathBuf,
    /// Registry hosts (`hosts.toml` per registry), from registries.yaml.
    pub certs_d: PathBuf,
    /// The CNI config folder containerd reads.
    pub cni_conf_dir: PathBuf,
}

impl ContainerdPaths {
    pub fn new(agent_dir: &Path) -> Self {
        let root = agent_dir.join("containerd");
        ContainerdPaths {
            socket: root.join("containerd.sock"),
            config: agent_dir.join("etc").join("containerd").join("config.toml"),
            certs_d: agent_dir.join("etc").join("containerd").join("certs.d"),
            cni_conf_dir: agent_dir.join("etc").join("cni").join("net.d"),
            root,
        }
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("containerd.log")
    }

    fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    fn pid_file(&self) -> PathBuf {
        self.root.join("containerd.pid")
    }
}

/// An OCI runtime containerd is configured with, a RuntimeClass handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeHandler {
    pub name: String,
    pub binary: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("{binary} is not installed (Debian package: {package})")]
    Missing { binary: String, package: &'static str },
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("the socket path {0} is longer than a Unix socket allows (107 bytes); use a shorter --data-dir")]
    SocketPathTooLong(PathBuf),
    #[error("containerd did not come up within {0:?}; see {1}")]
    NotReady(Duration, PathBuf),
    #[error("containerd exited at start ({status}); see {log}")]
    Exited { status: std::process::ExitStatus, log: PathBuf },
}

pub use crate::host::find_binary;
use crate::host::is_executable;

/// The folder holding the host's CNI plugins.
pub fn cni_bin_dir() -> Option<PathBuf> {
    ["/usr/lib/cni", "/opt/cni/bin", "/usr/libexec/cni"]
        .map(PathBuf::from)
        .into_iter()
        .find(|d| is_executable(&d.join("bridge")))
}

/// Checks that what a node needs from the host is installed: containerd,
/// runc and the CNI plugins. Returns the runtime handlers (runc, and crun
/// when installed) and the CNI plugin folder.
pub fn check_host(external_runtime: bool) -> Result<(Vec<RuntimeHandler>, PathBuf), ContainerdError> {
    let missing = |binary: &str, package| ContainerdError::Missing { binary: binary.into(), package };
    if !external_runtime && find_binary("containerd").is_none() {
        return Err(missing("containerd", "containerd"));
    }
    let runc = find_binary("runc").ok_or_else(|| missing("runc", "runc"))?;
    let cni = cni_bin_dir().ok_or_else(|| missing("the CNI bridge plugin", "containernetworking-plugins"))?;
    for plugin in ["host-local", "loopback", "portmap"] {
        if !is_executable(&cni.join(plugin)) {
            return Err(missing(&format!("the CNI {plugin} plugin"), "containernetworking-plugins"));
        }
    }
    let mut handlers = vec![RuntimeHandler { name: "runc".into(), binary: runc }];
    if let Some(crun) = find_binary("crun") {
        match crun_unusable_because() {
            None => handlers.push(RuntimeHandler { name: "crun".into(), binary: crun }),
            Some(why) => {
                tracing::warn!("crun is installed but cannot run containers here ({why}); no crun RuntimeClass")
            }
        }
    }
    Ok((handlers, cni))
}

/// crun refuses a hybrid cgroup layout (v1 controllers plus a cgroup v2
/// tree) in which the v2 tree holds controllers ("cgroups in hybrid mode
/// not supported, drop all controllers from cgroupv2"); runc copes.
pub fn crun_unusable_because() -> Option<String> {
    hybrid_v2_controllers(std::path::Path::new("/sys/fs/cgroup"))
        .map(|c| format!("the host's cgroups are hybrid and cgroup v2 holds the {c} controller"))
}

fn hybrid_v2_controllers(root: &Path) -> Option<String> {
    if root.join("cgroup.controllers").exists() {
        return None; // pure cgroup v2
    }
    let controllers = std::fs::read_to_string(root.join("unified").join("cgroup.controllers")).ok()?;
    let controllers = controllers.trim();
    (!controllers.is_empty()).then(|| controllers.to_string())
}

/// What goes into containerd's config.
#[derive(Debug, Clone)]
pub struct ContainerdConfig {
    pub paths: ContainerdPaths,
    pub sandbox_image: String,
    pub handlers: Vec<RuntimeHandler>,
    pub cni_bin_dir: PathBuf,
    /// Largest log line before containerd splits it (`P` partial lines).
    pub max_container_log_line_size: u32,
}

/// `s` as a TOML basic string.
pub(crate) fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// containerd's config.toml (version 2) for this node.
pub fn render_config(c: &ContainerdConfig) -> String {
    let p = &c.paths;
    let q = |path: &Path| toml_str(&path.to_string_lossy());
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    let mut out = format!(
        r#"# Written by ferrok at every start; edits are overwritten.
version = 2
root = {root}
state = {state}
# Plugins a node never uses cost memory and start-up time.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = {sandbox}
  # Root here cannot lower oom_score_adj; without this every sandbox fails.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  max_container_log_line_size = {line}

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  disable_snapshot_annotations = true
"#,
        root = q(&p.root),
        state = q(&p.state()),
        sock = q(&p.socket),
        ttrpc = q(&p.socket.with_extension("sock.ttrpc")),
        opt = q(&p.root.join("opt")),
        sandbox = toml_str(&c.sandbox_image),
        line = c.max_container_log_line_size,
    );
    for h in &c.handlers {
        out.push_str(&format!(
            r#"
[{cri}.containerd.runtimes.{name}]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.{name}.options]
  BinaryName = {binary}
  Root = {rt_root}
  SystemdCgroup = false
"#,
            name = toml_str(&h.name),
            binary = q(&h.binary),
            rt_root = q(&p.root.join(&h.name)),
        ));
    }
    out.push_str(&format!(
        r#"
[{cri}.cni]
  bin_dir = {bin}
  conf_dir = {conf}
  max_conf_num = 1

[{cri}.registry]
  config_path = {certs}
"#,
        bin = q(&c.cni_bin_dir),
        conf = q(&p.cni_conf_dir),
        certs = q(&p.certs_d),
    ));
    out
}

/// A running containerd this node supervises.
pub struct Containerd {
    paths: ContainerdPaths,
    stop: watch::Sender<bool>,
    supervisor: tokio::task::JoinHandle<()>,
}

impl Containerd {
    /// Writes the config, stops a containerd an earlier ferrok left running
    /// on the same root, starts a new one and waits for its socket.
    pub async fn start(config: &ContainerdConfig) -> Result<Containerd, ContainerdError> {
        let p = &config.paths;
        if p.socket.as_os_str().len() > 107 {
            return Err(ContainerdError::SocketPathTooLong(p.socket.clone()));
        }
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| ContainerdError::Io { action, path, source }
        };
        for dir in [&p.root, &p.certs_d, &p.cni_conf_dir] {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        if let Some(dir) = p.config.parent() {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        write_atomic(&p.config, render_config(config).as_bytes()).map_err(io("write", &p.config))?;
        stop_leftover(p).await;
        let mut child = spawn(p)?;
        wait_for_socket(p, &mut child).await?;
        let (stop, stop_rx) = watch::channel(false);
        let supervisor = tokio::spawn(supervise(p.clone(), child, stop_rx));
        Ok(Containerd { paths: p.clone(), stop, supervisor })
    }

    pub fn socket(&self) -> &Path {
        &self.paths.socket
    }

    /// Stops containerd with SIGTERM (SIGKILL after 10 s); pods keep running.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.supervisor.await;
    }
}

pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

fn spawn(p: &ContainerdPaths) -> Result<Child, ContainerdError> {
    let log_path = p.log();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|source| ContainerdError::Io { action: "open", path: log_path.clone(), source })?;
    let err =
        log.try_clone().map_err(|source| ContainerdError::Io { action: "open", path: log_path.clone(), source })?;
    let binary = find_binary("containerd")
        .ok_or(ContainerdError::Missing { binary: "containerd".into(), package: "containerd" })?;
    let mut cmd = Command::new(binary);
    cmd.arg("--config").arg(&p.config).stdin(Stdio::null()).stdout(log).stderr(err).kill_on_drop(false);
    // Its own process group, so a ^C meant for ferrok does not reach it first.
    cmd.process_group(0);
    let child =
        cmd.spawn().map_err(|source| ContainerdError::Io { action: "start", path: p.config.clone(), source })?;
    if let Some(pid) = child.id() {
        let _ = std::fs::write(p.pid_file(), pid.to_string());
    }
    tracing::info!(pid = child.id(), config = %p.config.display(), "containerd started");
    Ok(child)
}

/// A containerd that an earlier ferrok (killed with -9) left running on
/// this root holds its database lock; it is stopped before a new one starts.
async fn stop_leftover(p: &ContainerdPaths) {
    let Some(pid) = std::fs::read_to_string(p.pid_file()).ok().and_then(|s| s.trim().parse::<i32>().ok()) else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let config = p.config.to_string_lossy();
    let ours = String::from_utf8_lossy(&cmdline).split('\0').any(|a| a == config);
    if !ours {
        return;
    }
    tracing::info!(pid, "stopping the containerd an earlier ferrok left running");
    terminate(pid, Duration::from_secs(10)).await;
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

async fn terminate(pid: i32, grace: Duration) {
    // SAFETY: kill(2) with a pid we read from our own pid file and checked.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = tokio::time::Instant::now() + grace;
    while alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if alive(pid) {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

async fn wait_for_socket(p: &ContainerdPaths, child: &mut Child) -> Result<(), ContainerdError> {
    let limit = Duration::from_secs(30);
    let deadline = tokio::time::Instant::now() + limit;
    let mut delay = Duration::from_millis(5);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ContainerdError::Exited { status, log: p.log() });
        }
        if tokio::net::UnixStream::connect(&p.socket).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(ContainerdError::NotReady(limit, p.log()));
        }
        tokio::time::sleep(delay).await;
        delay = crate::backoff::doubled(delay, Duration::from_millis(100));
    }
}

/// Restarts containerd when it dies (1 s doubling to 30 s, reset after a
/// minute up); stops it when asked.
async fn supervise(p: ContainerdPaths, child: Child, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_secs(1);
    let mut child = Some(child);
    loop {
        let started = tokio::time::Instant::now();
        let exited = async {
            match child.as_mut() {
                Some(c) => c.wait().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = exited => {
                tracing::warn!(status = ?status, log = %p.log().display(), "containerd exited; restarting it");
                child = None;
            }
            _ = stop.changed() => {
                if let Some(mut c) = child.take() {
                    if let Some(pid) = c.id() {
                        terminate(pid as i32, Duration::from_secs(10)).await;
                    }
                    let _ = c.wait().await;
                }
                let _ = std::fs::remove_file(p.pid_file());
                tracing::info!("containerd stopped");
                return;
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_secs(1);
        }
        while child.is_none() {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = crate::backoff::doubled(backoff, Duration::from_secs(30));
            match spawn(&p) {
                Ok(mut c) => {
                    if let Err(e) = wait_for_socket(&p, &mut c).await {
                        tracing::warn!(error = %e, "containerd did not come back yet");
                    }
                    child = Some(c);
                }
                Err(e) => tracing::error!(error = %e, "cannot restart containerd"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_every_path_and_runtime() {
        let paths = ContainerdPaths::new(Path::new("/d/agent"));
        let text = render_config(&ContainerdConfig {
            paths,
            sandbox_image: "ferrok.local/pause:1".into(),
            handlers: vec![
                RuntimeHandler { name: "runc".into(), binary: "/usr/sbin/runc".into() },
                RuntimeHandler { name: "crun".into(), binary: "/usr/bin/crun".into() },
            ],
            cni_bin_dir: "/usr/lib/cni".into(),
            max_container_log_line_size: 16384,
        });
        for want in [
            r#"root = "/d/agent/containerd""#,
            r#"address = "/d/agent/containerd/containerd.sock""#,
            "restrict_oom_score_adj = true",
            r#"sandbox_image = "ferrok.local/pause:1""#,
            r#"Root = "/d/agent/containerd/runc""#,
            r#"BinaryName = "/usr/bin/crun""#,
            r#"conf_dir = "/d/agent/etc/cni/net.d""#,
            r#"config_path = "/d/agent/etc/containerd/certs.d""#,
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }

    #[test]
    fn hybrid_cgroups_with_v2_controllers_rule_out_crun() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(hybrid_v2_controllers(d.path()), None);
        std::fs::create_dir_all(d.path().join("unified")).unwrap();
        std::fs::write(d.path().join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(hybrid_v2_controllers(d.path()), None);
        std::fs::write(d.path().join("unified/cgroup.controllers"), "hugetlb\n").unwrap();
        assert_eq!(hybrid_v2_controllers(d.path()).as_deref(), Some("hugetlb"));
        std::fs::write(d.path().join("cgroup.controllers"), "cpu memory").unwrap();
        assert_eq!(hybrid_v2_controllers(d.path()), None);
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
