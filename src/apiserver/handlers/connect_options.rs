//! The options object of a connect request and its admission (upstream's
//! `NewConnectOptions`, the query decoding of `getRequestOptions`, and the
//! admission step of `ConnectResource`): `PodAttachOptions`,
//! `PodExecOptions` and `PodPortForwardOptions` from the query,
//! `PodProxyOptions`, `ServiceProxyOptions` and `NodeProxyOptions` with the
//! proxied path. The webhooks review it with the operation CONNECT before
//! anything is connected; a mutating one may change it, and the request
//! then goes on as the changed options say.

use serde_json::{json, Map, Value};

use crate::apiserver::admission;
use crate::apiserver::call::Call;
use crate::apiserver::discovery::connect_options_kind;
use crate::apiserver::request::parse_bool;
use crate::apiserver::status::{ApiError, ApiResult};

/// Admits the connect request `call` (a no-op for a subresource that is
/// no connect one); a refusal is the error to answer with.
pub async fn admit(call: &mut Call) -> ApiResult<()> {
    let sub = call.path.subresource.clone().unwrap_or_default();
    let Some(kind) = connect_options_kind(&call.resource.kind, &sub) else { return Ok(()) };
    let built = options(kind, &query_values(call.raw_query.as_deref()), call.path.proxy_path.as_deref())?;
    let mut admitted = built.clone();
    admission::connect(call, &mut admitted).await?;
    if admitted != built {
        apply(call, &admitted);
    }
    Ok(())
}

/// Every `key=value` of a query, decoded, repeated keys kept in order.
fn query_values(raw: Option<&str>) -> Vec<(String, String)> {
    raw.and_then(|q| serde_urlencoded::from_str(q).ok()).unwrap_or_default()
}

/// The options object `kind` as upstream decodes it from the query (and
/// for a proxy, its `path` from the proxied path).
fn options(kind: &str, query: &[(String, String)], proxy_path: Option<&str>) -> ApiResult<Value> {
    let all = |key: &'static str| query.iter().filter(move |(k, _)| k == key).map(|(_, v)| v.as_str());
    let first = |key: &'static str| all(key).next();
    let mut out = Map::new();
    out.insert("kind".into(), json!(kind));
    out.insert("apiVersion".into(), json!("v1"));
    match kind {
        "PodAttachOptions" | "PodExecOptions" => {
            for key in ["stdin", "stdout", "stderr", "tty"] {
                if parse_bool(first(key)) {
                    out.insert(key.into(), json!(true));
                }
            }
            if let Some(c) = first("container").filter(|c| !c.is_empty()) {
                out.insert("container".into(), json!(c));
            }
            if kind == "PodExecOptions" {
                let command: Vec<&str> = all("command").collect();
                out.insert("command".into(), if command.is_empty() { Value::Null } else { json!(command) });
            }
        }
        "PodPortForwardOptions" => {
            // Repeated, or comma-separated in one value (as the kube crate
            // and the kubelet's own parser take them).
            let ports = all("ports")
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse::<i32>().map_err(|_| ApiError::bad_request(format!("invalid port {p:?}"))))
                .collect::<ApiResult<Vec<i32>>>()?;
            if !ports.is_empty() {
                out.insert("ports".into(), json!(ports));
            }
        }
        _ => {
            // The proxies: the path after `proxy`, with its leading slash.
            if let Some(path) = proxy_path.filter(|p| !p.is_empty()) {
                out.insert("path".into(), json!(path));
            }
        }
    }
    Ok(Value::Object(out))
}

/// Makes the request say what `options`, changed by a mutating webhook,
/// say: the query of a stream, or the path of a proxy.
fn apply(call: &mut Call, options: &Value) {
    if options["kind"].as_str().is_some_and(|k| k.ends_with("ProxyOptions")) {
        call.path.proxy_path = Some(options["path"].as_str().unwrap_or("/").to_string());
        return;
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for key in ["stdin", "stdout", "stderr", "tty"] {
        if options[key] == true {
            pairs.push((key.into(), "true".into()));
        }
    }
    if let Some(c) = options["container"].as_str() {
        pairs.push(("container".into(), c.into()));
    }
    for c in options["command"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        pairs.push(("command".into(), c.into()));
    }
    for p in options["ports"].as_array().into_iter().flatten().filter_map(Value::as_i64) {
        pairs.push(("ports".into(), p.to_string()));
    }
    let raw = serde_urlencoded::to_string(&pairs).unwrap_or_default();
    call.query = crate::apiserver::request::parse_query(Some(&raw));
    call.raw_query = Some(raw);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(raw: &str) -> Vec<(String, String)> {
        query_values(Some(raw))
    }

    #[test]
    fn options_read_from_the_query_as_upstream_decodes_them() {
        let attach = options("PodAttachOptions", &q("container=container1&stdin=true&stdout=1&stderr=false"), None);
        assert_eq!(
            attach.unwrap(),
            json!({"kind": "PodAttachOptions", "apiVersion": "v1", "stdin": true, "stdout": true, "container": "container1"})
        );
        let exec = options("PodExecOptions", &q("command=sh&command=-c&command=echo%20hi&tty="), None).unwrap();
        assert_eq!(exec["command"], json!(["sh", "-c", "echo hi"]));
        assert_eq!(exec["tty"], json!(true), "present and empty is true");
        assert_eq!(options("PodExecOptions", &[], None).unwrap()["command"], Value::Null);
        let pf = options("PodPortForwardOptions", &q("ports=8080&ports=9090"), None).unwrap();
        let listed = options("PodPortForwardOptions", &q("ports=8080,9090"), None).unwrap();
        assert_eq!(listed["ports"], pf["ports"]);
        assert_eq!(pf["ports"], json!([8080, 9090]));
        assert_eq!(options("PodPortForwardOptions", &q("ports=x"), None).unwrap_err().code, 400);
        let proxy = options("ServiceProxyOptions", &q("a=b"), Some("/healthz")).unwrap();
        assert_eq!(proxy, json!({"kind": "ServiceProxyOptions", "apiVersion": "v1", "path": "/healthz"}));
    }
}
