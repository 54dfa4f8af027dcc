//! `pods/proxy` and `services/proxy` (upstream's ProxyREST for pods and
//! services): a request to `…/pods/[SCHEME:]NAME[:PORT]/proxy/PATH` or
//! `…/services/[SCHEME:]NAME[:PORT]/proxy/PATH` goes to the pod's IP, or to
//! a ready endpoint of the Service, over plain HTTP or, for `https:`, over
//! TLS as upstream's proxy transport does (the other side's certificate not
//! checked, the front proxy's client certificate presented), and the answer
//! comes back with its links made to go through the proxy again
//! (proxy_rewrite.rs; WebSocket upgrades included). This is what `kubectl
//! proxy` users open in a browser.

use axum::body::Bytes;
use axum::http::Method;
use axum::response::Response;
use serde_json::Value;

use super::connect::split_proxy_name;
use super::connect_options;
use crate::apiserver::call::Call;
use crate::apiserver::proxy::relay;
use crate::apiserver::proxy::service_endpoint::{resolve, ServicePort, Unresolved};
use crate::apiserver::status::{ApiError, ApiResult};

const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the scheme asks for TLS; an unknown one is refused.
fn uses_tls(scheme: &str) -> ApiResult<bool> {
    match scheme {
        "" | "http" => Ok(false),
        "https" => Ok(true),
        other => Err(ApiError::bad_request(format!("unsupported scheme {other:?}: use http or https"))),
    }
}

/// The port a pod proxy names: a number, a container port's name, or 80.
fn pod_port(pod: &Value, port: Option<&str>) -> ApiResult<u16> {
    let containers = || pod.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten();
    // No port named: the first port of the first container that declares
    // one, else 80 (upstream's pod ResourceLocation).
    let Some(p) = port else {
        let first = containers()
            .find_map(|c| c.pointer("/ports/0/containerPort").and_then(Value::as_u64))
            .and_then(|n| u16::try_from(n).ok());
        return Ok(first.unwrap_or(80));
    };
    if let Ok(n) = p.parse::<u16>() {
        return Ok(n);
    }
    containers()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .find(|cp| cp["name"].as_str() == Some(p))
        .and_then(|cp| cp["containerPort"].as_u64())
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| ApiError::bad_request(format!("no container port named {p:?}")))
}

pub async fn pod_proxy(call: &mut Call, method: &Method, body: Bytes) -> ApiResult<Response> {
    connect_options::admit(call).await?;
    let target = call.path.name.clone().unwrap_or_default();
    let (scheme, name, port) = split_proxy_name(&target);
    let tls = uses_tls(scheme)?;
    let key = call.resource.key(call.namespace(), name);
    let pod = call.api.storage.get(&key).await?.ok_or_else(|| ApiError::not_found("", "pods", name))?.object;
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| ApiError::service_unavailable(format!("address not allowed: pod {name} has no IP")))?;
    let port = pod_port(&pod, port)?;
    let addr = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    forward(call, method, body, &addr, tls).await
}

pub async fn service_proxy(call: &mut Call, method: &Method, body: Bytes) -> ApiResult<Response> {
    connect_options::admit(call).await?;
    let target = call.path.name.clone().unwrap_or_default();
    let (scheme, name, port) = split_proxy_name(&target);
    let tls = uses_tls(scheme)?;
    let ns = call.namespace().unwrap_or_default();
    let port = ServicePort::parse(port.unwrap_or_default());
    let addr = resolve(&call.api.storage, ns, name, &port).await.map_err(|e| match e {
        Unresolved::ServiceNotFound(_) => ApiError::not_found("", "services", name),
        other => ApiError::service_unavailable(other.to_string()),
    })?;
    forward(call, method, body, &addr, tls).await
}

async fn forward(call: &mut Call, method: &Method, body: Bytes, addr: &str, tls: bool) -> ApiResult<Response> {
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
    let resp = if tls {
        let ip: std::net::IpAddr = tcp.peer_addr().map_err(|e| unreachable(&e))?.ip();
        let config = call.api.aggregator.proxy_tls().map_err(|e| unreachable(&e))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(rustls::pki_types::ServerName::IpAddress(ip.into()), tcp)
            .await
            .map_err(|e| unreachable(&e))?;
        exchange(stream, req).await.map_err(|e| unreachable(&e))?
    } else {
        exchange(tcp, req).await.map_err(|e| unreachable(&e))?
    };
    Ok(super::proxy_rewrite::answer(resp, call.upgrade.take(), &call.path, addr).await)
}

/// One request on a new HTTP/1.1 connection over `io`, kept open for any
/// upgrade it leads to.
async fn exchange<T>(
    io: T,
    req: hyper::Request<axum::body::Body>,
) -> hyper::Result<hyper::Response<hyper::body::Incoming>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    sender.send_request(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_ports_by_number_name_or_default() {
        let pod = json!({"spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}});
        assert_eq!(pod_port(&pod, None).unwrap(), 8080);
        let portless = json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "ports": [{"containerPort": 9}]}]}});
        assert_eq!(pod_port(&portless, None).unwrap(), 9);
        assert_eq!(pod_port(&json!({"spec": {"containers": [{"name": "a"}]}}), None).unwrap(), 80);
        assert_eq!(pod_port(&pod, Some("9000")).unwrap(), 9000);
        assert_eq!(pod_port(&pod, Some("http")).unwrap(), 8080);
        assert_eq!(pod_port(&pod, Some("nope")).unwrap_err().code, 400);
    }
}
