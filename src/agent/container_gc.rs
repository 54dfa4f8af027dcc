//! Container and sandbox garbage collection (upstream's kuberuntime_gc),
//! every minute: dead containers beyond the newest two instances of each
//! (pod, container) — what a pod's own sync prunes, done here for pods that
//! are not syncing — with their log files; dead sandboxes that are not
//! their pod's newest and hold no containers; and everything of pod uids no
//! pod worker knows once the pod source has listed (containers, sandboxes,
//! pod folders, cgroups and log folders).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::cri::{api, labels, CriError};
use super::kuberuntime::manager::RuntimeManager;
use super::kuberuntime::runtime_status::ContainerRunState;

/// How often garbage is collected (upstream's ContainerGCPeriod).
pub const GC_PERIOD: Duration = Duration::from_secs(60);
/// Instances kept per (pod, container), the running one included: the
/// current one and the one `lastState` and `logs --previous` show.
pub const KEEP_PER_CONTAINER: usize = 2;
/// A container created but never started is garbage only after this long
/// (it may be between CreateContainer and StartContainer).
const UNSTARTED_MIN_AGE: Duration = Duration::from_secs(60);

/// A runtime container as GC sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GcContainer {
    pub id: String,
    pub pod_uid: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: ContainerRunState,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
}

/// A runtime sandbox as GC sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GcSandbox {
    pub id: String,
    pub pod_uid: String,
    pub ready: bool,
    pub created_at: i64,
}

/// What one pass removes.
#[derive(Debug, Default, PartialEq)]
pub struct GcPlan {
    pub containers: Vec<String>,
    pub sandboxes: Vec<String>,
    /// Pod uids no worker knows: everything of theirs goes.
    pub orphans: BTreeSet<String>,
}

/// Chooses the garbage among the runtime's containers and sandboxes.
/// `known` says whether a pod worker has the uid; with `sources_ready`
/// false, no uid is taken for an orphan.
pub fn plan(
    containers: &[GcContainer],
    sandboxes: &[GcSandbox],
    known: &dyn Fn(&str) -> bool,
    sources_ready: bool,
    now_nanos: i64,
) -> GcPlan {
    let mut out = GcPlan::default();
    let orphan = |uid: &str| sources_ready && !uid.is_empty() && !known(uid);
    let mut by_container: HashMap<(&str, &str), Vec<&GcContainer>> = HashMap::new();
    for c in containers {
        if orphan(&c.pod_uid) {
            out.orphans.insert(c.pod_uid.clone());
        } else {
            by_container.entry((c.pod_uid.as_str(), c.name.as_str())).or_default().push(c);
        }
    }
    let min_age = UNSTARTED_MIN_AGE.as_nanos() as i64;
    let mut removed: HashSet<&str> = HashSet::new();
    for list in by_container.values_mut() {
        list.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in list.iter().skip(KEEP_PER_CONTAINER) {
            let dead = match c.state {
                ContainerRunState::Exited => true,
                ContainerRunState::Running => false,
                ContainerRunState::Created | ContainerRunState::Unknown => now_nanos - c.created_at > min_age,
            };
            if dead {
                out.containers.push(c.id.clone());
                removed.insert(c.id.as_str());
            }
        }
    }
    out.containers.sort();
    let mut in_use: HashSet<&str> = HashSet::new();
    for c in containers.iter().filter(|c| !removed.contains(c.id.as_str())) {
        in_use.insert(c.sandbox_id.as_str());
    }
    let mut by_pod: HashMap<&str, Vec<&GcSandbox>> = HashMap::new();
    for s in sandboxes {
        if orphan(&s.pod_uid) {
            out.orphans.insert(s.pod_uid.clone());
        } else {
            by_pod.entry(s.pod_uid.as_str()).or_default().push(s);
        }
    }
    for list in by_pod.values_mut() {
        list.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for s in list.iter().skip(1) {
            if !s.ready && !in_use.contains(s.id.as_str()) {
                out.sandboxes.push(s.id.clone());
            }
        }
    }
    out.sandboxes.sort();
    out
}

/// The pod uid of a log folder `<namespace>_<name>_<uid>`.
pub fn log_dir_uid(dir_name: &str) -> Option<&str> {
    dir_name.rsplit_once('_').map(|(_, uid)| uid).filter(|u| !u.is_empty())
}

/// Log folders of pod uids no worker knows.
fn orphan_log_dirs(pod_logs_dir: &Path, known: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pod_logs_dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().and_then(log_dir_uid).is_some_and(|uid| !known(uid)))
        .map(|e| e.path())
        .collect()
}

/// What container GC asks of the pod workers (upstream's sourcesReady and
/// podStateProvider).
pub trait PodStateProvider: Send + Sync {
    /// The pod source has listed its pods once.
    fn sources_ready(&self) -> bool;
    /// Whether a worker (syncing, terminating, or keeping a finished pod) has the uid.
    fn knows(&self, uid: &str) -> bool;
}

/// Removes what is left of pods no worker knows (the kubelet's part of
/// upstream's HandlePodCleanups).
#[async_trait::async_trait]
pub trait OrphanCleaner: Send + Sync {
    /// Every pod uid the runtime or the disk has something of.
    async fn known_uids(&self) -> Result<HashSet<String>, CriError>;
    /// Removes everything the runtime and the disk hold for the uid.
    async fn cleanup_orphan(&self, uid: &str) -> Result<(), CriError>;
}

/// Upstream's container GC, through the runtime manager, asking the pod
/// workers which pods are wanted and the kubelet to clean up the others.
pub struct ContainerGc {
    runtime: Arc<RuntimeManager>,
    pods: Arc<dyn PodStateProvider>,
    orphans: Arc<dyn OrphanCleaner>,
}

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcStats {
    pub containers: usize,
    pub sandboxes: usize,
    pub pods: usize,
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

impl ContainerGc {
    pub fn new(
        runtime: Arc<RuntimeManager>,
        pods: Arc<dyn PodStateProvider>,
        orphans: Arc<dyn OrphanCleaner>,
    ) -> Arc<ContainerGc> {
        Arc::new(ContainerGc { runtime, pods, orphans })
    }

    /// Collects every GC period, for ever.
    pub async fn run(self: Arc<Self>) {
        loop {
            tokio::time::sleep(GC_PERIOD).await;
            match self.garbage_collect().await {
                Ok(s) if s != GcStats::default() => tracing::debug!(?s, "container garbage collected"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "container garbage collection failed"),
            }
        }
    }

    async fn list(&self) -> Result<(Vec<GcContainer>, Vec<GcSandbox>), CriError> {
        let cri = &self.runtime.cri;
        let containers = cri
            .list_containers(None)
            .await?
            .into_iter()
            .map(|c| GcContainer {
                pod_uid: c.labels.get(labels::POD_UID).cloned().unwrap_or_default(),
                name: c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default(),
                sandbox_id: c.pod_sandbox_id,
                state: ContainerRunState::from(c.state),
                created_at: c.created_at,
                id: c.id,
            })
            .collect();
        let sandboxes = cri
            .list_pod_sandboxes(None)
            .await?
            .into_iter()
            .map(|s| GcSandbox {
                pod_uid: s.labels.get(labels::POD_UID).cloned().unwrap_or_default(),
                ready: s.state == api::PodSandboxState::SandboxReady as i32,
                created_at: s.created_at,
                id: s.id,
            })
            .collect();
        Ok((containers, sandboxes))
    }

    /// One pass; errors on single objects are logged and the pass goes on.
    pub async fn garbage_collect(&self) -> Result<GcStats, CriError> {
        let (containers, sandboxes) = self.list().await?;
        let ready = self.pods.sources_ready();
        let known = |uid: &str| self.pods.knows(uid);
        let mut plan = plan(&containers, &sandboxes, &known, ready, now_nanos());
        let mut stats = GcStats::default();
        for id in &plan.containers {
            match self.runtime.remove_container(id).await {
                Ok(()) => stats.containers += 1,
                Err(e) => tracing::debug!(container = %id, error = %e, "cannot remove a dead container"),
            }
        }
        for id in &plan.sandboxes {
            match self.runtime.remove_sandbox(id).await {
                Ok(()) => stats.sandboxes += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::debug!(sandbox = %id, error = %e, "cannot remove a dead sandbox"),
            }
        }
        if !ready {
            return Ok(stats);
        }
        // Pods only the disk remembers (folders, volumes).
        if let Ok(uids) = self.orphans.known_uids().await {
            plan.orphans.extend(uids.into_iter().filter(|u| !known(u)));
        }
        for uid in &plan.orphans {
            // A worker may have started since the list.
            if known(uid) {
                continue;
            }
            tracing::info!(pod_uid = %uid, "removing what is left of a pod no longer on this node");
            match self.orphans.cleanup_orphan(uid).await {
                Ok(()) => stats.pods += 1,
                Err(e) => tracing::warn!(pod_uid = %uid, error = %e, "cannot remove an orphaned pod"),
            }
        }
        for dir in orphan_log_dirs(&self.runtime.pod_logs_dir, &known) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot remove the log folder of a removed pod");
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ContainerRunState::*;

    fn c(id: &str, uid: &str, name: &str, sandbox: &str, state: ContainerRunState, created: i64) -> GcContainer {
        GcContainer {
            id: id.into(),
            pod_uid: uid.into(),
            name: name.into(),
            sandbox_id: sandbox.into(),
            state,
            created_at: created,
        }
    }

    fn s(id: &str, uid: &str, ready: bool, created: i64) -> GcSandbox {
        GcSandbox { id: id.into(), pod_uid: uid.into(), ready, created_at: created }
    }

    const NOW: i64 = 1_000 * 1_000_000_000;

    #[test]
    fn dead_instances_beyond_the_newest_two_go() {
        let containers = [
            c("a4", "p", "app", "sb", Running, 40),
            c("a3", "p", "app", "sb", Exited, 30),
            c("a2", "p", "app", "sb", Exited, 20),
            c("a1", "p", "app", "sb", Exited, 10),
            c("b2", "p", "side", "sb", Exited, 20),
            c("b1", "p", "side", "sb", Exited, 10),
        ];
        let p = plan(&containers, &[s("sb", "p", true, 1)], &|_| true, true, NOW);
        assert_eq!(p.containers, ["a1", "a2"]);
        assert!(p.sandboxes.is_empty() && p.orphans.is_empty());
    }

    #[test]
    fn a_just_created_container_stays() {
        let containers = [
            c("a3", "p", "app", "sb", Exited, NOW - 10),
            c("a2", "p", "app", "sb", Exited, NOW - 20),
            c("a1", "p", "app", "sb", Created, NOW - 30),
            c("a0", "p", "app", "sb", Created, NOW - 120 * 1_000_000_000),
        ];
        let p = plan(&containers, &[], &|_| true, true, NOW);
        assert_eq!(p.containers, ["a0"]);
    }

    #[test]
    fn old_dead_sandboxes_without_containers_go() {
        let containers = [c("a2", "p", "app", "sb2", Running, 30), c("a1", "p", "app", "sb1", Exited, 20)];
        let sandboxes =
            [s("sb3", "p", false, 40), s("sb2", "p", true, 25), s("sb1", "p", false, 15), s("sb0", "p", false, 5)];
        let p = plan(&containers, &sandboxes, &|_| true, true, NOW);
        // sb3 is the newest (kept, even dead); sb2 is ready; sb1 still holds a1.
        assert_eq!(p.sandboxes, ["sb0"]);
    }

    #[test]
    fn unknown_pods_are_orphans_once_sources_are_ready() {
        let containers = [c("x", "gone", "app", "sbg", Running, 1), c("y", "p", "app", "sb", Running, 1)];
        let sandboxes = [s("sbg", "gone", true, 1), s("sb", "p", true, 1), s("sbh", "also-gone", false, 1)];
        let known = |u: &str| u == "p";
        let p = plan(&containers, &sandboxes, &known, true, NOW);
        assert_eq!(p.orphans.iter().map(String::as_str).collect::<Vec<_>>(), ["also-gone", "gone"]);
        assert!(p.containers.is_empty() && p.sandboxes.is_empty());
        let before = plan(&containers, &sandboxes, &known, false, NOW);
        assert!(before.orphans.is_empty());
    }

    #[test]
    fn log_folders_name_their_pod() {
        assert_eq!(log_dir_uid("default_web-1_0b7d5b9e-6a2c"), Some("0b7d5b9e-6a2c"));
        assert_eq!(log_dir_uid("kube_system_x_u"), Some("u"));
        assert_eq!(log_dir_uid("nounderscore"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ns_a_keep")).unwrap();
        std::fs::create_dir(dir.path().join("ns_b_drop")).unwrap();
        let dirs = orphan_log_dirs(dir.path(), &|u| u == "keep");
        assert_eq!(dirs, [dir.path().join("ns_b_drop")]);
    }
}
