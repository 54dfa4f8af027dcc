//! The resource registry: what the API serves (group, version, kind,
//! plural, scope, verbs, short names, categories, subresources) and, per
//! resource, the strategy that defaults, validates and splits spec from
//! status. Every request goes through one generic path driven by this.

mod builtin;
pub mod strategy;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub use strategy::Strategy;

/// The verbs of a resource that stores objects.
pub const CRUD_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// One served resource.
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
}

#[derive(Debug, Clone)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Where objects of this resource live: `/registry/<plural>/` for the
    /// core group, `/registry/<group>/<plural>/` for the others.
    pub fn key_prefix(&self) -> String {
        if self.group.is_empty() {
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
}

/// A group's versions, newest preferred first.
#[derive(Debug, Clone)]
pub struct GroupInfo {
    pub name: String,
    pub versions: Vec<String>,
}

/// Every served resource, looked up by group, version and plural.
#[derive(Default)]
pub struct Registry {
    inner: RwLock<Inner>,
    /// Bumped at every change, so derived documents know when to rebuild.
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Inner {
    by_path: HashMap<(String, String, String), Arc<Resource>>,
    /// Keeps the order resources were added in, for discovery.
    order: Vec<Arc<Resource>>,
}

impl Registry {
    /// The built-in resources of Kubernetes v1.33 that ferrok serves.
    pub fn builtin() -> Registry {
        let registry = Registry::default();
        for r in builtin::resources() {
            registry.add(r);
        }
        registry
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    pub fn add(&self, r: Resource) {
        self.changed();
        let r = Arc::new(r);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let key = (r.group.clone(), r.version.clone(), r.plural.clone());
        inner.order.retain(|o| {
            (o.group.as_str(), o.version.as_str(), o.plural.as_str())
                != (key.0.as_str(), key.1.as_str(), key.2.as_str())
        });
        inner.order.push(r.clone());
        inner.by_path.insert(key, r);
    }

    pub fn remove(&self, group: &str, plural: &str) {
        self.changed();
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.order.retain(|o| !(o.group == group && o.plural == plural));
        inner.by_path.retain(|(g, _, p), _| !(g == group && p == plural));
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.by_path.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// The resources of one group/version, in the order they were added.
    pub fn in_version(&self, group: &str, version: &str) -> Vec<Arc<Resource>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.order.iter().filter(|r| r.group == group && r.version == version).cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<Resource>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).order.clone()
    }

    /// The non-core groups, with their versions (preferred first).
    pub fn groups(&self) -> Vec<GroupInfo> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut groups: Vec<GroupInfo> = Vec::new();
        for r in &inner.order {
            if r.group.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|g| g.name == r.group) {
                Some(g) => {
                    if !g.versions.contains(&r.version) {
                        g.versions.push(r.version.clone());
                        g.versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
                    }
                }
                None => groups.push(GroupInfo { name: r.group.clone(), versions: vec![r.version.clone()] }),
            }
        }
        groups
    }
}

/// Kubernetes' version order: GA > beta > alpha, then by number.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let major_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let Ok(major) = rest[..major_len].parse::<u32>() else {
        return (0, 0, 0);
    };
    let tail = &rest[major_len..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    if let Some(n) = tail.strip_prefix("beta") {
        return (2, major, n.parse().unwrap_or(0));
    }
    if let Some(n) = tail.strip_prefix("alpha") {
        return (1, major, n.parse().unwrap_or(0));
    }
    (0, major, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_registry_serves_the_core_kinds() {
        let r = Registry::builtin();
        let pods = r.get("", "v1", "pods").expect("pods");
        assert!(pods.namespaced && pods.status);
        assert_eq!(pods.key(Some("default"), "web"), "/registry/pods/default/web");
        let deploy = r.get("apps", "v1", "deployments").expect("deployments");
        assert!(deploy.scale.is_some());
        assert_eq!(deploy.key_prefix(), "/registry/apps/deployments/");
        assert!(r.groups().iter().any(|g| g.name == "rbac.authorization.k8s.io"));
        assert!(version_priority("v2") > version_priority("v1"));
        assert!(version_priority("v1") > version_priority("v2beta1"));
    }
}
