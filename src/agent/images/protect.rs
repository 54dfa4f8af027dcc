//! Which images the node's image garbage collection must keep (those ferrok
//! imported: they came from no registry and could not be pulled again),
//! and the listing and removal `ferrok images` offers.

use std::collections::BTreeSet;
use std::time::Duration;

use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::{DeleteImageRequest, GetImageRequest, ListImagesRequest};

use super::reference::{looks_like_id, normalize, InvalidReference};
use super::{ImageError, LABEL_IMPORTED, LABEL_PINNED};
use crate::agent::cri::{api, namespaced, Cri, CriError};

fn is_marked(labels: &std::collections::HashMap<String, String>) -> bool {
    labels.get(LABEL_IMPORTED).is_some_and(|v| v == "true") || labels.get(LABEL_PINNED).is_some_and(|v| v == "pinned")
}

/// The names of every image the node must never garbage-collect.
pub async fn protected_refs(cri: &Cri) -> Result<BTreeSet<String>, ImageError> {
    let images = ImagesClient::new(cri.channel())
        .max_decoding_message_size(64 << 20)
        .list(namespaced(ListImagesRequest { filters: vec![] }))
        .await
        .map_err(ImageError::containerd("Images.List"))?
        .into_inner()
        .images;
    Ok(images.into_iter().filter(|i| is_marked(&i.labels)).map(|i| i.name).collect())
}

/// Whether `image` (a reference, or a CRI image ID) is protected: one of
/// its names was imported by ferrok.
pub async fn is_protected(cri: &Cri, image: &str) -> Result<bool, ImageError> {
    if looks_like_id(image) {
        let protected = protected_refs(cri).await?;
        let Some(found) = image_status(cri, image).await? else { return Ok(false) };
        return Ok(found.repo_tags.iter().any(|t| protected.contains(t)));
    }
    let name = normalize(image)?;
    match ImagesClient::new(cri.channel()).get(namespaced(GetImageRequest { name })).await {
        Ok(r) => Ok(r.into_inner().image.is_some_and(|i| is_marked(&i.labels))),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(false),
        Err(s) => Err(ImageError::Containerd { call: "Images.Get", status: s }),
    }
}

async fn image_status(cri: &Cri, image: &str) -> Result<Option<api::Image>, ImageError> {
    let req = api::ImageStatusRequest {
        image: Some(api::ImageSpec { image: image.to_string(), ..Default::default() }),
        verbose: false,
    };
    let resp = cri.images().image_status(req).await.map_err(CriError::call("ImageStatus"))?;
    Ok(resp.into_inner().image)
}

/// An image as CRI lists it, with whether it is protected.
#[derive(Debug, Clone)]
pub struct ListedImage {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size: u64,
    pub protected: bool,
}

/// Every image CRI knows, sorted by first name.
pub async fn list_images(cri: &Cri) -> Result<Vec<ListedImage>, ImageError> {
    let images = cri.list_images().await?;
    let protected = protected_refs(cri).await?;
    let mut out: Vec<ListedImage> = images
        .into_iter()
        .map(|i| ListedImage {
            protected: i.repo_tags.iter().any(|t| protected.contains(t)) || i.pinned,
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
        })
        .collect();
    out.sort_by(|a, b| a.repo_tags.first().cmp(&b.repo_tags.first()).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// Removes `image`: a name drops that name only (the image stays while
/// other names point at it); an ID (or a unique prefix of one, as
/// `crictl rmi` takes) removes the image with all its names. Returns the
/// names removed.
pub async fn remove_image(cri: &Cri, image: &str) -> Result<Vec<String>, ImageError> {
    if looks_like_id(image) {
        let prefix = image.strip_prefix("sha256:").unwrap_or(image);
        let matches: Vec<ListedImage> = list_images(cri)
            .await?
            .into_iter()
            .filter(|i| i.id.strip_prefix("sha256:").unwrap_or(&i.id).starts_with(prefix))
            .collect();
        let found = match matches.as_slice() {
            [one] => one.clone(),
            [] => return Err(ImageError::NotFound(image.to_string())),
            _ => return Err(ImageError::Reference { reference: image.into(), reason: InvalidReference::AmbiguousId }),
        };
        let req =
            api::RemoveImageRequest { image: Some(api::ImageSpec { image: found.id.clone(), ..Default::default() }) };
        cri.images().remove_image(req).await.map_err(CriError::call("RemoveImage"))?;
        return Ok(if found.repo_tags.is_empty() { vec![found.id] } else { found.repo_tags });
    }
    let name = normalize(image)?;
    let req = namespaced(DeleteImageRequest { name: name.clone(), sync: false, target: None });
    match ImagesClient::new(cri.channel()).delete(req).await {
        Ok(_) => {}
        Err(s) if s.code() == tonic::Code::NotFound => return Err(ImageError::NotFound(image.to_string())),
        Err(s) => return Err(ImageError::Containerd { call: "Images.Delete", status: s }),
    }
    // CRI forgets the name when it sees the delete event.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        match image_status(cri, &name).await {
            Ok(Some(i)) if i.repo_tags.contains(&name) => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => break,
        }
    }
    Ok(vec![name])
}
