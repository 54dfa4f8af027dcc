//! One worker per pod (upstream's pod_workers): a task that owns the pod's
//! lifecycle on this node — syncing while it runs, terminating it when it
//! is deleted or finished, cleaning up after it — woken by changes of the
//! pod, by the PLEG (a container exited), by the prober, or by its own
//! timers (back-offs, a slow periodic resync). Workers of different pods
//! run in parallel; one pod's steps never overlap. Each step is a call to
//! the [`PodSyncer`] (the kubelet), as upstream's podSyncer.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{watch, Notify};

use super::cri::CriError;
use super::kuberuntime::manager::Waiting;
use super::pod_status::PodFailure;
use super::pod_util;
use crate::sync::LockExt;

/// How often a quiet pod is looked at anyway (upstream's syncFrequency is 1 min).
const RESYNC: Duration = Duration::from_secs(90);

/// What a pod worker keeps between syncs of its pod.
#[derive(Debug, Default)]
pub struct PodState {
    /// Why containers are not running, from the last attempt to start them.
    pub waiting: HashMap<String, Waiting>,
    /// A pod-level end the node decided (admission, eviction, deadline).
    pub failure: Option<PodFailure>,
    /// Container ids the PLEG said exited, not yet seen exited through CRI.
    pub expected_exits: HashSet<String>,
    /// The kubelet's retry of the pod's volumes: until when, and the delay.
    pub volume_backoff: Option<(Instant, Duration)>,
    /// The kubelet's retry of the pod's sandbox: until when, and the delay.
    pub sandbox_backoff: Option<(Instant, Duration)>,
}

/// The outcome of a sync: when to look again, and whether the pod is done.
#[derive(Debug, Default)]
pub struct SyncResult {
    pub next: Option<Duration>,
    pub terminal: bool,
}

/// The steps of a pod's life a worker calls, in order (upstream's
/// podSyncer, which the kubelet implements).
#[async_trait::async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    /// Brings a running pod to its spec (upstream's SyncPod).
    async fn sync_pod(&self, pod: &Pod, st: &mut PodState) -> Result<SyncResult, CriError>;
    /// Stops every container of the pod and its sandbox with `grace`
    /// seconds; `in_api` says its final status is written (upstream's
    /// SyncTerminatingPod).
    async fn terminate_pod(&self, pod: &Pod, st: &mut PodState, grace: i64, in_api: bool) -> Result<(), CriError>;
    /// After termination: releases what the pod held, everything when it
    /// is `deleted` (upstream's SyncTerminatedPod).
    async fn cleanup_pod(&self, pod: &Pod, deleted: bool) -> Result<(), CriError>;
    /// Deletes the API object of a pod whose containers are all gone.
    async fn finish_deletion(&self, pod: &Pod);
}

/// How long the pod's containers get to stop when it is deleted.
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod_util::spec(pod).termination_grace_period_seconds)
        .unwrap_or(30)
}

/// The pod as its source last said.
#[derive(Clone)]
pub struct PodUpdate {
    pub pod: Arc<Pod>,
    /// Gone from its source (deleted from the API, manifest removed).
    pub removed: bool,
}

struct Worker {
    update: watch::Sender<PodUpdate>,
    wake: Arc<Notify>,
    state: Arc<Mutex<Vec<String>>>,
    eviction: Arc<Mutex<Option<Eviction>>>,
}

/// Decides whether a pod new to the node may start beside the pods it
/// runs already; a failure rejects it.
pub type AdmitHandler = Arc<dyn Fn(&Pod, &[Arc<Pod>]) -> Option<PodFailure> + Send + Sync>;

/// The node's decision to end a running pod (eviction): its failure, and
/// the grace period its containers get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub failure: PodFailure,
    pub grace_seconds: i64,
}

/// The workers of every pod on this node, by pod uid.
pub struct PodWorkers {
    syncer: Arc<dyn PodSyncer>,
    workers: Mutex<HashMap<String, Worker>>,
    me: Weak<PodWorkers>,
    /// The pod source has listed once: a uid without a worker is not wanted.
    sources_ready: AtomicBool,
    admit: Mutex<Vec<AdmitHandler>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Syncing,
    Terminating,
    /// Stopped for good but still in the API (finished pods keep their
    /// containers for `kubectl logs` until deleted).
    Terminated,
}

impl PodWorkers {
    pub fn new(syncer: Arc<dyn PodSyncer>) -> Arc<PodWorkers> {
        Arc::new_cyclic(|me| PodWorkers {
            syncer,
            workers: Mutex::new(HashMap::new()),
            me: me.clone(),
            sources_ready: AtomicBool::new(false),
            admit: Mutex::new(Vec::new()),
        })
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Worker>> {
        self.workers.locked()
    }

    /// The pod was added or changed at its source.
    pub fn update(&self, pod: Arc<Pod>) {
        self.send(PodUpdate { pod, removed: false });
    }

    /// A newer copy of the pod that changes nothing its worker acts on
    /// (its status, as written by this node): stored without a wake-up.
    pub fn refresh(&self, pod: Arc<Pod>) {
        let uid = pod_util::uid(&pod).to_string();
        match self.workers().get(&uid) {
            Some(w) => {
                w.update.send_if_modified(|u| {
                    u.pod = pod;
                    false
                });
            }
            None => {
                drop(pod);
            }
        }
    }

    /// The pod is gone from its source; `pod` is its last known state.
    pub fn remove(&self, pod: Arc<Pod>) {
        self.send(PodUpdate { pod, removed: true });
    }

    fn send(&self, update: PodUpdate) {
        let uid = pod_util::uid(&update.pod).to_string();
        if uid.is_empty() {
            return;
        }
        let mut workers = self.workers();
        if let Some(w) = workers.get(&uid) {
            w.update.send_replace(update);
            return;
        }
        if update.removed {
            // No worker: it already finished, or never ran here (leftovers
            // of pods deleted while ferrok was down are cleaned at start).
            return;
        }
        // A pod the node cannot admit ends before it starts, as an eviction.
        let running = active_in(&workers);
        let rejected = self.admission(&update.pod, &running).map(|failure| Eviction { failure, grace_seconds: 0 });
        let (tx, rx) = watch::channel(update);
        let wake = Arc::new(Notify::new());
        let exits = Arc::new(Mutex::new(Vec::new()));
        let eviction = Arc::new(Mutex::new(rejected));
        workers.insert(
            uid.clone(),
            Worker { update: tx, wake: wake.clone(), state: exits.clone(), eviction: eviction.clone() },
        );
        let syncer = self.syncer.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            run(syncer, rx, wake, exits, eviction).await;
            if let Some(w) = me.upgrade() {
                w.workers().remove(&uid);
            }
        });
    }

    /// Something about the pod's containers changed: sync it now.
    pub fn wake(&self, uid: &str) {
        if let Some(w) = self.workers().get(uid) {
            w.wake.notify_one();
        }
    }

    /// A container of the pod exited (the PLEG saw it before CRI may have).
    pub fn container_died(&self, uid: &str, container_id: &str) {
        if let Some(w) = self.workers().get(uid) {
            w.state.locked().push(container_id.to_string());
            w.wake.notify_one();
        }
    }

    pub fn wake_all(&self) {
        for w in self.workers().values() {
            w.wake.notify_one();
        }
    }

    /// Uids with a worker.
    pub fn uids(&self) -> Vec<String> {
        self.workers().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.workers().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pods of `workers` meant to be running: in their source, not being
/// deleted, not finished, and not already told to end.
fn active_in(workers: &HashMap<String, Worker>) -> Vec<Arc<Pod>> {
    workers
        .values()
        .filter(|w| w.eviction.locked().is_none())
        .map(|w| w.update.borrow().clone())
        .filter(|u| !u.removed && u.pod.metadata.deletion_timestamp.is_none())
        .filter(|u| {
            !matches!(u.pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
        })
        .map(|u| u.pod)
        .collect()
}

// What the node's housekeeping (eviction, garbage collection) asks of the workers.
impl PodWorkers {
    /// The pod source has listed its pods once.
    pub fn set_sources_ready(&self) {
        self.sources_ready.store(true, Ordering::Relaxed);
    }

    /// Whether a uid without a worker can be taken as not wanted here.
    pub fn sources_ready(&self) -> bool {
        self.sources_ready.load(Ordering::Relaxed)
    }

    /// Whether a worker (syncing, terminating, or keeping a finished pod) has the uid.
    pub fn knows(&self, uid: &str) -> bool {
        self.workers().contains_key(uid)
    }

    /// The pods meant to be running: in their source, not being deleted,
    /// not finished, and not already told to end.
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        active_in(&self.workers())
    }

    /// Adds a check new pods go through, after those added before (the
    /// eviction manager's admission, then the node's predicates).
    pub fn add_admit_handler(&self, handler: AdmitHandler) {
        self.admit.locked().push(handler);
    }

    /// The first check's refusal of `pod` beside the `running` pods.
    fn admission(&self, pod: &Pod, running: &[Arc<Pod>]) -> Option<PodFailure> {
        let handlers = self.admit.locked().clone();
        handlers.iter().find_map(|h| h(pod, running))
    }

    /// Ends a running pod on the node's decision: it is stopped with
    /// `grace_seconds` and its status shows `failure` (phase Failed).
    /// False when the pod has no worker.
    pub fn evict(&self, uid: &str, failure: PodFailure, grace_seconds: i64) -> bool {
        let workers = self.workers();
        let Some(w) = workers.get(uid) else { return false };
        *w.eviction.locked() = Some(Eviction { failure, grace_seconds });
        w.wake.notify_one();
        true
    }
}

fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    crate::host::random::fill(&mut b);
    d + Duration::from_millis(u64::from(u16::from_be_bytes(b)) % 10_000)
}

async fn run(
    k: Arc<dyn PodSyncer>,
    mut updates: watch::Receiver<PodUpdate>,
    wake: Arc<Notify>,
    exits: Arc<Mutex<Vec<String>>>,
    eviction: Arc<Mutex<Option<Eviction>>>,
) {
    let mut st = PodState::default();
    let mut stage = Stage::Syncing;
    let mut failures = 0u32;
    let mut grace_override: Option<i64> = None;
    loop {
        let update = updates.borrow_and_update().clone();
        let pod = update.pod.clone();
        st.expected_exits.extend(exits.locked().drain(..));
        let deleting = update.removed || pod.metadata.deletion_timestamp.is_some();
        let next: Option<Duration>;
        if let Some(e) = eviction.locked().take().filter(|_| stage == Stage::Syncing) {
            st.failure = Some(e.failure);
            grace_override = Some(e.grace_seconds);
            stage = Stage::Terminating;
        }
        if stage == Stage::Syncing && deleting {
            stage = Stage::Terminating;
        }
        match stage {
            Stage::Syncing => match k.sync_pod(&pod, &mut st).await {
                Ok(r) => {
                    failures = 0;
                    next = r.next;
                    if r.terminal {
                        stage = Stage::Terminating;
                        continue;
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(pod = %pod_util::full_name(&pod), error = %e, "pod sync failed");
                    next = Some(Duration::from_millis(500) * failures.min(20));
                }
            },
            Stage::Terminating => {
                let grace = grace_override.unwrap_or_else(|| grace_period(&pod));
                match k.terminate_pod(&pod, &mut st, grace, !update.removed).await {
                    Ok(()) => {
                        failures = 0;
                        stage = Stage::Terminated;
                        continue;
                    }
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(pod = %pod_util::full_name(&pod), error = %e, "pod termination failed");
                        next = Some(Duration::from_millis(500) * failures.min(20));
                    }
                }
            }
            Stage::Terminated => match k.cleanup_pod(&pod, deleting).await {
                Ok(()) if deleting => {
                    if !update.removed {
                        k.finish_deletion(&pod).await;
                    }
                    tracing::debug!(pod = %pod_util::full_name(&pod), "pod worker done");
                    return;
                }
                Ok(()) => {
                    // Finished but still in the API: wait for its deletion.
                    if updates.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(pod = %pod_util::full_name(&pod), error = %e, "pod cleanup failed");
                    next = Some(Duration::from_millis(500) * failures.min(20));
                }
            },
        }
        let sleep = next.unwrap_or_else(|| jitter(RESYNC));
        tokio::select! {
            r = updates.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

#[cfg(test)]
mod tests;
