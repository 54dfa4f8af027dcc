//! The official Python `kubernetes` client against `ferrok server`
//! (installed by scripts/deps): CRUD, patch, scale, 404s and watch.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn python_kubernetes_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let mut server = Command::new(common::ferrok_bin())
        .args(["server", "--disable-agent", "--bind-address", "127.0.0.1", "--data-dir"])
        .arg(dir.path())
        .args(["--https-listen-port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ferrok server");
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    let started = Instant::now();
    while !kubeconfig.exists() {
        assert!(started.elapsed() < Duration::from_secs(20), "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python_client.py");
    let out = Command::new("python3").arg(script).arg(&kubeconfig).output().expect("python3");
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "the Python client failed (is `kubernetes` installed? scripts/deps installs it):\n{stdout}\n{stderr}"
    );
}
