//! The service proxy (upstream's kube-proxy, inside the node): Services and
//! EndpointSlices come from the process's shared informers, and every
//! change reprograms only the Services it touched, through a [`Dataplane`]
//! (nftables by default). Events that arrive together are applied
//! together.

mod conntrack_cleanup;
pub mod dataplane;
pub mod model;
pub mod nftables;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::ResourceExt;

pub use dataplane::{Change, Dataplane, DataplaneError};
use model::ServicePort;

use crate::client::informer_factory::SharedInformerFactory;

/// How long to wait before programming everything again after a failure.
const RETRY: Duration = Duration::from_secs(1);

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Services and EndpointSlices the proxy knows (the shared informers'
/// objects, not copies).
#[derive(Default)]
struct Cache {
    services: HashMap<String, Arc<Service>>,
    slices: HashMap<String, Arc<EndpointSlice>>,
    /// Service key → its slices' keys.
    slices_of: HashMap<String, BTreeSet<String>>,
    /// Objects of a relist in progress, swapped in when it is done.
    services_relist: Option<HashMap<String, Arc<Service>>>,
    slices_relist: Option<HashMap<String, Arc<EndpointSlice>>>,
    services_synced: bool,
    slices_synced: bool,
    /// Services whose programming may have changed.
    dirty: BTreeSet<String>,
}

fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

fn slice_service(slice: &EndpointSlice) -> Option<String> {
    let svc = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(key(slice.metadata.namespace.as_deref(), svc))
}

impl Cache {
    fn service_event(&mut self, event: watcher::Event<Arc<Service>>) {
        match event {
            watcher::Event::Apply(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.dirty.insert(k.clone());
                self.services.insert(k, s);
            }
            watcher::Event::Delete(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.services.remove(&k);
                self.dirty.insert(k);
            }
            watcher::Event::Init => self.services_relist = Some(HashMap::new()),
            watcher::Event::InitApply(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.services_relist.get_or_insert_default().insert(k, s);
            }
            watcher::Event::InitDone => {
                let fresh = self.services_relist.take().unwrap_or_default();
                self.dirty.extend(self.services.keys().cloned());
                self.dirty.extend(fresh.keys().cloned());
                self.services = fresh;
                self.services_synced = true;
            }
        }
    }

    fn add_slice(&mut self, k: String, slice: Arc<EndpointSlice>) {
        self.remove_slice(&k);
        if let Some(svc) = slice_service(&slice) {
            self.slices_of.entry(svc.clone()).or_default().insert(k.clone());
            self.dirty.insert(svc);
        }
        self.slices.insert(k, slice);
    }

    fn remove_slice(&mut self, k: &str) {
        let Some(old) = self.slices.remove(k) else { return };
        if let Some(svc) = slice_service(&old) {
            if let Some(set) = self.slices_of.get_mut(&svc) {
                set.remove(k);
                if set.is_empty() {
                    self.slices_of.remove(&svc);
                }
            }
            self.dirty.insert(svc);
        }
    }

    fn slice_event(&mut self, event: watcher::Event<Arc<EndpointSlice>>) {
        match event {
            watcher::Event::Apply(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.add_slice(k, s);
            }
            watcher::Event::Delete(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.remove_slice(&k);
            }
            watcher::Event::Init => self.slices_relist = Some(HashMap::new()),
            watcher::Event::InitApply(s) => {
                let k = key(s.metadata.namespace.as_deref(), &s.name_any());
                self.slices_relist.get_or_insert_default().insert(k, s);
            }
            watcher::Event::InitDone => {
                let fresh = self.slices_relist.take().unwrap_or_default();
                let old: Vec<String> = self.slices.keys().cloned().collect();
                for k in old.iter().filter(|k| !fresh.contains_key(*k)) {
                    self.remove_slice(k);
                }
                for (k, s) in fresh {
                    self.add_slice(k, s);
                }
                self.slices_synced = true;
            }
        }
    }

    fn ports(&self, service: &str, node_name: &str) -> Vec<ServicePort> {
        let Some(svc) = self.services.get(service) else { return Vec::new() };
        let slices = self.slices_of.get(service).into_iter().flatten().filter_map(|k| self.slices.get(k).map(|s| &**s));
        model::service_ports(svc, slices, node_name)
    }

    fn all_ports(&self, node_name: &str) -> BTreeMap<String, Vec<ServicePort>> {
        self.services
            .keys()
            .map(|k| (k.clone(), self.ports(k, node_name)))
            .filter(|(_, ports)| !ports.is_empty())
            .collect()
    }
}

/// Deletes the conntrack entries a change left behind (after the rules
/// changed, so a client's next datagram is sent by the new ones).
async fn forget(stale: Vec<conntrack_cleanup::Stale>) {
    if stale.is_empty() {
        return;
    }
    match conntrack_cleanup::delete(stale).await {
        Ok(n) => tracing::debug!(deleted = n, "stale UDP conntrack entries deleted"),
        Err(e) => tracing::warn!(error = %e, "cannot delete stale UDP conntrack entries"),
    }
}

/// Runs the proxy for `node_name` until the informers' streams end.
pub async fn run(informers: SharedInformerFactory, node_name: String, mut dataplane: impl Dataplane) {
    let (_, mut service_events) = informers.informer::<Service>().subscribe().into_watch_events();
    let (_, mut slice_events) = informers.informer::<EndpointSlice>().subscribe().into_watch_events();
    let mut resync = dataplane.resync_requests();
    let mut cache = Cache::default();
    // What the dataplane holds, to tell what a change leaves behind.
    let mut programmed: BTreeMap<String, Vec<ServicePort>> = BTreeMap::new();
    // Programmed in full at start, and after a resync request or a failure.
    let mut need_full = true;
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let deadline = retry_at;
        let retry = async move {
            match deadline {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            e = service_events.next() => match e {
                Some(Ok(e)) => cache.service_event(e),
                Some(Err(e)) => tracing::debug!(error = %e, "service watch error"),
                None => return,
            },
            e = slice_events.next() => match e {
                Some(Ok(e)) => cache.slice_event(e),
                Some(Err(e)) => tracing::debug!(error = %e, "endpointslice watch error"),
                None => return,
            },
            changed = resync.changed() => {
                if changed.is_err() {
                    return;
                }
                need_full = true;
            }
            _ = retry => retry_at = None,
        }
        // Whatever else has already arrived is applied in the same sync.
        while let Some(Some(Ok(e))) = service_events.next().now_or_never() {
            cache.service_event(e);
        }
        while let Some(Some(Ok(e))) = slice_events.next().now_or_never() {
            cache.slice_event(e);
        }
        if !(cache.services_synced && cache.slices_synced) || retry_at.is_some() {
            continue;
        }
        let started = Instant::now();
        if need_full {
            cache.dirty.clear();
            let all = cache.all_ports(&node_name);
            match dataplane.full(&all).await {
                Ok(()) => {
                    need_full = false;
                    tracing::info!(
                        services = all.len(),
                        ms = started.elapsed().as_millis() as u64,
                        "services programmed"
                    );
                    let mut stale = Vec::new();
                    for key in programmed.keys().chain(all.keys()) {
                        let old = programmed.get(key).map(Vec::as_slice).unwrap_or_default();
                        let new = all.get(key).map(Vec::as_slice).unwrap_or_default();
                        stale.extend(conntrack_cleanup::stale_udp(old, new));
                    }
                    programmed = all;
                    forget(stale).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot program the services; retrying");
                    retry_at = Some(tokio::time::Instant::now() + RETRY);
                }
            }
        } else if !cache.dirty.is_empty() {
            let dirty = std::mem::take(&mut cache.dirty);
            let changes: Vec<Change> = dirty
                .into_iter()
                .map(|key| {
                    let new = cache.ports(&key, &node_name);
                    let old = programmed.get(&key).cloned().unwrap_or_default();
                    Change { key, old, new }
                })
                .filter(|c| c.old != c.new)
                .collect();
            let count = changes.len();
            match dataplane.update(&changes).await {
                Ok(()) => {
                    tracing::debug!(
                        services = count,
                        us = started.elapsed().as_micros() as u64,
                        "services reprogrammed"
                    );
                    let mut stale = Vec::new();
                    for Change { key, old, new } in changes {
                        stale.extend(conntrack_cleanup::stale_udp(&old, &new));
                        if new.is_empty() {
                            programmed.remove(&key);
                        } else {
                            programmed.insert(key, new);
                        }
                    }
                    forget(stale).await;
                }
                Err(e) => {
                    // What the table holds is no longer known: start over.
                    tracing::warn!(error = %e, "a service update was refused; programming everything again");
                    need_full = true;
                    retry_at = Some(tokio::time::Instant::now() + RETRY / 10);
                }
            }
        }
    }
}
