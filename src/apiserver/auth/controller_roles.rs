//! The roles of the controllers that run under their own service accounts
//! in kube-system (upstream's `--use-service-account-credentials` and its
//! `controller_policy.go`): `system:controller:<name>`, bound to the
//! service account `<name>`, for every controller of upstream v1.33's
//! default policy (with its default feature gates), whether or not ferrok
//! runs it. The rules are upstream's; where a ferrok controller writes
//! differently (a merge patch where upstream sends an update), the rule it
//! needs is added beside, with the reason.

use serde_json::{json, Value};

use super::rbac::rule;

const READ: &[&str] = &["get", "list", "watch"];
const CORE: &[&str] = &[""];
const APPS: &[&str] = &["apps"];
const APPS_EXT: &[&str] = &["apps", "extensions"];
const BATCH: &[&str] = &["batch"];
const CERTIFICATES: &[&str] = &["certificates.k8s.io"];
const STORAGE: &[&str] = &["storage.k8s.io"];
const NETWORKING: &[&str] = &["networking.k8s.io"];

/// Every `system:controller:<name>` role of upstream v1.33's default
/// policy, by controller name, in upstream's order (its feature-gated
/// roles only where the gate is on by default in v1.33:
/// `service-cidrs-controller` and `selinux-warning-controller`).
pub const ROLES: &[&str] = &[
    "attachdetach-controller",
    "clusterrole-aggregation-controller",
    "cronjob-controller",
    "daemon-set-controller",
    "deployment-controller",
    "disruption-controller",
    "endpoint-controller",
    "endpointslice-controller",
    "endpointslicemirroring-controller",
    "expand-controller",
    "ephemeral-volume-controller",
    "generic-garbage-collector",
    "horizontal-pod-autoscaler",
    "job-controller",
    "namespace-controller",
    "node-controller",
    "persistent-volume-binder",
    "pod-garbage-collector",
    "replicaset-controller",
    "replication-controller",
    "resourcequota-controller",
    "route-controller",
    "service-account-controller",
    "service-controller",
    "service-cidrs-controller",
    "statefulset-controller",
    "ttl-controller",
    "certificate-controller",
    "pvc-protection-controller",
    "pv-protection-controller",
    "ttl-after-finished-controller",
    "root-ca-cert-publisher",
    "validatingadmissionpolicy-status-controller",
    "legacy-service-account-token-cleaner",
    "selinux-warning-controller",
];

/// The service account every ferrok controller runs as, upstream's name
/// (created in kube-system at start, as upstream's controller manager
/// creates the accounts of the controllers it runs). Node IPAM, node
/// lifecycle and taint eviction all act as `node-controller`, as they do
/// upstream.
pub const CONTROLLERS: &[&str] = &[
    "bootstrap-signer",
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
    "service-account-controller",
    "service-cidrs-controller",
    "service-controller",
    "statefulset-controller",
    "token-cleaner",
    "ttl-after-finished-controller",
    "ttl-controller",
];

/// What every controller needs to record Events.
fn with_events(mut rules: Vec<Value>) -> Vec<Value> {
    rules.push(rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]));
    rules
}

/// ferrok's controllers write status with a merge patch of `status` alone
/// where upstream's send an update of the whole object; the patch is the
/// same change, so each is granted `patch` beside upstream's `update`.
fn status_patch(groups: &[&str], resource: &str) -> Value {
    rule(groups, &[&format!("{resource}/status")], &["patch"])
}

fn cronjob() -> Vec<Value> {
    with_events(vec![
        rule(BATCH, &["cronjobs"], &["get", "list", "watch", "update"]),
        rule(BATCH, &["jobs"], &["get", "list", "watch", "create", "update", "delete", "patch"]),
        rule(BATCH, &["cronjobs/status"], &["update"]),
        rule(BATCH, &["cronjobs/finalizers"], &["update"]),
        rule(CORE, &["pods"], &["list", "watch", "delete"]),
        status_patch(BATCH, "cronjobs"),
    ])
}

fn daemonset() -> Vec<Value> {
    with_events(vec![
        rule(APPS_EXT, &["daemonsets"], READ),
        rule(APPS_EXT, &["daemonsets/status"], &["update"]),
        rule(APPS_EXT, &["daemonsets/finalizers"], &["update"]),
        rule(CORE, &["nodes"], &["list", "watch"]),
        rule(CORE, &["pods"], &["list", "watch", "create", "delete", "patch"]),
        rule(CORE, &["pods/binding"], &["create"]),
        rule(APPS, &["controllerrevisions"], &["get", "list", "watch", "create", "delete", "update", "patch"]),
        status_patch(APPS, "daemonsets"),
    ])
}

fn deployment() -> Vec<Value> {
    with_events(vec![
        rule(APPS_EXT, &["deployments"], &["get", "list", "watch", "update"]),
        rule(APPS_EXT, &["deployments/status"], &["update"]),
        rule(APPS_EXT, &["deployments/finalizers"], &["update"]),
        rule(APPS_EXT, &["replicasets"], &["get", "list", "watch", "create", "update", "patch", "delete"]),
        rule(CORE, &["pods"], &["get", "list", "watch", "update"]),
        // Upstream writes the revision annotation through the status
        // subresource; ferrok's status subresource keeps metadata as it
        // was, so the annotation goes as a metadata-only patch.
        rule(APPS, &["deployments"], &["patch"]),
    ])
}

fn disruption() -> Vec<Value> {
    with_events(vec![
        rule(APPS_EXT, &["deployments"], READ),
        rule(APPS_EXT, &["replicasets"], READ),
        rule(CORE, &["replicationcontrollers"], READ),
        rule(&["policy"], &["poddisruptionbudgets"], READ),
        rule(APPS, &["statefulsets"], READ),
        rule(&["policy"], &["poddisruptionbudgets/status"], &["update"]),
        rule(CORE, &["pods/status"], &["patch", "update"]),
        rule(&["*"], &["*/scale"], &["get"]),
    ])
}

fn endpoint() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["services", "pods"], READ),
        rule(CORE, &["endpoints"], &["get", "list", "watch", "create", "update", "delete"]),
        rule(CORE, &["endpoints/restricted"], &["create"]),
    ])
}

fn endpointslice() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["services", "pods", "nodes"], READ),
        rule(CORE, &["services/finalizers"], &["update"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["get", "list", "watch", "create", "update", "delete"]),
    ])
}

fn garbage_collector() -> Vec<Value> {
    with_events(vec![rule(&["*"], &["*"], &["get", "list", "watch", "patch", "update", "delete"])])
}

fn job() -> Vec<Value> {
    with_events(vec![
        rule(BATCH, &["jobs"], &["get", "list", "watch", "update", "patch"]),
        rule(BATCH, &["jobs/status"], &["update"]),
        rule(BATCH, &["jobs/finalizers"], &["update"]),
        rule(CORE, &["pods"], &["list", "watch", "create", "delete", "patch"]),
        status_patch(BATCH, "jobs"),
    ])
}

/// Upstream's namespace-controller role records no Events.
fn namespace() -> Vec<Value> {
    vec![
        rule(CORE, &["namespaces"], &["get", "list", "watch", "delete"]),
        rule(CORE, &["namespaces/finalize", "namespaces/status"], &["update"]),
        rule(&["*"], &["*"], &["get", "list", "watch", "delete", "deletecollection"]),
    ]
}

fn node() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["nodes"], &["get", "list", "watch", "update", "delete", "patch"]),
        rule(CORE, &["nodes/status"], &["patch", "update"]),
        rule(CORE, &["pods/status"], &["patch", "update"]),
        rule(CORE, &["pods"], &["list", "watch", "get", "delete"]),
    ])
}

fn persistent_volume_binder() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["persistentvolumes"], &["get", "list", "watch", "update", "create", "delete"]),
        rule(CORE, &["persistentvolumes/status"], &["update"]),
        rule(CORE, &["persistentvolumeclaims"], &["get", "list", "watch", "update"]),
        rule(CORE, &["persistentvolumeclaims/status"], &["update"]),
        rule(CORE, &["pods"], &["list", "watch", "get", "create", "delete"]),
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        rule(CORE, &["nodes"], &["list", "watch"]),
        rule(CORE, &["events"], &["watch"]),
        rule(CORE, &["services"], &["get"]),
        // ferrok binds a claim and its volume with merge patches of the
        // fields it sets (upstream updates the whole objects).
        rule(CORE, &["persistentvolumes", "persistentvolumeclaims"], &["patch"]),
        rule(CORE, &["persistentvolumes/status", "persistentvolumeclaims/status"], &["patch"]),
    ])
}

fn replicaset() -> Vec<Value> {
    with_events(vec![
        rule(APPS_EXT, &["replicasets"], &["get", "list", "watch", "update"]),
        rule(APPS_EXT, &["replicasets/status"], &["update"]),
        rule(APPS_EXT, &["replicasets/finalizers"], &["update"]),
        rule(CORE, &["pods"], &["list", "watch", "patch", "create", "delete"]),
    ])
}

fn resourcequota() -> Vec<Value> {
    with_events(vec![rule(&["*"], &["*"], &["list", "watch"]), rule(CORE, &["resourcequotas/status"], &["update"])])
}

fn root_ca_cert_publisher() -> Vec<Value> {
    with_events(vec![rule(CORE, &["configmaps"], &["create", "update"])])
}

fn service_account() -> Vec<Value> {
    with_events(vec![rule(CORE, &["serviceaccounts"], &["create"])])
}

fn statefulset() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["pods"], &["list", "watch"]),
        rule(APPS, &["statefulsets"], READ),
        rule(APPS, &["statefulsets/status"], &["update"]),
        rule(APPS, &["statefulsets/finalizers"], &["update"]),
        rule(CORE, &["pods"], &["get", "create", "delete", "update", "patch"]),
        rule(APPS, &["controllerrevisions"], &["get", "create", "delete", "update", "patch", "list", "watch"]),
        rule(CORE, &["persistentvolumeclaims"], &["get", "create", "list", "watch"]),
        rule(CORE, &["persistentvolumeclaims"], &["update", "delete"]),
        rule(CORE, &["pods/finalizers"], &["update"]),
        status_patch(APPS, "statefulsets"),
        // ferrok adds the set's owner reference to a retained claim with a
        // merge patch (upstream updates the claim).
        rule(CORE, &["persistentvolumeclaims"], &["patch"]),
    ])
}

/// Upstream's cloud-controller-manager role of the same name, which
/// ferrok's ServiceLB runs as; it reads EndpointSlices as well, for
/// `externalTrafficPolicy: Local`.
fn service() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["services"], &["get", "list", "watch", "patch", "update"]),
        rule(CORE, &["services/status"], &["patch", "update"]),
        rule(CORE, &["nodes"], &["get", "list", "watch"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
    ])
}

fn ttl_after_finished() -> Vec<Value> {
    with_events(vec![rule(BATCH, &["jobs"], &["get", "list", "watch", "delete"])])
}

/// Upstream's events rule, where upstream places it among a role's rules.
fn events() -> Value {
    rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"])
}

fn named(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "resourceNames": names, "verbs": verbs})
}

fn attach_detach() -> Vec<Value> {
    vec![
        rule(CORE, &["persistentvolumeclaims", "persistentvolumes"], &["list", "watch"]),
        rule(CORE, &["nodes"], READ),
        rule(CORE, &["nodes/status"], &["patch", "update"]),
        rule(CORE, &["pods"], &["list", "watch"]),
        events(),
        rule(STORAGE, &["volumeattachments"], &["create", "delete", "get", "list", "watch"]),
        rule(STORAGE, &["csidrivers"], READ),
        rule(STORAGE, &["csinodes"], READ),
    ]
}

/// Full rights on ClusterRoles (`escalate` included), to write any
/// aggregated rules; records no Events.
fn clusterrole_aggregation() -> Vec<Value> {
    vec![rule(
        &["rbac.authorization.k8s.io"],
        &["clusterroles"],
        &["escalate", "get", "list", "patch", "update", "watch"],
    )]
}

fn endpointslice_mirroring() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["endpoints", "services"], READ),
        rule(CORE, &["services/finalizers"], &["update"]),
        rule(CORE, &["endpoints/finalizers"], &["update"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["create", "delete", "get", "list", "update", "watch"]),
    ])
}

fn expand() -> Vec<Value> {
    vec![
        rule(CORE, &["persistentvolumes"], &["get", "list", "patch", "update", "watch"]),
        rule(CORE, &["persistentvolumeclaims/status"], &["patch", "update"]),
        rule(CORE, &["persistentvolumeclaims"], READ),
        events(),
        rule(CORE, &["services"], &["get"]),
    ]
}

fn ephemeral_volume() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["pods"], READ),
        rule(CORE, &["pods/finalizers"], &["update"]),
        rule(CORE, &["persistentvolumeclaims"], &["create", "get", "list", "watch"]),
    ])
}

fn horizontal_pod_autoscaler() -> Vec<Value> {
    with_events(vec![
        rule(&["autoscaling"], &["horizontalpodautoscalers"], READ),
        rule(&["autoscaling"], &["horizontalpodautoscalers/status"], &["update"]),
        rule(&["*"], &["*/scale"], &["get", "update"]),
        rule(CORE, &["pods"], &["list", "watch"]),
        rule(&["metrics.k8s.io"], &["pods"], &["list", "watch"]),
        rule(&["custom.metrics.k8s.io"], &["*"], READ),
        rule(&["external.metrics.k8s.io"], &["*"], READ),
    ])
}

/// Upstream's pod garbage collector records no Events.
fn pod_garbage_collector() -> Vec<Value> {
    vec![
        rule(CORE, &["pods"], &["delete", "list", "watch"]),
        rule(CORE, &["nodes"], READ),
        rule(CORE, &["pods/status"], &["patch"]),
    ]
}

fn replication() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["replicationcontrollers"], &["get", "list", "update", "watch"]),
        rule(CORE, &["replicationcontrollers/status"], &["update"]),
        rule(CORE, &["replicationcontrollers/finalizers"], &["update"]),
        rule(CORE, &["pods"], &["create", "delete", "list", "patch", "watch"]),
    ])
}

fn route() -> Vec<Value> {
    with_events(vec![rule(CORE, &["nodes"], &["list", "watch"]), rule(CORE, &["nodes/status"], &["patch"])])
}

fn service_cidrs() -> Vec<Value> {
    with_events(vec![
        rule(NETWORKING, &["servicecidrs"], &["get", "list", "patch", "update", "watch"]),
        rule(NETWORKING, &["servicecidrs/finalizers"], &["patch", "update"]),
        rule(NETWORKING, &["servicecidrs/status"], &["patch", "update"]),
        rule(NETWORKING, &["ipaddresses"], READ),
    ])
}

fn ttl() -> Vec<Value> {
    with_events(vec![rule(CORE, &["nodes"], &["list", "patch", "update", "watch"])])
}

fn certificate() -> Vec<Value> {
    with_events(vec![
        rule(CERTIFICATES, &["certificatesigningrequests"], &["delete", "get", "list", "watch"]),
        rule(CERTIFICATES, &["certificatesigningrequests/approval", "certificatesigningrequests/status"], &["update"]),
        named(CERTIFICATES, &["signers"], &["kubernetes.io/kube-apiserver-client-kubelet"], &["approve"]),
        named(
            CERTIFICATES,
            &["signers"],
            &[
                "kubernetes.io/kube-apiserver-client",
                "kubernetes.io/kube-apiserver-client-kubelet",
                "kubernetes.io/kubelet-serving",
                "kubernetes.io/legacy-unknown",
            ],
            &["sign"],
        ),
        rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
    ])
}

fn pvc_protection() -> Vec<Value> {
    with_events(vec![
        rule(CORE, &["persistentvolumeclaims"], &["get", "list", "update", "watch"]),
        rule(CORE, &["pods"], READ),
    ])
}

fn pv_protection() -> Vec<Value> {
    with_events(vec![rule(CORE, &["persistentvolumes"], &["get", "list", "update", "watch"])])
}

fn validating_admission_policy_status() -> Vec<Value> {
    let group = &["admissionregistration.k8s.io"];
    with_events(vec![
        rule(group, &["validatingadmissionpolicies"], READ),
        rule(group, &["validatingadmissionpolicies/status"], &["get", "patch", "update"]),
    ])
}

/// Records no Events; reads only the tracking ConfigMap by name.
fn legacy_service_account_token_cleaner() -> Vec<Value> {
    vec![
        named(CORE, &["configmaps"], &["kube-apiserver-legacy-service-account-token-tracking"], &["get"]),
        rule(CORE, &["secrets"], &["delete", "patch"]),
    ]
}

fn selinux_warning() -> Vec<Value> {
    vec![
        events(),
        rule(CORE, &["persistentvolumes"], READ),
        rule(CORE, &["persistentvolumeclaims"], READ),
        rule(CORE, &["pods"], READ),
        rule(STORAGE, &["csidrivers"], READ),
    ]
}

/// `system:controller:<name>` and its rules, for every name of `ROLES`.
pub fn roles() -> Vec<(&'static str, Vec<Value>)> {
    ROLES
        .iter()
        .map(|&name| {
            let rules = match name {
                "attachdetach-controller" => attach_detach(),
                "clusterrole-aggregation-controller" => clusterrole_aggregation(),
                "endpointslicemirroring-controller" => endpointslice_mirroring(),
                "expand-controller" => expand(),
                "ephemeral-volume-controller" => ephemeral_volume(),
                "horizontal-pod-autoscaler" => horizontal_pod_autoscaler(),
                "pod-garbage-collector" => pod_garbage_collector(),
                "replication-controller" => replication(),
                "route-controller" => route(),
                "service-cidrs-controller" => service_cidrs(),
                "ttl-controller" => ttl(),
                "certificate-controller" => certificate(),
                "pvc-protection-controller" => pvc_protection(),
                "pv-protection-controller" => pv_protection(),
                "validatingadmissionpolicy-status-controller" => validating_admission_policy_status(),
                "legacy-service-account-token-cleaner" => legacy_service_account_token_cleaner(),
                "selinux-warning-controller" => selinux_warning(),
                "cronjob-controller" => cronjob(),
                "daemon-set-controller" => daemonset(),
                "deployment-controller" => deployment(),
                "disruption-controller" => disruption(),
                "endpoint-controller" => endpoint(),
                "endpointslice-controller" => endpointslice(),
                "generic-garbage-collector" => garbage_collector(),
                "job-controller" => job(),
                "namespace-controller" => namespace(),
                "node-controller" => node(),
                "persistent-volume-binder" => persistent_volume_binder(),
                "replicaset-controller" => replicaset(),
                "resourcequota-controller" => resourcequota(),
                "root-ca-cert-publisher" => root_ca_cert_publisher(),
                "service-account-controller" => service_account(),
                "service-controller" => service(),
                "statefulset-controller" => statefulset(),
                "ttl-after-finished-controller" => ttl_after_finished(),
                _ => Vec::new(),
            };
            (name, rules)
        })
        .collect()
}

/// The ServiceAccount object of a controller, in kube-system. ferrok's
/// controllers act in process and need no token; the object is there so
/// the identity is visible (`kubectl -n kube-system get sa`), as upstream's
/// controller manager creates it when it starts with service account
/// credentials.
pub fn service_account_object(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "uid": crate::apiserver::meta::new_uid(),
            "creationTimestamp": crate::apiserver::meta::now_rfc3339(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_controller_has_rules_and_records_events_where_upstream_does() {
        let silent = [
            "clusterrole-aggregation-controller",
            "legacy-service-account-token-cleaner",
            "namespace-controller",
            "pod-garbage-collector",
        ];
        for (name, rules) in roles() {
            assert!(!rules.is_empty(), "{name} has no rules");
            let events = rules.iter().any(|r| r["resources"] == json!(["events"]) && r["verbs"][0] == "create");
            assert_eq!(events, !silent.contains(&name), "{name}");
        }
    }

    #[test]
    fn every_controller_ferrok_runs_has_an_upstream_role() {
        // The bootstrap signer's and the token cleaner's are Roles of
        // kube-system (and kube-public), not ClusterRoles.
        let namespaced: Vec<String> = super::super::namespace_roles::roles()
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str()?.strip_prefix("system:controller:").map(str::to_string))
            .collect();
        for name in CONTROLLERS {
            assert!(ROLES.contains(name) || namespaced.iter().any(|n| n == name), "{name}");
        }
        assert_eq!(ROLES.len(), 35);
    }

    #[test]
    fn the_service_account_controller_may_only_create_service_accounts() {
        let rules = service_account();
        let sa: Vec<_> = rules.iter().filter(|r| r["resources"] == json!(["serviceaccounts"])).collect();
        assert_eq!(sa.len(), 1);
        assert_eq!(sa[0]["verbs"], json!(["create"]));
    }
}
