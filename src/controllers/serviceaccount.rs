//! ServiceAccountController: every active namespace has a `default`
//! ServiceAccount, recreated if deleted.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::ControllerError;

async fn reconcile(ns: Arc<Namespace>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = ns.metadata.name.clone().unwrap_or_default();
    let accounts: Api<ServiceAccount> = Api::namespaced((*client).clone(), &name);
    if accounts.get_opt("default").await?.is_none() {
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some("default".into()), ..Default::default() },
            ..Default::default()
        };
        match accounts
            .create(&PostParams { field_manager: Some("service-account-controller".into()), ..Default::default() }, &sa)
            .await
        {
            Ok(_) => tracing::debug!(namespace = %name, "created the default ServiceAccount"),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 || s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

fn error_policy(_ns: Arc<Namespace>, err: &ControllerError, _client: Arc<kube::Client>) -> Action {
    tracing::warn!(error = %err, "service account reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

pub async fn run(client: kube::Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let accounts: Api<ServiceAccount> = Api::all(client.clone());
    Controller::new(namespaces, watcher::Config::default())
        .watches(accounts, watcher::Config::default().fields("metadata.name=default"), |sa: ServiceAccount| {
            sa.metadata.namespace.map(|ns| ObjectRef::<Namespace>::new(&ns))
        })
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|_| std::future::ready(()))
        .await;
}
