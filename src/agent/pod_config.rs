//! Where the node's pods come from (upstream's kubelet/config): the API's
//! pods bound to this node, watched with a field selector, handed to the
//! pod workers. Changes that only the kubelet itself made (status) refresh
//! the worker's copy without waking it. After the first full list, pods the
//! runtime or disk still has but the API no longer knows (deleted while
//! ferrok was down) are cleaned up.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};

use super::kubelet::Kubelet;
use super::pod_util;
use super::pod_workers::PodWorkers;
use super::static_pods::{is_mirror, Mirrors};
use crate::client::forget_managed_fields;

/// What in a pod needs its worker's attention when it changes.
fn fingerprint(pod: &Pod) -> String {
    let m = &pod.metadata;
    serde_json::to_string(&(
        &pod.spec,
        &m.deletion_timestamp,
        &m.deletion_grace_period_seconds,
        &m.labels,
        &m.annotations,
    ))
    .unwrap_or_default()
}

/// Where mirror pods go: the record of them, and the static pod source to
/// poke when one changes.
pub struct MirrorHooks {
    pub mirrors: Arc<Mirrors>,
    pub recheck: Arc<tokio::sync::Notify>,
}

pub async fn run(
    client: kube::Client,
    node_name: String,
    kubelet: Arc<Kubelet>,
    workers: Arc<PodWorkers>,
    mirror: MirrorHooks,
) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut listing: HashSet<String> = HashSet::new();
    let mut first_list = true;
    let mut stream = crate::client::typed_watcher::watch(api, cfg);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(mut pod)) | Ok(Event::Apply(mut pod)) => {
                forget_managed_fields(&mut pod);
                if is_mirror(&pod) {
                    // The static pod runs from its manifest; the mirror only shows it.
                    let deleting = pod.metadata.deletion_timestamp.is_some();
                    if let Some(static_uid) = mirror.mirrors.seen(Arc::new(pod)) {
                        workers.wake(&static_uid);
                    }
                    if deleting {
                        mirror.recheck.notify_one();
                    }
                    continue;
                }
                let uid = pod_util::uid(&pod).to_string();
                listing.insert(uid.clone());
                let print = fingerprint(&pod);
                let changed = seen.get(&uid) != Some(&print);
                seen.insert(uid, print);
                let pod = Arc::new(pod);
                if changed {
                    workers.update(pod);
                } else {
                    workers.refresh(pod);
                }
            }
            Ok(Event::Delete(pod)) if is_mirror(&pod) => {
                mirror.mirrors.gone(&pod);
                mirror.recheck.notify_one();
            }
            Ok(Event::Delete(pod)) => {
                let uid = pod_util::uid(&pod).to_string();
                seen.remove(&uid);
                workers.remove(Arc::new(pod));
            }
            Ok(Event::InitDone) => {
                // Pods deleted while the watch was down.
                let gone: Vec<String> = seen.keys().filter(|u| !listing.contains(*u)).cloned().collect();
                for uid in gone {
                    seen.remove(&uid);
                    let mut pod = Pod::default();
                    pod.metadata.uid = Some(uid);
                    workers.remove(Arc::new(pod));
                }
                if first_list {
                    first_list = false;
                    cleanup_orphans(&kubelet, &workers, &listing).await;
                    workers.set_sources_ready();
                }
            }
            Err(e) => tracing::debug!(error = %e, "pod watch error"),
        }
    }
}

/// Removes what is left of pods the API does not know.
async fn cleanup_orphans(kubelet: &Kubelet, workers: &PodWorkers, listed: &HashSet<String>) {
    let known = match kubelet.known_uids().await {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the runtime's pods for cleanup");
            return;
        }
    };
    let active: HashSet<String> = workers.uids().into_iter().collect();
    for uid in known.difference(listed) {
        if active.contains(uid) {
            continue;
        }
        tracing::info!(pod_uid = %uid, "removing a pod deleted while ferrok was down");
        if let Err(e) = kubelet.cleanup_orphan(uid).await {
            tracing::warn!(pod_uid = %uid, error = %e, "cannot remove an orphaned pod");
        }
    }
}
