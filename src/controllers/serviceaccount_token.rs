//! TokensController (serviceaccount-token): legacy service-account token
//! Secrets, as upstream's token controller keeps them. A Secret of type
//! `kubernetes.io/service-account-token` annotated
//! `kubernetes.io/service-account.name` (and maybe `.uid`) is filled with a
//! `token` (a non-expiring JWT signed with the service-account key, issuer
//! `kubernetes/serviceaccount`, naming the Secret), `ca.crt` (the cluster's
//! root CA) and `namespace`, and annotated with its account's uid. A
//! Secret whose account does not exist (or has another uid) is deleted;
//! deleting an account deletes its token Secrets; a deleted token Secret is
//! taken out of its account's `secrets`. No token Secret is made for an
//! account (upstream stopped in v1.24). It acts as the controller manager
//! itself, as upstream's does: it is the one that holds the signing key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informers::{self, Trigger};
use super::ControllerError;
use crate::client::indexer::Index;
use crate::client::informer::Change;
use crate::client::informer_factory::SharedInformerFactory;
use crate::pki::service_account_key::{LegacyClaims, ServiceAccountKey};

pub const SECRET_TYPE: &str = "kubernetes.io/service-account-token";
pub const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
pub const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// Token Secrets by `<namespace>/<account name>`.
const BY_ACCOUNT: &str = "serviceaccount";

fn by_account(secret: &Secret) -> Vec<String> {
    annotation(secret, NAME_ANNOTATION)
        .map(|name| vec![format!("{}/{name}", secret.metadata.namespace.as_deref().unwrap_or_default())])
        .unwrap_or_default()
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret.metadata.annotations.as_ref()?.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

struct Context {
    client: kube::Client,
    key: Arc<ServiceAccountKey>,
    root_ca: Arc<String>,
    accounts: Store<ServiceAccount>,
}

/// `client` acts as the controller manager; `key` signs the tokens and
/// `root_ca` is each Secret's `ca.crt`.
pub async fn run(
    client: kube::Client,
    informers: SharedInformerFactory,
    key: Arc<ServiceAccountKey>,
    root_ca: Arc<String>,
) {
    let tokens = watcher::Config::default().fields(&format!("type={SECRET_TYPE}"));
    let secret_informer = informers.informer_with::<Secret>(tokens);
    let owned = secret_informer.index(BY_ACCOUNT, by_account);
    let account_informer = informers.informer::<ServiceAccount>();
    let accounts = account_informer.store();
    // A deleted token leaves its account's list of secrets.
    let (_, secret_changes) = secret_informer.subscribe().into_changes();
    tokio::spawn(forget_deleted(client.clone(), accounts.clone(), secret_changes));
    let (secrets, secret_events) = secret_informer.subscribe().trigger_self();
    let account_events: Trigger<Secret> = account_informer
        .subscribe()
        .trigger_with(move |sa: &ServiceAccount| tokens_of(&owned, sa).into_iter().map(|s| ObjectRef::from_obj(&*s)))
        .1;
    let ctx = Arc::new(Context { client, key, root_ca, accounts });
    informers::run("serviceaccount_tokens_secret", secrets, vec![secret_events, account_events], reconcile, ctx).await;
}

/// The token Secrets naming `sa` (by name; by uid too where they say one).
fn tokens_of(owned: &Index<Secret>, sa: &ServiceAccount) -> Vec<Arc<Secret>> {
    let ns = sa.metadata.namespace.as_deref().unwrap_or_default();
    let name = sa.metadata.name.as_deref().unwrap_or_default();
    owned.get(&format!("{ns}/{name}"))
}

/// The account a Secret names, from the cache, or from the API when the
/// cache has not seen it (yet): None when it does not exist, or exists
/// with another uid than the Secret says.
async fn account_of(ctx: &Context, secret: &Secret) -> Result<Option<ServiceAccount>, ControllerError> {
    let ns = secret.metadata.namespace.as_deref().unwrap_or_default();
    let Some(name) = annotation(secret, NAME_ANNOTATION) else { return Ok(None) };
    let uid = annotation(secret, UID_ANNOTATION);
    let matches = |sa: &ServiceAccount| uid.is_none_or(|u| sa.metadata.uid.as_deref() == Some(u));
    if let Some(sa) = ctx.accounts.get(&ObjectRef::new(name).within(ns)) {
        if matches(&sa) {
            return Ok(Some((*sa).clone()));
        }
    }
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api.get_opt(name).await?.filter(matches))
}

/// What a Secret lacks: (ca.crt, namespace, token).
fn needs(secret: &Secret, root_ca: &str) -> (bool, bool, bool) {
    let data = secret.data.as_ref();
    let value = |k: &str| data.and_then(|d| d.get(k)).map(|v| v.0.as_slice()).unwrap_or_default();
    (
        !root_ca.is_empty() && value("ca.crt") != root_ca.as_bytes(),
        value("namespace").is_empty(),
        value("token").is_empty(),
    )
}

async fn reconcile(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let ns = secret.metadata.namespace.clone().unwrap_or_default();
    let name = secret.metadata.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    if annotation(&secret, NAME_ANNOTATION).is_none() {
        // Validation requires the name; such a Secret names no account.
        return Ok(Action::await_change());
    }
    let Some(sa) = account_of(&ctx, &secret).await? else {
        tracing::debug!(namespace = %ns, secret = %name, "deleting a token whose service account does not exist");
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: secret.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        return match secrets.delete(&name, &params).await {
            Ok(_) => Ok(Action::await_change()),
            // Gone already, or replaced by another Secret of that name.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Action::await_change()),
            Err(e) => Err(e.into()),
        };
    };
    if needs(&secret, &ctx.root_ca) == (false, false, false) {
        return Ok(Action::await_change());
    }
    // Fill the newest copy, and only when the cache has it: otherwise the
    // change to come will bring it here again.
    let Some(mut live) = secrets.get_opt(&name).await? else { return Ok(Action::await_change()) };
    if live.metadata.resource_version != secret.metadata.resource_version {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let (ca, namespace, token) = needs(&live, &ctx.root_ca);
    let data = live.data.get_or_insert_with(BTreeMap::new);
    if ca {
        data.insert("ca.crt".into(), ByteString(ctx.root_ca.as_bytes().to_vec()));
    }
    if namespace {
        data.insert("namespace".into(), ByteString(ns.clone().into_bytes()));
    }
    if token {
        let claims = LegacyClaims {
            namespace: ns.clone(),
            service_account_name: sa.metadata.name.clone().unwrap_or_default(),
            service_account_uid: sa.metadata.uid.clone().unwrap_or_default(),
            secret_name: name.clone(),
        };
        let jwt = ctx.key.sign(&claims.payload()).map_err(|e| ControllerError::Invalid(e.to_string()))?;
        data.insert("token".into(), ByteString(jwt.into_bytes()));
    }
    let annotations = live.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(NAME_ANNOTATION.into(), sa.metadata.name.clone().unwrap_or_default());
    annotations.insert(UID_ANNOTATION.into(), sa.metadata.uid.clone().unwrap_or_default());
    match secrets.replace(&name, &PostParams::default(), &live).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Action::requeue(Duration::from_millis(200))),
        Err(e) => Err(e.into()),
    }
}

/// Takes each deleted token Secret out of its account's `secrets`.
async fn forget_deleted(
    client: kube::Client,
    accounts: Store<ServiceAccount>,
    mut changes: futures_util::stream::BoxStream<'static, Change<Secret>>,
) {
    while let Some(change) = changes.next().await {
        let Change::Deleted(secret) = change else { continue };
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let Some(sa_name) = annotation(&secret, NAME_ANNOTATION) else { continue };
        let secret_name = secret.metadata.name.clone().unwrap_or_default();
        let listed =
            |sa: &ServiceAccount| sa.secrets.iter().flatten().any(|r| r.name.as_deref() == Some(&*secret_name));
        if !accounts.get(&ObjectRef::new(sa_name).within(&ns)).is_some_and(|sa| listed(&sa)) {
            continue;
        }
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        // A few tries against concurrent writers, as upstream's back-off.
        for _ in 0..10 {
            let Ok(Some(mut sa)) = api.get_opt(sa_name).await else { break };
            let uid = annotation(&secret, UID_ANNOTATION);
            if uid.is_some_and(|u| sa.metadata.uid.as_deref() != Some(u)) || !listed(&sa) {
                break;
            }
            if let Some(list) = sa.secrets.as_mut() {
                list.retain(|r| r.name.as_deref() != Some(&*secret_name));
            }
            match api.replace(sa_name, &PostParams::default(), &sa).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::debug!(namespace = %ns, account = %sa_name, error = %e, "could not forget a deleted token");
                    break;
                }
                Ok(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_secret_lacks() {
        let mut s = Secret::default();
        assert_eq!(needs(&s, "CA"), (true, true, true));
        assert_eq!(needs(&s, ""), (false, true, true));
        s.data = Some(
            [("ca.crt", "CA"), ("namespace", "ns"), ("token", "t")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        assert_eq!(needs(&s, "CA"), (false, false, false));
        assert_eq!(needs(&s, "NEW CA"), (true, false, false));
    }
}
