//! Rewriting what is stored with the key that writes now: after a key
//! rotation, and at start when encryption was turned on or off. Each
//! value is opened and sealed again in a compare-and-swap on its
//! revision, so a concurrent write is never overwritten: when one wins,
//! its value is looked at again (it was sealed with the new key, or it is
//! rewritten in turn).

use std::sync::Arc;

use super::cluster::SharedError;
use super::config::{Cipher, ConfigError, EncryptionConfiguration};
use super::{Encryption, RotationState, Stage, TransformError};
use crate::store::proto::*;
use crate::store::{prefix_end, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ReencryptError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("cannot re-encrypt {key}: {source}")]
    Transform { key: String, source: TransformError },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Shared(#[from] SharedError),
    #[error("server {0} is rotating the keys; try again when it ends")]
    RotatingElsewhere(String),
    #[error("secrets encryption is disabled: run `ferrok secrets-encrypt enable` and restart the server first")]
    Disabled,
    #[error("the rotation stopped: {0}")]
    Aborted(String),
    #[error("a re-encryption is already running (a rotation, or the pass at start); try again when it ends")]
    Busy,
}

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Values looked at.
    pub seen: u64,
    /// Values rewritten.
    pub rewritten: u64,
}

const PAGE: i64 = 500;

/// Rewrites every value of the transformed resources that is not in the
/// form a write gives it now.
pub async fn reencrypt_all(store: &Arc<dyn Store>, enc: &Encryption) -> Result<Counts, ReencryptError> {
    let mut counts = Counts::default();
    for prefix in enc.prefixes() {
        let end = prefix_end(prefix.as_bytes());
        let mut start = prefix.as_bytes().to_vec();
        loop {
            let req = RangeRequest { key: start.clone(), range_end: end.clone(), limit: PAGE, ..Default::default() };
            let page = store.range(req).await?;
            for kv in &page.kvs {
                counts.seen += 1;
                if rewrite(store, enc, kv.clone()).await? {
                    counts.rewritten += 1;
                }
            }
            match (page.more, page.kvs.last()) {
                (true, Some(last)) => {
                    start = last.key.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
    }
    Ok(counts)
}

/// Rewrites one value unless it is current; whether it wrote.
async fn rewrite(store: &Arc<dyn Store>, enc: &Encryption, mut kv: KeyValue) -> Result<bool, ReencryptError> {
    let name = |key: &[u8]| String::from_utf8_lossy(key).into_owned();
    loop {
        if enc.is_current(&kv.key, &kv.value) {
            return Ok(false);
        }
        let plain =
            enc.open(&kv.key, &kv.value).map_err(|source| ReencryptError::Transform { key: name(&kv.key), source })?;
        let (sealed, _held) = enc
            .seal(&kv.key, plain.into_owned())
            .await
            .map_err(|source| ReencryptError::Transform { key: name(&kv.key), source })?;
        let req = TxnRequest {
            compare: vec![Compare::mod_revision_is(&kv.key, kv.mod_revision)],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: kv.key.clone(),
                    value: sealed,
                    lease: kv.lease,
                    ..Default::default()
                })),
            }],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: kv.key.clone(),
                    ..Default::default()
                })),
            }],
        };
        let resp = store.txn(req).await?;
        if resp.succeeded {
            return Ok(true);
        }
        // Someone wrote (or deleted) it meanwhile: look again.
        let now = resp.responses.into_iter().find_map(|op| match op.response {
            Some(response_op::Response::ResponseRange(r)) => r.kvs.into_iter().next(),
            _ => None,
        });
        match now {
            Some(newer) => kv = newer,
            None => return Ok(false),
        }
    }
}

/// What `rotate-keys` did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Rotation {
    /// The key that writes now.
    pub key: String,
    pub counts: Counts,
}

/// `rotate-keys`, in k3s' stages, each persisted before the next begins
/// (and, on a shared datastore, loaded by every live server first):
/// `prepare` adds a new key that every server reads, `rotate` makes it the
/// one that writes, `reencrypt_active` rewrites every value with it,
/// `reencrypt_finished` drops the old keys. A rotation found under way
/// (this server restarted midway, or an earlier run failed) is finished
/// instead of a new one begun.
pub async fn rotate_keys(store: &Arc<dyn Store>, enc: &Encryption) -> Result<Rotation, ReencryptError> {
    let Ok(_only) = enc.rotation.try_lock() else { return Err(ReencryptError::Busy) };
    enc.refresh().await?;
    let state = enc.state();
    if state.stage.in_progress() {
        check_owner(enc, &state).await?;
        return finish_rotation(store, enc).await;
    }
    let mut config = match enc.config() {
        Some(c) if c.enabled() => c,
        _ => return Err(ReencryptError::Disabled),
    };
    let key = config.add_reading_key().ok_or(ReencryptError::Disabled)?;
    let owner = Some(enc.server_name()).filter(|s| !s.is_empty());
    let next = RotationState { stage: Stage::Prepare, new_key: Some(key.clone()), owner, ..state };
    enc.publish(config, next).await?;
    tracing::info!(key = %key, "secrets encryption: prepare: every server reads the new key");
    finish_rotation(store, enc).await
}

/// A rotation under way belongs to the server that began it while that
/// server lives.
async fn check_owner(enc: &Encryption, state: &RotationState) -> Result<(), ReencryptError> {
    if let (Some(owner), Some(shared)) = (&state.owner, enc.shared()) {
        if shared.is_other_live_server(owner).await? {
            return Err(ReencryptError::RotatingElsewhere(owner.clone()));
        }
    }
    Ok(())
}

/// The rotation from its persisted stage to the end.
async fn finish_rotation(store: &Arc<dyn Store>, enc: &Encryption) -> Result<Rotation, ReencryptError> {
    let mut state = enc.state();
    let key = state.new_key.clone().ok_or_else(|| ReencryptError::Aborted("no new key is recorded".into()))?;
    let mut config = enc.config().ok_or(ReencryptError::Disabled)?;
    state.owner = Some(enc.server_name()).filter(|s| !s.is_empty());
    if !config.promote_key(&key) {
        return Err(ReencryptError::Aborted(format!("the new key {key} is not in the configuration")));
    }
    if matches!(state.stage, Stage::Prepare | Stage::Rotate) {
        state.stage = Stage::Rotate;
        enc.publish(config.clone(), state.clone()).await?;
        tracing::info!(key = %key, "secrets encryption: rotate: every server writes with the new key");
        state.stage = Stage::ReencryptActive;
        enc.publish(config.clone(), state.clone()).await?;
    }
    let counts = reencrypt_all(store, enc).await?;
    let before = config.key_names();
    config.drop_old_keys();
    let after = config.key_names();
    let mut retired = state.retired_keys.clone();
    for k in before {
        if !after.contains(&k) && !retired.contains(&k) {
            retired.push(k);
        }
    }
    let done = RotationState { stage: Stage::ReencryptFinished, new_key: None, owner: None, retired_keys: retired };
    enc.publish(config, done).await?;
    tracing::info!(key = %key, seen = counts.seen, rewritten = counts.rewritten, "secrets encryption: keys rotated");
    Ok(Rotation { key, counts })
}

/// What `enable` or `disable` did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Toggle {
    /// Whether the configuration changed (false: it already was so).
    pub changed: bool,
    pub counts: Counts,
}

/// `enable` (`Some(cipher)`: a new key of it when there is none) or
/// `disable` while the server runs: the configuration in force on every
/// server first, then every stored value rewritten the new way.
pub async fn set_enabled(
    store: &Arc<dyn Store>,
    enc: &Encryption,
    enable: Option<Cipher>,
) -> Result<Toggle, ReencryptError> {
    let Ok(_only) = enc.rotation.try_lock() else { return Err(ReencryptError::Busy) };
    enc.refresh().await?;
    let state = enc.state();
    if state.stage.in_progress() {
        return Err(ReencryptError::Aborted(format!(
            "a key rotation is under way (stage {}): run rotate-keys to finish it first",
            state.stage.as_str()
        )));
    }
    let (config, changed) = match (enc.config(), enable) {
        (None, None) => return Ok(Toggle { changed: false, counts: Counts::default() }),
        (None, Some(cipher)) => (EncryptionConfiguration::new(cipher), true),
        (Some(mut c), Some(cipher)) => {
            let changed = c.enable(cipher);
            (c, changed)
        }
        (Some(mut c), None) => {
            let changed = c.disable();
            (c, changed)
        }
    };
    if changed {
        let active = RotationState { stage: Stage::ReencryptActive, new_key: None, owner: None, ..state.clone() };
        enc.publish(config.clone(), active).await?;
    }
    let counts = reencrypt_all(store, enc).await?;
    if changed {
        enc.publish(config, RotationState { stage: Stage::ReencryptFinished, ..state }).await?;
    }
    tracing::info!(
        enabled = enable.is_some(),
        changed,
        rewritten = counts.rewritten,
        "secrets encryption: turned on or off"
    );
    Ok(Toggle { changed, counts })
}

/// At start: a rotation this server left midway is finished; values
/// written before encryption was turned on (or off, or with a key since
/// rotated away from) are rewritten in the background.
pub async fn reencrypt_at_start(store: Arc<dyn Store>, enc: Arc<Encryption>) {
    if enc.config().is_none() {
        return;
    }
    let Ok(_only) = enc.rotation.try_lock() else { return };
    let state = enc.state();
    if state.stage.in_progress() {
        if let Err(e) = check_owner(&enc, &state).await {
            tracing::info!(reason = %e, "secrets encryption: not resuming the rotation under way");
            return;
        }
        tracing::info!(stage = state.stage.as_str(), "secrets encryption: resuming the key rotation left midway");
        match finish_rotation(&store, &enc).await {
            Ok(r) => {
                tracing::info!(key = %r.key, rewritten = r.counts.rewritten, "secrets encryption: the rotation finished")
            }
            Err(e) => {
                tracing::error!(error = %e, "secrets encryption: cannot finish the rotation; run `ferrok secrets-encrypt rotate-keys` to retry")
            }
        }
        return;
    }
    let alone = enc.shared().is_none();
    match reencrypt_all(&store, &enc).await {
        Ok(c) if c.rewritten > 0 => {
            if alone {
                enc.set_stage(Stage::ReencryptFinished);
            }
            tracing::info!(
                seen = c.seen,
                rewritten = c.rewritten,
                "secrets encryption: stored values rewritten with the current key"
            );
        }
        Ok(_) => {}
        Err(e) => {
            if alone {
                enc.set_stage(Stage::ReencryptFailed);
            }
            tracing::error!(error = %e, "secrets encryption: cannot re-encrypt stored values");
        }
    }
}
