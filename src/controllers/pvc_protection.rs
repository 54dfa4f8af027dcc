//! PVCProtectionController (persistentvolumeclaim-protection), as
//! upstream's pkg/controller/volume/pvcprotection, acting as
//! `pvc-protection-controller`: a claim carries the finalizer
//! `kubernetes.io/pvc-protection` (the StorageObjectInUseProtection
//! admission adds it on create; this adds it to any claim without it), and
//! a claim being deleted keeps it while a pod scheduled to a node uses it
//! (by name, or as its generic ephemeral volume's claim while that pod is
//! not shut down). The pod cache is asked first; when it knows of no user,
//! the pods of the namespace are listed from the API to be sure, as
//! upstream does. Upstream records no Events here, nor does this.

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::controller_utils::pod_phase;
use super::informers::{self, Trigger};
use super::ControllerError;
use crate::client::indexer::Index;
use crate::client::informer::Change;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::pod_volumes::{claim_is_for_pod, ephemeral_claim_name};

/// The service account it acts as.
pub const NAME: &str = "pvc-protection-controller";
/// The finalizer (the StorageObjectInUseProtection admission adds it too).
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

struct Context {
    client: kube::Client,
    pods_by_namespace: Index<Pod>,
}

fn has_finalizer(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

/// Being deleted with the finalizer still on (upstream's IsDeletionCandidate).
fn deletion_candidate(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some() && has_finalizer(claim)
}

/// Not being deleted and without the finalizer (upstream's NeedToAddFinalizer).
fn needs_finalizer(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none() && !has_finalizer(claim)
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (claims, claim_requests) = informers
        .informer::<PersistentVolumeClaim>()
        .subscribe()
        .only(|c| deletion_candidate(c) || needs_finalizer(c))
        .trigger_self();
    // A pod that goes, finishes or is not scheduled may free its claims.
    let (_, pod_changes) = informers.informer::<Pod>().subscribe().into_changes();
    let pod_requests: Trigger<PersistentVolumeClaim> = pod_changes
        .flat_map(|change| {
            let pods: Vec<Arc<Pod>> = match change {
                Change::Deleted(pod) => vec![pod],
                Change::Applied { new, old } => {
                    let mut pods = Vec::new();
                    if let Some(old) = old.filter(|o| o.metadata.uid != new.metadata.uid) {
                        pods.push(old);
                    }
                    if is_terminated(&new) || node_name(&new).is_empty() {
                        pods.push(new);
                    }
                    pods
                }
                _ => Vec::new(),
            };
            let requests: Vec<_> = pods.iter().flat_map(|p| claims_of(p)).map(Ok::<_, watcher::Error>).collect();
            futures_util::stream::iter(requests)
        })
        .boxed();
    let ctx = Arc::new(Context { client, pods_by_namespace: informers.by_namespace::<Pod>() });
    informers::run("pvcprotection", claims, vec![claim_requests, pod_requests], reconcile, ctx).await;
}

fn node_name(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default()
}

fn is_terminated(pod: &Pod) -> bool {
    matches!(pod_phase(pod), "Succeeded" | "Failed")
}

/// The requests for every claim a pod's volumes name.
fn claims_of(pod: &Pod) -> Vec<ReconcileRequest<PersistentVolumeClaim>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    crate::client::pod_volumes::claim_names(pod)
        .iter()
        .map(|c| ReconcileRequest::from(ObjectRef::new(c).within(&ns)))
        .collect()
}

/// Done with by its kubelet or force-deleted (upstream's podIsShutDown).
fn is_shut_down(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// Whether `pod` uses `claim` (upstream's podUsesPVC): only a scheduled
/// pod does, since a kubelet starts no pod whose claim is being deleted.
fn uses(pod: &Pod, claim: &PersistentVolumeClaim) -> bool {
    if node_name(pod).is_empty() || pod.metadata.namespace != claim.metadata.namespace {
        return false;
    }
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
        v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name)
            || (v.ephemeral.is_some()
                && !is_shut_down(pod)
                && ephemeral_claim_name(pod_name, v) == name
                && claim_is_for_pod(pod, claim).is_ok())
    })
}

async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let mut updated = (*claim).clone();
    updated.metadata.managed_fields = None;
    if deletion_candidate(&claim) {
        if in_use(&claim, &ctx).await? {
            tracing::debug!(claim = %format!("{ns}/{name}"), "keeping a claim a pod uses");
            return Ok(Action::await_change());
        }
        updated.metadata.finalizers =
            Some(claim.metadata.finalizers.iter().flatten().filter(|f| *f != FINALIZER).cloned().collect());
    } else if needs_finalizer(&claim) {
        updated.metadata.finalizers.get_or_insert_with(Vec::new).push(FINALIZER.to_string());
    } else {
        return Ok(Action::await_change());
    }
    match api.replace(&name, &PostParams::default(), &updated).await {
        Ok(_) => Ok(Action::await_change()),
        // Changed or gone meanwhile: the change brings it back.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

/// A pod uses the claim: one in the cache, or else one the API lists.
async fn in_use(claim: &PersistentVolumeClaim, ctx: &Context) -> Result<bool, ControllerError> {
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    if ctx.pods_by_namespace.get(&ns).iter().any(|p| uses(p, claim)) {
        return Ok(true);
    }
    let live = Api::<Pod>::namespaced(ctx.client.clone(), &ns).list(&ListParams::default()).await?;
    Ok(live.items.iter().any(|p| uses(p, claim)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: Option<&str>, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"nodeName": node, "containers": [], "volumes": volumes},
        }))
        .unwrap()
    }

    fn claim(name: &str, owner: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "finalizers": [FINALIZER],
                "ownerReferences": owner.map(|uid| json!([{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid, "controller": true}]))},
        }))
        .unwrap()
    }

    #[test]
    fn only_scheduled_pods_use_their_claims() {
        let by_name = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]);
        assert!(uses(&pod(Some("n1"), by_name.clone()), &claim("data", None)));
        assert!(!uses(&pod(None, by_name), &claim("data", None)));
        let ephemeral = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]);
        assert!(uses(&pod(Some("n1"), ephemeral.clone()), &claim("web-scratch", Some("u1"))));
        // A claim of that name the pod does not own is not its.
        assert!(!uses(&pod(Some("n1"), ephemeral.clone()), &claim("web-scratch", Some("other"))));
        // A force-deleted pod is done with its ephemeral claim.
        let mut gone = pod(Some("n1"), ephemeral);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        gone.metadata.deletion_grace_period_seconds = Some(0);
        assert!(!uses(&gone, &claim("web-scratch", Some("u1"))));
    }
}
