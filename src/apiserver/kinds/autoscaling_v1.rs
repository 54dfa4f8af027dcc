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

use k8s_openapi::api::autoscaling::v2::CrossVersionObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::autoscaling::{horizontalpodautoscaler_hooks, DEFAULT_CPU_UTILIZATION};
use super::default_field;
use crate::apiserver::strategy::{Conversion, Hooks};

pub const METRIC_SPECS: &str = "autoscaling.alpha.kubernetes.io/metrics";
pub const METRIC_STATUSES: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
pub const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
pub const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const ROUND_TRIP: [&str; 4] = [METRIC_SPECS, BEHAVIOR, METRIC_STATUSES, CONDITIONS];

/// A Quantity field Go writes even when unset (a non-pointer `resource.Quantity`).
fn zero_quantity() -> Value {
    json!("0")
}

fn is_null(v: &Value) -> bool {
    v.is_null()
}

// The autoscaling/v1 metric types of the annotations, fields in Go's order.

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1MetricSpec {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<V1ObjectMetricSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pods: Option<V1PodsMetricSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<V1ResourceMetricSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_resource: Option<V1ResourceMetricSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external: Option<V1ExternalMetricSource>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ObjectMetricSource {
    #[serde(default)]
    target: CrossVersionObjectReference,
    #[serde(default)]
    metric_name: String,
    #[serde(default = "zero_quantity")]
    target_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "is_null")]
    average_value: Value,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1PodsMetricSource {
    #[serde(default)]
    metric_name: String,
    #[serde(default = "zero_quantity")]
    target_average_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelector>,
}

/// Resource and ContainerResource (the latter with `container`).
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ResourceMetricSource {
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "is_null")]
    target_average_utilization: Value,
    #[serde(default, skip_serializing_if = "is_null")]
    target_average_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<String>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ExternalMetricSource {
    #[serde(default)]
    metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    metric_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "is_null")]
    target_value: Value,
    #[serde(default, skip_serializing_if = "is_null")]
    target_average_value: Value,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1MetricStatus {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<V1ObjectMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pods: Option<V1PodsMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<V1ResourceMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_resource: Option<V1ResourceMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external: Option<V1ExternalMetricStatus>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ObjectMetricStatus {
    #[serde(default)]
    target: CrossVersionObjectReference,
    #[serde(default)]
    metric_name: String,
    #[serde(default = "zero_quantity")]
    current_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "is_null")]
    average_value: Value,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1PodsMetricStatus {
    #[serde(default)]
    metric_name: String,
    #[serde(default = "zero_quantity")]
    current_average_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelector>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ResourceMetricStatus {
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "is_null")]
    current_average_utilization: Value,
    #[serde(default = "zero_quantity")]
    current_average_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<String>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct V1ExternalMetricStatus {
    #[serde(default)]
    metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    metric_selector: Option<LabelSelector>,
    #[serde(default = "zero_quantity")]
    current_value: Value,
    #[serde(default, skip_serializing_if = "is_null")]
    current_average_value: Value,
}

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

fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn selector(v: &Value) -> Option<LabelSelector> {
    serde_json::from_value(v.clone()).ok().filter(|_| !v.is_null())
}

/// `obj` without nulls among its fields (what Go's omitempty leaves out).
fn compact(mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    obj
}

fn is_cpu_utilization(m: &Value) -> bool {
    m["type"] == "Resource"
        && get(m, &["resource", "name"]) == "cpu"
        && !get(m, &["resource", "target", "averageUtilization"]).is_null()
}

fn metric_spec_to_v1(m: &Value) -> V1MetricSpec {
    let t = |src: &str, f: &str| get(m, &[src, "target", f]).clone();
    let mut out = V1MetricSpec { type_: m["type"].as_str().unwrap_or_default().to_string(), ..Default::default() };
    match out.type_.as_str() {
        "Object" => {
            out.object = Some(V1ObjectMetricSource {
                target: serde_json::from_value(get(m, &["object", "describedObject"]).clone()).unwrap_or_default(),
                metric_name: get(m, &["object", "metric", "name"]).as_str().unwrap_or_default().into(),
                target_value: Some(t("object", "value")).filter(|v| !v.is_null()).unwrap_or_else(zero_quantity),
                selector: selector(get(m, &["object", "metric", "selector"])),
                average_value: t("object", "averageValue"),
            })
        }
        "Pods" => {
            out.pods = Some(V1PodsMetricSource {
                metric_name: get(m, &["pods", "metric", "name"]).as_str().unwrap_or_default().into(),
                target_average_value: Some(t("pods", "averageValue"))
                    .filter(|v| !v.is_null())
                    .unwrap_or_else(zero_quantity),
                selector: selector(get(m, &["pods", "metric", "selector"])),
            })
        }
        "Resource" | "ContainerResource" => {
            let src = if out.type_ == "Resource" { "resource" } else { "containerResource" };
            let r = V1ResourceMetricSource {
                name: get(m, &[src, "name"]).as_str().unwrap_or_default().into(),
                target_average_utilization: t(src, "averageUtilization"),
                target_average_value: t(src, "averageValue"),
                container: get(m, &[src, "container"]).as_str().map(str::to_string).filter(|_| src != "resource"),
            };
            if src == "resource" {
                out.resource = Some(r);
            } else {
                out.container_resource = Some(r);
            }
        }
        "External" => {
            out.external = Some(V1ExternalMetricSource {
                metric_name: get(m, &["external", "metric", "name"]).as_str().unwrap_or_default().into(),
                metric_selector: selector(get(m, &["external", "metric", "selector"])),
                target_value: t("external", "value"),
                target_average_value: t("external", "averageValue"),
            })
        }
        _ => {}
    }
    out
}

fn metric_spec_from_v1(m: V1MetricSpec) -> Value {
    let identifier = |name: String, sel: Option<LabelSelector>| compact(json!({"name": name, "selector": sel}));
    let target_of = |value: Value, average: Value, average_type_when: bool, value_type: &str| {
        let ty = if average_type_when { "AverageValue" } else { value_type };
        compact(json!({"type": ty, "value": value, "averageValue": average}))
    };
    match m.type_.as_str() {
        "Object" => {
            let o = m.object.unwrap_or_default();
            let average = !o.average_value.is_null();
            json!({"type": "Object", "object": {
                "describedObject": o.target,
                "metric": identifier(o.metric_name, o.selector),
                "target": target_of(o.target_value, o.average_value, average, "Value"),
            }})
        }
        "Pods" => {
            let p = m.pods.unwrap_or_default();
            json!({"type": "Pods", "pods": {
                "metric": identifier(p.metric_name, p.selector),
                "target": {"type": "AverageValue", "averageValue": p.target_average_value},
            }})
        }
        "Resource" | "ContainerResource" => {
            let (field, r) = if m.type_ == "Resource" {
                ("resource", m.resource.unwrap_or_default())
            } else {
                ("containerResource", m.container_resource.unwrap_or_default())
            };
            let ty = if r.target_average_utilization.is_null() { "AverageValue" } else { "Utilization" };
            let target = compact(json!({"type": ty, "averageUtilization": r.target_average_utilization,
                "averageValue": r.target_average_value}));
            json!({"type": m.type_, field: compact(json!({"name": r.name, "container": r.container, "target": target}))})
        }
        "External" => {
            let e = m.external.unwrap_or_default();
            let average = e.target_value.is_null();
            json!({"type": "External", "external": {
                "metric": identifier(e.metric_name, e.metric_selector),
                "target": target_of(e.target_value, e.target_average_value, average, "Value"),
            }})
        }
        other => json!({"type": other}),
    }
}

fn metric_status_to_v1(m: &Value) -> V1MetricStatus {
    let c = |src: &str, f: &str| get(m, &[src, "current", f]).clone();
    let or_zero = |v: Value| if v.is_null() { zero_quantity() } else { v };
    let mut out = V1MetricStatus { type_: m["type"].as_str().unwrap_or_default().to_string(), ..Default::default() };
    match out.type_.as_str() {
        "Object" => {
            out.object = Some(V1ObjectMetricStatus {
                target: serde_json::from_value(get(m, &["object", "describedObject"]).clone()).unwrap_or_default(),
                metric_name: get(m, &["object", "metric", "name"]).as_str().unwrap_or_default().into(),
                current_value: or_zero(c("object", "value")),
                selector: selector(get(m, &["object", "metric", "selector"])),
                average_value: c("object", "averageValue"),
            })
        }
        "Pods" => {
            out.pods = Some(V1PodsMetricStatus {
                metric_name: get(m, &["pods", "metric", "name"]).as_str().unwrap_or_default().into(),
                current_average_value: or_zero(c("pods", "averageValue")),
                selector: selector(get(m, &["pods", "metric", "selector"])),
            })
        }
        "Resource" | "ContainerResource" => {
            let src = if out.type_ == "Resource" { "resource" } else { "containerResource" };
            let r = V1ResourceMetricStatus {
                name: get(m, &[src, "name"]).as_str().unwrap_or_default().into(),
                current_average_utilization: c(src, "averageUtilization"),
                current_average_value: or_zero(c(src, "averageValue")),
                container: get(m, &[src, "container"]).as_str().map(str::to_string).filter(|_| src != "resource"),
            };
            if src == "resource" {
                out.resource = Some(r);
            } else {
                out.container_resource = Some(r);
            }
        }
        "External" => {
            out.external = Some(V1ExternalMetricStatus {
                metric_name: get(m, &["external", "metric", "name"]).as_str().unwrap_or_default().into(),
                metric_selector: selector(get(m, &["external", "metric", "selector"])),
                current_value: or_zero(c("external", "value")),
                current_average_value: c("external", "averageValue"),
            })
        }
        _ => {}
    }
    out
}

fn metric_status_from_v1(m: V1MetricStatus) -> Value {
    let identifier = |name: String, sel: Option<LabelSelector>| compact(json!({"name": name, "selector": sel}));
    match m.type_.as_str() {
        "Object" => {
            let o = m.object.unwrap_or_default();
            json!({"type": "Object", "object": {
                "describedObject": o.target,
                "metric": identifier(o.metric_name, o.selector),
                "current": compact(json!({"value": o.current_value, "averageValue": o.average_value})),
            }})
        }
        "Pods" => {
            let p = m.pods.unwrap_or_default();
            json!({"type": "Pods", "pods": {
                "metric": identifier(p.metric_name, p.selector),
                "current": {"averageValue": p.current_average_value},
            }})
        }
        "Resource" | "ContainerResource" => {
            let (field, r) = if m.type_ == "Resource" {
                ("resource", m.resource.unwrap_or_default())
            } else {
                ("containerResource", m.container_resource.unwrap_or_default())
            };
            let current = compact(json!({"averageUtilization": r.current_average_utilization,
                "averageValue": r.current_average_value}));
            json!({"type": m.type_, field: compact(json!({"name": r.name, "container": r.container, "current": current}))})
        }
        "External" => {
            let e = m.external.unwrap_or_default();
            json!({"type": "External", "external": {
                "metric": identifier(e.metric_name, e.metric_selector),
                "current": compact(json!({"value": e.current_value, "averageValue": e.current_average_value})),
            }})
        }
        other => json!({"type": other}),
    }
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
