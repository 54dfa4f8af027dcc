//! Acknowledged writes survive SIGKILL of `ferrok datastore`, and a restart
//! keeps revisions, compaction and leases.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ferrok::store::proto::lease_client::LeaseClient;
use ferrok::store::proto::*;

/// Key → the value and revision a write of it was acknowledged with.
type Acked = HashMap<String, (Vec<u8>, i64)>;

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9() {
    let mut server = start_ferrok(&[]).await;
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let mut writers = Vec::new();
    let stop_at = Instant::now() + Duration::from_millis(1500);
    for w in 0..16 {
        let mut kv = server.kv().await;
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop_at {
                // Updates of a few keys and creates of new ones.
                let key = if n.is_multiple_of(2) { format!("/k/w{w}/hot") } else { format!("/k/w{w}/n{n}") };
                let value = format!("w{w}-{n}").into_bytes();
                let req = PutRequest { key: key.clone().into_bytes(), value: value.clone(), ..Default::default() };
                match kv.put(req).await {
                    Ok(resp) => {
                        let rev = resp.into_inner().header.map_or(0, |h| h.revision);
                        acked.lock().expect("lock").insert(key, (value, rev));
                    }
                    Err(_) => break,
                }
                n += 1;
            }
        }));
    }
    // Kill while the writers are still going.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.child.kill().expect("kill -9");
    let _ = server.child.wait();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() > 100, "only {} writes were acknowledged before the kill", acked.len());
    let max_acked = acked.values().map(|(_, rev)| *rev).max().unwrap_or(0);

    let dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("tempdir"));
    drop(server);
    let server = start_ferrok_in(Some(dir), &[]).await;
    let mut kv = server.kv().await;
    let all = kv
        .range(RangeRequest { key: b"/k/".to_vec(), range_end: b"/k0".to_vec(), ..Default::default() })
        .await
        .expect("range after restart")
        .into_inner();
    let head = all.header.map_or(0, |h| h.revision);
    assert!(head >= max_acked, "revision went back: {head} < {max_acked}");
    let found: HashMap<Vec<u8>, (Vec<u8>, i64)> =
        all.kvs.into_iter().map(|kv| (kv.key, (kv.value, kv.mod_revision))).collect();
    let mut lost = Vec::new();
    for (key, (value, rev)) in &acked {
        match found.get(key.as_bytes()) {
            // A later write of the same key may have landed unacknowledged.
            Some((v, r)) if v == value || *r > *rev => {}
            other => lost.push(format!("{key}: acked {:?}@{rev}, found {other:?}", String::from_utf8_lossy(value))),
        }
    }
    assert!(lost.is_empty(), "{} acknowledged writes lost, e.g. {:?}", lost.len(), &lost[..lost.len().min(5)]);
    // New writes continue from the recovered revision.
    let put =
        kv.put(PutRequest { key: b"after".to_vec(), value: b"1".to_vec(), ..Default::default() }).await.expect("put");
    assert_eq!(put.into_inner().header.map_or(0, |h| h.revision), head + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_revisions_compaction_and_leases() {
    let mut server = start_ferrok(&[]).await;
    let mut kv = server.kv().await;
    let mut lease = LeaseClient::new(channel(&server.url()).await);
    for i in 0..10 {
        kv.put(PutRequest { key: b"r".to_vec(), value: format!("{i}").into_bytes(), ..Default::default() })
            .await
            .expect("put");
    }
    kv.compact(CompactionRequest { revision: 6, physical: true }).await.expect("compact");
    let granted = lease.lease_grant(LeaseGrantRequest { ttl: 600, id: 0 }).await.expect("grant").into_inner();
    kv.put(PutRequest { key: b"leased".to_vec(), value: b"v".to_vec(), lease: granted.id, ..Default::default() })
        .await
        .expect("put leased");

    // A graceful stop (SIGTERM) and a start on the same data dir.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let status = server.child.wait().expect("wait");
    assert!(status.success(), "ferrok exited with {status} on SIGTERM");
    let dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("tempdir"));
    drop(server);
    let server = start_ferrok_in(Some(dir), &[]).await;
    let mut kv = server.kv().await;
    let mut lease = LeaseClient::new(channel(&server.url()).await);

    let r = kv.range(RangeRequest { key: b"r".to_vec(), ..Default::default() }).await.expect("range").into_inner();
    assert_eq!(r.header.map_or(0, |h| h.revision), 12);
    assert_eq!(r.kvs[0].value, b"9");
    assert_eq!(r.kvs[0].version, 10);
    let old = kv.range(RangeRequest { key: b"r".to_vec(), revision: 5, ..Default::default() }).await;
    assert_eq!(old.expect_err("compacted").message(), "etcdserver: mvcc: required revision has been compacted");
    let at6 = kv
        .range(RangeRequest { key: b"r".to_vec(), revision: 6, ..Default::default() })
        .await
        .expect("at 6")
        .into_inner();
    assert_eq!(at6.kvs[0].value, b"4");
    let ttl = lease
        .lease_time_to_live(LeaseTimeToLiveRequest { id: granted.id, keys: true })
        .await
        .expect("ttl")
        .into_inner();
    assert_eq!(ttl.granted_ttl, 600);
    assert!(ttl.ttl > 590, "lease renewed at start, ttl {}", ttl.ttl);
    assert_eq!(ttl.keys, vec![b"leased".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_flags_fail_with_one_line() {
    for (args, needle) in [
        (vec!["datastore", "--no-such-flag"], "--no-such-flag"),
        (vec!["datastore", "--sync", "sometimes"], "--sync"),
        (vec!["datastore", "--listen-client-urls", "tcp://x"], "tcp://x"),
        (vec!["datastore", "--watch-progress-notify-interval", "soon"], "--watch-progress-notify-interval"),
        (vec!["datastore", "--cert-file", "/nonexistent.pem", "--key-file", "/nonexistent.key"], "--cert-file"),
        (vec!["server", "--https-listen-port", "many"], "--https-listen-port"),
        (vec!["server", "--service-cidr", "10.43.0.0"], "--service-cidr"),
        (vec!["server", "--write-kubeconfig-mode", "999"], "--write-kubeconfig-mode"),
        (vec!["server", "--config", "/nonexistent/config.yaml"], "--config"),
        (vec!["agent"], "--server"),
        (vec!["agent", "--server", "https://127.0.0.1:1"], "--token"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = std::process::Command::new(ferrok_bin())
            .args(&args)
            .args(if args[0] == "agent" {
                vec![]
            } else {
                vec!["--data-dir".to_string(), dir.path().display().to_string()]
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run ferrok");
        // A command that starts serving instead of failing is killed, and fails the test.
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?} did not fail");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?} printed more than one line: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr:?} does not name {needle}");
    }
    let out = std::process::Command::new(ferrok_bin()).arg("--version").output().expect("run ferrok");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ferrok "));
}
