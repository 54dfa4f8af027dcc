//! Images for containers (upstream's images.imageManager): the pull policy
//! decides, an image that is present is used as it is, an absent one is
//! pulled through CRI with the pod's pull secrets and the node's registry
//! credentials, one pull per image at a time, and failures back off
//! (ErrImagePull, then ImagePullBackOff) with upstream's events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod, Secret};
use kube::api::Api;

use super::cri::{api, Cri, CriError, ImageService};
use super::pod_util;
use super::{credentials, events::Events};
use crate::backoff::Backoff;
use crate::client::events::EventType;
use crate::sync::LockExt;

/// What the container will be created from.
#[derive(Debug, Clone, Default)]
pub struct ImageInfo {
    /// The image id (`sha256:…`) CRI resolved the reference to.
    pub id: String,
    pub uid: Option<i64>,
    pub username: String,
}

/// Why the image is not there, as the container's waiting reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ImageError {
    pub reason: &'static str,
    pub message: String,
}

/// A pull that failed with every credential tried: the runtime's words
/// for the last try.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.message())]
pub struct PullFailed(#[source] CriError);

/// Credentials the node itself holds for a registry (registries.yaml).
pub trait NodeCredentials: Send + Sync {
    fn auth_for(&self, image: &str) -> Option<api::AuthConfig>;
}

/// The image service of containerd's CRI, and containerd's own image
/// labels for the images the node imported.
#[async_trait::async_trait]
impl ImageService for Cri {
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.to_string(), ..Default::default() }),
            verbose: false,
        };
        let resp = self.images().image_status(req).await.map_err(CriError::call("ImageStatus"))?;
        Ok(resp.into_inner().image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let req = api::PullImageRequest {
            image: Some(api::ImageSpec { image: image.to_string(), ..Default::default() }),
            auth,
            sandbox_config,
        };
        let resp = self.images().pull_image(req).await.map_err(CriError::call("PullImage"))?;
        Ok(resp.into_inner().image_ref)
    }

    async fn is_imported(&self, image: &str) -> bool {
        super::images::is_protected(self, image).await.unwrap_or(false)
    }
}

pub struct ImageManager {
    /// The runtime's images (containerd, or a test double).
    cri: Arc<dyn ImageService>,
    client: kube::Client,
    events: Events,
    backoff: Backoff,
    /// One lock per image reference: concurrent pods wait for one pull.
    pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    node_credentials: Mutex<Option<Arc<dyn NodeCredentials>>>,
    /// When each failed pull's back-off ends, by pod uid and image.
    backoff_until: Mutex<HashMap<String, Instant>>,
}

/// `Always` for `:latest` or untagged images, else `IfNotPresent` (upstream's default).
pub fn pull_policy(c: &Container) -> String {
    if let Some(p) = c.image_pull_policy.as_deref().filter(|p| !p.is_empty()) {
        return p.to_string();
    }
    let image = c.image.as_deref().unwrap_or_default();
    let name = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent".into();
    }
    match name.split_once(':') {
        Some((_, "latest")) | None => "Always".into(),
        Some(_) => "IfNotPresent".into(),
    }
}

impl ImageManager {
    pub fn new(cri: Arc<dyn ImageService>, client: kube::Client, events: Events) -> Self {
        ImageManager {
            cri,
            client,
            events,
            backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
            pulls: Mutex::new(HashMap::new()),
            node_credentials: Mutex::new(None),
            backoff_until: Mutex::new(HashMap::new()),
        }
    }

    pub fn set_node_credentials(&self, creds: Arc<dyn NodeCredentials>) {
        *self.node_credentials.locked() = Some(creds);
    }

    /// Whether the image was imported from a tarball (never pulled or collected).
    pub async fn is_protected(&self, image_id: &str) -> bool {
        self.cri.is_imported(image_id).await
    }

    /// Pulls `image` for the node itself (the images folder's pull lists),
    /// with the node's registry credentials.
    pub async fn pull_for_node(&self, image: &str) -> Result<(), PullFailed> {
        let node = self.node_credentials.locked().clone();
        let auths: Vec<api::AuthConfig> = node.and_then(|n| n.auth_for(image)).into_iter().collect();
        self.pull(image, &auths, None).await.map(|_| ())
    }

    /// The image as CRI knows it, if present.
    pub async fn status(&self, image: &str) -> Result<Option<api::Image>, ImageError> {
        self.cri.image_status(image).await.map_err(|e| ImageError {
            reason: "ErrImageInspect",
            message: format!("Failed to inspect image {image:?}: {}", e.message()),
        })
    }

    fn info(img: &api::Image) -> ImageInfo {
        ImageInfo { id: img.id.clone(), uid: img.uid.as_ref().map(|u| u.value), username: img.username.clone() }
    }

    async fn pod_credentials(&self, pod: &Pod, image: &str) -> Vec<api::AuthConfig> {
        let mut out = Vec::new();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), pod_util::namespace(pod));
        for r in pod_util::spec(pod).image_pull_secrets.iter().flatten() {
            match secrets.get_opt(&r.name).await {
                Ok(Some(s)) => out.extend(credentials::from_secret(&s, image)),
                Ok(None) => tracing::debug!(secret = %r.name, "image pull secret not found"),
                Err(e) => tracing::warn!(secret = %r.name, error = %e, "cannot read image pull secret"),
            }
        }
        let node = self.node_credentials.locked().clone();
        if let Some(auth) = node.and_then(|n| n.auth_for(image)) {
            out.push(auth);
        }
        out
    }

    async fn pull(
        &self,
        image: &str,
        auths: &[api::AuthConfig],
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<String, PullFailed> {
        // Each credential in turn (none when there is none), until one pulls.
        let (first, rest) = match auths.split_first() {
            Some((first, rest)) => (Some(first.clone()), rest),
            None => (None, &[][..]),
        };
        let mut result = self.cri.pull_image(image, first, sandbox.cloned()).await;
        for auth in rest {
            if result.is_ok() {
                break;
            }
            result = self.cri.pull_image(image, Some(auth.clone()), sandbox.cloned()).await;
        }
        result.map_err(PullFailed)
    }

    /// Makes sure the container's image is present, pulling it when the
    /// policy says so; emits upstream's events on the container.
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        container_ref: &ObjectReference,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<ImageInfo, ImageError> {
        let image = c.image.clone().unwrap_or_default();
        if image.trim().is_empty() {
            return Err(ImageError {
                reason: "InvalidImageName",
                message:
                    "Failed to apply default image tag \"\": couldn't parse image name \"\": invalid reference format"
                        .into(),
            });
        }
        let policy = pull_policy(c);
        let present = self.status(&image).await?;
        let usable_without_pull = match (&present, policy.as_str()) {
            (Some(_), "IfNotPresent") | (Some(_), "Never") => true,
            (Some(img), _) => self.is_protected(&img.id).await,
            (None, _) => false,
        };
        if usable_without_pull {
            if let Some(img) = &present {
                let msg = format!("Container image {image:?} already present on machine");
                self.events.container(container_ref, EventType::Normal, "Pulled", &msg);
                return Ok(Self::info(img));
            }
        }
        if present.is_none() && policy == "Never" {
            let msg = format!("Container image {image:?} is not present with pull policy of Never");
            self.events.container(container_ref, EventType::Warning, "ErrImageNeverPull", &msg);
            return Err(ImageError { reason: "ErrImageNeverPull", message: msg });
        }
        let key = format!("{}_{image}", pod_util::uid(pod));
        if self.backoff.get(&key, Instant::now()).is_some() && self.backoff_pending(&key) {
            let msg = format!("Back-off pulling image {image:?}");
            self.events.container(container_ref, EventType::Normal, "BackOff", &msg);
            return Err(ImageError { reason: "ImagePullBackOff", message: msg });
        }
        let lock = {
            let mut pulls = self.pulls.locked();
            pulls.entry(image.clone()).or_default().clone()
        };
        let waited = Instant::now();
        let _guard = lock.lock().await;
        // Another pod's pull may have brought it meanwhile.
        if present.is_none() {
            if let Some(img) = self.status(&image).await? {
                let msg = format!("Container image {image:?} already present on machine");
                self.events.container(container_ref, EventType::Normal, "Pulled", &msg);
                return Ok(Self::info(&img));
            }
        }
        self.events.container(container_ref, EventType::Normal, "Pulling", &format!("Pulling image {image:?}"));
        let started = Instant::now();
        let auths = self.pod_credentials(pod, &image).await;
        match self.pull(&image, &auths, sandbox).await {
            Ok(_) => {
                self.backoff.reset(&key);
                let img = self.status(&image).await?.ok_or_else(|| ImageError {
                    reason: "ErrImagePull",
                    message: format!("image {image:?} is not present after its pull"),
                })?;
                let msg = format!(
                    "Successfully pulled image {image:?} in {:.3}s ({:.3}s including waiting). Image size: {} bytes.",
                    started.elapsed().as_secs_f64(),
                    waited.elapsed().as_secs_f64(),
                    img.size
                );
                self.events.container(container_ref, EventType::Normal, "Pulled", &msg);
                Ok(Self::info(&img))
            }
            Err(err) => {
                self.backoff.next(&key, Instant::now());
                self.mark_backoff(&key);
                if let Some(img) = &present {
                    let msg = format!("Failed to pull image {image:?}: {err}; using the image present on the node");
                    self.events.container(container_ref, EventType::Warning, "Failed", &msg);
                    return Ok(Self::info(img));
                }
                let msg = format!("Failed to pull image {image:?}: {err}");
                self.events.container(container_ref, EventType::Warning, "Failed", &msg);
                self.events.container(container_ref, EventType::Warning, "Failed", "Error: ErrImagePull");
                Err(ImageError { reason: "ErrImagePull", message: msg })
            }
        }
    }

    /// When the back-off of `key` ends, for the pod worker's next try.
    pub fn backoff_remaining(&self, pod: &Pod, image: &str) -> Option<Duration> {
        let key = format!("{}_{image}", pod_util::uid(pod));
        let until = *self.backoff_until.locked().get(&key)?;
        until.checked_duration_since(Instant::now())
    }

    fn mark_backoff(&self, key: &str) {
        if let Some(d) = self.backoff.get(key, Instant::now()) {
            self.backoff_until.locked().insert(key.to_string(), Instant::now() + d);
        }
    }

    fn backoff_pending(&self, key: &str) -> bool {
        self.backoff_until.locked().get(key).is_some_and(|until| Instant::now() < *until)
    }

    /// Forgets a pod's back-offs when it goes.
    pub fn forget_pod(&self, uid: &str) {
        self.backoff_until.locked().retain(|k, _| !k.starts_with(&format!("{uid}_")));
        self.backoff.gc(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_pull_policy_follows_the_tag() {
        let c = |image: &str| -> Container { serde_json::from_value(json!({"name": "a", "image": image})).unwrap() };
        assert_eq!(pull_policy(&c("busybox")), "Always");
        assert_eq!(pull_policy(&c("busybox:latest")), "Always");
        assert_eq!(pull_policy(&c("busybox:1")), "IfNotPresent");
        assert_eq!(pull_policy(&c("127.0.0.1:5000/busybox")), "Always");
        assert_eq!(pull_policy(&c("127.0.0.1:5000/busybox:1")), "IfNotPresent");
        assert_eq!(pull_policy(&c("busybox@sha256:abc")), "IfNotPresent");
    }
}
