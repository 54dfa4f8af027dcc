//! One served resource: its group, version, kind, plural, scope, verbs,
//! short names, categories and subresources, the strategy its objects go
//! through, and where they live in the store.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::status::ApiResult;
use super::strategy::Strategy;

/// What a kind does right before its objects are written, with state only
/// the API server holds (upstream's BeginCreate/BeginUpdate of a REST
/// store): Services take their cluster IPs and node ports. The guard it
/// returns is held until the write is done, so that two writes never take
/// the same thing.
pub trait BeginWrite: Send + Sync {
    /// `obj` is about to be stored at `key`, replacing `old` on an update.
    fn begin<'a>(
        &'a self,
        obj: &'a mut Value,
        key: &'a str,
        old: Option<&'a Value>,
    ) -> BoxFuture<'a, ApiResult<WriteGuard>>;
}

/// Held from `BeginWrite::begin` until the write is done.
pub type WriteGuard = Box<dyn Send>;

/// The verbs of a resource that stores objects.
pub const CRUD_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// One served resource.
#[derive(Clone)]
pub struct Resource {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `status` subresource: the main resource ignores status changes.
    pub status: bool,
    /// Has a `scale` subresource; the paths of replicas in spec and status.
    pub scale: Option<ScalePaths>,
    /// Other subresources served (`binding`, `eviction`, `token`, ...).
    pub subresources: Vec<String>,
    /// Create-only and never stored (the review APIs).
    pub ephemeral: bool,
    /// Read-only and never stored: computed from the cluster's state on
    /// every get and list (`componentstatuses`).
    pub computed: bool,
    pub strategy: Arc<dyn Strategy>,
    /// Runs before each create or update is stored (see `BeginWrite`).
    pub begin_write: Option<Arc<dyn BeginWrite>>,
}

#[derive(Debug, Clone)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

impl Resource {
    /// Runs the kind's `BeginWrite`, if it has one; the guard is held until
    /// the write is done.
    pub async fn begin_write(&self, obj: &mut Value, key: &str, old: Option<&Value>) -> ApiResult<Option<WriteGuard>> {
        match &self.begin_write {
            Some(hook) => Ok(Some(hook.begin(obj, key, old).await?)),
            None => Ok(None),
        }
    }

    /// The apiVersion its objects are stored in: its own, or the one its
    /// conversion stores them as.
    pub fn storage_api_version(&self) -> String {
        match self.strategy.conversion() {
            Some(c) => c.storage_api_version().to_string(),
            None => self.api_version(),
        }
    }

    /// The apiVersion the watch cache holds its objects in; None when each
    /// keeps the one it was stored in (custom resources, whose stored
    /// objects may be of several versions).
    pub fn cache_api_version(&self) -> Option<String> {
        (!self.strategy.is_custom()).then(|| self.storage_api_version())
    }

    /// Stored objects in this resource's served form (one conversion for
    /// them all).
    pub async fn from_storage(&self, stored: Vec<Value>) -> ApiResult<Vec<Value>> {
        match self.strategy.conversion() {
            Some(c) => c.served(stored).await,
            None => Ok(stored),
        }
    }

    /// A served object in the form it is stored in; None when that is the
    /// served form itself.
    pub async fn to_storage(&self, obj: &Value) -> ApiResult<Option<Value>> {
        match self.strategy.conversion() {
            Some(c) if c.storage_api_version() != self.api_version() => Ok(Some(c.stored(obj.clone()).await?)),
            _ => Ok(None),
        }
    }

    /// Whether its objects may be served otherwise than as stored.
    pub fn converts(&self) -> bool {
        self.strategy.conversion().is_some()
    }

    /// Whether an object the store holds in `api_version` is served as it
    /// is (the watch cache's JSON of it sent as it is, its apiVersion and
    /// kind set).
    pub fn serves_as_stored(&self, api_version: &str) -> bool {
        self.strategy.conversion().is_none_or(|c| c.serves_as_stored(api_version))
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Where objects of this resource live: `/registry/<plural>/` for the
    /// core group, `/registry/<group>/<plural>/` for the others, or the
    /// prefix of the resource they are stored as (`Strategy::stored_under`).
    pub fn key_prefix(&self) -> String {
        if let Some(prefix) = self.strategy.stored_under() {
            prefix.to_string()
        } else if self.group.is_empty() {
            format!("/registry/{}/", self.plural)
        } else {
            format!("/registry/{}/{}/", self.group, self.plural)
        }
    }

    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/{name}", self.key_prefix()),
            _ => format!("{}{name}", self.key_prefix()),
        }
    }

    /// The prefix a list reads: one namespace or all of them.
    pub fn list_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/", self.key_prefix()),
            _ => self.key_prefix(),
        }
    }

    /// A `meta.k8s.io/v1` Table of `objects` with this resource's columns.
    pub fn table(
        &self,
        objects: &[serde_json::Value],
        list_meta: serde_json::Value,
        include: &str,
    ) -> serde_json::Value {
        let strategy = &self.strategy;
        super::table::table(strategy.columns(), &|o| strategy.cells(o), objects, list_meta, include)
    }
}
