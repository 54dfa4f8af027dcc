//! The node's link to the container runtime: containerd's CRI
//! (runtime.v1) over its Unix socket, and containerd's own API on the same
//! socket for what CRI lacks (image import, events). The channel is lazy
//! and reconnects by itself, so a restarted containerd is picked up again.

#[cfg(test)]
pub mod fake;
pub mod labels;
pub mod service;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use api::image_service_client::ImageServiceClient;
use api::runtime_service_client::RuntimeServiceClient;
pub use k8s_cri::v1 as api;
pub use service::{ImageService, RuntimeService};

/// containerd's namespace for everything CRI does.
pub const K8S_NAMESPACE: &str = "k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("{call}: {}", .status.message())]
    Call { call: &'static str, status: tonic::Status },
    #[error("invalid CRI endpoint {0:?}")]
    Endpoint(String),
    #[error("{0}")]
    Invalid(String),
}

impl CriError {
    pub fn call(call: &'static str) -> impl FnOnce(tonic::Status) -> CriError {
        move |status| CriError::Call { call, status }
    }

    /// The runtime does not know the object (already gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// The runtime's own words (a call's status message), as events and
    /// container reasons quote them.
    pub fn message(&self) -> String {
        match self {
            CriError::Call { status, .. } => status.message().to_string(),
            other => other.to_string(),
        }
    }

    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Call { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// Clients of one runtime socket; clones share the connection.
#[derive(Clone, Debug)]
pub struct Cri {
    channel: Channel,
    socket: PathBuf,
}

/// `unix:///run/x.sock` or a plain path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.is_empty() || !path.starts_with('/') {
        return Err(CriError::Endpoint(endpoint.into()));
    }
    Ok(PathBuf::from(path))
}

impl Cri {
    /// A lazy channel to the socket: nothing is dialled until the first call.
    pub fn connect(socket: &Path) -> Result<Cri, CriError> {
        let path = socket.to_path_buf();
        let channel = Endpoint::try_from("http://localhost")
            .map_err(|_| CriError::Endpoint(socket.display().to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(60))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
            }));
        Ok(Cri { channel, socket: socket.to_path_buf() })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(64 << 20)
    }

    pub fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(64 << 20)
    }

    /// The raw channel, for containerd's own services (which need the
    /// `containerd-namespace` header: see [`namespaced`]).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The runtime's name and version (`containerd`, `1.6.20`).
    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        let req = api::VersionRequest { version: "v1".into() };
        Ok(self.runtime().version(req).await.map_err(CriError::call("Version"))?.into_inner())
    }

    /// Whether the runtime and its network are ready, with the reasons.
    pub async fn status(&self) -> Result<api::RuntimeStatus, CriError> {
        let resp = self
            .runtime()
            .status(api::StatusRequest { verbose: false })
            .await
            .map_err(CriError::call("Status"))?
            .into_inner();
        resp.status.ok_or_else(|| CriError::Invalid("Status: no status in the answer".into()))
    }

    /// The images the runtime holds.
    pub async fn list_images(&self) -> Result<Vec<api::Image>, CriError> {
        let req = api::ListImagesRequest { filter: None };
        Ok(self.images().list_images(req).await.map_err(CriError::call("ListImages"))?.into_inner().images)
    }

    /// The containers that pass `filter` (all of them without one).
    pub async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>, CriError> {
        let req = api::ListContainersRequest { filter };
        Ok(self.runtime().list_containers(req).await.map_err(CriError::call("ListContainers"))?.into_inner().containers)
    }

    /// The pod sandboxes that pass `filter` (all of them without one).
    pub async fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let req = api::ListPodSandboxRequest { filter };
        Ok(self.runtime().list_pod_sandbox(req).await.map_err(CriError::call("ListPodSandbox"))?.into_inner().items)
    }

    /// Waits until the runtime answers, up to `limit`.
    pub async fn wait_ready(&self, limit: Duration) -> Result<api::VersionResponse, CriError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.version().await {
                Ok(v) => return Ok(v),
                Err(e) if tokio::time::Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// The filter for containers that are running.
pub fn running() -> api::ContainerFilter {
    api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    }
}

/// A request to one of containerd's own services, in CRI's namespace.
pub fn namespaced<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert("containerd-namespace", tonic::metadata::MetadataValue::from_static(K8S_NAMESPACE));
    req
}

/// The runtime condition of `kind` (`RuntimeReady`, `NetworkReady`), if reported.
pub fn condition<'a>(status: &'a api::RuntimeStatus, kind: &str) -> Option<&'a api::RuntimeCondition> {
    status.conditions.iter().find(|c| c.r#type == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_paths() {
        assert_eq!(socket_path("unix:///run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert_eq!(socket_path("/run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert!(socket_path("tcp://1.2.3.4:1").is_err());
        assert!(socket_path("").is_err());
    }
}
