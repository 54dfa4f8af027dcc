//! What a probe or a hook aims at: the container (its id for exec, its
//! named ports), the pod (its IP, or the node's for hostNetwork pods), and
//! the `$(VAR)` expansion of exec commands, as upstream's
//! `probe.ResolveContainerPort` and `ExpandContainerCommandOnlyStatic`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One running container, as the probes see it.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    pub pod: Arc<Pod>,
    pub container: Arc<Container>,
    /// The runtime's id of the container (ExecSync goes there).
    pub container_id: String,
    /// Where network probes go when their handler names no host: the pod's
    /// IP, or the node's for a hostNetwork pod.
    pub pod_ip: Option<IpAddr>,
}

impl ProbeTarget {
    /// The pod IP as text, if any.
    pub fn pod_ip_text(&self) -> Option<String> {
        self.pod_ip.map(|ip| ip.to_string())
    }
}

/// The address probes aim at when the caller does not say: the pod's IP
/// from its status, or the node's IP for a hostNetwork pod.
pub fn pod_ip_from_status(pod: &Pod) -> Option<IpAddr> {
    let status = pod.status.as_ref()?;
    let parse = |s: &Option<String>| s.as_deref().and_then(|s| s.parse::<IpAddr>().ok());
    if let Some(ip) = parse(&status.pod_ip) {
        return Some(ip);
    }
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    if host_network {
        return parse(&status.host_ip);
    }
    None
}

/// A probe's or hook's port that names no port, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// A name that is no port of the container, nor a number.
    #[error("strconv.Atoi: parsing {}: invalid syntax", super::text::quote(.name))]
    NotANumber { name: String, source: std::num::ParseIntError },
    #[error("invalid port number: {0}")]
    OutOfRange(i64),
}

/// A port given by number or by the name of one of the container's ports.
/// As upstream, a name that matches no port is tried as a number; the
/// errors read as upstream's.
pub fn resolve_container_port(port: &IntOrString, container: &Container) -> Result<u16, PortError> {
    let number: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named {
                Some(n) => n,
                None => name.parse::<i64>().map_err(|source| PortError::NotANumber { name: name.clone(), source })?,
            }
        }
    };
    if number > 0 && number < 65536 {
        Ok(number as u16)
    } else {
        Err(PortError::OutOfRange(number))
    }
}

/// `$(VAR)` references in an exec command replaced by the container's
/// literal env values (`$$` is a literal `$`; unknown names stay as they
/// are), as upstream does for exec probes. Values from `valueFrom` are not
/// known here and expand to nothing, as upstream.
pub fn expand_command(command: &[String], container: &Container) -> Vec<String> {
    let env: HashMap<&str, &str> =
        container.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())).collect();
    command.iter().map(|arg| expand(arg, &env)).collect()
}

fn expand(input: &str, env: &HashMap<&str, &str>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            out.push_str(&input[checkpoint..i]);
            let rest = &input[i + 1..];
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match env.get(name) {
                            Some(v) => out.push_str(v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        i += close + 2;
                    }
                    None => {
                        out.push_str("$(");
                        i += 2;
                    }
                },
                _ => {
                    out.push('$');
                    i += 1;
                }
            }
            checkpoint = i;
            continue;
        }
        i += 1;
    }
    out.push_str(&input[checkpoint..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, EnvVar};

    fn container() -> Container {
        Container {
            name: "c".into(),
            ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }]),
            env: Some(vec![
                EnvVar { name: "A".into(), value: Some("x".into()), ..Default::default() },
                EnvVar { name: "S".into(), value: None, ..Default::default() },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn ports_resolve_by_number_and_name() {
        let c = container();
        assert_eq!(resolve_container_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(resolve_container_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(resolve_container_port(&IntOrString::String("9090".into()), &c), Ok(9090));
        let said = |port: IntOrString| resolve_container_port(&port, &c).map_err(|e| e.to_string());
        assert_eq!(
            said(IntOrString::String("nope".into())),
            Err("strconv.Atoi: parsing \"nope\": invalid syntax".into())
        );
        assert_eq!(said(IntOrString::Int(0)), Err("invalid port number: 0".into()));
        assert_eq!(said(IntOrString::Int(70000)), Err("invalid port number: 70000".into()));
    }

    #[test]
    fn commands_expand_static_env() {
        let c = container();
        let cmd = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            expand_command(&cmd(&["echo", "$(A)-$(S)-$(B)", "$$(A)", "$", "a$b", "$(A"]), &c),
            cmd(&["echo", "x--$(B)", "$(A)", "$", "a$b", "$(A"])
        );
    }

    #[test]
    fn host_network_pods_are_probed_on_the_host_ip() {
        use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
        let mut pod = Pod {
            spec: Some(PodSpec { host_network: Some(true), ..Default::default() }),
            status: Some(PodStatus { host_ip: Some("192.168.1.2".into()), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(pod_ip_from_status(&pod), "192.168.1.2".parse().ok());
        if let Some(s) = pod.status.as_mut() {
            s.pod_ip = Some("10.42.0.5".into());
        }
        assert_eq!(pod_ip_from_status(&pod), "10.42.0.5".parse().ok());
    }
}
