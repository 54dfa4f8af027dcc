//! The ConfigMap `kube-system/extension-apiserver-authentication`, which
//! upstream's API server keeps (its cluster-authentication-trust
//! controller) and every aggregated API server reads at start to trust the
//! cluster's clients: `client-ca-file` (the CA of client certificates),
//! and, when the API server has a front-proxy (request header) CA,
//! `requestheader-client-ca-file` with the header names as JSON arrays
//! (`requestheader-username-headers`, `-uid-headers`, `-group-headers`,
//! `-extra-headers-prefix`, `-allowed-names`): the request-header CA that
//! signed the front proxy's client certificate of the aggregator
//! (`system:auth-proxy`, as k3s names it) and the headers it names the
//! caller in (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-`).
//!
//! As upstream, what is there is combined with this server's own: the
//! certificates of both, without duplicates or expired ones, and the union
//! of the header lists, so that servers of one cluster with different CAs
//! all appear. Written at every start.

use serde_json::{json, Map, Value};
use x509_parser::prelude::FromDer;

use crate::apiserver::meta;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Storage, WriteError};
use crate::pki::ca_bundle;

const KEY: &str = "/registry/configmaps/kube-system/extension-apiserver-authentication";

/// Request header lists, in the order upstream writes their keys.
const HEADER_LISTS: &[&str] = &[
    "requestheader-username-headers",
    "requestheader-uid-headers",
    "requestheader-group-headers",
    "requestheader-extra-headers-prefix",
];
const ALLOWED_NAMES: &str = "requestheader-allowed-names";
const CLIENT_CA: &str = "client-ca-file";
const REQUEST_HEADER_CA: &str = "requestheader-client-ca-file";

/// Certificates are kept while they expire less than this long ago.
const EXPIRY_SLACK_SECONDS: i64 = 5 * 60;

fn pem(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The certificates of the bundles, in order, once each, without those
/// expired more than the slack ago; an unreadable bundle adds none.
fn combine_certificates(bundles: &[&str], now: i64) -> String {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    for bundle in bundles {
        let ders = ca_bundle::certificates(bundle).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "an unreadable CA bundle in extension-apiserver-authentication");
            Vec::new()
        });
        for der in ders {
            let fresh = x509_parser::certificate::X509Certificate::from_der(&der)
                .is_ok_and(|(_, c)| c.validity().not_after.timestamp() > now - EXPIRY_SLACK_SECONDS);
            if fresh && !kept.contains(&der) {
                kept.push(der);
            }
        }
    }
    kept.iter().map(|d| pem(d)).collect()
}

/// A JSON array of strings, as the ConfigMap holds the header lists.
fn string_list(data: &Map<String, Value>, key: &str) -> Vec<String> {
    data.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| serde_json::from_str::<Vec<String>>(s).ok())
        .unwrap_or_default()
}

/// This server's front proxy: its CA and the names and headers it uses.
#[derive(Debug, Clone, Default)]
pub struct RequestHeader {
    /// The request-header CA, PEM.
    pub ca_pem: String,
    pub allowed_names: Vec<String>,
    /// By key of [`HEADER_LISTS`]: the header names for it.
    pub headers: Vec<(&'static str, Vec<String>)>,
}

impl RequestHeader {
    /// ferrok's aggregator: `system:auth-proxy` naming the caller in
    /// `X-Remote-User`, `X-Remote-Group` and `X-Remote-Extra-*`.
    pub fn front_proxy(ca_pem: String) -> RequestHeader {
        let one = |h: &str| vec![h.to_string()];
        RequestHeader {
            ca_pem,
            allowed_names: one(crate::pki::AUTH_PROXY_USER),
            headers: vec![
                ("requestheader-username-headers", one("X-Remote-User")),
                ("requestheader-group-headers", one("X-Remote-Group")),
                ("requestheader-extra-headers-prefix", one("X-Remote-Extra-")),
            ],
        }
    }
}

/// The union of two lists, `existing` first, once each.
fn union(mut existing: Vec<String>, ours: &[String]) -> Vec<String> {
    for item in ours {
        if !existing.contains(item) {
            existing.push(item.clone());
        }
    }
    existing
}

/// The ConfigMap's data: what `existing` holds combined with this server's
/// client CA (`client_ca`, PEM) and front proxy, at `now` (Unix seconds).
pub fn combined_data(
    existing: &Map<String, Value>,
    client_ca: &str,
    front_proxy: Option<&RequestHeader>,
    now: i64,
) -> Map<String, Value> {
    let text = |key: &str| existing.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut data = Map::new();
    let client = combine_certificates(&[&text(CLIENT_CA), client_ca], now);
    if !client.is_empty() {
        data.insert(CLIENT_CA.into(), json!(client));
    }
    let ours = front_proxy.map(|f| f.ca_pem.as_str()).unwrap_or_default();
    let request_header = combine_certificates(&[&text(REQUEST_HEADER_CA), ours], now);
    if !request_header.is_empty() {
        let no_names = Vec::new();
        for key in HEADER_LISTS {
            let our_headers =
                front_proxy.and_then(|f| f.headers.iter().find(|(k, _)| k == key).map(|(_, v)| v)).unwrap_or(&no_names);
            let list = union(string_list(existing, key), our_headers);
            data.insert(key.to_string(), json!(json!(list).to_string()));
        }
        data.insert(REQUEST_HEADER_CA.into(), json!(request_header));
        let names = union(string_list(existing, ALLOWED_NAMES), front_proxy.map_or(&no_names, |f| &f.allowed_names));
        data.insert(ALLOWED_NAMES.into(), json!(json!(names).to_string()));
    }
    data
}

/// Writes the ConfigMap (creating it when missing) unless it holds what it
/// must already.
pub async fn publish(storage: &Storage, client_ca: &str, front_proxy: Option<&RequestHeader>) -> ApiResult<()> {
    for _ in 0..3 {
        let current = storage.get(KEY).await?;
        let existing = current.as_ref().and_then(|c| c.object["data"].as_object().cloned()).unwrap_or_default();
        let data = Value::Object(combined_data(&existing, client_ca, front_proxy, meta::unix_now()));
        let written = match current {
            Some(c) if c.object["data"] == data => return Ok(()),
            Some(c) => {
                let mut updated = c.object;
                updated["data"] = data;
                storage.update(KEY, &updated, c.rev).await
            }
            None => {
                let object = json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": "extension-apiserver-authentication",
                        "namespace": "kube-system",
                        "uid": meta::new_uid(),
                        "creationTimestamp": meta::now_rfc3339(),
                    },
                    "data": data,
                });
                storage.create(KEY, &object).await
            }
        };
        match written {
            Ok(_) => return Ok(()),
            Err(WriteError::Exists) | Err(WriteError::Changed(_)) => continue,
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    tracing::warn!("extension-apiserver-authentication not written: it kept changing");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(cn: &str, not_after: (i32, u8)) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, 1);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").pem()
    }

    #[test]
    fn client_cas_are_combined_once_each_and_expired_ones_dropped() {
        let now = meta::unix_now();
        let (ours, theirs, old) = (ca("ours", (2200, 1)), ca("theirs", (2200, 1)), ca("old", (2001, 1)));
        let data = combined_data(&Map::new(), &ours, None, now);
        assert_eq!(data.keys().collect::<Vec<_>>(), vec![CLIENT_CA]);
        assert_eq!(
            ca_bundle::certificates(data[CLIENT_CA].as_str().unwrap_or_default()).map(|c| c.len()).ok(),
            Some(1)
        );
        // Again: the same, byte for byte.
        assert_eq!(combined_data(&data, &ours, None, now), data);
        let existing: Map<String, Value> =
            [(CLIENT_CA.to_string(), json!(format!("{theirs}{old}{ours}")))].into_iter().collect();
        let combined = combined_data(&existing, &ours, None, now);
        let certs = ca_bundle::certificates(combined[CLIENT_CA].as_str().unwrap_or_default()).unwrap_or_default();
        assert_eq!(certs.len(), 2);
        assert_eq!(certs, ca_bundle::certificates(&format!("{theirs}{ours}")).unwrap_or_default());
    }

    #[test]
    fn request_header_keys_are_kept_as_json_arrays_when_a_front_proxy_ca_is_there() {
        let now = meta::unix_now();
        let existing: Map<String, Value> = [
            (REQUEST_HEADER_CA.to_string(), json!(ca("front-proxy", (2200, 1)))),
            ("requestheader-username-headers".to_string(), json!("[\"X-Remote-User\"]")),
            (ALLOWED_NAMES.to_string(), json!("[\"front-proxy-client\"]")),
        ]
        .into_iter()
        .collect();
        let data = combined_data(&existing, &ca("ours", (2200, 1)), None, now);
        assert_eq!(data["requestheader-username-headers"], json!("[\"X-Remote-User\"]"));
        assert_eq!(data["requestheader-group-headers"], json!("[]"));
        assert_eq!(data[ALLOWED_NAMES], json!("[\"front-proxy-client\"]"));
        assert!(data.contains_key(REQUEST_HEADER_CA));
        // With ferrok's own front proxy: both CAs, and the lists' union.
        let ours = RequestHeader::front_proxy(ca("ferrok-request-header-ca", (2200, 1)));
        let data = combined_data(&existing, &ca("ours", (2200, 1)), Some(&ours), now);
        assert_eq!(data[ALLOWED_NAMES], json!("[\"front-proxy-client\",\"system:auth-proxy\"]"));
        assert_eq!(data["requestheader-group-headers"], json!("[\"X-Remote-Group\"]"));
        assert_eq!(data["requestheader-extra-headers-prefix"], json!("[\"X-Remote-Extra-\"]"));
        assert_eq!(
            ca_bundle::certificates(data[REQUEST_HEADER_CA].as_str().unwrap_or_default()).map(|c| c.len()).ok(),
            Some(2)
        );
    }
}
