//! The Roles and RoleBindings of upstream v1.33's default policy
//! (`bootstrappolicy/namespace_policy.go`): in kube-system the reader of
//! `extension-apiserver-authentication` (what every aggregated API server
//! reads at start), the leader-locking roles of the controller manager and
//! the scheduler, and the roles of the bootstrap signer, the cloud provider
//! and the token cleaner; in kube-public the bootstrap signer's.

use serde_json::Value;

use super::cluster_roles::{binding_object, role_object, service_account, user, values, R};
use crate::well_known::users::{KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER};

use R::{Named, Res};

const CORE: &[&str] = &[""];
const READ: &[&str] = &["get", "list", "watch"];
const LEADER_LOCKING: &[R] = &[
    Res(&["coordination.k8s.io"], &["leases"], &["create", "get", "list", "update", "watch"]),
    Res(&["coordination.k8s.io"], &["leasecandidates"], &["create", "get", "list", "update", "watch"]),
];
const EVENTS: R = Res(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]);

/// (namespace, name, rules).
const ROLES: &[(&str, &str, &[R])] = &[
    (
        "kube-system",
        "extension-apiserver-authentication-reader",
        &[Named(CORE, &["configmaps"], &["extension-apiserver-authentication"], READ)],
    ),
    ("kube-system", "system::leader-locking-kube-controller-manager", LEADER_LOCKING),
    ("kube-system", "system::leader-locking-kube-scheduler", LEADER_LOCKING),
    ("kube-system", "system:controller:bootstrap-signer", &[Res(CORE, &["secrets"], READ)]),
    (
        "kube-system",
        "system:controller:cloud-provider",
        &[Res(CORE, &["configmaps"], &["create", "get", "list", "watch"])],
    ),
    (
        "kube-system",
        "system:controller:token-cleaner",
        &[Res(CORE, &["secrets"], &["delete", "get", "list", "watch"]), EVENTS],
    ),
    (
        "kube-public",
        "system:controller:bootstrap-signer",
        &[Res(CORE, &["configmaps"], READ), Named(CORE, &["configmaps"], &["cluster-info"], &["update"]), EVENTS],
    ),
];

/// Every default Role.
pub fn roles() -> Vec<Value> {
    ROLES.iter().map(|(ns, name, rules)| role_object("Role", Some(ns), name, values(rules))).collect()
}

fn binding(namespace: &str, name: &str, role: &str, subjects: Vec<Value>) -> Value {
    binding_object("RoleBinding", Some(namespace), name, "Role", role, subjects)
}

/// Every default RoleBinding.
pub fn role_bindings() -> Vec<Value> {
    let sa = |name: &str| service_account("kube-system", name);
    vec![
        binding(
            "kube-system",
            "system::extension-apiserver-authentication-reader",
            "extension-apiserver-authentication-reader",
            vec![user(KUBE_CONTROLLER_MANAGER), user(KUBE_SCHEDULER)],
        ),
        binding(
            "kube-system",
            "system::leader-locking-kube-controller-manager",
            "system::leader-locking-kube-controller-manager",
            vec![user(KUBE_CONTROLLER_MANAGER), sa("kube-controller-manager"), sa("leader-election-controller")],
        ),
        binding(
            "kube-system",
            "system::leader-locking-kube-scheduler",
            "system::leader-locking-kube-scheduler",
            vec![user(KUBE_SCHEDULER), sa("kube-scheduler")],
        ),
        binding(
            "kube-system",
            "system:controller:bootstrap-signer",
            "system:controller:bootstrap-signer",
            vec![sa("bootstrap-signer")],
        ),
        binding(
            "kube-system",
            "system:controller:cloud-provider",
            "system:controller:cloud-provider",
            vec![sa("cloud-provider")],
        ),
        binding(
            "kube-system",
            "system:controller:token-cleaner",
            "system:controller:token-cleaner",
            vec![sa("token-cleaner")],
        ),
        binding(
            "kube-public",
            "system:controller:bootstrap-signer",
            "system:controller:bootstrap-signer",
            vec![sa("bootstrap-signer")],
        ),
    ]
}
