//! What keeps a node healthy over months, started together: container log
//! rotation, container and image garbage collection, and the eviction
//! manager (which reports pressure through the node status' channel, calls
//! on both collectors when the disk runs short, and keeps new pods off a
//! node under pressure through the pod workers' admission check). Each is one task
//! that sleeps between passes; nothing here polls faster than upstream.
//! None of them imports the kubelet or the pod workers: each is handed
//! what it asks of them through a narrow trait, implemented here.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::container_gc::{self, ContainerGc};
use super::cri::{Cri, CriError};
use super::eviction::{self, EvictionConfig, EvictionManager, Reclaimers};
use super::image_gc::{ImageGcManager, ImageGcPolicy};
use super::kubelet::Kubelet;
use super::logs::rotation::{ContainerLogManager, LogRotatePolicy};
use super::node_status::NodePressure;
use super::pod_status::PodFailure;
use super::pod_workers::PodWorkers;

/// The eviction manager ends pods through their workers.
impl eviction::PodKiller for PodWorkers {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        PodWorkers::active_pods(self)
    }

    fn is_known(&self, uid: &str) -> bool {
        self.knows(uid)
    }

    fn kill_pod(&self, uid: &str, failure: PodFailure, grace_seconds: i64) -> bool {
        self.evict(uid, failure, grace_seconds)
    }
}

/// Container GC asks the workers which pods are wanted.
impl container_gc::PodStateProvider for PodWorkers {
    fn sources_ready(&self) -> bool {
        PodWorkers::sources_ready(self)
    }

    fn knows(&self, uid: &str) -> bool {
        PodWorkers::knows(self, uid)
    }
}

/// Container GC has the kubelet remove what is left of unwanted pods.
#[async_trait::async_trait]
impl container_gc::OrphanCleaner for Kubelet {
    async fn known_uids(&self) -> Result<HashSet<String>, CriError> {
        Kubelet::known_uids(self).await
    }

    async fn cleanup_orphan(&self, uid: &str) -> Result<(), CriError> {
        Kubelet::cleanup_orphan(self, uid).await
    }
}

/// Starts the node's housekeeping; `cri` is the runtime's socket (logs,
/// images, stats), `image_fs` containerd's root.
pub fn spawn(
    kubelet: Arc<Kubelet>,
    workers: Arc<PodWorkers>,
    cri: Cri,
    pressure: watch::Sender<NodePressure>,
    image_fs: PathBuf,
    sandbox_image: String,
) -> Vec<JoinHandle<()>> {
    let kc = &kubelet.config.kubelet;
    let logs = ContainerLogManager::new(
        cri.clone(),
        LogRotatePolicy {
            max_size: kc.container_log_max_size.max(0) as u64,
            max_files: kc.container_log_max_files as usize,
        },
    );
    let policy = ImageGcPolicy {
        high_threshold_percent: kc.image_gc_high_threshold_percent,
        low_threshold_percent: kc.image_gc_low_threshold_percent,
        min_age: kc.image_minimum_gc_age,
    };
    workers.add_admit_handler(super::eviction::admission::handler(pressure.subscribe(), kubelet.events.clone()));
    workers.add_admit_handler(super::predicate_admission::handler(
        kubelet.node_allocatable.clone(),
        kubelet.events.clone(),
    ));
    let container_gc = ContainerGc::new(kubelet.runtime.clone(), workers.clone(), kubelet.clone());
    let image_gc = ImageGcManager::new(
        cri.clone(),
        kubelet.events.clone(),
        &kubelet.config.node_name,
        policy,
        image_fs.clone(),
        sandbox_image,
    );
    // The node status waits on this channel: it must outlive the eviction
    // manager even if that task ended, or the status loop would spin.
    let pressure = Arc::new(pressure);
    let keeper = pressure.clone();
    let config = EvictionConfig {
        kubelet: kc.clone(),
        node_fs: kubelet.config.dir.clone(),
        image_fs,
        pods_dir: kubelet.runtime.pods_dir.clone(),
        pod_logs_dir: kubelet.runtime.pod_logs_dir.clone(),
        cgroup_root: kubelet.runtime.cgroup_root.clone(),
    };
    let reclaim = Reclaimers { containers: container_gc.clone(), images: image_gc.clone() };
    let eviction = EvictionManager::new(config, cri, kubelet.events.clone(), workers, pressure, reclaim);
    vec![
        tokio::spawn(logs.run()),
        tokio::spawn(container_gc.run()),
        tokio::spawn(image_gc.run()),
        tokio::spawn(eviction.run()),
        tokio::spawn(async move {
            let _keep = keeper;
            std::future::pending::<()>().await
        }),
    ]
}
