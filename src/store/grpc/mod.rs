//! Serving a store as an etcd v3 gRPC endpoint, over HTTP or HTTPS (with
//! client-certificate checks when a trusted CA is given).

mod authority;
mod hpack;
mod services;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

pub use services::EtcdFacade;

use super::proto::{cluster_server, kv_server, lease_server, maintenance_server, watch_server};
use super::Store;

/// gRPC's own framing allowance on top of the largest request, as etcd has.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid listen URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("{0} is https but no --cert-file and --key-file were given")]
    MissingCert(String),
    #[error("cannot read {0}: {1}")]
    ReadFile(PathBuf, std::io::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Certificate files for HTTPS listeners.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// When set, clients must present a certificate signed by this CA.
    pub trusted_ca_file: Option<PathBuf>,
}

/// A listener bound and ready to serve.
pub struct Listener {
    pub url: String,
    pub addr: SocketAddr,
    tls: bool,
    listener: TcpListener,
}

/// Binds every URL before anything is served, so a bad address fails at once.
pub async fn bind(urls: &[String]) -> Result<Vec<Listener>, ServeError> {
    let mut out = Vec::new();
    for url in urls {
        let (tls, hostport) = if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else {
            return Err(ServeError::BadUrl(url.clone()));
        };
        let hostport = hostport.trim_end_matches('/');
        if hostport.is_empty() || hostport.contains('/') {
            return Err(ServeError::BadUrl(url.clone()));
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(hostport)
            .await
            .map_err(|e| ServeError::Resolve(hostport.to_string(), e))?
            .collect();
        let addr = *addrs.first().ok_or_else(|| ServeError::BadUrl(url.clone()))?;
        let listener = TcpListener::bind(addr).await.map_err(|e| ServeError::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| ServeError::Bind(addr, e))?;
        out.push(Listener { url: url.clone(), addr, tls, listener });
    }
    Ok(out)
}

fn read(path: &PathBuf) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|e| ServeError::ReadFile(path.clone(), e))
}

fn tls_config(url: &str, files: &TlsFiles) -> Result<ServerTlsConfig, ServeError> {
    let (Some(cert), Some(key)) = (&files.cert_file, &files.key_file) else {
        return Err(ServeError::MissingCert(url.to_string()));
    };
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &files.trusted_ca_file {
        config = config.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

/// Serves `store` on every listener until `shutdown` resolves.
pub async fn serve(
    store: Arc<dyn Store>,
    listeners: Vec<Listener>,
    tls: TlsFiles,
    max_request_bytes: usize,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let facade = EtcdFacade::new(store);
    let max_decode = max_request_bytes + GRPC_OVERHEAD_BYTES;
    let mut tasks = Vec::new();
    for l in listeners {
        let mut server = Server::builder();
        if l.tls {
            server = server.tls_config(tls_config(&l.url, &tls)?)?;
        }
        let router = server
            .add_service(kv_server::KvServer::new(facade.clone()).max_decoding_message_size(max_decode))
            .add_service(watch_server::WatchServer::new(facade.clone()).max_decoding_message_size(max_decode))
            .add_service(lease_server::LeaseServer::new(facade.clone()))
            .add_service(maintenance_server::MaintenanceServer::new(facade.clone()))
            .add_service(cluster_server::ClusterServer::new(facade.clone()));
        let mut stop = shutdown.clone();
        tracing::info!(url = %l.url, addr = %l.addr, "serving the etcd v3 API");
        // Small answers must not wait for Nagle's algorithm and delayed ACKs.
        let incoming = tonic::transport::server::TcpIncoming::from(l.listener)
            .with_nodelay(Some(true))
            .map(|conn| conn.map(authority::AuthorityFix::new));
        tasks.push(tokio::spawn(router.serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }
    for task in tasks {
        match task.await {
            Ok(res) => res?,
            Err(e) => tracing::error!(error = %e, "listener task failed"),
        }
    }
    Ok(())
}
