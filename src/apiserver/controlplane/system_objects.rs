//! What a new cluster has before anyone asks: the namespaces default,
//! kube-system, kube-public and kube-node-lease, and the `kubernetes`
//! Service (its Endpoints and EndpointSlice, every live server, are the
//! lease endpoint reconciler's: `endpoint_reconciler.rs`), the `kube-dns` Service of the cluster DNS (its EndpointSlice is the
//! cluster-dns controller's), and the local APIService of each built-in
//! group/version.
//! Run at every start; what exists is kept, what is missing is made.

use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::WriteError;
use crate::apiserver::Api;
use crate::net::NthAddr;

fn object(api_version: &str, kind: &str, namespace: Option<&str>, name: &str, labels: Value) -> Value {
    let mut metadata = json!({
        "name": name,
        "uid": meta::new_uid(),
        "creationTimestamp": meta::now_rfc3339(),
        "labels": labels,
    });
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
}

async fn ensure(api: &Api, key: &str, obj: Value) -> ApiResult<()> {
    match api.storage.create(key, &obj).await {
        Ok(_) | Err(WriteError::Exists) => Ok(()),
        Err(WriteError::Changed(_)) => Ok(()),
        Err(WriteError::Api(e)) => Err(e),
    }
}

/// Replaces an object the server owns when its content drifted.
async fn reconcile(api: &Api, key: &str, mut obj: Value, fields: &[&str]) -> ApiResult<()> {
    match api.storage.get(key).await? {
        None => ensure(api, key, obj).await,
        Some(current) => {
            let same = fields.iter().all(|f| current.object.get(*f) == obj.get(*f));
            if same {
                return Ok(());
            }
            obj["metadata"] = current.object["metadata"].clone();
            match api.storage.update(key, &obj, current.rev).await {
                Ok(_) | Err(WriteError::Changed(_)) | Err(WriteError::Exists) => Ok(()),
                Err(WriteError::Api(e)) => Err(e),
            }
        }
    }
}

pub async fn run(api: &Api) -> ApiResult<()> {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let mut obj = object("v1", "Namespace", None, ns, json!({"kubernetes.io/metadata.name": ns}));
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        obj["status"] = json!({"phase": "Active"});
        ensure(api, &format!("/registry/namespaces/{ns}"), obj).await?;
    }
    let cfg = &api.config;
    let service_ip = cfg.service_cidr.nth(1).to_string();
    let labels = json!({"component": "apiserver", "provider": "kubernetes"});
    let mut svc = object("v1", "Service", Some("default"), "kubernetes", labels.clone());
    svc["spec"] = json!({
        "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": cfg.https_port}],
        "clusterIP": service_ip, "clusterIPs": [service_ip],
        "type": "ClusterIP", "sessionAffinity": "None",
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
    });
    svc["status"] = json!({"loadBalancer": {}});
    reconcile(api, "/registry/services/default/kubernetes", svc, &["spec"]).await?;

    // The default ServiceCIDR, as upstream 1.33 records it.
    let mut cidr = object("networking.k8s.io/v1", "ServiceCIDR", None, "kubernetes", json!({}));
    cidr["spec"] = json!({"cidrs": [cfg.service_cidr.to_string()]});
    cidr["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "Kubernetes Service CIDR is ready", "lastTransitionTime": meta::now_rfc3339()}]});
    ensure(api, "/registry/networking.k8s.io/servicecidrs/kubernetes", cidr).await?;

    match cfg.cluster_dns {
        Some(ip) => kube_dns_service(api, ip).await?,
        // The cluster DNS is turned off (`--disable coredns`): its Service goes.
        // (Not a kube-dns Service of the user's own DNS: ours has no selector.)
        None => remove(api, "/registry/services/kube-system/kube-dns", |s| s["spec"]["selector"].is_null()).await?,
    }

    // A local APIService for each built-in group/version this server serves.
    if let Some(apiservices) = api.registry.get("apiregistration.k8s.io", "v1", "apiservices") {
        let now = meta::now_rfc3339();
        let served: std::collections::BTreeSet<(String, String)> =
            api.registry.all().iter().map(|r| (r.group.clone(), r.version.clone())).collect();
        for (group, version) in &served {
            if let Some(mut obj) = crate::apiserver::kinds::local_apiservice(group, version, &now) {
                obj["metadata"]["uid"] = json!(meta::new_uid());
                obj["metadata"]["creationTimestamp"] = json!(now);
                let name = format!("{version}.{group}");
                ensure(api, &apiservices.key(None, &name), obj).await?;
            }
        }
        // A local APIService of a group no longer served (metrics.k8s.io
        // with `--disable metrics-server`) goes.
        let (stored, _) = api.storage.list_all(&apiservices.key_prefix()).await?;
        for s in stored {
            let spec = |f: &str| s.object["spec"][f].as_str().unwrap_or_default().to_string();
            let local = s.object["metadata"]["labels"][crate::apiserver::kinds::AUTOMANAGED_LABEL].is_string()
                && s.object["spec"]["service"].is_null();
            if local && !served.contains(&(spec("group"), spec("version"))) {
                let name = s.object["metadata"]["name"].as_str().unwrap_or_default().to_string();
                remove(api, &apiservices.key(None, &name), |_| true).await?;
            }
        }
    }
    Ok(())
}

/// Deletes an object the server made, if it is there and `owned` says it is ours.
async fn remove(api: &Api, key: &str, owned: impl Fn(&Value) -> bool) -> ApiResult<()> {
    if let Some(current) = api.storage.get(key).await? {
        if owned(&current.object) {
            match api.storage.delete(key, current.rev).await {
                Ok(_) | Err(WriteError::Changed(_)) | Err(WriteError::Exists) => {}
                Err(WriteError::Api(e)) => return Err(e),
            }
            tracing::info!(key, "removed: its part is disabled");
        }
    }
    Ok(())
}

/// The `kube-dns` Service tools look for (k3s' labels, CoreDNS' port
/// names), with no selector: the cluster-dns controller keeps its
/// EndpointSlice (every node's own DNS), and `internalTrafficPolicy: Local`
/// keeps each pod's queries on its node.
async fn kube_dns_service(api: &Api, ip: std::net::IpAddr) -> ApiResult<()> {
    let in_range = match ip {
        std::net::IpAddr::V4(v4) => api.config.service_cidr.contains(&v4),
        std::net::IpAddr::V6(_) => false,
    };
    if !in_range {
        tracing::warn!(cluster_dns = %ip, service_cidr = %api.config.service_cidr,
            "--cluster-dns is outside the service CIDR: no kube-dns Service");
        return Ok(());
    }
    let labels =
        json!({"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"});
    let mut svc = object("v1", "Service", Some("kube-system"), "kube-dns", labels);
    let ip = ip.to_string();
    svc["spec"] = json!({
        "ports": [
            {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 53},
            {"name": "dns-tcp", "protocol": "TCP", "port": 53, "targetPort": 53},
        ],
        "clusterIP": ip, "clusterIPs": [ip],
        "type": "ClusterIP", "sessionAffinity": "None",
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Local",
    });
    svc["status"] = json!({"loadBalancer": {}});
    reconcile(api, "/registry/services/kube-system/kube-dns", svc, &["spec"]).await
}
