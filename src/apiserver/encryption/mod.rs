//! Secrets encrypted at rest, as upstream's `--encryption-provider-config`:
//! the API server's storage seals the values of the configured resources
//! (Secrets) on every write and opens them on every read, list and watch
//! event, so the store holds `k8s:enc:aescbc:v1:<key>:…` while every
//! client sees plain objects. The store itself knows bytes only.
//!
//! The configuration lives in a file (k3s' place and format, see
//! [`config`]); `rotate-keys` swaps it while the server runs
//! ([`reencrypt`]), and `/v1-ferrok/encrypt/…`
//! (`supervisor::secrets_encrypt`) lets `ferrok secrets-encrypt` drive it.

pub mod aescbc;
pub mod cluster;
pub mod config;
pub mod reencrypt;
pub mod secretbox;
pub mod transformer;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use cluster::{Record, SharedConfig, SharedError};
use config::{ConfigError, EncryptionConfiguration};
use transformer::Transformer;

use crate::sync::{LockExt, RwLockExt};

#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error("{0}")]
    Corrupt(&'static str),
    #[error("no configured key reads data that starts with {0:?}")]
    NoKey(String),
    #[error("{0}")]
    Failed(String),
}

/// How far a key rotation has come, in k3s' words: `prepare` (a new key
/// every server reads), `rotate` (every server writes with it),
/// `reencrypt_active` (every value rewritten with it), `reencrypt_finished`
/// (the old keys dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    #[default]
    Start,
    Prepare,
    Rotate,
    ReencryptActive,
    ReencryptFinished,
    ReencryptFailed,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Start => "start",
            Stage::Prepare => "prepare",
            Stage::Rotate => "rotate",
            Stage::ReencryptActive => "reencrypt_active",
            Stage::ReencryptFinished => "reencrypt_finished",
            Stage::ReencryptFailed => "reencrypt_failed",
        }
    }

    /// Whether a rotation is under way (and must be finished before the
    /// old keys can go).
    pub fn in_progress(self) -> bool {
        matches!(self, Stage::Prepare | Stage::Rotate | Stage::ReencryptActive)
    }
}

/// Where a rotation stands, persisted (in `encryption-state.json` beside
/// the configuration, and in the cluster's record on a shared datastore)
/// so that a server restarted midway finishes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RotationState {
    pub stage: Stage,
    /// The key a rotation under way brings in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_key: Option<String>,
    /// The server running that rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Keys rotations dropped: a server whose file still lists them is
    /// behind the cluster, not at odds with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_keys: Vec<String>,
}

/// The state file beside the configuration file `config`.
pub fn state_path(config: &Path) -> PathBuf {
    config.with_file_name("encryption-state.json")
}

/// The state in `path` (the default when there is none).
pub fn load_state(path: &Path) -> Result<RotationState, ConfigError> {
    match config::read(path)? {
        None => Ok(RotationState::default()),
        Some(bytes) => {
            serde_json::from_slice(&bytes).map_err(|source| ConfigError::State { path: path.to_path_buf(), source })
        }
    }
}

pub fn save_state(path: &Path, state: &RotationState) -> Result<(), ConfigError> {
    config::write_private(path, &(serde_json::to_string_pretty(state).unwrap_or_default() + "\n"))
}

/// One key (or identity) of the configuration the server runs with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderStatus {
    pub resources: Vec<String>,
    /// `aescbc`, `secretbox` or `identity`.
    pub provider: String,
    /// The key's name (empty for identity).
    pub key: String,
    /// Whether this key writes.
    pub active: bool,
}

/// What `GET /v1-ferrok/encrypt/status` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionStatus {
    pub enabled: bool,
    pub stage: Stage,
    /// The configuration file.
    pub config_file: String,
    /// sha256 of the file the server runs with (empty: none).
    pub server_hash: String,
    /// sha256 of the file on disk now (empty: none).
    pub file_hash: String,
    pub providers: Vec<ProviderStatus>,
    /// On a shared datastore: each live server's hash of the configuration it runs.
    #[serde(default)]
    pub server_hashes: BTreeMap<String, String>,
    /// The key a rotation under way brings in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_key: Option<String>,
}

/// The configuration in force, with its transformer.
struct Loaded {
    config: Option<EncryptionConfiguration>,
    transformer: Transformer,
    hash: String,
}

/// Encryption at rest for one API server: the configuration in force,
/// swapped whole when keys rotate.
pub struct Encryption {
    path: PathBuf,
    loaded: RwLock<Arc<Loaded>>,
    /// Writes of transformed resources hold it shared from sealing to
    /// commit; a swap of the configuration holds it exclusively, so once
    /// a swap returns no value sealed with the old configuration is still
    /// on its way to the store.
    gate: Arc<tokio::sync::RwLock<()>>,
    state: Mutex<RotationState>,
    /// One rotation at a time.
    pub(crate) rotation: tokio::sync::Mutex<()>,
    /// The configuration shared with the other servers of the datastore.
    shared: OnceLock<Arc<SharedConfig>>,
    /// A reload from the cluster's record and a publication of a new one
    /// never interleave (a reload could put an older record back).
    sync: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Encryption").field("path", &self.path).field("enabled", &self.enabled()).finish()
    }
}

/// A write's hold on the configuration it sealed with.
pub type WriteGuard = Option<tokio::sync::OwnedRwLockReadGuard<()>>;

fn hash(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Encryption {
    /// The configuration in `path` (none when there is no file: nothing is
    /// encrypted, and status says so).
    pub fn load(path: &Path) -> Result<Arc<Encryption>, ConfigError> {
        let config = config::load(path)?;
        let loaded = Self::prepare(config, path)?;
        let state = load_state(&state_path(path))?;
        Ok(Arc::new(Encryption {
            path: path.to_path_buf(),
            loaded: RwLock::new(Arc::new(loaded)),
            gate: Arc::new(tokio::sync::RwLock::new(())),
            state: Mutex::new(state),
            rotation: tokio::sync::Mutex::new(()),
            shared: OnceLock::new(),
            sync: tokio::sync::Mutex::new(()),
        }))
    }

    fn prepare(config: Option<EncryptionConfiguration>, path: &Path) -> Result<Loaded, ConfigError> {
        let invalid = |reason| ConfigError::Invalid { path: path.to_path_buf(), reason };
        Ok(match config {
            None => Loaded { config: None, transformer: Transformer::identity(), hash: String::new() },
            Some(c) => Loaded {
                transformer: Transformer::new(&c).map_err(invalid)?,
                hash: hash(c.to_json().as_bytes()),
                config: Some(c),
            },
        })
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded.read_locked().clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration in force (None: no file).
    pub fn config(&self) -> Option<EncryptionConfiguration> {
        self.current().config.clone()
    }

    pub fn enabled(&self) -> bool {
        self.current().config.as_ref().is_some_and(EncryptionConfiguration::enabled)
    }

    /// Shares the configuration with the other servers of the datastore.
    pub fn set_shared(&self, shared: Arc<SharedConfig>) {
        let _ = self.shared.set(shared);
    }

    pub fn shared(&self) -> Option<&Arc<SharedConfig>> {
        self.shared.get()
    }

    /// This server's name among those of the datastore (empty alone).
    pub fn server_name(&self) -> String {
        self.shared().map(|s| s.server().to_string()).unwrap_or_default()
    }

    fn set_state(&self, state: RotationState) {
        *self.state.locked() = state;
    }

    pub fn state(&self) -> RotationState {
        self.state.locked().clone()
    }

    /// Sets the stage of this server alone (the pass at start), persisted.
    pub fn set_stage(&self, stage: Stage) {
        let mut state = self.state();
        state.stage = stage;
        if let Err(e) = save_state(&state_path(&self.path), &state) {
            tracing::warn!(error = %e, "secrets encryption: cannot persist the rotation stage");
        }
        self.set_state(state);
    }

    pub fn stage(&self) -> Stage {
        self.state().stage
    }

    /// The hash of the configuration in force (empty: none).
    pub fn hash(&self) -> String {
        self.current().hash.clone()
    }

    /// Puts `config` and `state` in force everywhere: alone, in the files;
    /// on a shared datastore, in the cluster's record first (only if it is
    /// still what this server runs), then here, then waits until every
    /// live server runs it too.
    pub async fn publish(&self, config: EncryptionConfiguration, state: RotationState) -> Result<(), SharedError> {
        let Some(shared) = self.shared().cloned() else {
            self.install(config).await?;
            save_state(&state_path(&self.path), &state)?;
            self.set_state(state);
            return Ok(());
        };
        let hash = {
            let _one = self.sync.lock().await;
            let expected = self.config().map(|config| Record { config, state: self.state() });
            let record = Record { config, state };
            if !shared.replace(expected.as_ref(), &record).await? {
                return Err(SharedError::Changed);
            }
            self.apply(record).await?
        };
        shared.ack(&hash).await?;
        shared.wait_all(&hash).await
    }

    /// Puts the cluster's record in force here, if it changed.
    async fn apply(&self, record: Record) -> Result<String, SharedError> {
        if self.config().as_ref() != Some(&record.config) {
            self.install(record.config).await?;
            tracing::info!(hash = %self.hash(), "secrets encryption: loaded the cluster's configuration");
        }
        if self.state() != record.state {
            save_state(&state_path(&self.path), &record.state)?;
            self.set_state(record.state);
        }
        Ok(self.hash())
    }

    /// Loads the cluster's record (shared datastore only) and records the
    /// hash this server runs.
    pub async fn refresh(&self) -> Result<(), SharedError> {
        let Some(shared) = self.shared().cloned() else { return Ok(()) };
        let hash = {
            let _one = self.sync.lock().await;
            match shared.read().await? {
                Some(record) => self.apply(record).await?,
                None => self.hash(),
            }
        };
        shared.ack(&hash).await
    }

    /// Writes `config` to the file and puts it in force, once every write
    /// sealed with the old one has reached the store.
    pub async fn install(&self, config: EncryptionConfiguration) -> Result<(), ConfigError> {
        let loaded = Self::prepare(Some(config.clone()), &self.path)?;
        config::save(&self.path, &config)?;
        let _exclusive = self.gate.write().await;
        *self.loaded.write_locked() = Arc::new(loaded);
        Ok(())
    }

    /// Whether values under `key` are transformed.
    pub fn applies_to(&self, key: &[u8]) -> bool {
        self.current().transformer.applies_to(key)
    }

    /// The store prefixes of the transformed resources.
    pub fn prefixes(&self) -> Vec<String> {
        self.current().transformer.prefixes()
    }

    /// Whether `data` is already in the form a write would give it now.
    pub fn is_current(&self, key: &[u8], data: &[u8]) -> bool {
        self.current().transformer.is_current(key, data)
    }

    /// `plain` as stored under `key`, and the hold the write keeps until it
    /// has committed.
    pub async fn seal(&self, key: &[u8], plain: Vec<u8>) -> Result<(Vec<u8>, WriteGuard), TransformError> {
        if !self.applies_to(key) {
            return Ok((plain, None));
        }
        let guard = self.gate.clone().read_owned().await;
        let sealed = self.current().transformer.to_storage(key, plain)?;
        Ok((sealed, Some(guard)))
    }

    /// The plain value of `data` stored under `key`.
    pub fn open<'a>(&self, key: &[u8], data: &'a [u8]) -> Result<Cow<'a, [u8]>, TransformError> {
        self.current().transformer.from_storage(key, data)
    }

    /// On a shared datastore: whether one of `values` (store key, value)
    /// is sealed with a key this server does not know yet (another
    /// server's newer configuration, its change not seen yet).
    pub fn behind<'a>(&self, mut values: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> bool {
        if self.shared().is_none() {
            return false;
        }
        let current = self.current();
        !values.all(|(k, v)| current.transformer.knows(k, v))
    }

    /// [`refresh`](Self::refresh), a failure logged: for readers that go
    /// on with the keys they have.
    pub async fn catch_up(&self) {
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "secrets encryption: cannot reload the cluster's configuration");
        }
    }

    /// What `ferrok secrets-encrypt status` shows.
    pub async fn status(&self) -> EncryptionStatus {
        let mut server_hashes = BTreeMap::new();
        if let Some(shared) = self.shared() {
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "secrets encryption: cannot read the cluster's configuration");
            }
            match shared.hashes().await {
                Ok(h) => server_hashes = h,
                Err(e) => tracing::warn!(error = %e, "secrets encryption: cannot read the servers' hashes"),
            }
        }
        let state = self.state();
        let current = self.current();
        let file_hash = match config::load(&self.path) {
            Ok(Some(c)) => hash(c.to_json().as_bytes()),
            Ok(None) => String::new(),
            Err(e) => format!("unreadable: {e}"),
        };
        EncryptionStatus {
            enabled: current.config.as_ref().is_some_and(EncryptionConfiguration::enabled),
            stage: state.stage,
            new_key: state.new_key,
            server_hashes,
            config_file: self.path.display().to_string(),
            server_hash: current.hash.clone(),
            file_hash,
            providers: match &current.config {
                Some(c) => Transformer::describe(c),
                None => vec![ProviderStatus {
                    resources: vec!["secrets".into()],
                    provider: "identity".into(),
                    key: String::new(),
                    active: true,
                }],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::config::Cipher;
    use super::*;

    const KEY: &[u8] = b"/registry/secrets/default/s";

    /// A new configuration is put in force only once every write sealed
    /// with the old one has committed (dropped its guard).
    #[tokio::test]
    async fn a_swap_waits_for_writes_sealed_with_the_old_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = config::path_in(dir.path());
        config::ensure_enabled(&path, Cipher::Aescbc).unwrap();
        let enc = Encryption::load(&path).unwrap();
        let (old, guard) = enc.seal(KEY, b"v".to_vec()).await.unwrap();
        assert!(guard.is_some(), "a secret's write holds the gate");
        assert!(enc.seal(b"/registry/configmaps/default/c", b"v".to_vec()).await.unwrap().1.is_none());
        let mut next = enc.config().unwrap();
        let key = next.prepend_new_key().unwrap();
        let swapping = {
            let enc = enc.clone();
            tokio::spawn(async move { enc.install(next).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!swapping.is_finished(), "the swap waits for the write in flight");
        assert!(enc.is_current(KEY, &old), "the old key writes until the swap");
        drop(guard);
        swapping.await.unwrap().unwrap();
        assert!(!enc.is_current(KEY, &old), "the old value is now stale");
        let (new, _) = enc.seal(KEY, b"v".to_vec()).await.unwrap();
        assert!(new.starts_with(format!("k8s:enc:aescbc:v1:{key}:").as_bytes()));
        assert_eq!(&*enc.open(KEY, &old).unwrap(), b"v");
        let status = enc.status().await;
        assert_eq!(status.server_hash, status.file_hash);
    }
}
