//! Where the autoscaler reads metrics (upstream's REST metrics client):
//! resource metrics from `metrics.k8s.io/v1beta1` PodMetrics (the API
//! server serves them from the nodes' stats), per-pod and per-object
//! metrics from `custom.metrics.k8s.io` and external ones from
//! `external.metrics.k8s.io`. Errors are upstream's words; ferrok serves no
//! custom or external metrics API, so those read as upstream reads a
//! cluster without one.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::Request;
use k8s_openapi::api::autoscaling::v2::CrossVersionObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::replica_calculator::{PodMetric, PodMetricsInfo};
use crate::client::labels;
use crate::controllers::replicaset::error_message;

const CUSTOM_METRICS_GROUP: &str = "custom.metrics.k8s.io";
const CUSTOM_METRICS_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];
/// The window of a custom metric that names none (metrics-server's default).
const DEFAULT_METRIC_WINDOW: Duration = Duration::from_secs(60);

/// Why a metric could not be read, in upstream's words.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("unable to fetch metrics from resource metrics API: {}", error_message(.0))]
    ResourceApi(#[source] kube::Error),
    #[error("no metrics returned from resource metrics API")]
    NoResourceMetrics,
    #[error("failed to get container metrics: container {container} not present in metrics for pod {namespace}/{pod}")]
    ContainerMissing { container: String, namespace: String, pod: String },
    #[error("unable to fetch metrics from custom metrics API: {0}")]
    CustomApi(#[source] CustomApiError),
    #[error("no metrics returned from custom metrics API")]
    NoCustomMetrics,
    #[error("unable to fetch metrics from external metrics API: {}", error_message(.0))]
    ExternalApi(#[source] kube::Error),
    #[error("no metrics returned from external metrics API")]
    NoExternalMetrics,
}

/// Why the custom metrics API could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum CustomApiError {
    #[error("{}", error_message(.0))]
    Api(#[from] kube::Error),
    #[error("no custom metrics API ({group}) registered", group = CUSTOM_METRICS_GROUP)]
    NotRegistered,
    #[error("no known available metric versions found")]
    NoKnownVersion,
}

#[derive(Deserialize)]
struct List<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Deserialize)]
struct PodMetrics {
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    timestamp: Option<Time>,
    window: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerMetrics>,
}

#[derive(Deserialize)]
struct ContainerMetrics {
    name: String,
    #[serde(default)]
    usage: BTreeMap<String, Quantity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetricValue {
    #[serde(default)]
    described_object: Option<CrossVersionObjectReference>,
    timestamp: Option<Time>,
    window_seconds: Option<i64>,
    value: Quantity,
}

#[derive(Deserialize)]
struct ExternalMetricValue {
    timestamp: Option<Time>,
    value: Quantity,
}

fn milli(q: &Quantity) -> i64 {
    crate::quantity::milli_value(q).unwrap_or(0)
}

fn at(t: &Option<Time>) -> Timestamp {
    t.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Go's `%+v` of a `*metav1.LabelSelector`, as upstream's messages print one.
pub fn go_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else { return "nil".into() };
    let labels: String =
        sel.match_labels.iter().flatten().map(|(k, v)| format!("{k}: {v},")).collect::<Vec<_>>().join("");
    let exprs: String = sel
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                e.key,
                e.operator,
                e.values.as_deref().unwrap_or_default().join(" ")
            )
        })
        .collect();
    format!("&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}")
}

/// Reads metrics through the API.
#[derive(Clone)]
pub struct MetricsClient {
    client: kube::Client,
}

impl MetricsClient {
    pub fn new(client: kube::Client) -> Self {
        MetricsClient { client }
    }

    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, kube::Error> {
        let query = serde_urlencoded::to_string(query).unwrap_or_default();
        let uri = if query.is_empty() { path.to_string() } else { format!("{path}?{query}") };
        let request = Request::get(uri).body(Vec::new()).map_err(kube::Error::HttpError)?;
        self.client.request::<T>(request).await
    }

    /// Upstream's `GetResourceMetric`: each pod's usage of `resource`
    /// (summed over its containers, or the one named `container`) and the
    /// first sample's time.
    pub async fn resource_metric(
        &self,
        resource: &str,
        namespace: &str,
        selector: &LabelSelector,
        container: &str,
    ) -> Result<(PodMetricsInfo, Timestamp), MetricsError> {
        let path = format!("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods");
        let list: List<PodMetrics> = self
            .get(&path, &[("labelSelector", labels::to_query(selector))])
            .await
            .map_err(MetricsError::ResourceApi)?;
        let Some(first) = list.items.first() else {
            return Err(MetricsError::NoResourceMetrics);
        };
        let timestamp = at(&first.timestamp);
        let mut out = PodMetricsInfo::new();
        for m in &list.items {
            let name = m.metadata.name.clone().unwrap_or_default();
            let window = m.window.as_deref().and_then(|w| crate::duration::parse(w).ok()).unwrap_or_default();
            let sample = |value| PodMetric { timestamp: at(&m.timestamp), window, value };
            if !container.is_empty() {
                let Some(c) = m.containers.iter().find(|c| c.name == container) else {
                    return Err(MetricsError::ContainerMissing {
                        container: container.to_string(),
                        namespace: namespace.to_string(),
                        pod: name,
                    });
                };
                if let Some(v) = c.usage.get(resource) {
                    out.insert(name, sample(milli(v)));
                }
                continue;
            }
            let values: Option<Vec<i64>> = m.containers.iter().map(|c| c.usage.get(resource).map(milli)).collect();
            match values {
                Some(v) if !m.containers.is_empty() => {
                    out.insert(name, sample(v.iter().sum()));
                }
                _ => tracing::debug!(resource, namespace, pod = %name, "missing resource metric"),
            }
        }
        Ok((out, timestamp))
    }

    /// The custom metrics API's version to ask, from discovery.
    async fn custom_metrics_version(&self) -> Result<&'static str, CustomApiError> {
        let groups = self.client.list_api_groups().await?;
        let Some(group) = groups.groups.iter().find(|g| g.name == CUSTOM_METRICS_GROUP) else {
            return Err(CustomApiError::NotRegistered);
        };
        let known =
            |gv: &str| CUSTOM_METRICS_VERSIONS.into_iter().find(|v| gv == format!("{CUSTOM_METRICS_GROUP}/{v}"));
        group
            .preferred_version
            .as_ref()
            .and_then(|p| known(&p.group_version))
            .or_else(|| group.versions.iter().find_map(|v| known(&v.group_version)))
            .ok_or(CustomApiError::NoKnownVersion)
    }

    async fn custom_values(&self, path_tail: &str, query: &[(&str, String)]) -> Result<Vec<MetricValue>, MetricsError> {
        let fetch = async {
            let version = self.custom_metrics_version().await?;
            let path = format!("/apis/{CUSTOM_METRICS_GROUP}/{version}/{path_tail}");
            let list: List<MetricValue> = self.get(&path, query).await?;
            Ok::<_, CustomApiError>(list.items)
        };
        fetch.await.map_err(MetricsError::CustomApi)
    }

    fn metric_query(
        selector: Option<&LabelSelector>,
        metric_selector: Option<&LabelSelector>,
    ) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(s) = selector {
            q.push(("labelSelector", labels::to_query(s)));
        }
        if let Some(s) = metric_selector.filter(|s| !labels::is_empty(s)) {
            q.push(("metricLabelSelector", labels::to_query(s)));
        }
        q
    }

    /// Upstream's `GetRawMetric`: a per-pod custom metric of the selected pods.
    pub async fn raw_metric(
        &self,
        metric: &str,
        namespace: &str,
        selector: &LabelSelector,
        metric_selector: Option<&LabelSelector>,
    ) -> Result<(PodMetricsInfo, Timestamp), MetricsError> {
        let tail = format!("namespaces/{namespace}/pods/*/{metric}");
        let values = self.custom_values(&tail, &Self::metric_query(Some(selector), metric_selector)).await?;
        let Some(first) = values.first() else { return Err(MetricsError::NoCustomMetrics) };
        let timestamp = at(&first.timestamp);
        let out = values
            .iter()
            .map(|v| {
                let name = v.described_object.as_ref().map(|o| o.name.clone()).unwrap_or_default();
                let window = v.window_seconds.map_or(DEFAULT_METRIC_WINDOW, |s| Duration::from_secs(s.max(0) as u64));
                (name, PodMetric { timestamp: at(&v.timestamp), window, value: milli(&v.value) })
            })
            .collect();
        Ok((out, timestamp))
    }

    /// Upstream's `GetObjectMetric`: a custom metric of one object, whose
    /// kind `resource` names (the namespace itself for a Namespace).
    pub async fn object_metric(
        &self,
        metric: &str,
        namespace: &str,
        object: &CrossVersionObjectReference,
        resource: &str,
        metric_selector: Option<&LabelSelector>,
    ) -> Result<(i64, Timestamp), MetricsError> {
        let core = object.api_version.as_deref().is_none_or(|v| !v.contains('/'));
        let tail = if object.kind == "Namespace" && core {
            format!("namespaces/{namespace}/metrics/{metric}")
        } else {
            format!("namespaces/{namespace}/{resource}/{}/{metric}", object.name)
        };
        let values = self.custom_values(&tail, &Self::metric_query(None, metric_selector)).await?;
        let Some(v) = values.first() else { return Err(MetricsError::NoCustomMetrics) };
        Ok((milli(&v.value), at(&v.timestamp)))
    }

    /// Upstream's `GetExternalMetric`: every value of an external metric.
    pub async fn external_metric(
        &self,
        metric: &str,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Result<(Vec<i64>, Timestamp), MetricsError> {
        let path = format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}");
        let query = [("labelSelector", selector.map(labels::to_query).unwrap_or_default())];
        let list: List<ExternalMetricValue> = self.get(&path, &query).await.map_err(MetricsError::ExternalApi)?;
        let Some(first) = list.items.first() else {
            return Err(MetricsError::NoExternalMetrics);
        };
        let timestamp = at(&first.timestamp);
        Ok((list.items.iter().map(|v| milli(&v.value)).collect(), timestamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_print_as_go_does() {
        assert_eq!(go_selector(None), "nil");
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({"matchLabels": {"queue": "jobs"}})).unwrap();
        assert_eq!(
            go_selector(Some(&sel)),
            "&LabelSelector{MatchLabels:map[string]string{queue: jobs,},MatchExpressions:[]LabelSelectorRequirement{},}"
        );
    }
}
