//! Node-pressure eviction (upstream's eviction manager). Every 10 s the
//! node's signals are observed (see `signals` for what memory.available
//! means here) and compared with the hard and soft thresholds. Conditions
//! (MemoryPressure, DiskPressure, PIDPressure) follow the thresholds met,
//! held for the pressure transition period, and reach the Node through the
//! node status' watch channel. A threshold met for its grace period is
//! acted on: for disk, node-level reclaim first (container GC, then unused
//! images); if that is not enough, one pod per pass is evicted, ranked as
//! upstream ranks them, never a critical one. Pods over their emptyDir
//! size limits or ephemeral-storage limits are evicted whatever the
//! node's state. An evicted pod fails with reason `Evicted`, upstream's
//! message, the `DisruptionTarget` condition and an `Evicted` event, and
//! its worker stops it (no grace for hard thresholds, the soft grace
//! otherwise).

pub mod admission;
pub mod local_storage;
pub mod ranking;
pub mod signals;
pub mod stats;
pub mod thresholds;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

use super::config::{KubeletConfig, Signal};
use super::container_gc::ContainerGc;
use super::cri::{Cri, CriError};
use super::events::Events;
use super::image_gc::ImageGcManager;
use super::kuberuntime::sandbox;
use super::node_status::NodePressure;
use super::pod_status::{FailureKind, PodFailure};
use super::pod_util;
use crate::client::events::EventType;
use ranking::PodUsage;
use thresholds::{EvictionThreshold, Pressure, ThresholdState};

/// How often signals are observed (upstream's monitoring interval).
pub const MONITOR_PERIOD: Duration = Duration::from_secs(10);
/// The status reason of an evicted pod.
pub const REASON: &str = "Evicted";
/// The grace period of a hard eviction (upstream's immediateEvictionGracePeriodSeconds;
/// the runtime manager raises it to its minimum).
const IMMEDIATE_GRACE_SECONDS: i64 = 1;

/// Adds the `DisruptionTarget` condition of a pod the node evicted
/// (reason `TerminationByKubelet`), keeping the time of one already there.
/// A pod rejected at admission never ran: it gets none, as upstream.
pub fn add_disruption_target(status: &mut PodStatus, failure: Option<&PodFailure>) {
    let evicted = |f: &&PodFailure| f.kind == FailureKind::Evicted;
    let Some(f) = failure.filter(evicted) else { return };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let wanted = PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(f.message.clone()),
        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    match conditions.iter_mut().find(|c| c.type_ == wanted.type_) {
        Some(c) if c.status == wanted.status && c.reason == wanted.reason => {}
        Some(c) => *c = wanted,
        None => conditions.push(wanted),
    }
}

/// What the eviction manager asks of the node's pods (upstream's
/// ActivePodsFunc, KillPodFunc and PodCleanedUpFunc): the pod workers.
pub trait PodKiller: Send + Sync {
    /// The pods meant to be running: in their source, not being deleted,
    /// not finished, and not already told to end.
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// Whether the pod is still on the node (its worker has not finished).
    fn is_known(&self, uid: &str) -> bool;
    /// Ends a running pod with `failure`, its containers getting
    /// `grace_seconds`; false when the pod is not on the node.
    fn kill_pod(&self, uid: &str, failure: PodFailure, grace_seconds: i64) -> bool;
}

/// Where the eviction manager measures: the node's settings and folders.
pub struct EvictionConfig {
    pub kubelet: KubeletConfig,
    /// The agent's folder: the node filesystem.
    pub node_fs: PathBuf,
    /// containerd's root: the image filesystem.
    pub image_fs: PathBuf,
    /// `<agent>/pods`: the pods' folders (emptyDir volumes).
    pub pods_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub cgroup_root: String,
}

/// Upstream's eviction manager, handed what it needs: the runtime's stats,
/// the pods (through [`PodKiller`]), the node's two garbage collectors, and
/// the channel the node status reads the pressure from.
pub struct EvictionManager {
    config: EvictionConfig,
    cri: Cri,
    events: Events,
    pods: Arc<dyn PodKiller>,
    pressure: Arc<watch::Sender<NodePressure>>,
    container_gc: Arc<ContainerGc>,
    image_gc: Arc<ImageGcManager>,
    state: ThresholdState,
    /// Pods told to go, until their workers are gone.
    evicted: HashSet<String>,
    /// The last pass found nothing to evict (said once, not every pass).
    nothing_to_evict: bool,
}

/// The node's garbage collectors, for node-level reclaim under disk pressure.
pub struct Reclaimers {
    pub containers: Arc<ContainerGc>,
    pub images: Arc<ImageGcManager>,
}

impl EvictionManager {
    pub fn new(
        config: EvictionConfig,
        cri: Cri,
        events: Events,
        pods: Arc<dyn PodKiller>,
        pressure: Arc<watch::Sender<NodePressure>>,
        reclaim: Reclaimers,
    ) -> Self {
        EvictionManager {
            config,
            cri,
            events,
            pods,
            pressure,
            container_gc: reclaim.containers,
            image_gc: reclaim.images,
            state: ThresholdState::default(),
            evicted: HashSet::new(),
            nothing_to_evict: false,
        }
    }

    /// Observes and acts every monitor period, for ever.
    pub async fn run(mut self) {
        loop {
            self.synchronize(Instant::now()).await;
            tokio::time::sleep(MONITOR_PERIOD).await;
        }
    }

    fn observe(&self) -> signals::Observations {
        signals::observe(&self.config.node_fs, &self.config.image_fs)
    }

    /// One pass (upstream's synchronize).
    pub async fn synchronize(&mut self, now: Instant) {
        let pods = self.pods.clone();
        self.evicted.retain(|uid| pods.is_known(uid));
        let active: Vec<Arc<Pod>> =
            pods.active_pods().into_iter().filter(|p| !self.evicted.contains(pod_util::uid(p))).collect();
        if self.local_storage_eviction(&active).await {
            return;
        }
        let kc = &self.config.kubelet;
        let observations = self.observe();
        let met = thresholds::met(&thresholds::configured(kc), &observations);
        let pressure = self.state.pressure(&met, now, kc.eviction_pressure_transition_period);
        self.pressure.send_if_modified(|p| {
            let changed = *p != pressure;
            if changed {
                tracing::info!(?pressure, "node pressure changed");
                *p = pressure;
            }
            changed
        });
        let mut to_reclaim = self.state.met_for_grace(&met, now);
        if to_reclaim.is_empty() {
            return;
        }
        thresholds::by_eviction_priority(&mut to_reclaim);
        let threshold = to_reclaim.swap_remove(0);
        let signal = threshold.signal();
        tracing::debug!(signal = signal.name(), "eviction threshold met; attempting to reclaim");
        let mut observations = observations;
        if thresholds::pressure_of(signal) == Pressure::Disk {
            self.reclaim_node_level().await;
            observations = self.observe();
            if !thresholds::is_met(&threshold, &observations) {
                tracing::info!(signal = signal.name(), "node-level reclaim was enough; no pod evicted");
                return;
            }
        }
        let Some(observed) = observations.get(&signal).copied() else { return };
        let ranked = match self.rank(signal, &active).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot rank pods for eviction");
                return;
            }
        };
        let resource = signals::resource_of(signal);
        let quantity = signals::format_amount(signal, threshold.amount(observed.capacity));
        let available = signals::format_amount(signal, observed.available);
        for usage in ranked {
            if ranking::is_critical(&usage.pod) {
                continue;
            }
            let message = ranking::eviction_message(resource, &quantity, &available, &usage);
            let grace = self.grace_period(&threshold, &usage.pod);
            if self.evict(&usage.pod, message, grace) {
                self.nothing_to_evict = false;
                return;
            }
        }
        if !std::mem::replace(&mut self.nothing_to_evict, true) {
            tracing::warn!(signal = signal.name(), "eviction threshold met but no pod can be evicted");
        }
    }

    /// Soft thresholds: the max pod grace period (at most the pod's own); hard ones: none.
    fn grace_period(&self, threshold: &EvictionThreshold, pod: &Pod) -> i64 {
        if threshold.hard {
            return IMMEDIATE_GRACE_SECONDS;
        }
        let max = self.config.kubelet.eviction_max_pod_grace_period;
        match pod_util::spec(pod).termination_grace_period_seconds {
            Some(own) => max.min(own),
            None => max,
        }
    }

    async fn reclaim_node_level(&self) {
        match self.container_gc.garbage_collect().await {
            Ok(stats) => tracing::info!(?stats, "reclaimed dead containers"),
            Err(e) => tracing::warn!(error = %e, "container garbage collection for disk pressure failed"),
        }
        match self.image_gc.delete_unused_images().await {
            Ok(bytes) => tracing::info!(bytes, "reclaimed unused images"),
            Err(e) => tracing::warn!(error = %e, "image garbage collection for disk pressure failed"),
        }
    }

    /// Sets the pod's failure and has its worker stop it; false when it has no worker.
    fn evict(&mut self, pod: &Pod, message: String, grace_seconds: i64) -> bool {
        let uid = pod_util::uid(pod).to_string();
        let failure = PodFailure { kind: FailureKind::Evicted, reason: REASON.into(), message: message.clone() };
        if !self.pods.kill_pod(&uid, failure, grace_seconds) {
            return false;
        }
        tracing::info!(pod = %pod_util::full_name(pod), %message, "evicting pod");
        self.events.pod(pod, EventType::Warning, REASON, &message);
        self.evicted.insert(uid);
        true
    }

    /// The active pods in eviction order for the starved signal.
    async fn rank(&self, signal: Signal, pods: &[Arc<Pod>]) -> Result<Vec<PodUsage>, CriError> {
        let cri = &self.cri;
        let cgroup_root = self.config.cgroup_root.clone();
        let mut out: Vec<PodUsage> = match thresholds::pressure_of(signal) {
            Pressure::Memory => {
                let running = stats::running_containers(cri).await?;
                pods.iter()
                    .map(|p| {
                        let containers = running.get(pod_util::uid(p)).map(Vec::as_slice).unwrap_or_default();
                        let (usage, containers) = stats::pod_memory(p, &cgroup_root, containers);
                        PodUsage { pod: p.clone(), usage, containers }
                    })
                    .collect()
            }
            Pressure::Pid => pods
                .iter()
                .map(|p| PodUsage {
                    pod: p.clone(),
                    usage: stats::pod_processes(p, &cgroup_root),
                    containers: Vec::new(),
                })
                .collect(),
            Pressure::Disk => {
                let measured = self.measure_disk(pods.to_vec()).await?;
                measured
                    .into_iter()
                    .map(|(pod, u)| PodUsage { pod, usage: Some(u.total), containers: u.containers })
                    .collect()
            }
        };
        match thresholds::pressure_of(signal) {
            Pressure::Memory => ranking::rank_memory(&mut out),
            Pressure::Disk => ranking::rank_disk(&mut out),
            Pressure::Pid => ranking::rank_pid(&mut out),
        }
        Ok(out)
    }

    /// Local storage of each pod (walks folders off the async workers).
    async fn measure_disk(&self, pods: Vec<Arc<Pod>>) -> Result<Vec<(Arc<Pod>, stats::PodDiskUsage)>, CriError> {
        let cri = &self.cri;
        let running = stats::running_containers(cri).await?;
        let layers = stats::writable_layers(cri).await?;
        let pods_dir = self.config.pods_dir.clone();
        let logs_dir = self.config.pod_logs_dir.clone();
        let walk = move || {
            pods.into_iter()
                .map(|p| {
                    let containers = running.get(pod_util::uid(&p)).cloned().unwrap_or_default();
                    let log_dir =
                        sandbox::pod_log_dir(&logs_dir, pod_util::namespace(&p), pod_util::name(&p), pod_util::uid(&p));
                    let usage = stats::pod_disk(&p, &containers, &layers, &pods_dir, &log_dir);
                    (p, usage)
                })
                .collect::<Vec<_>>()
        };
        tokio::task::spawn_blocking(walk).await.map_err(|e| CriError::Invalid(format!("disk usage: {e}")))
    }

    /// Evicts every pod over a local storage limit; true when one was.
    async fn local_storage_eviction(&mut self, active: &[Arc<Pod>]) -> bool {
        let limited: Vec<Arc<Pod>> = active.iter().filter(|p| local_storage::has_limits(p)).cloned().collect();
        if limited.is_empty() {
            return false;
        }
        let measured = match self.measure_disk(limited).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "cannot measure pods' local storage");
                return false;
            }
        };
        let mut any = false;
        let mut seen: HashMap<String, ()> = HashMap::new();
        for (pod, usage) in measured {
            if seen.insert(pod_util::uid(&pod).to_string(), ()).is_some() || ranking::is_critical(&pod) {
                continue;
            }
            if let Some(message) = local_storage::violation(&pod, &usage) {
                any |= self.evict(&pod, message, IMMEDIATE_GRACE_SECONDS);
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicted_pods_get_the_disruption_target() {
        let failure = PodFailure {
            kind: FailureKind::Evicted,
            reason: REASON.into(),
            message: "The node was low on resource: memory. ".into(),
        };
        let mut status = PodStatus::default();
        add_disruption_target(&mut status, Some(&failure));
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!((c.type_.as_str(), c.status.as_str()), ("DisruptionTarget", "True"));
        assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
        let first = c.last_transition_time.clone();
        add_disruption_target(&mut status, Some(&failure));
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
        assert_eq!(status.conditions.as_ref().unwrap()[0].last_transition_time, first);
        let mut other = PodStatus::default();
        let deadline = PodFailure {
            kind: FailureKind::DeadlineExceeded,
            reason: "DeadlineExceeded".into(),
            message: String::new(),
        };
        add_disruption_target(&mut other, Some(&deadline));
        add_disruption_target(&mut other, None);
        let rejected = PodFailure {
            kind: FailureKind::Rejected,
            reason: REASON.into(),
            message: "The node had condition: [MemoryPressure]. ".into(),
        };
        add_disruption_target(&mut other, Some(&rejected));
        assert!(other.conditions.is_none());
    }
}
