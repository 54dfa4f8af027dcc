//! What each manifest file made, remembered in the ConfigMap
//! `kube-system/ferrok-manifests-<server>` (k3s keeps an `Addon` object per
//! file; one record per server, so that servers sharing a datastore never
//! delete what another server's folder holds):
//! a key per file holding the file's name, the checksum of the content
//! last applied in full, and the objects it made, so that objects dropped
//! from a file, and every object of a removed file, can be deleted, even
//! across restarts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::manifest::ObjectId;

pub const NAMESPACE: &str = "kube-system";

/// The record's name for a server (by its node name).
pub fn name(server: &str) -> String {
    format!("ferrok-manifests-{server}")
}

/// One file's record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub file: String,
    /// sha256 of the content last applied without error ("" after a failure).
    #[serde(default)]
    pub checksum: String,
    #[serde(default)]
    pub objects: Vec<ObjectId>,
}

/// A ConfigMap key for a file name (keys allow `[-._a-zA-Z0-9]`).
pub fn key(file: &str) -> String {
    file.chars().map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '_' }).collect()
}

/// The records by file name, and the ConfigMap (for Events), made if missing.
pub async fn load(client: &kube::Client, name: &str) -> Result<(ConfigMap, BTreeMap<String, FileRecord>), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let cm = match api.get_opt(name).await? {
        Some(cm) => cm,
        None => {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name.into());
            cm.metadata.labels = Some([("app.kubernetes.io/managed-by".to_string(), "ferrok".to_string())].into());
            match api.create(&PostParams::default(), &cm).await {
                Ok(cm) => cm,
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(name).await?,
                Err(e) => return Err(e),
            }
        }
    };
    let mut out = BTreeMap::new();
    for (k, v) in cm.data.iter().flatten() {
        match serde_json::from_str::<FileRecord>(v) {
            Ok(r) => {
                out.insert(r.file.clone(), r);
            }
            Err(e) => {
                tracing::warn!(key = %k, error = %e, "unreadable record of the manifests folder; ignored")
            }
        }
    }
    Ok((cm, out))
}

/// Writes (or, with `None`, forgets) one file's record; other keys stay.
pub async fn store(
    client: &kube::Client,
    name: &str,
    file: &str,
    record: Option<&FileRecord>,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let value = match record {
        Some(r) => json!(serde_json::to_string(r).unwrap_or_default()),
        None => serde_json::Value::Null,
    };
    let patch = json!({"data": {key(file): value}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_configmap_keys() {
        assert_eq!(key("local-storage.yaml"), "local-storage.yaml");
        assert_eq!(key("my app (1).yaml"), "my_app__1_.yaml");
    }
}
