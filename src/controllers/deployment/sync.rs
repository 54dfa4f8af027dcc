//! Finding a Deployment's ReplicaSets (adopting orphans, releasing those
//! its selector no longer matches), finding or creating the new one with
//! its pod-template-hash, scaling ReplicaSets with ScalingReplicaSet events,
//! and proportional scaling while a rollout is in flight or paused.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::history::{
    max_revision, replicas_annotations_need_update, set_deployment_revision, set_new_replicaset_annotations,
    set_replicas_annotations,
};
use super::progress::{get_condition, new_condition, set_condition, PROGRESSING};
use super::util::{
    annotation, available_replicas, by_creation, by_size_newer, by_size_older, compute_hash, equal_ignore_hash,
    is_paused, is_rolling, max_surge, progress_deadline, replica_count, replicas, round_half_away, rs_replicas,
    template_of, DESIRED_REPLICAS, MAX_REPLICAS, POD_TEMPLATE_HASH, REVISION,
};
use super::DeploymentSync;
use crate::client::events::EventType;
use crate::client::labels;
use crate::controllers::controller_utils::ignore_not_found;
use crate::controllers::controller_utils::{controller_of, controller_ref, is_controlled_by};
use crate::controllers::informers::controlled_by;
use crate::controllers::replicaset::error_message;
use crate::controllers::ControllerError;

/// The oldest ReplicaSet whose template is the Deployment's.
pub fn find_new_replicaset<'a>(d: &Deployment, rss: &'a [ReplicaSet]) -> Option<&'a ReplicaSet> {
    let template = d.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let mut sorted: Vec<&ReplicaSet> = rss.iter().collect();
    sorted.sort_by(|a, b| by_creation(a, b));
    sorted.into_iter().find(|rs| equal_ignore_hash(&template_of(rs), &template))
}

/// ReplicaSets with replicas.
pub fn active<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> Vec<&'a ReplicaSet> {
    rss.into_iter().filter(|rs| rs_replicas(rs) > 0).collect()
}

fn annotated(rs: &ReplicaSet, key: &str) -> Option<i32> {
    annotation(rs, key).and_then(|v| v.parse().ok())
}

/// The new ReplicaSet has all replicas, as desired, all available.
fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    rs.is_some_and(|rs| {
        rs_replicas(rs) == replicas(d)
            && annotated(rs, DESIRED_REPLICAS) == Some(replicas(d))
            && available_replicas(rs) == replicas(d)
    })
}

/// How many replicas `rs` gains or loses when the Deployment grows by
/// `to_add` (upstream's GetProportion).
fn proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = if replicas(d) == 0 {
        -rs_replicas(rs)
    } else {
        let deployment_replicas = replicas(d) + max_surge(d);
        let annotated_replicas =
            annotated(rs, MAX_REPLICAS).unwrap_or_else(|| d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
        if annotated_replicas == 0 {
            0
        } else {
            let size = f64::from(rs_replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated_replicas);
            round_half_away(size) - rs_replicas(rs)
        }
    };
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

impl DeploymentSync<'_> {
    /// The Deployment's ReplicaSets in its namespace, after adopting
    /// matching orphans and releasing owned ones that no longer match.
    pub(super) async fn claim_replicasets(&self) -> Result<Vec<ReplicaSet>, ControllerError> {
        let ns = self.namespace();
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let selector = self.d.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
        let deleting = self.d.metadata.deletion_timestamp.is_some();
        let api = self.replicasets_api();
        let mut can_adopt: Option<bool> = None;
        let mut owned = Vec::new();
        // Its own ReplicaSets, and the orphans of its namespace it may adopt.
        let candidates: Vec<_> = controlled_by(&self.ctx.replicasets_by_owner, &ns, &uid)
            .into_iter()
            .chain(self.ctx.orphan_replicasets.get(&ns))
            .collect();
        for rs in &candidates {
            let name = rs.metadata.name.clone().unwrap_or_default();
            let matches = labels::matches(&selector, rs.metadata.labels.as_ref());
            match controller_of(&rs.metadata) {
                Some(c) if c.uid == uid => {
                    if matches {
                        owned.push((**rs).clone());
                    } else if !deleting {
                        let rest: Vec<_> =
                            rs.metadata.owner_references.iter().flatten().filter(|o| o.uid != uid).collect();
                        let rest = if rest.is_empty() { serde_json::Value::Null } else { serde_json::json!(rest) };
                        let patch = serde_json::json!({"metadata": {"ownerReferences": rest}});
                        ignore_not_found(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await)?;
                    }
                }
                Some(_) => {}
                None if matches && !deleting && rs.metadata.deletion_timestamp.is_none() => {
                    if can_adopt.is_none() {
                        let deployments: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), &ns);
                        let fresh = deployments.get_opt(&self.name()).await?;
                        can_adopt = Some(fresh.is_some_and(|f| {
                            f.metadata.uid == self.d.metadata.uid && f.metadata.deletion_timestamp.is_none()
                        }));
                    }
                    if can_adopt != Some(true) {
                        continue;
                    }
                    let mut refs = rs.metadata.owner_references.clone().unwrap_or_default();
                    refs.push(controller_ref(&self.d));
                    let patch = serde_json::json!({"metadata": {"ownerReferences": refs}});
                    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                        Ok(adopted) => owned.push(adopted),
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                None => {}
            }
        }
        Ok(owned)
    }

    /// The new ReplicaSet (created when `create` and missing) and the old
    /// ones, with revisions brought up to date.
    pub(super) async fn get_all_replicasets_and_sync_revision(
        &mut self,
        rss: &[ReplicaSet],
        create: bool,
    ) -> Result<(Option<ReplicaSet>, Vec<ReplicaSet>), ControllerError> {
        let new_uid = find_new_replicaset(&self.d, rss).and_then(|rs| rs.metadata.uid.clone());
        let old: Vec<ReplicaSet> =
            rss.iter().filter(|rs| rs.metadata.uid != new_uid || new_uid.is_none()).cloned().collect();
        let new_rs = self.get_new_replicaset(rss, &old, create).await?;
        Ok((new_rs, old))
    }

    async fn get_new_replicaset(
        &mut self,
        rss: &[ReplicaSet],
        old: &[ReplicaSet],
        create: bool,
    ) -> Result<Option<ReplicaSet>, ControllerError> {
        let new_revision = max_revision(old) + 1;
        if let Some(existing) = find_new_replicaset(&self.d, rss) {
            let mut rs = existing.clone();
            let annotations_updated = set_new_replicaset_annotations(&self.d, &mut rs, new_revision, true);
            let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
            let spec = rs.spec.get_or_insert_with(Default::default);
            let min_ready_updated = spec.min_ready_seconds.unwrap_or(0) != min_ready.unwrap_or(0);
            if annotations_updated || min_ready_updated {
                spec.min_ready_seconds = min_ready;
                rs = self.update_replicaset(&rs).await?;
            }
            let revision = annotation(&rs, REVISION).unwrap_or_default().to_string();
            let mut needs_update = set_deployment_revision(&mut self.d, &revision);
            let has_deadline = progress_deadline(&self.d).is_some();
            let status = self.d.status.get_or_insert_with(Default::default);
            if has_deadline && get_condition(status, PROGRESSING).is_none() {
                let msg = format!("Found new replica set {:?}", rs.metadata.name.as_deref().unwrap_or_default());
                set_condition(status, new_condition(PROGRESSING, "True", "FoundNewReplicaSet", msg));
                needs_update = true;
            }
            if needs_update {
                self.update_status().await?;
            }
            return Ok(Some(rs));
        }
        if !create {
            return Ok(None);
        }
        self.create_new_replicaset(old, new_revision).await.map(Some)
    }

    async fn create_new_replicaset(
        &mut self,
        old: &[ReplicaSet],
        new_revision: i64,
    ) -> Result<ReplicaSet, ControllerError> {
        let d = &self.d;
        let spec = d.spec.clone().unwrap_or_default();
        let collision_count = d.status.as_ref().and_then(|s| s.collision_count);
        let hash = compute_hash(&spec.template, collision_count);
        let mut template = spec.template.clone();
        let template_labels =
            template.metadata.get_or_insert_with(Default::default).labels.get_or_insert_with(BTreeMap::new);
        template_labels.insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let labels = template_labels.clone();
        let mut selector = spec.selector.clone();
        selector.match_labels.get_or_insert_with(BTreeMap::new).insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let rs_name = format!("{}-{hash}", self.name());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(rs_name.clone()),
                namespace: Some(self.namespace()),
                owner_references: Some(vec![controller_ref(d)]),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let mut all: Vec<ReplicaSet> = old.to_vec();
        all.push(rs.clone());
        let new_replicas = new_rs_new_replicas(d, &all, &rs);
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(new_replicas);
        }
        set_new_replicaset_annotations(d, &mut rs, new_revision, false);
        let api = self.replicasets_api();
        let (created, already_exists) = match api.create(&PostParams::default(), &rs).await {
            Ok(created) => (created, false),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(&rs_name).await?;
                let uid = d.metadata.uid.as_deref().unwrap_or_default();
                let template = spec.template.clone();
                if is_controlled_by(&existing.metadata, uid) && equal_ignore_hash(&template_of(&existing), &template) {
                    (existing, true)
                } else {
                    // A hash collision: try again with another hash.
                    let status = self.d.status.get_or_insert_with(Default::default);
                    status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                    self.update_status().await?;
                    return Err(ControllerError::Invalid(format!(
                        "replica set {rs_name:?} already exists with another template; collision count raised"
                    )));
                }
            }
            Err(e) => {
                let message = format!("Failed to create new replica set {rs_name:?}: {}", error_message(&e));
                if progress_deadline(&self.d).is_some() {
                    let status = self.d.status.get_or_insert_with(Default::default);
                    set_condition(
                        status,
                        new_condition(PROGRESSING, "False", "ReplicaSetCreateError", message.clone()),
                    );
                    self.update_status().await?;
                }
                self.event(EventType::Warning, "FailedCreate", &message);
                return Err(e.into());
            }
        };
        if !already_exists && new_replicas > 0 {
            self.event(
                EventType::Normal,
                "ScalingReplicaSet",
                &format!("Scaled up replica set {rs_name} from 0 to {new_replicas}"),
            );
        }
        let mut needs_update = set_deployment_revision(&mut self.d, &new_revision.to_string());
        if !already_exists && progress_deadline(&self.d).is_some() {
            let status = self.d.status.get_or_insert_with(Default::default);
            let msg = format!("Created new replica set {rs_name:?}");
            set_condition(status, new_condition(PROGRESSING, "True", "NewReplicaSetCreated", msg));
            needs_update = true;
        }
        if needs_update {
            self.update_status().await?;
        }
        Ok(created)
    }

    /// Scales `rs` to `new_scale` with a ScalingReplicaSet event; the
    /// ReplicaSet as written when it changed.
    pub(super) async fn scale_replicaset_and_record_event(
        &self,
        rs: &ReplicaSet,
        new_scale: i32,
    ) -> Result<Option<ReplicaSet>, ControllerError> {
        if rs_replicas(rs) == new_scale {
            return Ok(None);
        }
        let operation = if rs_replicas(rs) < new_scale { "up" } else { "down" };
        self.scale_replicaset(rs, new_scale, operation).await
    }

    async fn scale_replicaset(
        &self,
        rs: &ReplicaSet,
        new_scale: i32,
        operation: &str,
    ) -> Result<Option<ReplicaSet>, ControllerError> {
        let size_changes = rs_replicas(rs) != new_scale;
        let (desired, max) = (replicas(&self.d), replicas(&self.d) + max_surge(&self.d));
        if !size_changes && !replicas_annotations_need_update(rs, desired, max) {
            return Ok(None);
        }
        let mut copy = rs.clone();
        copy.spec.get_or_insert_with(Default::default).replicas = Some(new_scale);
        set_replicas_annotations(&mut copy, desired, max);
        let updated = self.update_replicaset(&copy).await?;
        if size_changes {
            let name = rs.metadata.name.as_deref().unwrap_or_default();
            let from = rs_replicas(rs);
            self.event(
                EventType::Normal,
                "ScalingReplicaSet",
                &format!("Scaled {operation} replica set {name} from {from} to {new_scale}"),
            );
        }
        Ok(Some(updated))
    }

    /// Brings the ReplicaSets to the Deployment's size: the only active (or
    /// latest) one directly, otherwise proportionally to their sizes.
    async fn scale(&self, new_rs: Option<&ReplicaSet>, old: &[ReplicaSet]) -> Result<(), ControllerError> {
        let d = &self.d;
        if let Some(rs) = find_active_or_latest(new_rs, old) {
            if rs_replicas(rs) != replicas(d) {
                self.scale_replicaset_and_record_event(rs, replicas(d)).await?;
            }
            return Ok(());
        }
        if is_saturated(d, new_rs) {
            for rs in active(old) {
                self.scale_replicaset_and_record_event(rs, 0).await?;
            }
            return Ok(());
        }
        if !is_rolling(d) {
            return Ok(());
        }
        let mut all: Vec<&ReplicaSet> = active(old.iter().chain(new_rs));
        let allowed = if replicas(d) > 0 { replicas(d) + max_surge(d) } else { 0 };
        let to_add = allowed - replica_count(all.iter().copied());
        let operation = match to_add {
            n if n > 0 => {
                all.sort_by(|a, b| by_size_newer(a, b));
                "up"
            }
            n if n < 0 => {
                all.sort_by(|a, b| by_size_older(a, b));
                "down"
            }
            _ => "",
        };
        let mut added = 0;
        let mut sizes: Vec<i32> = Vec::with_capacity(all.len());
        for rs in &all {
            let p = proportion(rs, d, to_add, added);
            sizes.push(rs_replicas(rs) + p);
            added += p;
        }
        if let Some(first) = sizes.first_mut() {
            if to_add != 0 {
                *first = (*first + to_add - added).max(0);
            }
        }
        for (rs, size) in all.iter().zip(sizes) {
            self.scale_replicaset(rs, size, operation).await?;
        }
        Ok(())
    }

    /// A paused Deployment or a scaling event: scale, clean up, status.
    pub(super) async fn sync(&mut self, rss: &[ReplicaSet]) -> Result<(), ControllerError> {
        let (new_rs, old) = self.get_all_replicasets_and_sync_revision(rss, false).await?;
        self.scale(new_rs.as_ref(), &old).await?;
        if is_paused(&self.d) {
            self.cleanup_deployment(&old).await?;
        }
        let mut all = old;
        all.extend(new_rs.clone());
        self.sync_deployment_status(&all, new_rs.as_ref()).await
    }

    pub(super) async fn sync_status_only(&mut self, rss: &[ReplicaSet]) -> Result<(), ControllerError> {
        let (new_rs, old) = self.get_all_replicasets_and_sync_revision(rss, false).await?;
        let mut all = old;
        all.extend(new_rs.clone());
        self.sync_deployment_status(&all, new_rs.as_ref()).await
    }

    /// Whether an active ReplicaSet was sized for another replica count.
    /// (Upstream syncs revisions here too; that is left to the sync that
    /// follows, so that the ReplicaSets in hand stay current.)
    pub(super) fn is_scaling_event(&self, rss: &[ReplicaSet]) -> bool {
        let want = replicas(&self.d);
        active(rss).into_iter().filter_map(|rs| annotated(rs, DESIRED_REPLICAS)).any(|desired| desired != want)
    }
}

/// The only active ReplicaSet, or with none active the new one or else the
/// newest old one; None while several are active.
fn find_active_or_latest<'a>(new_rs: Option<&'a ReplicaSet>, old: &'a [ReplicaSet]) -> Option<&'a ReplicaSet> {
    if new_rs.is_none() && old.is_empty() {
        return None;
    }
    let mut newest_first: Vec<&ReplicaSet> = old.iter().collect();
    newest_first.sort_by(|a, b| by_creation(b, a));
    let all = active(newest_first.iter().copied().chain(new_rs));
    match all.len() {
        0 => new_rs.or_else(|| newest_first.first().copied()),
        1 => all.first().copied(),
        _ => None,
    }
}

/// How many replicas the new ReplicaSet may have now (upstream's NewRSNewReplicas).
pub fn new_rs_new_replicas(d: &Deployment, all: &[ReplicaSet], new_rs: &ReplicaSet) -> i32 {
    if !is_rolling(d) {
        return replicas(d);
    }
    let current = replica_count(all);
    let max_total = replicas(d) + max_surge(d);
    if current >= max_total {
        return rs_replicas(new_rs);
    }
    let scale_up = (max_total - current).min(replicas(d) - rs_replicas(new_rs));
    rs_replicas(new_rs) + scale_up
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(name: &str, replicas: i32, max: i32, created: i64) -> ReplicaSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {MAX_REPLICAS: max.to_string()},
                         "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()},
            "spec": {"replicas": replicas, "selector": {}}
        }))
        .unwrap()
    }

    fn deployment(replicas: i32) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "spec": {"replicas": replicas, "selector": {}, "template": {},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}}}
        }))
        .unwrap()
    }

    #[test]
    fn proportions_follow_upstream() {
        // 10 → 15 replicas with maxSurge 3 while old has 8 and new 5 (max 13).
        let d = deployment(15);
        let old = rs("old", 8, 13, 1);
        let new = rs("new", 5, 13, 2);
        let to_add = 18 - 13;
        let p_old = proportion(&old, &d, to_add, 0);
        assert_eq!(p_old, 3); // round(8 * 18 / 13) - 8 = 11 - 8
        let p_new = proportion(&new, &d, to_add, p_old);
        assert_eq!(p_new, 2); // min(round(5 * 18 / 13) - 5 = 2, 5 - 3)
        assert_eq!(proportion(&new, &deployment(0), -5, 0), -5);
    }

    #[test]
    fn new_replicas_respect_surge() {
        let d = deployment(10);
        let old = rs("old", 10, 13, 1);
        let new = rs("new", 0, 13, 2);
        assert_eq!(new_rs_new_replicas(&d, &[old.clone(), new.clone()], &new), 3);
        let new = rs("new", 3, 13, 2);
        assert_eq!(new_rs_new_replicas(&d, &[old, new.clone()], &new), 3);
    }
}
