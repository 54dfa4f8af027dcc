//! The autoscaling/v1 shapes of metrics (v2beta1's: `targetAverageUtilization`,
//! `metricName`, `currentAverageValue`, ...) that ride in an autoscaling/v1
//! HorizontalPodAutoscaler's round-trip annotations, fields in Go's order,
//! and their conversion to and from autoscaling/v2's, as upstream's
//! `Convert_*MetricSource*` and `Convert_*MetricStatus*` functions do.

use k8s_openapi::api::autoscaling::v2::CrossVersionObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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
pub(super) struct V1MetricSpec {
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
pub(super) struct V1MetricStatus {
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

pub(super) fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn selector(v: &Value) -> Option<LabelSelector> {
    serde_json::from_value(v.clone()).ok().filter(|_| !v.is_null())
}

/// `obj` without nulls among its fields (what Go's omitempty leaves out).
pub(super) fn compact(mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    obj
}

pub(super) fn metric_spec_to_v1(m: &Value) -> V1MetricSpec {
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

pub(super) fn metric_spec_from_v1(m: V1MetricSpec) -> Value {
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

pub(super) fn metric_status_to_v1(m: &Value) -> V1MetricStatus {
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

pub(super) fn metric_status_from_v1(m: V1MetricStatus) -> Value {
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
