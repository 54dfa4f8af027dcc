//! Adoption of orphans and release of pods, as upstream's
//! ControllerRefManager does it: a pod that matches a workload's selector
//! and has no controller becomes the workload's (a pod orphaned by
//! `--cascade=orphan` returns to a recreated owner), and a pod it controls
//! whose labels stop matching is let go. Nothing is adopted by an owner
//! that is being deleted.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::controller_utils::{controller_of, controller_ref};
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

/// Upstream's ClaimPods: of `pods` (the owner's and the orphans of its
/// namespace), keeps those `owner` controls and `selector` matches, adopts
/// matching orphans (once the owner, read afresh, is still the same and not
/// being deleted) and releases the pods it controls that no longer match.
/// Returns the pods `owner` controls after that.
pub async fn claim_pods<K>(
    client: &kube::Client,
    owner: &K,
    selector: &LabelSelector,
    pods: Vec<Arc<Pod>>,
) -> Result<Vec<Arc<Pod>>, ControllerError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
{
    let meta = owner.meta();
    let uid = meta.uid.clone().unwrap_or_default();
    let owner_name = meta.name.clone().unwrap_or_default();
    let ns = meta.namespace.clone().unwrap_or_default();
    let deleting = meta.deletion_timestamp.is_some();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut can_adopt: Option<bool> = None;
    let mut owned = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let matches = !labels::is_empty(selector) && labels::matches(selector, pod.metadata.labels.as_ref());
        match controller_of(&pod.metadata) {
            Some(c) if c.uid == uid => {
                if matches {
                    owned.push(pod);
                } else if !deleting {
                    let rest: Vec<_> =
                        pod.metadata.owner_references.iter().flatten().filter(|o| o.uid != uid).collect();
                    let rest = if rest.is_empty() { serde_json::Value::Null } else { json!(rest) };
                    let patch = json!({"metadata": {"ownerReferences": rest, "uid": pod.metadata.uid}});
                    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                        Ok(_) => tracing::debug!(owner = %owner_name, pod = %name, "released pod"),
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Some(_) => {}
            None if matches && !deleting && pod.metadata.deletion_timestamp.is_none() => {
                if can_adopt.is_none() {
                    can_adopt = Some(fresh_and_alive(client, owner).await?);
                }
                if can_adopt != Some(true) {
                    continue;
                }
                let mut refs = pod.metadata.owner_references.clone().unwrap_or_default();
                refs.push(controller_ref(owner));
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": pod.metadata.uid}});
                match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(adopted) => {
                        tracing::debug!(owner = %owner_name, pod = %name, "adopted orphan pod");
                        owned.push(Arc::new(adopted))
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            None => {}
        }
    }
    Ok(owned)
}

/// Whether the owner, read afresh, is still this one and not being
/// deleted (upstream's RecheckDeletionTimestamp before an adoption).
async fn fresh_and_alive<K>(client: &kube::Client, owner: &K) -> Result<bool, ControllerError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
{
    let meta = owner.meta();
    let api: Api<K> = Api::namespaced(client.clone(), meta.namespace.as_deref().unwrap_or_default());
    let fresh = api.get_opt(meta.name.as_deref().unwrap_or_default()).await?;
    Ok(fresh.is_some_and(|f| f.meta().uid == meta.uid && f.meta().deletion_timestamp.is_none()))
}
