//! The kubelet API of the node (upstream's `pkg/kubelet/server`): HTTPS on
//! port 10250 with a serving certificate from the cluster CA, callers
//! authenticated and authorized as upstream's kubelet does (see `auth`).
//! The API server reaches it for `pods/log`, `exec`, `attach`,
//! `portforward` and `nodes/proxy`; metrics-style readers for stats.

pub mod auth;
pub mod lookup;
mod serving_cert;
pub mod streams;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::config::KubeletTls;
use super::cri::Cri;
use super::kubelet::Kubelet;
use super::logs::endpoint::{self as container_logs, ContainerLogs};
use super::stats;
use auth::{Attributes, KubeletAuth, PeerCertificate};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("kubelet API certificate {path}: {message}")]
    Pem { path: String, message: String },
    #[error("kubelet API TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {addr} for the kubelet API: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// What every handler of the kubelet API shares.
pub struct KubeletServer {
    pub kubelet: Arc<Kubelet>,
    /// The runtime's socket: exec, attach, port-forward and logs go to it.
    pub cri: Cri,
    pub auth: KubeletAuth,
    /// Keeps each cgroup's last CPU reading between requests, for rates.
    pub stats: super::stats::StatsProvider,
}

/// The authenticated caller of a request (an extension set by `guard`).
#[derive(Debug, Clone)]
pub struct Caller(pub auth::UserInfo);

/// A plain-text error answer, as the kubelet writes them.
pub fn text_error(status: u16, message: impl std::fmt::Display) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message.to_string()).into_response()
}

/// The kubelet API's routes, every one behind authentication and authorization.
pub fn router(server: Arc<KubeletServer>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
        .route(
            "/stats/summary",
            get(|State(s): State<Arc<KubeletServer>>| async move { stats::serve_stats_summary(&s.stats).await }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Arc<KubeletServer>>| async move { stats::serve_kubelet_metrics(&s.stats).await }),
        )
        .route(
            "/metrics/resource",
            get(|State(s): State<Arc<KubeletServer>>| async move { stats::serve_resource_metrics(&s.stats).await }),
        )
        .route(
            "/metrics/cadvisor",
            get(|State(s): State<Arc<KubeletServer>>| async move { stats::serve_cadvisor_metrics(&s.stats).await }),
        )
        .route("/exec/{namespace}/{pod}/{container}", any(exec))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", any(exec_uid))
        .route("/attach/{namespace}/{pod}/{container}", any(attach))
        .route("/attach/{namespace}/{pod}/{uid}/{container}", any(attach_uid))
        .route("/portForward/{namespace}/{pod}", any(port_forward))
        .route("/portForward/{namespace}/{pod}/{uid}", any(port_forward_uid))
        .fallback(|| async { text_error(404, "404 page not found") })
        .layer(axum::middleware::from_fn_with_state(server.clone(), guard))
        .with_state(server)
}

/// Authenticates and authorizes every request before its route runs.
async fn guard(State(server): State<Arc<KubeletServer>>, mut req: Request, next: Next) -> Response {
    let cert = req.extensions().get::<PeerCertificate>().cloned().unwrap_or_default();
    let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let user = match server.auth.authenticate(&cert, authorization).await {
        Ok(u) => u,
        Err(e) => return text_error(e.status(), e),
    };
    let attrs = Attributes::of(req.method(), req.uri().path());
    if let Err(e) = server.auth.authorize(&user, &attrs).await {
        tracing::debug!(user = %user.name, path = %req.uri().path(), error = %e, "kubelet API refused");
        return text_error(e.status(), e);
    }
    req.extensions_mut().insert(Caller(user));
    next.run(req).await
}

/// `/containerLogs/{namespace}/{pod}/{container}`.
async fn container_logs(
    State(server): State<Arc<KubeletServer>>,
    axum::extract::Path((namespace, pod, container)): axum::extract::Path<(String, String, String)>,
    uri: axum::http::Uri,
) -> Response {
    let logs = ContainerLogs {
        client: server.kubelet.client.clone(),
        cri: server.cri.clone(),
        node_name: server.kubelet.config.node_name.clone(),
    };
    container_logs::serve_container_logs(&logs, &namespace, &pod, &container, uri.query()).await
}

/// `/pods`: the pods bound to this node, as a PodList.
async fn pods(State(server): State<Arc<KubeletServer>>) -> Response {
    let api: Api<Pod> = Api::all(server.kubelet.client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={}", server.kubelet.config.node_name));
    match api.list(&lp).await {
        Ok(list) => {
            axum::Json(serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list.items}))
                .into_response()
        }
        Err(e) => text_error(500, e),
    }
}

/// exec or attach: the running container named in the path, then the stream.
async fn remote_command(
    server: Arc<KubeletServer>,
    attach: bool,
    (namespace, pod, uid, container): (String, String, Option<String>, String),
    req: Request,
) -> Response {
    let cri = server.cri.clone();
    match lookup::running_container(&cri, &namespace, &pod, uid.as_deref(), &container).await {
        Ok(id) if attach => streams::serve_attach(cri, id, req).await,
        Ok(id) => streams::serve_exec(cri, id, req).await,
        Err(e) => text_error(e.status(), e),
    }
}

async fn exec(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod, c)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    remote_command(s, false, (ns, pod, None, c), req).await
}

async fn exec_uid(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod, uid, c)): Path<(String, String, String, String)>,
    req: Request,
) -> Response {
    remote_command(s, false, (ns, pod, Some(uid), c), req).await
}

async fn attach(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod, c)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    remote_command(s, true, (ns, pod, None, c), req).await
}

async fn attach_uid(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod, uid, c)): Path<(String, String, String, String)>,
    req: Request,
) -> Response {
    remote_command(s, true, (ns, pod, Some(uid), c), req).await
}

/// port-forward: the network namespace of the pod's sandbox, then the stream.
async fn forward(
    server: Arc<KubeletServer>,
    namespace: String,
    pod: String,
    uid: Option<String>,
    req: Request,
) -> Response {
    let cri = server.cri.clone();
    match lookup::pod_network_namespace(&cri, &namespace, &pod, uid.as_deref()).await {
        Ok(netns) => {
            let target =
                streams::PortForwardTarget { netns, pod: format!("{namespace}/{pod}"), uid: uid.unwrap_or_default() };
            streams::serve_port_forward(target, req).await
        }
        Err(e) => text_error(e.status(), e),
    }
}

async fn port_forward(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod)): Path<(String, String)>,
    req: Request,
) -> Response {
    forward(s, ns, pod, None, req).await
}

async fn port_forward_uid(
    State(s): State<Arc<KubeletServer>>,
    Path((ns, pod, uid)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    forward(s, ns, pod, Some(uid), req).await
}

fn tls_config(tls: &KubeletTls) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let pem = |path: &std::path::Path, e: &dyn std::fmt::Display| ServerError::Pem {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&tls.client_ca).map_err(|e| pem(&tls.client_ca, &e))? {
        roots.add(c.map_err(|e| pem(&tls.client_ca, &e))?).map_err(|e| ServerError::Tls(e.to_string()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let resolver = serving_cert::ServingCert::load(tls.cert.clone(), tls.key.clone(), provider.clone())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(resolver));
    // HTTP/1.1 first: the streams (SPDY, WebSocket) are HTTP/1.1 upgrades.
    config.alpn_protocols = vec![b"http/1.1".to_vec(), b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Starts the kubelet API on `port` of every address; runs until aborted.
pub async fn start(
    kubelet: Arc<Kubelet>,
    cri: Cri,
    tls: &KubeletTls,
    port: u16,
) -> Result<tokio::task::JoinHandle<()>, ServerError> {
    let config = tls_config(tls)?;
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
    let auth = KubeletAuth::new(kubelet.client.clone(), kubelet.config.node_name.clone());
    let stats = stats::StatsProvider::new(
        cri.clone(),
        kubelet.config.node_name.clone(),
        kubelet.config.kubelet.cgroup_root.clone(),
    );
    let app = router(Arc::new(KubeletServer { kubelet, cri, auth, stats }));
    tracing::info!(%addr, "kubelet API listening");
    Ok(tokio::spawn(accept(listener, TlsAcceptor::from(config), app)))
}

async fn accept(listener: TcpListener, acceptor: TlsAcceptor, app: Router) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "kubelet API: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let cert = PeerCertificate(
                tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| Arc::new(c.as_ref().to_vec())),
            );
            let service =
                hyper_util::service::TowerToHyperService::new(app.layer(axum::Extension(cert)).into_service());
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection_with_upgrades(TokioIo::new(tls), service).await {
                tracing::debug!(%peer, error = %e, "kubelet API: connection ended");
            }
        });
    }
}
