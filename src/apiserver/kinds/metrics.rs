//! `metrics.k8s.io/v1beta1` objects (NodeMetrics, PodMetrics) made from a
//! kubelet's `/stats/summary`, as metrics-server makes them: CPU is the
//! rate `usageNanoCores` (a quantity in `n`), memory the working set
//! (bytes, in `Ki` when whole). The summary is read as JSON, the wire form
//! the kubelet serves, so the API server needs nothing of the node's code.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::apiserver::resource::Resource;
use crate::apiserver::strategy::{DecodeError, Strategy};

pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";
/// The window of an entry's CPU rate, as Go prints a duration (`1.5s`,
/// `250ms`): the time between the kubelet's two readings.
fn window(entry: &Value) -> Value {
    let Some(ns) = entry["cpu"]["usageWindowNanoSeconds"].as_u64() else { return Value::Null };
    let text = if ns >= 1_000_000_000 {
        let s = format!("{:.3}", ns as f64 / 1e9);
        format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{}ms", ns / 1_000_000)
    };
    Value::String(text)
}

/// CPU in nanocores as a quantity.
pub fn cpu_quantity(nano_cores: u64) -> String {
    format!("{nano_cores}n")
}

/// Bytes as a quantity (`Ki` when a whole number of KiB, as BinarySI prints).
pub fn memory_quantity(bytes: u64) -> String {
    if bytes != 0 && bytes.is_multiple_of(1024) {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

/// `{"cpu": …, "memory": …}` of a summary entry, if it has both.
fn usage(entry: &Value) -> Option<Value> {
    let cpu = entry["cpu"]["usageNanoCores"].as_u64()?;
    let memory = entry["memory"]["workingSetBytes"].as_u64()?;
    Some(json!({"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)}))
}

fn timestamp(entry: &Value) -> Value {
    entry["cpu"]["time"].clone()
}

/// The NodeMetrics of a node from its summary; `labels` are the Node's.
pub fn node_metrics(name: &str, labels: &Value, summary: &Value) -> Option<Value> {
    let node = &summary["node"];
    Some(json!({
        "kind": "NodeMetrics",
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "labels": labels, "creationTimestamp": timestamp(node)},
        "timestamp": timestamp(node),
        "window": window(node),
        "usage": usage(node)?,
    }))
}

/// The PodMetrics of every pod in a summary that has usage for each of
/// its containers, as (namespace, name, uid, object without labels).
pub fn pod_metrics(summary: &Value) -> Vec<(String, String, String, Value)> {
    let mut out = Vec::new();
    for pod in summary["pods"].as_array().into_iter().flatten() {
        let r = &pod["podRef"];
        let (Some(ns), Some(name)) = (r["namespace"].as_str(), r["name"].as_str()) else { continue };
        let uid = r["uid"].as_str().unwrap_or_default();
        let containers: Option<Vec<Value>> = pod["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Some(json!({"name": c["name"], "usage": usage(c)?})))
            .collect();
        // A pod with no container running (crash-looping, just started)
        // has no usage to report: left out, as metrics-server leaves it,
        // rather than served without the `timestamp` and `window` clients parse.
        let Some(containers) = containers.filter(|c| !c.is_empty()) else { continue };
        let time = pod["containers"].get(0).map(timestamp).unwrap_or(Value::Null);
        let window = pod["containers"].get(0).map(window).unwrap_or(Value::Null);
        if time.is_null() || window.is_null() {
            continue;
        }
        out.push((
            ns.to_string(),
            name.to_string(),
            uid.to_string(),
            json!({
                "kind": "PodMetrics",
                "apiVersion": GROUP_VERSION,
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": time},
                "timestamp": time,
                "window": window,
                "containers": containers,
            }),
        ));
    }
    out
}

/// NodeMetrics and PodMetrics are made on every read, never written.
struct MetricsStrategy;

impl Strategy for MetricsStrategy {
    fn decode(&self, obj: &Value) -> Result<(Value, Vec<String>), DecodeError> {
        Ok((obj.clone(), Vec::new()))
    }
}

fn metrics_resource(kind: &str, plural: &str, namespaced: bool) -> Resource {
    Resource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: String::new(),
        namespaced,
        verbs: vec!["get".into(), "list".into()],
        short_names: Vec::new(),
        categories: Vec::new(),
        status: false,
        scale: None,
        subresources: Vec::new(),
        ephemeral: false,
        computed: true,
        strategy: Arc::new(MetricsStrategy),
        begin_write: None,
    }
}

/// The resources of `metrics.k8s.io/v1beta1`.
pub fn resources() -> Vec<Resource> {
    vec![metrics_resource("NodeMetrics", "nodes", false), metrics_resource("PodMetrics", "pods", true)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Value {
        let cpu = |n: u64| {
            json!({"time": "2026-11-24T04:00:00Z", "usageNanoCores": n, "usageCoreNanoSeconds": 5,
                   "usageWindowNanoSeconds": 1_500_000_000u64})
        };
        let mem = |b: u64| json!({"time": "2026-11-24T04:00:00Z", "workingSetBytes": b});
        json!({
            "node": {"nodeName": "n1", "cpu": cpu(250_000_000), "memory": mem(2048 * 1024)},
            "pods": [
                {"podRef": {"name": "burn", "namespace": "default", "uid": "u1"},
                 "containers": [{"name": "a", "cpu": cpu(990_000_000), "memory": mem(1000)},
                                {"name": "b", "cpu": cpu(1), "memory": mem(4096)}]},
                {"podRef": {"name": "fresh", "namespace": "default", "uid": "u2"},
                 "containers": [{"name": "a", "cpu": {"time": "x", "usageCoreNanoSeconds": 1}, "memory": mem(1)}]},
                {"podRef": {"name": "crashing", "namespace": "default", "uid": "u3"}, "containers": []},
                {"podRef": {"name": "no-window", "namespace": "default", "uid": "u4"},
                 "containers": [{"name": "a", "cpu": {"usageNanoCores": 1}, "memory": mem(1)}]}
            ]
        })
    }

    #[test]
    fn node_metrics_take_the_rate_and_the_working_set() {
        let m = node_metrics("n1", &json!({"a": "b"}), &summary()).unwrap();
        assert_eq!(m["usage"], json!({"cpu": "250000000n", "memory": "2048Ki"}));
        assert_eq!(m["metadata"]["labels"]["a"], "b");
        assert_eq!(m["timestamp"], "2026-11-24T04:00:00Z");
        assert_eq!(m["window"], "1.5s");
        let short = json!({"cpu": {"usageWindowNanoSeconds": 250_000_000u64}});
        assert_eq!(window(&short), "250ms");
        assert!(node_metrics("n1", &json!({}), &json!({"node": {}})).is_none());
    }

    #[test]
    fn pod_metrics_list_containers_and_skip_pods_without_a_rate() {
        let pods = pod_metrics(&summary());
        assert_eq!(
            pods.len(),
            1,
            "pods with a container lacking a rate, no container or no window are left out, as metrics-server does"
        );
        let (ns, name, uid, m) = &pods[0];
        assert_eq!((ns.as_str(), name.as_str(), uid.as_str()), ("default", "burn", "u1"));
        assert_eq!(m["containers"][0], json!({"name": "a", "usage": {"cpu": "990000000n", "memory": "1000"}}));
        assert_eq!(m["containers"][1]["usage"]["memory"], "4Ki");
    }
}
