//! The official Python `kubernetes` client against `ferrok server`
//! (installed by scripts/deps): CRUD, patch, scale, 404s and watch.

mod common;

use std::process::Command;

#[test]
fn python_kubernetes_client() {
    let server = common::ApiServer::start();
    let kubeconfig = server.kubeconfig();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python_client.py");
    let out = Command::new("python3").arg(script).arg(&kubeconfig).output().expect("python3");
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "the Python client failed (is `kubernetes` installed? scripts/deps installs it):\n{stdout}\n{stderr}"
    );
}
