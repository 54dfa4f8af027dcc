//! Revisions: the `deployment.kubernetes.io/revision` and
//! `revision-history` annotations a Deployment writes on its ReplicaSets
//! (and itself), the desired-/max-replicas annotations proportional scaling
//! reads, and the removal of old ReplicaSets beyond revisionHistoryLimit.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::DeleteParams;

use super::util::{
    max_surge, replicas, revision, rs_replicas, skip_copy_annotation, DESIRED_REPLICAS, MAX_REPLICAS, REVISION,
    REVISION_HISTORY,
};
use super::DeploymentSync;
use crate::controllers::controller_utils::ignore_not_found;
use crate::controllers::ControllerError;

pub fn max_revision(rss: &[ReplicaSet]) -> i64 {
    rss.iter().map(revision).max().unwrap_or(0)
}

/// Copies the Deployment's own annotations (all but the controller's) onto
/// the ReplicaSet; true if any changed.
fn copy_deployment_annotations(d: &Deployment, rs: &mut ReplicaSet) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if skip_copy_annotation(k) || annotations.get(k) == Some(v) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// Sets desired-replicas and max-replicas; true if either changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if annotations.get(k) != Some(&v) {
            annotations.insert(k.to_string(), v);
            changed = true;
        }
    }
    changed
}

pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    let get = |k: &str| rs.metadata.annotations.as_ref().and_then(|a| a.get(k)).cloned();
    get(DESIRED_REPLICAS) != Some(desired.to_string()) || get(MAX_REPLICAS) != Some(max.to_string())
}

/// The annotations of the new ReplicaSet: the Deployment's own, the new
/// revision (remembering the one it replaces in revision-history), and for
/// a ReplicaSet about to be created the replicas annotations. True if any
/// changed.
pub fn set_new_replicaset_annotations(d: &Deployment, rs: &mut ReplicaSet, new_revision: i64, exists: bool) -> bool {
    let mut changed = copy_deployment_annotations(d, rs);
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let old_revision = annotations.get(REVISION).cloned().unwrap_or_default();
    let old: i64 = match old_revision.parse() {
        Ok(r) => r,
        Err(_) if old_revision.is_empty() => 0,
        Err(_) => {
            tracing::warn!(revision = %old_revision, "a replica set has an unparsable revision");
            return changed;
        }
    };
    if old < new_revision {
        annotations.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        if !old_revision.is_empty() {
            let history = match annotations.get(REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{old_revision}"),
                _ => old_revision,
            };
            annotations.insert(REVISION_HISTORY.into(), history);
        }
    }
    if !exists && set_replicas_annotations(rs, replicas(d), replicas(d) + max_surge(d)) {
        changed = true;
    }
    changed
}

/// Sets the Deployment's revision annotation; true if it changed.
pub fn set_deployment_revision(d: &mut Deployment, revision: &str) -> bool {
    let annotations = d.metadata.annotations.get_or_insert_with(Default::default);
    if annotations.get(REVISION).map(String::as_str) == Some(revision) {
        return false;
    }
    annotations.insert(REVISION.into(), revision.to_string());
    true
}

impl DeploymentSync<'_> {
    /// Deletes the oldest scaled-down ReplicaSets beyond revisionHistoryLimit.
    pub(super) async fn cleanup_deployment(&self, old: &[ReplicaSet]) -> Result<(), ControllerError> {
        let Some(limit) = self.d.spec.as_ref().and_then(|s| s.revision_history_limit) else { return Ok(()) };
        let mut cleanable: Vec<&ReplicaSet> =
            old.iter().filter(|rs| rs.metadata.deletion_timestamp.is_none()).collect();
        let diff = cleanable.len() as i64 - i64::from(limit);
        if diff <= 0 {
            return Ok(());
        }
        cleanable.sort_by(|a, b| super::util::by_revision(a, b));
        let api = self.replicasets_api();
        for rs in cleanable.into_iter().take(diff as usize) {
            let status = rs.status.as_ref();
            let settled = status.is_some_and(|s| s.observed_generation >= rs.metadata.generation);
            if status.map(|s| s.replicas).unwrap_or(0) != 0 || rs_replicas(rs) != 0 || !settled {
                continue;
            }
            let name = rs.metadata.name.clone().unwrap_or_default();
            tracing::debug!(deployment = %self.name(), replicaset = %name, "cleaning up an old replica set");
            ignore_not_found(api.delete(&name, &DeleteParams::default()).await)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_and_history() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {"team": "a", REVISION: "9"}},
            "spec": {"replicas": 4, "selector": {}, "template": {}}
        }))
        .unwrap();
        let mut rs = ReplicaSet::default();
        assert!(set_new_replicaset_annotations(&d, &mut rs, 1, false));
        let a = rs.metadata.annotations.clone().unwrap();
        assert_eq!(a.get(REVISION).map(String::as_str), Some("1"));
        assert_eq!(a.get("team").map(String::as_str), Some("a"));
        assert_eq!(a.get(DESIRED_REPLICAS).map(String::as_str), Some("4"));
        assert_eq!(a.get(MAX_REPLICAS).map(String::as_str), Some("5"));
        assert!(!set_new_replicaset_annotations(&d, &mut rs, 1, true));
        assert!(set_new_replicaset_annotations(&d, &mut rs, 3, true));
        assert!(set_new_replicaset_annotations(&d, &mut rs, 5, true));
        let a = rs.metadata.annotations.unwrap();
        assert_eq!(a.get(REVISION).map(String::as_str), Some("5"));
        assert_eq!(a.get(REVISION_HISTORY).map(String::as_str), Some("1,3"));
    }
}
