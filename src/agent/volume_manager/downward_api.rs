//! downwardAPI volume files, as upstream's `downwardapi.CollectData`: pod
//! fields (`metadata.labels` and `metadata.annotations` as sorted
//! `key="value"` lines, Go-quoted) and container resources (limits fall
//! back to the node's allocatable, divided by the divisor, rounded up).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::allocatable::NodeAllocatable;
use super::atomic_writer::{FileProjection, Payload};
use super::error::SetUpError;
use super::projection::file_mode;
use crate::agent::prober::text::quote;
use crate::quantity;

/// The files of a downwardAPI volume (or projected source).
pub fn collect_data(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    allocatable: &NodeAllocatable,
    default_mode: i32,
) -> Result<Payload, SetUpError> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let mode = file_mode(item.mode.unwrap_or(default_mode));
        let value = if let Some(f) = &item.field_ref {
            field_value(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            resource_value(pod, r, allocatable)
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                payload.insert(item.path.clone(), FileProjection { data: v.into_bytes(), mode });
            }
            Err(e) => errors.push(e),
        }
    }
    SetUpError::aggregate(errors)?;
    Ok(payload)
}

/// `metadata.annotations['key']` → (`metadata.annotations`, `key`).
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let s = path.strip_suffix("']")?;
    let (head, key) = s.split_once("['")?;
    (!head.is_empty()).then_some((head, key))
}

/// A pod field as a string, as upstream's `ExtractFieldPathAsString`
/// (plus the pod fields the kubelet also serves to environment variables).
pub fn field_value(pod: &Pod, path: &str) -> Result<String, SetUpError> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if let Some((head, key)) = split_subscript(path) {
        return match head {
            "metadata.labels" => Ok(labels.get(key).cloned().unwrap_or_default()),
            "metadata.annotations" => Ok(annotations.get(key).cloned().unwrap_or_default()),
            _ => Err(SetUpError::NoSubscript(path.into())),
        };
    }
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        other => return Err(SetUpError::UnsupportedFieldPath(other.into())),
    })
}

/// `key="value"` lines sorted by key, without a final newline.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect::<Vec<_>>().join("\n")
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
}

/// A container resource for a downwardAPI file: limits default to the
/// node's allocatable, requests to the limit the API would have defaulted.
pub fn resource_value(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    allocatable: &NodeAllocatable,
) -> Result<String, SetUpError> {
    let name = selector.container_name.clone().unwrap_or_default();
    let container = find_container(pod, &name).ok_or_else(|| SetUpError::NoSuchContainer(name.clone()))?;
    let resources = container.resources.as_ref();
    let limit = |r: &str| resources.and_then(|x| x.limits.as_ref()).and_then(|m| m.get(r));
    let request = |r: &str| resources.and_then(|x| x.requests.as_ref()).and_then(|m| m.get(r)).or_else(|| limit(r));
    let divisor = selector.divisor.as_ref().filter(|d| quantity::milli_value(d).is_some_and(|v| v != 0));
    let one = Quantity("1".into());
    let divisor = divisor.unwrap_or(&one);
    let bad_divisor = || SetUpError::InvalidDivisor(divisor.0.clone());

    let cpu = |q: Option<&Quantity>, fallback: i64| -> Result<String, SetUpError> {
        let millis = match q {
            Some(q) => quantity::milli_value(q).filter(|v| *v != 0).unwrap_or(fallback),
            None => fallback,
        };
        let d = quantity::milli_value(divisor).filter(|v| *v > 0).ok_or_else(bad_divisor)?;
        Ok(ceil_div(millis, d).to_string())
    };
    let bytes = |q: Option<&Quantity>, fallback: i64| -> Result<String, SetUpError> {
        let v = match q {
            Some(q) => quantity::value(q).filter(|v| *v != 0).unwrap_or(fallback),
            None => fallback,
        };
        let d = quantity::value(divisor).filter(|v| *v > 0).ok_or_else(bad_divisor)?;
        Ok(ceil_div(v, d).to_string())
    };
    match selector.resource.as_str() {
        "limits.cpu" => cpu(limit("cpu"), allocatable.cpu_millis),
        "limits.memory" => bytes(limit("memory"), allocatable.memory_bytes),
        "limits.ephemeral-storage" => bytes(limit("ephemeral-storage"), allocatable.ephemeral_storage_bytes),
        "requests.cpu" => cpu(request("cpu"), 0),
        "requests.memory" => bytes(request("memory"), 0),
        "requests.ephemeral-storage" => bytes(request("ephemeral-storage"), 0),
        r if r.starts_with("requests.hugepages-") || r.starts_with("limits.hugepages-") => {
            let (kind, res) = r.split_once('.').unwrap_or(("", r));
            let q = if kind == "limits" { limit(res) } else { request(res) };
            bytes(q, 0)
        }
        other => Err(SetUpError::UnsupportedResource(other.into())),
    }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a / b;
    if a % b != 0 && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectFieldSelector, PodSpec, ResourceRequirements};
    use kube::api::ObjectMeta;

    fn pod() -> Pod {
        let q = |s: &str| Quantity(s.into());
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("1234".into()),
                labels: Some([("b".into(), "2".into()), ("a".into(), "1".into())].into_iter().collect()),
                annotations: Some(
                    [("note".into(), "say \"hi\"\n\ttab é\u{a0}".into()), ("x/y".into(), "z".into())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![
                    Container {
                        name: "limited".into(),
                        resources: Some(ResourceRequirements {
                            limits: Some(
                                [("cpu".into(), q("250m")), ("memory".into(), q("64Mi"))].into_iter().collect(),
                            ),
                            requests: Some([("cpu".into(), q("100m"))].into_iter().collect()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    Container { name: "free".into(), ..Default::default() },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const NODE: NodeAllocatable =
        NodeAllocatable { cpu_millis: 2000, memory_bytes: 1 << 30, ephemeral_storage_bytes: 10 << 30 };

    fn res(container: &str, resource: &str, divisor: Option<&str>) -> String {
        let sel = ResourceFieldSelector {
            container_name: Some(container.into()),
            resource: resource.into(),
            divisor: divisor.map(|d| Quantity(d.into())),
        };
        resource_value(&pod(), &sel, &NODE).unwrap()
    }

    #[test]
    fn labels_and_annotations_are_sorted_quoted_lines() {
        let p = pod();
        assert_eq!(field_value(&p, "metadata.labels").unwrap(), "a=\"1\"\nb=\"2\"");
        assert_eq!(
            field_value(&p, "metadata.annotations").unwrap(),
            "note=\"say \\\"hi\\\"\\n\\ttab é\\u00a0\"\nx/y=\"z\""
        );
        assert_eq!(field_value(&p, "metadata.labels['b']").unwrap(), "2");
        assert_eq!(field_value(&p, "metadata.annotations['x/y']").unwrap(), "z");
        assert_eq!(field_value(&p, "metadata.labels['none']").unwrap(), "");
        assert_eq!(field_value(&p, "metadata.name").unwrap(), "web");
        assert_eq!(field_value(&p, "metadata.namespace").unwrap(), "prod");
        assert_eq!(field_value(&p, "metadata.uid").unwrap(), "1234");
        assert_eq!(field_value(&p, "spec.nodeName").unwrap(), "n1");
        assert_eq!(field_value(&p, "spec.bogus").unwrap_err().to_string(), "unsupported fieldPath: spec.bogus");
        assert!(field_value(&p, "metadata.name['x']").is_err());
    }

    #[test]
    fn resources_with_divisors_and_node_fallback() {
        assert_eq!(res("limited", "limits.cpu", None), "1", "250m rounds up to 1 core");
        assert_eq!(res("limited", "limits.cpu", Some("1m")), "250");
        assert_eq!(res("limited", "requests.cpu", Some("1m")), "100");
        assert_eq!(res("limited", "limits.memory", None), (64u64 << 20).to_string());
        assert_eq!(res("limited", "limits.memory", Some("1Mi")), "64");
        assert_eq!(res("limited", "requests.memory", Some("1Mi")), "64", "requests default to limits");
        assert_eq!(res("free", "limits.cpu", Some("1m")), "2000", "no limit: node allocatable");
        assert_eq!(res("free", "limits.memory", Some("1Gi")), "1");
        assert_eq!(res("free", "limits.ephemeral-storage", Some("1Gi")), "10");
        assert_eq!(res("free", "requests.cpu", None), "0");
        let sel =
            ResourceFieldSelector { container_name: Some("nope".into()), resource: "limits.cpu".into(), divisor: None };
        assert!(resource_value(&pod(), &sel, &NODE).is_err());
        let sel =
            ResourceFieldSelector { container_name: Some("free".into()), resource: "limits.gpu".into(), divisor: None };
        assert_eq!(
            resource_value(&pod(), &sel, &NODE).unwrap_err().to_string(),
            "unsupported container resource : limits.gpu"
        );
    }

    #[test]
    fn collect_data_uses_modes_and_aggregates_errors() {
        let file = |path: &str, field: &str, mode: Option<i32>| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector { field_path: field.into(), api_version: None }),
            mode,
            resource_field_ref: None,
        };
        let items = [file("labels", "metadata.labels", None), file("name", "metadata.name", Some(0o400))];
        let p = collect_data(&items, &pod(), &NODE, 0o644).unwrap();
        assert_eq!(p["labels"].mode, 0o644);
        assert_eq!(p["name"], FileProjection { data: b"web".to_vec(), mode: 0o400 });
        let bad = [file("a", "spec.x", None), file("b", "spec.y", None)];
        let e = collect_data(&bad, &pod(), &NODE, 0o644).unwrap_err();
        assert_eq!(e.to_string(), "[unsupported fieldPath: spec.x, unsupported fieldPath: spec.y]");
    }
}
