//! Where volumes live on the node, laid out as upstream's kubelet lays them
//! out: `<pods-dir>/<pod-uid>/volumes/kubernetes.io~<plugin>/<volume>/`,
//! and `<pods-dir>/<pod-uid>/volume-subpaths/<volume>/<container>/<index>`
//! for subPath bind mounts.

use std::path::{Path, PathBuf};

/// The volume plugins whose volumes have a folder of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plugin {
    EmptyDir,
    /// Not materialised: containers mount the host's path itself.
    HostPath,
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
    LocalVolume,
}

impl Plugin {
    /// The plugin's folder name (`kubernetes.io~empty-dir`).
    pub fn dir_name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io~empty-dir",
            Plugin::HostPath => "kubernetes.io~host-path",
            Plugin::ConfigMap => "kubernetes.io~configmap",
            Plugin::Secret => "kubernetes.io~secret",
            Plugin::DownwardApi => "kubernetes.io~downward-api",
            Plugin::Projected => "kubernetes.io~projected",
            Plugin::LocalVolume => "kubernetes.io~local-volume",
        }
    }

    /// Whether the volume's files are written by the atomic writer (and
    /// follow their sources).
    pub fn uses_atomic_writer(self) -> bool {
        matches!(self, Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected)
    }

    /// Whether the volume is a tmpfs even without `medium: Memory` (as
    /// upstream wraps secret, downwardAPI and projected volumes).
    pub fn memory_backed(self) -> bool {
        matches!(self, Plugin::Secret | Plugin::DownwardApi | Plugin::Projected)
    }
}

/// A pod uid usable as one path component.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid != "." && uid != ".." && !uid.contains('/') && !uid.contains('\0') && uid.len() <= 255
}

pub fn pod_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid)
}

pub fn volumes_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    pod_dir(pods_dir, uid).join("volumes")
}

pub fn volume_dir(pods_dir: &Path, uid: &str, plugin: Plugin, name: &str) -> PathBuf {
    volumes_dir(pods_dir, uid).join(plugin.dir_name()).join(name)
}

pub fn subpath_dir(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir.join("volume-subpaths").join(volume).join(container).join(index.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_as_upstream() {
        let p = volume_dir(Path::new("/var/lib/kubelet/pods"), "u1", Plugin::ConfigMap, "cfg");
        assert_eq!(p, Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/cfg"));
        assert_eq!(subpath_dir(Path::new("/p/u1"), "v", "c", 2), Path::new("/p/u1/volume-subpaths/v/c/2"));
        assert!(valid_uid("0b7d5b9e-6a2c-4e7f-9d51-2f3a0c1e2d34"));
        assert!(!valid_uid("..") && !valid_uid("a/b") && !valid_uid(""));
    }
}
