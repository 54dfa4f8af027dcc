//! The `apiserver.config.k8s.io/v1` EncryptionConfiguration, as upstream
//! reads it from `--encryption-provider-config` and as k3s keeps it at
//! `<data-dir>/server/cred/encryption-config.json` (mode 0600): for each
//! list of resources, providers in order (`aescbc`, `secretbox` with named
//! base64 keys; `identity` for plain data). The first provider writes;
//! every one reads.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};

pub const KIND: &str = "EncryptionConfiguration";
pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionConfiguration {
    pub kind: String,
    pub api_version: String,
    pub resources: Vec<ResourceConfiguration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceConfiguration {
    /// `secrets`, `configmaps`, or `<resource>.<group>`.
    pub resources: Vec<String>,
    pub providers: Vec<ProviderConfiguration>,
}

/// One provider: exactly one of its fields is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProviderConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbc: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretbox: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityConfiguration>,
    /// Upstream's other providers, read only to refuse them by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aesgcm: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IdentityConfiguration {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeysConfiguration {
    pub keys: Vec<Key>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Key {
    pub name: String,
    /// base64 of the key's bytes.
    pub secret: String,
}

/// The ciphers a new key can be made for (`--secrets-encryption-provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    Aescbc,
    Secretbox,
}

impl Cipher {
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aescbc => "aescbc",
            Cipher::Secretbox => "secretbox",
        }
    }
}

impl std::str::FromStr for Cipher {
    type Err = InvalidConfig;

    fn from_str(s: &str) -> Result<Cipher, InvalidConfig> {
        match s {
            "aescbc" => Ok(Cipher::Aescbc),
            "secretbox" => Ok(Cipher::Secretbox),
            other => Err(InvalidConfig::UnknownCipher(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: InvalidConfig },
    /// The state file beside the configuration does not parse.
    #[error("{path}: {source}")]
    State { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {source}")]
    Write { path: PathBuf, source: crate::pki::PkiError },
}

/// What is wrong with an EncryptionConfiguration (or a provider named on
/// the command line).
#[derive(Debug, thiserror::Error)]
pub enum InvalidConfig {
    #[error("{0:?} is not a provider (aescbc, secretbox)")]
    UnknownCipher(String),
    #[error("{0}")]
    Parse(#[source] serde_yaml_ng::Error),
    #[error("not an {KIND} of {API_VERSION} (kind {kind:?}, apiVersion {api_version:?})")]
    WrongKind { kind: String, api_version: String },
    #[error("a rule names no resources")]
    NoResources,
    #[error("resources {0:?} have no providers")]
    NoProviders(Vec<String>),
    #[error("resource {0:?}: wildcards are not supported; name the resources")]
    Wildcard(String),
    #[error("resource {0:?} is not a resource name")]
    NotAResource(String),
    #[error("resource {0:?} is named twice")]
    ResourceNamedTwice(String),
    #[error("provider {0} is not supported (aescbc, secretbox, identity are)")]
    UnsupportedProvider(&'static str),
    #[error("a provider names none of aescbc, secretbox, identity")]
    NoProvider,
    #[error("a provider names more than one of aescbc, secretbox, identity")]
    SeveralProviders,
    #[error("provider {0} has no keys")]
    NoKeys(&'static str),
    #[error("a key of provider {0} has no name")]
    UnnamedKey(&'static str),
    #[error("key {name:?} of provider {provider} is named twice")]
    KeyNamedTwice { name: String, provider: &'static str },
    #[error("key {name:?}: the secret is not base64: {source}")]
    NotBase64 { name: String, source: base64::DecodeError },
    #[error("key {name:?}: an aescbc key is 16, 24 or 32 bytes, not {len}")]
    AesCbcKeySize { name: String, len: usize },
    #[error("key {name:?}: a secretbox key is 32 bytes, not {len}")]
    SecretBoxKeySize { name: String, len: usize },
}

/// What kind of provider a `ProviderConfiguration` is.
pub enum ProviderKind<'a> {
    AesCbc(&'a [Key]),
    SecretBox(&'a [Key]),
    Identity,
}

impl ProviderConfiguration {
    pub fn kind(&self) -> Result<ProviderKind<'_>, InvalidConfig> {
        if self.aesgcm.is_some() || self.kms.is_some() {
            let name = if self.aesgcm.is_some() { "aesgcm" } else { "kms" };
            return Err(InvalidConfig::UnsupportedProvider(name));
        }
        match (&self.aescbc, &self.secretbox, &self.identity) {
            (Some(k), None, None) => Ok(ProviderKind::AesCbc(&k.keys)),
            (None, Some(k), None) => Ok(ProviderKind::SecretBox(&k.keys)),
            (None, None, Some(_)) => Ok(ProviderKind::Identity),
            (None, None, None) => Err(InvalidConfig::NoProvider),
            _ => Err(InvalidConfig::SeveralProviders),
        }
    }

    fn keys_mut(&mut self) -> Option<&mut Vec<Key>> {
        self.aescbc.as_mut().or(self.secretbox.as_mut()).map(|k| &mut k.keys)
    }

    fn identity() -> ProviderConfiguration {
        ProviderConfiguration { identity: Some(IdentityConfiguration {}), ..Default::default() }
    }

    fn with_key(cipher: Cipher, key: Key) -> ProviderConfiguration {
        let keys = Some(KeysConfiguration { keys: vec![key] });
        match cipher {
            Cipher::Aescbc => ProviderConfiguration { aescbc: keys, ..Default::default() },
            Cipher::Secretbox => ProviderConfiguration { secretbox: keys, ..Default::default() },
        }
    }

    fn cipher(&self) -> Option<Cipher> {
        match self.kind() {
            Ok(ProviderKind::AesCbc(_)) => Some(Cipher::Aescbc),
            Ok(ProviderKind::SecretBox(_)) => Some(Cipher::Secretbox),
            _ => None,
        }
    }
}

/// A key's bytes from its base64 text.
pub fn key_bytes(key: &Key) -> Result<Vec<u8>, InvalidConfig> {
    base64::engine::general_purpose::STANDARD
        .decode(key.secret.trim())
        .map_err(|source| InvalidConfig::NotBase64 { name: key.name.clone(), source })
}

/// A new key of 32 random bytes, named `<cipher>-key-<UTC time>` (unique
/// among `taken`).
pub fn new_key(cipher: Cipher, taken: &[&str]) -> Key {
    let mut bytes = [0u8; 32];
    crate::host::random::fill(&mut bytes);
    let time = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let base = format!("{}-key-{time}", cipher.name());
    let mut name = base.clone();
    let mut n = 1;
    while taken.contains(&name.as_str()) {
        n += 1;
        name = format!("{base}-{n}");
    }
    Key { name, secret: base64::engine::general_purpose::STANDARD.encode(bytes) }
}

impl EncryptionConfiguration {
    /// Secrets encrypted with a new key of `cipher`, plain data still read.
    pub fn new(cipher: Cipher) -> EncryptionConfiguration {
        EncryptionConfiguration {
            kind: KIND.into(),
            api_version: API_VERSION.into(),
            resources: vec![ResourceConfiguration {
                resources: vec!["secrets".into()],
                providers: vec![
                    ProviderConfiguration::with_key(cipher, new_key(cipher, &[])),
                    ProviderConfiguration::identity(),
                ],
            }],
        }
    }

    pub fn from_slice(bytes: &[u8]) -> Result<EncryptionConfiguration, InvalidConfig> {
        // YAML is a superset of JSON: upstream accepts both.
        let config: EncryptionConfiguration = serde_yaml_ng::from_slice(bytes).map_err(InvalidConfig::Parse)?;
        if config.kind != KIND || config.api_version != API_VERSION {
            return Err(InvalidConfig::WrongKind { kind: config.kind, api_version: config.api_version });
        }
        Ok(config)
    }

    pub fn to_json(&self) -> String {
        // Serialising plain structs of strings cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Whether the first provider of every rule encrypts.
    pub fn enabled(&self) -> bool {
        !self.resources.is_empty()
            && self.resources.iter().all(|r| r.providers.first().and_then(ProviderConfiguration::cipher).is_some())
    }

    /// Turns encryption on: identity moves to the end of every rule (a
    /// rule without a key gets a new one of `cipher`). Whether anything changed.
    pub fn enable(&mut self, cipher: Cipher) -> bool {
        let mut changed = false;
        for rule in &mut self.resources {
            if rule.providers.first().and_then(ProviderConfiguration::cipher).is_some() {
                continue;
            }
            changed = true;
            let identity = rule.providers.iter().any(|p| p.identity.is_some());
            rule.providers.retain(|p| p.identity.is_none());
            if rule.providers.is_empty() {
                rule.providers.push(ProviderConfiguration::with_key(cipher, new_key(cipher, &[])));
            }
            if identity {
                rule.providers.push(ProviderConfiguration::identity());
            }
        }
        changed
    }

    /// Turns encryption off: identity first (added if missing), every key
    /// kept so that encrypted data stays readable. Whether anything changed.
    pub fn disable(&mut self) -> bool {
        let mut changed = false;
        for rule in &mut self.resources {
            if rule.providers.first().is_some_and(|p| p.identity.is_some()) {
                continue;
            }
            changed = true;
            rule.providers.retain(|p| p.identity.is_none());
            rule.providers.insert(0, ProviderConfiguration::identity());
        }
        changed
    }

    /// A new key in front of every rule's first provider (each rule that
    /// encrypts); the new key's name.
    pub fn prepend_new_key(&mut self) -> Option<String> {
        let mut name = None;
        for rule in &mut self.resources {
            let Some(first) = rule.providers.first_mut() else { continue };
            let Some(cipher) = first.cipher() else { continue };
            let Some(keys) = first.keys_mut() else { continue };
            let taken: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
            let key = new_key(cipher, &taken);
            name.get_or_insert_with(|| key.name.clone());
            keys.insert(0, key);
        }
        name
    }

    /// A new key of the first provider's cipher placed second in every
    /// rule that encrypts: read by every server before any writes with it
    /// (a rotation's `prepare`); the new key's name.
    pub fn add_reading_key(&mut self) -> Option<String> {
        let mut name: Option<String> = None;
        for rule in &mut self.resources {
            let Some(first) = rule.providers.first_mut() else { continue };
            let Some(cipher) = first.cipher() else { continue };
            let Some(keys) = first.keys_mut() else { continue };
            let taken: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
            let key = match &name {
                // One name for every rule, so that the rotation can name it.
                Some(n) if !taken.contains(&n.as_str()) => Key { name: n.clone(), secret: new_key(cipher, &[]).secret },
                _ => new_key(cipher, &taken),
            };
            name.get_or_insert_with(|| key.name.clone());
            keys.insert(1.min(keys.len()), key);
        }
        name
    }

    /// The key `name` moved in front of its provider's keys, in every rule
    /// where the first provider holds it (a rotation's `rotate`). Whether
    /// any rule holds it.
    pub fn promote_key(&mut self, name: &str) -> bool {
        let mut found = false;
        for rule in &mut self.resources {
            let Some(keys) = rule.providers.first_mut().and_then(ProviderConfiguration::keys_mut) else { continue };
            if let Some(i) = keys.iter().position(|k| k.name == name) {
                let key = keys.remove(i);
                keys.insert(0, key);
                found = true;
            }
        }
        found
    }

    /// The names of every key, in every rule and provider.
    pub fn key_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for rule in &self.resources {
            for provider in &rule.providers {
                if let Ok(ProviderKind::AesCbc(keys) | ProviderKind::SecretBox(keys)) = provider.kind() {
                    names.extend(keys.iter().map(|k| k.name.clone()));
                }
            }
        }
        names
    }

    /// Every key but the one that writes dropped from every rule that
    /// encrypts (identity stays, for data written before encryption).
    pub fn drop_old_keys(&mut self) {
        for rule in &mut self.resources {
            if rule.providers.first().and_then(ProviderConfiguration::cipher).is_none() {
                continue;
            }
            rule.providers.truncate(1);
            if let Some(keys) = rule.providers[0].keys_mut() {
                keys.truncate(1);
            }
            rule.providers.push(ProviderConfiguration::identity());
        }
    }
}

/// Where k3s keeps the file, under the server's data dir.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("cred").join("encryption-config.json")
}

/// The file's bytes, or None when there is none.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, ConfigError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Io { action: "read", path: path.to_path_buf(), source }),
    }
}

/// The configuration in `path`, or None when there is no file.
pub fn load(path: &Path) -> Result<Option<EncryptionConfiguration>, ConfigError> {
    let Some(bytes) = read(path)? else { return Ok(None) };
    let config = EncryptionConfiguration::from_slice(&bytes)
        .map_err(|reason| ConfigError::Invalid { path: path.to_path_buf(), reason })?;
    // Every key must be usable before anything is written with the file.
    super::transformer::Transformer::new(&config)
        .map_err(|reason| ConfigError::Invalid { path: path.to_path_buf(), reason })?;
    Ok(Some(config))
}

/// Writes `text` to `path` (mode 0600, through a temporary file).
pub fn write_private(path: &Path, text: &str) -> Result<(), ConfigError> {
    crate::pki::write(path, text, 0o600).map_err(|e| match e {
        crate::pki::PkiError::Io { action, path, source } => ConfigError::Io { action, path, source },
        source => ConfigError::Write { path: path.to_path_buf(), source },
    })
}

/// Writes `config` to `path` (mode 0600, through a temporary file, so a
/// reader sees the old file or the new one).
pub fn save(path: &Path, config: &EncryptionConfiguration) -> Result<(), ConfigError> {
    write_private(path, &config.to_json())?;
    // An existing file keeps its mode across a rename of a new one; a file
    // someone loosened is tightened again.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| ConfigError::Io {
        action: "chmod",
        path: path.to_path_buf(),
        source,
    })
}

/// `--secrets-encryption` and `ferrok secrets-encrypt enable`: the file
/// made (a new key of `cipher`) or turned on. Whether it changed.
pub fn ensure_enabled(path: &Path, cipher: Cipher) -> Result<bool, ConfigError> {
    let (config, changed) = match load(path)? {
        None => (EncryptionConfiguration::new(cipher), true),
        Some(mut c) => {
            let changed = c.enable(cipher);
            (c, changed)
        }
    };
    if changed {
        save(path, &config)?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_is_upstreams_shape() {
        let c = EncryptionConfiguration::new(Cipher::Aescbc);
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["kind"], "EncryptionConfiguration");
        assert_eq!(v["apiVersion"], "apiserver.config.k8s.io/v1");
        assert_eq!(v["resources"][0]["resources"], serde_json::json!(["secrets"]));
        let key = &v["resources"][0]["providers"][0]["aescbc"]["keys"][0];
        assert!(key["name"].as_str().unwrap().starts_with("aescbc-key-"));
        assert_eq!(key_bytes(&serde_json::from_value(key.clone()).unwrap()).unwrap().len(), 32);
        assert_eq!(v["resources"][0]["providers"][1], serde_json::json!({"identity": {}}));
        assert!(c.enabled());
        assert_eq!(EncryptionConfiguration::from_slice(c.to_json().as_bytes()).unwrap(), c);
    }

    #[test]
    fn enable_disable_rotate() {
        let mut c = EncryptionConfiguration::new(Cipher::Secretbox);
        assert!(c.disable());
        assert!(!c.enabled());
        assert!(c.resources[0].providers[0].identity.is_some());
        assert!(!c.disable());
        assert!(c.enable(Cipher::Aescbc));
        assert!(c.enabled());
        assert!(c.resources[0].providers[0].secretbox.is_some(), "the old key is kept");
        let old = c.resources[0].providers[0].secretbox.as_ref().unwrap().keys[0].name.clone();
        let new = c.prepend_new_key().unwrap();
        assert_ne!(new, old, "names are unique even within one second");
        let keys: Vec<_> =
            c.resources[0].providers[0].secretbox.as_ref().unwrap().keys.iter().map(|k| k.name.clone()).collect();
        assert_eq!(keys, vec![new.clone(), old]);
        c.drop_old_keys();
        assert_eq!(c.resources[0].providers.len(), 2);
        assert_eq!(c.resources[0].providers[0].secretbox.as_ref().unwrap().keys.len(), 1);
        assert_eq!(c.resources[0].providers[0].secretbox.as_ref().unwrap().keys[0].name, new);
    }

    #[test]
    fn a_staged_rotation_reads_then_writes_then_drops() {
        let mut c = EncryptionConfiguration::new(Cipher::Aescbc);
        let old = c.key_names()[0].clone();
        let new = c.add_reading_key().unwrap();
        assert_eq!(c.key_names(), vec![old.clone(), new.clone()], "prepare: the old key still writes");
        assert!(c.promote_key(&new));
        assert!(c.promote_key(&new), "promoting twice changes nothing");
        assert_eq!(c.key_names(), vec![new.clone(), old]);
        assert!(!c.promote_key("no-such-key"));
        c.drop_old_keys();
        assert_eq!(c.key_names(), vec![new]);
        // A configuration that does not encrypt has no key to add.
        c.disable();
        assert!(c.add_reading_key().is_none());
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let bad = |text: &str| EncryptionConfiguration::from_slice(text.as_bytes()).err();
        assert!(bad("{").is_some());
        assert!(bad("kind: EncryptionConfig\napiVersion: v1\nresources: []")
            .unwrap()
            .to_string()
            .contains("not an Encryption"));
        let c = EncryptionConfiguration::from_slice(
            b"kind: EncryptionConfiguration\napiVersion: apiserver.config.k8s.io/v1\nresources:\n- resources: [secrets]\n  providers:\n  - aesgcm: {keys: []}\n",
        )
        .unwrap();
        assert!(c.resources[0].providers[0].kind().err().unwrap().to_string().contains("aesgcm"));
    }

    #[test]
    fn files_are_private_and_errors_name_them() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(ensure_enabled(&path, Cipher::Aescbc).unwrap());
        assert!(!ensure_enabled(&path, Cipher::Aescbc).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "{\"kind\": ").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
