//! Auto-deployed manifests (k3s' deploy controller and its AddOns): the
//! YAML and JSON files in `<data-dir>/server/manifests/` are applied at
//! start and whenever they change, by server-side apply under the field
//! manager `ferrok-deploy`;
//! objects dropped from a file, and every object of a removed file, are
//! deleted; a `<file>.skip` beside a file leaves it alone (nothing applied
//! or deleted). Files are applied in name order. The folder is watched
//! with inotify, changes debounced; a file that fails to parse or apply
//! gets a Warning Event (on `kube-system/ferrok-manifests-<server>`, the
//! record of what each file made) and a log line naming it, and the other files
//! still apply. Apply failures are retried with back-off.
//! It runs on every server, acting with the server's own rights.

pub mod manifest;
pub mod packaged;
pub mod record;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, Scope};
use serde_json::Value;
use sha2::Digest;

use crate::client::events::{EventRecorder, EventType};
use crate::host::dir_watch::DirWatch;
use manifest::{Entry, ObjectId};
use record::FileRecord;

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "ferrok-deploy";
/// Changes closer together than this are applied together.
const DEBOUNCE: Duration = Duration::from_millis(200);
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(120);

/// Runs until aborted: applies `dir` at start, then on every change.
/// `server` (this server's node name) names its record.
pub async fn run(client: kube::Client, dir: PathBuf, server: &str) {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the manifests folder");
    }
    let mut watch = match DirWatch::any_change(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the manifests folder; applied at start only");
            None
        }
    };
    let mut deployer = Deployer {
        recorder: EventRecorder::new(client.clone(), FIELD_MANAGER),
        client,
        dir,
        record: record::name(server),
        first: true,
        reported: HashMap::new(),
    };
    let mut backoff = RETRY_FIRST;
    loop {
        let retry = match deployer.sync().await {
            Ok(false) => {
                backoff = RETRY_FIRST;
                None
            }
            Ok(true) => Some(backoff),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the manifests' record; retrying");
                Some(backoff)
            }
        };
        if retry.is_some() {
            backoff = crate::backoff::doubled(backoff, RETRY_MAX);
        }
        let changed = async {
            match watch.as_mut() {
                Some(w) => {
                    if let Err(e) = w.next().await {
                        tracing::warn!(error = %e, "watching the manifests folder failed");
                        std::future::pending::<()>().await;
                    }
                    // Debounce: wait until the folder is quiet.
                    while let Ok(Ok(_)) = tokio::time::timeout(DEBOUNCE, w.next()).await {}
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(retry.unwrap_or(Duration::MAX / 4)), if retry.is_some() => {}
        }
    }
}

/// What a sync may fail with as a whole (one file's failure is its own).
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("the manifests folder: {0}")]
    Folder(#[from] std::io::Error),
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

struct Deployer {
    client: kube::Client,
    dir: PathBuf,
    /// The record's ConfigMap.
    record: String,
    recorder: EventRecorder,
    /// At start every file is applied again (objects deleted by hand come back).
    first: bool,
    /// Files already reported unparsable, by checksum (reported once per content).
    reported: HashMap<String, String>,
}

/// Why one object of a file was not applied (an Event quotes it).
#[derive(Debug, Clone, thiserror::Error)]
enum ApplyError {
    #[error("the server does not serve {api_version} {kind}")]
    NotServed { api_version: String, kind: String, source: Arc<kube::Error> },
    /// The server refused the apply: its Status message, else the error.
    #[error("{}", match .0.as_ref() { kube::Error::Api(e) => e.message.clone(), other => other.to_string() })]
    Refused(#[source] Arc<kube::Error>),
}

type Resolved = HashMap<(String, String, String), Result<(ApiResource, ApiCapabilities), ApplyError>>;

impl Deployer {
    /// Applies what changed and deletes what went; `Ok(true)` asks for a retry.
    async fn sync(&mut self) -> Result<bool, DeployError> {
        let dir = self.dir.clone();
        let entries = tokio::task::spawn_blocking(move || manifest::scan(&dir))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
        let (cm, records) = record::load(&self.client, &self.record).await?;
        let mut resolved = Resolved::new();
        let mut wanted: Vec<ObjectId> = Vec::new();
        let mut written: Vec<(String, FileRecord, Vec<ObjectId>)> = Vec::new();
        let mut retry = false;
        for (file, entry) in &entries {
            let old =
                records.get(file).cloned().unwrap_or_else(|| FileRecord { file: file.clone(), ..Default::default() });
            let content = match entry {
                Ok(Entry::File(c)) => c,
                Ok(Entry::Skipped) => {
                    wanted.extend(old.objects);
                    continue;
                }
                Err(e) => {
                    self.warn(&cm, file, &e.to_string());
                    wanted.extend(old.objects);
                    continue;
                }
            };
            let sum = format!("{:x}", sha2::Sha256::digest(content));
            if (!self.first && old.checksum == sum) || self.reported.get(file) == Some(&sum) {
                wanted.extend(old.objects);
                continue;
            }
            let objects = match manifest::parse(file, content) {
                Ok(o) => o,
                Err(e) => {
                    self.warn(&cm, file, &e.to_string());
                    self.reported.insert(file.clone(), sum);
                    wanted.extend(old.objects);
                    continue;
                }
            };
            self.reported.remove(file);
            let mut applied = Vec::new();
            let mut errors = Vec::new();
            for obj in objects {
                match self.apply(&mut resolved, obj).await {
                    Ok(id) => applied.push(id),
                    Err((id, e)) => errors.push(format!("{id}: {e}")),
                }
            }
            let new = if errors.is_empty() {
                tracing::info!(file = %file, objects = applied.len(), "manifest applied");
                self.recorder.publish(&cm, EventType::Normal, "AppliedManifest", &format!("Applied manifest {file}"));
                FileRecord { file: file.clone(), checksum: sum, objects: applied }
            } else {
                retry = true;
                self.warn(&cm, file, &errors.join("; "));
                // Nothing of the old set is pruned while the new one is incomplete.
                let mut objects = applied;
                for o in &old.objects {
                    if !objects.iter().any(|a| a.same_object(o)) {
                        objects.push(o.clone());
                    }
                }
                FileRecord { file: file.clone(), checksum: String::new(), objects }
            };
            wanted.extend(new.objects.iter().cloned());
            written.push((file.clone(), new, old.objects));
        }
        // Pruning comes after every apply, so an object that moved to
        // another file is not deleted.
        for (file, new, old) in written {
            for o in old.iter().filter(|o| !wanted.iter().any(|w| w.same_object(o))) {
                retry |= !self.delete(&mut resolved, o, &file).await;
            }
            if records.get(&file) != Some(&new) {
                record::store(&self.client, &self.record, &file, Some(&new)).await?;
            }
        }
        for (file, old) in records.iter().filter(|(f, _)| !entries.contains_key(*f)) {
            let mut all_gone = true;
            for o in old.objects.iter().filter(|o| !wanted.iter().any(|w| w.same_object(o))) {
                all_gone &= self.delete(&mut resolved, o, file).await;
            }
            if all_gone {
                tracing::info!(file = %file, objects = old.objects.len(), "manifest removed; its objects deleted");
                record::store(&self.client, &self.record, file, None).await?;
            } else {
                retry = true;
            }
        }
        self.first = false;
        Ok(retry)
    }

    fn warn(&self, cm: &ConfigMap, file: &str, message: &str) {
        let path = self.dir.join(file);
        tracing::warn!(file = %path.display(), error = %message, "cannot apply manifest");
        self.recorder.publish(
            cm,
            EventType::Warning,
            "ApplyManifestFailed",
            &format!("Failed to apply manifest {}: {message}", path.display()),
        );
    }

    async fn resolve(
        &self,
        resolved: &mut Resolved,
        id: &ObjectId,
    ) -> Result<(ApiResource, ApiCapabilities), ApplyError> {
        let key = (id.group().to_string(), id.version().to_string(), id.kind.clone());
        if let Some(r) = resolved.get(&key) {
            return r.clone();
        }
        let gvk = GroupVersionKind::gvk(id.group(), id.version(), &id.kind);
        let r = kube::discovery::pinned_kind(&self.client, &gvk).await.map_err(|e| ApplyError::NotServed {
            api_version: id.api_version.clone(),
            kind: id.kind.clone(),
            source: Arc::new(e),
        });
        resolved.insert(key, r.clone());
        r
    }

    fn api(&self, ar: &ApiResource, caps: &ApiCapabilities, namespace: &str) -> Api<DynamicObject> {
        match caps.scope {
            Scope::Namespaced => Api::namespaced_with(self.client.clone(), namespace, ar),
            Scope::Cluster => Api::all_with(self.client.clone(), ar),
        }
    }

    /// Server-side apply of one object, forced (the file wins).
    async fn apply(&self, resolved: &mut Resolved, mut obj: Value) -> Result<ObjectId, (ObjectId, ApplyError)> {
        let mut id = manifest::id_of(&obj);
        let (ar, caps) = match self.resolve(resolved, &id).await {
            Ok(r) => r,
            Err(e) => return Err((id, e)),
        };
        match caps.scope {
            Scope::Namespaced if id.namespace.is_empty() => id.namespace = "default".into(),
            Scope::Namespaced => {}
            Scope::Cluster => id.namespace.clear(),
        }
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            match id.namespace.as_str() {
                "" => meta.remove("namespace"),
                ns => meta.insert("namespace".into(), Value::String(ns.into())),
            };
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self.api(&ar, &caps, &id.namespace).patch(&id.name, &params, &Patch::Apply(&obj)).await {
            Ok(_) => Ok(id),
            Err(e) => Err((id, ApplyError::Refused(Arc::new(e)))),
        }
    }

    /// Deletes an object a file no longer has; false when it must be tried again.
    async fn delete(&self, resolved: &mut Resolved, id: &ObjectId, file: &str) -> bool {
        let (ar, caps) = match self.resolve(resolved, id).await {
            Ok(r) => r,
            // Its kind is gone (a CRD removed): so is the object.
            Err(_) => return true,
        };
        match self.api(&ar, &caps, &id.namespace).delete(&id.name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(file = %file, object = %id, "deleted: no longer in its manifest");
                true
            }
            Err(kube::Error::Api(e)) if e.code == 404 => true,
            Err(e) => {
                tracing::warn!(file = %file, object = %id, error = %e, "cannot delete an object its manifest dropped");
                false
            }
        }
    }
}

/// `<data-dir>/server/manifests`.
pub fn manifests_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("manifests")
}
