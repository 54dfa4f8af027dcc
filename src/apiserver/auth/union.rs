//! The authorizers asked in turn, as upstream's union authorizer runs
//! them for `--authorization-mode=Node,RBAC` behind its privileged-group
//! authorizer: system:masters may do anything (no reason given); a
//! kubelet what the Node authorizer allows; everyone (a kubelet too, when
//! the Node authorizer has no opinion) as RBAC allows. A refusal carries
//! the Node authorizer's reason, if it gave one.

use std::time::Duration;

use super::graph_populator::NodeGraphCaches;
use super::node_authorizer::{self, NodeDecision};
use super::rbac::{Attributes, RbacCache};
use super::{Decision, User};

/// The authorizers of one API server, over its caches.
pub struct Authorizers<'a> {
    pub rbac: &'a RbacCache,
    pub node_graph: &'a NodeGraphCaches,
}

impl Authorizers<'_> {
    /// Whether `user` may do what `attrs` describe, and why.
    pub fn decide(&self, user: &User, attrs: &Attributes) -> Decision {
        if user.in_group("system:masters") {
            return Decision { allowed: true, reason: String::new() };
        }
        let mut refusal = String::new();
        if let Some(node) = node_authorizer::node_identity(user) {
            match node_authorizer::authorize(node, attrs, &self.node_graph.graph()) {
                NodeDecision::Allow => return Decision { allowed: true, reason: String::new() },
                NodeDecision::NoOpinion(reason) => refusal = reason,
            }
        }
        match self.rbac.allowed_by(user, attrs) {
            Some(by) => Decision { allowed: true, reason: format!("RBAC: allowed by {by}") },
            None => Decision { allowed: false, reason: refusal },
        }
    }

    /// `decide`; but a kubelet refused an object its pods' graph does not
    /// (yet) lead to is asked again as the graph's caches change, for up to
    /// half a second: the kubelet may have seen its new pod on its own watch
    /// before the authorizer's cache did (upstream's kubelets retry instead).
    pub async fn decide_waiting_for_graph(&self, user: &User, attrs: &Attributes) -> Decision {
        let Some(_) = node_authorizer::node_identity(user) else { return self.decide(user, attrs) };
        let [mut pods, mut claims, mut volumes] = self.node_graph.subscribe();
        let mut decision = self.decide(user, attrs);
        let deadline = tokio::time::sleep(Duration::from_millis(500));
        tokio::pin!(deadline);
        while !decision.allowed && decision.reason.starts_with("no relationship found") {
            tokio::select! {
                _ = &mut deadline => break,
                r = pods.changed() => if r.is_err() { break },
                r = claims.changed() => if r.is_err() { break },
                r = volumes.changed() => if r.is_err() { break },
            }
            decision = self.decide(user, attrs);
        }
        decision
    }
}
