//! What the cluster DNS reads of a Service and of an EndpointSlice: only
//! the parts that make names (kind and addresses, named ports, ready
//! endpoints and their hostnames), so the index holds no API objects.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum ServiceKind {
    Cluster(Vec<IpAddr>),
    Headless,
    ExternalName(String),
}

/// What of a Service makes records.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ServiceView {
    pub(super) kind: ServiceKind,
    /// Named ports: (name, protocol, port).
    pub(super) ports: Vec<(String, String, u16)>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct EndpointView {
    pub(super) addresses: Vec<IpAddr>,
    pub(super) hostname: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct SliceView {
    pub(super) service: String,
    /// Ready endpoints only.
    pub(super) endpoints: Vec<EndpointView>,
    pub(super) ports: Vec<(String, String, u16)>,
}

fn named_ports<'a>(ports: impl Iterator<Item = (Option<&'a str>, Option<&'a str>, i32)>) -> Vec<(String, String, u16)> {
    ports
        .filter_map(|(name, proto, port)| {
            let name = name.filter(|n| !n.is_empty())?;
            Some((name.to_ascii_lowercase(), proto.unwrap_or("TCP").to_ascii_lowercase(), u16::try_from(port).ok()?))
        })
        .collect()
}

pub(super) fn service_view(svc: &Service) -> ServiceView {
    let spec = svc.spec.clone().unwrap_or_default();
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        ServiceKind::ExternalName(spec.external_name.unwrap_or_default().trim_end_matches('.').to_ascii_lowercase())
    } else if spec.cluster_ip.as_deref() == Some("None") {
        ServiceKind::Headless
    } else {
        let mut ips: Vec<IpAddr> = spec.cluster_ips.iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
        if ips.is_empty() {
            ips.extend(spec.cluster_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()));
        }
        ServiceKind::Cluster(ips)
    };
    let ports = named_ports(spec.ports.iter().flatten().map(|p| (p.name.as_deref(), p.protocol.as_deref(), p.port)));
    ServiceView { kind, ports }
}

pub(super) fn slice_view(slice: &EndpointSlice) -> Option<SliceView> {
    let service = slice.metadata.labels.as_ref()?.get("kubernetes.io/service-name")?.clone();
    let endpoints = slice
        .endpoints
        .iter()
        // An unset `ready` means ready, as the API documents.
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .map(|e| EndpointView {
            addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
            hostname: e.hostname.clone().filter(|h| !h.is_empty()).map(|h| h.to_ascii_lowercase()),
        })
        .collect();
    let ports = named_ports(
        slice.ports.iter().flatten().filter_map(|p| Some((p.name.as_deref(), p.protocol.as_deref(), p.port?))),
    );
    Some(SliceView { service, endpoints, ports })
}
