//! Service-account tokens: ES256 JWTs signed with the cluster's
//! service-account key, with upstream's claims, and their verification.

use std::path::Path;

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the service-account key {0}: {1}")]
    Read(String, std::io::Error),
    #[error("the service-account key is not a PKCS#8 P-256 key: {0}")]
    Key(String),
    #[error("invalid token")]
    Invalid,
    #[error("token has expired")]
    Expired,
    #[error("signing failed")]
    Sign,
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
    key: EcdsaKeyPair,
    public: Vec<u8>,
    kid: String,
    issuer: String,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body.trim()).ok()
}

impl TokenSigner {
    pub fn load(path: &Path, issuer: String) -> Result<TokenSigner, TokenError> {
        let pem = std::fs::read_to_string(path).map_err(|e| TokenError::Read(path.display().to_string(), e))?;
        let der = pem_body(&pem).ok_or_else(|| TokenError::Key("not PEM".into()))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &SystemRandom::new())
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let public = key.public_key().as_ref().to_vec();
        let kid = b64(&Sha256::digest(&public));
        Ok(TokenSigner { key, public, kid, issuer })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Signs a token for a service account, valid for `seconds`.
    pub fn issue(&self, claims: &Claims, now: i64, bound: Option<Value>) -> Result<String, TokenError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
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
        let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(payload.to_string().as_bytes()));
        let sig = self.key.sign(&SystemRandom::new(), signing_input.as_bytes()).map_err(|_| TokenError::Sign)?;
        Ok(format!("{signing_input}.{}", b64(sig.as_ref())))
    }

    /// Checks a token's signature, issuer and expiry.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Invalid);
        };
        let decode =
            |x: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(x).map_err(|_| TokenError::Invalid);
        let sig = decode(s)?;
        let input = format!("{h}.{p}");
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public)
            .verify(input.as_bytes(), &sig)
            .map_err(|_| TokenError::Invalid)?;
        let payload: Value = serde_json::from_slice(&decode(p)?).map_err(|_| TokenError::Invalid)?;
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
