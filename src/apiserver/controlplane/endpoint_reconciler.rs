//! The `kubernetes` Service's endpoints: every live API server, as
//! upstream's lease endpoint reconciler keeps them. Each server holds a
//! record under `/registry/masterleases/<ip>` attached to a store lease
//! (TTL 15 s, renewed every 10 s), and rewrites the Endpoints and the
//! EndpointSlice `default/kubernetes` to the set of records whenever that
//! set changes (watched) and at each renewal: itself at start, without
//! itself on a clean shutdown, without a server whose lease expired. Agents read the
//! EndpointSlice to know every server they can fail over to.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};

use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{Change, Decoding, WriteError};
use crate::apiserver::{meta, Api};
use crate::store::proto::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest};

/// Where the servers' lease records live, one key per advertise address.
pub const MASTER_LEASES_PREFIX: &str = "/registry/masterleases/";
/// How long a record outlives its server's last renewal (upstream's default).
pub const MASTER_LEASE_TTL_SECONDS: i64 = 15;
/// How often a server renews its record (upstream's reconcile interval).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);

const ENDPOINTS_KEY: &str = "/registry/endpoints/default/kubernetes";
const SLICE_KEY: &str = "/registry/discovery.k8s.io/endpointslices/default/kubernetes";
/// Writes lost to another server's write of the same object are retried this often.
const CONFLICT_RETRIES: usize = 5;

type Changes = Pin<Box<dyn Stream<Item = ApiResult<Change>> + Send>>;

/// This server's record and the reconciliation of the `kubernetes` endpoints.
pub struct LeaseEndpointReconciler {
    api: Arc<Api>,
    ip: IpAddr,
    port: u16,
    lease: i64,
}

impl LeaseEndpointReconciler {
    /// Writes this server's record and reconciles the endpoints once.
    pub async fn start(api: Arc<Api>) -> ApiResult<LeaseEndpointReconciler> {
        let mut r = LeaseEndpointReconciler { ip: api.config.advertise_ip, port: api.config.https_port, api, lease: 0 };
        r.write_record().await?;
        r.reconcile(true).await?;
        Ok(r)
    }

    fn record_key(&self) -> String {
        format!("{MASTER_LEASES_PREFIX}{}", self.ip)
    }

    /// A new lease and this server's record on it.
    async fn write_record(&mut self) -> ApiResult<()> {
        let store = self.api.storage.store();
        let granted = store.lease_grant(LeaseGrantRequest { ttl: MASTER_LEASE_TTL_SECONDS, id: 0 }).await?;
        let record = json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": self.ip.to_string(), "creationTimestamp": meta::now_rfc3339()},
            "subsets": [{"addresses": [{"ip": self.ip.to_string()}], "ports": [{"port": self.port, "protocol": "TCP"}]}],
        });
        let value = serde_json::to_vec(&record).map_err(|e| ApiError::internal(e.to_string()))?;
        store
            .put(PutRequest { key: self.record_key().into_bytes(), value, lease: granted.id, ..Default::default() })
            .await?;
        self.lease = granted.id;
        tracing::debug!(ip = %self.ip, lease = granted.id, "wrote this server's master lease");
        Ok(())
    }

    /// Renews the lease; a lease that is gone (expired while this server
    /// could not reach the store) is replaced with a new record.
    async fn renew(&mut self) -> ApiResult<()> {
        let resp = self.api.storage.store().lease_keep_alive(LeaseKeepAliveRequest { id: self.lease }).await;
        match resp {
            Ok(r) if r.ttl > 0 => Ok(()),
            Ok(_) | Err(crate::store::StoreError::LeaseNotFound) => {
                tracing::info!(ip = %self.ip, "this server's master lease expired: writing it again");
                self.write_record().await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The addresses of the live servers (with or without this one).
    async fn live_servers(&self, include_self: bool) -> ApiResult<BTreeSet<IpAddr>> {
        let (records, _) = self.api.storage.list_all(MASTER_LEASES_PREFIX).await?;
        let mut ips: BTreeSet<IpAddr> = records
            .iter()
            .filter_map(|r| r.object.pointer("/metadata/name").and_then(Value::as_str))
            .filter_map(|name| name.parse().ok())
            .collect();
        // Our own record may not be visible yet; on shutdown it is going.
        if include_self {
            ips.insert(self.ip);
        } else {
            ips.remove(&self.ip);
        }
        Ok(ips)
    }

    /// Makes the Endpoints and EndpointSlice `default/kubernetes` list the live servers.
    async fn reconcile(&self, include_self: bool) -> ApiResult<()> {
        let ips = self.live_servers(include_self).await?;
        let addresses: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let port = json!([{"name": "https", "port": self.port, "protocol": "TCP"}]);
        let subsets = if addresses.is_empty() {
            json!([])
        } else {
            json!([{"addresses": addresses.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(), "ports": port}])
        };
        let mut ep = new_object("v1", "Endpoints", json!({"endpointslice.kubernetes.io/skip-mirror": "true"}));
        ep["subsets"] = subsets;
        write_if_changed(&self.api, ENDPOINTS_KEY, ep, &["subsets"]).await?;

        let mut slice = new_object(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            json!({"kubernetes.io/service-name": "kubernetes", "endpointslice.kubernetes.io/managed-by": "ferrok.io/apiserver"}),
        );
        slice["addressType"] = json!("IPv4");
        slice["endpoints"] =
            addresses.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Value>();
        slice["ports"] = port;
        write_if_changed(&self.api, SLICE_KEY, slice, &["endpoints", "ports"]).await?;
        tracing::debug!(servers = ?addresses, "reconciled the kubernetes endpoints");
        Ok(())
    }

    /// A watch of the records after the current revision.
    async fn watch_records(&self) -> ApiResult<Changes> {
        let (_, rev) = self.api.storage.list_all(MASTER_LEASES_PREFIX).await?;
        let changes =
            self.api.storage.watch(MASTER_LEASES_PREFIX, false, rev, Duration::from_secs(3600), Decoding::NEW).await?;
        Ok(Box::pin(changes))
    }

    /// Renews the record every `RENEW_INTERVAL` and reconciles whenever a
    /// record comes or goes, until `stop`; then removes this server's
    /// record and itself from the endpoints.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(RENEW_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut changes: Option<Changes> = None;
        let mut want_watch = true;
        loop {
            if changes.is_none() && want_watch {
                // (Re)watched at start and at renewals, never in a tight loop.
                want_watch = false;
                match self.watch_records().await {
                    Ok(c) => changes = Some(c),
                    Err(e) => tracing::warn!(error = %e, "cannot watch the master leases"),
                }
                // Records may have changed while nobody watched.
                if let Err(e) = self.reconcile(true).await {
                    tracing::warn!(error = %e, "cannot reconcile the kubernetes endpoints");
                }
            }
            tokio::select! {
                _ = stop.changed() => break,
                _ = tick.tick() => {
                    want_watch = true;
                    if let Err(e) = self.renew().await {
                        tracing::warn!(error = %e, "cannot renew this server's master lease");
                    }
                    // As upstream, each renewal also reconciles: it heals what
                    // no record change announces (a peer's clean shutdown
                    // that took a shared address out).
                    if let Err(e) = self.reconcile(true).await {
                        tracing::warn!(error = %e, "cannot reconcile the kubernetes endpoints");
                    }
                }
                change = next(&mut changes) => match change {
                    Some(Ok(Change::Progress(_))) => {}
                    Some(Ok(_)) => {
                        if let Err(e) = self.reconcile(true).await {
                            tracing::warn!(error = %e, "cannot reconcile the kubernetes endpoints");
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "the master lease watch ended");
                        changes = None;
                    }
                    None => changes = None,
                },
            }
        }
        self.remove().await;
    }

    /// Takes this server out: its record goes with its lease, then the endpoints follow.
    async fn remove(&self) {
        if let Err(e) = self.api.storage.store().lease_revoke(LeaseRevokeRequest { id: self.lease }).await {
            tracing::warn!(error = %e, "cannot revoke this server's master lease");
        }
        match self.reconcile(false).await {
            Ok(()) => tracing::info!(ip = %self.ip, "removed this server from the kubernetes endpoints"),
            Err(e) => tracing::warn!(error = %e, "cannot remove this server from the kubernetes endpoints"),
        }
    }
}

async fn next(changes: &mut Option<Changes>) -> Option<ApiResult<Change>> {
    match changes {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

fn new_object(api_version: &str, kind: &str, labels: Value) -> Value {
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {
            "name": "kubernetes", "namespace": "default", "uid": meta::new_uid(),
            "creationTimestamp": meta::now_rfc3339(), "labels": labels,
        },
    })
}

/// Creates `key` or replaces the `fields` that differ, keeping its
/// metadata; a write lost to another server is read again and retried.
async fn write_if_changed(api: &Api, key: &str, mut obj: Value, fields: &[&str]) -> ApiResult<()> {
    for _ in 0..CONFLICT_RETRIES {
        let result = match api.storage.get(key).await? {
            None => api.storage.create(key, &obj).await.map(|_| ()),
            Some(current) => {
                if fields.iter().all(|f| current.object.get(*f) == obj.get(*f)) {
                    return Ok(());
                }
                obj["metadata"] = current.object["metadata"].clone();
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                api.storage.update(key, &obj, current.rev).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => return Ok(()),
            Err(WriteError::Exists) | Err(WriteError::Changed(_)) => continue,
            Err(WriteError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::internal(format!("{key} kept changing while it was reconciled")))
}
