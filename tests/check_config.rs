//! `ferrok check-config` on this machine (which `scripts/deps` set up): all
//! checks pass in a clean network namespace, and a busy port or an open
//! data dir fails with a line saying what to do and exit status 1.

mod common;

use std::process::{Command, Output};

use common::node::alloc_netns;

fn check_config(netns: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, common::ferrok_bin()]);
            c
        }
        None => Command::new(common::ferrok_bin()),
    };
    cmd.arg("check-config").args(args).output().expect("ferrok check-config")
}

fn line<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no {name:?} line in\n{stdout}"))
}

#[test]
fn a_ready_host_passes_and_each_failure_says_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.display().to_string();

    // In a namespace of its own, no port is taken by another test.
    let (ns, _) = alloc_netns();
    let out = check_config(Some(&ns), &["--data-dir", &data_arg]);
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    for name in [
        "kernel ",
        "kernel options",
        "cgroups",
        "containerd",
        "runc",
        "CNI plugins",
        "nft ",
        "nftables",
        "port 6443/tcp",
        "port 10250/tcp",
        "port 8472/udp",
        "data dir",
    ] {
        let l = line(&stdout, name);
        assert!(l.starts_with("ok "), "{l}");
    }

    // A port in use, and a data dir others may write to.
    let held = std::net::TcpListener::bind(("0.0.0.0", 0)).expect("a port");
    let port = held.local_addr().expect("its address").port().to_string();
    std::fs::create_dir(&data).expect("data dir");
    std::fs::set_permissions(&data, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777))
        .expect("chmod");
    let out = check_config(None, &["--data-dir", &data_arg, "--https-listen-port", &port]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let busy = line(&stdout, &format!("port {port}/tcp"));
    assert!(busy.starts_with("FAIL") && busy.contains("in use (the API server)"), "{busy}");
    let open = line(&stdout, "data dir");
    assert!(open.starts_with("FAIL") && open.contains("chmod go-w"), "{open}");
    assert!(stderr.trim().lines().count() == 1 && stderr.contains("check(s) failed"), "{stderr}");
    drop(held);
}
