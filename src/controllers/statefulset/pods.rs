//! The identity of a StatefulSet's pods, as upstream's stateful_set_utils
//! gives it: the name `<set>-<ordinal>`, the pod-name, pod-index and
//! controller-revision-hash labels, the hostname and subdomain, and one
//! PersistentVolumeClaim `<claim>-<set>-<ordinal>` per claim template.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::controllers::controller_utils::{
    controller_ref, ignore_not_found, is_pod_ready, pod_from_template, pod_phase,
};
use crate::controllers::ControllerError;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The ordinal in `<set>-<ordinal>`, if `pod` is named so.
pub fn ordinal_of(set_name: &str, pod_name: &str) -> Option<i32> {
    let rest = pod_name.strip_prefix(set_name)?.strip_prefix('-')?;
    if rest.is_empty() || (rest.len() > 1 && rest.starts_with('0')) {
        return None;
    }
    rest.parse().ok().filter(|n: &i32| *n >= 0)
}

pub fn pod_name(set: &StatefulSet, ordinal: i32) -> String {
    format!("{}-{ordinal}", set.metadata.name.as_deref().unwrap_or_default())
}

pub fn claim_name(claim: &str, set: &StatefulSet, ordinal: i32) -> String {
    format!("{claim}-{}", pod_name(set, ordinal))
}

/// The revision name a pod was made from.
pub fn revision_of(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.as_ref()?.get(REVISION_LABEL).map(String::as_str)
}

/// Created, Running and Ready, and not being deleted.
pub fn is_running_and_ready(pod: &Pod) -> bool {
    pod_phase(pod) == "Running" && is_pod_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

pub fn is_failed(pod: &Pod) -> bool {
    pod_phase(pod) == "Failed"
}

pub fn is_succeeded(pod: &Pod) -> bool {
    pod_phase(pod) == "Succeeded"
}

pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The pod for `ordinal` from `template` (of revision `revision`).
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let mut pod = pod_from_template(template, &ns, controller_ref(set));
    let name = pod_name(set, ordinal);
    pod.metadata.name = Some(name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), revision.to_string());
    let spec = set.spec.as_ref();
    if let Some(pod_spec) = pod.spec.as_mut() {
        pod_spec.hostname = Some(name.clone());
        if let Some(service) = spec.and_then(|s| s.service_name.clone()).filter(|s| !s.is_empty()) {
            pod_spec.subdomain = Some(service);
        }
        for claim in spec.and_then(|s| s.volume_claim_templates.as_ref()).into_iter().flatten() {
            let claim_template = claim.metadata.name.clone().unwrap_or_default();
            let volume = Volume {
                name: claim_template.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim_name(&claim_template, set, ordinal),
                    read_only: None,
                }),
                ..Default::default()
            };
            let volumes = pod_spec.volumes.get_or_insert_with(Vec::new);
            volumes.retain(|v| v.name != claim_template);
            volumes.push(volume);
        }
    }
    pod
}

/// Creates the claims of `ordinal` that do not exist yet; returns the
/// names it created.
pub async fn create_claims(
    client: &kube::Client,
    set: &StatefulSet,
    ordinal: i32,
) -> Result<Vec<String>, ControllerError> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let spec = set.spec.as_ref();
    let delete_with_set =
        spec.and_then(|s| s.persistent_volume_claim_retention_policy.as_ref()).and_then(|p| p.when_deleted.as_deref())
            == Some("Delete");
    let selector_labels = spec.and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    let mut created = Vec::new();
    for template in spec.and_then(|s| s.volume_claim_templates.as_ref()).into_iter().flatten() {
        let name = claim_name(template.metadata.name.as_deref().unwrap_or_default(), set, ordinal);
        if api.get_opt(&name).await?.is_some() {
            continue;
        }
        let mut claim = template.clone();
        claim.status = None;
        claim.metadata.name = Some(name.clone());
        claim.metadata.namespace = Some(ns.clone());
        claim.metadata.resource_version = None;
        let mut labels = selector_labels.clone();
        labels.extend(claim.metadata.labels.take().unwrap_or_default());
        claim.metadata.labels = Some(labels);
        if delete_with_set {
            let mut owner = controller_ref(set);
            owner.controller = None;
            claim.metadata.owner_references = Some(vec![owner]);
        }
        match api.create(&PostParams::default(), &claim).await {
            Ok(_) => created.push(name),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// With `whenScaled: Delete`, a condemned pod's claims become its
/// dependents, so the garbage collector removes them with it.
pub async fn release_claims_on_scale_down(
    client: &kube::Client,
    set: &StatefulSet,
    pod: &Pod,
    ordinal: i32,
) -> Result<(), ControllerError> {
    let spec = set.spec.as_ref();
    let when_scaled =
        spec.and_then(|s| s.persistent_volume_claim_retention_policy.as_ref()).and_then(|p| p.when_scaled.as_deref());
    if when_scaled != Some("Delete") {
        return Ok(());
    }
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let owner = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod.metadata.name,
        "uid": pod.metadata.uid,
    });
    for template in spec.and_then(|s| s.volume_claim_templates.as_ref()).into_iter().flatten() {
        let name = claim_name(template.metadata.name.as_deref().unwrap_or_default(), set, ordinal);
        let Some(claim) = api.get_opt(&name).await? else { continue };
        let mut refs: Vec<serde_json::Value> =
            claim.metadata.owner_references.iter().flatten().filter_map(|r| serde_json::to_value(r).ok()).collect();
        if refs.iter().any(|r| r.get("uid") == owner.get("uid")) {
            continue;
        }
        refs.push(owner.clone());
        let patch = json!({"metadata": {"ownerReferences": refs}});
        ignore_not_found(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_parse_from_names() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-01"), None);
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webb-1"), None);
        assert_eq!(ordinal_of("web", "web-"), None);
    }
}
