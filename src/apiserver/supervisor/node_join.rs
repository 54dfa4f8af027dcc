//! What a joining node asks the server for before it has credentials of
//! its own (k3s' `/cacerts` and `/v1-k3s/…` endpoints, with ferrok's names):
//!
//! - `GET /cacerts`, for anyone: the server CA bundle, whose SHA-256 the
//!   join token carries, so the node checks the server before it sends a
//!   secret;
//! - `GET /v1-ferrok/config`: the cluster settings a node needs (CIDRs,
//!   cluster DNS and domain, the client CA its kubelet API trusts);
//! - `POST /v1-ferrok/kubelet-client.crt` and `…/kubelet-serving.crt`: a
//!   PKCS#10 request in, a certificate out, signed for the node's name
//!   (`system:node:<name>` in `system:nodes`; the serving one for its name
//!   and addresses). Private keys never leave the node.
//!
//! The last three are for bootstrappers (the join token, a bootstrap
//! token) and for nodes renewing their own certificates. A bootstrapper
//! proves the node's name with its node password: the first join of a
//! name records a salted hash in the Secret
//! `kube-system/<name>.node-password.ferrok`, and a later join of the same
//! name with another password is refused.
//!
//! - `PUT /v1-ferrok/token`, for those RBAC lets `update` that path (the
//!   cluster's administrators): rotates the server's join token
//!   (server_token.rs);
//! - `PUT /v1-ferrok/cacerts`, for the same: rotates the cluster's CAs
//!   (ca_rotation.rs).

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use super::server_token::{RotateError, TokenRotation};
use crate::apiserver::auth::rbac::Attributes;
use crate::apiserver::auth::User;
use crate::apiserver::status::ApiError;
use crate::apiserver::storage::WriteError;
use crate::apiserver::Api;
use crate::client::node_join::{
    NodeJoinConfig, CONFIG_PATH, KUBELET_CLIENT_CERT_PATH, KUBELET_SERVING_CERT_PATH, NODE_IP_HEADER, NODE_NAME_HEADER,
    NODE_PASSWORD_HEADER, SERVER_CA_PATH,
};
use crate::pki::{Ca, LeafSpec};

/// The server's signing side of joining.
pub struct JoinAuthority {
    /// `/cacerts`: the server CA bundle, byte for byte as the token hashes it.
    pub server_ca_bundle: Vec<u8>,
    server_ca: Ca,
    client_ca: Ca,
    pub config: NodeJoinConfig,
    /// Where the CAs are kept, for their rotation.
    pub ca_rotation: Option<super::ca_rotation::CaRotation>,
}

impl std::fmt::Debug for JoinAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinAuthority").field("config", &self.config).finish_non_exhaustive()
    }
}

impl JoinAuthority {
    pub fn new(
        server_ca_bundle: Vec<u8>,
        server_ca: Ca,
        client_ca: Ca,
        config: NodeJoinConfig,
        tls_dir: Option<std::path::PathBuf>,
    ) -> Arc<Self> {
        let ca_rotation = tls_dir.map(super::ca_rotation::CaRotation::new);
        Arc::new(JoinAuthority { server_ca_bundle, server_ca, client_ca, config, ca_rotation })
    }
}

/// Whether a path is one of these endpoints.
pub fn handles(path: &str) -> bool {
    path == SERVER_CA_PATH || path.starts_with("/v1-ferrok/")
}

/// Serves one of the join endpoints for `user` (anonymous for `/cacerts`).
pub async fn serve(api: &Api, user: &User, method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let Some(join) = api.config.node_join.as_ref() else {
        return ApiError::new(404, "NotFound", "this server does not accept nodes").into_response();
    };
    if path == SERVER_CA_PATH {
        if method != Method::GET {
            return method_not_allowed();
        }
        return ([("content-type", "application/x-pem-file")], join.server_ca_bundle.clone()).into_response();
    }
    if user.is_anonymous() {
        return ApiError::unauthorized().into_response();
    }
    if path == TOKEN_PATH {
        return rotate_token(api, user, method, body).await;
    }
    if path == super::ca_rotation::CACERTS_PATH {
        return super::ca_rotation::serve(api, user, method, body).await;
    }
    let bootstrapper = user.in_group("system:bootstrappers");
    let node_user = user.in_group("system:nodes").then(|| user.name.strip_prefix("system:node:")).flatten();
    if !bootstrapper && node_user.is_none() {
        return ApiError::forbidden(format!("User \"{}\" may not join nodes", user.name)).into_response();
    }
    match path {
        CONFIG_PATH if method == Method::GET => axum::Json(join.config.clone()).into_response(),
        KUBELET_CLIENT_CERT_PATH | KUBELET_SERVING_CERT_PATH if method == Method::POST => {
            match sign(api, join, user, node_user, path, headers, body).await {
                Ok(pem) => ([("content-type", "application/x-pem-file")], pem).into_response(),
                Err(e) => e.into_response(),
            }
        }
        CONFIG_PATH | KUBELET_CLIENT_CERT_PATH | KUBELET_SERVING_CERT_PATH => method_not_allowed(),
        _ => ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response(),
    }
}

/// Where an administrator rotates the server's join token.
pub const TOKEN_PATH: &str = "/v1-ferrok/token";

/// `PUT /v1-ferrok/token` with a [`TokenRotation`]: the new token (whole,
/// its secret, or empty for a random one); the answer holds the whole token.
async fn rotate_token(api: &Api, user: &User, method: &Method, body: &[u8]) -> Response {
    if method != Method::PUT {
        return method_not_allowed();
    }
    let attrs = Attributes { verb: "update".into(), path: Some(TOKEN_PATH.into()), ..Default::default() };
    if !api.allowed(user, &attrs) {
        return ApiError::forbidden(format!("User \"{}\" cannot rotate the server token", user.name)).into_response();
    }
    let Some(token) = api.config.join_token.as_ref() else {
        return ApiError::new(404, "NotFound", "this server has no join token").into_response();
    };
    let wanted: TokenRotation = match serde_json::from_slice(body) {
        Ok(w) => w,
        Err(e) => return ApiError::bad_request(format!("the body is not a token rotation: {e}")).into_response(),
    };
    match token.rotate(&wanted.token).await {
        Ok(new) => axum::Json(TokenRotation { token: new }).into_response(),
        Err(e @ (RotateError::Invalid(_) | RotateError::OtherCa { .. })) => {
            ApiError::bad_request(e.to_string()).into_response()
        }
        Err(e @ RotateError::Raced) => ApiError::new(409, "Conflict", e.to_string()).into_response(),
        Err(e) => ApiError::new(500, "InternalError", e.to_string()).into_response(),
    }
}

fn method_not_allowed() -> Response {
    ApiError::method_not_allowed("the server does not allow this method on the requested resource").into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// A DNS-1123 subdomain, as a Node's name must be.
fn valid_node_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

async fn sign(
    api: &Api,
    join: &JoinAuthority,
    user: &User,
    node_user: Option<&str>,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, ApiError> {
    let name = header(headers, NODE_NAME_HEADER)
        .ok_or_else(|| ApiError::bad_request(format!("the {NODE_NAME_HEADER} header is required")))?;
    if !valid_node_name(name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is not a valid node name (a lowercase DNS-1123 subdomain)"
        )));
    }
    match node_user {
        // A node renews its own certificates with the one it has.
        Some(own) if !user.in_group("system:bootstrappers") => {
            if own != name {
                return Err(ApiError::forbidden(format!(
                    "node \"{own}\" may not request certificates for node \"{name}\""
                )));
            }
        }
        _ => {
            let password = header(headers, NODE_PASSWORD_HEADER)
                .ok_or_else(|| ApiError::bad_request(format!("the {NODE_PASSWORD_HEADER} header is required")))?;
            check_node_password(api, name, password).await?;
        }
    }
    let csr = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the request body is not a PEM CSR"))?;
    let (ca, spec) = if path == KUBELET_CLIENT_CERT_PATH {
        (&join.client_ca, LeafSpec::client(&format!("system:node:{name}"), &["system:nodes"]))
    } else {
        let mut ips: Vec<IpAddr> = Vec::new();
        for text in header(headers, NODE_IP_HEADER).unwrap_or_default().split(',').filter(|s| !s.trim().is_empty()) {
            let ip = text
                .trim()
                .parse()
                .map_err(|_| ApiError::bad_request(format!("{NODE_IP_HEADER}: {text:?} is not an IP address")))?;
            ips.push(ip);
        }
        for local in [IpAddr::from([127, 0, 0, 1]), IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])] {
            if !ips.contains(&local) {
                ips.push(local);
            }
        }
        (&join.server_ca, LeafSpec::server(name, vec![name.to_string(), "localhost".into()], ips))
    };
    let pem = ca
        .sign_request(csr, &spec)
        .map_err(|e| ApiError::bad_request(format!("cannot sign the certificate request: {e}")))?;
    tracing::info!(node = %name, user = %user.name, kind = %path.trim_start_matches("/v1-ferrok/"), "signed a node certificate");
    Ok(pem)
}

fn password_secret_key(node: &str) -> String {
    format!("/registry/secrets/kube-system/{}", crate::pki::node_password::secret_name(node))
}

/// Records the node's password on its first join; refuses another one later.
async fn check_node_password(api: &Api, node: &str, password: &str) -> Result<(), ApiError> {
    let key = password_secret_key(node);
    let refused = || {
        ApiError::forbidden(format!(
            "node password rejected for node \"{node}\": another machine has joined with this name. \
             Give this node another name (--node-name, or --with-node-id), or, if the old node is gone for good, \
             delete its password with `kubectl -n kube-system delete secret {node}.node-password.ferrok`"
        ))
    };
    for _ in 0..3 {
        if let Some(stored) = api.storage.get(&key).await? {
            let hash = stored
                .object
                .pointer("/data/hash")
                .and_then(Value::as_str)
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default();
            return if crate::pki::node_password::verify(password, &hash) { Ok(()) } else { Err(refused()) };
        }
        let hash = crate::pki::node_password::hash(password);
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "ferrok.io/node-password",
            "metadata": {
                "name": crate::pki::node_password::secret_name(node),
                "namespace": "kube-system",
                "uid": crate::apiserver::meta::new_uid(),
                "creationTimestamp": crate::apiserver::meta::now_rfc3339(),
                "labels": {(crate::pki::node_password::NODE_LABEL): node},
            },
            "immutable": true,
            "data": {"hash": base64::engine::general_purpose::STANDARD.encode(hash)},
        });
        match api.storage.create(&key, &secret).await {
            Ok(_) => {
                tracing::info!(node = %node, "recorded the node's password");
                return Ok(());
            }
            // Another join of the same name won the race: compare with its password.
            Err(WriteError::Exists) | Err(WriteError::Changed(_)) => continue,
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::new(StatusCode::CONFLICT.as_u16(), "Conflict", "the node password changed while it was checked"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_names() {
        assert!(super::valid_node_name("edge-1"));
        assert!(super::valid_node_name("edge-1.example"));
        assert!(!super::valid_node_name("Edge"));
        assert!(!super::valid_node_name("-a"));
        assert!(!super::valid_node_name("a..b"));
        assert!(!super::valid_node_name(""));
    }

    #[test]
    fn an_older_servers_config_runs_the_dns_and_no_local_path() {
        let old = r#"{"clusterCidr":"10.42.0.0/16","serviceCidr":"10.43.0.0/16","clusterDns":"10.43.0.10",
                      "clusterDomain":"cluster.local","clientCa":"CA"}"#;
        let c: super::NodeJoinConfig = serde_json::from_str(old).unwrap();
        assert!(!c.disable_cluster_dns);
        assert!(c.local_storage_path.is_empty());
        let new = serde_json::to_value(super::NodeJoinConfig { disable_cluster_dns: true, ..c }).unwrap();
        assert_eq!(new["disableClusterDns"], true);
    }
}
