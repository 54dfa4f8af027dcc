//! The node role on the server's own host (unless `--disable-agent`): the
//! agent's configuration, the kubelet's serving certificate signed here,
//! the local-path cleanup of this node, then the node role itself.

use std::sync::Arc;

use anyhow::Context;

use super::{Running, Setup};
use crate::apiserver::auth::User;
use crate::apiserver::{self, Api};
use crate::client::informer_factory::SharedInformerFactory;
use crate::pki::Pki;

/// Starts the node role for this host, unless `--disable-agent`. The node
/// role (its network, its shared watches) reads from `informers`, the
/// controllers' own.
pub(super) async fn start_node(
    s: &Setup,
    api: &Arc<Api>,
    pki: &Pki,
    informers: SharedInformerFactory,
    running: &mut Running,
) -> anyhow::Result<Option<crate::agent::Agent>> {
    if s.args.disable_agent {
        return Ok(None);
    }
    let (args, data_dir, node_name) = (&s.args, &s.data_dir, &s.node_name);
    let config = args.node.agent_config(
        data_dir,
        node_name,
        s.advertise_ip,
        true,
        &args.cluster_dns,
        &args.cluster_domain,
        &args.cluster_cidr,
        &args.service_cidr,
        args.data_dir.is_none(),
    )?;
    let tls = crate::agent::KubeletTls {
        cert: config.dir.join("serving-kubelet.crt"),
        key: config.dir.join("serving-kubelet.key"),
        client_ca: pki.client_ca_cert.clone(),
    };
    crate::pki::ensure_kubelet_serving(
        &data_dir.join("server").join("tls"),
        &tls.cert,
        &tls.key,
        node_name,
        &config.node_ips,
    )
    .context("the kubelet's serving certificate")?;
    let config = crate::agent::AgentConfig { kubelet_tls: Some(tls), dns_server: s.enabled.dns, ..config };
    if s.enabled.local_storage {
        // Released local-path volumes of this node: their directories, then the volumes.
        running.followers.push(tokio::spawn(crate::agent::local_path::run(
            apiserver::in_process::client(api.clone(), User::node(node_name)),
            informers.clone(),
            node_name.clone(),
            s.local_storage.clone(),
        )));
    }
    let client = apiserver::in_process::client(api.clone(), User::node(node_name));
    let labeler = apiserver::in_process::client(api.clone(), User::supervisor());
    Ok(Some(crate::agent::start(config, client, Some(labeler), informers).await.context("the node role")?))
}
