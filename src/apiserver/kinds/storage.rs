//! PersistentVolumes, PersistentVolumeClaims and the storage.k8s.io kinds
//! (StorageClasses, CSIDrivers, CSINodes, CSIStorageCapacities,
//! VolumeAttachments): their `kubectl get` columns, and what an update may
//! do to a claim's storage request.

use serde_json::{json, Value};

use super::{len, str_list};
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// The annotation that, when present, names a volume's or claim's class.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// Access modes as kubectl abbreviates them, in upstream's fixed order.
fn access_modes(o: &Value, path: &[&str]) -> String {
    let modes = str_list(o, path);
    [("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP")]
        .iter()
        .filter(|(mode, _)| modes.contains(mode))
        .map(|(_, short)| *short)
        .collect::<Vec<_>>()
        .join(",")
}

/// The class of a volume or claim: the beta annotation first, then the spec.
fn storage_class(o: &Value) -> &str {
    at(o, &["metadata", "annotations", BETA_STORAGE_CLASS])
        .and_then(Value::as_str)
        .or_else(|| str_at(o, &["spec", "storageClassName"]))
        .unwrap_or_default()
}

/// The phase, or `Terminating` once deletion has begun.
fn phase(o: &Value) -> &str {
    if at(o, &["metadata", "deletionTimestamp"]).is_some() {
        "Terminating"
    } else {
        str_at(o, &["status", "phase"]).unwrap_or_default()
    }
}

fn unset(v: Option<&str>) -> Value {
    json!(v.unwrap_or("<unset>"))
}

/// A bool at `path`, or `default` when unset.
fn flag(o: &Value, path: &[&str], default: bool) -> Value {
    json!(at(o, path).and_then(Value::as_bool).unwrap_or(default))
}

pub fn persistentvolume_hooks() -> Hooks {
    Hooks {
        initial_status: |_| Some(json!({"phase": "Pending"})),
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                crate::apiserver::kinds::default_field(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
                crate::apiserver::kinds::default_field(spec, "volumeMode", json!("Filesystem"));
            }
        },
        columns: || {
            vec![
                Column::new("Capacity", "string", 0),
                Column::new("Access Modes", "string", 0),
                Column::new("Reclaim Policy", "string", 0),
                Column::new("Status", "string", 0),
                Column::new("Claim", "string", 0),
                Column::new("StorageClass", "string", 0),
                Column::new("VolumeAttributesClass", "string", 0),
                Column::new("Reason", "string", 0),
                Column::age(),
                Column::new("VolumeMode", "string", 1),
            ]
        },
        cells: |o| {
            let claim = match at(o, &["spec", "claimRef"]) {
                Some(r) => format!(
                    "{}/{}",
                    str_at(r, &["namespace"]).unwrap_or_default(),
                    str_at(r, &["name"]).unwrap_or_default()
                ),
                None => String::new(),
            };
            vec![
                json!(str_at(o, &["spec", "capacity", "storage"]).unwrap_or("0")),
                json!(access_modes(o, &["spec", "accessModes"])),
                json!(str_at(o, &["spec", "persistentVolumeReclaimPolicy"]).unwrap_or_default()),
                json!(phase(o)),
                json!(claim),
                json!(storage_class(o)),
                unset(str_at(o, &["spec", "volumeAttributesClassName"])),
                json!(str_at(o, &["status", "reason"]).unwrap_or_default()),
                json!(age(o)),
                unset(str_at(o, &["spec", "volumeMode"])),
            ]
        },
        ..Hooks::default()
    }
}

/// What an update of a claim may do to its storage request, as upstream
/// v1.33's ValidatePersistentVolumeClaimUpdate (RecoverVolumeExpansionFailure
/// on): an unbound claim's spec may not change it at all; a bound claim's
/// request may shrink (back from an expansion not yet done) but never to
/// its `status.capacity` or below. Growth is the PersistentVolumeClaimResize
/// admission's to allow.
fn validate_claim_change(subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    let Some(old) = old.filter(|_| subresource.is_none()) else { return Vec::new() };
    let storage = |o: &Value, path: &str| {
        o.pointer(path).and_then(Value::as_str).and_then(|s| crate::quantity::Amount::parse(s).ok())
    };
    let (was, now) =
        (storage(old, "/spec/resources/requests/storage"), storage(new, "/spec/resources/requests/storage"));
    if was == now {
        return Vec::new();
    }
    if old.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return vec![Cause::forbidden(
            "spec",
            "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        )];
    }
    let capacity = storage(old, "/status/capacity/storage").unwrap_or_default();
    match (was, now) {
        (Some(was), Some(now)) if now < was && now <= capacity => vec![Cause::forbidden(
            "spec.resources.requests.storage",
            "Forbidden: field can not be less than status.capacity",
        )],
        _ => Vec::new(),
    }
}

pub fn persistentvolumeclaim_hooks() -> Hooks {
    Hooks {
        validate: super::quantities::validate_claim,
        validate_change: validate_claim_change,
        initial_status: |_| Some(json!({"phase": "Pending"})),
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                crate::apiserver::kinds::default_field(spec, "volumeMode", json!("Filesystem"));
            }
        },
        columns: || {
            vec![
                Column::new("Status", "string", 0),
                Column::new("Volume", "string", 0),
                Column::new("Capacity", "string", 0),
                Column::new("Access Modes", "string", 0),
                Column::new("StorageClass", "string", 0),
                Column::new("VolumeAttributesClass", "string", 0),
                Column::age(),
                Column::new("VolumeMode", "string", 1),
            ]
        },
        cells: |o| {
            let volume = str_at(o, &["spec", "volumeName"]).unwrap_or_default();
            // Capacity and modes are the bound volume's, so shown only once bound.
            let (capacity, modes) = if volume.is_empty() {
                (String::new(), String::new())
            } else {
                (
                    str_at(o, &["status", "capacity", "storage"]).unwrap_or("0").to_string(),
                    access_modes(o, &["status", "accessModes"]),
                )
            };
            vec![
                json!(phase(o)),
                json!(volume),
                json!(capacity),
                json!(modes),
                json!(storage_class(o)),
                unset(str_at(o, &["spec", "volumeAttributesClassName"])),
                json!(age(o)),
                unset(str_at(o, &["spec", "volumeMode"])),
            ]
        },
        ..Hooks::default()
    }
}

pub fn storageclass_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Provisioner", "string", 0),
                Column::new("ReclaimPolicy", "string", 0),
                Column::new("VolumeBindingMode", "string", 0),
                Column::new("AllowVolumeExpansion", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            vec![
                json!(str_at(o, &["provisioner"]).unwrap_or_default()),
                json!(str_at(o, &["reclaimPolicy"]).unwrap_or("Delete")),
                json!(str_at(o, &["volumeBindingMode"]).unwrap_or("Immediate")),
                flag(o, &["allowVolumeExpansion"], false),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

pub fn csidriver_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("AttachRequired", "boolean", 0),
                Column::new("PodInfoOnMount", "boolean", 0),
                Column::new("StorageCapacity", "boolean", 0),
                Column::new("TokenRequests", "string", 0),
                Column::new("RequiresRepublish", "boolean", 0),
                Column::new("Modes", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            let tokens = match at(o, &["spec", "tokenRequests"]).and_then(Value::as_array) {
                Some(reqs) => {
                    reqs.iter().map(|r| str_at(r, &["audience"]).unwrap_or_default()).collect::<Vec<_>>().join(",")
                }
                None => "<unset>".into(),
            };
            let modes = str_list(o, &["spec", "volumeLifecycleModes"]).join(",");
            vec![
                flag(o, &["spec", "attachRequired"], true),
                flag(o, &["spec", "podInfoOnMount"], false),
                flag(o, &["spec", "storageCapacity"], false),
                json!(tokens),
                flag(o, &["spec", "requiresRepublish"], false),
                json!(if modes.is_empty() { "<none>".into() } else { modes }),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

pub fn csinode_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Drivers", "integer", 0), Column::age()],
        cells: |o| vec![json!(len(o, &["spec", "drivers"])), json!(age(o))],
        ..Hooks::default()
    }
}

/// Upstream shows no age for capacities.
pub fn csistoragecapacity_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("StorageClassName", "string", 0), Column::new("Capacity", "string", 0)],
        cells: |o| vec![json!(str_at(o, &["storageClassName"]).unwrap_or_default()), unset(str_at(o, &["capacity"]))],
        ..Hooks::default()
    }
}

pub fn volumeattachment_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                // Upstream marks this column as a name, too.
                Column { format: "name", ..Column::new("Attacher", "string", 0) },
                Column::new("PV", "string", 0),
                Column::new("Node", "string", 0),
                Column::new("Attached", "boolean", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            vec![
                json!(str_at(o, &["spec", "attacher"]).unwrap_or_default()),
                json!(str_at(o, &["spec", "source", "persistentVolumeName"]).unwrap_or_default()),
                json!(str_at(o, &["spec", "nodeName"]).unwrap_or_default()),
                flag(o, &["status", "attached"], false),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_request_never_shrinks_to_its_capacity() {
        let claim = |request: &str, phase: &str| {
            json!({"spec": {"resources": {"requests": {"storage": request}}},
                   "status": {"phase": phase, "capacity": {"storage": "1Gi"}}})
        };
        let fields = |new: &Value, old: &Value| -> Vec<String> {
            validate_claim_change(None, new, Some(old)).into_iter().map(|c| c.field).collect()
        };
        let bound = claim("2Gi", "Bound");
        assert!(fields(&claim("3Gi", "Bound"), &bound).is_empty(), "growth is admission's");
        assert!(fields(&claim("1500Mi", "Bound"), &bound).is_empty(), "back from a pending expansion");
        assert_eq!(fields(&claim("1Gi", "Bound"), &bound), ["spec.resources.requests.storage"]);
        assert_eq!(fields(&claim("2Gi", "Pending"), &claim("1Gi", "Pending")), ["spec"]);
        assert!(fields(&claim("2048Mi", "Bound"), &bound).is_empty(), "the same amount");
        assert!(validate_claim_change(Some("status"), &claim("1Gi", "Bound"), Some(&bound)).is_empty());
    }

    #[test]
    fn volume_and_claim_cells() {
        let pv = json!({
            "metadata": {"name": "pv1", "annotations": {"volume.beta.kubernetes.io/storage-class": "slow"}},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "ns", "name": "data"}, "storageClassName": "fast", "volumeMode": "Filesystem"},
            "status": {"phase": "Bound"}
        });
        let cells = (persistentvolume_hooks().cells)(&pv);
        assert_eq!(cells.len(), (persistentvolume_hooks().columns)().len());
        assert_eq!(
            &cells[..8],
            &[
                json!("5Gi"),
                json!("RWO,RWX"),
                json!("Retain"),
                json!("Bound"),
                json!("ns/data"),
                json!("slow"),
                json!("<unset>"),
                json!("")
            ]
        );
        assert_eq!(cells[9], json!("Filesystem"));

        let pending = json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "fast"}, "status": {"phase": "Pending"}});
        let cells = (persistentvolumeclaim_hooks().cells)(&pending);
        assert_eq!(&cells[..6], &[json!("Pending"), json!(""), json!(""), json!(""), json!("fast"), json!("<unset>")]);
        let bound = json!({"spec": {"volumeName": "pv1"}, "status": {"phase": "Bound", "capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOncePod"]}});
        let cells = (persistentvolumeclaim_hooks().cells)(&bound);
        assert_eq!(&cells[..4], &[json!("Bound"), json!("pv1"), json!("5Gi"), json!("RWOP")]);
    }

    #[test]
    fn csidriver_defaults() {
        let cells = (csidriver_hooks().cells)(&json!({"spec": {"volumeLifecycleModes": ["Persistent", "Ephemeral"]}}));
        assert_eq!(
            &cells[..6],
            &[json!(true), json!(false), json!(false), json!("<unset>"), json!(false), json!("Persistent,Ephemeral")]
        );
    }
}
