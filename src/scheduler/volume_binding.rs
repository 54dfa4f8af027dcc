//! VolumeBinding, its PreBind part only: before a pod is bound, each of its
//! claims that is still unbound and whose StorageClass binds
//! WaitForFirstConsumer is annotated `volume.kubernetes.io/selected-node`
//! with the chosen node, which tells a provisioner (the local-path one)
//! where to make the volume, as upstream's scheduler does. (Not yet: the
//! Filter part that keeps a pod off nodes its bound volumes exclude.)

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Annotates the pod's unbound WaitForFirstConsumer claims with `node`.
pub async fn pre_bind(client: &kube::Client, pod: &Pod, node: &str) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    // Generic ephemeral volumes' claims too, once their controller made them.
    for name in crate::client::pod_volumes::claim_names(pod) {
        let Some(claim) = claims.get_opt(&name).await? else { continue };
        let spec = claim.spec.unwrap_or_default();
        let annotated = claim.metadata.annotations.as_ref().and_then(|a| a.get(SELECTED_NODE)).map(String::as_str);
        if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) || annotated == Some(node) {
            continue;
        }
        let Some(class) = spec.storage_class_name.filter(|c| !c.is_empty()) else { continue };
        let Some(class) = Api::<StorageClass>::all(client.clone()).get_opt(&class).await? else { continue };
        if class.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
        claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        tracing::debug!(claim = %format!("{ns}/{name}"), node, "selected node annotated");
    }
    Ok(())
}
