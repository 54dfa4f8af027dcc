//! `ferrok secrets-encrypt status|enable|disable|rotate-keys`, after k3s':
//! Secrets encrypted at rest with the keys in
//! `<data-dir>/server/cred/encryption-config.json`. Every command asks the
//! running server, with the admin credentials of the data dir, at
//! `/v1-ferrok/encrypt/…` (the server swaps keys between two writes, which
//! nothing outside it can do safely, and shares them with the other
//! servers of its datastore). `enable` and `disable` on a server that is
//! not running edit the file instead, used from its next start (which
//! rewrites the Secrets stored the other way).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::apiserver::encryption::config::{self, Cipher};
use crate::apiserver::encryption::reencrypt::{Rotation, Toggle};
use crate::apiserver::encryption::{EncryptionStatus, ProviderStatus};
use crate::apiserver::supervisor::secrets_encrypt::{DISABLE, ENABLE, ROTATE_KEYS, STATUS};

#[derive(Debug, Args)]
pub struct SecretsEncryptArgs {
    #[command(subcommand)]
    command: SecretsEncryptCommand,
    /// The server's data dir: its encryption config and admin credentials.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The server to talk to (status, rotate-keys).
    #[arg(long, short = 's', global = true, value_name = "URL", default_value = "https://127.0.0.1:6443")]
    server: String,
}

#[derive(Debug, Subcommand)]
enum SecretsEncryptCommand {
    /// Whether Secrets are encrypted, the rotation stage, and the keys.
    Status,
    /// Encrypt Secrets from the server's next start (a new key when there is none).
    Enable {
        /// The cipher of a new key.
        #[arg(long, value_name = "PROVIDER", default_value = "aescbc")]
        secrets_encryption_provider: Cipher,
    },
    /// Write Secrets in plain from the server's next start (the keys stay, to read).
    Disable,
    /// A new key, every Secret rewritten with it, the old keys dropped; the server keeps running.
    RotateKeys,
}

fn data_dir(args: &SecretsEncryptArgs) -> anyhow::Result<PathBuf> {
    let dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    if !dir.join("server").is_dir() {
        bail!("--data-dir: {} is not a server's data dir (no server/ folder)", dir.display());
    }
    Ok(dir)
}

/// `enable` or `disable` on the file; what to print.
fn edit(path: &Path, enable: Option<Cipher>) -> anyhow::Result<String> {
    let file = path.display();
    Ok(match enable {
        Some(cipher) => {
            if config::ensure_enabled(path, cipher)? {
                format!("secrets encryption enabled in {file} (the server is not running): it encrypts Secrets from its next start")
            } else {
                format!("secrets encryption is already enabled in {file}")
            }
        }
        None => match config::load(path)? {
            None => format!("secrets encryption is not configured ({file} does not exist)"),
            Some(mut c) => {
                if c.disable() {
                    config::save(path, &c)?;
                    format!("secrets encryption disabled in {file} (the server is not running): it writes Secrets in plain from its next start")
                } else {
                    format!("secrets encryption is already disabled in {file}")
                }
            }
        },
    })
}

fn key_type(provider: &str) -> &str {
    match provider {
        "aescbc" => "AES-CBC",
        "secretbox" => "XSalsa20-Poly1305",
        "identity" => "Identity",
        other => other,
    }
}

fn rows(providers: &[ProviderStatus]) -> Vec<[String; 4]> {
    providers
        .iter()
        .map(|p| {
            [
                if p.active { "*".into() } else { String::new() },
                key_type(&p.provider).into(),
                if p.key.is_empty() { "-".into() } else { p.key.clone() },
                p.resources.join(","),
            ]
        })
        .collect()
}

/// k3s' "Server Encryption Hashes" line: every live server of the
/// datastore runs the same configuration, and this one the file it has.
fn hashes(s: &EncryptionStatus) -> String {
    let short = |h: &str| if h.is_empty() { "none".to_string() } else { h.chars().take(12).collect() };
    if let Some((first, hash)) = s.server_hashes.iter().next() {
        if let Some((other, other_hash)) = s.server_hashes.iter().find(|(_, h)| *h != hash) {
            return format!(
                "hash does not match between {first} ({}) and {other} ({})",
                short(hash),
                short(other_hash)
            );
        }
    }
    if s.server_hash == s.file_hash {
        return "All hashes match".into();
    }
    format!(
        "the server runs {} but {} is {}: restart the server to use the file",
        short(&s.server_hash),
        s.config_file,
        short(&s.file_hash)
    )
}

fn print_status(s: &EncryptionStatus) {
    println!("Encryption Status: {}", if s.enabled { "Enabled" } else { "Disabled" });
    match &s.new_key {
        Some(key) => println!("Current Rotation Stage: {} (new key {key})", s.stage.as_str()),
        None => println!("Current Rotation Stage: {}", s.stage.as_str()),
    }
    println!("Server Encryption Hashes: {}", hashes(s));
    println!();
    super::table::print_table(["ACTIVE", "KEY TYPE", "NAME", "RESOURCES"], &rows(&s.providers));
}

/// A request to the server's encryption endpoint, its JSON answer.
async fn call<T: serde::de::DeserializeOwned>(
    args: &SecretsEncryptArgs,
    method: &str,
    path: &str,
) -> anyhow::Result<T> {
    match try_call(args, method, path).await? {
        Ok(v) => Ok(v),
        Err(e) => bail!("cannot reach the server at {} (--server): {e}", args.server),
    }
}

/// The answer, or (inner error) why the server could not be reached.
async fn try_call<T: serde::de::DeserializeOwned>(
    args: &SecretsEncryptArgs,
    method: &str,
    path: &str,
) -> anyhow::Result<Result<T, kube::Error>> {
    let (client, _) = super::token::admin_client(args.data_dir.as_deref(), &args.server)?;
    let request = axum::http::Request::builder().method(method).uri(path).body(Vec::new()).context("request")?;
    match client.request::<T>(request).await {
        Ok(v) => Ok(Ok(v)),
        Err(kube::Error::Api(s)) => bail!("{}", s.message),
        Err(e) => Ok(Err(e)),
    }
}

/// `enable` or `disable`: through the running server (in force at once on
/// every server of its datastore), else in the file.
async fn toggle(args: &SecretsEncryptArgs, enable: Option<Cipher>) -> anyhow::Result<String> {
    let dir = data_dir(args)?;
    let path = config::path_in(&dir);
    let what = if enable.is_some() { "enabled" } else { "disabled" };
    let uri = match enable {
        Some(cipher) => format!("{ENABLE}?provider={}", cipher.name()),
        None => DISABLE.to_string(),
    };
    let has_credentials = dir.join("server").join("tls").join("client-admin.key").exists();
    if has_credentials {
        if let Ok(t) = try_call::<Toggle>(args, "POST", &uri).await? {
            return Ok(if t.changed {
                format!(
                    "secrets encryption {what} on the running server: {} of {} stored values rewritten",
                    t.counts.rewritten, t.counts.seen
                )
            } else {
                format!("secrets encryption is already {what}")
            });
        }
    }
    edit(&path, enable)
}

pub async fn run(args: SecretsEncryptArgs) -> anyhow::Result<()> {
    match &args.command {
        SecretsEncryptCommand::Status => print_status(&call(&args, "GET", STATUS).await?),
        SecretsEncryptCommand::Enable { secrets_encryption_provider } => {
            println!("{}", toggle(&args, Some(*secrets_encryption_provider)).await?)
        }
        SecretsEncryptCommand::Disable => println!("{}", toggle(&args, None).await?),
        SecretsEncryptCommand::RotateKeys => {
            let r: Rotation = call(&args, "POST", ROTATE_KEYS).await?;
            println!(
                "keys rotated: {} writes now; {} of {} stored values rewritten, the old keys dropped",
                r.key, r.counts.rewritten, r.counts.seen
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::encryption::Stage;

    #[test]
    fn enable_then_disable_edit_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = config::path_in(dir.path());
        assert!(edit(&path, None).unwrap().contains("not configured"));
        assert!(edit(&path, Some(Cipher::Secretbox)).unwrap().contains("enabled in"));
        assert!(edit(&path, Some(Cipher::Aescbc)).unwrap().contains("already enabled"));
        assert!(config::load(&path).unwrap().unwrap().enabled());
        assert!(edit(&path, None).unwrap().contains("disabled in"));
        assert!(!config::load(&path).unwrap().unwrap().enabled());
        assert!(edit(&path, None).unwrap().contains("already disabled"));
    }

    #[test]
    fn status_lines() {
        let mut s = EncryptionStatus {
            enabled: true,
            stage: Stage::Start,
            config_file: "/d/encryption-config.json".into(),
            server_hash: "abc".into(),
            file_hash: "abc".into(),
            providers: vec![ProviderStatus {
                resources: vec!["secrets".into()],
                provider: "aescbc".into(),
                key: "k1".into(),
                active: true,
            }],
            server_hashes: Default::default(),
            new_key: None,
        };
        assert_eq!(hashes(&s), "All hashes match");
        s.server_hashes = [("a".to_string(), "abc".to_string()), ("b".to_string(), "abc".to_string())].into();
        assert_eq!(hashes(&s), "All hashes match");
        s.server_hashes.insert("c".into(), "def".into());
        assert_eq!(hashes(&s), "hash does not match between a (abc) and c (def)");
        s.server_hashes.clear();
        s.file_hash = "def".into();
        assert!(hashes(&s).contains("restart the server"));
        assert_eq!(rows(&s.providers)[0], ["*".to_string(), "AES-CBC".into(), "k1".into(), "secrets".into()]);
    }
}
