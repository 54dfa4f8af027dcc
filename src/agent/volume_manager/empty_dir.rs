//! emptyDir, and the folder every materialised volume starts as: a
//! directory with mode 0777, or a tmpfs for `medium: Memory` (and for the
//! memory-backed secret, downwardAPI and projected volumes). A tmpfs is
//! sized as upstream sizes it: the smallest of the node's allocatable
//! memory, the pod's memory limit (when every container has one) and the
//! volume's sizeLimit. On disk, sizeLimit is enforced by eviction, which
//! reads [`usage`].

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::error::SetUpError;
use super::mounter::{self, Mounter};
use crate::quantity;

/// Creates `dir` (mode 0777, whatever the umask) and, when asked, mounts a
/// tmpfs of `tmpfs_size` bytes on it. Idempotent: an existing folder keeps
/// its content, a mounted tmpfs is not mounted twice.
pub fn set_up(mounter: &dyn Mounter, dir: &Path, tmpfs_size: Option<i64>, memory: bool) -> Result<(), SetUpError> {
    std::fs::create_dir_all(dir).map_err(SetUpError::io(dir))?;
    let meta = std::fs::symlink_metadata(dir).map_err(SetUpError::io(dir))?;
    if !meta.is_dir() {
        return Err(SetUpError::InvalidPath(format!("{} is not a directory", dir.display())));
    }
    if meta.mode() & 0o777 != 0o777 && !memory {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(SetUpError::io(dir))?;
    }
    if memory && !mounter.is_mount_point(dir).map_err(SetUpError::io(dir))? {
        mounter.mount_tmpfs(dir, tmpfs_size).map_err(|source| SetUpError::Mount { target: dir.into(), source })?;
        tracing::debug!(dir = %dir.display(), size = ?tmpfs_size, "tmpfs mounted");
    }
    Ok(())
}

/// The size of a memory-backed volume: node allocatable memory, lowered to
/// the pod's memory limit and then to the volume's sizeLimit.
pub fn memory_size(pod: &Pod, size_limit: Option<&Quantity>, node_memory: i64) -> i64 {
    let mut size = node_memory;
    if let Some(limit) = pod_memory_limit(pod).filter(|l| *l > 0 && (size <= 0 || *l <= size)) {
        size = limit;
    }
    if let Some(limit) = size_limit.and_then(quantity::value).filter(|l| *l > 0 && (size <= 0 || *l <= size)) {
        size = limit;
    }
    size
}

/// The pod's memory limit as its cgroup gets it: the sum over containers,
/// at least any init container's; None when a container has no limit.
pub fn pod_memory_limit(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources.as_ref()?.limits.as_ref()?.get("memory").and_then(quantity::value)
    };
    let mut sum = 0i64;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    let mut max_init = 0i64;
    for c in spec.init_containers.iter().flatten() {
        let l = limit(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sum = sum.saturating_add(l);
        } else {
            max_init = max_init.max(l);
        }
    }
    Some(sum.max(max_init))
}

/// Bytes an emptyDir uses: the tmpfs's used blocks when it is one (cheap),
/// else the blocks of its files (a walk that follows no link and stays on
/// the volume's filesystem).
pub fn usage(dir: &Path, is_mount: bool) -> std::io::Result<u64> {
    if is_mount {
        return mounter::filesystem_used(dir);
    }
    let root = std::fs::symlink_metadata(dir)?;
    disk_usage(dir, root.dev())
}

fn disk_usage(path: &Path, dev: u64) -> std::io::Result<u64> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    if meta.dev() != dev {
        return Ok(0);
    }
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            total += disk_usage(&entry?.path(), dev)?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::super::mounter::{FakeMount, FakeMounter};
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

    fn container(memory: Option<&str>) -> Container {
        Container {
            resources: memory.map(|m| ResourceRequirements {
                limits: Some([("memory".into(), Quantity(m.into()))].into_iter().collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod { spec: Some(PodSpec { containers, ..Default::default() }), ..Default::default() }
    }

    #[test]
    fn tmpfs_size_is_the_smallest_limit() {
        let gi = 1i64 << 30;
        let limited = pod(vec![container(Some("1Gi")), container(Some("1Gi"))]);
        assert_eq!(pod_memory_limit(&limited), Some(2 * gi));
        assert_eq!(memory_size(&limited, None, 8 * gi), 2 * gi);
        assert_eq!(memory_size(&limited, Some(&Quantity("64Mi".into())), 8 * gi), 64 << 20);
        assert_eq!(memory_size(&limited, Some(&Quantity("4Gi".into())), 8 * gi), 2 * gi);
        let open = pod(vec![container(Some("1Gi")), container(None)]);
        assert_eq!(pod_memory_limit(&open), None);
        assert_eq!(memory_size(&open, None, 8 * gi), 8 * gi);
    }

    #[test]
    fn set_up_makes_a_0777_dir_and_keeps_content() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("a/b/vol");
        let mounter = FakeMounter::default();
        set_up(&mounter, &vol, None, false).unwrap();
        assert_eq!(std::fs::metadata(&vol).unwrap().mode() & 0o777, 0o777);
        std::fs::write(vol.join("f"), vec![1u8; 10000]).unwrap();
        set_up(&mounter, &vol, None, false).unwrap();
        assert!(mounter.table().is_empty(), "a folder on disk, no mount");
        assert!(vol.join("f").exists());
        let used = usage(&vol, false).unwrap();
        assert!(used >= 10000, "{used}");
    }

    #[test]
    fn memory_volumes_are_a_tmpfs_of_their_size_mounted_once() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("mem");
        let mounter = FakeMounter::default();
        set_up(&mounter, &vol, Some(16 << 20), true).unwrap();
        assert_eq!(mounter.mounts_on(&vol), [FakeMount::Tmpfs { size: Some(16 << 20) }]);
        // Set up again (a sync after a restart): the tmpfs is not mounted twice.
        set_up(&mounter, &vol, Some(32 << 20), true).unwrap();
        assert_eq!(mounter.mounts_on(&vol), [FakeMount::Tmpfs { size: Some(16 << 20) }]);
    }
}
