//! ResourceQuotaController: `status.hard` mirrors `spec.hard`, and
//! `status.used` counts what the namespace holds for each of those keys —
//! pods (not finished), requests/limits of cpu, memory and
//! ephemeral-storage summed over those pods (max of the containers' sum and
//! any init container, plus overhead), services (and their load balancers
//! and node ports), configmaps, secrets, persistentvolumeclaims and
//! requests.storage, and `count/<resource>[.<group>]` for any resource.
//! Scopes Terminating/NotTerminating/BestEffort/NotBestEffort and the
//! PriorityClass scope selector narrow which pods count.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ResourceQuota, ResourceQuotaStatus, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informers::reflected;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;

/// `--resource-quota-sync-period`: how often quotas counting kinds this
/// controller does not watch are recounted.
pub const RESOURCE_QUOTA_SYNC_PERIOD: Duration = Duration::from_secs(300);

/// A quantity as milli-units, and whether it was written in binary units.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amount {
    pub milli: i128,
    pub binary: bool,
}

impl Amount {
    pub fn count(n: usize) -> Amount {
        Amount { milli: n as i128 * 1000, binary: false }
    }

    pub fn parse(q: &str) -> Amount {
        let q = q.trim();
        let split = q.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+'))).unwrap_or(q.len());
        let (num, suffix) = q.split_at(split);
        let n: f64 = num.parse().unwrap_or(0.0);
        let (mult, binary) = match suffix {
            "" => (1.0, false),
            "m" => (1e-3, false),
            "k" => (1e3, false),
            "M" => (1e6, false),
            "G" => (1e9, false),
            "T" => (1e12, false),
            "P" => (1e15, false),
            "Ki" => (1024.0, true),
            "Mi" => (1024f64.powi(2), true),
            "Gi" => (1024f64.powi(3), true),
            "Ti" => (1024f64.powi(4), true),
            "Pi" => (1024f64.powi(5), true),
            s if s.starts_with(['e', 'E']) => (10f64.powi(s[1..].parse().unwrap_or(0)), false),
            _ => (1.0, false),
        };
        Amount { milli: (n * mult * 1000.0).round() as i128, binary }
    }

    pub fn plus(self, other: Amount) -> Amount {
        Amount { milli: self.milli + other.milli, binary: self.binary || other.binary }
    }

    pub fn max(self, other: Amount) -> Amount {
        if other.milli > self.milli {
            Amount { binary: self.binary || other.binary, ..other }
        } else {
            self
        }
    }

    /// The canonical string, as upstream prints quantities.
    pub fn format(self) -> String {
        if self.milli % 1000 != 0 {
            return format!("{}m", self.milli);
        }
        let n = self.milli / 1000;
        if n == 0 {
            return "0".into();
        }
        if self.binary {
            for (i, suffix) in ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"].iter().enumerate() {
                let unit = 1i128 << (10 * (6 - i));
                if n % unit == 0 {
                    return format!("{}{suffix}", n / unit);
                }
            }
            return n.to_string();
        }
        for (i, suffix) in ["E", "P", "T", "G", "M", "k"].iter().enumerate() {
            let unit = 10i128.pow(3 * (6 - i as u32));
            if n % unit == 0 {
                return format!("{}{suffix}", n / unit);
            }
        }
        n.to_string()
    }
}

/// upstream's `QuotaV1Pod`: finished pods and pods past their deletion
/// grace period no longer count.
pub fn pod_counts(pod: &Pod, now: Timestamp) -> bool {
    if matches!(super::controller_utils::pod_phase(pod), "Succeeded" | "Failed") {
        return false;
    }
    match (&pod.metadata.deletion_timestamp, pod.metadata.deletion_grace_period_seconds) {
        (Some(at), Some(grace)) => now.as_second() <= at.0.as_second() + grace,
        _ => true,
    }
}

/// The pod's request (or limit) of `resource`: the larger of the
/// containers' sum and any one init container, plus the pod overhead.
pub fn pod_resource(pod: &Pod, field: &str, resource: &str) -> Amount {
    let Some(spec) = pod.spec.as_ref() else { return Amount::default() };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let map =
            if field == "requests" { r.and_then(|r| r.requests.as_ref()) } else { r.and_then(|r| r.limits.as_ref()) };
        map.and_then(|m| m.get(resource)).map(|q| Amount::parse(&q.0)).unwrap_or_default()
    };
    let sum = spec.containers.iter().map(of).fold(Amount::default(), Amount::plus);
    let init = spec.init_containers.iter().flatten().map(of).fold(Amount::default(), Amount::max);
    let overhead =
        spec.overhead.as_ref().and_then(|o| o.get(resource)).map(|q| Amount::parse(&q.0)).unwrap_or_default();
    sum.max(init).plus(overhead)
}

fn best_effort(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten())).all(|c| {
        c.resources.as_ref().is_none_or(|r| {
            r.requests.as_ref().is_none_or(BTreeMap::is_empty) && r.limits.as_ref().is_none_or(BTreeMap::is_empty)
        })
    })
}

/// Whether the quota's scopes select the pod.
pub fn pod_in_scope(quota: &ResourceQuota, pod: &Pod) -> bool {
    let spec = quota.spec.as_ref();
    let terminating = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds).is_some();
    let scopes = spec.and_then(|s| s.scopes.clone()).unwrap_or_default();
    let by_scope = scopes.iter().all(|s| match s.as_str() {
        "Terminating" => terminating,
        "NotTerminating" => !terminating,
        "BestEffort" => best_effort(pod),
        "NotBestEffort" => !best_effort(pod),
        _ => true,
    });
    let class = pod.spec.as_ref().and_then(|s| s.priority_class_name.clone());
    let by_selector =
        spec.and_then(|s| s.scope_selector.as_ref()).and_then(|s| s.match_expressions.as_ref()).is_none_or(|exprs| {
            exprs.iter().all(|e| {
                let values = e.values.clone().unwrap_or_default();
                let v = if e.scope_name == "PriorityClass" {
                    class.clone()
                } else {
                    return match e.scope_name.as_str() {
                        "Terminating" => terminating,
                        "NotTerminating" => !terminating,
                        "BestEffort" => best_effort(pod),
                        "NotBestEffort" => !best_effort(pod),
                        _ => true,
                    };
                };
                match e.operator.as_str() {
                    "In" => v.is_some_and(|v| values.contains(&v)),
                    "NotIn" => v.is_none_or(|v| !values.contains(&v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
        });
    by_scope && by_selector
}

fn is_scoped(quota: &ResourceQuota) -> bool {
    let spec = quota.spec.as_ref();
    spec.and_then(|s| s.scopes.as_ref()).is_some_and(|s| !s.is_empty())
        || spec.and_then(|s| s.scope_selector.as_ref()).is_some()
}

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    services: Store<Service>,
    configmaps: Store<ConfigMap>,
    secrets: Store<Secret>,
    claims: Store<PersistentVolumeClaim>,
}

fn in_ns<K>(store: &Store<K>, ns: &str) -> Vec<Arc<K>>
where
    K: kube::Resource + Clone,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state_filter(|o| o.meta().namespace.as_deref() == Some(ns))
}

/// The `count/<plural>[.<group>]` of a kind this controller does not watch.
async fn count_other(ctx: &Context, ns: &str, resource: &str) -> Result<usize, ControllerError> {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let version = if group.is_empty() {
        "v1".to_string()
    } else {
        let g = kube::discovery::group(&ctx.client, group).await?;
        g.preferred_version_or_latest().to_string()
    };
    let api_version = if group.is_empty() { version.clone() } else { format!("{group}/{version}") };
    let ar = ApiResource { group: group.into(), version, api_version, kind: String::new(), plural: plural.into() };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
    Ok(api.list_metadata(&ListParams::default()).await.map(|l| l.items.len())?)
}

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
            .map(|q| Amount::parse(&q.0))
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
            "services.loadbalancers" => Amount::count(
                in_ns(&ctx.services, ns)
                    .iter()
                    .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
                    .count(),
            ),
            "services.nodeports" => Amount::count(
                in_ns(&ctx.services, ns)
                    .iter()
                    .filter_map(|s| s.spec.as_ref())
                    .filter(|s| matches!(s.type_.as_deref(), Some("NodePort") | Some("LoadBalancer")))
                    .map(|s| s.ports.as_ref().map_or(0, Vec::len))
                    .sum(),
            ),
            "configmaps" | "count/configmaps" => Amount::count(in_ns(&ctx.configmaps, ns).len()),
            "secrets" | "count/secrets" => Amount::count(in_ns(&ctx.secrets, ns).len()),
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
            "replicationcontrollers" => {
                resync = true;
                Amount::count(count_other(ctx, ns, "replicationcontrollers").await?)
            }
            "resourcequotas" => {
                resync = true;
                Amount::count(count_other(ctx, ns, "resourcequotas").await?)
            }
            k if k.starts_with("count/") => {
                resync = true;
                match count_other(ctx, ns, &k["count/".len()..]).await {
                    Ok(n) => Amount::count(n),
                    Err(e) => {
                        tracing::debug!(key = %k, error = %e, "cannot count this resource");
                        continue;
                    }
                }
            }
            _ => continue,
        };
        out.insert(key.clone(), Quantity(amount.format()));
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
        ctx.pods.wait_until_ready().await,
        ctx.services.wait_until_ready().await,
        ctx.configmaps.wait_until_ready().await,
        ctx.secrets.wait_until_ready().await,
        ctx.claims.wait_until_ready().await,
    ] {
        let _ = ready;
    }
    let hard = quota.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default();
    let (used, resync) = used(&ctx, &quota, &ns).await?;
    let next = if resync { Action::requeue(RESOURCE_QUOTA_SYNC_PERIOD) } else { Action::await_change() };
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

fn quotas_in(quotas: &Store<ResourceQuota>, ns: Option<&str>) -> Vec<ObjectRef<ResourceQuota>> {
    quotas.state().iter().filter(|q| q.metadata.namespace.as_deref() == ns).map(|q| ObjectRef::from_obj(&**q)).collect()
}

pub async fn run(client: kube::Client, pod_informer: super::informers::Informer<Pod>) {
    let cfg = watcher::Config::default;
    let (pods, pod_events) = pod_informer.into_parts();
    let (services, service_events) = reflected(Api::<Service>::all(client.clone()), cfg());
    let (configmaps, configmap_events) = reflected(Api::<ConfigMap>::all(client.clone()), cfg());
    let (secrets, secret_events) = reflected(Api::<Secret>::all(client.clone()), cfg());
    let (claims, claim_events) = reflected(Api::<PersistentVolumeClaim>::all(client.clone()), cfg());
    let (quotas, quota_events) = reflected(Api::<ResourceQuota>::all(client.clone()), cfg());
    let queue = QueueMetrics::new("resourcequota_primary", quotas.clone());
    let (q1, q2, q3, q4, q5) = (quotas.clone(), quotas.clone(), quotas.clone(), quotas.clone(), quotas.clone());
    let ctx = Arc::new(Context { client, pods, services, configmaps, secrets, claims });
    let results = Controller::for_stream(queue.primary(quota_events), quotas)
        .watches_stream(pod_events, queue.mapped(move |o: Pod| quotas_in(&q1, o.metadata.namespace.as_deref())))
        .watches_stream(service_events, queue.mapped(move |o: Service| quotas_in(&q2, o.metadata.namespace.as_deref())))
        .watches_stream(
            configmap_events,
            queue.mapped(move |o: ConfigMap| quotas_in(&q3, o.metadata.namespace.as_deref())),
        )
        .watches_stream(secret_events, queue.mapped(move |o: Secret| quotas_in(&q4, o.metadata.namespace.as_deref())))
        .watches_stream(
            claim_events,
            queue.mapped(move |o: PersistentVolumeClaim| quotas_in(&q5, o.metadata.namespace.as_deref())),
        )
        .run(queue.timed(reconcile), queue.retried(error_policy), ctx);
    drain("resourcequota_primary", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_add_and_print_as_upstream() {
        let sum = |qs: &[&str]| qs.iter().map(|q| Amount::parse(q)).fold(Amount::default(), Amount::plus).format();
        assert_eq!(sum(&["500m", "500m"]), "1");
        assert_eq!(sum(&["250m", "1"]), "1250m");
        assert_eq!(sum(&["64Mi", "64Mi"]), "128Mi");
        assert_eq!(sum(&["1Gi", "512Mi"]), "1536Mi");
        assert_eq!(sum(&["1G", "1G"]), "2G");
        assert_eq!(sum(&[]), "0");
        assert_eq!(Amount::count(3).format(), "3");
        assert_eq!(Amount::count(1000).format(), "1k");
    }

    #[test]
    fn pod_requests_take_init_containers_and_overhead() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}, "limits": {"memory": "1Gi"}}}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}],
                "overhead": {"cpu": "10m"}
            }
        }))
        .unwrap();
        assert_eq!(pod_resource(&pod, "requests", "cpu").format(), "1010m");
        assert_eq!(pod_resource(&pod, "requests", "memory").format(), "64Mi");
        assert_eq!(pod_resource(&pod, "limits", "memory").format(), "1Gi");
        assert!(!best_effort(&pod));
    }
}
