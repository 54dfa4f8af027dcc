//! The snapshot folder, with k3s' names: `<name>-<node name>-<unix time>`
//! (`on-demand` for `ferrok etcd-snapshot save`, `etcd-snapshot` for the
//! server's scheduled ones). A snapshot being written is a hidden
//! `.<name>.partial` file, renamed once complete, so a listing never shows
//! half a snapshot.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};

/// A snapshot on disk.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub created: SystemTime,
}

impl SnapshotFile {
    /// The unix time in the name, if it has k3s' form for `prefix`.
    fn time_for(&self, prefix: &str) -> Option<u64> {
        let rest = self.name.strip_prefix(prefix)?;
        (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())).then(|| rest.parse().ok()).flatten()
    }
}

/// `<name>-<node>-`: what every snapshot of one kind from one node starts with.
pub fn prefix(name: &str, node: &str) -> String {
    format!("{name}-{node}-")
}

/// A name that stays inside the folder.
pub fn check_name(flag: &str, name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') || name.contains('\0') {
        bail!("{flag}: {name:?} is not a snapshot name (no '/', not empty, not starting with '.')");
    }
    Ok(())
}

/// A name for a new snapshot that no snapshot has yet: the unix time in
/// it is now's, or the next second's when now's is taken (two saves in
/// one second).
pub fn new_name(dir: &Path, name: &str, node: &str) -> String {
    loop {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let candidate = format!("{}{}", prefix(name, node), now.as_secs());
        if !dir.join(&candidate).exists() && !partial(dir, &candidate).exists() {
            return candidate;
        }
        std::thread::sleep(Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos())));
    }
}

/// Where a snapshot is written before it is complete.
pub fn partial(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.partial"))
}

/// The snapshots in `dir`, oldest first; none when `dir` does not exist.
pub fn list(dir: &Path) -> anyhow::Result<Vec<SnapshotFile>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        files.push(SnapshotFile {
            name,
            path: entry.path(),
            size: meta.len(),
            created: meta.modified().unwrap_or(UNIX_EPOCH),
        });
    }
    files.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)));
    Ok(files)
}

/// The snapshot called `name` in `dir`.
pub fn find(dir: &Path, name: &str) -> anyhow::Result<SnapshotFile> {
    check_name("snapshot", name)?;
    list(dir)?
        .into_iter()
        .find(|f| f.name == name)
        .with_context(|| format!("snapshot {name:?} not found in {}", dir.display()))
}

/// Deletes the snapshots named; none is deleted unless all exist.
pub fn delete(dir: &Path, names: &[String]) -> anyhow::Result<Vec<SnapshotFile>> {
    let files = names.iter().map(|n| find(dir, n)).collect::<anyhow::Result<Vec<_>>>()?;
    for f in &files {
        std::fs::remove_file(&f.path).with_context(|| format!("cannot delete {}", f.path.display()))?;
    }
    Ok(files)
}

/// Deletes all but the newest `retention` snapshots named `<name>-<node>-<unix
/// time>` (0 keeps all), and returns those deleted.
pub fn prune(dir: &Path, name: &str, node: &str, retention: usize) -> anyhow::Result<Vec<SnapshotFile>> {
    if retention == 0 {
        return Ok(Vec::new());
    }
    let prefix = prefix(name, node);
    let mut ours: Vec<(u64, SnapshotFile)> =
        list(dir)?.into_iter().filter_map(|f| f.time_for(&prefix).map(|t| (t, f))).collect();
    ours.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.name.cmp(&a.1.name)));
    let old: Vec<SnapshotFile> = ours.into_iter().skip(retention).map(|(_, f)| f).collect();
    for f in &old {
        std::fs::remove_file(&f.path).with_context(|| format!("cannot delete {}", f.path.display()))?;
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest_of_one_name_and_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in ["on-demand-n1-100", "on-demand-n1-300", "on-demand-n1-200", "on-demand-n2-50", "etcd-snapshot-n1-1"] {
            std::fs::write(dir.path().join(n), n).expect("write");
        }
        std::fs::write(dir.path().join(".on-demand-n1-400.partial"), "x").expect("write");
        std::fs::write(dir.path().join("on-demand-n1-extra-5"), "x").expect("write");
        let gone = prune(dir.path(), "on-demand", "n1", 2).expect("prune");
        assert_eq!(gone.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["on-demand-n1-100"]);
        let left: Vec<String> = list(dir.path()).expect("list").into_iter().map(|f| f.name).collect();
        assert_eq!(left.len(), 5, "{left:?}");
        assert!(!left.contains(&"on-demand-n1-100".to_string()));
        assert!(prune(dir.path(), "on-demand", "n1", 0).expect("prune").is_empty());
    }

    #[test]
    fn delete_is_all_or_nothing_and_stays_in_the_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), "a").expect("write");
        let err = delete(dir.path(), &["a".into(), "b".into()]).expect_err("b is missing");
        assert!(err.to_string().contains("\"b\" not found"), "{err}");
        assert!(dir.path().join("a").exists());
        assert!(delete(dir.path(), &["../a".into()]).is_err());
        assert_eq!(delete(dir.path(), &["a".into()]).expect("delete").len(), 1);
        assert!(list(&dir.path().join("none")).expect("missing folder").is_empty());
    }

    #[test]
    fn new_names_do_not_collide() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = new_name(dir.path(), "on-demand", "n1");
        std::fs::write(dir.path().join(&first), "x").expect("write");
        let second = new_name(dir.path(), "on-demand", "n1");
        assert_ne!(first, second);
        assert!(second.starts_with("on-demand-n1-"));
    }
}
