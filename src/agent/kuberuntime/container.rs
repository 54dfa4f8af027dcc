//! A container's config (upstream's generateContainerConfig): image,
//! command and args with `$(VAR)` expanded, environment, mounts, the log
//! path `<name>/<restart>.log`, the labels and annotations ferrok finds it
//! by after a restart, resources and security context.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{resources, sandbox, security};
use crate::agent::cri::{api, labels};
use crate::agent::env;
use crate::agent::pod_util::{self, ContainerKind};

/// `<name>/<restart-count>.log`, relative to the pod's log folder.
pub fn log_path(container: &str, restart_count: i32) -> String {
    format!("{container}/{restart_count}.log")
}

pub struct ContainerInputs<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub kind: ContainerKind,
    pub restart_count: i32,
    /// The image id CRI resolved the container's image to.
    pub image_ref: &'a str,
    pub envs: &'a [(String, String)],
    pub mounts: Vec<api::Mount>,
    pub memory_capacity: i64,
    /// The runtime id of the container an ephemeral container targets: it
    /// joins that container's process namespace.
    pub target_id: Option<&'a str>,
}

/// Upstream's expansion of command and args from the container's env.
pub fn command_and_args(c: &Container, envs: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let vars: HashMap<String, String> = envs.iter().cloned().collect();
    let expand = |list: &Option<Vec<String>>| list.iter().flatten().map(|s| env::expand(s, &vars)).collect();
    (expand(&c.command), expand(&c.args))
}

pub fn container_config(i: &ContainerInputs<'_>) -> api::ContainerConfig {
    let c = i.container;
    let (command, args) = command_and_args(c, i.envs);
    let mut container_labels = sandbox::pod_labels(i.pod);
    container_labels.insert(labels::CONTAINER_NAME.to_string(), c.name.clone());
    container_labels.insert(labels::CONTAINER_HASH.to_string(), pod_util::container_hash(c));
    container_labels.insert(labels::CONTAINER_KIND.to_string(), i.kind.label().to_string());
    let spec = pod_util::spec(i.pod);
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_string(), pod_util::container_hash(c)),
        (labels::CONTAINER_RESTART_COUNT.to_string(), i.restart_count.to_string()),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_string(),
            c.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
        (
            labels::POD_TERMINATION_GRACE_PERIOD.to_string(),
            spec.termination_grace_period_seconds.unwrap_or(30).to_string(),
        ),
    ]);
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        if let Ok(json) = serde_json::to_string(pre_stop) {
            annotations.insert(labels::CONTAINER_PRESTOP_HANDLER.to_string(), json);
        }
    }
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: c.name.clone(), attempt: i.restart_count.max(0) as u32 }),
        image: Some(api::ImageSpec {
            image: i.image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: i.envs.iter().map(|(k, v)| api::KeyValue { key: k.clone(), value: v.clone() }).collect(),
        mounts: i.mounts.clone(),
        labels: container_labels,
        annotations,
        log_path: log_path(&c.name, i.restart_count),
        stdin: c.stdin == Some(true),
        stdin_once: c.stdin_once == Some(true),
        tty: c.tty == Some(true),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources::container_resources(i.pod, c, i.memory_capacity)),
            security_context: Some(security_context(i)),
        }),
        ..Default::default()
    }
}

/// The container's security context; an ephemeral container with a target
/// sees the target's processes (CRI's TARGET pid namespace mode).
fn security_context(i: &ContainerInputs<'_>) -> api::LinuxContainerSecurityContext {
    let mut sc = security::container_security_context(i.pod, i.container);
    if let (Some(target), Some(ns)) = (i.target_id, sc.namespace_options.as_mut()) {
        ns.pid = api::NamespaceMode::Target as i32;
        ns.target_id = target.to_string();
    }
    sc
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_expands_and_labels() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"containers": [{"name": "app", "image": "busybox:1", "command": ["sh", "-c"], "args": ["echo $(GREETING) $(NOPE)"]}]}
        }))
        .unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let envs = vec![("GREETING".to_string(), "hi".to_string())];
        let cfg = container_config(&ContainerInputs {
            pod: &pod,
            container: c,
            kind: ContainerKind::Regular,
            restart_count: 3,
            image_ref: "sha256:abc",
            envs: &envs,
            mounts: vec![],
            memory_capacity: 1 << 30,
            target_id: None,
        });
        assert_eq!(cfg.args, ["echo hi $(NOPE)"]);
        assert_eq!(cfg.log_path, "app/3.log");
        assert_eq!(cfg.metadata.unwrap().attempt, 3);
        assert_eq!(cfg.labels[labels::POD_UID], "u");
        assert_eq!(cfg.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        assert_eq!(cfg.image.unwrap().user_specified_image, "busybox:1");
        let pid = |cfg: &api::ContainerConfig| {
            let ns =
                cfg.linux.as_ref().and_then(|l| l.security_context.as_ref()).and_then(|s| s.namespace_options.clone());
            ns.map(|n| (n.pid, n.target_id)).unwrap_or_default()
        };
        let inputs = |target_id| ContainerInputs {
            pod: &pod,
            container: c,
            kind: ContainerKind::Ephemeral,
            restart_count: 0,
            image_ref: "sha256:abc",
            envs: &envs,
            mounts: vec![],
            memory_capacity: 1 << 30,
            target_id,
        };
        assert_eq!(pid(&container_config(&inputs(None))), (api::NamespaceMode::Container as i32, String::new()));
        assert_eq!(
            pid(&container_config(&inputs(Some("cid")))),
            (api::NamespaceMode::Target as i32, "cid".to_string())
        );
    }
}
