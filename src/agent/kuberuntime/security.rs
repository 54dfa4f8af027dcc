//! Security contexts in the runtime's terms (upstream's
//! kuberuntime/security_context.go): the container's settings over the
//! pod's, namespaces, capabilities, seccomp, the default masked /proc paths,
//! and the runAsNonRoot check against the image's user.

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile};

use crate::agent::cri::api;
use crate::agent::pod_util;

/// Upstream's default masked and read-only paths (procMount Default).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The pod's namespace modes.
pub fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let s = pod_util::spec(pod);
    let node = api::NamespaceMode::Node as i32;
    api::NamespaceOption {
        network: if s.host_network == Some(true) { node } else { api::NamespaceMode::Pod as i32 },
        pid: if s.host_pid == Some(true) {
            node
        } else if s.share_process_namespace == Some(true) {
            api::NamespaceMode::Pod as i32
        } else {
            api::NamespaceMode::Container as i32
        },
        ipc: if s.host_ipc == Some(true) { node } else { api::NamespaceMode::Pod as i32 },
        ..Default::default()
    }
}

fn seccomp(profile: Option<&SeccompProfile>) -> Option<api::SecurityProfile> {
    let p = profile?;
    let profile_type = match p.type_.as_str() {
        "RuntimeDefault" => api::security_profile::ProfileType::RuntimeDefault,
        "Localhost" => api::security_profile::ProfileType::Localhost,
        _ => api::security_profile::ProfileType::Unconfined,
    };
    Some(api::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref: p.localhost_profile.clone().unwrap_or_default(),
    })
}

fn unconfined() -> api::SecurityProfile {
    api::SecurityProfile {
        profile_type: api::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    }
}

/// Whether any container of the pod is privileged (then its sandbox must be).
pub fn pod_privileged(pod: &Pod) -> bool {
    pod_util::containers(pod).any(|(_, c)| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
}

fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let psc = pod_util::spec(pod).security_context.as_ref();
    let mut groups: Vec<i64> = psc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default();
    if let Some(fs) = psc.and_then(|s| s.fs_group) {
        if !groups.contains(&fs) {
            groups.insert(0, fs);
        }
    }
    groups
}

/// The sandbox's security context.
pub fn sandbox_security_context(pod: &Pod) -> api::LinuxSandboxSecurityContext {
    let psc = pod_util::spec(pod).security_context.as_ref();
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod)),
        run_as_user: psc.and_then(|s| s.run_as_user).map(|value| api::Int64Value { value }),
        run_as_group: psc.and_then(|s| s.run_as_group).map(|value| api::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        privileged: pod_privileged(pod),
        seccomp: Some(seccomp(psc.and_then(|s| s.seccomp_profile.as_ref())).unwrap_or_else(unconfined)),
        ..Default::default()
    }
}

/// The effective user a container runs as, when the spec says.
pub fn run_as_user(pod: &Pod, c: &Container) -> Option<i64> {
    let psc = pod_util::spec(pod).security_context.as_ref();
    c.security_context.as_ref().and_then(|s| s.run_as_user).or_else(|| psc.and_then(|s| s.run_as_user))
}

/// Why a container that must run as non-root may not start, in upstream's
/// words (the pod's full name and the container's name in each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NonRootError {
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})")]
    ImageRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})")]
    ImageUserName { user: String, pod: String, container: String },
}

/// upstream's verifyRunAsNonRoot, given the image's user (uid, or name).
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), NonRootError> {
    let psc = pod_util::spec(pod).security_context.as_ref();
    let non_root =
        c.security_context.as_ref().and_then(|s| s.run_as_non_root).or_else(|| psc.and_then(|s| s.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (pod_name, container) = (pod_util::full_name(pod), c.name.clone());
    if let Some(uid) = run_as_user(pod, c) {
        if uid == 0 {
            return Err(NonRootError::RunAsRoot { pod: pod_name, container });
        }
        return Ok(());
    }
    match image_uid {
        Some(0) => Err(NonRootError::ImageRoot { pod: pod_name, container }),
        Some(_) => Ok(()),
        None if !image_user.is_empty() => {
            Err(NonRootError::ImageUserName { user: image_user.to_string(), pod: pod_name, container })
        }
        // No user in the image: it runs as root.
        None => Err(NonRootError::ImageRoot { pod: pod_name, container }),
    }
}

/// The container's security context.
pub fn container_security_context(pod: &Pod, c: &Container) -> api::LinuxContainerSecurityContext {
    let psc = pod_util::spec(pod).security_context.as_ref();
    let sc = c.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged) == Some(true);
    let unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let seccomp_profile =
        sc.and_then(|s| s.seccomp_profile.as_ref()).or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()));
    api::LinuxContainerSecurityContext {
        capabilities: caps.map(|c| api::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged,
        namespace_options: Some(namespace_options(pod)),
        run_as_user: run_as_user(pod, c).map(|value| api::Int64Value { value }),
        run_as_group: sc
            .and_then(|s| s.run_as_group)
            .or_else(|| psc.and_then(|s| s.run_as_group))
            .map(|value| api::Int64Value { value }),
        readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        supplemental_groups: supplemental_groups(pod),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: if privileged || unmasked {
            Vec::new()
        } else {
            MASKED_PATHS.iter().map(|s| s.to_string()).collect()
        },
        readonly_paths: if privileged || unmasked {
            Vec::new()
        } else {
            READONLY_PATHS.iter().map(|s| s.to_string()).collect()
        },
        seccomp: Some(seccomp(seccomp_profile).unwrap_or_else(unconfined)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": v})).unwrap()
    }

    #[test]
    fn container_settings_win_over_the_pod() {
        let p = pod(json!({"securityContext": {"runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [3000]},
            "containers": [{"name": "a", "securityContext": {"runAsUser": 1001, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}, "readOnlyRootFilesystem": true}}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let sc = container_security_context(&p, c);
        assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 1001 }));
        assert_eq!(sc.supplemental_groups, [2000, 3000]);
        assert!(sc.no_new_privs && sc.readonly_rootfs && !sc.privileged);
        assert_eq!(sc.capabilities.unwrap().add_capabilities, ["NET_ADMIN"]);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));
    }

    #[test]
    fn privileged_pods_have_privileged_sandboxes_and_no_masks() {
        let p = pod(json!({"containers": [{"name": "a", "securityContext": {"privileged": true}}]}));
        assert!(sandbox_security_context(&p).privileged);
        let sc = container_security_context(&p, &p.spec.as_ref().unwrap().containers[0]);
        assert!(sc.masked_paths.is_empty());
    }

    #[test]
    fn run_as_non_root_checks_the_image_user() {
        let p = pod(json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a"}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert!(verify_run_as_non_root(&p, c, Some(0), "").unwrap_err().to_string().contains("image will run as root"));
        assert!(verify_run_as_non_root(&p, c, None, "nobody")
            .unwrap_err()
            .to_string()
            .contains("non-numeric user (nobody)"));
        assert!(verify_run_as_non_root(&p, c, Some(65534), "").is_ok());
        let p =
            pod(json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 1000}, "containers": [{"name": "a"}]}));
        assert!(verify_run_as_non_root(&p, &p.spec.as_ref().unwrap().containers[0], Some(0), "").is_ok());
    }

    #[test]
    fn namespaces() {
        let p = pod(json!({"hostNetwork": true, "shareProcessNamespace": true, "containers": []}));
        let n = namespace_options(&p);
        assert_eq!(n.network, api::NamespaceMode::Node as i32);
        assert_eq!(n.pid, api::NamespaceMode::Pod as i32);
        assert_eq!(n.ipc, api::NamespaceMode::Pod as i32);
    }
}
