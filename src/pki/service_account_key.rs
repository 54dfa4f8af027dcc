//! The service-account signing key and the ES256 JSON Web Tokens signed
//! with it, whatever their claims: the API server's bound tokens and the
//! token controller's legacy tokens are both signed here, and checked
//! here before their claims are read.

use std::path::Path;

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("cannot read the service-account key {0}: {1}")]
    Read(String, std::io::Error),
    #[error("the service-account key is not a PKCS#8 P-256 key: {0}")]
    Key(String),
    #[error("invalid token")]
    Invalid,
    #[error("signing failed")]
    Sign,
}

/// An ECDSA P-256 key that signs and checks tokens; `kid` names it in
/// each token's header.
pub struct ServiceAccountKey {
    key: EcdsaKeyPair,
    public: Vec<u8>,
    kid: String,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn unb64(data: &str) -> Result<Vec<u8>, JwtError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(data).map_err(|_| JwtError::Invalid)
}

fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body.trim()).ok()
}

/// A token's three parts: header, payload, signature.
fn parts(token: &str) -> Result<(&str, &str, &str), JwtError> {
    let mut parts = token.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) => Ok((h, p, s)),
        _ => Err(JwtError::Invalid),
    }
}

/// A token's payload, its signature unchecked: only to tell which kind of
/// token it is before checking it.
pub fn unverified_payload(token: &str) -> Option<Value> {
    let (_, payload, _) = parts(token).ok()?;
    serde_json::from_slice(&unb64(payload).ok()?).ok()
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl ServiceAccountKey {
    /// The key in the PKCS#8 PEM file at `path`.
    pub fn load(path: &Path) -> Result<ServiceAccountKey, JwtError> {
        let pem = std::fs::read_to_string(path).map_err(|e| JwtError::Read(path.display().to_string(), e))?;
        ServiceAccountKey::from_pem(&pem)
    }

    pub fn from_pem(pem: &str) -> Result<ServiceAccountKey, JwtError> {
        let der = pem_body(pem).ok_or_else(|| JwtError::Key("not PEM".into()))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &SystemRandom::new())
            .map_err(|e| JwtError::Key(e.to_string()))?;
        let public = key.public_key().as_ref().to_vec();
        let kid = b64(&Sha256::digest(&public));
        Ok(ServiceAccountKey { key, public, kid })
    }

    /// A token carrying `payload`.
    pub fn sign(&self, payload: &Value) -> Result<String, JwtError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(payload.to_string().as_bytes()));
        let sig = self.key.sign(&SystemRandom::new(), signing_input.as_bytes()).map_err(|_| JwtError::Sign)?;
        Ok(format!("{signing_input}.{}", b64(sig.as_ref())))
    }

    /// The payload of a token this key signed; its claims are for the
    /// caller to check.
    pub fn verify(&self, token: &str) -> Result<Value, JwtError> {
        let (h, p, s) = parts(token)?;
        let sig = unb64(s)?;
        let input = format!("{h}.{p}");
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public)
            .verify(input.as_bytes(), &sig)
            .map_err(|_| JwtError::Invalid)?;
        serde_json::from_slice(&unb64(p)?).map_err(|_| JwtError::Invalid)
    }
}

/// The issuer of legacy service-account tokens, those kept in Secrets of
/// type `kubernetes.io/service-account-token`.
pub const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

/// The date (UTC, `YYYY-MM-DD`) a legacy token was last used, a label of
/// its Secret the API server keeps.
pub const LAST_USED_LABEL: &str = "kubernetes.io/legacy-token-last-used";
/// The date the legacy token cleaner found a token unused for its period;
/// the API server refuses such a token.
pub const INVALID_SINCE_LABEL: &str = "kubernetes.io/legacy-token-invalid-since";

/// A Unix time's UTC date, `YYYY-MM-DD`, as those labels hold it (such
/// dates compare as strings).
pub fn date_of(unix: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}-{:02}-{:02}", at.year(), u8::from(at.month()), at.day())
}

/// What a legacy token says, upstream's claims of it: it never expires and
/// names the Secret it is kept in, which must still hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyClaims {
    pub namespace: String,
    pub service_account_name: String,
    pub service_account_uid: String,
    pub secret_name: String,
}

impl LegacyClaims {
    pub fn payload(&self) -> Value {
        json!({
            "iss": LEGACY_ISSUER,
            "sub": format!("system:serviceaccount:{}:{}", self.namespace, self.service_account_name),
            "kubernetes.io/serviceaccount/namespace": self.namespace,
            "kubernetes.io/serviceaccount/secret.name": self.secret_name,
            "kubernetes.io/serviceaccount/service-account.name": self.service_account_name,
            "kubernetes.io/serviceaccount/service-account.uid": self.service_account_uid,
        })
    }

    /// The claims of a legacy token's payload; None for any other token,
    /// or one whose subject is not the account its claims name.
    pub fn from_payload(payload: &Value) -> Option<LegacyClaims> {
        if payload.get("iss").and_then(Value::as_str) != Some(LEGACY_ISSUER) {
            return None;
        }
        let text = |k: &str| payload.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let claims = LegacyClaims {
            namespace: text("kubernetes.io/serviceaccount/namespace"),
            service_account_name: text("kubernetes.io/serviceaccount/service-account.name"),
            service_account_uid: text("kubernetes.io/serviceaccount/service-account.uid"),
            secret_name: text("kubernetes.io/serviceaccount/secret.name"),
        };
        let sub = text("sub");
        let (ns, name) = sub.strip_prefix("system:serviceaccount:")?.split_once(':')?;
        if claims.namespace.is_empty() || ns != claims.namespace || name != claims.service_account_name {
            return None;
        }
        Some(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_and_verifies_any_claims() {
        let key = ServiceAccountKey::from_pem(&crate::pki::new_key_pem().unwrap()).unwrap();
        let token = key.sign(&json!({"iss": "x", "n": 1})).unwrap();
        assert_eq!(key.verify(&token).unwrap(), json!({"iss": "x", "n": 1}));
        assert_eq!(unverified_payload(&token).unwrap()["iss"], "x");
        let other = ServiceAccountKey::from_pem(&crate::pki::new_key_pem().unwrap()).unwrap();
        assert!(other.verify(&token).is_err());
        assert!(key.verify(&format!("{token}x")).is_err());
        assert!(unverified_payload("a.b").is_none());
    }

    #[test]
    fn dates_are_utc_days() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(1_700_000_000), "2023-11-14");
    }

    #[test]
    fn legacy_claims_round_trip_and_need_a_matching_subject() {
        let claims = LegacyClaims {
            namespace: "ns".into(),
            service_account_name: "sa".into(),
            service_account_uid: "u".into(),
            secret_name: "sa-token".into(),
        };
        let payload = claims.payload();
        assert_eq!(LegacyClaims::from_payload(&payload), Some(claims));
        let mut other = payload.clone();
        other["sub"] = json!("system:serviceaccount:ns:else");
        assert_eq!(LegacyClaims::from_payload(&other), None);
        other["iss"] = json!("https://kubernetes.default.svc");
        assert_eq!(LegacyClaims::from_payload(&other), None);
    }
}
