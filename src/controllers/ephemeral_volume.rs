//! EphemeralVolumeController (ephemeral-volume), as upstream's
//! pkg/controller/volume/ephemeral, acting as `ephemeral-volume-controller`:
//! for each generic ephemeral volume of a pod (`ephemeral.volumeClaimTemplate`)
//! it creates the PersistentVolumeClaim `<pod>-<volume>` from the template
//! (its labels, annotations and spec), controlled by the pod, so that the
//! garbage collector deletes it with the pod. A claim of that name the pod
//! does not control is left alone and reported on the pod (a `Warning`
//! `FailedBinding` Event, upstream's words), as is a failed create. A claim
//! deleted while its pod still lives is made again.
//!
//! The claim then follows the path of any other: the binder or the
//! local-path provisioner gives it a volume on the pod's node, and the
//! node's volume manager mounts it once the claim is bound to the pod's.

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informers;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::pod_volumes::{claim_is_for_pod, ephemeral_claim_name, uses_claim, ClaimNotForPod};

/// The service account it acts as.
pub const NAME: &str = "ephemeral-volume-controller";
/// The source its Events name (upstream's).
const EVENT_SOURCE: &str = "ephemeral_volume";

struct Context {
    client: kube::Client,
    claims: Store<PersistentVolumeClaim>,
    recorder: EventRecorder,
}

/// A pod that is not being deleted and has a generic ephemeral volume.
fn wants_claims(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| v.ephemeral.is_some())
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (pods, pod_requests) = informers.informer::<Pod>().subscribe().only(wants_claims).trigger_self();
    let pods_by_namespace = informers.by_namespace::<Pod>();
    // A claim deleted under a live pod is made again.
    let (claims, claim_changes) = informers.informer::<PersistentVolumeClaim>().subscribe().into_changes();
    let deleted_claims = {
        use futures_util::StreamExt;
        claim_changes
            .filter_map(move |change| {
                let requests = match change {
                    crate::client::informer::Change::Deleted(claim) => {
                        let (ns, name) = (claim.metadata.namespace.clone(), claim.metadata.name.clone());
                        pods_by_namespace
                            .get(ns.as_deref().unwrap_or_default())
                            .into_iter()
                            .filter(|p| wants_claims(p) && name.as_deref().is_some_and(|n| uses_claim(p, n)))
                            .map(|p| Ok::<_, watcher::Error>(ReconcileRequest::from(ObjectRef::from_obj(&*p))))
                            .collect::<Vec<_>>()
                    }
                    _ => Vec::new(),
                };
                std::future::ready((!requests.is_empty()).then(|| futures_util::stream::iter(requests)))
            })
            .flatten()
            .boxed()
    };
    let ctx = Arc::new(Context { recorder: EventRecorder::new(client.clone(), EVENT_SOURCE), client, claims });
    informers::run("ephemeral_volume", pods, vec![pod_requests, deleted_claims], reconcile, ctx).await;
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if !wants_claims(&pod) {
        return Ok(Action::await_change());
    }
    informers::wait_synced(&ctx.claims).await?;
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).filter(|v| v.ephemeral.is_some());
    for volume in volumes {
        if let Err(problem) = handle_volume(&pod, volume, &ctx).await {
            let message = format!("ephemeral volume {}: {problem}", volume.name);
            ctx.recorder.publish(&*pod, EventType::Warning, "FailedBinding", &message);
            return Err(ControllerError::Invalid(format!(
                "pod {}/{}, {message}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            )));
        }
    }
    Ok(Action::await_change())
}

/// Why an ephemeral volume has no claim of its pod.
#[derive(Debug, thiserror::Error)]
enum ClaimError {
    #[error(transparent)]
    NotForPod(#[from] ClaimNotForPod),
    #[error("create PVC {name}: {}", api_message(.source))]
    Create { name: String, source: kube::Error },
}

/// Makes the claim of one ephemeral volume, unless it exists (and is the pod's).
async fn handle_volume(
    pod: &Pod,
    volume: &k8s_openapi::api::core::v1::Volume,
    ctx: &Context,
) -> Result<(), ClaimError> {
    let Some(template) = volume.ephemeral.as_ref().and_then(|e| e.volume_claim_template.as_ref()) else {
        return Ok(());
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let name = ephemeral_claim_name(&pod_name, volume);
    if let Some(existing) = ctx.claims.get(&ObjectRef::new(&name).within(&ns)) {
        return Ok(claim_is_for_pod(pod, &existing)?);
    }
    let meta = template.metadata.clone().unwrap_or_default();
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: meta.labels,
            annotations: meta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod_name,
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(template.spec.clone()),
        status: None,
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    match api.create(&PostParams::default(), &claim).await {
        Ok(_) => {
            tracing::debug!(namespace = %ns, claim = %name, "ephemeral volume claim created");
            Ok(())
        }
        // Made meanwhile (the cache had not seen it yet): it must be the pod's.
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await {
            Ok(Some(existing)) => Ok(claim_is_for_pod(pod, &existing)?),
            Ok(None) => Err(ClaimError::Create { name, source: kube::Error::Api(s) }),
            Err(source) => Err(ClaimError::Create { name, source }),
        },
        Err(source) => Err(ClaimError::Create { name, source }),
    }
}

/// An API error as upstream's client prints it (the Status message).
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}
