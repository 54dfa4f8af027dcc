//! What the kubelet core's unit tests run against instead of a node: the
//! in-memory runtime (`cri::fake`), a mount table in memory
//! (`volume_manager::mounter::FakeMounter`), and an API server
//! that records every request and answers each with 404 (status writes,
//! events and lookups are seen by the test and go nowhere). Nothing here
//! needs root, containerd or a network.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::config::{AgentConfig, KubeletConfig};
use super::cri::fake::FakeRuntime;
use super::events::Events;
use super::image_manager::ImageManager;
use super::kubelet::{Kubelet, ProbeResults};
use super::kuberuntime::actions::ProbeState;
use super::kuberuntime::manager::RuntimeManager;
use super::kuberuntime::runtime_status::RuntimePod;
use super::pleg::ContainerIndex;
use super::prober::ProbeType;
use super::status_manager::StatusManager;
use super::volume_manager::mounter::FakeMounter;
use super::volume_manager::VolumeManager;
use crate::backoff::Backoff;
use crate::sync::LockExt;

/// One request the fake API server saw.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub body: Value,
}

/// The fake API server's record.
#[derive(Clone, Default)]
pub struct FakeApi {
    requests: Arc<Mutex<Vec<Recorded>>>,
    changed: Arc<Notify>,
}

impl FakeApi {
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.locked().clone()
    }

    /// The reasons of the events recorded so far.
    pub fn event_reasons(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .filter_map(|r| r.body.get("reason").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The statuses written for pod `name`, oldest first.
    pub fn status_writes(&self, name: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/pods/{name}/status")))
            .map(|r| r.body["status"].clone())
            .collect()
    }

    /// Waits (at most 10 s) until the requests seen satisfy `check`.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeApi) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the API never saw {what}; requests: {:?}", self.requests());
            }
        }
    }
}

async fn record(State(api): State<FakeApi>, req: Request) -> Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let bytes = axum::body::to_bytes(req.into_body(), usize::MAX).await.unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    api.requests.locked().push(Recorded { method, path, body });
    api.changed.notify_waiters();
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
        "message": "not found"});
    (StatusCode::NOT_FOUND, [("content-type", "application/json")], Body::from(status.to_string())).into_response()
}

/// A client of the fake API server, and its record.
pub fn fake_api() -> (kube::Client, FakeApi) {
    let api = FakeApi::default();
    let router = axum::Router::new().fallback(record).with_state(api.clone());
    (kube::Client::new(router.into_service::<kube::client::Body>(), "default"), api)
}

/// A node's settings with every folder under `dir`.
pub fn agent_config(dir: &Path) -> AgentConfig {
    let cidr = |s: &str| crate::net::parse_cluster_range(s).expect("a valid CIDR");
    AgentConfig {
        dir: dir.to_path_buf(),
        node_name: "node-1".into(),
        node_ips: vec!["192.0.2.10".parse().expect("an address")],
        external_ips: Vec::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        control_plane: false,
        pause_image: None,
        resolv_conf: None,
        runtime_endpoint: None,
        cluster_dns: vec!["10.43.0.10".parse().expect("an address")],
        dns_server: false,
        cluster_domain: "cluster.local".into(),
        cluster_cidr: cidr("10.42.0.0/16"),
        service_cidr: cidr("10.43.0.0/16"),
        flannel_backend: Default::default(),
        flannel_iface: None,
        pod_logs_dir: dir.join("pod-logs"),
        // No cgroup of this host is touched: none is under this root.
        kubelet: KubeletConfig { cgroup_root: "/ferrok-unit-tests".into(), ..KubeletConfig::default() },
        kubelet_tls: None,
    }
}

/// A prober that probes nothing: every running container is started and
/// ready, unless a test says a probe of it failed.
#[derive(Default)]
pub struct FakeProbes {
    failed: Mutex<Vec<(String, ProbeType)>>,
}

impl FakeProbes {
    /// The `probe` of the running container `name` has failed.
    pub fn fail(&self, name: &str, probe: ProbeType) {
        self.failed.locked().push((name.to_string(), probe));
    }
}

impl ProbeResults for FakeProbes {
    fn ensure(&self, _pod: &Pod, _rt: &RuntimePod, _pod_ip: Option<std::net::IpAddr>) {}

    fn state(&self, _pod: &Pod, rt: &RuntimePod) -> ProbeState {
        let failed = self.failed.locked().clone();
        let mut state = ProbeState::default();
        for c in rt.running() {
            state.started.insert(c.id.clone());
            if let Some((_, t)) = failed.iter().find(|(n, _)| *n == c.name) {
                state.must_restart.insert(c.id.clone(), *t);
            }
        }
        state
    }

    fn ready(&self, _pod: &Pod, rt: &RuntimePod) -> HashSet<String> {
        rt.running().map(|c| c.id.clone()).collect()
    }
}

/// A kubelet over the fakes, in a temporary folder.
pub struct TestNode {
    pub kubelet: Arc<Kubelet>,
    pub runtime: Arc<FakeRuntime>,
    pub api: FakeApi,
    pub probes: Arc<FakeProbes>,
    pub mounter: Arc<FakeMounter>,
    pub dir: tempfile::TempDir,
}

impl TestNode {
    pub fn start() -> TestNode {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let config = Arc::new(agent_config(dir.path()));
        let (client, api) = fake_api();
        let runtime = FakeRuntime::new();
        runtime.add_image("busybox:1");
        let events = Events::new(client.clone(), &config.node_name);
        let probes = Arc::new(FakeProbes::default());
        let manager = RuntimeManager {
            cri: runtime.clone(),
            client: client.clone(),
            events: events.clone(),
            images: ImageManager::new(runtime.clone(), client.clone(), events.clone()),
            index: Arc::new(ContainerIndex::default()),
            crash_backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
            hooks: None,
            probes: None,
            dns: super::dns::DnsSettings {
                cluster_dns: config.cluster_dns.clone(),
                cluster_domain: config.cluster_domain.clone(),
                host: Default::default(),
            },
            pods_dir: dir.path().join("pods"),
            pod_logs_dir: config.pod_logs_dir.clone(),
            cgroup_root: config.kubelet.cgroup_root.clone(),
            memory_capacity: 1 << 30,
        };
        let mounter = Arc::new(FakeMounter::default());
        let volumes =
            VolumeManager::with_mounter(client.clone(), dir.path().join("pods"), "node-1".into(), mounter.clone());
        let (_, node_allocatable) = tokio::sync::watch::channel(BTreeMap::new());
        let kubelet = Arc::new(Kubelet {
            client: client.clone(),
            config: config.clone(),
            runtime: Arc::new(manager),
            status: StatusManager::start(client),
            events,
            runtime_name: "fake".into(),
            host_ips: vec!["192.0.2.10".into()],
            allocatable: BTreeMap::new(),
            node_allocatable,
            services: kube::runtime::reflector::store().0,
            volumes,
            probes: probes.clone(),
            mirrors: Arc::default(),
        });
        TestNode { kubelet, runtime, api, probes, mounter, dir }
    }
}

/// A pod bound to the test node, from the JSON of its spec.
pub fn pod(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!("node-1");
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .expect("a pod")
}
