//! Pod status to the API (upstream's status_manager): pod workers hand in
//! the status they computed; one writer sends it with a strategic merge
//! patch of `pods/status` when it differs from what the API holds, so the
//! conditions others own (PodScheduled, DisruptionTarget) stay. Writes are
//! coalesced per pod (only the newest status is sent) and never block a
//! worker. The final delete of a terminated pod goes through here too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

use crate::sync::LockExt;

/// Conditions the kubelet owns; only these are sent.
const OWN_CONDITIONS: [&str; 4] = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"];
/// Status writes in flight at once.
const PARALLEL_WRITES: usize = 8;

struct Entry {
    namespace: String,
    name: String,
    /// The status to write (JSON, our conditions only).
    wanted: Value,
    /// What the API held after our last write (or when we first saw it).
    written: Option<Value>,
}

#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    entries: Mutex<HashMap<String, Entry>>,
    tx: mpsc::UnboundedSender<String>,
    /// Woken after every write, for tests of quiescence and for shutdown.
    idle: Notify,
}

/// The DisruptionTarget condition of a pod this node evicted (others' stay theirs).
fn by_kubelet(c: &Value) -> bool {
    c.get("type").and_then(Value::as_str) == Some("DisruptionTarget")
        && c.get("reason").and_then(Value::as_str) == Some("TerminationByKubelet")
}

/// The part of a status the kubelet writes, as JSON, in a stable form.
fn ours(status: &PodStatus) -> Value {
    let mut v = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        conds.retain(|c| {
            c.get("type").and_then(Value::as_str).is_some_and(|t| OWN_CONDITIONS.contains(&t)) || by_kubelet(c)
        });
    }
    v
}

/// The status as a strategic merge patch: a condition's reason and message
/// that are no longer there are sent as null, so the API drops the old ones
/// (conditions are merged by type, not replaced).
fn with_deletions(wanted: &Value) -> Value {
    let mut v = wanted.clone();
    if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conds {
            if let Some(m) = c.as_object_mut() {
                for key in ["reason", "message"] {
                    m.entry(key).or_insert(Value::Null);
                }
            }
        }
    }
    v
}

/// Whether `current` (the API's status) already says what `wanted` says.
fn satisfied(current: &Value, wanted: &Value) -> bool {
    let Some(w) = wanted.as_object() else { return false };
    w.iter().all(|(k, v)| {
        let cur = current.get(k).unwrap_or(&Value::Null);
        if k == "conditions" {
            let list = |x: &Value| x.as_array().cloned().unwrap_or_default();
            return list(v).iter().all(|c| list(cur).contains(c));
        }
        cur == v
    })
}

impl StatusManager {
    pub fn start(client: kube::Client) -> StatusManager {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner { client, entries: Mutex::new(HashMap::new()), tx, idle: Notify::new() });
        tokio::spawn(writer(inner.clone(), rx));
        StatusManager { inner }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.entries.locked()
    }

    /// Hands in the status of `pod` (keyed by the API object's uid).
    pub fn set(&self, pod: &Pod, status: &PodStatus) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let wanted = ours(status);
        let current = pod.status.as_ref().map(ours);
        let mut entries = self.entries();
        let entry = entries.entry(uid.clone()).or_insert_with(|| Entry {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            wanted: Value::Null,
            written: current.clone(),
        });
        if entry.wanted == wanted {
            return;
        }
        entry.wanted = wanted.clone();
        let known = entry.written.as_ref().or(current.as_ref());
        if known.is_some_and(|k| satisfied(k, &wanted)) {
            return;
        }
        drop(entries);
        let _ = self.inner.tx.send(uid);
    }

    /// Forgets a pod that is gone.
    pub fn forget(&self, uid: &str) {
        self.entries().remove(uid);
    }

    /// Deletes a terminated pod's API object for good (grace 0, only this uid).
    pub async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

async fn writer(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<String>) {
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_WRITES));
    // Pods with a write in flight, and whether a newer status came in
    // meanwhile: that pod is written again when the write ends. Both are
    // decided under one lock, so no status handed in is left unwritten.
    let busy: Arc<Mutex<HashMap<String, bool>>> = Arc::new(Mutex::new(HashMap::new()));
    let (retry_tx, mut retry_rx) = mpsc::unbounded_channel::<String>();
    loop {
        let uid = tokio::select! {
            Some(uid) = rx.recv() => uid,
            Some(uid) = retry_rx.recv() => uid,
            else => return,
        };
        {
            let mut b = busy.locked();
            if let Some(pending) = b.get_mut(&uid) {
                *pending = true;
                continue;
            }
            b.insert(uid.clone(), false);
        }
        let Ok(permit) = limit.clone().acquire_owned().await else { return };
        let inner = inner.clone();
        let busy = busy.clone();
        let retry = retry_tx.clone();
        tokio::spawn(async move {
            let mut again = write_one(&inner, &uid).await;
            if busy.locked().remove(&uid) == Some(true) {
                again = Some(again.unwrap_or(Duration::ZERO));
            }
            drop(permit);
            inner.idle.notify_waiters();
            if let Some(delay) = again {
                tokio::time::sleep(delay).await;
                let _ = retry.send(uid);
            }
        });
    }
}

/// Writes the newest status of one pod; Some(delay) asks for another try.
async fn write_one(inner: &Inner, uid: &str) -> Option<Duration> {
    let (namespace, name, wanted) = {
        let entries = inner.entries.locked();
        let e = entries.get(uid)?;
        if e.written.as_ref().is_some_and(|w| satisfied(w, &e.wanted)) {
            return None;
        }
        (e.namespace.clone(), e.name.clone(), e.wanted.clone())
    };
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &namespace);
    let patch = json!({"metadata": {"uid": uid}, "status": with_deletions(&wanted)});
    match api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        Ok(pod) => {
            let mut entries = inner.entries.locked();
            if let Some(e) = entries.get_mut(uid) {
                e.written = pod.status.as_ref().map(ours);
                // A newer status arrived while writing: go again.
                if !e.written.as_ref().is_some_and(|w| satisfied(w, &e.wanted)) {
                    return Some(Duration::ZERO);
                }
            }
            None
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {
            inner.entries.locked().remove(uid);
            None
        }
        Err(e) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "cannot write pod status; retrying");
            Some(Duration::from_secs(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubelet_conditions_are_sent_and_compared() {
        let status: PodStatus = serde_json::from_value(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]
        }))
        .unwrap();
        let v = ours(&status);
        assert_eq!(v["conditions"].as_array().unwrap().len(), 1);
        let api = json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]});
        assert!(satisfied(&api, &v));
        let api = json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "True"}]});
        assert!(!satisfied(&api, &v));
    }

    #[test]
    fn the_kubelets_own_disruption_target_is_sent() {
        let status: PodStatus = serde_json::from_value(json!({"conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
            {"type": "Ready", "status": "False"}]}))
        .unwrap();
        assert_eq!(ours(&status)["conditions"].as_array().unwrap().len(), 2);
        let theirs: PodStatus = serde_json::from_value(json!({"conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}))
        .unwrap();
        assert!(ours(&theirs)["conditions"].as_array().unwrap().is_empty());
    }

    #[test]
    fn stale_condition_reasons_are_deleted() {
        let wanted = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let patch = with_deletions(&wanted);
        assert_eq!(patch["conditions"][0]["reason"], Value::Null);
        assert!(patch["conditions"][0].as_object().unwrap().contains_key("message"));
    }
}
