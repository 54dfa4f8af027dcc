//! Who may use the kubelet API, as upstream's kubelet decides it: a client
//! certificate signed by the cluster's client CA, or a bearer token the API
//! server vouches for (TokenReview); then a SubjectAccessReview on the
//! node for the request's verb and the subresource its path maps to
//! (`nodes/stats`, `nodes/metrics`, `nodes/log`, `nodes/spec`,
//! `nodes/checkpoint`, everything else `nodes/proxy`). Answers are cached
//! as upstream's webhook caches do: tokens 2 min, allowed 5 min, denied 30 s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::Method;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::sync::LockExt;

/// The DER client certificate of the connection, if the client sent one
/// that the client CA signed (an extension of every request).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificate(pub Option<std::sync::Arc<Vec<u8>>>);

/// The caller, as the API server knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

const TOKEN_TTL: Duration = Duration::from_secs(120);
const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries a cache holds before expired ones are swept out (and, when all
/// are fresh, the whole cache is dropped): bounded memory under any load.
const CACHE_LIMIT: usize = 1024;

struct TtlCache<K, V> {
    entries: HashMap<K, (Instant, V)>,
}

impl<K: std::hash::Hash + Eq, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache { entries: HashMap::new() }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.entries.get(key).filter(|(until, _)| *until > Instant::now()).map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: K, value: V, ttl: Duration) {
        let now = Instant::now();
        if self.entries.len() >= CACHE_LIMIT {
            self.entries.retain(|_, (until, _)| *until > now);
            if self.entries.len() >= CACHE_LIMIT {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now + ttl, value));
    }
}

/// What a request asks of the node, as upstream's GetRequestAttributes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

impl Attributes {
    pub fn of(method: &Method, path: &str) -> Attributes {
        let verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
        let subresource = if under("/stats") {
            "stats"
        } else if under("/metrics") {
            "metrics"
        } else if under("/logs") {
            "log"
        } else if under("/spec") {
            "spec"
        } else if under("/checkpoint") {
            "checkpoint"
        } else {
            "proxy"
        };
        Attributes { verb, subresource }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("Unauthorized")]
    Unauthenticated,
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden { user: String, verb: &'static str, subresource: &'static str },
    #[error("Authorization error (user={user}, verb={verb}, resource=nodes, subresource={subresource}): {message}")]
    Review { user: String, verb: &'static str, subresource: &'static str, message: String },
}

impl AuthError {
    pub fn status(&self) -> u16 {
        match self {
            AuthError::Unauthenticated => 401,
            AuthError::Forbidden { .. } => 403,
            AuthError::Review { .. } => 500,
        }
    }
}

/// The kubelet API's authenticator and authorizer.
pub struct KubeletAuth {
    client: kube::Client,
    node_name: String,
    tokens: Mutex<TtlCache<String, Option<UserInfo>>>,
    decisions: Mutex<TtlCache<(UserInfo, Attributes), bool>>,
}

impl KubeletAuth {
    pub fn new(client: kube::Client, node_name: String) -> KubeletAuth {
        KubeletAuth { client, node_name, tokens: Mutex::new(TtlCache::new()), decisions: Mutex::new(TtlCache::new()) }
    }

    /// The caller of a request: its certificate's CN and O, else its bearer token's user.
    pub async fn authenticate(
        &self,
        cert: &PeerCertificate,
        authorization: Option<&str>,
    ) -> Result<UserInfo, AuthError> {
        // Upstream's union: the certificate first, then the token.
        if let Some((name, mut groups)) = cert.0.as_ref().and_then(|der| crate::pki::subject_of(der)) {
            groups.push("system:authenticated".into());
            return Ok(UserInfo { name, uid: String::new(), groups, extra: BTreeMap::new() });
        }
        let token = authorization.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
        match token {
            Some(t) if !t.is_empty() => self.review_token(t).await.ok_or(AuthError::Unauthenticated),
            _ => Err(AuthError::Unauthenticated),
        }
    }

    async fn review_token(&self, token: &str) -> Option<UserInfo> {
        if let Some(cached) = self.tokens.locked().get(&token.to_string()) {
            return cached;
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..Default::default()
        };
        let answer = match Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: TokenReview failed");
                return None;
            }
        };
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        self.tokens.locked().put(token.to_string(), user.clone(), TOKEN_TTL);
        user
    }

    /// Whether `user` may make the request `attrs` describes on this node.
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AuthError> {
        let key = (user.clone(), attrs.clone());
        let cached = self.decisions.locked().get(&key);
        let allowed = match cached {
            Some(a) => a,
            None => {
                let allowed = self.review_access(user, attrs).await?;
                self.decisions.locked().put(key, allowed, if allowed { ALLOWED_TTL } else { DENIED_TTL });
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(AuthError::Forbidden { user: user.name.clone(), verb: attrs.verb, subresource: attrs.subresource })
        }
    }

    async fn review_access(&self, user: &UserInfo, attrs: &Attributes) -> Result<bool, AuthError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attrs.verb.to_string()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attrs.subresource.to_string()),
                    name: Some(self.node_name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &review).await {
            Ok(r) => Ok(r.status.is_some_and(|s| s.allowed)),
            Err(e) => Err(AuthError::Review {
                user: user.name.clone(),
                verb: attrs.verb,
                subresource: attrs.subresource,
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_node_subresources_as_upstream() {
        let a = |m: Method, p: &str| {
            let a = Attributes::of(&m, p);
            (a.verb, a.subresource)
        };
        assert_eq!(a(Method::GET, "/stats/summary"), ("get", "stats"));
        assert_eq!(a(Method::GET, "/stats"), ("get", "stats"));
        assert_eq!(a(Method::GET, "/statsx"), ("get", "proxy"));
        assert_eq!(a(Method::GET, "/metrics/cadvisor"), ("get", "metrics"));
        assert_eq!(a(Method::GET, "/logs/syslog"), ("get", "log"));
        assert_eq!(a(Method::POST, "/exec/ns/pod/c"), ("create", "proxy"));
        assert_eq!(a(Method::GET, "/containerLogs/ns/pod/c"), ("get", "proxy"));
        assert_eq!(a(Method::DELETE, "/pods"), ("delete", "proxy"));
    }

    #[test]
    fn caches_expire_and_stay_bounded() {
        let mut c: TtlCache<u32, bool> = TtlCache::new();
        c.put(1, true, Duration::from_secs(60));
        c.put(2, false, Duration::ZERO);
        assert_eq!(c.get(&1), Some(true));
        assert_eq!(c.get(&2), None);
        for i in 0..(CACHE_LIMIT as u32 * 3) {
            c.put(i + 10, true, Duration::from_secs(60));
        }
        assert!(c.entries.len() <= CACHE_LIMIT);
    }
}
