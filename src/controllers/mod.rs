//! The control loops that run inside `ferrok server`, each talking to the
//! API only through an in-process `kube::Client` and driven by kube-runtime
//! (watch-fed caches, a deduplicating work queue, retries with back-off).
//! They run while this server holds the `kube-controller-manager` Lease.

pub mod bootstrap_signer;
pub mod bootstrap_token;
pub mod certificates;
pub mod cluster_dns;
pub mod clusterrole_aggregation;
pub mod controller_utils;
pub mod cron_schedule;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod endpointslice_mirroring;
pub mod ephemeral_volume;
pub mod expectations;
pub mod garbage_collector;
pub mod history;
pub mod informers;
pub mod job;
pub mod job_pods;
pub mod legacy_token_cleaner;
pub mod local_path;
pub mod manifests;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod node_password;
pub mod persistentvolume;
pub mod pod_gc;
pub mod podautoscaler;
pub mod pv_protection;
pub mod pvc_protection;
pub mod queue_metrics;
pub mod ref_manager;
pub mod replicaset;
pub mod resourcequota;
pub mod root_ca;
pub mod service_cidr;
pub mod serviceaccount;
pub mod serviceaccount_token;
pub mod servicelb;
pub mod statefulset;
pub mod taint_eviction;
pub mod token_cleaner;
pub mod ttl;
pub mod ttl_after_finished;
pub mod volume_expand;
pub mod work_queue;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Pod, ReplicationController};

use crate::client::informer_factory::SharedInformerFactory;

/// What a reconcile can fail with; the work queue retries it.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Discovery(String),
    #[error("{0}")]
    Invalid(String),
}

/// What the controllers are told at start.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// The serving CA, published as `kube-root-ca.crt`.
    pub server_ca_pem: Arc<String>,
    /// `--cluster-cidr`: node IPAM hands each node a slice of it.
    pub cluster_cidr: crate::net::Ipv4Net,
    /// The prefix length of each node's podCIDR (24).
    pub node_cidr_mask: u8,
    /// ServiceLB runs (off with `--disable servicelb`).
    pub servicelb: bool,
    /// The in-process cluster DNS runs, so its `kube-dns` slice is kept (off with `--disable coredns`).
    pub cluster_dns: bool,
    /// The local-path provisioner's storage folder (none with `--disable local-storage`).
    pub local_storage: Option<std::path::PathBuf>,
    /// `--terminated-pod-gc-threshold` (0: terminated pods are not collected by count).
    pub terminated_pod_gc_threshold: usize,
    /// The CAs the certificate signers sign with.
    pub signing: Arc<certificates::signer::SigningConfig>,
    /// The service-account key legacy token Secrets are signed with.
    pub service_account_key: Arc<crate::pki::service_account_key::ServiceAccountKey>,
}

/// Starts every controller; they run until aborted.
/// `informers` is the process' informer factory, which watches as
/// system:kube-controller-manager (the shared caches, and the few watches
/// a controller's own role does not cover, as upstream reads them from the
/// manager's informers); it outlives a lost leader election, so a
/// controller started again finds its caches warm. `client_for` gives each
/// controller its own service account's client (upstream's
/// `--use-service-account-credentials`), under which it writes, so RBAC
/// constrains it and the audit log names it.
pub fn start(
    informers: SharedInformerFactory,
    client_for: crate::client::ClientFor,
    config: Arc<ControllerConfig>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let f = &informers;
    let pods = informers.informer::<Pod>();
    let jobs = informers.informer::<Job>();
    let csrs = informers.informer::<CertificateSigningRequest>();
    let own = |name: &str| client_for(name);
    let mut handles = vec![
        tokio::spawn(clusterrole_aggregation::run(own(clusterrole_aggregation::NAME), f.clone())),
        tokio::spawn(statefulset::run(own("statefulset-controller"), f.clone())),
        tokio::spawn(daemonset::run(own("daemon-set-controller"), f.clone())),
        tokio::spawn(job::run(own("job-controller"), f.clone())),
        tokio::spawn(cronjob::run(own("cronjob-controller"), f.clone())),
        tokio::spawn(ttl_after_finished::run(own("ttl-after-finished-controller"), jobs.subscribe())),
        tokio::spawn(namespace::run(own("namespace-controller"), f.clone())),
        tokio::spawn(garbage_collector::run(own("generic-garbage-collector"), f.client().clone())),
        tokio::spawn(serviceaccount::run(own("service-account-controller"), f.clone())),
        tokio::spawn(root_ca::run(own("root-ca-cert-publisher"), f.clone(), config.server_ca_pem.clone())),
        // Node IPAM, node lifecycle and taint eviction all act as
        // node-controller, as upstream starts them.
        tokio::spawn(node_ipam::run(own("node-controller"), f.clone(), config.clone())),
        tokio::spawn(node_lifecycle::run(own("node-controller"), f.clone(), pods.subscribe())),
        tokio::spawn(taint_eviction::run(own("node-controller"), f.clone())),
        tokio::spawn(endpoints::run(own("endpoint-controller"), f.clone(), pods.subscribe())),
        tokio::spawn(endpointslice::run(own("endpointslice-controller"), f.clone(), pods.subscribe())),
        tokio::spawn(disruption::run(own("disruption-controller"), pods.subscribe())),
        tokio::spawn(persistentvolume::run(own("persistent-volume-binder"), f.clone(), pods.subscribe())),
        tokio::spawn(replicaset::run::<ReplicaSet>(own("replicaset-controller"), f.clone(), "replicaset-controller")),
        tokio::spawn(replicaset::run::<ReplicationController>(
            own("replication-controller"),
            f.clone(),
            "replication-controller",
        )),
        tokio::spawn(deployment::run(own("deployment-controller"), f.clone())),
        tokio::spawn(podautoscaler::run(own("horizontal-pod-autoscaler"), f.clone())),
        tokio::spawn(resourcequota::run(own("resourcequota-controller"), f.clone(), pods.subscribe())),
        tokio::spawn(certificates::signer::run(
            own(certificates::CONTROLLER),
            csrs.subscribe(),
            config.signing.clone(),
        )),
        tokio::spawn(certificates::approver::run(own(certificates::CONTROLLER), csrs.subscribe())),
        tokio::spawn(certificates::cleaner::run(own(certificates::CONTROLLER), csrs.subscribe())),
        // It holds the signing key: it acts as the controller manager, as upstream's.
        tokio::spawn(serviceaccount_token::run(
            f.client().clone(),
            f.clone(),
            config.service_account_key.clone(),
            config.server_ca_pem.clone(),
        )),
        tokio::spawn(legacy_token_cleaner::run(own("legacy-service-account-token-cleaner"), f.clone(), pods.store())),
        tokio::spawn(bootstrap_signer::run(own("bootstrap-signer"), f.clone())),
        tokio::spawn(token_cleaner::run(own("token-cleaner"), f.clone())),
    ];
    if config.cluster_dns {
        handles.push(tokio::spawn(cluster_dns::run(own("endpointslice-controller"), f.clone())));
    }
    if config.servicelb {
        // ServiceLB acts as upstream's cloud service-controller does.
        handles.push(tokio::spawn(servicelb::run(own(servicelb::CONTROLLER_NAME), f.clone())));
    }
    if let Some(dir) = &config.local_storage {
        handles.push(tokio::spawn(local_path::run(own("persistent-volume-binder"), pods.subscribe(), dir.clone())));
    }
    handles.extend([
        tokio::spawn(pod_gc::run(own(pod_gc::NAME), f.clone(), config.terminated_pod_gc_threshold)),
        tokio::spawn(ttl::run(own(ttl::NAME), f.clone())),
        tokio::spawn(ephemeral_volume::run(own(ephemeral_volume::NAME), f.clone())),
        tokio::spawn(endpointslice_mirroring::run(own(endpointslice_mirroring::NAME), f.clone())),
        tokio::spawn(volume_expand::run(own(volume_expand::NAME), f.clone())),
        tokio::spawn(service_cidr::run(own(service_cidr::NAME), f.clone())),
        tokio::spawn(pvc_protection::run(own(pvc_protection::NAME), f.clone())),
        tokio::spawn(pv_protection::run(own(pv_protection::NAME), f.clone())),
    ]);
    handles
}
