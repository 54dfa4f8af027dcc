//! Node, pod and container resource usage, as the kubelet serves it:
//! `/stats/summary` (JSON) and the Prometheus endpoints `/metrics/resource`,
//! `/metrics/cadvisor` and `/metrics`. Everything is read when asked; the
//! only state kept is each cgroup's last CPU reading, for rates.

pub mod cgroup;
pub mod prometheus;
pub mod rate;
pub mod summary;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

pub use summary::{StatsProvider, Summary};

fn metrics_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// `GET /stats/summary`.
pub async fn serve_stats_summary(stats: &StatsProvider) -> Response {
    match stats.summary().await {
        Ok(s) => axum::Json(s).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot collect node stats");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("Internal Error: failed to get node info: {e}")).into_response()
        }
    }
}

/// `GET /metrics/resource`.
pub async fn serve_resource_metrics(stats: &StatsProvider) -> Response {
    let summary = stats.summary().await.inspect_err(|e| tracing::warn!(error = %e, "cannot collect resource metrics"));
    metrics_response(prometheus::resource_metrics(summary.as_ref().ok()))
}

/// `GET /metrics/cadvisor`.
pub async fn serve_cadvisor_metrics(stats: &StatsProvider) -> Response {
    match stats.summary().await {
        Ok(s) => metrics_response(prometheus::cadvisor_metrics(&s)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /metrics`.
pub async fn serve_kubelet_metrics(stats: &StatsProvider) -> Response {
    let summary = stats.summary().await.ok();
    metrics_response(prometheus::kubelet_metrics(&stats.node_name, summary.as_ref()))
}
