//! The built-in resources of Kubernetes v1.33 that a single-node
//! distribution serves, each decoded through its `k8s-openapi` type.

use k8s_openapi::api::{
    admissionregistration::v1 as admission, apps::v1 as apps, autoscaling::v2 as autoscaling, batch::v1 as batch,
    certificates::v1 as certificates, coordination::v1 as coordination, core::v1 as core, discovery::v1 as discovery,
    events::v1 as events, flowcontrol::v1 as flowcontrol, networking::v1 as networking, node::v1 as node,
    policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling, storage::v1 as storage,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as apiregistration;
use std::sync::Arc;

use k8s_openapi::{ClusterResourceScope, ListableResource, NamespaceResourceScope};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::apiserver::kinds;
use crate::apiserver::resource::{Resource, ScalePaths, CRUD_VERBS};
use crate::apiserver::strategy::{Described, Hooks, Strategy, Typed};

/// Whether a `k8s-openapi` scope is namespaced.
trait Scope {
    const NAMESPACED: bool;
}
impl Scope for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}
impl Scope for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

#[derive(Default)]
struct Spec {
    short: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    scale: bool,
    sub: &'static [&'static str],
    hooks: Hooks,
}

fn resource<K>(spec: Spec) -> Resource
where
    K: ListableResource + DeserializeOwned + Serialize + Described + 'static,
    K::Scope: Scope,
{
    let names = Names::of::<K>(K::LIST_KIND, <K::Scope as Scope>::NAMESPACED);
    let strategy = Arc::new(Typed::<K>::new(spec.hooks));
    listable(names, spec, strategy)
}

/// What a kind's type says of its resource.
struct Names {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    list_kind: &'static str,
    plural: &'static str,
    namespaced: bool,
}

impl Names {
    fn of<K: k8s_openapi::Resource>(list_kind: &'static str, namespaced: bool) -> Names {
        Names {
            group: K::GROUP,
            version: K::VERSION,
            kind: K::KIND,
            list_kind,
            plural: K::URL_PATH_SEGMENT,
            namespaced,
        }
    }

    fn resource(self, verbs: Vec<String>, strategy: Arc<dyn Strategy>) -> Resource {
        Resource {
            group: self.group.into(),
            version: self.version.into(),
            kind: self.kind.into(),
            list_kind: self.list_kind.into(),
            plural: self.plural.into(),
            singular: self.kind.to_ascii_lowercase(),
            namespaced: self.namespaced,
            verbs,
            short_names: Vec::new(),
            categories: Vec::new(),
            status: false,
            scale: None,
            subresources: Vec::new(),
            ephemeral: false,
            computed: false,
            begin_write: None,
            strategy,
        }
    }
}

/// The resource of a stored, listable kind (one copy of this code for
/// every kind: `resource` only names the type).
#[inline(never)]
fn listable(names: Names, spec: Spec, strategy: Arc<dyn Strategy>) -> Resource {
    let scale = spec.scale.then(|| ScalePaths {
        spec_replicas: ".spec.replicas".into(),
        status_replicas: ".status.replicas".into(),
        label_selector: Some(".status.selector".into()),
    });
    Resource {
        short_names: spec.short.iter().map(|s| s.to_string()).collect(),
        categories: spec.categories.iter().map(|s| s.to_string()).collect(),
        status: spec.status,
        scale,
        subresources: spec.sub.iter().map(|s| s.to_string()).collect(),
        ..names.resource(CRUD_VERBS.iter().map(|v| v.to_string()).collect(), strategy)
    }
}

fn with_generation(hooks: Hooks) -> Hooks {
    Hooks { generation: true, ..hooks }
}

/// A create-only review resource that is answered, never stored.
fn review<K>(namespaced: bool) -> Resource
where
    K: k8s_openapi::Resource + DeserializeOwned + Serialize + Described + 'static,
{
    let strategy = Arc::new(Typed::<K>::new(Hooks::default()));
    Resource { ephemeral: true, ..Names::of::<K>("", namespaced).resource(vec!["create".into()], strategy) }
}

const ALL: &[&str] = &["all"];

pub fn resources() -> Vec<Resource> {
    vec![
        // core/v1
        resource::<core::Pod>(Spec {
            short: &["po"],
            categories: ALL,
            status: true,
            sub: &[
                "binding",
                "eviction",
                "log",
                "exec",
                "attach",
                "portforward",
                "proxy",
                "ephemeralcontainers",
                "resize",
            ],
            hooks: kinds::pod_hooks(),
            ..Default::default()
        }),
        resource::<core::ConfigMap>(Spec { short: &["cm"], hooks: kinds::configmap_hooks(), ..Default::default() }),
        resource::<core::Secret>(Spec { hooks: kinds::secret_hooks(), ..Default::default() }),
        // Namespaces are deleted one by one (no deletecollection), as upstream.
        Resource {
            verbs: CRUD_VERBS.iter().filter(|v| **v != "deletecollection").map(|v| v.to_string()).collect(),
            ..resource::<core::Namespace>(Spec {
                short: &["ns"],
                status: true,
                sub: &["finalize"],
                hooks: kinds::namespace_hooks(),
                ..Default::default()
            })
        },
        resource::<core::Service>(Spec {
            short: &["svc"],
            categories: ALL,
            status: true,
            sub: &["proxy"],
            hooks: kinds::service_hooks(),
            ..Default::default()
        }),
        resource::<core::ServiceAccount>(Spec {
            short: &["sa"],
            sub: &["token"],
            hooks: kinds::serviceaccount_hooks(),
            ..Default::default()
        }),
        resource::<core::Endpoints>(Spec { short: &["ep"], hooks: kinds::endpoints_hooks(), ..Default::default() }),
        resource::<core::Node>(Spec {
            short: &["no"],
            status: true,
            sub: &["proxy"],
            hooks: kinds::node_hooks(),
            ..Default::default()
        }),
        Resource {
            verbs: vec!["get".into(), "list".into()],
            computed: true,
            ..resource::<core::ComponentStatus>(Spec {
                short: &["cs"],
                hooks: kinds::componentstatus_hooks(),
                ..Default::default()
            })
        },
        resource::<core::Event>(Spec { short: &["ev"], hooks: kinds::event_hooks(), ..Default::default() }),
        // The legacy collection form of pods/binding: create only, never stored.
        review::<core::Binding>(true),
        resource::<core::PersistentVolume>(Spec {
            short: &["pv"],
            status: true,
            hooks: kinds::persistentvolume_hooks(),
            ..Default::default()
        }),
        resource::<core::PersistentVolumeClaim>(Spec {
            short: &["pvc"],
            status: true,
            hooks: kinds::persistentvolumeclaim_hooks(),
            ..Default::default()
        }),
        resource::<core::LimitRange>(Spec {
            short: &["limits"],
            hooks: kinds::limitrange_hooks(),
            ..Default::default()
        }),
        resource::<core::ResourceQuota>(Spec {
            short: &["quota"],
            status: true,
            hooks: kinds::resourcequota_hooks(),
            ..Default::default()
        }),
        resource::<core::PodTemplate>(Spec { hooks: kinds::podtemplate_hooks(), ..Default::default() }),
        resource::<core::ReplicationController>(Spec {
            short: &["rc"],
            categories: ALL,
            status: true,
            scale: true,
            hooks: with_generation(kinds::replicationcontroller_hooks()),
            ..Default::default()
        }),
        // apps/v1
        resource::<apps::Deployment>(Spec {
            short: &["deploy"],
            categories: ALL,
            status: true,
            scale: true,
            hooks: kinds::deployment_hooks(),
            ..Default::default()
        }),
        resource::<apps::ReplicaSet>(Spec {
            short: &["rs"],
            categories: ALL,
            status: true,
            scale: true,
            hooks: kinds::replicaset_hooks(),
            ..Default::default()
        }),
        resource::<apps::StatefulSet>(Spec {
            short: &["sts"],
            categories: ALL,
            status: true,
            scale: true,
            hooks: kinds::statefulset_hooks(),
            ..Default::default()
        }),
        resource::<apps::DaemonSet>(Spec {
            short: &["ds"],
            categories: ALL,
            status: true,
            hooks: kinds::daemonset_hooks(),
            ..Default::default()
        }),
        resource::<apps::ControllerRevision>(Spec { hooks: kinds::controllerrevision_hooks(), ..Default::default() }),
        // batch/v1
        resource::<batch::Job>(Spec { categories: ALL, status: true, hooks: kinds::job_hooks(), ..Default::default() }),
        resource::<batch::CronJob>(Spec {
            short: &["cj"],
            categories: ALL,
            status: true,
            hooks: kinds::cronjob_hooks(),
            ..Default::default()
        }),
        // autoscaling/v2
        resource::<autoscaling::HorizontalPodAutoscaler>(Spec {
            short: &["hpa"],
            categories: ALL,
            status: true,
            hooks: with_generation(kinds::horizontalpodautoscaler_hooks()),
            ..Default::default()
        }),
        // autoscaling/v1: stored as v2 through its conversion
        resource::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>(Spec {
            short: &["hpa"],
            categories: ALL,
            status: true,
            hooks: kinds::horizontalpodautoscaler_v1_hooks(),
            ..Default::default()
        }),
        // policy/v1
        resource::<policy::PodDisruptionBudget>(Spec {
            short: &["pdb"],
            status: true,
            hooks: with_generation(kinds::poddisruptionbudget_hooks()),
            ..Default::default()
        }),
        // rbac.authorization.k8s.io/v1
        resource::<rbac::ClusterRole>(Spec { hooks: kinds::role_hooks(), ..Default::default() }),
        resource::<rbac::ClusterRoleBinding>(Spec { hooks: kinds::role_binding_hooks(), ..Default::default() }),
        resource::<rbac::Role>(Spec { hooks: kinds::role_hooks(), ..Default::default() }),
        resource::<rbac::RoleBinding>(Spec { hooks: kinds::role_binding_hooks(), ..Default::default() }),
        // networking.k8s.io/v1
        resource::<networking::Ingress>(Spec {
            short: &["ing"],
            status: true,
            hooks: with_generation(kinds::ingress_hooks()),
            ..Default::default()
        }),
        resource::<networking::IngressClass>(Spec { hooks: kinds::ingressclass_hooks(), ..Default::default() }),
        resource::<networking::NetworkPolicy>(Spec {
            short: &["netpol"],
            hooks: with_generation(kinds::networkpolicy_hooks()),
            ..Default::default()
        }),
        resource::<networking::IPAddress>(Spec {
            short: &["ip"],
            hooks: kinds::ipaddress_hooks(),
            ..Default::default()
        }),
        resource::<networking::ServiceCIDR>(Spec {
            status: true,
            hooks: kinds::servicecidr_hooks(),
            ..Default::default()
        }),
        // discovery.k8s.io/v1
        resource::<discovery::EndpointSlice>(Spec { hooks: kinds::endpointslice_hooks(), ..Default::default() }),
        // coordination.k8s.io/v1
        resource::<coordination::Lease>(Spec { hooks: kinds::lease_hooks(), ..Default::default() }),
        // events.k8s.io/v1
        resource::<events::Event>(Spec { short: &["ev"], hooks: kinds::events_v1_event_hooks(), ..Default::default() }),
        // storage.k8s.io/v1
        resource::<storage::StorageClass>(Spec {
            short: &["sc"],
            hooks: kinds::storageclass_hooks(),
            ..Default::default()
        }),
        resource::<storage::CSIDriver>(Spec { hooks: kinds::csidriver_hooks(), ..Default::default() }),
        resource::<storage::CSINode>(Spec { hooks: kinds::csinode_hooks(), ..Default::default() }),
        resource::<storage::CSIStorageCapacity>(Spec {
            hooks: kinds::csistoragecapacity_hooks(),
            ..Default::default()
        }),
        resource::<storage::VolumeAttachment>(Spec {
            status: true,
            hooks: kinds::volumeattachment_hooks(),
            ..Default::default()
        }),
        // scheduling.k8s.io/v1
        resource::<scheduling::PriorityClass>(Spec {
            short: &["pc"],
            hooks: kinds::priorityclass_hooks(),
            ..Default::default()
        }),
        // node.k8s.io/v1
        resource::<node::RuntimeClass>(Spec { hooks: kinds::runtimeclass_hooks(), ..Default::default() }),
        // certificates.k8s.io/v1
        resource::<certificates::CertificateSigningRequest>(Spec {
            short: &["csr"],
            status: true,
            sub: &["approval"],
            hooks: kinds::certificatesigningrequest_hooks(),
            ..Default::default()
        }),
        // admissionregistration.k8s.io/v1
        resource::<admission::MutatingWebhookConfiguration>(Spec {
            categories: &["api-extensions"],
            hooks: with_generation(kinds::webhook_configuration_hooks()),
            ..Default::default()
        }),
        resource::<admission::ValidatingWebhookConfiguration>(Spec {
            categories: &["api-extensions"],
            hooks: with_generation(kinds::webhook_configuration_hooks()),
            ..Default::default()
        }),
        resource::<admission::ValidatingAdmissionPolicy>(Spec {
            categories: &["api-extensions"],
            status: true,
            hooks: with_generation(kinds::validatingadmissionpolicy_hooks()),
            ..Default::default()
        }),
        resource::<admission::ValidatingAdmissionPolicyBinding>(Spec {
            categories: &["api-extensions"],
            hooks: with_generation(kinds::validatingadmissionpolicybinding_hooks()),
            ..Default::default()
        }),
        // apiextensions.k8s.io/v1
        resource::<apiextensions::CustomResourceDefinition>(Spec {
            short: &["crd", "crds"],
            categories: &["api-extensions"],
            status: true,
            hooks: kinds::crd_hooks(),
            ..Default::default()
        }),
        // apiregistration.k8s.io/v1
        resource::<apiregistration::APIService>(Spec {
            categories: &["api-extensions"],
            status: true,
            hooks: with_generation(kinds::apiservice_hooks()),
            ..Default::default()
        }),
        // authorization.k8s.io/v1 and authentication.k8s.io/v1: reviews
        review::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(false),
        review::<k8s_openapi::api::authorization::v1::SelfSubjectRulesReview>(false),
        review::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(false),
        review::<k8s_openapi::api::authorization::v1::LocalSubjectAccessReview>(true),
        review::<k8s_openapi::api::authentication::v1::SelfSubjectReview>(false),
        review::<k8s_openapi::api::authentication::v1::TokenReview>(false),
        // flowcontrol.apiserver.k8s.io/v1
        resource::<flowcontrol::FlowSchema>(Spec {
            status: true,
            hooks: with_generation(kinds::flowschema_hooks()),
            ..Default::default()
        }),
        resource::<flowcontrol::PriorityLevelConfiguration>(Spec {
            status: true,
            hooks: with_generation(kinds::prioritylevelconfiguration_hooks()),
            ..Default::default()
        }),
    ]
}
