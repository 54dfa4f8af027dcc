//! Objects in the store: JSON under `/registry/...` keys, whose
//! `resourceVersion` is the key's mod revision (never stored in the value).
//! Creates, updates and deletes are etcd transactions with the same compare
//! shapes as upstream's apiserver, so a stale write fails as a conflict.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use serde_json::Value;

use super::encryption::Encryption;
use super::metrics::{self, Operation};
use super::status::{ApiError, ApiResult};
use crate::store::proto::*;
use crate::store::{prefix_end, Store};

mod encoded;
mod follow;
pub mod lease_manager;
mod progress;
mod watch;

pub(crate) use encoded::Encoded;
pub use encoded::{assemble, Assembled};
pub use follow::{Followed, Follower};
pub use watch::{Change, Decoding};

/// An object as read from the store, its resourceVersion filled in.
#[derive(Debug, Clone)]
pub struct Stored<T = Value> {
    pub object: T,
    pub rev: i64,
}

/// What a write found when its precondition failed.
#[derive(Debug)]
pub enum WriteError {
    /// create: the key exists.
    Exists,
    /// update/delete: the key changed since `expected` (None: it is gone).
    Changed(Option<Stored>),
    Api(ApiError),
}

impl From<ApiError> for WriteError {
    fn from(e: ApiError) -> Self {
        WriteError::Api(e)
    }
}

#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn Store>,
    expiring: Option<Arc<Expiring>>,
    /// Values of some resources (Secrets) encrypted at rest.
    encryption: Option<Arc<Encryption>>,
    /// Whether the store answers progress requests in order.
    progress: Arc<progress::ProgressSupport>,
}

/// Objects under some prefixes expire: each write attaches a store lease
/// (upstream's TTLFunc of a resource, as Events have with `--event-ttl`).
struct Expiring {
    prefixes: Vec<String>,
    ttl_seconds: i64,
    leases: lease_manager::LeaseManager,
}

/// A page of a list.
pub struct Page<T = Value> {
    pub items: Vec<Stored<T>>,
    /// The revision the list was read at.
    pub rev: i64,
    /// Where the next page starts (a key), when there is one.
    pub next_key: Option<Vec<u8>>,
    /// Items after this page (before selectors), when known.
    pub remaining: Option<i64>,
}

/// How the list's resourceVersion constrains the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// The newest state.
    Latest,
    /// Exactly this revision (continue tokens, resourceVersionMatch=Exact).
    Exact(i64),
}

/// The object stored in `kv`, opened first when its resource is encrypted.
fn decode(enc: Option<&Encryption>, kv: &KeyValue) -> ApiResult<Stored> {
    decode_with(enc, kv, whole)
}

/// The object stored in `kv` as `parse` makes it.
fn decode_with<T: Decoded>(enc: Option<&Encryption>, kv: &KeyValue, parse: Parse<T>) -> ApiResult<Stored<T>> {
    let value = match enc {
        Some(enc) => enc.open(&kv.key, &kv.value).map_err(|e| {
            ApiError::internal(format!("unable to transform key {:?}: {e}", String::from_utf8_lossy(&kv.key)))
        })?,
        None => std::borrow::Cow::Borrowed(kv.value.as_slice()),
    };
    let mut object = parse(&value)
        .map_err(|e| ApiError::internal(format!("object at {} is not JSON: {e}", String::from_utf8_lossy(&kv.key))))?;
    object.set_resource_version(kv.mod_revision);
    Ok(Stored { object, rev: kv.mod_revision })
}

/// How stored bytes become the object a reader keeps: whole, a reader's
/// own small projection, parsed without building the rest (the Node
/// authorizer keeps a few references of each pod), or the bytes as they
/// are (the watch cache encodes them itself).
pub type Parse<T = Value> = fn(&[u8]) -> serde_json::Result<T>;

/// What a `Parse` makes, which the revision it was read at is set on.
pub trait Decoded: Sized {
    fn set_resource_version(&mut self, rev: i64);
}

impl Decoded for Value {
    fn set_resource_version(&mut self, rev: i64) {
        set_resource_version(self, rev)
    }
}

/// An object's stored JSON (opened, when its resource is encrypted), which
/// carries no resourceVersion: its reader takes `Stored::rev`.
#[derive(Debug, Clone)]
pub struct Raw(pub Vec<u8>);

impl Decoded for Raw {
    fn set_resource_version(&mut self, _: i64) {}
}

/// The whole object.
pub fn whole(bytes: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice(bytes)
}

/// The stored bytes, not parsed.
pub fn raw(bytes: &[u8]) -> serde_json::Result<Raw> {
    Ok(Raw(bytes.to_vec()))
}

pub fn set_resource_version(object: &mut Value, rev: i64) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
}

/// The stored form (`Encoded::of`'s bytes). The watch cache
/// (`watch_cache::splice`), the answer to a create or an update (`handlers::write::Written`)
/// and the binding (`handlers::assign_pod`) edit this encoding in place, and
/// take the decoding path for bytes that are not in it.
pub(crate) fn encode(object: &Value) -> ApiResult<Vec<u8>> {
    Encoded::of(object).map(|e| e.bytes)
}

fn put(key: &str, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn get_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

fn header_rev(h: &Option<ResponseHeader>) -> i64 {
    h.as_ref().map_or(0, |h| h.revision)
}

/// The object a failed txn's `range` branch read back, if any.
fn found(enc: Option<&Encryption>, resp: &TxnResponse) -> ApiResult<Option<Stored>> {
    for op in &resp.responses {
        if let Some(response_op::Response::ResponseRange(r)) = &op.response {
            return r.kvs.first().map(|kv| decode(enc, kv)).transpose();
        }
    }
    Ok(None)
}

impl Storage {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Storage { store, expiring: None, encryption: None, progress: Default::default() }
    }

    /// Whether a requested progress notification comes after every event
    /// before its revision (false for an etcd with the bug fixed in 3.4.31
    /// and 3.5.13): what a watch cache's consistent reads rely on.
    pub async fn progress_requests_ordered(&self) -> bool {
        self.progress.ordered(self.store.as_ref()).await
    }

    /// Values of the resources `encryption` names are sealed on every
    /// write and opened on every read.
    pub fn with_encryption(mut self, encryption: Option<Arc<Encryption>>) -> Self {
        self.encryption = encryption;
        self
    }

    fn enc(&self) -> Option<&Encryption> {
        self.encryption.as_deref()
    }

    /// Values sealed with a key another server brought in are opened
    /// after this server has loaded it.
    async fn catch_up(&self, kvs: &[KeyValue]) {
        if let Some(enc) = self.enc() {
            if enc.behind(kvs.iter().map(|kv| (kv.key.as_slice(), kv.value.as_slice()))) {
                enc.catch_up().await;
            }
        }
    }

    /// The stored form of an encoded object under `key`, sealed when its
    /// resource is encrypted, with the hold the write keeps until it has
    /// committed.
    async fn seal_encoded(&self, key: &str, plain: Vec<u8>) -> ApiResult<(Vec<u8>, super::encryption::WriteGuard)> {
        match &self.encryption {
            Some(enc) => enc
                .seal(key.as_bytes(), plain)
                .await
                .map_err(|e| ApiError::internal(format!("unable to transform key {key:?}: {e}"))),
            None => Ok((plain, None)),
        }
    }

    /// Objects written under `prefixes` expire `ttl` after their last write.
    pub fn with_ttl(mut self, prefixes: &[&str], ttl: std::time::Duration) -> Self {
        let ttl_seconds = ttl.as_secs() as i64;
        if ttl_seconds > 0 {
            self.expiring = Some(Arc::new(Expiring {
                prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
                ttl_seconds,
                leases: lease_manager::LeaseManager::new(self.store.clone()),
            }));
        }
        self
    }

    /// The lease a write of `key` carries (0: none).
    async fn lease_for(&self, key: &str) -> ApiResult<i64> {
        match &self.expiring {
            Some(e) if e.prefixes.iter().any(|p| key.starts_with(p.as_str())) => {
                Ok(e.leases.lease_for(e.ttl_seconds).await?)
            }
            _ => Ok(0),
        }
    }

    async fn timed_txn(
        &self,
        op: Operation,
        key: &str,
        req: TxnRequest,
    ) -> ApiResult<crate::store::proto::TxnResponse> {
        let started = Instant::now();
        let resp = self.store.txn(req).await;
        metrics::global().observe_storage(op, key, started.elapsed());
        resp.map_err(ApiError::from)
    }

    /// How many keys are under `prefix` now.
    pub async fn count(&self, prefix: &str) -> ApiResult<i64> {
        let req = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            count_only: true,
            ..Default::default()
        };
        Ok(self.store.range(req).await?.count)
    }

    /// The store itself, for what is not about objects (health, compaction).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub async fn get(&self, key: &str) -> ApiResult<Option<Stored>> {
        let started = Instant::now();
        let resp = self.store.range(RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() }).await;
        metrics::global().observe_storage(Operation::Get, key, started.elapsed());
        let resp = resp?;
        self.catch_up(&resp.kvs).await;
        resp.kvs.first().map(|kv| decode(self.enc(), kv)).transpose()
    }

    /// Creates `key`; fails with `Exists` when it is there. Returns the
    /// revision it was written at (the object's resourceVersion), so that
    /// no copy of the object is made.
    pub async fn create(&self, key: &str, object: &Value) -> Result<i64, WriteError> {
        self.create_encoded(key, encode(object)?).await
    }

    /// `create` of an object already in the stored encoding (`encode`'s).
    pub async fn create_encoded(&self, key: &str, plain: Vec<u8>) -> Result<i64, WriteError> {
        let lease = self.lease_for(key).await?;
        let (value, _held) = self.seal_encoded(key, plain).await?;
        let req = TxnRequest {
            compare: vec![Compare::mod_revision_is(key.as_bytes(), 0)],
            success: vec![put(key, value, lease)],
            failure: vec![],
        };
        let resp = self.timed_txn(Operation::Create, key, req).await?;
        if !resp.succeeded {
            return Err(WriteError::Exists);
        }
        Ok(header_rev(&resp.header))
    }

    /// Replaces `key` if it is still at `expected`; returns the revision
    /// it was written at.
    pub async fn update(&self, key: &str, object: &Value, expected: i64) -> Result<i64, WriteError> {
        self.update_encoded(key, encode(object)?, expected).await
    }

    /// `update` of an object already in the stored encoding (`encode`'s).
    pub async fn update_encoded(&self, key: &str, plain: Vec<u8>, expected: i64) -> Result<i64, WriteError> {
        let lease = self.lease_for(key).await?;
        let (value, _held) = self.seal_encoded(key, plain).await?;
        let req = TxnRequest {
            compare: vec![Compare::mod_revision_is(key.as_bytes(), expected)],
            success: vec![put(key, value, lease)],
            failure: vec![get_op(key)],
        };
        let resp = self.timed_txn(Operation::Update, key, req).await?;
        if !resp.succeeded {
            return Err(WriteError::Changed(found(self.enc(), &resp)?));
        }
        Ok(header_rev(&resp.header))
    }

    /// Deletes `key` if it is still at `expected`; returns the delete revision.
    pub async fn delete(&self, key: &str, expected: i64) -> Result<i64, WriteError> {
        let req = TxnRequest {
            compare: vec![Compare::mod_revision_is(key.as_bytes(), expected)],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                    key: key.as_bytes().to_vec(),
                    range_end: Vec::new(),
                    prev_kv: false,
                })),
            }],
            failure: vec![get_op(key)],
        };
        let resp = self.timed_txn(Operation::Delete, key, req).await?;
        if !resp.succeeded {
            return Err(WriteError::Changed(found(self.enc(), &resp)?));
        }
        Ok(header_rev(&resp.header))
    }

    /// One page of the objects under `prefix`, starting at `start` (a key
    /// under the prefix) and read at `at`.
    pub async fn list(&self, prefix: &str, start: Option<Vec<u8>>, limit: i64, at: ReadAt) -> ApiResult<Page> {
        self.list_parsed(prefix, start, limit, at, whole).await
    }

    /// A page of objects as `parse` makes them.
    async fn list_parsed<T: Decoded>(
        &self,
        prefix: &str,
        start: Option<Vec<u8>>,
        limit: i64,
        at: ReadAt,
        parse: Parse<T>,
    ) -> ApiResult<Page<T>> {
        let key = start.unwrap_or_else(|| prefix.as_bytes().to_vec());
        let revision = match at {
            ReadAt::Latest => 0,
            ReadAt::Exact(rev) => rev,
        };
        let req = RangeRequest {
            key,
            range_end: prefix_end(prefix.as_bytes()),
            limit: limit.max(0),
            revision,
            ..Default::default()
        };
        let started = Instant::now();
        let resp = self.store.range(req).await;
        metrics::global().observe_storage(Operation::List, prefix, started.elapsed());
        let resp = resp.map_err(|e| match e {
            crate::store::StoreError::Compacted { .. } => {
                ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
            }
            other => ApiError::from(other),
        })?;
        let rev = if revision > 0 { revision } else { header_rev(&resp.header) };
        self.catch_up(&resp.kvs).await;
        let items = resp.kvs.iter().map(|kv| decode_with(self.enc(), kv, parse)).collect::<ApiResult<Vec<_>>>()?;
        let next_key = if resp.more {
            resp.kvs.last().map(|kv| {
                let mut k = kv.key.clone();
                k.push(0);
                k
            })
        } else {
            None
        };
        let remaining = resp.more.then(|| resp.count - items.len() as i64);
        Ok(Page { items, rev, next_key, remaining })
    }

    /// Every object under `prefix`, read in pages at one revision (so the
    /// result is a consistent snapshot), and that revision.
    pub async fn list_all(&self, prefix: &str) -> ApiResult<(Vec<Stored>, i64)> {
        self.list_all_parsed(prefix, whole).await
    }

    /// Every object under `prefix` as `parse` makes it, and the revision read at.
    pub async fn list_all_parsed<T: Decoded>(&self, prefix: &str, parse: Parse<T>) -> ApiResult<(Vec<Stored<T>>, i64)> {
        let mut out = Vec::new();
        let (mut start, mut at) = (None, ReadAt::Latest);
        loop {
            let page = self.list_parsed(prefix, start.take(), 1000, at, parse).await?;
            out.extend(page.items);
            match page.next_key {
                Some(k) => {
                    start = Some(k);
                    at = ReadAt::Exact(page.rev);
                }
                None => return Ok((out, page.rev)),
            }
        }
    }

    /// The store's current revision, read cheaply (a point read of a key
    /// that holds nothing, whose answer's header carries the revision).
    pub async fn current_revision(&self, prefix: &str) -> ApiResult<i64> {
        let req = RangeRequest { key: prefix.as_bytes().to_vec(), count_only: true, ..Default::default() };
        Ok(header_rev(&self.store.range(req).await?.header))
    }
}

/// Continue tokens, in upstream's shape: base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"<key after the prefix>"}`.
pub fn encode_continue(rev: i64, prefix: &str, next_key: &[u8]) -> String {
    let start = String::from_utf8_lossy(next_key.strip_prefix(prefix.as_bytes()).unwrap_or(next_key)).into_owned();
    let token = serde_json::json!({"v": "meta.k8s.io/v1", "rv": rev, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

pub fn decode_continue(token: &str, prefix: &str) -> ApiResult<(i64, Vec<u8>)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(Value::as_i64).filter(|r| *r > 0).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    if start.contains("..") || start.starts_with('/') {
        return Err(bad());
    }
    let mut key = prefix.as_bytes().to_vec();
    key.extend_from_slice(start.as_bytes());
    Ok((rev, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "/registry/pods/", b"/registry/pods/ns/b\0");
        let (rev, key) = decode_continue(&t, "/registry/pods/").unwrap();
        assert_eq!((rev, key), (42, b"/registry/pods/ns/b\0".to_vec()));
        assert!(decode_continue("garbage", "/registry/pods/").is_err());
    }

    #[test]
    fn the_stored_form_leaves_out_the_resource_version_only() {
        let obj = serde_json::json!({
            "kind": "ConfigMap",
            "metadata": {"name": "a", "resourceVersion": "7", "labels": {"resourceVersion": "x"}},
            "data": {"resourceVersion": "y"},
        });
        let stored: Value = serde_json::from_slice(&encode(&obj).unwrap()).unwrap();
        let mut want = obj.clone();
        want["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        assert_eq!(stored, want);
        assert_eq!(encode(&serde_json::json!([1])).unwrap(), b"[1]");
    }
}
