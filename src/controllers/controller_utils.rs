//! What the workload controllers share, in upstream's controller_utils
//! vocabulary: controller references, pod states, and pods made from a
//! template.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::backoff::Backoff;

/// Per-object retry delays for failed syncs, as the work queue's per-item
/// exponential rate limiter gives them: 100 ms doubling on each failure of
/// the same object up to 5 min, forgotten on its next success
/// ([`Backoff::reset`]).
pub fn sync_retry_backoff() -> Backoff {
    Backoff::per_item(Duration::from_millis(100), Duration::from_secs(300))
}

/// An ownerReference marking `owner` as the controller of a dependent, with
/// `blockOwnerDeletion` so foreground deletion waits for the dependent.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let meta = owner.meta();
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether a pod's labels changed: what selected it by its old labels
/// (Services, disruption budgets) must look again too, as upstream's
/// `GetServicesToUpdateOnPodChange` and disruption `updatePod` do.
pub fn relabelled(old: &Pod, new: &Pod) -> bool {
    old.metadata.labels != new.metadata.labels
}

/// The ownerReference with `controller: true`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|o| o.controller == Some(true))
}

/// Whether `meta`'s controller is the object with `uid`.
pub fn is_controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    controller_of(meta).is_some_and(|o| o.uid == uid)
}

pub fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// Neither finished nor being deleted: what a ReplicaSet counts.
pub fn is_pod_active(pod: &Pod) -> bool {
    !matches!(pod_phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

/// The pod's Ready condition is True.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When to look again at a pod that is ready but not yet available: after
/// `min_ready_seconds`, and at least a second from now.
pub fn look_again_for_available(min_ready_seconds: i32) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from(min_ready_seconds).unwrap_or(0).max(1))
}

/// Ready for at least `min_ready_seconds` by `now`.
pub fn is_pod_available(pod: &Pod, min_ready_seconds: i32, now: k8s_openapi::jiff::Timestamp) -> bool {
    if !is_pod_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    let since = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref());
    since.is_some_and(|t| now.as_second() - t.0.as_second() >= i64::from(min_ready_seconds))
}

/// A pod for `namespace` from `template`, controlled by `owner`; the caller
/// sets `name` or `generate_name`.
pub fn pod_from_template(template: &PodTemplateSpec, namespace: &str, owner: OwnerReference) -> Pod {
    let t = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            labels: t.labels,
            annotations: t.annotations,
            finalizers: t.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// A create refused because its namespace is being deleted (upstream's
/// NamespaceTerminating cause): nothing to retry. Any other 403 is a
/// refusal by RBAC, an error worth retrying and logging.
pub fn namespace_terminating(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 403 && s.message.contains("being terminated"))
}

/// A delete or patch that found its object already gone did what it was for.
pub fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `status` to a namespaced object's status subresource as a merge
/// patch; an object gone meanwhile is fine.
pub async fn patch_status<K>(client: &kube::Client, obj: &K, status: serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let meta = obj.meta();
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), meta.namespace.as_deref().unwrap_or_default());
    let patch = serde_json::json!({ "status": status });
    let name = meta.name.as_deref().unwrap_or_default();
    ignore_not_found(api.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await)
}

/// Delete options that only delete the object with `uid`, not a newer one
/// of the same name created meanwhile.
pub fn delete_only_uid(uid: Option<String>) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status { code: 403, ..kube::core::Status::failure(message, "Forbidden") }.boxed())
    }

    #[test]
    fn only_a_terminating_namespace_makes_a_403_nothing_to_retry() {
        assert!(namespace_terminating(&forbidden(
            "pods \"p\" is forbidden: unable to create new content in namespace team because it is being terminated"
        )));
        assert!(!namespace_terminating(&forbidden(
            "pods is forbidden: User \"system:serviceaccount:kube-system:job-controller\" cannot create resource \"pods\""
        )));
    }
}
