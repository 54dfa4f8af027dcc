//! HTTPS with client-certificate checks: `ferrok datastore` serving TLS to
//! etcdctl, and ferrok reaching a TLS-only etcd with the k3s-named flags.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out =
        Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed (scripts/deps)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a serving certificate for 127.0.0.1 and a client certificate.
fn make_pki(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("ext");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    for (name, ext) in [("server", "server.ext"), ("client", "client.ext")] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-extfile",
                ext,
            ],
        );
    }
}

fn etcdctl_tls(endpoint: &str, pki: &Path, with_client_cert: bool, args: &[&str]) -> (bool, String, String) {
    let mut full = vec![format!("--cacert={}", pki.join("ca.crt").display())];
    if with_client_cert {
        full.push(format!("--cert={}", pki.join("client.crt").display()));
        full.push(format!("--key={}", pki.join("client.key").display()));
    }
    full.push("--dial-timeout=2s".into());
    full.push("--command-timeout=3s".into());
    full.extend(args.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    etcdctl(&format!("https://{endpoint}"), &refs, None)
}

async fn start_ferrok_tls(pki: &Path, extra: &[String]) -> (std::process::Child, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut cmd = Command::new(ferrok_bin());
    cmd.arg("datastore").arg("--data-dir").arg(dir.path());
    cmd.args(["--listen-client-urls", &format!("https://127.0.0.1:{port}")]);
    cmd.arg("--cert-file").arg(pki.join("server.crt")).arg("--key-file").arg(pki.join("server.key"));
    cmd.arg("--trusted-ca-file").arg(pki.join("ca.crt"));
    cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
    let child = cmd.spawn().expect("start ferrok");
    let endpoint = format!("127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(&endpoint).is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (child, endpoint, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn https_with_client_certificates() {
    let pki = tempfile::tempdir().expect("tempdir");
    make_pki(pki.path());
    let (mut child, endpoint, _dir) = start_ferrok_tls(pki.path(), &[]).await;
    let (ok, out, err) = etcdctl_tls(&endpoint, pki.path(), true, &["put", "secure", "yes"]);
    assert!(ok, "put over TLS failed: {out} {err}");
    let (ok, out, _) = etcdctl_tls(&endpoint, pki.path(), true, &["get", "secure", "--print-value-only"]);
    assert!(ok && out.trim() == "yes", "{out}");
    let (ok, out, err) = etcdctl_tls(&endpoint, pki.path(), false, &["get", "secure"]);
    assert!(!ok, "a client without a certificate was served: {out} {err}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn datastore_endpoint_over_tls() {
    let pki = tempfile::tempdir().expect("tempdir");
    make_pki(pki.path());
    let p = pki.path();
    let dir = tempfile::tempdir().expect("tempdir");
    let (client, peer) = (free_port(), free_port());
    let mut etcd = Command::new("etcd")
        .args(["--name", "default", "--data-dir"])
        .arg(dir.path().join("etcd"))
        .args(["--listen-client-urls", &format!("https://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("https://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .arg("--cert-file")
        .arg(p.join("server.crt"))
        .arg("--key-file")
        .arg(p.join("server.key"))
        .arg("--trusted-ca-file")
        .arg(p.join("ca.crt"))
        .arg("--client-cert-auth")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd_endpoint = format!("127.0.0.1:{client}");
    let mut ready = false;
    for _ in 0..100 {
        if etcdctl_tls(&etcd_endpoint, p, true, &["put", "from-etcd", "1"]).0 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "etcd with TLS did not start");
    let extra: Vec<String> = vec![
        "--datastore-endpoint".into(),
        format!("https://{etcd_endpoint}"),
        "--datastore-cafile".into(),
        p.join("ca.crt").display().to_string(),
        "--datastore-certfile".into(),
        p.join("client.crt").display().to_string(),
        "--datastore-keyfile".into(),
        p.join("client.key").display().to_string(),
    ];
    let (mut child, endpoint, _dir) = start_ferrok_tls(p, &extra).await;
    let (ok, out, err) = etcdctl_tls(&endpoint, p, true, &["get", "from-etcd", "--print-value-only"]);
    assert!(ok && out.trim() == "1", "read through ferrok from TLS etcd: {out} {err}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = etcd.kill();
    let _ = etcd.wait();
}
