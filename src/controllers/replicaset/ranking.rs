//! Which pods a ReplicaSet deletes first when it scales down, in upstream's
//! `ActivePodsWithRanks` order: unscheduled before scheduled, Pending before
//! Unknown before Running, not ready before ready, lower
//! `controller.kubernetes.io/pod-deletion-cost` first, pods doubled up on a
//! node first, ready for less time first, more restarts first, newer first.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::controller_utils::{is_pod_ready, pod_phase};

const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn node_of(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

fn phase_ordinal(pod: &Pod) -> u8 {
    match pod_phase(pod) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 3,
    }
}

fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(POD_DELETION_COST)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready")?.last_transition_time.as_ref().map(|t| t.0)
}

fn max_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().map(|c| c.restart_count).max())
        .unwrap_or(0)
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// `Less` when `a` should be deleted before `b`; `rank_*` is how many of
/// the ReplicaSet's active pods share the pod's node.
fn compare(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize) -> Ordering {
    let unassigned = |p: &Pod| !node_of(p).is_empty();
    unassigned(a)
        .cmp(&unassigned(b))
        .then_with(|| phase_ordinal(a).cmp(&phase_ordinal(b)))
        .then_with(|| is_pod_ready(a).cmp(&is_pod_ready(b)))
        .then_with(|| deletion_cost(a).cmp(&deletion_cost(b)))
        .then_with(|| rank_b.cmp(&rank_a))
        .then_with(|| {
            if is_pod_ready(a) && is_pod_ready(b) {
                // Ready more recently (or with no time) goes first.
                newer_first(ready_since(a), ready_since(b))
            } else {
                Ordering::Equal
            }
        })
        .then_with(|| max_restarts(b).cmp(&max_restarts(a)))
        .then_with(|| newer_first(created(a), created(b)))
}

/// Empty before newer before older.
fn newer_first(a: Option<Timestamp>, b: Option<Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(&a),
    }
}

/// The `count` pods of `pods` to delete first.
pub fn pods_to_delete(pods: &[Arc<Pod>], count: usize) -> Vec<Arc<Pod>> {
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for p in pods {
        let node = node_of(p);
        if !node.is_empty() {
            *per_node.entry(node).or_default() += 1;
        }
    }
    let rank = |p: &Pod| per_node.get(node_of(p)).copied().unwrap_or(0);
    let mut ranked: Vec<(Arc<Pod>, usize)> = pods.iter().map(|p| (p.clone(), rank(p))).collect();
    ranked.sort_by(|(a, ra), (b, rb)| compare(a, *ra, b, *rb));
    ranked.into_iter().take(count).map(|(p, _)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, phase: &str, ready: bool, created: i64) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "creationTimestamp": Timestamp::from_second(created).unwrap().to_string()},
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn deletes_in_upstream_order() {
        let pods = vec![
            pod("running-ready-old", "n1", "Running", true, 100),
            pod("running-ready-new", "n1", "Running", true, 200),
            pod("running-unready", "n1", "Running", false, 100),
            pod("pending-scheduled", "n2", "Pending", false, 100),
            pod("unscheduled", "", "Pending", false, 100),
        ];
        let order: Vec<_> = pods_to_delete(&pods, 5).iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(
            order,
            ["unscheduled", "pending-scheduled", "running-unready", "running-ready-new", "running-ready-old"]
        );
        assert_eq!(pods_to_delete(&pods, 2).len(), 2);
    }
}
