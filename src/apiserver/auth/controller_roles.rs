//! The roles of the controllers that run under their own service accounts
//! in kube-system (upstream's `--use-service-account-credentials` and its
//! `controller_policy.go`): `system:controller:<name>`, bound to the
//! service account `<name>`. The rules are upstream's; where a ferrok
//! controller writes differently (a merge patch where upstream sends an
//! update), the rule it needs is added beside, with the reason.

use serde_json::{json, Value};

use super::bootstrap::rule;

const READ: &[&str] = &["get", "list", "watch"];
const CORE: &[&str] = &[""];
const APPS: &[&str] = &["apps"];
const APPS_EXT: &[&str] = &["apps", "extensions"];
const BATCH: &[&str] = &["batch"];

/// The service account every ferrok controller runs as, upstream's name.
/// Node IPAM, node lifecycle and taint eviction all act as
/// `node-controller`, as they do upstream.
pub const CONTROLLERS: &[&str] = &[
    "cronjob-controller",
    "daemon-set-controller",
    "deployment-controller",
    "disruption-controller",
    "endpoint-controller",
    "endpointslice-controller",
    "generic-garbage-collector",
    "job-controller",
    "namespace-controller",
    "node-controller",
    "persistent-volume-binder",
    "replicaset-controller",
    "resourcequota-controller",
    "root-ca-cert-publisher",
    "service-account-controller",
    "service-controller",
    "statefulset-controller",
    "ttl-after-finished-controller",
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

/// `system:controller:<name>` and its rules.
pub fn roles() -> Vec<(&'static str, Vec<Value>)> {
    CONTROLLERS
        .iter()
        .map(|&name| {
            let rules = match name {
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

/// The binding of `system:controller:<name>` to the service account
/// `kube-system/<name>`.
pub fn binding(name: &str) -> Value {
    let full = format!("system:controller:{name}");
    super::bootstrap::binding_to(
        &full,
        &full,
        vec![json!({"kind": "ServiceAccount", "name": name, "namespace": "kube-system"})],
    )
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
        for (name, rules) in roles() {
            assert!(!rules.is_empty(), "{name} has no rules");
            let events = rules.iter().any(|r| r["resources"] == json!(["events"]) && r["verbs"][0] == "create");
            assert_eq!(events, name != "namespace-controller", "{name}");
        }
    }

    #[test]
    fn the_service_account_controller_may_only_create_service_accounts() {
        let rules = service_account();
        let sa: Vec<_> = rules.iter().filter(|r| r["resources"] == json!(["serviceaccounts"])).collect();
        assert_eq!(sa.len(), 1);
        assert_eq!(sa[0]["verbs"], json!(["create"]));
    }
}
