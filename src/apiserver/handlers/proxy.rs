//! `pods/proxy` and `services/proxy` (upstream's ProxyREST for pods and
//! services): a request to `…/pods/NAME[:PORT]/proxy/PATH` or
//! `…/services/NAME[:PORT]/proxy/PATH` goes over plain HTTP to the pod's IP,
//! or to a ready endpoint of the Service, and the answer comes back as is
//! (WebSocket upgrades included). This is what `kubectl proxy` users open
//! in a browser.

use axum::body::Bytes;
use axum::http::Method;
use axum::response::Response;
use serde_json::Value;

use super::connect::split_proxy_name;
use super::relay;
use crate::apiserver::call::Call;
use crate::apiserver::service_endpoint::{resolve, ServicePort};
use crate::apiserver::status::{ApiError, ApiResult};

const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn plain_http_only(scheme: &str) -> ApiResult<()> {
    match scheme {
        "" | "http" => Ok(()),
        other => Err(ApiError::bad_request(format!("unsupported scheme {other:?}: ferrok proxies plain HTTP only"))),
    }
}

/// The port a pod proxy names: a number, a container port's name, or 80.
fn pod_port(pod: &Value, port: Option<&str>) -> ApiResult<u16> {
    let Some(p) = port else { return Ok(80) };
    if let Ok(n) = p.parse::<u16>() {
        return Ok(n);
    }
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .find(|cp| cp["name"].as_str() == Some(p))
        .and_then(|cp| cp["containerPort"].as_u64())
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| ApiError::bad_request(format!("no container port named {p:?}")))
}

pub async fn pod_proxy(call: &mut Call, method: &Method, body: Bytes) -> ApiResult<Response> {
    let target = call.path.name.clone().unwrap_or_default();
    let (scheme, name, port) = split_proxy_name(&target);
    plain_http_only(scheme)?;
    let key = call.resource.key(call.namespace(), name);
    let pod = call.api.storage.get(&key).await?.ok_or_else(|| ApiError::not_found("", "pods", name))?.object;
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| ApiError::service_unavailable(format!("address not allowed: pod {name} has no IP")))?;
    let port = pod_port(&pod, port)?;
    let addr = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    forward(call, method, body, &addr).await
}

pub async fn service_proxy(call: &mut Call, method: &Method, body: Bytes) -> ApiResult<Response> {
    let target = call.path.name.clone().unwrap_or_default();
    let (scheme, name, port) = split_proxy_name(&target);
    plain_http_only(scheme)?;
    let ns = call.namespace().unwrap_or_default();
    let port = ServicePort::parse(port.unwrap_or_default());
    let addr = resolve(&call.api.storage, ns, name, &port).await.map_err(|e| {
        if e.ends_with("not found") {
            ApiError::not_found("", "services", name)
        } else {
            ApiError::service_unavailable(e)
        }
    })?;
    forward(call, method, body, &addr).await
}

async fn forward(call: &mut Call, method: &Method, body: Bytes, addr: &str) -> ApiResult<Response> {
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::service_unavailable(format!("error trying to reach {addr}: {e}"));
    let path = call.path.proxy_path.clone().unwrap_or_else(|| "/".into());
    let path = match &call.raw_query {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path,
    };
    let mut req = relay::outgoing(method, &path, &call.headers, body)?;
    if let Ok(host) = addr.parse() {
        req.headers_mut().insert(axum::http::header::HOST, host);
    }
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(&"i/o timeout"))?
        .map_err(|e| unreachable(&e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let resp = sender.send_request(req).await.map_err(|e| unreachable(&e))?;
    Ok(relay::answer(resp, call.upgrade.take()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_ports_by_number_name_or_default() {
        let pod = json!({"spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}});
        assert_eq!(pod_port(&pod, None).unwrap(), 80);
        assert_eq!(pod_port(&pod, Some("9000")).unwrap(), 9000);
        assert_eq!(pod_port(&pod, Some("http")).unwrap(), 8080);
        assert_eq!(pod_port(&pod, Some("nope")).unwrap_err().code, 400);
    }
}
