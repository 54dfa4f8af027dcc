//! GarbageCollector: follows every resource's metadata and keeps a graph
//! of owners and dependents by uid. A dependent whose owners are all gone
//! is deleted (background propagation). An owner being deleted with the
//! `orphan` finalizer has its dependents' ownerReferences to it removed;
//! with `foregroundDeletion`, its dependents are deleted first (those that
//! block it, `blockOwnerDeletion`, gone before it; a circle of owners is
//! broken as upstream breaks it). Either way the finalizer is then
//! removed, which lets the API server delete it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{select_all, BoxStream};
use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::core::ApiResource;
use kube::discovery::{verbs, Discovery, Scope};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::Mutex;

use super::ControllerError;
use crate::metrics::workqueue::WorkQueueMetrics;

/// One object the collector knows of.
#[derive(Clone)]
struct Node {
    resource: Arc<ApiResource>,
    namespace: Option<String>,
    name: String,
    owners: Vec<OwnerReference>,
    deleting: bool,
    finalizers: Vec<String>,
}

impl Node {
    /// Whether it waits for its blocking dependents to go first.
    fn is_deleting_dependents(&self) -> bool {
        self.finalizers.iter().any(|f| f == "foregroundDeletion")
    }

    /// Whether its reference to `owner` blocks the owner's foreground deletion.
    fn blocks(&self, owner: &str) -> bool {
        self.owners.iter().any(|o| o.uid == owner && o.block_owner_deletion == Some(true))
    }
}

#[derive(Default)]
struct Graph {
    nodes: HashMap<String, Node>,
    /// owner uid → dependent uids.
    dependents: HashMap<String, HashSet<String>>,
}

impl Graph {
    fn upsert(&mut self, uid: String, node: Node) {
        if let Some(old) = self.nodes.get(&uid) {
            for o in &old.owners {
                if let Some(set) = self.dependents.get_mut(&o.uid) {
                    set.remove(&uid);
                }
            }
        }
        for o in &node.owners {
            self.dependents.entry(o.uid.clone()).or_default().insert(uid.clone());
        }
        self.nodes.insert(uid, node);
    }

    fn remove(&mut self, uid: &str) {
        if let Some(old) = self.nodes.remove(uid) {
            for o in &old.owners {
                if let Some(set) = self.dependents.get_mut(&o.uid) {
                    set.remove(uid);
                }
            }
        }
    }

    fn dependents_of(&self, uid: &str) -> Vec<(String, Node)> {
        self.dependents
            .get(uid)
            .map(|set| set.iter().filter_map(|d| self.nodes.get(d).map(|n| (d.clone(), n.clone()))).collect())
            .unwrap_or_default()
    }
}

fn api_for(client: &kube::Client, node: &Node) -> Api<DynamicObject> {
    match &node.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, node.resource.as_ref()),
        None => Api::all_with(client.clone(), node.resource.as_ref()),
    }
}

/// Whether an owner still exists, asked of the API (the graph may not
/// follow the owner's kind, or may lag).
async fn owner_exists(
    client: &kube::Client,
    discovery: &Discovery,
    namespace: Option<&str>,
    owner: &OwnerReference,
) -> Result<bool, ControllerError> {
    let (group, version) = match owner.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", owner.api_version.as_str()),
    };
    let Some((ar, caps)) = discovery
        .groups()
        .find(|g| g.name() == group)
        .and_then(|g| g.versioned_resources(version).into_iter().find(|(ar, _)| ar.kind == owner.kind))
    else {
        // An owner of a kind the server does not serve is gone.
        return Ok(false);
    };
    let api: Api<DynamicObject> = match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    match api.get_metadata_opt(&owner.name).await? {
        Some(found) => Ok(found.metadata.uid.as_deref() == Some(owner.uid.as_str())),
        None => Ok(false),
    }
}

/// Removes `finalizer` from an object, guarded by its resourceVersion.
async fn remove_finalizer(client: &kube::Client, node: &Node, finalizer: &str) -> Result<(), ControllerError> {
    let api = api_for(client, node);
    let Some(current) = api.get_metadata_opt(&node.name).await? else { return Ok(()) };
    let mut finalizers = current.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    finalizers.retain(|f| f != finalizer);
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": current.metadata.resource_version}});
    api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Changes an object's ownerReferences, guarded by its resourceVersion;
/// an object already gone is left alone.
async fn rewrite_owner_references(
    client: &kube::Client,
    node: &Node,
    change: impl Fn(&mut Vec<OwnerReference>),
) -> Result<(), ControllerError> {
    let api = api_for(client, node);
    let Some(current) = api.get_metadata_opt(&node.name).await? else { return Ok(()) };
    let before = current.metadata.owner_references.clone().unwrap_or_default();
    let mut refs = before.clone();
    change(&mut refs);
    if refs == before {
        return Ok(());
    }
    // An empty list goes away entirely, as upstream leaves it.
    let value = if refs.is_empty() { serde_json::Value::Null } else { serde_json::json!(refs) };
    let patch = serde_json::json!({"metadata": {"ownerReferences": value, "resourceVersion": current.metadata.resource_version}});
    match api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

struct Collector {
    client: kube::Client,
    discovery: Discovery,
    graph: Mutex<Graph>,
    /// Bounds the collection steps in flight (a start with many owned
    /// objects checks every owner).
    workers: tokio::sync::Semaphore,
}

impl Collector {
    /// Looks at one object and does what its state asks for.
    async fn attend(&self, uid: &str) -> Result<(), ControllerError> {
        let (node, dependents) = {
            let graph = self.graph.lock().await;
            let Some(node) = graph.nodes.get(uid).cloned() else { return Ok(()) };
            (node, graph.dependents_of(uid))
        };
        if node.deleting && node.finalizers.iter().any(|f| f == "orphan") {
            for (_, dep) in &dependents {
                let owners: Vec<&OwnerReference> = dep.owners.iter().filter(|o| o.uid != uid).collect();
                // An empty list goes away entirely, as upstream leaves it.
                let refs = if owners.is_empty() { serde_json::Value::Null } else { serde_json::json!(owners) };
                let patch = serde_json::json!({"metadata": {"ownerReferences": refs}});
                match api_for(&self.client, dep).patch(&dep.name, &PatchParams::default(), &Patch::Merge(&patch)).await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            remove_finalizer(&self.client, &node, "orphan").await?;
            return Ok(());
        }
        if node.deleting && node.is_deleting_dependents() {
            // Only dependents that block their owner's deletion hold it
            // back; the others go once it is gone, as any orphan does.
            if !dependents.iter().any(|(_, d)| d.blocks(uid)) {
                remove_finalizer(&self.client, &node, "foregroundDeletion").await?;
                return Ok(());
            }
            for (dep_uid, dep) in &dependents {
                if !dep.deleting {
                    self.delete_dependent(dep_uid, dep, uid).await?;
                }
            }
            return Ok(());
        }
        if node.owners.is_empty() || node.deleting {
            return Ok(());
        }
        for owner in &node.owners {
            if owner_exists(&self.client, &self.discovery, node.namespace.as_deref(), owner).await? {
                return Ok(());
            }
        }
        tracing::debug!(object = %node.name, kind = %node.resource.kind, "deleting an object whose owners are gone");
        self.delete(&node, DeleteParams::background()).await
    }

    /// Deletes (in the foreground) a dependent of an owner being deleted in
    /// the foreground, as upstream's attemptToDeleteItem: a dependent with
    /// another owner that still exists only lets go of this one; before a
    /// dependent goes, its own dependents that wait for their dependents
    /// stop being blocked by it, which breaks a circle of owners (upstream's
    /// unblockOwnerReferences).
    async fn delete_dependent(&self, dep_uid: &str, dep: &Node, owner_uid: &str) -> Result<(), ControllerError> {
        for other in dep.owners.iter().filter(|o| o.uid != owner_uid) {
            if owner_exists(&self.client, &self.discovery, dep.namespace.as_deref(), other).await? {
                return rewrite_owner_references(&self.client, dep, |refs| refs.retain(|o| o.uid != owner_uid)).await;
            }
        }
        let waiting: Vec<Node> = {
            let graph = self.graph.lock().await;
            graph
                .dependents_of(dep_uid)
                .into_iter()
                .map(|(_, d)| d)
                .filter(|d| d.deleting && d.is_deleting_dependents() && d.blocks(dep_uid))
                .collect()
        };
        for d in &waiting {
            rewrite_owner_references(&self.client, d, |refs| {
                for o in refs.iter_mut().filter(|o| o.uid == dep_uid) {
                    o.block_owner_deletion = Some(false);
                }
            })
            .await?;
        }
        self.delete(dep, DeleteParams::foreground()).await
    }

    async fn delete(&self, node: &Node, params: DeleteParams) -> Result<(), ControllerError> {
        match api_for(&self.client, node).delete(&node.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn node_of(resource: &Arc<ApiResource>, meta: &PartialObjectMeta<DynamicObject>) -> Option<(String, Node)> {
    let m = &meta.metadata;
    Some((
        m.uid.clone()?,
        Node {
            resource: resource.clone(),
            namespace: m.namespace.clone(),
            name: m.name.clone()?,
            owners: m.owner_references.clone().unwrap_or_default(),
            deleting: m.deletion_timestamp.is_some(),
            finalizers: m.finalizers.clone().unwrap_or_default(),
        },
    ))
}

type Tagged = (Arc<ApiResource>, Result<Event<PartialObjectMeta<DynamicObject>>, watcher::Error>);

/// `client` is the collector's own, under which it deletes and patches;
/// `watch_client` the shared informers' (the controller manager's, which
/// may watch every kind and is sent no managedFields, as upstream's
/// collector reads its metadata informers).
pub async fn run(client: kube::Client, watch_client: kube::Client) {
    loop {
        if let Err(e) = follow(client.clone(), watch_client.clone()).await {
            tracing::warn!(error = %e, "garbage collector stopped; starting again");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs until the set of served resources changes (a CRD comes or goes).
async fn follow(client: kube::Client, watch_client: kube::Client) -> Result<(), ControllerError> {
    let discovery =
        Discovery::new(client.clone()).run().await.map_err(|e| ControllerError::Discovery(e.to_string()))?;
    let mut streams: Vec<BoxStream<'static, Tagged>> = Vec::new();
    let mut served = HashSet::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::WATCH) || !caps.supports_operation(verbs::DELETE) {
                continue;
            }
            // Events are many and short-lived; upstream's collector ignores them.
            if ar.plural == "events" && (ar.group.is_empty() || ar.group == "events.k8s.io") {
                continue;
            }
            served.insert(format!("{}/{}", ar.group, ar.plural));
            let ar = Arc::new(ar);
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(watch_client.clone(), ar.as_ref());
            let tag = ar.clone();
            streams.push(
                watcher(api, watcher::Config::default()).default_backoff().map(move |e| (tag.clone(), e)).boxed(),
            );
        }
    }
    let collector = Arc::new(Collector {
        client: client.clone(),
        discovery,
        graph: Mutex::new(Graph::default()),
        workers: tokio::sync::Semaphore::new(8),
    });
    // Upstream's queue of objects to look at (its attemptToDelete).
    let attempts = WorkQueueMetrics::named("garbage_collector_attempt_to_delete");
    let mut events = select_all(streams);
    while let Some((resource, event)) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, kind = %resource.kind, "watch error; the watcher retries");
                continue;
            }
        };
        let mut todo = Vec::new();
        {
            let mut graph = collector.graph.lock().await;
            match event {
                Event::Apply(meta) | Event::InitApply(meta) => {
                    // A CRD for a resource not followed yet: start again with a fresh discovery.
                    if resource.group == "apiextensions.k8s.io" && resource.kind == "CustomResourceDefinition" {
                        if let Some(name) = &meta.metadata.name {
                            let (plural, group) = name.split_once('.').unwrap_or((name, ""));
                            if !served.contains(&format!("{group}/{plural}"))
                                && meta.metadata.deletion_timestamp.is_none()
                            {
                                tokio::time::sleep(Duration::from_millis(500)).await;
                                return Ok(());
                            }
                        }
                    }
                    if let Some((uid, node)) = node_of(&resource, &meta) {
                        let interesting = !node.owners.is_empty() || node.deleting;
                        graph.upsert(uid.clone(), node);
                        if interesting {
                            todo.push(uid);
                        }
                    }
                }
                Event::Delete(meta) => {
                    if let Some(uid) = meta.metadata.uid.clone() {
                        graph.remove(&uid);
                        todo.extend(graph.dependents_of(&uid).into_iter().map(|(d, _)| d));
                        for owner in meta.metadata.owner_references.unwrap_or_default() {
                            todo.push(owner.uid);
                        }
                    }
                    if resource.group == "apiextensions.k8s.io" && resource.kind == "CustomResourceDefinition" {
                        return Ok(());
                    }
                }
                Event::Init | Event::InitDone => {}
            }
        }
        for uid in todo {
            let c = collector.clone();
            let queue = attempts.clone();
            queue.add(&uid);
            tokio::spawn(async move {
                let Ok(_permit) = c.workers.acquire().await else { return };
                for attempt in 0..5u32 {
                    let timer = queue.start(&uid);
                    let step = c.attend(&uid).await;
                    drop(timer);
                    match step {
                        Ok(()) => return,
                        Err(e) => {
                            queue.retry();
                            tracing::debug!(error = %e, attempt, "garbage collection step failed; retrying");
                            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                        }
                    }
                }
            });
        }
    }
    Ok(())
}
