//! A watch-fed cache of a secondary kind whose events also trigger a
//! controller: the store is written before the trigger fires, so a
//! reconcile caused by a change always sees that change in the cache.

use std::fmt::Debug;

use futures_util::Stream;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;

/// A cache of `api` and the stream of objects touched (applied or deleted),
/// for `Controller::watches_stream`.
pub fn reflected<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff().touched_objects();
    (reader, stream)
}
