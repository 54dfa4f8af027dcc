//! `ferrok secrets-encrypt` talks to the running server here (the server
//! holds the keys in force and is the only writer that can swap them
//! between two writes; a command editing the file and the store from
//! outside could not stop a write sealed with an old key from landing
//! after that key was dropped):
//! - `GET /v1-ferrok/encrypt/status`: an [`EncryptionStatus`].
//! - `POST /v1-ferrok/encrypt/rotate-keys`: a [`Rotation`], when done.
//!
//! Both are non-resource URLs that RBAC must allow (`get`, `post`): the
//! cluster admins (system:masters, cluster-admin) may, nobody else by default.

use axum::http::Method;
use axum::response::{IntoResponse, Response};

use super::reencrypt::{self, ReencryptError};
use crate::apiserver::auth::{rbac::Attributes, DecisionRecord, User};
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

pub const STATUS: &str = "/v1-ferrok/encrypt/status";
pub const ROTATE_KEYS: &str = "/v1-ferrok/encrypt/rotate-keys";

/// Whether a path is one of these endpoints.
pub fn handles(path: &str) -> bool {
    path.starts_with("/v1-ferrok/encrypt/")
}

pub async fn serve(api: &Api, user: &User, method: &Method, path: &str, record: Option<&DecisionRecord>) -> Response {
    if user.is_anonymous() {
        return ApiError::unauthorized().into_response();
    }
    let verb = match (path, method) {
        (STATUS, &Method::GET) => "get",
        (ROTATE_KEYS, &Method::POST) => "post",
        (STATUS | ROTATE_KEYS, _) => {
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
    match verb {
        "get" => axum::Json(enc.status().await).into_response(),
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
        Err(e @ ReencryptError::Disabled) => ApiError::bad_request(e.to_string()).into_response(),
        Err(e @ (ReencryptError::Busy | ReencryptError::RotatingElsewhere(_))) => {
            ApiError::new(409, "Conflict", e.to_string()).into_response()
        }
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}
