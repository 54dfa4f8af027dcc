//! The claims a pod's volumes use, as upstream's component-helpers
//! (`storage/ephemeral`) name them for every component that reads them
//! (the scheduler, the PersistentVolume controllers, the ephemeral volume
//! controller): a `persistentVolumeClaim` volume names its claim, a generic
//! ephemeral volume (`ephemeral.volumeClaimTemplate`) uses the claim
//! `<pod>-<volume>`, which is the pod's only when the pod controls it.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Volume};

/// The claim of the generic ephemeral volume `volume` of the pod `pod_name`.
pub fn ephemeral_claim_name(pod_name: &str, volume: &Volume) -> String {
    format!("{pod_name}-{}", volume.name)
}

/// The names of every claim the pod's volumes use, in the volumes' order.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(ephemeral_claim_name(pod_name, v)),
            (None, None) => None,
        })
        .collect()
}

/// Whether the pod uses the claim `name` (of its namespace).
pub fn uses_claim(pod: &Pod, name: &str) -> bool {
    claim_names(pod).iter().any(|c| c == name)
}

/// A claim that another pod (or no pod) controls, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PVC {claim} was not created for pod {pod} (pod is not owner)")]
pub struct ClaimNotForPod {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// `namespace/name` of the pod.
    pub pod: String,
}

/// Upstream's `VolumeIsForPod`: the claim was made for this pod (it is in
/// the pod's namespace and the pod is its controller); the error says why
/// not.
pub fn claim_is_for_pod(pod: &Pod, claim: &PersistentVolumeClaim) -> Result<(), ClaimNotForPod> {
    let controlled = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref());
    if claim.metadata.namespace != pod.metadata.namespace || !controlled {
        let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default())
        };
        return Err(ClaimNotForPod { claim: key(&claim.metadata), pod: key(&pod.metadata) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_of_a_pod_and_whose_they_are() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "tmp", "emptyDir": {}},
            ]}
        }))
        .unwrap();
        assert_eq!(claim_names(&pod), ["shared", "web-scratch"]);
        assert!(uses_claim(&pod, "web-scratch") && !uses_claim(&pod, "web-tmp"));
        let mut claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "web-scratch", "namespace": "shop",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u1", "controller": true}]}
        }))
        .unwrap();
        assert_eq!(claim_is_for_pod(&pod, &claim), Ok(()));
        claim.metadata.owner_references = None;
        assert_eq!(
            claim_is_for_pod(&pod, &claim).map_err(|e| e.to_string()),
            Err("PVC shop/web-scratch was not created for pod shop/web (pod is not owner)".to_string())
        );
    }
}
