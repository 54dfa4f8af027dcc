//! The Recreate strategy: scale every old ReplicaSet to zero, wait until
//! their pods are gone (terminating ones too), then create (or scale up)
//! the new one.

use k8s_openapi::api::apps::v1::ReplicaSet;

use super::progress::deployment_complete;
use super::sync::active;
use super::util::{replicas, status_replicas};
use super::DeploymentSync;
use crate::controllers::controller_utils::pod_phase;
use crate::controllers::informers::controlled_by;
use crate::controllers::ControllerError;

impl DeploymentSync<'_> {
    pub(super) async fn rollout_recreate(&mut self, rss: &[ReplicaSet]) -> Result<(), ControllerError> {
        let (new_rs, old) = self.get_all_replicasets_and_sync_revision(rss, false).await?;
        let mut all = old.clone();
        all.extend(new_rs.clone());
        let mut scaled_down = false;
        for rs in active(&old) {
            scaled_down |= self.scale_replicaset_and_record_event(rs, 0).await?.is_some();
        }
        if scaled_down {
            return self.sync_rollout_status(&all, new_rs.as_ref()).await;
        }
        if self.old_pods_running(&old) {
            return self.sync_rollout_status(&all, new_rs.as_ref()).await;
        }
        let (new_rs, old) = match new_rs {
            Some(rs) => (rs, old),
            None => {
                let (rs, old) = self.get_all_replicasets_and_sync_revision(rss, true).await?;
                (rs.ok_or_else(|| ControllerError::Invalid("no new replica set".into()))?, old)
            }
        };
        let mut all = old.clone();
        all.push(new_rs.clone());
        self.scale_replicaset_and_record_event(&new_rs, replicas(&self.d)).await?;
        if self.d.status.as_ref().is_some_and(|s| deployment_complete(&self.d, s)) {
            self.cleanup_deployment(&old).await?;
        }
        self.sync_rollout_status(&all, Some(&new_rs)).await
    }

    /// Whether an old ReplicaSet still counts pods, or any pod it controls
    /// (terminating ones included) has not finished.
    fn old_pods_running(&self, old: &[ReplicaSet]) -> bool {
        if old.iter().any(|rs| status_replicas(rs) > 0) {
            return true;
        }
        let ns = self.namespace();
        old.iter().filter_map(|rs| rs.metadata.uid.as_deref()).any(|uid| {
            controlled_by(&self.ctx.pods_by_owner, &ns, uid)
                .iter()
                .any(|p| !matches!(pod_phase(p), "Succeeded" | "Failed"))
        })
    }
}
