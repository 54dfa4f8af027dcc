//! get and list of `metrics.k8s.io/v1beta1` NodeMetrics and PodMetrics,
//! served by the API server itself (no metrics-server pod): each Ready
//! node's kubelet is asked for its `/stats/summary` through the API
//! server's kubelet client, and the answers are turned into metrics
//! objects. PodMetrics carry their pod's labels, so `-l` selects them.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use futures_util::future::join_all;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::list::computed_list;
use super::read::object_response;
use super::Call;
use crate::apiserver::kinds::metrics::{node_metrics, pod_metrics};
use crate::apiserver::kubelet_client::node_endpoint;
use crate::apiserver::proxy::relay;
use crate::apiserver::status::{ApiError, ApiResult};

/// How long a kubelet gets to answer with its summary.
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(10);

fn is_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
}

/// A node's `/stats/summary`, or None when it cannot be had.
async fn summary(call: &Call, node: &Value) -> Option<Value> {
    let connector = call.api.config.kubelet.as_ref()?;
    let addr = node_endpoint(node)?;
    let req = relay::outgoing(&Method::GET, "/stats/summary", &Default::default(), Bytes::new()).ok()?;
    let fetch = async {
        let resp = connector.send(addr, req).await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string())
    };
    match tokio::time::timeout(SUMMARY_TIMEOUT, fetch).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::warn!(node = %name_of(node), error = %e, "cannot read the node's stats summary");
            None
        }
        Err(_) => {
            tracing::warn!(node = %name_of(node), "the node's stats summary timed out");
            None
        }
    }
}

async fn ready_nodes(call: &Call) -> ApiResult<Vec<Value>> {
    let (nodes, _) = call.api.storage.list_all("/registry/nodes/").await?;
    Ok(nodes.into_iter().map(|s| s.object).filter(is_ready).collect())
}

async fn node_objects(call: &Call, only: Option<&str>) -> ApiResult<Vec<Value>> {
    let nodes: Vec<Value> =
        ready_nodes(call).await?.into_iter().filter(|n| only.is_none_or(|o| name_of(n) == o)).collect();
    let made = join_all(nodes.iter().map(|n| async move {
        let s = summary(call, n).await?;
        let labels = n.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
        node_metrics(name_of(n), &labels, &s)
    }))
    .await;
    Ok(made.into_iter().flatten().collect())
}

async fn pod_objects(call: &Call, namespace: Option<&str>, only: Option<&str>) -> ApiResult<Vec<Value>> {
    let prefix = match namespace {
        Some(ns) => format!("/registry/pods/{ns}/"),
        None => "/registry/pods/".to_string(),
    };
    let (pods, _) = call.api.storage.list_all(&prefix).await?;
    // The labels of the pods that exist, by uid.
    let labels: HashMap<String, Value> = pods
        .into_iter()
        .filter_map(|p| {
            let uid = p.object.pointer("/metadata/uid")?.as_str()?.to_string();
            Some((uid, p.object.pointer("/metadata/labels").cloned().unwrap_or(json!({}))))
        })
        .collect();
    let nodes = ready_nodes(call).await?;
    let summaries = join_all(nodes.iter().map(|n| summary(call, n))).await;
    let mut out = Vec::new();
    for s in summaries.into_iter().flatten() {
        for (ns, name, uid, mut obj) in pod_metrics(&s) {
            if namespace.is_some_and(|want| want != ns) || only.is_some_and(|want| want != name) {
                continue;
            }
            let Some(l) = labels.get(&uid) else { continue };
            obj["metadata"]["labels"] = l.clone();
            out.push(obj);
        }
    }
    out.sort_by(|a, b| {
        let key = |o: &Value| (o["metadata"]["namespace"].as_str().map(str::to_string), name_of(o).to_string());
        key(a).cmp(&key(b))
    });
    Ok(out)
}

pub async fn serve(call: &mut Call, verb: &str) -> ApiResult<Response> {
    let r = call.resource.clone();
    let nodes = r.plural == "nodes";
    let namespace = call.namespace().map(str::to_string);
    match verb {
        "get" => {
            let name = call.path.name.clone().unwrap_or_default();
            let found = if nodes {
                node_objects(call, Some(&name)).await?
            } else {
                pod_objects(call, namespace.as_deref(), Some(&name)).await?
            };
            match found.into_iter().next() {
                Some(obj) => Ok(object_response(call, StatusCode::OK, obj)),
                None if nodes => Err(ApiError::not_found("metrics.k8s.io", "nodemetrics", &name)),
                None => Err(ApiError::not_found(
                    "metrics.k8s.io",
                    "podmetrics",
                    &format!("{}/{name}", namespace.unwrap_or_default()),
                )),
            }
        }
        "list" => {
            let all = if nodes {
                node_objects(call, None).await?
            } else {
                pod_objects(call, namespace.as_deref(), None).await?
            };
            computed_list(call, all)
        }
        _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported on {}", r.plural))),
    }
}
