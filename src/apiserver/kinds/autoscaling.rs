//! HorizontalPodAutoscalers (autoscaling/v2) and their `kubectl get`
//! columns, TARGETS summarising each metric as `current/target`.

use serde_json::{json, Value};

use super::int;
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

pub fn horizontalpodautoscaler_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Reference", "string", 0),
                Column::new("Targets", "string", 0),
                Column::new("MinPods", "string", 0),
                Column::new("MaxPods", "string", 0),
                Column::new("Replicas", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            let reference = format!(
                "{}/{}",
                str_at(o, &["spec", "scaleTargetRef", "kind"]).unwrap_or_default(),
                str_at(o, &["spec", "scaleTargetRef", "name"]).unwrap_or_default()
            );
            let min = at(o, &["spec", "minReplicas"])
                .and_then(Value::as_i64)
                .map_or_else(|| "<unset>".to_string(), |n| n.to_string());
            vec![
                json!(reference),
                json!(format_metrics(o)),
                json!(min),
                json!(int(o, &["spec", "maxReplicas"])),
                json!(int(o, &["status", "currentReplicas"])),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

/// How many metrics TARGETS lists before `+ N more...`.
const MAX_LISTED: usize = 2;

/// The first two metrics, each paired with the status entry at its index.
fn format_metrics(o: &Value) -> String {
    let specs = at(o, &["spec", "metrics"]).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses =
        at(o, &["status", "currentMetrics"]).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let list: Vec<String> =
        specs.iter().enumerate().take(MAX_LISTED).map(|(i, spec)| format_metric(spec, statuses.get(i))).collect();
    let shown = list.join(", ");
    if specs.len() > MAX_LISTED {
        format!("{shown} + {} more...", specs.len() - MAX_LISTED)
    } else {
        shown
    }
}

/// A quantity as Go prints a possibly-nil one.
fn quantity(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => crate::quantity::canonical(s).unwrap_or_else(|| s.clone()),
        Some(Value::Number(n)) => crate::quantity::canonical(&n.to_string()).unwrap_or_else(|| n.to_string()),
        _ => "<nil>".into(),
    }
}

fn format_metric(spec: &Value, status: Option<&Value>) -> String {
    let ty = str_at(spec, &["type"]).unwrap_or_default();
    let source = match ty {
        "External" => "external",
        "Pods" => "pods",
        "Object" => "object",
        "Resource" => "resource",
        "ContainerResource" => "containerResource",
        _ => return "<unknown type>".into(),
    };
    let target = at(spec, &[source, "target"]);
    let target_field = |f: &str| target.and_then(|t| t.get(f));
    // The status entry's current values, when it reports this kind of metric.
    let current = status.and_then(|s| s.get(source)).map(|s| s.get("current").unwrap_or(&Value::Null));
    let unknown = || "<unknown>".to_string();
    match ty {
        "External" | "Object" => match target_field("averageValue") {
            Some(avg) => {
                let cur = current.and_then(|c| c.get("averageValue")).map_or_else(unknown, |q| quantity(Some(q)));
                format!("{cur}/{} (avg)", quantity(Some(avg)))
            }
            None => {
                let cur = current.map_or_else(unknown, |c| quantity(c.get("value")));
                format!("{cur}/{}", quantity(target_field("value")))
            }
        },
        "Pods" => {
            let cur = current.map_or_else(unknown, |c| quantity(c.get("averageValue")));
            format!("{cur}/{}", quantity(target_field("averageValue")))
        }
        _ => {
            let name = str_at(spec, &[source, "name"]).unwrap_or_default();
            match target_field("averageValue") {
                Some(avg) => {
                    let cur = current.map_or_else(unknown, |c| quantity(c.get("averageValue")));
                    format!("{name}: {cur}/{}", quantity(Some(avg)))
                }
                None => {
                    let percent = |v: Option<&Value>| v.and_then(Value::as_i64).map(|n| format!("{n}%"));
                    let cur = percent(current.and_then(|c| c.get("averageUtilization"))).unwrap_or_else(unknown);
                    let goal = percent(target_field("averageUtilization")).unwrap_or_else(|| "<auto>".into());
                    format!("{name}: {cur}/{goal}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_pair_specs_with_statuses() {
        let hpa = json!({
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 5, "metrics": [
                {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}},
                {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value", "value": "3"}}}
            ]},
            "status": {"currentReplicas": 2, "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 42}}}
            ]}
        });
        let cells = (horizontalpodautoscaler_hooks().cells)(&hpa);
        assert_eq!(
            &cells[..5],
            &[
                json!("Deployment/web"),
                json!("cpu: 42%/80%, <unknown>/10 + 1 more..."),
                json!("<unset>"),
                json!(5),
                json!(2)
            ]
        );
        let memory = json!({"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}});
        assert_eq!(format_metric(&memory, None), "memory: <unknown>/100Mi");
        let object = json!({"type": "Object", "object": {"target": {"type": "AverageValue", "averageValue": "2"}}});
        let status = json!({"type": "Object", "object": {"current": {"averageValue": "1500m"}}});
        assert_eq!(format_metric(&object, Some(&status)), "1500m/2 (avg)");
        assert_eq!(format_metrics(&json!({"spec": {}})), "<none>");
    }
}
