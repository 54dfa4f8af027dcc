//! `kubectl cp` both ways through ferrok: kubectl runs `tar xmf - -C DIR`
//! in the pod with the tar stream on the exec's stdin (upload) and
//! `tar cf - PATH` with the tar stream on its stdout (download). kubectl 1.33
//! speaks WebSocket v5, kubectl 1.27 SPDY/3.1. Needs root and what
//! `scripts/deps` installs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::node::{Node, BUSYBOX};
use sha2::{Digest, Sha256};

/// `kubectl.1.NN` beside the file `kubectl` links to.
fn kubectl_version(minor: u32) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    let kubectl =
        path.split(':').map(|d| PathBuf::from(d).join("kubectl")).find(|p| p.exists()).expect("kubectl on PATH");
    let real = std::fs::canonicalize(kubectl).expect("kubectl");
    real.parent().expect("folder").join(format!("kubectl.1.{minor}")).to_string_lossy().into_owned()
}

/// Runs kubectl `bin` against the node: exit code and stdout+stderr.
fn kubectl(node: &Node, bin: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin)
        .env("KUBECONFIG", node.kubeconfig())
        .env("HOME", node.dir.path())
        .args(args)
        .output()
        .expect("kubectl runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// `len` bytes that do not compress, different on each run.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut x: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha_file(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap_or_default()))
}

/// Size and checksum of a file in the pod, as the pod sees it.
fn in_pod(node: &Node, path: &str) -> String {
    kubectl(node, "kubectl", &["exec", "box", "--", "sh", "-c", &format!("wc -c < {path}; sha256sum {path}")]).1
}

fn cp_suite(node: &Node, bin: &str, work: &Path) {
    let label = bin.rsplit('/').next().unwrap_or(bin).to_string();
    // One 10 MiB file in and out again.
    let data = random_bytes(10 << 20);
    let file = work.join(format!("{label}-in"));
    std::fs::write(&file, &data).expect("write the file");
    let want = sha_file(&file);
    let target = format!("/tmp/{label}-x");
    let (code, out) = kubectl(node, bin, &["cp", &file.to_string_lossy(), &format!("box:{target}")]);
    assert_eq!(code, 0, "{label}: cp into the pod: {out}");
    let seen = in_pod(node, &target);
    assert!(seen.contains(&want), "{label}: the pod holds {seen:?}, want {} bytes {want}", data.len());
    let back = work.join(format!("{label}-out"));
    let (code, out) = kubectl(node, bin, &["cp", &format!("box:{target}"), &back.to_string_lossy()]);
    assert_eq!(code, 0, "{label}: cp out of the pod: {out}");
    assert_eq!(std::fs::metadata(&back).map(|m| m.len()).unwrap_or(0), data.len() as u64, "{label}: size back");
    assert_eq!(sha_file(&back), want, "{label}: the file came back different");

    // A directory with a few files (one in a subdirectory, one empty).
    let dir = work.join(format!("{label}-dir"));
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.txt", b"alpha\n".to_vec()),
        ("b.bin", random_bytes(300_000)),
        ("empty", Vec::new()),
        ("sub/c.bin", random_bytes(70_001)),
    ];
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("write");
    }
    let pod_dir = format!("/tmp/{label}-dir");
    let (code, out) = kubectl(node, bin, &["cp", &dir.to_string_lossy(), &format!("box:{pod_dir}")]);
    assert_eq!(code, 0, "{label}: cp a directory into the pod: {out}");
    for (name, bytes) in &files {
        let seen = in_pod(node, &format!("{pod_dir}/{name}"));
        let want = format!("{:x}", Sha256::digest(bytes));
        assert!(seen.contains(&want), "{label}: {pod_dir}/{name} in the pod is {seen:?}");
    }
    let dir_back = work.join(format!("{label}-dir-back"));
    let (code, out) = kubectl(node, bin, &["cp", &format!("box:{pod_dir}"), &dir_back.to_string_lossy()]);
    assert_eq!(code, 0, "{label}: cp a directory out of the pod: {out}");
    for (name, bytes) in &files {
        let got = std::fs::read(dir_back.join(name)).unwrap_or_else(|e| panic!("{label}: {name} back: {e}"));
        assert!(got == *bytes, "{label}: {name} came back as {} bytes, want {}", got.len(), bytes.len());
    }
}

#[test]
fn kubectl_cp_both_ways_old_and_new() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: box, namespace: default}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "100000"]
"#
    ));
    common::eventually_within("box running", Duration::from_secs(90), || {
        node.get(&["pod", "box"], "{.status.phase}") == "Running"
    });
    let work = tempfile::tempdir().expect("tempdir");
    for minor in [33, 27] {
        cp_suite(&node, &kubectl_version(minor), work.path());
    }
}
