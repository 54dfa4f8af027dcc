//! `ferrok kubectl …` and ferrok linked as `kubectl`: the host's kubectl
//! runs with the admin kubeconfig (found as a user without root finds
//! it), a kubeconfig the caller names wins, kubectl's own flags pass
//! through, and each way it cannot work says why in one line.

mod common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::ApiServer;

const NOBODY: u32 = 65534;

fn host_kubectl_dir() -> PathBuf {
    let out = Command::new("sh").args(["-c", "readlink -f \"$(command -v kubectl)\""]).output().expect("sh");
    let real = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    real.parent().expect("kubectl's folder").to_path_buf()
}

/// `program args…` as the user nobody, with only `home` and `path`.
fn as_nobody(home: &Path, path: &str, program: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", &NOBODY.to_string(), "--regid", &NOBODY.to_string(), "--clear-groups", "--"])
        .arg("env")
        .arg("-i")
        .arg(format!("HOME={}", home.display()))
        .arg(format!("PATH={path}"))
        .arg(program)
        .args(args)
        .output()
        .expect("setpriv")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn kubectl_runs_with_the_admin_kubeconfig() {
    let server = ApiServer::start();
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A home of nobody's with the server's kubeconfig where a server run
    // by that user would have written it.
    let home = root.path().join("home");
    let config = home.join(".ferrok").join("kubeconfig.yaml");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("mkdir");
    std::fs::copy(server.kubeconfig(), &config).expect("copy kubeconfig");
    for p in [&home, &home.join(".ferrok"), &config] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    // ferrok linked as kubectl, first in PATH, before the host's kubectl.
    let links = root.path().join("bin");
    std::fs::create_dir_all(&links).expect("mkdir");
    let link = links.join("kubectl");
    symlink(std::fs::canonicalize(common::ferrok_bin()).expect("ferrok"), &link).expect("symlink");
    let path = format!("{}:{}", links.display(), host_kubectl_dir().display());

    let out = as_nobody(&home, &path, &link, &["get", "namespace", "default", "-o", "name"]);
    assert!(out.status.success(), "kubectl through the link: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "namespace/default", "{}", text(&out));

    let ferrok = Path::new(common::ferrok_bin());
    let out = as_nobody(&home, &path, ferrok, &["kubectl", "get", "namespace", "kube-system", "-o", "name"]);
    assert!(out.status.success(), "ferrok kubectl: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "namespace/kube-system");

    // kubectl's flags are kubectl's, ferrok's -v and --help included.
    let out = as_nobody(&home, &path, ferrok, &["kubectl", "--help"]);
    assert!(
        out.status.success() && text(&out).contains("kubectl controls the Kubernetes cluster manager"),
        "{}",
        text(&out)
    );
    let out = as_nobody(&home, &path, ferrok, &["kubectl", "-v", "6", "get", "namespace", "default", "-o", "name"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("https://127.0.0.1:{}", server.port)), "-v 6 reached kubectl: {}", text(&out));

    // A kubeconfig the caller names wins over the default.
    let elsewhere = root.path().join("other.yaml");
    std::fs::write(&elsewhere, "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n").expect("write");
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let flag = format!("--kubeconfig={}", elsewhere.display());
    let out = as_nobody(&home, &path, ferrok, &["kubectl", &flag, "get", "namespace", "default"]);
    assert!(!out.status.success(), "an empty kubeconfig must not reach the server: {}", text(&out));
    assert!(!text(&out).contains("namespace/default"), "{}", text(&out));

    // The kubeconfig is the server's (root's, mode 0600): one line saying what to do.
    std::os::unix::fs::chown(&config, Some(0), Some(0)).expect("chown");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = as_nobody(&home, &path, &link, &["get", "namespace"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    assert!(said.contains("permission denied") && said.contains("--write-kubeconfig-mode 644"), "{said}");

    // No server on this host.
    std::fs::remove_file(&config).expect("rm");
    let out = as_nobody(&home, &path, &link, &["get", "namespace"]);
    assert!(!out.status.success() && text(&out).contains("no admin kubeconfig at"), "{}", text(&out));

    // No kubectl but ferrok's own link: refused, not a loop.
    let out = as_nobody(&home, &links.display().to_string(), &link, &["get", "namespace"]);
    assert!(!out.status.success() && text(&out).contains("no kubectl in PATH"), "{}", text(&out));
}
