//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook: the matching
//! webhooks of the stored configurations are called over HTTPS with an
//! `admission.k8s.io/v1` AdmissionReview; mutating ones may answer with a
//! JSON patch. A webhook behind a Service is reached at one of the
//! Service's ready endpoints, with the Service's DNS name for TLS.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

use super::Operation;
use crate::apiserver::call::Call;
use crate::apiserver::selector::LabelSelector;
use crate::apiserver::status::{ApiError, ApiResult};

/// Where to send a review: address to dial, TLS name and path.
struct Target {
    addr: String,
    server_name: String,
    path: String,
}

fn matches_list(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|a| a.iter().any(|v| v == "*" || v.as_str() == Some(want)))
}

fn rule_matches(rule: &Value, call: &Call, op: Operation) -> bool {
    let r = &call.resource;
    let resource = match &call.path.subresource {
        Some(s) => format!("{}/{s}", r.plural),
        None => r.plural.clone(),
    };
    let ops_ok = matches_list(&rule["operations"], op.as_str());
    let groups_ok = matches_list(&rule["apiGroups"], &r.group);
    let versions_ok = matches_list(&rule["apiVersions"], &r.version);
    let resources_ok = rule["resources"].as_array().is_some_and(|a| {
        a.iter().filter_map(Value::as_str).any(|x| {
            x == "*"
                || x == resource
                || (call.path.subresource.is_some()
                    && (x == "*/*" || x == format!("*/{}", call.path.subresource.as_deref().unwrap_or_default())))
                || (x == format!("{}/*", r.plural) && call.path.subresource.is_some())
        })
    });
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Namespaced" => r.namespaced,
        "Cluster" => !r.namespaced,
        _ => true,
    };
    ops_ok && groups_ok && versions_ok && resources_ok && scope_ok
}

async fn namespace_labels(call: &Call) -> Option<Value> {
    let ns = call.namespace()?;
    let obj = match call.api.caches.namespaces.get(&format!("Namespace/{ns}")) {
        Some(o) => o,
        None => std::sync::Arc::new(call.api.storage.get(&format!("/registry/namespaces/{ns}")).await.ok()??.object),
    };
    obj.pointer("/metadata/labels").cloned()
}

async fn target(call: &Call, client_config: &Value) -> Result<Target, String> {
    if let Some(url) = client_config.get("url").and_then(Value::as_str) {
        let rest = url.strip_prefix("https://").ok_or_else(|| format!("webhook URL {url:?} must be https"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let host =
            hostport.rsplit_once(':').map(|(h, _)| h).unwrap_or(hostport).trim_start_matches('[').trim_end_matches(']');
        let addr = if hostport.contains(':') && !hostport.ends_with(']') {
            hostport.to_string()
        } else {
            format!("{hostport}:443")
        };
        return Ok(Target { addr, server_name: host.to_string(), path: path.to_string() });
    }
    let svc = client_config.get("service").ok_or("webhook has neither url nor service")?;
    let ns = svc["namespace"].as_str().unwrap_or_default();
    let name = svc["name"].as_str().unwrap_or_default();
    let port = svc["port"].as_i64().unwrap_or(443);
    let path = svc["path"].as_str().unwrap_or("/").to_string();
    let port = crate::apiserver::service_endpoint::ServicePort::Number(port);
    let addr = crate::apiserver::service_endpoint::resolve(&call.api.storage, ns, name, &port).await?;
    Ok(Target { addr, server_name: format!("{name}.{ns}.svc"), path })
}

fn tls_config(ca_bundle: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(b64) = ca_bundle {
        let pem = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("caBundle: {e}"))?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.map_err(|e| format!("caBundle: {e}"))?).map_err(|e| format!("caBundle: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// POSTs a review and returns the answer's `response`.
async fn send(target: &Target, ca_bundle: Option<&str>, review: &Value, timeout: Duration) -> Result<Value, String> {
    let config = tls_config(ca_bundle)?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(&target.addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from(target.server_name.clone()).map_err(|e| e.to_string())?;
        let tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let body = review.to_string();
        let req = hyper::Request::post(format!("{}?timeout={}s", target.path, timeout.as_secs()))
            .header("host", &target.server_name)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("the server responded with {status}"));
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("invalid AdmissionReview: {e}"))?;
        v.get("response").cloned().ok_or_else(|| "the AdmissionReview has no response".to_string())
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| "context deadline exceeded".to_string())?
}

fn review(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> Value {
    let r = &call.resource;
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr = json!({"group": r.group, "version": r.version, "resource": r.plural});
    let mut req = json!({
        "uid": crate::apiserver::meta::new_uid(),
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": crate::apiserver::meta::name_of(obj),
        "operation": op.as_str(),
        "userInfo": {"username": call.user.name, "groups": call.user.groups},
        "object": if op == Operation::Delete { Value::Null } else { obj.clone() },
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": call.dry_run(),
    });
    if let Some(ns) = call.namespace() {
        req["namespace"] = json!(ns);
    }
    if let Some(s) = &call.path.subresource {
        req["subResource"] = json!(s);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

/// The object the webhooks review: mutating webhooks may patch it,
/// validating webhooks only read it (so it needs no copy).
pub enum Reviewed<'a> {
    Mutable(&'a mut Value),
    ReadOnly(&'a Value),
}

impl Reviewed<'_> {
    fn get(&self) -> &Value {
        match self {
            Reviewed::Mutable(obj) => obj,
            Reviewed::ReadOnly(obj) => obj,
        }
    }
}

/// Calls every matching webhook of one kind: mutating ones for a
/// `Reviewed::Mutable` object, validating ones for a read-only one.
pub async fn call_all(call: &Call, mut obj: Reviewed<'_>, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    let mutating = matches!(obj, Reviewed::Mutable(_));
    // Webhooks never gate their own configuration, so they cannot lock the cluster.
    if call.resource.group == "admissionregistration.k8s.io" || call.resource.ephemeral {
        return Ok(());
    }
    let configs =
        if mutating { call.api.caches.mutating_webhooks.all() } else { call.api.caches.validating_webhooks.all() };
    if configs.is_empty() {
        return Ok(());
    }
    let ns_labels = namespace_labels(call).await;
    for config in configs {
        for hook in config["webhooks"].as_array().cloned().unwrap_or_default() {
            let name = hook["name"].as_str().unwrap_or_default().to_string();
            if !hook["rules"].as_array().is_some_and(|rs| rs.iter().any(|r| rule_matches(r, call, op))) {
                continue;
            }
            if let Some(sel) = hook.get("namespaceSelector").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
                if call.resource.namespaced && !LabelSelector::from_object(sel).matches(ns_labels.as_ref()) {
                    continue;
                }
            }
            if let Some(sel) = hook.get("objectSelector").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
                let labels = obj.get().pointer("/metadata/labels").or(old.and_then(|o| o.pointer("/metadata/labels")));
                if !LabelSelector::from_object(sel).matches(labels) {
                    continue;
                }
            }
            if call.dry_run() && !matches!(hook["sideEffects"].as_str(), Some("None") | Some("NoneOnDryRun")) {
                return Err(ApiError::bad_request(format!("admission webhook \"{name}\" does not support dry run")));
            }
            let fail_open = hook["failurePolicy"].as_str() == Some("Ignore");
            let timeout = Duration::from_secs(hook["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30));
            let ca = hook.pointer("/clientConfig/caBundle").and_then(Value::as_str).map(str::to_string);
            let outcome = match target(call, &hook["clientConfig"]).await {
                Ok(t) => send(&t, ca.as_deref(), &review(call, obj.get(), old, op), timeout).await,
                Err(e) => Err(e),
            };
            let response = match outcome {
                Ok(r) => r,
                Err(e) if fail_open => {
                    tracing::warn!(webhook = %name, error = %e, "admission webhook failed; ignored by its failurePolicy");
                    continue;
                }
                Err(e) => return Err(ApiError::internal(format!("failed calling webhook \"{name}\": {e}"))),
            };
            if response["allowed"].as_bool() != Some(true) {
                let code = response.pointer("/status/code").and_then(Value::as_u64).unwrap_or(403) as u16;
                let message = response.pointer("/status/message").and_then(Value::as_str).unwrap_or_default();
                let reason = if code == 403 { "Forbidden" } else { "BadRequest" };
                let text = if message.is_empty() {
                    format!("admission webhook \"{name}\" denied the request without explanation")
                } else {
                    format!("admission webhook \"{name}\" denied the request: {message}")
                };
                return Err(ApiError::new(code, reason, text));
            }
            if let Reviewed::Mutable(obj) = &mut obj {
                if let Some(patch) = response["patch"].as_str() {
                    let raw = base64::engine::general_purpose::STANDARD.decode(patch).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent a patch that is not base64: {e}"))
                    })?;
                    let ops: json_patch::Patch = serde_json::from_slice(&raw).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent an invalid JSON patch: {e}"))
                    })?;
                    json_patch::patch(obj, &ops).map_err(|e| {
                        ApiError::internal(format!("webhook \"{name}\" sent a patch that does not apply: {e}"))
                    })?;
                }
            }
        }
    }
    Ok(())
}
