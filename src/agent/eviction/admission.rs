//! Admission under node pressure (upstream's eviction manager Admit): while
//! the node reports a pressure condition, a new pod is rejected unless it
//! is critical; under memory pressure alone only BestEffort pods are
//! rejected, and not those that tolerate the memory-pressure taint. A
//! rejected pod fails at once with reason `Evicted` and upstream's message
//! ("The node had condition: [MemoryPressure]. ") and never starts.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use tokio::sync::watch;

use super::ranking::is_critical;
use super::REASON;
use crate::agent::events::Events;
use crate::agent::node_status::NodePressure;
use crate::agent::pod_status::{FailureKind, PodFailure};
use crate::agent::pod_util;
use crate::agent::pod_workers::AdmitHandler;
use crate::client::events::EventType;

const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";
/// How a rejection's message begins (upstream's nodeConditionMessageFmt).
const MESSAGE_PREFIX: &str = "The node had condition: ";

/// The node's conditions as Go prints the list (`[MemoryPressure DiskPressure]`).
fn conditions(p: NodePressure) -> Vec<&'static str> {
    let mut out = Vec::new();
    if p.memory {
        out.push("MemoryPressure");
    }
    if p.disk {
        out.push("DiskPressure");
    }
    if p.pid {
        out.push("PIDPressure");
    }
    out
}

/// Whether a toleration tolerates `key:NoSchedule` (no value).
fn tolerates(t: &Toleration, key: &str) -> bool {
    let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule");
    let exists = t.operator.as_deref() == Some("Exists");
    let key_ok = match t.key.as_deref() {
        None | Some("") => exists,
        Some(k) => k == key,
    };
    let value_ok = exists || t.value.as_deref().unwrap_or_default().is_empty();
    effect_ok && key_ok && value_ok
}

/// Why the pod may not start under `pressure`; None to admit it.
pub fn admit(pod: &Pod, pressure: NodePressure) -> Option<PodFailure> {
    let conds = conditions(pressure);
    if conds.is_empty() || is_critical(pod) || !pod_util::never_started(pod) {
        return None;
    }
    if conds == ["MemoryPressure"] {
        if pod_util::qos_class(pod) != "BestEffort" {
            return None;
        }
        let tolerations = pod_util::spec(pod).tolerations.iter().flatten();
        if tolerations.into_iter().any(|t| tolerates(t, MEMORY_PRESSURE_TAINT)) {
            return None;
        }
    }
    Some(PodFailure {
        kind: FailureKind::Rejected,
        reason: REASON.into(),
        message: format!("{MESSAGE_PREFIX}[{}]. ", conds.join(" ")),
    })
}

/// The pod workers' admission check, reading the pressure the eviction manager reports.
pub fn handler(pressure: watch::Receiver<NodePressure>, events: Events) -> AdmitHandler {
    Arc::new(move |pod: &Pod, _running: &[Arc<Pod>]| {
        let failure = admit(pod, *pressure.borrow())?;
        tracing::info!(pod = %pod_util::full_name(pod), message = %failure.message, "pod rejected under node pressure");
        events.pod(pod, EventType::Warning, REASON, &failure.message);
        Some(failure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap()
    }

    const MEMORY: NodePressure = NodePressure { memory: true, disk: false, pid: false };

    #[test]
    fn memory_pressure_rejects_best_effort_pods_only() {
        let be = pod(json!({"containers": [{"name": "a"}]}));
        let f = admit(&be, MEMORY).unwrap();
        assert_eq!((f.reason.as_str(), f.message.as_str()), ("Evicted", "The node had condition: [MemoryPressure]. "));
        assert!(admit(&be, NodePressure::default()).is_none());
        let burstable = pod(json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "1Mi"}}}]}));
        assert!(admit(&burstable, MEMORY).is_none());
        let tolerant = pod(json!({"containers": [{"name": "a"}], "tolerations": [
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(admit(&tolerant, MEMORY).is_none());
        let critical = pod(json!({"containers": [{"name": "a"}], "priority": 2000001000}));
        assert!(admit(&critical, MEMORY).is_none());
    }

    #[test]
    fn other_pressure_rejects_every_pod_not_critical() {
        let both = NodePressure { memory: true, disk: true, pid: false };
        let burstable = pod(json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "1Mi"}}}]}));
        assert_eq!(admit(&burstable, both).unwrap().message, "The node had condition: [MemoryPressure DiskPressure]. ");
        let pid = NodePressure { memory: false, disk: false, pid: true };
        assert_eq!(admit(&burstable, pid).unwrap().message, "The node had condition: [PIDPressure]. ");
    }

    #[test]
    fn running_pods_are_not_rejected_again() {
        let mut be = pod(json!({"containers": [{"name": "a"}]}));
        be.status = serde_json::from_value(json!({"phase": "Running"})).unwrap();
        assert!(admit(&be, MEMORY).is_none());
    }
}
