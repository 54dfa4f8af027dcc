//! Static pods (upstream's kubelet/config/file.go and mirror_client.go):
//! pod manifests in `<agent-dir>/pod-manifests/` run on this node without
//! the API server deciding anything; the kubelet gives each a uid from its
//! content, and keeps a mirror pod in the API so that kubectl shows it and
//! its status. A manifest that changes is a new pod (new uid); a deleted
//! mirror pod comes back; a removed manifest stops its pod.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use sha2::{Digest, Sha256};

use super::pod_util;
use super::pod_workers::PodWorkers;
use crate::sync::LockExt;
use crate::well_known::annotations::CONFIG_MIRROR;

pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";

/// How often the folder is read again besides its inotify events
/// (upstream's file check frequency; catches edits inotify cannot see,
/// such as a bind-mounted file changed elsewhere).
const CHECK_EVERY: Duration = Duration::from_secs(20);

/// Is this API pod the mirror of a static pod?
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

/// Is this pod a static pod (from a manifest file)?
pub fn is_static(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE)).is_some_and(|s| s != "api")
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Reads one manifest into a static pod for `node`, with upstream's defaults.
pub fn read_manifest(path: &Path, node: &str) -> Result<Pod, ManifestError> {
    let bad = |message: String| ManifestError::Invalid { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_yaml_ng::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if value.get("kind").and_then(|k| k.as_str()) != Some("Pod") {
        return Err(bad("a static pod manifest must be one object of kind Pod".into()));
    }
    let mut pod: Pod = crate::decode::from_value(&value).map_err(|e| bad(e.to_string()))?;
    let name =
        pod.metadata.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| bad("metadata.name is required".into()))?;
    if pod.spec.as_ref().is_none_or(|s| s.containers.is_empty()) {
        return Err(bad("spec.containers must not be empty".into()));
    }
    // The uid comes from the content, the node and the source, as upstream's.
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(&pod).unwrap_or_default());
    h.update(format!("host:{node}file:{}", path.display()).as_bytes());
    let digest = h.finalize();
    let uid: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    pod.metadata.uid = Some(uid.clone());
    pod.metadata.name = Some(format!("{name}-{node}"));
    pod.metadata.namespace =
        Some(pod.metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()));
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.into(), uid);
    annotations.insert(CONFIG_SOURCE.into(), "file".into());
    annotations.insert(CONFIG_SEEN.into(), k8s_openapi::jiff::Timestamp::now().to_string());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node.to_string());
    // Static pods tolerate every NoExecute taint, as upstream's.
    spec.tolerations.get_or_insert_with(Vec::new).push(Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    });
    Ok(pod)
}

/// Manifests in the folder (`*.yaml`, `*.yml`, `*.json`), hidden files skipped.
fn manifests(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
        })
        .collect();
    out.sort();
    out
}

/// The static pods of the folder now (bad manifests are skipped).
pub fn read_all(dir: &Path, node: &str) -> Vec<Pod> {
    manifests(dir).iter().filter_map(|p| read_manifest(p, node).ok()).collect()
}

/// The mirror pods the API holds, by the static pod's uid (config hash).
#[derive(Default)]
pub struct Mirrors {
    pods: Mutex<HashMap<String, Arc<Pod>>>,
}

impl Mirrors {
    pub fn get(&self, static_uid: &str) -> Option<Arc<Pod>> {
        self.pods.locked().get(static_uid).cloned()
    }

    /// Records a mirror pod seen in the API; returns the static uid it mirrors.
    pub fn seen(&self, pod: Arc<Pod>) -> Option<String> {
        let hash = pod.metadata.annotations.as_ref()?.get(CONFIG_MIRROR)?.clone();
        self.pods.locked().insert(hash.clone(), pod);
        Some(hash)
    }

    pub fn gone(&self, pod: &Pod) -> Option<String> {
        let hash = pod.metadata.annotations.as_ref()?.get(CONFIG_MIRROR)?.clone();
        let mut pods = self.pods.locked();
        if pods.get(&hash).is_some_and(|p| p.metadata.uid == pod.metadata.uid) {
            pods.remove(&hash);
        }
        Some(hash)
    }
}

/// The mirror pod for a static pod: the same spec, annotated, owned by the Node.
fn mirror_of(pod: &Pod, node_uid: &str) -> Pod {
    let mut m = pod.clone();
    m.metadata.uid = None;
    m.metadata.resource_version = None;
    m.status = None;
    let hash = pod_util::uid(pod).to_string();
    m.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(CONFIG_MIRROR.into(), hash);
    if !node_uid.is_empty() {
        m.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: pod_util::spec(pod).node_name.clone().unwrap_or_default(),
            uid: node_uid.to_string(),
            // NodeRestriction admits only a controller reference to the Node.
            controller: Some(true),
            ..Default::default()
        }]);
    }
    m
}

/// Makes sure the API has a current mirror pod for `pod`: creates it, or
/// replaces one that mirrors another version or is being deleted.
pub async fn ensure_mirror(client: &kube::Client, mirrors: &Mirrors, pod: &Pod, node_uid: &str) {
    let ns = pod_util::namespace(pod);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let hash = pod_util::uid(pod);
    if let Some(m) = mirrors.get(hash) {
        if m.metadata.deletion_timestamp.is_none() {
            return;
        }
    }
    // Whatever holds the name and is not the current mirror goes first.
    match api.get_opt(pod_util::name(pod)).await {
        Ok(Some(existing)) => {
            let current = existing.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_MIRROR)).map(String::as_str)
                == Some(hash);
            if current && existing.metadata.deletion_timestamp.is_none() {
                mirrors.seen(Arc::new(existing));
                return;
            }
            if !is_mirror(&existing) {
                tracing::warn!(pod = %pod_util::full_name(pod), "a pod that is not a mirror holds the static pod's name");
                return;
            }
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: existing.metadata.uid.clone(), resource_version: None }),
                ..Default::default()
            };
            if let Err(e) = api.delete(pod_util::name(pod), &dp).await {
                tracing::debug!(error = %e, "cannot delete an outdated mirror pod");
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the mirror pod");
            return;
        }
    }
    match api.create(&PostParams::default(), &mirror_of(pod, node_uid)).await {
        Ok(created) => {
            mirrors.seen(Arc::new(created));
        }
        Err(e) => tracing::warn!(pod = %pod_util::full_name(pod), error = %e, "cannot create the mirror pod"),
    }
}

/// Deletes the mirror pod of a static pod that is gone.
pub async fn delete_mirror(client: &kube::Client, mirrors: &Mirrors, pod: &Pod) {
    let Some(m) = mirrors.get(pod_util::uid(pod)) else { return };
    let api: Api<Pod> = Api::namespaced(client.clone(), pod_util::namespace(&m));
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: m.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    let _ = api.delete(pod_util::name(&m), &dp).await;
}

/// Reads the manifest folder now and every check period, handing static
/// pods to the workers and keeping their mirror pods in the API.
pub async fn run(
    client: kube::Client,
    dir: PathBuf,
    node: String,
    node_uid: String,
    workers: Arc<PodWorkers>,
    mirrors: Arc<Mirrors>,
    recheck: Arc<tokio::sync::Notify>,
) {
    let mut watch = match super::images::watch::DirWatch::any_change(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the static pod folder; reading it every 20 s");
            None
        }
    };
    let mut current: HashMap<PathBuf, Arc<Pod>> = HashMap::new();
    let mut reported: HashMap<PathBuf, String> = HashMap::new();
    loop {
        let mut seen = HashMap::new();
        for path in manifests(&dir) {
            match read_manifest(&path, &node) {
                Ok(pod) => {
                    reported.remove(&path);
                    let pod = match current.get(&path) {
                        // Unchanged content keeps its first-seen copy (and time).
                        Some(old) if old.metadata.uid == pod.metadata.uid => old.clone(),
                        _ => Arc::new(pod),
                    };
                    seen.insert(path, pod);
                }
                Err(e) => {
                    let text = e.to_string();
                    if reported.get(&path) != Some(&text) {
                        tracing::warn!(error = %text, "static pod manifest skipped");
                        reported.insert(path, text);
                    }
                }
            }
        }
        for (path, old) in &current {
            if seen.get(path).is_none_or(|p| p.metadata.uid != old.metadata.uid) {
                delete_mirror(&client, &mirrors, old).await;
                workers.remove(old.clone());
            }
        }
        for pod in seen.values() {
            workers.update(pod.clone());
            ensure_mirror(&client, &mirrors, pod, &node_uid).await;
        }
        current = seen;
        let changed = async {
            match watch.as_mut() {
                Some(w) => {
                    if w.next().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = recheck.notified() => {}
            _ = changed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_become_static_pods_with_stable_uids() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("web.yaml");
        std::fs::write(&p, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n").unwrap();
        let a = read_manifest(&p, "n1").unwrap();
        let b = read_manifest(&p, "n1").unwrap();
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_eq!(a.metadata.name.as_deref(), Some("web-n1"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(pod_util::spec(&a).node_name.as_deref(), Some("n1"));
        assert!(is_static(&a) && !is_mirror(&a));
        let m = mirror_of(&a, "node-uid");
        assert!(is_mirror(&m));
        assert_eq!(m.metadata.annotations.as_ref().unwrap()[CONFIG_MIRROR], a.metadata.uid.clone().unwrap());
        std::fs::write(&p, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:2\n").unwrap();
        assert_ne!(read_manifest(&p, "n1").unwrap().metadata.uid, a.metadata.uid);
    }

    #[test]
    fn bad_manifests_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.yaml");
        std::fs::write(&p, "kind: Deployment\n").unwrap();
        assert!(read_manifest(&p, "n").unwrap_err().to_string().contains("kind Pod"));
        std::fs::write(&p, "kind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n").unwrap();
        assert!(read_manifest(&p, "n").unwrap_err().to_string().contains("containers"));
    }
}
