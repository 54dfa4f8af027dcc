//! Upstream's updateDaemonSetStatus: the DaemonSet's counts over the Nodes,
//! written when they changed.

use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::json;

use super::manage::NodeState;
use super::{revision_hash, Availability, Context};
use crate::controllers::controller_utils::{is_pod_ready, patch_status};
use crate::controllers::ControllerError;

#[derive(Default)]
pub(super) struct Counts {
    pub desired: i32,
    pub current: i32,
    pub misscheduled: i32,
    pub ready: i32,
    pub updated: i32,
    pub available: i32,
    /// A Node's daemon pod is ready but not yet available.
    pub look_again: bool,
}

/// The counts of the status, from each Node's oldest live pod.
pub(super) fn count(nodes: &[NodeState], hash: &str, availability: &Availability) -> Counts {
    let mut counts = Counts::default();
    for node in nodes {
        if !node.place.should_run {
            if !node.live.is_empty() {
                counts.misscheduled += 1;
            }
            continue;
        }
        counts.desired += 1;
        let Some(first) = node.live.first() else { continue };
        counts.current += 1;
        if is_pod_ready(first) {
            counts.ready += 1;
            if availability.of(first) {
                counts.available += 1;
            } else {
                counts.look_again = true;
            }
        }
        if node.live.iter().any(|p| revision_hash(p) == Some(hash)) {
            counts.updated += 1;
        }
    }
    counts
}

/// Writes the status when a field of it changed (a DaemonSet gone
/// meanwhile is fine).
pub(super) async fn update_daemonset_status(
    ctx: &Context,
    ds: &DaemonSet,
    counts: &Counts,
    collision_count: i32,
) -> Result<(), ControllerError> {
    let new_status = json!({
        "observedGeneration": ds.metadata.generation,
        "desiredNumberScheduled": counts.desired,
        "currentNumberScheduled": counts.current,
        "numberMisscheduled": counts.misscheduled,
        "numberReady": counts.ready,
        "updatedNumberScheduled": counts.updated,
        "numberAvailable": counts.available,
        "numberUnavailable": counts.desired - counts.available,
        "collisionCount": collision_count,
    });
    let old = serde_json::to_value(ds.status.clone().unwrap_or_default()).unwrap_or_default();
    let changed = new_status.as_object().into_iter().flatten().any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v);
    if changed {
        patch_status(&ctx.client, ds, new_status).await?;
    }
    Ok(())
}
