//! `PUT /v1-ferrok/cacerts` (`ferrok certificate rotate-ca`), for those
//! RBAC lets `update` that path: new server and/or client CAs, checked
//! against the current ones (src/pki/ca_rotation.rs), are written to the
//! server's TLS folder after a backup and, where servers share a
//! datastore, into the cluster's bootstrap data, so that every server
//! takes them at its next start. With no CA given, the server makes
//! successors of both, cross-signed by the current ones.
//!
//! As with k3s, the running servers keep their CAs until restarted; each
//! then issues its leaf certificates from the new CAs, and nodes keep
//! trusting the servers through the cross-signed certificates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::http::Method;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::server_token::RotateError;
use crate::apiserver::auth::rbac::Attributes;
use crate::apiserver::auth::User;
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;
use crate::pki::ca_rotation::{self, NewCa, RotationError, ROTATED_CAS};
use crate::pki::Ca;

/// Where an administrator rotates the cluster's CAs.
pub const CACERTS_PATH: &str = "/v1-ferrok/cacerts";

/// The body of `PUT /v1-ferrok/cacerts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CaRotationRequest {
    /// New CAs by base name (`server-ca`, `client-ca`); none: the server makes both.
    #[serde(default)]
    pub cas: BTreeMap<String, NewCa>,
    /// Take CAs that do not chain to the current ones.
    #[serde(default)]
    pub force: bool,
}

/// The answer: the files written, and where the old ones were saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaRotationAnswer {
    pub written: Vec<String>,
    pub backup: String,
    /// The join token naming the new server CA bundle.
    pub token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Invalid(#[from] RotationError),
    #[error("cannot {action} {path}: {message}")]
    Io { action: &'static str, path: String, message: String },
    #[error("the cluster's bootstrap data: {0}")]
    Bootstrap(#[from] RotateError),
}

/// The server's side of CA rotation: its TLS folder, one rotation at a time.
#[derive(Debug)]
pub struct CaRotation {
    tls_dir: PathBuf,
    rotating: tokio::sync::Mutex<()>,
}

impl CaRotation {
    pub fn new(tls_dir: PathBuf) -> Self {
        CaRotation { tls_dir, rotating: tokio::sync::Mutex::new(()) }
    }
}

pub async fn serve(api: &Api, user: &User, method: &Method, body: &[u8]) -> Response {
    if method != Method::PUT {
        return ApiError::method_not_allowed("the server does not allow this method on the requested resource")
            .into_response();
    }
    let attrs = Attributes { verb: "update".into(), path: Some(CACERTS_PATH.into()), ..Default::default() };
    if !api.allowed(user, &attrs) {
        return ApiError::forbidden(format!("User \"{}\" cannot rotate the cluster's CAs", user.name)).into_response();
    }
    let Some(rotation) = api.config.node_join.as_ref().and_then(|j| j.ca_rotation.as_ref()) else {
        return ApiError::new(404, "NotFound", "this server keeps no CAs").into_response();
    };
    let request: CaRotationRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return ApiError::bad_request(format!("the body is not a CA rotation: {e}")).into_response(),
    };
    match rotate(api, rotation, request).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e @ Failure::Invalid(_)) => ApiError::bad_request(e.to_string()).into_response(),
        Err(e @ Failure::Bootstrap(RotateError::Raced)) => {
            ApiError::new(409, "Conflict", e.to_string()).into_response()
        }
        Err(e) => ApiError::new(500, "InternalError", e.to_string()).into_response(),
    }
}

fn read(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| Failure::Io {
        action: "read",
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Keys are readable by the owner only; certificates by all.
fn mode_of(name: &str) -> u32 {
    if name.ends_with(".key") {
        0o600
    } else {
        0o644
    }
}

async fn rotate(api: &Api, rotation: &CaRotation, request: CaRotationRequest) -> Result<CaRotationAnswer, Failure> {
    let _one = rotation.rotating.lock().await;
    let dir = &rotation.tls_dir;
    let mut current = BTreeMap::new();
    for (base, _) in ROTATED_CAS {
        for ending in ["crt", "key"] {
            let name = format!("{base}.{ending}");
            current.insert(name.clone(), read(&dir.join(&name))?);
        }
    }
    let wanted = if request.cas.is_empty() {
        let mut made = BTreeMap::new();
        for (base, cn) in ROTATED_CAS {
            let ca = Ca::load(current[&format!("{base}.crt")].clone(), current[&format!("{base}.key")].clone())
                .map_err(RotationError::from)?;
            made.insert(base.to_string(), ca_rotation::generate(&ca, cn)?);
        }
        made
    } else {
        request.cas
    };
    let files = ca_rotation::files(&wanted, &current, request.force)?;

    // The old files are saved first, as `ferrok certificate rotate` saves leaves.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let data_dir = dir.parent().and_then(Path::parent).unwrap_or(dir);
    let backup = data_dir.join(format!("tls-backup-{stamp}")).join("server").join("tls");
    for name in files.keys() {
        crate::pki::write(&backup.join(name), &current[name], mode_of(name)).map_err(|e| Failure::Io {
            action: "back up",
            path: dir.join(name).display().to_string(),
            message: e.to_string(),
        })?;
    }

    // The cluster's bootstrap data first: should a local write fail after
    // it, the next start takes the rotated CAs from there.
    let token = api.config.join_token.as_ref();
    let new_token = match (token, files.get("server-ca.crt")) {
        (Some(t), Some(bundle)) => Some(crate::pki::with_ca_hash(&t.current(), bundle)),
        (Some(t), None) => Some(t.current()),
        (None, _) => None,
    };
    if let Some(t) = token {
        let (files, new_token) = (files.clone(), new_token.clone());
        t.update_bootstrap(move |data| {
            data.files.extend(files);
            if let Some(new) = new_token {
                data.token = new;
            }
        })
        .await?;
    }
    for (name, contents) in &files {
        crate::pki::write(&dir.join(name), contents, mode_of(name)).map_err(|e| Failure::Io {
            action: "write",
            path: dir.join(name).display().to_string(),
            message: e.to_string(),
        })?;
    }
    if let (Some(t), Some(new)) = (token, &new_token) {
        t.record(new)?;
    }
    tracing::info!(files = ?files.keys().collect::<Vec<_>>(), force = request.force, "the cluster's CAs were rotated; they take effect at the next start");
    Ok(CaRotationAnswer {
        written: files.keys().map(|n| dir.join(n).display().to_string()).collect(),
        backup: backup.display().to_string(),
        token: new_token,
    })
}
