//! Where a request for a Service goes when the API server itself calls it
//! (admission webhooks, `services/proxy`): one ready endpoint of the
//! Service's EndpointSlices, at the port the Service port maps to.

use serde_json::Value;

use super::storage::{ReadAt, Storage};

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

/// `ip:port` of a ready endpoint of Service `namespace/name`.
pub async fn resolve(storage: &Storage, namespace: &str, name: &str, port: &ServicePort) -> Result<String, String> {
    let service = storage
        .get(&format!("/registry/services/{namespace}/{name}"))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("services \"{name}\" not found"))?;
    let ports: Vec<Value> =
        service.object.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    let sport = match port {
        ServicePort::Number(n) => ports.iter().find(|p| p["port"].as_i64() == Some(*n)).cloned(),
        ServicePort::Name(n) => ports.iter().find(|p| p["name"].as_str() == Some(n.as_str())).cloned(),
        ServicePort::Only if ports.len() == 1 => ports.first().cloned(),
        ServicePort::Only => None,
    };
    let (port_name, target_port) = match (&sport, port) {
        (Some(p), _) => (p["name"].as_str().unwrap_or_default().to_string(), p["targetPort"].clone()),
        (None, ServicePort::Number(n)) => (String::new(), Value::from(*n)),
        (None, _) => return Err(format!("no service port {port:?} found for service \"{name}\"")),
    };
    let slices = storage
        .list(&format!("/registry/discovery.k8s.io/endpointslices/{namespace}/"), None, 0, ReadAt::Latest)
        .await
        .map_err(|e| e.to_string())?;
    for slice in slices.items {
        if slice.object.pointer("/metadata/labels/kubernetes.io~1service-name").and_then(Value::as_str) != Some(name) {
            continue;
        }
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
    Err(format!("no endpoints available for service \"{name}\""))
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
