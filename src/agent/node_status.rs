//! Registration and status of this node, as upstream's kubelet_node_status:
//! the Node is created (or adopted) with upstream's labels, then its status —
//! capacity and allocatable from the host, addresses, nodeInfo, images,
//! runtime handlers and the Ready/MemoryPressure/DiskPressure/PIDPressure
//! conditions — is written when it changes and at least every report period
//! (5 min), never more often than needed. Liveness is the Lease's job.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeRuntimeHandler,
    NodeRuntimeHandlerFeatures, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{watch, Notify};

use super::config::{AgentConfig, Signal};
use super::cri::{self, Cri};
use crate::client::informer::WatchEvents;
use crate::client::informer_factory::SharedInformerFactory;
use crate::host;
use crate::network::overlay::FlannelBackend;
use crate::quantity::{Amount, Format};

/// The kubelet version ferrok reports.
pub const KUBELET_VERSION: &str = concat!("v1.33.0+ferrok-", env!("CARGO_PKG_VERSION"));
/// Upstream reports at most this many images in node status.
const MAX_IMAGES: usize = 50;

/// What the eviction manager says about the node's resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodePressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeStatusError {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("node {0:?} exists and belongs to another kubelet: {1}")]
    Taken(String, String),
}

/// The Node a kubelet registers: labels, taints and a first status.
pub fn node_to_register(config: &AgentConfig, status: NodeStatus) -> Node {
    let mut labels = BTreeMap::new();
    let arch = host::goarch();
    labels.insert("kubernetes.io/hostname".to_string(), config.node_name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), arch.to_string());
    labels.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("beta.kubernetes.io/arch".to_string(), arch.to_string());
    labels.insert("node.kubernetes.io/instance-type".to_string(), "ferrok".to_string());
    if config.control_plane {
        labels.insert("node-role.kubernetes.io/control-plane".to_string(), "true".to_string());
    }
    labels.extend(config.labels.clone());
    let mut annotations = BTreeMap::new();
    annotations.insert("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string());
    annotations.insert("volumes.kubernetes.io/controller-managed-attach-detach".to_string(), "true".to_string());
    Node {
        metadata: ObjectMeta {
            name: Some(config.node_name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!config.taints.is_empty()).then(|| config.taints.clone()),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// What the status is computed from, besides the host.
pub struct StatusInputs {
    pub config: Arc<AgentConfig>,
    pub cri: Cri,
    pub handlers: Vec<String>,
    pub pressure: watch::Receiver<NodePressure>,
    /// The node's allocatable as the API holds it (extended resources
    /// included), for the node's own admission of pods.
    pub allocatable: watch::Sender<BTreeMap<String, Quantity>>,
}

/// Bytes (whole KiB) as upstream's BinarySI quantity prints them.
fn ki(bytes: u64) -> Quantity {
    let kib = i64::try_from(bytes / 1024).unwrap_or(i64::MAX / 1024);
    Amount::from_units(kib * 1024, Format::BinarySI).to_quantity()
}

/// Capacity and allocatable (capacity less the hard eviction thresholds, as upstream).
pub fn resources(config: &AgentConfig) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let cpu = host::cpu_count().to_string();
    let memory = host::meminfo("MemTotal").unwrap_or(0);
    let fs = host::fs_stats(&config.dir).unwrap_or_default();
    let pods = config.kubelet.max_pods.to_string();
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), Quantity(cpu.clone()));
    capacity.insert("memory".to_string(), ki(memory));
    capacity.insert("ephemeral-storage".to_string(), ki(fs.capacity));
    capacity.insert("pods".to_string(), Quantity(pods.clone()));
    capacity.insert("hugepages-1Gi".to_string(), Quantity("0".into()));
    capacity.insert("hugepages-2Mi".to_string(), Quantity("0".into()));
    let threshold = |signal: Signal, total: u64| {
        config
            .kubelet
            .eviction_hard
            .iter()
            .find(|t| t.signal == signal)
            .map(|t| t.value.amount(total as i64).max(0) as u64)
            .unwrap_or(0)
    };
    let mut allocatable = capacity.clone();
    allocatable.insert("memory".to_string(), ki(memory.saturating_sub(threshold(Signal::MemoryAvailable, memory))));
    allocatable.insert(
        "ephemeral-storage".to_string(),
        Quantity(fs.capacity.saturating_sub(threshold(Signal::NodeFsAvailable, fs.capacity)).to_string()),
    );
    (capacity, allocatable)
}

fn addresses(config: &AgentConfig) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = Vec::new();
    for ip in &config.node_ips {
        out.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
    }
    for ip in &config.external_ips {
        out.push(NodeAddress { type_: "ExternalIP".into(), address: ip.to_string() });
    }
    out.push(NodeAddress { type_: "Hostname".into(), address: host::hostname() });
    out
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: kind.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        ..Default::default()
    }
}

/// Why the runtime or its network is not ready, in upstream's words; None when ready.
async fn runtime_not_ready(cri: &Cri) -> Option<String> {
    let status = match cri.status().await {
        Ok(s) => s,
        Err(e) => return Some(format!("container runtime is down: {e}")),
    };
    let mut problems = Vec::new();
    for (kind, what) in [("RuntimeReady", "container runtime"), ("NetworkReady", "container runtime network")] {
        match cri::condition(&status, kind) {
            Some(c) if c.status => {}
            Some(c) => {
                problems.push(format!("{what} not ready: {kind}=false reason:{} message:{}", c.reason, c.message))
            }
            None => problems.push(format!("{what} not ready: {kind} is not reported")),
        }
    }
    (!problems.is_empty()).then(|| problems.join(", "))
}

async fn images(cri: &Cri) -> Vec<ContainerImage> {
    let Ok(images) = cri.list_images().await else {
        return Vec::new();
    };
    let mut list: Vec<ContainerImage> = images
        .into_iter()
        .map(|i| {
            let mut names = i.repo_digests.clone();
            names.extend(i.repo_tags.iter().cloned());
            ContainerImage { names: Some(names), size_bytes: Some(i.size as i64) }
        })
        .filter(|i| i.names.as_ref().is_some_and(|n| !n.is_empty()))
        .collect();
    list.sort_by_key(|i| std::cmp::Reverse(i.size_bytes));
    list.truncate(MAX_IMAGES);
    list
}

/// The node's status now (heartbeat times left empty).
pub async fn current_status(inputs: &StatusInputs) -> NodeStatus {
    let config = &inputs.config;
    let (capacity, allocatable) = resources(config);
    let pressure = *inputs.pressure.borrow();
    let not_ready = runtime_not_ready(&inputs.cri).await;
    let version = inputs.cri.version().await.ok();
    let (kernel, _) = host::uname();
    let ready = match &not_ready {
        None => condition("Ready", true, "KubeletReady", "kubelet is posting ready status"),
        Some(why) => condition("Ready", false, "KubeletNotReady", why),
    };
    let conditions = vec![
        if pressure.memory {
            condition(
                "MemoryPressure",
                true,
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            )
        } else {
            condition("MemoryPressure", false, "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
        },
        if pressure.disk {
            condition("DiskPressure", true, "KubeletHasDiskPressure", "kubelet has disk pressure")
        } else {
            condition("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
        },
        if pressure.pid {
            condition("PIDPressure", true, "KubeletHasInsufficientPID", "kubelet has insufficient PID available")
        } else {
            condition("PIDPressure", false, "KubeletHasSufficientPID", "kubelet has sufficient PID available")
        },
        ready,
    ];
    let mut runtime_handlers = vec![NodeRuntimeHandler {
        name: Some(String::new()),
        features: Some(NodeRuntimeHandlerFeatures {
            recursive_read_only_mounts: Some(false),
            user_namespaces: Some(false),
        }),
    }];
    for h in &inputs.handlers {
        runtime_handlers.push(NodeRuntimeHandler {
            name: Some(h.clone()),
            features: Some(NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: Some(false),
                user_namespaces: Some(false),
            }),
        });
    }
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conditions),
        addresses: Some(addresses(config)),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: config.kubelet.port as i32 }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: host::goarch().into(),
            boot_id: host::boot_id(),
            container_runtime_version: version
                .map(|v| format!("{}://{}", v.runtime_name, v.runtime_version))
                .unwrap_or_default(),
            kernel_version: kernel,
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.into(),
            machine_id: host::machine_id(),
            operating_system: "linux".into(),
            os_image: host::os_image(),
            system_uuid: host::system_uuid(),
            swap: None,
        }),
        images: Some(images(&inputs.cri).await),
        runtime_handlers: Some(runtime_handlers),
        ..Default::default()
    }
}

/// Creates the Node, or takes over an existing one of the same name (a
/// restart), reconciling its labels; returns the stored Node. The labels a
/// kubelet may not set itself (NodeRestriction: `node-role.kubernetes.io/…`,
/// `node-restriction.kubernetes.io/…`, other `kubernetes.io` labels) are
/// set through `labeler` when there is one (the server labelling its own
/// node, as k3s' supervisor does), and otherwise left out with a warning.
pub async fn register(
    client: &kube::Client,
    labeler: Option<&kube::Client>,
    config: &AgentConfig,
    status: NodeStatus,
) -> Result<Node, NodeStatusError> {
    let api: Api<Node> = Api::all(client.clone());
    let mut wanted = node_to_register(config, status);
    let (own, restricted): (BTreeMap<String, String>, BTreeMap<String, String>) = wanted
        .metadata
        .labels
        .take()
        .unwrap_or_default()
        .into_iter()
        .partition(|(k, _)| crate::well_known::labels::kubelet_may_set_label(k));
    wanted.metadata.labels = Some(own.clone());
    let mut node = match api.create(&PostParams::default(), &wanted).await {
        Ok(node) => {
            tracing::info!(node = %config.node_name, "node registered");
            node
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // Upstream reconciles only its own labels on an existing Node;
            // user-set labels and taints stay as they are.
            let patch = json!({"metadata": {"labels": own}});
            let node = api.patch(&config.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            tracing::info!(node = %config.node_name, "node already registered; updated it");
            node
        }
        Err(e) => return Err(e.into()),
    };
    let missing = restricted.iter().any(|(k, v)| node.metadata.labels.as_ref().and_then(|l| l.get(k)) != Some(v));
    if missing {
        match labeler {
            Some(labeler) => {
                let patch = json!({"metadata": {"labels": restricted}});
                node = Api::<Node>::all(labeler.clone())
                    .patch(&config.node_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            None => tracing::warn!(
                node = %config.node_name,
                labels = ?restricted.keys().collect::<Vec<_>>(),
                "a node may not set these labels on itself (NodeRestriction); set them with kubectl label"
            ),
        }
    }
    Ok(node)
}

/// The status without times, for change detection.
fn comparable(status: &NodeStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Some(conds) = v.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in conds {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastHeartbeatTime");
                m.remove("lastTransitionTime");
            }
        }
    }
    v
}

/// The changes of this node's own Node, from `informers`: from the
/// process's informer of every Node when the process watches them all
/// anyway (a server's controllers, the overlay's routes to other nodes),
/// else from one of this Node alone (a field selector, as upstream's
/// kubelet watches it), shared by everything on the node that reads it.
pub fn own_node_changes(informers: &SharedInformerFactory, config: &AgentConfig) -> WatchEvents<Node> {
    let every_node_watched = config.control_plane || config.flannel_backend != FlannelBackend::None;
    let informer = if every_node_watched {
        informers.informer::<Node>()
    } else {
        informers.informer_with(watcher::Config::default().fields(&format!("metadata.name={}", config.node_name)))
    };
    let name = config.node_name.clone();
    informer.subscribe().only(move |n: &Node| n.metadata.name.as_deref() == Some(name.as_str())).into_watch_events().1
}

/// Writes the status whenever it changes (checked every update period and
/// whenever `trigger` fires) and at least every report period; `own` is
/// the Node's changes (`own_node_changes`).
pub async fn run(
    client: kube::Client,
    mut inputs: StatusInputs,
    first: Node,
    trigger: Arc<Notify>,
    mut own: WatchEvents<Node>,
) {
    let api: Api<Node> = Api::all(client);
    let name = inputs.config.node_name.clone();
    let update_every = inputs.config.kubelet.node_status_update_frequency;
    let report_every = inputs.config.kubelet.node_status_report_frequency;
    // What the API holds: conditions keep their transition times across writes.
    let mut written: Option<NodeStatus> = first.status;
    let mut written_at: Option<Instant> = None;
    // The extended resources others advertise in the node's capacity, from
    // a watch of the Node (upstream's kubelet reads its Node at each update).
    let mut extended = extended_resources(written.as_ref());
    loop {
        let mut status = current_status(&inputs).await;
        add_extended_resources(&mut status, &extended);
        let changed = written.as_ref().is_none_or(|w| comparable(w) != comparable(&status));
        let due = written_at.is_none_or(|t| t.elapsed() >= report_every);
        if changed || due {
            stamp_conditions(&mut status, written.as_ref());
            let mut patch = json!({"status": status});
            // A resource no longer in capacity leaves allocatable too.
            for list in ["capacity", "allocatable"] {
                let before = written.as_ref().and_then(|w| {
                    if list == "capacity" {
                        w.capacity.as_ref()
                    } else {
                        w.allocatable.as_ref()
                    }
                });
                for key in before.into_iter().flat_map(|b| b.keys()) {
                    if patch["status"][list].get(key).is_none() {
                        patch["status"][list][key] = serde_json::Value::Null;
                    }
                }
            }
            match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(node) => {
                    if let Some(a) = node.status.as_ref().and_then(|s| s.allocatable.clone()) {
                        inputs.allocatable.send_replace(a);
                    }
                    written = node.status;
                    written_at = Some(Instant::now());
                    if changed {
                        tracing::debug!(node = %name, "node status written");
                    }
                }
                Err(e) => tracing::warn!(error = %e, node = %name, "cannot write the node status"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(update_every) => {}
            _ = trigger.notified() => {}
            _ = inputs.pressure.changed() => {}
            event = own.next() => match event {
                Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node))) => {
                    extended = extended_resources(node.status.as_ref());
                }
                Some(Err(e)) => tracing::debug!(error = %e, node = %name, "watch of the node failed; retried"),
                _ => {}
            }
        }
    }
}

/// The extended resources (`example.com/dongle`) in a node's capacity: not
/// the kubelet's to measure, advertised by whoever patched them in.
fn extended_resources(status: Option<&NodeStatus>) -> BTreeMap<String, Quantity> {
    let is_extended =
        |name: &str| name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.");
    status
        .and_then(|s| s.capacity.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| is_extended(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Extended resources are in capacity and, all of them, in allocatable
/// (upstream's MachineInfo setter: nothing reserved of them).
fn add_extended_resources(status: &mut NodeStatus, extended: &BTreeMap<String, Quantity>) {
    for (k, v) in extended {
        status.capacity.get_or_insert_with(BTreeMap::new).insert(k.clone(), v.clone());
        status.allocatable.get_or_insert_with(BTreeMap::new).insert(k.clone(), v.clone());
    }
}

/// Heartbeat now; transition time kept unless the condition's status changed.
fn stamp_conditions(status: &mut NodeStatus, previous: Option<&NodeStatus>) {
    let now = Time(Timestamp::now());
    let before = previous.and_then(|p| p.conditions.as_ref());
    for c in status.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = Some(now.clone());
        let old = before.and_then(|b| b.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match old {
            Some(o) if o.status == c.status => o.last_transition_time.clone().or_else(|| Some(now.clone())),
            _ => Some(now.clone()),
        };
    }
}

/// How long node registration waits between attempts.
pub const REGISTER_RETRY: Duration = Duration::from_millis(500);
