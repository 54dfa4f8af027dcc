//! An authorization decision as the audit log records it: upstream's
//! `authorization.k8s.io/decision` (`allow` or `forbid`) and
//! `authorization.k8s.io/reason` annotations. The audit middleware puts an
//! empty record in each request's extensions; whoever authorizes the
//! request fills it in.

use std::sync::{Arc, Mutex};

use crate::sync::LockExt;

/// What the authorizer decided, and why (the RBAC binding that allowed it;
/// empty for system:masters and for a refusal, as upstream leaves it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// The slot a request's decision is written to.
#[derive(Debug, Clone, Default)]
pub struct DecisionRecord(Arc<Mutex<Option<Decision>>>);

impl DecisionRecord {
    /// Keeps the first refusal, else the last decision: a request authorized
    /// twice (impersonation, then the resource) is refused by either.
    pub fn set(&self, decision: &Decision) {
        let mut slot = self.0.locked();
        if slot.as_ref().is_none_or(|d| d.allowed) {
            *slot = Some(decision.clone());
        }
    }

    pub fn get(&self) -> Option<Decision> {
        self.0.locked().clone()
    }
}
