//! Status fields that upstream's Go types write even when they are zero
//! (no `omitempty` in their JSON tags): a fresh ReplicaSet reads
//! `"status":{"replicas":0}` from upstream, and clients that wait on
//! `{.status.replicas}` or read `status.availableReplicas` rely on them.
//! The `k8s-openapi` types (and so every typed decode and every status a
//! controller writes through them) leave out what is `None`; this table
//! puts the zero back on every write of the kind.

use serde_json::{json, Map, Value};

/// The zero a field takes.
#[derive(Debug, Clone, Copy)]
enum Zero {
    Int,
    Bool,
    Object,
}

/// (group, kind, status fields without `omitempty`), from the Go types of
/// Kubernetes v1.33.
const STATUS: &[(&str, &str, &[(&str, Zero)])] = &[
    ("", "ReplicationController", &[("replicas", Zero::Int)]),
    ("", "Service", &[("loadBalancer", Zero::Object)]),
    ("apps", "ReplicaSet", &[("replicas", Zero::Int)]),
    ("apps", "StatefulSet", &[("replicas", Zero::Int), ("availableReplicas", Zero::Int)]),
    (
        "apps",
        "DaemonSet",
        &[
            ("currentNumberScheduled", Zero::Int),
            ("numberMisscheduled", Zero::Int),
            ("desiredNumberScheduled", Zero::Int),
            ("numberReady", Zero::Int),
        ],
    ),
    ("autoscaling", "HorizontalPodAutoscaler", &[("desiredReplicas", Zero::Int)]),
    ("networking.k8s.io", "Ingress", &[("loadBalancer", Zero::Object)]),
    (
        "policy",
        "PodDisruptionBudget",
        &[
            ("disruptionsAllowed", Zero::Int),
            ("currentHealthy", Zero::Int),
            ("desiredHealthy", Zero::Int),
            ("expectedPods", Zero::Int),
        ],
    ),
    ("storage.k8s.io", "VolumeAttachment", &[("attached", Zero::Bool)]),
];

/// Puts back the zero of every always-written status field the object of
/// `group`/`kind` lacks; an object without a status gets one when its kind
/// has such fields.
pub fn fill_status(group: &str, kind: &str, obj: &mut Value) {
    let Some((_, _, fields)) = STATUS.iter().find(|(g, k, _)| *g == group && *k == kind) else { return };
    let Some(o) = obj.as_object_mut() else { return };
    let status = o.entry("status").or_insert_with(|| Value::Object(Map::new()));
    if status.is_null() {
        *status = Value::Object(Map::new());
    }
    let Some(status) = status.as_object_mut() else { return };
    for (field, zero) in fields.iter() {
        let value = match zero {
            Zero::Int => json!(0),
            Zero::Bool => json!(false),
            Zero::Object => json!({}),
        };
        match status.get(*field) {
            None | Some(Value::Null) => {
                status.insert((*field).to_string(), value);
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_put_back_and_values_kept() {
        let mut sts = json!({"kind": "StatefulSet", "status": {"replicas": 3}});
        fill_status("apps", "StatefulSet", &mut sts);
        assert_eq!(sts["status"], json!({"replicas": 3, "availableReplicas": 0}));
        let mut ds = json!({"kind": "DaemonSet"});
        fill_status("apps", "DaemonSet", &mut ds);
        assert_eq!(
            ds["status"],
            json!({"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0})
        );
        let mut cm = json!({"kind": "ConfigMap", "data": {}});
        fill_status("", "ConfigMap", &mut cm);
        assert!(cm.get("status").is_none());
    }
}
