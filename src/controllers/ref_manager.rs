//! Adoption of orphans, as upstream's ControllerRefManager does it: a pod
//! that matches a workload's selector and has no controller becomes the
//! workload's (a pod orphaned by `--cascade=orphan` returns to a recreated
//! owner). Nothing is adopted by an owner that is being deleted.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::controller_utils::controller_of;
use super::ControllerError;
use crate::client::indexer::Index;
use crate::client::labels;

/// Pods in `namespace` matching `selector` that have no controller.
/// (through the index of orphans by namespace: no scan of other pods).
pub fn orphans(orphans_by_namespace: &Index<Pod>, namespace: &str, selector: &LabelSelector) -> Vec<Arc<Pod>> {
    if labels::is_empty(selector) {
        return Vec::new();
    }
    orphans_by_namespace
        .get(namespace)
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && controller_of(&p.metadata).is_none()
                && labels::matches(selector, p.metadata.labels.as_ref())
        })
        .collect()
}

/// Makes `owner` the controller of each pod; a pod changed meanwhile is
/// left for the next pass.
pub async fn adopt(
    client: &kube::Client,
    namespace: &str,
    pods: &[Arc<Pod>],
    owner: &OwnerReference,
) -> Result<(), ControllerError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for pod in pods {
        let mut refs = pod.metadata.owner_references.clone().unwrap_or_default();
        refs.retain(|r| r.uid != owner.uid);
        refs.push(owner.clone());
        let patch = json!({"metadata": {
            "ownerReferences": refs,
            "uid": pod.metadata.uid,
            "resourceVersion": pod.metadata.resource_version,
        }});
        let name = pod.metadata.name.clone().unwrap_or_default();
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => tracing::debug!(pod = %name, owner = %owner.name, "adopted orphan pod"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
