//! The RollingUpdate strategy: scale the new ReplicaSet up within maxSurge,
//! scale old ones down within maxUnavailable (unhealthy replicas first),
//! clean up old ReplicaSets once the rollout is complete.

use k8s_openapi::api::apps::v1::ReplicaSet;

use super::progress::deployment_complete;
use super::sync::{active, new_rs_new_replicas};
use super::util::{
    available_replica_count, available_replicas, by_creation, max_unavailable, replica_count, replicas, rs_replicas,
};
use super::DeploymentSync;
use crate::controllers::ControllerError;

impl DeploymentSync<'_> {
    pub(super) async fn rollout_rolling(&mut self, rss: &[ReplicaSet]) -> Result<(), ControllerError> {
        let (new_rs, old) = self.get_all_replicasets_and_sync_revision(rss, true).await?;
        let Some(new_rs) = new_rs else {
            return Err(ControllerError::Invalid("no new replica set".into()));
        };
        let mut all = old.clone();
        all.push(new_rs.clone());
        if self.reconcile_new_replicaset(&all, &new_rs).await? {
            return self.sync_rollout_status(&all, Some(&new_rs)).await;
        }
        let active_old: Vec<ReplicaSet> = active(&old).into_iter().cloned().collect();
        if self.reconcile_old_replicasets(&all, active_old, &new_rs).await? {
            return self.sync_rollout_status(&all, Some(&new_rs)).await;
        }
        if self.d.status.as_ref().is_some_and(|s| deployment_complete(&self.d, s)) {
            self.cleanup_deployment(&old).await?;
        }
        self.sync_rollout_status(&all, Some(&new_rs)).await
    }

    /// Scales the new ReplicaSet toward the Deployment's size; true if it did.
    async fn reconcile_new_replicaset(&self, all: &[ReplicaSet], new_rs: &ReplicaSet) -> Result<bool, ControllerError> {
        let want = replicas(&self.d);
        let have = rs_replicas(new_rs);
        if have == want {
            return Ok(false);
        }
        let target = if have > want { want } else { new_rs_new_replicas(&self.d, all, new_rs) };
        Ok(self.scale_replicaset_and_record_event(new_rs, target).await?.is_some())
    }

    /// Scales old ReplicaSets down as far as availability allows; true if any was.
    async fn reconcile_old_replicasets(
        &self,
        all: &[ReplicaSet],
        old: Vec<ReplicaSet>,
        new_rs: &ReplicaSet,
    ) -> Result<bool, ControllerError> {
        if replica_count(&old) == 0 {
            return Ok(false);
        }
        let all_pods = replica_count(all);
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let new_unavailable = rs_replicas(new_rs) - available_replicas(new_rs);
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        let (old, cleaned) = self.cleanup_unhealthy_replicas(old, max_scaled_down).await?;
        let mut all: Vec<ReplicaSet> = old.clone();
        all.push(new_rs.clone());
        let scaled = self.scale_down_old_replicasets(&all, old).await?;
        Ok(cleaned + scaled > 0)
    }

    /// Removes replicas that are not available from old ReplicaSets first,
    /// oldest first, at most `max_cleanup`.
    async fn cleanup_unhealthy_replicas(
        &self,
        mut old: Vec<ReplicaSet>,
        max_cleanup: i32,
    ) -> Result<(Vec<ReplicaSet>, i32), ControllerError> {
        old.sort_by(by_creation);
        let mut total = 0;
        for rs in old.iter_mut() {
            if total >= max_cleanup {
                break;
            }
            let (want, available) = (rs_replicas(rs), available_replicas(rs));
            if want == 0 || want == available {
                continue;
            }
            let count = (max_cleanup - total).min(want - available);
            if let Some(updated) = self.scale_replicaset_and_record_event(rs, want - count).await? {
                *rs = updated;
            }
            total += count;
        }
        Ok((old, total))
    }

    /// Scales old ReplicaSets down, oldest first, while availability stays
    /// at least replicas - maxUnavailable.
    async fn scale_down_old_replicasets(
        &self,
        all: &[ReplicaSet],
        mut old: Vec<ReplicaSet>,
    ) -> Result<i32, ControllerError> {
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let available = available_replica_count(all);
        if available <= min_available {
            return Ok(0);
        }
        old.sort_by(by_creation);
        let total = available - min_available;
        let mut scaled = 0;
        for rs in &old {
            if scaled >= total {
                break;
            }
            if rs_replicas(rs) == 0 {
                continue;
            }
            let count = rs_replicas(rs).min(total - scaled);
            self.scale_replicaset_and_record_event(rs, rs_replicas(rs) - count).await?;
            scaled += count;
        }
        Ok(scaled)
    }
}
