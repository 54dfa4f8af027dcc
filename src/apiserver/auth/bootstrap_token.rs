//! Bootstrap tokens, as upstream's authenticator reads them: a token
//! `<id>.<secret>` names the Secret `kube-system/bootstrap-token-<id>` of
//! type `bootstrap.kubernetes.io/token`, which must hold the same secret,
//! allow authentication (`usage-bootstrap-authentication: "true"`) and not
//! have expired. Its user is `system:bootstrap:<id>`, in
//! `system:bootstrappers` and the Secret's `auth-extra-groups`.

use base64::Engine;
use serde_json::Value;

use super::User;
use crate::apiserver::storage::Storage;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";

fn field(secret: &Value, key: &str) -> Option<String> {
    let b64 = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// Byte-wise comparison in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The user of a bootstrap token, if it is one and it is valid now.
pub async fn authenticate(storage: &Storage, token: &str, now_unix: i64) -> Option<User> {
    if !crate::pki::join_token::is_bootstrap_token(token) {
        return None;
    }
    let (id, secret) = token.split_once('.')?;
    let stored = storage.get(&format!("/registry/secrets/kube-system/bootstrap-token-{id}")).await.ok()??;
    let obj = &stored.object;
    if obj.get("type").and_then(Value::as_str) != Some(SECRET_TYPE)
        || obj.pointer("/metadata/deletionTimestamp").is_some()
    {
        return None;
    }
    if field(obj, "token-id").as_deref() != Some(id) || !same(&field(obj, "token-secret")?, secret) {
        return None;
    }
    if field(obj, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return None;
    }
    if let Some(expiration) = field(obj, "expiration") {
        let at = time::OffsetDateTime::parse(&expiration, &time::format_description::well_known::Rfc3339).ok()?;
        if at.unix_timestamp() <= now_unix {
            return None;
        }
    }
    let mut groups = vec!["system:bootstrappers".to_string()];
    for g in field(obj, "auth-extra-groups").unwrap_or_default().split(',').map(str::trim) {
        // Upstream accepts only further system:bootstrappers:* groups.
        if g.starts_with("system:bootstrappers:") && !groups.iter().any(|x| x == g) {
            groups.push(g.to_string());
        }
    }
    groups.push("system:authenticated".into());
    Some(User { name: format!("system:bootstrap:{id}"), groups })
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_compare() {
        assert!(super::same("abc", "abc"));
        assert!(!super::same("abc", "abd"));
        assert!(!super::same("abc", "ab"));
    }
}
