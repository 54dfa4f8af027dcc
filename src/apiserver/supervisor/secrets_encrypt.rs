//! `ferrok secrets-encrypt` talks to the running server here (the server
//! holds the keys in force and is the only writer that can swap them
//! between two writes; a command editing the file and the store from
//! outside could not stop a write sealed with an old key from landing
//! after that key was dropped):
//! - `GET /v1-ferrok/encrypt/status`: an [`EncryptionStatus`].
//! - `POST /v1-ferrok/encrypt/rotate-keys`: a [`Rotation`], when done.
//! - `POST /v1-ferrok/encrypt/enable[?provider=aescbc|secretbox]` and
//!   `POST /v1-ferrok/encrypt/disable`: a [`Toggle`], when every server
//!   runs the new configuration and the stored values are rewritten.
//!
//! Both are non-resource URLs that RBAC must allow (`get`, `post`): the
//! cluster admins (system:masters, cluster-admin) may, nobody else by default.

use axum::http::Method;
use axum::response::{IntoResponse, Response};

use crate::apiserver::auth::{rbac::Attributes, DecisionRecord, User};
use crate::apiserver::encryption::cluster::SharedError;
use crate::apiserver::encryption::config::Cipher;
use crate::apiserver::encryption::reencrypt::{self, ReencryptError};
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

pub const STATUS: &str = "/v1-ferrok/encrypt/status";
pub const ROTATE_KEYS: &str = "/v1-ferrok/encrypt/rotate-keys";
pub const ENABLE: &str = "/v1-ferrok/encrypt/enable";
pub const DISABLE: &str = "/v1-ferrok/encrypt/disable";

/// Whether a path is one of these endpoints.
pub fn handles(path: &str) -> bool {
    path.starts_with("/v1-ferrok/encrypt/")
}

pub async fn serve(
    api: &Api,
    user: &User,
    method: &Method,
    path: &str,
    query: Option<&str>,
    record: Option<&DecisionRecord>,
) -> Response {
    if user.is_anonymous() {
        return ApiError::unauthorized().into_response();
    }
    let verb = match (path, method) {
        (STATUS, &Method::GET) => "get",
        (ROTATE_KEYS | ENABLE | DISABLE, &Method::POST) => "post",
        (STATUS | ROTATE_KEYS | ENABLE | DISABLE, _) => {
            return ApiError::method_not_allowed("the server does not allow this method on the requested resource")
                .into_response()
        }
        _ => return ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response(),
    };
    let attrs = Attributes { verb: verb.into(), path: Some(path.into()), ..Default::default() };
    if !api.allowed_recorded(user, &attrs, record) {
        return ApiError::forbidden(format!("forbidden: User \"{}\" cannot {verb} path \"{path}\"", user.name))
            .into_response();
    }
    let Some(enc) = api.config.encryption.as_ref() else {
        return ApiError::new(404, "NotFound", "this server does not encrypt at rest").into_response();
    };
    let cipher = match query.unwrap_or_default().split('&').find_map(|kv| kv.strip_prefix("provider=")) {
        None => Cipher::Aescbc,
        Some(name) => match name.parse() {
            Ok(c) => c,
            Err(e) => return ApiError::bad_request(format!("provider: {e}")).into_response(),
        },
    };
    match (verb, path) {
        ("get", _) => axum::Json(enc.status().await).into_response(),
        (_, ENABLE | DISABLE) => {
            let enable = (path == ENABLE).then_some(cipher);
            let (store, enc) = (api.storage.store().clone(), enc.clone());
            let toggle = tokio::spawn(async move { reencrypt::set_enabled(&store, &enc, enable).await });
            match toggle.await.unwrap_or_else(|e| Err(ReencryptError::Aborted(e.to_string()))) {
                Ok(t) => axum::Json(t).into_response(),
                Err(e) => failed(e),
            }
        }
        _ => {
            // A task of its own: a client that goes away does not stop a
            // rotation halfway.
            let (store, enc) = (api.storage.store().clone(), enc.clone());
            let rotation = tokio::spawn(async move { reencrypt::rotate_keys(&store, &enc).await });
            rotated(rotation.await.unwrap_or_else(|e| Err(ReencryptError::Aborted(e.to_string()))))
        }
    }
}

fn rotated(result: Result<reencrypt::Rotation, ReencryptError>) -> Response {
    match result {
        Ok(rotation) => axum::Json(rotation).into_response(),
        Err(e) => failed(e),
    }
}

fn failed(e: ReencryptError) -> Response {
    match e {
        e @ ReencryptError::Disabled => ApiError::bad_request(e.to_string()).into_response(),
        e @ (ReencryptError::Busy
        | ReencryptError::RotatingElsewhere(_)
        | ReencryptError::Shared(SharedError::Changed | SharedError::Lagging { .. })) => {
            ApiError::new(409, "Conflict", e.to_string()).into_response()
        }
        e => ApiError::internal(e.to_string()).into_response(),
    }
}
