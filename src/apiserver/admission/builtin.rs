//! The built-in admission plugins a user expects: ServiceAccount (pods
//! run as `default` unless told otherwise, with its token mounted), DefaultTolerationSeconds (300 s
//! for not-ready and unreachable nodes), Priority (priorityClassName
//! becomes priority), DefaultStorageClass (claims without a class get the
//! default one), StorageObjectInUseProtection (new claims and volumes carry
//! the finalizer their protection controller removes once nothing uses
//! them) and LimitRanger's defaults (`limit_ranger`).
//! ResourceQuota is in `resource_quota`.

use serde_json::{json, Value};

use super::Operation;
use crate::apiserver::call::Call;
use crate::apiserver::status::{ApiError, ApiResult};

fn is(call: &Call, group: &str, plural: &str) -> bool {
    call.resource.group == group && call.resource.plural == plural && call.path.subresource.is_none()
}

pub async fn mutate(call: &Call, obj: &mut Value, op: Operation) -> ApiResult<()> {
    if op != Operation::Create {
        return Ok(());
    }
    if is(call, "", "pods") {
        service_account(obj);
        service_account_token_volume(call, obj).await?;
        default_toleration_seconds(obj);
        priority(call, obj).await?;
        super::limit_ranger::default_pod(call, obj);
    }
    if is(call, "", "persistentvolumeclaims") {
        default_storage_class(call, obj).await?;
        storage_object_in_use_protection(obj, PVC_PROTECTION_FINALIZER);
    }
    if is(call, "", "persistentvolumes") {
        storage_object_in_use_protection(obj, PV_PROTECTION_FINALIZER);
    }
    if is(call, "certificates.k8s.io", "certificatesigningrequests") {
        // The requester is whoever creates the CSR, never what the body claims.
        if let Some(spec) = obj.get_mut("spec") {
            spec["username"] = json!(call.user.name);
            spec["groups"] = json!(call.user.groups);
        }
    }
    Ok(())
}

fn service_account(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| spec.get("serviceAccount").and_then(Value::as_str).filter(|s| !s.is_empty()))
        .unwrap_or("default")
        .to_string();
    spec.insert("serviceAccountName".into(), json!(name));
    spec.insert("serviceAccount".into(), json!(name));
}

/// Where the token, CA and namespace of the pod's service account appear.
const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount plugin's token volume: unless the pod or its service
/// account opts out (`automountServiceAccountToken: false`), a projected
/// `kube-api-access-xxxxx` volume (a bound token renewed by the kubelet,
/// `kube-root-ca.crt`'s `ca.crt`, the namespace) mounted read-only in every
/// container at /var/run/secrets/kubernetes.io/serviceaccount, as upstream.
/// Mirror pods of static pods get none.
async fn service_account_token_volume(call: &Call, pod: &mut Value) -> ApiResult<()> {
    if pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some() {
        return Ok(());
    }
    let Some(spec) = pod.get("spec") else { return Ok(()) };
    let automount = match spec.get("automountServiceAccountToken").and_then(Value::as_bool) {
        Some(a) => a,
        None => {
            let ns = crate::apiserver::meta::namespace_of(pod).unwrap_or("default").to_string();
            let sa = spec.get("serviceAccountName").and_then(Value::as_str).unwrap_or("default");
            // The cached account first, the store when the cache has none
            // (yet), as upstream's admission asks its lister, then the API.
            let key = format!("/registry/serviceaccounts/{ns}/{sa}");
            let stored = match call.api.registry.get("", "v1", "serviceaccounts") {
                Some(r) => call.api.watch_cache.get_or_read(&r, &key).await?,
                None => call.api.storage.get(&key).await?,
            };
            stored.and_then(|s| s.object.get("automountServiceAccountToken").and_then(Value::as_bool)).unwrap_or(true)
        }
    };
    if !automount {
        return Ok(());
    }
    let mounted = |c: &Value| {
        c.get("volumeMounts").and_then(Value::as_array).is_some_and(|m| {
            m.iter().any(|v| v.get("mountPath").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_MOUNT))
        })
    };
    let containers = ["containers", "initContainers"];
    let all_mounted =
        containers.iter().flat_map(|k| spec.get(*k).and_then(Value::as_array).into_iter().flatten()).all(mounted);
    if all_mounted {
        return Ok(());
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rnd = [0u8; 5];
    crate::host::random::fill(&mut rnd);
    let suffix: String = rnd.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect();
    let name = format!("kube-api-access-{suffix}");
    let volume = json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    });
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    if let Some(v) = volumes.as_array_mut() {
        v.push(volume);
    }
    for key in containers {
        for c in spec.get_mut(key).and_then(Value::as_array_mut).into_iter().flatten() {
            if mounted(c) {
                continue;
            }
            let Some(obj) = c.as_object_mut() else { continue };
            let mounts = obj.entry("volumeMounts").or_insert_with(|| json!([]));
            if let Some(m) = mounts.as_array_mut() {
                m.push(json!({"name": name, "mountPath": SERVICE_ACCOUNT_MOUNT, "readOnly": true}));
            }
        }
    }
    Ok(())
}

/// DefaultTolerationSeconds: pods tolerate their node being not-ready or
/// unreachable for 300 s before the taint eviction removes them, unless
/// they say otherwise for that taint.
fn default_toleration_seconds(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    let Some(list) = tolerations.as_array_mut() else { return };
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        // Upstream skips a key any existing NoExecute (or any-effect)
        // toleration already covers, whether by key or by a wildcard.
        let covered = list.iter().any(|t| {
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            let tkey = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let exists = t.get("operator").and_then(Value::as_str) == Some("Exists");
            (effect.is_empty() || effect == "NoExecute") && (tkey == key || (tkey.is_empty() && exists))
        });
        if !covered {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

async fn priority(call: &Call, pod: &mut Value) -> ApiResult<()> {
    let class = pod.pointer("/spec/priorityClassName").and_then(Value::as_str).unwrap_or_default().to_string();
    let classes = call.api.caches.priority_classes.all();
    let chosen = if class.is_empty() {
        classes.iter().find(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true)).map(|c| (**c).clone())
    } else {
        match classes.iter().find(|c| c.pointer("/metadata/name").and_then(Value::as_str) == Some(class.as_str())) {
            Some(c) => Some((**c).clone()),
            None if class == "system-node-critical" => Some(json!({"metadata": {"name": class}, "value": 2000001000})),
            None if class == "system-cluster-critical" => {
                Some(json!({"metadata": {"name": class}, "value": 2000000000}))
            }
            None => {
                return Err(ApiError::forbidden(format!(
                    "pods \"{}\" is forbidden: no PriorityClass with name {class} was found",
                    crate::apiserver::meta::name_of(pod)
                )))
            }
        }
    };
    if let Some(spec) = pod.get_mut("spec") {
        let value = chosen.as_ref().and_then(|c| c.get("value")).and_then(Value::as_i64).unwrap_or(0);
        spec["priority"] = json!(value);
        if let Some(c) = &chosen {
            spec["priorityClassName"] = c["metadata"]["name"].clone();
            if let Some(p) = c.get("preemptionPolicy") {
                spec["preemptionPolicy"] = p.clone();
            }
        }
        if spec.get("preemptionPolicy").is_none() {
            spec["preemptionPolicy"] = json!("PreemptLowerPriority");
        }
    }
    Ok(())
}

/// The finalizer of a claim still used by a pod (the pvc-protection controller's).
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// The finalizer of a volume still bound to a claim (the pv-protection controller's).
pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";

/// StorageObjectInUseProtection: the protection finalizer, once.
fn storage_object_in_use_protection(obj: &mut Value, finalizer: &str) {
    let meta = crate::apiserver::meta::metadata_mut(obj);
    let finalizers = meta.entry("finalizers").or_insert_with(|| json!([]));
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut() {
        if !list.iter().any(|f| f.as_str() == Some(finalizer)) {
            list.push(json!(finalizer));
        }
    }
}

async fn default_storage_class(call: &Call, pvc: &mut Value) -> ApiResult<()> {
    if pvc.pointer("/spec/storageClassName").is_some() {
        return Ok(());
    }
    let classes = call.api.caches.storage_classes.all();
    let default = classes.iter().find(|c| {
        c.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class").and_then(Value::as_str)
            == Some("true")
    });
    if let (Some(c), Some(spec)) = (default, pvc.get_mut("spec")) {
        spec["storageClassName"] = c["metadata"]["name"].clone();
    }
    Ok(())
}
