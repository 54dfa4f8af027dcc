//! The ClusterRoles and ClusterRoleBindings of upstream v1.33's default
//! policy (`bootstrappolicy/policy.go`, its default feature gates), and the
//! few ferrok adds of its own. The controllers' roles are in
//! `controller_roles.rs`, the scheduler's and controller manager's rules in
//! `component_roles.rs`.
//!
//! `admin`, `edit` and `view` are aggregated: they are written without
//! rules, and the clusterrole-aggregation controller gives them the rules
//! of the roles their selectors pick (`system:aggregate-to-*`, and `view`
//! into `edit` into `admin` through the labels they carry).

use serde_json::{json, Value};

use super::component_roles;
use super::reconcile::AUTOUPDATE;
use crate::well_known::users::{KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, NODES_GROUP};

/// One policy rule of a table.
#[derive(Clone, Copy)]
pub enum R {
    /// apiGroups, resources, verbs.
    Res(&'static [&'static str], &'static [&'static str], &'static [&'static str]),
    /// apiGroups, resources, resourceNames, verbs.
    Named(&'static [&'static str], &'static [&'static str], &'static [&'static str], &'static [&'static str]),
    /// nonResourceURLs, verbs.
    Urls(&'static [&'static str], &'static [&'static str]),
}

impl R {
    pub fn to_value(self) -> Value {
        match self {
            R::Res(g, r, v) => json!({"apiGroups": g, "resources": r, "verbs": v}),
            R::Named(g, r, n, v) => json!({"apiGroups": g, "resources": r, "resourceNames": n, "verbs": v}),
            R::Urls(u, v) => json!({"nonResourceURLs": u, "verbs": v}),
        }
    }
}

pub fn values(rules: &[R]) -> Vec<Value> {
    rules.iter().map(|r| r.to_value()).collect()
}

use R::{Named, Res, Urls};

const CORE: &[&str] = &[""];
const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const EVENTS: R = Res(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]);
const CERTIFICATES: &[&str] = &["certificates.k8s.io"];

const AGGREGATE_TO_ADMIN: &[R] = &[
    Res(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]),
    Res(&["rbac.authorization.k8s.io"], &["rolebindings", "roles"], READ_WRITE),
];

const AGGREGATE_TO_EDIT: &[R] = &[
    Res(CORE, &["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"], READ),
    Res(CORE, &["serviceaccounts"], &["impersonate"]),
    Res(CORE, &["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], WRITE),
    Res(CORE, &["pods/eviction"], &["create"]),
    Res(
        CORE,
        &[
            "configmaps",
            "events",
            "persistentvolumeclaims",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "secrets",
            "serviceaccounts",
            "services",
            "services/proxy",
        ],
        WRITE,
    ),
    Res(CORE, &["serviceaccounts/token"], &["create"]),
    Res(
        &["apps"],
        &[
            "daemonsets",
            "deployments",
            "deployments/rollback",
            "deployments/scale",
            "replicasets",
            "replicasets/scale",
            "statefulsets",
            "statefulsets/scale",
        ],
        WRITE,
    ),
    Res(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
    Res(&["batch"], &["cronjobs", "jobs"], WRITE),
    Res(
        &["extensions"],
        &[
            "daemonsets",
            "deployments",
            "deployments/rollback",
            "deployments/scale",
            "ingresses",
            "networkpolicies",
            "replicasets",
            "replicasets/scale",
            "replicationcontrollers/scale",
        ],
        WRITE,
    ),
    Res(&["policy"], &["poddisruptionbudgets"], WRITE),
    Res(&["networking.k8s.io"], &["ingresses", "networkpolicies"], WRITE),
    Res(&["coordination.k8s.io"], &["leases"], READ_WRITE),
];

const AGGREGATE_TO_VIEW: &[R] = &[
    Res(
        CORE,
        &[
            "configmaps",
            "endpoints",
            "persistentvolumeclaims",
            "persistentvolumeclaims/status",
            "pods",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/status",
        ],
        READ,
    ),
    Res(
        CORE,
        &[
            "bindings",
            "events",
            "limitranges",
            "namespaces/status",
            "pods/log",
            "pods/status",
            "replicationcontrollers/status",
            "resourcequotas",
            "resourcequotas/status",
        ],
        READ,
    ),
    Res(CORE, &["namespaces"], READ),
    Res(&["discovery.k8s.io"], &["endpointslices"], READ),
    Res(
        &["apps"],
        &[
            "controllerrevisions",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "statefulsets",
            "statefulsets/scale",
            "statefulsets/status",
        ],
        READ,
    ),
    Res(&["autoscaling"], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"], READ),
    Res(&["batch"], &["cronjobs", "cronjobs/status", "jobs", "jobs/status"], READ),
    Res(
        &["extensions"],
        &[
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "ingresses",
            "ingresses/status",
            "networkpolicies",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "replicationcontrollers/scale",
        ],
        READ,
    ),
    Res(&["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"], READ),
    Res(&["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"], READ),
];

/// Upstream's role of every kubelet. Upstream binds it to no one (the
/// Node authorizer grants kubelets their rights, narrowed per node), and
/// so does ferrok: its Node authorizer's rules are `node_authorizer.rs`'s.
const NODE: &[R] = &[
    Res(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    Res(&["authorization.k8s.io"], &["localsubjectaccessreviews", "subjectaccessreviews"], &["create"]),
    Res(CORE, &["services"], READ),
    Res(CORE, &["nodes"], &["create", "get", "list", "watch"]),
    Res(CORE, &["nodes/status"], &["patch", "update"]),
    Res(CORE, &["nodes"], &["patch", "update"]),
    Res(CORE, &["events"], &["create", "patch", "update"]),
    Res(CORE, &["pods"], READ),
    Res(CORE, &["pods"], &["create", "delete"]),
    Res(CORE, &["pods/status"], &["patch", "update"]),
    Res(CORE, &["pods/eviction"], &["create"]),
    Res(CORE, &["configmaps", "secrets"], READ),
    Res(CORE, &["persistentvolumeclaims", "persistentvolumes"], &["get"]),
    Res(CORE, &["endpoints"], &["get"]),
    Res(CERTIFICATES, &["certificatesigningrequests"], &["create", "get", "list", "watch"]),
    Res(&["coordination.k8s.io"], &["leases"], &["create", "delete", "get", "patch", "update"]),
    Res(&["storage.k8s.io"], &["volumeattachments"], &["get"]),
    Res(CORE, &["serviceaccounts/token"], &["create"]),
    Res(CORE, &["persistentvolumeclaims/status"], &["get", "patch", "update"]),
    Res(&["storage.k8s.io"], &["csidrivers"], READ),
    Res(&["storage.k8s.io"], &["csinodes"], &["create", "delete", "get", "patch", "update"]),
    Res(&["node.k8s.io"], &["runtimeclasses"], READ),
];

const HEALTH_URLS: &[&str] = &["/healthz", "/livez", "/readyz", "/version", "/version/"];

/// The roles whose rules are plain data, by name.
const TABLES: &[(&str, &[R])] = &[
    ("cluster-admin", &[Res(&["*"], &["*"], &["*"]), Urls(&["*"], &["*"])]),
    ("system:aggregate-to-admin", AGGREGATE_TO_ADMIN),
    ("system:aggregate-to-edit", AGGREGATE_TO_EDIT),
    ("system:aggregate-to-view", AGGREGATE_TO_VIEW),
    (
        "system:auth-delegator",
        &[
            Res(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
            Res(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
        ],
    ),
    (
        "system:basic-user",
        &[
            Res(&["authorization.k8s.io"], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"], &["create"]),
            Res(&["authentication.k8s.io"], &["selfsubjectreviews"], &["create"]),
        ],
    ),
    (
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        &[Res(CERTIFICATES, &["certificatesigningrequests/nodeclient"], &["create"])],
    ),
    (
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        &[Res(CERTIFICATES, &["certificatesigningrequests/selfnodeclient"], &["create"])],
    ),
    (
        "system:certificates.k8s.io:kube-apiserver-client-approver",
        &[Named(CERTIFICATES, &["signers"], &["kubernetes.io/kube-apiserver-client"], &["approve"])],
    ),
    (
        "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver",
        &[Named(CERTIFICATES, &["signers"], &["kubernetes.io/kube-apiserver-client-kubelet"], &["approve"])],
    ),
    (
        "system:certificates.k8s.io:kubelet-serving-approver",
        &[Named(CERTIFICATES, &["signers"], &["kubernetes.io/kubelet-serving"], &["approve"])],
    ),
    (
        "system:certificates.k8s.io:legacy-unknown-approver",
        &[Named(CERTIFICATES, &["signers"], &["kubernetes.io/legacy-unknown"], &["approve"])],
    ),
    (
        "system:discovery",
        &[Urls(
            &[
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/healthz",
                "/livez",
                "/openapi",
                "/openapi/*",
                "/readyz",
                "/version",
                "/version/",
            ],
            &["get"],
        )],
    ),
    (
        "system:heapster",
        &[Res(CORE, &["events", "namespaces", "nodes", "pods"], READ), Res(&["extensions"], &["deployments"], READ)],
    ),
    ("system:kube-aggregator", &[Res(CORE, &["endpoints", "services"], READ)]),
    ("system:kube-dns", &[Res(CORE, &["endpoints", "services"], &["list", "watch"])]),
    (
        "system:kubelet-api-admin",
        &[
            Res(CORE, &["nodes"], READ),
            Res(CORE, &["nodes"], &["proxy"]),
            Res(CORE, &["nodes/log", "nodes/metrics", "nodes/proxy", "nodes/stats"], &["*"]),
        ],
    ),
    (
        "system:monitoring",
        &[Urls(
            &["/healthz", "/healthz/*", "/livez", "/livez/*", "/metrics", "/metrics/slis", "/readyz", "/readyz/*"],
            &["get"],
        )],
    ),
    ("system:node", NODE),
    (
        "system:node-bootstrapper",
        &[Res(CERTIFICATES, &["certificatesigningrequests"], &["create", "get", "list", "watch"])],
    ),
    (
        "system:node-problem-detector",
        &[Res(CORE, &["nodes"], &["get"]), Res(CORE, &["nodes/status"], &["patch"]), EVENTS],
    ),
    (
        "system:node-proxier",
        &[
            Res(CORE, &["endpoints", "services"], &["list", "watch"]),
            Res(CORE, &["nodes"], READ),
            EVENTS,
            Res(&["discovery.k8s.io"], &["endpointslices"], &["list", "watch"]),
        ],
    ),
    (
        "system:persistent-volume-provisioner",
        &[
            Res(CORE, &["persistentvolumes"], &["create", "delete", "get", "list", "watch"]),
            Res(CORE, &["persistentvolumeclaims"], &["get", "list", "update", "watch"]),
            Res(&["storage.k8s.io"], &["storageclasses"], READ),
            Res(CORE, &["events"], &["watch"]),
            EVENTS,
        ],
    ),
    ("system:public-info-viewer", &[Urls(HEALTH_URLS, &["get"])]),
    (
        "system:service-account-issuer-discovery",
        &[Urls(&["/.well-known/openid-configuration", "/openid/v1/jwks"], &["get"])],
    ),
];

const AGGREGATE_TO_ADMIN_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const AGGREGATE_TO_EDIT_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const AGGREGATE_TO_VIEW_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The labels a role of the table carries beyond `kubernetes.io/bootstrapping`.
fn extra_label(name: &str) -> Option<&'static str> {
    match name {
        "system:aggregate-to-admin" | "edit" => Some(AGGREGATE_TO_ADMIN_LABEL),
        "system:aggregate-to-edit" | "view" => Some(AGGREGATE_TO_EDIT_LABEL),
        "system:aggregate-to-view" => Some(AGGREGATE_TO_VIEW_LABEL),
        _ => None,
    }
}

fn metadata(name: &str, namespace: Option<&str>, labels: Value) -> Value {
    let mut meta = json!({
        "name": name,
        "uid": crate::apiserver::meta::new_uid(),
        "creationTimestamp": crate::apiserver::meta::now_rfc3339(),
        "labels": labels,
        "annotations": {AUTOUPDATE: "true"},
    });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

/// A default role object: `kind` ClusterRole or Role, with upstream's
/// labels and annotation.
pub fn role_object(kind: &str, namespace: Option<&str>, name: &str, rules: Vec<Value>) -> Value {
    let mut labels = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    if let Some(label) = extra_label(name) {
        labels[label] = json!("true");
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata(name, namespace, labels),
        "rules": rules,
    })
}

/// A default binding object of `kind` (ClusterRoleBinding or RoleBinding)
/// of the `role_kind` `role`.
pub fn binding_object(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    role_kind: &str,
    role: &str,
    subjects: Vec<Value>,
) -> Value {
    let mut binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata(name, namespace, json!({"kubernetes.io/bootstrapping": "rbac-defaults"})),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
    });
    if !subjects.is_empty() {
        binding["subjects"] = Value::Array(subjects);
    }
    binding
}

pub fn group(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name})
}

pub fn user(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name})
}

pub fn service_account(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": namespace})
}

/// An aggregated role: no rules of its own, a selector of the label.
fn aggregated(name: &str, label: &str) -> Value {
    let mut role = role_object("ClusterRole", None, name, Vec::new());
    if let Some(map) = role.as_object_mut() {
        map.remove("rules");
    }
    role["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {label: "true"}}]});
    role
}

/// metrics-server's role (k3s ships it with metrics-server; ferrok serves
/// metrics.k8s.io itself), aggregated into view, edit and admin.
fn aggregated_metrics_reader() -> Value {
    let mut role = role_object(
        "ClusterRole",
        None,
        "system:aggregated-metrics-reader",
        vec![
            json!({"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}),
        ],
    );
    role["metadata"]["labels"] = json!({
        AGGREGATE_TO_ADMIN_LABEL: "true",
        AGGREGATE_TO_EDIT_LABEL: "true",
        AGGREGATE_TO_VIEW_LABEL: "true",
    });
    role
}

/// Every default ClusterRole: upstream's, the controllers', then ferrok's own.
pub fn cluster_roles() -> Vec<Value> {
    let mut roles = vec![
        aggregated("admin", AGGREGATE_TO_ADMIN_LABEL),
        aggregated("edit", AGGREGATE_TO_EDIT_LABEL),
        aggregated("view", AGGREGATE_TO_VIEW_LABEL),
    ];
    roles.extend(TABLES.iter().map(|(name, rules)| role_object("ClusterRole", None, name, values(rules))));
    for (name, rules) in [
        ("system:kube-controller-manager", component_roles::kube_controller_manager()),
        ("system:kube-scheduler", component_roles::kube_scheduler()),
        ("system:volume-scheduler", component_roles::volume_scheduler()),
    ] {
        roles.push(role_object("ClusterRole", None, name, rules));
    }
    roles.extend(
        super::controller_roles::roles()
            .into_iter()
            .map(|(name, rules)| role_object("ClusterRole", None, &format!("system:controller:{name}"), rules)),
    );
    // ferrok's own.
    roles.push(aggregated_metrics_reader());
    roles.push(role_object("ClusterRole", None, "system:ferrok:node", component_roles::ferrok_node()));
    roles
}

fn cluster_binding(name: &str, role: &str, subjects: Vec<Value>) -> Value {
    binding_object("ClusterRoleBinding", None, name, "ClusterRole", role, subjects)
}

/// Every default ClusterRoleBinding: upstream's, the controllers', then ferrok's own.
pub fn cluster_role_bindings() -> Vec<Value> {
    let authenticated = || group("system:authenticated");
    let mut bindings = vec![
        cluster_binding("cluster-admin", "cluster-admin", vec![group("system:masters")]),
        cluster_binding("system:monitoring", "system:monitoring", vec![group("system:monitoring")]),
        cluster_binding("system:discovery", "system:discovery", vec![authenticated()]),
        cluster_binding("system:basic-user", "system:basic-user", vec![authenticated()]),
        cluster_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![authenticated(), group("system:unauthenticated")],
        ),
        cluster_binding("system:node-proxier", "system:node-proxier", vec![user("system:kube-proxy")]),
        cluster_binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            vec![user(KUBE_CONTROLLER_MANAGER)],
        ),
        cluster_binding("system:kube-dns", "system:kube-dns", vec![service_account("kube-system", "kube-dns")]),
        cluster_binding("system:kube-scheduler", "system:kube-scheduler", vec![user(KUBE_SCHEDULER)]),
        cluster_binding("system:volume-scheduler", "system:volume-scheduler", vec![user(KUBE_SCHEDULER)]),
        // Upstream's binding of the kubelets' role, left without subjects.
        cluster_binding("system:node", "system:node", Vec::new()),
        cluster_binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            vec![group("system:serviceaccounts")],
        ),
    ];
    bindings.extend(super::controller_roles::ROLES.iter().map(|name| {
        let full = format!("system:controller:{name}");
        cluster_binding(&full, &full, vec![service_account("kube-system", name)])
    }));
    // ferrok's own: its nodes' extra reads, the kubelet API rights of the
    // API server's kubelet client (k3s' name), and bootstrap tokens'
    // certificate requests.
    bindings.push(cluster_binding("system:ferrok:node", "system:ferrok:node", vec![group(NODES_GROUP)]));
    bindings.push(cluster_binding(
        "kube-apiserver-kubelet-admin",
        "system:kubelet-api-admin",
        vec![user(crate::pki::KUBE_APISERVER_USER)],
    ));
    bindings.push(cluster_binding(
        "system:node-bootstrapper",
        "system:node-bootstrapper",
        vec![group("system:bootstrappers")],
    ));
    bindings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(objects: &[Value]) -> Vec<String> {
        objects.iter().map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect()
    }

    #[test]
    fn upstream_counts_plus_ferroks_own_and_no_duplicates() {
        let roles = names(&cluster_roles());
        let bindings = names(&cluster_role_bindings());
        // 31 of policy.go, 35 of controller_policy.go, 2 of ferrok's.
        assert_eq!(roles.len(), 31 + 35 + 2);
        // 12 of policy.go, 35 of controller_policy.go, 3 of ferrok's.
        assert_eq!(bindings.len(), 12 + 35 + 3);
        for list in [&roles, &bindings] {
            let mut sorted = list.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len());
        }
        for b in cluster_role_bindings() {
            let role = b["roleRef"]["name"].as_str().unwrap_or_default();
            assert!(roles.iter().any(|r| r == role), "{role}");
        }
    }

    #[test]
    fn admin_edit_and_view_aggregate_and_chain_through_their_labels() {
        let roles = cluster_roles();
        let find = |n: &str| roles.iter().find(|r| r["metadata"]["name"] == n).cloned().unwrap_or_default();
        assert!(find("admin").get("rules").is_none());
        assert_eq!(
            find("admin")["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"][AGGREGATE_TO_ADMIN_LABEL],
            "true"
        );
        assert_eq!(find("edit")["metadata"]["labels"][AGGREGATE_TO_ADMIN_LABEL], "true");
        assert_eq!(find("view")["metadata"]["labels"][AGGREGATE_TO_EDIT_LABEL], "true");
        assert_eq!(find("system:aggregate-to-view")["metadata"]["labels"][AGGREGATE_TO_VIEW_LABEL], "true");
        assert_eq!(find("cluster-admin")["metadata"]["annotations"][AUTOUPDATE], "true");
    }
}
