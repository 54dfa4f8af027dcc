//! Watches of the store: changes under a prefix after a revision, decoded
//! as the watcher asks (`Decoding`), with progress requests that become
//! bookmarks. The watch cache's reflector and the uncached watch path both
//! stand on it.

use futures_util::{Stream, StreamExt};

use super::{decode_with, header_rev, whole, Decoded, Parse, Storage, Stored};
use crate::apiserver::encryption::Encryption;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::store::prefix_end;
use crate::store::proto::*;

/// A change to an object seen by a watch.
#[derive(Debug, Clone)]
pub enum Change<T = serde_json::Value> {
    Added(Stored<T>),
    Modified {
        new: Stored<T>,
        /// The object before the change, decoded only for watches that
        /// asked for it (`Decoding::old`).
        old: Option<Stored<T>>,
    },
    Deleted(Stored<T>),
    /// Everything up to this revision has been sent.
    Progress(i64),
}

/// What a watch decodes of each change.
pub struct Decoding<T = serde_json::Value> {
    /// Whether `Change::Modified` carries the object as it was. Only a
    /// watch that filters (a selector an object may enter or leave) reads
    /// it; every other watcher would decode each old object for nothing.
    pub old: bool,
    pub parse: Parse<T>,
}

impl<T> Clone for Decoding<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Decoding<T> {}

impl Decoding {
    /// The new object, whole.
    pub const NEW: Decoding = Decoding { old: false, parse: whole };
    /// The new and the old object, whole.
    pub const NEW_AND_OLD: Decoding = Decoding { old: true, parse: whole };
}

impl<T> Decoding<T> {
    /// The new object as `parse` makes it.
    pub fn projected(parse: Parse<T>) -> Decoding<T> {
        Decoding { old: false, parse }
    }
}

impl Storage {
    /// Changes under `prefix` (or to exactly `key` when `exact`) after `after`.
    pub async fn watch<T: Decoded + Send + 'static>(
        &self,
        key: &str,
        exact: bool,
        after: i64,
        progress_every: std::time::Duration,
        decoding: Decoding<T>,
    ) -> ApiResult<impl Stream<Item = ApiResult<Change<T>>> + Send + 'static> {
        let (ask, asks) = tokio::sync::mpsc::channel(1);
        // Progress requests ask the store to confirm how far we are, which
        // becomes a BOOKMARK; the ticker sleeps, it does not poll data.
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(progress_every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if ask.send(()).await.is_err() {
                    return;
                }
            }
        });
        // When the caller drops the stream, the ticker stops.
        let guard = AbortOnDrop(ticker.abort_handle());
        let changes = self.watch_asking_progress(key, exact, after, asks, decoding).await?;
        Ok(changes.map(move |c| {
            let _held = &guard;
            c
        }))
    }

    /// Changes under `prefix` (or to exactly `key` when `exact`) after
    /// `after`; each `()` received on `asks` asks the store for a progress
    /// notification (a `Change::Progress` once everything before it is sent).
    /// A store that answers such requests out of order is not asked; it
    /// sends its own periodic (ordered) progress notifications instead.
    pub async fn watch_asking_progress<T: Decoded + Send + 'static>(
        &self,
        key: &str,
        exact: bool,
        after: i64,
        mut asks: tokio::sync::mpsc::Receiver<()>,
        decoding: Decoding<T>,
    ) -> ApiResult<impl Stream<Item = ApiResult<Change<T>>> + Send + 'static> {
        let ordered = self.progress_requests_ordered().await;
        let create = WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            range_end: if exact { Vec::new() } else { prefix_end(key.as_bytes()) },
            start_revision: after + 1,
            prev_kv: true,
            progress_notify: !ordered,
            ..Default::default()
        };
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let create = WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) };
        let _ = tx.send(create).await;
        let forward = tokio::spawn(async move {
            while asks.recv().await.is_some() {
                if !ordered {
                    continue;
                }
                let progress = WatchRequest {
                    request_union: Some(watch_request::RequestUnion::ProgressRequest(WatchProgressRequest {})),
                };
                if tx.send(progress).await.is_err() {
                    return;
                }
            }
        });
        let responses = self.store.watch(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))).await?;
        // When the caller drops the stream, the forwarder stops; its sender
        // goes with it, which ends the store's watch at once.
        let guard = AbortOnDrop(forward.abort_handle());
        let enc = self.encryption.clone();
        Ok(responses
            .then(move |resp| {
                let enc = enc.clone();
                async move {
                    let behind = match (&enc, &resp) {
                        (Some(e), Ok(r)) => e.behind(
                            r.events
                                .iter()
                                .flat_map(|ev| ev.kv.iter().chain(ev.prev_kv.iter()))
                                .map(|kv| (kv.key.as_slice(), kv.value.as_slice())),
                        ),
                        _ => false,
                    };
                    if let (true, Some(e)) = (behind, &enc) {
                        e.catch_up().await;
                    }
                    futures_util::stream::iter(changes(enc, resp, decoding))
                }
            })
            .flatten()
            .map(move |change| {
                let _held = &guard;
                change
            }))
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Changes<T> = Box<dyn Iterator<Item = ApiResult<Change<T>>> + Send>;

/// The changes of one store response, each decoded only when the reader
/// takes it: a response can carry hundreds of events (a watch catching
/// up), and decoding them all at once held every decoded object together.
fn changes<T: Decoded + Send + 'static>(
    enc: Option<std::sync::Arc<Encryption>>,
    resp: crate::store::Result<WatchResponse>,
    decoding: Decoding<T>,
) -> Changes<T> {
    let one = |c: ApiResult<Change<T>>| -> Changes<T> { Box::new(std::iter::once(c)) };
    let resp = match resp {
        Ok(r) => r,
        Err(e) => return one(Err(e.into())),
    };
    if resp.canceled {
        if resp.compact_revision > 0 {
            return one(Err(ApiError::gone(format!(
                "too old resource version: {} ({})",
                resp.compact_revision - 1,
                resp.compact_revision
            ))));
        }
        return one(Err(ApiError::internal(format!("watch canceled: {}", resp.cancel_reason))));
    }
    if resp.created {
        return Box::new(std::iter::empty());
    }
    if resp.events.is_empty() {
        return one(Ok(Change::Progress(header_rev(&resp.header))));
    }
    Box::new(resp.events.into_iter().map(move |ev| {
        let decode = |kv: &KeyValue| decode_with(enc.as_deref(), kv, decoding.parse);
        let kv = ev.kv.as_ref().ok_or_else(|| ApiError::internal("watch event without kv"))?;
        if ev.r#type == EventType::Delete as i32 {
            let prev = ev.prev_kv.as_ref().ok_or_else(|| ApiError::internal("delete event without prev_kv"))?;
            let mut gone = decode(prev)?;
            gone.object.set_resource_version(kv.mod_revision);
            gone.rev = kv.mod_revision;
            Ok(Change::Deleted(gone))
        } else if kv.create_revision == kv.mod_revision {
            Ok(Change::Added(decode(kv)?))
        } else {
            Ok(Change::Modified {
                new: decode(kv)?,
                old: if decoding.old { ev.prev_kv.as_ref().map(decode).transpose()? } else { None },
            })
        }
    }))
}
