//! TTLController (ttl), as upstream's pkg/controller/ttl, acting as
//! `ttl-controller`: annotates every Node with
//! `node.alpha.kubernetes.io/ttl`, the number of seconds a kubelet may
//! cache the Secrets and ConfigMaps its pods use, from the cluster's size:
//! 0 up to 100 nodes, 15 up to 500, 30 up to 1000, 60 up to 2000, 300
//! beyond. The size steps have upstream's overlap (up past 100 nodes,
//! down again only below 90, and so on), so a cluster at a boundary does
//! not flap.
//!
//! Upstream relies on each kubelet's status heartbeats to revisit every
//! node; this skips heartbeats and instead revisits every node when the
//! step changes.

use std::sync::{Arc, Mutex};

use crate::controllers::work_queue::Action;
use futures_util::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::informers::{self, Trigger};
use super::ControllerError;
use crate::client::informer::Change;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::predicates::node_heartbeat_only;
use crate::sync::LockExt;

/// The service account it acts as.
pub const NAME: &str = "ttl-controller";
/// The annotation (upstream's `v1.ObjectTTLAnnotationKey`).
pub const TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";

/// A range of cluster sizes and the TTL it gets.
struct Boundary {
    size_min: usize,
    size_max: usize,
    ttl_seconds: u32,
}

/// Upstream's steps: the ranges overlap, so the step a cluster is in
/// depends on the way it came.
const BOUNDARIES: [Boundary; 5] = [
    Boundary { size_min: 0, size_max: 100, ttl_seconds: 0 },
    Boundary { size_min: 90, size_max: 500, ttl_seconds: 15 },
    Boundary { size_min: 450, size_max: 1000, ttl_seconds: 30 },
    Boundary { size_min: 900, size_max: 2000, ttl_seconds: 60 },
    Boundary { size_min: 1800, size_max: usize::MAX, ttl_seconds: 300 },
];

/// The step a cluster of `count` nodes is in, coming from `step`.
fn step_for(count: usize, mut step: usize) -> usize {
    while step + 1 < BOUNDARIES.len() && count > BOUNDARIES[step].size_max {
        step += 1;
    }
    while step > 0 && count < BOUNDARIES[step].size_min {
        step -= 1;
    }
    step
}

/// The cluster's size step, shared by the trigger and the reconcile.
#[derive(Default)]
struct Sizing {
    step: usize,
}

struct Context {
    client: kube::Client,
    sizing: Arc<Mutex<Sizing>>,
}

fn desired_ttl(sizing: &Mutex<Sizing>) -> u32 {
    BOUNDARIES[sizing.locked().step].ttl_seconds
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (nodes, changes) = informers.informer::<Node>().subscribe().skip_updates(node_heartbeat_only).into_changes();
    let sizing = Arc::new(Mutex::new(Sizing::default()));
    let trigger = requests(changes, nodes.clone(), sizing.clone());
    informers::run("ttlcontroller", nodes, vec![trigger], reconcile, Arc::new(Context { client, sizing })).await;
}

/// Each node changed, and every node when the cluster moves to another step.
fn requests(
    changes: futures_util::stream::BoxStream<'static, Change<Node>>,
    nodes: Store<Node>,
    sizing: Arc<Mutex<Sizing>>,
) -> Trigger<Node> {
    changes
        .flat_map(move |change| {
            let count = || nodes.state().len();
            let touched: Vec<Arc<Node>> = match &change {
                // The size is known once a list is complete: what it holds.
                Change::Relist | Change::Listed(_) => Vec::new(),
                Change::Synced | Change::Deleted(_) | Change::Applied { old: None, .. } => {
                    let mut s = sizing.locked();
                    let step = step_for(count(), s.step);
                    if step != s.step || matches!(change, Change::Synced) {
                        s.step = step;
                        nodes.state()
                    } else {
                        change.object().filter(|_| !matches!(change, Change::Deleted(_))).cloned().into_iter().collect()
                    }
                }
                Change::Applied { new, .. } => vec![new.clone()],
            };
            stream::iter(touched.into_iter().map(|n| Ok(ReconcileRequest::from(ObjectRef::from_obj(&*n)))))
        })
        .boxed()
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let desired = desired_ttl(&ctx.sizing);
    let current = node.metadata.annotations.as_ref().and_then(|a| a.get(TTL_ANNOTATION)).and_then(|v| v.parse().ok());
    if current == Some(desired) {
        return Ok(Action::await_change());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {TTL_ANNOTATION: desired.to_string()}}});
    match Api::<Node>::all(ctx.client.clone()).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::debug!(node = %name, ttl = desired, "ttl annotation changed"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_go_up_past_the_max_and_down_below_the_min() {
        assert_eq!(step_for(1, 0), 0);
        assert_eq!(step_for(100, 0), 0);
        assert_eq!(step_for(101, 0), 1);
        // Down again only below 90.
        assert_eq!(step_for(95, 1), 1);
        assert_eq!(step_for(89, 1), 0);
        assert_eq!(step_for(5000, 0), 4);
        assert_eq!(step_for(1900, 4), 4);
        assert_eq!(step_for(3, 4), 0);
        assert_eq!(BOUNDARIES[step_for(600, 0)].ttl_seconds, 30);
    }
}
