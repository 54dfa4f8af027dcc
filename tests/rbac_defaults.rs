//! The default RBAC policy: upstream v1.33's bootstrap ClusterRoles,
//! ClusterRoleBindings, Roles and RoleBindings (and ferrok's few own), kept
//! at every start as upstream's reconciler keeps them; ClusterRole
//! aggregation (admin, edit and view, and any ClusterRole with an
//! aggregationRule); and the `extension-apiserver-authentication`
//! ConfigMap that aggregated API servers read.

mod common;

use std::collections::BTreeSet;

use common::{apply, eventually, kubectl, ApiServer};
use serde_json::Value;

/// Upstream v1.33's default ClusterRoles (policy.go and controller_policy.go).
const UPSTREAM_CLUSTER_ROLES: &[&str] = &[
    "admin",
    "cluster-admin",
    "edit",
    "view",
    "system:aggregate-to-admin",
    "system:aggregate-to-edit",
    "system:aggregate-to-view",
    "system:auth-delegator",
    "system:basic-user",
    "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
    "system:certificates.k8s.io:kube-apiserver-client-approver",
    "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver",
    "system:certificates.k8s.io:kubelet-serving-approver",
    "system:certificates.k8s.io:legacy-unknown-approver",
    "system:discovery",
    "system:heapster",
    "system:kube-aggregator",
    "system:kube-controller-manager",
    "system:kube-dns",
    "system:kube-scheduler",
    "system:kubelet-api-admin",
    "system:monitoring",
    "system:node",
    "system:node-bootstrapper",
    "system:node-problem-detector",
    "system:node-proxier",
    "system:persistent-volume-provisioner",
    "system:public-info-viewer",
    "system:service-account-issuer-discovery",
    "system:volume-scheduler",
];

/// Upstream v1.33's controller roles, each `system:controller:<name>` and
/// bound by a ClusterRoleBinding of that name to `kube-system/<name>`.
const UPSTREAM_CONTROLLERS: &[&str] = &[
    "attachdetach-controller",
    "certificate-controller",
    "clusterrole-aggregation-controller",
    "cronjob-controller",
    "daemon-set-controller",
    "deployment-controller",
    "disruption-controller",
    "endpoint-controller",
    "endpointslice-controller",
    "endpointslicemirroring-controller",
    "ephemeral-volume-controller",
    "expand-controller",
    "generic-garbage-collector",
    "horizontal-pod-autoscaler",
    "job-controller",
    "legacy-service-account-token-cleaner",
    "namespace-controller",
    "node-controller",
    "persistent-volume-binder",
    "pod-garbage-collector",
    "pv-protection-controller",
    "pvc-protection-controller",
    "replicaset-controller",
    "replication-controller",
    "resourcequota-controller",
    "root-ca-cert-publisher",
    "route-controller",
    "selinux-warning-controller",
    "service-account-controller",
    "service-cidrs-controller",
    "service-controller",
    "statefulset-controller",
    "ttl-after-finished-controller",
    "ttl-controller",
    "validatingadmissionpolicy-status-controller",
];

const UPSTREAM_CLUSTER_ROLE_BINDINGS: &[&str] = &[
    "cluster-admin",
    "system:basic-user",
    "system:discovery",
    "system:kube-controller-manager",
    "system:kube-dns",
    "system:kube-scheduler",
    "system:monitoring",
    "system:node",
    "system:node-proxier",
    "system:public-info-viewer",
    "system:service-account-issuer-discovery",
    "system:volume-scheduler",
];

/// ferrok's own, beyond upstream's.
const FERROK_CLUSTER_ROLES: &[&str] = &["system:aggregated-metrics-reader", "system:ferrok:node"];
const FERROK_CLUSTER_ROLE_BINDINGS: &[&str] =
    &["kube-apiserver-kubelet-admin", "system:ferrok:node", "system:node-bootstrapper"];

/// Upstream's Roles and RoleBindings, as `namespace/name`.
const UPSTREAM_ROLES: &[&str] = &[
    "kube-public/system:controller:bootstrap-signer",
    "kube-system/extension-apiserver-authentication-reader",
    "kube-system/system::leader-locking-kube-controller-manager",
    "kube-system/system::leader-locking-kube-scheduler",
    "kube-system/system:controller:bootstrap-signer",
    "kube-system/system:controller:cloud-provider",
    "kube-system/system:controller:token-cleaner",
];
const UPSTREAM_ROLE_BINDINGS: &[&str] = &[
    "kube-public/system:controller:bootstrap-signer",
    "kube-system/system::extension-apiserver-authentication-reader",
    "kube-system/system::leader-locking-kube-controller-manager",
    "kube-system/system::leader-locking-kube-scheduler",
    "kube-system/system:controller:bootstrap-signer",
    "kube-system/system:controller:cloud-provider",
    "kube-system/system:controller:token-cleaner",
];

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

fn get_json(s: &ApiServer, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let (ok, out) = kubectl(s, &all);
    assert!(ok, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The `namespace/name` (or name) of each item of a list.
fn names(list: &Value) -> BTreeSet<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| match o["metadata"]["namespace"].as_str() {
            Some(ns) => format!("{ns}/{}", o["metadata"]["name"].as_str().unwrap_or_default()),
            None => o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

/// `kubectl auth can-i <args>` as the admin asks it for someone else.
fn can_i(s: &ApiServer, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    let (_, out) = kubectl(s, &all);
    out.lines().any(|l| l.trim() == "yes")
}

#[test]
fn a_binding_to_auth_delegator_grants_token_and_access_reviews() {
    let s = ApiServer::start();
    for resource in ["tokenreviews.authentication.k8s.io", "subjectaccessreviews.authorization.k8s.io"] {
        assert!(!can_i(&s, &["create", resource, "--as=proxy"]), "{resource} before the binding");
    }
    let (ok, out) = kubectl(
        &s,
        &["create", "clusterrolebinding", "proxy-auth", "--clusterrole=system:auth-delegator", "--user=proxy"],
    );
    assert!(ok, "{out}");
    for resource in ["tokenreviews.authentication.k8s.io", "subjectaccessreviews.authorization.k8s.io"] {
        eventually(&format!("proxy may create {resource}"), || can_i(&s, &["create", resource, "--as=proxy"]));
    }
    // And nothing more.
    assert!(!can_i(&s, &["get", "pods", "--as=proxy"]));
}

#[test]
fn a_role_labelled_aggregate_to_edit_extends_edit_and_admin_until_the_label_goes() {
    let s = ApiServer::start();
    for (user, role) in [("bob", "edit"), ("carol", "admin"), ("vic", "view")] {
        let (ok, out) =
            kubectl(&s, &["create", "rolebinding", user, &format!("--clusterrole={role}"), &format!("--user={user}")]);
        assert!(ok, "{out}");
    }
    // The default rules hold from the start: edit writes deployments, view
    // only reads them, admin writes roles.
    eventually("edit's and admin's defaults", || {
        can_i(&s, &["create", "deployments.apps", "--as=bob"])
            && can_i(&s, &["create", "roles.rbac.authorization.k8s.io", "--as=carol"])
    });
    assert!(can_i(&s, &["list", "deployments.apps", "--as=vic"]));
    assert!(!can_i(&s, &["create", "deployments.apps", "--as=vic"]));
    assert!(!can_i(&s, &["create", "roles.rbac.authorization.k8s.io", "--as=bob"]));

    // What neither edit nor admin may do: write LimitRanges.
    let limits = ["create", "limitranges"];
    assert!(!can_i(&s, &[limits[0], limits[1], "--as=bob"]));
    assert!(!can_i(&s, &[limits[0], limits[1], "--as=carol"]));
    apply(
        &s,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: limits-edit
  labels:
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
rules:
- apiGroups: [""]
  resources: [limitranges]
  verbs: [create, update, patch, delete]
"#,
    );
    eventually("edit aggregates limits-edit", || can_i(&s, &[limits[0], limits[1], "--as=bob"]));
    // admin picks edit, so it gets the rules too; view does not.
    eventually("admin aggregates edit's new rules", || can_i(&s, &[limits[0], limits[1], "--as=carol"]));
    assert!(!can_i(&s, &[limits[0], limits[1], "--as=vic"]));
    let edit = get_json(&s, &["clusterrole", "edit"]);
    let picked = serde_json::json!({"apiGroups": [""], "resources": ["limitranges"], "verbs": ["create", "update", "patch", "delete"]});
    assert!(edit["rules"].as_array().into_iter().flatten().any(|r| r == &picked), "{edit}");
    assert_eq!(
        edit["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"]
            ["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );

    let (ok, out) =
        kubectl(&s, &["label", "clusterrole", "limits-edit", "rbac.authorization.k8s.io/aggregate-to-edit-"]);
    assert!(ok, "{out}");
    eventually("edit drops limits-edit's rules", || !can_i(&s, &[limits[0], limits[1], "--as=bob"]));
    eventually("admin drops them too", || !can_i(&s, &[limits[0], limits[1], "--as=carol"]));
    assert!(can_i(&s, &["create", "deployments.apps", "--as=bob"]));
}

#[test]
fn a_user_cluster_role_with_an_aggregation_rule_gets_the_selected_rules() {
    let s = ApiServer::start();
    apply(
        &s,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: monitoring
aggregationRule:
  clusterRoleSelectors:
  - matchLabels:
      example.com/aggregate-to-monitoring: "true"
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: monitoring-pods
  labels:
    example.com/aggregate-to-monitoring: "true"
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: monitoring-endpoints
  labels:
    example.com/aggregate-to-monitoring: "true"
rules:
- apiGroups: [""]
  resources: [services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: not-monitoring
rules:
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
"#,
    );
    // The picked roles by name, each rule once: monitoring-endpoints' two,
    // then monitoring-pods' (equal to one already there).
    let want = serde_json::json!([
        {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]);
    eventually("monitoring holds the selected rules", || get_json(&s, &["clusterrole", "monitoring"])["rules"] == want);
    let (ok, out) = kubectl(&s, &["create", "clusterrolebinding", "dave", "--clusterrole=monitoring", "--user=dave"]);
    assert!(ok, "{out}");
    eventually("dave lists services", || can_i(&s, &["list", "services", "--as=dave", "-A"]));
    assert!(!can_i(&s, &["get", "secrets", "--as=dave", "-A"]));
    // A role deleted leaves the aggregate.
    let (ok, out) = kubectl(&s, &["delete", "clusterrole", "monitoring-endpoints"]);
    assert!(ok, "{out}");
    let want = serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]);
    eventually("monitoring keeps monitoring-pods' rule alone", || {
        get_json(&s, &["clusterrole", "monitoring"])["rules"] == want
    });
}

#[test]
fn the_default_roles_and_bindings_are_upstreams_with_its_labels_and_annotations() {
    let s = ApiServer::start();
    let roles = get_json(&s, &["clusterroles"]);
    let bindings = get_json(&s, &["clusterrolebindings"]);
    let controller = |n: &&str| format!("system:controller:{n}");
    let want_roles: BTreeSet<String> = UPSTREAM_CLUSTER_ROLES
        .iter()
        .map(|n| n.to_string())
        .chain(UPSTREAM_CONTROLLERS.iter().map(controller))
        .chain(FERROK_CLUSTER_ROLES.iter().map(|n| n.to_string()))
        .collect();
    let want_bindings: BTreeSet<String> = UPSTREAM_CLUSTER_ROLE_BINDINGS
        .iter()
        .map(|n| n.to_string())
        .chain(UPSTREAM_CONTROLLERS.iter().map(controller))
        .chain(FERROK_CLUSTER_ROLE_BINDINGS.iter().map(|n| n.to_string()))
        .collect();
    assert_eq!(UPSTREAM_CLUSTER_ROLES.len() + UPSTREAM_CONTROLLERS.len(), 66);
    assert_eq!(names(&roles), want_roles);
    assert_eq!(names(&bindings), want_bindings);
    let namespaced = |kind: &str| -> BTreeSet<String> {
        let list = get_json(&s, &[kind, "-A", "-l", "kubernetes.io/bootstrapping=rbac-defaults"]);
        names(&list)
    };
    let strings = |l: &[&str]| l.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(namespaced("roles"), strings(UPSTREAM_ROLES));
    assert_eq!(namespaced("rolebindings"), strings(UPSTREAM_ROLE_BINDINGS));

    // Upstream's labels and annotation on each of upstream's objects.
    for o in roles["items"].as_array().into_iter().flatten().chain(bindings["items"].as_array().into_iter().flatten()) {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        if name == "system:aggregated-metrics-reader" {
            continue;
        }
        assert_eq!(o["metadata"]["labels"]["kubernetes.io/bootstrapping"], "rbac-defaults", "{name}");
        assert_eq!(o["metadata"]["annotations"][AUTOUPDATE], "true", "{name}");
    }
    let find = |name: &str| {
        roles["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    let label =
        |role: &str, key: &str| find(role)["metadata"]["labels"][format!("rbac.authorization.k8s.io/{key}")].clone();
    assert_eq!(label("edit", "aggregate-to-admin"), "true");
    assert_eq!(label("view", "aggregate-to-edit"), "true");
    assert_eq!(label("system:aggregate-to-admin", "aggregate-to-admin"), "true");
    assert_eq!(label("system:aggregate-to-edit", "aggregate-to-edit"), "true");
    assert_eq!(label("system:aggregate-to-view", "aggregate-to-view"), "true");
    for (role, key) in [("admin", "aggregate-to-admin"), ("edit", "aggregate-to-edit"), ("view", "aggregate-to-view")] {
        let selector = &find(role)["aggregationRule"]["clusterRoleSelectors"];
        assert_eq!(
            selector,
            &serde_json::json!([{"matchLabels": {format!("rbac.authorization.k8s.io/{key}"): "true"}}])
        );
        assert!(find(role)["rules"].as_array().is_some_and(|r| !r.is_empty()), "{role} has its aggregated rules");
    }
    // The controllers' bindings name their service accounts.
    let binding = bindings["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["metadata"]["name"] == "system:controller:horizontal-pod-autoscaler")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}])
    );
}

#[test]
fn a_default_role_the_user_changed_is_restored_at_restart_unless_autoupdate_is_false() {
    let s = ApiServer::start();
    // Rules removed from one role, from another marked autoupdate=false; a
    // default binding and the authentication ConfigMap deleted.
    let (ok, out) = kubectl(
        &s,
        &[
            "patch",
            "clusterrole",
            "system:auth-delegator",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/rules/1"}]"#,
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &s,
        &[
            "patch",
            "clusterrole",
            "system:heapster",
            "--type=merge",
            "-p",
            &format!(r#"{{"metadata":{{"annotations":{{"{AUTOUPDATE}":"false"}}}},"rules":[]}}"#),
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&s, &["delete", "clusterrolebinding", "system:kube-dns"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&s, &["-n", "kube-system", "delete", "configmap", "extension-apiserver-authentication"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &s,
        &["create", "clusterrolebinding", "proxy-auth", "--clusterrole=system:auth-delegator", "--user=proxy"],
    );
    assert!(ok, "{out}");
    eventually("the binding counts", || can_i(&s, &["create", "tokenreviews.authentication.k8s.io", "--as=proxy"]));
    assert!(!can_i(&s, &["create", "subjectaccessreviews.authorization.k8s.io", "--as=proxy"]));

    let (dir, port) = s.stop();
    let s = ApiServer::start_in(dir, port);
    eventually("auth-delegator's rule is back", || {
        can_i(&s, &["create", "subjectaccessreviews.authorization.k8s.io", "--as=proxy"])
    });
    let heapster = get_json(&s, &["clusterrole", "system:heapster"]);
    assert!(heapster["rules"].as_array().is_none_or(Vec::is_empty), "{heapster}");
    assert_eq!(heapster["metadata"]["annotations"][AUTOUPDATE], "false");
    let dns = get_json(&s, &["clusterrolebinding", "system:kube-dns"]);
    assert_eq!(dns["subjects"][0]["name"], "kube-dns");
    let cm = get_json(&s, &["-n", "kube-system", "configmap", "extension-apiserver-authentication"]);
    assert!(cm["data"]["client-ca-file"].as_str().is_some_and(|c| c.contains("BEGIN CERTIFICATE")), "{cm}");
}

/// The certificates of a PEM bundle, as their base64 bodies.
fn certificate_bodies(pem: &str) -> Vec<String> {
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .filter_map(|b| b.split("-----END CERTIFICATE-----").next())
        .map(|b| b.split_whitespace().collect())
        .collect()
}

#[test]
fn extension_apiserver_authentication_holds_the_client_ca_and_its_readers_may_read_it() {
    let s = ApiServer::start();
    let cm = get_json(&s, &["-n", "kube-system", "configmap", "extension-apiserver-authentication"]);
    let data = cm["data"].as_object().cloned().unwrap_or_default();
    // The client CA, and the front proxy's request-header CA with its headers.
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        vec![
            "client-ca-file",
            "requestheader-allowed-names",
            "requestheader-client-ca-file",
            "requestheader-extra-headers-prefix",
            "requestheader-group-headers",
            "requestheader-uid-headers",
            "requestheader-username-headers"
        ],
        "{cm}"
    );
    let request_header_ca = std::fs::read_to_string(s.dir.path().join("server/tls/request-header-ca.crt")).expect("CA");
    assert_eq!(
        certificate_bodies(data["requestheader-client-ca-file"].as_str().unwrap_or_default()),
        certificate_bodies(&request_header_ca)
    );
    let client_ca = std::fs::read_to_string(s.dir.path().join("server/tls/client-ca.crt")).expect("client CA");
    assert_eq!(certificate_bodies(data["client-ca-file"].as_str().unwrap_or_default()), certificate_bodies(&client_ca),);

    let role = get_json(&s, &["-n", "kube-system", "role", "extension-apiserver-authentication-reader"]);
    assert_eq!(role["rules"][0]["resourceNames"], serde_json::json!(["extension-apiserver-authentication"]));
    let binding =
        get_json(&s, &["-n", "kube-system", "rolebinding", "system::extension-apiserver-authentication-reader"]);
    assert_eq!(binding["roleRef"]["name"], "extension-apiserver-authentication-reader");
    let cm_ref = "configmaps/extension-apiserver-authentication";
    for user in ["system:kube-controller-manager", "system:kube-scheduler"] {
        assert!(can_i(&s, &["get", cm_ref, "-n", "kube-system", &format!("--as={user}")]), "{user}");
    }
    // An aggregated API server's account, bound to the reader role as its
    // installation does.
    let sa = "--as=system:serviceaccount:metrics:server";
    assert!(!can_i(&s, &["get", cm_ref, "-n", "kube-system", sa]));
    let (ok, out) = kubectl(
        &s,
        &[
            "-n",
            "kube-system",
            "create",
            "rolebinding",
            "metrics-server-auth-reader",
            "--role=extension-apiserver-authentication-reader",
            "--serviceaccount=metrics:server",
        ],
    );
    assert!(ok, "{out}");
    eventually("the aggregated server may read the ConfigMap", || can_i(&s, &["get", cm_ref, "-n", "kube-system", sa]));
    assert!(!can_i(&s, &["get", "configmaps/other", "-n", "kube-system", sa]));
}
