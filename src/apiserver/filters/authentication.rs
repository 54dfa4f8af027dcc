//! Authentication (upstream's `WithAuthentication` filter and its union
//! of token authenticators): a bearer token names the user when the
//! request carries one (a token that names nobody is refused with 401);
//! else the client certificate the listener verified (`serve`); else the
//! request is anonymous.

use axum::http::header;
use axum::http::request::Parts;

use crate::apiserver::auth::{self, User};
use crate::apiserver::meta;
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

/// The user a request comes from.
pub async fn authenticate(api: &Api, parts: &Parts) -> Result<User, ApiError> {
    let user = parts.extensions.get::<User>().cloned().unwrap_or_else(User::anonymous);
    let bearer =
        parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let Some(token) = bearer else { return Ok(user) };
    api.authenticate_token(token.trim()).await.ok_or_else(ApiError::unauthorized)
}

impl Api {
    /// The user a bearer token names: a service-account token whose
    /// account still exists with the same uid.
    pub async fn authenticate_token(&self, token: &str) -> Option<User> {
        if let Some(join) = &self.config.join_token {
            // The node join token, whole (K10<ca hash>::server:<secret>) or its secret.
            if join.matches(token) {
                return Some(User {
                    name: "system:ferrok:node-bootstrap".into(),
                    groups: vec![
                        "system:bootstrappers".into(),
                        "system:bootstrappers:ferrok".into(),
                        "system:authenticated".into(),
                    ],
                });
            }
        }
        if let Some(user) = auth::bootstrap_token::authenticate(&self.storage, token, meta::unix_now()).await {
            return Some(user);
        }
        if let Some(user) = auth::legacy_token::authenticate(self, token).await {
            return Some(user);
        }
        let signer = self.tokens.as_ref()?;
        let claims = signer.verify(token, meta::unix_now()).ok()?;
        let key = format!("/registry/serviceaccounts/{}/{}", claims.namespace, claims.name);
        let sa = self.storage.get(&key).await.ok()??;
        let uid = sa.object.pointer("/metadata/uid").and_then(serde_json::Value::as_str).unwrap_or_default();
        if !claims.uid.is_empty() && uid != claims.uid {
            return None;
        }
        Some(User {
            name: format!("system:serviceaccount:{}:{}", claims.namespace, claims.name),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", claims.namespace),
                "system:authenticated".into(),
            ],
        })
    }
}
