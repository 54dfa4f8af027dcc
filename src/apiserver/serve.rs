//! The HTTPS listener: rustls with optional client certificates (checked
//! against the client CA), HTTP/1.1 and HTTP/2, and the authenticated user
//! attached to every request of a connection.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;

use super::auth::User;
use crate::pki::tls::ServerSuites;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read {path}: {message}")]
    Pem { path: String, message: String },
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ServeError> {
    let err = |m: String| ServeError::Pem { path: path.display().to_string(), message: m };
    CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))
}

/// The TLS configs serving `cert`/`key`, asking for (not requiring) client
/// certificates signed by `client_ca`, in both cipher suite orders.
pub fn tls_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<ServerSuites, ServeError> {
    let (chain, mut roots) = (certs(cert)?, rustls::RootCertStore::empty());
    for c in certs(client_ca)? {
        roots.add(c).map_err(|e| ServeError::Verifier(e.to_string()))?;
    }
    let (roots, key) = (
        Arc::new(roots),
        PrivateKeyDer::from_pem_file(key)
            .map_err(|e| ServeError::Pem { path: key.display().to_string(), message: e.to_string() })?,
    );
    ServerSuites::new(|provider| {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .allow_unauthenticated()
            .build()
            .map_err(|e| ServeError::Verifier(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    })
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })
}

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: ServerSuites,
    app: Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        };
        let _ = tcp.set_nodelay(true);
        let suites = tls.clone();
        let app = app.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let handshake = async move {
                let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await?;
                let config = suites.for_client(start.client_hello().cipher_suites());
                start.into_stream(config).await
            };
            let tls = match tokio::time::timeout(std::time::Duration::from_secs(10), handshake).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|c| User::from_certificate(c.as_ref()))
                .unwrap_or_else(User::anonymous);
            let service = tower_service(app, user, peer);
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            let stopping = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::select! {
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(%peer, error = %e, "connection ended");
                    }
                    return;
                }
                _ = stopping => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        });
    }
}

/// The router as a hyper service that tags each request with `user` and
/// the address it came from.
fn tower_service(
    app: Router,
    user: User,
    peer: SocketAddr,
) -> hyper_util::service::TowerToHyperService<axum::routing::RouterIntoService<hyper::body::Incoming>> {
    hyper_util::service::TowerToHyperService::new(
        app.layer(axum::Extension(user)).layer(axum::Extension(super::audit::PeerAddr(peer))).into_service(),
    )
}
