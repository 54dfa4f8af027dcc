//! What pods use, read only when a decision needs it. Memory and process
//! counts come from the pod's cgroup (`resources::pod_cgroup_parent`, each
//! container a child named by its id): a few small file reads, cheaper than
//! a CRI `ListContainerStats` round trip that reads the same files. Local
//! storage is the containers' writable layers (CRI stats: containerd
//! measures its snapshots in the background), their log folders, and the
//! pod's emptyDir folders, measured like `du` (allocated blocks).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::agent::cri::{api, labels, Cri, CriError};
use crate::agent::kuberuntime::resources;
use crate::agent::pod_util;

const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// Where upstream's kubelet lays out emptyDir volumes under a pod's folder.
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

fn unified() -> bool {
    Path::new(CGROUP_MOUNT).join("cgroup.controllers").exists()
}

/// The folder of a cgroup path under a controller's hierarchy.
fn cgroup_dir(controller: &str, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if unified() {
        Path::new(CGROUP_MOUNT).join(rel)
    } else {
        Path::new(CGROUP_MOUNT).join(controller).join(rel)
    }
}

fn read_i64(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A field of memory.stat.
pub fn memory_stat(text: &str, field: &str) -> Option<i64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == field).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The working set of a cgroup: usage less inactive file pages (as cAdvisor).
fn working_set(dir: &Path) -> Option<i64> {
    let v2 = unified();
    let usage = read_i64(&dir.join(if v2 { "memory.current" } else { "memory.usage_in_bytes" }))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let inactive = memory_stat(&stat, if v2 { "inactive_file" } else { "total_inactive_file" }).unwrap_or(0);
    Some(if inactive < usage { usage - inactive } else { 0 })
}

/// The running containers of each pod uid: (id, name).
pub async fn running_containers(cri: &Cri) -> Result<HashMap<String, Vec<(String, String)>>, CriError> {
    let list = cri.list_containers(Some(crate::agent::cri::running())).await?;
    let mut out: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for c in list {
        let (Some(uid), Some(name)) = (c.labels.get(labels::POD_UID), c.labels.get(labels::CONTAINER_NAME)) else {
            continue;
        };
        out.entry(uid.clone()).or_default().push((c.id, name.clone()));
    }
    Ok(out)
}

/// The pod's memory working set and each container's.
pub fn pod_memory(pod: &Pod, cgroup_root: &str, containers: &[(String, String)]) -> (Option<i64>, Vec<(String, i64)>) {
    let parent = resources::pod_cgroup_parent(pod, cgroup_root);
    let dir = cgroup_dir("memory", &parent);
    let per_container: Vec<(String, i64)> =
        containers.iter().filter_map(|(id, name)| working_set(&dir.join(id)).map(|w| (name.clone(), w))).collect();
    (working_set(&dir), per_container)
}

/// The processes (tasks) in the pod's cgroup.
pub fn pod_processes(pod: &Pod, cgroup_root: &str) -> Option<i64> {
    let parent = resources::pod_cgroup_parent(pod, cgroup_root);
    read_i64(&cgroup_dir("pids", &parent).join("pids.current"))
}

/// Bytes allocated to the files under `path`, symlinks not followed, as `du`.
pub fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.filter_map(Result::ok) {
                total += disk_usage(&e.path());
            }
        }
    }
    total
}

/// Local storage a pod uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDiskUsage {
    /// Writable layer plus logs, by container name.
    pub containers: Vec<(String, i64)>,
    /// emptyDir usage by volume name (memory-backed ones too).
    pub empty_dirs: HashMap<String, i64>,
    /// Everything counted against the pod's ephemeral storage: containers
    /// and disk-backed emptyDirs.
    pub total: i64,
}

/// The writable layer of each container with CRI stats, by container id.
pub async fn writable_layers(cri: &Cri) -> Result<HashMap<String, i64>, CriError> {
    let stats = cri
        .runtime()
        .list_container_stats(api::ListContainerStatsRequest { filter: None })
        .await
        .map_err(CriError::call("ListContainerStats"))?
        .into_inner()
        .stats;
    Ok(stats
        .into_iter()
        .filter_map(|s| {
            let id = s.attributes?.id;
            let used = s.writable_layer?.used_bytes?.value;
            Some((id, used as i64))
        })
        .collect())
}

/// Measures a pod's local storage (blocking: walks folders).
pub fn pod_disk(
    pod: &Pod,
    containers: &[(String, String)],
    layers: &HashMap<String, i64>,
    pods_dir: &Path,
    pod_log_dir: &Path,
) -> PodDiskUsage {
    let mut out = PodDiskUsage::default();
    for (id, name) in containers {
        let used = layers.get(id).copied().unwrap_or(0) + disk_usage(&pod_log_dir.join(name)) as i64;
        out.containers.push((name.clone(), used));
        out.total += used;
    }
    let volumes = pods_dir.join(pod_util::uid(pod)).join("volumes").join(EMPTY_DIR_PLUGIN);
    for v in pod_util::spec(pod).volumes.iter().flatten() {
        let Some(ed) = &v.empty_dir else { continue };
        let used = disk_usage(&volumes.join(&v.name)) as i64;
        out.empty_dirs.insert(v.name.clone(), used);
        if ed.medium.as_deref() != Some("Memory") {
            out.total += used;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stat_fields() {
        let text = "cache 100\nrss 5\ntotal_inactive_file 4096\ninactive_file 10\n";
        assert_eq!(memory_stat(text, "total_inactive_file"), Some(4096));
        assert_eq!(memory_stat(text, "inactive_file"), Some(10));
        assert_eq!(memory_stat(text, "missing"), None);
    }

    #[test]
    fn disk_usage_counts_allocated_blocks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub").join("f"), vec![1u8; 64 * 1024]).unwrap();
        let used = disk_usage(dir.path());
        assert!(used >= 64 * 1024, "{used}");
        assert_eq!(disk_usage(&dir.path().join("absent")), 0);
    }
}
