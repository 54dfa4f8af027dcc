//! Policies that bound what a namespace's pods may do: PodDisruptionBudgets,
//! ResourceQuotas and LimitRanges, and their `kubectl get` columns.

use serde_json::{json, Value};

use super::{created_at_hooks, int};
use crate::apiserver::meta::{age, at};
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// An int-or-string as upstream prints it, `N/A` when unset.
fn int_or_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => crate::quantity::canonical(s).unwrap_or_else(|| s.clone()),
        Some(Value::Number(n)) => crate::quantity::canonical(&n.to_string()).unwrap_or_else(|| n.to_string()),
        _ => "N/A".into(),
    }
}

pub fn poddisruptionbudget_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Min Available", "string", 0),
                Column::new("Max Unavailable", "string", 0),
                Column::new("Allowed Disruptions", "integer", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            vec![
                json!(int_or_string(at(o, &["spec", "minAvailable"]))),
                json!(int_or_string(at(o, &["spec", "maxUnavailable"]))),
                json!(int(o, &["status", "disruptionsAllowed"])),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

/// A quantity as upstream prints it: canonical (`0.5` shows as `500m`).
fn quantity(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => crate::quantity::canonical(s).unwrap_or_else(|| s.clone()),
        Some(Value::Number(n)) => crate::quantity::canonical(&n.to_string()).unwrap_or_else(|| n.to_string()),
        _ => "0".into(),
    }
}

/// `resource: used/hard` for every hard limit in the status, sorted by
/// resource; `limits.*` resources go to the LIMIT column, the rest to REQUEST.
fn quota_cells(o: &Value) -> (String, String) {
    let (mut requests, mut limits) = (Vec::new(), Vec::new());
    // serde_json's maps are sorted by key, as upstream sorts the names.
    for (resource, hard) in at(o, &["status", "hard"]).and_then(Value::as_object).into_iter().flatten() {
        let used = quantity(at(o, &["status", "used", resource]));
        let entry = format!("{resource}: {used}/{}", quantity(Some(hard)));
        if resource.starts_with("limits.") {
            limits.push(entry);
        } else {
            requests.push(entry);
        }
    }
    (requests.join(", "), limits.join(", "))
}

pub fn resourcequota_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Request", "string", 0), Column::new("Limit", "string", 0), Column::age()],
        cells: |o| {
            let (requests, limits) = quota_cells(o);
            vec![json!(requests), json!(limits), json!(age(o))]
        },
        validate: super::quantities::validate_quota,
        ..Hooks::default()
    }
}

/// LimitRanges: upstream has no printer, so NAME and CREATED AT.
pub fn limitrange_hooks() -> Hooks {
    created_at_hooks()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdb_cells() {
        let pdb = json!({"spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 2}});
        assert_eq!((poddisruptionbudget_hooks().cells)(&pdb)[..3], [json!("50%"), json!("N/A"), json!(2)]);
        let pdb = json!({"spec": {"maxUnavailable": 1}});
        assert_eq!((poddisruptionbudget_hooks().cells)(&pdb)[..3], [json!("N/A"), json!("1"), json!(0)]);
    }

    #[test]
    fn quota_splits_requests_and_limits() {
        let q = json!({"status": {
            "hard": {"pods": "10", "requests.cpu": "1", "limits.memory": "2Gi", "limits": "3"},
            "used": {"pods": "2", "limits.memory": "512Mi"}
        }});
        let (requests, limits) = quota_cells(&q);
        assert_eq!(requests, "limits: 0/3, pods: 2/10, requests.cpu: 0/1");
        assert_eq!(limits, "limits.memory: 512Mi/2Gi");
        assert_eq!(quota_cells(&json!({})), (String::new(), String::new()));
    }
}
