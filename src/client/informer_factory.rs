//! client-go's SharedInformerFactory: the one place a process's
//! components (the controllers, the scheduler, and the node role: its
//! service proxy, cluster DNS, network policy, overlay, Node status and
//! local-path cleanup) get their informers from, so each (kind, selector)
//! is watched once and cached once for the whole process, however many
//! components read it. An informer starts on first request and runs for
//! the life of the process; components subscribing later (after a leader
//! election, say) are handed its cache as it is.
//!
//! A server's factory watches as `system:kube-controller-manager`, whose
//! role lists and watches everything, and its node role shares it; an
//! agent's watches with the node's own credentials. Components write with
//! their own clients.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;

use super::indexer::{self, Index};
use super::informer::SharedIndexInformer;
use crate::sync::LockExt;

/// Each informer, type-erased, by its kind and its selectors.
type Informers = HashMap<(TypeId, String), Box<dyn Any + Send + Sync>>;

/// The informers of the process, by kind and selector.
#[derive(Clone)]
pub struct SharedInformerFactory {
    client: kube::Client,
    informers: Arc<Mutex<Informers>>,
}

impl SharedInformerFactory {
    /// Informers that watch through `client`.
    pub fn new(client: kube::Client) -> Self {
        SharedInformerFactory { client, informers: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// The client the informers watch with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The informer of every `K` in the cluster.
    pub fn informer<K>(&self) -> SharedIndexInformer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.informer_with(watcher::Config::default())
    }

    /// The informer of the `K`s `config`'s selectors pick (one per distinct
    /// label and field selector).
    pub fn informer_with<K>(&self, config: watcher::Config) -> SharedIndexInformer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let key = (TypeId::of::<K>(), format!("{:?}|{:?}", config.label_selector, config.field_selector));
        let mut informers = self.informers.locked();
        if let Some(existing) = informers.get(&key).and_then(|i| i.downcast_ref::<SharedIndexInformer<K>>()) {
            return existing.clone();
        }
        let informer = SharedIndexInformer::start(Api::<K>::all(self.client.clone()), config);
        informers.insert(key, Box::new(informer.clone()));
        informer
    }

    /// Pods by the node they are bound to.
    pub fn pods_by_node(&self) -> Index<Pod> {
        self.informer::<Pod>().index(indexer::POD_NODE_NAME, indexer::pod_node_name)
    }

    /// Every `K` by the UID of its controller.
    pub fn by_controller<K>(&self) -> Index<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.informer::<K>().index(indexer::CONTROLLER_UID, indexer::controller_uid::<K>)
    }

    /// Every `K` without a controller, by namespace.
    pub fn orphans_by_namespace<K>(&self) -> Index<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.informer::<K>().index(indexer::ORPHAN_NAMESPACE, indexer::orphan_namespace::<K>)
    }

    /// Every `K` by namespace.
    pub fn by_namespace<K>(&self) -> Index<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.informer::<K>().index(indexer::NAMESPACE, indexer::namespace::<K>)
    }
}
