//! Container log rotation (upstream's ContainerLogManager): every 10 s the
//! current log of each running container (CRI's `log_path`,
//! `<pod-log-dir>/<container>/<restart>.log`) is looked at; one over
//! `containerLogMaxSize` is renamed to `<log>.<YYYYMMDD-hhmmss>` and the
//! runtime is told to reopen it (`ReopenContainerLog`). Older rotated files
//! are gzipped (all but the newest, which a reader may still be following)
//! and the oldest removed, so at most `containerLogMaxFiles` files remain,
//! counting the live one. A pass where nothing is big costs one CRI list,
//! one status per running container, and a stat each.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::agent::cri::{api, Cri, CriError};

/// How often logs are looked at (upstream's logMonitorPeriod).
pub const MONITOR_PERIOD: Duration = Duration::from_secs(10);
/// The suffix of compressed rotated logs.
const COMPRESS_SUFFIX: &str = ".gz";
/// The suffix of a file being written (a leftover after a crash).
const TMP_SUFFIX: &str = ".tmp";

#[derive(Debug, thiserror::Error)]
pub enum LogRotationError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: io::Error },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LogRotationError + 'a {
    move |source| LogRotationError::Io { action, path: path.to_path_buf(), source }
}

/// `containerLogMaxSize` and `containerLogMaxFiles`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotatePolicy {
    pub max_size: u64,
    /// Files kept per container, the live one included (≥ 2).
    pub max_files: usize,
}

/// Rotates the logs of the runtime's running containers.
pub struct ContainerLogManager {
    cri: Cri,
    policy: LogRotatePolicy,
}

/// The name a log gets when rotated at `now` (`0.log.20261123-195034`).
pub fn rotated_name(log: &Path, now: Timestamp) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".");
    name.push(now.strftime("%Y%m%d-%H%M%S").to_string());
    PathBuf::from(name)
}

/// The rotated files of `log` (`<log>.*`), oldest first: their names end
/// in a sortable timestamp.
pub fn rotated_files(log: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(base)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{base}.");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Leftovers of an interrupted pass: temporary files, and plain files
/// whose compressed copy was finished. Returns what to remove and what stays.
pub fn unused_logs(logs: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let is_tmp = |p: &Path| p.to_string_lossy().ends_with(TMP_SUFFIX);
    let compressed = |p: &Path| {
        let mut gz = p.as_os_str().to_owned();
        gz.push(COMPRESS_SUFFIX);
        logs.iter().any(|l| l.as_os_str() == gz)
    };
    logs.iter().cloned().partition(|l| is_tmp(l) || compressed(l))
}

/// Of the rotated files (oldest first), the oldest to remove so that after
/// one more rotation at most `max_files` remain counting the live log.
pub fn excess_logs(logs: &[PathBuf], max_files: usize) -> usize {
    // The live log and the one about to be rotated take two places.
    let keep = max_files.saturating_sub(2);
    logs.len().saturating_sub(keep)
}

/// Gzips `path` into `path.gz` (through `path.gz.tmp`) and removes it.
pub fn compress_log(path: &Path) -> Result<(), LogRotationError> {
    let mut gz = path.as_os_str().to_owned();
    gz.push(COMPRESS_SUFFIX);
    let gz = PathBuf::from(gz);
    let mut tmp = gz.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let mut input = std::fs::File::open(path).map_err(io_err("open", path))?;
    let output = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
    let written = io::copy(&mut input, &mut encoder).and_then(|_| encoder.finish()).and_then(|f| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(LogRotationError::Io { action: "compress", path: path.to_path_buf(), source: e });
    }
    std::fs::rename(&tmp, &gz).map_err(io_err("rename", &tmp))?;
    std::fs::remove_file(path).map_err(io_err("remove", path))
}

/// Makes room for one more rotated file of `log`: cleans leftovers,
/// removes the oldest beyond the limit, compresses the rest.
fn prepare_rotation(log: &Path, max_files: usize) -> Result<(), LogRotationError> {
    let dir = log.parent().unwrap_or(Path::new("/"));
    let all = rotated_files(log).map_err(io_err("list", dir))?;
    let (unused, mut logs) = unused_logs(&all);
    for p in unused {
        std::fs::remove_file(&p).map_err(io_err("remove", &p))?;
    }
    let excess = excess_logs(&logs, max_files);
    for p in logs.drain(..excess) {
        std::fs::remove_file(&p).map_err(io_err("remove", &p))?;
    }
    for p in logs.iter().filter(|p| !p.to_string_lossy().ends_with(COMPRESS_SUFFIX)) {
        compress_log(p)?;
    }
    Ok(())
}

/// Removes a container's log and its rotated files (when the container goes).
pub fn remove_container_logs(log_path: &str) {
    if log_path.is_empty() {
        return;
    }
    let log = Path::new(log_path);
    let mut files = rotated_files(log).unwrap_or_default();
    files.push(log.to_path_buf());
    for f in files {
        if let Err(e) = std::fs::remove_file(&f) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::debug!(file = %f.display(), error = %e, "cannot remove a container log");
            }
        }
    }
}

impl ContainerLogManager {
    pub fn new(cri: Cri, policy: LogRotatePolicy) -> Self {
        ContainerLogManager { cri, policy }
    }

    /// Rotates logs every monitor period, for ever.
    pub async fn run(self) {
        loop {
            tokio::time::sleep(MONITOR_PERIOD).await;
            if let Err(e) = self.rotate_logs().await {
                tracing::warn!(error = %e, "container log rotation failed");
            }
        }
    }

    /// One pass over the running containers.
    pub async fn rotate_logs(&self) -> Result<(), LogRotationError> {
        let containers = self.cri.list_containers(Some(crate::agent::cri::running())).await?;
        for c in containers {
            let req = api::ContainerStatusRequest { container_id: c.id.clone(), verbose: false };
            let log_path = match self.cri.runtime().container_status(req).await {
                Ok(r) => r.into_inner().status.map(|s| s.log_path).unwrap_or_default(),
                Err(s) if s.code() == tonic::Code::NotFound => continue,
                Err(status) => return Err(CriError::Call { call: "ContainerStatus", status }.into()),
            };
            if log_path.is_empty() {
                continue;
            }
            let size = match std::fs::metadata(&log_path) {
                Ok(m) => m.len(),
                // Not there yet, or the runtime is reopening it.
                Err(_) => continue,
            };
            if size <= self.policy.max_size {
                continue;
            }
            if let Err(e) = self.rotate_log(&c.id, Path::new(&log_path)).await {
                tracing::warn!(container = %c.id, log = %log_path, error = %e, "cannot rotate container log");
            }
        }
        Ok(())
    }

    async fn rotate_log(&self, id: &str, log: &Path) -> Result<(), LogRotationError> {
        let max_files = self.policy.max_files;
        let owned = log.to_path_buf();
        tokio::task::spawn_blocking(move || prepare_rotation(&owned, max_files)).await.map_err(|e| {
            LogRotationError::Io { action: "rotate", path: log.to_path_buf(), source: io::Error::other(e) }
        })??;
        let rotated = rotated_name(log, Timestamp::now());
        if rotated.exists() {
            // Rotated this very second already; the next pass does it.
            return Ok(());
        }
        std::fs::rename(log, &rotated).map_err(io_err("rename", log))?;
        let req = api::ReopenContainerLogRequest { container_id: id.to_string() };
        if let Err(status) = self.cri.runtime().reopen_container_log(req).await {
            // Put the log back so the runtime keeps writing where readers look.
            if let Err(e) = std::fs::rename(&rotated, log) {
                tracing::warn!(log = %log.display(), error = %e, "cannot restore a log after a failed reopen");
            }
            return Err(CriError::Call { call: "ReopenContainerLog", status }.into());
        }
        tracing::debug!(container = %id, log = %rotated.display(), "container log rotated");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(|n| PathBuf::from(format!("/l/app/{n}"))).collect()
    }

    #[test]
    fn rotated_names_are_upstreams() {
        let t: Timestamp = "2026-11-23T19:50:34.5Z".parse().unwrap();
        assert_eq!(rotated_name(Path::new("/l/app/0.log"), t), Path::new("/l/app/0.log.20261123-195034"));
    }

    #[test]
    fn leftovers_are_found() {
        let logs = paths(&[
            "0.log.20261123-190000.gz",
            "0.log.20261123-190010",
            "0.log.20261123-190010.gz",
            "0.log.20261123-190020.gz.tmp",
            "0.log.20261123-190030",
        ]);
        let (unused, kept) = unused_logs(&logs);
        assert_eq!(unused, paths(&["0.log.20261123-190010", "0.log.20261123-190020.gz.tmp"]));
        assert_eq!(kept, paths(&["0.log.20261123-190000.gz", "0.log.20261123-190010.gz", "0.log.20261123-190030"]));
    }

    #[test]
    fn retention_counts_the_live_log() {
        let logs = paths(&["a", "b", "c", "d"]);
        // 5 files: live + 4 rotated after this rotation, so 3 old ones stay.
        assert_eq!(excess_logs(&logs, 5), 1);
        assert_eq!(excess_logs(&logs, 3), 3);
        assert_eq!(excess_logs(&logs, 2), 4);
        assert_eq!(excess_logs(&logs[..1], 5), 0);
    }

    #[test]
    fn a_rotation_keeps_at_most_max_files_gzipping_the_older() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let mut t: Timestamp = "2026-11-23T19:50:00Z".parse().unwrap();
        for round in 0..6 {
            std::fs::write(&log, format!("round {round}\n").repeat(100)).unwrap();
            prepare_rotation(&log, 3).unwrap();
            std::fs::rename(&log, rotated_name(&log, t)).unwrap();
            t = t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(10)).unwrap();
        }
        std::fs::write(&log, "live\n").unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["0.log", "0.log.20261123-195040.gz", "0.log.20261123-195050"]);
        let gz = std::fs::File::open(dir.path().join("0.log.20261123-195040.gz")).unwrap();
        let mut text = String::new();
        io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
        assert!(text.starts_with("round 4\n"));
        remove_container_logs(log.to_str().unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
