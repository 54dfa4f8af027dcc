//! The server's join token (`K10<server CA hash>::server:<secret>`), as
//! nodes present it, and its rotation (`ferrok token rotate`, k3s' `token
//! rotate`): `PUT /v1-ferrok/token` by an administrator sets a new secret,
//! written to `<data-dir>/server/token`; where servers share a datastore,
//! the cluster's sealed bootstrap data moves to the new token in the same
//! step. Nodes that already joined keep working: they rejoin with their own
//! client certificates, not with the token.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::pki::shared_pki::{storage_key, token_secret, BootstrapData, BootstrapError};
use crate::store::{kv, Store};
use crate::sync::RwLockExt;

/// The body of `PUT /v1-ferrok/token`, and of its answer (the whole new token).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRotation {
    pub token: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("{0}")]
    Invalid(String),
    #[error("the new token names another CA (sha256 {given}) than this cluster's (sha256 {cluster})")]
    OtherCa { given: String, cluster: String },
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    #[error("the cluster's bootstrap data: {0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("the datastore: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("the bootstrap data changed while the token was rotated: try again")]
    Raced,
}

pub struct ServerToken {
    current: RwLock<String>,
    /// `<data-dir>/server/token`.
    file: PathBuf,
    /// SHA-256 of the server CA bundle, as the token's `K10` prefix names it.
    ca_hash: String,
    /// The shared datastore whose bootstrap data is sealed with the token.
    shared: Option<Arc<dyn Store>>,
    /// One rotation at a time.
    rotating: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ServerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerToken").field("file", &self.file).finish_non_exhaustive()
    }
}

impl ServerToken {
    pub fn new(token: String, file: PathBuf, server_ca_bundle: &[u8], shared: Option<Arc<dyn Store>>) -> Arc<Self> {
        Arc::new(ServerToken {
            current: RwLock::new(token),
            file,
            ca_hash: crate::pki::ca_hash(server_ca_bundle),
            shared,
            rotating: tokio::sync::Mutex::new(()),
        })
    }

    pub fn current(&self) -> String {
        self.current.read_locked().clone()
    }

    /// Whether a bearer token is the join token, whole or its secret.
    pub fn matches(&self, bearer: &str) -> bool {
        let current = self.current.read_locked();
        let secret = token_secret(&current);
        !secret.is_empty() && (bearer == current.as_str() || bearer == secret)
    }

    /// The whole token for `given`: a full `K10…` token must name this
    /// cluster's CA; a bare secret gets the prefix and the `server` user.
    fn full(&self, given: &str) -> Result<String, RotateError> {
        let given = given.trim();
        if let Some(rest) = given.strip_prefix("K10") {
            let (hash, creds) = rest
                .split_once("::")
                .ok_or_else(|| RotateError::Invalid("a K10 token has the form K10<CA hash>::<user>:<secret>".into()))?;
            if !hash.eq_ignore_ascii_case(&self.ca_hash) {
                return Err(RotateError::OtherCa { given: hash.to_string(), cluster: self.ca_hash.clone() });
            }
            let (_, secret) = creds
                .split_once(':')
                .ok_or_else(|| RotateError::Invalid("a K10 token has the form K10<CA hash>::<user>:<secret>".into()))?;
            check_secret(secret)?;
            return Ok(format!("K10{}::{creds}", self.ca_hash));
        }
        check_secret(given)?;
        Ok(format!("K10{}::server:{given}", self.ca_hash))
    }

    /// Replaces the token with `new` (whole or its secret; a random one
    /// when empty) and returns the whole new token.
    pub async fn rotate(&self, new: &str) -> Result<String, RotateError> {
        let _one = self.rotating.lock().await;
        let old = self.current();
        let new = if new.trim().is_empty() { crate::pki::new_token_for_hash(&self.ca_hash) } else { self.full(new)? };
        if token_secret(&new) == token_secret(&old) {
            return Err(RotateError::Invalid("the new token is the current one".into()));
        }
        if let Some(store) = &self.shared {
            let from = storage_key(&old);
            let sealed = kv::get(store.as_ref(), from.as_bytes()).await?.ok_or(RotateError::Raced)?;
            let mut data = BootstrapData::open(&old, &sealed)?;
            data.token = new.clone();
            let resealed = data.seal(&new)?;
            if !kv::replace(store.as_ref(), from.as_bytes(), storage_key(&new).as_bytes(), resealed).await? {
                return Err(RotateError::Raced);
            }
        }
        crate::pki::write(&self.file, &format!("{new}\n"), 0o600)
            .map_err(|e| RotateError::Write { path: self.file.display().to_string(), message: e.to_string() })?;
        *self.current.write_locked() = new.clone();
        tracing::info!(file = %self.file.display(), "the server token was rotated");
        Ok(new)
    }
}

impl ServerToken {
    /// Rewrites the cluster's sealed bootstrap data with `change`, where
    /// servers share a datastore (nothing to do otherwise); one change at a
    /// time, token rotations included.
    pub async fn update_bootstrap(&self, change: impl FnOnce(&mut BootstrapData)) -> Result<(), RotateError> {
        let _one = self.rotating.lock().await;
        let Some(store) = &self.shared else { return Ok(()) };
        let token = self.current();
        let key = storage_key(&token);
        let sealed = kv::get(store.as_ref(), key.as_bytes()).await?.ok_or(RotateError::Raced)?;
        let mut data = BootstrapData::open(&token, &sealed)?;
        change(&mut data);
        let resealed = data.seal(&token)?;
        if !kv::replace(store.as_ref(), key.as_bytes(), key.as_bytes(), resealed).await? {
            return Err(RotateError::Raced);
        }
        Ok(())
    }

    /// Writes `token` (the same secret, naming a rotated CA) to the token
    /// file for the next start; this process keeps the one it has.
    pub fn record(&self, token: &str) -> Result<(), RotateError> {
        crate::pki::write(&self.file, &format!("{token}\n"), 0o600)
            .map_err(|e| RotateError::Write { path: self.file.display().to_string(), message: e.to_string() })
    }
}

/// A token's secret: printable, no whitespace or `:`, long enough to guess
/// at no better than a random one's odds.
fn check_secret(secret: &str) -> Result<(), RotateError> {
    if secret.len() < 16 {
        return Err(RotateError::Invalid("the token's secret must be at least 16 characters".into()));
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(RotateError::Invalid("the token's secret must be printable ASCII without spaces or ':'".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::shared_pki::BOOTSTRAP_PREFIX;

    fn token(dir: &std::path::Path, store: Option<Arc<dyn Store>>) -> Arc<ServerToken> {
        let ca = b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n";
        let hash = crate::pki::ca_hash(ca);
        ServerToken::new(format!("K10{hash}::server:0123456789abcdef0123"), dir.join("token"), ca, store)
    }

    #[tokio::test]
    async fn a_rotated_token_replaces_the_old_one_and_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let t = token(dir.path(), None);
        assert!(t.matches("0123456789abcdef0123"));
        let new = t.rotate("fedcba9876543210fedcba").await.unwrap();
        assert!(new.starts_with("K10") && new.ends_with("::server:fedcba9876543210fedcba"), "{new}");
        assert!(!t.matches("0123456789abcdef0123") && t.matches("fedcba9876543210fedcba") && t.matches(&new));
        assert_eq!(std::fs::read_to_string(dir.path().join("token")).unwrap().trim(), new);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.path().join("token")).unwrap().permissions().mode() & 0o777, 0o600);
        let generated = t.rotate("").await.unwrap();
        assert!(generated.contains("::server:") && generated != new);
    }

    #[tokio::test]
    async fn bad_tokens_are_refused_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = token(dir.path(), None);
        for bad in ["short", "has a space in the middle", "K10abc::server:0123456789abcdef0123", "0123456789abcdef0123"]
        {
            assert!(t.rotate(bad).await.is_err(), "{bad}");
        }
        assert!(t.matches("0123456789abcdef0123"));
        assert!(!dir.path().join("token").exists());
    }

    #[tokio::test]
    async fn shared_bootstrap_data_moves_to_the_new_token() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            crate::store::sqlite::SqliteStore::open(crate::store::sqlite::SqliteOptions::new(dir.path().join("s.db")))
                .unwrap();
        let tls = dir.path().join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        let mut data = BootstrapData::from_dir_or_generate(&tls).unwrap();
        let ca = data.files["server-ca.crt"].clone();
        data.token = format!("K10{}::server:0123456789abcdef0123", crate::pki::ca_hash(ca.as_bytes()));
        let old_key = storage_key(&data.token);
        kv::create_first_under(
            store.as_ref(),
            BOOTSTRAP_PREFIX.as_bytes(),
            old_key.as_bytes(),
            data.seal(&data.token).unwrap(),
        )
        .await
        .unwrap();
        let t = ServerToken::new(data.token.clone(), dir.path().join("token"), ca.as_bytes(), Some(store.clone()));
        let new = t.rotate("fedcba9876543210fedcba").await.unwrap();
        assert_eq!(kv::get(store.as_ref(), old_key.as_bytes()).await.unwrap(), None);
        let sealed = kv::get(store.as_ref(), storage_key(&new).as_bytes()).await.unwrap().unwrap();
        let opened = BootstrapData::open(&new, &sealed).unwrap();
        assert_eq!(opened.token, new);
        assert_eq!(opened.files, data.files);
    }
}
