//! The connect subresources that lead to a node's kubelet: `pods/log`,
//! `pods/exec`, `pods/attach`, `pods/portforward` and `nodes/proxy`
//! (upstream's `pkg/registry/core/pod/rest` and `node/rest`). The pod's
//! node and container are checked here, after admission
//! (`connect_options`); the stream itself, whatever protocol the client
//! speaks, is passed through to the kubelet.

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::connect_options;
use crate::apiserver::call::Call;
use crate::apiserver::kubelet_client::{node_endpoint, KubeletConnector};
use crate::apiserver::proxy::relay;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::websocket;

/// PodLogOptions the kubelet takes, passed on as given.
const LOG_OPTIONS: &[&str] =
    &["follow", "previous", "timestamps", "sinceSeconds", "sinceTime", "tailLines", "limitBytes"];

fn connector(call: &Call) -> ApiResult<&KubeletConnector> {
    call.api.config.kubelet.as_ref().ok_or_else(|| ApiError::service_unavailable("this server reaches no kubelets"))
}

/// The kubelet of node `name`.
async fn kubelet_of(call: &Call, name: &str) -> ApiResult<std::net::SocketAddr> {
    let nodes = call
        .api
        .registry
        .get("", "v1", "nodes")
        .ok_or_else(|| ApiError::internal("the nodes resource is not served"))?;
    let node =
        call.api.storage.get(&nodes.key(None, name)).await?.ok_or_else(|| ApiError::not_found("", "nodes", name))?;
    node_endpoint(&node.object)
        .ok_or_else(|| ApiError::bad_request(format!("node {name:?} has no address the API server can reach")))
}

/// The pod's node and the container a request means (upstream's defaulting:
/// the only container when there is one, else the caller must say).
fn pod_target(pod: &Value, requested: Option<&str>) -> ApiResult<(String, String)> {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .map(|cs| cs.iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let (containers, init, ephemeral) = (names("containers"), names("initContainers"), names("ephemeralContainers"));
    let container = match requested {
        Some(c) => {
            if !containers.iter().chain(&init).chain(&ephemeral).any(|n| n == c) {
                return Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}")));
            }
            c.to_string()
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            let mut message =
                format!("a container name must be specified for pod {name}, choose one of: [{}]", containers.join(" "));
            if !init.is_empty() {
                message += &format!(" or one of the init containers: [{}]", init.join(" "));
            }
            if !ephemeral.is_empty() {
                message += &format!(" or one of the ephemeral containers: [{}]", ephemeral.join(" "));
            }
            return Err(ApiError::bad_request(message));
        }
    };
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?;
    Ok((node.to_string(), container))
}

/// The caller's query (as sent, still encoded) with only the parameters
/// `keep` accepts, `?`-prefixed when not empty.
fn query_keeping(call: &Call, keep: impl Fn(&str) -> bool) -> String {
    let raw = call.raw_query.as_deref().unwrap_or_default();
    let kept: Vec<&str> =
        raw.split('&').filter(|kv| !kv.is_empty() && keep(kv.split('=').next().unwrap_or_default())).collect();
    if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    }
}

/// `pods/log`: the kubelet's containerLogs, streamed; over a WebSocket
/// when the request is one (upstream's StreamObject).
pub async fn pod_log(call: &mut Call) -> ApiResult<Response> {
    let pod = call.load_object().await?.object;
    let (node, container) = pod_target(&pod, call.param("container"))?;
    let ns = call.namespace().unwrap_or_default();
    let name = call.path.name.as_deref().unwrap_or_default();
    let query = query_keeping(call, |k| LOG_OPTIONS.contains(&k));
    let path = format!("/containerLogs/{ns}/{name}/{container}{query}");
    let addr = kubelet_of(call, &node).await?;
    let req = relay::outgoing(&Method::GET, &path, &Default::default(), Bytes::new())?;
    let resp = connector(call)?.send(addr, req).await.map_err(|e| ApiError::service_unavailable(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(relay::error_of(resp).await);
    }
    if websocket::is_websocket_request(&call.headers) {
        return stream_over_websocket(call, Body::new(resp.into_body()));
    }
    let mut out = relay::answer(resp, None);
    out.headers_mut().insert(axum::http::header::CONTENT_TYPE, "text/plain".parse().expect("static header"));
    Ok(out)
}

/// Answers a WebSocket handshake with 101 and sends `body` on the upgraded
/// connection as messages of the subprotocol the client chose (upstream's
/// `wsstream.NewReader` with its default reader protocols).
fn stream_over_websocket(call: &mut Call, body: Body) -> ApiResult<Response> {
    websocket::check_handshake(&call.headers).map_err(ApiError::bad_request)?;
    let offered = websocket::offered_protocols(&call.headers);
    let supported = websocket::READER_PROTOCOLS;
    let protocol = websocket::select_protocol(&offered, supported).ok_or_else(|| {
        ApiError::forbidden(format!("requested protocol(s) are not supported: {offered:?}; supports {supported:?}"))
    })?;
    let upgrade = call.upgrade.take().ok_or_else(|| ApiError::bad_request("this connection cannot be upgraded"))?;
    let base64_text = protocol == websocket::BASE64_BINARY;
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => websocket::send_stream(TokioIo::new(io), body, base64_text).await,
            Err(e) => tracing::debug!(error = %e, "the log's websocket upgrade failed"),
        }
    });
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    websocket::accept_headers(&call.headers, &protocol, out.headers_mut());
    Ok(out)
}

/// `pods/exec`, `pods/attach` and `pods/portforward`: the request goes to
/// the kubelet with its upgrade headers, and the stream is spliced.
pub async fn pod_stream(call: &mut Call, method: &Method) -> ApiResult<Response> {
    let sub = call.path.subresource.clone().unwrap_or_default();
    // Opening a stream with GET (WebSocket) also takes `create`, as upstream
    // since 1.30 (AuthorizePodWebsocketUpgradeCreatePermission).
    if method == Method::GET {
        call.api.authorize(call, "create").await?;
    }
    connect_options::admit(call).await?;
    let pod = call.load_object().await?.object;
    let ns = call.namespace().unwrap_or_default();
    let name = call.path.name.as_deref().unwrap_or_default();
    let path = if sub == "portforward" {
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?;
        (node.to_string(), format!("/portForward/{ns}/{name}{}", query_keeping(call, |_| true)))
    } else {
        let (node, container) = pod_target(&pod, call.param("container"))?;
        let verb = if sub == "exec" { "exec" } else { "attach" };
        let query = query_keeping(call, |k| k != "container");
        (node, format!("/{verb}/{ns}/{name}/{container}{query}"))
    };
    let (node, path) = path;
    let addr = kubelet_of(call, &node).await?;
    let req = relay::outgoing(method, &path, &call.headers, Bytes::new())?;
    let resp = connector(call)?.send(addr, req).await.map_err(|e| ApiError::service_unavailable(e.to_string()))?;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        return Err(relay::error_of(resp).await);
    }
    Ok(relay::answer(resp, call.upgrade.take()))
}

/// `nodes/proxy`: any request to the node's kubelet API (`name`,
/// `name:port` or `https:name:port`).
pub async fn node_proxy(call: &mut Call, method: &Method, body: Bytes) -> ApiResult<Response> {
    connect_options::admit(call).await?;
    let target = call.path.name.clone().unwrap_or_default();
    let (scheme, name, port) = split_proxy_name(&target);
    if !matches!(scheme, "" | "https") {
        return Err(ApiError::bad_request(format!("unsupported scheme {scheme:?} for a node proxy")));
    }
    let mut addr = kubelet_of(call, name).await?;
    if let Some(p) = port {
        addr.set_port(p.parse().map_err(|_| ApiError::bad_request(format!("invalid port {p:?}")))?);
    }
    let path = format!("{}{}", call.path.proxy_path.as_deref().unwrap_or("/"), query_keeping(call, |_| true));
    let req = relay::outgoing(method, &path, &call.headers, body)?;
    let resp = connector(call)?.send(addr, req).await.map_err(|e| ApiError::service_unavailable(e.to_string()))?;
    Ok(super::proxy_rewrite::answer(resp, call.upgrade.take(), &call.path, &addr.to_string()).await)
}

/// `[scheme:]name[:port]` of a proxy subresource's name.
pub fn split_proxy_name(target: &str) -> (&str, &str, Option<&str>) {
    let parts: Vec<&str> = target.splitn(3, ':').collect();
    match parts.as_slice() {
        [name] => ("", name, None),
        [name, port] => ("", name, Some(*port).filter(|p| !p.is_empty())),
        [scheme, name, port] => (scheme, name, Some(*port).filter(|p| !p.is_empty())),
        _ => ("", target, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_only_container_is_the_default_and_others_must_be_named() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1",
            "containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}});
        assert_eq!(pod_target(&pod, None).unwrap(), ("n1".to_string(), "a".to_string()));
        assert_eq!(pod_target(&pod, Some("i")).unwrap().1, "i");
        let e = pod_target(&pod, Some("zz")).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "container zz is not valid for pod p"));
        let two = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1",
            "containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}});
        assert_eq!(
            pod_target(&two, None).unwrap_err().message,
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
        );
        let unbound = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pod_target(&unbound, None).unwrap_err().message, "pod p does not have a host assigned");
    }

    #[test]
    fn proxy_names_with_scheme_and_port() {
        assert_eq!(split_proxy_name("web"), ("", "web", None));
        assert_eq!(split_proxy_name("web:8080"), ("", "web", Some("8080")));
        assert_eq!(split_proxy_name("https:web:443"), ("https", "web", Some("443")));
        assert_eq!(split_proxy_name("https:web:"), ("https", "web", None));
    }
}
