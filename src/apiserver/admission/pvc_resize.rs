//! PersistentVolumeClaimResize, upstream's validating admission plugin: a
//! claim's storage request may grow only when the claim is bound and its
//! StorageClass (the same before and after) has `allowVolumeExpansion:
//! true`. A smaller request is the validation's to judge (it may not fall
//! to `status.capacity` or below: `kinds::storage`).

use serde_json::Value;

use super::Operation;
use crate::apiserver::call::Call;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::quantity::Amount;

/// The beta annotation that named a claim's class before `storageClassName`.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

fn storage_request(claim: &Value) -> Amount {
    let q = claim.pointer("/spec/resources/requests/storage");
    q.and_then(Value::as_str).and_then(|s| Amount::parse(s).ok()).unwrap_or_default()
}

/// The claim's class, as upstream's GetPersistentVolumeClaimClass reads it
/// (the beta annotation first).
fn class_of(claim: &Value) -> &str {
    let annotation = claim.pointer("/metadata/annotations").and_then(|a| a.get(BETA_STORAGE_CLASS));
    annotation.or_else(|| claim.pointer("/spec/storageClassName")).and_then(Value::as_str).unwrap_or_default()
}

pub async fn admit(call: &Call, claim: &Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    let r = &call.resource;
    if op != Operation::Update || r.group != "" || r.plural != "persistentvolumeclaims" {
        return Ok(());
    }
    let Some(old) = old.filter(|_| call.path.subresource.is_none()) else { return Ok(()) };
    if storage_request(claim) <= storage_request(old) {
        return Ok(());
    }
    let name = crate::apiserver::meta::name_of(claim);
    let forbidden = |why: &str| Err(ApiError::forbidden_object("", "persistentvolumeclaims", name, why));
    if old.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return forbidden("Only bound persistent volume claims can be expanded");
    }
    let (class, old_class) = (class_of(claim), class_of(old));
    let allowed = !class.is_empty()
        && class == old_class
        && call.api.caches.storage_classes.all().iter().any(|c| {
            c.pointer("/metadata/name").and_then(Value::as_str) == Some(class)
                && c.get("allowVolumeExpansion").and_then(Value::as_bool) == Some(true)
        });
    if !allowed {
        return forbidden(
            "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_class_is_the_beta_annotation_first() {
        let claim =
            json!({"metadata": {"annotations": {BETA_STORAGE_CLASS: "old"}}, "spec": {"storageClassName": "new"}});
        assert_eq!(class_of(&claim), "old");
        assert_eq!(class_of(&json!({"spec": {"storageClassName": "new"}})), "new");
        let (small, big) = (
            json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
            json!({"spec": {"resources": {"requests": {"storage": "1025Mi"}}}}),
        );
        assert!(storage_request(&small) < storage_request(&big));
    }
}
