//! A container runtime in memory, for unit tests (upstream's
//! FakeRuntimeService and FakeImageService): sandboxes and containers kept
//! as CRI reports them, created, started, stopped and removed by the calls
//! of [`RuntimeService`]; a test moves them along (a container exits) and
//! reads them back. Every call is recorded by name, and any call can be
//! made to fail. Images are present when added, or pullable when allowed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::{api, CriError, ImageService, RuntimeService};
use crate::sync::LockExt;

struct Sandbox {
    config: api::PodSandboxConfig,
    state: api::PodSandboxState,
    created_at: i64,
    ip: String,
}

struct Container {
    sandbox_id: String,
    config: api::ContainerConfig,
    log_path: String,
    state: api::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
}

#[derive(Default)]
struct State {
    next_id: u64,
    last_time: i64,
    sandboxes: BTreeMap<String, Sandbox>,
    containers: BTreeMap<String, Container>,
    images: Vec<api::Image>,
    pullable: HashSet<String>,
    calls: Vec<&'static str>,
    /// (container id, timeout) of every StopContainer.
    stops: Vec<(String, i64)>,
    failing: HashMap<&'static str, String>,
}

impl State {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}", self.next_id)
    }

    /// Wall-clock nanoseconds (the crash back-off counts from them), never
    /// twice the same, so creation order is total.
    fn now(&mut self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        self.last_time = wall.max(self.last_time + 1);
        self.last_time
    }
}

/// The in-memory runtime; share it as `Arc<FakeRuntime>`.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    changed: Notify,
}

fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn not_found(call: &'static str, what: &str) -> CriError {
    CriError::Call { call, status: tonic::Status::not_found(format!("{what} not found")) }
}

impl FakeRuntime {
    pub fn new() -> Arc<FakeRuntime> {
        Arc::new(FakeRuntime::default())
    }

    /// Records the call; the error it was told to fail with, if any.
    fn call(&self, name: &'static str) -> Result<MutexGuard<'_, State>, CriError> {
        let mut st = self.state.locked();
        st.calls.push(name);
        match st.failing.get(name) {
            Some(message) => Err(CriError::Call { call: name, status: tonic::Status::unknown(message.clone()) }),
            None => Ok(st),
        }
    }

    fn changed(&self) {
        self.changed.notify_waiters();
    }

    /// An image present on the node, by reference.
    pub fn add_image(&self, reference: &str) {
        let mut st = self.state.locked();
        let id = format!("sha256:{:064x}", st.images.len() + 1);
        st.images.push(api::Image { id, repo_tags: vec![reference.to_string()], size: 1024, ..Default::default() });
    }

    /// A reference a pull will find (none is found otherwise).
    pub fn allow_pull(&self, reference: &str) {
        self.state.locked().pullable.insert(reference.to_string());
    }

    /// Every call of `name` fails with `message` from now on (`None`: no more).
    pub fn fail(&self, name: &'static str, message: Option<&str>) {
        let mut st = self.state.locked();
        match message {
            Some(m) => st.failing.insert(name, m.to_string()),
            None => st.failing.remove(name),
        };
    }

    /// The calls made so far, by CRI name, in order.
    pub fn calls(&self) -> Vec<&'static str> {
        self.state.locked().calls.clone()
    }

    /// (container id, grace seconds) of every stop asked so far.
    pub fn stops(&self) -> Vec<(String, i64)> {
        self.state.locked().stops.clone()
    }

    /// The container ends on its own with `exit_code`.
    pub fn exit(&self, id: &str, exit_code: i32) {
        let mut st = self.state.locked();
        let now = st.now();
        if let Some(c) = st.containers.get_mut(id) {
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = now;
            c.exit_code = exit_code;
        }
        drop(st);
        self.changed();
    }

    /// (id, state) of every container with the name, oldest first.
    pub fn containers_named(&self, name: &str) -> Vec<(String, api::ContainerState)> {
        let st = self.state.locked();
        let mut out: Vec<(i64, String, api::ContainerState)> = st
            .containers
            .iter()
            .filter(|(_, c)| c.config.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|(id, c)| (c.created_at, id.clone(), c.state))
            .collect();
        out.sort();
        out.into_iter().map(|(_, id, s)| (id, s)).collect()
    }

    /// The mounts the container was created with.
    pub fn mounts_of(&self, id: &str) -> Vec<api::Mount> {
        self.state.locked().containers.get(id).map(|c| c.config.mounts.clone()).unwrap_or_default()
    }

    /// How many sandboxes the runtime holds, and how many are ready.
    pub fn sandbox_count(&self) -> (usize, usize) {
        let st = self.state.locked();
        let ready = st.sandboxes.values().filter(|s| s.state == api::PodSandboxState::SandboxReady).count();
        (st.sandboxes.len(), ready)
    }

    /// Waits (at most 10 s) until `check` finds what it looks for.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeRuntime) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the runtime never showed {what}; calls: {:?}", self.calls());
            }
        }
    }

    fn sandbox_view(id: &str, s: &Sandbox) -> api::PodSandbox {
        api::PodSandbox {
            id: id.to_string(),
            metadata: s.config.metadata.clone(),
            state: s.state as i32,
            created_at: s.created_at,
            labels: s.config.labels.clone(),
            annotations: s.config.annotations.clone(),
            ..Default::default()
        }
    }

    fn container_view(id: &str, c: &Container) -> api::Container {
        api::Container {
            id: id.to_string(),
            pod_sandbox_id: c.sandbox_id.clone(),
            metadata: c.config.metadata.clone(),
            image: c.config.image.clone(),
            image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
            state: c.state as i32,
            created_at: c.created_at,
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            ..Default::default()
        }
    }
}

#[async_trait::async_trait]
impl RuntimeService for FakeRuntime {
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, _handler: String) -> Result<String, CriError> {
        let mut st = self.call("RunPodSandbox")?;
        let id = st.id("sandbox");
        let created_at = st.now();
        let ip = format!("10.42.0.{}", st.sandboxes.len() + 2);
        st.sandboxes.insert(id.clone(), Sandbox { config, state: api::PodSandboxState::SandboxReady, created_at, ip });
        drop(st);
        self.changed();
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut st = self.call("StopPodSandbox")?;
        let s = st.sandboxes.get_mut(id).ok_or_else(|| not_found("StopPodSandbox", id))?;
        s.state = api::PodSandboxState::SandboxNotready;
        drop(st);
        self.changed();
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut st = self.call("RemovePodSandbox")?;
        st.sandboxes.remove(id).ok_or_else(|| not_found("RemovePodSandbox", id))?;
        drop(st);
        self.changed();
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        let st = self.call("PodSandboxStatus")?;
        let s = st.sandboxes.get(id).ok_or_else(|| not_found("PodSandboxStatus", id))?;
        Ok(Some(api::PodSandboxStatus {
            id: id.to_string(),
            metadata: s.config.metadata.clone(),
            state: s.state as i32,
            created_at: s.created_at,
            network: Some(api::PodSandboxNetworkStatus { ip: s.ip.clone(), ..Default::default() }),
            labels: s.config.labels.clone(),
            ..Default::default()
        }))
    }

    async fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let st = self.call("ListPodSandbox")?;
        let f = filter.unwrap_or_default();
        Ok(st
            .sandboxes
            .iter()
            .filter(|(id, _)| f.id.is_empty() || **id == f.id)
            .filter(|(_, s)| f.state.as_ref().is_none_or(|v| v.state == s.state as i32))
            .filter(|(_, s)| labels_match(&f.label_selector, &s.config.labels))
            .map(|(id, s)| Self::sandbox_view(id, s))
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let mut st = self.call("CreateContainer")?;
        if !st.sandboxes.contains_key(sandbox_id) {
            return Err(not_found("CreateContainer", sandbox_id));
        }
        let id = st.id("container");
        let created_at = st.now();
        let log_path = std::path::Path::new(&sandbox_config.log_directory).join(&config.log_path);
        let container = Container {
            sandbox_id: sandbox_id.to_string(),
            log_path: log_path.to_string_lossy().into_owned(),
            config,
            state: api::ContainerState::ContainerCreated,
            created_at,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
        };
        st.containers.insert(id.clone(), container);
        drop(st);
        self.changed();
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let mut st = self.call("StartContainer")?;
        let now = st.now();
        let c = st.containers.get_mut(id).ok_or_else(|| not_found("StartContainer", id))?;
        c.state = api::ContainerState::ContainerRunning;
        c.started_at = now;
        drop(st);
        self.changed();
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> Result<(), CriError> {
        let mut st = self.call("StopContainer")?;
        st.stops.push((id.to_string(), timeout_seconds));
        let now = st.now();
        let c = st.containers.get_mut(id).ok_or_else(|| not_found("StopContainer", id))?;
        if c.state == api::ContainerState::ContainerRunning {
            // SIGTERM heeded.
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = now;
        }
        drop(st);
        self.changed();
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut st = self.call("RemoveContainer")?;
        st.containers.remove(id).ok_or_else(|| not_found("RemoveContainer", id))?;
        drop(st);
        self.changed();
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>, CriError> {
        let st = self.call("ListContainers")?;
        let f = filter.unwrap_or_default();
        Ok(st
            .containers
            .iter()
            .filter(|(id, c)| {
                (f.id.is_empty() || **id == f.id) && (f.pod_sandbox_id.is_empty() || c.sandbox_id == f.pod_sandbox_id)
            })
            .filter(|(_, c)| f.state.as_ref().is_none_or(|v| v.state == c.state as i32))
            .filter(|(_, c)| labels_match(&f.label_selector, &c.config.labels))
            .map(|(id, c)| Self::container_view(id, c))
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError> {
        let st = self.call("ContainerStatus")?;
        let c = st.containers.get(id).ok_or_else(|| not_found("ContainerStatus", id))?;
        let reason = match (c.state, c.exit_code) {
            (api::ContainerState::ContainerExited, 0) => "Completed",
            (api::ContainerState::ContainerExited, _) => "Error",
            _ => "",
        };
        Ok(Some(api::ContainerStatus {
            id: id.to_string(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
            reason: reason.to_string(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            mounts: c.config.mounts.clone(),
            log_path: c.log_path.clone(),
            ..Default::default()
        }))
    }
}

#[async_trait::async_trait]
impl ImageService for FakeRuntime {
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        let st = self.call("ImageStatus")?;
        Ok(st.images.iter().find(|i| i.id == image || i.repo_tags.iter().any(|t| t == image)).cloned())
    }

    async fn pull_image(
        &self,
        image: &str,
        _auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        if !self.call("PullImage")?.pullable.contains(image) {
            let status = tonic::Status::unknown(format!("failed to resolve reference {image:?}: not found"));
            return Err(CriError::Call { call: "PullImage", status });
        }
        self.add_image(image);
        let found = self.image_status(image).await?;
        Ok(found.map(|i| i.id).unwrap_or_default())
    }

    async fn is_imported(&self, _image: &str) -> bool {
        false
    }
}
