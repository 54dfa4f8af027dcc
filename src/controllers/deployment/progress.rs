//! A Deployment's status as upstream computes it: the counters summed over
//! its ReplicaSets, the Available condition (MinimumReplicasAvailable /
//! MinimumReplicasUnavailable), the Progressing condition (NewReplicaSetCreated,
//! FoundNewReplicaSet, ReplicaSetUpdated, NewReplicaSetAvailable,
//! ProgressDeadlineExceeded, DeploymentPaused, DeploymentResumed), and the
//! ReplicaFailure condition copied from a failing ReplicaSet.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::util::{
    actual_replica_count, available_replica_count, is_paused, max_unavailable, progress_deadline, ready_replica_count,
    replica_count, replicas,
};
use super::DeploymentSync;
use crate::controllers::ControllerError;

pub const PROGRESSING: &str = "Progressing";
pub const AVAILABLE: &str = "Available";
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
const PAUSED: &str = "DeploymentPaused";
const RESUMED: &str = "DeploymentResumed";

pub fn new_condition(type_: &str, status: &str, reason: &str, message: String) -> DeploymentCondition {
    let now = Time(Timestamp::now());
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

pub fn get_condition<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_)
}

pub fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(c) = status.conditions.as_mut() {
        c.retain(|c| c.type_ != type_);
        if c.is_empty() {
            status.conditions = None;
        }
    }
}

/// Upstream's SetDeploymentCondition: same status and reason is no change;
/// same status keeps the transition time; the condition moves to the end.
pub fn set_condition(status: &mut DeploymentStatus, mut condition: DeploymentCondition) {
    if let Some(current) = get_condition(status, &condition.type_) {
        if current.status == condition.status && current.reason == condition.reason {
            return;
        }
        if current.status == condition.status {
            condition.last_transition_time = current.last_transition_time.clone();
        }
    }
    let mut conditions: Vec<_> =
        status.conditions.take().unwrap_or_default().into_iter().filter(|c| c.type_ != condition.type_).collect();
    conditions.push(condition);
    status.conditions = Some(conditions);
}

/// Zero counters are left out, as upstream's `omitempty` leaves them out.
fn non_zero(v: i32) -> Option<i32> {
    (v != 0).then_some(v)
}

/// The status counters over `all` (the new ReplicaSet included) and the
/// Available condition.
pub fn calculate_status(all: &[ReplicaSet], new_rs: Option<&ReplicaSet>, d: &Deployment) -> DeploymentStatus {
    let available = available_replica_count(all);
    let total = replica_count(all);
    let old = d.status.clone().unwrap_or_default();
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: non_zero(actual_replica_count(all)),
        updated_replicas: non_zero(actual_replica_count(new_rs)),
        ready_replicas: non_zero(ready_replica_count(all)),
        available_replicas: non_zero(available),
        unavailable_replicas: non_zero((total - available).max(0)),
        collision_count: old.collision_count,
        conditions: old.conditions,
        terminating_replicas: None,
    };
    if available >= replicas(d) - max_unavailable(d) {
        set_condition(
            &mut status,
            new_condition(AVAILABLE, "True", "MinimumReplicasAvailable", "Deployment has minimum availability.".into()),
        );
    } else {
        set_condition(
            &mut status,
            new_condition(
                AVAILABLE,
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            ),
        );
    }
    status
}

fn count(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Every replica updated and available, and the latest spec observed.
pub fn deployment_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let want = replicas(d);
    count(status.updated_replicas) == want
        && count(status.replicas) == want
        && count(status.available_replicas) == want
        && status.observed_generation >= d.metadata.generation
}

/// Whether `status` shows progress over the Deployment's current status.
fn deployment_progressing(d: &Deployment, status: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let old_old = count(old.replicas) - count(old.updated_replicas);
    let new_old = count(status.replicas) - count(status.updated_replicas);
    count(status.updated_replicas) > count(old.updated_replicas)
        || new_old < old_old
        || count(status.ready_replicas) > count(old.ready_replicas)
        || count(status.available_replicas) > count(old.available_replicas)
}

/// Past the progress deadline since the Progressing condition last moved.
fn deployment_timed_out(d: &Deployment, status: &DeploymentStatus, now: Timestamp) -> bool {
    let Some(deadline) = progress_deadline(d) else { return false };
    let Some(c) = get_condition(status, PROGRESSING) else { return false };
    match c.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => c.last_update_time.as_ref().is_some_and(|t| t.0.as_second() + i64::from(deadline) < now.as_second()),
    }
}

/// The first ReplicaFailure condition of the new, then the old ReplicaSets.
fn replica_failure(all: &[ReplicaSet], new_rs: Option<&ReplicaSet>) -> Option<DeploymentCondition> {
    let failing = |rs: &ReplicaSet| {
        rs.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == REPLICA_FAILURE).map(|c| {
            DeploymentCondition {
                type_: REPLICA_FAILURE.into(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_update_time: c.last_transition_time.clone(),
                last_transition_time: c.last_transition_time.clone(),
            }
        })
    };
    new_rs.and_then(failing).or_else(|| all.iter().find_map(failing))
}

impl DeploymentSync<'_> {
    /// Writes status when it differs (paused and scaling syncs).
    pub(super) async fn sync_deployment_status(
        &mut self,
        all: &[ReplicaSet],
        new_rs: Option<&ReplicaSet>,
    ) -> Result<(), ControllerError> {
        let status = calculate_status(all, new_rs, &self.d);
        if self.d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    /// Status with the Progressing condition of a rollout, and a requeue at
    /// the progress deadline while nothing else changes.
    pub(super) async fn sync_rollout_status(
        &mut self,
        all: &[ReplicaSet],
        new_rs: Option<&ReplicaSet>,
    ) -> Result<(), ControllerError> {
        let d = &self.d;
        let mut status = calculate_status(all, new_rs, d);
        if progress_deadline(d).is_none() {
            remove_condition(&mut status, PROGRESSING);
        }
        let current = d.status.as_ref().and_then(|s| get_condition(s, PROGRESSING)).cloned();
        let complete = count(status.replicas) == count(status.updated_replicas)
            && current.as_ref().is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
        let subject = match new_rs {
            Some(rs) => format!("ReplicaSet {:?}", rs.metadata.name.as_deref().unwrap_or_default()),
            None => format!("Deployment {:?}", d.metadata.name.as_deref().unwrap_or_default()),
        };
        if progress_deadline(d).is_some() && !complete {
            if deployment_complete(d, &status) {
                let msg = format!("{subject} has successfully progressed.");
                set_condition(&mut status, new_condition(PROGRESSING, "True", NEW_RS_AVAILABLE, msg));
            } else if deployment_progressing(d, &status) {
                let mut c =
                    new_condition(PROGRESSING, "True", "ReplicaSetUpdated", format!("{subject} is progressing."));
                if let Some(current) = &current {
                    if current.status == "True" {
                        c.last_transition_time = current.last_transition_time.clone();
                    }
                    remove_condition(&mut status, PROGRESSING);
                }
                set_condition(&mut status, c);
            } else if deployment_timed_out(d, &status, Timestamp::now()) {
                let msg = format!("{subject} has timed out progressing.");
                set_condition(&mut status, new_condition(PROGRESSING, "False", TIMED_OUT, msg));
            }
        }
        match replica_failure(all, new_rs) {
            Some(c) => set_condition(&mut status, c),
            None => remove_condition(&mut status, REPLICA_FAILURE),
        }
        if d.status.as_ref() == Some(&status) {
            self.requeue = self.stuck_requeue(&status);
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    /// When to check the progress deadline again, if it can still pass.
    fn stuck_requeue(&self, status: &DeploymentStatus) -> Option<Duration> {
        let deadline = progress_deadline(&self.d)?;
        let c = get_condition(status, PROGRESSING)?;
        if c.reason.as_deref() == Some(TIMED_OUT) || deployment_complete(&self.d, status) {
            return None;
        }
        let from = c.last_update_time.as_ref()?.0.as_second();
        let after = from + i64::from(deadline) + 1 - Timestamp::now().as_second();
        Some(Duration::from_secs(after.max(1) as u64))
    }

    /// Records pausing and resuming in the Progressing condition.
    pub(super) async fn check_paused_conditions(&mut self) -> Result<(), ControllerError> {
        if progress_deadline(&self.d).is_none() {
            return Ok(());
        }
        let mut status = self.d.status.clone().unwrap_or_default();
        let reason = get_condition(&status, PROGRESSING).and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(TIMED_OUT) {
            return Ok(());
        }
        let paused_recorded = reason.as_deref() == Some(PAUSED);
        let paused = is_paused(&self.d);
        if paused && !paused_recorded {
            set_condition(&mut status, new_condition(PROGRESSING, "Unknown", PAUSED, "Deployment is paused".into()));
        } else if !paused && paused_recorded {
            set_condition(&mut status, new_condition(PROGRESSING, "Unknown", RESUMED, "Deployment is resumed".into()));
        } else {
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_transition_times() {
        let mut s = DeploymentStatus::default();
        let mut first = new_condition(AVAILABLE, "True", "A", "m".into());
        first.last_transition_time = Some(Time(Timestamp::from_second(10).unwrap()));
        set_condition(&mut s, first);
        set_condition(&mut s, new_condition(PROGRESSING, "True", "B", "m".into()));
        set_condition(&mut s, new_condition(AVAILABLE, "True", "C", "m".into()));
        let c = s.conditions.clone().unwrap();
        assert_eq!(c[1].type_, AVAILABLE);
        assert_eq!(c[1].last_transition_time.as_ref().unwrap().0.as_second(), 10);
        remove_condition(&mut s, AVAILABLE);
        remove_condition(&mut s, PROGRESSING);
        assert!(s.conditions.is_none());
    }
}
