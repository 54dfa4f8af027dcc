//! The start-up steps that run the cluster's loops in the server: the
//! loops every server runs (auto-deploy manifests, cluster-info, node
//! passwords), then the controller manager and the scheduler, each behind
//! its leader election.

use std::sync::Arc;

use anyhow::Context;

use super::{Running, Setup};
use crate::apiserver::auth::User;
use crate::apiserver::{self, Api};
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::leader::LeaderElection;
use crate::controllers::certificates::signer::{CaFiles, SigningConfig, DEFAULT_DURATION};
use crate::controllers::ControllerConfig;
use crate::pki::Pki;

/// What the controllers are told at start: the CAs they sign with, the pod
/// network, the packaged parts that are on, `--kube-controller-manager-arg`.
pub(super) fn controller_config(s: &Setup, pki: &Pki) -> anyhow::Result<Arc<ControllerConfig>> {
    let (args, enabled) = (&s.args, s.enabled);
    Ok(Arc::new(ControllerConfig {
        server_ca_pem: Arc::new(std::fs::read_to_string(&pki.server_ca_cert).context("server CA")?),
        cluster_cidr: args.cluster_cidr,
        node_cidr_mask: 24,
        servicelb: enabled.servicelb,
        cluster_dns: enabled.dns,
        local_storage: enabled.local_storage.then(|| s.local_storage.clone()),
        terminated_pod_gc_threshold: controller_manager_args(&args.kube_controller_manager_arg)?,
        signing: Arc::new(SigningConfig {
            client_ca: CaFiles { cert: pki.client_ca_cert.clone(), key: pki.client_ca_key.clone() },
            server_ca: CaFiles { cert: pki.server_ca_cert.clone(), key: pki.server_ca_key.clone() },
            duration: DEFAULT_DURATION,
        }),
        service_account_key: Arc::new(
            crate::pki::service_account_key::ServiceAccountKey::load(&pki.service_account_key)
                .context("service-account key")?,
        ),
    }))
}

/// `--terminated-pod-gc-threshold` from `--kube-controller-manager-arg`s.
fn controller_manager_args(args: &[String]) -> anyhow::Result<usize> {
    let mut threshold = crate::controllers::pod_gc::DEFAULT_TERMINATED_POD_THRESHOLD;
    for arg in args {
        match arg.trim_start_matches("--").split_once('=') {
            Some(("terminated-pod-gc-threshold", n)) => {
                threshold = n.parse().with_context(|| {
                    format!("--kube-controller-manager-arg {arg:?}: the threshold must be a number of pods")
                })?;
            }
            _ => {
                anyhow::bail!("--kube-controller-manager-arg {arg:?}: only terminated-pod-gc-threshold=N is understood")
            }
        }
    }
    Ok(threshold)
}

/// The loops every server runs, leader or not: the auto-deploy folder
/// (with the server's own rights), kube-public/cluster-info (this server
/// and the CA, for the bootstrap signer to sign), and node passwords that
/// follow their Nodes (deletes are idempotent).
pub(super) fn start_server_loops(s: &Setup, api: &Arc<Api>, pki: &Pki, running: &mut Running) -> anyhow::Result<()> {
    let followers = &mut running.followers;
    {
        let (client, dir, server) =
            (apiserver::in_process::client(api.clone(), User::supervisor()), s.manifests.clone(), s.node_name.clone());
        followers.push(tokio::spawn(async move { crate::controllers::manifests::run(client, dir, &server).await }));
    }
    {
        let client = apiserver::in_process::client(api.clone(), User::supervisor());
        let server = format!("https://{}", api.config.advertise);
        let ca = std::fs::read_to_string(&pki.server_ca_cert).context("server CA")?;
        followers.push(tokio::spawn(async move {
            if let Err(e) = crate::cli::cluster_info::publish(client, &server, &ca).await {
                tracing::warn!(error = %e, "cannot publish kube-public/cluster-info");
            }
        }));
    }
    followers.push(tokio::spawn(crate::controllers::node_password::run(apiserver::in_process::client(
        api.clone(),
        User::supervisor(),
    ))));
    Ok(())
}

/// The controller manager, while this server holds the
/// `kube-controller-manager` Lease. Returns the shared informers (one per
/// kind), which the scheduler uses too.
pub(super) fn start_controllers(
    s: &Setup,
    api: &Arc<Api>,
    config: Arc<ControllerConfig>,
    running: &mut Running,
) -> SharedInformerFactory {
    let manager = apiserver::in_process::client(api.clone(), User::controller_manager());
    let informers = SharedInformerFactory::new(apiserver::in_process::client_for_informers(
        api.clone(),
        User::controller_manager(),
    ));
    let election = LeaderElection::new(manager.clone(), "kube-controller-manager", &s.node_name);
    let for_controllers = api.clone();
    let client_for: crate::client::ClientFor = Arc::new(move |name: &str| {
        apiserver::in_process::client(for_controllers.clone(), User::controller_service_account(name))
    });
    let for_manager = informers.clone();
    running.followers.push(tokio::spawn(
        election.run(move || crate::controllers::start(for_manager.clone(), client_for.clone(), config.clone())),
    ));
    informers
}

/// The scheduler with its profiles (`--kube-scheduler-arg config=FILE`),
/// while this server holds the `kube-scheduler` Lease.
pub(super) fn start_scheduler(
    s: &Setup,
    api: &Arc<Api>,
    informers: SharedInformerFactory,
    running: &mut Running,
) -> anyhow::Result<()> {
    let profiles: Vec<_> = scheduler_profiles(&s.args.kube_scheduler_arg)?.into_iter().map(Arc::new).collect();
    let scheduler = apiserver::in_process::client(api.clone(), User::scheduler());
    let election = LeaderElection::new(scheduler.clone(), "kube-scheduler", &s.node_name);
    running.followers.push(tokio::spawn(election.run(move || {
        vec![tokio::spawn(crate::scheduler::run(scheduler.clone(), informers.clone(), profiles.clone()))]
    })));
    Ok(())
}

/// The scheduler's profiles from `--kube-scheduler-arg config=FILE`.
fn scheduler_profiles(args: &[String]) -> anyhow::Result<Vec<crate::scheduler::profile::Profile>> {
    let mut profiles = crate::scheduler::default_profiles();
    for arg in args {
        match arg.split_once('=') {
            Some(("config", file)) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("--kube-scheduler-arg config: cannot read {file}"))?;
                profiles = crate::scheduler::config::profiles_from(&text)
                    .with_context(|| format!("--kube-scheduler-arg config: {file}"))?;
            }
            _ => anyhow::bail!("--kube-scheduler-arg {arg:?}: only config=FILE is understood"),
        }
    }
    Ok(profiles)
}
