//! The quota monitor (upstream's QuotaMonitor): a metadata-only watch of
//! each resource quotas count by `count/<resource>[.<group>]` (and by the
//! bare `replicationcontrollers` and `resourcequotas`), the kinds the
//! controller has no informer of its own for. A resource is watched from
//! the first time a quota counts it, and its cache counts a namespace's
//! objects from then on. An object deleted, or the watch listing again
//! (which may have missed deletions), requeues the quotas that count the
//! resource (upstream's replenishment), so their usage is released at once
//! rather than at the next resync.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::mpsc;

use crate::controllers::ControllerError;

type Metadata = PartialObjectMeta<DynamicObject>;

/// The watched resources, their caches, and where requeues go.
pub struct QuotaMonitor {
    /// The informers' client (sent no managedFields).
    client: kube::Client,
    quotas: Store<ResourceQuota>,
    requeue: mpsc::UnboundedSender<ObjectRef<ResourceQuota>>,
    /// `plural[.group]` → the cache of its objects' metadata.
    monitors: tokio::sync::Mutex<HashMap<String, Store<Metadata>>>,
}

/// The `plural[.group]` a quota key counts by listing, if it is one the
/// monitor watches (not those the controller's informers hold).
pub fn monitored_resource(key: &str) -> Option<&str> {
    match key {
        "replicationcontrollers" | "resourcequotas" => Some(key),
        k => k.strip_prefix("count/").filter(|r| !super::INFORMED.contains(r)),
    }
}

/// Whether `quota` counts `resource`.
fn counts(quota: &ResourceQuota, resource: &str) -> bool {
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    hard.is_some_and(|h| h.keys().any(|k| monitored_resource(k) == Some(resource)))
}

impl QuotaMonitor {
    /// The monitor, and the stream of quotas it asks to be recounted.
    pub fn new(
        client: kube::Client,
        quotas: Store<ResourceQuota>,
    ) -> (Arc<QuotaMonitor>, mpsc::UnboundedReceiver<ObjectRef<ResourceQuota>>) {
        let (requeue, requests) = mpsc::unbounded_channel();
        let monitor = QuotaMonitor { client, quotas, requeue, monitors: Default::default() };
        (Arc::new(monitor), requests)
    }

    /// How many objects of `resource` namespace `ns` holds, once its cache
    /// has listed (its watch started on the first call).
    pub async fn count_in(&self, resource: &str, ns: &str) -> Result<usize, ControllerError> {
        let store = self.monitor(resource).await?;
        store.wait_until_ready().await.map_err(|e| ControllerError::Discovery(e.to_string()))?;
        Ok(store.state().iter().filter(|o| o.metadata.namespace.as_deref() == Some(ns)).count())
    }

    /// The cache of `resource`, its watch started if it has none yet.
    async fn monitor(&self, resource: &str) -> Result<Store<Metadata>, ControllerError> {
        let mut monitors = self.monitors.lock().await;
        if let Some(store) = monitors.get(resource) {
            return Ok(store.clone());
        }
        let ar = api_resource(&self.client, resource).await?;
        let writer = reflector::store::Writer::<Metadata>::new(ar.clone());
        let store = writer.as_reader();
        let api: Api<Metadata> = Api::all_with(self.client.clone(), &ar);
        let watch = watcher(api, watcher::Config::default()).default_backoff();
        let events = reflector::reflector(writer, watch).boxed();
        let (quotas, requeue, name) = (self.quotas.clone(), self.requeue.clone(), resource.to_string());
        tracing::debug!(resource = %name, "quota monitor watches a resource");
        tokio::spawn(replenish(events, quotas, requeue, name));
        monitors.insert(resource.to_string(), store.clone());
        Ok(store)
    }
}

/// Requeues the quotas that count `resource` on what calls for a recount:
/// an object deleted (those of its namespace), a list done (all of them).
async fn replenish(
    mut events: futures_util::stream::BoxStream<'static, Result<watcher::Event<Metadata>, watcher::Error>>,
    quotas: Store<ResourceQuota>,
    requeue: mpsc::UnboundedSender<ObjectRef<ResourceQuota>>,
    resource: String,
) {
    while let Some(event) = events.next().await {
        let namespace = match event {
            Ok(watcher::Event::Delete(meta)) => Some(meta.metadata.namespace),
            Ok(watcher::Event::InitDone) => None,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(resource = %resource, error = %e, "quota monitor's watch failed; it retries");
                continue;
            }
        };
        for quota in quotas.state() {
            let in_scope = namespace.as_ref().is_none_or(|ns| &quota.metadata.namespace == ns);
            if in_scope && counts(&quota, &resource) && requeue.send(ObjectRef::from_obj(&*quota)).is_err() {
                // The controller is gone.
                return;
            }
        }
    }
}

/// `plural[.group]` at its group's preferred version.
async fn api_resource(client: &kube::Client, resource: &str) -> Result<ApiResource, ControllerError> {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let version = if group.is_empty() {
        "v1".to_string()
    } else {
        kube::discovery::group(client, group).await?.preferred_version_or_latest().to_string()
    };
    let api_version = if group.is_empty() { version.clone() } else { format!("{group}/{version}") };
    Ok(ApiResource { group: group.into(), version, api_version, kind: String::new(), plural: plural.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monitor_watches_what_no_informer_holds() {
        assert_eq!(monitored_resource("count/replicasets.apps"), Some("replicasets.apps"));
        assert_eq!(monitored_resource("count/widgets.example.com"), Some("widgets.example.com"));
        assert_eq!(monitored_resource("replicationcontrollers"), Some("replicationcontrollers"));
        assert_eq!(monitored_resource("resourcequotas"), Some("resourcequotas"));
        assert_eq!(monitored_resource("count/pods"), None);
        assert_eq!(monitored_resource("count/secrets"), None);
        assert_eq!(monitored_resource("pods"), None);
        assert_eq!(monitored_resource("requests.cpu"), None);
        let quota: ResourceQuota =
            serde_json::from_value(serde_json::json!({"spec": {"hard": {"count/replicasets.apps": "1"}}}))
                .expect("quota");
        assert!(counts(&quota, "replicasets.apps") && !counts(&quota, "deployments.apps"));
    }
}
