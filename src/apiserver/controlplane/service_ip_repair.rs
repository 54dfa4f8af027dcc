//! The IPAddress objects (networking.k8s.io/v1) of the Services' cluster
//! IPs, as upstream v1.33's allocator keeps them (MultiCIDRServiceAllocator,
//! GA and on by default): one per address a Service holds, named after the
//! address, labelled `ipaddress.kubernetes.io/ip-family` and
//! `ipaddress.kubernetes.io/managed-by: ipallocator.k8s.io`, its
//! `spec.parentRef` the Service. ferrok's allocator (`allocator`) hands the
//! addresses out under its lock; this follower of the store writes each
//! one's IPAddress once the Service holding it is stored, and deletes the
//! IPAddresses a Service let go (deleted, made headless or ExternalName),
//! as upstream's release and its RepairIPAddress loop do. At start, and
//! whenever its watch is made again, it reconciles every Service and
//! IPAddress; in between, each change of one.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};

use crate::apiserver::allocator::IP_ADDRESSES_PREFIX;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Change, Decoding, Stored, WriteError};
use crate::apiserver::{meta, Api};

const SERVICES_PREFIX: &str = "/registry/services/";
/// The managed-by value of the IPAddresses of Services' cluster IPs.
pub const MANAGED_BY: &str = "ipallocator.k8s.io";
const MANAGED_BY_LABEL: &str = "ipaddress.kubernetes.io/managed-by";
const FAMILY_LABEL: &str = "ipaddress.kubernetes.io/ip-family";
/// How long to wait before watching again after the watch failed.
const REWATCH: Duration = Duration::from_secs(2);

type Changes = Pin<Box<dyn Stream<Item = ApiResult<Change>> + Send>>;

/// A Service, as the parent of its addresses: (namespace, name).
type Parent = (String, String);

/// The cluster IPs a stored Service holds.
fn cluster_ips(svc: &Value) -> BTreeSet<String> {
    let ips = svc.pointer("/spec/clusterIPs").and_then(Value::as_array);
    let first = svc.pointer("/spec/clusterIP").and_then(Value::as_str);
    ips.into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .chain(first)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        .map(str::to_string)
        .collect()
}

fn parent_of(svc: &Value) -> Parent {
    (meta::namespace_of(svc).unwrap_or_default().to_string(), meta::name_of(svc).to_string())
}

/// The Service an IPAddress managed by the allocator names as its parent.
fn managed_parent(address: &Value) -> Option<Parent> {
    let managed = address.pointer("/metadata/labels").and_then(|l| l.get(MANAGED_BY_LABEL)).and_then(Value::as_str);
    if managed != Some(MANAGED_BY) {
        return None;
    }
    let r = address.pointer("/spec/parentRef")?;
    let field = |f: &str| r.get(f).and_then(Value::as_str).unwrap_or_default().to_string();
    (field("resource") == "services" && field("group").is_empty()).then(|| (field("namespace"), field("name")))
}

/// The IPAddress object of `ip` held by `parent`.
fn ip_address(ip: &str, parent: &Parent) -> Value {
    let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IPAddress",
        "metadata": {
            "name": ip,
            "uid": meta::new_uid(),
            "creationTimestamp": meta::now_rfc3339(),
            "labels": {FAMILY_LABEL: family, MANAGED_BY_LABEL: MANAGED_BY},
        },
        "spec": {"parentRef": {"resource": "services", "namespace": parent.0, "name": parent.1}},
    })
}

fn key_of(ip: &str) -> String {
    format!("{IP_ADDRESSES_PREFIX}{ip}")
}

/// Keeps the IPAddresses of the Services' cluster IPs.
pub struct RepairIpAddress {
    api: Arc<Api>,
}

impl RepairIpAddress {
    pub fn new(api: Arc<Api>) -> Self {
        RepairIpAddress { api }
    }

    /// Reconciles everything, then follows the changes, until the process ends.
    pub async fn run(self) {
        loop {
            match self.resync().await {
                Ok(changes) => self.follow(changes).await,
                Err(e) => tracing::warn!(error = %e, "cannot reconcile the Services' IPAddresses"),
            }
            tokio::time::sleep(REWATCH).await;
        }
    }

    /// Every Service's addresses written, every orphan deleted; the watch
    /// of both kinds from the revision read.
    async fn resync(&self) -> ApiResult<Changes> {
        let (services, rev) = self.api.storage.list_all(SERVICES_PREFIX).await?;
        let held: BTreeMap<String, Parent> = services
            .iter()
            .flat_map(|s| cluster_ips(&s.object).into_iter().map(move |ip| (ip, parent_of(&s.object))))
            .collect();
        let (addresses, _) = self.api.storage.list_all(IP_ADDRESSES_PREFIX).await?;
        for address in &addresses {
            let ip = meta::name_of(&address.object).to_string();
            if let Some(parent) = managed_parent(&address.object) {
                if held.get(&ip) != Some(&parent) {
                    self.delete_if_unchanged(address).await?;
                }
            }
        }
        for (ip, parent) in &held {
            self.ensure(ip, parent).await?;
        }
        let storage = &self.api.storage;
        let hour = Duration::from_secs(3600);
        let services: Changes =
            Box::pin(storage.watch(SERVICES_PREFIX, false, rev, hour, Decoding::NEW_AND_OLD).await?);
        let addresses: Changes = Box::pin(storage.watch(IP_ADDRESSES_PREFIX, false, rev, hour, Decoding::NEW).await?);
        Ok(Box::pin(futures_util::stream::select(services, addresses)))
    }

    async fn follow(&self, mut changes: Changes) {
        while let Some(change) = changes.next().await {
            let result = match change {
                Ok(Change::Added(s)) | Ok(Change::Modified { new: s, old: None }) => {
                    self.changed(&s.object, None).await
                }
                Ok(Change::Modified { new, old: Some(old) }) => self.changed(&new.object, Some(&old.object)).await,
                Ok(Change::Deleted(s)) => self.deleted(&s.object).await,
                Ok(Change::Progress(_)) => Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, "the Services' IPAddress watch ended");
                    return;
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "cannot reconcile a Service's IPAddresses");
                return;
            }
        }
    }

    fn is_service(obj: &Value) -> bool {
        obj.get("kind").and_then(Value::as_str) == Some("Service")
    }

    /// A Service written: its addresses held, the ones it let go released.
    async fn changed(&self, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
        if !Self::is_service(obj) {
            return Ok(());
        }
        let parent = parent_of(obj);
        let now = cluster_ips(obj);
        let before = old.map(cluster_ips);
        // Most writes of a Service (its status, its labels) keep its
        // addresses: their IPAddresses are there already.
        if before.as_ref() == Some(&now) {
            return Ok(());
        }
        for ip in &now {
            self.ensure(ip, &parent).await?;
        }
        for ip in before.unwrap_or_default().difference(&now) {
            self.release(ip, &parent).await?;
        }
        Ok(())
    }

    /// A Service deleted: its addresses released; an IPAddress of a
    /// Service that still holds the address is written again.
    async fn deleted(&self, obj: &Value) -> ApiResult<()> {
        if Self::is_service(obj) {
            let parent = parent_of(obj);
            for ip in cluster_ips(obj) {
                self.release(&ip, &parent).await?;
            }
            return Ok(());
        }
        let ip = meta::name_of(obj).to_string();
        let Some(parent) = managed_parent(obj) else { return Ok(()) };
        let key = format!("{SERVICES_PREFIX}{}/{}", parent.0, parent.1);
        if let Some(svc) = self.api.storage.get(&key).await? {
            if cluster_ips(&svc.object).contains(&ip) {
                self.ensure(&ip, &parent).await?;
            }
        }
        Ok(())
    }

    /// Writes the IPAddress of `ip` unless it exists (anyone's: an address
    /// held by another object is left to it).
    async fn ensure(&self, ip: &str, parent: &Parent) -> ApiResult<()> {
        let key = key_of(ip);
        if self.api.storage.get(&key).await?.is_some() {
            return Ok(());
        }
        match self.api.storage.create(&key, &ip_address(ip, parent)).await {
            Ok(_) => {
                tracing::debug!(ip, service = %format!("{}/{}", parent.0, parent.1), "IPAddress written");
                Ok(())
            }
            Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(()),
            Err(WriteError::Api(e)) => Err(e),
        }
    }

    /// Deletes the IPAddress of `ip` if `parent` holds it.
    async fn release(&self, ip: &str, parent: &Parent) -> ApiResult<()> {
        match self.api.storage.get(&key_of(ip)).await? {
            Some(address) if managed_parent(&address.object).as_ref() == Some(parent) => {
                self.delete_if_unchanged(&address).await
            }
            _ => Ok(()),
        }
    }

    async fn delete_if_unchanged(&self, address: &Stored) -> ApiResult<()> {
        let ip = meta::name_of(&address.object).to_string();
        match self.api.storage.delete(&key_of(&ip), address.rev).await {
            Ok(_) => {
                tracing::debug!(ip = %ip, "IPAddress released");
                Ok(())
            }
            // Written meanwhile: the next change decides.
            Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(()),
            Err(WriteError::Api(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_address_names_its_service() {
        let svc = json!({"kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                         "spec": {"clusterIP": "10.43.0.7", "clusterIPs": ["10.43.0.7"]}});
        assert_eq!(cluster_ips(&svc).into_iter().collect::<Vec<_>>(), ["10.43.0.7"]);
        let headless = json!({"spec": {"clusterIP": "None", "clusterIPs": ["None"]}});
        assert!(cluster_ips(&headless).is_empty());
        let address = ip_address("10.43.0.7", &parent_of(&svc));
        assert_eq!(address["metadata"]["labels"][FAMILY_LABEL], "IPv4");
        assert_eq!(address["spec"]["parentRef"], json!({"resource": "services", "namespace": "shop", "name": "web"}));
        assert_eq!(managed_parent(&address), Some(("shop".into(), "web".into())));
        let users_own =
            json!({"metadata": {"name": "10.43.0.9"}, "spec": {"parentRef": {"resource": "services", "name": "x"}}});
        assert_eq!(managed_parent(&users_own), None);
    }
}
