//! The OCI image-spec and Docker documents an import reads and writes:
//! descriptors, indexes, manifests, the parts of an image config that
//! matter here, and docker-archive's `manifest.json`; media types; the
//! host platform.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MEDIA_DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// containerd's annotation naming the image an index entry is.
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation naming a reference (often only the tag).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// containerd's garbage collector follows these labels from a blob to the
/// blobs and snapshots it needs.
pub const GC_REF_CONTENT: &str = "containerd.io/gc.ref.content";
pub const GC_REF_SNAPSHOT: &str = "containerd.io/gc.ref.snapshot";
/// The uncompressed digest (diff ID) of a layer blob, as containerd's unpacker records it.
pub const LABEL_UNCOMPRESSED: &str = "containerd.io/uncompressed";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub media_type: String,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub media_type: String,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What an import needs from an image config: the platform and the diff IDs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: String,
    #[serde(default)]
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// One entry of docker-archive's `manifest.json` (`docker save`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerArchiveEntry {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    #[serde(default)]
    pub layers: Vec<String>,
}

pub fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_MANIFEST_LIST
}

pub fn is_manifest(media_type: &str) -> bool {
    media_type == MEDIA_OCI_MANIFEST || media_type == MEDIA_DOCKER_MANIFEST
}

/// A document's own media type, from its descriptor or, failing that, its
/// `mediaType` field or shape (an OCI index may leave both out).
pub fn sniff_media_type(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: String,
        manifests: Option<serde_json::Value>,
        config: Option<serde_json::Value>,
    }
    let p: Probe = serde_json::from_slice(bytes).ok()?;
    if !p.media_type.is_empty() {
        return Some(p.media_type);
    }
    if p.manifests.is_some() {
        return Some(MEDIA_OCI_INDEX.into());
    }
    if p.config.is_some() {
        return Some(MEDIA_OCI_MANIFEST.into());
    }
    None
}

/// The layer media type for a blob starting with `head`: gzip and zstd by
/// their magic bytes, a plain tar otherwise.
pub fn layer_media_type(head: &[u8]) -> &'static str {
    match super::archive::Compression::detect(head) {
        super::archive::Compression::Gzip => MEDIA_OCI_LAYER_GZIP,
        super::archive::Compression::Zstd => MEDIA_OCI_LAYER_ZSTD,
        super::archive::Compression::None => MEDIA_OCI_LAYER,
    }
}

/// The GC label prefix for a child of an index or manifest, as containerd's
/// `images.ChildGCLabels` names them (`m.` manifests, `config`, `l.` layers).
pub fn child_gc_label(child: &Descriptor, index: usize) -> String {
    let mt = child.media_type.as_str();
    if mt == MEDIA_OCI_CONFIG || mt == MEDIA_DOCKER_CONFIG {
        format!("{GC_REF_CONTENT}.config")
    } else if is_manifest(mt) || is_index(mt) {
        format!("{GC_REF_CONTENT}.m.{index}")
    } else if mt.contains(".layer.") || mt.contains(".rootfs.") {
        format!("{GC_REF_CONTENT}.l.{index}")
    } else {
        format!("{GC_REF_CONTENT}.{index}")
    }
}

/// This host as an OCI platform (`linux/amd64`, `linux/arm64/v8`).
pub fn host_platform() -> Platform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", ""),
        "aarch64" => ("arm64", "v8"),
        "arm" => ("arm", "v7"),
        "x86" => ("386", ""),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", ""),
        "loongarch64" => ("loong64", ""),
        other => (other, ""),
    };
    Platform { architecture: architecture.into(), os: std::env::consts::OS.into(), variant: variant.into() }
}

impl Platform {
    /// Whether an image for `self` runs on `host` (a missing variant matches
    /// the default one, as containerd's platform matcher does).
    pub fn runs_on(&self, host: &Platform) -> bool {
        if self.os != host.os || self.architecture != host.architecture {
            return false;
        }
        let default_variant =
            |v: &str| if host.architecture == "arm64" && v.is_empty() { "v8".to_string() } else { v.to_string() };
        self.variant.is_empty()
            || host.variant.is_empty()
            || default_variant(&self.variant) == default_variant(&host.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if !self.variant.is_empty() {
            write!(f, "/{}", self.variant)?;
        }
        Ok(())
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Chain IDs of a layer stack, as the OCI image spec defines them: the first
/// is its diff ID, each next one `sha256(parent + " " + diff ID)`.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(parent) => sha256_digest(format!("{parent} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_spec() {
        let a = "sha256:".to_string() + &"a".repeat(64);
        let b = "sha256:".to_string() + &"b".repeat(64);
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        assert_eq!(ids[1], sha256_digest(format!("{a} {b}").as_bytes()));
    }

    #[test]
    fn gc_labels_as_containerd_names_them() {
        let d = |mt: &str| Descriptor { media_type: mt.into(), ..Default::default() };
        assert_eq!(child_gc_label(&d(MEDIA_OCI_CONFIG), 0), "containerd.io/gc.ref.content.config");
        assert_eq!(child_gc_label(&d(MEDIA_OCI_LAYER_GZIP), 2), "containerd.io/gc.ref.content.l.2");
        assert_eq!(child_gc_label(&d(MEDIA_DOCKER_MANIFEST), 1), "containerd.io/gc.ref.content.m.1");
    }

    #[test]
    fn platforms_match_with_default_variants() {
        let host = Platform { architecture: "arm64".into(), os: "linux".into(), variant: "v8".into() };
        let plain = Platform { architecture: "arm64".into(), os: "linux".into(), variant: String::new() };
        assert!(plain.runs_on(&host));
        let amd = Platform { architecture: "amd64".into(), os: "linux".into(), variant: String::new() };
        assert!(!amd.runs_on(&host));
        assert_eq!(host.to_string(), "linux/arm64/v8");
    }

    #[test]
    fn documents_are_recognised_by_shape() {
        assert_eq!(sniff_media_type(br#"{"schemaVersion":2,"manifests":[]}"#).as_deref(), Some(MEDIA_OCI_INDEX));
        assert_eq!(sniff_media_type(br#"{"schemaVersion":2,"config":{}}"#).as_deref(), Some(MEDIA_OCI_MANIFEST));
        assert_eq!(sniff_media_type(b"\x1f\x8b"), None);
    }
}
