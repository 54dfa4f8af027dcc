//! `ferrok kubectl …`, and ferrok started under the name `kubectl` (the
//! installer's `INSTALL_FERROK_SYMLINK`): the host's kubectl, run with the
//! cluster's admin kubeconfig unless the caller chose one. ferrok does not
//! embed kubectl (it would double the binary); it finds the real one in
//! `PATH`, skipping links back to ferrok itself.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Whether ferrok was started as `kubectl` (through a link to its binary).
pub fn invoked_as_kubectl(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name().is_some_and(|n| n == "kubectl")
}

/// The admin kubeconfig a server on this host writes by default: the one
/// under `/etc/ferrok` for root, else the one in the default data dir.
fn default_kubeconfig() -> PathBuf {
    if super::is_root() {
        PathBuf::from("/etc/ferrok/ferrok.yaml")
    } else {
        super::default_data_dir().join("kubeconfig.yaml")
    }
}

/// Whether the caller named a kubeconfig: `--kubeconfig` or `KUBECONFIG`.
fn kubeconfig_given(args: &[OsString]) -> bool {
    let flag = args.iter().any(|a| {
        let a = a.to_string_lossy();
        a == "--kubeconfig" || a.starts_with("--kubeconfig=")
    });
    flag || std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty())
}

/// The first `kubectl` in `PATH` that is not ferrok itself.
fn host_kubectl(path: &OsStr, myself: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path).map(|dir| dir.join("kubectl")).find(|candidate| {
        let Ok(meta) = std::fs::metadata(candidate) else { return false };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return false;
        }
        let real = std::fs::canonicalize(candidate).ok();
        real.is_none() || real.as_deref() != myself
    })
}

/// Runs the host's kubectl with `args` in place of this process; returns
/// only when that is not possible, with the reason.
pub fn exec(args: Vec<OsString>) -> anyhow::Error {
    let myself = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let Some(kubectl) = host_kubectl(&path, myself.as_deref()) else {
        return anyhow::anyhow!(
            "no kubectl in PATH (ferrok runs the host's kubectl): install kubectl, or use the admin kubeconfig {} \
             with any Kubernetes client",
            default_kubeconfig().display()
        );
    };
    let mut command = std::process::Command::new(&kubectl);
    command.args(&args);
    if !kubeconfig_given(&args) {
        let config = default_kubeconfig();
        if let Err(e) = std::fs::File::open(&config) {
            return match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "no admin kubeconfig at {}: is `ferrok server` running on this host? (or set KUBECONFIG)",
                    config.display()
                ),
                std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
                    "cannot read the admin kubeconfig {}: permission denied; run as root, or start the server with \
                     --write-kubeconfig-mode 644 (or set KUBECONFIG)",
                    config.display()
                ),
                _ => anyhow::anyhow!("cannot read the admin kubeconfig {}: {e}", config.display()),
            };
        }
        command.env("KUBECONFIG", config);
    }
    let e = command.exec();
    anyhow::anyhow!("cannot run {}: {e}", kubectl.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_host_kubectl_past_a_link_to_ferrok() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let root = std::env::temp_dir().join(format!("ferrok-kubectl-{}", std::process::id()));
        let (links, host) = (root.join("links"), root.join("host"));
        std::fs::create_dir_all(&links).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        let ferrok = root.join("ferrok");
        std::fs::write(&ferrok, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&ferrok, std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink(&ferrok, links.join("kubectl")).unwrap();
        let real = host.join("kubectl");
        std::fs::write(&real, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let myself = std::fs::canonicalize(&ferrok).unwrap();
        let path = std::env::join_paths([&links, &host]).unwrap();
        assert_eq!(host_kubectl(&path, Some(&myself)), Some(real.clone()));
        // Not executable: skipped.
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(host_kubectl(&path, Some(&myself)), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn started_as_kubectl() {
        assert!(invoked_as_kubectl(OsStr::new("/usr/local/bin/kubectl")));
        assert!(invoked_as_kubectl(OsStr::new("kubectl")));
        assert!(!invoked_as_kubectl(OsStr::new("/usr/local/bin/ferrok")));
        assert!(!invoked_as_kubectl(OsStr::new("kubectl.1.27")));
    }
}
