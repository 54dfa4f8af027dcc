//! The kubelet's sync of one pod (upstream's kubelet.go): `sync_pod` brings
//! a running pod to its spec, `terminate_pod` stops it with its grace
//! period, `cleanup_pod` removes what it left once it is gone, and each
//! writes the pod's status through the status manager. Pod workers call
//! these (the kubelet is their `PodSyncer`); nothing here keeps state
//! between calls except through `PodState`. The prober's answers come
//! through [`ProbeResults`] (`prober_results`), the runtime through the
//! runtime manager's `RuntimeService`, so `tests` drive every step against
//! the doubles of `agent::testing`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector::Store;

use super::config::AgentConfig;
use super::cri::{api, CriError};
use super::dns;
use super::env::{self, EnvContext};
use super::events::Events;
use super::kuberuntime::actions::{self, KillReason, ProbeState};
use super::kuberuntime::manager::{ContainerStart, RuntimeManager, StartFailure, Waiting};
use super::kuberuntime::resources;
use super::kuberuntime::runtime_status::{self, ContainerRunState, RuntimePod};
use super::kuberuntime::sandbox;
use super::pod_status::{self, FailureKind, PodFailure, StatusInputs};
use super::pod_util::{self, ContainerKind};
use super::pod_workers::{PodState, PodSyncer, SyncResult};
use super::status_manager::StatusManager;
use super::volume_manager::{PodVolumes, VolumeManager};
use crate::client::events::EventType;

pub mod prober_results;

/// What the prober knows, for actions and status.
pub trait ProbeResults: Send + Sync {
    /// Makes sure the pod's running containers are probed (after a restart of ferrok, say).
    fn ensure(&self, pod: &Pod, rt: &RuntimePod, pod_ip: Option<std::net::IpAddr>);
    /// Containers to restart (liveness/startup failed) and containers started.
    fn state(&self, pod: &Pod, rt: &RuntimePod) -> ProbeState;
    /// Ready container ids.
    fn ready(&self, pod: &Pod, rt: &RuntimePod) -> HashSet<String>;
}

/// What every container started in one sync shares: the pod, the sandbox
/// it goes in, and what the pod has ready for it.
struct SandboxContext<'a> {
    pod: &'a Pod,
    rt: &'a RuntimePod,
    sandbox_id: &'a str,
    sandbox_config: &'a api::PodSandboxConfig,
    pod_ips: &'a [String],
    volumes: &'a PodVolumes,
    /// The pod's hosts file, mounted on /etc/hosts unless a volume is.
    hosts_file: Option<&'a PathBuf>,
}

pub struct Kubelet {
    pub client: kube::Client,
    pub config: Arc<AgentConfig>,
    pub runtime: Arc<RuntimeManager>,
    pub status: StatusManager,
    pub events: Events,
    /// `containerd`, for container ids.
    pub runtime_name: String,
    pub host_ips: Vec<String>,
    pub allocatable: BTreeMap<String, Quantity>,
    /// The allocatable the API holds for the node (what the scheduler
    /// counted, extended resources included), kept by the node status.
    pub node_allocatable: tokio::sync::watch::Receiver<BTreeMap<String, Quantity>>,
    pub services: Store<Service>,
    pub volumes: VolumeManager,
    pub probes: Arc<dyn ProbeResults>,
    /// Mirror pods of static pods, where their status is written.
    pub mirrors: Arc<super::static_pods::Mirrors>,
}

fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Doubles a retry delay from 1 s up to 30 s.
fn next_backoff(prev: Option<(Instant, Duration)>) -> (Instant, Duration) {
    let d = prev.map_or(Duration::from_secs(1), |(_, d)| crate::backoff::doubled(d, Duration::from_secs(30)));
    (Instant::now() + d, d)
}

impl Kubelet {
    pub fn pods_dir(&self) -> &PathBuf {
        &self.runtime.pods_dir
    }

    fn pod_log_dir(&self, pod: &Pod) -> PathBuf {
        sandbox::pod_log_dir(
            &self.runtime.pod_logs_dir,
            pod_util::namespace(pod),
            pod_util::name(pod),
            pod_util::uid(pod),
        )
    }

    fn services_for(&self, namespace: &str) -> Vec<Service> {
        self.services
            .state()
            .iter()
            .filter(|s| {
                let ns = s.metadata.namespace.as_deref().unwrap_or_default();
                ns == namespace || (ns == "default" && s.metadata.name.as_deref() == Some("kubernetes"))
            })
            .map(|s| (**s).clone())
            .collect()
    }

    /// The pod's status from what the runtime holds now.
    async fn status_of(&self, pod: &Pod, rt: &RuntimePod, st: &PodState, terminal: bool) -> PodStatus {
        // A static pod's last status is its mirror's.
        let with_mirror_status;
        let pod = match self.mirror_of(pod) {
            Some(m) => {
                let mut p = pod.clone();
                p.status = m.status.clone();
                with_mirror_status = p;
                &with_mirror_status
            }
            None => pod,
        };
        let mut messages = HashMap::new();
        for c in rt.containers.iter().filter(|c| c.state == ContainerRunState::Exited) {
            if let Some(m) = self.runtime.termination_message(c) {
                messages.insert(c.id.clone(), m);
            }
        }
        let probes = self.probes.state(pod, rt);
        let ready = self.probes.ready(pod, rt);
        let mut status = pod_status::generate(&StatusInputs {
            pod,
            rt,
            waiting: &st.waiting,
            ready: &ready,
            started: &probes.started,
            host_ips: &self.host_ips,
            runtime_name: &self.runtime_name,
            termination_messages: &messages,
            failure: st.failure.as_ref(),
            terminal,
        });
        super::eviction::add_disruption_target(&mut status, st.failure.as_ref());
        status
    }

    fn mirror_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        super::static_pods::is_static(pod).then(|| self.mirrors.get(pod_util::uid(pod))).flatten()
    }

    /// Hands the status to the status manager: for a static pod, as its
    /// mirror pod's (none is written until the mirror exists).
    fn publish(&self, pod: &Pod, status: &PodStatus) {
        if super::static_pods::is_static(pod) {
            if let Some(m) = self.mirror_of(pod) {
                self.status.set(&m, status);
            }
            return;
        }
        self.status.set(pod, status);
    }

    async fn read(&self, uid: &str) -> Result<RuntimePod, CriError> {
        let rt = runtime_status::read(self.runtime.cri.as_ref(), uid).await?;
        for c in &rt.containers {
            self.runtime.index.insert(&c.id, uid);
        }
        for s in &rt.sandboxes {
            self.runtime.index.insert(&s.id, uid);
        }
        Ok(rt)
    }

    /// Where the pod's network probes go: its sandbox's address, or the
    /// node's for host-network pods.
    fn pod_ip(&self, pod: &Pod, rt: &RuntimePod) -> Option<std::net::IpAddr> {
        if pod_util::spec(pod).host_network == Some(true) {
            return self.host_ips.first().and_then(|ip| ip.parse().ok());
        }
        rt.ready_sandbox().and_then(|s| s.ips.first()).and_then(|ip| ip.parse().ok())
    }

    fn deadline_exceeded(pod: &Pod) -> Option<PodFailure> {
        let deadline = pod_util::spec(pod).active_deadline_seconds?;
        let start = pod.status.as_ref()?.start_time.as_ref()?;
        let elapsed = k8s_openapi::jiff::Timestamp::now().as_second() - start.0.as_second();
        (elapsed >= deadline).then(|| PodFailure {
            kind: FailureKind::DeadlineExceeded,
            reason: "DeadlineExceeded".into(),
            message: "Pod was active on the node longer than the specified deadline".into(),
        })
    }

    /// Publishes the status while the pod waits for something (volumes, a sandbox).
    async fn publish_waiting(
        &self,
        pod: &Pod,
        rt: &RuntimePod,
        st: &PodState,
        next: Option<Duration>,
    ) -> Result<SyncResult, CriError> {
        let status = self.status_of(pod, rt, st, false).await;
        self.publish(pod, &status);
        Ok(SyncResult { next, terminal: false })
    }

    fn write_hosts_file(&self, pod: &Pod, pod_ips: &[String]) -> Option<PathBuf> {
        let dir = self.runtime.pods_dir.join(pod_util::uid(pod));
        let host_hosts = std::fs::read_to_string("/etc/hosts").ok();
        let text = dns::hosts_file(pod, pod_ips, &self.config.cluster_domain, host_hosts.as_deref());
        let path = dir.join("etc-hosts");
        let write = std::fs::create_dir_all(&dir).and_then(|_| super::containerd::write_atomic(&path, text.as_bytes()));
        match write {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(pod = %pod_util::full_name(pod), error = %e, "cannot write the pod's hosts file");
                None
            }
        }
    }

    /// Starts one container of the spec in the sandbox: its environment
    /// and mounts first, then the runtime manager's start.
    async fn start_one(
        &self,
        sandbox: &SandboxContext<'_>,
        kind: ContainerKind,
        c: &Container,
    ) -> Result<(), StartFailure> {
        let SandboxContext { pod, pod_ips, .. } = *sandbox;
        let cref = Events::container_ref(pod, kind, &c.name);
        let fail = |reason: &str, message: String| {
            self.events.container(&cref, EventType::Warning, "Failed", &format!("Error: {message}"));
            StartFailure {
                waiting: Waiting { reason: reason.into(), message },
                retry_after: Some(Duration::from_secs(10)),
            }
        };
        let services = self.services_for(pod_util::namespace(pod));
        let ctx = EnvContext {
            client: &self.client,
            services: &services,
            pod_ips,
            host_ips: &self.host_ips,
            node_name: &self.config.node_name,
            allocatable: &self.allocatable,
        };
        let (envs, invalid) = match env::make_environment(pod, c, &ctx).await {
            Ok(e) => e,
            Err(e) => return Err(fail("CreateContainerConfigError", e.to_string())),
        };
        if !invalid.is_empty() {
            let msg = format!("Keys [{}] from the EnvFrom configMap {}/… were skipped since they are considered invalid environment variable names.", invalid.join(", "), pod_util::namespace(pod));
            self.events.pod(pod, EventType::Warning, "InvalidEnvironmentVariableNames", &msg);
        }
        let env_map: BTreeMap<String, String> = envs.iter().cloned().collect();
        let mut container_mounts =
            sandbox.volumes.mounts_for(c, &env_map).map_err(|e| fail("CreateContainerConfigError", e.to_string()))?;
        let mounts_hosts = !container_mounts.iter().any(|m| m.container_path == "/etc/hosts");
        if let (Some(h), true) = (sandbox.hosts_file, mounts_hosts) {
            container_mounts.push(api::Mount {
                container_path: "/etc/hosts".into(),
                host_path: h.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        let pod_ip = pod_ips.first().and_then(|ip| ip.parse().ok());
        let start = ContainerStart {
            pod,
            kind,
            container: c,
            rt: sandbox.rt,
            sandbox_id: sandbox.sandbox_id,
            sandbox_config: sandbox.sandbox_config,
            envs: &envs,
            mounts: container_mounts,
            pod_ip,
        };
        self.runtime.start_container(start).await.map(|_| ())
    }

    /// Removes what the runtime and disk hold for a pod uid no longer known
    /// to the API (deleted while ferrok was down).
    pub async fn cleanup_orphan(&self, uid: &str) -> Result<(), CriError> {
        let rt = self.read(uid).await?;
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.to_string());
        self.runtime.kill_pod(&pod, &rt, 2).await;
        let rt = self.read(uid).await?;
        let log_dir = self.orphan_log_dir(uid);
        self.runtime.remove_pod(uid, &rt, log_dir).await?;
        if let Err(e) = self.volumes.unmount_pod(uid).await {
            tracing::warn!(pod_uid = %uid, error = %e, "cannot unmount an orphaned pod's volumes");
        }
        let _ = std::fs::remove_dir_all(self.runtime.pods_dir.join(uid));
        resources::remove_pod_cgroups(&self.runtime.cgroup_root, uid);
        Ok(())
    }

    fn orphan_log_dir(&self, uid: &str) -> Option<PathBuf> {
        let entries = std::fs::read_dir(&self.runtime.pod_logs_dir).ok()?;
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&format!("_{uid}"))))
    }

    /// Every pod uid the runtime or the disk has something of.
    pub async fn known_uids(&self) -> Result<HashSet<String>, CriError> {
        let mut out = HashSet::new();
        let sandboxes = self.runtime.cri.list_pod_sandboxes(None).await?;
        for s in sandboxes {
            if let Some(uid) = s.labels.get(super::cri::labels::POD_UID) {
                out.insert(uid.clone());
            }
        }
        out.extend(self.volumes.pods_on_disk());
        if let Ok(entries) = std::fs::read_dir(&self.runtime.pods_dir) {
            out.extend(entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str().map(str::to_string)));
        }
        Ok(out)
    }
}

/// The steps of a pod's life its worker calls.
#[async_trait::async_trait]
impl PodSyncer for Kubelet {
    /// Brings a running pod to its spec (upstream's syncPod).
    async fn sync_pod(&self, pod: &Pod, st: &mut PodState) -> Result<SyncResult, CriError> {
        let uid = pod_util::uid(pod).to_string();
        if let Some(f) = Self::deadline_exceeded(pod) {
            self.events.pod(pod, EventType::Normal, "DeadlineExceeded", &f.message);
            st.failure = Some(f);
            return Ok(SyncResult { next: None, terminal: true });
        }
        let mut rt = self.read(&uid).await?;
        let mut next: Option<Duration> = None;
        // Exits the PLEG announced but CRI has not caught up with yet.
        st.expected_exits
            .retain(|id| rt.containers.iter().any(|c| &c.id == id && c.state == ContainerRunState::Running));
        if !st.expected_exits.is_empty() {
            next = Some(Duration::from_millis(100));
        }

        // Volumes first: nothing starts without them.
        if let Some((until, _)) = st.volume_backoff.filter(|(u, _)| Instant::now() < *u) {
            return self.publish_waiting(pod, &rt, st, Some(until - Instant::now())).await;
        }
        let mounts = match self.volumes.mount_pod(pod).await {
            Ok(m) => {
                st.volume_backoff = None;
                self.volumes.pod_updated(pod).await;
                m
            }
            Err(e) => {
                for msg in e.event_messages() {
                    self.events.pod(pod, EventType::Warning, e.event_reason(), &msg);
                }
                let b = next_backoff(st.volume_backoff);
                st.volume_backoff = Some(b);
                return self.publish_waiting(pod, &rt, st, Some(b.1)).await;
            }
        };

        let pod_ip = self.pod_ip(pod, &rt);
        self.probes.ensure(pod, &rt, pod_ip);
        let probes = self.probes.state(pod, &rt);
        let acts = actions::compute(pod, &rt, &probes);
        let grace = pod_util::spec(pod).termination_grace_period_seconds.unwrap_or(30);
        if acts.kill_pod {
            self.runtime.kill_pod(pod, &rt, grace).await;
        }
        for k in &acts.kill {
            let probe = match k.reason {
                KillReason::ProbeFailed(t) => Some(t),
                KillReason::DefinitionChanged | KillReason::UnknownState => None,
            };
            let grace = match pod_util::find_any_container(pod, &k.name) {
                Some((_, c)) => super::prober::kill_grace_period(pod, &c, probe),
                None => grace,
            };
            self.runtime.kill_container(pod, &k.id, &k.name, grace, Some(&k.message())).await;
        }
        let mut sandbox_id = acts.sandbox_id.clone();
        let mut sandbox_config = None;
        if acts.create_sandbox {
            if let Some((until, _)) = st.sandbox_backoff.filter(|(u, _)| Instant::now() < *u) {
                return self.publish_waiting(pod, &rt, st, Some(until - Instant::now())).await;
            }
            if !rt.sandboxes.is_empty() {
                self.events.pod(
                    pod,
                    EventType::Normal,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                );
            }
            match self.runtime.create_sandbox(pod, acts.attempt).await {
                Ok((id, cfg)) => {
                    st.sandbox_backoff = None;
                    sandbox_id = Some(id);
                    sandbox_config = Some(cfg);
                }
                Err(msg) => {
                    let m = format!("Failed to create pod sandbox: {msg}");
                    self.events.pod(pod, EventType::Warning, "FailedCreatePodSandBox", &m);
                    let b = next_backoff(st.sandbox_backoff);
                    st.sandbox_backoff = Some(b);
                    return self.publish_waiting(pod, &rt, st, Some(b.1)).await;
                }
            }
        }
        if let (Some(id), false) = (&sandbox_id, acts.start.is_empty()) {
            let cfg = match sandbox_config.take() {
                Some(c) => c,
                None => self.runtime.sandbox_config(pod, rt.sandboxes.first().map(|s| s.attempt).unwrap_or(0)),
            };
            let pod_ips = if pod_util::spec(pod).host_network == Some(true) {
                self.host_ips.clone()
            } else {
                self.runtime.sandbox_ips(id).await
            };
            let hosts = self.write_hosts_file(pod, &pod_ips);
            // The pod is visible as ContainerCreating while images are pulled.
            let early = self.status_of(pod, &rt, st, false).await;
            self.publish(pod, &early);
            let sandbox = SandboxContext {
                pod,
                rt: &rt,
                sandbox_id: id,
                sandbox_config: &cfg,
                pod_ips: &pod_ips,
                volumes: &mounts,
                hosts_file: hosts.as_ref(),
            };
            for start in &acts.start {
                let Some((kind, c)) = pod_util::find_any_container(pod, &start.name) else { continue };
                match self.start_one(&sandbox, kind, &c).await {
                    Ok(()) => {
                        st.waiting.remove(&c.name);
                        // Look again at once: a started sidecar lets the
                        // next container go, as upstream's PLEG relist would.
                        next = sooner(next, Some(Duration::from_millis(50)));
                    }
                    Err(f) => {
                        next = sooner(next, f.retry_after);
                        st.waiting.insert(c.name.clone(), f.waiting);
                    }
                }
                // An init container runs alone; the next starts when it is done.
                if kind == ContainerKind::Init {
                    break;
                }
            }
        }
        // Reasons of containers no longer being started are stale.
        let starting: HashSet<&str> = acts.start.iter().map(|s| s.name.as_str()).collect();
        st.waiting.retain(|name, _| starting.contains(name.as_str()));
        rt = self.read(&uid).await?;
        self.runtime.prune_dead(&rt).await;
        let status = self.status_of(pod, &rt, st, false).await;
        let terminal = matches!(status.phase.as_deref(), Some("Succeeded") | Some("Failed"));
        self.publish(pod, &status);
        Ok(SyncResult { next, terminal })
    }

    /// Stops every container of the pod and its sandbox, then writes the
    /// pod's final status (upstream's syncTerminatingPod).
    async fn terminate_pod(&self, pod: &Pod, st: &mut PodState, grace: i64, in_api: bool) -> Result<(), CriError> {
        let uid = pod_util::uid(pod).to_string();
        let rt = self.read(&uid).await?;
        self.runtime.kill_pod(pod, &rt, grace).await;
        if in_api {
            let rt = self.read(&uid).await?;
            st.waiting.clear();
            let status = self.status_of(pod, &rt, st, true).await;
            self.publish(pod, &status);
        }
        Ok(())
    }

    /// After termination: volumes are released; a deleted pod loses its
    /// containers, sandbox, logs, cgroups and folders, and its API object
    /// goes (upstream's syncTerminatedPod and the status manager's delete).
    async fn cleanup_pod(&self, pod: &Pod, deleted: bool) -> Result<(), CriError> {
        let uid = pod_util::uid(pod).to_string();
        if let Err(e) = self.volumes.unmount_pod(&uid).await {
            tracing::warn!(pod = %pod_util::full_name(pod), error = %e, "cannot unmount the pod's volumes");
        }
        if !deleted {
            return Ok(());
        }
        let rt = self.read(&uid).await?;
        self.runtime.remove_pod(&uid, &rt, Some(self.pod_log_dir(pod))).await?;
        let dir = self.runtime.pods_dir.join(&uid);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the pod's folder");
            }
        }
        resources::remove_pod_cgroups(&self.runtime.cgroup_root, &uid);
        self.status.forget(&uid);
        Ok(())
    }

    /// Deletes the API object of a pod whose containers are all gone.
    async fn finish_deletion(&self, pod: &Pod) {
        if super::static_pods::is_static(pod) {
            // Its mirror goes with its manifest (static_pods).
            return;
        }
        let (ns, name, uid) = (pod_util::namespace(pod), pod_util::name(pod), pod_util::uid(pod));
        if let Err(e) = self.status.delete_pod(ns, name, uid).await {
            tracing::warn!(pod = %pod_util::full_name(pod), error = %e, "cannot delete the terminated pod");
        }
    }
}

#[cfg(test)]
mod tests;
