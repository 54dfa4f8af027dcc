//! Manifests ferrok ships (k3s' packaged components): written into the
//! manifests folder at every start, so the deploy controller applies them
//! as any other file, and removed when the component is disabled, so their
//! objects are deleted. A `<file>.skip` keeps a user's edited copy: the
//! file is then neither written nor removed.

use std::path::Path;

/// The `local-path` StorageClass, the cluster's default (k3s' `local-storage`).
pub const LOCAL_STORAGE: (&str, &str) = (
    "local-storage.yaml",
    r#"# Written by ferrok at every start (create local-storage.yaml.skip to keep your own);
# removed with --disable local-storage.
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-path
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
"#,
);

/// Writes `(name, content)` into `dir` when `enabled`, removes it otherwise.
pub fn install(dir: &Path, (name, content): (&str, &str), enabled: bool) -> std::io::Result<()> {
    let path = dir.join(name);
    if dir.join(format!("{name}.skip")).exists() {
        return Ok(());
    }
    if !enabled {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    if std::fs::read(&path).is_ok_and(|c| c == content.as_bytes()) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    // A dotfile is not a manifest: the watcher sees the rename only.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_removed_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCAL_STORAGE.0);
        install(dir.path(), LOCAL_STORAGE, true).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("rancher.io/local-path"));
        assert!(super::super::manifest::parse(LOCAL_STORAGE.0, LOCAL_STORAGE.1.as_bytes()).unwrap().len() == 1);
        install(dir.path(), LOCAL_STORAGE, false).unwrap();
        assert!(!path.exists());
        install(dir.path(), LOCAL_STORAGE, false).unwrap();
        std::fs::write(&path, "mine").unwrap();
        std::fs::write(dir.path().join("local-storage.yaml.skip"), "").unwrap();
        install(dir.path(), LOCAL_STORAGE, true).unwrap();
        install(dir.path(), LOCAL_STORAGE, false).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
    }
}
