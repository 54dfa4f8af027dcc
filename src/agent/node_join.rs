//! Joining a server (upstream's kubelet TLS bootstrap, in k3s' manner):
//!
//! 1. read the server's CA bundle from `/cacerts` (nothing secret sent
//!    yet) and check its SHA-256 against the join token's;
//! 2. with that CA trusted, read the cluster settings with the token (a
//!    node that joined before uses its own client certificate while it is
//!    valid, so a rotated token does not lock it out);
//! 3. generate the node's keys here and send certificate requests for its
//!    client certificate (`system:node:<name>`, `system:nodes`) and its
//!    kubelet serving certificate (its name and addresses), proving the
//!    node's name with its node password.
//!
//! Certificates are kept in the agent's folder and reused while they are
//! more than 90 days from expiry; [`renew`] requests new ones before
//! then, authenticated by the current client certificate.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::client::node_join::{
    NodeJoinConfig, CONFIG_PATH, KUBELET_CLIENT_CERT_PATH, KUBELET_SERVING_CERT_PATH, NODE_IP_HEADER, NODE_NAME_HEADER,
    NODE_PASSWORD_HEADER, SERVER_CA_PATH,
};
use crate::pki::join_token::JoinToken;
use crate::pki::LeafSpec;

const TIMEOUT: Duration = Duration::from_secs(15);
/// Certificates are renewed this long before they expire.
const RENEW_BEFORE_SECS: i64 = 90 * 86_400;

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "the server's CA certificate (sha256 {got}) is not the one the token names (sha256 {expected}): \
         either the token is for another cluster or something is in the way; check --server and --token"
    )]
    CaMismatch { expected: String, got: String },
    #[error(
        "the server's CA certificate changed since this node joined ({file}); the token carries no CA hash \
         to prove the new one: use a token with its K10<hash> prefix"
    )]
    CaChanged { file: String },
    #[error("the server refused the token (401 Unauthorized): check --token")]
    Unauthorized,
    #[error("the server refused to {what}: {message}")]
    Refused { what: &'static str, message: String },
    #[error("cannot reach the server at {server}: {message}")]
    Unreachable { server: String, message: String },
    #[error("cannot {action} {path}: {message}")]
    Io { action: &'static str, path: String, message: String },
    #[error("{0}")]
    Pki(String),
}

/// What a node needs to know to join.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// `host:port` of the server named by `--server`.
    pub server: String,
    pub token: JoinToken,
    pub node_name: String,
    /// The node's addresses, for its serving certificate.
    pub node_ips: Vec<IpAddr>,
    /// `<data-dir>/agent`.
    pub dir: PathBuf,
}

/// Where a joined node's credentials are.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub server_ca: PathBuf,
    pub client_ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub node_password: PathBuf,
}

impl Credentials {
    pub fn in_dir(dir: &Path) -> Credentials {
        Credentials {
            server_ca: dir.join("server-ca.crt"),
            client_ca: dir.join("client-ca.crt"),
            client_cert: dir.join("client-kubelet.crt"),
            client_key: dir.join("client-kubelet.key"),
            serving_cert: dir.join("serving-kubelet.crt"),
            serving_key: dir.join("serving-kubelet.key"),
            node_password: dir.join("node-password"),
        }
    }
}

/// A joined node: the cluster's settings and its credentials.
#[derive(Debug, Clone)]
pub struct Joined {
    pub config: NodeJoinConfig,
    pub credentials: Credentials,
}

fn read(path: &Path) -> Result<Option<String>, JoinError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JoinError::Io { action: "read", path: path.display().to_string(), message: e.to_string() }),
    }
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<(), JoinError> {
    crate::pki::write(path, contents, mode).map_err(|e| JoinError::Pki(e.to_string()))
}

/// One HTTP/1.1 exchange over TLS.
async fn exchange(
    server: &str,
    tls: Arc<rustls::ClientConfig>,
    method: Method,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), JoinError> {
    let unreachable = |message: String| JoinError::Unreachable { server: server.to_string(), message };
    let host = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server).trim_matches(['[', ']']);
    let name = ServerName::try_from(host.to_string()).map_err(|e| unreachable(e.to_string()))?;
    let work = async {
        let tcp = tokio::net::TcpStream::connect(server).await.map_err(|e| unreachable(e.to_string()))?;
        let stream =
            tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(connection);
        let mut req = Request::builder().method(method).uri(path).header("host", server);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| unreachable(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes().to_vec();
        Ok((status, body))
    };
    tokio::time::timeout(TIMEOUT, work).await.map_err(|_| unreachable("timed out".into()))?
}

/// The message of a refusal: a Status' `message`, else the body.
fn refusal(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| text.trim().to_string())
}

/// Reads the server's CA bundle and checks it against the token: its
/// SHA-256 must be the token's; or, after a CA rotation, the bundle must
/// end with the one the token names (or the one this node trusted before),
/// and the server must prove itself under that old CA, through the
/// cross-signed certificate it sends, by serving the same bundle again.
async fn fetch_server_ca(opts: &JoinOptions, file: &Path) -> Result<String, JoinError> {
    let insecure = crate::agent::prober::http::insecure_tls().map_err(|e| JoinError::Pki(format!("tls: {e}")))?;
    let (status, body) = exchange(&opts.server, insecure, Method::GET, SERVER_CA_PATH, &[], Vec::new()).await?;
    if status != StatusCode::OK {
        return Err(JoinError::Refused { what: "give its CA", message: format!("{status}: {}", refusal(&body)) });
    }
    let got = crate::pki::ca_hash(&body);
    let bundle = String::from_utf8(body).map_err(|_| JoinError::Pki("the CA bundle is not text".into()))?;
    let (old, refused) = match &opts.token.ca_hash {
        Some(expected) if *expected == got => return Ok(bundle),
        Some(expected) => {
            let mismatch = JoinError::CaMismatch { expected: expected.clone(), got: got.clone() };
            match crate::pki::ca_bundle::suffix_with_hash(&bundle, expected) {
                Some(old) => (old.to_string(), mismatch),
                None => return Err(mismatch),
            }
        }
        None => match read(file)? {
            Some(known) if known == bundle => return Ok(bundle),
            Some(known) => (known, JoinError::CaChanged { file: file.display().to_string() }),
            None => {
                tracing::warn!(
                    ca_sha256 = %got,
                    "the token carries no CA hash: trusting the server's CA as first seen (use the full K10… token)"
                );
                return Ok(bundle);
            }
        },
    };
    let Ok(trusted) = crate::pki::tls::client_config(&old, None, &[b"http/1.1"]) else { return Err(refused) };
    match exchange(&opts.server, trusted, Method::GET, SERVER_CA_PATH, &[], Vec::new()).await {
        Ok((StatusCode::OK, again)) if again == bundle.as_bytes() => {
            tracing::info!(ca_sha256 = %got, "the server's CAs were rotated: taking the new bundle, vouched for by the old CA");
            Ok(bundle)
        }
        Ok(_) => Err(refused),
        Err(e) => {
            tracing::warn!(error = %e, "the server does not prove itself under the CA this node trusted");
            Err(refused)
        }
    }
}

/// Joins (or rejoins) the cluster: the CA checked, the settings read,
/// the certificates the node lacks requested.
pub async fn join(opts: &JoinOptions) -> Result<Joined, JoinError> {
    let creds = Credentials::in_dir(&opts.dir);
    let server_ca = fetch_server_ca(opts, &creds.server_ca).await?;
    write(&creds.server_ca, &server_ca, 0o644)?;
    if let Some(joined) = rejoin(opts, &creds).await {
        return Ok(joined);
    }
    let trusted = crate::pki::tls::client_config(&server_ca, None, &[b"http/1.1"])
        .map_err(|e| JoinError::Pki(format!("{}: {e}", creds.server_ca.display())))?;
    let bearer = format!("Bearer {}", opts.token.bearer());
    let config = fetch_config(opts, &trusted, &[("authorization", bearer.clone())], &creds).await?;
    let password = match read(&creds.node_password)? {
        Some(p) if !p.trim().is_empty() => p.trim().to_string(),
        _ => {
            let p = crate::pki::node_password::generate();
            write(&creds.node_password, &format!("{p}\n"), 0o600)?;
            p
        }
    };
    ensure_credentials(opts, &trusted, &Auth::Token { bearer, password }, &creds).await?;
    Ok(Joined { config, credentials: creds })
}

/// The cluster settings from `/v1-ferrok/config`; the client CA they name
/// is written beside the node's credentials.
async fn fetch_config(
    opts: &JoinOptions,
    tls: &Arc<rustls::ClientConfig>,
    headers: &[(&str, String)],
    creds: &Credentials,
) -> Result<NodeJoinConfig, JoinError> {
    let what = "give the cluster settings";
    let (status, body) = exchange(&opts.server, tls.clone(), Method::GET, CONFIG_PATH, headers, Vec::new()).await?;
    match status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED => return Err(JoinError::Unauthorized),
        _ => return Err(JoinError::Refused { what, message: refusal(&body) }),
    }
    let config: NodeJoinConfig = serde_json::from_slice(&body)
        .map_err(|e| JoinError::Refused { what, message: format!("unreadable answer: {e}") })?;
    write(&creds.client_ca, &config.client_ca, 0o644)?;
    Ok(config)
}

/// The node's client and serving certificates, kept while good, else requested.
async fn ensure_credentials(
    opts: &JoinOptions,
    tls: &Arc<rustls::ClientConfig>,
    auth: &Auth,
    creds: &Credentials,
) -> Result<(), JoinError> {
    let client_spec = LeafSpec::client(&format!("system:node:{}", opts.node_name), &["system:nodes"]);
    ensure(opts, tls, auth, Kind::Client, &creds.client_cert, &creds.client_key, &client_spec).await?;
    ensure(opts, tls, auth, Kind::Serving, &creds.serving_cert, &creds.serving_key, &serving_spec(opts)).await
}

/// A node that joined before rejoins with its own client certificate while
/// it is valid, so a rotated join token does not lock it out; None when it
/// has none or the server does not take it (the token is tried then).
async fn rejoin(opts: &JoinOptions, creds: &Credentials) -> Option<Joined> {
    let cert = read(&creds.client_cert).ok()??;
    read(&creds.client_key).ok()??;
    let cn = format!("system:node:{}", opts.node_name);
    if !subject_matches(&cert, &cn) || crate::pki::seconds_left(&cert).unwrap_or(0) < 60 {
        return None;
    }
    let attempt = async {
        let tls = client_tls(creds, b"http/1.1")?;
        let config = fetch_config(opts, &tls, &[], creds).await?;
        ensure_credentials(opts, &tls, &Auth::Certificate, creds).await?;
        Ok::<_, JoinError>(config)
    };
    match attempt.await {
        Ok(config) => Some(Joined { config, credentials: creds.clone() }),
        Err(e) => {
            tracing::info!(error = %e, "the node's own certificate was not accepted; joining with the token");
            None
        }
    }
}

fn serving_spec(opts: &JoinOptions) -> LeafSpec {
    LeafSpec::server(&opts.node_name, vec![opts.node_name.clone(), "localhost".into()], opts.node_ips.clone())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Client,
    Serving,
}

/// How a certificate request is authenticated: the join token and the
/// node password, or (renewal) the node's own client certificate.
enum Auth {
    Token { bearer: String, password: String },
    Certificate,
}

/// Keeps the certificate at `cert` when it is good for `spec`, else requests one.
async fn ensure(
    opts: &JoinOptions,
    tls: &Arc<rustls::ClientConfig>,
    auth: &Auth,
    kind: Kind,
    cert: &Path,
    key: &Path,
    spec: &LeafSpec,
) -> Result<(), JoinError> {
    if let (Some(c), Some(_)) = (read(cert)?, read(key)?) {
        let subject_ok = kind == Kind::Serving || subject_matches(&c, &spec.common_name);
        if subject_ok && crate::pki::still_good(&c, spec).unwrap_or(false) {
            return Ok(());
        }
    }
    request(opts, tls, auth, kind, cert, key).await
}

fn subject_matches(cert_pem: &str, cn: &str) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else { return false };
    crate::pki::subject_of(&pem.contents).is_some_and(|(name, _)| name == cn)
}

/// A new key, a request for it, the signed certificate: both written.
async fn request(
    opts: &JoinOptions,
    tls: &Arc<rustls::ClientConfig>,
    auth: &Auth,
    kind: Kind,
    cert: &Path,
    key: &Path,
) -> Result<(), JoinError> {
    let key_pem = crate::pki::new_key_pem().map_err(|e| JoinError::Pki(e.to_string()))?;
    let csr = crate::pki::new_request(&key_pem, &format!("system:node:{}", opts.node_name))
        .map_err(|e| JoinError::Pki(e.to_string()))?;
    let mut headers = vec![(NODE_NAME_HEADER, opts.node_name.clone())];
    if let Auth::Token { bearer, password } = auth {
        headers.push(("authorization", bearer.clone()));
        headers.push((NODE_PASSWORD_HEADER, password.clone()));
    }
    let (path, what) = match kind {
        Kind::Client => (KUBELET_CLIENT_CERT_PATH, "sign the node's client certificate"),
        Kind::Serving => {
            let ips: Vec<String> = opts.node_ips.iter().map(|ip| ip.to_string()).collect();
            headers.push((NODE_IP_HEADER, ips.join(",")));
            (KUBELET_SERVING_CERT_PATH, "sign the node's serving certificate")
        }
    };
    let (status, body) = exchange(&opts.server, tls.clone(), Method::POST, path, &headers, csr.into_bytes()).await?;
    match status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED => return Err(JoinError::Unauthorized),
        _ => return Err(JoinError::Refused { what, message: refusal(&body) }),
    }
    let pem = String::from_utf8(body).map_err(|_| JoinError::Refused { what, message: "not a PEM answer".into() })?;
    write(key, &key_pem, 0o600)?;
    write(cert, &pem, 0o644)?;
    tracing::info!(path = %cert.display(), "received a signed node certificate");
    Ok(())
}

/// The TLS client configuration of the node towards the API servers: the
/// server CA trusted, the node's client certificate presented, HTTP/2.
pub fn api_tls(creds: &Credentials) -> Result<Arc<rustls::ClientConfig>, JoinError> {
    client_tls(creds, b"h2")
}

fn client_tls(creds: &Credentials, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>, JoinError> {
    let ca = read(&creds.server_ca)?.unwrap_or_default();
    let cert = read(&creds.client_cert)?.unwrap_or_default();
    let key = read(&creds.client_key)?.unwrap_or_default();
    crate::pki::tls::client_config(&ca, Some((&cert, &key)), &[alpn]).map_err(|e| JoinError::Pki(e.to_string()))
}

/// Renews the node's certificates 90 days before they expire, with the
/// current client certificate as credential, for as long as it runs;
/// a renewed client certificate goes to `on_client_renewed`.
pub async fn renew(
    opts: JoinOptions,
    creds: Credentials,
    on_client_renewed: impl Fn(Arc<rustls::ClientConfig>) + Send,
) {
    loop {
        let left = |p: &Path| read(p).ok().flatten().and_then(|c| crate::pki::seconds_left(&c).ok()).unwrap_or(0);
        let due = left(&creds.client_cert).min(left(&creds.serving_cert)) - RENEW_BEFORE_SECS;
        if due > 0 {
            // Long sleeps are cut in days, so that a suspended machine notices soon after it wakes.
            tokio::time::sleep(Duration::from_secs(due.min(86_400) as u64)).await;
            continue;
        }
        let outcome = async {
            let tls = client_tls(&creds, b"http/1.1")?;
            ensure_credentials(&opts, &tls, &Auth::Certificate, &creds).await?;
            api_tls(&creds)
        }
        .await;
        match outcome {
            Ok(tls) => on_client_renewed(tls),
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the node's certificates; retrying in a minute");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}
