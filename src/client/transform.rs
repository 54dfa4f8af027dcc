//! client-go's informer TransformFunc for the shared informers: what the
//! process's caches keep of each object. kube-scheduler and
//! kube-controller-manager drop managedFields there; ferrok also drops
//! what no in-process reader (controllers, scheduler) reads of a pod and
//! what weighs most in it: the volumes that name no claim, and their
//! mounts.
//!
//! Every pod carries its projected service-account token volume (added at
//! admission), which in k8s-openapi's types is a 3 KiB `Volume` (each of
//! its thirty-odd optional sources is held inline) plus its projections:
//! for a one-container pod that is half of its 10 KiB decoded (measured
//! with a counting allocator), 47 MiB for 10,000 pods. The readers of
//! pod volumes in process are the scheduler's volume binding and the
//! PersistentVolume and local-path controllers, which look for claims
//! only (`persistentVolumeClaim`, and `ephemeral`, whose claim is named
//! after the pod). A component that needs another volume source must keep
//! it here. Pods are never written back from the cache (controllers
//! patch), so what is dropped is never lost: the API server and the
//! agent's own pod watch keep every field.

use std::any::Any;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kube::Resource;

/// What the shared caches keep of `obj`.
pub fn transform<K: Resource + 'static>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(pod) = (obj as &mut dyn Any).downcast_mut::<Pod>() {
        forget_unread_volumes(pod);
    }
}

/// Whether an in-process reader reads the volume: it names a claim.
fn names_a_claim(volume: &Volume) -> bool {
    volume.persistent_volume_claim.is_some() || volume.ephemeral.is_some()
}

/// Drops the pod's volumes that name no claim, and every container's
/// mounts of them.
fn forget_unread_volumes(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else { return };
    let Some(volumes) = spec.volumes.as_mut() else { return };
    let dropped: Vec<String> = volumes.iter().filter(|v| !names_a_claim(v)).map(|v| v.name.clone()).collect();
    if dropped.is_empty() {
        return;
    }
    volumes.retain(names_a_claim);
    if volumes.is_empty() {
        spec.volumes = None;
    }
    for container in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        if let Some(mounts) = container.volume_mounts.as_mut() {
            mounts.retain(|m| !dropped.contains(&m.name));
            if mounts.is_empty() {
                container.volume_mounts = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default",
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {
                "initContainers": [{"name": "init", "volumeMounts": [
                    {"name": "kube-api-access-x2v4q", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "containers": [{"name": "web", "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "kube-api-access-x2v4q", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "kube-api-access-x2v4q", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}},
                    {"name": "config", "configMap": {"name": "web"}}]
            }
        }))
        .expect("pod")
    }

    #[test]
    fn a_cached_pod_keeps_its_claims_and_their_mounts_only() {
        let mut p = pod();
        transform(&mut p);
        assert_eq!(p.metadata.managed_fields, None);
        let spec = p.spec.expect("spec");
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["data", "scratch"]);
        let mounts: Vec<&str> =
            spec.containers[0].volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(mounts, ["/data", "/scratch"]);
        assert_eq!(spec.init_containers.expect("init containers")[0].volume_mounts, None);
    }

    #[test]
    fn a_pod_without_claims_keeps_no_volumes_and_other_kinds_keep_everything_but_managed_fields() {
        let mut p = pod();
        p.spec.as_mut().expect("spec").volumes.as_mut().expect("volumes").drain(..2);
        transform(&mut p);
        let spec = p.spec.expect("spec");
        assert_eq!(spec.volumes, None);
        assert_eq!(spec.containers[0].volume_mounts.iter().flatten().count(), 2, "mounts of the volumes it kept stay");

        let mut node: Node = serde_json::from_value(json!({"metadata": {"name": "n1",
            "managedFields": [{"manager": "kubelet"}], "labels": {"a": "b"}}, "spec": {"podCIDR": "10.42.0.0/24"}}))
        .expect("node");
        let before = node.clone();
        transform(&mut node);
        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!((node.metadata.labels, node.spec), (before.metadata.labels, before.spec));
    }
}
