//! Setting up one volume of a pod, by kind: upstream's plugins' `SetUp`.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::atomic_writer::AtomicWriter;
use super::claim::{self, ClaimSource};
use super::contents::Context;
use super::error::SetUpError;
use super::layout::{volume_dir, Plugin};
use super::tokens::{PodTokens, TokenKey};
use super::{empty_dir, host_path, ownership, Inner, MountedVolume};

/// Runs blocking file-system work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SetUpError> + Send + 'static,
) -> Result<T, SetUpError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| SetUpError::Api(format!("volume task failed: {e}")))?
}

/// The pod's fsGroup and fsGroupChangePolicy.
fn fs_group(pod: &Pod) -> (Option<i64>, Option<String>) {
    let sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    (sc.and_then(|c| c.fs_group), sc.and_then(|c| c.fs_group_change_policy.clone()))
}

/// The plugin of a volume written by the atomic writer, if it is one.
pub fn writer_plugin(volume: &Volume) -> Option<Plugin> {
    if volume.config_map.is_some() {
        Some(Plugin::ConfigMap)
    } else if volume.secret.is_some() {
        Some(Plugin::Secret)
    } else if volume.downward_api.is_some() {
        Some(Plugin::DownwardApi)
    } else if volume.projected.is_some() {
        Some(Plugin::Projected)
    } else {
        None
    }
}

fn mounted(name: &str, plugin: Plugin, path: PathBuf, read_only: bool) -> MountedVolume {
    MountedVolume { name: name.to_string(), plugin, path, read_only }
}

impl Inner {
    /// Makes `volume` of `pod` ready on the node.
    pub(super) async fn set_up_volume(
        &self,
        pod: &Pod,
        uid: &str,
        volume: &Volume,
        tokens: &mut PodTokens,
    ) -> Result<MountedVolume, SetUpError> {
        let name = volume.name.as_str();
        let (group, policy) = fs_group(pod);
        let memory = self.allocatable_now().memory_bytes;
        if let Some(ed) = &volume.empty_dir {
            let in_memory = match ed.medium.as_deref().unwrap_or_default() {
                "" => false,
                "Memory" => true,
                other => return Err(SetUpError::UnsupportedMedium(other.to_string())),
            };
            let dir = volume_dir(&self.pods_dir, uid, Plugin::EmptyDir, name);
            let size = in_memory.then(|| empty_dir::memory_size(pod, ed.size_limit.as_ref(), memory));
            let d = dir.clone();
            let mounter = self.mounter.clone();
            blocking(move || {
                empty_dir::set_up(mounter.as_ref(), &d, size, in_memory)?;
                ownership::set_volume_ownership(&d, group, policy.as_deref(), false)
            })
            .await?;
            return Ok(mounted(name, Plugin::EmptyDir, dir, false));
        }
        if let Some(hp) = &volume.host_path {
            let (path, kind) = (hp.path.clone(), hp.type_.clone());
            blocking(move || host_path::check_type(&path, kind.as_deref())).await?;
            return Ok(mounted(name, Plugin::HostPath, PathBuf::from(&hp.path), false));
        }
        if let Some(pvc) = &volume.persistent_volume_claim {
            let read_only = pvc.read_only.unwrap_or(false);
            return self.set_up_claim(pod, uid, name, &pvc.claim_name, read_only, false).await;
        }
        if volume.ephemeral.is_some() {
            let claim = format!("{}-{}", pod.metadata.name.as_deref().unwrap_or_default(), name);
            return self.set_up_claim(pod, uid, name, &claim, false, true).await;
        }
        let Some(plugin) = writer_plugin(volume) else {
            return Err(SetUpError::UnsupportedVolume);
        };
        let dir = volume_dir(&self.pods_dir, uid, plugin, name);
        let size = plugin.memory_backed().then(|| empty_dir::memory_size(pod, None, memory));
        let d = dir.clone();
        let mounter = self.mounter.clone();
        blocking(move || empty_dir::set_up(mounter.as_ref(), &d, size, plugin.memory_backed())).await?;
        let mut used = Vec::new();
        self.write_contents(pod, volume, &dir, tokens, &mut used).await?;
        Ok(mounted(name, plugin, dir, true))
    }

    /// Builds the payload of an atomic-writer volume and writes it when it
    /// changed; returns whether it did.
    pub(super) async fn write_contents(
        &self,
        pod: &Pod,
        volume: &Volume,
        dir: &Path,
        tokens: &mut PodTokens,
        used: &mut Vec<TokenKey>,
    ) -> Result<bool, SetUpError> {
        let allocatable = self.allocatable_now();
        let ctx = Context {
            client: &self.client,
            sources: &self.sources,
            allocatable: &allocatable,
            sync_limit: self.sync_limit,
        };
        let payload = ctx.payload(pod, volume, tokens, used).await?;
        let (group, _) = fs_group(pod);
        let dir = dir.to_path_buf();
        blocking(move || {
            let set_perms = |d: &Path| ownership::set_volume_ownership(d, group, None, true);
            AtomicWriter::new(&dir).write(&payload, Some(&set_perms))
        })
        .await
    }

    async fn set_up_claim(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
        claim_name: &str,
        read_only: bool,
        ephemeral: bool,
    ) -> Result<MountedVolume, SetUpError> {
        let resolved = claim::resolve(&self.client, pod, claim_name, ephemeral).await?;
        match resolved.source {
            ClaimSource::HostPath { path, kind } => {
                let p = path.clone();
                blocking(move || host_path::check_type(&p, kind.as_deref())).await?;
                Ok(mounted(name, Plugin::HostPath, PathBuf::from(path), read_only))
            }
            ClaimSource::Local { path } => {
                let dir = volume_dir(&self.pods_dir, uid, Plugin::LocalVolume, &resolved.volume_name);
                let (group, policy) = fs_group(pod);
                let d = dir.clone();
                let mounter = self.mounter.clone();
                blocking(move || {
                    let source = Path::new(&path);
                    if !host_path::exists(source) {
                        return Err(SetUpError::LocalPathMissing(path.clone()));
                    }
                    std::fs::create_dir_all(&d).map_err(SetUpError::io(&d))?;
                    if !mounter.is_mount_point(&d).map_err(SetUpError::io(&d))? {
                        mounter
                            .bind_mount(source, &d, read_only)
                            .map_err(|source| SetUpError::Mount { target: d.clone(), source })?;
                    }
                    if !read_only {
                        ownership::set_volume_ownership(&d, group, policy.as_deref(), false)?;
                    }
                    Ok(())
                })
                .await?;
                Ok(mounted(name, Plugin::LocalVolume, dir, read_only))
            }
        }
    }
}
