//! `ferrok certificate check|rotate` on a real server's data dir: every
//! certificate listed with its expiry, an expired one failing the check,
//! rotated leaves backed up and issued anew at the next start, with the
//! CAs (and so the clients' trust) unchanged.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::ApiServer;

fn certificate(data: &Path, args: &[&str]) -> Output {
    Command::new(common::ferrok_bin())
        .arg("certificate")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("ferrok certificate")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The line of `check` for `file`.
fn line(table: &str, file: &str) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(file))
        .unwrap_or_else(|| panic!("no line for {file} in\n{table}"))
        .to_string()
}

/// A client certificate for `cn` valid from 2020 until `not_after`.
fn certificate_until(cn: &str, not_after: time::OffsetDateTime) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = not_after;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.self_signed(&key).expect("self-signed").pem()
}

#[test]
fn check_lists_expiry_and_rotate_issues_new_leaves() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    let tls = data.join("server").join("tls");

    let out = certificate(&data, &["check"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("FILENAME"), "{table}");
    let ca = line(&table, "server/tls/server-ca.crt");
    assert!(ca.contains("CN=ferrok-server-ca@") && ca.contains("CertSign") && ca.ends_with("OK"), "{ca}");
    let admin = line(&table, "server/tls/client-admin.crt");
    assert!(admin.contains("CN=system:admin,O=system:masters") && admin.contains("ClientAuth"), "{admin}");
    // Issued a moment ago for 365 days (the residual time is floored).
    assert!((admin.contains(" 364d ") || admin.contains(" 365d ")) && admin.ends_with("OK"), "{admin}");
    let serving = line(&table, "server/tls/serving-kube-apiserver.crt");
    assert!(serving.contains("ServerAuth") && serving.ends_with("OK"), "{serving}");

    // One certificate near expiry, one expired: a warning, and a failed check.
    let soon = certificate_until(
        "soon",
        time::OffsetDateTime::now_utc() + time::Duration::days(30) - time::Duration::hours(1),
    );
    std::fs::write(tls.join("extra-soon.crt"), soon).expect("write");
    let out = certificate(&data, &["check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let l = line(&stdout(&out), "server/tls/extra-soon.crt");
    assert!(l.contains(" 29d ") && l.ends_with("WARNING: renewed at the next start"), "{l}");
    std::fs::write(tls.join("extra-gone.crt"), certificate_until("gone", rcgen::date_time_ymd(2021, 1, 1)))
        .expect("write");
    let out = certificate(&data, &["check"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let l = line(&stdout(&out), "server/tls/extra-gone.crt");
    assert!(l.contains("expired") && l.ends_with("EXPIRED"), "{l}");
    assert_eq!(stderr(&out).trim(), "error: 1 certificate(s) have expired; see above");
    for f in ["extra-soon.crt", "extra-gone.crt"] {
        std::fs::remove_file(tls.join(f)).expect("rm");
    }

    // Rotation: the leaves move to a backup, the CAs stay.
    let old_admin = std::fs::read_to_string(tls.join("client-admin.crt")).expect("admin cert");
    let old_serving = std::fs::read_to_string(tls.join("serving-kube-apiserver.crt")).expect("serving cert");
    let old_ca = std::fs::read_to_string(tls.join("server-ca.crt")).expect("ca");
    let (dir, port) = server.stop();
    let out = certificate(dir.path(), &["rotate", "--service", "admin,api-server"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("restart ferrok"), "{}", stdout(&out));
    assert!(!tls.join("client-admin.crt").exists() && !tls.join("client-admin.key").exists());
    assert!(!tls.join("serving-kube-apiserver.crt").exists());
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("tls-backup-"))
        .collect();
    assert_eq!(backups.len(), 1);
    let kept = std::fs::read_to_string(backups[0].path().join("server/tls/client-admin.crt")).expect("backup");
    assert_eq!(kept, old_admin);

    // The next start issues new leaves from the same CAs; kubectl works with them.
    let server = ApiServer::start_in(dir, port);
    let new_admin = std::fs::read_to_string(tls.join("client-admin.crt")).expect("admin cert");
    assert_ne!(new_admin, old_admin);
    assert_ne!(std::fs::read_to_string(tls.join("serving-kube-apiserver.crt")).expect("serving"), old_serving);
    assert_eq!(std::fs::read_to_string(tls.join("server-ca.crt")).expect("ca"), old_ca);
    let (ok, out) = common::kubectl(&server, &["get", "namespace", "default", "-o", "name"]);
    assert!(ok, "{out}");
    assert!(certificate(&data, &["check"]).status.success());

    // Bad input: one line each, naming what is wrong.
    let out = certificate(&data, &["rotate", "--service", "etcd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'etcd'") && stderr(&out).contains("--service"), "{}", stderr(&out));
    let empty = tempfile::tempdir().expect("tempdir");
    let out = certificate(empty.path(), &["check"]);
    assert!(!out.status.success());
    assert!(stderr(&out).trim().starts_with("error: --data-dir: no certificates in"), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim().lines().count(), 1);
}
