//! ControllerRevisions for StatefulSets and DaemonSets, as upstream's
//! controller history package keeps them: a revision holds the pod template
//! as a replace patch, is named `<owner>-<hash>` (FNV-1 of that data and
//! the collision count, in the safe alphabet), and revisions beyond
//! `revisionHistoryLimit` that no pod uses are deleted.
//!
//! The start of a DaemonSet's and a StatefulSet's sync is the same, and
//! is written once here: claim the orphan pods the selector matches (the
//! ControllerRefManager), then the owner's revisions and the one of its
//! current template (upstream's `constructHistory` and
//! `getStatefulSetRevisions`); `History::cleanup` is their
//! `cleanupHistory` / `truncateHistory`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Resource;
use serde_json::{json, Value};

use super::controller_utils::controller_ref;
use super::informers::controlled_by;
use super::{ref_manager, ControllerError};
use crate::client::indexer::Index;
use crate::controllers::controller_utils::ignore_not_found;

/// The label every revision carries with its hash.
pub const REVISION_HASH_LABEL: &str = "controller.kubernetes.io/hash";

const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// FNV-1 (32 bit), as Go's hash/fnv New32.
fn fnv32(bytes: &[u8], mut h: u32) -> u32 {
    for b in bytes {
        h = h.wrapping_mul(16_777_619);
        h ^= u32::from(*b);
    }
    h
}

/// Upstream's rand.SafeEncodeString: each byte mapped into an alphabet
/// without vowels or look-alike digits.
pub fn safe_encode(s: &str) -> String {
    s.bytes().map(|b| SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()] as char).collect()
}

/// The hash naming a revision of `data`: FNV-1 over the data and the
/// collision count in decimal, as upstream's HashControllerRevision.
pub fn hash_revision(data: &Value, collision_count: i32) -> String {
    let h = fnv32(data.to_string().as_bytes(), 2_166_136_261);
    let h = fnv32(collision_count.to_string().as_bytes(), h);
    safe_encode(&h.to_string())
}

/// What a StatefulSet or DaemonSet revision stores: its template as a
/// strategic-merge patch that replaces the template.
///
/// The bytes are those upstream's controllers (and its clients' `Match`,
/// which compares them with the owner's template encoded again) write:
/// keys sorted, and the fields Go's types always encode present even when
/// empty (the template's `creationTimestamp: null`, each container's
/// `resources: {}`, a resourceFieldRef's `divisor: "0"`).
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    with_go_fields(&mut t);
    if let Some(m) = t.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// A pod template's fields that Go encodes even when empty (structs, not
/// pointers, in upstream's types).
fn with_go_fields(template: &mut Value) {
    let Some(t) = template.as_object_mut() else { return };
    let meta = t.entry("metadata").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.entry("creationTimestamp").or_insert(Value::Null);
    }
    let Some(spec) = t.get_mut("spec").and_then(Value::as_object_mut) else { return };
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            let Some(c) = c.as_object_mut() else { continue };
            c.entry("resources").or_insert_with(|| json!({}));
            for env in c.get_mut("env").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(r) = env.pointer_mut("/valueFrom/resourceFieldRef").and_then(Value::as_object_mut) {
                    r.entry("divisor").or_insert_with(|| json!("0"));
                }
            }
        }
    }
}

/// Whether a revision holds `data`, however an older ferrok wrote it
/// (without the fields Go always encodes): such a revision is reused, not
/// replaced, so pods keep their hash across an upgrade.
fn holds(revision: &ControllerRevision, data: &Value) -> bool {
    let Some(held) = data_of(revision) else { return false };
    if held == data {
        return true;
    }
    let mut shaped = held.clone();
    if let Some(t) = shaped.pointer_mut("/spec/template") {
        with_go_fields(t);
    }
    &shaped == data
}

/// The template a revision holds.
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = revision.data.as_ref()?.0.pointer("/spec/template")?.clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    crate::decode::from_value(&t).ok()
}

fn data_of(revision: &ControllerRevision) -> Option<&Value> {
    revision.data.as_ref().map(|d| &d.0)
}

/// Revisions sorted oldest first.
pub fn sorted(mut revisions: Vec<Arc<ControllerRevision>>) -> Vec<Arc<ControllerRevision>> {
    revisions.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then(a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp))
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
    revisions
}

/// Finds or creates the revision for `data` (the newest revision number),
/// bumping `collision_count` when a different revision holds the name.
pub struct NewRevision<'a> {
    pub api: &'a Api<ControllerRevision>,
    pub owner_name: &'a str,
    pub owner_ref: OwnerReference,
    /// The owner's pod template's labels (upstream's, on each revision).
    pub labels: BTreeMap<String, String>,
    /// The label that carries the revision's hash: a StatefulSet's
    /// `controller.kubernetes.io/hash`, a DaemonSet's `controller-revision-hash`.
    pub hash_label: &'static str,
    pub data: Value,
    /// The owner's revisions, oldest first.
    pub revisions: &'a [Arc<ControllerRevision>],
}

impl NewRevision<'_> {
    pub async fn ensure(self, collision_count: &mut i32) -> Result<ControllerRevision, ControllerError> {
        let next = self.revisions.last().map_or(1, |r| r.revision + 1);
        // An equal revision: reuse it (a rollback makes it the newest again).
        if let Some(equal) = self.revisions.iter().rev().find(|r| holds(r, &self.data)) {
            let last = self.revisions.last().map(|r| &r.metadata.name);
            if last == Some(&equal.metadata.name) {
                return Ok((**equal).clone());
            }
            let name = equal.metadata.name.clone().unwrap_or_default();
            let patch = json!({"revision": next});
            return Ok(self.api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?);
        }
        loop {
            let hash = hash_revision(&self.data, *collision_count);
            let name = format!("{}-{hash}", self.owner_name);
            let mut labels = self.labels.clone();
            labels.insert(self.hash_label.into(), hash);
            let revision = ControllerRevision {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels),
                    owner_references: Some(vec![self.owner_ref.clone()]),
                    ..Default::default()
                },
                data: Some(RawExtension(self.data.clone())),
                revision: next,
            };
            match self.api.create(&PostParams::default(), &revision).await {
                Ok(r) => return Ok(r),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = self.api.get(&name).await?;
                    if holds(&existing, &self.data) {
                        return Ok(existing);
                    }
                    *collision_count += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Deletes the oldest revisions beyond `limit` that are neither `live`
/// (used by a pod, current or update) nor among the newest.
pub async fn truncate(
    api: &Api<ControllerRevision>,
    revisions: &[Arc<ControllerRevision>],
    live: &HashSet<String>,
    limit: i32,
) -> Result<(), ControllerError> {
    let history: Vec<_> =
        revisions.iter().filter(|r| !live.contains(r.metadata.name.as_deref().unwrap_or_default())).collect();
    let excess = history.len().saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
    for r in history.into_iter().take(excess) {
        let name = r.metadata.name.clone().unwrap_or_default();
        ignore_not_found(api.delete(&name, &DeleteParams::default()).await)?;
    }
    Ok(())
}

/// A DaemonSet or StatefulSet at the start of its sync: the object, the
/// parts of its spec the shared preamble reads, and the caches it reads
/// them against.
pub struct RevisionedOwner<'a, K> {
    pub client: &'a kube::Client,
    pub owner: &'a K,
    pub selector: &'a LabelSelector,
    pub template: &'a PodTemplateSpec,
    /// The label that carries a revision's hash (see `NewRevision`).
    pub hash_label: &'static str,
    /// The status' collisionCount.
    pub collision_count: Option<i32>,
    /// Pods without a controller, by namespace.
    pub orphan_pods: &'a Index<Pod>,
    /// ControllerRevisions by their controller's uid.
    pub revisions_by_owner: &'a Index<ControllerRevision>,
}

impl<K: Resource<DynamicType = ()>> RevisionedOwner<'_, K> {
    /// Adopts the orphan pods the selector matches, then finds or creates
    /// the revision of the current template. `None` when pods were
    /// adopted: they come back as watch events and another pass.
    pub async fn claim_and_construct_history(self) -> Result<Option<History>, ControllerError> {
        let meta = self.owner.meta();
        let ns = meta.namespace.clone().unwrap_or_default();
        let orphans = ref_manager::orphans(self.orphan_pods, &ns, self.selector);
        if !orphans.is_empty() {
            ref_manager::adopt(self.client, &ns, &orphans, &controller_ref(self.owner)).await?;
            return Ok(None);
        }
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let uid = meta.uid.clone().unwrap_or_default();
        let revisions = sorted(controlled_by(self.revisions_by_owner, &ns, &uid));
        let mut collision_count = self.collision_count.unwrap_or(0);
        let update = NewRevision {
            api: &api,
            owner_name: meta.name.as_deref().unwrap_or_default(),
            owner_ref: controller_ref(self.owner),
            labels: self.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default(),
            hash_label: self.hash_label,
            data: template_patch(self.template),
            revisions: &revisions,
        }
        .ensure(&mut collision_count)
        .await?;
        Ok(Some(History { api, revisions, update, collision_count }))
    }
}

/// An owner's revisions as one sync found them, and the revision of its
/// current template.
pub struct History {
    api: Api<ControllerRevision>,
    /// The owner's revisions, oldest first, as the cache had them.
    pub revisions: Vec<Arc<ControllerRevision>>,
    /// The revision of the owner's current template (found or created).
    pub update: ControllerRevision,
    /// The collisionCount to write back, bumped by any hash collision met.
    pub collision_count: i32,
}

impl History {
    /// The update revision's name.
    pub fn update_name(&self) -> String {
        self.update.metadata.name.clone().unwrap_or_default()
    }

    /// The revision named `name` if the owner has it, else the update revision.
    pub fn named_or_update(&self, name: Option<&String>) -> ControllerRevision {
        name.and_then(|n| self.revisions.iter().find(|r| r.metadata.name.as_ref() == Some(n)))
            .map(|r| (**r).clone())
            .unwrap_or_else(|| self.update.clone())
    }

    /// Upstream's cleanupHistory / truncateHistory: deletes the oldest
    /// revisions beyond `limit` (revisionHistoryLimit, 10 when unset) that
    /// are not `live`.
    pub async fn cleanup(&self, live: &HashSet<String>, limit: Option<i32>) -> Result<(), ControllerError> {
        truncate(&self.api, &self.revisions, live, limit.unwrap_or(10)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_and_change_with_collisions() {
        let d = json!({"spec": {"template": {"metadata": {"labels": {"app": "web"}}}}});
        let a = hash_revision(&d, 0);
        assert_eq!(a, hash_revision(&d, 0));
        assert_ne!(a, hash_revision(&d, 1));
        assert!(a.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        assert_eq!(safe_encode("0123"), "4567");
    }

    #[test]
    fn a_template_patch_is_the_bytes_go_writes() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "httpd", "env": [{"name": "CPU",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}]}}))
        .expect("template");
        let data = template_patch(&template);
        assert_eq!(
            data.to_string(),
            r#"{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null,"labels":{"app":"web"}},"spec":{"containers":[{"env":[{"name":"CPU","valueFrom":{"resourceFieldRef":{"divisor":"0","resource":"limits.cpu"}}}],"image":"httpd","name":"app","resources":{}}]}}}}"#
        );
        // A revision an older ferrok wrote without those fields still holds it.
        let mut old = serde_json::to_value(&template).expect("json");
        old["$patch"] = json!("replace");
        let revision =
            ControllerRevision { data: Some(RawExtension(json!({"spec": {"template": old}}))), ..Default::default() };
        assert!(holds(&revision, &data));
    }
}
