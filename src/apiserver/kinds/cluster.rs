//! Cluster-wide plumbing: Leases, ComponentStatuses, PriorityClasses, RuntimeClasses,
//! CertificateSigningRequests, and API Priority and Fairness (FlowSchemas,
//! PriorityLevelConfigurations): their `kubectl get` columns.

use serde_json::{json, Value};

use super::int;
use crate::apiserver::meta::{age, at, human_duration, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

pub fn lease_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Holder", "string", 0), Column::age()],
        cells: |o| vec![json!(str_at(o, &["spec", "holderIdentity"]).unwrap_or_default()), json!(age(o))],
        ..Hooks::default()
    }
}

/// ComponentStatuses as `kubectl get cs` shows them: STATUS from the
/// Healthy condition, its MESSAGE and ERROR; no AGE.
pub fn componentstatus_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Status", "string", 0),
                Column::new("Message", "string", 0),
                Column::new("Error", "string", 0),
            ]
        },
        cells: |o| {
            let healthy = o["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"))
                .cloned()
                .unwrap_or(Value::Null);
            let status = if healthy["status"] == "True" { "Healthy" } else { "Unhealthy" };
            vec![
                json!(status),
                json!(healthy["message"].as_str().unwrap_or_default()),
                json!(healthy["error"].as_str().unwrap_or_default()),
            ]
        },
        ..Hooks::default()
    }
}

/// Upstream prints PREEMPTIONPOLICY after AGE, without marking it wide.
pub fn priorityclass_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Value", "integer", 0),
                Column::new("Global-Default", "boolean", 0),
                Column::age(),
                Column::new("PreemptionPolicy", "string", 0),
            ]
        },
        cells: |o| {
            vec![
                json!(int(o, &["value"])),
                json!(at(o, &["globalDefault"]).and_then(Value::as_bool).unwrap_or(false)),
                json!(age(o)),
                json!(str_at(o, &["preemptionPolicy"]).unwrap_or_default()),
            ]
        },
        validate_change: validate_priorityclass_change,
        ..Hooks::default()
    }
}

/// A PriorityClass's value and preemptionPolicy never change (upstream's
/// ValidatePriorityClassUpdate).
fn validate_priorityclass_change(_subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    let Some(old) = old else { return Vec::new() };
    let mut causes = Vec::new();
    if new.get("value") != old.get("value") {
        causes.push(Cause::forbidden("value", "Forbidden: may not be changed in an update."));
    }
    if new.get("preemptionPolicy") != old.get("preemptionPolicy") {
        let value = new.get("preemptionPolicy").and_then(Value::as_str).unwrap_or_default();
        causes.push(Cause::invalid("preemptionPolicy", format!("Invalid value: {value:?}: field is immutable")));
    }
    causes
}

pub fn runtimeclass_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Handler", "string", 0), Column::age()],
        cells: |o| vec![json!(str_at(o, &["handler"]).unwrap_or_default()), json!(age(o))],
        ..Hooks::default()
    }
}

/// Denied, Approved or Pending, then `,Failed` and `,Issued` as they apply.
fn csr_condition(o: &Value) -> String {
    let conds = at(o, &["status", "conditions"]).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let has = |t: &str| conds.iter().any(|c| str_at(c, &["type"]) == Some(t));
    let mut status = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        status.push_str(",Failed");
    }
    if str_at(o, &["status", "certificate"]).is_some_and(|c| !c.is_empty()) {
        status.push_str(",Issued");
    }
    status
}

pub fn certificatesigningrequest_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::age(),
                Column::new("SignerName", "string", 0),
                Column::new("Requestor", "string", 0),
                Column::new("RequestedDuration", "string", 0),
                Column::new("Condition", "string", 0),
            ]
        },
        cells: |o| {
            let duration = at(o, &["spec", "expirationSeconds"])
                .and_then(Value::as_i64)
                .map_or_else(|| "<none>".to_string(), human_duration);
            vec![
                json!(age(o)),
                json!(str_at(o, &["spec", "signerName"]).filter(|s| !s.is_empty()).unwrap_or("<none>")),
                json!(str_at(o, &["spec", "username"]).unwrap_or_default()),
                json!(duration),
                json!(csr_condition(o)),
            ]
        },
        subresource_update: super::certificates::csr_subresource_update,
        validate_change: super::certificates::validate_csr_change,
        ..Hooks::default()
    }
}

pub fn flowschema_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("PriorityLevel", "string", 0),
                Column::new("MatchingPrecedence", "string", 0),
                Column::new("DistinguisherMethod", "string", 0),
                Column::age(),
                Column::new("MissingPL", "string", 0),
            ]
        },
        cells: |o| {
            // Whether the priority level it names is missing: its Dangling condition.
            let dangling = at(o, &["status", "conditions"])
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| str_at(c, &["type"]) == Some("Dangling")))
                .and_then(|c| str_at(c, &["status"]))
                .unwrap_or("?");
            vec![
                json!(str_at(o, &["spec", "priorityLevelConfiguration", "name"]).unwrap_or_default()),
                json!(int(o, &["spec", "matchingPrecedence"])),
                json!(str_at(o, &["spec", "distinguisherMethod", "type"]).unwrap_or("<none>")),
                json!(age(o)),
                json!(dangling),
            ]
        },
        ..Hooks::default()
    }
}

pub fn prioritylevelconfiguration_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Type", "string", 0),
                Column::new("NominalConcurrencyShares", "string", 0),
                Column::new("Queues", "string", 0),
                Column::new("HandSize", "string", 0),
                Column::new("QueueLengthLimit", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            // Numbers for limited levels (queue settings only when queuing), else <none>.
            let none = || json!("<none>");
            let (mut shares, mut queues, mut hand, mut limit) = (none(), none(), none(), none());
            if let Some(limited) = at(o, &["spec", "limited"]).filter(|l| l.is_object()) {
                shares = json!(int(limited, &["nominalConcurrencyShares"]));
                if let Some(q) = at(limited, &["limitResponse", "queuing"]).filter(|q| q.is_object()) {
                    (queues, hand, limit) = (
                        json!(int(q, &["queues"])),
                        json!(int(q, &["handSize"])),
                        json!(int(q, &["queueLengthLimit"])),
                    );
                }
            }
            vec![json!(str_at(o, &["spec", "type"]).unwrap_or_default()), shares, queues, hand, limit, json!(age(o))]
        },
        ..Hooks::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_cells() {
        let csr = json!({"spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "alice", "expirationSeconds": 86400},
                         "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0t"}});
        let cells = (certificatesigningrequest_hooks().cells)(&csr);
        assert_eq!(
            &cells[1..],
            &[json!("kubernetes.io/kube-apiserver-client"), json!("alice"), json!("24h"), json!("Approved,Issued")]
        );
        let cells = (certificatesigningrequest_hooks().cells)(&json!({"spec": {}}));
        assert_eq!(&cells[1..], &[json!("<none>"), json!(""), json!("<none>"), json!("Pending")]);
    }

    #[test]
    fn priority_class_value_and_preemption_policy_are_immutable() {
        let old = json!({"value": 10, "preemptionPolicy": "PreemptLowerPriority"});
        assert!(validate_priorityclass_change(None, &old, Some(&old)).is_empty());
        let causes =
            validate_priorityclass_change(None, &json!({"value": 100, "preemptionPolicy": "Never"}), Some(&old));
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["value", "preemptionPolicy"]);
        assert_eq!(causes[0].message, "Forbidden: may not be changed in an update.");
    }

    #[test]
    fn priority_level_cells() {
        let limited = json!({"spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 30,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 50}}}}});
        let cells = (prioritylevelconfiguration_hooks().cells)(&limited);
        assert_eq!(&cells[..5], &[json!("Limited"), json!(30), json!(64), json!(6), json!(50)]);
        let exempt = json!({"spec": {"type": "Exempt", "exempt": {}}});
        let cells = (prioritylevelconfiguration_hooks().cells)(&exempt);
        assert_eq!(&cells[..5], &[json!("Exempt"), json!("<none>"), json!("<none>"), json!("<none>"), json!("<none>")]);
    }
}
