//! The probe manager (upstream's `prober_manager.go` with its results
//! managers): one set of workers per running container, the cached
//! results the status reports, and the stream of changes the pod workers
//! act on.
//!
//! A container instance is known by its runtime id: when the pod worker
//! reports a new id for a container (it restarted), the old instance's
//! workers stop and its results are forgotten; the new one starts from the
//! initial values (not ready, alive, not started).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::clock::{Clock, TokioClock};
use super::events::EventSink;
use super::probe::{Prober, RuntimeProber};
use super::target::{pod_ip_from_status, ProbeTarget};
use super::worker::{self, WorkerHandle, WorkerKey};
use super::{ProbeOutcome, ProbeType};
use crate::agent::cri::Cri;
use crate::sync::LockExt;

/// A change of a cached probe result. Readiness and startup changes call
/// for a status sync; a liveness or startup `Failure` means the container
/// must be killed and restarted (see [`super::kill_grace_period`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    /// The container instance the result is about; an update for an id the
    /// pod worker no longer runs is stale.
    pub container_id: String,
    pub probe_type: ProbeType,
    pub result: ProbeOutcome,
    /// What the last attempt said (a failure's output).
    pub message: Option<String>,
}

/// Runs the probes of the node's containers. Clones share the workers;
/// they all stop when the last clone is dropped.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) prober: Arc<dyn Prober>,
    pub(super) events: Arc<dyn EventSink>,
    pub(super) clock: Arc<dyn Clock>,
    /// When the manager started: workers created within a period of it
    /// spread their first probe over that period.
    pub(super) start: Instant,
    pub(super) jitter: bool,
    updates: mpsc::UnboundedSender<ProbeUpdate>,
    /// Pod uid → container name → probes of the running instance.
    pods: Mutex<HashMap<String, HashMap<String, ContainerProbes>>>,
}

struct ContainerProbes {
    target: ProbeTarget,
    /// When the container started, on the workers' clock (`None`: before
    /// that clock's origin, so any initial delay has passed).
    started_at: Option<Instant>,
    /// Per probe type (see `ProbeType::index`); `None` when the container
    /// has no such probe.
    results: [Option<ProbeOutcome>; 3],
    workers: Vec<WorkerHandle>,
}

impl Drop for ContainerProbes {
    fn drop(&mut self) {
        for w in &self.workers {
            w.task.abort();
        }
    }
}

impl ContainerProbes {
    fn result(&self, t: ProbeType) -> Option<ProbeOutcome> {
        self.results[t.index()]
    }

    /// Started: no startup probe, or it has succeeded.
    fn started(&self) -> bool {
        self.result(ProbeType::Startup).is_none_or(|r| r == ProbeOutcome::Success)
    }

    /// Ready: started, and no readiness probe or it has succeeded.
    fn ready(&self) -> bool {
        self.started() && self.result(ProbeType::Readiness).is_none_or(|r| r == ProbeOutcome::Success)
    }
}

/// What a worker needs to know before an attempt.
pub(super) struct Snapshot {
    pub target: ProbeTarget,
    pub started_at: Option<Instant>,
    pub started: bool,
    /// The pod is being deleted.
    pub deleting: bool,
}

impl ProbeManager {
    /// A manager probing through the node's container runtime and
    /// recording events through `events` (an `EventRecorder`). Returns the
    /// stream of result changes, which the pod workers must drain.
    pub fn new(cri: Cri, events: Arc<dyn EventSink>) -> (Self, mpsc::UnboundedReceiver<ProbeUpdate>) {
        Self::with_prober(Arc::new(RuntimeProber::new(cri)), events)
    }

    /// A manager with another way of running one attempt of a probe.
    pub fn with_prober(
        prober: Arc<dyn Prober>,
        events: Arc<dyn EventSink>,
    ) -> (Self, mpsc::UnboundedReceiver<ProbeUpdate>) {
        Self::build(prober, events, Arc::new(TokioClock), true)
    }

    pub(super) fn build(
        prober: Arc<dyn Prober>,
        events: Arc<dyn EventSink>,
        clock: Arc<dyn Clock>,
        jitter: bool,
    ) -> (Self, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (updates, rx) = mpsc::unbounded_channel();
        let start = clock.now();
        let inner = Inner { prober, events, clock, start, jitter, updates, pods: Mutex::default() };
        (ProbeManager { inner: Arc::new(inner) }, rx)
    }

    /// Starts the probes of a running container, idempotently: for the id
    /// already known it only refreshes the pod (a deletion, a new IP); for a
    /// new id it replaces the old instance's workers and results.
    /// `pod_ip` is where network probes go (the node's IP for hostNetwork
    /// pods); without it the pod's status is used. Must be called within a
    /// tokio runtime.
    pub fn add_container(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        started_at: SystemTime,
        pod_ip: Option<IpAddr>,
    ) {
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            tracing::warn!(pod = ?pod.metadata.name, "a pod without a uid cannot be probed");
            return;
        };
        let mut pods = self.inner.pods.locked();
        let containers = pods.entry(uid.clone()).or_default();
        if let Some(known) = containers.get_mut(&container.name) {
            if known.target.container_id == container_id {
                refresh(&mut known.target, pod, pod_ip);
                return;
            }
        }
        let now = self.inner.clock.now();
        let age = SystemTime::now().duration_since(started_at).unwrap_or_default();
        let target = ProbeTarget {
            pod: Arc::new(pod.clone()),
            container: Arc::new(container.clone()),
            container_id: container_id.to_string(),
            pod_ip: pod_ip.or_else(|| pod_ip_from_status(pod)),
        };
        let mut probes =
            ContainerProbes { target, started_at: now.checked_sub(age), results: [None; 3], workers: Vec::new() };
        for t in ProbeType::ALL {
            let Some(spec) = t.of(container) else { continue };
            probes.results[t.index()] = Some(t.initial_outcome());
            let key = WorkerKey {
                pod_uid: uid.clone(),
                container_name: container.name.clone(),
                container_id: container_id.to_string(),
            };
            probes.workers.push(worker::spawn(Arc::downgrade(&self.inner), key, t, spec.clone()));
        }
        tracing::debug!(pod = %uid, container = %container.name, id = container_id, workers = probes.workers.len(), "probing container");
        // Replacing the entry drops the old instance, which stops its workers.
        containers.insert(container.name.clone(), probes);
    }

    /// Refreshes the pod every probed container of it sees (say, its
    /// deletion: liveness and startup probes stop once it is deleted).
    pub fn update_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else { return };
        if let Some(containers) = self.inner.pods.locked().get_mut(uid) {
            for c in containers.values_mut() {
                refresh(&mut c.target, pod, None);
            }
        }
    }

    /// Stops probing a container (it exited or was removed); its results go.
    pub fn remove_container(&self, pod_uid: &str, container_name: &str) {
        let mut pods = self.inner.pods.locked();
        if let Some(containers) = pods.get_mut(pod_uid) {
            containers.remove(container_name);
            if containers.is_empty() {
                pods.remove(pod_uid);
            }
        }
    }

    /// Stops probing every container of a pod.
    pub fn remove_pod(&self, pod_uid: &str) {
        self.inner.pods.locked().remove(pod_uid);
    }

    /// Whether the container counts as started (for its status'
    /// `started`): probed and past its startup probe, if it has one.
    pub fn is_started(&self, pod_uid: &str, container_name: &str) -> bool {
        self.inner.with_container(pod_uid, container_name, ContainerProbes::started).unwrap_or(false)
    }

    /// Whether the container counts as ready (for its status' `ready`):
    /// probed, started, and past its readiness probe, if it has one.
    pub fn is_ready(&self, pod_uid: &str, container_name: &str) -> bool {
        self.inner.with_container(pod_uid, container_name, ContainerProbes::ready).unwrap_or(false)
    }

    /// The cached result of one probe of a container, if it has that probe.
    pub fn result(&self, pod_uid: &str, container_name: &str, probe_type: ProbeType) -> Option<ProbeOutcome> {
        self.inner.with_container(pod_uid, container_name, |c| c.result(probe_type)).flatten()
    }

    /// The id of the container instance being probed.
    pub fn container_id(&self, pod_uid: &str, container_name: &str) -> Option<String> {
        self.inner.with_container(pod_uid, container_name, |c| c.target.container_id.clone())
    }

    /// How many probe workers run (for metrics and tests).
    pub fn worker_count(&self) -> usize {
        let pods = self.inner.pods.locked();
        pods.values().flat_map(|cs| cs.values()).flat_map(|c| &c.workers).filter(|w| !w.task.is_finished()).count()
    }
}

fn refresh(target: &mut ProbeTarget, pod: &Pod, pod_ip: Option<IpAddr>) {
    let same = |a: &Pod, b: &Pod| {
        a.metadata.resource_version == b.metadata.resource_version
            && a.metadata.deletion_timestamp == b.metadata.deletion_timestamp
    };
    if !same(&target.pod, pod) {
        target.pod = Arc::new(pod.clone());
    }
    if let Some(ip) = pod_ip.or_else(|| pod_ip_from_status(pod)) {
        target.pod_ip = Some(ip);
    }
}

impl Inner {
    fn with_container<T>(&self, pod_uid: &str, name: &str, f: impl FnOnce(&ContainerProbes) -> T) -> Option<T> {
        self.pods.locked().get(pod_uid).and_then(|cs| cs.get(name)).map(f)
    }

    /// The worker's container, if it still is the instance being probed.
    pub(super) fn snapshot(&self, key: &WorkerKey) -> Option<Snapshot> {
        self.with_container(&key.pod_uid, &key.container_name, |c| {
            (c.target.container_id == key.container_id).then(|| Snapshot {
                target: c.target.clone(),
                started_at: c.started_at,
                started: c.started(),
                deleting: c.target.pod.metadata.deletion_timestamp.is_some(),
            })
        })
        .flatten()
    }

    /// Caches a worker's verdict; a change is sent to the pod workers. A
    /// startup success runs the readiness probe at once.
    pub(super) fn set_result(&self, key: &WorkerKey, t: ProbeType, result: ProbeOutcome, message: Option<String>) {
        let mut pods = self.pods.locked();
        let Some(c) = pods.get_mut(&key.pod_uid).and_then(|cs| cs.get_mut(&key.container_name)) else { return };
        if c.target.container_id != key.container_id || c.results[t.index()] == Some(result) {
            return;
        }
        c.results[t.index()] = Some(result);
        if t == ProbeType::Startup && result == ProbeOutcome::Success {
            for w in c.workers.iter().filter(|w| w.probe_type == ProbeType::Readiness) {
                w.trigger.notify_one();
            }
        }
        tracing::debug!(pod = %key.pod_uid, container = %key.container_name, probe = %t, ?result, "probe result changed");
        let _ = self.updates.send(ProbeUpdate {
            pod_uid: key.pod_uid.clone(),
            container_name: key.container_name.clone(),
            container_id: key.container_id.clone(),
            probe_type: t,
            result,
            message,
        });
    }
}

impl std::fmt::Debug for ProbeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeManager").field("workers", &self.worker_count()).finish()
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
