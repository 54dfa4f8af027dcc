//! What keeps a node healthy over months, started together: container log
//! rotation, container and image garbage collection, and the eviction
//! manager (which reports pressure through the node status' channel, calls
//! on both collectors when the disk runs short, and keeps new pods off a
//! node under pressure through the pod workers' admission check). Each is one task
//! that sleeps between passes; nothing here polls faster than upstream.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::container_gc::ContainerGc;
use super::eviction::EvictionManager;
use super::image_gc::{ImageGcManager, ImageGcPolicy};
use super::kubelet::Kubelet;
use super::logs::{ContainerLogManager, LogRotatePolicy};
use super::node_status::NodePressure;
use super::pod_workers::PodWorkers;

/// Starts the node's housekeeping; `image_fs` is containerd's root.
pub fn spawn(
    kubelet: Arc<Kubelet>,
    workers: Arc<PodWorkers>,
    pressure: watch::Sender<NodePressure>,
    image_fs: PathBuf,
    sandbox_image: String,
) -> Vec<JoinHandle<()>> {
    let kc = &kubelet.config.kubelet;
    let logs = ContainerLogManager::new(
        kubelet.runtime.cri.clone(),
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
    let container_gc = ContainerGc::new(kubelet.clone(), workers.clone());
    let image_gc = ImageGcManager::new(kubelet.clone(), policy, image_fs.clone(), sandbox_image);
    // The node status waits on this channel: it must outlive the eviction
    // manager even if that task ended, or the status loop would spin.
    let pressure = Arc::new(pressure);
    let keeper = pressure.clone();
    let eviction = EvictionManager::new(kubelet, workers, pressure, container_gc.clone(), image_gc.clone(), image_fs);
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
