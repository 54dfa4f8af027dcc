//! The pod evaluator of resource quota, as upstream's
//! `pkg/quota/v1/evaluator/core/pods.go`: which pods count, what one pod
//! uses (`pods`, `count/pods`, requests and limits of cpu, memory,
//! ephemeral-storage, hugepages and extended resources), which quota
//! scopes select it, and the containers' duty to state requests and
//! limits that a quota constrains.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;

use super::ResourceList;
use crate::quantity::Amount;

/// The resources the pod evaluator accounts for (besides hugepages and extended ones).
const POD_RESOURCES: &[&str] = &[
    "pods",
    "count/pods",
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
];

/// The resources whose quota obliges every container to state them.
const VALIDATION_SET: &[&str] = &["cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"];

/// An extended resource: a domain-qualified name outside `kubernetes.io`.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// Which of `names` the pod evaluator accounts for.
pub fn matching_resources<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| {
            POD_RESOURCES.contains(&n.as_str())
                || n.starts_with("hugepages-")
                || n.starts_with("requests.hugepages-")
                || (n.starts_with("requests.") && n.contains('/'))
        })
        .cloned()
        .collect()
}

/// Upstream's `podComputeUsageHelper`.
fn compute_usage(requests: &ResourceList, limits: &ResourceList) -> ResourceList {
    let mut out = ResourceList::new();
    out.insert("pods".into(), Amount::count(1));
    for res in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(r) = requests.get(res) {
            out.insert(res.into(), *r);
            out.insert(format!("requests.{res}"), *r);
        }
        if let Some(l) = limits.get(res) {
            out.insert(format!("limits.{res}"), *l);
        }
    }
    for (res, r) in requests {
        if res.starts_with("hugepages-") {
            out.insert(res.clone(), *r);
            out.insert(format!("requests.{res}"), *r);
        }
        if is_extended(res) {
            out.insert(format!("requests.{res}"), *r);
        }
    }
    out
}

fn list_of(map: Option<&BTreeMap<String, Quantity>>) -> ResourceList {
    map.into_iter().flatten().filter_map(|(k, q)| Amount::of(q).ok().map(|a| (k.clone(), a))).collect()
}

/// What one pod uses: always `count/pods`, and while it counts
/// ([`pod_counts`]) `pods` and its compute requests and limits.
pub fn usage(pod: &Pod, now: Timestamp) -> ResourceList {
    let mut out = ResourceList::new();
    out.insert("count/pods".into(), Amount::count(1));
    if !pod_counts(pod, now) {
        return out;
    }
    let names = |field: &str| -> BTreeSet<String> {
        let spec = pod.spec.iter();
        spec.flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| if field == "requests" { r.requests.iter() } else { r.limits.iter() })
            .flat_map(|m| m.keys().cloned())
            // Overhead adds to every request, but only to limits that are set.
            .chain(
                pod.spec
                    .iter()
                    .filter(|_| field == "requests")
                    .flat_map(|s| s.overhead.iter().flat_map(|o| o.keys().cloned())),
            )
            .collect()
    };
    let total = |field: &str| -> ResourceList {
        names(field).into_iter().map(|res| (res.clone(), pod_resource(pod, field, &res))).collect()
    };
    out.extend(compute_usage(&total("requests"), &total("limits")));
    out
}

/// The resources a quota requires that containers leave unstated: each
/// resource with the names of those containers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must specify {}", describe(.0))]
pub struct Unstated(pub BTreeMap<String, BTreeSet<String>>);

/// `requests.cpu for: a,b; limits.memory for: c`.
fn describe(missing: &BTreeMap<String, BTreeSet<String>>) -> String {
    let parts: Vec<String> = missing
        .iter()
        .map(|(res, names)| format!("{res} for: {}", names.iter().cloned().collect::<Vec<_>>().join(",")))
        .collect();
    parts.join("; ")
}

/// Upstream's `enforcePodContainerConstraints`, for every container: the
/// names of `required` (within [`VALIDATION_SET`]) a container leaves
/// unstated (`must specify requests.cpu for: a,b; ...`), when any.
pub fn constraints(required: &[String], pod: &Pod) -> Result<(), Unstated> {
    let required: BTreeSet<&str> = required.iter().map(String::as_str).filter(|r| VALIDATION_SET.contains(r)).collect();
    if required.is_empty() {
        return Ok(());
    }
    let mut missing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    for c in containers {
        let r = c.resources.as_ref();
        let usage =
            compute_usage(&list_of(r.and_then(|r| r.requests.as_ref())), &list_of(r.and_then(|r| r.limits.as_ref())));
        for res in &required {
            if !usage.contains_key(*res) {
                missing.entry(res.to_string()).or_default().insert(c.name.clone());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Unstated(missing))
}

fn container_amount(c: &Container, field: &str, resource: &str) -> Amount {
    let r = c.resources.as_ref();
    let map = if field == "requests" { r.and_then(|r| r.requests.as_ref()) } else { r.and_then(|r| r.limits.as_ref()) };
    map.and_then(|m| m.get(resource)).and_then(|q| Amount::of(q).ok()).unwrap_or_default()
}

/// upstream's `QuotaV1Pod`: finished pods and pods past their deletion
/// grace period no longer count.
pub fn pod_counts(pod: &Pod, now: Timestamp) -> bool {
    if matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending"), "Succeeded" | "Failed") {
        return false;
    }
    match (&pod.metadata.deletion_timestamp, pod.metadata.deletion_grace_period_seconds) {
        (Some(at), Some(grace)) => now.as_second() <= at.0.as_second() + grace,
        _ => true,
    }
}

/// The pod's request (or limit) of `resource`: the larger of the
/// containers' sum and any one init container, plus the pod overhead.
pub fn pod_resource(pod: &Pod, field: &str, resource: &str) -> Amount {
    let Some(spec) = pod.spec.as_ref() else { return Amount::default() };
    let of = |c: &Container| container_amount(c, field, resource);
    let states = |c: &Container| {
        let r = c.resources.as_ref();
        let map =
            if field == "requests" { r.and_then(|r| r.requests.as_ref()) } else { r.and_then(|r| r.limits.as_ref()) };
        map.is_some_and(|m| m.contains_key(resource))
    };
    // Overhead adds to every request, but only to limits some container sets.
    let any = spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(states);
    if field == "limits" && !any {
        return Amount::default();
    }
    let sum = spec.containers.iter().map(of).fold(Amount::default(), Amount::plus);
    let init = spec.init_containers.iter().flatten().map(of).fold(Amount::default(), Amount::max);
    let overhead =
        spec.overhead.as_ref().and_then(|o| o.get(resource)).and_then(|q| Amount::of(q).ok()).unwrap_or_default();
    sum.max(init).plus(overhead)
}

pub fn best_effort(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten())).all(|c| {
        c.resources.as_ref().is_none_or(|r| {
            r.requests.as_ref().is_none_or(BTreeMap::is_empty) && r.limits.as_ref().is_none_or(BTreeMap::is_empty)
        })
    })
}

/// Whether the quota's scopes select the pod.
pub fn pod_in_scope(quota: &ResourceQuota, pod: &Pod) -> bool {
    let spec = quota.spec.as_ref();
    let terminating = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds).is_some();
    let scopes = spec.and_then(|s| s.scopes.clone()).unwrap_or_default();
    let by_scope = scopes.iter().all(|s| match s.as_str() {
        "Terminating" => terminating,
        "NotTerminating" => !terminating,
        "BestEffort" => best_effort(pod),
        "NotBestEffort" => !best_effort(pod),
        _ => true,
    });
    let class = pod.spec.as_ref().and_then(|s| s.priority_class_name.clone());
    let by_selector =
        spec.and_then(|s| s.scope_selector.as_ref()).and_then(|s| s.match_expressions.as_ref()).is_none_or(|exprs| {
            exprs.iter().all(|e| {
                let values = e.values.clone().unwrap_or_default();
                let v = if e.scope_name == "PriorityClass" {
                    class.clone()
                } else {
                    return match e.scope_name.as_str() {
                        "Terminating" => terminating,
                        "NotTerminating" => !terminating,
                        "BestEffort" => best_effort(pod),
                        "NotBestEffort" => !best_effort(pod),
                        _ => true,
                    };
                };
                match e.operator.as_str() {
                    "In" => v.is_some_and(|v| values.contains(&v)),
                    "NotIn" => v.is_none_or(|v| !values.contains(&v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
        });
    by_scope && by_selector
}

pub fn is_scoped(quota: &ResourceQuota) -> bool {
    let spec = quota.spec.as_ref();
    spec.and_then(|s| s.scopes.as_ref()).is_some_and(|s| !s.is_empty())
        || spec.and_then(|s| s.scope_selector.as_ref()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn pod_requests_take_init_containers_and_overhead() {
        let p = pod(serde_json::json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}, "limits": {"memory": "1Gi"}}}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}],
                "overhead": {"cpu": "10m"}
            }
        }));
        assert_eq!(pod_resource(&p, "requests", "cpu").to_string(), "1010m");
        assert_eq!(pod_resource(&p, "requests", "memory").to_string(), "64Mi");
        assert_eq!(pod_resource(&p, "limits", "memory").to_string(), "1Gi");
        // The overhead adds to limits only where a container sets one.
        assert!(pod_resource(&p, "limits", "cpu").is_zero());
        assert!(!best_effort(&p));
        let u = usage(&p, Timestamp::now());
        assert_eq!(
            super::super::pretty_print(&u),
            "count/pods=1,cpu=1010m,limits.memory=1Gi,memory=64Mi,pods=1,requests.cpu=1010m,requests.memory=64Mi"
        );
    }

    #[test]
    fn quota_on_cpu_obliges_every_container() {
        let p = pod(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "b"}
            ]}
        }));
        let required = vec!["requests.cpu".to_string(), "limits.memory".to_string(), "pods".to_string()];
        assert_eq!(
            constraints(&required, &p).map_err(|e| e.to_string()),
            Err("must specify limits.memory for: a,b; requests.cpu for: b".to_string())
        );
        assert_eq!(constraints(&["pods".to_string()], &p), Ok(()));
    }
}
