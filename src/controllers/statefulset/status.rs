//! Upstream's updateStatefulSetStatus: the set's counts from the cache as
//! it stands (changes made by the pass arrive as watch events and trigger
//! another), written when they changed.

use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::json;

use super::pods::{is_running_and_ready, is_terminating, revision_of};
use super::update::{SetPods, UpdatePolicy};
use super::{Context, SetRevisions};
use crate::controllers::controller_utils::{is_pod_available, patch_status};
use crate::controllers::ControllerError;

/// The status one pass computes.
pub(super) struct SetStatus {
    pub replicas: i32,
    pub ready: i32,
    pub available: i32,
    pub updated: i32,
    /// The current revision: the update revision once a rolling update has
    /// every replica updated and ready.
    pub current_revision: String,
    pub current_replicas: i32,
    pub update_revision: String,
    pub collision_count: i32,
    /// A pod is ready but not yet available.
    pub look_again: bool,
}

impl SetStatus {
    pub fn compute(
        pods: &SetPods,
        revisions: &SetRevisions,
        policy: &UpdatePolicy,
        min_ready: i32,
        collision_count: i32,
    ) -> Self {
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut s = SetStatus {
            replicas: 0,
            ready: 0,
            available: 0,
            updated: 0,
            current_revision: revisions.current.clone(),
            current_replicas: 0,
            update_revision: revisions.update.clone(),
            collision_count,
            look_again: false,
        };
        for pod in pods.slots.values().chain(pods.condemned.iter().map(|(_, p)| p)) {
            if is_terminating(pod) {
                continue;
            }
            s.replicas += 1;
            if is_running_and_ready(pod) {
                s.ready += 1;
                if is_pod_available(pod, min_ready, now) {
                    s.available += 1;
                } else {
                    s.look_again = true;
                }
            }
            if revision_of(pod) == Some(revisions.current.as_str()) {
                s.current_replicas += 1;
            }
            if revision_of(pod) == Some(revisions.update.as_str()) {
                s.updated += 1;
            }
        }
        if policy.rolling && s.updated == s.replicas && s.ready == s.replicas && s.replicas == pods.replicas {
            s.current_revision = revisions.update.clone();
            s.current_replicas = s.updated;
        }
        s
    }
}

/// Writes the status when a field of it changed (a set gone meanwhile is
/// fine).
pub(super) async fn update_statefulset_status(
    ctx: &Context,
    set: &StatefulSet,
    s: &SetStatus,
) -> Result<(), ControllerError> {
    let new_status = json!({
        "observedGeneration": set.metadata.generation,
        "replicas": s.replicas,
        "readyReplicas": s.ready,
        "currentReplicas": s.current_replicas,
        "updatedReplicas": s.updated,
        "availableReplicas": s.available,
        "currentRevision": s.current_revision,
        "updateRevision": s.update_revision,
        "collisionCount": s.collision_count,
    });
    let old = serde_json::to_value(set.status.clone().unwrap_or_default()).unwrap_or_default();
    let changed = new_status
        .as_object()
        .into_iter()
        .flatten()
        .any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v && !(v.is_null() && old.get(k).is_none()));
    if changed {
        patch_status(&ctx.client, set, new_status).await?;
    }
    Ok(())
}
