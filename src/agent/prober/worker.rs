//! One probe of one container instance, as upstream's `worker.go`: a task
//! that probes every `periodSeconds` (its first run spread over a period
//! when the node has just started), skips the `initialDelaySeconds` after
//! the container started, holds liveness and readiness back until the
//! startup probe has succeeded, and changes the cached result only after
//! `failureThreshold` failures or `successThreshold` successes in a row.
//! A liveness or startup failure ends the worker (the container will be
//! restarted, and a new instance gets new workers); so does a startup
//! success (nothing is left to probe) and the pod's deletion for liveness
//! and startup probes (a quiet shutdown).

use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use tokio::sync::Notify;

use super::events::{container_ref, CONTAINER_PROBE_WARNING, CONTAINER_UNHEALTHY};
use super::manager::Inner;
use super::probe::Prober;
use super::target::ProbeTarget;
use super::{ProbeOutcome, ProbeResult, ProbeType};
use crate::client::events::EventType;

/// Upstream tries a probe that could not be run this many times per period.
const MAX_PROBE_RETRIES: usize = 3;

/// Which container instance a worker probes.
#[derive(Debug, Clone)]
pub(super) struct WorkerKey {
    pub pod_uid: String,
    pub container_name: String,
    pub container_id: String,
}

/// The manager's handle on a worker.
pub(super) struct WorkerHandle {
    pub probe_type: ProbeType,
    pub task: tokio::task::JoinHandle<()>,
    /// Runs the probe now (and restarts its period from now).
    pub trigger: Arc<Notify>,
}

/// The probe's settings with upstream's defaults and floors.
#[derive(Debug, Clone, Copy)]
struct Settings {
    initial_delay: Duration,
    period: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

impl Settings {
    fn of(spec: &Probe, t: ProbeType) -> Settings {
        let at_least_one = |v: Option<i32>, default: i32| v.unwrap_or(default).max(1) as u32;
        Settings {
            initial_delay: Duration::from_secs(spec.initial_delay_seconds.unwrap_or(0).max(0) as u64),
            period: Duration::from_secs(u64::from(at_least_one(spec.period_seconds, 10))),
            // Validation allows only 1 for liveness and startup probes.
            success_threshold: if t == ProbeType::Readiness { at_least_one(spec.success_threshold, 1) } else { 1 },
            failure_threshold: at_least_one(spec.failure_threshold, 3),
        }
    }
}

struct Worker {
    manager: Weak<Inner>,
    key: WorkerKey,
    probe_type: ProbeType,
    spec: Probe,
    settings: Settings,
    trigger: Arc<Notify>,
    /// The last attempt's verdict and how many in a row gave it.
    last: Option<ProbeOutcome>,
    run: u32,
}

pub(super) fn spawn(manager: Weak<Inner>, key: WorkerKey, probe_type: ProbeType, spec: Probe) -> WorkerHandle {
    let trigger = Arc::new(Notify::new());
    let settings = Settings::of(&spec, probe_type);
    let worker = Worker { manager, key, probe_type, spec, settings, trigger: trigger.clone(), last: None, run: 0 };
    WorkerHandle { probe_type, task: tokio::spawn(worker.run()), trigger }
}

impl Worker {
    async fn run(mut self) {
        let period = self.settings.period;
        let Some(manager) = self.manager.upgrade() else { return };
        let clock = manager.clock.clone();
        let jitter = manager.jitter && clock.now().saturating_duration_since(manager.start) < period;
        drop(manager);
        if jitter {
            // The node has just started: do not probe everything at once.
            clock.sleep(period.mul_f64(crate::host::random::fraction())).await;
        }
        let mut next = clock.now() + period;
        while self.do_probe().await {
            tokio::select! {
                _ = clock.sleep_until(next) => {
                    // As Go's ticker: after a probe slower than its period
                    // one more runs at once; further missed ticks are dropped.
                    let now = clock.now();
                    next += period;
                    if next <= now {
                        next = now + period;
                    }
                }
                _ = self.trigger.notified() => next = clock.now() + period,
            }
        }
        tracing::debug!(pod = %self.key.pod_uid, container = %self.key.container_name, probe = %self.probe_type, "probe worker done");
    }

    /// Probes once if it is time to; returns whether to keep going.
    async fn do_probe(&mut self) -> bool {
        let t = self.probe_type;
        let Some((snapshot, prober, events, now)) = self.manager.upgrade().and_then(|m| {
            let snapshot = m.snapshot(&self.key)?;
            Some((snapshot, m.prober.clone(), m.events.clone(), m.clock.now()))
        }) else {
            // The container or the manager is gone.
            return false;
        };
        if snapshot.deleting && t != ProbeType::Readiness {
            // The container is stopping anyway: let it go quietly.
            self.set(ProbeOutcome::Success, None);
            return false;
        }
        if snapshot.started_at.is_some_and(|at| now.saturating_duration_since(at) < self.settings.initial_delay) {
            return true;
        }
        if t != ProbeType::Startup && !snapshot.started {
            return true;
        }
        let result = run_with_retries(&*prober, t, &self.spec, &snapshot.target).await;
        let reference = || container_ref(&snapshot.target.pod, &snapshot.target.container);
        let (outcome, message) = match result {
            ProbeResult::Success => (ProbeOutcome::Success, None),
            ProbeResult::Warning(m) => {
                let text = format!("{t} probe warning: {m}");
                events.event(reference(), EventType::Warning, CONTAINER_PROBE_WARNING, &text);
                (ProbeOutcome::Success, Some(m))
            }
            ProbeResult::Failure(m) => {
                tracing::debug!(pod = %self.key.pod_uid, container = %self.key.container_name, probe = %t, output = %m, "probe failed");
                events.event(reference(), EventType::Warning, CONTAINER_UNHEALTHY, &format!("{t} probe failed: {m}"));
                (ProbeOutcome::Failure, Some(m))
            }
            ProbeResult::Unknown(e) => {
                // As upstream: recorded, then thrown away.
                tracing::debug!(pod = %self.key.pod_uid, container = %self.key.container_name, probe = %t, error = %e, "probe errored");
                let text = format!("{t} probe errored and resulted in unknown state: {e}");
                events.event(reference(), EventType::Warning, CONTAINER_UNHEALTHY, &text);
                return true;
            }
        };
        if self.last == Some(outcome) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let threshold = match outcome {
            ProbeOutcome::Failure => self.settings.failure_threshold,
            _ => self.settings.success_threshold,
        };
        if self.run < threshold {
            return true;
        }
        self.set(outcome, message);
        match (t, outcome) {
            // The container will be restarted; its next instance gets new workers.
            (ProbeType::Liveness | ProbeType::Startup, ProbeOutcome::Failure) => false,
            // Started for good: liveness and readiness take over.
            (ProbeType::Startup, ProbeOutcome::Success) => false,
            _ => true,
        }
    }

    fn set(&self, outcome: ProbeOutcome, message: Option<String>) {
        if let Some(m) = self.manager.upgrade() {
            m.set_result(&self.key, self.probe_type, outcome, message);
        }
    }
}

/// One attempt, tried again at once (up to three times in all) when the
/// probe could not be run, as upstream's `runProbeWithRetries`.
async fn run_with_retries(prober: &dyn Prober, t: ProbeType, spec: &Probe, target: &ProbeTarget) -> ProbeResult {
    let mut result = prober.probe(t, spec, target).await;
    for _ in 1..MAX_PROBE_RETRIES {
        if !matches!(result, ProbeResult::Unknown(_)) {
            break;
        }
        result = prober.probe(t, spec, target).await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_and_floor_as_upstream() {
        let s = Settings::of(&Probe::default(), ProbeType::Readiness);
        assert_eq!(s.period, Duration::from_secs(10));
        assert_eq!((s.success_threshold, s.failure_threshold), (1, 3));
        assert_eq!(s.initial_delay, Duration::ZERO);
        let spec = Probe { period_seconds: Some(0), success_threshold: Some(3), ..Default::default() };
        assert_eq!(Settings::of(&spec, ProbeType::Readiness).success_threshold, 3);
        assert_eq!(Settings::of(&spec, ProbeType::Liveness).success_threshold, 1);
        assert_eq!(Settings::of(&spec, ProbeType::Liveness).period, Duration::from_secs(1));
    }
}
