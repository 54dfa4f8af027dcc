//! `/livez`, `/readyz` and `/healthz` as upstream's apiserver serves them:
//! named checks run on every request, each listed under `?verbose` as
//! `[+]name ok` or `[-]name failed: reason withheld` (the reason goes to the
//! log only, the endpoints being public), then `<endpoint> check passed` or
//! `failed`. A failure always answers 500 with the whole list;
//! `?exclude=name` skips a check; `/readyz/<name>` runs one alone.
//!
//! The checks: `ping`; `log` (the log is not blocked); `etcd` and, for
//! readiness, `etcd-readiness` (the store answers a read within a timeout,
//! embedded or external); `informer-sync` (the API server's caches have
//! loaded); `poststarthook/<name>` for each start-up step, named as
//! upstream names its hook; `shutdown` (readiness turns red once the
//! process is stopping).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Api;
use crate::store::proto::RangeRequest;
use crate::store::{Store, StoreError};
use crate::sync::LockExt;

/// Upstream's default `--etcd-healthcheck-timeout` and `--etcd-readycheck-timeout`.
pub const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// The key the store check reads (upstream: `/<prefix>/health`).
const HEALTH_KEY: &[u8] = b"/registry/health";
/// The log counts as blocked when it has not been flushed for this long.
const LOG_BLOCKED_AFTER: Duration = Duration::from_secs(120);

/// The start-up steps, by upstream's post-start hook names.
pub mod hooks {
    /// The API server's own caches (upstream's shared informers) are started.
    pub const START_INFORMERS: &str = "generic-apiserver-start-informers";
    /// CustomResourceDefinitions are loaded and followed.
    pub const APIEXTENSIONS_CONTROLLERS: &str = "start-apiextensions-controllers";
    pub const CRD_INFORMER_SYNCED: &str = "crd-informer-synced";
    /// The default namespaces and the `kubernetes` Service exist.
    pub const BOOTSTRAP_CONTROLLER: &str = "bootstrap-controller";
    /// The default RBAC roles and bindings exist.
    pub const RBAC_BOOTSTRAP_ROLES: &str = "rbac/bootstrap-roles";

    pub const ALL: &[&str] =
        &[START_INFORMERS, APIEXTENSIONS_CONTROLLERS, CRD_INFORMER_SYNCED, BOOTSTRAP_CONTROLLER, RBAC_BOOTSTRAP_ROLES];
}

/// The three endpoints; they differ in which checks they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Livez,
    Readyz,
    Healthz,
}

impl Endpoint {
    pub fn from_path(path: &str) -> Option<(Endpoint, Option<&str>)> {
        let (root, rest) = match path.trim_start_matches('/').split_once('/') {
            Some((root, rest)) => (root, Some(rest).filter(|r| !r.is_empty())),
            None => (path.trim_start_matches('/'), None),
        };
        let endpoint = match root {
            "livez" => Endpoint::Livez,
            "readyz" => Endpoint::Readyz,
            "healthz" => Endpoint::Healthz,
            _ => return None,
        };
        Some((endpoint, rest))
    }

    fn name(self) -> &'static str {
        match self {
            Endpoint::Livez => "livez",
            Endpoint::Readyz => "readyz",
            Endpoint::Healthz => "healthz",
        }
    }

    /// The checks this endpoint runs, in upstream's order.
    fn checks(self) -> Vec<String> {
        let mut names: Vec<String> = vec!["ping".into(), "log".into(), "etcd".into()];
        if self == Endpoint::Readyz {
            names.push("etcd-readiness".into());
            names.push("informer-sync".into());
        }
        names.extend(hooks::ALL.iter().map(|h| format!("poststarthook/{h}")));
        if self == Endpoint::Readyz {
            names.push("shutdown".into());
        }
        names
    }
}

/// Why a check fails; the reason goes to the log (and to `/readyz/<name>`
/// alone), as upstream's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CheckFailed {
    #[error("error getting data from etcd: {0}")]
    StoreRead(#[source] Arc<StoreError>),
    #[error("error getting data from etcd: context deadline exceeded")]
    StoreTimeout,
    #[error("logging blocked")]
    LogBlocked,
    #[error("informers not started yet")]
    InformersNotSynced,
    #[error("process is shutting down")]
    ShuttingDown,
    #[error("not finished")]
    HookNotFinished,
}

/// What the checks need beyond the rest of the API server.
pub struct Health {
    store: Arc<dyn Store>,
    /// The last store probe: when it started and what it found.
    probe: tokio::sync::Mutex<Option<(Instant, Result<(), CheckFailed>)>>,
    finished_hooks: Mutex<Vec<&'static str>>,
    shutting_down: AtomicBool,
}

impl Health {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Health {
            store,
            probe: tokio::sync::Mutex::new(None),
            finished_hooks: Mutex::new(Vec::new()),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Marks a post-start hook (one of `hooks::ALL`) finished.
    pub fn hook_finished(&self, name: &'static str) {
        let mut done = self.finished_hooks.locked();
        if !done.contains(&name) {
            done.push(name);
        }
    }

    fn hook_is_finished(&self, name: &str) -> bool {
        self.finished_hooks.locked().contains(&name)
    }

    /// Readiness turns red from now on: the process is stopping.
    pub fn shutdown_initiated(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Reads from the store within the timeout. Probes are spaced at least
    /// half the timeout apart, as upstream's; a request in between gets the
    /// last probe's answer.
    pub async fn store_answers(&self) -> Result<(), CheckFailed> {
        let mut last = self.probe.lock().await;
        if let Some((at, result)) = last.as_ref() {
            if at.elapsed() < STORE_CHECK_TIMEOUT / 2 {
                return result.clone();
            }
        }
        let started = Instant::now();
        let read = RangeRequest { key: HEALTH_KEY.to_vec(), limit: 1, ..Default::default() };
        let result = match tokio::time::timeout(STORE_CHECK_TIMEOUT, self.store.range(read)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(CheckFailed::StoreRead(Arc::new(e))),
            Err(_) => Err(CheckFailed::StoreTimeout),
        };
        *last = Some((started, result.clone()));
        result
    }
}

/// Seconds since the epoch at which the log was last flushed.
static LOG_FLUSHED_AT: AtomicU64 = AtomicU64::new(0);

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The log is not blocked: a thread flushes it every minute and notes the
/// time; a flush stuck on a full pipe stops the clock.
fn log_flushes() -> Result<(), CheckFailed> {
    static FLUSHER: OnceLock<()> = OnceLock::new();
    FLUSHER.get_or_init(|| {
        LOG_FLUSHED_AT.store(unix_secs(), Ordering::Release);
        let spawned = std::thread::Builder::new().name("log-flush".into()).spawn(|| loop {
            use std::io::Write;
            let _ = std::io::stderr().flush();
            LOG_FLUSHED_AT.store(unix_secs(), Ordering::Release);
            std::thread::sleep(Duration::from_secs(60));
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the log flusher");
        }
    });
    if log_blocked(LOG_FLUSHED_AT.load(Ordering::Acquire), unix_secs()) {
        return Err(CheckFailed::LogBlocked);
    }
    Ok(())
}

/// Whether a log last flushed at `flushed_at` is blocked at `now` (seconds).
fn log_blocked(flushed_at: u64, now: u64) -> bool {
    now.saturating_sub(flushed_at) > LOG_BLOCKED_AFTER.as_secs()
}

async fn run_check(api: &Api, name: &str) -> Option<Result<(), CheckFailed>> {
    let health = &api.health;
    let result = match name {
        "ping" => Ok(()),
        "log" => log_flushes(),
        "etcd" | "etcd-readiness" => health.store_answers().await,
        "informer-sync" => {
            if api.caches_synced() {
                Ok(())
            } else {
                Err(CheckFailed::InformersNotSynced)
            }
        }
        "shutdown" => {
            if health.shutting_down.load(Ordering::Acquire) {
                Err(CheckFailed::ShuttingDown)
            } else {
                Ok(())
            }
        }
        other => {
            let hook = other.strip_prefix("poststarthook/")?;
            if !hooks::ALL.contains(&hook) {
                return None;
            }
            if health.hook_is_finished(hook) {
                Ok(())
            } else {
                Err(CheckFailed::HookNotFinished)
            }
        }
    };
    Some(result)
}

fn text(code: StatusCode, body: String) -> Response {
    let headers = [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")];
    (code, headers, body).into_response()
}

/// Answers `/livez`, `/readyz`, `/healthz` and `/<endpoint>/<check>`.
pub async fn serve(api: &Api, path: &str, query: Option<&str>) -> Response {
    let Some((endpoint, single)) = Endpoint::from_path(path) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    };
    let params: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or_default()).unwrap_or_default();
    let checks = endpoint.checks();
    if let Some(name) = single {
        if !checks.iter().any(|c| c == name) {
            return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
        }
        return match run_check(api, name).await {
            Some(Ok(())) => text(StatusCode::OK, "ok".into()),
            Some(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {e}\n")),
            None => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
        };
    }
    let verbose = params.iter().any(|(k, _)| k == "verbose");
    let mut excluded: Vec<String> = params.into_iter().filter(|(k, _)| k == "exclude").map(|(_, v)| v).collect();
    let mut out = String::new();
    let mut failed = Vec::new();
    for name in &checks {
        if let Some(i) = excluded.iter().position(|e| e == name) {
            excluded.remove(i);
            out.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match run_check(api, name).await {
            Some(Err(reason)) => {
                out.push_str(&format!("[-]{name} failed: reason withheld\n"));
                tracing::debug!(check = %name, endpoint = endpoint.name(), %reason, "health check failed");
                failed.push(name.as_str());
            }
            _ => out.push_str(&format!("[+]{name} ok\n")),
        }
    }
    if !excluded.is_empty() {
        let quoted: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
        out.push_str(&format!("warn: some health checks cannot be excluded: no matches for {}\n", quoted.join(",")));
    }
    if !failed.is_empty() {
        tracing::info!(endpoint = endpoint.name(), checks = %failed.join(","), "health check failed");
        out.push_str(&format!("{} check failed\n", endpoint.name()));
        return text(StatusCode::INTERNAL_SERVER_ERROR, out);
    }
    if !verbose {
        return text(StatusCode::OK, "ok".into());
    }
    out.push_str(&format!("{} check passed\n", endpoint.name()));
    text(StatusCode::OK, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_their_checks() {
        assert_eq!(Endpoint::from_path("/readyz"), Some((Endpoint::Readyz, None)));
        assert_eq!(Endpoint::from_path("/readyz/etcd"), Some((Endpoint::Readyz, Some("etcd"))));
        assert_eq!(
            Endpoint::from_path("/livez/poststarthook/rbac/bootstrap-roles"),
            Some((Endpoint::Livez, Some("poststarthook/rbac/bootstrap-roles")))
        );
        assert_eq!(Endpoint::from_path("/version"), None);
        let ready = Endpoint::Readyz.checks();
        assert_eq!(ready.first().map(String::as_str), Some("ping"));
        assert_eq!(ready.last().map(String::as_str), Some("shutdown"));
        assert!(ready.iter().any(|c| c == "informer-sync"));
        let live = Endpoint::Livez.checks();
        assert!(!live.iter().any(|c| c == "shutdown" || c == "informer-sync"));
        assert!(live.iter().any(|c| c == "poststarthook/bootstrap-controller"));
    }

    #[test]
    fn the_log_is_flushed() {
        assert_eq!(log_flushes().map_err(|e| e.to_string()), Ok(()));
        // A flush older than two minutes means a stuck log.
        assert!(!log_blocked(1_000, 1_119));
        assert!(log_blocked(1_000, 1_121));
    }
}
