//! A ReplicaSet's (or ReplicationController's) status as upstream computes
//! it from its active pods: replicas, fullyLabeledReplicas, readyReplicas,
//! availableReplicas (ready for minReadySeconds), observedGeneration, and
//! the ReplicaFailure condition while creating or deleting pods fails.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::owner::ReplicaOwner;
use crate::controllers::controller_utils::{is_pod_available, is_pod_ready};

pub const REPLICA_FAILURE: &str = "ReplicaFailure";

fn template_labels_match<K: ReplicaOwner>(rs: &K, pod: &Pod) -> bool {
    let want = rs.template().and_then(|t| t.metadata.as_ref());
    let have = pod.metadata.labels.as_ref();
    want.and_then(|m| m.labels.as_ref())
        .is_none_or(|want| want.iter().all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v)))
}

/// The status `rs` should have given its active `pods` and the outcome of
/// managing replicas (`Err((reason, message))` when it failed).
pub fn calculate_status<K: ReplicaOwner>(
    rs: &K,
    pods: &[Arc<Pod>],
    manage: &Result<(), (String, String)>,
    now: Timestamp,
) -> ReplicaSetStatus {
    let mut status = rs.replica_status().unwrap_or_default();
    let min_ready = rs.min_ready_seconds();
    let fully_labeled = pods.iter().filter(|p| template_labels_match(rs, p)).count() as i32;
    let ready = pods.iter().filter(|p| is_pod_ready(p)).count() as i32;
    let available = pods.iter().filter(|p| is_pod_available(p, min_ready, now)).count() as i32;
    let mut conditions = status.conditions.take().unwrap_or_default();
    let failure = conditions.iter().position(|c| c.type_ == REPLICA_FAILURE);
    match (manage, failure) {
        (Err((reason, message)), None) => conditions.push(ReplicaSetCondition {
            type_: REPLICA_FAILURE.into(),
            status: "True".into(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            last_transition_time: Some(Time(now)),
        }),
        (Ok(()), Some(i)) => {
            conditions.remove(i);
        }
        _ => {}
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    status.replicas = pods.len() as i32;
    // Zero counters are left out, as upstream's `omitempty` leaves them out.
    let non_zero = |v: i32| (v != 0).then_some(v);
    status.fully_labeled_replicas = non_zero(fully_labeled);
    status.ready_replicas = non_zero(ready);
    status.available_replicas = non_zero(available);
    status.observed_generation = rs.meta().generation;
    status
}

/// How long until the next ready pod becomes available, if one is waiting
/// out minReadySeconds.
pub fn next_availability<K: ReplicaOwner>(rs: &K, pods: &[Arc<Pod>], now: Timestamp) -> Option<Duration> {
    let min_ready = i64::from(rs.min_ready_seconds());
    if min_ready <= 0 {
        return None;
    }
    pods.iter()
        .filter(|p| is_pod_ready(p) && !is_pod_available(p, min_ready as i32, now))
        .filter_map(|p| {
            let since = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
            let since = since.last_transition_time.as_ref()?.0.as_second();
            let wait = since + min_ready - now.as_second();
            Some(Duration::from_secs(wait.max(0) as u64) + Duration::from_millis(100))
        })
        .min()
}

/// Equal in everything upstream compares before writing status.
pub fn status_equal(a: &ReplicaSetStatus, b: &ReplicaSetStatus) -> bool {
    a.replicas == b.replicas
        && a.fully_labeled_replicas.unwrap_or(0) == b.fully_labeled_replicas.unwrap_or(0)
        && a.ready_replicas.unwrap_or(0) == b.ready_replicas.unwrap_or(0)
        && a.available_replicas.unwrap_or(0) == b.available_replicas.unwrap_or(0)
        && a.observed_generation == b.observed_generation
        && a.conditions == b.conditions
}
