//! The same etcdctl sessions against real etcd 3.4 and `ferrok datastore`,
//! compared line by line after removing what legitimately differs (member
//! and cluster ids, lease ids, timings, sizes, ports).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A record of what etcdctl printed, one entry per command.
struct Session {
    endpoint: String,
    transcript: Vec<String>,
    /// Lease ids as this server granted them, replaced by stable names.
    leases: Vec<String>,
}

impl Session {
    fn new(endpoint: &str) -> Self {
        Session { endpoint: endpoint.to_string(), transcript: Vec::new(), leases: Vec::new() }
    }

    fn normalize(&self, text: &str) -> String {
        let mut out = text.replace(&self.endpoint, "ENDPOINT");
        for (i, id) in self.leases.iter().enumerate() {
            out = out.replace(id.as_str(), &format!("LEASE{i}"));
        }
        out.lines().map(normalize_line).collect::<Vec<_>>().join("\n")
    }

    /// Runs one command and records its outcome; returns stdout.
    fn run(&mut self, args: &[&str]) -> String {
        self.run_with(args, None)
    }

    fn run_with(&mut self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = etcdctl(&self.endpoint, args, stdin);
        if let Some(id) = out.strip_prefix("lease ").and_then(|r| r.split(' ').next()) {
            if out.contains("granted with TTL") && !self.leases.iter().any(|l| l == id) {
                self.leases.push(id.to_string());
            }
        }
        let entry = format!(
            "$ etcdctl {}\n[{}]\n{}\n{}",
            self.normalize(&args.join(" ")),
            if ok { "ok" } else { "failed" },
            self.normalize(&out),
            self.normalize(&err)
        );
        self.transcript.push(entry);
        out
    }

    /// Runs `etcdctl watch ...` for a while and records what it printed.
    fn watch(&mut self, args: &[&str], for_ms: u64) {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .arg("watch")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl watch");
        std::thread::sleep(Duration::from_millis(for_ms));
        let _ = child.kill();
        let out = child.wait_with_output().expect("watch output");
        let clean = |b: &[u8]| {
            String::from_utf8_lossy(b).lines().filter(|l| !l.starts_with("{\"level\"")).collect::<Vec<_>>().join("\n")
        };
        let entry = format!(
            "$ etcdctl watch {}\n{}\n{}",
            args.join(" "),
            self.normalize(&clean(&out.stdout)),
            self.normalize(&clean(&out.stderr))
        );
        self.transcript.push(entry);
    }
}

/// Removes what differs between two healthy servers: ids, timings, sizes.
fn normalize_line(line: &str) -> String {
    if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) {
        scrub(&mut v);
        return v.to_string();
    }
    let mut l = line.to_string();
    if l.starts_with("\"ClusterID\" : ") || l.starts_with("\"MemberID\" : ") {
        if let Some(i) = l.find(" : ") {
            l.truncate(i + 3);
        }
    }
    if let Some(i) = l.find("took = ") {
        l.truncate(i + 7);
    }
    if let Some(i) = l.find("attached keys([") {
        // etcd lists a lease's keys in map order.
        let start = i + "attached keys([".len();
        if let Some(len) = l[start..].find(']') {
            let mut keys: Vec<&str> = l[start..start + len].split(' ').collect();
            keys.sort_unstable();
            let sorted = keys.join(" ");
            l.replace_range(start..start + len, &sorted);
        }
    }
    if let Some(i) = l.find("remaining(") {
        if let Some(j) = l[i..].find(')') {
            l.replace_range(i..i + j + 1, "remaining(N)");
        }
    }
    l
}

fn scrub(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for key in [
                "cluster_id",
                "member_id",
                "raft_term",
                "ID",
                "id",
                "leader",
                "version",
                "dbSize",
                "dbSizeInUse",
                "raftIndex",
                "raftAppliedIndex",
                "raftTerm",
                "TTL",
                "grantedTTL",
            ] {
                if map.contains_key(key) {
                    map.insert(key.to_string(), serde_json::Value::String("*".into()));
                }
            }
            if map.get("lease").and_then(|l| l.as_i64()).is_some_and(|l| l != 0) {
                map.insert("lease".to_string(), serde_json::Value::String("LEASE".into()));
            }
            for (_, child) in map.iter_mut() {
                scrub(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

fn kv_session(s: &mut Session) {
    s.run(&["put", "a", "1"]);
    s.run(&["put", "b", "2"]);
    s.run(&["put", "c", "3"]);
    s.run(&["put", "a/x", "4"]);
    s.run(&["get", "a"]);
    s.run(&["get", "a", "c"]);
    s.run(&["get", "--prefix", "a"]);
    s.run(&["get", "--prefix", ""]);
    s.run(&["get", "--from-key", "b"]);
    s.run(&["get", "--prefix", "", "--limit", "2"]);
    s.run(&["get", "--prefix", "", "--limit", "2", "-w", "json"]);
    s.run(&["get", "--prefix", "", "--count-only", "-w", "json"]);
    s.run(&["get", "--prefix", "", "--keys-only"]);
    s.run(&["get", "--prefix", "", "--sort-by", "VALUE", "--order", "DESCEND"]);
    s.run(&["get", "--prefix", "", "--sort-by", "MODIFY", "--order", "ASCEND", "--limit", "3"]);
    s.run(&["get", "a", "-w", "json"]);
    s.run(&["put", "a", "11", "--prev-kv"]);
    s.run(&["get", "a", "--rev", "2"]);
    s.run(&["get", "a", "--rev", "2", "-w", "json"]);
    s.run(&["get", "--prefix", "", "--rev", "4", "-w", "fields"]);
    s.run(&["get", "a", "--rev", "99"]);
    s.run(&["put", "", "x"]);
    s.run(&["get", ""]);
    s.run(&["del", "b", "--prev-kv"]);
    s.run(&["del", "nothing"]);
    s.run(&["del", "--prefix", "a", "-w", "json"]);
    s.run(&["get", "--prefix", "", "-w", "json"]);
    s.run(&["put", "b", "again", "-w", "json"]);
    s.run(&["get", "b", "-w", "fields"]);
    s.run(&["put", "b", "--ignore-value"]);
    s.run(&["get", "b"]);
}

fn txn_session(s: &mut Session) {
    s.run(&["put", "k", "v1"]);
    s.run_with(&["txn"], Some("value(\"k\") = \"v1\"\n\nput k v2\nget k\n\nput k nope\n\n"));
    s.run_with(&["txn"], Some("value(\"k\") = \"v1\"\n\nput k v3\n\nget k\n\n"));
    s.run_with(&["txn", "-w", "json"], Some("mod(\"k\") = \"3\"\n\nput k v4\n\nget k\n\n"));
    s.run_with(&["txn"], Some("create(\"missing\") = \"0\"\n\nput missing here\n\n\n"));
    s.run_with(&["txn"], Some("ver(\"k\") > \"1\"\nvalue(\"missing\") = \"here\"\n\ndel k\nget missing\n\n\n"));
    s.run_with(&["txn"], Some("value(\"nokey\") = \"\"\n\nput y 1\n\nput y 2\n\n"));
    s.run_with(&["txn"], Some("\nput d 1\nput d 2\n\n\n"));
    s.run(&["get", "--prefix", "", "-w", "json"]);
}

fn compaction_session(s: &mut Session) {
    for v in ["1", "2", "3", "4", "5"] {
        s.run(&["put", "x", v]);
    }
    s.run(&["compact", "4"]);
    s.run(&["get", "x", "--rev", "3"]);
    s.run(&["get", "x", "--rev", "4"]);
    s.run(&["compact", "3"]);
    s.run(&["compact", "100"]);
    s.run(&["compact", "6", "--physical"]);
    s.run(&["get", "x", "-w", "json"]);
    s.watch(&["--rev", "2", "x"], 800);
    s.watch(&["--rev", "6", "x", "--prev-kv"], 800);
}

fn watch_session(s: &mut Session) {
    s.run(&["put", "w/a", "1"]);
    s.run(&["put", "w/b", "2"]);
    s.run(&["put", "w/a", "3"]);
    s.run(&["del", "w/b"]);
    s.run(&["put", "other", "x"]);
    s.watch(&["--rev", "1", "--prefix", "w/"], 800);
    s.watch(&["--rev", "3", "--prefix", "w/", "--prev-kv"], 800);
    s.watch(&["--rev", "1", "w/a", "w/c"], 800);
    s.watch(&["--rev", "1", "--prefix", "w/", "-w", "json"], 800);
}

fn lease_session(s: &mut Session) {
    let out = s.run(&["lease", "grant", "100"]);
    let id = out.split(' ').nth(1).unwrap_or_default().to_string();
    s.run(&["put", "leased", "v", "--lease", &id]);
    s.run(&["put", "leased2", "v", "--lease", &id]);
    s.run(&["get", "leased", "-w", "json"]);
    s.run(&["lease", "timetolive", &id]);
    s.run(&["lease", "timetolive", &id, "--keys"]);
    s.run(&["lease", "list"]);
    s.run(&["lease", "keep-alive", "--once", &id]);
    s.run(&["lease", "revoke", &id]);
    s.run(&["get", "--prefix", "leased"]);
    s.run(&["lease", "timetolive", &id]);
    s.run(&["lease", "revoke", &id]);
    s.run(&["lease", "keep-alive", "--once", &id]);
    s.run(&["put", "k", "v", "--lease", "1234abcd"]);
    let out = s.run(&["lease", "grant", "1"]);
    let short = out.split(' ').nth(1).unwrap_or_default().to_string();
    s.run(&["put", "short", "v", "--lease", &short]);
    s.run(&["get", "short"]);
    std::thread::sleep(Duration::from_millis(3500));
    s.run(&["get", "short"]);
    s.run(&["lease", "list"]);
}

fn maintenance_session(s: &mut Session) {
    s.run(&["put", "m", "1"]);
    s.run(&["endpoint", "health"]);
    s.run(&["endpoint", "status", "-w", "json"]);
    s.run(&["alarm", "list"]);
    s.run(&["defrag"]);
    s.run(&["get", "m"]);
}

/// Runs one session against both servers and asserts the transcripts match.
async fn compare(name: &str, session: fn(&mut Session)) {
    let etcd = start_etcd().await;
    let ferrok = start_ferrok(&[]).await;
    let (a, b) = {
        let e = etcd.endpoint.clone();
        let f = ferrok.endpoint.clone();
        let ta = std::thread::spawn(move || {
            let mut s = Session::new(&e);
            session(&mut s);
            s.transcript
        });
        let tb = std::thread::spawn(move || {
            let mut s = Session::new(&f);
            session(&mut s);
            s.transcript
        });
        (ta.join().expect("etcd session"), tb.join().expect("ferrok session"))
    };
    let mut diffs = Vec::new();
    for (x, y) in a.iter().zip(b.iter()) {
        if x != y {
            diffs.push(format!("--- etcd:\n{x}\n+++ ferrok:\n{y}\n"));
        }
    }
    assert_eq!(a.len(), b.len());
    assert!(diffs.is_empty(), "{name}: {} of {} commands differ:\n{}", diffs.len(), a.len(), diffs.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_matches_etcd() {
    compare("kv", kv_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn txn_matches_etcd() {
    compare("txn", txn_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compaction_matches_etcd() {
    compare("compaction", compaction_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_matches_etcd() {
    compare("watch", watch_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_matches_etcd() {
    compare("lease", lease_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_matches_etcd() {
    compare("maintenance", maintenance_session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_save_writes_a_file() {
    let ferrok = start_ferrok(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("snap.db");
    let path = path.to_str().expect("utf-8 path");
    let (ok, out, err) = etcdctl(&ferrok.endpoint, &["put", "s", "1"], None);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = etcdctl(&ferrok.endpoint, &["snapshot", "save", path], None);
    assert!(ok, "snapshot save failed: {out}{err}");
    assert_eq!(out.trim(), format!("Snapshot saved at {path}"));
    let size = std::fs::metadata(path).expect("snapshot file").len();
    assert!(size > 4096, "snapshot is {size} bytes");
    // The file is a SQLite database holding the key.
    let head = std::fs::read(path).expect("read snapshot");
    assert!(head.starts_with(b"SQLite format 3\0"));
}
