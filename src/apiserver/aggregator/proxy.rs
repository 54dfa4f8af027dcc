//! Passing a request on to an aggregated API server: authorized here as
//! upstream's aggregator does (RBAC on the group's resources), sent to a
//! ready endpoint of the APIService's Service with the caller named in the
//! front proxy's headers, and answered with the other server's answer
//! (streamed, so watches pass through; upgrades spliced).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::Remote;
use crate::apiserver::auth::{self, User};
use crate::apiserver::proxy::relay;
use crate::apiserver::proxy::service_endpoint::{resolve, ServicePort, Unresolved};
use crate::apiserver::request::{self, ResourcePath};
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

/// How long dialling an aggregated API server may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The headers naming the caller, as the front proxy sets them.
const USER_HEADER: &str = "x-remote-user";
const GROUP_HEADER: &str = "x-remote-group";
const EXTRA_PREFIX: &str = "x-remote-extra-";

/// Why a remote cannot be reached: the reason and message of its
/// APIService's `Available` condition (upstream's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    pub reason: &'static str,
    pub message: String,
}

/// The address of a ready endpoint of the remote's Service, on the port
/// the APIService names, from the Service's EndpointSlices.
pub async fn endpoint(api: &Api, remote: &Remote) -> Result<SocketAddr, Unreachable> {
    let (ns, name) = (remote.namespace.as_str(), remote.service.as_str());
    let port = ServicePort::Number(i64::from(remote.port));
    let unreachable = |reason, message| Unreachable { reason, message };
    let addr = resolve(&api.storage, ns, name, &port).await.map_err(|e| match e {
        Unresolved::ServiceNotFound(_) => {
            unreachable("ServiceNotFound", format!("service/{name} in {ns:?} is not present"))
        }
        Unresolved::NoPort { .. } => unreachable(
            "ServicePortError",
            format!("service/{name} in {ns:?} is not listening on port {}", remote.port),
        ),
        Unresolved::NoSlices(_) => {
            unreachable("EndpointsNotFound", format!("cannot find endpointslices for service/{name} in {ns:?}"))
        }
        Unresolved::NoAddress { port_name, .. } => unreachable(
            "MissingEndpoints",
            format!("endpointslices for service/{name} in {ns:?} have no addresses with port name {port_name:?}"),
        ),
        Unresolved::Store(e) => unreachable("FailedDiscoveryCheck", e.to_string()),
    })?;
    addr.parse().map_err(|_| unreachable("MissingEndpoints", format!("not an address: {addr}")))
}

/// Sends `req` to the remote as `user` (its name and groups in the front
/// proxy's headers; whatever such headers the caller sent are dropped).
pub async fn send(
    api: &Api,
    remote: &Remote,
    user: &User,
    req: hyper::Request<Body>,
) -> Result<hyper::Response<Incoming>, ApiError> {
    send_with(api, remote, &remote.tls, user, req).await
}

/// `send` with TLS settings of the caller's (the availability check's,
/// which trusts any serving certificate, as upstream's does).
pub(super) async fn send_with(
    api: &Api,
    remote: &Remote,
    tls: &Arc<rustls::ClientConfig>,
    user: &User,
    mut req: hyper::Request<Body>,
) -> Result<hyper::Response<Incoming>, ApiError> {
    let addr = endpoint(api, remote).await.map_err(|u| ApiError::service_unavailable(u.message))?;
    let unavailable =
        |e: &dyn std::fmt::Display| ApiError::service_unavailable(format!("error trying to reach service: {e}"));
    let headers = req.headers_mut();
    let forged: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            let k = k.as_str();
            k == USER_HEADER || k == GROUP_HEADER || k.starts_with(EXTRA_PREFIX)
        })
        .cloned()
        .collect();
    for k in forged {
        headers.remove(k);
    }
    let value = |v: &str| HeaderValue::from_str(v).map_err(|e| ApiError::bad_request(e.to_string()));
    headers.insert(USER_HEADER, value(&user.name)?);
    for g in &user.groups {
        headers.append(GROUP_HEADER, value(g)?);
    }
    if let Ok(host) = remote.server_name().parse() {
        headers.insert(hyper::header::HOST, host);
    }
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unavailable(&format!("dial tcp {addr}: i/o timeout")))?
        .map_err(|e| unavailable(&format!("dial tcp {addr}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(remote.server_name()).map_err(|e| unavailable(&e))?;
    let tls =
        tokio_rustls::TlsConnector::from(tls.clone()).connect(server_name, tcp).await.map_err(|e| unavailable(&e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| unavailable(&e))?;
    let name = remote.name.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(apiservice = %name, error = %e, "aggregated API server connection ended");
        }
    });
    sender.send_request(req).await.map_err(|e| unavailable(&e))
}

/// Upstream's refusal of a request RBAC does not allow.
fn forbidden(user: &User, verb: &str, p: &ResourcePath, reason: &str) -> ApiError {
    let resource = match &p.subresource {
        Some(s) => format!("{}/{s}", p.plural),
        None => p.plural.clone(),
    };
    let qualified = format!("{resource}.{}", p.group);
    let what = match &p.name {
        Some(n) => format!("{qualified} \"{n}\""),
        None => qualified,
    };
    let scope = match &p.namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".into(),
    };
    let because = if reason.is_empty() { String::new() } else { format!(": {reason}") };
    let mut e = ApiError::forbidden(format!(
        "{what} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\"{scope}{because}",
        user.name, p.group
    ));
    e.kind = p.plural.clone();
    e.group = p.group.clone();
    e.name = p.name.clone().unwrap_or_default();
    e
}

/// Serves a request for the remote's group and version: a resource
/// request (`path` given) authorized first, discovery as it is.
pub async fn serve(
    api: Arc<Api>,
    remote: Remote,
    user: User,
    path: Option<ResourcePath>,
    mut parts: Parts,
    body: Bytes,
) -> Response {
    if let Some(p) = &path {
        let query = request::parse_query(parts.uri.query());
        let watching = p.watch_prefix || request::parse_bool(query.get("watch").map(String::as_str));
        let Some(verb) = request::verb(&parts.method, p.name.is_some(), watching) else {
            return ApiError::method_not_allowed("the server does not allow this method on the requested resource")
                .into_response();
        };
        let attrs = auth::rbac::Attributes {
            verb: verb.to_string(),
            group: p.group.clone(),
            resource: p.plural.clone(),
            subresource: p.subresource.clone().unwrap_or_default(),
            namespace: p.namespace.clone().unwrap_or_default(),
            name: p.name.clone().unwrap_or_default(),
            path: None,
        };
        let decision = api.decide(&user, &attrs);
        if let Some(record) = parts.extensions.get::<auth::DecisionRecord>() {
            record.set(&decision);
        }
        if !decision.allowed {
            return forbidden(&user, verb, p, &decision.reason).into_response();
        }
    }
    let path_and_query = parts.uri.path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_default();
    let req = match relay::outgoing(&parts.method, &path_and_query, &parts.headers, body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    match send(&api, &remote, &user, req).await {
        Ok(resp) => relay::answer(resp, upgrade),
        Err(e) => e.into_response(),
    }
}

/// `insecureSkipTLSVerify`: any certificate is taken, its signatures on
/// the handshake still checked.
#[derive(Debug)]
pub(super) struct NoVerification(pub Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
