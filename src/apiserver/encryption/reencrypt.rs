//! Rewriting what is stored with the key that writes now: after a key
//! rotation, and at start when encryption was turned on or off. Each
//! value is opened and sealed again in a compare-and-swap on its
//! revision, so a concurrent write is never overwritten: when one wins,
//! its value is looked at again (it was sealed with the new key, or it is
//! rewritten in turn).

use std::sync::Arc;

use super::config::ConfigError;
use super::{Encryption, Stage, TransformError};
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

/// `rotate-keys`: a new key put first and in force, every value rewritten
/// with it, then the old keys dropped. A failure midway leaves both keys
/// configured, so everything stays readable, and the stage says so.
pub async fn rotate_keys(store: &Arc<dyn Store>, enc: &Encryption) -> Result<Rotation, ReencryptError> {
    let Ok(_only) = enc.rotation.try_lock() else { return Err(ReencryptError::Busy) };
    let mut config = match enc.config() {
        Some(c) if c.enabled() => c,
        _ => return Err(ReencryptError::Disabled),
    };
    let key = config.prepend_new_key().ok_or(ReencryptError::Disabled)?;
    enc.install(config.clone()).await?;
    tracing::info!(key = %key, "secrets encryption: new key in force, re-encrypting");
    enc.set_stage(Stage::ReencryptActive);
    let counts = match reencrypt_all(store, enc).await {
        Ok(c) => c,
        Err(e) => {
            enc.set_stage(Stage::ReencryptFailed);
            return Err(e);
        }
    };
    config.drop_old_keys();
    if let Err(e) = enc.install(config).await {
        enc.set_stage(Stage::ReencryptFailed);
        return Err(e.into());
    }
    enc.set_stage(Stage::ReencryptFinished);
    tracing::info!(key = %key, seen = counts.seen, rewritten = counts.rewritten, "secrets encryption: keys rotated");
    Ok(Rotation { key, counts })
}

/// At start: values written before encryption was turned on (or off, or
/// with a key since rotated away from) are rewritten in the background.
pub async fn reencrypt_at_start(store: Arc<dyn Store>, enc: Arc<Encryption>) {
    if enc.config().is_none() {
        return;
    }
    let Ok(_only) = enc.rotation.try_lock() else { return };
    match reencrypt_all(&store, &enc).await {
        Ok(c) if c.rewritten > 0 => {
            enc.set_stage(Stage::ReencryptFinished);
            tracing::info!(
                seen = c.seen,
                rewritten = c.rewritten,
                "secrets encryption: stored values rewritten with the current key"
            );
        }
        Ok(_) => {}
        Err(e) => {
            enc.set_stage(Stage::ReencryptFailed);
            tracing::error!(error = %e, "secrets encryption: cannot re-encrypt stored values");
        }
    }
}
