//! One encryption configuration for every server of one datastore, as k3s
//! keeps it in its bootstrap data: the keys and the rotation stage travel
//! in the cluster's bootstrap data (sealed with the join token, see
//! `pki::shared_pki`), so that a Secret written through one server is
//! read through any other.
//!
//! - At start ([`join`]) a server installs the cluster's configuration in
//!   its data dir (0600), or, first of all, publishes its own. A local file
//!   whose keys the cluster never had is refused; one the cluster has moved
//!   on from by rotation is replaced.
//! - While it runs ([`follow`]) a server watches the bootstrap data and
//!   reloads its keys when they change, then records the hash of the
//!   configuration it runs with under `/ferrok/encryption-hashes/<server>`
//!   (on a lease of 15 s): `status` compares them, and a rotation waits
//!   until every live server runs its new configuration before it goes on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::config::{self, Cipher, ConfigError, EncryptionConfiguration};
use super::{Encryption, RotationState};
use crate::pki::shared_pki::{storage_key, BootstrapData, BootstrapError, BOOTSTRAP_PREFIX};
use crate::store::proto::*;
use crate::store::{prefix_end, Store, StoreError};

/// Each server's record of the configuration it runs with.
pub const HASHES_PREFIX: &str = "/ferrok/encryption-hashes/";
const HASH_TTL_SECONDS: i64 = 15;
const RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// How long a rotation waits for every live server to load a new configuration.
const ACK_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error("the datastore: {0}")]
    Store(#[from] StoreError),
    #[error("the cluster's bootstrap data: {0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("the cluster's bootstrap data is not in the datastore under this server's token (was the token rotated on another server?)")]
    NoBootstrapData,
    #[error("the cluster's encryption configuration in the datastore is damaged: {0}")]
    Damaged(String),
    #[error(
        "{} differs from the cluster's encryption configuration in the datastore (its key {key:?} was never the cluster's): remove it to install the cluster's, or use the datastore it was made with",
        .path.display()
    )]
    Conflict { path: PathBuf, key: String },
    #[error("the cluster's encryption configuration changed meanwhile (another server?): try again")]
    Changed,
    #[error("server {server} has not loaded the new encryption configuration within {}s (it runs {hash}); the rotation stays at its stage: run rotate-keys again to go on", ACK_TIMEOUT.as_secs())]
    Lagging { server: String, hash: String },
    #[error("{0}")]
    Config(#[from] ConfigError),
}

/// What the bootstrap data holds: the configuration and where a rotation stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub config: EncryptionConfiguration,
    #[serde(flatten)]
    pub state: RotationState,
}

impl Record {
    fn from_json(text: &str) -> Result<Record, SharedError> {
        serde_json::from_str(text).map_err(|e| SharedError::Damaged(e.to_string()))
    }

    fn to_json(&self) -> String {
        // Plain structs of strings: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The shared record of one server: the datastore, the token that seals
/// the bootstrap data, and this server's name.
pub struct SharedConfig {
    store: Arc<dyn Store>,
    token: Box<dyn Fn() -> String + Send + Sync>,
    server: String,
    /// The lease of this server's hash record (0: none yet), and the hash.
    lease: tokio::sync::Mutex<(i64, String)>,
}

impl std::fmt::Debug for SharedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConfig").field("server", &self.server).finish_non_exhaustive()
    }
}

fn short(hash: &str) -> String {
    hash.chars().take(12).collect()
}

impl SharedConfig {
    pub fn new(
        store: Arc<dyn Store>,
        token: impl Fn() -> String + Send + Sync + 'static,
        server: &str,
    ) -> Arc<SharedConfig> {
        Arc::new(SharedConfig {
            store,
            token: Box::new(token),
            server: server.to_string(),
            lease: tokio::sync::Mutex::new((0, String::new())),
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The opened bootstrap data, its key and revision, and the token.
    async fn bootstrap(&self) -> Result<(BootstrapData, String, i64, String), SharedError> {
        let token = (self.token)();
        let key = storage_key(&token);
        let resp = self.store.range(RangeRequest { key: key.clone().into_bytes(), ..Default::default() }).await?;
        let kv = resp.kvs.into_iter().next().ok_or(SharedError::NoBootstrapData)?;
        // The key derivation is slow on purpose: off the async workers.
        let t = token.clone();
        let data = tokio::task::spawn_blocking(move || BootstrapData::open(&t, &kv.value))
            .await
            .map_err(|e| SharedError::Damaged(e.to_string()))??;
        Ok((data, key, kv.mod_revision, token))
    }

    /// The cluster's record (None: no server has configured encryption).
    pub async fn read(&self) -> Result<Option<Record>, SharedError> {
        let (data, ..) = self.bootstrap().await?;
        data.encryption.as_deref().map(Record::from_json).transpose()
    }

    /// Stores `new` if the cluster's record is still `expected`; false when
    /// it changed meanwhile.
    pub async fn replace(&self, expected: Option<&Record>, new: &Record) -> Result<bool, SharedError> {
        let (mut data, key, rev, token) = self.bootstrap().await?;
        let now = data.encryption.as_deref().map(Record::from_json).transpose()?;
        if now.as_ref() != expected {
            return Ok(false);
        }
        data.encryption = Some(new.to_json());
        let sealed = tokio::task::spawn_blocking(move || data.seal(&token))
            .await
            .map_err(|e| SharedError::Damaged(e.to_string()))??;
        let put = PutRequest { key: key.clone().into_bytes(), value: sealed, ..Default::default() };
        let req = TxnRequest {
            compare: vec![Compare::mod_revision_is(key.as_bytes(), rev)],
            success: vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }],
            failure: vec![],
        };
        Ok(self.store.txn(req).await?.succeeded)
    }

    fn hash_key(&self) -> Vec<u8> {
        format!("{HASHES_PREFIX}{}", self.server).into_bytes()
    }

    /// Records that this server runs the configuration of `hash`.
    pub async fn ack(&self, hash: &str) -> Result<(), SharedError> {
        let mut held = self.lease.lock().await;
        held.1 = hash.to_string();
        for _ in 0..2 {
            if held.0 == 0 {
                let granted = self.store.lease_grant(LeaseGrantRequest { ttl: HASH_TTL_SECONDS, id: 0 }).await?;
                held.0 = granted.id;
            }
            let put = PutRequest {
                key: self.hash_key(),
                value: hash.as_bytes().to_vec(),
                lease: held.0,
                ..Default::default()
            };
            match self.store.put(put).await {
                Ok(_) => return Ok(()),
                Err(StoreError::LeaseNotFound) => held.0 = 0,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::LeaseNotFound.into())
    }

    /// Keeps this server's hash record alive (written again if its lease expired).
    async fn renew(&self) -> Result<(), SharedError> {
        let (lease, hash) = self.lease.lock().await.clone();
        if lease != 0 {
            match self.store.lease_keep_alive(LeaseKeepAliveRequest { id: lease }).await {
                Ok(r) if r.ttl > 0 => return Ok(()),
                Ok(_) | Err(StoreError::LeaseNotFound) => self.lease.lock().await.0 = 0,
                Err(e) => return Err(e.into()),
            }
        }
        self.ack(&hash).await
    }

    /// Every live server's configuration hash, by server name.
    pub async fn hashes(&self) -> Result<BTreeMap<String, String>, SharedError> {
        let prefix = HASHES_PREFIX.as_bytes();
        let req = RangeRequest { key: prefix.to_vec(), range_end: prefix_end(prefix), ..Default::default() };
        let resp = self.store.range(req).await?;
        Ok(resp
            .kvs
            .into_iter()
            .map(|kv| {
                let name = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
                (name, String::from_utf8_lossy(&kv.value).into_owned())
            })
            .collect())
    }

    /// Whether `server` is another live server of this datastore.
    pub async fn is_other_live_server(&self, server: &str) -> Result<bool, SharedError> {
        Ok(server != self.server && self.hashes().await?.contains_key(server))
    }

    /// Waits until every live server runs the configuration of `hash`
    /// (a server that stopped drops out when its lease expires).
    pub async fn wait_all(&self, hash: &str) -> Result<(), SharedError> {
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        loop {
            let hashes = self.hashes().await?;
            let lagging = hashes.iter().find(|(_, h)| h.as_str() != hash);
            match lagging {
                None => return Ok(()),
                Some((server, h)) if tokio::time::Instant::now() >= deadline => {
                    return Err(SharedError::Lagging { server: server.clone(), hash: short(h) })
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// At a server's start on a shared datastore: makes `path` hold the
/// cluster's configuration, or publishes this server's as the cluster's
/// when there is none yet (`enable`: `--secrets-encryption`, a new key
/// when no file exists). The state file is written to match.
pub async fn join(path: &Path, enable: Option<Cipher>, shared: &SharedConfig) -> Result<(), SharedError> {
    // Two servers starting at once: the one that loses joins the winner's.
    for _ in 0..3 {
        if let Some(record) = shared.read().await? {
            if let Some(local) = config::load(path)? {
                if local != record.config {
                    let mut known = record.config.key_names();
                    known.extend(record.state.retired_keys.iter().cloned());
                    if let Some(key) = local.key_names().into_iter().find(|k| !known.contains(k)) {
                        return Err(SharedError::Conflict { path: path.to_path_buf(), key });
                    }
                    tracing::info!(file = %path.display(), "secrets encryption: the cluster's configuration moved on (key rotation): installing it");
                }
            }
            if enable.is_some() && !record.config.enabled() {
                tracing::warn!("secrets encryption is disabled in the cluster's configuration: `ferrok secrets-encrypt enable` turns it on");
            }
            if config::load(path)?.as_ref() != Some(&record.config) {
                config::save(path, &record.config)?;
            }
            super::save_state(&super::state_path(path), &record.state)?;
            tracing::info!("secrets encryption: running the cluster's configuration from the datastore");
            return Ok(());
        }
        let config = match (config::load(path)?, enable) {
            (Some(mut c), Some(cipher)) => {
                c.enable(cipher);
                c
            }
            (Some(c), None) => c,
            (None, Some(cipher)) => EncryptionConfiguration::new(cipher),
            (None, None) => return Ok(()),
        };
        let state = super::load_state(&super::state_path(path))?;
        let record = Record { config, state };
        // The file is written only once it is the cluster's.
        if shared.replace(None, &record).await? {
            config::save(path, &record.config)?;
            tracing::info!("secrets encryption: published this server's configuration as the cluster's");
            return Ok(());
        }
    }
    Err(SharedError::Changed)
}

/// While the server runs: reloads the keys whenever the cluster's record
/// changes, and keeps this server's hash record alive.
pub async fn follow(enc: Arc<Encryption>, shared: Arc<SharedConfig>) {
    loop {
        if let Err(e) = follow_once(&enc, &shared).await {
            tracing::warn!(error = %e, "secrets encryption: following the cluster's configuration");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn follow_once(enc: &Encryption, shared: &SharedConfig) -> Result<(), SharedError> {
    let prefix = BOOTSTRAP_PREFIX.as_bytes();
    let create = WatchCreateRequest { key: prefix.to_vec(), range_end: prefix_end(prefix), ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) }).await;
    let mut events = shared.store.watch(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))).await?;
    // What changed before the watch began.
    enc.refresh().await?;
    let mut renew = tokio::time::interval(RENEW_INTERVAL);
    renew.tick().await;
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                None => return Err(SharedError::Damaged("the watch of the bootstrap data ended".into())),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(resp)) if !resp.events.is_empty() => enc.refresh().await?,
                Some(Ok(_)) => {}
            },
            _ = renew.tick() => shared.renew().await?,
        }
    }
}
