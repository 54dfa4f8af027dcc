//! Legacy service-account tokens, as upstream's legacy validator accepts
//! them: signed with the service-account key by the token controller, with
//! the issuer `kubernetes/serviceaccount` and no expiry, valid while the
//! Secret they name exists (not being deleted) and still holds them, and
//! while their ServiceAccount exists with the uid they name. A use is
//! recorded on the Secret as the date label
//! `kubernetes.io/legacy-token-last-used`, at most once a day; a Secret the
//! legacy token cleaner labelled `kubernetes.io/legacy-token-invalid-since`
//! authenticates nobody (its use is still recorded).

use base64::Engine;
use serde_json::{json, Value};

use super::User;
use crate::apiserver::storage::Storage;
use crate::apiserver::Api;
use crate::pki::service_account_key::{
    date_of, unverified_payload, LegacyClaims, INVALID_SINCE_LABEL, LAST_USED_LABEL,
};

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels").and_then(|l| l.get(key)).and_then(Value::as_str)
}

/// The user of a legacy token, if `token` is one and is valid now.
pub async fn authenticate(api: &Api, token: &str) -> Option<User> {
    // Tell legacy tokens apart before paying for a signature check.
    LegacyClaims::from_payload(&unverified_payload(token)?)?;
    let payload = api.tokens.as_ref()?.key().verify(token).ok()?;
    let claims = LegacyClaims::from_payload(&payload)?;
    let secret_key = format!("/registry/secrets/{}/{}", claims.namespace, claims.secret_name);
    let secret = api.storage.get(&secret_key).await.ok()??;
    if secret.object.pointer("/metadata/deletionTimestamp").is_some() {
        return None;
    }
    let held = secret.object.pointer("/data/token").and_then(Value::as_str)?;
    let held = base64::engine::general_purpose::STANDARD.decode(held).ok()?;
    if held != token.as_bytes() {
        return None;
    }
    let account_key = format!("/registry/serviceaccounts/{}/{}", claims.namespace, claims.service_account_name);
    let account = api.storage.get(&account_key).await.ok()??;
    if account.object.pointer("/metadata/deletionTimestamp").is_some()
        || account.object.pointer("/metadata/uid").and_then(Value::as_str) != Some(claims.service_account_uid.as_str())
    {
        return None;
    }
    let invalid = label(&secret.object, INVALID_SINCE_LABEL).is_some();
    record_use(api.storage.clone(), secret_key, secret.object, secret.rev);
    if invalid {
        tracing::debug!(namespace = %claims.namespace, secret = %claims.secret_name, "legacy token marked invalid");
        return None;
    }
    Some(User {
        name: format!("system:serviceaccount:{}:{}", claims.namespace, claims.service_account_name),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{}", claims.namespace),
            "system:authenticated".into(),
        ],
    })
}

/// Labels the Secret with today's date unless it already says today (or
/// tomorrow, a clock ahead of ours), in the background: the request does
/// not wait for the write, and a lost race is the next use's to retry.
fn record_use(storage: Storage, key: String, mut secret: Value, rev: i64) {
    let now = crate::apiserver::meta::unix_now();
    let today = date_of(now);
    let last = label(&secret, LAST_USED_LABEL);
    if last == Some(today.as_str()) || last == Some(date_of(now + 86_400).as_str()) {
        return;
    }
    let Some(meta) = secret.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels[LAST_USED_LABEL] = json!(today);
    tokio::spawn(async move {
        if let Err(e) = storage.update(&key, &secret, rev).await {
            tracing::debug!(secret = %key, error = ?e, "could not record a legacy token's use");
        }
    });
}
