//! ExpandController (persistentvolume-expander), as upstream's
//! pkg/controller/volume/expand, acting as `expand-controller`: a bound
//! claim whose storage request grew past its `status.capacity` (which the
//! PersistentVolumeClaimResize admission lets through only when its
//! StorageClass has `allowVolumeExpansion: true`) has its volume expanded.
//!
//! What an expansion does depends on the volume, as upstream's plugins:
//! - a volume of ferrok's local-path provisioner (a hostPath directory,
//!   `pv.kubernetes.io/provisioned-by: rancher.io/local-path`) has no size
//!   limit to move: the directory already holds whatever fits on its
//!   node's disk. Expanding it is upstream's controller-side expansion
//!   with nothing to do on the device and no file system to grow on the
//!   node (as for a plugin that needs no node expansion), recorded on the
//!   API objects the way upstream v1.33 records it (RecoverVolumeExpansionFailure
//!   on): the claim's `status.allocatedResources.storage` becomes the new
//!   size, `status.allocatedResourceStatuses.storage` is
//!   `ControllerResizeInProgress` with a `Resizing` condition while it
//!   works; then the volume's `spec.capacity.storage` is the new size, and
//!   the claim's `status.capacity.storage` too, its resize status and
//!   resize conditions are cleared, and a `VolumeResizeSuccessful` Event
//!   says "ExpandVolume succeeded for volume <namespace>/<claim>". A
//!   failure is a `VolumeResizeFailed` Warning, retried.
//! - any other volume (a hostPath or local volume made by hand) has no
//!   plugin here that can expand it, as upstream's in-tree hostPath and
//!   local plugins have none: the claim gets upstream's `Normal`
//!   `ExternalExpanding` Event, "waiting for an external controller to
//!   expand this PVC", and keeps its request until something else records
//!   the expansion.
//!
//! (Upstream also annotates the claim `volume.kubernetes.io/storage-resizer`
//! through the status subresource; ferrok's status subresource keeps the
//! claim's metadata, so the annotation is not written.)

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::informers;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;
use crate::quantity::Amount;
use crate::well_known::annotations::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};

/// The service account it acts as.
pub const NAME: &str = "expand-controller";
/// The resize conditions upstream manages on a claim.
const RESIZE_CONDITIONS: [&str; 4] =
    ["Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError"];
/// A PV annotation upstream keeps while a node expansion is pending.
const PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

struct Context {
    client: kube::Client,
    volumes: Store<PersistentVolume>,
    recorder: EventRecorder,
}

fn is_bound(claim: &PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (claims, requests) = informers.informer::<PersistentVolumeClaim>().subscribe().only(is_bound).trigger_self();
    let volumes = informers.informer::<PersistentVolume>().store();
    let ctx = Arc::new(Context { recorder: EventRecorder::new(client.clone(), "volume_expand"), client, volumes });
    informers::run("volume_expand", claims, vec![requests], reconcile, ctx).await;
}

fn amount(q: Option<&Quantity>) -> Amount {
    q.and_then(|q| Amount::parse(&q.0).ok()).unwrap_or_default()
}

fn requested(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage")
}

fn status_capacity(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    claim.status.as_ref()?.capacity.as_ref()?.get("storage")
}

fn allocated(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    claim.status.as_ref()?.allocated_resources.as_ref()?.get("storage")
}

fn resize_status(claim: &PersistentVolumeClaim) -> &str {
    let statuses = claim.status.as_ref().and_then(|s| s.allocated_resource_statuses.as_ref());
    statuses.and_then(|s| s.get("storage")).map(String::as_str).unwrap_or_default()
}

fn volume_capacity(volume: &PersistentVolume) -> Option<&Quantity> {
    volume.spec.as_ref()?.capacity.as_ref()?.get("storage")
}

/// Whether ferrok can expand the volume itself: its local-path directories.
fn expandable_here(volume: &PersistentVolume) -> bool {
    let provisioner = volume.metadata.annotations.as_ref().and_then(|a| a.get(PROVISIONED_BY));
    provisioner.is_some_and(|p| p == LOCAL_PATH_PROVISIONER)
        && volume.spec.as_ref().is_some_and(|s| s.host_path.is_some())
}

/// The size to expand to (upstream's expandAndRecoverFunction), or None
/// when there is nothing for the controller to do.
fn target_size<'a>(claim: &'a PersistentVolumeClaim, volume: &PersistentVolume) -> Option<&'a Quantity> {
    let request = requested(claim)?;
    let status = resize_status(claim);
    let in_progress = matches!(
        status,
        "ControllerResizeInProgress" | "NodeResizePending" | "NodeResizeInProgress" | "NodeResizeFailed"
    );
    if amount(volume_capacity(volume)) < amount(Some(request)) {
        return Some(if in_progress { allocated(claim).unwrap_or(request) } else { request });
    }
    match status {
        // Waiting on a node: nothing for the controller.
        "NodeResizePending" | "NodeResizeInProgress" | "NodeResizeFailed" => None,
        "ControllerResizeInProgress" | "ControllerResizeFailed" => Some(allocated(claim).unwrap_or(request)),
        "" if allocated(claim).is_some() => allocated(claim),
        _ => Some(request),
    }
}

async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if !is_bound(&claim) || claim.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    let request = amount(requested(&claim));
    let capacity = amount(status_capacity(&claim));
    let interrupted = !resize_status(&claim).is_empty();
    if request <= capacity && !interrupted {
        return Ok(Action::await_change());
    }
    informers::wait_synced(&ctx.volumes).await?;
    let Some(volume) = ctx.volumes.get(&ObjectRef::new(&volume_name)) else {
        return Err(ControllerError::Invalid(format!("failed to get PV {volume_name:?}: not found")));
    };
    let claim_ref = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let bound_here = claim_ref
        .is_some_and(|r| r.namespace == claim.metadata.namespace && r.uid.is_some() && r.uid == claim.metadata.uid);
    if !bound_here {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        return Err(ControllerError::Invalid(format!("persistent Volume is not bound to PVC being updated : {key}")));
    }
    if !expandable_here(&volume) {
        if request > capacity {
            ctx.recorder.publish(
                &*claim,
                EventType::Normal,
                "ExternalExpanding",
                "waiting for an external controller to expand this PVC",
            );
        }
        return Ok(Action::await_change());
    }
    let Some(size) = target_size(&claim, &volume).cloned() else { return Ok(Action::await_change()) };
    match expand(&claim, &volume, &size, &ctx).await {
        Ok(()) => Ok(Action::await_change()),
        // The cached claim was behind: the newer one comes with its change.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Action::requeue(std::time::Duration::from_millis(500))),
        Err(e) => {
            ctx.recorder.publish(&*claim, EventType::Warning, "VolumeResizeFailed", &e.to_string());
            Err(e.into())
        }
    }
}

/// The claim's conditions with the resize ones replaced by `resize`
/// (upstream's MergeResizeConditionOnPVC without keeping old ones): a
/// condition whose status stays keeps its transition time.
fn merged_conditions(
    claim: &PersistentVolumeClaim,
    resize: Vec<PersistentVolumeClaimCondition>,
) -> Vec<PersistentVolumeClaimCondition> {
    let mut out = Vec::new();
    let mut pending = resize;
    for c in claim.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten() {
        if !RESIZE_CONDITIONS.contains(&c.type_.as_str()) {
            out.push(c.clone());
        } else if let Some(i) = pending.iter().position(|n| n.type_ == c.type_) {
            let new = pending.remove(i);
            out.push(if new.status == c.status { c.clone() } else { new });
        }
    }
    out.extend(pending);
    out
}

async fn expand(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    size: &Quantity,
    ctx: &Context,
) -> Result<(), kube::Error> {
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let params = PatchParams::default();
    // Controller resize in progress (upstream's MarkControllerReisizeInProgress).
    let resizing = PersistentVolumeClaimCondition {
        type_: "Resizing".into(),
        status: "True".into(),
        last_transition_time: Some(Time(Timestamp::now())),
        ..Default::default()
    };
    let patch = json!({
        "metadata": {"resourceVersion": claim.metadata.resource_version},
        "status": {
            "conditions": merged_conditions(claim, vec![resizing]),
            "allocatedResources": {"storage": size},
            "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
        }
    });
    let claim = claims.patch_status(&name, &params, &Patch::Merge(&patch)).await?;
    // The directory has no size to change: the volume records the new one.
    let volume_name = volume.metadata.name.clone().unwrap_or_default();
    let mut pv_patch = json!({"spec": {"capacity": {"storage": size}}});
    if volume.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PRE_RESIZE_CAPACITY)) {
        pv_patch["metadata"] = json!({"annotations": {PRE_RESIZE_CAPACITY: null}});
    }
    Api::<PersistentVolume>::all(ctx.client.clone()).patch(&volume_name, &params, &Patch::Merge(&pv_patch)).await?;
    // No file system to grow on the node: the resize is finished
    // (upstream's MarkResizeFinished).
    let others_pending = claim
        .status
        .as_ref()
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .is_some_and(|s| s.keys().any(|k| k != "storage"));
    let statuses = if others_pending { json!({"storage": null}) } else { serde_json::Value::Null };
    let patch = json!({
        "metadata": {"resourceVersion": claim.metadata.resource_version},
        "status": {
            "capacity": {"storage": size},
            "conditions": Some(merged_conditions(&claim, Vec::new())).filter(|c| !c.is_empty()),
            "allocatedResourceStatuses": statuses,
        }
    });
    claims.patch_status(&name, &params, &Patch::Merge(&patch)).await?;
    let message = format!("ExpandVolume succeeded for volume {ns}/{name}");
    ctx.recorder.publish(&claim, EventType::Normal, "VolumeResizeSuccessful", &message);
    tracing::info!(claim = %format!("{ns}/{name}"), volume = %volume_name, size = %size.0, "volume expanded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(request: &str, capacity: &str, status: Option<&str>, allocated: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity},
                       "allocatedResourceStatuses": status.map(|s| json!({"storage": s})),
                       "allocatedResources": allocated.map(|a| json!({"storage": a})),
                       "conditions": [{"type": "Resizing", "status": "True"}, {"type": "Other", "status": "True"}]},
        }))
        .unwrap()
    }

    fn volume(capacity: &str, provisioned_by: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "annotations": {PROVISIONED_BY: provisioned_by}},
            "spec": {"capacity": {"storage": capacity}, "hostPath": {"path": "/x"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_size_to_expand_to() {
        let pv = volume("1Gi", LOCAL_PATH_PROVISIONER);
        assert_eq!(target_size(&claim("2Gi", "1Gi", None, None), &pv).map(|q| q.0.as_str()), Some("2Gi"));
        // An interrupted controller resize resumes at what it recorded.
        let c = claim("3Gi", "1Gi", Some("ControllerResizeInProgress"), Some("2Gi"));
        assert_eq!(target_size(&c, &pv).map(|q| q.0.as_str()), Some("2Gi"));
        // Waiting on a node: nothing here.
        let c = claim("1Gi", "1Gi", Some("NodeResizePending"), Some("1Gi"));
        assert_eq!(target_size(&c, &volume("2Gi", LOCAL_PATH_PROVISIONER)), None);
        assert!(expandable_here(&pv) && !expandable_here(&volume("1Gi", "example.com/other")));
    }

    #[test]
    fn resize_conditions_are_replaced_and_others_kept() {
        let c = claim("2Gi", "1Gi", None, None);
        let kept: Vec<String> = merged_conditions(&c, Vec::new()).into_iter().map(|c| c.type_).collect();
        assert_eq!(kept, ["Other"]);
        let resizing =
            PersistentVolumeClaimCondition { type_: "Resizing".into(), status: "True".into(), ..Default::default() };
        let merged = merged_conditions(&c, vec![resizing]);
        assert_eq!(merged.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Resizing", "Other"]);
    }
}
