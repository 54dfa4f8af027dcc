//! Bootstrap token Secrets as the bootstrap signer and the token cleaner
//! read them (upstream's `k8s.io/cluster-bootstrap` secret helpers): the
//! Secret `kube-system/bootstrap-token-<id>` of type
//! `bootstrap.kubernetes.io/token`, its fields in `data`, its `expiration`
//! in RFC 3339 (one that does not parse counts as expired).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const NAMESPACE: &str = "kube-system";
const NAME_PREFIX: &str = "bootstrap-token-";

/// A field of the Secret's data, as text.
pub fn field(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The token id the Secret's name carries.
pub fn id_of_name(secret: &Secret) -> Option<&str> {
    secret.metadata.name.as_deref()?.strip_prefix(NAME_PREFIX).filter(|id| !id.is_empty())
}

/// Whether the Secret is a bootstrap token in kube-system.
pub fn is_token(secret: &Secret) -> bool {
    secret.type_.as_deref() == Some(SECRET_TYPE) && secret.metadata.namespace.as_deref() == Some(NAMESPACE)
}

/// How long the token is still valid for, in seconds: None without an
/// expiration, Some(0 or less) once expired (or unreadable).
pub fn time_left(secret: &Secret, now: Timestamp) -> Option<i64> {
    let expiration = field(secret, "expiration").filter(|e| !e.is_empty())?;
    match expiration.parse::<Timestamp>() {
        Ok(at) => Some(at.as_second() - now.as_second()),
        Err(_) => Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn token(name: &str, fields: &[(&str, &str)]) -> Secret {
        let mut s = Secret { type_: Some(SECRET_TYPE.into()), ..Default::default() };
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(NAMESPACE.into());
        s.data = Some(fields.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect());
        s
    }

    #[test]
    fn expiry() {
        let now: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(time_left(&token("bootstrap-token-abcdef", &[]), now), None);
        let later = token("bootstrap-token-abcdef", &[("expiration", "2024-01-01T01:00:00+01:00")]);
        assert_eq!(time_left(&later, now), Some(0));
        let hour = token("bootstrap-token-abcdef", &[("expiration", "2024-01-01T01:00:00Z")]);
        assert_eq!(time_left(&hour, now), Some(3600));
        assert_eq!(time_left(&token("t", &[("expiration", "tomorrow")]), now), Some(0));
        assert_eq!(id_of_name(&hour), Some("abcdef"));
    }
}
