//! Validation of the quantities in built-in objects, as upstream's
//! `ValidateResourceRequirements`, `ValidateResourceQuantityValue` and the
//! claim and quota validations: no negative request, limit or hard
//! amount, whole numbers of objects, requests within limits, claims
//! asking for more than zero.
//! (Quantities that do not parse at all are refused when decoding.)

use serde_json::Value;

use crate::apiserver::status::Cause;
use crate::quantity::Amount;

fn amount(v: &Value) -> Option<Amount> {
    match v {
        Value::String(s) => Amount::parse(s).ok(),
        Value::Number(n) => Amount::parse(&n.to_string()).ok(),
        _ => None,
    }
}

fn text(v: &Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())
}

/// Every entry of the map at `path` is zero or more.
fn nonnegative(map: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    for (name, q) in map.and_then(Value::as_object).into_iter().flatten() {
        if amount(q).is_some_and(|a| a < Amount::default()) {
            causes.push(Cause::invalid(
                format!("{path}[{name}]"),
                format!("Invalid value: {:?}: must be greater than or equal to 0", text(q)),
            ));
        }
    }
}

/// One container's `resources`.
fn container(c: &Value, path: &str, causes: &mut Vec<Cause>) {
    let limits = c.pointer("/resources/limits");
    let requests = c.pointer("/resources/requests");
    nonnegative(limits, &format!("{path}.resources.limits"), causes);
    nonnegative(requests, &format!("{path}.resources.requests"), causes);
    for (name, q) in requests.and_then(Value::as_object).into_iter().flatten() {
        let limit = limits.and_then(|l| l.get(name));
        if let (Some(req), Some(lim)) = (amount(q), limit.and_then(amount)) {
            if req > lim {
                causes.push(Cause::invalid(
                    format!("{path}.resources.requests"),
                    format!("Invalid value: {:?}: must be less than or equal to {name} limit of {lim}", text(q)),
                ));
            }
        }
    }
}

/// The containers and init containers of a pod spec at `path`.
pub fn validate_pod_resources(spec: Option<&Value>, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    for key in ["containers", "initContainers"] {
        for (i, c) in spec.and_then(|s| s.get(key)).and_then(Value::as_array).into_iter().flatten().enumerate() {
            container(c, &format!("{path}.{key}[{i}]"), &mut causes);
        }
    }
    if let Some(overhead) = spec.and_then(|s| s.get("overhead")) {
        nonnegative(Some(overhead), &format!("{path}.overhead"), &mut causes);
    }
    causes
}

/// The quota resources counted in whole objects (upstream's
/// `standardIntegerResources`).
const INTEGER_RESOURCES: &[&str] = &[
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "services.loadbalancers",
    "services.nodeports",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
];

/// A ResourceQuota's `spec.hard`: nothing negative, whole numbers of objects.
pub fn validate_quota(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let hard = o.pointer("/spec/hard");
    nonnegative(hard, "spec.hard", &mut causes);
    for (name, q) in hard.and_then(Value::as_object).into_iter().flatten() {
        let fractional = amount(q).is_some_and(|a| a.milli_value() % 1000 != 0);
        if INTEGER_RESOURCES.contains(&name.as_str()) && fractional {
            causes.push(Cause::invalid(
                format!("spec.hard[{name}]"),
                format!("Invalid value: {:?}: must be an integer", text(q)),
            ));
        }
    }
    causes
}

/// A claim asks for some storage.
pub fn validate_claim(o: &Value) -> Vec<Cause> {
    let path = "spec.resources.requests[storage]";
    match o.pointer("/spec/resources/requests/storage") {
        None => vec![Cause::required("spec.resources[storage]")],
        Some(q) if amount(q).is_some_and(|a| a <= Amount::default()) => {
            vec![Cause::invalid(path, format!("Invalid value: {:?}: must be greater than zero", text(q)))]
        }
        Some(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn negative_and_inverted_amounts_are_invalid() {
        let spec = json!({"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "2", "memory": "-1"}, "limits": {"cpu": "1500m"}}}]});
        let causes = validate_pod_resources(Some(&spec), "spec");
        let fields: Vec<(&str, &str)> = causes.iter().map(|c| (c.field.as_str(), c.message.as_str())).collect();
        assert_eq!(
            fields,
            vec![
                (
                    "spec.containers[0].resources.requests[memory]",
                    "Invalid value: \"-1\": must be greater than or equal to 0"
                ),
                (
                    "spec.containers[0].resources.requests",
                    "Invalid value: \"2\": must be less than or equal to cpu limit of 1500m"
                ),
            ]
        );
        assert!(validate_quota(&json!({"spec": {"hard": {"pods": "5"}}})).is_empty());
        assert_eq!(validate_quota(&json!({"spec": {"hard": {"pods": "-5"}}}))[0].field, "spec.hard[pods]");
        let half = validate_quota(&json!({"spec": {"hard": {"pods": "1500m", "cpu": "1500m"}}}));
        assert_eq!(half.len(), 1);
        assert_eq!(half[0].message, "Invalid value: \"1500m\": must be an integer");
        assert_eq!(validate_claim(&json!({"spec": {"resources": {"requests": {"storage": "0"}}}})).len(), 1);
        assert!(validate_claim(&json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}})).is_empty());
    }
}
