//! HorizontalController (upstream's pkg/controller/podautoscaler, the
//! `horizontalpodautoscaling` controller): every 15 s (upstream's
//! `--horizontal-pod-autoscaler-sync-period`) each autoscalers/v2
//! HorizontalPodAutoscaler reads its target's `scale` subresource, asks its
//! metrics how many replicas they want (`compute.rs`, with the
//! `replica_calculator`), stabilizes and rate-limits that (`normalize.rs`),
//! writes the new size through the scale subresource, and records its
//! status (currentReplicas, desiredReplicas, currentMetrics, lastScaleTime,
//! the AbleToScale / ScalingActive / ScalingLimited conditions) and Events
//! (SuccessfulRescale, FailedGetScale, FailedGetResourceMetric, ...), all in
//! upstream's words.
//!
//! As upstream's work queue does, a change of an autoscaler only asks for a
//! sync one period later (a request already waiting keeps its earlier
//! time), so the controller's own status writes never make it sync twice.

mod compute;
mod conditions;
mod metrics;
mod normalize;
mod replica_calculator;
mod scale;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};
use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, HorizontalPodAutoscalerStatus, MetricStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::scheduler::{scheduler, ScheduleRequest};
use tokio_stream::wrappers::UnboundedReceiverStream;

use self::compute::ComputeError;
use self::conditions::{Condition, ABLE_TO_SCALE, SCALING_ACTIVE, SCALING_LIMITED};
use self::metrics::MetricsClient;
use self::normalize::{History, DOWNSCALE_STABILIZATION};
use self::replica_calculator::ReplicaCalculator;
use self::scale::{group_of, ScaleClient, ScaleError};
use super::replicaset::error_message;
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer::Change;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::labels;
use crate::sync::LockExt;

/// Upstream's `--horizontal-pod-autoscaler-sync-period`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);
/// Upstream's `--concurrent-horizontal-pod-autoscaler-syncs`.
const WORKERS: usize = 5;

struct Context {
    client: kube::Client,
    hpas: Store<HorizontalPodAutoscaler>,
    pods: Store<Pod>,
    pods_by_namespace: Index<Pod>,
    scales: ScaleClient,
    metrics: MetricsClient,
    calc: ReplicaCalculator,
    recorder: EventRecorder,
    downscale_window: Duration,
    /// Each autoscaler's recommendations and scale events.
    histories: Mutex<HashMap<String, History>>,
    /// Each autoscaler's target selector as last seen (None before its
    /// first sync selects nothing, as upstream's `labels.Nothing()`).
    selectors: Mutex<HashMap<String, Option<LabelSelector>>>,
}

fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl Context {
    fn forget(&self, key: &str) {
        self.histories.locked().remove(key);
        self.selectors.locked().remove(key);
    }

    /// Records `selector` as `key`'s and names every autoscaler (`key`
    /// included) whose selector picks one of `pods` (upstream's
    /// `hpasControllingPodsUnderSelector`).
    fn hpas_selecting(&self, key: &str, selector: LabelSelector, pods: &[&Arc<Pod>]) -> Vec<String> {
        let mut selectors = self.selectors.locked();
        if let Some(own) = selectors.get_mut(key) {
            *own = Some(selector);
        }
        let ns = key.split_once('/').map_or("", |(ns, _)| ns);
        let mut found: Vec<String> = selectors
            .iter()
            .filter(|(k, _)| k.split_once('/').is_some_and(|(n, _)| n == ns))
            .filter(|(_, s)| {
                s.as_ref().is_some_and(|s| pods.iter().any(|p| labels::matches(s, p.metadata.labels.as_ref())))
            })
            .map(|(k, _)| k.clone())
            .collect();
        found.sort();
        found
    }
}

/// Why a sync of an autoscaler failed, in upstream's words.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("invalid API version in scale target reference: unexpected GroupVersion string: {0}")]
    InvalidApiVersion(String),
    #[error("unable to determine resource for scale target reference: {0}")]
    NoMapping(#[source] ScaleError),
    #[error("failed to query scale subresource for {reference}: {source}")]
    GetScale { reference: String, source: ScaleError },
    #[error(
        "failed to compute desired number of replicas based on listed metrics for {reference}: {}",
        .source.as_ref().map(ToString::to_string).unwrap_or_default()
    )]
    ComputeReplicas { reference: String, source: Option<ComputeError> },
    /// Some metrics failed, the others decided.
    #[error(transparent)]
    Metrics(ComputeError),
    #[error("failed to rescale {reference}: {source}")]
    Rescale { reference: String, source: ScaleError },
    #[error("failed to update status for {name}: {}", error_message(.source))]
    UpdateStatus { name: String, source: kube::Error },
}

/// One sync of one autoscaler: its copy being brought up to date.
pub(crate) struct Reconciliation<'a> {
    ctx: &'a Context,
    key: String,
    hpa: HorizontalPodAutoscaler,
    now: Timestamp,
}

impl Reconciliation<'_> {
    fn event(&self, kind: EventType, reason: &str, message: &str) {
        self.ctx.recorder.publish(&self.hpa, kind, reason, message);
    }

    fn set(&mut self, c: &Condition) {
        conditions::set(&mut self.hpa, c, self.now);
    }

    fn condition(&mut self, type_: &'static str, status: bool, reason: &str, message: &str) {
        self.set(&Condition::new(type_, status, reason, message));
    }

    fn status(&mut self) -> &mut HorizontalPodAutoscalerStatus {
        self.hpa.status.get_or_insert_with(Default::default)
    }

    /// Upstream's `setStatus`: the status rebuilt from the sync's outcome.
    fn set_status(&mut self, current: i32, desired: i32, metrics: Option<Vec<MetricStatus>>, rescaled: bool) {
        let now = self.now;
        let status = self.status();
        let last_scale_time = if rescaled { Some(Time(now)) } else { status.last_scale_time.take() };
        *status = HorizontalPodAutoscalerStatus {
            current_replicas: Some(current),
            desired_replicas: desired,
            last_scale_time,
            current_metrics: metrics,
            conditions: status.conditions.take(),
            observed_generation: None,
        };
    }

    /// Upstream's `setCurrentReplicasAndMetricsInStatus`.
    fn set_current(&mut self, current: i32, metrics: Option<Vec<MetricStatus>>) {
        let desired = self.hpa.status.as_ref().map_or(0, |s| s.desired_replicas);
        self.set_status(current, desired, metrics, false);
    }

    /// Writes the status when it changed (upstream's `updateStatusIfNeeded`).
    async fn update_status_if_needed(&self, original: &Option<HorizontalPodAutoscalerStatus>) -> Result<(), SyncError> {
        if self.hpa.status.as_ref().is_none_or(|s| Some(s) == original.as_ref()) {
            return Ok(());
        }
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let name = self.hpa.metadata.name.clone().unwrap_or_default();
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(self.ctx.client.clone(), &ns);
        match api.replace_status(&name, &PostParams::default(), &self.hpa).await {
            Ok(_) => Ok(()),
            Err(source) => {
                self.event(EventType::Warning, "FailedUpdateStatus", &error_message(&source));
                Err(SyncError::UpdateStatus { name, source })
            }
        }
    }

    /// Writes the status, logging a failure (a sync that fails anyway).
    async fn write_status(&self, original: &Option<HorizontalPodAutoscalerStatus>) {
        if let Err(e) = self.update_status_if_needed(original).await {
            tracing::debug!(hpa = %self.key, error = %e, "cannot update the autoscaler's status");
        }
    }

    /// The target's scale could not be had: upstream's FailedGetScale.
    async fn failed_get_scale(&mut self, original: &Option<HorizontalPodAutoscalerStatus>, err: &str) {
        self.event(EventType::Warning, "FailedGetScale", err);
        let msg = format!("the HPA controller was unable to get the target's current scale: {err}");
        self.condition(ABLE_TO_SCALE, false, "FailedGetScale", &msg);
        self.write_status(original).await;
    }

    /// Upstream's `reconcileAutoscaler`.
    async fn reconcile(mut self) -> Result<(), SyncError> {
        let original = self.hpa.status.clone();
        let ns = self.hpa.metadata.namespace.clone().unwrap_or_default();
        let spec = self.hpa.spec.clone().unwrap_or_default();
        let target = &spec.scale_target_ref;
        let reference = format!("{}/{ns}/{}", target.kind, target.name);
        let api_version = target.api_version.clone().unwrap_or_default();
        if api_version.matches('/').count() > 1 {
            let err = format!("unexpected GroupVersion string: {api_version}");
            self.failed_get_scale(&original, &err).await;
            return Err(SyncError::InvalidApiVersion(api_version));
        }
        let group = group_of(&api_version).to_string();
        let mappings = match self.ctx.scales.mappings(&group, &target.kind).await {
            Ok(m) => m,
            Err(err) => {
                self.failed_get_scale(&original, &err.to_string()).await;
                return Err(SyncError::NoMapping(err));
            }
        };
        let (mut scale, mapping) = match self.ctx.scales.get(&ns, &target.name, &mappings).await {
            Ok(found) => found,
            Err(err) => {
                self.ctx.scales.forget(&group, &target.kind);
                self.failed_get_scale(&original, &err.to_string()).await;
                return Err(SyncError::GetScale { reference, source: err });
            }
        };
        self.condition(
            ABLE_TO_SCALE,
            true,
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale",
        );
        let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let started = Instant::now();
        self.with_history(|h| h.record_initial(current, started));
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        let mut statuses = None;
        let mut result = Ok(());
        let (mut desired, mut reason, mut rescale) = (0, String::new(), true);
        if current == 0 && min != 0 {
            rescale = false;
            self.condition(
                SCALING_ACTIVE,
                false,
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero",
            );
        } else if current > max {
            (desired, reason) = (max, "Current number of replicas above Spec.MaxReplicas".into());
        } else if current < min {
            (desired, reason) = (min, "Current number of replicas below Spec.MinReplicas".into());
        } else {
            let computed = self.compute_replicas_for_metrics(&scale, spec.metrics.as_deref().unwrap_or_default()).await;
            statuses = computed.statuses;
            let Some(proposed) = computed.replicas else {
                self.set_current(current, statuses);
                self.write_status(&original).await;
                let err = computed.error;
                let message = err.as_ref().map(ToString::to_string).unwrap_or_default();
                self.event(EventType::Warning, "FailedComputeMetricsReplicas", &message);
                return Err(SyncError::ComputeReplicas { reference, source: err });
            };
            if let Some(e) = computed.error {
                result = Err(SyncError::Metrics(e));
            }
            desired = proposed.max(0);
            if desired > current {
                reason = format!("{} above target", computed.metric);
            }
            if desired < current {
                reason = "All metrics below target".into();
            }
            let now = Instant::now();
            let window = self.ctx.downscale_window;
            let normalized = match spec.behavior.as_ref() {
                None => self.with_history(|h| h.normalize(current, desired, min, max, window, now)),
                Some(b) => self.with_history(|h| h.normalize_with_behavior(b, current, desired, min, max, window, now)),
            };
            self.condition(ABLE_TO_SCALE, true, normalized.able.0, normalized.able.1);
            let (limited, why, message) = normalized.limited;
            self.condition(SCALING_LIMITED, limited, why, message);
            desired = normalized.replicas;
            rescale = desired != current;
        }
        if rescale {
            if let Some(s) = scale.spec.as_mut() {
                s.replicas = Some(desired);
            } else {
                scale.spec = Some(k8s_openapi::api::autoscaling::v1::ScaleSpec { replicas: Some(desired) });
            }
            if let Err(err) = self.ctx.scales.update(&ns, &mapping, &scale).await {
                self.event(
                    EventType::Warning,
                    "FailedRescale",
                    &format!("New size: {desired}; reason: {reason}; error: {err}"),
                );
                let msg = format!("the HPA controller was unable to update the target scale: {err}");
                self.condition(ABLE_TO_SCALE, false, "FailedUpdateScale", &msg);
                self.set_current(current, statuses);
                self.write_status(&original).await;
                return Err(SyncError::Rescale { reference, source: err });
            }
            let msg = format!("the HPA controller was able to update the target scale to {desired}");
            self.condition(ABLE_TO_SCALE, true, "SucceededRescale", &msg);
            self.event(EventType::Normal, "SuccessfulRescale", &format!("New size: {desired}; reason: {reason}"));
            let behavior = spec.behavior.clone();
            self.with_history(|h| h.store_scale_event(behavior.as_ref(), current, desired, Instant::now()));
            tracing::info!(hpa = %self.key, current, desired, reason = %reason, "successfully rescaled");
        } else {
            desired = current;
        }
        self.set_status(current, desired, statuses, rescale);
        self.update_status_if_needed(&original).await?;
        result
    }

    fn with_history<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        let mut histories = self.ctx.histories.locked();
        f(histories.entry(self.key.clone()).or_default())
    }
}

/// Syncs the autoscaler `key`; false when it no longer exists.
async fn reconcile_key(ctx: &Context, key: &str) -> bool {
    let Some((ns, name)) = key.split_once('/') else { return false };
    let Some(hpa) = ctx.hpas.get(&ObjectRef::new(name).within(ns)) else {
        tracing::info!(hpa = %key, "horizontal pod autoscaler has been deleted");
        ctx.forget(key);
        return false;
    };
    let sync = Reconciliation { ctx, key: key.to_string(), hpa: (*hpa).clone(), now: Timestamp::now() };
    if let Err(e) = sync.reconcile().await {
        tracing::debug!(hpa = %key, error = %e, "autoscaler sync failed");
    }
    true
}

fn object_key(hpa: &HorizontalPodAutoscaler) -> String {
    key_of(hpa.metadata.namespace.as_deref().unwrap_or_default(), hpa.metadata.name.as_deref().unwrap_or_default())
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (hpas, changes) = informers.informer::<HorizontalPodAutoscaler>().subscribe().into_changes();
    let ctx = Arc::new(Context {
        client: client.clone(),
        hpas,
        pods: informers.informer::<Pod>().store(),
        pods_by_namespace: informers.by_namespace(),
        scales: ScaleClient::new(client.clone()),
        metrics: MetricsClient::new(client.clone()),
        calc: ReplicaCalculator::default(),
        recorder: EventRecorder::new(client.clone(), "horizontal-pod-autoscaler"),
        downscale_window: DOWNSCALE_STABILIZATION,
        histories: Mutex::new(HashMap::new()),
        selectors: Mutex::new(HashMap::new()),
    });
    for store in [&ctx.pods] {
        if crate::client::cache_sync::wait_for_cache_sync(store).await.is_err() {
            return;
        }
    }
    // A change asks for a sync one period on; a deletion forgets the
    // autoscaler's past.
    let watch_ctx = ctx.clone();
    let from_changes = changes.filter_map(move |change| {
        let request = match change {
            Change::Listed(o) | Change::Applied { new: o, .. } => {
                let key = object_key(&o);
                watch_ctx.selectors.locked().entry(key.clone()).or_insert(None);
                Some(ScheduleRequest { message: key, run_at: tokio::time::Instant::now() + SYNC_PERIOD })
            }
            Change::Deleted(o) => {
                watch_ctx.forget(&object_key(&o));
                None
            }
            Change::Relist | Change::Synced => None,
        };
        std::future::ready(request)
    });
    let (requeue, requeued) = tokio::sync::mpsc::unbounded_channel::<ScheduleRequest<String>>();
    let due = scheduler(stream::select(from_changes, UnboundedReceiverStream::new(requeued)));
    let in_flight: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
    due.for_each_concurrent(WORKERS, |key| {
        let (ctx, requeue, in_flight) = (ctx.clone(), requeue.clone(), in_flight.clone());
        async move {
            if !in_flight.locked().insert(key.clone()) {
                // Still syncing from the last period: look again a period on.
                let _ =
                    requeue.send(ScheduleRequest { message: key, run_at: tokio::time::Instant::now() + SYNC_PERIOD });
                return;
            }
            let exists = reconcile_key(&ctx, &key).await;
            in_flight.locked().remove(&key);
            if exists {
                let _ =
                    requeue.send(ScheduleRequest { message: key, run_at: tokio::time::Instant::now() + SYNC_PERIOD });
            }
        }
    })
    .await;
}
