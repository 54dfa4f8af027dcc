//! Following every object under a prefix from inside the API server (the
//! CRDs it serves, the APIServices it proxies to): one read of them all,
//! then their changes from that revision; when the watch ends (a
//! compaction, a store that went away) a fresh read starts over, and the
//! follower hears the whole set again.

use std::pin::Pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};

use super::watch::{Change, Decoding};
use super::{ReadAt, Storage, Stored};
use crate::apiserver::status::ApiResult;

/// What a follower hears.
pub enum Followed {
    /// Every object under the prefix (first, and after a restart).
    Listed(Vec<Stored>),
    /// An object created or changed.
    Put(Stored),
    Deleted(Stored),
}

type Changes = Pin<Box<dyn Stream<Item = ApiResult<Change>> + Send>>;

pub struct Follower {
    storage: Storage,
    prefix: &'static str,
    changes: Option<Changes>,
}

impl Follower {
    pub fn new(storage: Storage, prefix: &'static str) -> Follower {
        Follower { storage, prefix, changes: None }
    }

    /// The first read, whose error is the caller's (a server that cannot
    /// read its CRDs does not start).
    pub async fn list(&mut self) -> ApiResult<Vec<Stored>> {
        let page = self.storage.list(self.prefix, None, 0, ReadAt::Latest).await?;
        let changes =
            self.storage.watch(self.prefix, false, page.rev, Duration::from_secs(3600), Decoding::NEW).await?;
        self.changes = Some(Box::pin(changes));
        Ok(page.items)
    }

    /// The next event; read and watch errors are retried here.
    pub async fn next(&mut self) -> Followed {
        loop {
            let Some(changes) = self.changes.as_mut() else {
                match self.list().await {
                    Ok(items) => return Followed::Listed(items),
                    Err(e) => {
                        tracing::warn!(prefix = self.prefix, error = %e, "cannot read and watch; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
            };
            match changes.next().await {
                Some(Ok(Change::Added(s))) | Some(Ok(Change::Modified { new: s, .. })) => return Followed::Put(s),
                Some(Ok(Change::Deleted(s))) => return Followed::Deleted(s),
                Some(Ok(Change::Progress(_))) => {}
                Some(Err(e)) => {
                    tracing::warn!(prefix = self.prefix, error = %e, "watch ended; reading again");
                    self.changes = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => {
                    self.changes = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}
