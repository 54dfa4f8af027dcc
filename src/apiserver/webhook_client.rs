//! Calls to webhooks the cluster's configuration names (upstream's
//! `apiserver/pkg/util/webhook`): admission webhooks and CRD conversion
//! webhooks share the client config (`url`, or a `service` reached at one
//! of its ready endpoints with the Service's DNS name for TLS), the
//! `caBundle` the server is checked against, and the POST of one JSON
//! review with a deadline.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

use super::proxy::service_endpoint::{self, ServicePort, Unresolved};
use super::storage::Storage;

/// Why a webhook could not be called, or answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The client config names nothing that can be called (a bad URL or
    /// caBundle).
    #[error("{0}")]
    Config(String),
    /// The request did not get an answer (no endpoint of the Service,
    /// connection, TLS, deadline).
    #[error("Post \"{url}\": {cause}")]
    Transport { url: String, cause: String },
    /// The webhook answered with a status other than 2xx.
    #[error("{0}")]
    Status(String),
}

/// Where to send a review: the address to dial (or why there is none: a
/// Service is resolved as the connection is dialled, as upstream's dialer
/// does, so its failure is the POST's), the name TLS checks and the path.
pub struct Target {
    addr: Result<String, Unresolved>,
    server_name: String,
    /// `https://host[:port]` as upstream's URL shows it.
    base: String,
    path: String,
}

impl Target {
    /// The URL the review is posted to, as upstream's errors show it.
    fn url(&self, timeout: Duration) -> String {
        format!("{}{}?timeout={}s", self.base, self.path, timeout.as_secs())
    }
}

/// The target of a webhook's `clientConfig`: its `url`, or its `service`
/// resolved to one of the Service's ready endpoints.
pub async fn target(storage: &Storage, client_config: &Value) -> Result<Target, CallError> {
    if let Some(url) = client_config.get("url").and_then(Value::as_str) {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| CallError::Config(format!("webhook URL {url:?} must be https")))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let host =
            hostport.rsplit_once(':').map(|(h, _)| h).unwrap_or(hostport).trim_start_matches('[').trim_end_matches(']');
        let addr = if hostport.contains(':') && !hostport.ends_with(']') {
            hostport.to_string()
        } else {
            format!("{hostport}:443")
        };
        return Ok(Target {
            addr: Ok(addr),
            server_name: host.to_string(),
            base: format!("https://{hostport}"),
            path: path.to_string(),
        });
    }
    let svc =
        client_config.get("service").ok_or_else(|| CallError::Config("webhook has neither url nor service".into()))?;
    let ns = svc["namespace"].as_str().unwrap_or_default();
    let name = svc["name"].as_str().unwrap_or_default();
    let number = svc["port"].as_i64().unwrap_or(443);
    let path = svc["path"].as_str().filter(|p| !p.is_empty()).unwrap_or("/").to_string();
    let addr = service_endpoint::resolve(storage, ns, name, &ServicePort::Number(number)).await;
    let server_name = format!("{name}.{ns}.svc");
    Ok(Target { addr, base: format!("https://{server_name}:{number}"), server_name, path })
}

/// A TLS client that trusts the (base64 PEM) `caBundle` only.
fn tls_config(ca_bundle: Option<&str>) -> Result<Arc<rustls::ClientConfig>, CallError> {
    let bad = |e: String| CallError::Config(format!("caBundle: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    if let Some(b64) = ca_bundle {
        let pem = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| bad(e.to_string()))?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CallError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// POSTs `review` as JSON to `target` within `timeout`; the answer's body
/// when the webhook answered 2xx.
pub async fn post(
    target: &Target,
    ca_bundle: Option<&str>,
    review: &Value,
    timeout: Duration,
) -> Result<Bytes, CallError> {
    let url = target.url(timeout);
    let transport = |cause: String| CallError::Transport { url: url.clone(), cause };
    let connector = tokio_rustls::TlsConnector::from(tls_config(ca_bundle)?);
    let exchange = async {
        let addr = target.addr.as_ref().map_err(|e| transport(e.to_string()))?;
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| transport(e.to_string()))?;
        let name = ServerName::try_from(target.server_name.clone()).map_err(|e| transport(e.to_string()))?;
        let tls = connector.connect(name, tcp).await.map_err(|e| transport(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| transport(e.to_string()))?;
        tokio::spawn(conn);
        let req = hyper::Request::post(format!("{}?timeout={}s", target.path, timeout.as_secs()))
            .header("host", &target.server_name)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .map_err(|e| transport(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| transport(e.to_string()))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| transport(e.to_string()))?.to_bytes();
        if !status.is_success() {
            return Err(CallError::Status(status_error(status.as_u16(), &bytes)));
        }
        Ok(bytes)
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| transport("context deadline exceeded".into()))?
}

/// What a client-go REST client reports for a non-2xx answer: the
/// message of a metav1.Status body, else a sentence for the code.
fn status_error(code: u16, body: &[u8]) -> String {
    let status: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(message) = status.as_ref().and_then(|s| s["message"].as_str()).filter(|m| !m.is_empty()) {
        return message.to_string();
    }
    match code {
        404 => "the server could not find the requested resource".into(),
        _ => format!("the server responded with the status code {code} but did not return more information"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_2xx_answers_read_as_client_go_reports_them() {
        assert_eq!(status_error(500, br#"{"kind":"Status","message":"boom"}"#), "boom");
        assert_eq!(status_error(404, b"not json"), "the server could not find the requested resource");
        assert_eq!(
            status_error(503, b""),
            "the server responded with the status code 503 but did not return more information"
        );
    }
}
