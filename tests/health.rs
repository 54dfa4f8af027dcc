//! `/livez`, `/readyz` and `/healthz` run real checks: a server on an
//! external etcd (the real etcd binary) turns red when etcd stops and green
//! when it returns; each check is listed by upstream's name under
//! `?verbose`, answers alone at `/readyz/<check>`, and can be excluded.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{eventually_within, free_port, start_etcd_in, ApiServer};

/// GET on the server as an anonymous client: status code and body.
fn get(s: &ApiServer, path: &str) -> (u16, String) {
    curl(s, path, &[])
}

/// GET with the admin client certificate.
fn get_as_admin(s: &ApiServer, path: &str) -> (u16, String) {
    let tls = s.dir.path().join("server").join("tls");
    let cert = tls.join("client-admin.crt");
    let key = tls.join("client-admin.key");
    curl(s, path, &["--cert", &cert.to_string_lossy(), "--key", &key.to_string_lossy()])
}

fn curl(s: &ApiServer, path: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://127.0.0.1:{}{path}", s.port))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_follows_an_external_etcd() {
    let (client, peer) = (free_port(), free_port());
    let etcd = start_etcd_in(tempfile::tempdir().expect("tempdir"), client, peer).await;
    let endpoint = etcd.url();
    let s =
        ApiServer::start_with(tempfile::tempdir().expect("tempdir"), free_port(), &["--datastore-endpoint", &endpoint]);
    assert_eq!(get(&s, "/readyz"), (200, "ok".to_string()));
    assert_eq!(get_as_admin(&s, "/readyz/etcd"), (200, "ok".to_string()));

    // etcd stops: readiness (and liveness, whose etcd check is the same)
    // turn red within seconds, naming the check and withholding the reason.
    let mut etcd = etcd;
    let data = std::mem::replace(&mut etcd.dir, tempfile::tempdir().expect("tempdir"));
    drop(etcd);
    eventually_within("/readyz to turn red with etcd stopped", Duration::from_secs(10), || get(&s, "/readyz").0 == 500);
    let (code, body) = get(&s, "/readyz");
    assert_eq!(code, 500);
    assert!(body.contains("[-]etcd failed: reason withheld\n"), "{body}");
    assert!(body.contains("[-]etcd-readiness failed: reason withheld\n"), "{body}");
    assert!(body.contains("[+]ping ok\n"), "{body}");
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    let (code, body) = get(&s, "/livez");
    assert_eq!(code, 500, "{body}");
    assert!(body.ends_with("livez check failed\n"), "{body}");
    let (code, body) = get_as_admin(&s, "/readyz/etcd");
    assert_eq!(code, 500);
    assert!(body.starts_with("internal server error: error getting data from etcd"), "{body}");
    assert_eq!(get_as_admin(&s, "/readyz/ping"), (200, "ok".to_string()));
    // Excluding the failing checks leaves a ready server.
    assert_eq!(get(&s, "/readyz?exclude=etcd&exclude=etcd-readiness"), (200, "ok".to_string()));

    // etcd returns: green again.
    let etcd = start_etcd_in(data, client, peer).await;
    eventually_within("/readyz to turn green with etcd back", Duration::from_secs(15), || {
        get(&s, "/readyz") == (200, "ok".to_string())
    });
    assert_eq!(get_as_admin(&s, "/readyz/etcd"), (200, "ok".to_string()));
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread")]
async fn checks_are_listed_by_upstream_names() {
    let s = ApiServer::start();
    let (code, body) = get(&s, "/readyz?verbose");
    assert_eq!(code, 200);
    let lines: Vec<&str> = body.lines().collect();
    for want in [
        "[+]ping ok",
        "[+]log ok",
        "[+]etcd ok",
        "[+]etcd-readiness ok",
        "[+]informer-sync ok",
        "[+]poststarthook/generic-apiserver-start-informers ok",
        "[+]poststarthook/start-apiextensions-controllers ok",
        "[+]poststarthook/crd-informer-synced ok",
        "[+]poststarthook/bootstrap-controller ok",
        "[+]poststarthook/rbac/bootstrap-roles ok",
        "[+]shutdown ok",
    ] {
        assert!(lines.contains(&want), "{want} missing from\n{body}");
    }
    assert_eq!(lines.first(), Some(&"[+]ping ok"));
    assert_eq!(lines.last(), Some(&"readyz check passed"));

    let (code, body) = get(&s, "/livez?verbose");
    assert_eq!(code, 200);
    let lines: Vec<&str> = body.lines().collect();
    assert!(lines.contains(&"[+]etcd ok"), "{body}");
    assert!(!lines.contains(&"[+]shutdown ok") && !lines.contains(&"[+]informer-sync ok"), "{body}");
    assert!(body.ends_with("livez check passed\n"), "{body}");
    let (code, body) = get(&s, "/healthz?verbose=1");
    assert_eq!(code, 200);
    assert!(body.ends_with("healthz check passed\n"), "{body}");

    let (_, body) = get(&s, "/readyz?verbose&exclude=etcd&exclude=nope");
    assert!(body.contains("[+]etcd excluded: ok\n"), "{body}");
    assert!(body.contains("[+]etcd-readiness ok\n"), "{body}");
    assert!(body.contains("warn: some health checks cannot be excluded: no matches for \"nope\"\n"), "{body}");

    // One check alone, for an authenticated user.
    assert_eq!(get_as_admin(&s, "/readyz/etcd"), (200, "ok".to_string()));
    assert_eq!(get_as_admin(&s, "/livez/poststarthook/rbac/bootstrap-roles"), (200, "ok".to_string()));
    assert_eq!(get_as_admin(&s, "/readyz/nope").0, 404);
    assert_eq!(get_as_admin(&s, "/livez/shutdown").0, 404, "livez has no shutdown check");
    assert_eq!(get(&s, "/readyz/etcd").0, 401, "single checks are not public");
}
