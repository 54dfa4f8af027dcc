//! The node's part of the local-path provisioner (what k3s' helper pod
//! does): a volume it provisioned on this node that is Released with the
//! Delete reclaim policy has its directory removed here, then the volume
//! is deleted. Only directories `pvc-*` right under the storage path are
//! ever removed. (The directory itself is made by the volume manager, the
//! hostPath being DirectoryOrCreate.)
//!
//! It runs with the node's own credentials, which read and delete only the
//! local-path volumes pinned to this node (the Node authorizer) and delete
//! them only once released (NodeRestriction). So it does not list every
//! volume: each `pvc-<uid>_…` directory under the storage path is followed
//! by a watch of its one volume, `pvc-<uid>`; the folder is looked at again
//! whenever a pod of the node changes (the volume manager makes a
//! directory just before its pod's containers start), as the process's
//! shared pod informer tells (which the node's network policy keeps for
//! every pod of the cluster anyway).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::task::JoinHandle;

use crate::client::informer_factory::SharedInformerFactory;
use crate::well_known::annotations::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};

/// Runs until aborted; `client` is the node's.
pub async fn run(client: kube::Client, informers: SharedInformerFactory, node_name: String, storage: PathBuf) {
    let on_node = node_name.clone();
    let (_, mut pod_changes) = informers
        .informer::<Pod>()
        .subscribe()
        .only(move |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(on_node.as_str()))
        .into_shared_parts();
    let mut followed: HashMap<String, JoinHandle<()>> = HashMap::new();
    loop {
        let present = volumes_in(&storage).await;
        followed.retain(|name, task| {
            let keep = present.contains(name);
            if !keep {
                task.abort();
            }
            keep
        });
        for name in present {
            if let std::collections::hash_map::Entry::Vacant(slot) = followed.entry(name) {
                let name = slot.key().clone();
                slot.insert(tokio::spawn(follow(client.clone(), name, node_name.clone(), storage.clone())));
            }
        }
        if pod_changes.next().await.is_none() {
            break;
        }
    }
    for task in followed.into_values() {
        task.abort();
    }
}

/// The volume names (`pvc-<uid>`) of the directories `pvc-<uid>_<ns>_<claim>` under `storage`.
async fn volumes_in(storage: &Path) -> Vec<String> {
    let storage = storage.to_path_buf();
    let scan = tokio::task::spawn_blocking(move || {
        let Ok(entries) = std::fs::read_dir(&storage) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.starts_with("pvc-").then(|| n.split('_').next().map(str::to_string)).flatten())
            .collect();
        names.sort();
        names.dedup();
        names
    });
    scan.await.unwrap_or_default()
}

/// Watches the volume `name` until it is released here and removed.
async fn follow(client: kube::Client, name: String, node_name: String, storage: PathBuf) {
    let api: Api<PersistentVolume> = Api::all(client);
    let one = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut changes = watcher(api.clone(), one).default_backoff().applied_objects().boxed();
    while let Some(change) = changes.next().await {
        let pv = match change {
            Ok(pv) => pv,
            Err(e) => {
                tracing::debug!(volume = %name, error = %e, "watching a local-path volume");
                continue;
            }
        };
        let Some(dir) = released_here(&pv, &node_name, &storage) else { continue };
        if remove(&api, &pv, dir).await {
            return;
        }
    }
}

/// Removes a released volume's directory, then the volume; whether both went.
async fn remove(api: &Api<PersistentVolume>, pv: &PersistentVolume, dir: PathBuf) -> bool {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let target = dir.clone();
    let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&target) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    })
    .await;
    match removed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(volume = %name, dir = %dir.display(), error = %e, "cannot remove a released volume's directory");
            return false;
        }
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "removing a released volume's directory");
            return false;
        }
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: pv.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {
            tracing::info!(volume = %name, dir = %dir.display(), "released volume and its directory deleted");
            true
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "cannot delete a released volume");
            false
        }
    }
}

/// The directory to remove, if `pv` is a released local-path volume of
/// this node with the Delete policy, right under `storage`.
fn released_here(pv: &PersistentVolume, node: &str, storage: &Path) -> Option<PathBuf> {
    if pv.metadata.deletion_timestamp.is_some()
        || pv.metadata.annotations.as_ref().and_then(|a| a.get(PROVISIONED_BY)).map(String::as_str)
            != Some(LOCAL_PATH_PROVISIONER)
        || pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released")
    {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
        return None;
    }
    let terms = &spec.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let pinned = terms.iter().flat_map(|t| t.match_expressions.iter().flatten()).any(|e| {
        e.key == "kubernetes.io/hostname" && e.operator == "In" && e.values.as_deref() == Some(&[node.to_string()])
    });
    let path = PathBuf::from(&spec.host_path.as_ref()?.path);
    let ours = path.parent() == Some(storage)
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("pvc-") && !n.contains(".."));
    (pinned && ours).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(path: &str, node: &str, phase: &str, policy: &str) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-u", "annotations": {PROVISIONED_BY: LOCAL_PATH_PROVISIONER}},
            "spec": {"persistentVolumeReclaimPolicy": policy, "hostPath": {"path": path},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn only_our_released_directories() {
        let s = Path::new("/d/storage");
        let ok = pv("/d/storage/pvc-u_ns_c", "n1", "Released", "Delete");
        assert_eq!(released_here(&ok, "n1", s), Some(PathBuf::from("/d/storage/pvc-u_ns_c")));
        assert_eq!(released_here(&ok, "n2", s), None);
        assert_eq!(released_here(&pv("/d/storage/pvc-u_ns_c", "n1", "Bound", "Delete"), "n1", s), None);
        assert_eq!(released_here(&pv("/d/storage/pvc-u_ns_c", "n1", "Released", "Retain"), "n1", s), None);
        assert_eq!(released_here(&pv("/etc/pvc-x", "n1", "Released", "Delete"), "n1", s), None);
        assert_eq!(released_here(&pv("/d/storage/data", "n1", "Released", "Delete"), "n1", s), None);
    }
}
