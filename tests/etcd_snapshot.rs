//! `ferrok etcd-snapshot save|ls|delete|prune|restore`, the server's
//! scheduled snapshots and `ferrok server --cluster-reset
//! --cluster-reset-restore-path`, on real servers: a snapshot taken while
//! objects are being written is consistent, a restore brings the cluster
//! back as it was (objects created after it gone, deleted ones back) at a
//! revision past the old one, so old watches are told to relist; bad input
//! is one line naming the flag or file and changes nothing. With an
//! external etcd, the snapshot is etcd's own (`etcdctl snapshot status`).
//! The commands read the server's config file for the keys they share
//! with it (data dir, snapshot folder, node name, retention).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{kubectl, ApiServer};

fn ferrok(args: &[&str], data: &Path) -> Output {
    Command::new(common::ferrok_bin()).args(args).arg("--data-dir").arg(data).output().expect("run ferrok")
}

fn snapshot(args: &[&str], data: &Path) -> Output {
    let mut all = vec!["etcd-snapshot"];
    all.extend_from_slice(args);
    ferrok(&all, data)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Succeeded, and its stdout.
fn ok(out: Output) -> String {
    assert!(out.status.success(), "failed: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

/// Failed with one line on stderr containing each of `words`.
fn one_line_error(out: &Output, words: &[&str]) {
    assert!(!out.status.success(), "succeeded: {}", stdout(out));
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for w in words {
        assert!(lines[0].contains(w), "{w:?} not in {err}");
    }
}

/// The path printed by `save`: `Snapshot NAME saved (...) to PATH`.
fn saved_path(out: &str) -> PathBuf {
    let line = out.lines().find(|l| l.starts_with("Snapshot ")).unwrap_or_else(|| panic!("no snapshot in {out}"));
    PathBuf::from(line.rsplit(" to ").next().expect("path"))
}

fn names(table: &str) -> Vec<String> {
    table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

fn configmaps(s: &ApiServer) -> Vec<String> {
    let (ok, out) = kubectl(s, &["get", "configmaps", "-o", "name"]);
    assert!(ok, "{out}");
    out.lines().map(|l| l.trim_start_matches("configmap/").to_string()).collect()
}

fn resource_version(s: &ApiServer, name: &str) -> i64 {
    let (ok, out) = kubectl(s, &["get", "configmap", name, "-o", "jsonpath={.metadata.resourceVersion}"]);
    assert!(ok, "{out}");
    out.trim().parse().unwrap_or_else(|_| panic!("resourceVersion {out:?}"))
}

#[test]
fn snapshot_while_writing_then_restore_with_cluster_reset() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    for name in ["before", "deleted-later"] {
        assert!(kubectl(&server, &["create", "configmap", name]).0);
    }

    // A writer creates w-0, w-1, … one after the other while the snapshot is taken.
    let kubeconfig = server.kubeconfig();
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, stop) = (written.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let n = written.load(Ordering::SeqCst);
                let out = Command::new("kubectl")
                    .env("KUBECONFIG", &kubeconfig)
                    .args(["create", "configmap", &format!("w-{n}"), "--from-literal=n=x"])
                    .output()
                    .expect("kubectl");
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                written.store(n + 1, Ordering::SeqCst);
            }
        })
    };
    common::eventually("the writer to start", || written.load(Ordering::SeqCst) >= 3);
    let at_save = written.load(Ordering::SeqCst);
    let out = ok(snapshot(&["save"], &data));
    let file = saved_path(&out);
    assert!(file.starts_with(data.join("server/db/snapshots")), "{out}");
    let name = file.file_name().expect("name").to_string_lossy().into_owned();
    assert!(
        name.starts_with("on-demand-") && name.rsplit('-').next().is_some_and(|t| t.parse::<u64>().is_ok()),
        "{name}"
    );
    let after_save = written.load(Ordering::SeqCst);
    common::eventually("more writes after the snapshot", || written.load(Ordering::SeqCst) >= after_save + 2);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");

    // ls: the table of k3s' columns.
    let table = ok(snapshot(&["ls"], &data));
    assert!(table.starts_with("Name") && table.lines().next().is_some_and(|h| h.contains("Location")), "{table}");
    let row = table.lines().find(|l| l.starts_with(&name)).unwrap_or_else(|| panic!("{name} not in {table}"));
    assert!(row.contains(&format!("file://{}", file.display())), "{row}");
    let size = std::fs::metadata(&file).expect("snapshot file").len();
    assert!(row.contains(&format!(" {size} ")), "{row}");

    // Changes after the snapshot.
    assert!(kubectl(&server, &["create", "configmap", "after"]).0);
    assert!(kubectl(&server, &["delete", "configmap", "deleted-later"]).0);
    let rv_after = resource_version(&server, "after");

    // The store of a running server is not replaced.
    let out = snapshot(&["restore", &name], &data);
    one_line_error(&out, &["in use", "stop ferrok server"]);

    let (dir, port) = server.stop();
    let db = data.join("server/db/state.db");
    let before = std::fs::read(&db).expect("state.db");

    // Bad input: nothing changes.
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![7u8; 10_000]).expect("write");
    let run_reset = |path: &str| {
        Command::new(common::ferrok_bin())
            .args(["server", "--disable-agent", "--cluster-reset", "--cluster-reset-restore-path", path])
            .arg("--data-dir")
            .arg(&data)
            .args(["--https-listen-port", &port.to_string()])
            .output()
            .expect("ferrok server --cluster-reset")
    };
    let out = run_reset(&garbage.to_string_lossy());
    one_line_error(&out, &[&garbage.to_string_lossy(), "not a snapshot"]);
    let truncated = dir.path().join("truncated.db");
    let whole = std::fs::read(&file).expect("snapshot");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).expect("write");
    let out = run_reset(&truncated.to_string_lossy());
    one_line_error(&out, &[&truncated.to_string_lossy()]);
    let out = run_reset("no-such-snapshot");
    one_line_error(&out, &["\"no-such-snapshot\" not found"]);
    let out = run_reset(&dir.path().join("missing.db").to_string_lossy());
    one_line_error(&out, &["missing.db"]);
    let out = Command::new(common::ferrok_bin())
        .args(["server", "--cluster-reset-restore-path", &name, "--data-dir"])
        .arg(&data)
        .output()
        .expect("ferrok server");
    one_line_error(&out, &["--cluster-reset"]);
    assert!(std::fs::read(&db).expect("state.db") == before, "a refused restore changed the store");

    // The restore itself: by name, from the snapshot folder; the server exits.
    let out = run_reset(&name);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("restart ferrok server without --cluster-reset"), "{}", stderr(&out));
    let kept: Vec<_> = std::fs::read_dir(data.join("server/db"))
        .expect("db dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("state-old-"))
        .collect();
    assert_eq!(kept.len(), 1, "the replaced store is kept");

    let server = ApiServer::start_in(dir, port);
    let cms = configmaps(&server);
    assert!(cms.contains(&"before".to_string()) && cms.contains(&"deleted-later".to_string()), "{cms:?}");
    assert!(!cms.contains(&"after".to_string()), "{cms:?}");
    // Consistent: the writer's objects are w-0 … w-(k-1), no gap, all
    // that were written before the save began.
    let mut ws: Vec<usize> =
        cms.iter().filter_map(|n| n.strip_prefix("w-")).map(|n| n.parse().expect("number")).collect();
    ws.sort();
    assert!(ws.len() >= at_save, "{} of the writer's objects, {at_save} were written before the save", ws.len());
    // (one more may have committed before the save ended and been counted after)
    assert!(ws.len() <= after_save + 1, "{} objects, {after_save} were written when the save ended", ws.len());
    assert_eq!(ws, (0..ws.len()).collect::<Vec<_>>(), "a gap: the snapshot is not consistent");

    // New writes come after every revision clients saw, and a watch from a
    // revision of the replaced history is told to relist (410 Gone).
    assert!(kubectl(&server, &["create", "configmap", "new"]).0);
    assert!(resource_version(&server, "new") > rv_after);
    let (_, out) = kubectl(
        &server,
        &[
            "get",
            "--request-timeout=10s",
            "--raw",
            &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv_after}"),
        ],
    );
    assert!(out.contains("410") || out.contains("Expired") || out.contains("too old"), "{out}");
}

#[test]
fn ls_delete_prune_and_bad_input() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    let mut saved = Vec::new();
    for _ in 0..3 {
        saved.push(saved_path(&ok(snapshot(&["save", "--name", "keep", "--node-name", "n1"], &data))));
    }
    let other = saved_path(&ok(snapshot(&["save", "--node-name", "n1"], &data)));
    let names_of = |paths: &[PathBuf]| -> Vec<String> {
        paths.iter().map(|p| p.file_name().expect("name").to_string_lossy().into_owned()).collect()
    };
    let keep = names_of(&saved);
    assert_eq!(keep.iter().collect::<std::collections::HashSet<_>>().len(), 3, "names collide: {keep:?}");
    let listed = names(&ok(snapshot(&["ls"], &data)));
    assert_eq!(listed.len(), 4, "{listed:?}");

    // Prune keeps the newest of that name only.
    let out = ok(snapshot(&["prune", "--name", "keep", "--node-name", "n1", "--snapshot-retention", "1"], &data));
    assert!(out.contains(&keep[0]) && out.contains(&keep[1]), "{out}");
    let listed = names(&ok(snapshot(&["ls"], &data)));
    let other_name = names_of(std::slice::from_ref(&other)).remove(0);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(&keep[2]) && listed.contains(&other_name), "{listed:?}");

    // Delete: an unknown name deletes nothing.
    let out = snapshot(&["delete", &keep[2], "no-such-snapshot"], &data);
    one_line_error(&out, &["\"no-such-snapshot\" not found"]);
    assert_eq!(names(&ok(snapshot(&["ls"], &data))).len(), 2);
    let out = ok(snapshot(&["delete", &keep[2]], &data));
    assert!(out.contains(&keep[2]), "{out}");
    assert_eq!(names(&ok(snapshot(&["ls"], &data))), vec![other_name.clone()]);
    one_line_error(&snapshot(&["delete", "../state.db"], &data), &["not a snapshot name"]);

    // A missing data dir or folder.
    let missing = data.join("nowhere");
    one_line_error(&snapshot(&["ls"], &missing), &["--data-dir", "nowhere"]);
    one_line_error(&snapshot(&["save"], &missing), &["--data-dir", "nowhere"]);
    one_line_error(&snapshot(&["ls", "--dir", "/nonexistent/snapshots"], &data), &["--dir", "/nonexistent/snapshots"]);
    one_line_error(&snapshot(&["save", "--name", "a/b"], &data), &["--name"]);
    // A server whose store is gone (an empty data dir with server/).
    let empty = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(empty.path().join("server")).expect("mkdir");
    one_line_error(&snapshot(&["save"], empty.path()), &["no datastore", "state.db"]);

    // The server refuses a bad schedule before starting.
    let out = Command::new(common::ferrok_bin())
        .args(["server", "--etcd-snapshot-schedule-cron", "*/5 * *", "--data-dir"])
        .arg(empty.path())
        .output()
        .expect("ferrok server");
    one_line_error(&out, &["--etcd-snapshot-schedule-cron"]);

    // Save works with the server stopped too, and the copy is complete.
    let (dir, _) = server.stop();
    let stopped = saved_path(&ok(snapshot(&["save"], dir.path())));
    assert!(std::fs::metadata(&stopped).expect("snapshot").len() > 4096);
    let left: Vec<String> = ["server/db", "server/db/snapshots"]
        .iter()
        .flat_map(|d| std::fs::read_dir(dir.path().join(d)).expect("db dir"))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| n.ends_with(".partial") || n.ends_with(".restoring")), "{left:?}");
}

#[test]
fn scheduled_snapshots_fire_and_keep_the_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshots = dir.path().join("snaps");
    let snapshots_arg = snapshots.to_string_lossy().into_owned();
    // Two older scheduled snapshots of this node (pruning goes by the
    // names), and one of another node that it leaves alone.
    std::fs::create_dir_all(&snapshots).expect("mkdir");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let older: Vec<PathBuf> =
        [now - 2000, now - 1000].iter().map(|t| snapshots.join(format!("etcd-snapshot-n1-{t}"))).collect();
    let foreign = snapshots.join(format!("etcd-snapshot-n2-{}", now - 3000));
    for f in older.iter().chain([&foreign]) {
        std::fs::write(f, "old").expect("write");
    }
    let port = common::free_port();
    let server = ApiServer::start_with(
        dir,
        port,
        &[
            "--node-name",
            "n1",
            "--etcd-snapshot-schedule-cron",
            "* * * * *",
            "--etcd-snapshot-retention",
            "2",
            "--etcd-snapshot-dir",
            &snapshots_arg,
        ],
    );
    let data = server.dir.path().to_path_buf();
    let on_demand = saved_path(&ok(snapshot(&["save", "--node-name", "n1", "--dir", &snapshots_arg], &data)));
    let ls = || names(&ok(snapshot(&["ls", "--dir", &snapshots_arg], &data)));
    let old_names: Vec<String> =
        older.iter().map(|p| p.file_name().expect("name").to_string_lossy().into_owned()).collect();
    // The schedule fires at the next minute boundary.
    common::eventually_within("a scheduled snapshot", Duration::from_secs(75), || {
        ls().iter().any(|n| n.starts_with("etcd-snapshot-n1-") && !old_names.contains(n))
    });
    common::eventually("the oldest scheduled snapshot to be pruned", || !older[0].exists());
    let after = ls();
    let scheduled: Vec<&String> = after.iter().filter(|n| n.starts_with("etcd-snapshot-n1-")).collect();
    assert_eq!(scheduled.len(), 2, "{after:?}");
    assert!(older[1].exists() && on_demand.exists() && foreign.exists(), "{after:?}");
    let fresh = scheduled.iter().find(|n| !old_names.contains(n)).expect("the scheduled one");
    assert!(std::fs::metadata(snapshots.join(fresh)).expect("snapshot").len() > 4096, "{fresh} is not a database");
}

#[tokio::test]
async fn external_etcd_snapshot_is_etcds_own() {
    let etcd = common::start_etcd().await;
    let url = etcd.url();
    for i in 0..20 {
        let (ok_, _, err) = common::etcdctl(&etcd.endpoint, &["put", &format!("/registry/k{i}"), "v"], None);
        assert!(ok_, "{err}");
    }
    let data = tempfile::tempdir().expect("tempdir");
    let snaps = data.path().join("snaps");
    let snaps_arg = snaps.to_string_lossy().into_owned();
    let out =
        ok(snapshot(&["save", "--datastore-endpoint", &url, "--dir", &snaps_arg, "--node-name", "n1"], data.path()));
    let file = saved_path(&out);
    let path = file.to_str().expect("path");
    let (ok_, status, err) = common::etcdctl(&etcd.endpoint, &["snapshot", "status", "-w", "json", path], None);
    assert!(ok_, "{err}");
    let status: serde_json::Value = serde_json::from_str(status.trim()).unwrap_or_else(|_| panic!("{status}"));
    assert!(status["totalKey"].as_i64().unwrap_or(0) >= 20, "{status}");
    assert!(names(&ok(snapshot(&["ls", "--dir", &snaps_arg], data.path()))).len() == 1);

    // Restoring an external etcd is etcdutl's business; etcd's file is not ours.
    let out = Command::new(common::ferrok_bin())
        .args(["server", "--cluster-reset", "--datastore-endpoint", &url, "--data-dir"])
        .arg(data.path())
        .output()
        .expect("ferrok server");
    one_line_error(&out, &["--cluster-reset", "external etcd", "etcdutl"]);
    let out = snapshot(&["restore", path, "--datastore-endpoint", &url], data.path());
    one_line_error(&out, &["external etcd", "etcdutl"]);
    std::fs::create_dir_all(data.path().join("server")).expect("mkdir");
    let out = snapshot(&["restore", path], data.path());
    one_line_error(&out, &[path, "etcd snapshot", "etcdutl"]);
}

fn pod_phase(node: &common::node::Node, name: &str) -> String {
    node.get(&["pod", name], "{.status.phase}")
}

#[test]
fn restored_pods_keep_running_and_later_ones_go() {
    use common::node::{Node, BUSYBOX};
    let mut node = Node::start(&[]);
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: {BUSYBOX}, command: [\"sleep\", \"100000\"]}}]\n"
        )
    };
    node.apply(&pod("keep"));
    node.eventually("keep running", 60, || pod_phase(&node, "keep") == "Running");
    let keep_id = node.container_id("default", "keep", "c");
    let data = node.dir.path().to_path_buf();
    let file = saved_path(&ok(snapshot(&["save"], &data)));

    node.apply(&pod("later"));
    node.eventually("later running", 60, || pod_phase(&node, "later") == "Running");
    let later_id = node.container_id("default", "later", "c");
    node.stop(false);

    // (`etcd-snapshot restore` is what `server --cluster-reset` runs, without the server.)
    let out = ok(snapshot(&["restore", file.to_str().expect("path")], &data));
    assert!(out.starts_with("restored ") && out.contains("the replaced store is kept as"), "{out}");

    node.spawn();
    node.wait_ready(Duration::from_secs(60));
    assert!(!node.kubectl(&["get", "pod", "later"]).0, "a pod created after the snapshot is back");
    node.eventually("later's container removed", 60, || !node.runtime_containers().contains(&later_id));
    node.eventually("keep reported running", 30, || {
        pod_phase(&node, "keep") == "Running"
            && node.get(&["pod", "keep"], "{.status.containerStatuses[0].ready}") == "true"
    });
    assert_eq!(node.container_id("default", "keep", "c"), keep_id, "the restored pod's container was replaced");
    assert_eq!(node.get(&["pod", "keep"], "{.status.containerStatuses[0].restartCount}"), "0");
    assert!(node.runtime_containers().contains(&keep_id));
}

/// The server's config file (named by `FERROK_CONFIG_FILE`, as the
/// installed service has it) tells the snapshot commands, run with no
/// flags, where the data dir and the snapshots are, the node name and the
/// retention; the server's other keys are ignored; flags on the command
/// line win; a bad file is one line naming it.
#[test]
fn snapshot_commands_read_the_servers_config_file() {
    let server = ApiServer::start();
    let data = server.dir.path().to_path_buf();
    let conf = tempfile::tempdir().expect("tempdir");
    let snaps = conf.path().join("snaps");
    let config = conf.path().join("config.yaml");
    let run = |args: &[&str]| {
        Command::new(common::ferrok_bin())
            .arg("etcd-snapshot")
            .args(args)
            .env("FERROK_CONFIG_FILE", &config)
            .output()
            .expect("ferrok etcd-snapshot")
    };
    // First, read-only: the file's data dir is where the commands look
    // (so that nothing is ever written to this host's own data dir).
    let nowhere = conf.path().join("nowhere");
    std::fs::write(&config, format!("data-dir: {}\n", nowhere.display())).expect("config file");
    one_line_error(&run(&["ls"]), &["--data-dir", &nowhere.to_string_lossy()]);
    std::fs::write(
        &config,
        format!(
            "data-dir: {}\netcd-snapshot-dir: {}\nnode-name: edge-1\netcd-snapshot-retention: 2\n\
             token: for-the-server-only\ndisable: [coredns, servicelb]\nwrite-kubeconfig-mode: \"0644\"\n",
            data.display(),
            snaps.display()
        ),
    )
    .expect("config file");
    let mut saved = Vec::new();
    for _ in 0..3 {
        let path = saved_path(&ok(run(&["save"])));
        assert_eq!(path.parent(), Some(snaps.as_path()), "{}", path.display());
        saved.push(path.file_name().expect("name").to_string_lossy().into_owned());
    }
    assert!(saved[0].starts_with("on-demand-edge-1-"), "{saved:?}");
    let mut listed = names(&ok(run(&["ls"])));
    listed.sort();
    let mut all = saved.clone();
    all.sort();
    assert_eq!(listed, all);
    // prune keeps the config file's retention (2).
    ok(run(&["prune"]));
    assert_eq!(names(&ok(run(&["ls"]))).len(), 2);
    // Flags on the command line win over the file, before or after the subcommand.
    let elsewhere = conf.path().join("elsewhere");
    let path = saved_path(&ok(run(&["save", "--etcd-snapshot-dir", &elsewhere.to_string_lossy()])));
    assert_eq!(path.parent(), Some(elsewhere.as_path()));
    let path = saved_path(&ok(run(&["--node-name", "edge-2", "save"])));
    assert!(path.to_string_lossy().contains("-edge-2-"), "{}", path.display());
    assert_eq!(names(&ok(run(&["ls", "--dir", &elsewhere.to_string_lossy()]))).len(), 1);
    // A bad config file: one line naming it, nothing written.
    std::fs::write(&config, "data-dir: [\n").expect("config file");
    one_line_error(&run(&["save"]), &["--config", &config.to_string_lossy()]);
    one_line_error(&run(&["ls", "--config", "/nonexistent/config.yaml"]), &["/nonexistent/config.yaml"]);
    assert_eq!(std::fs::read_dir(&snaps).expect("snapshots").count(), 3);
}
