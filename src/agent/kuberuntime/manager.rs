//! The runtime manager's verbs (upstream's kuberuntime_manager and
//! kuberuntime_container): make a sandbox, start a container (image, env,
//! config, create, start, postStart hook), kill a container (preStop hook,
//! then stop with the grace period), stop a pod, and remove everything the
//! runtime holds for a pod.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::Api;

use super::container::{container_config, ContainerInputs};
use super::runtime_status::{ContainerRunState, RuntimePod};
use super::sandbox::{self, SandboxInputs};
use super::security;
use crate::agent::cri::{api, labels, CriError, RuntimeService};
use crate::agent::dns::DnsSettings;
use crate::agent::events::Events;
use crate::agent::image_manager::ImageManager;
use crate::agent::pleg::ContainerIndex;
use crate::agent::pod_util::{self, ContainerKind};
use crate::agent::prober::exec::ExecError;
use crate::agent::prober::http::{HttpError, RequestError};
use crate::backoff::Backoff;
use crate::client::events::EventType;

/// The smallest grace period a container is stopped with (upstream's minimumGracePeriodInSeconds).
const MIN_GRACE_SECONDS: i64 = 2;

/// Runs lifecycle hooks (postStart, preStop) in a container.
#[async_trait::async_trait]
pub trait HookRunner: Send + Sync {
    async fn run(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        handler: &LifecycleHandler,
    ) -> Result<(), HookError>;
}

/// Why a hook failed: the message of upstream's `FailedPostStartHook` or
/// `FailedPreStopHook` event. Container and pod names come quoted.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("Exec lifecycle hook ({command}) for Container {container} in Pod {pod} failed - error: {source}, message: {output}")]
    Exec { command: String, container: String, pod: String, source: ExecError, output: String },
    #[error("HTTP lifecycle hook ({path}) for Container {container} in Pod {pod} failed - error: {source}")]
    Http { path: String, container: String, pod: String, source: HttpHookError },
    #[error("Cannot run handler: invalid handler: {0}")]
    InvalidHandler(String),
}

/// Why a pod's sandbox was not made (the FailedCreatePodSandBox event's words).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot create the pod log folder {path}: {source}")]
    LogFolder { path: String, source: std::io::Error },
    #[error("RuntimeClass {0:?} not found")]
    NoRuntimeClass(String),
    #[error("cannot read RuntimeClass {name:?}: {source}")]
    RuntimeClass { name: String, source: kube::Error },
    /// The runtime's own words.
    #[error("{}", .0.message())]
    Runtime(#[source] CriError),
}

/// Why an httpGet hook got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpHookError {
    #[error("failed to find networking container: the pod sandbox has no IP address")]
    NoSandboxIp,
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Get(#[from] HttpError),
}

/// What the prober is told about containers' lives.
pub trait ProbeRegistry: Send + Sync {
    fn add_container(&self, pod: &Pod, container: &Container, container_id: &str, pod_ip: Option<std::net::IpAddr>);
    fn remove_container(&self, pod_uid: &str, container_name: &str);
    fn remove_pod(&self, pod_uid: &str);
}

/// Why a container is not running, as the last attempt to start it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// One container of the spec to start in a ready sandbox (upstream's
/// startContainer arguments).
pub struct ContainerStart<'a> {
    pub pod: &'a Pod,
    pub kind: ContainerKind,
    pub container: &'a Container,
    /// What the runtime holds for the pod (the container's earlier instances).
    pub rt: &'a RuntimePod,
    pub sandbox_id: &'a str,
    pub sandbox_config: &'a api::PodSandboxConfig,
    pub envs: &'a [(String, String)],
    pub mounts: Vec<api::Mount>,
    /// Where the container's probes go.
    pub pod_ip: Option<std::net::IpAddr>,
}

/// Why a container did not start, and when to try again.
#[derive(Debug, Clone)]
pub struct StartFailure {
    pub waiting: Waiting,
    pub retry_after: Option<Duration>,
}

pub struct RuntimeManager {
    /// The runtime's sandboxes and containers (containerd, or a test double).
    pub cri: Arc<dyn RuntimeService>,
    pub client: kube::Client,
    pub events: Events,
    pub images: ImageManager,
    pub index: Arc<ContainerIndex>,
    pub crash_backoff: Backoff,
    pub hooks: Option<Arc<dyn HookRunner>>,
    pub probes: Option<Arc<dyn ProbeRegistry>>,
    pub dns: DnsSettings,
    pub pods_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub cgroup_root: String,
    pub memory_capacity: i64,
}

/// The Instant a wall-clock time in nanoseconds corresponds to.
fn instant_of(unix_nanos: i64) -> Instant {
    let now_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
    let ago = Duration::from_nanos(now_unix.saturating_sub(unix_nanos).max(0) as u64);
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

impl RuntimeManager {
    pub fn sandbox_config(&self, pod: &Pod, attempt: u32) -> api::PodSandboxConfig {
        sandbox::sandbox_config(
            pod,
            attempt,
            &SandboxInputs { pod_logs_dir: &self.pod_logs_dir, cgroup_root: &self.cgroup_root, dns: &self.dns },
        )
    }

    /// The CRI handler of the pod's RuntimeClass ("" for the default).
    async fn runtime_handler(&self, pod: &Pod) -> Result<String, SandboxError> {
        let Some(name) = pod_util::spec(pod).runtime_class_name.as_deref().filter(|n| !n.is_empty()) else {
            return Ok(String::new());
        };
        match Api::<RuntimeClass>::all(self.client.clone()).get_opt(name).await {
            Ok(Some(rc)) => Ok(rc.handler),
            Ok(None) => Err(SandboxError::NoRuntimeClass(name.to_string())),
            Err(source) => Err(SandboxError::RuntimeClass { name: name.to_string(), source }),
        }
    }

    /// Makes the pod's sandbox; returns its id and config.
    pub async fn create_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
    ) -> Result<(String, api::PodSandboxConfig), SandboxError> {
        let config = self.sandbox_config(pod, attempt);
        std::fs::create_dir_all(&config.log_directory)
            .map_err(|source| SandboxError::LogFolder { path: config.log_directory.clone(), source })?;
        let handler = self.runtime_handler(pod).await?;
        let id = self.cri.run_pod_sandbox(config.clone(), handler).await.map_err(SandboxError::Runtime)?;
        self.index.insert(&id, pod_util::uid(pod));
        Ok((id, config))
    }

    /// The pod's addresses from its sandbox.
    pub async fn sandbox_ips(&self, sandbox_id: &str) -> Vec<String> {
        let Ok(status) = self.cri.pod_sandbox_status(sandbox_id).await else { return Vec::new() };
        let Some(net) = status.and_then(|s| s.network) else { return Vec::new() };
        let mut ips = vec![net.ip];
        ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
        ips.retain(|i| !i.is_empty());
        ips
    }

    fn termination_log(&self, pod: &Pod, c: &Container) -> Option<api::Mount> {
        let path = c.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
        if path.is_empty() {
            return None;
        }
        let dir = self.pods_dir.join(pod_util::uid(pod)).join("containers").join(&c.name);
        std::fs::create_dir_all(&dir).ok()?;
        let mut buf = [0u8; 4];
        crate::host::random::fill(&mut buf);
        let file = dir.join(format!("{:08x}", u32::from_be_bytes(buf)));
        std::fs::write(&file, b"").ok()?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).ok()?;
        Some(api::Mount { container_path: path, host_path: file.to_string_lossy().into_owned(), ..Default::default() })
    }

    fn fail(&self, pod: &Pod, kind: ContainerKind, name: &str, reason: &str, message: String) -> StartFailure {
        let r = Events::container_ref(pod, kind, name);
        self.events.container(&r, EventType::Warning, "Failed", &format!("Error: {message}"));
        StartFailure { waiting: Waiting { reason: reason.into(), message }, retry_after: None }
    }

    /// Starts one container of the spec in the sandbox (upstream's startContainer).
    pub async fn start_container(&self, start: ContainerStart<'_>) -> Result<String, StartFailure> {
        let ContainerStart { pod, kind, container: c, rt, sandbox_id, sandbox_config, envs, mut mounts, pod_ip } =
            start;
        let uid = pod_util::uid(pod);
        let latest = rt.latest(&c.name);
        let restart_count = latest.map(|l| l.restart_count + 1).unwrap_or(0);
        let cref = Events::container_ref(pod, kind, &c.name);
        // Crash-loop back-off, counted from when the last instance ended.
        if let Some(l) = latest.filter(|l| l.state == ContainerRunState::Exited) {
            let key = format!("{uid}/{}", c.name);
            let now = Instant::now();
            if let Some(left) = self.crash_backoff.remaining_since(&key, instant_of(l.finished_at), now) {
                let delay = self.crash_backoff.get(&key, now).unwrap_or(left);
                let msg =
                    format!("Back-off restarting failed container {} in pod {}", c.name, pod_util::full_name(pod));
                self.events.container(&cref, EventType::Warning, "BackOff", &msg);
                return Err(StartFailure {
                    waiting: Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {} restarting failed container={} pod={}",
                            go_duration(delay),
                            c.name,
                            pod_util::full_name(pod)
                        ),
                    },
                    retry_after: Some(left),
                });
            }
            self.crash_backoff.next(&key, now);
        }
        let image = match self.images.ensure_image(pod, c, &cref, Some(sandbox_config)).await {
            Ok(i) => i,
            Err(e) => {
                // After ErrImagePull the pod shows ImagePullBackOff while the
                // back-off runs (a sync soon), then the pull is tried again.
                let retry = match e.reason {
                    "ErrImagePull" => Some(Duration::from_secs(1)),
                    _ => self.images.backoff_remaining(pod, c.image.as_deref().unwrap_or_default()),
                };
                return Err(StartFailure {
                    waiting: Waiting { reason: e.reason.into(), message: e.message },
                    retry_after: retry.or(Some(Duration::from_secs(10))),
                });
            }
        };
        if let Err(e) = security::verify_run_as_non_root(pod, c, image.uid, &image.username) {
            return Err(self.fail(pod, kind, &c.name, "CreateContainerConfigError", e.to_string()));
        }
        if let Some(m) = self.termination_log(pod, c) {
            mounts.push(m);
        }
        // An ephemeral container's target (upstream's getTargetID).
        let target = pod_util::ephemeral_target(pod, &c.name).filter(|_| kind == ContainerKind::Ephemeral);
        let target_id = match target {
            Some(t) => match rt.latest(t) {
                Some(tc) => Some(tc.id.clone()),
                None => {
                    let msg = format!("unable to find target container {t}");
                    return Err(self.fail(pod, kind, &c.name, "CreateContainerConfigError", msg));
                }
            },
            None => None,
        };
        let config = container_config(&ContainerInputs {
            pod,
            container: c,
            kind,
            restart_count,
            image_ref: &image.id,
            envs,
            mounts,
            memory_capacity: self.memory_capacity,
            target_id: target_id.as_deref(),
        });
        let log_dir = PathBuf::from(&sandbox_config.log_directory).join(&c.name);
        if let Err(e) = std::fs::create_dir_all(&log_dir) {
            return Err(self.fail(
                pod,
                kind,
                &c.name,
                "CreateContainerError",
                format!("create container log directory for container {} failed: {e}", c.name),
            ));
        }
        let id = match self.cri.create_container(sandbox_id, config, sandbox_config.clone()).await {
            Ok(id) => id,
            Err(e) => return Err(self.fail(pod, kind, &c.name, "CreateContainerError", e.message())),
        };
        self.index.insert(&id, uid);
        self.events.container(&cref, EventType::Normal, "Created", &format!("Created container: {}", c.name));
        if let Err(e) = self.cri.start_container(&id).await {
            return Err(self.fail(pod, kind, &c.name, "RunContainerError", e.message()));
        }
        self.events.container(&cref, EventType::Normal, "Started", &format!("Started container {}", c.name));
        if let Some(p) = &self.probes {
            p.add_container(pod, c, &id, pod_ip);
        }
        if let (Some(hook), Some(hooks)) = (c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()), &self.hooks) {
            if let Err(e) = hooks.run(pod, c, &id, hook).await {
                let msg = e.to_string();
                tracing::info!(pod = %pod_util::full_name(pod), container = %c.name, error = %msg, "postStart hook failed");
                self.events.container(&cref, EventType::Warning, "FailedPostStartHook", "PostStartHook failed");
                let grace = pod_util::spec(pod).termination_grace_period_seconds.unwrap_or(30);
                self.kill_container(pod, &id, &c.name, grace, Some("FailedPostStartHook")).await;
                return Err(StartFailure {
                    waiting: Waiting { reason: "PostStartHookError".into(), message: msg },
                    retry_after: None,
                });
            }
        }
        Ok(id)
    }

    /// Stops a container: preStop hook first, then SIGTERM and, after
    /// what is left of the grace period, SIGKILL (upstream's killContainer).
    pub async fn kill_container(&self, pod: &Pod, id: &str, name: &str, grace_seconds: i64, message: Option<&str>) {
        let kind = pod_util::find_any_container(pod, name).map(|(k, _)| k).unwrap_or(ContainerKind::Regular);
        let cref = Events::container_ref(pod, kind, name);
        let msg = match message {
            Some("FailedPostStartHook") => format!("FailedPostStartHook: container {name} will be stopped"),
            Some(m) => m.to_string(),
            None => format!("Stopping container {name}"),
        };
        self.events.container(&cref, EventType::Normal, "Killing", &msg);
        let started = Instant::now();
        let mut grace = grace_seconds.max(MIN_GRACE_SECONDS);
        let spec = pod_util::find_any_container(pod, name).map(|(_, c)| c.into_owned());
        if let (Some(c), Some(hooks)) = (spec.as_ref(), &self.hooks) {
            if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
                let run = hooks.run(pod, c, id, pre_stop);
                match tokio::time::timeout(Duration::from_secs(grace as u64), run).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        self.events.container(&cref, EventType::Warning, "FailedPreStopHook", &e.to_string());
                    }
                    Err(_) => {
                        let m = format!("PreStopHook failed to complete in {grace}s");
                        self.events.container(&cref, EventType::Warning, "FailedPreStopHook", &m);
                    }
                }
                grace = (grace - started.elapsed().as_secs() as i64).max(MIN_GRACE_SECONDS);
            }
        }
        if let Err(e) = self.cri.stop_container(id, grace).await {
            if !e.is_not_found() {
                tracing::warn!(container = %id, error = %e.message(), "cannot stop container");
            }
        }
        if let Some(p) = &self.probes {
            p.remove_container(pod_util::uid(pod), name);
        }
    }

    /// Stops every running container (regular ones first, sidecars after,
    /// each group in parallel) and then the sandboxes.
    pub async fn kill_pod(&self, pod: &Pod, rt: &RuntimePod, grace_seconds: i64) {
        let running: Vec<_> = rt.running().cloned().collect();
        let is_sidecar = |name: &str| matches!(pod_util::find_container(pod, name), Some((ContainerKind::Sidecar, _)));
        for sidecars in [false, true] {
            let group = running.iter().filter(|c| is_sidecar(&c.name) == sidecars);
            futures_util::future::join_all(
                group.map(|c| self.kill_container(pod, &c.id, &c.name, grace_seconds, None)),
            )
            .await;
        }
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            if let Err(e) = self.cri.stop_pod_sandbox(&s.id).await {
                if !e.is_not_found() {
                    tracing::warn!(sandbox = %s.id, error = %e.message(), "cannot stop sandbox");
                }
            }
        }
    }

    /// Removes all the runtime holds for the pod: containers, sandboxes (and
    /// with them its network), then its log folder.
    pub async fn remove_pod(&self, uid: &str, rt: &RuntimePod, log_dir: Option<PathBuf>) -> Result<(), CriError> {
        for c in &rt.containers {
            match self.cri.remove_container(&c.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        for s in &rt.sandboxes {
            let _ = self.cri.stop_pod_sandbox(&s.id).await;
            match self.cri.remove_pod_sandbox(&s.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(dir) = log_dir {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::debug!(dir = %dir.display(), error = %e, "cannot remove pod logs");
                }
            }
        }
        self.index.forget_pod(uid);
        if let Some(p) = &self.probes {
            p.remove_pod(uid);
        }
        self.images.forget_pod(uid);
        Ok(())
    }

    /// Removes a container and its log files (containerd leaves them); one
    /// already gone is no error.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let log_path = match self.cri.container_status(id).await {
            Ok(status) => status.map(|s| s.log_path).unwrap_or_default(),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        match self.cri.remove_container(id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        crate::agent::logs::rotation::remove_container_logs(&log_path);
        Ok(())
    }

    /// Removes a sandbox (and with it its network).
    pub async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.cri.remove_pod_sandbox(id).await
    }

    /// Removes dead instances older than the newest two of each container
    /// (the current one and the one `lastState` and `logs --previous` show),
    /// as the kubelet's container GC keeps them bounded.
    pub async fn prune_dead(&self, rt: &RuntimePod) {
        let mut count: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for c in &rt.containers {
            let n = count.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 2 && c.state == ContainerRunState::Exited {
                match self.cri.remove_container(&c.id).await {
                    // containerd leaves the log files: they go with the container.
                    Ok(()) => crate::agent::logs::rotation::remove_container_logs(&c.log_path),
                    Err(e) => {
                        tracing::debug!(container = %c.id, error = %e.message(), "cannot remove a dead container")
                    }
                }
            }
        }
    }

    /// The termination message a container left (file, or log tail on error).
    pub fn termination_message(&self, c: &super::runtime_status::RuntimeContainer) -> Option<String> {
        let path = c.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)?;
        let policy =
            c.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY).map(String::as_str).unwrap_or("File");
        let mount = c.mounts.iter().find(|m| &m.container_path == path);
        let from_file = mount.and_then(|m| read_at_most(&m.host_path, 4096)).unwrap_or_default();
        if !from_file.is_empty() {
            return Some(from_file);
        }
        if policy == "FallbackToLogsOnError" && c.exit_code != 0 {
            return Some(log_tail(&c.log_path, 80, 2048));
        }
        None
    }
}

fn read_at_most(path: &str, max: u64) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.by_ref().take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `lines` lines of a CRI log, their text only, at most `max` bytes.
fn log_tail(path: &str, lines: usize, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut out = String::new();
    for line in &all[start..] {
        // `<time> <stream> <F|P> <text>`
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(""));
        out.push_str(msg);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > max {
        let cut = out.len() - max;
        let mut i = cut;
        while !out.is_char_boundary(i) {
            i += 1;
        }
        out = out[i..].to_string();
    }
    out
}

/// A duration as Go prints it (`10s`, `1m20s`, `5m0s`).
pub use crate::duration::format as go_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(80)), "1m20s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    }

    #[test]
    fn log_tail_keeps_text_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        std::fs::write(
            &p,
            "2026-01-01T00:00:00Z stdout F one\n2026-01-01T00:00:00Z stderr P tw\n2026-01-01T00:00:00Z stderr F o\n",
        )
        .unwrap();
        assert_eq!(log_tail(p.to_str().unwrap(), 80, 2048), "one\ntwo\n");
        assert_eq!(log_tail(p.to_str().unwrap(), 80, 4), "two\n");
    }
}
