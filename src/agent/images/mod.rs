//! Images on a node that needs no registry: tarballs imported straight into
//! containerd's content store and unpacked into its snapshotter (what
//! `ctr images import` does), the built-in pause image, the `images/`
//! folder of tarballs and pull lists, and registries.yaml for the pulls
//! that do reach a registry.
//!
//! Everything here works in containerd's `k8s.io` namespace through
//! containerd's own API (the CRI has no import call); containerd's CRI
//! plugin sees the images through containerd's image events.

mod archive;
mod content;
pub mod dir;
pub mod import;
mod oci;
pub mod pause;
mod protect;
pub mod reference;
pub mod registries;
mod unpack;
pub(crate) use crate::host::dir_watch as watch;

use std::path::PathBuf;

pub use dir::{ImagesDir, ImagesDirTask, PullError, Puller};
pub use import::{import_file, import_reader, import_with, ImportOptions};
pub use pause::{ensure_pause_image, PAUSE_IMAGE};
pub use protect::{is_protected, list_images, protected_refs, remove_image, ListedImage};
pub use registries::Registries;

/// Label containerd 1.7+'s CRI reads as "never garbage-collect this image".
pub const LABEL_PINNED: &str = "io.cri-containerd.pinned";
/// ferrok's own mark on images it imported: the node's image GC keeps them.
pub const LABEL_IMPORTED: &str = "ferrok.io/imported";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{source_name}: {message}")]
    Archive { source_name: String, message: String },
    #[error("{source_name}: {source}")]
    Unreadable { source_name: String, source: archive::ArchiveError },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{source_name}: {path}: digest is {actual}, the archive names it {expected}")]
    DigestMismatch { source_name: String, path: String, expected: String, actual: String },
    #[error("{source_name}: {what} {digest} is not in the archive (nor in containerd)")]
    MissingBlob { source_name: String, what: String, digest: String },
    #[error("{source_name}: no image in the archive has a name (no io.containerd.image.name, org.opencontainers.image.ref.name or RepoTags); give a base name")]
    NoImageName { source_name: String },
    #[error("{source_name}: no manifest in the archive is for {platform}")]
    NoMatchingPlatform { source_name: String, platform: String },
    #[error("invalid image reference {reference:?}: {reason}")]
    Reference { reference: String, reason: reference::InvalidReference },
    #[error("containerd {call}: {}", .status.message())]
    Containerd { call: &'static str, status: tonic::Status },
    #[error("{0}")]
    Cri(#[from] crate::agent::cri::CriError),
    #[error("image {0} not found")]
    NotFound(String),
}

impl ImageError {
    pub(crate) fn containerd(call: &'static str) -> impl FnOnce(tonic::Status) -> ImageError {
        move |status| ImageError::Containerd { call, status }
    }

    pub(crate) fn archive(source_name: &str, message: impl Into<String>) -> ImageError {
        ImageError::Archive { source_name: source_name.to_string(), message: message.into() }
    }

    /// containerd answered NotFound.
    pub fn is_not_found(&self) -> bool {
        match self {
            ImageError::Containerd { status, .. } => status.code() == tonic::Code::NotFound,
            ImageError::NotFound(_) => true,
            ImageError::Cri(e) => e.is_not_found(),
            _ => false,
        }
    }
}
