//! Secrets encrypted at rest, as upstream's `--encryption-provider-config`:
//! the API server's storage seals the values of the configured resources
//! (Secrets) on every write and opens them on every read, list and watch
//! event, so the store holds `k8s:enc:aescbc:v1:<key>:…` while every
//! client sees plain objects. The store itself knows bytes only.
//!
//! The configuration lives in a file (k3s' place and format, see
//! [`config`]); `rotate-keys` swaps it while the server runs
//! ([`reencrypt`]), and `/v1-ferrok/encrypt/…` ([`endpoint`]) lets
//! `ferrok secrets-encrypt` drive it.

pub mod aescbc;
pub mod config;
pub mod endpoint;
pub mod reencrypt;
pub mod secretbox;
pub mod transformer;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use config::{ConfigError, EncryptionConfiguration};
use transformer::Transformer;

#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error("{0}")]
    Corrupt(&'static str),
    #[error("no configured key reads data that starts with {0:?}")]
    NoKey(String),
    #[error("{0}")]
    Failed(String),
}

/// How far a key rotation has come, in k3s' words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Start,
    ReencryptActive,
    ReencryptFinished,
    ReencryptFailed,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Start => "start",
            Stage::ReencryptActive => "reencrypt_active",
            Stage::ReencryptFinished => "reencrypt_finished",
            Stage::ReencryptFailed => "reencrypt_failed",
        }
    }
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
    stage: Mutex<Stage>,
    /// One rotation at a time.
    pub(crate) rotation: tokio::sync::Mutex<()>,
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
        Ok(Arc::new(Encryption {
            path: path.to_path_buf(),
            loaded: RwLock::new(Arc::new(loaded)),
            gate: Arc::new(tokio::sync::RwLock::new(())),
            stage: Mutex::new(Stage::Start),
            rotation: tokio::sync::Mutex::new(()),
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
        match self.loaded.read() {
            Ok(l) => l.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
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

    pub fn set_stage(&self, stage: Stage) {
        match self.stage.lock() {
            Ok(mut s) => *s = stage,
            Err(poisoned) => *poisoned.into_inner() = stage,
        }
    }

    pub fn stage(&self) -> Stage {
        match self.stage.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Writes `config` to the file and puts it in force, once every write
    /// sealed with the old one has reached the store.
    pub async fn install(&self, config: EncryptionConfiguration) -> Result<(), ConfigError> {
        let loaded = Self::prepare(Some(config.clone()), &self.path)?;
        config::save(&self.path, &config)?;
        let _exclusive = self.gate.write().await;
        match self.loaded.write() {
            Ok(mut l) => *l = Arc::new(loaded),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(loaded),
        }
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

    /// What `ferrok secrets-encrypt status` shows.
    pub fn status(&self) -> EncryptionStatus {
        let current = self.current();
        let file_hash = match config::load(&self.path) {
            Ok(Some(c)) => hash(c.to_json().as_bytes()),
            Ok(None) => String::new(),
            Err(e) => format!("unreadable: {e}"),
        };
        EncryptionStatus {
            enabled: current.config.as_ref().is_some_and(EncryptionConfiguration::enabled),
            stage: self.stage(),
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
        assert_eq!(enc.status().server_hash, enc.status().file_hash);
    }
}
