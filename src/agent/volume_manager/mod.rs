//! VolumeManager: what upstream's kubelet volume manager does for the pods
//! bound to this node, on the host's file system, laid out as upstream
//! lays it out (`<pods-dir>/<uid>/volumes/kubernetes.io~<plugin>/<name>/`).
//!
//! `mount_pod` prepares every volume of a pod (emptyDir, hostPath checks,
//! configMap, secret, downwardAPI, projected with service-account tokens,
//! persistentVolumeClaim and ephemeral claims); the pod worker then asks
//! [`PodVolumes::mounts_for`] for each container's CRI mounts. While the
//! pod lives, one task per pod keeps its atomic-writer volumes current:
//! it wakes when a followed ConfigMap or Secret changes, when the pod is
//! updated (labels, annotations), and when a token is due for renewal.
//! `unmount_pod` stops all that and removes the pod's folder.

pub mod allocatable;
pub mod atomic_writer;
mod claim;
mod cleanup;
mod container_mounts;
mod contents;
pub mod downward_api;
mod empty_dir;
pub mod error;
mod host_path;
pub mod layout;
pub mod mounter;
mod ownership;
pub mod projection;
mod setup;
pub mod sources;
mod subpath;
pub mod tokens;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

pub use allocatable::NodeAllocatable;
pub use container_mounts::{expand, expand_sub_path};
pub use error::{SetUpError, SetUpFailure, VolumeError};
pub use layout::Plugin;
pub use mounter::{HostMounter, Mounter};
pub use sources::SourceKey;

use contents::referenced_sources;
use sources::SourceWatches;
use tokens::PodTokens;

use crate::sync::LockExt;

/// How long a newly followed ConfigMap or Secret may take to be listed.
const SYNC_LIMIT: Duration = Duration::from_secs(10);
/// The shortest pause between two refreshes of a pod that failed.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// A task aborted when its handle is dropped.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The message of an API error (its Status message when the server sent one).
pub(crate) fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// One volume ready on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    pub name: String,
    pub plugin: Plugin,
    /// What containers mount: the volume's folder, or the host's path.
    pub path: PathBuf,
    /// Containers must mount it read-only (configMap, secret, downwardAPI,
    /// projected, read-only claims).
    pub read_only: bool,
}

/// The volumes of one pod, ready on the node.
#[derive(Clone)]
pub struct PodVolumes {
    pub uid: String,
    pub pod_dir: PathBuf,
    pub volumes: BTreeMap<String, MountedVolume>,
    /// Where containers' subPaths are bind-mounted through.
    pub mounter: Arc<dyn Mounter>,
}

/// Two answers for a pod are the same when their volumes are (whatever
/// mounter made them).
impl PartialEq for PodVolumes {
    fn eq(&self, other: &Self) -> bool {
        (&self.uid, &self.pod_dir, &self.volumes) == (&other.uid, &other.pod_dir, &other.volumes)
    }
}

impl Eq for PodVolumes {}

impl std::fmt::Debug for PodVolumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodVolumes")
            .field("uid", &self.uid)
            .field("pod_dir", &self.pod_dir)
            .field("volumes", &self.volumes)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct PodState {
    volumes: BTreeMap<String, MountedVolume>,
    complete: bool,
    sources: BTreeSet<SourceKey>,
    tokens: PodTokens,
}

struct PodEntry {
    uid: String,
    /// The newest copy of the pod (downwardAPI reads it).
    pod: Mutex<Pod>,
    notify: Arc<Notify>,
    state: tokio::sync::Mutex<PodState>,
    task: Mutex<Option<AbortOnDrop>>,
}

struct Inner {
    client: kube::Client,
    /// The host's mounts (tmpfs, binds): root's, or a test double.
    mounter: Arc<dyn Mounter>,
    pods_dir: PathBuf,
    node_name: String,
    allocatable: Mutex<NodeAllocatable>,
    sync_limit: Duration,
    token_renew_after: Mutex<Option<Duration>>,
    sources: SourceWatches,
    pods: Mutex<HashMap<String, Arc<PodEntry>>>,
}

/// The node's volume manager; clones share it.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

fn uid_of(pod: &Pod) -> Result<String, VolumeError> {
    let uid = pod.metadata.uid.clone().filter(|u| !u.is_empty()).ok_or(VolumeError::NoUid)?;
    if !layout::valid_uid(&uid) {
        return Err(VolumeError::InvalidUid(uid));
    }
    Ok(uid)
}

impl VolumeManager {
    /// A manager for the pods under `pods_dir`. Node allocatable starts as
    /// the host's capacity; see [`VolumeManager::set_node_allocatable`].
    pub fn new(client: kube::Client, pods_dir: PathBuf, node_name: String) -> Self {
        Self::with_mounter(client, pods_dir, node_name, Arc::new(HostMounter))
    }

    /// A manager whose mounts go through `mounter` (a test double, say).
    pub fn with_mounter(client: kube::Client, pods_dir: PathBuf, node_name: String, mounter: Arc<dyn Mounter>) -> Self {
        let allocatable = NodeAllocatable::detect(&pods_dir);
        VolumeManager {
            inner: Arc::new(Inner {
                sources: SourceWatches::new(client.clone()),
                client,
                mounter,
                pods_dir,
                node_name,
                allocatable: Mutex::new(allocatable),
                sync_limit: SYNC_LIMIT,
                token_renew_after: Mutex::new(None),
                pods: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The node's allocatable: the default size of memory-backed volumes
    /// and what the downward API reports for containers without limits.
    pub fn set_node_allocatable(&self, allocatable: NodeAllocatable) {
        *self.inner.allocatable.locked() = allocatable;
    }

    /// Renews service-account tokens at the latest `after` their issuance
    /// (for tests of renewal; upstream has no such setting). Applies to
    /// pods mounted afterwards.
    #[doc(hidden)]
    pub fn renew_tokens_after(&self, after: Duration) {
        *self.inner.token_renew_after.locked() = Some(after);
    }

    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    pub fn pods_dir(&self) -> &Path {
        &self.inner.pods_dir
    }

    /// Prepares every volume of the pod. Idempotent: once all volumes are
    /// ready, a call for the same uid returns the same PodVolumes at once.
    /// After a failure, volumes already ready stay so and the next call
    /// tries only the others.
    pub async fn mount_pod(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let uid = uid_of(pod)?;
        let entry = self.entry(&uid, pod);
        self.inner.note_pod(&entry, pod);
        let mut state = entry.state.lock().await;
        if state.complete {
            return Ok(self.inner.pod_volumes(&uid, &state));
        }
        let pod = entry.pod.locked().clone();
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        for volume in &volumes {
            for key in referenced_sources(&namespace, volume) {
                if state.sources.insert(key.clone()) {
                    self.inner.sources.subscribe(&key, &uid, entry.notify.clone());
                }
            }
        }
        let pod_dir = layout::pod_dir(&self.inner.pods_dir, &uid);
        make_pod_dirs(&pod_dir)?;

        let mut failures = Vec::new();
        for volume in &volumes {
            if state.volumes.contains_key(&volume.name) {
                continue;
            }
            let set_up = self.inner.set_up_volume(&pod, &uid, volume, &mut state.tokens).await;
            match set_up {
                Ok(mounted) => {
                    tracing::debug!(pod = %uid, volume = %volume.name, path = %mounted.path.display(), "volume ready");
                    state.volumes.insert(volume.name.clone(), mounted);
                }
                Err(error) => failures.push(SetUpFailure { volume: volume.name.clone(), error }),
            }
        }
        // The refresh task learns from its first pass when tokens are due.
        entry.notify.notify_one();
        if !failures.is_empty() {
            return Err(VolumeError::SetUp(failures));
        }
        state.complete = true;
        Ok(self.inner.pod_volumes(&uid, &state))
    }

    /// The pod changed (labels, annotations, resources): its downwardAPI
    /// files follow. Pods not mounted here are ignored.
    pub async fn pod_updated(&self, pod: &Pod) {
        let Ok(uid) = uid_of(pod) else { return };
        let entry = self.inner.pods.locked().get(&uid).cloned();
        if let Some(entry) = entry {
            self.inner.note_pod(&entry, pod);
        }
    }

    /// Stops following the pod's sources, unmounts its tmpfs and bind
    /// mounts, and removes `<pods-dir>/<uid>` entirely.
    pub async fn unmount_pod(&self, uid: &str) -> Result<(), VolumeError> {
        if !layout::valid_uid(uid) {
            return Err(VolumeError::InvalidUid(uid.to_string()));
        }
        let entry = self.inner.pods.locked().remove(uid);
        if let Some(entry) = entry {
            // Stop the refresh task first: it must not write while we remove.
            drop(entry.task.locked().take());
            let state = entry.state.lock().await;
            for key in &state.sources {
                self.inner.sources.unsubscribe(key, uid);
            }
        }
        let dir = layout::pod_dir(&self.inner.pods_dir, uid);
        let mounter = self.inner.mounter.clone();
        tokio::task::spawn_blocking(move || cleanup::remove_pod_dir(mounter.as_ref(), &dir))
            .await
            .map_err(|e| VolumeError::Task(e.to_string()))??;
        tracing::debug!(pod = %uid, "volumes removed");
        Ok(())
    }

    /// Uids of the pods with a folder on disk.
    pub fn pods_on_disk(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.inner.pods_dir) else { return Vec::new() };
        let mut uids: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|u| layout::valid_uid(u))
            .collect();
        uids.sort();
        uids
    }

    /// Bytes used by each emptyDir of the pod (by volume name), for
    /// eviction's sizeLimit checks. A tmpfs is measured with statfs; a
    /// folder on disk by walking it (blocking: call it off async workers).
    pub fn usage(&self, uid: &str) -> Result<BTreeMap<String, u64>, VolumeError> {
        if !layout::valid_uid(uid) {
            return Err(VolumeError::InvalidUid(uid.to_string()));
        }
        let dir = layout::volumes_dir(&self.inner.pods_dir, uid).join(Plugin::EmptyDir.dir_name());
        let mut out = BTreeMap::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(VolumeError::io(&dir)(e)),
        };
        let mount_points: BTreeSet<PathBuf> =
            self.inner.mounter.mount_points().map_err(VolumeError::io("/proc/self/mountinfo"))?.into_iter().collect();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            let path = entry.path();
            let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            let used = empty_dir::usage(&path, mount_points.contains(&canonical)).map_err(VolumeError::io(&path))?;
            out.insert(name, used);
        }
        Ok(out)
    }

    /// The ConfigMaps and Secrets followed now (for diagnostics and tests).
    pub fn followed_sources(&self) -> Vec<SourceKey> {
        self.inner.sources.followed()
    }

    fn entry(&self, uid: &str, pod: &Pod) -> Arc<PodEntry> {
        let mut pods = self.inner.pods.locked();
        if let Some(e) = pods.get(uid) {
            return e.clone();
        }
        let entry = Arc::new(PodEntry {
            uid: uid.to_string(),
            pod: Mutex::new(pod.clone()),
            notify: Arc::new(Notify::new()),
            state: tokio::sync::Mutex::new(PodState {
                tokens: PodTokens::with_renew_after(*self.inner.token_renew_after.locked()),
                ..PodState::default()
            }),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(refresh_loop(Arc::downgrade(&self.inner), Arc::downgrade(&entry)));
        *entry.task.locked() = Some(AbortOnDrop(task));
        pods.insert(uid.to_string(), entry.clone());
        entry
    }
}

/// `<pod>/volumes` and `<pod>/plugins` with mode 0750, as the kubelet makes them.
fn make_pod_dirs(pod_dir: &Path) -> Result<(), VolumeError> {
    use std::os::unix::fs::DirBuilderExt;
    for dir in [pod_dir.to_path_buf(), pod_dir.join("volumes"), pod_dir.join("plugins")] {
        std::fs::DirBuilder::new().recursive(true).mode(0o750).create(&dir).map_err(VolumeError::io(&dir))?;
    }
    Ok(())
}

impl Inner {
    fn allocatable_now(&self) -> NodeAllocatable {
        *self.allocatable.locked()
    }

    fn pod_volumes(&self, uid: &str, state: &PodState) -> PodVolumes {
        PodVolumes {
            uid: uid.to_string(),
            pod_dir: layout::pod_dir(&self.pods_dir, uid),
            volumes: state.volumes.clone(),
            mounter: self.mounter.clone(),
        }
    }

    /// Keeps the newest copy of the pod; a change of what the downward API
    /// shows wakes the pod's refresh.
    fn note_pod(&self, entry: &PodEntry, pod: &Pod) {
        let mut current = entry.pod.locked();
        if is_older(pod, &current) {
            return;
        }
        let shown_changed = current.metadata.labels != pod.metadata.labels
            || current.metadata.annotations != pod.metadata.annotations
            || current.spec.as_ref().map(|s| &s.containers) != pod.spec.as_ref().map(|s| &s.containers)
            || current.status.as_ref().map(|s| (&s.pod_ip, &s.host_ip))
                != pod.status.as_ref().map(|s| (&s.pod_ip, &s.host_ip));
        *current = pod.clone();
        if shown_changed {
            entry.notify.notify_one();
        }
    }

    /// Rewrites the pod's atomic-writer volumes whose content changed
    /// (sources, pod fields, tokens due). Returns when to come back for the
    /// next token renewal, and whether everything went well.
    async fn refresh(&self, entry: &PodEntry) -> (Option<SystemTime>, bool) {
        let pod = entry.pod.locked().clone();
        let mut state = entry.state.lock().await;
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        let mut used = Vec::new();
        let mut ok = true;
        let PodState { volumes: ready, tokens, .. } = &mut *state;
        for volume in &volumes {
            let Some(mounted) = ready.get(&volume.name).filter(|m| m.plugin.uses_atomic_writer()) else { continue };
            match self.write_contents(&pod, volume, &mounted.path, tokens, &mut used).await {
                Ok(true) => tracing::debug!(pod = %entry.uid, volume = %volume.name, "volume content updated"),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    tracing::warn!(pod = %entry.uid, volume = %volume.name, error = %e, "cannot update volume; keeping its content");
                }
            }
        }
        if ok {
            tokens.retain(&used);
        }
        (tokens.next_refresh(), ok)
    }
}

/// Whether `pod` is an older copy than `current` (resourceVersions are
/// opaque; ferrok's, like etcd's, are revisions, compared when both are).
fn is_older(pod: &Pod, current: &Pod) -> bool {
    let rv = |p: &Pod| p.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
    matches!((rv(pod), rv(current)), (Some(new), Some(cur)) if new < cur)
}

/// One per pod: waits for a change or a token renewal, then refreshes.
async fn refresh_loop(inner: Weak<Inner>, entry: Weak<PodEntry>) {
    let mut next: Option<SystemTime> = None;
    let mut failed = false;
    loop {
        let Some(notify) = entry.upgrade().map(|e| e.notify.clone()) else { return };
        let wait = next.map(|at| {
            let until = at.duration_since(SystemTime::now()).unwrap_or_default();
            if failed {
                until.max(RETRY_AFTER_FAILURE)
            } else {
                until
            }
        });
        match wait {
            Some(d) => {
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = tokio::time::sleep(d) => {}
                }
            }
            None => notify.notified().await,
        }
        let (Some(inner), Some(entry)) = (inner.upgrade(), entry.upgrade()) else { return };
        let (due, ok) = inner.refresh(&entry).await;
        next = due;
        failed = !ok;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(rv: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.resource_version = rv.map(str::to_string);
        p
    }

    #[test]
    fn older_copies_of_a_pod_are_ignored() {
        assert!(is_older(&pod(Some("9")), &pod(Some("10"))));
        assert!(!is_older(&pod(Some("10")), &pod(Some("10"))));
        assert!(!is_older(&pod(Some("11")), &pod(Some("10"))));
        assert!(!is_older(&pod(None), &pod(Some("10"))));
        assert!(!is_older(&pod(Some("x")), &pod(Some("10"))));
    }
}
