//! A container's environment, as upstream's makeEnvironmentVariables: the
//! service links of the pod's namespace, then `envFrom`, then `env` (later
//! wins), with `$(VAR)` expanded from what came before, values from the
//! pod itself (fieldRef), its resources (resourceFieldRef), ConfigMaps and
//! Secrets. Missing non-optional sources fail the container's creation with
//! upstream's CreateContainerConfigError messages.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;

use super::pod_util;
use crate::quantity;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The text shown as the container's waiting message.
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    ResourceField(#[from] ResourceFieldError),
}

/// A resourceFieldRef that reads no value, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceFieldError {
    #[error("unsupported container resource : {0}")]
    Unsupported(String),
    #[error("invalid divisor {0}")]
    InvalidDivisor(String),
    #[error("invalid quantity {0}")]
    InvalidQuantity(String),
}

/// What a container's environment may refer to besides the pod.
pub struct EnvContext<'a> {
    pub client: &'a kube::Client,
    /// Services of the pod's namespace and the `kubernetes` Service, for service links.
    pub services: &'a [Service],
    pub pod_ips: &'a [String],
    pub host_ips: &'a [String],
    pub node_name: &'a str,
    /// Node allocatable, for resourceFieldRef of containers without limits.
    pub allocatable: &'a BTreeMap<String, Quantity>,
}

/// Expands `$(VAR)` references from `vars`; `$$(VAR)` is a literal `$(VAR)`,
/// unknown references stay as written (upstream's expansion).
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Upstream's service link variables for the active Services given.
pub fn service_links(services: &[Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut sorted: Vec<&Service> = services.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for svc in sorted {
        let Some(spec) = &svc.spec else { continue };
        let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None") else { continue };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let name = svc.metadata.name.as_deref().unwrap_or_default().to_uppercase().replace('-', "_");
        out.push((format!("{name}_SERVICE_HOST"), ip.to_string()));
        out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        for p in ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{name}_SERVICE_PORT_{}", pn.to_uppercase().replace('-', "_")), p.port.to_string()));
            }
        }
        let proto = |p: &k8s_openapi::api::core::v1::ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
        out.push((format!("{name}_PORT"), format!("{}://{ip}:{}", proto(first).to_lowercase(), first.port)));
        for p in ports {
            let pr = proto(p);
            let prefix = format!("{name}_PORT_{}_{}", p.port, pr.to_uppercase());
            out.push((prefix.clone(), format!("{}://{ip}:{}", pr.to_lowercase(), p.port)));
            out.push((format!("{prefix}_PROTO"), pr.to_lowercase()));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// A pod field by path, as the downward API reads it.
pub fn pod_field(
    pod: &Pod,
    path: &str,
    ctx_pod_ips: &[String],
    host_ips: &[String],
    node_name: &str,
) -> Option<String> {
    let meta = &pod.metadata;
    let map_key = |prefix: &str| path.strip_prefix(prefix).and_then(|r| r.strip_suffix("']")).map(str::to_string);
    if let Some(k) = map_key("metadata.labels['") {
        return Some(meta.labels.as_ref().and_then(|l| l.get(&k)).cloned().unwrap_or_default());
    }
    if let Some(k) = map_key("metadata.annotations['") {
        return Some(meta.annotations.as_ref().and_then(|l| l.get(&k)).cloned().unwrap_or_default());
    }
    let spec = pod_util::spec(pod);
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => spec.node_name.clone().unwrap_or_else(|| node_name.to_string()),
        "spec.serviceAccountName" => spec.service_account_name.clone().unwrap_or_default(),
        "status.hostIP" => host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => host_ips.join(","),
        "status.podIP" => ctx_pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx_pod_ips.join(","),
        _ => return None,
    })
}

/// `key="value"` lines, sorted, values quoted as Go's %q does.
pub fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A container resource for resourceFieldRef, divided by `divisor` and
/// rounded up (upstream's ExtractContainerResourceValue).
pub fn resource_field(
    c: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, ResourceFieldError> {
    let unsupported = || ResourceFieldError::Unsupported(resource.to_string());
    let (kind, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let res = c.resources.as_ref();
    let pick = |m: Option<&BTreeMap<String, Quantity>>| m.and_then(|m| m.get(name)).cloned();
    let value = match kind {
        "limits" => pick(res.and_then(|r| r.limits.as_ref())).or_else(|| allocatable.get(name).cloned()),
        "requests" => pick(res.and_then(|r| r.requests.as_ref()))
            .or_else(|| pick(res.and_then(|r| r.limits.as_ref())))
            .or_else(|| if name == "cpu" || name == "memory" { None } else { allocatable.get(name).cloned() }),
        _ => return Err(unsupported()),
    };
    // A zero divisor is unset: typed clients send "0" for an unset
    // quantity, and upstream divides by 1 then.
    let one = Quantity("1".into());
    let divisor = divisor.filter(|d| quantity::milli_value(d) != Some(0)).unwrap_or(&one);
    let d = quantity::milli_value(divisor)
        .filter(|d| *d > 0)
        .ok_or_else(|| ResourceFieldError::InvalidDivisor(divisor.0.clone()))?;
    let Some(v) = value else {
        // A request that is not set reads as 0 (cpu requests default to 0).
        return Ok("0".into());
    };
    let m = quantity::milli_value(&v).ok_or_else(|| ResourceFieldError::InvalidQuantity(v.0.clone()))?;
    Ok(((m + d - 1) / d).to_string())
}

async fn config_map(client: &kube::Client, ns: &str, name: &str) -> Result<Option<ConfigMap>, EnvError> {
    Ok(Api::<ConfigMap>::namespaced(client.clone(), ns).get_opt(name).await?)
}

async fn secret(client: &kube::Client, ns: &str, name: &str) -> Result<Option<Secret>, EnvError> {
    Ok(Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await?)
}

fn secret_data(s: &Secret) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> =
        s.data.iter().flatten().map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned())).collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
}

/// Is `name` a valid environment variable name? Upstream 1.33 relaxes the
/// rule (RelaxedEnvironmentVariableValidation, on by default): any printable
/// ASCII but `=`.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (32..=126).contains(&b) && b != b'=')
}

/// The container's environment, in order, with the keys envFrom skipped as invalid.
pub async fn make_environment(
    pod: &Pod,
    c: &Container,
    ctx: &EnvContext<'_>,
) -> Result<(Vec<(String, String)>, Vec<String>), EnvError> {
    let ns = pod_util::namespace(pod);
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut index: HashMap<String, String> = HashMap::new();
    let mut invalid = Vec::new();
    let set = |vars: &mut Vec<(String, String)>, index: &mut HashMap<String, String>, k: String, v: String| {
        if let Some(slot) = vars.iter_mut().find(|(n, _)| *n == k) {
            slot.1 = v.clone();
        } else {
            vars.push((k.clone(), v.clone()));
        }
        index.insert(k, v);
    };
    if pod_util::spec(pod).enable_service_links != Some(false) {
        for (k, v) in service_links(ctx.services) {
            set(&mut vars, &mut index, k, v);
        }
    }
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            let name = r.name.as_str();
            match config_map(ctx.client, ns, name).await? {
                Some(cm) => config_map_data(&cm),
                None if r.optional == Some(true) => continue,
                None => return Err(EnvError::Config(format!("configmap \"{name}\" not found"))),
            }
        } else if let Some(r) = &from.secret_ref {
            let name = r.name.as_str();
            match secret(ctx.client, ns, name).await? {
                Some(s) => secret_data(&s),
                None if r.optional == Some(true) => continue,
                None => return Err(EnvError::Config(format!("secret \"{name}\" not found"))),
            }
        } else {
            continue;
        };
        for (k, v) in data {
            let key = format!("{prefix}{k}");
            if !valid_env_name(&key) {
                invalid.push(key);
                continue;
            }
            set(&mut vars, &mut index, key, v);
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            expand(v, &index)
        } else if let Some(src) = &e.value_from {
            if let Some(f) = &src.field_ref {
                pod_field(pod, &f.field_path, ctx.pod_ips, ctx.host_ips, ctx.node_name)
                    .ok_or_else(|| EnvError::Config(format!("unsupported fieldPath: {}", f.field_path)))?
            } else if let Some(r) = &src.resource_field_ref {
                let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                    Some(n) => pod_util::find_container(pod, n).map(|(_, c)| c).unwrap_or(c),
                    None => c,
                };
                resource_field(target, &r.resource, r.divisor.as_ref(), ctx.allocatable)?
            } else if let Some(r) = &src.config_map_key_ref {
                let name = r.name.as_str();
                match config_map(ctx.client, ns, name).await? {
                    Some(cm) => match config_map_data(&cm).get(&r.key) {
                        Some(v) => v.clone(),
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(EnvError::Config(format!(
                                "couldn't find key {} in ConfigMap {ns}/{name}",
                                r.key
                            )))
                        }
                    },
                    None if r.optional == Some(true) => continue,
                    None => return Err(EnvError::Config(format!("configmap \"{name}\" not found"))),
                }
            } else if let Some(r) = &src.secret_key_ref {
                let name = r.name.as_str();
                match secret(ctx.client, ns, name).await? {
                    Some(s) => match secret_data(&s).get(&r.key) {
                        Some(v) => v.clone(),
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(EnvError::Config(format!("couldn't find key {} in Secret {ns}/{name}", r.key)))
                        }
                    },
                    None if r.optional == Some(true) => continue,
                    None => return Err(EnvError::Config(format!("secret \"{name}\" not found"))),
                }
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        set(&mut vars, &mut index, e.name.clone(), value);
    }
    Ok((vars, invalid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expansion_follows_upstream() {
        let vars: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &vars), "x-$(B)-$(A)-$");
        assert_eq!(expand("é$(A)", &vars), "éx");
        assert_eq!(expand("$(A", &vars), "$(A");
    }

    #[test]
    fn service_links_name_ports() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "my-svc"},
            "spec": {"clusterIP": "10.43.0.5", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        }))
        .unwrap();
        let vars: HashMap<_, _> = service_links(&[svc]).into_iter().collect();
        assert_eq!(vars["MY_SVC_SERVICE_HOST"], "10.43.0.5");
        assert_eq!(vars["MY_SVC_SERVICE_PORT"], "80");
        assert_eq!(vars["MY_SVC_SERVICE_PORT_HTTP"], "80");
        assert_eq!(vars["MY_SVC_PORT"], "tcp://10.43.0.5:80");
        assert_eq!(vars["MY_SVC_PORT_80_TCP_ADDR"], "10.43.0.5");
    }

    #[test]
    fn resource_fields_round_up() {
        let c: Container = serde_json::from_value(json!({
            "name": "a", "resources": {"limits": {"cpu": "1500m", "memory": "64Mi"}, "requests": {"cpu": "250m"}}
        }))
        .unwrap();
        let alloc = BTreeMap::from([("memory".to_string(), Quantity("1Gi".into()))]);
        assert_eq!(resource_field(&c, "limits.cpu", None, &alloc).unwrap(), "2");
        assert_eq!(resource_field(&c, "requests.cpu", Some(&Quantity("1m".into())), &alloc).unwrap(), "250");
        assert_eq!(resource_field(&c, "limits.memory", Some(&Quantity("1Mi".into())), &alloc).unwrap(), "64");
        assert_eq!(resource_field(&c, "limits.cpu", Some(&Quantity("0".into())), &alloc).unwrap(), "2");
        let none: Container = serde_json::from_value(json!({"name": "b"})).unwrap();
        assert_eq!(resource_field(&none, "limits.memory", None, &alloc).unwrap(), (1u64 << 30).to_string());
    }

    #[test]
    fn pod_fields() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [], "serviceAccountName": "sa"}
        }))
        .unwrap();
        let ips = vec!["10.42.0.7".to_string()];
        let f = |p| pod_field(&pod, p, &ips, &["192.168.1.2".to_string()], "n1");
        assert_eq!(f("metadata.labels").unwrap(), "a=\"1\"\nb=\"2\"");
        assert_eq!(f("metadata.labels['b']").unwrap(), "2");
        assert_eq!(f("status.podIP").unwrap(), "10.42.0.7");
        assert_eq!(f("spec.nodeName").unwrap(), "n1");
        assert_eq!(f("spec.serviceAccountName").unwrap(), "sa");
        assert!(f("spec.nope").is_none());
    }
}
