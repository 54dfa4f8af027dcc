//! What one object uses of a quota, per kind, as upstream's evaluators in
//! `pkg/quota/v1/evaluator/core` and the generic object-count evaluator:
//! pods (see [`super::pods`]), services, persistent volume claims, and a
//! `count/<resource>[.<group>]` for any other kind (with the legacy name
//! `configmaps`, `secrets`, … for the core kinds that had one).

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::{object_count_name, pods, ResourceList};
use crate::quantity::Amount;

/// The suffix of per-storage-class claim quotas.
const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// The evaluator of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evaluator {
    Pods,
    Services,
    PersistentVolumeClaims,
    /// Any other kind: only its object count.
    ObjectCount {
        count: String,
        alias: Option<&'static str>,
    },
}

impl Evaluator {
    pub fn for_resource(group: &str, plural: &str) -> Evaluator {
        match (group, plural) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::PersistentVolumeClaims,
            _ => {
                let alias = match (group, plural) {
                    ("", "configmaps") => Some("configmaps"),
                    ("", "secrets") => Some("secrets"),
                    ("", "replicationcontrollers") => Some("replicationcontrollers"),
                    ("", "resourcequotas") => Some("resourcequotas"),
                    _ => None,
                };
                Evaluator::ObjectCount { count: object_count_name(group, plural), alias }
            }
        }
    }

    /// Whether an update can change what the object uses: services
    /// (their type and ports) and claims (a larger request); for the
    /// others only a create counts.
    pub fn handles_update(&self) -> bool {
        matches!(self, Evaluator::Services | Evaluator::PersistentVolumeClaims)
    }

    /// Which of `names` (a quota's resources) this kind uses.
    pub fn matching_resources<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        let names = names.into_iter();
        match self {
            Evaluator::Pods => pods::matching_resources(names),
            Evaluator::Services => names
                .filter(|n| {
                    matches!(
                        n.as_str(),
                        "services" | "count/services" | "services.loadbalancers" | "services.nodeports"
                    )
                })
                .cloned()
                .collect(),
            Evaluator::PersistentVolumeClaims => names
                .filter(|n| {
                    matches!(n.as_str(), "persistentvolumeclaims" | "count/persistentvolumeclaims" | "requests.storage")
                        || n.split_once(STORAGE_CLASS_SUFFIX)
                            .is_some_and(|(_, r)| r == "requests.storage" || r == "persistentvolumeclaims")
                })
                .cloned()
                .collect(),
            Evaluator::ObjectCount { count, alias } => {
                names.filter(|n| *n == count || Some(n.as_str()) == *alias).cloned().collect()
            }
        }
    }

    /// Whether the quota's scopes select the object: pods as their scopes
    /// say; other kinds only by unscoped quotas.
    pub fn matches_scopes(&self, quota: &ResourceQuota, obj: &Value) -> bool {
        match self {
            Evaluator::Pods => {
                let pod: Pod = crate::decode::from_value(obj).unwrap_or_default();
                pods::pod_in_scope(quota, &pod)
            }
            _ => !pods::is_scoped(quota),
        }
    }

    /// Upstream's `Constraints`: only pods have them.
    pub fn constraints(&self, required: &[String], obj: &Value) -> Result<(), pods::Unstated> {
        match self {
            Evaluator::Pods => {
                let pod: Pod = crate::decode::from_value(obj).unwrap_or_default();
                pods::constraints(required, &pod)
            }
            _ => Ok(()),
        }
    }

    /// What the object uses.
    pub fn usage(&self, obj: &Value, now: Timestamp) -> ResourceList {
        let one = Amount::count(1);
        let mut out = ResourceList::new();
        match self {
            Evaluator::Pods => {
                let pod: Pod = crate::decode::from_value(obj).unwrap_or_default();
                return pods::usage(&pod, now);
            }
            Evaluator::Services => {
                out.insert("services".into(), one);
                out.insert("count/services".into(), one);
                let ty = obj.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP");
                let ports = obj.pointer("/spec/ports").and_then(Value::as_array).map_or(0, Vec::len);
                let allocate =
                    obj.pointer("/spec/allocateLoadBalancerNodePorts").and_then(Value::as_bool) != Some(false);
                let node_ports = match ty {
                    "NodePort" => ports,
                    "LoadBalancer" if allocate => ports,
                    _ => 0,
                };
                out.insert("services.nodeports".into(), Amount::count(node_ports));
                out.insert("services.loadbalancers".into(), Amount::count(usize::from(ty == "LoadBalancer")));
            }
            Evaluator::PersistentVolumeClaims => {
                out.insert("persistentvolumeclaims".into(), one);
                out.insert("count/persistentvolumeclaims".into(), one);
                let storage = obj
                    .pointer("/spec/resources/requests/storage")
                    .and_then(Value::as_str)
                    .and_then(|s| Amount::parse(s).ok());
                if let Some(s) = storage {
                    out.insert("requests.storage".into(), s);
                }
                if let Some(class) = obj.pointer("/spec/storageClassName").and_then(Value::as_str) {
                    out.insert(format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"), one);
                    if let Some(s) = storage {
                        out.insert(format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"), s);
                    }
                }
            }
            Evaluator::ObjectCount { count, alias } => {
                out.insert(count.clone(), one);
                if let Some(a) = alias {
                    out.insert((*a).into(), one);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_use_what_upstream_counts() {
        let now = Timestamp::now();
        let cm = Evaluator::for_resource("", "configmaps");
        assert_eq!(super::super::pretty_print(&cm.usage(&json!({}), now)), "configmaps=1,count/configmaps=1");
        let deploy = Evaluator::for_resource("apps", "deployments");
        assert_eq!(super::super::pretty_print(&deploy.usage(&json!({}), now)), "count/deployments.apps=1");
        let names: Vec<String> = ["count/deployments.apps", "pods"].iter().map(|s| s.to_string()).collect();
        assert_eq!(deploy.matching_resources(&names), vec!["count/deployments.apps".to_string()]);
        let svc = Evaluator::for_resource("", "services");
        let lb = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        assert_eq!(
            super::super::pretty_print(&svc.usage(&lb, now)),
            "count/services=1,services=1,services.loadbalancers=1,services.nodeports=2"
        );
        let pvc = Evaluator::for_resource("", "persistentvolumeclaims");
        let claim = json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": "1Gi"}}}});
        let u = pvc.usage(&claim, now);
        assert_eq!(u.get("requests.storage").map(ToString::to_string).as_deref(), Some("1Gi"));
        assert!(u.contains_key("gold.storageclass.storage.k8s.io/requests.storage"));
    }
}
