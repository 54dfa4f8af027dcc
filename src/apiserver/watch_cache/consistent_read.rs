//! Reads that must not be older than a revision: upstream's consistent
//! list from the cache (the store's current revision is read cheaply and
//! the cache waited for until it has reached it) and `resourceVersion=N`
//! (NotOlderThan), which waits a few seconds and then answers 504.

use std::time::Duration;

use super::cacher::Cacher;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::sync::LockExt;

/// How long a consistent read waits for the cache before it reads the
/// store instead.
pub const CONSISTENT_READ_WAIT: Duration = Duration::from_secs(1);
/// How long a read at `resourceVersion=N` waits for the cache to reach N
/// (upstream's blockTimeout).
pub const NOT_OLDER_THAN_WAIT: Duration = Duration::from_secs(3);
/// How long a first use waits for the cache's first list.
const READY_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting read asks the store watch how far it is.
const ASK_EVERY: Duration = Duration::from_millis(50);

impl Cacher {
    /// The cache's revision once it has listed.
    pub async fn ready(&self) -> ApiResult<i64> {
        let mut rx = self.rev.subscribe();
        let reached = tokio::time::timeout(READY_WAIT, rx.wait_for(|r| *r > 0)).await.map(|r| r.map(|rev| *rev));
        match reached {
            Ok(Ok(rev)) => Ok(rev),
            _ => Err(ApiError::service_unavailable(format!(
                "the watch cache of {} is not initialized yet",
                self.shape.prefix
            ))),
        }
    }

    /// Waits until the cache has reached `target`, asking the store watch
    /// for progress so that a resource nobody writes to gets there too.
    /// Err(revision reached) after `bound`.
    pub async fn wait_until(&self, target: i64, bound: Duration) -> Result<i64, i64> {
        let mut rx = self.rev.subscribe();
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let now = *rx.borrow_and_update();
            if now >= target && now > 0 {
                return Ok(now);
            }
            self.ask_progress();
            let step = (tokio::time::Instant::now() + ASK_EVERY).min(deadline);
            tokio::select! {
                _ = tokio::time::sleep_until(step) => {}
                changed = rx.changed() => if changed.is_err() { return Err(now) },
            }
            if tokio::time::Instant::now() >= deadline {
                let now = *rx.borrow();
                return if now >= target && now > 0 { Ok(now) } else { Err(now) };
            }
        }
    }

    /// A consistent read: Some(revision) once the cache has everything the
    /// store had when the read began; None when it does not get there in
    /// time, or cannot know it (the store's progress cannot be asked), and
    /// the caller reads the store.
    pub async fn wait_fresh(&self) -> ApiResult<Option<i64>> {
        self.ready().await?;
        if !self.can_ask_progress() {
            return Ok(None);
        }
        let target = self.storage.current_revision(&self.shape.prefix).await?;
        Ok(self.wait_until(target, CONSISTENT_READ_WAIT).await.ok())
    }

    /// A read at resourceVersion `rv` (NotOlderThan): Some(revision) once
    /// the cache has reached it; upstream's "Too large resource version"
    /// 504 with Retry-After when it does not in time. When the store's
    /// progress cannot be asked, a cache behind `rv` (on a quiet prefix it
    /// may never get there) answers None at once: the store serves.
    pub async fn wait_not_older_than(&self, rv: i64) -> ApiResult<Option<i64>> {
        let now = self.ready().await?;
        if !self.can_ask_progress() {
            let now = now.max(*self.rev.borrow());
            return Ok((now >= rv).then_some(now));
        }
        self.wait_until(rv, NOT_OLDER_THAN_WAIT).await.map(Some).map_err(|current| too_large(rv, current))
    }

    fn can_ask_progress(&self) -> bool {
        self.asks.locked().is_some()
    }
}

/// Upstream's `NewTooLargeResourceVersionError`.
pub fn too_large(rv: i64, current: i64) -> ApiError {
    let mut e = ApiError::timeout(format!("Too large resource version: {rv}, current: {current}"));
    e.causes.push(crate::apiserver::status::Cause {
        reason: "ResourceVersionTooLarge",
        message: "Too large resource version".into(),
        field: String::new(),
    });
    e.retry_after = Some(1);
    e
}
