//! LocalPathProvisioner: k3s' local-path-provisioner (an external
//! provisioner, `rancher.io/local-path`) without its helper pods. A pending
//! claim of a class it provisions gets, once its node is known (the
//! `volume.kubernetes.io/selected-node` annotation, or the node of a
//! scheduled pod that uses it: WaitForFirstConsumer), a PersistentVolume
//! pre-bound to it: a hostPath `<storage>/pvc-<uid>_<namespace>_<name>`
//! (DirectoryOrCreate, so the node's volume manager makes the directory)
//! pinned to that node. The binder then binds the two. A released volume
//! with the Delete policy is removed by its node (`agent::local_path`):
//! the directory first, then the volume.

use std::path::PathBuf;
use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::json;

use super::informers::{self, Informer};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::pod_volumes::claim_names;
use crate::well_known::annotations::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};

struct Context {
    client: kube::Client,
    classes: Store<StorageClass>,
    pods: Store<Pod>,
    storage: PathBuf,
    recorder: EventRecorder,
}

/// The volume's name for a claim: upstream's `pvc-<claim uid>`.
pub fn volume_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// The directory of a claim's volume under `storage` (k3s' layout).
pub fn volume_path(storage: &std::path::Path, uid: &str, namespace: &str, name: &str) -> PathBuf {
    storage.join(format!("pvc-{uid}_{namespace}_{name}"))
}

/// Runs until aborted. `storage` is `--default-local-storage-path`.
pub async fn run(client: kube::Client, pods: Informer<Pod>, storage: PathBuf) {
    let claims = informers::informer(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default());
    let classes = informers::informer(Api::<StorageClass>::all(client.clone()), watcher::Config::default());
    let (claim_store, claim_requests) = claims.trigger_self();
    let pending = {
        let store = claim_store.clone();
        move |_: &StorageClass| {
            store.state().iter().filter(|c| unbound(c)).map(|c| ObjectRef::from_obj(&**c)).collect::<Vec<_>>()
        }
    };
    let (class_store, class_requests) = classes.trigger_with(pending);
    // A scheduled pod names the node of its claims (generic ephemeral ones included).
    let (pod_store, pod_requests) = pods.trigger_with(|p: &Pod| {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let scheduled = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
        let claims = if scheduled { claim_names(p) } else { Vec::new() };
        claims.iter().map(|c| ObjectRef::<PersistentVolumeClaim>::new(c).within(&ns)).collect::<Vec<_>>()
    });
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), LOCAL_PATH_PROVISIONER),
        client,
        classes: class_store,
        pods: pod_store,
        storage,
    });
    informers::run(
        "local-path-provisioner",
        claim_store,
        vec![claim_requests, class_requests, pod_requests],
        provision,
        ctx,
    )
    .await;
}

fn unbound(c: &PersistentVolumeClaim) -> bool {
    c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty)
}

async fn provision(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if claim.metadata.deletion_timestamp.is_some() || !unbound(&claim) {
        return Ok(Action::await_change());
    }
    let spec = claim.spec.clone().unwrap_or_default();
    let class_name = spec.storage_class_name.clone().unwrap_or_default();
    let Some(class) = ctx.classes.get(&ObjectRef::new(&class_name)) else { return Ok(Action::await_change()) };
    if class.provisioner != LOCAL_PATH_PROVISIONER {
        return Ok(Action::await_change());
    }
    let Some(node) = super::persistentvolume::consumer_node(&ctx.pods, &claim) else {
        return Ok(Action::await_change());
    };
    let (ns, name) =
        (claim.metadata.namespace.clone().unwrap_or_default(), claim.metadata.name.clone().unwrap_or_default());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = volume_name(&uid);
    let path = volume_path(&ctx.storage, &uid, &ns, &name);
    let size = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned();
    let pv: PersistentVolume = crate::decode::from_value(&json!({
        "metadata": {"name": pv_name, "annotations": {PROVISIONED_BY: LOCAL_PATH_PROVISIONER}},
        "spec": {
            "capacity": {"storage": size.map(|q| q.0).unwrap_or_else(|| "1Gi".into())},
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class_name,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "hostPath": {"path": path.to_string_lossy(), "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid},
        }
    }))
    .map_err(|e| ControllerError::Invalid(e.to_string()))?;
    match Api::<PersistentVolume>::all(ctx.client.clone()).create(&PostParams::default(), &pv).await {
        Ok(_) => {
            tracing::info!(claim = %format!("{ns}/{name}"), volume = %pv_name, node = %node, "volume provisioned");
            let msg = format!("Successfully provisioned volume {pv_name} at {} on {node}", path.display());
            ctx.recorder.publish(&*claim, EventType::Normal, "ProvisioningSucceeded", &msg);
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => {
            let msg = format!("failed to provision volume with StorageClass {class_name:?}: {e}");
            ctx.recorder.publish(&*claim, EventType::Warning, "ProvisioningFailed", &msg);
            return Err(e.into());
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3s_layout() {
        let p = volume_path(std::path::Path::new("/var/lib/ferrok/storage"), "u1", "default", "data");
        assert_eq!(p, PathBuf::from("/var/lib/ferrok/storage/pvc-u1_default_data"));
        assert_eq!(volume_name("u1"), "pvc-u1");
    }
}
