//! The roles of the controllers that run under their own service accounts
//! in kube-system (upstream's `--use-service-account-credentials` and its
//! `controller_policy.go`): `system:controller:<name>`, bound to the
//! service account `<name>`. Only the controllers moved to their own
//! identity so far are listed; the rest still act as
//! `system:kube-controller-manager`.

use serde_json::{json, Value};

use super::bootstrap::rule;

/// What every controller needs to record Events.
fn event_rules() -> Vec<Value> {
    vec![
        rule(&[""], &["events"], &["create", "patch", "update"]),
        rule(&["events.k8s.io"], &["events"], &["create", "patch", "update"]),
    ]
}

/// `system:controller:<name>` and its rules, as upstream grants them.
pub fn roles() -> Vec<(&'static str, Vec<Value>)> {
    let mut replicaset = vec![
        rule(&["apps", "extensions"], &["replicasets"], &["get", "list", "update", "watch"]),
        rule(&["apps", "extensions"], &["replicasets/status"], &["update"]),
        rule(&["apps", "extensions"], &["replicasets/finalizers"], &["update"]),
        rule(&[""], &["pods"], &["create", "delete", "list", "patch", "watch"]),
    ];
    replicaset.extend(event_rules());
    vec![("replicaset-controller", replicaset)]
}

/// The binding of `system:controller:<name>` to the service account
/// `kube-system/<name>`.
pub fn binding(name: &str) -> Value {
    let full = format!("system:controller:{name}");
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": full,
            "uid": crate::apiserver::meta::new_uid(),
            "creationTimestamp": crate::apiserver::meta::now_rfc3339(),
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": full},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
    })
}
