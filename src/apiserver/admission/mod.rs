//! Admission: after an object is decoded and defaulted, the mutating
//! plugins run (NodeRestriction for kubelets, the built-ins ServiceAccount, Priority, DefaultStorageClass
//! and LimitRanger, then MutatingAdmissionWebhook), the object is
//! validated, and the validating plugins run (LimitRanger's bounds, PersistentVolumeClaimResize, the certificates API's
//! CertificateApproval, CertificateSigning and CertificateSubjectRestriction, ValidatingAdmissionWebhook,
//! then ResourceQuota last, as upstream, so that a create is charged to
//! its quota only once nothing else can refuse it). Nothing is stored
//! unless all agree. A connect request (exec, attach, port-forward, the
//! proxies) is admitted as CONNECT with its options object, by the
//! webhooks only, before anything is connected.

mod builtin;
mod certificates;
mod limit_ranger;
pub mod node_restriction;
mod pvc_resize;
pub mod resource_quota;
pub mod webhook;

use serde_json::Value;

use super::call::Call;
use super::status::ApiResult;

/// What kind of write is being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The mutating plugins, in upstream's order. NodeRestriction looks at the
/// kubelet's write first, as it sent it (before the ServiceAccount plugin
/// names a service account a mirror pod must not have).
pub async fn mutate(call: &Call, obj: &mut Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    node_restriction::admit(call, obj, old, op).await?;
    builtin::mutate(call, obj, op).await?;
    webhook::call_all(call, webhook::Reviewed::Mutable(obj), old, op).await
}

/// The validating plugins (and, for a delete, which no mutating plugin
/// sees, NodeRestriction).
pub async fn validate(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    if op == Operation::Delete {
        node_restriction::admit(call, obj, old, op).await?;
    }
    limit_ranger::validate(call, obj, op)?;
    pvc_resize::admit(call, obj, old, op).await?;
    certificates::admit(call, obj, old, op)?;
    webhook::call_all(call, webhook::Reviewed::ReadOnly(obj), old, op).await?;
    resource_quota::admit(call, obj, old, op).await
}

/// Admission of a connect request (upstream's ConnectResource): the
/// mutating webhooks, which may change the options object
/// (`PodAttachOptions`, ...), then the validating ones.
pub async fn connect(call: &Call, options: &mut Value) -> ApiResult<()> {
    webhook::call_all(call, webhook::Reviewed::Mutable(options), None, Operation::Connect).await?;
    webhook::call_all(call, webhook::Reviewed::ReadOnly(options), None, Operation::Connect).await
}
