//! A ReplicationController seen as a ReplicaSet (upstream's
//! pkg/controller/replication, which runs the ReplicaSet controller over
//! RCs through a conversion): its map selector is a selector of matchLabels,
//! and its status converts to and from a ReplicaSet's field for field.

use std::borrow::Cow;

use k8s_openapi::api::apps::v1::{ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{
    PodTemplateSpec, ReplicationController, ReplicationControllerCondition, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::owner::ReplicaOwner;

impl ReplicaOwner for ReplicationController {
    const QUEUE: &'static str = "replicationmanager";

    fn selector(&self) -> Option<Cow<'_, LabelSelector>> {
        let labels = self.spec.as_ref()?.selector.clone()?;
        Some(Cow::Owned(LabelSelector { match_labels: Some(labels), match_expressions: None }))
    }

    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().and_then(|s| s.template.as_ref())
    }

    fn desired_replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    fn min_ready_seconds(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
    }

    fn replica_status(&self) -> Option<ReplicaSetStatus> {
        let s = self.status.as_ref()?;
        Some(ReplicaSetStatus {
            replicas: s.replicas,
            fully_labeled_replicas: s.fully_labeled_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            conditions: s.conditions.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| ReplicaSetCondition {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        last_transition_time: c.last_transition_time.clone(),
                    })
                    .collect()
            }),
            ..Default::default()
        })
    }

    fn with_replica_status(&self, s: ReplicaSetStatus) -> Self {
        let status = ReplicationControllerStatus {
            replicas: s.replicas,
            fully_labeled_replicas: s.fully_labeled_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .map(|c| ReplicationControllerCondition {
                        type_: c.type_,
                        status: c.status,
                        reason: c.reason,
                        message: c.message,
                        last_transition_time: c.last_transition_time,
                    })
                    .collect()
            }),
        };
        ReplicationController { status: Some(status), ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rc_reads_as_a_replica_set_and_its_status_converts_back() {
        let rc: ReplicationController = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "minReadySeconds": 5, "selector": {"app": "web"},
                     "template": {"metadata": {"labels": {"app": "web"}}}},
            "status": {"replicas": 2, "readyReplicas": 1, "observedGeneration": 4,
                       "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}]}
        }))
        .unwrap();
        let sel = rc.selector().unwrap();
        assert_eq!(sel.match_labels.as_ref().unwrap()["app"], "web");
        assert_eq!((rc.desired_replicas(), rc.min_ready_seconds()), (3, 5));
        let status = rc.replica_status().unwrap();
        assert_eq!((status.replicas, status.ready_replicas, status.observed_generation), (2, Some(1), Some(4)));
        let back = rc.with_replica_status(status);
        assert_eq!(back.status, rc.status);
        assert!(ReplicationController::is_kind("v1", "ReplicationController"));
        assert!(!ReplicationController::is_kind("apps/v1", "ReplicationController"));
        assert!(k8s_openapi::api::apps::v1::ReplicaSet::is_kind("apps/v1", "ReplicaSet"));
    }
}
