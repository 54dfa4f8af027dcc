//! Waiting for an informer's cache to hold its first full list (client-go's
//! `WaitForCacheSync`), safe for many waiters at once.
//!
//! kube's `Store::wait_until_ready` waits on a one-shot channel that keeps
//! a single waker: when several tasks wait on the same cache (the
//! reconciles of several namespaces, or a readiness check polled with
//! `now_or_never`), only the last one to poll is woken when the list
//! completes, and the others wait for ever. Each waiter here polls again on
//! a short timer until the cache is ready; once it is, the answer is
//! remembered by the store and every later call returns at once.

use std::time::Duration;

use futures_util::FutureExt;
use kube::runtime::reflector::{store::WriterDropped, Store};
use kube::Resource;

/// How often a waiter looks again while the cache is still listing (only
/// during start-up; a synced cache answers at once).
const RECHECK: Duration = Duration::from_millis(50);

/// Returns once `store` has its first full list; Err when its informer
/// stopped before that.
pub async fn wait_for_cache_sync<K>(store: &Store<K>) -> Result<(), WriterDropped>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(done) = tokio::time::timeout(RECHECK, store.wait_until_ready()).await {
            return done;
        }
    }
}

/// Whether `store` has its first full list, without waiting.
pub fn has_synced<K>(store: &Store<K>) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.wait_until_ready().now_or_never().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    /// Several tasks wait on one cache; all of them return once it lists
    /// (with kube's own wait, only the last to poll would).
    #[tokio::test]
    async fn every_waiter_is_released() {
        let (store, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let s = store.clone();
                tokio::spawn(async move { wait_for_cache_sync(&s).await.is_ok() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!has_synced(&store));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        for w in waiters {
            let released = tokio::time::timeout(Duration::from_secs(2), w).await;
            assert!(matches!(released, Ok(Ok(true))), "a waiter was left waiting");
        }
        assert!(has_synced(&store));
    }
}
