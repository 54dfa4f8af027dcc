//! DefaultPreemption: when a pod fits nowhere, find a node where evicting
//! lower-priority pods would let it fit, respecting PodDisruptionBudgets.

use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::framework::{CycleState, NodeFailure};
use super::node_info::{NodeInfo, PodInfo};
use super::profile::Profile;
use crate::client::events::EventRecorder;

/// A node where the pod would fit once `victims` are gone.
pub struct Candidate {
    pub node: String,
    pub victims: Vec<Arc<PodInfo>>,
}

/// Chooses where to preempt; `Err` carries the message users see after
/// "preemption: " (empty when preemption does not apply).
pub fn find_candidate(
    _profile: &Profile,
    _state: &CycleState,
    _pod: &Arc<PodInfo>,
    _nodes: &[NodeInfo],
    _failures: &[NodeFailure],
    _pdbs: &[Arc<PodDisruptionBudget>],
) -> Result<Candidate, String> {
    Err(String::new())
}

/// Evicts the victims and nominates the node for the pod.
pub async fn preempt(
    _client: &kube::Client,
    _recorder: &EventRecorder,
    _pod: &PodInfo,
    _candidate: &Candidate,
) -> Result<(), kube::Error> {
    Ok(())
}
