//! persistentVolumeClaim (and generic ephemeral) volumes: the claim is
//! resolved to the PersistentVolume it is bound to, whose source says what
//! to mount. hostPath volumes mount the host's path (after upstream's type
//! check); `local` volumes are bind-mounted from `spec.local.path` into
//! the pod's folder, as upstream's local-volume plugin does.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;

use super::error::SetUpError;

/// What a bound claim mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimSource {
    HostPath { path: String, kind: Option<String> },
    Local { path: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedClaim {
    pub volume_name: String,
    pub source: ClaimSource,
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Resolves `claim` of `pod`; `ephemeral` claims must be owned by the pod.
pub async fn resolve(
    client: &kube::Client,
    pod: &Pod,
    claim: &str,
    ephemeral: bool,
) -> Result<ResolvedClaim, SetUpError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvc = match claims.get(claim).await {
        Ok(pvc) => pvc,
        Err(e) if is_not_found(&e) => return Err(SetUpError::ClaimNotFound(claim.to_string())),
        Err(e) => return Err(SetUpError::Api(super::api_message(&e))),
    };
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(SetUpError::ClaimDeleting(claim.to_string()));
    }
    if ephemeral {
        let owned = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == "Pod" && Some(&o.uid) == pod.metadata.uid.as_ref());
        if !owned {
            return Err(SetUpError::ClaimNotOwned {
                namespace: namespace.to_string(),
                claim: claim.to_string(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
            });
        }
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let volume_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty());
    let Some(volume_name) = volume_name.filter(|_| phase == Some("Bound")) else {
        return Err(SetUpError::ClaimNotBound(claim.to_string()));
    };
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv = match volumes.get(&volume_name).await {
        Ok(pv) => pv,
        Err(e) if is_not_found(&e) => return Err(SetUpError::VolumeNotFound(volume_name)),
        Err(e) => return Err(SetUpError::Api(super::api_message(&e))),
    };
    let spec = pv.spec.unwrap_or_default();
    if let Some(r) = &spec.claim_ref {
        let same_uid = match (&r.uid, &pvc.metadata.uid) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        if r.name.as_deref() != Some(claim) || !same_uid {
            return Err(SetUpError::VolumeBoundElsewhere { volume: volume_name, claim: claim.to_string() });
        }
    }
    let source = if let Some(h) = spec.host_path {
        ClaimSource::HostPath { path: h.path, kind: h.type_ }
    } else if let Some(l) = spec.local {
        ClaimSource::Local { path: l.path }
    } else {
        return Err(SetUpError::UnsupportedPersistentVolume(volume_name));
    };
    Ok(ResolvedClaim { volume_name, source })
}
