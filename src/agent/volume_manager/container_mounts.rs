//! A container's volumeMounts as CRI mounts, as upstream's `makeMounts`:
//! readOnly (forced for the volumes that must be), subPath and
//! subPathExpr (`$(VAR)` from the container's environment), and mount
//! propagation.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Container;

use super::error::VolumeError;
use super::layout::subpath_dir;
use super::subpath::{self, SubPath};
use super::PodVolumes;
use crate::agent::cri::api;

/// Expands `$(VAR)` references as upstream's `expansion.Expand`: `$$` is a
/// literal `$`, an unclosed `$(` stays as written. Names for which
/// `mapping` returns None are collected in `missing` (and expand to "").
pub fn expand(input: &str, mapping: impl Fn(&str) -> Option<String>, missing: &mut BTreeSet<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.chars().next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match mapping(name) {
                        Some(v) if !v.is_empty() => out.push_str(&v),
                        _ => {
                            missing.insert(name.to_string());
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A subPathExpr expanded from the container's environment; every
/// variable it names must have a non-empty value.
pub fn expand_sub_path(expr: &str, env: &BTreeMap<String, String>) -> Result<String, VolumeError> {
    let mut missing = BTreeSet::new();
    let out = expand(expr, |k| env.get(k).cloned(), &mut missing);
    if !missing.is_empty() {
        return Err(VolumeError::SubPathExpr {
            expr: expr.to_string(),
            missing: missing.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    Ok(out)
}

/// Checks a subPath as upstream does before using it.
pub fn validate_sub_path(sub: &str) -> Result<(), VolumeError> {
    if sub.starts_with('/') {
        return Err(VolumeError::SubPathAbsolute(sub.to_string()));
    }
    if sub.split('/').any(|c| c == "..") {
        return Err(VolumeError::SubPathBacksteps(sub.to_string()));
    }
    Ok(())
}

fn propagation(container: &Container, mode: Option<&str>) -> Result<api::MountPropagation, VolumeError> {
    match mode {
        None | Some("None") => Ok(api::MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(api::MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => {
            let privileged = container.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
            if !privileged {
                return Err(VolumeError::BidirectionalNotPrivileged);
            }
            Ok(api::MountPropagation::PropagationBidirectional)
        }
        Some(other) => Err(VolumeError::InvalidPropagation(other.to_string())),
    }
}

impl PodVolumes {
    /// The CRI mounts of `container`, whose environment is `env` (for
    /// subPathExpr). subPaths are bind-mounted under the pod's folder now.
    pub fn mounts_for(
        &self,
        container: &Container,
        env: &BTreeMap<String, String>,
    ) -> Result<Vec<api::Mount>, VolumeError> {
        let mut mounts = Vec::new();
        for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
            let volume = self.volumes.get(&vm.name).ok_or_else(|| VolumeError::NoSuchVolume {
                volume: vm.name.clone(),
                container: container.name.clone(),
            })?;
            let propagation = propagation(container, vm.mount_propagation.as_deref())?;
            let sub = match vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                Some(expr) => expand_sub_path(expr, env)?,
                None => vm.sub_path.clone().unwrap_or_default(),
            };
            let host_path = if sub.is_empty() {
                volume.path.clone()
            } else {
                validate_sub_path(&sub)?;
                let target = subpath_dir(&self.pod_dir, &vm.name, &container.name, index);
                let at = SubPath {
                    volume: &volume.path,
                    sub: &sub,
                    target: &target,
                    mount: &vm.name,
                    container: &container.name,
                };
                subpath::prepare(self.mounter.as_ref(), &at)?
            };
            mounts.push(api::Mount {
                container_path: vm.mount_path.clone(),
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: vm.read_only.unwrap_or(false) || volume.read_only,
                selinux_relabel: false,
                propagation: propagation as i32,
                ..Default::default()
            });
        }
        Ok(mounts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use k8s_openapi::api::core::v1::{SecurityContext, VolumeMount};

    use super::super::layout::Plugin;
    use super::super::MountedVolume;

    fn env() -> BTreeMap<String, String> {
        [("POD".to_string(), "web-0".to_string()), ("NS".to_string(), "prod".to_string()), ("E".to_string(), "".into())]
            .into_iter()
            .collect()
    }

    #[test]
    fn expansion_follows_upstream_rules() {
        let mut missing = BTreeSet::new();
        let map = |k: &str| env().get(k).cloned();
        assert_eq!(expand("logs/$(NS)/$(POD)", map, &mut missing), "logs/prod/web-0");
        assert_eq!(expand("$$(POD)", map, &mut missing), "$(POD)");
        assert_eq!(expand("a$b", map, &mut missing), "a$b");
        assert_eq!(expand("open $(POD", map, &mut missing), "open $(POD");
        assert_eq!(expand("end$", map, &mut missing), "end$");
        assert_eq!(expand("ü$é", map, &mut missing), "ü$é");
        assert!(missing.is_empty());
        assert_eq!(expand("$(NOPE)/x", map, &mut missing), "/x");
        assert_eq!(missing.into_iter().collect::<Vec<_>>(), ["NOPE"]);
    }

    #[test]
    fn sub_path_expr_needs_every_variable() {
        assert_eq!(expand_sub_path("$(NS)/$(POD)", &env()).unwrap(), "prod/web-0");
        let e = expand_sub_path("$(E)/$(X)/$(A)", &env()).unwrap_err();
        assert_eq!(e.to_string(), "unable to expand the subPathExpr \"$(E)/$(X)/$(A)\": missing value for A, E, X");
        assert!(validate_sub_path("/abs").is_err());
        assert!(validate_sub_path("a/../b").is_err());
        assert!(validate_sub_path("a/..b").is_ok());
    }

    fn volumes() -> PodVolumes {
        let vol = |name: &str, plugin, path: &str, read_only| {
            (name.to_string(), MountedVolume { name: name.into(), plugin, path: PathBuf::from(path), read_only })
        };
        PodVolumes {
            uid: "u".into(),
            pod_dir: PathBuf::from("/nonexistent/u"),
            volumes: [
                vol("cfg", Plugin::ConfigMap, "/p/u/volumes/kubernetes.io~configmap/cfg", true),
                vol("host", Plugin::HostPath, "/var/log", false),
            ]
            .into_iter()
            .collect(),
            mounter: std::sync::Arc::new(super::super::mounter::FakeMounter::default()),
        }
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
    }

    #[test]
    fn mounts_carry_read_only_and_propagation() {
        let mut host = mount("host", "/logs");
        host.mount_propagation = Some("HostToContainer".into());
        let mut ro = mount("host", "/ro");
        ro.read_only = Some(true);
        let c = Container {
            name: "c".into(),
            volume_mounts: Some(vec![mount("cfg", "/etc/cfg"), host, ro]),
            ..Default::default()
        };
        let m = volumes().mounts_for(&c, &env()).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].host_path, "/p/u/volumes/kubernetes.io~configmap/cfg");
        assert!(m[0].readonly, "configMap volumes are always read-only");
        assert_eq!(m[1].host_path, "/var/log");
        assert!(!m[1].readonly);
        assert_eq!(m[1].propagation, api::MountPropagation::PropagationHostToContainer as i32);
        assert!(m[2].readonly);
        assert_eq!(m[2].propagation, api::MountPropagation::PropagationPrivate as i32);
    }

    #[test]
    fn bidirectional_needs_privilege_and_volumes_must_exist() {
        let mut b = mount("host", "/x");
        b.mount_propagation = Some("Bidirectional".into());
        let mut c = Container { name: "c".into(), volume_mounts: Some(vec![b]), ..Default::default() };
        assert!(matches!(volumes().mounts_for(&c, &env()), Err(VolumeError::BidirectionalNotPrivileged)));
        c.security_context = Some(SecurityContext { privileged: Some(true), ..Default::default() });
        let m = volumes().mounts_for(&c, &env()).unwrap();
        assert_eq!(m[0].propagation, api::MountPropagation::PropagationBidirectional as i32);
        let c = Container { name: "c".into(), volume_mounts: Some(vec![mount("nope", "/x")]), ..Default::default() };
        assert_eq!(
            volumes().mounts_for(&c, &env()).unwrap_err().to_string(),
            "cannot find volume \"nope\" to mount into container \"c\""
        );
        let mut bad = mount("host", "/x");
        bad.sub_path_expr = Some("$(MISSING)".into());
        let c = Container { name: "c".into(), volume_mounts: Some(vec![bad]), ..Default::default() };
        assert!(matches!(volumes().mounts_for(&c, &env()), Err(VolumeError::SubPathExpr { .. })));
    }
}
