//! The PKI every server of one cluster shares (k3s' "bootstrap data"), so
//! that each issues and accepts the same credentials: the server and
//! client CAs with their keys, the service-account signing key, the join
//! token. The first server on an external datastore seals it with a
//! key derived from the join token's secret (PBKDF2-HMAC-SHA256, then
//! AES-256-GCM) and stores it under a key named from a hash of that secret;
//! the next servers, given the same token, open it and install the files in
//! their own TLS folder before issuing their own serving certificates.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{certs, read, write, CertError, PkiError};

/// Where bootstrap data lives in the datastore (one key per token).
pub const BOOTSTRAP_PREFIX: &str = "/bootstrap/";

/// The files of `<data-dir>/server/tls` every server shares, and their modes.
pub const SHARED_FILES: [(&str, u32); 7] = [
    ("server-ca.crt", 0o644),
    ("server-ca.key", 0o600),
    ("client-ca.crt", 0o644),
    ("client-ca.key", 0o600),
    ("request-header-ca.crt", 0o644),
    ("request-header-ca.key", 0o600),
    ("service.key", 0o600),
];

const FORMAT: &str = "ferrok-bootstrap-v1";
const PBKDF2_ITERATIONS: u32 = 100_000;
const SALT_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("bootstrap data already exists and is encrypted with a different token")]
    WrongToken,
    #[error("the bootstrap data in the datastore is damaged: {0}")]
    Damaged(String),
    #[error(
        "{} differs from the cluster's bootstrap data in the datastore: remove it to join this cluster, or use the datastore and token it was made with",
        .0.display()
    )]
    Conflict(PathBuf),
    #[error("the token names a server CA (hash {given}) that is not the cluster's ({cluster})")]
    CaHashMismatch { given: String, cluster: String },
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("cannot make the cluster's certificate authorities: {0}")]
    Cert(#[from] CertError),
}

/// The shared files (name → PEM) and the cluster's join token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapData {
    pub files: BTreeMap<String, String>,
    pub token: String,
    /// The servers' shared secrets-encryption configuration and rotation
    /// stage (JSON, opaque here; see `apiserver::encryption::cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
}

/// The secret part of a join token: the password of a full
/// `K10<ca hash>::<user>:<password>` token, or the token as given.
pub fn token_secret(token: &str) -> &str {
    match full_token_parts(token) {
        Some((_, password)) => password,
        None => token,
    }
}

/// `(ca hash, password)` of a full `K10<sha256 hex>::<user>:<password>` token.
fn full_token_parts(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix("K10")?;
    let (hash, creds) = rest.split_once("::")?;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (_, password) = creds.split_once(':')?;
    (!password.is_empty()).then_some((hash, password))
}

/// The datastore key of the bootstrap data for `token`: named from a hash
/// of its secret, never the secret itself.
pub fn storage_key(token: &str) -> String {
    let digest = Sha256::digest(token_secret(token).as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{BOOTSTRAP_PREFIX}{hex}")
}

fn aead_key(token: &str, salt: &[u8]) -> Result<LessSafeKey, BootstrapError> {
    let mut key = [0u8; 32];
    let iterations = NonZeroU32::new(PBKDF2_ITERATIONS).unwrap_or(NonZeroU32::MIN);
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, iterations, salt, token_secret(token).as_bytes(), &mut key);
    let unbound = UnboundKey::new(&AES_256_GCM, &key).map_err(|_| BootstrapError::Damaged("bad key length".into()))?;
    Ok(LessSafeKey::new(unbound))
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl BootstrapData {
    /// The shared files of `dir`, those missing made anew (new CAs, a new
    /// service-account key); the token is left empty.
    pub fn from_dir_or_generate(dir: &Path) -> Result<BootstrapData, BootstrapError> {
        let mut files = BTreeMap::new();
        for (cert, key, cn) in [
            ("server-ca.crt", "server-ca.key", "ferrok-server-ca"),
            ("client-ca.crt", "client-ca.key", "ferrok-client-ca"),
            ("request-header-ca.crt", "request-header-ca.key", "ferrok-request-header-ca"),
        ] {
            let (cert_pem, key_pem) = match (read(&dir.join(cert))?, read(&dir.join(key))?) {
                (Some(c), Some(k)) => (c, k),
                _ => {
                    let ca = certs::Ca::generate(cn)?;
                    (ca.cert_pem, ca.key_pem)
                }
            };
            files.insert(cert.to_string(), cert_pem);
            files.insert(key.to_string(), key_pem);
        }
        let sa = match read(&dir.join("service.key"))? {
            Some(k) => k,
            None => certs::new_key()?,
        };
        files.insert("service.key".to_string(), sa);
        Ok(BootstrapData { files, token: String::new(), encryption: None })
    }

    /// A new join token naming this data's server CA.
    pub fn new_token(&self) -> String {
        super::new_token(self.files.get("server-ca.crt").map(String::as_str).unwrap_or_default())
    }

    /// A full token must name this cluster's server CA bundle, or one it
    /// grew from by a CA rotation (see [`super::ca_bundle`]).
    pub fn check_token(&self, token: &str) -> Result<(), BootstrapError> {
        let Some((given, _)) = full_token_parts(token) else { return Ok(()) };
        let bundle = self.files.get("server-ca.crt").map(String::as_str).unwrap_or_default();
        if super::ca_bundle::suffix_with_hash(bundle, given).is_none() {
            return Err(BootstrapError::CaHashMismatch {
                given: given.to_string(),
                cluster: certs::ca_hash(bundle.as_bytes()),
            });
        }
        Ok(())
    }

    /// The data encrypted with a key derived from `token`'s secret:
    /// `ferrok-bootstrap-v1:<salt>:<nonce and ciphertext>`, base64.
    pub fn seal(&self, token: &str) -> Result<Vec<u8>, BootstrapError> {
        let mut plain = serde_json::to_vec(self).map_err(|e| BootstrapError::Damaged(e.to_string()))?;
        let mut salt = [0u8; SALT_LEN];
        crate::host::random::fill(&mut salt);
        let mut nonce = [0u8; NONCE_LEN];
        crate::host::random::fill(&mut nonce);
        aead_key(token, &salt)?
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(FORMAT.as_bytes()), &mut plain)
            .map_err(|_| BootstrapError::Damaged("cannot encrypt".into()))?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&plain);
        Ok(format!("{FORMAT}:{}:{}", b64().encode(salt), b64().encode(sealed)).into_bytes())
    }

    /// Opens what `seal` made; a different token fails with `WrongToken`.
    pub fn open(token: &str, sealed: &[u8]) -> Result<BootstrapData, BootstrapError> {
        let damaged = |what: &str| BootstrapError::Damaged(what.to_string());
        let text = std::str::from_utf8(sealed).map_err(|_| damaged("not text"))?;
        let mut parts = text.splitn(3, ':');
        if parts.next() != Some(FORMAT) {
            return Err(damaged("unknown format"));
        }
        let salt = b64().decode(parts.next().unwrap_or_default()).map_err(|_| damaged("bad salt"))?;
        let mut body = b64().decode(parts.next().unwrap_or_default()).map_err(|_| damaged("bad body"))?;
        if body.len() < NONCE_LEN {
            return Err(damaged("too short"));
        }
        let mut ciphertext = body.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&body).map_err(|_| damaged("bad nonce"))?;
        let plain = aead_key(token, &salt)?
            .open_in_place(nonce, Aad::from(FORMAT.as_bytes()), &mut ciphertext)
            .map_err(|_| BootstrapError::WrongToken)?;
        serde_json::from_slice(plain).map_err(|e| BootstrapError::Damaged(e.to_string()))
    }

    /// Writes the shared files into `dir`. A file already there must be
    /// equal to the cluster's, or be a CA (and its key) that the cluster's
    /// rotated from (the cluster's CA file holds the local CA); when one
    /// differs otherwise, nothing is written.
    pub fn install(&self, dir: &Path) -> Result<(), BootstrapError> {
        let rotated = self.rotated_from(dir)?;
        let mut missing = Vec::new();
        for (name, mode) in SHARED_FILES {
            let contents = match self.files.get(name) {
                Some(c) => c,
                // Data written before the request-header CA existed: each
                // server makes its own (extension-apiserver-authentication
                // lists them all).
                None if name.starts_with("request-header-ca.") => continue,
                None => return Err(BootstrapError::Damaged(format!("{name} is missing"))),
            };
            let path = dir.join(name);
            match read(&path)? {
                Some(local) if local == *contents => {}
                Some(_) if rotated.iter().any(|base| name.starts_with(base.as_str())) => {
                    tracing::info!(path = %path.display(), "taking the cluster's rotated certificate authority");
                    missing.push((path, contents, mode));
                }
                Some(_) => return Err(BootstrapError::Conflict(path)),
                None => missing.push((path, contents, mode)),
            }
        }
        for (path, contents, mode) in missing {
            write(&path, contents, mode)?;
        }
        Ok(())
    }
}

impl BootstrapData {
    /// The CAs (by base name) whose local file in `dir` differs from the
    /// cluster's but whose CA the cluster's file still holds: the cluster
    /// rotated them, and this server has not taken the new ones yet.
    fn rotated_from(&self, dir: &Path) -> Result<Vec<String>, BootstrapError> {
        let mut rotated = Vec::new();
        for (base, _) in super::ca_rotation::ROTATED_CAS {
            let name = format!("{base}.crt");
            let (Some(local), Some(cluster)) = (read(&dir.join(&name))?, self.files.get(&name)) else { continue };
            if local == *cluster {
                continue;
            }
            let own = super::ca_bundle::certificates(&local)?;
            if own.first().is_some_and(|ca| super::ca_bundle::certificates(cluster).is_ok_and(|all| all.contains(ca))) {
                rotated.push(base.to_string());
            }
        }
        Ok(rotated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_data_opens_with_its_token_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = BootstrapData::from_dir_or_generate(dir.path()).unwrap();
        data.token = data.new_token();
        let sealed = data.seal(&data.token).unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("PRIVATE KEY"));
        // The whole token and its secret alone derive the same key.
        assert_eq!(BootstrapData::open(&data.token, &sealed).unwrap(), data);
        assert_eq!(BootstrapData::open(token_secret(&data.token), &sealed).unwrap(), data);
        assert_eq!(storage_key(&data.token), storage_key(token_secret(&data.token)));
        assert!(matches!(BootstrapData::open("other", &sealed), Err(BootstrapError::WrongToken)));
        assert_ne!(storage_key("a"), storage_key("b"));
        assert!(!storage_key("sekrit").contains("sekrit"));
        data.check_token(&data.token).unwrap();
        let foreign = format!("K10{}::server:x", "0".repeat(64));
        assert!(matches!(data.check_token(&foreign), Err(BootstrapError::CaHashMismatch { .. })));
        assert_eq!(token_secret("plain::token"), "plain::token");
    }

    #[test]
    fn install_refuses_different_local_files() {
        let src = tempfile::tempdir().unwrap();
        let data = BootstrapData::from_dir_or_generate(src.path()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        data.install(dir.path()).unwrap();
        data.install(dir.path()).unwrap();
        assert_eq!(BootstrapData::from_dir_or_generate(dir.path()).unwrap().files, data.files);
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("service.key"), "not the cluster's").unwrap();
        assert!(matches!(data.install(other.path()), Err(BootstrapError::Conflict(_))));
        assert!(!other.path().join("server-ca.crt").exists(), "nothing is written on a conflict");
    }

    #[test]
    fn a_rotated_ca_replaces_the_one_it_grew_from() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = BootstrapData::from_dir_or_generate(dir.path()).unwrap();
        data.token = data.new_token();
        data.install(dir.path()).unwrap();
        let old =
            crate::pki::Ca::load(data.files["server-ca.crt"].clone(), data.files["server-ca.key"].clone()).unwrap();
        let new = super::super::ca_rotation::generate(&old, "ferrok-server-ca").unwrap();
        let bundle = super::super::ca_rotation::plan("server-ca", &new, &old.cert_pem, false).unwrap();
        let mut rotated = data.clone();
        rotated.files.insert("server-ca.crt".into(), bundle.clone());
        rotated.files.insert("server-ca.key".into(), new.key_pem.clone());
        // The token made for the old bundle still names the cluster.
        rotated.check_token(&data.token).unwrap();
        rotated.install(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("server-ca.crt")).unwrap(), bundle);
        assert_eq!(std::fs::read_to_string(dir.path().join("server-ca.key")).unwrap(), new.key_pem);
        // A forced rotation (the old CA not kept) is a conflict for servers that hold the old one.
        let other = tempfile::tempdir().unwrap();
        data.install(other.path()).unwrap();
        let mut forced = data.clone();
        forced.files.insert("server-ca.crt".into(), new.cert_pem.clone());
        forced.files.insert("server-ca.key".into(), new.key_pem);
        assert!(matches!(forced.install(other.path()), Err(BootstrapError::Conflict(_))));
        assert!(forced.check_token(&data.token).is_err());
    }
}
