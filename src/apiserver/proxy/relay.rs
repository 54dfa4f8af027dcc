//! Passing a request on to another server and its answer back (upstream's
//! UpgradeAwareHandler): headers copied but for hop-by-hop ones and the
//! caller's own credentials; a streamed body; and for an upgrade (SPDY,
//! WebSocket), the 101 answer returned and both connections spliced.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::apiserver::status::ApiError;

/// Headers that describe one connection, not the request.
const HOP_BY_HOP: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"];
/// What only the API server may see.
const CREDENTIALS: &[&str] = &["authorization", "cookie", "proxy-authorization"];

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

pub(crate) fn copy_headers(from: &HeaderMap, keep_upgrade: bool) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        let n = name.as_str();
        let hop = HOP_BY_HOP.contains(&n) && !(keep_upgrade && (n == "connection" || n == "upgrade"));
        if hop || CREDENTIALS.contains(&n) || n.starts_with("impersonate-") || n == "content-length" {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The request to send on: `method`, `path_and_query`, the caller's
/// headers (upgrade ones kept for an upgrade) and `body`.
pub fn outgoing(
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<hyper::Request<Body>, ApiError> {
    let upgrade = is_upgrade(headers);
    let mut req = hyper::Request::builder()
        .method(method.clone())
        .uri(path_and_query)
        .body(Body::from(body))
        .map_err(|e| ApiError::bad_request(format!("invalid proxied request: {e}")))?;
    *req.headers_mut() = copy_headers(headers, upgrade);
    Ok(req)
}

/// The other server's answer as ours. A 101 hands both upgraded
/// connections to a task that copies between them until either ends.
pub fn answer(mut resp: hyper::Response<Incoming>, client: Option<OnUpgrade>) -> Response {
    let status = resp.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client) = client else {
            return ApiError::bad_request("the upstream server upgraded a request that cannot be upgraded")
                .into_response();
        };
        let upstream = hyper::upgrade::on(&mut resp);
        let headers = copy_headers(resp.headers(), true);
        tokio::spawn(async move {
            let (client, upstream) = match tokio::try_join!(client, upstream) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "proxied upgrade failed");
                    return;
                }
            };
            let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(upstream));
            if let Err(e) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
                tracing::debug!(error = %e, "proxied stream ended");
            }
        });
        let mut out = Response::new(Body::empty());
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        return out;
    }
    let headers = copy_headers(resp.headers(), false);
    let mut out = Response::new(Body::new(resp.into_body()));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// A non-2xx answer of a kubelet as a Status with its code and text,
/// as upstream's API server reports a failed log or exec request.
pub async fn error_of(resp: hyper::Response<Incoming>) -> ApiError {
    use http_body_util::BodyExt;
    let code = resp.status().as_u16();
    let limited = http_body_util::Limited::new(resp.into_body(), 64 * 1024);
    let text = match limited.collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    // A kubelet may answer with a Status of its own.
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or(text);
    ApiError::new(code, reason_of(code), message)
}

/// Upstream's reason for an HTTP code.
fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// Whether a header is one the caller may not pass on (for tests).
#[cfg(test)]
fn passed_on(name: &str, upgrade: bool) -> bool {
    let mut h = HeaderMap::new();
    h.insert(axum::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"), "x".parse().expect("value"));
    !copy_headers(&h, upgrade).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        assert!(!passed_on("authorization", true));
        assert!(!passed_on("impersonate-user", false));
        assert!(!passed_on("connection", false));
        assert!(passed_on("connection", true));
        assert!(passed_on("upgrade", true));
        assert!(passed_on("x-stream-protocol-version", false));
        assert!(passed_on("sec-websocket-protocol", true));
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(is_upgrade(&h));
    }
}
