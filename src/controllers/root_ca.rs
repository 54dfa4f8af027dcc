//! RootCACertPublisher: every active namespace has the ConfigMap
//! `kube-root-ca.crt` holding the cluster's serving CA, kept current. It
//! reads from the controller manager's watches and may only create and
//! update ConfigMaps (upstream's role).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informers::wait_synced;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;

const NAME: &str = "kube-root-ca.crt";

struct Context {
    client: kube::Client,
    ca: Arc<String>,
    maps: Store<ConfigMap>,
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = ns.metadata.name.clone().unwrap_or_default();
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &name);
    let want: BTreeMap<String, String> = [("ca.crt".to_string(), ctx.ca.to_string())].into_iter().collect();
    wait_synced(&ctx.maps).await?;
    let current = ctx.maps.get(&ObjectRef::new(NAME).within(&name));
    if current.as_ref().is_some_and(|c| c.data.as_ref() == Some(&want)) {
        return Ok(Action::await_change());
    }
    let written = match current {
        Some(current) => {
            let mut updated = (*current).clone();
            updated.data = Some(want);
            maps.replace(NAME, &PostParams::default(), &updated).await.map(drop)
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(NAME.into()),
                    annotations: Some([("kubernetes.io/description".to_string(), "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.".to_string())].into_iter().collect()),
                    ..Default::default()
                },
                data: Some(want),
                ..Default::default()
            };
            maps.create(&PostParams::default(), &cm).await.map(drop)
        }
    };
    match written {
        Ok(()) => {}
        // A namespace being deleted refuses new objects; it will go.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) if super::controller_utils::namespace_terminating(&e) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

fn error_policy(_ns: Arc<Namespace>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "root CA publisher reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// `client` is the controller's own; `informers` the process' shared
/// informers (which watch as the controller manager).
pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    ca: Arc<String>,
) {
    let (namespaces, namespace_events) = informers.informer::<Namespace>().subscribe().into_parts();
    let by_name = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let (maps, map_events) = informers.informer_with::<ConfigMap>(by_name).subscribe().into_parts();
    let queue = QueueMetrics::new("root_ca_cert_publisher", namespaces.clone());
    let results = Controller::for_stream(queue.primary(namespace_events), namespaces)
        .watches_stream(
            map_events,
            queue.mapped(|cm: ConfigMap| cm.metadata.namespace.map(|ns| ObjectRef::<Namespace>::new(&ns))),
        )
        .run(queue.timed(reconcile), queue.retried(error_policy), Arc::new(Context { client, ca, maps }));
    drain("root_ca_cert_publisher", results).await;
}
