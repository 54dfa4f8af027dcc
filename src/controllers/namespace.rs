//! NamespaceController: when a namespace is being deleted, deletes
//! everything in it, and once nothing is left, removes the `kubernetes`
//! finalizer through `namespaces/<name>/finalize`, which lets the API server
//! remove the namespace.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{verbs, Discovery, Scope};

use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;

struct Context {
    client: kube::Client,
}

/// Deletes one round of what is left in `ns`; returns how many objects remain.
async fn delete_contents(client: &kube::Client, ns: &str) -> Result<usize, ControllerError> {
    let discovery =
        Discovery::new(client.clone()).run().await.map_err(|e| ControllerError::Discovery(e.to_string()))?;
    let mut remaining = 0;
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if caps.scope != Scope::Namespaced
                || !caps.supports_operation(verbs::LIST)
                || !caps.supports_operation(verbs::DELETE)
            {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            let items = api.list_metadata(&ListParams::default()).await?;
            if items.items.is_empty() {
                continue;
            }
            remaining += items.items.len();
            for item in items.items {
                if item.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if let Some(name) = item.metadata.name {
                    match api.delete(&name, &DeleteParams::background()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }
    Ok(remaining)
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let name = ns.metadata.name.clone().unwrap_or_default();
    let remaining = delete_contents(&ctx.client, &name).await?;
    if remaining > 0 {
        tracing::debug!(namespace = %name, remaining, "waiting for the namespace's contents to go");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let mut current = namespaces.get(&name).await?;
    let has_finalizer =
        current.spec.as_ref().and_then(|s| s.finalizers.as_ref()).is_some_and(|f| f.iter().any(|x| x == "kubernetes"));
    if has_finalizer {
        if let Some(spec) = current.spec.as_mut() {
            if let Some(f) = spec.finalizers.as_mut() {
                f.retain(|x| x != "kubernetes");
            }
        }
        namespaces.replace_subresource("finalize", &name, &PostParams::default(), &current).await?;
        tracing::info!(namespace = %name, "namespace finalized");
    }
    Ok(Action::await_change())
}

fn error_policy(_ns: Arc<Namespace>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "namespace reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

pub async fn run(client: kube::Client, informers: crate::client::informer_factory::SharedInformerFactory) {
    let (namespaces, namespace_events) = informers.informer::<Namespace>().subscribe().into_parts();
    let queue = QueueMetrics::new("namespace", namespaces.clone());
    let results = Controller::for_stream(queue.primary(namespace_events), namespaces).run(
        queue.timed(reconcile),
        queue.retried(error_policy),
        Arc::new(Context { client }),
    );
    drain("namespace", results).await;
}
