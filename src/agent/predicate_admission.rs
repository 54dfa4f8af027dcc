//! The node's own check of a pod new to it (upstream's kubelet
//! PredicateAdmitHandler): the host ports it asks for must be free among
//! the pods the node runs, and what it requests must fit in the node's
//! allocatable beside theirs. The scheduler checks the same before
//! binding, but a pod given a `nodeName` directly skips the scheduler, and
//! two pods bound at once may clash; the loser fails at once with phase
//! Failed and upstream's reason (`NodePorts`, `OutOfcpu`, `OutOfmemory`,
//! `OutOfpods`, …) and message, and never starts (its controller makes
//! another).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::agent::events::Events;
use crate::agent::pod_status::{FailureKind, PodFailure};
use crate::agent::pod_util;
use crate::agent::pod_workers::AdmitHandler;
use crate::client::events::EventType;
use crate::scheduler::node_info::PodInfo;
use crate::scheduler::plugins::node_ports::conflicts;
use crate::scheduler::resources::{pod_requests, Resources};

/// How a rejection's message begins, as the kubelet writes it.
const REJECTED: &str = "Pod was rejected: ";

fn failure(reason: String, message: String) -> PodFailure {
    PodFailure { kind: FailureKind::Rejected, reason, message: format!("{REJECTED}{message}") }
}

/// Why `pod` may not start beside `running` on a node with `allocatable`;
/// None to admit it.
pub fn admit(pod: &Pod, running: &[Arc<Pod>], allocatable: &BTreeMap<String, Quantity>) -> Option<PodFailure> {
    if !pod_util::never_started(pod) {
        return None;
    }
    let others: Vec<PodInfo> =
        running.iter().filter(|p| pod_util::uid(p) != pod_util::uid(pod)).map(|p| PodInfo::new(p.clone())).collect();
    let new = PodInfo::new(Arc::new(pod.clone()));
    let clash =
        new.host_ports.iter().any(|want| others.iter().flat_map(|o| &o.host_ports).any(|held| conflicts(want, held)));
    if clash {
        return Some(failure(
            "NodePorts".into(),
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".into(),
        ));
    }
    let capacity = Resources::from_list(Some(allocatable));
    let mut used = Resources::default();
    for o in &others {
        used.add(&o.requests);
    }
    let want = pod_requests(pod, false);
    let short = |name: &str, requested: i64, used: i64, capacity: i64| {
        failure(
            format!("OutOf{name}"),
            format!(
                "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        )
    };
    if others.len() as i64 + 1 > capacity.pods && capacity.pods > 0 {
        return Some(short("pods", 1, others.len() as i64, capacity.pods));
    }
    if want.milli_cpu > 0 && want.milli_cpu > capacity.milli_cpu - used.milli_cpu {
        return Some(short("cpu", want.milli_cpu, used.milli_cpu, capacity.milli_cpu));
    }
    if want.memory > 0 && want.memory > capacity.memory - used.memory {
        return Some(short("memory", want.memory, used.memory, capacity.memory));
    }
    if want.ephemeral_storage > 0 && want.ephemeral_storage > capacity.ephemeral_storage - used.ephemeral_storage {
        return Some(short(
            "ephemeral-storage",
            want.ephemeral_storage,
            used.ephemeral_storage,
            capacity.ephemeral_storage,
        ));
    }
    for (name, amount) in &want.scalar {
        let cap = capacity.scalar.get(name).copied().unwrap_or(0);
        let held = used.scalar.get(name).copied().unwrap_or(0);
        if *amount > 0 && *amount > cap - held {
            return Some(short(name, *amount, held, cap));
        }
    }
    None
}

/// The pod workers' check, with the node's allocatable as the API holds
/// it (extended resources others advertise included, as upstream's kubelet
/// reads its Node).
pub fn handler(allocatable: tokio::sync::watch::Receiver<BTreeMap<String, Quantity>>, events: Events) -> AdmitHandler {
    Arc::new(move |pod: &Pod, running: &[Arc<Pod>]| {
        let failure = admit(pod, running, &allocatable.borrow())?;
        tracing::info!(pod = %pod_util::full_name(pod), reason = %failure.reason, "pod rejected by the node");
        events.pod(pod, EventType::Warning, &failure.reason, &failure.message);
        Some(failure)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, spec: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": uid, "uid": uid}, "spec": spec})).unwrap())
    }

    fn alloc() -> BTreeMap<String, Quantity> {
        [("cpu", "2"), ("memory", "1Gi"), ("pods", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.into())))
            .collect()
    }

    #[test]
    fn a_host_port_taken_rejects_the_newcomer() {
        let holder =
            pod("a", json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 21017}]}]}));
        let newcomer =
            pod("b", json!({"containers": [{"name": "c", "ports": [{"containerPort": 81, "hostPort": 21017}]}]}));
        let f = admit(&newcomer, &[holder.clone()], &alloc()).expect("rejected");
        assert_eq!(f.reason, "NodePorts");
        assert_eq!(
            f.message,
            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        let udp = pod(
            "c",
            json!({"containers": [{"name": "c", "ports": [{"containerPort": 81, "hostPort": 21017, "protocol": "UDP"}]}]}),
        );
        assert!(admit(&udp, &[holder.clone()], &alloc()).is_none());
        // The pod itself among the running ones (a restart of ferrok) is no clash.
        assert!(admit(&holder, &[holder.clone()], &alloc()).is_none());
    }

    #[test]
    fn what_does_not_fit_is_rejected_by_resource() {
        let big = |uid: &str, cpu: &str| {
            pod(uid, json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}))
        };
        let f = admit(&big("b", "1500m"), &[big("a", "1")], &alloc()).expect("rejected");
        assert_eq!(f.reason, "OutOfcpu");
        assert_eq!(
            f.message,
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
        );
        assert!(admit(&big("b", "1"), &[big("a", "1")], &alloc()).is_none());
        let many: Vec<Arc<Pod>> = (0..3).map(|i| big(&format!("p{i}"), "10m")).collect();
        assert_eq!(admit(&big("x", "10m"), &many, &alloc()).expect("rejected").reason, "OutOfpods");
    }
}
