//! Whether the store answers a requested progress notification in order
//! with the watch's events: upstream's feature support checker for
//! `RequestWatchProgress`. etcd before 3.4.31 and 3.5.13 answers such a
//! request with its current revision at once, ahead of events still on
//! their way (etcd-io/etcd#15220, #17507), so a watch cache that believed
//! it would skip those events as already seen. Against such a store the
//! caches never ask: consistent reads go to the store, and the store's
//! own periodic progress notifications (which are ordered) bring the
//! bookmarks. ferrok's embedded store reports an etcd version past both
//! fixes.

use tokio::sync::OnceCell;

use crate::store::Store;

/// What the store was found to support, asked once.
#[derive(Default)]
pub struct ProgressSupport {
    known: OnceCell<bool>,
}

impl ProgressSupport {
    /// Whether requested progress notifications are ordered with events;
    /// false (asked again next time) while the store's version is unknown.
    pub async fn ordered(&self, store: &dyn Store) -> bool {
        if let Some(known) = self.known.get() {
            return *known;
        }
        match store.status().await {
            Ok(status) => {
                let ordered = orders_progress_requests(&status.version);
                if !ordered {
                    tracing::info!(
                        version = %status.version,
                        "etcd answers progress requests out of order (fixed in 3.4.31 and 3.5.13): \
                         consistent reads go to etcd, not the watch caches"
                    );
                }
                *self.known.get_or_init(|| async { ordered }).await
            }
            Err(e) => {
                tracing::debug!(error = %e, "the datastore's version is not known yet");
                false
            }
        }
    }
}

/// Whether an etcd of `version` answers progress requests in order: 3.4
/// from 3.4.31, 3.5 from 3.5.13, and every release from 3.6 on.
pub fn orders_progress_requests(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']).map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

#[cfg(test)]
mod tests {
    use super::orders_progress_requests as ordered;

    #[test]
    fn the_fixed_releases_of_each_line_are_trusted() {
        for v in ["3.4.31", "3.4.40", "3.5.13", "3.5.16", "3.6.0", "v3.6.4", "3.7.1", "4.0.0", "3.5.13-rc.1"] {
            assert!(ordered(v), "{v}");
        }
    }

    #[test]
    fn earlier_releases_and_unreadable_versions_are_not() {
        for v in ["3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "2.3.8", "", "3.5", "latest"] {
            assert!(!ordered(v), "{v}");
        }
    }
}
