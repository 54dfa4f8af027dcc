//! BootstrapSigner (bootstrapsigner): signs the `kubeconfig` of the
//! ConfigMap `kube-public/cluster-info` with every bootstrap token that may
//! sign (`usage-bootstrap-signing: "true"`, not expired), as upstream's: a
//! detached JWS (HS256, key id the token id, keyed by the token secret)
//! under `jws-kubeconfig-<token id>`, so that a node holding a token can
//! check the cluster's CA and address before it trusts the server.
//! Signatures of tokens that went away are removed.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::controllers::work_queue::Action;
use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::bootstrap_token::{field, id_of_name, is_token, time_left, SECRET_TYPE};
use super::informers;
use super::ControllerError;
use crate::client::informer_factory::SharedInformerFactory;

pub const NAMESPACE: &str = "kube-public";
pub const CONFIG_MAP: &str = "cluster-info";
pub const KUBECONFIG_KEY: &str = "kubeconfig";
pub const SIGNATURE_PREFIX: &str = "jws-kubeconfig-";

struct Context {
    client: kube::Client,
    tokens: Store<Secret>,
}

/// `client` is the controller's own.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let named = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    let (maps, map_events) = informers
        .informer_with::<ConfigMap>(named)
        .subscribe()
        .only(|cm| cm.metadata.namespace.as_deref() == Some(NAMESPACE))
        .trigger_self();
    let typed = watcher::Config::default().fields(&format!("type={SECRET_TYPE}"));
    let (tokens, token_events) = informers
        .informer_with::<Secret>(typed)
        .subscribe()
        .trigger_with(|s: &Secret| is_token(s).then(|| ObjectRef::<ConfigMap>::new(CONFIG_MAP).within(NAMESPACE)));
    let ctx = Arc::new(Context { client, tokens });
    informers::run("bootstrap_signer_queue", maps, vec![map_events, token_events], reconcile, ctx).await;
}

/// The tokens that may sign, by id: a well-named token with a secret,
/// allowed to sign and not expired.
fn signing_tokens(tokens: &[Arc<Secret>], now: Timestamp) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for t in tokens.iter().filter(|t| is_token(t)) {
        let (Some(name_id), Some(id), Some(secret)) = (id_of_name(t), field(t, "token-id"), field(t, "token-secret"))
        else {
            continue;
        };
        if name_id != id || secret.is_empty() || time_left(t, now).is_some_and(|left| left <= 0) {
            continue;
        }
        if field(t, "usage-bootstrap-signing").as_deref() != Some("true") {
            continue;
        }
        out.entry(id).or_insert(secret);
    }
    out
}

/// The detached JWS of `content` keyed by a token: `<header>..<signature>`,
/// the header `{"alg":"HS256","kid":"<id>"}` as go-jose writes it.
pub fn detached_signature(content: &str, token_id: &str, token_secret: &str) -> String {
    let b64 = |d: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d);
    let header = serde_json::json!({"alg": "HS256", "kid": token_id}).to_string();
    let signing_input = format!("{}.{}", b64(header.as_bytes()), b64(content.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token_secret.as_bytes());
    let tag = ring::hmac::sign(&key, signing_input.as_bytes());
    format!("{}..{}", b64(header.as_bytes()), b64(tag.as_ref()))
}

/// The ConfigMap's data with the signatures `tokens` make, or None when
/// they are what it holds already (or it has nothing to sign).
fn signed(data: &BTreeMap<String, String>, tokens: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    let content = data.get(KUBECONFIG_KEY)?;
    let mut new: BTreeMap<String, String> =
        data.iter().filter(|(k, _)| !k.starts_with(SIGNATURE_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect();
    for (id, secret) in tokens {
        new.insert(format!("{SIGNATURE_PREFIX}{id}"), detached_signature(content, id, secret));
    }
    (new != *data).then_some(new)
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let data = cm.data.clone().unwrap_or_default();
    let tokens = signing_tokens(&ctx.tokens.state(), Timestamp::now());
    let Some(new) = signed(&data, &tokens) else { return Ok(Action::await_change()) };
    let mut updated = (*cm).clone();
    updated.data = Some(new);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    match maps.replace(CONFIG_MAP, &PostParams::default(), &updated).await {
        Ok(_) => Ok(Action::await_change()),
        // The change to come brings it here again.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn token(id: &str, fields: &[(&str, &str)]) -> Arc<Secret> {
        let mut s = Secret { type_: Some(SECRET_TYPE.into()), ..Default::default() };
        s.metadata.name = Some(format!("bootstrap-token-{id}"));
        s.metadata.namespace = Some("kube-system".into());
        let mut data: BTreeMap<String, ByteString> =
            fields.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect();
        data.insert("token-id".into(), ByteString(id.as_bytes().to_vec()));
        s.data = Some(data);
        Arc::new(s)
    }

    #[test]
    fn only_valid_signing_tokens_sign() {
        let now: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        let tokens = vec![
            token("aaaaaa", &[("token-secret", "s1"), ("usage-bootstrap-signing", "true")]),
            token("bbbbbb", &[("token-secret", "s2"), ("usage-bootstrap-signing", "false")]),
            token(
                "cccccc",
                &[("token-secret", "s3"), ("usage-bootstrap-signing", "true"), ("expiration", "2023-01-01T00:00:00Z")],
            ),
            token("dddddd", &[("usage-bootstrap-signing", "true")]),
        ];
        let signing = signing_tokens(&tokens, now);
        assert_eq!(signing.keys().collect::<Vec<_>>(), ["aaaaaa"]);
    }

    #[test]
    fn signatures_are_replaced_and_removed() {
        let data: BTreeMap<String, String> = [
            (KUBECONFIG_KEY.to_string(), "kind: Config\n".to_string()),
            (format!("{SIGNATURE_PREFIX}gone00"), "x..y".to_string()),
        ]
        .into_iter()
        .collect();
        let tokens: BTreeMap<String, String> = [("abcdef".to_string(), "0123456789abcdef".to_string())].into();
        let new = signed(&data, &tokens).unwrap();
        assert!(!new.contains_key(&format!("{SIGNATURE_PREFIX}gone00")));
        let sig = &new[&format!("{SIGNATURE_PREFIX}abcdef")];
        assert!(sig.starts_with("eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9.."), "{sig}");
        assert_eq!(signed(&new, &tokens), None);
    }
}
