//! HorizontalPodAutoscalers (autoscaling/v2): upstream's defaults and
//! validation, the status a new one starts with, and their `kubectl get`
//! columns, TARGETS summarising each metric as `current/target`.

use serde_json::{json, Value};

use super::{default_field, int};
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// Upstream's `DefaultCPUUtilization`: what an autoscaler without metrics aims at.
pub const DEFAULT_CPU_UTILIZATION: i64 = 80;

/// Upstream's `SetDefaults_HorizontalPodAutoscaler` (autoscaling/v2): one
/// replica at least, CPU at 80 % without metrics, and a behavior's unset
/// rules filled with upstream's (`GenerateHPAScaleUpRules`,
/// `GenerateHPAScaleDownRules`).
fn default_horizontalpodautoscaler(o: &mut Value) {
    let Some(spec) = o.get_mut("spec").filter(|s| s.is_object()) else { return };
    default_field(spec, "minReplicas", json!(1));
    if spec.get("metrics").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]);
    }
    let Some(behavior) = spec.get_mut("behavior").filter(|b| b.is_object()) else { return };
    let scale_up = json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
        {"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}]});
    let scale_down =
        json!({"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]});
    for (direction, defaults) in [("scaleUp", scale_up), ("scaleDown", scale_down)] {
        let rules = behavior.as_object_mut().and_then(|b| {
            let r = b.entry(direction).or_insert_with(|| json!({}));
            if r.is_null() {
                *r = json!({});
            }
            r.as_object_mut()
        });
        if let (Some(rules), Some(defaults)) = (rules, defaults.as_object()) {
            for (k, v) in defaults {
                if rules.get(k).is_none_or(Value::is_null) {
                    rules.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Upstream's `ValidateHorizontalPodAutoscaler`, for what clients get
/// wrong most: the replica bounds, the target reference, each metric's
/// source and target.
fn validate_horizontalpodautoscaler(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let min = at(o, &["spec", "minReplicas"]).and_then(Value::as_i64);
    let max = int(o, &["spec", "maxReplicas"]);
    if let Some(min) = min.filter(|m| *m < 1) {
        causes.push(Cause::invalid(
            "spec.minReplicas",
            format!("Invalid value: {min}: must be greater than or equal to 1"),
        ));
    }
    if max < 1 {
        causes.push(Cause::invalid("spec.maxReplicas", format!("Invalid value: {max}: must be greater than 0")));
    }
    if min.is_some_and(|min| max < min) {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            format!("Invalid value: {max}: must be greater than or equal to `minReplicas`"),
        ));
    }
    for field in ["kind", "name"] {
        if str_at(o, &["spec", "scaleTargetRef", field]).unwrap_or_default().is_empty() {
            causes.push(Cause::required(format!("spec.scaleTargetRef.{field}")));
        }
    }
    for (i, m) in at(o, &["spec", "metrics"]).and_then(Value::as_array).into_iter().flatten().enumerate() {
        causes.extend(validate_metric(m, &format!("spec.metrics[{i}]")));
    }
    causes
}

/// The source field of each metric type.
const SOURCES: [(&str, &str); 5] = [
    ("Object", "object"),
    ("Pods", "pods"),
    ("Resource", "resource"),
    ("ContainerResource", "containerResource"),
    ("External", "external"),
];

fn validate_metric(m: &Value, path: &str) -> Vec<Cause> {
    let ty = str_at(m, &["type"]).unwrap_or_default();
    let Some((_, field)) = SOURCES.iter().find(|(t, _)| *t == ty) else {
        return vec![if ty.is_empty() {
            Cause::required(format!("{path}.type"))
        } else {
            Cause {
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {ty:?}: supported values: \"ContainerResource\", \"External\", \"Object\", \"Pods\", \"Resource\""
                ),
                field: format!("{path}.type"),
            }
        }];
    };
    let Some(source) = m.get(*field).filter(|s| s.is_object()) else {
        return vec![Cause::required(format!("{path}.{field}"))];
    };
    let mut causes = Vec::new();
    let target = source.get("target");
    let target_type = target.and_then(|t| str_at(t, &["type"])).unwrap_or_default();
    match target_type {
        "Utilization" if !matches!(ty, "Resource" | "ContainerResource") => causes.push(Cause::invalid(
            format!("{path}.{field}.target.type"),
            format!("Invalid value: {target_type:?}: must be either Value or AverageValue"),
        )),
        "Utilization" | "Value" | "AverageValue" => {
            let want = match target_type {
                "Utilization" => "averageUtilization",
                "Value" => "value",
                _ => "averageValue",
            };
            if target.and_then(|t| t.get(want)).is_none_or(Value::is_null) {
                causes.push(Cause::required(format!("{path}.{field}.target.{want}")));
            }
        }
        "" => causes.push(Cause::required(format!("{path}.{field}.target.type"))),
        other => causes.push(Cause::invalid(
            format!("{path}.{field}.target.type"),
            format!("Invalid value: {other:?}: must be either Utilization, Value, or AverageValue"),
        )),
    }
    if let Some(u) = target.and_then(|t| t.get("averageUtilization")).and_then(Value::as_i64).filter(|u| *u <= 0) {
        causes.push(Cause::invalid(
            format!("{path}.{field}.target.averageUtilization"),
            format!("Invalid value: {u}: must be greater than 0"),
        ));
    }
    let named = if matches!(ty, "Resource" | "ContainerResource") { &["name"][..] } else { &["metric", "name"][..] };
    if str_at(source, named).unwrap_or_default().is_empty() {
        causes.push(Cause::required(format!("{path}.{field}.{}", named.join("."))));
    }
    if ty == "ContainerResource" && str_at(source, &["container"]).unwrap_or_default().is_empty() {
        causes.push(Cause::required(format!("{path}.{field}.container")));
    }
    causes
}

pub fn horizontalpodautoscaler_hooks() -> Hooks {
    Hooks {
        default: default_horizontalpodautoscaler,
        validate: validate_horizontalpodautoscaler,
        // `desiredReplicas` has no omitempty; `currentMetrics` is written as null.
        initial_status: |_| Some(json!({"currentMetrics": null, "desiredReplicas": 0})),
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

    #[test]
    fn defaults_are_upstreams() {
        let mut hpa =
            json!({"spec": {"maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}}});
        default_horizontalpodautoscaler(&mut hpa);
        assert_eq!(hpa["spec"]["minReplicas"], 1);
        assert_eq!(hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80);
        let b = &hpa["spec"]["behavior"];
        assert_eq!(b["scaleUp"]["policies"].as_array().map(Vec::len), Some(2));
        assert_eq!(b["scaleUp"]["stabilizationWindowSeconds"], 0);
        assert_eq!(b["scaleDown"]["stabilizationWindowSeconds"], 10);
        assert_eq!(b["scaleDown"]["policies"][0], json!({"type": "Percent", "value": 100, "periodSeconds": 15}));
        let mut plain = json!({"spec": {"maxReplicas": 3}});
        default_horizontalpodautoscaler(&mut plain);
        assert!(plain["spec"].get("behavior").is_none(), "no behavior stays none");
    }

    #[test]
    fn validation_names_upstreams_fields() {
        let bad = json!({"spec": {"minReplicas": 0, "maxReplicas": 0, "scaleTargetRef": {"kind": "Deployment"},
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}]}});
        let fields: Vec<String> = validate_horizontalpodautoscaler(&bad).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.minReplicas",
                "spec.maxReplicas",
                "spec.scaleTargetRef.name",
                "spec.metrics[0].resource.target.averageUtilization"
            ]
        );
    }
}
