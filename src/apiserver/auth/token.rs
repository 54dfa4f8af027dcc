//! Service-account tokens: ES256 JWTs signed with the cluster's
//! service-account key, with upstream's claims, and their verification.

use std::path::Path;

use serde_json::{json, Value};

use crate::pki::service_account_key::{JwtError, ServiceAccountKey};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Key(#[from] JwtError),
    #[error("invalid token")]
    Invalid,
    #[error("token has expired")]
    Expired,
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub audiences: Vec<String>,
    pub expires: i64,
}

pub struct TokenSigner {
    key: ServiceAccountKey,
    issuer: String,
}

impl TokenSigner {
    pub fn load(path: &Path, issuer: String) -> Result<TokenSigner, TokenError> {
        Ok(TokenSigner { key: ServiceAccountKey::load(path)?, issuer })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key that signs and checks every service-account token.
    pub fn key(&self) -> &ServiceAccountKey {
        &self.key
    }

    /// Signs a token for a service account, valid for `seconds`.
    pub fn issue(&self, claims: &Claims, now: i64, bound: Option<Value>) -> Result<String, TokenError> {
        let mut k8s = json!({
            "namespace": claims.namespace,
            "serviceaccount": {"name": claims.name, "uid": claims.uid},
        });
        if let Some(b) = bound {
            if let Some(kind) = b.get("kind").and_then(Value::as_str) {
                k8s[kind.to_ascii_lowercase()] = json!({"name": b.get("name"), "uid": b.get("uid")});
            }
        }
        let payload = json!({
            "iss": self.issuer,
            "sub": format!("system:serviceaccount:{}:{}", claims.namespace, claims.name),
            "aud": claims.audiences,
            "exp": claims.expires,
            "iat": now,
            "nbf": now,
            "jti": crate::apiserver::meta::new_uid(),
            "kubernetes.io": k8s,
        });
        Ok(self.key.sign(&payload)?)
    }

    /// Checks a token's signature, issuer and expiry.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        let payload = self.key.verify(token).map_err(|_| TokenError::Invalid)?;
        if payload["iss"].as_str() != Some(self.issuer.as_str()) {
            return Err(TokenError::Invalid);
        }
        let exp = payload["exp"].as_i64().ok_or(TokenError::Invalid)?;
        if exp <= now {
            return Err(TokenError::Expired);
        }
        let k8s = &payload["kubernetes.io"];
        let audiences = match &payload["aud"] {
            Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            Value::String(s) => vec![s.clone()],
            _ => Vec::new(),
        };
        Ok(Claims {
            namespace: k8s["namespace"].as_str().ok_or(TokenError::Invalid)?.to_string(),
            name: k8s["serviceaccount"]["name"].as_str().ok_or(TokenError::Invalid)?.to_string(),
            uid: k8s["serviceaccount"]["uid"].as_str().unwrap_or_default().to_string(),
            audiences,
            expires: exp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.key");
        std::fs::write(&path, crate::pki::new_key_pem().unwrap()).unwrap();
        let signer = TokenSigner::load(&path, "https://kubernetes.default.svc.cluster.local".into()).unwrap();
        let claims = Claims {
            namespace: "ns".into(),
            name: "sa".into(),
            uid: "u".into(),
            audiences: vec!["api".into()],
            expires: 2000,
        };
        let token = signer.issue(&claims, 1000, None).unwrap();
        assert_eq!(signer.verify(&token, 1500).unwrap(), claims);
        assert!(matches!(signer.verify(&token, 2500), Err(TokenError::Expired)));
        let mut forged = token.clone();
        forged.push('x');
        assert!(signer.verify(&forged, 1500).is_err());
    }
}
