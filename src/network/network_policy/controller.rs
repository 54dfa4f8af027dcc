//! The watch loop: Pods (all namespaces, since peers can be anywhere),
//! Namespaces and NetworkPolicies come from the process's shared
//! informers; after each batch of events
//! the plan is worked out again and the difference to what the table holds
//! is sent as one update. The whole part is rendered once every list has
//! arrived, and again whenever the table writer asks for it.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher;
use kube::ResourceExt;

use super::model::{namespace_labels, PodInfo, Policy};
use super::plan::{plan, Cluster};
use super::render::{self, Ruleset};
use crate::client::informer::WatchEvents;
use crate::client::informer_factory::SharedInformerFactory;
use crate::network::nftables::Part;

/// What the node's network policy enforcement needs to know of the node.
#[derive(Debug, Clone)]
pub struct NetworkPolicyConfig {
    pub node_name: String,
    /// The cluster DNS Service addresses (kube-dns), kept reachable on port
    /// 53 for pods isolated for egress.
    pub cluster_dns: Vec<Ipv4Addr>,
}

/// One kind's objects, with a relist being gathered beside them.
struct Kind<T> {
    objects: HashMap<String, T>,
    relist: Option<HashMap<String, T>>,
    listed: bool,
}

impl<T> Default for Kind<T> {
    fn default() -> Self {
        Kind { objects: HashMap::new(), relist: None, listed: false }
    }
}

impl<T> Kind<T> {
    /// Applies one watch event; `convert` gives None for objects that are
    /// left out (and removed when they were in). True when anything changed.
    fn event<K: kube::Resource>(&mut self, event: watcher::Event<Arc<K>>, convert: impl Fn(&K) -> Option<T>) -> bool {
        let key = |o: &K| format!("{}/{}", o.meta().namespace.as_deref().unwrap_or_default(), o.name_any());
        match event {
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                if let (Some(relist), Some(v)) = (self.relist.as_mut(), convert(&o)) {
                    relist.insert(key(&o), v);
                }
                false
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.objects = relist;
                }
                self.listed = true;
                true
            }
            watcher::Event::Apply(o) => {
                match convert(&o) {
                    Some(v) => self.objects.insert(key(&o), v),
                    None => self.objects.remove(&key(&o)),
                };
                true
            }
            watcher::Event::Delete(o) => self.objects.remove(&key(&o)).is_some(),
        }
    }
}

#[derive(Default)]
struct State {
    pods: Kind<PodInfo>,
    namespaces: Kind<BTreeMap<String, String>>,
    policies: Kind<Policy>,
}

impl State {
    fn listed(&self) -> bool {
        self.pods.listed && self.namespaces.listed && self.policies.listed
    }

    fn cluster(&self) -> Cluster {
        Cluster {
            pods: self.pods.objects.clone(),
            namespaces: self
                .namespaces
                .objects
                .iter()
                .map(|(k, v)| (k.trim_start_matches('/').to_string(), v.clone()))
                .collect(),
            policies: self.policies.objects.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

/// A subscription to the process's informer of every `K`.
fn watch<K>(informers: &SharedInformerFactory) -> WatchEvents<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    informers.informer::<K>().subscribe().into_watch_events().1
}

fn log_error(kind: &str, e: &watcher::Error) {
    tracing::debug!(kind, error = %e, "network policy watch error");
}

/// Enforces NetworkPolicies for this node's pods until the part's writer stops.
pub async fn run(informers: SharedInformerFactory, config: NetworkPolicyConfig, part: Part) {
    let mut pods = watch::<Pod>(&informers);
    let mut namespaces = watch::<Namespace>(&informers);
    let mut policies = watch::<NetworkPolicy>(&informers);
    let mut resync = part.resync_requests();
    let mut state = State::default();
    // What the table holds of this part, once it has been rendered.
    let mut applied: Option<Ruleset> = None;
    loop {
        let started;
        let mut changed = false;
        tokio::select! {
            e = pods.next() => {
                started = Instant::now();
                match e {
                    None => return,
                    Some(Ok(e)) => changed |= state.pods.event(e, PodInfo::from_api),
                    Some(Err(e)) => log_error("Pod", &e),
                }
            }
            e = namespaces.next() => {
                started = Instant::now();
                match e {
                    None => return,
                    Some(Ok(e)) => changed |= state.namespaces.event(e, |n: &Namespace| Some(namespace_labels(n))),
                    Some(Err(e)) => log_error("Namespace", &e),
                }
            }
            e = policies.next() => {
                started = Instant::now();
                match e {
                    None => return,
                    Some(Ok(e)) => changed |= state.policies.event(e, Policy::from_api),
                    Some(Err(e)) => log_error("NetworkPolicy", &e),
                }
            }
            r = resync.changed() => {
                if r.is_err() {
                    return;
                }
                started = Instant::now();
                // Rendered in full below.
                applied = None;
                changed = true;
            }
        }
        // Whatever else has already arrived joins this batch.
        loop {
            let mut more = false;
            while let Some(Some(Ok(e))) = pods.next().now_or_never() {
                changed |= state.pods.event(e, PodInfo::from_api);
                more = true;
            }
            while let Some(Some(Ok(e))) = namespaces.next().now_or_never() {
                changed |= state.namespaces.event(e, |n: &Namespace| Some(namespace_labels(n)));
                more = true;
            }
            while let Some(Some(Ok(e))) = policies.next().now_or_never() {
                changed |= state.policies.event(e, Policy::from_api);
                more = true;
            }
            if !more {
                break;
            }
        }
        if !changed || !state.listed() {
            continue;
        }
        let wanted = render::ruleset(&plan(&state.cluster(), &config.node_name), &config.cluster_dns);
        if applied.as_ref() == Some(&wanted) {
            continue;
        }
        applied = apply(&part, applied, wanted).await;
        tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "network policies programmed");
    }
}

/// Sends the change (or the whole part when nothing is known to be in the
/// table); returns what the table now holds, None when that is unknown.
async fn apply(part: &Part, applied: Option<Ruleset>, wanted: Ruleset) -> Option<Ruleset> {
    if let Some(old) = &applied {
        let update = render::diff(old, &wanted);
        if update.is_empty() {
            return applied;
        }
        match part.update(update).await {
            Ok(()) => return Some(wanted),
            Err(e) => tracing::warn!(error = %e, "network policy update refused; rendering in full"),
        }
    }
    match part.full(render::full(&wanted)).await {
        Ok(()) => Some(wanted),
        Err(e) => {
            tracing::error!(error = %e, "cannot load the network policy rules");
            None
        }
    }
}
