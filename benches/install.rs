//! The installer, measured: seconds from running install.sh (downloading a
//! local release of the stripped binary over HTTP, checksum verified) to a
//! Ready node, with the service started as its OpenRC script would in a
//! network namespace of its own; seconds for ferrok-killall.sh and the
//! uninstaller; what the uninstaller leaves under the install's root
//! (should be nothing); the size of the stripped release binary.
//! Prints figures; it is not a pass/fail test. Needs root and what
//! `scripts/deps` installs.
//!
//! `cargo bench --bench install`

#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tcommon::install::{listing, node_name, run_install, server_exec, text, wait_node_ready, Netns, Release, Service};

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let bin = Path::new(tcommon::ferrok_bin());
    let work = tempfile::tempdir().expect("tempdir");
    let stripped = work.path().join("ferrok");
    std::fs::copy(bin, &stripped).expect("copy the binary");
    let out = Command::new("strip").arg(&stripped).output().expect("strip (binutils)");
    assert!(out.status.success(), "strip: {}", text(&out));
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    println!("binary {}: {:.1} MiB, after strip {:.1} MiB", bin.display(), mib(size(bin)), mib(size(&stripped)));

    let release = Release::serve(&stripped, None);
    let netns = Netns::new();
    let root = tempfile::tempdir().expect("tempdir");
    let exec = server_exec(&netns);
    let started = Instant::now();
    let env = [
        ("INSTALL_FERROK_INIT", "openrc"),
        ("INSTALL_FERROK_DOWNLOAD_URL", release.url.as_str()),
        ("INSTALL_FERROK_EXEC", exec.as_str()),
    ];
    let out = run_install(root.path(), &env, &[]);
    assert!(out.status.success(), "install.sh: {}", text(&out));
    let installed = started.elapsed();
    let data = root.path().join("var/lib/ferrok");
    let bin_dir = root.path().join("usr/local/bin");
    let mut service = Service::start_openrc(&netns, &root.path().join("etc/init.d/ferrok"));
    let ready = wait_node_ready(
        &netns,
        &mut service,
        &data.join("kubeconfig.yaml"),
        &node_name(&netns),
        Duration::from_secs(120),
    );
    let to_ready = started.elapsed();
    let t = Instant::now();
    let killall = netns.command(bin_dir.join("ferrok-killall.sh")).output().expect("killall");
    let killall_time = t.elapsed();
    let t = Instant::now();
    let uninstall = Command::new(bin_dir.join("ferrok-uninstall.sh")).output().expect("uninstall");
    let uninstall_time = t.elapsed();
    assert!(ready, "the node did not become Ready");
    assert!(killall.status.success(), "killall: {}", text(&killall));
    assert!(uninstall.status.success(), "uninstall: {}", text(&uninstall));
    println!("install.sh (download, verify, install, service files): {:.2} s", installed.as_secs_f64());
    println!("install.sh start to a Ready node: {:.2} s", to_ready.as_secs_f64());
    println!("ferrok-killall.sh: {:.2} s", killall_time.as_secs_f64());
    println!("ferrok-uninstall.sh: {:.2} s", uninstall_time.as_secs_f64());
    let left = listing(root.path());
    println!("left under the install's root after uninstalling: {} paths {:?}", left.len(), left);
}
