//! Values in and out of the store for the resources a configuration
//! names, as upstream's prefix transformers: a value written is
//! `k8s:enc:<provider>:v1:<key name>:` followed by the sealed bytes (or the
//! plain bytes when `identity` writes); a value read goes to the provider
//! and key whose prefix it carries, every configured one in order, and to
//! `identity` for plain data.

use std::borrow::Cow;

use super::aescbc::AesCbc;
use super::config::{key_bytes, EncryptionConfiguration, InvalidConfig, ProviderKind};
use super::secretbox::SecretBox;
use super::TransformError;

/// What every encrypted value starts with.
pub const ENCRYPTED: &[u8] = b"k8s:enc:";

enum Sealer {
    AesCbc(AesCbc),
    SecretBox(SecretBox),
}

/// One provider's key, or identity.
enum Entry {
    Key { prefix: Vec<u8>, sealer: Sealer },
    Identity,
}

/// The providers of one rule, in order: the first writes.
struct Chain {
    /// Store key prefixes of the rule's resources (`/registry/secrets/`).
    prefixes: Vec<String>,
    entries: Vec<Entry>,
}

pub struct Transformer {
    chains: Vec<Chain>,
}

/// The store's key prefix of a resource named in a configuration, as the
/// API server lays out keys: core resources under `/registry/<plural>/`,
/// others under `/registry/<group>/<plural>/`.
fn store_prefix(resource: &str) -> Result<String, InvalidConfig> {
    if resource.contains('*') {
        return Err(InvalidConfig::Wildcard(resource.to_string()));
    }
    let valid = |s: &str| {
        !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !valid(resource) {
        return Err(InvalidConfig::NotAResource(resource.to_string()));
    }
    Ok(match resource.split_once('.') {
        None => format!("/registry/{resource}/"),
        Some((plural, group)) => format!("/registry/{group}/{plural}/"),
    })
}

impl Transformer {
    /// The transformer of `config`, or what is wrong with it.
    pub fn new(config: &EncryptionConfiguration) -> Result<Transformer, InvalidConfig> {
        let mut chains = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for rule in &config.resources {
            if rule.resources.is_empty() {
                return Err(InvalidConfig::NoResources);
            }
            if rule.providers.is_empty() {
                return Err(InvalidConfig::NoProviders(rule.resources.clone()));
            }
            let mut prefixes = Vec::new();
            for r in &rule.resources {
                if !seen.insert(r.clone()) {
                    return Err(InvalidConfig::ResourceNamedTwice(r.clone()));
                }
                prefixes.push(store_prefix(r)?);
            }
            let mut entries = Vec::new();
            let mut names = std::collections::HashSet::new();
            for provider in &rule.providers {
                let (provider_name, keys) = match provider.kind()? {
                    ProviderKind::Identity => {
                        entries.push(Entry::Identity);
                        continue;
                    }
                    ProviderKind::AesCbc(keys) => ("aescbc", keys),
                    ProviderKind::SecretBox(keys) => ("secretbox", keys),
                };
                if keys.is_empty() {
                    return Err(InvalidConfig::NoKeys(provider_name));
                }
                for key in keys {
                    if key.name.is_empty() {
                        return Err(InvalidConfig::UnnamedKey(provider_name));
                    }
                    if !names.insert((provider_name, key.name.clone())) {
                        return Err(InvalidConfig::KeyNamedTwice { name: key.name.clone(), provider: provider_name });
                    }
                    let bytes = key_bytes(key)?;
                    let sealer = match provider_name {
                        "aescbc" => AesCbc::new(&bytes)
                            .map(Sealer::AesCbc)
                            .ok_or_else(|| InvalidConfig::AesCbcKeySize { name: key.name.clone(), len: bytes.len() })?,
                        _ => SecretBox::new(&bytes).map(Sealer::SecretBox).ok_or_else(|| {
                            InvalidConfig::SecretBoxKeySize { name: key.name.clone(), len: bytes.len() }
                        })?,
                    };
                    let prefix = format!("k8s:enc:{provider_name}:v1:{}:", key.name).into_bytes();
                    entries.push(Entry::Key { prefix, sealer });
                }
            }
            chains.push(Chain { prefixes, entries });
        }
        Ok(Transformer { chains })
    }

    /// A transformer that changes nothing (no configuration).
    pub fn identity() -> Transformer {
        Transformer { chains: Vec::new() }
    }

    fn chain(&self, key: &[u8]) -> Option<&Chain> {
        self.chains.iter().find(|c| c.prefixes.iter().any(|p| key.starts_with(p.as_bytes())))
    }

    /// Whether values under `key` are transformed at all.
    pub fn applies_to(&self, key: &[u8]) -> bool {
        self.chain(key).is_some()
    }

    /// The store prefixes of every transformed resource.
    pub fn prefixes(&self) -> Vec<String> {
        self.chains.iter().flat_map(|c| c.prefixes.iter().cloned()).collect()
    }

    /// The value to store for `plain` under `key`.
    pub fn to_storage(&self, key: &[u8], plain: Vec<u8>) -> Result<Vec<u8>, TransformError> {
        let Some(chain) = self.chain(key) else { return Ok(plain) };
        match chain.entries.first() {
            None | Some(Entry::Identity) => Ok(plain),
            Some(Entry::Key { prefix, sealer }) => {
                let sealed = match sealer {
                    Sealer::AesCbc(c) => c.seal(&plain),
                    Sealer::SecretBox(b) => b.seal(&plain)?,
                };
                let mut out = Vec::with_capacity(prefix.len() + sealed.len());
                out.extend_from_slice(prefix);
                out.extend_from_slice(&sealed);
                Ok(out)
            }
        }
    }

    /// The plain value of `data` stored under `key`.
    pub fn from_storage<'a>(&self, key: &[u8], data: &'a [u8]) -> Result<Cow<'a, [u8]>, TransformError> {
        let Some(chain) = self.chain(key) else { return Ok(Cow::Borrowed(data)) };
        let mut errors = Vec::new();
        for entry in &chain.entries {
            match entry {
                Entry::Identity => {
                    if data.starts_with(ENCRYPTED) {
                        errors.push("identity transformer tried to read encrypted data".to_string());
                    } else {
                        return Ok(Cow::Borrowed(data));
                    }
                }
                Entry::Key { prefix, sealer } => {
                    let Some(body) = data.strip_prefix(prefix.as_slice()) else { continue };
                    let opened = match sealer {
                        Sealer::AesCbc(c) => c.open(body),
                        Sealer::SecretBox(b) => b.open(body),
                    };
                    match opened {
                        Ok(plain) => return Ok(Cow::Owned(plain)),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
            }
        }
        if errors.is_empty() {
            let shown = &data[..data.len().min(40)];
            let shown = String::from_utf8_lossy(shown);
            let name = shown.split(':').take(5).collect::<Vec<_>>().join(":");
            Err(TransformError::NoKey(name))
        } else {
            Err(TransformError::Failed(errors.join("; ")))
        }
    }

    /// Whether some configured key (or identity, for plain data) reads
    /// `data` stored under `key`.
    pub fn knows(&self, key: &[u8], data: &[u8]) -> bool {
        let Some(chain) = self.chain(key) else { return true };
        if !data.starts_with(ENCRYPTED) {
            return true;
        }
        chain.entries.iter().any(|e| matches!(e, Entry::Key { prefix, .. } if data.starts_with(prefix)))
    }

    /// Whether `data` under `key` is in the form a write makes now (sealed
    /// with the first key, or plain when identity writes): what a
    /// re-encryption pass leaves alone.
    pub fn is_current(&self, key: &[u8], data: &[u8]) -> bool {
        let Some(chain) = self.chain(key) else { return true };
        match chain.entries.first() {
            None | Some(Entry::Identity) => !data.starts_with(ENCRYPTED),
            Some(Entry::Key { prefix, .. }) => data.starts_with(prefix),
        }
    }

    /// Each rule's providers for `status`: (resources, [(type, key name, writes)]).
    pub fn describe(config: &EncryptionConfiguration) -> Vec<super::ProviderStatus> {
        let mut out = Vec::new();
        for rule in &config.resources {
            for (i, provider) in rule.providers.iter().enumerate() {
                let (kind, keys): (&str, &[super::config::Key]) = match provider.kind() {
                    Ok(ProviderKind::AesCbc(k)) => ("aescbc", k),
                    Ok(ProviderKind::SecretBox(k)) => ("secretbox", k),
                    Ok(ProviderKind::Identity) => ("identity", &[]),
                    Err(_) => continue,
                };
                if keys.is_empty() {
                    out.push(super::ProviderStatus {
                        resources: rule.resources.clone(),
                        provider: kind.into(),
                        key: String::new(),
                        active: i == 0,
                    });
                }
                for (j, key) in keys.iter().enumerate() {
                    out.push(super::ProviderStatus {
                        resources: rule.resources.clone(),
                        provider: kind.into(),
                        key: key.name.clone(),
                        active: i == 0 && j == 0,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::Cipher;
    use super::*;

    const SECRET: &[u8] = b"/registry/secrets/default/s1";
    const CONFIGMAP: &[u8] = b"/registry/configmaps/default/c1";

    #[test]
    fn secrets_are_sealed_with_the_first_key_and_nothing_else_is() {
        for cipher in [Cipher::Aescbc, Cipher::Secretbox] {
            let config = EncryptionConfiguration::new(cipher);
            let t = Transformer::new(&config).unwrap();
            let stored = t.to_storage(SECRET, b"{\"data\":1}".to_vec()).unwrap();
            let name = &config.resources[0].providers[0]
                .aescbc
                .as_ref()
                .or(config.resources[0].providers[0].secretbox.as_ref())
                .unwrap()
                .keys[0]
                .name;
            let prefix = format!("k8s:enc:{}:v1:{name}:", cipher.name());
            assert!(stored.starts_with(prefix.as_bytes()), "{}", String::from_utf8_lossy(&stored));
            assert!(!stored.windows(8).any(|w| w == b"\"data\":1"));
            assert_eq!(&*t.from_storage(SECRET, &stored).unwrap(), b"{\"data\":1}");
            assert!(t.is_current(SECRET, &stored));
            // Plain data written before encryption is read through identity.
            assert_eq!(&*t.from_storage(SECRET, b"{\"plain\":1}").unwrap(), b"{\"plain\":1}");
            assert!(!t.is_current(SECRET, b"{\"plain\":1}"));
            assert_eq!(t.to_storage(CONFIGMAP, b"cm".to_vec()).unwrap(), b"cm");
            // A secret-looking name under another resource is left alone.
            assert_eq!(t.to_storage(b"/registry/secretsx/a", b"x".to_vec()).unwrap(), b"x");
        }
    }

    #[test]
    fn old_keys_read_until_dropped() {
        let mut config = EncryptionConfiguration::new(Cipher::Aescbc);
        let old = Transformer::new(&config).unwrap().to_storage(SECRET, b"v1".to_vec()).unwrap();
        config.prepend_new_key();
        let t = Transformer::new(&config).unwrap();
        assert_eq!(&*t.from_storage(SECRET, &old).unwrap(), b"v1");
        assert!(!t.is_current(SECRET, &old));
        let new = t.to_storage(SECRET, b"v2".to_vec()).unwrap();
        config.drop_old_keys();
        let t = Transformer::new(&config).unwrap();
        assert_eq!(&*t.from_storage(SECRET, &new).unwrap(), b"v2");
        let e = t.from_storage(SECRET, &old).unwrap_err().to_string();
        assert!(e.contains("identity transformer tried to read encrypted data"), "{e}");
        // Without identity, an unknown key says which one it was.
        config.resources[0].providers.truncate(1);
        let t = Transformer::new(&config).unwrap();
        let e = t.from_storage(SECRET, &old).unwrap_err().to_string();
        assert!(e.contains("k8s:enc:aescbc:v1:aescbc-key-"), "{e}");
    }

    #[test]
    fn bad_keys_are_refused() {
        let mut config = EncryptionConfiguration::new(Cipher::Aescbc);
        config.resources[0].providers[0].aescbc.as_mut().unwrap().keys[0].secret = "AAAA".into();
        assert!(Transformer::new(&config).err().unwrap().to_string().contains("16, 24 or 32 bytes"));
        config.resources[0].providers[0].aescbc.as_mut().unwrap().keys[0].secret = "!!".into();
        assert!(Transformer::new(&config).err().unwrap().to_string().contains("not base64"));
        let mut config = EncryptionConfiguration::new(Cipher::Aescbc);
        config.resources[0].resources = vec!["*.*".into()];
        assert!(Transformer::new(&config).err().unwrap().to_string().contains("wildcards"));
        config.resources[0].resources = vec!["deployments.apps".into()];
        assert_eq!(Transformer::new(&config).unwrap().prefixes(), vec!["/registry/apps/deployments/"]);
    }
}
