//! Service-account tokens of projected volumes, as upstream's token
//! manager: a TokenRequest on `serviceaccounts/<name>/token` bound to the
//! pod (`boundObjectRef` kind Pod, name and uid), cached per pod, renewed
//! once 80% of its lifetime has passed or when older than 24 hours.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};

use super::error::SetUpError;

/// What upstream's projected volumes ask for when the source says nothing.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// Tokens older than this are renewed whatever their lifetime.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The request a token answers: the same key gets the cached token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

#[derive(Debug, Clone)]
pub struct ServiceAccountToken {
    pub token: String,
    pub issued: SystemTime,
    pub expires: SystemTime,
}

impl ServiceAccountToken {
    /// When this token should be replaced.
    pub fn refresh_at(&self) -> SystemTime {
        let ttl = self.expires.duration_since(self.issued).unwrap_or_default();
        let at_80_percent = self.expires - ttl / 5;
        at_80_percent.min(self.issued + MAX_TTL)
    }

    pub fn needs_refresh(&self, now: SystemTime) -> bool {
        now >= self.refresh_at()
    }
}

/// The tokens one pod's volumes hold.
#[derive(Default)]
pub struct PodTokens {
    tokens: HashMap<TokenKey, ServiceAccountToken>,
    /// Renew at the latest this long after issuance (tests only).
    renew_after: Option<Duration>,
}

impl PodTokens {
    pub fn with_renew_after(renew_after: Option<Duration>) -> PodTokens {
        PodTokens { tokens: HashMap::new(), renew_after }
    }

    fn refresh_at(&self, t: &ServiceAccountToken) -> SystemTime {
        match self.renew_after {
            Some(d) => t.refresh_at().min(t.issued + d),
            None => t.refresh_at(),
        }
    }

    /// The token for `key`: the cached one while it is fresh, else a new one.
    pub async fn get(&mut self, client: &kube::Client, pod: &Pod, key: &TokenKey) -> Result<String, SetUpError> {
        let now = SystemTime::now();
        if let Some(t) = self.tokens.get(key).filter(|t| now < self.refresh_at(t)) {
            return Ok(t.token.clone());
        }
        let token = request(client, pod, key).await?;
        tracing::debug!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            service_account = %key.service_account,
            "service account token issued"
        );
        let value = token.token.clone();
        self.tokens.insert(key.clone(), token);
        Ok(value)
    }

    /// The earliest moment a held token needs renewing.
    pub fn next_refresh(&self) -> Option<SystemTime> {
        self.tokens.values().map(|t| self.refresh_at(t)).min()
    }

    /// Forgets tokens no volume asked for in the last pass.
    pub fn retain(&mut self, used: &[TokenKey]) {
        self.tokens.retain(|k, _| used.contains(k));
    }
}

async fn request(client: &kube::Client, pod: &Pod, key: &TokenKey) -> Result<ServiceAccountToken, SetUpError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: key.audience.iter().cloned().collect(),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let issued = SystemTime::now();
    let answer = api
        .create_token_request(&key.service_account, &PostParams::default(), &req)
        .await
        .map_err(|e| SetUpError::Token(super::api_message(&e)))?;
    let status = answer.status.ok_or_else(|| SetUpError::Token("the TokenRequest has no status".into()))?;
    if status.token.is_empty() {
        return Err(SetUpError::Token("the TokenRequest holds no token".into()));
    }
    let expires_unix = status.expiration_timestamp.0.as_second();
    let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(expires_unix).unwrap_or(0));
    let expires = if expires > issued { expires } else { issued + Duration::from_secs(key.expiration_seconds as u64) };
    Ok(ServiceAccountToken { token: status.token, issued, expires })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(issued: u64, lifetime: u64) -> ServiceAccountToken {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(issued);
        ServiceAccountToken { token: "t".into(), issued, expires: issued + Duration::from_secs(lifetime) }
    }

    #[test]
    fn renewed_at_80_percent_or_after_a_day() {
        let t = token(1000, 3600);
        assert_eq!(t.refresh_at(), SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + 2880));
        assert!(!t.needs_refresh(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + 2879)));
        assert!(t.needs_refresh(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + 2880)));
        // A year-long token is renewed after 24 hours.
        let t = token(0, 365 * 24 * 3600);
        assert_eq!(t.refresh_at(), SystemTime::UNIX_EPOCH + MAX_TTL);
        let mut tokens = PodTokens::default();
        assert_eq!(tokens.next_refresh(), None);
        let key = TokenKey { service_account: "default".into(), audience: None, expiration_seconds: 3600 };
        tokens.tokens.insert(key.clone(), token(1000, 3600));
        assert_eq!(tokens.next_refresh(), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3880)));
        tokens.retain(&[]);
        assert_eq!(tokens.next_refresh(), None);
    }
}
