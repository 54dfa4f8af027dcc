//! apiregistration.k8s.io/v1 APIService: the aggregation layer's record of
//! which server answers each group/version. This server serves every
//! built-in group itself, so each of them has a local APIService (no
//! `spec.service`) that is always Available, as upstream's autoregistration
//! makes them; user-made ones are stored and listed (proxying to an
//! extension server is not done).

use serde_json::{json, Value};

use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{Hooks, NameRule};
use crate::apiserver::table::Column;

/// The label upstream puts on the APIServices it registers at start.
pub const AUTOMANAGED_LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";

/// Upstream's discovery priorities (group, version) of the built-in group
/// versions (kube-apiserver's `apiVersionPriorities`); a group/version not
/// listed gets no local APIService, as upstream.
pub fn local_priority(group: &str, version: &str) -> Option<(i32, i32)> {
    Some(match (group, version) {
        ("", "v1") => (18000, 1),
        ("apiregistration.k8s.io", "v1") => (18000, 15),
        ("apps", "v1") => (17800, 15),
        ("events.k8s.io", "v1") => (17750, 15),
        ("authentication.k8s.io", "v1") => (17700, 15),
        ("authorization.k8s.io", "v1") => (17600, 15),
        ("autoscaling", "v1") => (17500, 15),
        ("autoscaling", "v2") => (17500, 30),
        ("batch", "v1") => (17400, 15),
        ("certificates.k8s.io", "v1") => (17300, 15),
        ("networking.k8s.io", "v1") => (17200, 15),
        ("policy", "v1") => (17100, 15),
        ("rbac.authorization.k8s.io", "v1") => (17000, 15),
        ("storage.k8s.io", "v1") => (16800, 15),
        ("apiextensions.k8s.io", "v1") => (16700, 15),
        ("admissionregistration.k8s.io", "v1") => (16700, 15),
        ("scheduling.k8s.io", "v1") => (16600, 15),
        ("coordination.k8s.io", "v1") => (16500, 15),
        ("node.k8s.io", "v1") => (16300, 15),
        ("discovery.k8s.io", "v1") => (16200, 15),
        ("flowcontrol.apiserver.k8s.io", "v1") => (16100, 21),
        // Served here, not by a metrics-server: metrics-server's priorities.
        ("metrics.k8s.io", "v1beta1") => (100, 100),
        _ => return None,
    })
}

/// The local APIService of a built-in group/version, as upstream registers it.
pub fn local_apiservice(group: &str, version: &str, now: &str) -> Option<Value> {
    let (group_priority, version_priority) = local_priority(group, version)?;
    Some(json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": format!("{version}.{group}"),
            "labels": {AUTOMANAGED_LABEL: "onstart"},
        },
        "spec": {
            "group": group,
            "version": version,
            "groupPriorityMinimum": group_priority,
            "versionPriority": version_priority,
        },
        "status": {"conditions": [{
            "type": "Available", "status": "True", "lastTransitionTime": now,
            "reason": "Local", "message": "Local APIServices are always available",
        }]},
    }))
}

/// Upstream's ValidateAPIService: the name is `<version>.<group>`, the
/// priorities are positive, and a service reference names its service.
fn validate(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let group = str_at(o, &["spec", "group"]).unwrap_or_default();
    let version = str_at(o, &["spec", "version"]).unwrap_or_default();
    let name = str_at(o, &["metadata", "name"]).unwrap_or_default();
    if version.is_empty() {
        causes.push(Cause::required("spec.version"));
    }
    if name != format!("{version}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            format!("must be `spec.version+\".\"+spec.group`: {:?}", format!("{version}.{group}")),
        ));
    }
    for field in ["groupPriorityMinimum", "versionPriority"] {
        let value = at(o, &["spec", field]).and_then(Value::as_i64).unwrap_or(0);
        if value <= 0 {
            causes.push(Cause::invalid(
                format!("spec.{field}"),
                format!("{value}: must be positive and less than 1000000"),
            ));
        }
    }
    if let Some(service) = at(o, &["spec", "service"]).filter(|s| !s.is_null()) {
        for field in ["namespace", "name"] {
            if service.get(field).and_then(Value::as_str).unwrap_or_default().is_empty() {
                causes.push(Cause::required(format!("spec.service.{field}")));
            }
        }
    }
    causes
}

pub fn apiservice_hooks() -> Hooks {
    Hooks {
        validate,
        // `v1.` (the core group's) is not a DNS subdomain.
        name_rule: NameRule::PathSegment,
        columns: || vec![Column::new("Service", "string", 0), Column::new("Available", "string", 0), Column::age()],
        cells: |o| {
            let service = match at(o, &["spec", "service"]).filter(|s| !s.is_null()) {
                Some(s) => format!(
                    "{}/{}",
                    s.get("namespace").and_then(Value::as_str).unwrap_or_default(),
                    s.get("name").and_then(Value::as_str).unwrap_or_default()
                ),
                None => "Local".into(),
            };
            let available = at(o, &["status", "conditions"])
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Available")))
                .map(|c| {
                    let status = c.get("status").and_then(Value::as_str).unwrap_or("Unknown");
                    match c.get("reason").and_then(Value::as_str) {
                        Some(reason) if status != "True" => format!("{status} ({reason})"),
                        _ => status.to_string(),
                    }
                })
                .unwrap_or_else(|| "Unknown".into());
            vec![json!(service), json!(available), json!(age(o))]
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_apiservices_are_named_version_dot_group_and_valid() {
        let core = local_apiservice("", "v1", "2026-01-01T00:00:00Z").expect("core");
        assert_eq!(core["metadata"]["name"], "v1.");
        assert!(validate(&core).is_empty(), "{:?}", validate(&core));
        let apps = local_apiservice("apps", "v1", "2026-01-01T00:00:00Z").expect("apps");
        assert_eq!(apps["metadata"]["name"], "v1.apps");
        assert_eq!(apps["spec"]["groupPriorityMinimum"], 17800);
        assert!(local_apiservice("example.com", "v1", "x").is_none());
    }

    #[test]
    fn a_misnamed_or_unprioritised_apiservice_is_invalid() {
        let bad = json!({"metadata": {"name": "v1.wrong"}, "spec": {"group": "apps", "version": "v1",
            "groupPriorityMinimum": 0, "versionPriority": 15, "service": {"namespace": "kube-system"}}});
        let fields: Vec<String> = validate(&bad).into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["metadata.name", "spec.groupPriorityMinimum", "spec.service.name"]);
        assert_eq!((apiservice_hooks().cells)(&bad)[0], "kube-system/");
    }
}
