//! How the API server reaches a node's kubelet API (upstream's
//! `pkg/kubelet/client`): HTTPS to the node's InternalIP (else ExternalIP)
//! and the port its status advertises, the kubelet's certificate checked
//! against the cluster's server CA, the API server's own client
//! certificate (`system:kube-apiserver`) presented. One connection per
//! request, kept for as long as its response (or upgraded stream) lives.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

/// How long dialling a kubelet may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet port when a node does not say.
const DEFAULT_KUBELET_PORT: u16 = 10250;

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("{path}: {message}")]
    Pem { path: String, message: String },
    #[error("kubelet client TLS: {0}")]
    Tls(String),
    #[error("dial tcp {addr}: {message}")]
    Dial { addr: SocketAddr, message: String },
    #[error("error trying to reach the kubelet at {addr}: {message}")]
    Exchange { addr: SocketAddr, message: String },
}

/// The TLS client the API server calls kubelets with.
#[derive(Clone)]
pub struct KubeletConnector {
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for KubeletConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeletConnector")
    }
}

impl KubeletConnector {
    pub fn new(server_ca: &Path, client_cert: &Path, client_key: &Path) -> Result<KubeletConnector, KubeletError> {
        let pem = |path: &Path, e: &dyn std::fmt::Display| KubeletError::Pem {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(server_ca).map_err(|e| pem(server_ca, &e))? {
            roots.add(c.map_err(|e| pem(server_ca, &e))?).map_err(|e| KubeletError::Tls(e.to_string()))?;
        }
        let chain = CertificateDer::pem_file_iter(client_cert)
            .map_err(|e| pem(client_cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem(client_cert, &e))?;
        let key = PrivateKeyDer::from_pem_file(client_key).map_err(|e| pem(client_key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| KubeletError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| KubeletError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeletConnector { tls: Arc::new(config) })
    }

    /// Sends `req` (its URI a path and query) to the kubelet at `addr`. The
    /// connection serves this one request and any upgrade it leads to.
    pub async fn send(
        &self,
        addr: SocketAddr,
        mut req: hyper::Request<Body>,
    ) -> Result<hyper::Response<Incoming>, KubeletError> {
        let dial = |message: String| KubeletError::Dial { addr, message };
        let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| dial("i/o timeout".into()))?
            .map_err(|e| dial(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let exchange = |message: String| KubeletError::Exchange { addr, message };
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .map_err(|e| exchange(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| exchange(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(%addr, error = %e, "kubelet connection ended");
            }
        });
        if let Ok(host) = addr.to_string().parse() {
            req.headers_mut().insert(hyper::header::HOST, host);
        }
        sender.send_request(req).await.map_err(|e| exchange(e.to_string()))
    }
}

/// The address and port of a node's kubelet API, from its status:
/// InternalIP first, then ExternalIP, as k3s prefers them.
pub fn node_endpoint(node: &Value) -> Option<SocketAddr> {
    let addresses = node.pointer("/status/addresses").and_then(Value::as_array)?;
    let ip = ["InternalIP", "ExternalIP"].iter().find_map(|kind| {
        addresses
            .iter()
            .filter(|a| a["type"].as_str() == Some(kind))
            .find_map(|a| a["address"].as_str().and_then(|s| s.parse::<IpAddr>().ok()))
    })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_endpoint_prefers_internal_ip_and_the_advertised_port() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "ExternalIP", "address": "1.2.3.4"},
                          {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 12345}}}});
        assert_eq!(node_endpoint(&node), Some("10.0.0.5:12345".parse().unwrap()));
        let external = json!({"status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}});
        assert_eq!(node_endpoint(&external), Some("1.2.3.4:10250".parse().unwrap()));
        assert_eq!(node_endpoint(&json!({"status": {}})), None);
    }
}
