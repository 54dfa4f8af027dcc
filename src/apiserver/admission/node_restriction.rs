//! NodeRestriction, as upstream's admission plugin of that name: what the
//! Node authorizer lets every kubelet write, this limits to the kubelet's
//! own objects. A node may create, update and delete only its own Node,
//! never change its taints after registering, and set only the labels a
//! kubelet may set (no `node-restriction.kubernetes.io/` label, no
//! `kubernetes.io`/`k8s.io` label but the kubelet's own); it may create
//! only mirror pods bound to itself that reference nothing, update the
//! status of and delete or evict only pods bound to itself, write only
//! its own Lease in kube-node-lease, update only PVC status, and request
//! service-account tokens only bound to a pod of its own.
//!
//! ferrok's node role removes the released volumes of the built-in
//! local-path provisioner on its node (their directories, then the
//! volumes): a node may delete a PersistentVolume only when it is such a
//! volume, pinned to that node, in phase Released.
//!
//! ferrok's node role also registers the RuntimeClasses of its runtime
//! handlers (as k3s ships them); a node may create a RuntimeClass only
//! when it names a handler of the same name and nothing else.

use serde_json::Value;

use super::Operation;
use crate::apiserver::auth::node_authorizer::{node_identity, NODE_LEASE_NAMESPACE};
use crate::apiserver::auth::node_graph;
use crate::apiserver::call::Call;
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::well_known::annotations::CONFIG_MIRROR;
use crate::well_known::labels::kubelet_may_set_label;

fn labels(obj: Option<&Value>) -> serde_json::Map<String, Value> {
    obj.and_then(|o| o.pointer("/metadata/labels")).and_then(Value::as_object).cloned().unwrap_or_default()
}

/// The label keys added, removed or changed, sorted.
fn modified_labels(new: Option<&Value>, old: Option<&Value>) -> Vec<String> {
    let (a, b) = (labels(new), labels(old));
    let mut keys: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .chain(b.iter().filter(|(k, v)| a.get(*k) != Some(v)))
        .map(|(k, _)| k.clone())
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn forbidden_labels(new: Option<&Value>, old: Option<&Value>) -> Vec<String> {
    modified_labels(new, old).into_iter().filter(|k| !kubelet_may_set_label(k)).collect()
}

fn refuse(call: &Call, name: &str, why: String) -> ApiError {
    ApiError::forbidden_object(&call.resource.group, &call.resource.plural, name, &why)
}

fn node_name_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default()
}

/// Admits a write of a node's kubelet (any other user passes). `obj` is
/// the new object (the old one for a delete).
pub async fn admit(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    let Some(node) = node_identity(&call.user) else { return Ok(()) };
    let name = match op {
        Operation::Create => meta::name_of(obj).to_string(),
        _ => call.path.name.clone().unwrap_or_else(|| meta::name_of(obj).to_string()),
    };
    let sub = call.path.subresource.as_deref().unwrap_or_default();
    let refused = |why: String| Err(refuse(call, &name, why));
    match (call.resource.group.as_str(), call.resource.plural.as_str()) {
        ("", "pods") => match (sub, op) {
            ("", Operation::Create) => admit_mirror_pod(call, &name, node, obj).await,
            ("", Operation::Delete) if node_name_of(obj) != node => {
                refused(format!("node \"{node}\" can only delete pods with spec.nodeName set to itself"))
            }
            ("", Operation::Delete) => Ok(()),
            ("", op) => refused(format!(
                "unexpected operation \"{}\", node \"{node}\" can only create and delete mirror pods",
                op.as_str()
            )),
            ("status", Operation::Update) => {
                let old_node = old.map(node_name_of).unwrap_or_default();
                if old_node != node {
                    return refused(format!(
                        "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                    ));
                }
                if labels(Some(obj)) != labels(old) {
                    return refused(format!("node \"{node}\" cannot update labels through pod status"));
                }
                Ok(())
            }
            ("status", op) => refused(format!("unexpected operation \"{}\"", op.as_str())),
            (other, _) => {
                refused(format!("unexpected pod subresource \"{other}\", only 'status' and 'eviction' are allowed"))
            }
        },
        ("", "nodes") => {
            if name != node {
                return refused(format!("node \"{node}\" is not allowed to modify node \"{name}\""));
            }
            match op {
                Operation::Create => {
                    if obj.pointer("/spec/configSource").is_some_and(|c| !c.is_null()) {
                        return refused(format!(
                            "node \"{node}\" is not allowed to create pods with a non-nil configSource"
                        ));
                    }
                    let bad = forbidden_labels(Some(obj), None);
                    if !bad.is_empty() {
                        return refused(format!(
                            "node \"{node}\" is not allowed to set the following labels: {}",
                            bad.join(", ")
                        ));
                    }
                    Ok(())
                }
                Operation::Update => {
                    let taints = |o: Option<&Value>| {
                        o.and_then(|o| o.pointer("/spec/taints")).filter(|t| !t.is_null()).cloned().unwrap_or_default()
                    };
                    let empty = |t: &Value| t.is_null() || t.as_array().is_some_and(|a| a.is_empty());
                    let (new_taints, old_taints) = (taints(Some(obj)), taints(old));
                    if new_taints != old_taints && !(empty(&new_taints) && empty(&old_taints)) {
                        return refused(format!("node \"{node}\" is not allowed to modify taints"));
                    }
                    let bad = forbidden_labels(Some(obj), old);
                    if !bad.is_empty() {
                        return refused(format!("is not allowed to modify labels: {}", bad.join(", ")));
                    }
                    Ok(())
                }
                Operation::Delete | Operation::Connect => Ok(()),
            }
        }
        ("", "persistentvolumes") => {
            let released = obj.pointer("/status/phase").and_then(Value::as_str) == Some("Released");
            if op != Operation::Delete || node_graph::local_path_node(obj) != Some(node) || !released {
                return refused(format!(
                    "node \"{node}\" can only delete released local-path volumes pinned to itself"
                ));
            }
            Ok(())
        }
        ("", node_graph::CLAIMS) if sub == "status" && op == Operation::Update => Ok(()),
        ("", node_graph::CLAIMS) => refused("may only update PVC status".into()),
        ("coordination.k8s.io", "leases") => {
            if call.namespace() != Some(NODE_LEASE_NAMESPACE) {
                return refused(format!("can only access leases in the \"{NODE_LEASE_NAMESPACE}\" system namespace"));
            }
            if name != node {
                return refused("can only access node lease with the same name as the requesting node".into());
            }
            Ok(())
        }
        ("storage.k8s.io", "csinodes") if name != node => {
            refused("can only access CSINode with the same name as the requesting node".into())
        }
        ("node.k8s.io", "runtimeclasses") => {
            let plain = obj.get("handler").and_then(Value::as_str) == Some(name.as_str())
                && obj.get("overhead").is_none_or(Value::is_null)
                && obj.get("scheduling").is_none_or(Value::is_null);
            if op != Operation::Create || !plain {
                return refused(format!(
                    "node \"{node}\" can only create a RuntimeClass named after its handler, with no overhead or scheduling"
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Upstream's `admitPodCreate`: a mirror pod bound to the node, owned by
/// its Node, referencing no other object.
async fn admit_mirror_pod(call: &Call, name: &str, node: &str, pod: &Value) -> ApiResult<()> {
    let refused = |why: String| Err(refuse(call, name, why));
    if pod.pointer("/metadata/annotations").and_then(|a| a.get(CONFIG_MIRROR)).is_none() {
        return refused(format!(
            "pod does not have \"{CONFIG_MIRROR}\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    if node_name_of(pod) != node {
        return refused(format!("node \"{node}\" can only create pods with spec.nodeName set to itself"));
    }
    let owners = pod.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    let owner = match owners.as_slice() {
        [] => return refused(format!("node \"{node}\" can only create pods with an owner reference set to itself")),
        [one] => one,
        _ => {
            return refused(format!("node \"{node}\" can only create pods with a single owner reference set to itself"))
        }
    };
    let field = |k: &str| owner.get(k).and_then(Value::as_str).unwrap_or_default();
    if field("apiVersion") != "v1" || field("kind") != "Node" || field("name") != node {
        return refused(format!("node \"{node}\" can only create pods with an owner reference set to itself"));
    }
    if owner.get("controller").and_then(Value::as_bool) != Some(true) {
        return refused(format!(
            "node \"{node}\" can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
        return refused(format!("node \"{node}\" must not set blockOwnerDeletion on an owner reference"));
    }
    let stored =
        call.api.storage.get(&format!("/registry/nodes/{node}")).await.map_err(|e| refuse(call, name, e.message))?;
    let uid = stored.as_ref().and_then(|s| s.object.pointer("/metadata/uid")).and_then(Value::as_str);
    if uid != Some(field("uid")) {
        return refused(format!("node {node} UID mismatch: expected {} got {}", field("uid"), uid.unwrap_or_default()));
    }
    let refs = node_graph::pod_references(pod);
    if refs.iter().any(|(k, _)| *k == node_graph::SERVICE_ACCOUNTS) {
        return refused(format!("node \"{node}\" can not create pods that reference a service account"));
    }
    for (kind, noun) in [
        (node_graph::SECRETS, "secrets"),
        (node_graph::CONFIG_MAPS, "configmaps"),
        (node_graph::CLAIMS, "persistentvolumeclaims"),
    ] {
        if refs.iter().any(|(k, _)| *k == kind) {
            return refused(format!("node \"{node}\" can not create pods that reference {noun}"));
        }
    }
    let trust_bundles = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
        .flatten()
        .any(|s| s.get("clusterTrustBundle").is_some());
    if trust_bundles {
        return refused(format!("node \"{node}\" can not create pods that reference clustertrustbundles"));
    }
    Ok(())
}

/// A node's TokenRequest must be bound to a pod of its own (upstream's
/// `admitServiceAccount`).
pub async fn admit_token_request(call: &Call, request: &Value) -> ApiResult<()> {
    let Some(node) = node_identity(&call.user) else { return Ok(()) };
    let name = call.path.name.clone().unwrap_or_default();
    let refused = |why: &str| Err(refuse(call, &name, why.to_string()));
    let bound = request.pointer("/spec/boundObjectRef").filter(|r| !r.is_null());
    let field = |k: &str| bound.and_then(|r| r.get(k)).and_then(Value::as_str).unwrap_or_default();
    if bound.is_none() || field("apiVersion") != "v1" || field("kind") != "Pod" || field("name").is_empty() {
        return refused("node requested token not bound to a pod");
    }
    if field("uid").is_empty() {
        return refused("node requested token with a pod binding without a uid");
    }
    let ns = call.namespace().unwrap_or_default();
    let key = format!("/registry/pods/{ns}/{}", field("name"));
    let Some(pod) = call.api.storage.get(&key).await? else {
        return Err(ApiError::not_found("", "pods", field("name")));
    };
    if pod.object.pointer("/metadata/uid").and_then(Value::as_str) != Some(field("uid")) {
        return refused(&format!(
            "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
            field("uid")
        ));
    }
    if node_name_of(&pod.object) != node {
        return refused("node requested token bound to a pod scheduled on a different node");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_changed_labels_count() {
        let old = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "true", "a": "1"}}});
        let same = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "true", "a": "2"}}});
        assert!(forbidden_labels(Some(&same), Some(&old)).is_empty());
        let removed = json!({"metadata": {"labels": {"a": "1"}}});
        assert_eq!(forbidden_labels(Some(&removed), Some(&old)), vec!["node-role.kubernetes.io/control-plane"]);
        let added = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}});
        assert_eq!(forbidden_labels(Some(&added), None), vec!["node-restriction.kubernetes.io/x"]);
    }
}
