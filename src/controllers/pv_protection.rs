//! PVProtectionController (persistentvolume-protection), as upstream's
//! pkg/controller/volume/pvprotection, acting as `pv-protection-controller`:
//! a PersistentVolume carries the finalizer `kubernetes.io/pv-protection`
//! (the StorageObjectInUseProtection admission adds it on create; this adds
//! it to any volume without it), and a volume being deleted keeps it while
//! it is Bound to a claim. Upstream records no Events here, nor does this.

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};

use super::informers;
use super::ControllerError;
use crate::client::informer_factory::SharedInformerFactory;

/// The service account it acts as.
pub const NAME: &str = "pv-protection-controller";
/// The finalizer (the StorageObjectInUseProtection admission adds it too).
pub const FINALIZER: &str = "kubernetes.io/pv-protection";

fn has_finalizer(volume: &PersistentVolume) -> bool {
    volume.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

fn deletion_candidate(volume: &PersistentVolume) -> bool {
    volume.metadata.deletion_timestamp.is_some() && has_finalizer(volume)
}

fn needs_finalizer(volume: &PersistentVolume) -> bool {
    volume.metadata.deletion_timestamp.is_none() && !has_finalizer(volume)
}

/// Bound to a claim: in use (upstream's isBeingUsed).
fn is_bound(volume: &PersistentVolume) -> bool {
    volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (volumes, requests) = informers
        .informer::<PersistentVolume>()
        .subscribe()
        .only(|v| deletion_candidate(v) || needs_finalizer(v))
        .trigger_self();
    informers::run("pvprotection", volumes, vec![requests], reconcile, Arc::new(client)).await;
}

async fn reconcile(volume: Arc<PersistentVolume>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    let mut updated = (*volume).clone();
    updated.metadata.managed_fields = None;
    if deletion_candidate(&volume) {
        if is_bound(&volume) {
            return Ok(Action::await_change());
        }
        let kept = volume.metadata.finalizers.iter().flatten().filter(|f| *f != FINALIZER).cloned().collect();
        updated.metadata.finalizers = Some(kept);
    } else if needs_finalizer(&volume) {
        updated.metadata.finalizers.get_or_insert_with(Vec::new).push(FINALIZER.to_string());
    } else {
        return Ok(Action::await_change());
    }
    let name = volume.metadata.name.clone().unwrap_or_default();
    match Api::<PersistentVolume>::all((*client).clone()).replace(&name, &PostParams::default(), &updated).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bound_volume_is_kept() {
        let pv = |phase: &str, deleting: bool| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pv1", "finalizers": [FINALIZER],
                             "deletionTimestamp": deleting.then_some("2025-01-01T00:00:00Z")},
                "status": {"phase": phase},
            }))
            .unwrap()
        };
        assert!(deletion_candidate(&pv("Bound", true)) && is_bound(&pv("Bound", true)));
        assert!(deletion_candidate(&pv("Released", true)) && !is_bound(&pv("Released", true)));
        assert!(!deletion_candidate(&pv("Bound", false)) && !needs_finalizer(&pv("Bound", false)));
    }
}
