//! What the ReplicaSet controller reads and writes of the kind it runs
//! over (`ReplicaOwner`): a ReplicaSet itself, or a ReplicationController
//! seen as one (`replication.rs`), as upstream runs its ReplicaSet
//! controller over ReplicationControllers through a conversion. Selector,
//! template, replicas and minReadySeconds are read through the trait; status
//! is computed as a `ReplicaSetStatus` and written back in the kind's own.

use std::borrow::Cow;
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A kind whose objects keep `replicas` pods made from a template.
pub trait ReplicaOwner:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The kind's name as its work queue and logs know it.
    const QUEUE: &'static str;

    /// The pods it selects; None when it has no selector.
    fn selector(&self) -> Option<Cow<'_, LabelSelector>>;

    /// The template its pods are made from.
    fn template(&self) -> Option<&PodTemplateSpec>;

    /// `spec.replicas` (1 when unset, as upstream defaults it).
    fn desired_replicas(&self) -> i32;

    /// `spec.minReadySeconds`.
    fn min_ready_seconds(&self) -> i32;

    /// Its status as a ReplicaSet's.
    fn replica_status(&self) -> Option<ReplicaSetStatus>;

    /// A copy carrying `status`, in the kind's own form.
    fn with_replica_status(&self, status: ReplicaSetStatus) -> Self;

    /// Whether `api_version`/`kind` (an owner reference's) name this kind.
    fn is_kind(api_version: &str, kind: &str) -> bool {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        kind == Self::kind(&()) && group == Self::group(&())
    }
}

impl ReplicaOwner for ReplicaSet {
    const QUEUE: &'static str = "replicaset";

    fn selector(&self) -> Option<Cow<'_, LabelSelector>> {
        self.spec.as_ref().map(|s| Cow::Borrowed(&s.selector))
    }

    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().and_then(|s| s.template.as_ref())
    }

    fn desired_replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    fn min_ready_seconds(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
    }

    fn replica_status(&self) -> Option<ReplicaSetStatus> {
        self.status.clone()
    }

    fn with_replica_status(&self, status: ReplicaSetStatus) -> Self {
        ReplicaSet { status: Some(status), ..self.clone() }
    }
}
