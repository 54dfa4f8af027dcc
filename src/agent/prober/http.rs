//! httpGet probes and hooks: one GET as upstream's `NewRequestForHTTPGetAction`
//! builds it (User-Agent `kube-probe/1.33`, `Accept: */*`, the spec's
//! headers, `Host` from them), sent without keep-alive, HTTPS without
//! verifying the certificate, redirects followed within the same host up
//! to 10 requests (a redirect elsewhere is returned as the answer), the
//! whole exchange within the timeout. [`probe`] judges the answer as
//! upstream's `DoHTTPProbe`: 2xx success, 3xx success with a warning,
//! anything else "HTTP probe failed with statuscode: N".

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue, LOCATION};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use rustls::pki_types::ServerName;
use tokio::time::Instant;

use super::target::{resolve_container_port, PortError};
use super::tcp::DialError;
use super::text::quote;
use super::url::{HttpUrl, UrlError};
use super::{tcp, ProbeResult, KUBE_VERSION};

/// Upstream reads at most this much of a response body.
pub const MAX_BODY: usize = 10 * 1024;
/// Go's http.Client gives up after this many requests in one redirect chain.
const MAX_REQUESTS: usize = 10;

/// One GET, ready to send.
#[derive(Debug, Clone)]
pub struct HttpGetRequest {
    pub url: HttpUrl,
    /// Header lines in the spec's order, `User-Agent` and `Accept` added.
    headers: Vec<(String, String)>,
    /// A `Host` header from the spec, which replaces the URL's authority.
    host_header: Option<String>,
}

/// An answer: its status and the first 10 KiB of its body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why an httpGet action cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the pod has no IP address yet")]
    NoPodIp,
    #[error(transparent)]
    Port(#[from] PortError),
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No answer came: Go's `url.Error` text, `Get "<url>": <why>`.
    #[error("Get {}: {source}", quote(.url))]
    Request { url: String, source: ExchangeError },
    /// The answer came but its body could not be read.
    #[error("{0}")]
    Body(String),
}

/// Why one request got no answer, in the words of Go's client.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("unsupported protocol scheme {}", quote(.0))]
    UnsupportedScheme(String),
    #[error("net/http: invalid request target {}: {source}", quote(.target))]
    InvalidTarget { target: String, source: hyper::http::Error },
    #[error("http: invalid Host header {}", quote(.0))]
    InvalidHost(String),
    #[error("net/http: invalid header field name {}", quote(.0))]
    InvalidHeaderName(String),
    #[error("net/http: invalid header field value for {}", quote(.0))]
    InvalidHeaderValue(String),
    #[error("{}", dial_text(.0))]
    Dial(#[source] DialError),
    #[error("tls: {0}")]
    ServerName(#[source] rustls::pki_types::InvalidDnsNameError),
    #[error("tls: {0}")]
    TlsConfig(#[source] rustls::Error),
    /// An HTTPS request answered in plain HTTP.
    #[error("{text}", text = HTTP_TO_HTTPS)]
    HttpToHttps(#[source] std::io::Error),
    #[error("{}", tls_error_text(.0))]
    Tls(#[source] std::io::Error),
    #[error("{}", hyper_error_text(.0))]
    Http(#[source] hyper::Error),
    #[error("context deadline exceeded {AWAITING_HEADERS}")]
    Deadline,
    #[error("failed to parse Location header {}: {source}", quote(.location))]
    Location { location: String, source: UrlError },
    #[error("stopped after {MAX_REQUESTS} redirects")]
    TooManyRedirects,
}

/// What Go's client says when an HTTPS request meets a plain HTTP server.
const HTTP_TO_HTTPS: &str = "http: server gave HTTP response to HTTPS client";

impl HttpError {
    /// Upstream's lifecycle hooks retry such a request over plain HTTP.
    pub fn is_http_response_to_https(&self) -> bool {
        matches!(self, HttpError::Request { source: ExchangeError::HttpToHttps(_), .. })
    }
}

/// A dial's error; a timeout, as Go's client says it, while awaiting headers.
fn dial_text(e: &DialError) -> String {
    match e {
        DialError::Timeout(_) => format!("{e} {AWAITING_HEADERS}"),
        other => other.to_string(),
    }
}

impl HttpGetRequest {
    /// Builds the request of an httpGet action. `purpose` names the User-Agent
    /// (`probe`, `lifecycle`); `pod_ip` is used when the action names no host.
    pub fn new(
        action: &HTTPGetAction,
        container: &Container,
        pod_ip: Option<&str>,
        purpose: &str,
    ) -> Result<HttpGetRequest, RequestError> {
        let scheme = action.scheme.as_deref().unwrap_or_default().to_ascii_lowercase();
        let scheme = if scheme.is_empty() { "http".to_string() } else { scheme };
        let host = match action.host.as_deref().filter(|h| !h.is_empty()) {
            Some(h) => h.to_string(),
            None => pod_ip.filter(|ip| !ip.is_empty()).ok_or(RequestError::NoPodIp)?.to_string(),
        };
        let port = resolve_container_port(&action.port, container)?;
        let url = HttpUrl::new(&scheme, &host, port, action.path.as_deref().unwrap_or_default());
        let mut headers: Vec<(String, String)> =
            action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
        let has = |headers: &[(String, String)], name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        if !has(&headers, "user-agent") {
            headers.push(("User-Agent".into(), format!("kube-{purpose}/{KUBE_VERSION}")));
        }
        match headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("accept")) {
            None => headers.push(("Accept".into(), "*/*".into())),
            Some((_, v)) if v.is_empty() => headers.retain(|(n, _)| !n.eq_ignore_ascii_case("accept")),
            Some(_) => {}
        }
        let host_header = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v.clone());
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case("host"));
        Ok(HttpGetRequest { url, headers, host_header })
    }

    /// The same request over plain HTTP (upstream's lifecycle fallback),
    /// without `Authorization`.
    pub fn as_plain_http(&self) -> HttpGetRequest {
        let mut r = self.clone();
        r.url.scheme = "http".into();
        r.headers.retain(|(n, _)| !n.eq_ignore_ascii_case("authorization"));
        r
    }
}

/// One attempt of an httpGet probe.
pub async fn probe(req: &HttpGetRequest, timeout: Duration) -> ProbeResult {
    match get(req, Some(timeout)).await {
        Err(e @ HttpError::Request { .. }) => ProbeResult::Failure(e.to_string()),
        Err(HttpError::Body(e)) => ProbeResult::Unknown(e),
        Ok(resp) => {
            let body = String::from_utf8_lossy(&resp.body);
            match resp.status {
                200..=299 => ProbeResult::Success,
                300..=399 => ProbeResult::Warning(format!("Probe terminated redirects, Response body: {body}")),
                code => ProbeResult::Failure(format!("HTTP probe failed with statuscode: {code}")),
            }
        }
    }
}

/// Sends the request, following redirects within the same host, all
/// within `timeout` when given.
pub async fn get(req: &HttpGetRequest, timeout: Option<Duration>) -> Result<HttpResponse, HttpError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut url = req.url.clone();
    let mut host_header = req.host_header.clone();
    let mut requests = 0;
    loop {
        requests += 1;
        let fail = |url: &HttpUrl, source: ExchangeError| HttpError::Request { url: url.to_string(), source };
        let exchange = send_once(&url, &req.headers, host_header.as_deref(), deadline).await;
        let (resp, _conn) = exchange.map_err(|e| fail(&url, e))?;
        let status = resp.status().as_u16();
        let location = resp.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        if let (true, Some(location)) = (matches!(status, 301 | 302 | 303 | 307 | 308), location) {
            let next = url
                .join(&location)
                .map_err(|source| fail(&url, ExchangeError::Location { location: location.clone(), source }))?;
            if next.host != req.url.host {
                // Upstream's redirect checker: the answer is the redirect itself.
                tracing::debug!(from = %url, to = %next, "probe redirect to another host not followed");
            } else if requests >= MAX_REQUESTS {
                return Err(fail(&next, ExchangeError::TooManyRedirects));
            } else {
                if next.scheme != "http" && next.scheme != "https" {
                    return Err(fail(&next, ExchangeError::UnsupportedScheme(next.scheme.clone())));
                }
                // Go keeps a custom Host only through relative redirects.
                if super::url::has_scheme(&location) {
                    host_header = None;
                }
                url = next;
                continue;
            }
        }
        let body = read_body(resp.into_body(), deadline).await?;
        return Ok(HttpResponse { status, body });
    }
}

async fn read_body(mut body: hyper::body::Incoming, deadline: Option<Instant>) -> Result<Vec<u8>, HttpError> {
    let read = async {
        let mut out = Vec::new();
        while out.len() < MAX_BODY {
            match body.frame().await {
                None => break,
                Some(Err(e)) => return Err(HttpError::Body(hyper_error_text(&e))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let room = MAX_BODY - out.len();
                        out.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
            }
        }
        Ok(out)
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, read).await.unwrap_or_else(|_| {
            Err(HttpError::Body(
                "context deadline exceeded (Client.Timeout or context cancellation while reading body)".into(),
            ))
        }),
        None => read.await,
    }
}

/// Aborts the connection's driver task when the exchange is over.
struct ConnGuard(tokio::task::JoinHandle<()>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

const AWAITING_HEADERS: &str = "(Client.Timeout exceeded while awaiting headers)";

async fn send_once(
    url: &HttpUrl,
    headers: &[(String, String)],
    host_header: Option<&str>,
    deadline: Option<Instant>,
) -> Result<(hyper::Response<hyper::body::Incoming>, ConnGuard), ExchangeError> {
    if url.scheme != "http" && url.scheme != "https" {
        return Err(ExchangeError::UnsupportedScheme(url.scheme.clone()));
    }
    let request = build_request(url, headers, host_header)?;
    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let exchange = async {
        let tcp = tcp::dial(&url.host, url.port, deadline.unwrap_or(far)).await.map_err(ExchangeError::Dial)?;
        let io: Box<dyn Io> = if url.scheme == "https" {
            let name = ServerName::try_from(url.host.clone()).map_err(ExchangeError::ServerName)?;
            let connector = tokio_rustls::TlsConnector::from(insecure_tls().map_err(ExchangeError::TlsConfig)?);
            Box::new(connector.connect(name, tcp).await.map_err(tls_failure)?)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .title_case_headers(true)
            .handshake::<_, Empty<Bytes>>(TokioIo::new(io))
            .await
            .map_err(ExchangeError::Http)?;
        let guard = ConnGuard(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let resp = sender.send_request(request).await.map_err(ExchangeError::Http)?;
        Ok((resp, guard))
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, exchange).await.unwrap_or_else(|_| Err(ExchangeError::Deadline)),
        None => exchange.await,
    }
}

fn build_request(
    url: &HttpUrl,
    headers: &[(String, String)],
    host_header: Option<&str>,
) -> Result<hyper::Request<Empty<Bytes>>, ExchangeError> {
    let mut req = hyper::Request::get(url.request_target())
        .body(Empty::new())
        .map_err(|source| ExchangeError::InvalidTarget { target: url.request_target().to_string(), source })?;
    let h = req.headers_mut();
    let host = host_header.map(str::to_string).unwrap_or_else(|| url.authority());
    let host = HeaderValue::from_str(&host).map_err(|_| ExchangeError::InvalidHost(host.clone()))?;
    h.insert(hyper::header::HOST, host);
    for (name, value) in headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| ExchangeError::InvalidHeaderName(name.clone()))?;
        let v = HeaderValue::from_str(value).map_err(|_| ExchangeError::InvalidHeaderValue(name.clone()))?;
        h.append(n, v);
    }
    // Go's transport with keep-alives off.
    h.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    Ok(req)
}

fn hyper_error_text(e: &hyper::Error) -> String {
    if e.is_incomplete_message() || e.is_closed() {
        "EOF".into()
    } else if e.is_parse() {
        "net/http: HTTP/1.x transport connection broken: malformed HTTP response".into()
    } else {
        use std::error::Error as _;
        match e.source() {
            Some(io) => match io.downcast_ref::<std::io::Error>() {
                Some(io) => format!("read: {}", super::text::errno_text(io)),
                None => format!("{e}: {io}"),
            },
            None => e.to_string(),
        }
    }
}

/// A failed TLS handshake; a plain HTTP answer is told apart, as Go's
/// client tells it.
fn tls_failure(e: std::io::Error) -> ExchangeError {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            ExchangeError::HttpToHttps(e)
        }
        _ => ExchangeError::Tls(e),
    }
}

fn tls_error_text(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => HTTP_TO_HTTPS.into(),
        Some(other) => format!("tls: {other}"),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => "EOF".into(),
        None => format!("read: {}", super::text::errno_text(e)),
    }
}

/// A TLS client that checks the handshake but not who signed the
/// certificate, as upstream's probes (`InsecureSkipVerify`).
pub(crate) fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, rustls::Error>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
