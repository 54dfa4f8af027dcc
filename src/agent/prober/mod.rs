//! The kubelet's prober: liveness, readiness and startup probes of running
//! containers, as upstream's `pkg/kubelet/prober`.
//!
//! - [`ProbeManager`] keeps one [`worker`] task per container and probe
//!   type, driven by timers only (the probe's period; the first run
//!   jittered when the node has just started). It caches the results the
//!   pod worker reports in the status (`started`, `ready`) and sends a
//!   [`ProbeUpdate`] whenever one changes: readiness and startup changes
//!   call for a status sync, a liveness or startup failure for a restart.
//! - One attempt of a probe is a handler: [`exec`] (CRI ExecSync),
//!   [`http`] (httpGet), [`tcp`] (tcpSocket), [`grpc`] (grpc.health.v1),
//!   chosen by [`probe::RuntimeProber`] and aimed by [`target`]. Their
//!   messages are upstream's, word for word, for `kubectl describe`.
//! - Failures are recorded as upstream's `Unhealthy`/`ProbeWarning` events
//!   on the Pod through an [`events::EventSink`]; recording never blocks.

mod clock;
pub mod events;
pub mod exec;
pub mod grpc;
pub mod http;
mod manager;
pub mod probe;
pub mod target;
pub mod tcp;
pub mod text;
pub mod url;
mod worker;

use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

pub use events::EventSink;
pub use manager::{ProbeManager, ProbeUpdate};
pub use probe::{Prober, RuntimeProber};
pub use target::ProbeTarget;

/// The Kubernetes minor version ferrok speaks, as probes' and hooks'
/// User-Agent shows it (`kube-probe/1.33`); the API server's discovery
/// reports the same version.
pub const KUBE_VERSION: &str = "1.33";

/// Which of a container's probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    pub const ALL: [ProbeType; 3] = [ProbeType::Liveness, ProbeType::Readiness, ProbeType::Startup];

    /// The container's probe of this type, if it has one.
    pub fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            ProbeType::Liveness => container.liveness_probe.as_ref(),
            ProbeType::Readiness => container.readiness_probe.as_ref(),
            ProbeType::Startup => container.startup_probe.as_ref(),
        }
    }

    /// The cached result before the first probe counts: readiness starts
    /// failed, liveness succeeded, startup unknown (not started).
    pub fn initial_outcome(self) -> ProbeOutcome {
        match self {
            ProbeType::Liveness => ProbeOutcome::Success,
            ProbeType::Readiness => ProbeOutcome::Failure,
            ProbeType::Startup => ProbeOutcome::Unknown,
        }
    }

    fn index(self) -> usize {
        match self {
            ProbeType::Liveness => 0,
            ProbeType::Readiness => 1,
            ProbeType::Startup => 2,
        }
    }
}

impl fmt::Display for ProbeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        })
    }
}

/// The result of one attempt of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    /// A success with something to say: an HTTP redirect to another host
    /// (upstream's `probe.Warning`, recorded as a `ProbeWarning` event).
    Warning(String),
    /// The container answered wrongly; the message is what users read.
    Failure(String),
    /// The probe could not be run (bad port, runtime error): upstream
    /// retries it and then throws the attempt away.
    Unknown(String),
}

/// A probe's cached verdict on a container (upstream's `results.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeOutcome {
    Unknown,
    Success,
    Failure,
}

/// Upstream's floor on how long a container gets to stop.
pub const MINIMUM_GRACE_PERIOD_SECONDS: i64 = 2;

/// How long a container gets between SIGTERM and SIGKILL when it is
/// killed, as upstream's `killContainer` decides: the pod's deletion grace
/// period, else its `terminationGracePeriodSeconds`, replaced by the
/// failing probe's own `terminationGracePeriodSeconds` when a liveness or
/// startup failure is the reason; never under 2 seconds.
pub fn kill_grace_period(pod: &Pod, container: &Container, reason: Option<ProbeType>) -> i64 {
    let mut grace = MINIMUM_GRACE_PERIOD_SECONDS;
    if let Some(d) = pod.metadata.deletion_grace_period_seconds {
        grace = d;
    } else if let Some(t) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        grace = t;
        let probe = match reason {
            Some(ProbeType::Liveness) => container.liveness_probe.as_ref(),
            Some(ProbeType::Startup) => container.startup_probe.as_ref(),
            _ => None,
        };
        if let Some(p) = probe.and_then(|p| p.termination_grace_period_seconds) {
            grace = p;
        }
    }
    grace.max(MINIMUM_GRACE_PERIOD_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn a_probes_grace_period_replaces_the_pods_on_its_failure() {
        let container = Container {
            liveness_probe: Some(Probe { termination_grace_period_seconds: Some(5), ..Default::default() }),
            ..Default::default()
        };
        let mut pod = Pod {
            spec: Some(PodSpec { termination_grace_period_seconds: Some(30), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(kill_grace_period(&pod, &container, None), 30);
        assert_eq!(kill_grace_period(&pod, &container, Some(ProbeType::Liveness)), 5);
        assert_eq!(kill_grace_period(&pod, &container, Some(ProbeType::Startup)), 30);
        pod.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(kill_grace_period(&pod, &container, Some(ProbeType::Liveness)), 2);
    }
}
