//! The resource registry: what the API serves (group, version, kind,
//! plural, scope, verbs, short names, categories, subresources) and, per
//! resource, the strategy that defaults, validates and splits spec from
//! status. Every request goes through one generic path driven by this.

mod builtin;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::resource::Resource;
use crate::sync::RwLockExt;

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
    /// Bumped after every change, so derived documents know when to
    /// rebuild: a reader that saw generation `g` sees every change up to `g`.
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Inner {
    by_path: HashMap<(String, String, String), Arc<Resource>>,
    /// Keeps the order resources were added in, for discovery.
    order: Vec<Arc<Resource>>,
}

impl Inner {
    fn remove(&mut self, group: &str, plural: &str) {
        self.order.retain(|o| !(o.group == group && o.plural == plural));
        self.by_path.retain(|(g, _, p), _| !(g == group && p == plural));
    }
}

impl Registry {
    /// The built-in resources of Kubernetes v1.33 that ferrok serves.
    pub fn builtin() -> Registry {
        let registry = Registry::default();
        for r in builtin::resources().into_iter().chain(super::kinds::metrics::resources()) {
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
        let r = Arc::new(r);
        let mut inner = self.inner.write_locked();
        let key = (r.group.clone(), r.version.clone(), r.plural.clone());
        inner.order.retain(|o| {
            (o.group.as_str(), o.version.as_str(), o.plural.as_str())
                != (key.0.as_str(), key.1.as_str(), key.2.as_str())
        });
        inner.order.push(r.clone());
        inner.by_path.insert(key, r);
        self.changed();
    }

    /// Replaces every served version of `group`/`plural` with a copy that
    /// `f` changed, in place (how the API server hands a kind state only it
    /// holds, such as the Service allocator).
    pub fn decorate(&self, group: &str, plural: &str, f: impl Fn(&mut Resource)) {
        let mut inner = self.inner.write_locked();
        let mut replaced = Vec::new();
        for slot in inner.order.iter_mut().filter(|r| r.group == group && r.plural == plural) {
            let mut r = Resource::clone(slot);
            f(&mut r);
            *slot = Arc::new(r);
            replaced.push(slot.clone());
        }
        for r in replaced {
            inner.by_path.insert((r.group.clone(), r.version.clone(), r.plural.clone()), r);
        }
        self.changed();
    }

    pub fn remove(&self, group: &str, plural: &str) {
        let mut inner = self.inner.write_locked();
        inner.remove(group, plural);
        self.changed();
    }

    /// Serves `resources` instead of every version of `group`/`plural`, in
    /// one step: a request never finds the resource missing in between (a
    /// CRD's update re-registers its versions).
    pub fn replace(&self, group: &str, plural: &str, resources: Vec<Resource>) {
        let mut inner = self.inner.write_locked();
        inner.remove(group, plural);
        for r in resources {
            let r = Arc::new(r);
            inner.order.push(r.clone());
            inner.by_path.insert((r.group.clone(), r.version.clone(), r.plural.clone()), r);
        }
        drop(inner);
        self.changed();
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        let inner = self.inner.read_locked();
        inner.by_path.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// The resources of one group/version, in the order they were added.
    pub fn in_version(&self, group: &str, version: &str) -> Vec<Arc<Resource>> {
        let inner = self.inner.read_locked();
        inner.order.iter().filter(|r| r.group == group && r.version == version).cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<Resource>> {
        self.inner.read_locked().order.clone()
    }

    /// The non-core groups, with their versions (preferred first).
    pub fn groups(&self) -> Vec<GroupInfo> {
        let inner = self.inner.read_locked();
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
