//! Since when the API server records the use of legacy service-account
//! tokens (`kubernetes.io/legacy-token-last-used`), as upstream's API
//! server publishes it: the ConfigMap
//! `kube-system/kube-apiserver-legacy-service-account-token-tracking` with
//! the date under `since`. The legacy token cleaner counts a token's idle
//! time from there at the earliest. Made at start when missing, or when its
//! date cannot be read; a date already there is kept.

use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Storage, WriteError};

pub const CONFIG_MAP: &str = "kube-apiserver-legacy-service-account-token-tracking";
pub const SINCE_KEY: &str = "since";

/// Whether `date` is a `YYYY-MM-DD` date.
fn is_date(date: &str) -> bool {
    let b = date.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter().enumerate().all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

pub async fn ensure(storage: &Storage) -> ApiResult<()> {
    let key = format!("/registry/configmaps/kube-system/{CONFIG_MAP}");
    let today = crate::pki::service_account_key::date_of(meta::unix_now());
    let written = match storage.get(&key).await? {
        None => {
            let cm = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": CONFIG_MAP, "namespace": "kube-system",
                    "uid": meta::new_uid(), "creationTimestamp": meta::now_rfc3339(),
                },
                "data": {SINCE_KEY: today},
            });
            storage.create(&key, &cm).await.map(drop)
        }
        Some(current) => {
            let since = current.object.pointer(&format!("/data/{SINCE_KEY}")).and_then(Value::as_str);
            if since.is_some_and(is_date) {
                return Ok(());
            }
            let mut updated = current.object.clone();
            if !updated.get("data").is_some_and(Value::is_object) {
                updated["data"] = json!({});
            }
            updated["data"][SINCE_KEY] = json!(today);
            storage.update(&key, &updated, current.rev).await.map(drop)
        }
    };
    match written {
        // Another server made or fixed it first.
        Ok(()) | Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(()),
        Err(WriteError::Api(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert!(super::is_date("2024-02-29"));
        assert!(!super::is_date("2024-2-29"));
        assert!(!super::is_date("yesterday!"));
    }
}
