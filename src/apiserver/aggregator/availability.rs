//! Whether each aggregated APIService can be reached (upstream's remote
//! AvailableConditionController): its Service exists and listens on the
//! port, a ready endpoint has that port, and the other server answers its
//! discovery path, asked as `system:kube-aggregator` in `system:masters`.
//! The outcome is the APIService's `Available` condition with upstream's
//! reasons (`ServiceNotFound`, `ServicePortError`, `EndpointsNotFound`,
//! `MissingEndpoints`, `FailedDiscoveryCheck`, `Passed`), written only when
//! it changes; the discovery answer is kept for aggregated discovery.
//! Checked when the APIServices change and every 30 s (upstream's resync),
//! and not at all while no APIService is served elsewhere.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::proxy::{self, Unreachable};
use super::{Remote, PREFIX};
use crate::apiserver::auth::User;
use crate::apiserver::meta;
use crate::apiserver::Api;

const RESYNC: Duration = Duration::from_secs(30);
/// How long the discovery check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(6);
/// The largest discovery answer kept.
const MAX_DISCOVERY_BYTES: usize = 4 << 20;

pub async fn run(api: Arc<Api>) {
    loop {
        let remotes = api.aggregator.remotes();
        for remote in &remotes {
            let outcome = check(&api, remote).await;
            write_condition(&api, &remote.name, outcome).await;
        }
        if remotes.is_empty() {
            api.aggregator.changed.notified().await;
        } else {
            tokio::select! {
                _ = api.aggregator.changed.notified() => {}
                _ = tokio::time::sleep(RESYNC) => {}
            }
        }
    }
}

/// The aggregator's identity for the discovery check: always allowed.
fn checker() -> User {
    User { name: "system:kube-aggregator".into(), groups: vec!["system:masters".into()] }
}

/// Reaches the remote and reads its discovery document.
async fn check(api: &Api, remote: &Remote) -> Result<(), Unreachable> {
    let addr = proxy::endpoint(api, remote).await?;
    let path = format!("/apis/{}/{}", remote.group, remote.version);
    let url = format!("https://{addr}{path}");
    let failed = |why: String| Unreachable {
        reason: "FailedDiscoveryCheck",
        message: format!("failing or missing response from {url}: {why}"),
    };
    let req = hyper::Request::get(&path)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Body::empty())
        .map_err(|e| failed(e.to_string()))?;
    let exchange = async {
        let resp = proxy::send_with(api, remote, &remote.check_tls, &checker(), req).await.map_err(|e| e.message)?;
        let status = resp.status();
        if !(status.is_success() || status.is_redirection()) {
            return Err(format!("bad status from {url}: {}", status.as_u16()));
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_DISCOVERY_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(serde_json::from_slice::<Value>(&body).ok())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, exchange).await {
        Ok(Ok(list)) => {
            api.aggregator.set_discovery(&remote.name, list.filter(|l| l["kind"] == "APIResourceList"));
            Ok(())
        }
        Ok(Err(why)) => Err(failed(why)),
        Err(_) => Err(Unreachable { reason: "FailedDiscoveryCheck", message: format!("timed out waiting for {url}") }),
    }
}

/// The `Available` condition of an outcome.
fn condition(outcome: &Result<(), Unreachable>) -> (&'static str, &'static str, String) {
    match outcome {
        Ok(()) => ("True", "Passed", "all checks passed".into()),
        Err(u) => ("False", u.reason, u.message.clone()),
    }
}

/// Writes the APIService's `Available` condition when it changed; a lost
/// race is left to the next check.
async fn write_condition(api: &Api, name: &str, outcome: Result<(), Unreachable>) {
    let key = format!("{PREFIX}{name}");
    let Ok(Some(stored)) = api.storage.get(&key).await else { return };
    let (status, reason, message) = condition(&outcome);
    let conditions = stored.object.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let old = conditions.iter().find(|c| c["type"] == "Available");
    if old.is_some_and(|c| c["status"] == status && c["reason"] == reason && c["message"] == message.as_str()) {
        return;
    }
    let since = match old {
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => json!(meta::now_rfc3339()),
    };
    let available = json!({"type": "Available", "status": status, "lastTransitionTime": since, "reason": reason, "message": message});
    let mut updated = stored.object.clone();
    let mut others: Vec<Value> = conditions.into_iter().filter(|c| c["type"] != "Available").collect();
    others.insert(0, available);
    updated["status"] = json!({"conditions": others});
    if status != "True" {
        tracing::info!(apiservice = %name, %reason, %message, "APIService not available");
    }
    if let Err(e) = api.storage.update(&key, &updated, stored.rev).await {
        tracing::debug!(apiservice = %name, error = ?e, "APIService status update lost a race; the next check retries");
    }
}
