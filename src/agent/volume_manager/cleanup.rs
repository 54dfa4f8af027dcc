//! Tearing a pod's folder down: every mount under it (tmpfs volumes, local
//! volume binds, subPath binds) is detached first, deepest first; nothing
//! is deleted while anything under the folder is still mounted, so a
//! failed unmount can never delete through into a host path; the removal
//! itself never follows a symlink.

use std::io::ErrorKind;
use std::path::Path;

use super::error::VolumeError;
use super::mounter::Mounter;

/// Unmounts everything under `dir`, then removes it.
pub fn remove_pod_dir(mounter: &dyn Mounter, dir: &Path) -> Result<(), VolumeError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(VolumeError::io(dir)(e)),
    };
    if !meta.is_dir() {
        // A link (or a stray file) where the pod's folder should be: remove
        // it, never what it points at.
        return std::fs::remove_file(dir).map_err(VolumeError::io(dir));
    }
    unmount_all(mounter, dir)?;
    std::fs::remove_dir_all(dir).map_err(VolumeError::io(dir))
}

/// Detaches every mount at or under `dir`, and checks none is left.
pub fn unmount_all(mounter: &dyn Mounter, dir: &Path) -> Result<(), VolumeError> {
    for mount in mounter.mounts_under(dir).map_err(VolumeError::io(dir))? {
        match mounter.unmount_detach(&mount) {
            Ok(()) => tracing::debug!(path = %mount.display(), "unmounted"),
            // Gone meanwhile.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {}
            Err(source) => return Err(VolumeError::Unmount { path: mount, source }),
        }
    }
    if let Some(left) = mounter.mounts_under(dir).map_err(VolumeError::io(dir))?.into_iter().next() {
        return Err(VolumeError::StillMounted(left));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::mounter::HostMounter;
    use super::*;

    #[test]
    fn removes_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), "keep").unwrap();
        let pods = tempfile::tempdir().unwrap();
        let pod = pods.path().join("uid");
        std::fs::create_dir_all(pod.join("volumes/kubernetes.io~empty-dir/x")).unwrap();
        std::os::unix::fs::symlink(outside.path(), pod.join("volumes/kubernetes.io~empty-dir/x/link")).unwrap();
        remove_pod_dir(&HostMounter, &pod).unwrap();
        assert!(!pod.exists());
        assert!(outside.path().join("precious").exists());
        remove_pod_dir(&HostMounter, &pod).unwrap();

        // A link in place of the pod's folder is removed, not followed.
        std::os::unix::fs::symlink(outside.path(), &pod).unwrap();
        remove_pod_dir(&HostMounter, &pod).unwrap();
        assert!(std::fs::symlink_metadata(&pod).is_err());
        assert!(outside.path().join("precious").exists());
    }
}
