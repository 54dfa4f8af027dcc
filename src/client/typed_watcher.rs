//! kube's watcher (list, then watch, relisting when the watch breaks,
//! with back-off), run once for every kind over objects kept as their JSON
//! text, each decoded into its kind only when it arrives.
//!
//! `kube::runtime::watcher::<K>` is generic over the kind: each kind
//! watched in the process instantiated the whole list/watch state machine,
//! its stream adapters and its back-off again (about 80 KB of machine code
//! per kind, thirty-odd kinds). Here the state machine runs over `RawObject`
//! alone, and what is per kind is the decode of an object's text, which
//! kube's list and watch decoders instantiated per kind anyway.

use std::future::ready;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource};
use kube::core::DynamicResourceScope;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// An object of any kind as the API sent it: its JSON text, and the part
/// of its metadata the watcher reads (the resource version it resumes
/// from) and logs (name and namespace).
#[derive(Clone, Debug)]
pub struct RawObject {
    metadata: ObjectMeta,
    json: Box<RawValue>,
}

/// The metadata a `RawObject` keeps, read from its text.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Head {
    #[serde(default)]
    metadata: HeadMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
}

impl<'de> Deserialize<'de> for RawObject {
    /// Only from serde_json's own deserializers (kube's list and watch
    /// decoders are), which hand over the text itself.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let json = Box::<RawValue>::deserialize(deserializer)?;
        let head: Head = serde_json::from_str(json.get()).map_err(D::Error::custom)?;
        let HeadMeta { name, namespace, resource_version } = head.metadata;
        Ok(RawObject { metadata: ObjectMeta { name, namespace, resource_version, ..ObjectMeta::default() }, json })
    }
}

impl Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The watch events of `api`'s objects under `config`, with kube's default
/// back-off between failed attempts, as `watcher(api,
/// config).default_backoff()` gives them. An object whose text does not
/// decode as a `K` (which the API server never sends) is logged and left
/// out.
pub fn watch<K>(api: Api<K>, config: watcher::Config) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let raw = match api.namespace().map(str::to_owned) {
        Some(ns) => Api::<RawObject>::namespaced_with(api.into_client(), &ns, &resource),
        None => Api::<RawObject>::all_with(api.into_client(), &resource),
    };
    watch_raw(raw, config).filter_map(|event| ready(decode_event(event))).boxed()
}

/// The one instantiation of kube's watcher and back-off.
fn watch_raw(
    api: Api<RawObject>,
    config: watcher::Config,
) -> BoxStream<'static, Result<Event<RawObject>, watcher::Error>> {
    watcher::watcher(api, config).default_backoff().boxed()
}

/// `event` with its object decoded as a `K`; None when it does not decode.
fn decode_event<K: Resource + DeserializeOwned>(
    event: Result<Event<RawObject>, watcher::Error>,
) -> Option<Result<Event<K>, watcher::Error>> {
    Some(Ok(match event {
        Err(e) => return Some(Err(e)),
        Ok(Event::Init) => Event::Init,
        Ok(Event::InitDone) => Event::InitDone,
        Ok(Event::InitApply(raw)) => Event::InitApply(decode(&raw)?),
        Ok(Event::Apply(raw)) => Event::Apply(decode(&raw)?),
        Ok(Event::Delete(raw)) => Event::Delete(decode(&raw)?),
    }))
}

fn decode<K: Resource + DeserializeOwned>(raw: &RawObject) -> Option<K> {
    serde_json::from_str(raw.json.get())
        .map_err(|e| {
            tracing::warn!(
                name = ?raw.metadata.name,
                namespace = ?raw.metadata.namespace,
                error = %e,
                "a watched object does not decode as its kind; left out"
            )
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::{ObjectList, WatchEvent};

    #[test]
    fn a_list_and_watch_events_keep_each_object_as_its_text() {
        let list = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"12"},
            "items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"7"},"data":{"k":"v"}}]}"#;
        let list: ObjectList<RawObject> = serde_json::from_str(list).expect("list");
        assert_eq!(list.metadata.resource_version.as_deref(), Some("12"));
        let item = &list.items[0];
        assert_eq!(item.metadata.resource_version.as_deref(), Some("7"));
        let cm: ConfigMap = decode(item).expect("decodes");
        assert_eq!(cm.metadata.name.as_deref(), Some("a"));
        assert_eq!(cm.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("v"));

        let line = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b","resourceVersion":"13"}}}"#;
        let WatchEvent::Modified(raw) = serde_json::from_str::<WatchEvent<RawObject>>(line).expect("event") else {
            panic!("not a modification")
        };
        assert_eq!(raw.metadata.resource_version.as_deref(), Some("13"));
        assert_eq!(decode::<ConfigMap>(&raw).and_then(|c| c.metadata.name).as_deref(), Some("b"));
    }

    #[test]
    fn an_object_of_another_shape_is_left_out_not_a_failed_watch() {
        let raw: RawObject = serde_json::from_str(r#"{"metadata":{"name":"x"},"data":7}"#).expect("raw");
        assert!(decode_event::<ConfigMap>(Ok(Event::Apply(raw))).is_none());
        assert!(matches!(decode_event::<ConfigMap>(Ok(Event::InitDone)), Some(Ok(Event::InitDone))));
    }
}
