//! ResourceQuotaController: `status.hard` mirrors `spec.hard`, and
//! `status.used` counts what the namespace holds for each of those keys —
//! pods (not finished), requests/limits of cpu, memory and
//! ephemeral-storage summed over those pods (max of the containers' sum and
//! any init container, plus overhead), services (and their load balancers
//! and node ports), configmaps, secrets, persistentvolumeclaims and
//! requests.storage, and `count/<resource>[.<group>]` for any resource.
//! Scopes Terminating/NotTerminating/BestEffort/NotBestEffort and the
//! PriorityClass scope selector narrow which pods count (see `crate::quota`).
//! Kinds without an informer here are counted from the quota monitor's
//! watches (`monitor`), which recount a namespace's quotas when one of its
//! objects is deleted.
//! ResourceQuota admission charges creates to `status.used` between
//! recounts; a recount that would lower `status.used` waits until the quota
//! has settled (see [`LOWERING_SETTLE`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controllers::work_queue::{Action, Controller};
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ResourceQuota, ResourceQuotaStatus, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

mod monitor;

use super::informers::{reflected, SharedIndexInformer};
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::quantity::Amount;
use crate::quota::evaluator::Evaluator;
use crate::quota::pods::{is_scoped, pod_counts, pod_in_scope, pod_resource};
use crate::sync::LockExt;
use monitor::{monitored_resource, QuotaMonitor};

/// `--resource-quota-sync-period`: how often a quota whose count of some
/// kind failed (a kind not served yet) is recounted.
pub const RESOURCE_QUOTA_SYNC_PERIOD: Duration = Duration::from_secs(300);

/// How long a quota must stay unchanged before a recount may lower its
/// `status.used`. Admission charges a quota just before it stores the new
/// object, so for a moment the informers here lack an object the quota
/// already counts; lowering the count in that moment would let the next
/// create overshoot. Once a quota has not been charged for this long, every
/// charged object has long been stored and seen.
const LOWERING_SETTLE: Duration = Duration::from_secs(1);

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    services: Store<Service>,
    /// Only their metadata: they are counted, never read.
    configmaps: Counted<PartialObjectMeta<ConfigMap>>,
    secrets: Counted<PartialObjectMeta<Secret>>,
    claims: Store<PersistentVolumeClaim>,
    /// Every other kind a quota counts.
    monitor: Arc<QuotaMonitor>,
    /// Quotas whose recount came out lower: `ns/name` → (resourceVersion, first seen).
    lowering: std::sync::Mutex<HashMap<String, (String, Instant)>>,
}

/// Whether `new` lowers any entry of `old`.
fn lowers(old: Option<&BTreeMap<String, Quantity>>, new: &BTreeMap<String, Quantity>) -> bool {
    new.iter().any(|(k, q)| {
        let before = old.and_then(|o| o.get(k)).and_then(|o| Amount::of(o).ok());
        before.is_some_and(|b| Amount::of(q).is_ok_and(|n| n < b))
    })
}

/// How long to wait before a lowering recount of the quota may be written
/// (see [`LOWERING_SETTLE`]); `None`: write now.
fn settle(ctx: &Context, key: &str, rv: &str) -> Option<Duration> {
    let mut pending = ctx.lowering.locked();
    let now = Instant::now();
    match pending.get(key) {
        Some((seen_rv, since)) if seen_rv == rv => {
            let waited = now.duration_since(*since);
            if waited >= LOWERING_SETTLE {
                pending.remove(key);
                None
            } else {
                Some(LOWERING_SETTLE - waited)
            }
        }
        _ => {
            pending.insert(key.to_string(), (rv.to_string(), now));
            Some(LOWERING_SETTLE)
        }
    }
}

/// `key` summed over `objects`, each charged as the admission evaluator charges it.
fn evaluated<K: serde::Serialize>(evaluator: &Evaluator, objects: &[Arc<K>], key: &str, now: Timestamp) -> Amount {
    objects
        .iter()
        .filter_map(|o| serde_json::to_value(o.as_ref()).ok())
        .filter_map(|o| evaluator.usage(&o, now).get(key).copied())
        .fold(Amount::default(), Amount::plus)
}

/// The cache of a kind this controller only counts (the metadata of
/// ConfigMaps and Secrets), watched from the first time a quota counts it.
/// Upstream's quota monitor watches every quotable kind from the start; here
/// a cluster where no quota counts them (the usual one) keeps no copy of
/// every ConfigMap's and Secret's metadata and decodes none of their
/// changes. Nothing is lost by the wait: a change before the watch has no
/// quota to recount, and the first quota that counts the kind lists it
/// before it counts.
struct Counted<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    wanted: tokio::sync::watch::Sender<bool>,
}

impl<K> Counted<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    /// The cache, and the stream of objects touched once it watches.
    fn watch(api: Api<K>) -> (Self, BoxStream<'static, Result<K, watcher::Error>>) {
        let (wanted, mut asked) = tokio::sync::watch::channel(false);
        let first_asked = async move {
            if asked.wait_for(|w| *w).await.is_err() {
                // The controller is gone: never watch.
                std::future::pending::<()>().await;
            }
        };
        let informer = SharedIndexInformer::start_when(api, watcher::Config::default(), first_asked);
        let (store, events) = informer.subscribe().into_parts();
        (Counted { store, wanted }, events)
    }

    /// How many objects `ns` holds, once the cache has listed (its watch
    /// begun on the first call).
    async fn count_in(&self, ns: &str) -> usize {
        self.wanted.send_if_modified(|w| !std::mem::replace(w, true));
        let _ = crate::client::cache_sync::wait_for_cache_sync(&self.store).await;
        in_ns(&self.store, ns).len()
    }
}

fn in_ns<K>(store: &Store<K>, ns: &str) -> Vec<Arc<K>>
where
    K: kube::Resource + Clone,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state_filter(|o| o.meta().namespace.as_deref() == Some(ns))
}

/// The `count/<resource>` keys counted from the informers above, not by
/// the quota monitor.
const INFORMED: [&str; 5] = ["pods", "services", "configmaps", "secrets", "persistentvolumeclaims"];

/// Recounts `status.used`; the bool says whether any key needs the periodic resync.
async fn used(
    ctx: &Context,
    quota: &ResourceQuota,
    ns: &str,
) -> Result<(BTreeMap<String, Quantity>, bool), ControllerError> {
    let hard = quota.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default();
    let now = Timestamp::now();
    let scoped = is_scoped(quota);
    let pods: Vec<Arc<Pod>> =
        in_ns(&ctx.pods, ns).into_iter().filter(|p| pod_counts(p, now) && pod_in_scope(quota, p)).collect();
    let claims = in_ns(&ctx.claims, ns);
    let claim_storage = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
            .and_then(|q| Amount::of(q).ok())
            .unwrap_or_default()
    };
    let mut out = BTreeMap::new();
    let mut resync = false;
    for key in hard.keys() {
        let pod_sum = |field: &str, res: &str| {
            pods.iter().map(|p| pod_resource(p, field, res)).fold(Amount::default(), Amount::plus)
        };
        let amount = match key.as_str() {
            "pods" | "count/pods" => Amount::count(pods.len()),
            "cpu" | "memory" | "ephemeral-storage" => pod_sum("requests", key),
            k if k.starts_with("requests.") && !scoped_out(k) && k != "requests.storage" => {
                pod_sum("requests", &k["requests.".len()..])
            }
            k if k.starts_with("limits.") => pod_sum("limits", &k["limits.".len()..]),
            _ if scoped => continue,
            "services" | "count/services" => Amount::count(in_ns(&ctx.services, ns).len()),
            // As admission charges each Service (one definition of its usage).
            "services.loadbalancers" | "services.nodeports" => {
                evaluated(&Evaluator::Services, &in_ns(&ctx.services, ns), key, now)
            }
            "configmaps" | "count/configmaps" => Amount::count(ctx.configmaps.count_in(ns).await),
            "secrets" | "count/secrets" => Amount::count(ctx.secrets.count_in(ns).await),
            "persistentvolumeclaims" | "count/persistentvolumeclaims" => Amount::count(claims.len()),
            "requests.storage" => claims.iter().map(|c| claim_storage(c)).fold(Amount::default(), Amount::plus),
            k if k.ends_with(".storageclass.storage.k8s.io/requests.storage")
                || k.ends_with(".storageclass.storage.k8s.io/persistentvolumeclaims") =>
            {
                let (class, what) = k.split_once(".storageclass.storage.k8s.io/").unwrap_or_default();
                let of_class: Vec<_> = claims
                    .iter()
                    .filter(|c| c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class))
                    .collect();
                if what == "persistentvolumeclaims" {
                    Amount::count(of_class.len())
                } else {
                    of_class.iter().map(|c| claim_storage(c)).fold(Amount::default(), Amount::plus)
                }
            }
            k => match monitored_resource(k) {
                Some(resource) => match ctx.monitor.count_in(resource, ns).await {
                    Ok(n) => Amount::count(n),
                    Err(e) => {
                        resync = true;
                        tracing::debug!(key = %k, error = %e, "cannot count this resource");
                        continue;
                    }
                },
                None => continue,
            },
        };
        out.insert(key.clone(), amount.to_quantity());
    }
    Ok((out, resync))
}

/// `requests.storage` belongs to claims, not pods.
fn scoped_out(key: &str) -> bool {
    key == "requests.storage"
}

async fn reconcile(quota: Arc<ResourceQuota>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let (Some(ns), Some(name)) = (quota.metadata.namespace.clone(), quota.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if quota.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    for ready in [
        crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await,
        crate::client::cache_sync::wait_for_cache_sync(&ctx.services).await,
        crate::client::cache_sync::wait_for_cache_sync(&ctx.claims).await,
    ] {
        let _ = ready;
    }
    let hard = quota.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default();
    let (used, resync) = used(&ctx, &quota, &ns).await?;
    let next = if resync { Action::requeue(RESOURCE_QUOTA_SYNC_PERIOD) } else { Action::await_change() };
    let old_used = quota.status.as_ref().and_then(|s| s.used.as_ref());
    let key = format!("{ns}/{name}");
    if lowers(old_used, &used) {
        let rv = quota.metadata.resource_version.clone().unwrap_or_default();
        if let Some(wait) = settle(&ctx, &key, &rv) {
            return Ok(Action::requeue(wait));
        }
    } else {
        ctx.lowering.locked().remove(&key);
    }
    let status = ResourceQuotaStatus { hard: Some(hard), used: Some(used) };
    if quota.status.as_ref() == Some(&status) {
        return Ok(next);
    }
    let mut updated = (*quota).clone();
    updated.status = Some(status);
    updated.metadata.managed_fields = None;
    let api: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), &ns);
    match api.replace_status(&name, &PostParams::default(), &updated).await {
        Ok(_) => tracing::debug!(quota = %name, namespace = %ns, "updated quota usage"),
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_millis(200))),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    }
    Ok(next)
}

fn error_policy(_q: Arc<ResourceQuota>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "resource quota reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Whether any quota is in namespace `ns`.
fn any_quota_in(quotas: &Store<ResourceQuota>, ns: Option<&str>) -> bool {
    quotas.find(|q| q.metadata.namespace.as_deref() == ns).is_some()
}

fn quotas_in(quotas: &Store<ResourceQuota>, ns: Option<&str>) -> Vec<ObjectRef<ResourceQuota>> {
    quotas.state().iter().filter(|q| q.metadata.namespace.as_deref() == ns).map(|q| ObjectRef::from_obj(&**q)).collect()
}

pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    pod_informer: super::informers::Informer<Pod>,
) {
    let cfg = watcher::Config::default;
    let (quotas, quota_events) = reflected(Api::<ResourceQuota>::all(client.clone()), cfg());
    // A pod change matters only to a namespace with a quota.
    let with_quotas = quotas.clone();
    let (pods, pod_events) =
        pod_informer.only(move |p| any_quota_in(&with_quotas, p.metadata.namespace.as_deref())).into_shared_parts();
    let (services, service_events) = informers.informer::<Service>().subscribe().into_parts();
    // The metadata of kinds no shared informer holds, watched with the
    // informers' client (sent no managedFields, which the cache drops)
    // once a quota counts them.
    let watch = informers.client();
    let (configmaps, configmap_events) = Counted::watch(Api::<PartialObjectMeta<ConfigMap>>::all(watch.clone()));
    let (secrets, secret_events) = Counted::watch(Api::<PartialObjectMeta<Secret>>::all(watch.clone()));
    let (claims, claim_events) = informers.informer::<PersistentVolumeClaim>().subscribe().into_parts();
    let queue = QueueMetrics::new("resourcequota_primary", quotas.clone());
    let (q1, q2, q3, q4, q5) = (quotas.clone(), quotas.clone(), quotas.clone(), quotas.clone(), quotas.clone());
    let (monitor, replenished) = QuotaMonitor::new(watch.clone(), quotas.clone());
    let replenished = queue.triggered(tokio_stream::wrappers::UnboundedReceiverStream::new(replenished));
    let lowering = std::sync::Mutex::default();
    let ctx = Arc::new(Context { client, pods, services, configmaps, secrets, claims, monitor, lowering });
    let results = Controller::for_stream(queue.primary(quota_events), quotas)
        .watches_shared_stream(
            pod_events,
            queue.mapped(move |o: Arc<Pod>| quotas_in(&q1, o.metadata.namespace.as_deref())),
        )
        .watches_stream(service_events, queue.mapped(move |o: Service| quotas_in(&q2, o.metadata.namespace.as_deref())))
        .watches_stream(
            configmap_events,
            queue.mapped(move |o: PartialObjectMeta<ConfigMap>| quotas_in(&q3, o.metadata.namespace.as_deref())),
        )
        .watches_stream(
            secret_events,
            queue.mapped(move |o: PartialObjectMeta<Secret>| quotas_in(&q4, o.metadata.namespace.as_deref())),
        )
        .watches_stream(
            claim_events,
            queue.mapped(move |o: PersistentVolumeClaim| quotas_in(&q5, o.metadata.namespace.as_deref())),
        )
        .reconcile_on(replenished)
        .run(queue.timed(reconcile), queue.retried(error_policy), ctx);
    drain("resourcequota_primary", results).await;
}
