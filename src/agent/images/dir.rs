//! The node's `images/` folder: image tarballs there are imported when the
//! node starts and whenever one is written or moved in (inotify, no
//! polling); `*.txt` files there list image references to pull. A tarball
//! imported before and unchanged since (same size and mtime, or the same
//! SHA-256) is not imported again while its images are still present; a
//! small state file remembers what was imported.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::GetImageRequest;
use serde::{Deserialize, Serialize};

use super::import::import_file;
use super::reference::normalize;
use super::watch::{Change, DirWatch};
use super::ImageError;
use crate::agent::cri::{api, namespaced, Cri, CriError};

/// Why a pull failed, as the puller found it (a pull list records its
/// message beside the image).
pub type PullError = Box<dyn std::error::Error + Send + Sync>;

/// Pulls an image from its registry (the node's image manager provides
/// it, with registries.yaml's credentials).
#[async_trait::async_trait]
pub trait Puller: Send + Sync {
    /// Pulls `reference` (normalized); the error says why it failed.
    async fn pull(&self, reference: &str) -> Result<(), PullError>;
}

/// Names of files taken as image tarballs (their compression is read from
/// their first bytes, whatever the name says).
const TARBALL_SUFFIXES: [&str; 7] = [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst", ".oci"];
const LIST_SUFFIX: &str = ".txt";

/// What became of one file of the folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    Imported(Vec<String>),
    /// Imported before, unchanged since, its images still there.
    Unchanged,
    /// A pull list: what was pulled, what was there already, what failed (and why).
    Pulled {
        pulled: Vec<String>,
        present: Vec<String>,
        failed: Vec<(String, String)>,
    },
    /// Neither a tarball nor a pull list.
    Ignored,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Imported {
    size: u64,
    mtime_ns: i128,
    digest: String,
    images: Vec<String>,
}

pub struct ImagesDir {
    dir: PathBuf,
    state_file: PathBuf,
    cri: Cri,
    puller: Option<Arc<dyn Puller>>,
}

/// The folder being watched; dropping it stops the watch at once (even
/// mid-import: the import is then done again at the next start).
pub struct ImagesDirTask {
    handle: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ImagesDirTask {
    /// Stops the watch once the file being handled (if any) is done.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.handle).await;
    }
}

impl Drop for ImagesDirTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl ImagesDir {
    /// `dir` holds the tarballs and lists; `state_file` remembers imports.
    pub fn new(dir: PathBuf, state_file: PathBuf, cri: Cri, puller: Option<Arc<dyn Puller>>) -> ImagesDir {
        ImagesDir { dir, state_file, cri, puller }
    }

    /// `<agent-dir>/images`, with its state in `<agent-dir>/etc/imported-images.json`.
    pub fn for_agent(agent_dir: &Path, cri: Cri, puller: Option<Arc<dyn Puller>>) -> ImagesDir {
        ImagesDir::new(agent_dir.join("images"), agent_dir.join("etc").join("imported-images.json"), cri, puller)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Imports and pulls what the folder holds now, then watches it: the
    /// images present at start are ready when this returns.
    pub async fn start(self) -> Result<(ImagesDirTask, Vec<(PathBuf, Result<FileOutcome, ImageError>)>), ImageError> {
        let io = |source| ImageError::Io { path: self.dir.clone(), source };
        tokio::fs::create_dir_all(&self.dir).await.map_err(io)?;
        // Watching before the first look: a file landing meanwhile is not missed.
        let mut watch = DirWatch::new(&self.dir).map_err(io)?;
        let outcomes = self.scan().await;
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let handle = tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = watch.next() => next,
                    _ = &mut stopped => return,
                };
                let names = match next {
                    Ok(Change::Files(names)) => names,
                    Ok(Change::Rescan) => {
                        self.scan().await;
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(dir = %self.dir.display(), error = %e, "cannot watch the images folder any longer");
                        return;
                    }
                };
                for name in names {
                    let path = self.dir.join(&name);
                    let result = self.handle(&path).await;
                    log_outcome(&path, &result);
                }
            }
        });
        Ok((ImagesDirTask { handle, stop: Some(stop) }, outcomes))
    }

    /// Handles every file of the folder once, in name order.
    pub async fn scan(&self) -> Vec<(PathBuf, Result<FileOutcome, ImageError>)> {
        let mut paths = Vec::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => paths.extend(entries.filter_map(|e| e.ok()).map(|e| e.path())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the images folder"),
        }
        paths.sort();
        let mut out = Vec::new();
        for path in paths {
            let result = self.handle(&path).await;
            log_outcome(&path, &result);
            if !matches!(result, Ok(FileOutcome::Ignored)) {
                out.push((path, result));
            }
        }
        out
    }

    /// Imports, pulls or skips one file of the folder.
    pub async fn handle(&self, path: &Path) -> Result<FileOutcome, ImageError> {
        let name = path.file_name().and_then(OsStr::to_str).unwrap_or_default().to_string();
        if name.starts_with('.') || !path.is_file() {
            return Ok(FileOutcome::Ignored);
        }
        if name.ends_with(LIST_SUFFIX) {
            return self.pull_list(path).await;
        }
        if !TARBALL_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            return Ok(FileOutcome::Ignored);
        }
        self.import_tarball(path, &name).await
    }

    async fn import_tarball(&self, path: &Path, name: &str) -> Result<FileOutcome, ImageError> {
        let io = |source| ImageError::Io { path: path.to_path_buf(), source };
        let meta = tokio::fs::metadata(path).await.map_err(io)?;
        let (size, mtime_ns) = (meta.len(), mtime_ns(&meta));
        let mut state = self.load_state();
        if let Some(before) = state.get(name).cloned() {
            if self.all_present(&before.images).await {
                if before.size == size && before.mtime_ns == mtime_ns {
                    return Ok(FileOutcome::Unchanged);
                }
                if before.size == size && file_digest(path).await.map_err(io)? == before.digest {
                    state.insert(name.to_string(), Imported { mtime_ns, ..before });
                    self.save_state(&state);
                    return Ok(FileOutcome::Unchanged);
                }
            }
        }
        let images = import_file(&self.cri, path).await?;
        let digest = file_digest(path).await.map_err(io)?;
        let mut state = self.load_state();
        state.insert(name.to_string(), Imported { size, mtime_ns, digest, images: images.clone() });
        self.save_state(&state);
        Ok(FileOutcome::Imported(images))
    }

    async fn all_present(&self, images: &[String]) -> bool {
        for name in images {
            let req = namespaced(GetImageRequest { name: name.clone() });
            if ImagesClient::new(self.cri.channel()).get(req).await.is_err() {
                return false;
            }
        }
        !images.is_empty()
    }

    async fn pull_list(&self, path: &Path) -> Result<FileOutcome, ImageError> {
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|source| ImageError::Io { path: path.to_path_buf(), source })?;
        let (mut pulled, mut present, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        for (i, line) in text.lines().enumerate() {
            let reference = line.split('#').next().unwrap_or_default().trim();
            if reference.is_empty() {
                continue;
            }
            let reference = match normalize(reference) {
                Ok(r) => r,
                Err(e) => {
                    failed.push((reference.to_string(), format!("{}:{}: {e}", path.display(), i + 1)));
                    continue;
                }
            };
            match self.present(&reference).await {
                Ok(true) => {
                    present.push(reference);
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    failed.push((reference, e.to_string()));
                    continue;
                }
            }
            let Some(puller) = &self.puller else {
                failed.push((reference, "no puller: this node cannot pull images".into()));
                continue;
            };
            match puller.pull(&reference).await {
                Ok(()) => pulled.push(reference),
                Err(e) => failed.push((reference, e.to_string())),
            }
        }
        Ok(FileOutcome::Pulled { pulled, present, failed })
    }

    async fn present(&self, reference: &str) -> Result<bool, CriError> {
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: reference.to_string(), ..Default::default() }),
            verbose: false,
        };
        Ok(self
            .cri
            .images()
            .image_status(req)
            .await
            .map_err(CriError::call("ImageStatus"))?
            .into_inner()
            .image
            .is_some())
    }

    fn load_state(&self) -> BTreeMap<String, Imported> {
        std::fs::read(&self.state_file).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn save_state(&self, state: &BTreeMap<String, Imported>) {
        let result = serde_json::to_vec_pretty(state).map_err(std::io::Error::other).and_then(|bytes| {
            if let Some(parent) = self.state_file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            crate::agent::containerd::write_atomic(&self.state_file, &bytes)
        });
        if let Err(e) = result {
            tracing::warn!(file = %self.state_file.display(), error = %e, "cannot save which images were imported");
        }
    }
}

fn log_outcome(path: &Path, result: &Result<FileOutcome, ImageError>) {
    match result {
        Ok(FileOutcome::Imported(images)) => tracing::info!(file = %path.display(), ?images, "imported"),
        Ok(FileOutcome::Unchanged) => tracing::debug!(file = %path.display(), "already imported"),
        Ok(FileOutcome::Pulled { pulled, failed, .. }) => {
            if !pulled.is_empty() {
                tracing::info!(file = %path.display(), ?pulled, "pulled");
            }
            for (image, why) in failed {
                tracing::warn!(file = %path.display(), image, error = %why, "cannot pull");
            }
        }
        Ok(FileOutcome::Ignored) => {}
        Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot import"),
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    use std::os::unix::fs::MetadataExt;
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

async fn file_digest(path: &Path) -> std::io::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use sha2::{Digest, Sha256};
        let mut file = std::fs::File::open(&path)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)?;
        Ok(format!("sha256:{}", super::oci::hex(&hasher.finalize())))
    })
    .await
    .map_err(std::io::Error::other)?
}
