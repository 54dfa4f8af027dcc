//! ServiceAccountController: every active namespace has a `default`
//! ServiceAccount, recreated if deleted. It reads from the controller
//! manager's watches and may only create (upstream's role).

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;

struct Context {
    client: kube::Client,
    accounts: Store<ServiceAccount>,
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = ns.metadata.name.clone().unwrap_or_default();
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &name);
    super::informers::wait_synced(&ctx.accounts).await?;
    if ctx.accounts.get(&ObjectRef::new("default").within(&name)).is_none() {
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some("default".into()), ..Default::default() },
            ..Default::default()
        };
        match accounts
            .create(&PostParams { field_manager: Some("service-account-controller".into()), ..Default::default() }, &sa)
            .await
        {
            Ok(_) => tracing::debug!(namespace = %name, "created the default ServiceAccount"),
            // Already there, or the namespace is going; a refusal by RBAC
            // is an error, retried.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) if super::controller_utils::namespace_terminating(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

fn error_policy(_ns: Arc<Namespace>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "service account reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// `client` is the controller's own; `informers` the process' shared
/// informers (which watch as the controller manager).
pub async fn run(client: kube::Client, informers: crate::client::informer_factory::SharedInformerFactory) {
    let (namespaces, namespace_events) = informers.informer::<Namespace>().subscribe().into_parts();
    let (accounts, account_events) = informers
        .informer_with::<ServiceAccount>(watcher::Config::default().fields("metadata.name=default"))
        .subscribe()
        .into_parts();
    let queue = QueueMetrics::new("serviceaccount", namespaces.clone());
    let results = Controller::for_stream(queue.primary(namespace_events), namespaces)
        .watches_stream(
            account_events,
            queue.mapped(|sa: ServiceAccount| sa.metadata.namespace.map(|ns| ObjectRef::<Namespace>::new(&ns))),
        )
        .run(queue.timed(reconcile), queue.retried(error_policy), Arc::new(Context { client, accounts }));
    drain("serviceaccount", results).await;
}
