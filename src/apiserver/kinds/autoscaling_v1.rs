//! HorizontalPodAutoscalers served as autoscaling/v1 and stored as
//! autoscaling/v2, through upstream's conversion
//! (pkg/apis/autoscaling/v1/conversion.go): a CPU Utilization metric is
//! `targetCPUUtilizationPercentage` (and its status
//! `currentCPUUtilizationPercentage`); every other metric, the metric
//! statuses, the conditions and the behavior ride in round-trip annotations
//! (`autoscaling.alpha.kubernetes.io/metrics`, `…/current-metrics`,
//! `…/conditions`, `…/behavior`) in the v1 metric shapes (v2beta1's) and,
//! for behavior, the internal type's Go field names, as upstream writes
//! them. An autoscaler without metrics aims at 80 % CPU.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::autoscaling::{horizontalpodautoscaler_hooks, DEFAULT_CPU_UTILIZATION};
use super::autoscaling_v1_metrics::{
    compact, get, metric_spec_from_v1, metric_spec_to_v1, metric_status_from_v1, metric_status_to_v1, V1MetricSpec,
    V1MetricStatus,
};
use super::default_field;
use crate::apiserver::strategy::{Conversion, Hooks};

pub const METRIC_SPECS: &str = "autoscaling.alpha.kubernetes.io/metrics";
pub const METRIC_STATUSES: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
pub const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
pub const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const ROUND_TRIP: [&str; 4] = [METRIC_SPECS, BEHAVIOR, METRIC_STATUSES, CONDITIONS];
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1Condition {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    last_transition_time: Value,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
}

/// The internal behavior type, as upstream marshals it: Go field names.
#[derive(Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct InternalBehavior {
    #[serde(default)]
    scale_up: Option<InternalRules>,
    #[serde(default)]
    scale_down: Option<InternalRules>,
}

#[derive(Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct InternalRules {
    #[serde(default)]
    stabilization_window_seconds: Option<i32>,
    #[serde(default)]
    select_policy: Option<String>,
    #[serde(default)]
    policies: Option<Vec<InternalPolicy>>,
    #[serde(default)]
    tolerance: Option<String>,
}

#[derive(Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct InternalPolicy {
    #[serde(rename = "Type", default)]
    type_: String,
    #[serde(default)]
    value: i32,
    #[serde(default)]
    period_seconds: i32,
}

fn is_cpu_utilization(m: &Value) -> bool {
    m["type"] == "Resource"
        && get(m, &["resource", "name"]) == "cpu"
        && !get(m, &["resource", "target", "averageUtilization"]).is_null()
}

fn rules_to_internal(r: &Value) -> Option<InternalRules> {
    if r.is_null() {
        return None;
    }
    let policies = r["policies"].as_array().map(|ps| {
        ps.iter()
            .map(|p| InternalPolicy {
                type_: p["type"].as_str().unwrap_or_default().into(),
                value: p["value"].as_i64().unwrap_or(0) as i32,
                period_seconds: p["periodSeconds"].as_i64().unwrap_or(0) as i32,
            })
            .collect()
    });
    Some(InternalRules {
        stabilization_window_seconds: r["stabilizationWindowSeconds"].as_i64().map(|s| s as i32),
        select_policy: r["selectPolicy"].as_str().map(str::to_string),
        policies,
        tolerance: r["tolerance"].as_str().map(str::to_string),
    })
}

fn rules_from_internal(r: Option<InternalRules>) -> Value {
    let Some(r) = r else { return Value::Null };
    let policies = r.policies.map(|ps| {
        ps.into_iter()
            .map(|p| json!({"type": p.type_, "value": p.value, "periodSeconds": p.period_seconds}))
            .collect::<Vec<_>>()
    });
    compact(json!({"stabilizationWindowSeconds": r.stabilization_window_seconds, "selectPolicy": r.select_policy,
        "policies": policies, "tolerance": r.tolerance}))
}

/// A JSON string of `t`, as Go's `json.Marshal` writes it.
fn encoded<T: Serialize>(t: &T) -> Value {
    Value::String(serde_json::to_string(t).unwrap_or_default())
}

/// autoscaling/v2 → autoscaling/v1 (what a v1 client reads).
pub fn v2_to_v1(v2: Value) -> Value {
    let spec = &v2["spec"];
    let status = &v2["status"];
    let mut metadata = v2.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let mut annotations: Map<String, Value> =
        metadata.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    annotations.retain(|k, _| !ROUND_TRIP.contains(&k.as_str()));
    let metrics = spec["metrics"].as_array().cloned().unwrap_or_default();
    let other: Vec<V1MetricSpec> = metrics.iter().filter(|m| !is_cpu_utilization(m)).map(metric_spec_to_v1).collect();
    if !other.is_empty() {
        annotations.insert(METRIC_SPECS.into(), encoded(&other));
    }
    let current = status["currentMetrics"].as_array().cloned().unwrap_or_default();
    if !current.is_empty() {
        let statuses: Vec<V1MetricStatus> = current.iter().map(metric_status_to_v1).collect();
        annotations.insert(METRIC_STATUSES.into(), encoded(&statuses));
    }
    if !spec["behavior"].is_null() {
        let behavior = InternalBehavior {
            scale_up: rules_to_internal(&spec["behavior"]["scaleUp"]),
            scale_down: rules_to_internal(&spec["behavior"]["scaleDown"]),
        };
        annotations.insert(BEHAVIOR.into(), encoded(&behavior));
    }
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    if !conditions.is_empty() {
        let list: Vec<V1Condition> = conditions.iter().filter_map(|c| serde_json::from_value(c.clone()).ok()).collect();
        annotations.insert(CONDITIONS.into(), encoded(&list));
    }
    if let Some(m) = metadata.as_object_mut() {
        if annotations.is_empty() {
            m.remove("annotations");
        } else {
            m.insert("annotations".into(), Value::Object(annotations));
        }
    }
    let target_cpu = metrics
        .iter()
        .find(|m| m["type"] == "Resource" && get(m, &["resource", "name"]) == "cpu")
        .map(|m| get(m, &["resource", "target", "averageUtilization"]).clone())
        .unwrap_or(Value::Null);
    let current_cpu = current
        .iter()
        .filter(|m| m["type"] == "Resource" && get(m, &["resource", "name"]) == "cpu")
        .map(|m| get(m, &["resource", "current", "averageUtilization"]).clone())
        .filter(|u| !u.is_null())
        .next_back()
        .unwrap_or(Value::Null);
    let mut out = json!({
        "apiVersion": "autoscaling/v1",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata,
        "spec": compact(json!({
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicas"],
            "maxReplicas": spec.get("maxReplicas").cloned().unwrap_or(json!(0)),
            "targetCPUUtilizationPercentage": target_cpu,
        })),
    });
    if status.is_object() {
        out["status"] = compact(json!({
            "observedGeneration": status["observedGeneration"],
            "lastScaleTime": status["lastScaleTime"],
            "currentReplicas": status.get("currentReplicas").cloned().unwrap_or(json!(0)),
            "desiredReplicas": status.get("desiredReplicas").cloned().unwrap_or(json!(0)),
            "currentCPUUtilizationPercentage": current_cpu,
        }));
    }
    out
}

fn parse_annotation<T: serde::de::DeserializeOwned>(annotations: &Map<String, Value>, key: &str) -> Option<T> {
    annotations.get(key).and_then(Value::as_str).and_then(|s| serde_json::from_str(s).ok())
}

/// autoscaling/v1 → autoscaling/v2 (what is stored of a v1 client's write).
pub fn v1_to_v2(v1: Value) -> Value {
    let spec = &v1["spec"];
    let status = &v1["status"];
    let mut metadata = v1.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let annotations: Map<String, Value> =
        metadata.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut metrics: Vec<Value> = Vec::new();
    if let Some(other) = parse_annotation::<Vec<V1MetricSpec>>(&annotations, METRIC_SPECS) {
        metrics.extend(other.into_iter().map(metric_spec_from_v1));
    }
    if !spec["targetCPUUtilizationPercentage"].is_null() {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": spec["targetCPUUtilizationPercentage"]}}}));
    }
    if metrics.is_empty() {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}));
    }
    let behavior = parse_annotation::<InternalBehavior>(&annotations, BEHAVIOR)
        .filter(|b| *b != InternalBehavior::default())
        .map(|b| {
            compact(json!({"scaleUp": rules_from_internal(b.scale_up), "scaleDown": rules_from_internal(b.scale_down)}))
        });
    let current_metrics: Option<Vec<Value>> =
        match parse_annotation::<Vec<V1MetricStatus>>(&annotations, METRIC_STATUSES) {
            Some(list) => Some(list.into_iter().map(metric_status_from_v1).collect()),
            None => status["currentCPUUtilizationPercentage"].as_i64().map(|u| {
                vec![json!({"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": u}}})]
            }),
        };
    let conditions = parse_annotation::<Vec<V1Condition>>(&annotations, CONDITIONS).map(|list| {
        list.into_iter()
            .map(|c| {
                compact(json!({"type": c.type_, "status": c.status, "lastTransitionTime": c.last_transition_time,
                "reason": Some(c.reason).filter(|r| !r.is_empty()), "message": Some(c.message).filter(|m| !m.is_empty())}))
            })
            .collect::<Vec<_>>()
    });
    if let Some(m) = metadata.as_object_mut() {
        let mut kept = annotations.clone();
        kept.retain(|k, _| !ROUND_TRIP.contains(&k.as_str()));
        if kept.is_empty() {
            m.remove("annotations");
        } else {
            m.insert("annotations".into(), Value::Object(kept));
        }
    }
    let mut out = json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata,
        "spec": compact(json!({
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicas"],
            "maxReplicas": spec.get("maxReplicas").cloned().unwrap_or(json!(0)),
            "metrics": metrics,
            "behavior": behavior,
        })),
    });
    if status.is_object() {
        let current = status["currentReplicas"].as_i64().filter(|c| *c != 0);
        let mut s = compact(json!({
            "observedGeneration": status["observedGeneration"],
            "lastScaleTime": status["lastScaleTime"],
            "currentReplicas": current,
            "desiredReplicas": status.get("desiredReplicas").cloned().unwrap_or(json!(0)),
            "conditions": conditions,
        }));
        // `currentMetrics` has no omitempty: null when there are none.
        s["currentMetrics"] = current_metrics.map(Value::from).unwrap_or(Value::Null);
        out["status"] = s;
    }
    out
}

/// Upstream's `SetDefaults_HorizontalPodAutoscaler` of autoscaling/v1.
fn default_v1(o: &mut Value) {
    if let Some(spec) = o.get_mut("spec").filter(|s| s.is_object()) {
        default_field(spec, "minReplicas", json!(1));
    }
}

/// The v1 kind: validated and shown as its v2 form is (upstream validates
/// and prints the internal one, which both convert to).
pub fn horizontalpodautoscaler_v1_hooks() -> Hooks {
    Hooks {
        default: default_v1,
        validate: |o| (horizontalpodautoscaler_hooks().validate)(&v1_to_v2(o.clone())),
        initial_status: |_| Some(json!({"currentReplicas": 0, "desiredReplicas": 0})),
        generation: true,
        cells: |o| (horizontalpodautoscaler_hooks().cells)(&v1_to_v2(o.clone())),
        conversion: Some(Conversion {
            storage_api_version: "autoscaling/v2",
            to_storage: v1_to_v2,
            from_storage: v2_to_v1,
        }),
        ..horizontalpodautoscaler_hooks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2() -> Value {
        json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default", "annotations": {"keep": "me"}},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                    {"type": "External", "external": {"metric": {"name": "queue", "selector": {"matchLabels": {"q": "jobs"}}},
                        "target": {"type": "Value", "value": "3"}}},
                    {"type": "Object", "object": {"describedObject": {"apiVersion": "v1", "kind": "Service", "name": "front"},
                        "metric": {"name": "rps"}, "target": {"type": "AverageValue", "averageValue": "2"}}},
                    {"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app",
                        "target": {"type": "Utilization", "averageUtilization": 60}}}
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10, "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}}
            },
            "status": {
                "currentReplicas": 2, "desiredReplicas": 3, "lastScaleTime": "2026-12-07T10:00:00Z",
                "currentMetrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 70, "averageValue": "7m"}}},
                    {"type": ""}
                ],
                "conditions": [{"type": "AbleToScale", "status": "True", "lastTransitionTime": "2026-12-07T10:00:00Z",
                    "reason": "SucceededRescale", "message": "ok"}]
            }
        })
    }

    #[test]
    fn cpu_utilization_is_the_v1_field_and_the_rest_rides_in_annotations() {
        let v1 = v2_to_v1(v2());
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
        assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 70);
        assert_eq!(v1["status"]["currentReplicas"], 2);
        let a = &v1["metadata"]["annotations"];
        assert_eq!(a["keep"], "me");
        let specs: Value = serde_json::from_str(a[METRIC_SPECS].as_str().unwrap()).unwrap();
        assert_eq!(specs.as_array().unwrap().len(), 5, "all but the CPU utilization");
        assert_eq!(
            specs[0],
            json!({"type": "Resource", "resource": {"name": "memory", "targetAverageValue": "100Mi"}})
        );
        assert_eq!(specs[1], json!({"type": "Pods", "pods": {"metricName": "qps", "targetAverageValue": "10"}}));
        assert!(a[METRIC_SPECS].as_str().unwrap().starts_with(r#"[{"type":"Resource","resource":{"name":"memory""#));
        let behavior = a[BEHAVIOR].as_str().unwrap();
        assert_eq!(
            behavior,
            r#"{"ScaleUp":null,"ScaleDown":{"StabilizationWindowSeconds":10,"SelectPolicy":"Max","Policies":[{"Type":"Percent","Value":100,"PeriodSeconds":15}],"Tolerance":null}}"#
        );
        let statuses: Value = serde_json::from_str(a[METRIC_STATUSES].as_str().unwrap()).unwrap();
        assert_eq!(
            statuses[0]["resource"],
            json!({"name": "cpu", "currentAverageUtilization": 70, "currentAverageValue": "7m"})
        );
        assert_eq!(statuses[1], json!({"type": ""}));
        assert!(a[CONDITIONS].as_str().unwrap().contains("SucceededRescale"));
    }

    #[test]
    fn a_round_trip_through_v1_keeps_the_v2_object() {
        let original = v2();
        let back = v1_to_v2(v2_to_v1(original.clone()));
        assert_eq!(back["metadata"], original["metadata"]);
        let mut metrics = original["spec"]["metrics"].as_array().unwrap().clone();
        // The CPU utilization comes back last, as upstream appends it.
        let cpu = metrics.remove(1);
        metrics.push(cpu);
        // v1 always carries an Object metric's targetValue, which comes back.
        metrics[3]["object"]["target"]["value"] = json!("0");
        assert_eq!(back["spec"]["metrics"], Value::from(metrics));
        assert_eq!(back["spec"]["behavior"], original["spec"]["behavior"]);
        assert_eq!(back["status"]["currentMetrics"], original["status"]["currentMetrics"]);
        assert_eq!(back["status"]["conditions"], original["status"]["conditions"]);
        assert_eq!(back["status"]["currentReplicas"], 2);
    }

    #[test]
    fn a_plain_v1_autoscaler_aims_at_80_percent_cpu() {
        let v1 = json!({"metadata": {"name": "a"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "a"},
            "maxReplicas": 3}, "status": {"currentReplicas": 0, "desiredReplicas": 0}});
        let v2 = v1_to_v2(v1);
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"],
            json!({"type": "Utilization", "averageUtilization": 80})
        );
        assert_eq!(v2["status"], json!({"currentMetrics": null, "desiredReplicas": 0}));
        assert!(v2["metadata"].get("annotations").is_none());
        let back = v2_to_v1(v2);
        assert_eq!(back["spec"]["targetCPUUtilizationPercentage"], 80);
        assert!(back["metadata"].get("annotations").is_none());
    }
}
