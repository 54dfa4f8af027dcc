//! `ferrok agent`: the node role alone, joined to a server with its URL
//! and token. It checks the server's CA against the token, gets its own
//! certificates (keys generated here), and runs the node with its own
//! data dir and containerd, talking to every server of the cluster in
//! turn should one go away.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::agent::node_join::{self, JoinError, JoinOptions};
use crate::client::https::{ServerList, Transport};
use crate::host::{host_ip, hostname};
use crate::pki::join_token::JoinToken;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The server to join, `https://HOST:6443`.
    #[arg(short = 's', long, env = "FERROK_URL", value_name = "URL")]
    pub server: Option<String>,
    /// The join token (`K10<ca hash>::<credential>`, from the server's `server/token`).
    #[arg(short = 't', long, env = "FERROK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the join token.
    #[arg(long, env = "FERROK_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Folder for the node's state.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// This node's name (default: the hostname).
    #[arg(long, env = "FERROK_NODE_NAME")]
    pub node_name: Option<String>,
    /// Append a random id kept in the data dir to the node name, so that
    /// machines with the same hostname join as different nodes.
    #[arg(long)]
    pub with_node_id: bool,
    #[command(flatten)]
    pub node: super::node_args::NodeArgs,
    /// Config file (YAML; keys are the long flag names).
    #[arg(long, value_name = "FILE", env = "FERROK_CONFIG_FILE", default_value = "/etc/ferrok/config.yaml")]
    pub config: PathBuf,
}

/// `https://host:port[/]` → `host:port` (port 6443 when none is given).
pub(crate) fn server_address(url: &str) -> anyhow::Result<String> {
    let rest =
        url.trim().strip_prefix("https://").with_context(|| format!("--server {url:?}: expected https://HOST:PORT"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') || authority.contains('@') {
        anyhow::bail!("--server {url:?}: expected https://HOST:PORT");
    }
    let has_port = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && (authority.starts_with('[') == host.ends_with(']')) => {
            port.parse::<u16>().with_context(|| format!("--server {url:?}: {port:?} is not a port"))?;
            true
        }
        _ => false,
    };
    Ok(if has_port { authority.to_string() } else { format!("{authority}:6443") })
}

fn token(args: &AgentArgs) -> anyhow::Result<JoinToken> {
    let text = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("--token-file: cannot read {}", f.display()))?
        }
        (None, None) => anyhow::bail!("--token (or FERROK_TOKEN, or --token-file) is required to join a server"),
    };
    JoinToken::parse(&text).map_err(|e| anyhow::anyhow!("--token: {e}"))
}

/// The address this host reaches `server` from (no packet is sent).
fn address_towards(server: &str) -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect(server).ok()?;
    Some(socket.local_addr().ok()?.ip()).filter(|ip| !ip.is_unspecified())
}

/// The node's name: `--node-name`, else the hostname; with
/// `--with-node-id`, a suffix kept in `<agent dir>/node-id`.
fn node_name(args: &AgentArgs, agent_dir: &std::path::Path) -> anyhow::Result<String> {
    let base = args.node_name.clone().unwrap_or_else(hostname).to_lowercase();
    if !args.with_node_id {
        return Ok(base);
    }
    let file = agent_dir.join("node-id");
    let id = match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => {
            let mut b = [0u8; 4];
            crate::host::random::fill(&mut b);
            let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
            crate::pki::write(&file, &format!("{id}\n"), 0o644)
                .with_context(|| format!("--with-node-id: {}", file.display()))?;
            id
        }
    };
    Ok(format!("{base}-{id}"))
}

/// Joins through the first server of `servers` that answers, retrying
/// while none does; a refusal is final.
async fn join(
    opts: &JoinOptions,
    servers: &ServerList,
    shutdown: &mut super::ShutdownSignal,
) -> anyhow::Result<node_join::Joined> {
    loop {
        let mut last = None;
        for server in servers.get() {
            let attempt = JoinOptions { server, ..opts.clone() };
            match node_join::join(&attempt).await {
                Ok(joined) => return Ok(joined),
                Err(e @ JoinError::Unreachable { .. }) => {
                    tracing::warn!(error = %e, "cannot join yet");
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        tracing::warn!(error = ?last.map(|e| e.to_string()), "no server answered; retrying in 5 s");
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = shutdown.wait() => anyhow::bail!("stopped before joining"),
        }
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut shutdown = super::ShutdownSignal::install();
    let url = args.server.clone().context("--server (or FERROK_URL) is required: the URL of the server to join")?;
    let server = server_address(&url)?;
    let token = token(&args)?;
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    let agent_dir = data_dir.join("agent");
    std::fs::create_dir_all(&agent_dir)
        .with_context(|| format!("--data-dir: cannot create {}", agent_dir.display()))?;
    let node_name = node_name(&args, &agent_dir)?;
    let default_ip = address_towards(&server).unwrap_or_else(host_ip);
    let node_ips = if args.node.node_ip.is_empty() { vec![default_ip] } else { args.node.node_ip.clone() };
    let servers = ServerList::new(server.clone(), Some(agent_dir.join("etc").join("servers")));
    let opts = JoinOptions { server, token, node_name: node_name.clone(), node_ips, dir: agent_dir.clone() };
    let joined = join(&opts, &servers, &mut shutdown).await?;
    let cluster = &joined.config;
    let cidr = |flag: &str, text: &str| -> anyhow::Result<crate::net::Ipv4Net> {
        crate::net::parse_cluster_range(text).map_err(|e| anyhow::anyhow!("the server's {flag} {text:?}: {e}"))
    };
    let cluster_dns: IpAddr =
        cluster.cluster_dns.parse().with_context(|| format!("the server's cluster DNS {:?}", cluster.cluster_dns))?;
    let mut node = args.node.clone();
    if node.flannel_backend.is_none() && !cluster.flannel_backend.is_empty() {
        let backend = cluster.flannel_backend.parse().map_err(|e| {
            anyhow::anyhow!("the server's flannel backend {:?}: {e} (set --flannel-backend)", cluster.flannel_backend)
        })?;
        node.flannel_backend = Some(backend);
    }
    let config = node.agent_config(
        &data_dir,
        &node_name,
        default_ip,
        false,
        &cluster_dns,
        &cluster.cluster_domain,
        &cidr("cluster CIDR", &cluster.cluster_cidr)?,
        &cidr("service CIDR", &cluster.service_cidr)?,
        args.data_dir.is_none(),
    )?;
    let creds = joined.credentials.clone();
    let config = crate::agent::AgentConfig {
        kubelet_tls: Some(crate::agent::KubeletTls {
            cert: creds.serving_cert.clone(),
            key: creds.serving_key.clone(),
            client_ca: creds.client_ca.clone(),
        }),
        // The server's `--disable coredns` holds for its agents too.
        dns_server: !cluster.disable_cluster_dns,
        ..config
    };
    let transport = Transport::new(servers.clone(), node_join::api_tls(&creds)?);
    let client = transport.client();
    // The node's one informer factory: its network and the watches it can share.
    let informers = crate::client::informer_factory::SharedInformerFactory::new(client.clone());
    let mut tasks = vec![tokio::spawn(crate::client::https::follow_servers(client.clone(), servers.clone()))];
    {
        let transport = transport.clone();
        tasks.push(tokio::spawn(node_join::renew(opts.clone(), creds, move |tls| transport.set_tls(tls))));
    }
    if !cluster.local_storage_path.is_empty() {
        // The server's local-path volumes released on this node: their directories, then the volumes.
        let storage = PathBuf::from(&cluster.local_storage_path);
        tasks.push(tokio::spawn(crate::agent::local_path::run(
            client.clone(),
            informers.clone(),
            node_name.clone(),
            storage,
        )));
    }
    let agent = tokio::select! {
        agent = crate::agent::start(config, client, None, informers) => agent.context("the node role")?,
        _ = shutdown.wait() => {
            for t in tasks {
                t.abort();
            }
            return Ok(());
        }
    };
    tracing::info!(node = %node_name, ready_ms = started.elapsed().as_millis() as u64, "ferrok agent is running");
    shutdown.wait().await;
    for t in tasks {
        t.abort();
    }
    agent.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::server_address;

    #[test]
    fn server_urls() {
        assert_eq!(server_address("https://10.0.0.1:6443").unwrap(), "10.0.0.1:6443");
        assert_eq!(server_address("https://edge.example/").unwrap(), "edge.example:6443");
        assert_eq!(server_address("https://[fd00::1]:7443").unwrap(), "[fd00::1]:7443");
        assert_eq!(server_address("https://[fd00::1]").unwrap(), "[fd00::1]:6443");
        assert!(server_address("http://10.0.0.1:6443").unwrap_err().to_string().contains("--server"));
        assert!(server_address("https://10.0.0.1:x").is_err());
        assert!(server_address("https://a/b").is_err());
    }
}
