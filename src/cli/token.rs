//! `ferrok token create|list|delete`: bootstrap tokens for agents to join
//! with, as k3s' and kubeadm's `token` commands; `ferrok token rotate`
//! replaces the server's own join token (apiserver/supervisor/server_token.rs). Each token is a Secret
//! `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`
//! (what the API server's bootstrap-token authenticator reads), written
//! through the API with the server's admin credentials, and printed in the
//! form an agent takes: `K10<hash of the server CA>::<id>.<secret>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::apiserver::auth::bootstrap_token::SECRET_TYPE;
use crate::apiserver::supervisor::node_join::TOKEN_PATH;
use crate::apiserver::supervisor::server_token::TokenRotation;
use crate::client::https::{ServerList, Transport};
use crate::pki::join_token::{is_bootstrap_token, new_bootstrap_token};

/// The group k3s gives the nodes that join with a bootstrap token, in ferrok's name.
const DEFAULT_GROUP: &str = "system:bootstrappers:ferrok:default-node-token";

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
    /// The server's data dir: its admin credentials and CA.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The server to talk to.
    #[arg(long, short = 's', global = true, value_name = "URL", default_value = "https://127.0.0.1:6443")]
    server: String,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a bootstrap token and print it as `ferrok agent --token` takes it.
    Create {
        /// The token (`[a-z0-9]{6}.[a-z0-9]{16}`); a random one when not given.
        token: Option<String>,
        /// How long the token is valid (`0` for ever).
        #[arg(long, default_value = "24h", value_parser = super::duration::parse_or_zero)]
        ttl: Duration,
        /// A note kept with the token.
        #[arg(long)]
        description: Option<String>,
        /// What the token may be used for.
        #[arg(long, value_delimiter = ',', default_value = "signing,authentication")]
        usages: Vec<String>,
        /// More groups the token's user is in (each `system:bootstrappers:…`).
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_GROUP)]
        groups: Vec<String>,
    },
    /// List the bootstrap tokens.
    #[command(alias = "ls")]
    List,
    /// Delete bootstrap tokens, by id or whole.
    #[command(alias = "rm")]
    Delete {
        #[arg(required = true)]
        tokens: Vec<String>,
    },
    /// Replace the server's join token; nodes already joined keep working.
    Rotate {
        /// The new token (its secret, or a whole K10… token of this cluster); a random one when not given.
        #[arg(long, value_name = "TOKEN")]
        new_token: Option<String>,
    },
}

struct Server {
    client: kube::Client,
    secrets: Api<Secret>,
    /// `K10<hash>::`, the prefix that names the server's CA.
    prefix: String,
}

/// A client of the server at `server` with the admin credentials of
/// `data_dir` (default: the server's), and the server CA's PEM.
pub(super) fn admin_client(data_dir: Option<&Path>, server: &str) -> anyhow::Result<(kube::Client, String)> {
    let data_dir = data_dir.map(Path::to_path_buf).unwrap_or_else(super::default_data_dir);
    let tls = data_dir.join("server").join("tls");
    let read = |name: &str| {
        let path = tls.join(name);
        std::fs::read_to_string(&path)
            .with_context(|| format!("--data-dir: cannot read {} (is this a server's data dir?)", path.display()))
    };
    let ca = read("server-ca.crt")?;
    let tls_config =
        crate::pki::tls::client_config(&ca, Some((&read("client-admin.crt")?, &read("client-admin.key")?)), &[b"h2"])?;
    let address = super::agent::server_address(server)?;
    let transport = Transport::new(ServerList::new(address, None), tls_config);
    Ok((transport.client(), ca))
}

fn connect(args: &TokenArgs) -> anyhow::Result<Server> {
    let (client, ca) = admin_client(args.data_dir.as_deref(), &args.server)?;
    let prefix = format!("K10{}::", crate::pki::ca_hash(ca.as_bytes()));
    Ok(Server { secrets: Api::namespaced(client.clone(), "kube-system"), client, prefix })
}

fn text(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

fn field(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref()?.get(key).map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

/// The Secret of a new token, as upstream's bootstrap-token helpers write it.
fn token_secret(
    token: &str,
    ttl: Duration,
    description: Option<&str>,
    usages: &[String],
    groups: &[String],
) -> anyhow::Result<Secret> {
    let (id, secret) = token.split_once('.').context("a token is <id>.<secret>")?;
    let mut data = BTreeMap::new();
    data.insert("token-id".to_string(), text(id));
    data.insert("token-secret".to_string(), text(secret));
    for usage in usages {
        if !matches!(usage.as_str(), "signing" | "authentication") {
            bail!("--usages: {usage:?} is not a bootstrap token usage (signing, authentication)");
        }
        data.insert(format!("usage-bootstrap-{usage}"), text("true"));
    }
    if let Some(bad) = groups.iter().find(|g| !g.starts_with("system:bootstrappers:")) {
        bail!("--groups: {bad:?} must start with system:bootstrappers:");
    }
    if !groups.is_empty() {
        data.insert("auth-extra-groups".to_string(), text(&groups.join(",")));
    }
    if let Some(d) = description {
        data.insert("description".to_string(), text(d));
    }
    if !ttl.is_zero() {
        let at = k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(ttl.as_secs() as i64))
            .context("--ttl: too long")?;
        data.insert("expiration".to_string(), text(&at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    })
}

/// One line of `token list`, in kubeadm's columns.
fn row(secret: &Secret, now: k8s_openapi::jiff::Timestamp) -> Option<[String; 6]> {
    let id = field(secret, "token-id")?;
    let token = format!("{id}.{}", field(secret, "token-secret")?);
    let (ttl, expires) = match field(secret, "expiration") {
        None => ("<forever>".to_string(), "<never>".to_string()),
        Some(at) => {
            let left = at.parse::<k8s_openapi::jiff::Timestamp>().ok().map(|t| t.duration_since(now).as_secs());
            let ttl = match left {
                Some(s) if s <= 0 => "<invalid>".to_string(),
                Some(s) if s >= 3600 => format!("{}h", s / 3600),
                Some(s) if s >= 60 => format!("{}m", s / 60),
                Some(s) => format!("{s}s"),
                None => "<invalid>".to_string(),
            };
            (ttl, at)
        }
    };
    let usages: Vec<&str> = ["authentication", "signing"]
        .into_iter()
        .filter(|u| field(secret, &format!("usage-bootstrap-{u}")).as_deref() == Some("true"))
        .collect();
    let or_none = |s: Option<String>| s.filter(|s| !s.is_empty()).unwrap_or_else(|| "<none>".into());
    Some([
        token,
        ttl,
        expires,
        or_none(Some(usages.join(","))),
        or_none(field(secret, "description")),
        or_none(field(secret, "auth-extra-groups")),
    ])
}

fn print_table(rows: &[[String; 6]]) {
    super::table::print_table(["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS"], rows);
}

pub async fn run(args: TokenArgs) -> anyhow::Result<()> {
    let server = connect(&args)?;
    match &args.command {
        TokenCommand::Create { token, ttl, description, usages, groups } => {
            let token = match token {
                Some(t) if is_bootstrap_token(t) => t.clone(),
                Some(t) => bail!("token {t:?}: a bootstrap token is [a-z0-9]{{6}}.[a-z0-9]{{16}}"),
                None => new_bootstrap_token(),
            };
            let secret = token_secret(&token, *ttl, description.as_deref(), usages, groups)?;
            match server.secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => println!("{}{token}", server.prefix),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    bail!("a token with id {:?} exists already", token.split('.').next().unwrap_or_default())
                }
                Err(e) => return Err(e).context("cannot create the token"),
            }
        }
        TokenCommand::List => {
            let list = server
                .secrets
                .list(&ListParams::default().fields(&format!("type={SECRET_TYPE}")))
                .await
                .context("cannot list the tokens")?;
            let now = k8s_openapi::jiff::Timestamp::now();
            let rows: Vec<_> = list.items.iter().filter_map(|s| row(s, now)).collect();
            print_table(&rows);
        }
        TokenCommand::Delete { tokens } => {
            for t in tokens {
                let t = t.rsplit("::").next().unwrap_or(t);
                let id = t.split('.').next().unwrap_or(t);
                match server.secrets.delete(&format!("bootstrap-token-{id}"), &DeleteParams::default()).await {
                    Ok(_) => println!("bootstrap token {id:?} deleted"),
                    Err(kube::Error::Api(s)) if s.code == 404 => bail!("bootstrap token {id:?} not found"),
                    Err(e) => return Err(e).with_context(|| format!("cannot delete bootstrap token {id:?}")),
                }
            }
        }
        TokenCommand::Rotate { new_token } => {
            let body = TokenRotation { token: new_token.clone().unwrap_or_default() };
            let req = axum::http::Request::put(TOKEN_PATH)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body)?)?;
            let rotated: TokenRotation = match server.client.request(req).await {
                Ok(r) => r,
                Err(kube::Error::Api(s)) if s.code == 400 => bail!("--new-token: {}", s.message),
                Err(e) => return Err(e).context("cannot rotate the server token"),
            };
            println!("{}", rotated.token);
            eprintln!(
                "The server token was rotated. Nodes already joined keep working; give the new token to nodes that \
                 join from now on, and to the other servers of this cluster (--token, restart them)."
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_as_upstream_writes_them() {
        let s = token_secret(
            "abcdef.0123456789abcdef",
            Duration::from_secs(3600),
            Some("edge"),
            &["signing".into(), "authentication".into()],
            &[DEFAULT_GROUP.into()],
        )
        .unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("bootstrap-token-abcdef"));
        assert_eq!(s.type_.as_deref(), Some(SECRET_TYPE));
        assert_eq!(field(&s, "token-secret").as_deref(), Some("0123456789abcdef"));
        assert_eq!(field(&s, "usage-bootstrap-authentication").as_deref(), Some("true"));
        let now = k8s_openapi::jiff::Timestamp::now();
        let r = row(&s, now).unwrap();
        assert_eq!(r[0], "abcdef.0123456789abcdef");
        assert!(r[1] == "59m" || r[1] == "1h", "{}", r[1]);
        assert_eq!(r[3], "authentication,signing");
        assert_eq!(r[4], "edge");
        let forever = token_secret("abcdef.0123456789abcdef", Duration::ZERO, None, &[], &[]).unwrap();
        assert!(field(&forever, "expiration").is_none());
        assert_eq!(row(&forever, now).unwrap()[1], "<forever>");
        assert!(token_secret("abcdef.0123456789abcdef", Duration::ZERO, None, &["other".into()], &[]).is_err());
        assert!(token_secret("abcdef.0123456789abcdef", Duration::ZERO, None, &[], &["system:masters".into()]).is_err());
    }
}
