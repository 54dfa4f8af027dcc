//! The scale target of an autoscaler, reached through its `scale`
//! subresource whatever its kind (upstream's RESTMapper and scale client):
//! the target's group and kind are mapped to resources through discovery
//! (built-in kinds and custom resources alike), remembered a minute, and
//! each mapping is tried in turn until one answers with a Scale.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v1::Scale;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;

use crate::controllers::replicaset::error_message;
use crate::sync::LockExt;

/// How long a discovered mapping is trusted.
const MAPPING_TTL: Duration = Duration::from_secs(60);

/// Why a target's scale cannot be read or written, in upstream's words.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// Discovery knows no resource of the kind (or could not be asked).
    #[error("no matches for kind {kind:?} in group {group:?}")]
    NoMatch { kind: String, group: String, source: Option<kube::Error> },
    #[error("unrecognized resource")]
    Unrecognized,
    /// The scale subresource answered with an error: its Status message.
    #[error("{}", error_message(.0))]
    Api(#[source] kube::Error),
}

type Mappings = HashMap<(String, String), (Instant, Vec<ApiResource>)>;

/// Maps kinds to resources and reads and writes their scale.
pub struct ScaleClient {
    client: kube::Client,
    mappings: Mutex<Mappings>,
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

impl ScaleClient {
    pub fn new(client: kube::Client) -> Self {
        ScaleClient { client, mappings: Mutex::new(HashMap::new()) }
    }

    /// The resources of `kind` in `group`, the preferred version first;
    /// upstream's `no matches for kind` when there are none.
    pub async fn mappings(&self, group: &str, kind: &str) -> Result<Vec<ApiResource>, ScaleError> {
        let key = (group.to_string(), kind.to_string());
        {
            let cached = self.mappings.locked();
            if let Some((at, found)) = cached.get(&key).filter(|(at, _)| at.elapsed() < MAPPING_TTL) {
                let _ = at;
                return Ok(found.clone());
            }
        }
        let no_match = |source| ScaleError::NoMatch { kind: kind.to_string(), group: group.to_string(), source };
        let discovered = kube::discovery::group(&self.client, group).await.map_err(|e| no_match(Some(e)))?;
        let mut versions: Vec<&str> = discovered.versions().collect();
        let preferred = discovered.preferred_version_or_latest().to_string();
        versions.sort_by_key(|v| *v != preferred);
        let found: Vec<ApiResource> = versions
            .into_iter()
            .flat_map(|v| discovered.versioned_resources(v))
            .filter(|(ar, _)| ar.kind == kind)
            .map(|(ar, _)| ar)
            .collect();
        if found.is_empty() {
            return Err(no_match(None));
        }
        self.mappings.locked().insert(key, (Instant::now(), found.clone()));
        Ok(found)
    }

    /// Forgets what discovery said of `group`/`kind` (after a failed read).
    pub fn forget(&self, group: &str, kind: &str) {
        self.mappings.locked().remove(&(group.to_string(), kind.to_string()));
    }

    fn api(&self, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, resource)
    }

    /// The Scale of `name` through the first mapping that answers, and that
    /// mapping (upstream's `scaleForResourceMappings`: the first error when
    /// none does).
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
        mappings: &[ApiResource],
    ) -> Result<(Scale, ApiResource), ScaleError> {
        let mut first = None;
        for m in mappings {
            match self.api(namespace, m).get_scale(name).await {
                Ok(scale) => return Ok((scale, m.clone())),
                Err(e) => {
                    first.get_or_insert(ScaleError::Api(e));
                }
            }
        }
        Err(first.unwrap_or(ScaleError::Unrecognized))
    }

    /// Writes `scale` back through `mapping`.
    pub async fn update(&self, namespace: &str, mapping: &ApiResource, scale: &Scale) -> Result<Scale, ScaleError> {
        let name = scale.metadata.name.clone().unwrap_or_default();
        self.api(namespace, mapping).replace_scale(&name, &PostParams::default(), scale).await.map_err(ScaleError::Api)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_of_api_versions() {
        assert_eq!(super::group_of("apps/v1"), "apps");
        assert_eq!(super::group_of("v1"), "");
        assert_eq!(super::group_of("example.com/v1alpha1"), "example.com");
    }
}
