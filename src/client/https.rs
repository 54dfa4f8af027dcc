//! How a node on another machine reaches the API: a `kube::Client` over
//! one HTTP/2 connection (every request and watch multiplexed on it),
//! with the node's client certificate, checking the servers against the
//! cluster's server CA, and failing over between servers on its own, as
//! k3s' agent load balancer does: when the connection to one server
//! breaks (or cannot be made), the next request dials the next server of
//! the list, and the watches that broke with it resume there.
//!
//! The list starts with the `--server` the node joined and follows the
//! `kubernetes` EndpointSlice (every live server's address), kept in a
//! file so that a restart can fail over even when the first server is
//! the one that is down.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{Request, Response, Uri};
use futures_util::future::BoxFuture;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;

use crate::sync::{LockExt, RwLockExt};

/// How long dialling one server may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings find a server that went away without closing the connection.
const KEEPALIVE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("no API server reachable (tried {tried}): {last}")]
    Unreachable { tried: String, last: DialError },
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("bad request URI: {0}")]
    Uri(String),
}

/// Why one server could not be dialled.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("no servers")]
    NoServers,
    #[error("{host}: {source}")]
    ServerName { host: String, source: rustls::pki_types::InvalidDnsNameError },
    #[error("dial tcp {0}: timed out")]
    DialTimeout(String),
    #[error("dial tcp {server}: {source}")]
    Dial { server: String, source: std::io::Error },
    #[error("TLS handshake with {0}: timed out")]
    TlsTimeout(String),
    #[error("TLS handshake with {server}: {source}")]
    Tls { server: String, source: std::io::Error },
    #[error("HTTP/2 with {server}: {source}")]
    Http2 { server: String, source: hyper::Error },
}

/// The API servers a node may talk to (`host:port` each), in order of
/// preference, shared by the transport and whoever keeps it up to date.
#[derive(Debug)]
pub struct ServerList {
    /// The server the node was told to join; kept as a last resort.
    joined: String,
    servers: Mutex<Vec<String>>,
    /// Where the list is kept across restarts.
    file: Option<PathBuf>,
}

impl ServerList {
    /// The list for a node joined through `joined` (`host:port`), with what
    /// `file` remembers of the last run.
    pub fn new(joined: String, file: Option<PathBuf>) -> Arc<ServerList> {
        let mut servers = vec![joined.clone()];
        if let Some(saved) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
            for s in saved.lines().map(str::trim).filter(|s| !s.is_empty()) {
                if !servers.iter().any(|x| x == s) {
                    servers.push(s.to_string());
                }
            }
        }
        Arc::new(ServerList { joined, servers: Mutex::new(servers), file })
    }

    pub fn get(&self) -> Vec<String> {
        self.servers.locked().clone()
    }

    /// Replaces the list with the live servers the cluster names (the
    /// joined one stays, last, unless it is among them).
    pub fn set(&self, live: Vec<String>) {
        let mut next = live;
        next.dedup();
        if next.is_empty() {
            return;
        }
        if !next.contains(&self.joined) {
            next.push(self.joined.clone());
        }
        let mut servers = self.servers.locked();
        if *servers == next {
            return;
        }
        tracing::info!(servers = ?next, "API servers");
        *servers = next;
        if let Some(f) = &self.file {
            if let Err(e) = crate::pki::write(f, &(servers.join("\n") + "\n"), 0o600) {
                tracing::warn!(file = %f.display(), error = %e, "cannot save the server list");
            }
        }
    }
}

struct Connection {
    sender: SendRequest<kube::client::Body>,
    server: String,
}

struct Shared {
    servers: Arc<ServerList>,
    tls: RwLock<Arc<rustls::ClientConfig>>,
    connection: tokio::sync::Mutex<Option<Connection>>,
}

/// The tower service under the node's `kube::Client`.
#[derive(Clone)]
pub struct Transport {
    shared: Arc<Shared>,
}

impl Transport {
    pub fn new(servers: Arc<ServerList>, tls: Arc<rustls::ClientConfig>) -> Transport {
        Transport {
            shared: Arc::new(Shared { servers, tls: RwLock::new(tls), connection: tokio::sync::Mutex::new(None) }),
        }
    }

    /// New credentials (a renewed certificate), used from the next connection on.
    pub fn set_tls(&self, tls: Arc<rustls::ClientConfig>) {
        *self.shared.tls.write_locked() = tls;
    }

    /// The `kube::Client` over this transport.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// The server the connection is open to, if any.
    pub async fn current(&self) -> Option<String> {
        self.shared.connection.lock().await.as_ref().filter(|c| !c.sender.is_closed()).map(|c| c.server.clone())
    }
}

impl Shared {
    /// The open connection's sender, or a new connection to the first
    /// server of the list (after the one that failed) that answers.
    async fn sender(&self) -> Result<(SendRequest<kube::client::Body>, String), TransportError> {
        let mut slot = self.connection.lock().await;
        let previous = match slot.as_ref() {
            Some(c) if !c.sender.is_closed() => return Ok((c.sender.clone(), c.server.clone())),
            Some(c) => Some(c.server.clone()),
            None => None,
        };
        let mut servers = self.servers.get();
        // Start after the server that failed last.
        if let Some(i) = previous.and_then(|p| servers.iter().position(|s| *s == p)) {
            let n = servers.len();
            servers.rotate_left((i + 1) % n);
        }
        let tls = self.tls.read_locked().clone();
        let mut last = DialError::NoServers;
        for server in &servers {
            match connect(server, tls.clone()).await {
                Ok(sender) => {
                    tracing::info!(server = %server, "connected to the API server");
                    *slot = Some(Connection { sender: sender.clone(), server: server.clone() });
                    return Ok((sender, server.clone()));
                }
                Err(e) => {
                    tracing::warn!(server = %server, error = %e, "cannot reach the API server");
                    last = e;
                }
            }
        }
        *slot = None;
        Err(TransportError::Unreachable { tried: servers.join(", "), last })
    }
}

/// Dials `server` (`host:port`), TLS with ALPN h2, and starts HTTP/2.
async fn connect(server: &str, tls: Arc<rustls::ClientConfig>) -> Result<SendRequest<kube::client::Body>, DialError> {
    let host = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server).trim_matches(['[', ']']);
    let name = ServerName::try_from(host.to_string())
        .map_err(|source| DialError::ServerName { host: host.to_string(), source })?;
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(server))
        .await
        .map_err(|_| DialError::DialTimeout(server.to_string()))?
        .map_err(|source| DialError::Dial { server: server.to_string(), source })?;
    let _ = tcp.set_nodelay(true);
    let stream = tokio::time::timeout(DIAL_TIMEOUT, tokio_rustls::TlsConnector::from(tls).connect(name, tcp))
        .await
        .map_err(|_| DialError::TlsTimeout(server.to_string()))?
        .map_err(|source| DialError::Tls { server: server.to_string(), source })?;
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|source| DialError::Http2 { server: server.to_string(), source })?;
    let server = server.to_string();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(server = %server, error = %e, "API server connection ended");
        }
    });
    Ok(sender)
}

impl tower::Service<Request<kube::client::Body>> for Transport {
    type Response = Response<Incoming>;
    type Error = TransportError;
    type Future = BoxFuture<'static, Result<Response<Incoming>, TransportError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<kube::client::Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move {
            let (mut sender, server) = shared.sender().await?;
            let path = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
            *req.uri_mut() =
                Uri::try_from(format!("https://{server}{path}")).map_err(|e| TransportError::Uri(e.to_string()))?;
            // A broken connection is seen closed by the next request, which dials again.
            sender.send_request(req).await.map_err(TransportError::from)
        })
    }
}

/// Keeps `servers` in step with the `kubernetes` EndpointSlice(s): every
/// ready endpoint address at the `https` port. Runs until aborted.
pub async fn follow_servers(client: kube::Client, servers: Arc<ServerList>) {
    use futures_util::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::{reflector, watcher};
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, "default");
    let config = watcher::Config::default().labels("kubernetes.io/service-name=kubernetes");
    let (store, writer) = reflector::store();
    let mut events = std::pin::pin!(reflector::reflector(writer, super::typed_watcher::watch(api, config)));
    while let Some(event) = events.next().await {
        if !matches!(event, Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) {
            continue;
        }
        let mut live = Vec::new();
        for slice in store.state() {
            let port = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("https"))
                .or_else(|| slice.ports.as_ref().and_then(|p| p.first()))
                .and_then(|p| p.port);
            let Some(port) = port else { continue };
            for ep in &slice.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for addr in &ep.addresses {
                    let host = if addr.contains(':') { format!("[{addr}]") } else { addr.clone() };
                    live.push(format!("{host}:{port}"));
                }
            }
        }
        live.sort();
        servers.set(live);
    }
}
