//! The streaming endpoints of the kubelet API: exec, attach and
//! port-forward. The router resolves the pod and container and calls
//! [`serve_exec`], [`serve_attach`] or [`serve_port_forward`] with the
//! request; these negotiate the protocol the client speaks (SPDY/3.1 or
//! WebSocket, any version upstream's kubelet accepts), answer 101 and run
//! the session on the upgraded connection.

pub mod exec;
pub mod netns;
pub mod portforward;
pub mod remotecommand;
pub mod runtime_stream;
pub mod spdy;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::agent::cri::{api, Cri, CriError};
use crate::websocket;
pub use portforward::PortForwardTarget;
use remotecommand::Options;

const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
const ACCEPTED_PROTOCOLS_HEADER: &str = "x-accepted-stream-protocol-versions";

/// The protocol a client asked for and we chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    Spdy(String),
    WebSocket(String),
}

fn text(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// The versions a SPDY client offers (one header each, or comma-joined by a proxy).
fn spdy_offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Chooses the protocol as upstream's kubelet would, or the error response
/// it would send.
pub fn negotiate(headers: &HeaderMap, spdy: &[&str], websocket: &[&str]) -> Result<Upgrade, Box<Response>> {
    if websocket::is_websocket_request(headers) {
        let offered = websocket::offered_protocols(headers);
        return match websocket::select_protocol(&offered, websocket) {
            Some(p) => Ok(Upgrade::WebSocket(p)),
            None => Err(Box::new(text(
                StatusCode::FORBIDDEN,
                format!("requested protocol(s) are not supported: {offered:?}; supports {websocket:?}"),
            ))),
        };
    }
    let is_spdy = websocket::header_has_token(headers, "connection", "upgrade")
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("SPDY/3.1"));
    if !is_spdy {
        return Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request".into(),
        )));
    }
    let offered = spdy_offered(headers);
    if offered.is_empty() {
        // A client that does not negotiate gets the oldest protocol.
        return Ok(Upgrade::Spdy(String::new()));
    }
    match offered.iter().find(|p| spdy.contains(&p.as_str())) {
        Some(p) => Ok(Upgrade::Spdy(p.clone())),
        None => {
            let mut r = text(
                StatusCode::FORBIDDEN,
                format!("unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {spdy:?}"),
            );
            for p in spdy {
                if let Ok(v) = HeaderValue::from_str(p) {
                    r.headers_mut().append(ACCEPTED_PROTOCOLS_HEADER, v);
                }
            }
            Err(Box::new(r))
        }
    }
}

/// The 101 answer for the chosen protocol.
fn switching(headers: &HeaderMap, upgrade: &Upgrade) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    match upgrade {
        Upgrade::Spdy(p) => {
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            if let Ok(v) = HeaderValue::from_str(p) {
                if !p.is_empty() {
                    h.insert(PROTOCOL_HEADER, v);
                }
            }
        }
        Upgrade::WebSocket(p) => websocket::accept_headers(headers, p, h),
    }
    r
}

/// The upgrade future, or the answer for a connection that cannot be upgraded.
fn take_upgrade(req: &mut Request, upgrade: &Upgrade) -> Result<OnUpgrade, Box<Response>> {
    if matches!(upgrade, Upgrade::WebSocket(_)) {
        websocket::check_handshake(req.headers()).map_err(|e| Box::new(text(StatusCode::BAD_REQUEST, e.into())))?;
    }
    req.extensions_mut().remove::<OnUpgrade>().ok_or_else(|| {
        Box::new(text(StatusCode::INTERNAL_SERVER_ERROR, "unable to upgrade: the connection cannot be upgraded".into()))
    })
}

fn cri_error(e: CriError) -> Response {
    let status = if e.is_not_found() { StatusCode::NOT_FOUND } else { StatusCode::INTERNAL_SERVER_ERROR };
    text(status, e.to_string())
}

/// `POST|GET /exec/{namespace}/{pod}/{container}?command=…&stdin=…&stdout=…&stderr=…&tty=…`
/// for a running container.
pub async fn serve_exec(cri: Cri, container_id: String, req: Request) -> Response {
    let opts = match Options::from_query(req.uri().query()) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if opts.command.is_empty() {
        return text(StatusCode::BAD_REQUEST, "you must specify at least one command for the container".into());
    }
    let exec = api::ExecRequest {
        container_id,
        cmd: opts.command.clone(),
        tty: opts.tty,
        stdin: opts.stdin,
        stdout: opts.stdout,
        stderr: opts.stderr,
    };
    let url = cri.runtime().exec(exec).await.map(|r| r.into_inner().url).map_err(CriError::call("Exec"));
    serve_remote_command(url, opts, req).await
}

/// `POST|GET /attach/{namespace}/{pod}/{container}?stdin=…&stdout=…&stderr=…&tty=…`
pub async fn serve_attach(cri: Cri, container_id: String, req: Request) -> Response {
    let opts = match Options::from_query(req.uri().query()) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let attach =
        api::AttachRequest { container_id, stdin: opts.stdin, tty: opts.tty, stdout: opts.stdout, stderr: opts.stderr };
    let url = cri.runtime().attach(attach).await.map(|r| r.into_inner().url).map_err(CriError::call("Attach"));
    serve_remote_command(url, opts, req).await
}

async fn serve_remote_command(url: Result<String, CriError>, opts: Options, mut req: Request) -> Response {
    let upgrade = match negotiate(req.headers(), remotecommand::SPDY_PROTOCOLS, remotecommand::WEBSOCKET_PROTOCOLS) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let on_upgrade = match take_upgrade(&mut req, &upgrade) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return cri_error(e),
    };
    // Reach the runtime before answering, so a failure is an HTTP error the client shows.
    let runtime = match runtime_stream::connect(&url, &opts).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    tracing::debug!(protocol = ?upgrade, "exec/attach upgrade");
    let response = switching(req.headers(), &upgrade);
    tokio::spawn(async move {
        let io = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "exec upgrade failed");
                runtime.session.close().await;
                return;
            }
        };
        let client = match &upgrade {
            Upgrade::WebSocket(p) => remotecommand::websocket_client(io, p, &opts),
            Upgrade::Spdy(p) => {
                let (session, incoming) = spdy::Session::server(io);
                let protocol = if p.is_empty() { remotecommand::V1 } else { p.as_str() };
                match remotecommand::spdy_client(session.clone(), incoming, protocol, &opts).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "exec client did not open its streams");
                        session.close().await;
                        runtime.session.close().await;
                        return;
                    }
                }
            }
        };
        exec::bridge(client, runtime).await;
    });
    response
}

/// `POST|GET /portForward/{namespace}/{pod}` (`?ports=` for WebSocket clients).
pub async fn serve_port_forward(target: PortForwardTarget, mut req: Request) -> Response {
    let upgrade = match negotiate(req.headers(), &[portforward::SPDY_PROTOCOL], portforward::WEBSOCKET_PROTOCOLS) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let ws_ports = match &upgrade {
        Upgrade::WebSocket(p) if p != portforward::TUNNEL_PROTOCOL => {
            match portforward::ports_from_query(req.uri().query()) {
                Ok(ports) => ports,
                Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
            }
        }
        _ => Vec::new(),
    };
    let on_upgrade = match take_upgrade(&mut req, &upgrade) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    tracing::debug!(pod = %target.pod, protocol = ?upgrade, "port-forward upgrade");
    let response = switching(req.headers(), &upgrade);
    let target = Arc::new(target);
    tokio::spawn(async move {
        let io = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "port-forward upgrade failed");
                return;
            }
        };
        match upgrade {
            Upgrade::Spdy(_) => {
                let (session, incoming) = spdy::Session::server(io);
                portforward::serve_spdy(session, incoming, target).await;
            }
            Upgrade::WebSocket(p) if p == portforward::TUNNEL_PROTOCOL => {
                let (session, incoming) = spdy::Session::server(websocket::tunnel(io));
                portforward::serve_spdy(session, incoming, target).await;
            }
            Upgrade::WebSocket(p) => portforward::serve_websocket(io, &p, ws_ports, target).await,
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn spdy_negotiation_follows_the_client_order() {
        let h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ("x-stream-protocol-version", "v3.channel.k8s.io"),
        ]);
        assert_eq!(negotiate(&h, remotecommand::SPDY_PROTOCOLS, &[]).unwrap(), Upgrade::Spdy(remotecommand::V4.into()));
        let h = headers(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v9")]);
        let refused = negotiate(&h, remotecommand::SPDY_PROTOCOLS, &[]).unwrap_err();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert_eq!(refused.headers().get_all(ACCEPTED_PROTOCOLS_HEADER).iter().count(), 4);
        let plain = headers(&[("upgrade", "SPDY/3.1")]);
        assert_eq!(
            negotiate(&plain, remotecommand::SPDY_PROTOCOLS, &[]).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn websocket_negotiation_and_accept_header() {
        let h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io, v4.channel.k8s.io"),
        ]);
        let up = negotiate(&h, &[], portforward::WEBSOCKET_PROTOCOLS).unwrap();
        assert_eq!(up, Upgrade::WebSocket(portforward::TUNNEL_PROTOCOL.into()));
        let r = switching(&h, &up);
        assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(r.headers()["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(r.headers()["sec-websocket-protocol"], portforward::TUNNEL_PROTOCOL);
        let up = negotiate(&h, &[], remotecommand::WEBSOCKET_PROTOCOLS).unwrap();
        assert_eq!(up, Upgrade::WebSocket("v4.channel.k8s.io".into()));
    }
}
