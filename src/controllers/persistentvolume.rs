//! PersistentVolumeController, binding part (upstream's
//! pkg/controller/volume/persistentvolume): a pending claim is bound to the
//! smallest available volume that fits it (storage class, volume mode,
//! access modes, capacity, selector; a volume pre-bound by `claimRef` or a
//! claim naming `volumeName` first); a volume's phase follows its claim
//! (Available, Bound, Released) and a released volume whose reclaim policy
//! is Delete is deleted. Claims of a `WaitForFirstConsumer` class wait for
//! a scheduled pod and take a volume whose node affinity admits its node.

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::informers::{self, Informer};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::pod_volumes::{claim_names, uses_claim};
use crate::client::predicates::node_heartbeat_only;
use crate::client::{labels, scheduling};
use crate::quantity;
use crate::well_known::annotations::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};

const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

struct Context {
    client: kube::Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, factory: SharedInformerFactory, pods: Informer<Pod>) {
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let claims_for_claims = claims.subscribe();
    let claims_for_volumes = claims.subscribe();
    let volumes_for_claims = volumes.subscribe();
    let volumes_for_volumes = volumes.subscribe();
    let classes = factory.informer::<StorageClass>().subscribe();
    let nodes = factory.informer::<Node>().subscribe().skip_updates(node_heartbeat_only);
    let (claim_store, claim_requests) = claims_for_claims.trigger_self();
    // Any volume or class that changes may let a pending claim bind.
    let pending = {
        let store = claim_store.clone();
        move || {
            store
                .state()
                .iter()
                .filter(|c| claim_volume(c).is_none())
                .map(|c| ObjectRef::from_obj(&**c))
                .collect::<Vec<_>>()
        }
    };
    let (volume_store, volume_requests) = volumes_for_claims.trigger_with({
        let pending = pending.clone();
        move |_: &PersistentVolume| pending()
    });
    let (class_store, class_requests) = classes.trigger_with(move |_: &StorageClass| pending());
    // A scheduled pod lets its WaitForFirstConsumer claims (generic
    // ephemeral ones included) bind.
    let (pod_store, pod_requests) = pods.trigger_with(|p: &Pod| {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        claim_names(p).iter().map(|c| ObjectRef::<PersistentVolumeClaim>::new(c).within(&ns)).collect::<Vec<_>>()
    });
    let (node_store, node_events) = nodes.into_parts();
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "persistentvolume-controller"),
        client: client.clone(),
        claims: claim_store.clone(),
        volumes: volume_store,
        classes: class_store,
        pods: pod_store,
        nodes: node_store,
    });
    // Volumes' phases: each volume, and the volume a claim change concerns.
    let (own_volumes, own_volume_requests) = volumes_for_volumes.trigger_self();
    let (_, volumes_of_claims) = claims_for_volumes.trigger_with(|c: &PersistentVolumeClaim| {
        claim_volume(c).map(ObjectRef::<PersistentVolume>::new).into_iter().collect::<Vec<_>>()
    });
    let node_cache = tokio::spawn(futures_util::StreamExt::for_each(node_events, |_| std::future::ready(())));
    let binder = informers::run(
        // Upstream's queue names: the binder's claim and volume queues.
        "claims",
        claim_store,
        vec![claim_requests, volume_requests, class_requests, pod_requests],
        bind_claim,
        ctx.clone(),
    );
    let phases = informers::run("volumes", own_volumes, vec![own_volume_requests, volumes_of_claims], sync_volume, ctx);
    tokio::join!(binder, phases);
    node_cache.abort();
}

fn claim_volume(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty())
}

fn claim_class(c: &PersistentVolumeClaim) -> &str {
    c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default()
}

fn volume_class(v: &PersistentVolume) -> &str {
    v.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default()
}

fn bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.and_then(quantity::value).unwrap_or(0)
}

/// Whether `volume` can serve `claim` (ignoring binding), as upstream's findMatchingVolume.
fn fits(claim: &PersistentVolumeClaim, volume: &PersistentVolume) -> bool {
    let (Some(cs), Some(vs)) = (claim.spec.as_ref(), volume.spec.as_ref()) else { return false };
    if claim_class(claim) != volume_class(volume) {
        return false;
    }
    let mode = |m: Option<&String>| m.map(String::as_str).unwrap_or("Filesystem").to_string();
    if mode(cs.volume_mode.as_ref()) != mode(vs.volume_mode.as_ref()) {
        return false;
    }
    let have = vs.access_modes.clone().unwrap_or_default();
    if !cs.access_modes.iter().flatten().all(|m| have.contains(m)) {
        return false;
    }
    let want = bytes(cs.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")));
    let size = bytes(vs.capacity.as_ref().and_then(|c| c.get("storage")));
    if size < want {
        return false;
    }
    match &cs.selector {
        Some(sel) => labels::matches(sel, volume.metadata.labels.as_ref()),
        None => true,
    }
}

/// Whether the volume's node affinity admits `node`.
fn admits(volume: &PersistentVolume, node: Option<&Node>) -> bool {
    let Some(required) = volume.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    node.is_some_and(|n| {
        let name = n.metadata.name.as_deref().unwrap_or_default();
        required.node_selector_terms.iter().any(|t| scheduling::term_matches(t, n.metadata.labels.as_ref(), name))
    })
}

/// The claim a volume's claimRef names, if it is this one.
fn claimed_by(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return false };
    r.name.as_deref() == claim.metadata.name.as_deref()
        && r.namespace.as_deref() == claim.metadata.namespace.as_deref()
        && r.uid.as_deref().is_none_or(|u| Some(u) == claim.metadata.uid.as_deref())
}

/// The volume to bind `claim` to: pre-bound first, then the smallest that fits.
fn choose<'a>(
    claim: &PersistentVolumeClaim,
    volumes: &'a [Arc<PersistentVolume>],
    node: Option<&Node>,
) -> Option<&'a Arc<PersistentVolume>> {
    if let Some(v) = volumes.iter().find(|v| claimed_by(v, claim) && fits(claim, v)) {
        return Some(v);
    }
    volumes
        .iter()
        .filter(|v| v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none())
        .filter(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released"))
        .filter(|v| fits(claim, v) && admits(v, node))
        .min_by_key(|v| bytes(v.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"))))
}

/// The node of a scheduled pod using the claim (for WaitForFirstConsumer).
pub(super) fn consumer_node(pods: &Store<Pod>, claim: &PersistentVolumeClaim) -> Option<String> {
    if let Some(n) = claim.metadata.annotations.as_ref().and_then(|a| a.get(SELECTED_NODE)) {
        return Some(n.clone());
    }
    let (ns, name) = (claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref()?);
    pods.state().iter().find_map(|p| {
        let uses = p.metadata.namespace.as_deref() == ns && uses_claim(p, name);
        if uses {
            p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty())
        } else {
            None
        }
    })
}

async fn bind_claim(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let volumes = ctx.volumes.state();
    let chosen = match claim_volume(&claim) {
        // Asked for a volume by name: bind it when it is free or ours.
        Some(wanted) => match volumes.iter().find(|v| v.metadata.name.as_deref() == Some(wanted)) {
            Some(v) if claimed_by(v, &claim) || v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() => {
                v.clone()
            }
            Some(_) => return Ok(Action::await_change()),
            None => {
                let msg = format!("volume {wanted:?} not found");
                ctx.recorder.publish(&*claim, EventType::Warning, "ProvisioningFailed", &msg);
                return Ok(Action::await_change());
            }
        },
        None => {
            let class =
                ctx.classes.state().into_iter().find(|c| c.metadata.name.as_deref() == Some(claim_class(&claim)));
            let wait = class.as_ref().and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
            let node_name = if wait {
                match consumer_node(&ctx.pods, &claim) {
                    Some(n) => Some(n),
                    None => {
                        ctx.recorder.publish(
                            &*claim,
                            EventType::Normal,
                            "WaitForFirstConsumer",
                            "waiting for first consumer to be created before binding",
                        );
                        return Ok(Action::await_change());
                    }
                }
            } else {
                None
            };
            let node =
                node_name.and_then(|n| ctx.nodes.state().into_iter().find(|x| x.metadata.name.as_deref() == Some(&n)));
            match choose(&claim, &volumes, node.as_deref()) {
                Some(v) => v.clone(),
                None => {
                    // Upstream's words for each case.
                    let msg = match (claim_class(&claim), &class) {
                        ("", _) => {
                            "no persistent volumes available for this claim and no storage class is set".to_string()
                        }
                        (c, None) => format!("storageclass.storage.k8s.io {c:?} not found"),
                        (_, Some(_)) => "no persistent volumes available for this claim".to_string(),
                    };
                    ctx.recorder.publish(&*claim, EventType::Normal, "FailedBinding", &msg);
                    return Ok(Action::await_change());
                }
            }
        }
    };
    let volume_name = chosen.metadata.name.clone().unwrap_or_default();
    // The volume first: it is what keeps two claims from taking it.
    if !claimed_by(&chosen, &claim) || chosen.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        let claim_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
            ..Default::default()
        };
        let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
        let patch = json!({
            "metadata": {"resourceVersion": chosen.metadata.resource_version, "annotations": {BOUND_BY_CONTROLLER: "yes"}},
            "spec": {"claimRef": claim_ref}
        });
        match pvs.patch(&volume_name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            // Someone else changed it first: look again.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return Ok(Action::requeue(std::time::Duration::from_millis(200)))
            }
            Err(e) => return Err(e.into()),
        }
        pvs.patch_status(&volume_name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": "Bound"}})))
            .await?;
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let vs = chosen.spec.clone().unwrap_or_default();
    let completed = claim.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(BIND_COMPLETED));
    if !completed || claim_volume(&claim) != Some(volume_name.as_str()) {
        let patch = json!({
            "metadata": {"annotations": {BIND_COMPLETED: "yes", BOUND_BY_CONTROLLER: "yes"}},
            "spec": {"volumeName": volume_name}
        });
        pvcs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    // The capacity is the volume's as the claim becomes Bound only, as
    // upstream's updateClaimStatus: later it is what a resize recorded.
    let status = claim.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) != Some("Bound") {
        let status = json!({"status": {"phase": "Bound", "capacity": vs.capacity, "accessModes": vs.access_modes}});
        pvcs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
        tracing::debug!(claim = %format!("{ns}/{name}"), volume = %volume_name, "claim bound");
    } else if status.and_then(|s| s.access_modes.as_ref()) != vs.access_modes.as_ref() {
        let status = json!({"status": {"accessModes": vs.access_modes}});
        pvcs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    }
    Ok(Action::await_change())
}

/// A volume's phase from its claim: Available, Bound or Released (and
/// deleted when released with the Delete policy), also while it is being
/// deleted.
async fn sync_volume(volume: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    // A volume being deleted still follows its claim (its protection
    // finalizer goes once it is no longer Bound), but is not reclaimed again.
    let deleting = volume.metadata.deletion_timestamp.is_some();
    let name = volume.metadata.name.clone().unwrap_or_default();
    let spec = volume.spec.clone().unwrap_or_default();
    let phase = volume.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let wanted = match &spec.claim_ref {
        None => "Available",
        Some(r) => {
            let claim = ctx
                .claims
                .state()
                .into_iter()
                .find(|c| c.metadata.name == r.name && c.metadata.namespace == r.namespace);
            match claim {
                Some(c) if r.uid.is_none() || c.metadata.uid == r.uid => {
                    if claim_volume(&c) == Some(name.as_str()) {
                        "Bound"
                    } else {
                        // Pre-bound or mid-binding: the binder finishes it.
                        return Ok(Action::await_change());
                    }
                }
                _ => "Released",
            }
        }
    };
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    // A local-path volume is deleted by its node, after its directory.
    let provisioned_by = volume.metadata.annotations.as_ref().and_then(|a| a.get(PROVISIONED_BY));
    let external = provisioned_by.is_some_and(|p| p == LOCAL_PATH_PROVISIONER);
    if wanted == "Released"
        && spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete")
        && !external
        && !deleting
    {
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: volume.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => tracing::debug!(volume = %name, "released volume deleted (reclaim policy Delete)"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    if phase != wanted {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": wanted}}))).await?;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, size: &str, class: &str, modes: &[&str]) -> Arc<PersistentVolume> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"tier": "fast"}},
                "spec": {"capacity": {"storage": size}, "storageClassName": class, "accessModes": modes,
                         "hostPath": {"path": "/tmp/x"}}
            }))
            .unwrap(),
        )
    }

    fn pvc(size: &str, class: &str, modes: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "d", "uid": "u1"},
            "spec": {"storageClassName": class, "accessModes": modes, "resources": {"requests": {"storage": size}}}
        }))
        .unwrap()
    }

    #[test]
    fn the_smallest_fitting_volume_wins() {
        let vols = vec![
            pv("big", "10Gi", "", &["ReadWriteOnce"]),
            pv("small", "1Gi", "", &["ReadWriteOnce"]),
            pv("tiny", "100Mi", "", &["ReadWriteOnce"]),
        ];
        let claim = pvc("500Mi", "", &["ReadWriteOnce"]);
        assert_eq!(choose(&claim, &vols, None).and_then(|v| v.metadata.name.clone()).as_deref(), Some("small"));
        let claim = pvc("500Mi", "", &["ReadWriteMany"]);
        assert!(choose(&claim, &vols, None).is_none());
        let claim = pvc("500Mi", "gold", &["ReadWriteOnce"]);
        assert!(choose(&claim, &vols, None).is_none());
    }

    #[test]
    fn pre_bound_volumes_go_to_their_claim() {
        let mut v: PersistentVolume = (*pv("mine", "10Gi", "", &["ReadWriteOnce"])).clone();
        v.spec.as_mut().unwrap().claim_ref =
            Some(ObjectReference { name: Some("c".into()), namespace: Some("d".into()), ..Default::default() });
        let vols = vec![pv("free", "1Gi", "", &["ReadWriteOnce"]), Arc::new(v)];
        let claim = pvc("500Mi", "", &["ReadWriteOnce"]);
        assert_eq!(choose(&claim, &vols, None).and_then(|v| v.metadata.name.clone()).as_deref(), Some("mine"));
        let other: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "other", "namespace": "d"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}
        }))
        .unwrap();
        assert_eq!(choose(&other, &vols, None).and_then(|v| v.metadata.name.clone()).as_deref(), Some("free"));
    }
}
