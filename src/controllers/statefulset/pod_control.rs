//! Upstream's StatefulPodControl: creates a set's pod (its claims first)
//! and deletes one (releasing its claims on scale down), recording what it
//! expects to see and the events upstream records.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{Api, DeleteParams, PostParams};

use super::pods::{create_claims, new_pod, ordinal_of, release_claims_on_scale_down};
use super::Context;
use crate::client::events::EventType;
use crate::controllers::ControllerError;

pub(super) struct StatefulPodControl<'a> {
    ctx: &'a Context,
    set: &'a StatefulSet,
    name: String,
    uid: String,
    pods: Api<Pod>,
}

impl<'a> StatefulPodControl<'a> {
    pub fn new(ctx: &'a Context, set: &'a StatefulSet) -> Self {
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        StatefulPodControl {
            ctx,
            set,
            name: set.metadata.name.clone().unwrap_or_default(),
            uid: set.metadata.uid.clone().unwrap_or_default(),
            pods: Api::namespaced(ctx.client.clone(), &ns),
        }
    }

    /// Creates the pod of ordinal `ord` from `template` (of `revision`),
    /// after the claims it mounts; one that exists already is fine.
    pub async fn create(&self, template: &PodTemplateSpec, revision: &str, ord: i32) -> Result<(), ControllerError> {
        let (ctx, set, name) = (self.ctx, self.set, &self.name);
        let pod = new_pod(set, template, revision, ord);
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        for claim in create_claims(&ctx.client, set, ord).await? {
            ctx.recorder.publish(
                set,
                EventType::Normal,
                "SuccessfulCreate",
                &format!("create Claim {claim} Pod {pod_name} in StatefulSet {name} success"),
            );
        }
        ctx.expectations.expect_create(&self.uid, &pod_name);
        match self.pods.create(&PostParams::default(), &pod).await {
            Ok(_) => ctx.recorder.publish(
                set,
                EventType::Normal,
                "SuccessfulCreate",
                &format!("create Pod {pod_name} in StatefulSet {name} successful"),
            ),
            Err(e) => {
                ctx.expectations.forget_create(&self.uid, &pod_name);
                if !matches!(&e, kube::Error::Api(s) if s.code == 409) {
                    ctx.recorder.publish(
                        set,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("create Pod {pod_name} in StatefulSet {name} failed error: {e}"),
                    );
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Deletes `pod` (`why`: finished, scale down, update); on scale down
    /// its claims are released first as the retention policy says. One
    /// already gone is fine.
    pub async fn delete(&self, pod: &Pod, why: &'static str) -> Result<(), ControllerError> {
        let (ctx, set, name) = (self.ctx, self.set, &self.name);
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        if why == "scale down" {
            if let Some(ord) = ordinal_of(name, &pod_name) {
                release_claims_on_scale_down(&ctx.client, set, pod, ord).await?;
            }
        }
        tracing::debug!(statefulset = %name, pod = %pod_name, why, "deleting pod");
        ctx.expectations.expect_delete(&self.uid, &pod_name);
        match self.pods.delete(&pod_name, &DeleteParams::default()).await {
            Ok(_) => ctx.recorder.publish(
                set,
                EventType::Normal,
                "SuccessfulDelete",
                &format!("delete Pod {pod_name} in StatefulSet {name} successful"),
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                ctx.recorder.publish(
                    set,
                    EventType::Warning,
                    "FailedDelete",
                    &format!("delete Pod {pod_name} in StatefulSet {name} failed error: {e}"),
                );
                return Err(e.into());
            }
        }
        Ok(())
    }
}
