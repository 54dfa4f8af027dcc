//! The default ClusterRoles and ClusterRoleBindings every cluster starts
//! with: cluster-admin (bound to system:masters), admin, edit, view, and the
//! system roles for discovery, basic user information and public info.
//! They carry `rbac.authorization.kubernetes.io/autoupdate: "true"` and are
//! reconciled at every start. The controllers' service accounts in
//! kube-system are created here too when missing (a deleted one comes
//! back at the next start; the controllers act in process regardless).

use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Storage, WriteError};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

pub(super) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

/// Resources a namespace user reads (view) and, with edit, writes.
fn workload_resources() -> Vec<(&'static [&'static str], &'static [&'static str])> {
    vec![
        (
            &[""],
            &[
                "pods",
                "pods/log",
                "pods/status",
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "replicationcontrollers/status",
                "services",
                "services/status",
                "serviceaccounts",
                "events",
                "limitranges",
                "resourcequotas",
                "resourcequotas/status",
                "bindings",
                "podtemplates",
            ],
        ),
        (
            &["apps"],
            &[
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
                "daemonsets",
                "daemonsets/status",
                "controllerrevisions",
            ],
        ),
        (&["batch"], &["jobs", "jobs/status", "cronjobs", "cronjobs/status"]),
        (&["autoscaling"], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
        (&["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"]),
        (&["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"]),
        (&["discovery.k8s.io"], &["endpointslices"]),
        (&["events.k8s.io"], &["events"]),
    ]
}

fn view_rules() -> Vec<Value> {
    let mut rules: Vec<Value> = workload_resources().into_iter().map(|(g, r)| rule(g, r, READ)).collect();
    rules.push(rule(&[""], &["namespaces", "namespaces/status"], READ));
    // Aggregated from system:aggregated-metrics-reader upstream.
    rules.push(rule(&["metrics.k8s.io"], &["pods", "nodes"], READ));
    rules
}

fn edit_rules() -> Vec<Value> {
    let mut rules = view_rules();
    for (g, r) in workload_resources() {
        let writable: Vec<&str> =
            r.iter().copied().filter(|x| !x.ends_with("/status") && *x != "pods/log" && *x != "bindings").collect();
        rules.push(rule(g, &writable, WRITE));
    }
    rules.push(rule(
        &[""],
        &["secrets"],
        &["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"],
    ));
    rules.push(rule(
        &[""],
        &["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "services/proxy"],
        &["create", "get"],
    ));
    rules.push(rule(&[""], &["pods/eviction", "serviceaccounts/token"], &["create"]));
    rules.push(rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"],
    ));
    rules
}

fn admin_rules() -> Vec<Value> {
    let mut rules = edit_rules();
    rules.push(rule(
        &["rbac.authorization.k8s.io"],
        &["roles", "rolebindings"],
        &["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"],
    ));
    rules.push(rule(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]));
    rules
}

fn cluster_role(name: &str, rules: Vec<Value>, bootstrap: bool) -> Value {
    let mut labels = json!({});
    if bootstrap {
        labels["kubernetes.io/bootstrapping"] = json!("rbac-defaults");
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name, "uid": meta::new_uid(), "creationTimestamp": meta::now_rfc3339(),
            "labels": labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    })
}

/// metrics-server's role, aggregated into view, edit and admin (whose
/// rules here already hold it: there is no aggregation controller).
fn aggregated_metrics_reader() -> Value {
    let mut role = cluster_role(
        "system:aggregated-metrics-reader",
        vec![rule(&["metrics.k8s.io"], &["pods", "nodes"], &["get", "list", "watch"])],
        false,
    );
    role["metadata"]["labels"] = json!({
        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
        "rbac.authorization.k8s.io/aggregate-to-edit": "true",
        "rbac.authorization.k8s.io/aggregate-to-view": "true",
    });
    role
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> =
        groups.iter().map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g})).collect();
    binding_to(name, role, subjects)
}

fn user_binding(name: &str, role: &str, user: &str) -> Value {
    binding_to(name, role, vec![json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user})])
}

pub(super) fn binding_to(name: &str, role: &str, subjects: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name, "uid": meta::new_uid(), "creationTimestamp": meta::now_rfc3339(),
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

/// Creates what is missing; refreshes rules of roles still marked autoupdate.
async fn reconcile(storage: &Storage, key: &str, obj: Value, field: &str) -> ApiResult<()> {
    match storage.get(key).await? {
        None => match storage.create(key, &obj).await {
            Ok(_) | Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(()),
            Err(WriteError::Api(e)) => Err(e),
        },
        Some(current) => {
            let auto = current
                .object
                .pointer("/metadata/annotations/rbac.authorization.kubernetes.io~1autoupdate")
                .and_then(Value::as_str)
                != Some("false");
            if !auto || current.object.get(field) == obj.get(field) {
                return Ok(());
            }
            let mut updated = current.object.clone();
            updated[field] = obj[field].clone();
            match storage.update(key, &updated, current.rev).await {
                Ok(_) | Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(()),
                Err(WriteError::Api(e)) => Err(e),
            }
        }
    }
}

pub async fn run(storage: &Storage) -> ApiResult<()> {
    let all = vec![
        json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
        json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
    ];
    let roles = vec![
        cluster_role("cluster-admin", all, true),
        cluster_role("admin", admin_rules(), false),
        cluster_role("edit", edit_rules(), false),
        cluster_role("view", view_rules(), false),
        aggregated_metrics_reader(),
        cluster_role(
            "system:discovery",
            vec![
                json!({"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}),
            ],
            true,
        ),
        cluster_role(
            "system:public-info-viewer",
            vec![
                json!({"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}),
            ],
            true,
        ),
        cluster_role(
            "system:monitoring",
            vec![
                json!({"nonResourceURLs": ["/healthz", "/healthz/*", "/livez", "/livez/*", "/metrics", "/metrics/slis", "/readyz", "/readyz/*"], "verbs": ["get"]}),
            ],
            true,
        ),
        cluster_role(
            "system:node-bootstrapper",
            vec![rule(&["certificates.k8s.io"], &["certificatesigningrequests"], &["create", "get", "list", "watch"])],
            true,
        ),
        // What the API server may do on kubelets (logs, exec, port-forward, stats).
        cluster_role(
            "system:kubelet-api-admin",
            vec![
                rule(&[""], &["nodes"], &["get", "list", "watch", "proxy"]),
                rule(&[""], &["nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log"], &["*"]),
            ],
            true,
        ),
        cluster_role(
            "system:basic-user",
            vec![
                rule(&["authorization.k8s.io"], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"], &["create"]),
                rule(&["authentication.k8s.io"], &["selfsubjectreviews"], &["create"]),
            ],
            true,
        ),
    ];
    let roles = roles.into_iter().chain([
        // Upstream's role of every kubelet, left unbound as upstream leaves
        // it: the Node authorizer grants these rules, narrowed per node.
        cluster_role("system:node", super::node_authorizer::node_rules().to_vec(), true),
        cluster_role("system:ferrok:node", super::component_roles::ferrok_node(), true),
        cluster_role("system:kube-scheduler", super::component_roles::kube_scheduler(), true),
        cluster_role("system:volume-scheduler", super::component_roles::volume_scheduler(), true),
        cluster_role("system:kube-controller-manager", super::component_roles::kube_controller_manager(), true),
    ]);
    let controllers = super::controller_roles::roles();
    let roles = roles.chain(
        controllers.iter().map(|(name, rules)| cluster_role(&format!("system:controller:{name}"), rules.clone(), true)),
    );
    for r in roles {
        let key = format!("/registry/rbac.authorization.k8s.io/clusterroles/{}", meta::name_of(&r));
        reconcile(storage, &key, r, "rules").await?;
    }
    let bindings = vec![
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding("system:discovery", "system:discovery", &["system:authenticated"]),
        binding("system:basic-user", "system:basic-user", &["system:authenticated"]),
        binding("system:monitoring", "system:monitoring", &["system:monitoring"]),
        binding("system:node-bootstrapper", "system:node-bootstrapper", &["system:bootstrappers"]),
        binding("system:ferrok:node", "system:ferrok:node", &[super::node_authorizer::NODES_GROUP]),
        user_binding("system:kube-scheduler", "system:kube-scheduler", "system:kube-scheduler"),
        // k3s' name for the same binding.
        user_binding("kube-apiserver-kubelet-admin", "system:kubelet-api-admin", crate::pki::KUBE_APISERVER_USER),
        user_binding("system:volume-scheduler", "system:volume-scheduler", "system:kube-scheduler"),
        user_binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            "system:kube-controller-manager",
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ];
    let bindings =
        bindings.into_iter().chain(controllers.iter().map(|(name, _)| super::controller_roles::binding(name)));
    for b in bindings {
        let key = format!("/registry/rbac.authorization.k8s.io/clusterrolebindings/{}", meta::name_of(&b));
        reconcile(storage, &key, b, "subjects").await?;
    }
    // The service accounts the controllers act as, in kube-system (made by
    // the API server's bootstrap before this runs).
    for name in super::controller_roles::CONTROLLERS {
        let key = format!("/registry/serviceaccounts/kube-system/{name}");
        match storage.create(&key, &super::controller_roles::service_account_object(name)).await {
            Ok(_) | Err(WriteError::Exists) | Err(WriteError::Changed(_)) => {}
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Ok(())
}
