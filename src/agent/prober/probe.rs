//! One attempt of a probe: the handler its spec names (exec, httpGet,
//! tcpSocket, grpc) run against the container with the probe's
//! `timeoutSeconds`, as upstream's `prober.runProbe`. [`Prober`] is the
//! seam the workers call, so their state machine can be tested with
//! scripted answers.

use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;

use super::http::HttpGetRequest;
use super::target::{expand_command, resolve_container_port, ProbeTarget};
use super::text::pod_full_name;
use super::{exec, grpc, http, tcp, ProbeResult, ProbeType};
use crate::agent::cri::Cri;

/// Runs one attempt of a probe.
#[async_trait::async_trait]
pub trait Prober: Send + Sync + 'static {
    async fn probe(&self, probe_type: ProbeType, spec: &Probe, target: &ProbeTarget) -> ProbeResult;
}

/// Upstream's default and floor for `timeoutSeconds`.
pub fn probe_timeout(spec: &Probe) -> Duration {
    Duration::from_secs(spec.timeout_seconds.unwrap_or(1).max(1) as u64)
}

/// The prober of a real node: exec through the container runtime, network
/// probes from the node to the pod.
#[derive(Clone, Debug)]
pub struct RuntimeProber {
    cri: Cri,
}

impl RuntimeProber {
    pub fn new(cri: Cri) -> Self {
        RuntimeProber { cri }
    }
}

#[async_trait::async_trait]
impl Prober for RuntimeProber {
    async fn probe(&self, probe_type: ProbeType, spec: &Probe, target: &ProbeTarget) -> ProbeResult {
        let timeout = probe_timeout(spec);
        let container = &target.container;
        let pod_ip = target.pod_ip_text();
        tracing::trace!(%probe_type, container = %container.name, id = %target.container_id, "probe");
        if let Some(action) = &spec.exec {
            let command = expand_command(action.command.as_deref().unwrap_or_default(), container);
            return exec::probe(&self.cri, &target.container_id, &command, timeout).await;
        }
        if let Some(action) = &spec.http_get {
            return match HttpGetRequest::new(action, container, pod_ip.as_deref(), "probe") {
                Ok(req) => http::probe(&req, timeout).await,
                Err(e) => ProbeResult::Unknown(e.to_string()),
            };
        }
        if let Some(action) = &spec.tcp_socket {
            let port = match resolve_container_port(&action.port, container) {
                Ok(p) => p,
                Err(e) => return ProbeResult::Unknown(e.to_string()),
            };
            let host = action.host.clone().filter(|h| !h.is_empty()).or(pod_ip);
            return match host {
                Some(host) => tcp::probe(&host, port, timeout).await,
                None => ProbeResult::Unknown("the pod has no IP address yet".into()),
            };
        }
        if let Some(action) = &spec.grpc {
            let Some(port) = u16::try_from(action.port).ok().filter(|p| *p != 0) else {
                return ProbeResult::Unknown(format!("invalid port number: {}", action.port));
            };
            return match pod_ip {
                Some(host) => grpc::probe(&host, port, action.service.as_deref().unwrap_or_default(), timeout).await,
                None => ProbeResult::Unknown("the pod has no IP address yet".into()),
            };
        }
        ProbeResult::Unknown(format!("missing probe handler for {}:{}", pod_full_name(&target.pod), container.name))
    }
}
