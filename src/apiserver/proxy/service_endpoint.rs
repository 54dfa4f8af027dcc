//! Where a request for a Service goes when the API server itself calls it
//! (admission webhooks, `services/proxy`): one ready endpoint of the
//! Service's EndpointSlices, at the port the Service port maps to.

use serde_json::Value;

use crate::apiserver::status::ApiError;
use crate::apiserver::storage::{ReadAt, Storage};

/// Which port of the Service: by number, by name, or its only one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServicePort {
    Number(i64),
    Name(String),
    /// No port given: the Service must have exactly one.
    Only,
}

impl ServicePort {
    /// A port as a proxy path names it (`web:http`, `web:8080`, `web`).
    pub fn parse(text: &str) -> ServicePort {
        match text {
            "" => ServicePort::Only,
            t => t.parse().map(ServicePort::Number).unwrap_or_else(|_| ServicePort::Name(t.to_string())),
        }
    }
}

/// Why a Service has no endpoint to call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unresolved {
    #[error("services \"{0}\" not found")]
    ServiceNotFound(String),
    #[error("no service port {port} found for service \"{name}\"")]
    NoPort { name: String, port: String },
    /// No EndpointSlice names the Service.
    #[error("no endpoints available for service \"{0}\"")]
    NoSlices(String),
    /// Slices, but no ready address with the port's name.
    #[error("no endpoints available for service \"{name}\"")]
    NoAddress { name: String, port_name: String },
    #[error("{0}")]
    Store(#[source] ApiError),
}

/// `ip:port` of a ready endpoint of Service `namespace/name`, or why there
/// is none.
pub async fn resolve(storage: &Storage, namespace: &str, name: &str, port: &ServicePort) -> Result<String, Unresolved> {
    let service = storage
        .get(&format!("/registry/services/{namespace}/{name}"))
        .await
        .map_err(Unresolved::Store)?
        .ok_or_else(|| Unresolved::ServiceNotFound(name.to_string()))?;
    let ports: Vec<Value> =
        service.object.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    let sport = match port {
        ServicePort::Number(n) => ports.iter().find(|p| p["port"].as_i64() == Some(*n)),
        ServicePort::Name(n) => ports.iter().find(|p| p["name"].as_str() == Some(n.as_str())),
        ServicePort::Only if ports.len() == 1 => ports.first(),
        ServicePort::Only => None,
    };
    let Some(sport) = sport else {
        let port = match port {
            ServicePort::Number(n) => n.to_string(),
            ServicePort::Name(n) => format!("{n:?}"),
            ServicePort::Only => "\"\"".into(),
        };
        return Err(Unresolved::NoPort { name: name.to_string(), port });
    };
    let port_name = sport["name"].as_str().unwrap_or_default().to_string();
    let target_port = sport["targetPort"].clone();
    let slices = storage
        .list(&format!("/registry/discovery.k8s.io/endpointslices/{namespace}/"), None, 0, ReadAt::Latest)
        .await
        .map_err(Unresolved::Store)?;
    let mut any_slice = false;
    for slice in slices.items {
        if slice.object.pointer("/metadata/labels/kubernetes.io~1service-name").and_then(Value::as_str) != Some(name) {
            continue;
        }
        any_slice = true;
        let port = slice.object["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"].as_str().unwrap_or_default() == port_name))
            .and_then(|p| p["port"].as_i64())
            .or_else(|| target_port.as_i64());
        for ep in slice.object["endpoints"].as_array().into_iter().flatten() {
            if ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            if let (Some(ip), Some(port)) = (ep["addresses"].get(0).and_then(Value::as_str), port) {
                return Ok(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") });
            }
        }
    }
    Err(match any_slice {
        true => Unresolved::NoAddress { name: name.to_string(), port_name },
        false => Unresolved::NoSlices(name.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_by_number_name_or_none() {
        assert_eq!(ServicePort::parse("80"), ServicePort::Number(80));
        assert_eq!(ServicePort::parse("http"), ServicePort::Name("http".into()));
        assert_eq!(ServicePort::parse(""), ServicePort::Only);
    }
}
