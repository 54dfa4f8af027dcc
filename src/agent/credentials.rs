//! Registry credentials from a pod's `imagePullSecrets`
//! (`kubernetes.io/dockerconfigjson` and the older `kubernetes.io/dockercfg`),
//! matched to an image by its registry host, as the kubelet's keyring does.

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

use super::cri::api;

/// The registry host of an image reference (`docker.io` when none is named).
pub fn registry_of(image: &str) -> String {
    let first = image.split('/').next().unwrap_or_default();
    let has_registry = image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        normalize(first)
    } else {
        "docker.io".into()
    }
}

/// `https://index.docker.io/v1/` → `docker.io`; `http://host:5000/x` → `host:5000`.
pub fn normalize(key: &str) -> String {
    let host = key.trim_start_matches("https://").trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or_default().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".into(),
        _ => host,
    }
}

fn auth_of(entry: &Value) -> Option<api::AuthConfig> {
    let s = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut auth = api::AuthConfig {
        username: s("username"),
        password: s("password"),
        auth: s("auth"),
        identity_token: s("identitytoken"),
        registry_token: s("registrytoken"),
        ..Default::default()
    };
    if auth.username.is_empty() && !auth.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth.auth.as_bytes()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, pass) = text.split_once(':')?;
        auth.username = user.to_string();
        auth.password = pass.to_string();
    }
    (!auth.username.is_empty() || !auth.identity_token.is_empty() || !auth.registry_token.is_empty()).then_some(auth)
}

/// Credentials in `secret` for the image's registry, in the order found.
pub fn from_secret(secret: &Secret, image: &str) -> Vec<api::AuthConfig> {
    let registry = registry_of(image);
    let data = secret.data.as_ref();
    let parsed: Option<Value> = data
        .and_then(|d| d.get(".dockerconfigjson").or_else(|| d.get(".dockercfg")))
        .and_then(|b| serde_json::from_slice(&b.0).ok());
    let Some(doc) = parsed else { return Vec::new() };
    let auths = doc.get("auths").unwrap_or(&doc);
    let Some(map) = auths.as_object() else { return Vec::new() };
    map.iter()
        .filter(|(k, _)| normalize(k) == registry)
        .filter_map(|(k, v)| {
            auth_of(v).map(|mut a| {
                // containerd 1.6 parses this as a URL and hands the
                // credentials only to that host; docker.io is served by
                // other hosts (registry-1.docker.io), so it is left open.
                let host = normalize(k);
                a.server_address = if host == "docker.io" { String::new() } else { format!("https://{host}") };
                a
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    #[test]
    fn registries_of_images() {
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("library/busybox:1"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/library/busybox:1"), "127.0.0.1:5000");
        assert_eq!(registry_of("ghcr.io/x/y@sha256:abc"), "ghcr.io");
        assert_eq!(registry_of("localhost/x"), "localhost");
        assert_eq!(normalize("https://index.docker.io/v1/"), "docker.io");
    }

    #[test]
    fn dockerconfigjson_secrets_match_by_registry() {
        let doc = r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYXNz"},"other.io":{"username":"a","password":"b"}}}"#;
        let secret = Secret {
            data: Some(BTreeMap::from([(".dockerconfigjson".to_string(), ByteString(doc.as_bytes().to_vec()))])),
            ..Default::default()
        };
        let found = from_secret(&secret, "127.0.0.1:5000/library/busybox:1");
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].username.as_str(), found[0].password.as_str()), ("user", "pass"));
        assert_eq!(found[0].server_address, "https://127.0.0.1:5000");
        assert!(from_secret(&secret, "busybox").is_empty());
    }
}
