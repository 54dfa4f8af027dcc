//! The ConfigMaps and Secrets that volumes project, followed as upstream's
//! watch-based manager follows them: one watch per object
//! (`fieldSelector=metadata.name=<name>` in its namespace), shared by every
//! pod that needs it and dropped when the last of them goes. A change
//! wakes the pods that use the object so they rewrite their volumes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::watcher::{self, Event};
use kube::Api;
use tokio::sync::{watch, Notify};

use super::error::SetUpError;
use super::projection::{config_map_data, secret_data, SourceData, SourceKind};
use super::AbortOnDrop;
use crate::sync::LockExt;

/// One object a volume reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub kind: SourceKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone)]
enum State {
    /// Not listed yet; the last error of the watch, if any.
    Syncing(Option<String>),
    /// Listed: the object's content, or None when it does not exist.
    Synced(Option<Arc<SourceData>>),
}

type Subscribers = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

struct Entry {
    subscribers: Subscribers,
    state: watch::Receiver<State>,
    _task: AbortOnDrop,
}

pub struct SourceWatches {
    client: kube::Client,
    entries: Mutex<HashMap<SourceKey, Entry>>,
}

impl SourceWatches {
    pub fn new(client: kube::Client) -> SourceWatches {
        SourceWatches { client, entries: Mutex::new(HashMap::new()) }
    }

    /// Pod `uid` needs `key`: start following it if nobody did, and wake
    /// `notify` whenever it changes.
    pub fn subscribe(&self, key: &SourceKey, uid: &str, notify: Arc<Notify>) {
        let mut entries = self.entries.locked();
        let entry = entries.entry(key.clone()).or_insert_with(|| {
            let (tx, rx) = watch::channel(State::Syncing(None));
            let subscribers: Subscribers = Arc::default();
            let task = tokio::spawn(follow(self.client.clone(), key.clone(), tx, subscribers.clone()));
            tracing::debug!(kind = key.kind.noun(), namespace = %key.namespace, name = %key.name, "following");
            Entry { subscribers, state: rx, _task: AbortOnDrop(task) }
        });
        entry.subscribers.locked().insert(uid.to_string(), notify);
    }

    /// Pod `uid` no longer needs `key`; the watch stops with its last user.
    pub fn unsubscribe(&self, key: &SourceKey, uid: &str) {
        let mut entries = self.entries.locked();
        let Some(entry) = entries.get(key) else { return };
        let empty = {
            let mut subs = entry.subscribers.locked();
            subs.remove(uid);
            subs.is_empty()
        };
        if empty {
            tracing::debug!(kind = key.kind.noun(), namespace = %key.namespace, name = %key.name, "no longer following");
            entries.remove(key);
        }
    }

    /// The objects followed now.
    pub fn followed(&self) -> Vec<SourceKey> {
        let mut keys: Vec<SourceKey> = self.entries.locked().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The object's content once listed (None: it does not exist). Only
    /// for a subscribed key; waits up to `limit` for the first list.
    pub async fn get(&self, key: &SourceKey, limit: Duration) -> Result<Option<Arc<SourceData>>, SetUpError> {
        let rx = self.entries.locked().get(key).map(|e| e.state.clone());
        let Some(mut rx) = rx else {
            return Err(SetUpError::SourceSync { kind: key.kind.noun(), last: Some("not followed".into()) });
        };
        let synced = tokio::time::timeout(limit, async {
            match &*rx.wait_for(|s| matches!(s, State::Synced(_))).await.ok()? {
                State::Synced(data) => Some(data.clone()),
                State::Syncing(_) => None,
            }
        })
        .await;
        match synced {
            Ok(Some(data)) => Ok(data),
            _ => {
                let last = match &*rx.borrow() {
                    State::Syncing(e) => e.clone(),
                    State::Synced(_) => None,
                };
                Err(SetUpError::SourceSync { kind: key.kind.noun(), last })
            }
        }
    }
}

async fn follow(client: kube::Client, key: SourceKey, tx: watch::Sender<State>, subscribers: Subscribers) {
    match key.kind {
        SourceKind::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client, &key.namespace);
            run(api, &key, tx, subscribers, config_map_data).await
        }
        SourceKind::Secret => {
            let api: Api<Secret> = Api::namespaced(client, &key.namespace);
            run(api, &key, tx, subscribers, secret_data).await
        }
    }
}

async fn run<K>(
    api: Api<K>,
    key: &SourceKey,
    tx: watch::Sender<State>,
    subscribers: Subscribers,
    extract: fn(&K) -> SourceData,
) where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let mut stream = crate::client::typed_watcher::watch(api, config);
    let named = |o: &K| o.meta().name.as_deref() == Some(key.name.as_str());
    let mut listing: Option<SourceData> = None;
    while let Some(event) = stream.next().await {
        let content = match event {
            Ok(Event::Init) => {
                listing = None;
                continue;
            }
            Ok(Event::InitApply(o)) => {
                if named(&o) {
                    listing = Some(extract(&o));
                }
                continue;
            }
            Ok(Event::InitDone) => listing.take(),
            Ok(Event::Apply(o)) if named(&o) => Some(extract(&o)),
            Ok(Event::Delete(o)) if named(&o) => None,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(kind = key.kind.noun(), name = %key.name, error = %e, "watch failed; retrying");
                tx.send_if_modified(|s| match s {
                    State::Syncing(last) => {
                        *last = Some(e.to_string());
                        true
                    }
                    State::Synced(_) => false,
                });
                continue;
            }
        };
        let mut changed = false;
        tx.send_modify(|s| {
            changed = match s {
                State::Synced(old) => old.as_deref() != content.as_ref(),
                State::Syncing(_) => false,
            };
            *s = State::Synced(content.map(Arc::new));
        });
        if changed {
            tracing::debug!(kind = key.kind.noun(), namespace = %key.namespace, name = %key.name, "changed");
            for notify in subscribers.locked().values() {
                notify.notify_one();
            }
        }
    }
}
