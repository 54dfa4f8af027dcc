//! TokenCleaner (tokencleaner): deletes each bootstrap token Secret of
//! kube-system once its `expiration` has passed (one that does not parse
//! has), as upstream's; a token that expires later is looked at again then.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::watcher;

use super::bootstrap_token::{is_token, time_left, NAMESPACE, SECRET_TYPE};
use super::informers;
use super::ControllerError;
use crate::client::informer_factory::SharedInformerFactory;

/// `client` is the controller's own.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let typed = watcher::Config::default().fields(&format!("type={SECRET_TYPE}"));
    let (tokens, events) = informers.informer_with::<Secret>(typed).subscribe().only(is_token).trigger_self();
    informers::run("token_cleaner", tokens, vec![events], reconcile, Arc::new(client)).await;
}

async fn reconcile(secret: Arc<Secret>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    if !is_token(&secret) || secret.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match time_left(&secret, Timestamp::now()) {
        None => return Ok(Action::await_change()),
        Some(left) if left > 0 => return Ok(Action::requeue(Duration::from_secs(u64::try_from(left).unwrap_or(1)))),
        Some(_) => {}
    }
    let name = secret.metadata.name.clone().unwrap_or_default();
    tracing::debug!(secret = %name, "deleting an expired bootstrap token");
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: secret.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced((*client).clone(), NAMESPACE);
    match secrets.delete(&name, &params).await {
        Ok(_) => Ok(Action::await_change()),
        // Gone already, or replaced by another Secret of that name.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
