//! The atomic writer of upstream's `pkg/volume/util`: how configMap,
//! secret, downwardAPI and projected volumes change under a running
//! container without it ever seeing half an update.
//!
//! ```text
//! <volume>/..2026_01_02_03_04_05.1234567/key     the files, in a timestamped dir
//! <volume>/..data -> ..2026_01_02_03_04_05.1234567
//! <volume>/key -> ..data/key                     what the user sees
//! ```
//!
//! A write fills a new timestamped dir, then points `..data` at it with
//! one rename of a temporary symlink (atomic), creates the user-visible
//! links that are missing, removes those no longer in the payload, and
//! removes the old timestamped dir.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::SetUpError;

pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;

/// One file of a volume: its bytes and its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path in the volume → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// What runs on the volume before new files become visible (fsGroup).
pub type SetPerms<'a> = &'a dyn Fn(&Path) -> Result<(), SetUpError>;

/// Checks a path a payload may write, as upstream's `validatePath`.
pub fn validate_path(target: &str) -> Result<(), SetUpError> {
    let invalid = |why: String| Err(SetUpError::InvalidPath(format!("invalid path: {why}")));
    if target.is_empty() {
        return invalid(format!("must not be empty: {target:?}"));
    }
    if target.starts_with('/') {
        return invalid(format!("must be relative path: {target}"));
    }
    if target.len() > MAX_PATH_LENGTH {
        return invalid(format!("must be less than or equal to {MAX_PATH_LENGTH} characters"));
    }
    let items: Vec<&str> = target.split('/').collect();
    for item in &items {
        if *item == ".." {
            return invalid(format!("must not contain '..': {target}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return invalid(format!("filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return invalid(format!("must not start with '..': {target}"));
    }
    Ok(())
}

/// `a//b/./c/` → `a/b/c` (what Go's `path.Clean` makes of a valid path).
fn clean(path: &str) -> String {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").collect::<Vec<_>>().join("/")
}

/// Validates and normalises every path of `payload`.
pub fn clean_payload(payload: &Payload) -> Result<Payload, SetUpError> {
    let mut out = Payload::new();
    for (path, file) in payload {
        validate_path(path)?;
        let cleaned = clean(path);
        if cleaned.is_empty() {
            return Err(SetUpError::InvalidPath(format!("invalid path: must not be empty: {path:?}")));
        }
        out.insert(cleaned, file.clone());
    }
    Ok(out)
}

/// Writes payloads into one volume dir.
pub struct AtomicWriter {
    target: PathBuf,
}

impl AtomicWriter {
    pub fn new(target: impl Into<PathBuf>) -> AtomicWriter {
        AtomicWriter { target: target.into() }
    }

    /// Makes the volume hold exactly `payload`. `set_perms` runs on the
    /// volume after new files are in place and before they become visible
    /// (fsGroup ownership). Returns whether anything was written: a
    /// payload equal to what the volume holds changes nothing.
    pub fn write(&self, payload: &Payload, set_perms: Option<SetPerms<'_>>) -> Result<bool, SetUpError> {
        let payload = clean_payload(payload)?;
        let io = |p: &Path| SetUpError::io(p.to_path_buf());
        let data_link = self.target.join(DATA_DIR);
        let old_ts = self.current_dir();
        let old_ts_path = old_ts.as_ref().map(|n| self.target.join(n));

        let to_remove = match &old_ts_path {
            Some(old) => paths_to_remove(&payload, old)?,
            None => BTreeSet::new(),
        };
        let must_write = match &old_ts_path {
            Some(old) => !to_remove.is_empty() || differs(&payload, old)?,
            None => true,
        };
        if !must_write {
            self.create_user_visible_files(&payload)?;
            tracing::trace!(volume = %self.target.display(), "no update required");
            return Ok(false);
        }

        let new_ts = self.new_timestamp_dir()?;
        let new_ts_path = self.target.join(&new_ts);
        if let Err(e) = write_payload(&payload, &new_ts_path) {
            let _ = std::fs::remove_dir_all(&new_ts_path);
            return Err(e);
        }
        if let Some(set_perms) = set_perms {
            if let Err(e) = set_perms(&self.target) {
                let _ = std::fs::remove_dir_all(&new_ts_path);
                return Err(e);
            }
        }

        // The swap: a new symlink renamed over the old one.
        let tmp_link = self.target.join(DATA_DIR_TMP);
        match std::fs::remove_file(&tmp_link) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(io(&tmp_link)(e)),
            _ => {}
        }
        std::os::unix::fs::symlink(&new_ts, &tmp_link).map_err(io(&tmp_link))?;
        std::fs::rename(&tmp_link, &data_link).map_err(io(&data_link))?;

        self.create_user_visible_files(&payload)?;
        for path in &to_remove {
            // Only links at the volume's root are user-visible; deeper
            // paths went away with the old timestamped dir.
            if !path.contains('/') {
                let p = self.target.join(path);
                if let Err(e) = std::fs::remove_file(&p) {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove a user-visible path");
                }
            }
        }
        self.remove_old_dirs(&new_ts);
        Ok(true)
    }

    /// The timestamped dir `..data` points at, when it exists.
    fn current_dir(&self) -> Option<String> {
        let link = std::fs::read_link(self.target.join(DATA_DIR)).ok()?;
        let name = link.to_str()?.to_string();
        if name.contains('/') || !name.starts_with("..") || name == DATA_DIR {
            return None;
        }
        std::fs::symlink_metadata(self.target.join(&name)).ok().filter(|m| m.is_dir())?;
        Some(name)
    }

    fn new_timestamp_dir(&self) -> Result<String, SetUpError> {
        let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S").to_string();
        for _ in 0..100 {
            let name = format!("..{stamp}.{}", crate::host::random::u32());
            let path = self.target.join(&name);
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                        .map_err(SetUpError::io(&path))?;
                    return Ok(name);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(SetUpError::io(&path)(e)),
            }
        }
        Err(SetUpError::InvalidPath(format!("cannot create a timestamped dir in {}", self.target.display())))
    }

    fn create_user_visible_files(&self, payload: &Payload) -> Result<(), SetUpError> {
        let tops: BTreeSet<&str> = payload.keys().map(|p| p.split('/').next().unwrap_or(p)).collect();
        for top in tops {
            let visible = self.target.join(top);
            match std::fs::symlink_metadata(&visible) {
                Ok(m) if m.file_type().is_symlink() => continue,
                Ok(_) => {
                    return Err(SetUpError::InvalidPath(format!(
                        "{} exists and is not a link into {DATA_DIR}",
                        visible.display()
                    )))
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    std::os::unix::fs::symlink(Path::new(DATA_DIR).join(top), &visible)
                        .map_err(SetUpError::io(&visible))?;
                }
                Err(e) => return Err(SetUpError::io(&visible)(e)),
            }
        }
        Ok(())
    }

    /// Removes every timestamped dir but `keep` (the one just swapped out,
    /// and any a crash left behind).
    fn remove_old_dirs(&self, keep: &str) {
        let Ok(entries) = std::fs::read_dir(&self.target) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name == keep || !is_timestamp_dir(name) {
                continue;
            }
            let path = entry.path();
            // remove_dir_all never follows symlinks.
            if let Err(e) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old data dir");
            }
        }
    }
}

/// `..YYYY_MM_DD_HH_MM_SS.N`
fn is_timestamp_dir(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("..") else { return false };
    let bytes = rest.as_bytes();
    bytes.len() > 20
        && bytes[..19].iter().enumerate().all(|(i, b)| match i {
            4 | 7 | 10 | 13 | 16 => *b == b'_',
            _ => b.is_ascii_digit(),
        })
        && bytes[19] == b'.'
}

/// Whether the files in `dir` differ from the payload (content only, as
/// upstream: ownership changes may have widened modes).
fn differs(payload: &Payload, dir: &Path) -> Result<bool, SetUpError> {
    for (path, file) in payload {
        let p = dir.join(path);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(SetUpError::io(&p)(e)),
        }
        if std::fs::read(&p).map_err(SetUpError::io(&p))? != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Paths in the old dir that neither the payload nor a parent of it names.
fn paths_to_remove(payload: &Payload, old: &Path) -> Result<BTreeSet<String>, SetUpError> {
    let mut existing = BTreeSet::new();
    walk(old, "", &mut existing)?;
    let mut wanted = BTreeSet::new();
    for path in payload.keys() {
        let mut p = path.as_str();
        loop {
            wanted.insert(p.to_string());
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
    }
    Ok(existing.difference(&wanted).cloned().collect())
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> Result<(), SetUpError> {
    for entry in std::fs::read_dir(dir).map_err(SetUpError::io(dir))? {
        let entry = entry.map_err(SetUpError::io(dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir {
            walk(&entry.path(), &rel, out)?;
        }
        out.insert(rel);
    }
    Ok(())
}

fn write_payload(payload: &Payload, dir: &Path) -> Result<(), SetUpError> {
    for (path, file) in payload {
        let p = dir.join(path);
        if let Some(parent) = p.parent() {
            create_dirs(dir, parent)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode & 0o7777)
            .open(&p)
            .map_err(SetUpError::io(&p))?;
        f.write_all(&file.data).map_err(SetUpError::io(&p))?;
        // The umask narrowed the mode at creation.
        f.set_permissions(std::fs::Permissions::from_mode(file.mode & 0o7777)).map_err(SetUpError::io(&p))?;
    }
    Ok(())
}

/// Creates the dirs from `base` down to `dir` with mode 0755.
fn create_dirs(base: &Path, dir: &Path) -> Result<(), SetUpError> {
    if dir == base || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(base, parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(SetUpError::io(dir)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SetUpError::io(dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection { data: data.as_bytes().to_vec(), mode }
    }

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items.iter().map(|(p, d, m)| (p.to_string(), file(d, *m))).collect()
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_timestamp_dir(n))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn paths_are_validated_as_upstream() {
        assert!(validate_path("a").is_ok());
        assert!(validate_path("a/b/c").is_ok());
        assert!(validate_path("..a/b").is_err(), "a leading ..name is reserved for the writer");
        assert!(validate_path("a/..b").is_ok());
        assert!(validate_path("..").is_err());
        assert!(validate_path("a/../b").is_err());
        assert!(validate_path("/etc/passwd").is_err());
        assert!(validate_path("").is_err());
        assert!(validate_path(&"x".repeat(256)).is_err());
        assert!(validate_path(&format!("{}/{}", "x".repeat(255), "y")).is_ok());
        assert_eq!(validate_path("/a").unwrap_err().to_string(), "invalid path: must be relative path: /a");
        assert_eq!(validate_path("a/../b").unwrap_err().to_string(), "invalid path: must not contain '..': a/../b");
        assert_eq!(clean("a//b/./c/"), "a/b/c");
    }

    #[test]
    fn write_lays_out_data_dir_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path());
        let p = payload(&[("key", "value", 0o644), ("nested/deep/file", "x", 0o400), ("exec", "#!", 0o755)]);
        assert!(w.write(&p, None).unwrap());

        let data = std::fs::read_link(dir.path().join(DATA_DIR)).unwrap();
        let data = data.to_str().unwrap();
        assert!(is_timestamp_dir(data), "{data}");
        assert_eq!(std::fs::read_link(dir.path().join("key")).unwrap(), Path::new("..data/key"));
        assert_eq!(std::fs::read_link(dir.path().join("nested")).unwrap(), Path::new("..data/nested"));
        assert_eq!(std::fs::read_to_string(dir.path().join("key")).unwrap(), "value");
        assert_eq!(std::fs::read_to_string(dir.path().join("nested/deep/file")).unwrap(), "x");
        let mode = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("key"), 0o644);
        assert_eq!(mode("nested/deep/file"), 0o400);
        assert_eq!(mode("exec"), 0o755);
        assert_eq!(mode("nested"), 0o755);
        assert_eq!(mode(data), 0o755);
    }

    #[test]
    fn rewrite_swaps_and_removes_old_dirs_and_paths() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path());
        assert!(w.write(&payload(&[("a", "1", 0o644), ("b/c", "2", 0o644)]), None).unwrap());
        let first = ts_dirs(dir.path());
        assert_eq!(first.len(), 1);

        // The same content: nothing happens.
        assert!(!w.write(&payload(&[("a", "1", 0o644), ("b/c", "2", 0o644)]), None).unwrap());
        assert_eq!(ts_dirs(dir.path()), first);

        // New content, a path gone, a path added.
        assert!(w.write(&payload(&[("a", "one", 0o600), ("d", "3", 0o644)]), None).unwrap());
        let second = ts_dirs(dir.path());
        assert_eq!(second.len(), 1, "the old timestamped dir is removed");
        assert_ne!(second, first);
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "one");
        assert_eq!(std::fs::metadata(dir.path().join("a")).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(dir.path().join("d")).unwrap(), "3");
        assert!(std::fs::symlink_metadata(dir.path().join("b")).is_err(), "b left the payload");

        // An empty payload empties the volume but keeps ..data.
        assert!(w.write(&Payload::new(), None).unwrap());
        let names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&DATA_DIR.to_string()));
    }

    #[test]
    fn leftover_dirs_of_a_crash_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..2020_01_01_00_00_00.42")).unwrap();
        std::os::unix::fs::symlink("..2020_01_01_00_00_00.42", dir.path().join(DATA_DIR_TMP)).unwrap();
        let w = AtomicWriter::new(dir.path());
        w.write(&payload(&[("a", "1", 0o644)]), None).unwrap();
        assert_eq!(ts_dirs(dir.path()).len(), 1);
        assert!(std::fs::symlink_metadata(dir.path().join(DATA_DIR_TMP)).is_err());
    }

    #[test]
    fn invalid_payloads_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path());
        assert!(w.write(&payload(&[("../escape", "x", 0o644)]), None).is_err());
        assert!(w.write(&payload(&[("..data", "x", 0o644)]), None).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn set_perms_runs_before_the_swap() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path());
        let seen = std::cell::Cell::new(false);
        let check = |volume: &Path| {
            assert!(std::fs::symlink_metadata(volume.join("a")).is_err(), "not yet visible");
            seen.set(true);
            Ok(())
        };
        w.write(&payload(&[("a", "1", 0o644)]), Some(&check)).unwrap();
        assert!(seen.get());
    }

    #[test]
    fn readers_always_see_one_whole_version() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path());
        let small = "a".repeat(10);
        let big = "b".repeat(100_000);
        w.write(&payload(&[("key", &small, 0o644)]), None).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, stop, small, big) = (dir.path().join("key"), stop.clone(), small.clone(), big.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // As upstream's writer, the old version's folder goes
                    // right after the swap: a reader that resolved `..data`
                    // just before it may find its file gone and reads again.
                    // What it reads is never a mix of two versions.
                    let got = match std::fs::read_to_string(&path) {
                        Ok(g) => g,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => panic!("cannot read the key: {e}"),
                    };
                    assert!(got == small || got == big, "a torn read of {} bytes", got.len());
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..200 {
            let content = if i % 2 == 0 { &big } else { &small };
            w.write(&payload(&[("key", content, 0o644)]), None).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(ts_dirs(dir.path()).len(), 1);
    }
}
