//! Importing an image tarball into containerd (`k8s.io` namespace), as
//! `ctr images import` does: an OCI image layout (`index.json`, `blobs/`)
//! or a `docker save` archive (`manifest.json`), plain, gzip or zstd.
//!
//! The archive is read once, front to back: every file goes into the
//! content store as it streams past (with its expected digest when its
//! path names one), small JSON documents are also kept in memory. Then the
//! documents are read: GC labels go on indexes and manifests, a docker
//! archive gets an OCI manifest written for it, the host platform's layers
//! are unpacked into the snapshotter, and the image records are created.
//! All of it happens under one lease, dropped at the end, so a failed
//! import leaves no image and its content is garbage-collected.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use containerd_client::services::v1 as ctrd;

use super::archive::{self, Event};
use super::content::{Session, Writer, MAX_DOCUMENT};
use super::oci::{self, Descriptor, DockerArchiveEntry, ImageConfig, Index, Manifest};
use super::reference::normalize;
use super::{ImageError, LABEL_IMPORTED, LABEL_PINNED};
use crate::agent::cri::{api, Cri};

/// How an import names and marks its images.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Names an index entry that carries only a tag
    /// (`org.opencontainers.image.ref.name: 1.0`) as `<base_name>:<tag>`,
    /// as `ctr images import --base-name` does.
    pub base_name: Option<String>,
    /// More labels for the image records.
    pub labels: BTreeMap<String, String>,
    /// Leave the layers packed (CRI unpacks them at first use).
    pub no_unpack: bool,
}

/// Imports the tarball at `path`; returns the image names it created.
pub async fn import_file(cri: &Cri, path: &Path) -> Result<Vec<String>, ImageError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|source| ImageError::Io { path: path.to_path_buf(), source })?
        .into_std()
        .await;
    import_with(cri, &path.display().to_string(), file, &ImportOptions::default()).await
}

/// Imports a tarball read from `reader`; `source_name` names it in errors.
pub async fn import_reader<R: Read + Send + 'static>(
    cri: &Cri,
    source_name: &str,
    reader: R,
) -> Result<Vec<String>, ImageError> {
    import_with(cri, source_name, reader, &ImportOptions::default()).await
}

/// [`import_reader`] with options.
pub async fn import_with<R: Read + Send + 'static>(
    cri: &Cri,
    source_name: &str,
    reader: R,
    options: &ImportOptions,
) -> Result<Vec<String>, ImageError> {
    let started = std::time::Instant::now();
    let session = Session::begin(cri).await?;
    let result = import_in(&session, source_name, reader, options).await;
    // Dropping the lease leaves the content to the image records (or, on
    // failure, to the garbage collector).
    session.end().await;
    let names = result?;
    wait_for_cri(cri, &names).await;
    tracing::info!(source = source_name, images = ?names, elapsed = ?started.elapsed(), "images imported");
    Ok(names)
}

/// A file of the archive, in the content store.
#[derive(Debug, Clone)]
struct Blob {
    digest: String,
    size: u64,
    /// The first bytes, to tell a layer's compression.
    head: Vec<u8>,
}

/// What one pass over the archive found.
#[derive(Default)]
struct Contents {
    files: HashMap<String, Blob>,
    /// Small JSON files, by archive path and by digest.
    documents: HashMap<String, Vec<u8>>,
    by_digest: HashMap<String, Blob>,
}

/// Files of the layout itself, never content.
fn is_layout_file(path: &str) -> bool {
    matches!(path, "index.json" | "manifest.json" | "oci-layout" | "repositories")
}

/// `blobs/sha256/<hex>` names its digest.
fn digest_from_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix("blobs/")?;
    let (alg, hex) = rest.split_once('/')?;
    let digest = format!("{alg}:{hex}");
    super::reference::validate_digest(&digest).ok().map(|_| digest)
}

struct Current {
    path: String,
    size: u64,
    expected: Option<String>,
    writer: Option<Writer>,
    head: Vec<u8>,
    /// Kept in memory while it may be a JSON document.
    memory: Option<Vec<u8>>,
}

async fn read_contents<R: Read + Send + 'static>(
    session: &Session,
    source_name: &str,
    reader: R,
) -> Result<Contents, ImageError> {
    let mut rx = archive::spawn_reader(reader);
    let mut contents = Contents::default();
    let mut links = Vec::new();
    let mut current: Option<Current> = None;
    let result: Result<(), ImageError> = async {
        while let Some(event) = rx.recv().await {
            match event.map_err(|source| ImageError::Unreadable { source_name: source_name.to_string(), source })? {
                Event::File { path, size } => {
                    let layout = is_layout_file(&path);
                    let expected = digest_from_path(&path);
                    let writer = if layout { None } else { Some(session.writer(expected.as_deref(), size).await?) };
                    let memory = (size as usize <= MAX_DOCUMENT).then(Vec::new);
                    current = Some(Current { path, size, expected, writer, head: Vec::new(), memory });
                }
                Event::Data(data) => {
                    let Some(c) = current.as_mut() else { continue };
                    if c.head.len() < 8 {
                        let take = (8 - c.head.len()).min(data.len());
                        c.head.extend_from_slice(&data[..take]);
                    }
                    if let Some(m) = c.memory.as_mut() {
                        let json =
                            is_layout_file(&c.path) || c.head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
                        if json {
                            m.extend_from_slice(&data);
                        } else {
                            c.memory = None;
                        }
                    }
                    if let Some(w) = c.writer.as_mut() {
                        w.write(&data).await?;
                    }
                }
                Event::End { digest } => {
                    let Some(mut c) = current.take() else { continue };
                    if let Some(expected) = &c.expected {
                        if *expected != digest {
                            if let Some(w) = c.writer.take() {
                                w.abort().await;
                            }
                            return Err(ImageError::DigestMismatch {
                                source_name: source_name.to_string(),
                                path: c.path,
                                expected: expected.clone(),
                                actual: digest,
                            });
                        }
                    }
                    if let Some(w) = c.writer.take() {
                        w.commit(c.size, &digest).await?;
                    }
                    let blob = Blob { digest: digest.clone(), size: c.size, head: c.head };
                    if let Some(m) = c.memory {
                        if !is_layout_file(&c.path) {
                            contents.documents.insert(digest.clone(), m.clone());
                        }
                        contents.documents.insert(c.path.clone(), m);
                    }
                    contents.by_digest.insert(digest, blob.clone());
                    contents.files.insert(c.path, blob);
                }
                Event::Link { path, target } => links.push((path, target)),
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        if let Some(w) = current.and_then(|c| c.writer) {
            w.abort().await;
        }
        return Err(e);
    }
    // Links (docker save shares a layer between images with symlinks),
    // followed a few times for links to links.
    for _ in 0..8 {
        for (path, target) in &links {
            if let Some(b) = contents.files.get(target).cloned() {
                contents.files.entry(path.clone()).or_insert(b);
            }
        }
    }
    Ok(contents)
}

async fn import_in<R: Read + Send + 'static>(
    session: &Session,
    source_name: &str,
    reader: R,
    options: &ImportOptions,
) -> Result<Vec<String>, ImageError> {
    let contents = read_contents(session, source_name, reader).await?;
    let mut ctx = Ctx { session, source_name, contents, host: oci::host_platform(), unpack: !options.no_unpack };
    let mut images: Vec<(String, Descriptor)> = Vec::new();
    if let Some(index) = ctx.contents.documents.get("index.json").cloned() {
        images = ctx.oci_layout(&index, options).await?;
    }
    if images.is_empty() {
        if let Some(manifest) = ctx.contents.documents.get("manifest.json").cloned() {
            images = ctx.docker_archive(&manifest).await?;
        } else if !ctx.contents.documents.contains_key("index.json") {
            return Err(ImageError::archive(
                source_name,
                "not an image archive: neither index.json (OCI image layout) nor manifest.json (docker save) is in it",
            ));
        }
    }
    if images.is_empty() {
        return Err(ImageError::NoImageName { source_name: source_name.to_string() });
    }
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        (LABEL_PINNED.to_string(), "pinned".to_string()),
        (LABEL_IMPORTED.to_string(), "true".to_string()),
        ("io.cri-containerd.image".to_string(), "managed".to_string()),
    ]);
    labels.extend(options.labels.clone());
    let mut names = Vec::new();
    for (name, target) in images {
        let image = ctrd::Image {
            name: name.clone(),
            labels: labels.clone().into_iter().collect(),
            target: Some(containerd_client::types::Descriptor {
                media_type: target.media_type.clone(),
                digest: target.digest.clone(),
                size: target.size,
                annotations: Default::default(),
            }),
            created_at: None,
            updated_at: None,
        };
        session.put_image(image).await?;
        names.push(name);
    }
    Ok(names)
}

struct Ctx<'a> {
    session: &'a Session,
    source_name: &'a str,
    contents: Contents,
    host: oci::Platform,
    unpack: bool,
}

impl Ctx<'_> {
    fn archive_error(&self, message: impl Into<String>) -> ImageError {
        ImageError::archive(self.source_name, message)
    }

    fn missing(&self, what: impl Into<String>, digest: &str) -> ImageError {
        ImageError::MissingBlob {
            source_name: self.source_name.to_string(),
            what: what.into(),
            digest: digest.to_string(),
        }
    }

    /// Whether the blob is in the archive or already in containerd.
    async fn available(&self, digest: &str) -> Result<bool, ImageError> {
        Ok(self.contents.by_digest.contains_key(digest) || self.session.exists(digest).await?)
    }

    async fn document(&self, what: &str, digest: &str) -> Result<Vec<u8>, ImageError> {
        if let Some(d) = self.contents.documents.get(digest) {
            return Ok(d.clone());
        }
        if self.session.exists(digest).await? {
            return self.session.read(digest).await;
        }
        Err(self.missing(what, digest))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, what: &str, bytes: &[u8]) -> Result<T, ImageError> {
        serde_json::from_slice(bytes)
            .map_err(|e| self.archive_error(format!("{what} is not valid JSON for its kind: {e}")))
    }

    /// index.json: the named entries, each prepared; several entries of one
    /// name are one image per platform, of which the host's is taken.
    async fn oci_layout(
        &mut self,
        index: &[u8],
        options: &ImportOptions,
    ) -> Result<Vec<(String, Descriptor)>, ImageError> {
        let index: Index = self.parse("index.json", index)?;
        let mut by_name: BTreeMap<String, Vec<Descriptor>> = BTreeMap::new();
        for d in &index.manifests {
            if let Some(name) = image_name(&d.annotations, options.base_name.as_deref())? {
                by_name.entry(name).or_default().push(d.clone());
            }
        }
        let mut out = Vec::new();
        let mut prepared = std::collections::HashSet::new();
        for (name, candidates) in by_name {
            let target = if candidates.len() == 1 {
                candidates[0].clone()
            } else {
                candidates
                    .iter()
                    .find(|d| d.platform.as_ref().is_some_and(|p| p.runs_on(&self.host)))
                    .cloned()
                    .ok_or_else(|| ImageError::NoMatchingPlatform {
                        source_name: self.source_name.to_string(),
                        platform: self.host.to_string(),
                    })?
            };
            if prepared.insert(target.digest.clone()) {
                self.prepare(&name, &target).await?;
            }
            out.push((name, target));
        }
        Ok(out)
    }

    /// Labels the tree under `target` and unpacks the host's manifest.
    async fn prepare(&self, name: &str, target: &Descriptor) -> Result<(), ImageError> {
        let manifest = self.walk(name, target, 0).await?.ok_or_else(|| ImageError::NoMatchingPlatform {
            source_name: self.source_name.to_string(),
            platform: self.host.to_string(),
        })?;
        self.check_and_unpack(name, &manifest).await
    }

    /// Sets GC labels on every index and manifest present under `desc`;
    /// returns the manifest for the host platform.
    async fn walk(&self, name: &str, desc: &Descriptor, depth: usize) -> Result<Option<Manifest>, ImageError> {
        if depth > 4 {
            return Err(self.archive_error(format!("{name}: indexes nested too deep")));
        }
        let bytes = self.document(&format!("the manifest of {name}"), &desc.digest).await?;
        let media_type = if desc.media_type.is_empty() {
            oci::sniff_media_type(&bytes).unwrap_or_default()
        } else {
            desc.media_type.clone()
        };
        if oci::is_index(&media_type) {
            let index: Index = self.parse(&format!("index {}", desc.digest), &bytes)?;
            let labels = gc_labels(&index.manifests);
            self.session.set_labels(&desc.digest, &labels).await?;
            let mut chosen = None;
            for child in &index.manifests {
                if !self.available(&child.digest).await? {
                    continue;
                }
                let runs = child.platform.as_ref().is_none_or(|p| p.runs_on(&self.host));
                let found = Box::pin(self.walk(name, child, depth + 1)).await?;
                if chosen.is_none() && runs {
                    chosen = found;
                }
            }
            Ok(chosen)
        } else if oci::is_manifest(&media_type) {
            let manifest: Manifest = self.parse(&format!("manifest {}", desc.digest), &bytes)?;
            let mut labels = BTreeMap::new();
            labels.insert(oci::child_gc_label(&manifest.config, 0), manifest.config.digest.clone());
            for (i, l) in manifest.layers.iter().enumerate() {
                labels.insert(oci::child_gc_label(l, i), l.digest.clone());
            }
            self.session.set_labels(&desc.digest, &labels).await?;
            Ok(Some(manifest))
        } else {
            Err(self.archive_error(format!(
                "{name}: {} has media type {media_type:?}, not an image index or manifest",
                desc.digest
            )))
        }
    }

    /// Checks that the manifest's blobs are all there, then unpacks it.
    async fn check_and_unpack(&self, name: &str, manifest: &Manifest) -> Result<(), ImageError> {
        for (i, layer) in manifest.layers.iter().enumerate() {
            if !self.available(&layer.digest).await? {
                return Err(self.missing(format!("layer {} of {name}", i + 1), &layer.digest));
            }
        }
        let config_bytes = self.document(&format!("the config of {name}"), &manifest.config.digest).await?;
        let config: ImageConfig = self.parse(&format!("the config of {name}"), &config_bytes)?;
        let platform = oci::Platform {
            architecture: config.architecture.clone(),
            os: config.os.clone(),
            variant: config.variant.clone(),
        };
        if !config.architecture.is_empty() && !platform.runs_on(&self.host) {
            tracing::warn!(image = name, platform = %platform, host = %self.host, "imported an image for another platform");
        }
        if self.unpack {
            super::unpack::unpack(
                self.session,
                self.source_name,
                &manifest.config.digest,
                &manifest.layers,
                &config.rootfs.diff_ids,
            )
            .await?;
        }
        Ok(())
    }

    /// manifest.json of `docker save`: one OCI manifest written per entry.
    async fn docker_archive(&mut self, manifest_json: &[u8]) -> Result<Vec<(String, Descriptor)>, ImageError> {
        let entries: Vec<DockerArchiveEntry> = self.parse("manifest.json", manifest_json)?;
        let mut out = Vec::new();
        for entry in entries {
            let config_path = archive::clean_path(&entry.config);
            let config = self.contents.files.get(&config_path).cloned().ok_or_else(|| {
                self.archive_error(format!("{config_path}, named in manifest.json, is not in the archive"))
            })?;
            let mut layers = Vec::new();
            for (i, path) in entry.layers.iter().enumerate() {
                let path = archive::clean_path(path);
                let blob = self.contents.files.get(&path).ok_or_else(|| {
                    self.archive_error(format!("{path} (layer {} in manifest.json) is not in the archive", i + 1))
                })?;
                layers.push(Descriptor {
                    media_type: oci::layer_media_type(&blob.head).to_string(),
                    digest: blob.digest.clone(),
                    size: blob.size as i64,
                    ..Default::default()
                });
            }
            let manifest = Manifest {
                schema_version: 2,
                media_type: oci::MEDIA_OCI_MANIFEST.into(),
                config: Descriptor {
                    media_type: oci::MEDIA_OCI_CONFIG.into(),
                    digest: config.digest.clone(),
                    size: config.size as i64,
                    ..Default::default()
                },
                layers,
                annotations: BTreeMap::new(),
            };
            let bytes = serde_json::to_vec(&manifest)
                .map_err(|e| self.archive_error(format!("cannot encode a manifest: {e}")))?;
            let digest = self.session.write_blob(&bytes).await?;
            let target = Descriptor {
                media_type: oci::MEDIA_OCI_MANIFEST.into(),
                digest,
                size: bytes.len() as i64,
                ..Default::default()
            };
            self.contents.documents.insert(target.digest.clone(), bytes);
            let tags = entry.repo_tags.unwrap_or_default();
            let first = tags.first().cloned().unwrap_or_else(|| config.digest.clone());
            if let Some(m) = self.walk(&first, &target, 0).await? {
                self.check_and_unpack(&first, &m).await?;
            }
            for tag in tags {
                out.push((normalize(&tag)?, target.clone()));
            }
        }
        Ok(out)
    }
}

/// GC labels of an index on its children (`containerd.io/gc.ref.content.m.<i>`).
fn gc_labels(children: &[Descriptor]) -> BTreeMap<String, String> {
    children.iter().enumerate().map(|(i, c)| (oci::child_gc_label(c, i), c.digest.clone())).collect()
}

/// The name of an index.json entry, as `ctr images import` reads it:
/// `io.containerd.image.name`, else `org.opencontainers.image.ref.name`
/// when it is a full reference, or a tag joined to the base name.
pub fn image_name(
    annotations: &BTreeMap<String, String>,
    base_name: Option<&str>,
) -> Result<Option<String>, ImageError> {
    if let Some(name) = annotations.get(oci::ANNOTATION_IMAGE_NAME).filter(|n| !n.is_empty()) {
        return normalize(name).map(Some);
    }
    let Some(r) = annotations.get(oci::ANNOTATION_REF_NAME).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    if r.contains(['/', ':', '@']) {
        return normalize(r).map(Some);
    }
    match base_name {
        Some(base) => normalize(&format!("{base}:{r}")).map(Some),
        None => Ok(None),
    }
}

/// containerd's CRI learns of new images from events; wait (briefly) until
/// it has seen each, so a CRI call right after the import finds it.
async fn wait_for_cri(cri: &Cri, names: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for name in names {
        loop {
            let req = api::ImageStatusRequest {
                image: Some(api::ImageSpec { image: name.clone(), ..Default::default() }),
                verbose: false,
            };
            match cri.images().image_status(req).await {
                Ok(r) if r.get_ref().image.is_some() => break,
                Ok(_) | Err(_) if tokio::time::Instant::now() > deadline => {
                    tracing::warn!(image = %name, "containerd's CRI has not seen the imported image yet");
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn names_come_from_annotations_as_ctr_reads_them() {
        let n = |a: &[(&str, &str)], base| image_name(&ann(a), base).unwrap();
        assert_eq!(
            n(&[(oci::ANNOTATION_IMAGE_NAME, "busybox:1")], None).as_deref(),
            Some("docker.io/library/busybox:1")
        );
        assert_eq!(
            n(&[(oci::ANNOTATION_IMAGE_NAME, "ferrok.local/pause:1"), (oci::ANNOTATION_REF_NAME, "x")], None)
                .as_deref(),
            Some("ferrok.local/pause:1")
        );
        assert_eq!(n(&[(oci::ANNOTATION_REF_NAME, "ghcr.io/a/b:2")], None).as_deref(), Some("ghcr.io/a/b:2"));
        assert_eq!(n(&[(oci::ANNOTATION_REF_NAME, "2")], None), None);
        assert_eq!(n(&[(oci::ANNOTATION_REF_NAME, "2")], Some("ghcr.io/a/b")).as_deref(), Some("ghcr.io/a/b:2"));
        assert_eq!(n(&[], None), None);
        assert!(image_name(&ann(&[(oci::ANNOTATION_IMAGE_NAME, "Bad Name")]), None).is_err());
    }

    #[test]
    fn blob_paths_name_digests() {
        let hex = "a".repeat(64);
        assert_eq!(digest_from_path(&format!("blobs/sha256/{hex}")), Some(format!("sha256:{hex}")));
        assert_eq!(digest_from_path("blobs/sha256/short"), None);
        assert_eq!(digest_from_path("abc/layer.tar"), None);
    }
}
