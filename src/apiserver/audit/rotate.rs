//! A log file that rotates itself, as lumberjack does for upstream's audit
//! log: past `max_size` bytes the file is renamed to
//! `<name>-<UTC timestamp>.<ext>` beside it and a new one started; backups
//! beyond `max_backups` or older than `max_age` are removed. Blocking I/O:
//! used from the audit writer thread only.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// lumberjack's default when no size is given.
const DEFAULT_MAX_SIZE: u64 = 100 * 1024 * 1024;

#[derive(Debug, Clone, Default)]
pub struct RotateOptions {
    /// Bytes before rotation; 0 is lumberjack's default, 100 MiB.
    pub max_size: u64,
    /// Backups kept; 0 keeps them all (unless too old).
    pub max_backups: usize,
    /// Age past which backups are removed; zero keeps them regardless of age.
    pub max_age: Duration,
}

pub struct RotatingFile {
    path: PathBuf,
    options: RotateOptions,
    file: File,
    size: u64,
}

fn open(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
}

/// `audit` and `.log` of `/var/log/audit.log`.
fn stem_and_ext(path: &Path) -> (String, String) {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.rfind('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name, String::new()),
    }
}

/// `2006-01-02T15-04-05.000`, lumberjack's backup time format, in UTC.
fn backup_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let base = crate::apiserver::meta::rfc3339(d.as_secs() as i64);
    format!("{}.{:03}", base.trim_end_matches('Z').replace(':', "-"), d.subsec_millis())
}

impl RotatingFile {
    pub fn open(path: PathBuf, options: RotateOptions) -> std::io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile { path, options, file, size })
    }

    fn max_size(&self) -> u64 {
        if self.options.max_size == 0 {
            DEFAULT_MAX_SIZE
        } else {
            self.options.max_size
        }
    }

    /// Appends one record, rotating first when it would not fit.
    pub fn write_record(&mut self, record: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + record.len() as u64 > self.max_size() {
            self.rotate()?;
        }
        self.file.write_all(record)?;
        self.size += record.len() as u64;
        Ok(())
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        let (stem, ext) = stem_and_ext(&self.path);
        let dir = self.path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut backup = dir.join(format!("{stem}-{}{ext}", backup_timestamp(SystemTime::now())));
        let mut n = 1;
        while backup.exists() {
            // Two rotations in one millisecond: keep both.
            backup = dir.join(format!("{stem}-{}-{n}{ext}", backup_timestamp(SystemTime::now())));
            n += 1;
        }
        std::fs::rename(&self.path, &backup)?;
        self.file = open(&self.path)?;
        self.size = 0;
        self.remove_old_backups(&dir, &stem, &ext);
        Ok(())
    }

    /// The backups of this log, newest first.
    fn backups(dir: &Path, stem: &str, ext: &str) -> Vec<(SystemTime, PathBuf)> {
        let prefix = format!("{stem}-");
        let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() { Path::new(".") } else { dir }) else {
            return Vec::new();
        };
        let mut found: Vec<(SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&prefix) && name.ends_with(ext) && name.len() > prefix.len() + ext.len()
            })
            .map(|e| (e.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH), e.path()))
            .collect();
        // Names carry the time, so they order like it.
        found.sort_by(|a, b| b.1.cmp(&a.1));
        found
    }

    fn remove_old_backups(&self, dir: &Path, stem: &str, ext: &str) {
        let backups = Self::backups(dir, stem, ext);
        let now = SystemTime::now();
        for (i, (modified, path)) in backups.iter().enumerate() {
            let too_many = self.options.max_backups > 0 && i >= self.options.max_backups;
            let too_old = !self.options.max_age.is_zero()
                && now.duration_since(*modified).map(|age| age > self.options.max_age).unwrap_or(false);
            if too_many || too_old {
                if let Err(e) = std::fs::remove_file(path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove an old audit log backup");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn rotates_past_max_size_and_keeps_max_backups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let options = RotateOptions { max_size: 100, max_backups: 2, max_age: Duration::ZERO };
        let mut f = RotatingFile::open(path.clone(), options).expect("open");
        for i in 0..20 {
            f.write_record(format!("{i:039}\n").as_bytes()).expect("write");
        }
        f.flush().expect("flush");
        let all = names(dir.path());
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all.contains(&"audit.log".to_string()));
        for b in all.iter().filter(|n| *n != "audit.log") {
            assert!(b.starts_with("audit-") && b.ends_with(".log"), "{b}");
        }
        // No record split across files and none over the size.
        assert!(std::fs::metadata(&path).expect("meta").len() <= 100);
        let last = std::fs::read_to_string(&path).expect("read");
        assert!(last.ends_with(&format!("{:039}\n", 19)), "{last}");
    }

    #[test]
    fn backup_names_follow_lumberjack() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(backup_timestamp(t), "2023-11-14T22-13-20.123");
        assert_eq!(stem_and_ext(Path::new("/x/audit.log")), ("audit".into(), ".log".into()));
        assert_eq!(stem_and_ext(Path::new("audit")), ("audit".into(), String::new()));
    }
}
