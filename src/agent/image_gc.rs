//! Image garbage collection (upstream's image_gc_manager): every 5 minutes,
//! and when the eviction manager sees disk pressure, the image filesystem
//! (containerd's root) is measured; above `imageGCHighThresholdPercent`
//! unused images are removed, least recently used first, until usage is
//! back under `imageGCLowThresholdPercent`. Never removed: images any
//! container uses (running or not), images imported from tarballs, the
//! sandbox image, images the runtime pins, and images first seen less than
//! `imageMinimumGCAge` ago. First-seen and last-used times live in memory.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use super::cri::{api, Cri, CriError};
use super::events::Events;
use crate::client::events::EventType;
use crate::sync::LockExt;

/// How often usage is checked (upstream's ImageGCPeriod).
pub const GC_PERIOD: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("invalid capacity 0 on image filesystem")]
    NoCapacity,
    #[error("cannot stat the image filesystem {0}")]
    Stat(PathBuf),
    #[error("cannot tell which images the node imported: {0}")]
    Protected(String),
    #[error("failed to remove image {id:?}: {message}")]
    Remove { id: String, message: String },
}

/// `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`, `imageMinimumGCAge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    pub high_threshold_percent: u8,
    pub low_threshold_percent: u8,
    pub min_age: Duration,
}

/// What is remembered of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRecord {
    pub first_detected: Instant,
    pub last_used: Instant,
    pub size: u64,
}

/// How many bytes to free, from the file system's size and free space;
/// zero while usage is under the high threshold (upstream's arithmetic).
pub fn bytes_to_free(policy: &ImageGcPolicy, capacity: u64, available: u64) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let usage_percent = 100 - (available.min(capacity) * 100 / capacity);
    if usage_percent < u64::from(policy.high_threshold_percent) {
        return 0;
    }
    (capacity * (100 - u64::from(policy.low_threshold_percent)) / 100).saturating_sub(available)
}

/// The images to remove to free `wanted` bytes, in eviction order (least
/// recently used, then oldest): unused, not kept, old enough.
pub fn images_to_remove(
    records: &HashMap<String, ImageRecord>,
    in_use: &HashSet<String>,
    kept: &dyn Fn(&str) -> bool,
    now: Instant,
    min_age: Duration,
    wanted: u64,
) -> Vec<(String, u64)> {
    let mut candidates: Vec<(&String, &ImageRecord)> = records
        .iter()
        .filter(|(id, _)| !in_use.contains(*id) && !kept(id))
        .filter(|(_, r)| now.saturating_duration_since(r.first_detected) >= min_age)
        .collect();
    candidates.sort_by(|a, b| (a.1.last_used, a.1.first_detected, a.0).cmp(&(b.1.last_used, b.1.first_detected, b.0)));
    let mut out = Vec::new();
    let mut freed = 0u64;
    for (id, r) in candidates {
        if freed >= wanted {
            break;
        }
        out.push((id.clone(), r.size));
        freed += r.size;
    }
    out
}

/// Upstream's image GC manager, over the runtime's image service.
pub struct ImageGcManager {
    cri: Cri,
    events: Events,
    policy: ImageGcPolicy,
    /// containerd's root: the image filesystem.
    image_fs: PathBuf,
    sandbox_image: String,
    node_ref: ObjectReference,
    records: Mutex<HashMap<String, ImageRecord>>,
}

impl ImageGcManager {
    pub fn new(
        cri: Cri,
        events: Events,
        node_name: &str,
        policy: ImageGcPolicy,
        image_fs: PathBuf,
        sandbox_image: String,
    ) -> Arc<Self> {
        let node = node_name.to_string();
        let node_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.clone()),
            uid: Some(node),
            ..Default::default()
        };
        Arc::new(ImageGcManager {
            cri,
            events,
            policy,
            image_fs,
            sandbox_image,
            node_ref,
            records: Mutex::new(HashMap::new()),
        })
    }

    fn node_event(&self, kind: EventType, reason: &str, message: &str) {
        self.events.recorder().publish_ref(self.node_ref.clone(), kind, reason, message);
    }

    /// Collects every GC period; `ImageGCFailed` after two failures in a row, as upstream.
    pub async fn run(self: Arc<Self>) {
        let mut failed_before = false;
        loop {
            tokio::time::sleep(GC_PERIOD).await;
            match self.garbage_collect().await {
                Ok(()) => failed_before = false,
                Err(e) => {
                    if failed_before {
                        self.node_event(EventType::Warning, "ImageGCFailed", &e.to_string());
                    } else {
                        tracing::warn!(error = %e, "image garbage collection failed");
                    }
                    failed_before = true;
                }
            }
        }
    }

    /// Frees space when the image filesystem is over the high threshold.
    pub async fn garbage_collect(&self) -> Result<(), ImageGcError> {
        let fs = crate::host::fs_stats(&self.image_fs).ok_or_else(|| ImageGcError::Stat(self.image_fs.clone()))?;
        if fs.capacity == 0 {
            return Err(ImageGcError::NoCapacity);
        }
        // Images are detected every pass, so first-seen times are known
        // well before space runs out.
        let in_use = self.detect_images(Instant::now()).await?;
        let wanted = bytes_to_free(&self.policy, fs.capacity, fs.available);
        if wanted == 0 {
            return Ok(());
        }
        let usage = 100 - fs.available * 100 / fs.capacity;
        tracing::info!(
            usage_percent = usage,
            high = self.policy.high_threshold_percent,
            bytes = wanted,
            "image filesystem over the high threshold; removing unused images"
        );
        let freed = self.free_space(wanted, &in_use, Instant::now()).await?;
        if freed < wanted {
            let msg = format!(
                "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
            );
            self.node_event(EventType::Warning, "FreeDiskSpaceFailed", &msg);
            return Err(ImageGcError::Remove { id: String::new(), message: msg });
        }
        Ok(())
    }

    /// Removes every unused image old enough (the eviction manager's reclaim); returns bytes freed.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        let in_use = self.detect_images(Instant::now()).await?;
        self.free_space(u64::MAX, &in_use, Instant::now()).await
    }

    /// Refreshes the records from the runtime; returns the image ids in use.
    async fn detect_images(&self, now: Instant) -> Result<HashSet<String>, ImageGcError> {
        let cri = &self.cri;
        let images = cri.list_images().await?;
        let containers = cri.list_containers(None).await?;
        let mut in_use: HashSet<String> = HashSet::new();
        for c in &containers {
            for id in [&c.image_ref, &c.image_id] {
                if !id.is_empty() {
                    in_use.insert(id.clone());
                }
            }
            // Some runtimes report the reference the container was made from.
            if let Some(spec) = c.image.as_ref().filter(|s| !s.image.is_empty()) {
                if let Some(img) = images.iter().find(|i| i.id == spec.image || i.repo_tags.contains(&spec.image)) {
                    in_use.insert(img.id.clone());
                }
            }
        }
        let mut records = self.records.locked();
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| present.contains(id.as_str()));
        for img in &images {
            let r = records.entry(img.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: now,
                size: img.size,
            });
            r.size = img.size;
            if in_use.contains(&img.id) {
                r.last_used = now;
            }
        }
        Ok(in_use)
    }

    /// Image ids never collected: the sandbox image, images pinned by the
    /// runtime, and images with a name the node imported (`images::protected_refs`).
    /// When that cannot be known, nothing is collected.
    async fn kept_ids(&self) -> Result<HashSet<String>, ImageGcError> {
        let cri = &self.cri;
        let mut out = HashSet::new();
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: self.sandbox_image.clone(), ..Default::default() }),
            verbose: false,
        };
        if let Ok(Some(img)) = cri.images().image_status(req).await.map(|r| r.into_inner().image) {
            out.insert(img.id);
        }
        let protected = super::images::protected_refs(cri).await.map_err(|e| ImageGcError::Protected(e.to_string()))?;
        let images = cri.list_images().await?;
        for i in images {
            if i.pinned || i.repo_tags.iter().any(|t| protected.contains(t)) {
                out.insert(i.id);
            }
        }
        Ok(out)
    }

    async fn free_space(&self, wanted: u64, in_use: &HashSet<String>, now: Instant) -> Result<u64, ImageGcError> {
        let kept_ids = self.kept_ids().await?;
        let kept = |id: &str| kept_ids.contains(id);
        let chosen = {
            let records = self.records.locked();
            images_to_remove(&records, in_use, &kept, now, self.policy.min_age, wanted)
        };
        let mut freed = 0u64;
        let mut errors = Vec::new();
        for (id, size) in chosen {
            tracing::info!(image = %id, size, "removing an unused image");
            let req =
                api::RemoveImageRequest { image: Some(api::ImageSpec { image: id.clone(), ..Default::default() }) };
            match self.cri.images().remove_image(req).await {
                Ok(_) => {
                    self.records.locked().remove(&id);
                    freed += size;
                }
                Err(s) => errors.push(ImageGcError::Remove { id, message: s.message().to_string() }),
            }
        }
        match errors.into_iter().next() {
            Some(e) if freed < wanted => Err(e),
            _ => Ok(freed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: ImageGcPolicy =
        ImageGcPolicy { high_threshold_percent: 85, low_threshold_percent: 80, min_age: Duration::from_secs(120) };

    #[test]
    fn space_to_free_follows_the_thresholds() {
        assert_eq!(bytes_to_free(&POLICY, 1000, 200), 0); // 80 % used
        assert_eq!(bytes_to_free(&POLICY, 1000, 160), 0); // 84 %
        assert_eq!(bytes_to_free(&POLICY, 1000, 151), 49); // 84.9 % counts as 85 % (integer percent, as upstream)
        assert_eq!(bytes_to_free(&POLICY, 1000, 150), 50); // 85 %: down to 80 %
        assert_eq!(bytes_to_free(&POLICY, 1000, 0), 200);
        assert_eq!(bytes_to_free(&POLICY, 0, 0), 0);
    }

    #[test]
    fn unused_old_images_go_least_recently_used_first() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(1000);
        let rec = |first: u64, used: u64, size: u64| ImageRecord {
            first_detected: t0 + Duration::from_secs(first),
            last_used: t0 + Duration::from_secs(used),
            size,
        };
        let records = HashMap::from([
            ("used".to_string(), rec(0, 0, 100)),
            ("pause".to_string(), rec(0, 0, 100)),
            ("young".to_string(), rec(950, 950, 100)),
            ("lru".to_string(), rec(0, 10, 30)),
            ("mru".to_string(), rec(0, 500, 40)),
            ("mid".to_string(), rec(0, 200, 50)),
        ]);
        let in_use = HashSet::from(["used".to_string()]);
        let kept = |id: &str| id == "pause";
        let ids = |v: Vec<(String, u64)>| v.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(ids(images_to_remove(&records, &in_use, &kept, now, POLICY.min_age, 60)), ["lru", "mid"]);
        assert_eq!(
            ids(images_to_remove(&records, &in_use, &kept, now, POLICY.min_age, u64::MAX)),
            ["lru", "mid", "mru"]
        );
        assert!(images_to_remove(&records, &in_use, &kept, now, POLICY.min_age, 0).is_empty());
    }
}
