//! How many replicas an autoscaler's metrics ask for (upstream's
//! `computeReplicasForMetrics` and the `computeStatusFor*Metric` of each
//! source type): the largest proposal of the metrics that could be read,
//! each metric's current value for the status, and for a metric that could
//! not be read the Warning event and ScalingActive condition upstream gives
//! it, with its error wrapped as upstream wraps it.

use std::sync::Arc;

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, ExternalMetricStatus, MetricIdentifier, MetricSpec, MetricStatus, MetricTarget,
    MetricValueStatus, ObjectMetricStatus, PodsMetricStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::conditions::{Condition, SCALING_ACTIVE};
use super::metrics::{go_selector, MetricsError};
use super::replica_calculator::CalcError;
use super::scale::group_of;
use super::Reconciliation;
use crate::client::events::EventType;
use crate::client::labels::{self, QueryError};

/// Why the metrics decide nothing, or only in part.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("selector is required")]
    SelectorRequired,
    #[error("couldn't convert selector into a corresponding internal selector object: {0}")]
    InvalidSelector(#[source] QueryError),
    #[error("pods by selector {selector} are controlled by multiple HPAs: [{}]", .hpas.join(" "))]
    AmbiguousSelector { selector: String, hpas: Vec<String> },
    #[error("invalid metrics ({invalid} invalid out of {total}), first error is: {first}")]
    InvalidMetrics { invalid: usize, total: usize, first: MetricError },
}

/// Why one metric gives no proposal, wrapped as upstream wraps it (the
/// inner errors are the Events' and conditions' messages).
#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("unknown metric source type {0:?}")]
    UnknownSourceType(String),
    #[error("unable to get metrics for resource {resource}: {source}")]
    ResourceMetrics { resource: String, source: MetricsError },
    #[error("unable to get metric {name}: {source}")]
    PodsMetric { name: String, source: MetricsError },
    #[error("unable to get metric {name}: {kind} on {namespace} {object}/{source}")]
    ObjectMetric { name: String, kind: String, namespace: String, object: String, source: MetricsError },
    #[error("unable to get external metric {namespace}/{name}/{selector}: {source}")]
    ExternalMetric { namespace: String, name: String, selector: String, source: MetricsError },
    #[error(transparent)]
    Replicas(#[from] CalcError),
    #[error("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set")]
    NoResourceTarget,
    #[error("invalid object metric source: neither a value target nor an average value target was set")]
    NoObjectTarget,
    #[error("invalid external metric source: neither a value target nor an average value target was set")]
    NoExternalTarget,
    #[error("failed to get {resource} usage: {source}")]
    Usage { resource: String, source: Box<MetricError> },
    #[error("failed to get {resource} utilization: {source}")]
    Utilization { resource: String, source: Box<MetricError> },
    #[error("failed to get {name} object metric: {source}")]
    ObjectAverage { name: String, source: Box<MetricError> },
    #[error("failed to get {name} external metric: {source}")]
    ExternalAverage { name: String, source: Box<MetricError> },
    #[error("failed to get external metric {name}: {source}")]
    ExternalValue { name: String, source: Box<MetricError> },
    #[error("failed to get object metric value: {0}")]
    ObjectValue(#[source] Box<MetricError>),
    #[error("failed to get pods metric value: {0}")]
    PodsValue(#[source] Box<MetricError>),
    #[error("failed to get {name} resource metric value: {source}")]
    ResourceValue { name: String, source: Box<MetricError> },
    #[error("failed to get {container} container metric value: {source}")]
    ContainerValue { container: String, source: Box<MetricError> },
    #[error("failed to get {name} external metric value: {source}")]
    ExternalMetricValue { name: String, source: Box<MetricError> },
}

/// What the metrics ask for. `replicas` is None when nothing can be
/// decided (upstream's -1); `error` may be set beside a decision when only
/// some metrics failed.
pub struct Computed {
    pub replicas: Option<i32>,
    pub metric: String,
    pub statuses: Option<Vec<MetricStatus>>,
    pub error: Option<ComputeError>,
}

/// One metric's proposal.
struct Proposal {
    replicas: i32,
    metric: String,
    status: MetricStatus,
}

/// A metric that could not be read: its condition (already evented) and error.
type Failure = (Condition, MetricError);

/// `resource.NewMilliQuantity(m, DecimalSI)`.
fn milli_quantity(m: i64) -> Quantity {
    Quantity(crate::quantity::canonical(&format!("{m}m")).unwrap_or_else(|| m.to_string()))
}

fn milli(q: Option<&Quantity>) -> Option<i64> {
    q.and_then(crate::quantity::milli_value)
}

impl Reconciliation<'_> {
    /// Upstream's `getUnableComputeReplicaCountCondition`: a Warning event
    /// named `reason`, and the ScalingActive condition to set should every
    /// metric fail.
    fn unable<E: std::fmt::Display + ?Sized>(&self, reason: &str, err: &E) -> Condition {
        let err = err.to_string();
        self.event(EventType::Warning, reason, &err);
        Condition::new(SCALING_ACTIVE, false, reason, format!("the HPA was unable to compute the replica count: {err}"))
    }

    /// Upstream's `validateAndParseSelector`: the target's selector, given,
    /// readable, and picking pods no other autoscaler picks.
    fn parse_selector(
        &mut self,
        selector: &str,
        pods_of_namespace: &[Arc<Pod>],
    ) -> Result<LabelSelector, ComputeError> {
        if selector.is_empty() {
            let e = ComputeError::SelectorRequired;
            self.event(EventType::Warning, "SelectorRequired", &e.to_string());
            self.condition(SCALING_ACTIVE, false, "InvalidSelector", "the HPA target's scale is missing a selector");
            return Err(e);
        }
        let parsed = match labels::from_query(selector) {
            Ok(p) => p,
            Err(e) => {
                let e = ComputeError::InvalidSelector(e);
                let msg = e.to_string();
                self.event(EventType::Warning, "InvalidSelector", &msg);
                self.condition(SCALING_ACTIVE, false, "InvalidSelector", &msg);
                return Err(e);
            }
        };
        let pods: Vec<&Arc<Pod>> =
            pods_of_namespace.iter().filter(|p| labels::matches(&parsed, p.metadata.labels.as_ref())).collect();
        let controlling = self.ctx.hpas_selecting(&self.key, parsed.clone(), &pods);
        if controlling.len() > 1 {
            let e = ComputeError::AmbiguousSelector { selector: selector.to_string(), hpas: controlling };
            let msg = e.to_string();
            self.event(EventType::Warning, "AmbiguousSelector", &msg);
            self.condition(SCALING_ACTIVE, false, "AmbiguousSelector", &msg);
            return Err(e);
        }
        Ok(parsed)
    }

    /// Upstream's `computeReplicasForMetrics`.
    pub async fn compute_replicas_for_metrics(&mut self, scale: &Scale, specs: &[MetricSpec]) -> Computed {
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let pods_of_namespace = self.ctx.pods_by_namespace.get(&ns);
        let selector_text = scale.status.as_ref().and_then(|s| s.selector.clone()).unwrap_or_default();
        let selector = match self.parse_selector(&selector_text, &pods_of_namespace) {
            Ok(s) => s,
            Err(e) => return Computed { replicas: None, metric: String::new(), statuses: None, error: Some(e) },
        };
        let pods: Vec<Arc<Pod>> =
            pods_of_namespace.into_iter().filter(|p| labels::matches(&selector, p.metadata.labels.as_ref())).collect();
        let spec_replicas = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let status_replicas = scale.status.as_ref().map_or(0, |s| s.replicas);
        let mut statuses = vec![MetricStatus { type_: String::new(), ..Default::default() }; specs.len()];
        let (mut replicas, mut metric) = (0, String::new());
        let mut invalid: Vec<Failure> = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            match self.compute_replicas_for_metric(spec, spec_replicas, status_replicas, &selector, &pods).await {
                Ok(p) => {
                    statuses[i] = p.status;
                    if replicas == 0 || p.replicas > replicas {
                        replicas = p.replicas;
                        metric = p.metric;
                    }
                }
                Err(f) => invalid.push(f),
            }
        }
        let count = invalid.len();
        let mut error = None;
        if let Some((condition, first)) = invalid.into_iter().next() {
            let stop = count >= specs.len() || replicas < spec_replicas;
            error = Some(ComputeError::InvalidMetrics { invalid: count, total: specs.len(), first });
            if stop {
                self.set(&condition);
                return Computed { replicas: None, metric: String::new(), statuses: Some(statuses), error };
            }
        }
        self.condition(
            SCALING_ACTIVE,
            true,
            "ValidMetricFound",
            &format!("the HPA was able to successfully calculate a replica count from {metric}"),
        );
        Computed { replicas: Some(replicas), metric, statuses: Some(statuses), error }
    }

    /// Upstream's `computeReplicasForMetric`: one metric's proposal, or its
    /// condition and error.
    async fn compute_replicas_for_metric(
        &mut self,
        spec: &MetricSpec,
        spec_replicas: i32,
        status_replicas: i32,
        selector: &LabelSelector,
        pods: &[Arc<Pod>],
    ) -> Result<Proposal, Failure> {
        match spec.type_.as_str() {
            "Object" => self
                .object_metric(spec, spec_replicas, status_replicas, pods)
                .await
                .map_err(|(c, e)| (c, MetricError::ObjectValue(Box::new(e)))),
            "Pods" => self
                .pods_metric(spec, spec_replicas, selector, pods)
                .await
                .map_err(|(c, e)| (c, MetricError::PodsValue(Box::new(e)))),
            "Resource" => {
                let Some(source) = spec.resource.as_ref() else { return Err(self.invalid_source(spec)) };
                let r = self.resource_metric(&source.name, "", &source.target, spec_replicas, selector, pods).await;
                match r {
                    Ok((replicas, metric, current)) => Ok(Proposal {
                        replicas,
                        metric,
                        status: MetricStatus {
                            type_: "Resource".into(),
                            resource: Some(ResourceMetricStatus { name: source.name.clone(), current }),
                            ..Default::default()
                        },
                    }),
                    Err(e) => Err((
                        self.unable("FailedGetResourceMetric", &e),
                        MetricError::ResourceValue { name: source.name.clone(), source: Box::new(e) },
                    )),
                }
            }
            "ContainerResource" => {
                let Some(source) = spec.container_resource.as_ref() else { return Err(self.invalid_source(spec)) };
                let container = source.container.as_str();
                let r =
                    self.resource_metric(&source.name, container, &source.target, spec_replicas, selector, pods).await;
                match r {
                    Ok((replicas, metric, current)) => Ok(Proposal {
                        replicas,
                        metric,
                        status: MetricStatus {
                            type_: "ContainerResource".into(),
                            container_resource: Some(ContainerResourceMetricStatus {
                                name: source.name.clone(),
                                container: source.container.clone(),
                                current,
                            }),
                            ..Default::default()
                        },
                    }),
                    Err(e) => Err((
                        self.unable("FailedGetContainerResourceMetric", &e),
                        MetricError::ContainerValue { container: container.to_string(), source: Box::new(e) },
                    )),
                }
            }
            "External" => self.external_metric(spec, spec_replicas, status_replicas, pods).await,
            other => Err(self.invalid_source_type(other)),
        }
    }

    fn invalid_source_type(&self, other: &str) -> Failure {
        let e = MetricError::UnknownSourceType(other.to_string());
        (self.unable("InvalidMetricSourceType", &e), e)
    }

    fn invalid_source(&self, spec: &MetricSpec) -> Failure {
        self.invalid_source_type(&spec.type_)
    }

    /// Upstream's `computeStatusForResourceMetricGeneric`: a Utilization
    /// or AverageValue target of a resource of the pods (or one container).
    async fn resource_metric(
        &self,
        resource: &str,
        container: &str,
        target: &MetricTarget,
        current: i32,
        selector: &LabelSelector,
        pods: &[Arc<Pod>],
    ) -> Result<(i32, String, MetricValueStatus), MetricError> {
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let unable = |source: MetricsError| MetricError::ResourceMetrics { resource: resource.to_string(), source };
        if let Some(average) = milli(target.average_value.as_ref()) {
            let fetched = self.ctx.metrics.resource_metric(resource, &ns, selector, container).await;
            let result = fetched.map_err(unable).and_then(|(metrics, _)| {
                Ok(self.ctx.calc.plain_replicas(current, average, resource, metrics, pods, self.now)?)
            });
            let (replicas, usage) =
                result.map_err(|e| MetricError::Usage { resource: resource.to_string(), source: Box::new(e) })?;
            let status = MetricValueStatus { average_value: Some(milli_quantity(usage)), ..Default::default() };
            return Ok((replicas, format!("{resource} resource"), status));
        }
        let Some(target_utilization) = target.average_utilization else {
            return Err(MetricError::NoResourceTarget);
        };
        let fetched = self.ctx.metrics.resource_metric(resource, &ns, selector, container).await;
        let result = fetched.map_err(unable).and_then(|(metrics, _)| {
            Ok(self.ctx.calc.resource_replicas(
                current,
                target_utilization,
                resource,
                container,
                metrics,
                pods,
                self.now,
            )?)
        });
        let u = result.map_err(|e| MetricError::Utilization { resource: resource.to_string(), source: Box::new(e) })?;
        let metric = if container.is_empty() {
            format!("{resource} resource utilization (percentage of request)")
        } else {
            format!("{resource} container resource utilization (percentage of request)")
        };
        let status = MetricValueStatus {
            average_utilization: Some(u.utilization),
            average_value: Some(milli_quantity(u.raw)),
            ..Default::default()
        };
        Ok((u.replicas, metric, status))
    }

    /// Upstream's `computeStatusForPodsMetric`.
    async fn pods_metric(
        &self,
        spec: &MetricSpec,
        current: i32,
        selector: &LabelSelector,
        pods: &[Arc<Pod>],
    ) -> Result<Proposal, Failure> {
        let Some(source) = spec.pods.as_ref() else { return Err(self.invalid_source(spec)) };
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let name = &source.metric.name;
        let target = milli(source.target.average_value.as_ref()).unwrap_or(0);
        let fetched = self.ctx.metrics.raw_metric(name, &ns, selector, source.metric.selector.as_ref()).await;
        let result = fetched
            .map_err(|source| MetricError::PodsMetric { name: name.clone(), source })
            .and_then(|(metrics, _)| Ok(self.ctx.calc.plain_replicas(current, target, "", metrics, pods, self.now)?));
        let (replicas, usage) = result.map_err(|e| (self.unable("FailedGetPodsMetric", &e), e))?;
        Ok(Proposal {
            replicas,
            metric: format!("pods metric {name}"),
            status: MetricStatus {
                type_: "Pods".into(),
                pods: Some(PodsMetricStatus {
                    metric: identifier(&source.metric),
                    current: MetricValueStatus { average_value: Some(milli_quantity(usage)), ..Default::default() },
                }),
                ..Default::default()
            },
        })
    }

    /// Upstream's `computeStatusForObjectMetric`.
    async fn object_metric(
        &self,
        spec: &MetricSpec,
        spec_replicas: i32,
        status_replicas: i32,
        pods: &[Arc<Pod>],
    ) -> Result<Proposal, Failure> {
        let Some(source) = spec.object.as_ref() else { return Err(self.invalid_source(spec)) };
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let name = &source.metric.name;
        let object = &source.described_object;
        let fetch = async {
            let group = group_of(object.api_version.as_deref().unwrap_or_default());
            let resource = match self.ctx.scales.mappings(group, &object.kind).await {
                Ok(m) => m.first().map(|r| r.plural.clone()).unwrap_or_default(),
                Err(_) => object.kind.to_lowercase(),
            };
            self.ctx.metrics.object_metric(name, &ns, object, &resource, source.metric.selector.as_ref()).await
        };
        let unable = |source: MetricsError| MetricError::ObjectMetric {
            name: name.clone(),
            kind: object.kind.clone(),
            namespace: ns.clone(),
            object: object.name.clone(),
            source,
        };
        let value = milli(source.target.value.as_ref());
        let average = milli(source.target.average_value.as_ref());
        let (replicas, current, metric) = match (source.target.type_.as_str(), value, average) {
            ("Value", Some(target), _) => {
                let result = fetch.await.map_err(unable).and_then(|(usage, _)| {
                    let replicas =
                        self.ctx.calc.usage_ratio_replicas(spec_replicas, usage as f64 / target as f64, pods)?;
                    Ok((replicas, usage))
                });
                let (replicas, usage) = result.map_err(|e| (self.unable("FailedGetObjectMetric", &e), e))?;
                let current = MetricValueStatus { value: Some(milli_quantity(usage)), ..Default::default() };
                (replicas, current, format!("{} metric {name}", object.kind))
            }
            ("AverageValue", _, Some(target)) => {
                let (usage, _) = fetch.await.map_err(unable).map_err(|e| {
                    let c = self.unable("FailedGetObjectMetric", &e);
                    (c, MetricError::ObjectAverage { name: name.clone(), source: Box::new(e) })
                })?;
                let (replicas, per_pod) = self.ctx.calc.per_pod_replicas(status_replicas, usage, target);
                let current = MetricValueStatus { average_value: Some(milli_quantity(per_pod)), ..Default::default() };
                let metric = format!("external metric {name}({})", go_selector(source.metric.selector.as_ref()));
                (replicas, current, metric)
            }
            _ => {
                let e = MetricError::NoObjectTarget;
                return Err((self.unable("FailedGetObjectMetric", &e), e));
            }
        };
        let status_object = if source.target.type_ == "Value" { Some(object.clone()) } else { None };
        Ok(Proposal {
            replicas,
            metric,
            status: MetricStatus {
                type_: "Object".into(),
                object: Some(ObjectMetricStatus {
                    described_object: status_object.unwrap_or_default(),
                    metric: identifier(&source.metric),
                    current,
                }),
                ..Default::default()
            },
        })
    }

    /// Upstream's `computeStatusForExternalMetric`.
    async fn external_metric(
        &self,
        spec: &MetricSpec,
        spec_replicas: i32,
        status_replicas: i32,
        pods: &[Arc<Pod>],
    ) -> Result<Proposal, Failure> {
        let Some(source) = spec.external.as_ref() else { return Err(self.invalid_source(spec)) };
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let name = &source.metric.name;
        let metric_selector = source.metric.selector.as_ref();
        let described = format!("external metric {name}({})", go_selector(metric_selector));
        let selector_text = go_selector(metric_selector);
        let unable = |source: MetricsError| MetricError::ExternalMetric {
            namespace: ns.clone(),
            name: name.clone(),
            selector: selector_text.clone(),
            source,
        };
        let outer = |e: MetricError| MetricError::ExternalMetricValue { name: name.clone(), source: Box::new(e) };
        let fetch = self.ctx.metrics.external_metric(name, &ns, metric_selector);
        let (replicas, current) = if let Some(target) = milli(source.target.average_value.as_ref()) {
            let (values, _) = fetch.await.map_err(unable).map_err(|e| {
                let c = self.unable("FailedGetExternalMetric", &e);
                (c, outer(MetricError::ExternalAverage { name: name.clone(), source: Box::new(e) }))
            })?;
            let (replicas, per_pod) = self.ctx.calc.per_pod_replicas(status_replicas, values.iter().sum(), target);
            (replicas, MetricValueStatus { average_value: Some(milli_quantity(per_pod)), ..Default::default() })
        } else if let Some(target) = milli(source.target.value.as_ref()) {
            let result = fetch.await.map_err(unable).and_then(|(values, _)| {
                let usage: i64 = values.iter().sum();
                Ok((self.ctx.calc.usage_ratio_replicas(spec_replicas, usage as f64 / target as f64, pods)?, usage))
            });
            let (replicas, usage) = result.map_err(|e| {
                let c = self.unable("FailedGetExternalMetric", &e);
                (c, outer(MetricError::ExternalValue { name: name.clone(), source: Box::new(e) }))
            })?;
            (replicas, MetricValueStatus { value: Some(milli_quantity(usage)), ..Default::default() })
        } else {
            let e = MetricError::NoExternalTarget;
            return Err((self.unable("FailedGetExternalMetric", &e), outer(e)));
        };
        Ok(Proposal {
            replicas,
            metric: described,
            status: MetricStatus {
                type_: "External".into(),
                external: Some(ExternalMetricStatus { metric: identifier(&source.metric), current }),
                ..Default::default()
            },
        })
    }
}

fn identifier(m: &MetricIdentifier) -> MetricIdentifier {
    MetricIdentifier { name: m.name.clone(), selector: m.selector.clone() }
}
