//! What the atomic-writer volumes (configMap, secret, downwardAPI,
//! projected) hold: the payload built from their sources, as upstream's
//! plugins build it in `SetUpAt` and `collectData`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume, VolumeProjection};

use super::allocatable::NodeAllocatable;
use super::atomic_writer::{FileProjection, Payload};
use super::downward_api;
use super::error::SetUpError;
use super::projection::{file_mode, make_payload, SourceData, SourceKind, DEFAULT_MODE};
use super::sources::{SourceKey, SourceWatches};
use super::tokens::{PodTokens, TokenKey, DEFAULT_EXPIRATION_SECONDS};

/// What building a payload needs from the volume manager.
pub struct Context<'a> {
    pub client: &'a kube::Client,
    pub sources: &'a SourceWatches,
    pub allocatable: &'a NodeAllocatable,
    /// How long to wait for a newly followed object's first list.
    pub sync_limit: Duration,
}

/// The ConfigMaps and Secrets `volume` reads.
pub fn referenced_sources(namespace: &str, volume: &Volume) -> Vec<SourceKey> {
    let key = |kind, name: &str| SourceKey { kind, namespace: namespace.to_string(), name: name.to_string() };
    let mut out = Vec::new();
    if let Some(cm) = &volume.config_map {
        out.push(key(SourceKind::ConfigMap, &cm.name));
    }
    if let Some(s) = &volume.secret {
        out.push(key(SourceKind::Secret, s.secret_name.as_deref().unwrap_or_default()));
    }
    for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(cm) = &source.config_map {
            out.push(key(SourceKind::ConfigMap, &cm.name));
        }
        if let Some(s) = &source.secret {
            out.push(key(SourceKind::Secret, &s.name));
        }
    }
    out
}

impl Context<'_> {
    async fn source(&self, pod: &Pod, kind: SourceKind, name: &str) -> Result<Option<Arc<SourceData>>, SetUpError> {
        let key = SourceKey {
            kind,
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: name.to_string(),
        };
        self.sources.get(&key, self.sync_limit).await
    }

    /// A ConfigMap's or Secret's payload; a missing object is an error
    /// unless the source is optional.
    async fn keys(
        &self,
        pod: &Pod,
        kind: SourceKind,
        name: &str,
        items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
        default_mode: i32,
        optional: bool,
    ) -> Result<Payload, SetUpError> {
        let data = self.source(pod, kind, name).await?;
        if data.is_none() && !optional {
            return Err(SetUpError::SourceNotFound { kind: kind.noun(), name: name.to_string() });
        }
        make_payload(kind, items, data.as_deref(), default_mode, optional)
    }

    /// The files `volume` holds now. Tokens come from (and go to) `tokens`;
    /// the keys of the tokens used are added to `used`.
    pub async fn payload(
        &self,
        pod: &Pod,
        volume: &Volume,
        tokens: &mut PodTokens,
        used: &mut Vec<TokenKey>,
    ) -> Result<Payload, SetUpError> {
        if let Some(cm) = &volume.config_map {
            let mode = cm.default_mode.unwrap_or(DEFAULT_MODE);
            let optional = cm.optional.unwrap_or(false);
            return self.keys(pod, SourceKind::ConfigMap, &cm.name, cm.items.as_deref(), mode, optional).await;
        }
        if let Some(s) = &volume.secret {
            let mode = s.default_mode.unwrap_or(DEFAULT_MODE);
            let optional = s.optional.unwrap_or(false);
            let name = s.secret_name.as_deref().unwrap_or_default();
            return self.keys(pod, SourceKind::Secret, name, s.items.as_deref(), mode, optional).await;
        }
        if let Some(d) = &volume.downward_api {
            let mode = d.default_mode.unwrap_or(DEFAULT_MODE);
            return downward_api::collect_data(d.items.as_deref().unwrap_or_default(), pod, self.allocatable, mode);
        }
        if let Some(p) = &volume.projected {
            let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
            let sources = p.sources.as_deref().unwrap_or_default();
            return self.projected(pod, sources, mode, tokens, used).await;
        }
        Err(SetUpError::UnsupportedVolume)
    }

    async fn projected(
        &self,
        pod: &Pod,
        sources: &[VolumeProjection],
        default_mode: i32,
        tokens: &mut PodTokens,
        used: &mut Vec<TokenKey>,
    ) -> Result<Payload, SetUpError> {
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|c| c.fs_group);
        for source in sources {
            let part = if let Some(cm) = &source.config_map {
                let optional = cm.optional.unwrap_or(false);
                self.keys(pod, SourceKind::ConfigMap, &cm.name, cm.items.as_deref(), default_mode, optional).await
            } else if let Some(s) = &source.secret {
                let optional = s.optional.unwrap_or(false);
                self.keys(pod, SourceKind::Secret, &s.name, s.items.as_deref(), default_mode, optional).await
            } else if let Some(d) = &source.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                downward_api::collect_data(items, pod, self.allocatable, default_mode)
            } else if let Some(t) = &source.service_account_token {
                let key = TokenKey {
                    service_account: pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.service_account_name.clone())
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| "default".into()),
                    audience: t.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
                };
                used.push(key.clone());
                // With an fsGroup, ownership widens 0600 to 0640.
                let mode = if fs_group.is_some() { 0o600 } else { file_mode(default_mode) };
                tokens.get(self.client, pod, &key).await.map(|token| {
                    [(t.path.clone(), FileProjection { data: token.into_bytes(), mode })].into_iter().collect()
                })
            } else {
                // clusterTrustBundle and podCertificate are not served.
                Ok(Payload::new())
            };
            match part {
                Ok(files) => payload.extend(files),
                Err(e) => errors.push(e),
            }
        }
        SetUpError::aggregate(errors)?;
        Ok(payload)
    }
}
