//! The CRI calls the kubelet's core makes, as two traits (upstream's
//! cri-api `RuntimeService` and `ImageManagerService`): the runtime manager,
//! the pod workers' syncs and the image manager go through them, so they
//! run against containerd ([`Cri`]) or against the test double in
//! `cri::fake`. Errors keep the call's name and the runtime's status, as
//! [`CriError::Call`]. (`ImageService` for [`Cri`] is implemented in
//! `image_manager`, beside the containerd image labels it also reads.)

use super::{api, Cri, CriError};

/// The runtime's sandboxes and containers.
#[async_trait::async_trait]
pub trait RuntimeService: Send + Sync {
    /// Makes and starts a sandbox; returns its id.
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: String)
        -> Result<String, CriError>;
    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError>;
    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError>;
    async fn pod_sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError>;
    /// The sandboxes that pass `filter` (all of them without one).
    async fn list_pod_sandboxes(&self, filter: Option<api::PodSandboxFilter>)
        -> Result<Vec<api::PodSandbox>, CriError>;
    /// Creates a container in a sandbox; returns its id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError>;
    async fn start_container(&self, id: &str) -> Result<(), CriError>;
    /// SIGTERM, then SIGKILL after `timeout_seconds`.
    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> Result<(), CriError>;
    async fn remove_container(&self, id: &str) -> Result<(), CriError>;
    /// The containers that pass `filter` (all of them without one).
    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>, CriError>;
    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError>;
}

/// The runtime's images.
#[async_trait::async_trait]
pub trait ImageService: Send + Sync {
    /// The image as the runtime knows it, if present.
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError>;
    /// Pulls `image`; returns the reference the runtime resolved it to.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, CriError>;
    /// Whether the node imported the image from a tarball (containerd's own
    /// image labels): it came from no registry, so it is never pulled.
    async fn is_imported(&self, image: &str) -> bool;
}

#[async_trait::async_trait]
impl RuntimeService for Cri {
    async fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String, CriError> {
        let req = api::RunPodSandboxRequest { config: Some(config), runtime_handler };
        let resp = self.runtime().run_pod_sandbox(req).await.map_err(CriError::call("RunPodSandbox"))?;
        Ok(resp.into_inner().pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::StopPodSandboxRequest { pod_sandbox_id: id.to_string() };
        self.runtime().stop_pod_sandbox(req).await.map(|_| ()).map_err(CriError::call("StopPodSandbox"))
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemovePodSandboxRequest { pod_sandbox_id: id.to_string() };
        self.runtime().remove_pod_sandbox(req).await.map(|_| ()).map_err(CriError::call("RemovePodSandbox"))
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
        let resp = self.runtime().pod_sandbox_status(req).await.map_err(CriError::call("PodSandboxStatus"))?;
        Ok(resp.into_inner().status)
    }

    async fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        Cri::list_pod_sandboxes(self, filter).await
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp = self.runtime().create_container(req).await.map_err(CriError::call("CreateContainer"))?;
        Ok(resp.into_inner().container_id)
    }

    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::StartContainerRequest { container_id: id.to_string() };
        self.runtime().start_container(req).await.map(|_| ()).map_err(CriError::call("StartContainer"))
    }

    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> Result<(), CriError> {
        let req = api::StopContainerRequest { container_id: id.to_string(), timeout: timeout_seconds };
        self.runtime().stop_container(req).await.map(|_| ()).map_err(CriError::call("StopContainer"))
    }

    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemoveContainerRequest { container_id: id.to_string() };
        self.runtime().remove_container(req).await.map(|_| ()).map_err(CriError::call("RemoveContainer"))
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>, CriError> {
        Cri::list_containers(self, filter).await
    }

    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError> {
        let req = api::ContainerStatusRequest { container_id: id.to_string(), verbose: false };
        let resp = self.runtime().container_status(req).await.map_err(CriError::call("ContainerStatus"))?;
        Ok(resp.into_inner().status)
    }
}
