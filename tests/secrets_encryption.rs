//! Secrets encrypted at rest (`--secrets-encryption`, `ferrok
//! secrets-encrypt`): the store, read with etcdctl on `--datastore-listen`,
//! holds `k8s:enc:<provider>:v1:<key>:…` while kubectl, watches and the
//! kubelet see the data; keys rotate under writes with nothing lost; a
//! server turned on later rewrites what it stored before.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::node::{Node, BUSYBOX};
use common::{free_port, kubectl, ApiServer};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams, WatchEvent, WatchParams};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A server with encryption flags and the store on an etcd endpoint.
struct Encrypted {
    server: ApiServer,
    etcd: String,
}

fn start(dir: tempfile::TempDir, port: u16, etcd_port: u16, extra: &[&str]) -> Encrypted {
    let etcd = format!("127.0.0.1:{etcd_port}");
    let listen = format!("http://{etcd}");
    let mut args = vec!["--datastore-listen", listen.as_str()];
    args.extend_from_slice(extra);
    Encrypted { server: ApiServer::start_with(dir, port, &args), etcd }
}

fn config_file(dir: &Path) -> PathBuf {
    dir.join("server").join("cred").join("encryption-config.json")
}

/// `ferrok <args>`: success, stdout, stderr.
fn ferrok(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(common::ferrok_bin()).args(args).output().expect("run ferrok");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn secrets_encrypt(s: &Encrypted, args: &[&str]) -> (bool, String, String) {
    secrets_encrypt_at(s.server.dir.path(), s.server.port, args)
}

fn secrets_encrypt_at(dir: &Path, port: u16, args: &[&str]) -> (bool, String, String) {
    let data_dir = dir.to_str().expect("utf-8 path").to_string();
    let url = format!("https://127.0.0.1:{port}");
    let mut all = vec!["secrets-encrypt"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--data-dir", &data_dir, "--server", &url]);
    ferrok(&all)
}

/// Every key and raw value under `prefix`, read with etcdctl.
fn raw_all(etcd: &str, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let (ok, out, err) = common::etcdctl(etcd, &["get", "--prefix", prefix, "-w", "json"], None);
    assert!(ok, "etcdctl get: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("etcdctl json");
    let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| {
            let key = B64.decode(kv["key"].as_str().expect("key")).expect("base64 key");
            let value = B64.decode(kv["value"].as_str().unwrap_or_default()).expect("base64 value");
            (String::from_utf8(key).expect("utf-8 key"), value)
        })
        .collect()
}

fn raw(etcd: &str, key: &str) -> Vec<u8> {
    raw_all(etcd, key).remove(key).unwrap_or_else(|| panic!("{key} is not in the store"))
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The name of the key that writes, from the file.
fn active_key(dir: &Path) -> (String, usize) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config_file(dir)).expect("config file")).expect("config json");
    let first = &v["resources"][0]["providers"][0];
    let keys = first["aescbc"]["keys"].as_array().or(first["secretbox"]["keys"].as_array()).expect("keys");
    (keys[0]["name"].as_str().expect("name").to_string(), keys.len())
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    common::eventually_within(what, Duration::from_secs(30), &mut check)
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_ciphertext_in_the_store_and_plain_through_the_api() {
    for provider in ["aescbc", "secretbox"] {
        let (port, etcd_port) = (free_port(), free_port());
        let s = tokio::task::spawn_blocking(move || {
            start(
                tempfile::tempdir().expect("tempdir"),
                port,
                etcd_port,
                &["--secrets-encryption", "--secrets-encryption-provider", provider],
            )
        })
        .await
        .expect("start");
        let dir = s.server.dir.path().to_path_buf();
        assert_eq!(mode(&config_file(&dir)), 0o600, "the key file is private");
        let (key, keys) = active_key(&dir);
        assert!(key.starts_with(&format!("{provider}-key-")), "{key}");
        assert_eq!(keys, 1);

        let (ok, out) =
            kubectl(&s.server, &["create", "secret", "generic", "db", "--from-literal=password=hunter2-very-secret"]);
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&s.server, &["create", "configmap", "plain", "--from-literal=colour=blue-plain-text"]);
        assert!(ok, "{out}");

        // The store holds ciphertext with upstream's prefix; the data is nowhere in it.
        let stored = raw(&s.etcd, "/registry/secrets/default/db");
        let prefix = format!("k8s:enc:{provider}:v1:{key}:");
        assert!(stored.starts_with(prefix.as_bytes()), "{}", String::from_utf8_lossy(&stored[..60.min(stored.len())]));
        assert!(!contains(&stored, "hunter2") && !contains(&stored, &B64.encode("hunter2-very-secret")));
        assert!(!contains(&stored, "\"db\""), "the whole object is sealed, metadata too");
        // Nothing else is encrypted.
        let cm = raw(&s.etcd, "/registry/configmaps/default/plain");
        assert!(contains(&cm, "blue-plain-text"), "{}", String::from_utf8_lossy(&cm));

        // Get, list and -o yaml see the data.
        let (ok, out) = kubectl(&s.server, &["get", "secret", "db", "-o", "jsonpath={.data.password}"]);
        assert!(ok, "{out}");
        assert_eq!(B64.decode(out.trim()).expect("base64"), b"hunter2-very-secret");
        let (ok, out) = kubectl(&s.server, &["get", "secrets", "-o", "yaml"]);
        assert!(ok && out.contains(&B64.encode("hunter2-very-secret")), "{out}");
        let (ok, out) = kubectl(&s.server, &["get", "secrets", "-A", "--no-headers"]);
        assert!(ok && out.contains("db"), "{out}");

        // A watch sees plain objects, updates included.
        let client = common::kube_client(&s.server.kubeconfig()).await;
        let secrets: Api<Secret> = Api::namespaced(client, "default");
        let rv = secrets.get("db").await.expect("get").metadata.resource_version.expect("rv");
        let mut watch =
            Box::pin(secrets.watch(&WatchParams::default().fields("metadata.name=db"), &rv).await.expect("watch"));
        let (ok, out) =
            kubectl(&s.server, &["patch", "secret", "db", "-p", r#"{"stringData":{"password":"changed-value"}}"#]);
        assert!(ok, "{out}");
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            use futures_util::StreamExt;
            while let Some(ev) = watch.next().await {
                if let Ok(WatchEvent::Modified(secret)) = ev {
                    return secret;
                }
            }
            panic!("the watch ended");
        })
        .await
        .expect("a MODIFIED event");
        assert_eq!(seen.data.expect("data")["password"].0, b"changed-value");
        assert!(raw(&s.etcd, "/registry/secrets/default/db").starts_with(prefix.as_bytes()));

        let (ok, out, err) = secrets_encrypt(&s, &["status"]);
        assert!(ok, "{err}");
        assert!(out.contains("Encryption Status: Enabled"), "{out}");
        assert!(out.contains("Current Rotation Stage: start"), "{out}");
        assert!(out.contains("Server Encryption Hashes: All hashes match"), "{out}");
        let kind = if provider == "aescbc" { "AES-CBC" } else { "XSalsa20-Poly1305" };
        let active = out.lines().find(|l| l.starts_with('*')).unwrap_or_else(|| panic!("no active key: {out}"));
        assert!(active.contains(kind) && active.contains(&key) && active.contains("secrets"), "{out}");
        assert!(out.lines().any(|l| l.contains("Identity")), "{out}");
    }
}

/// Writes secrets through the API until told to stop; what it wrote last, by name.
async fn keep_writing(secrets: Api<Secret>, stop: tokio::sync::watch::Receiver<bool>) -> BTreeMap<String, String> {
    let mut written = BTreeMap::new();
    let mut i = 0u32;
    while !*stop.borrow() {
        // New secrets, and updates of the first ones (replace, so each is a CAS write).
        let name = if i % 3 == 2 { format!("busy-{}", i % 10) } else { format!("busy-{i}") };
        let value = format!("value-{i}");
        let mut secret = Secret {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            data: Some(BTreeMap::from([("v".to_string(), ByteString(value.clone().into_bytes()))])),
            ..Default::default()
        };
        let result = match secrets.get_opt(&name).await.expect("get") {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                secrets.replace(&name, &PostParams::default(), &secret).await
            }
            None => secrets.create(&PostParams::default(), &secret).await,
        };
        match result {
            Ok(_) => {
                written.insert(name, value);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("write {name}: {e}"),
        }
        i += 1;
    }
    written
}

#[tokio::test(flavor = "multi_thread")]
async fn rotate_keys_under_writes_rewrites_every_secret_with_the_new_key() {
    let (port, etcd_port) = (free_port(), free_port());
    let s = tokio::task::spawn_blocking(move || {
        start(tempfile::tempdir().expect("tempdir"), port, etcd_port, &["--secrets-encryption"])
    })
    .await
    .expect("start");
    let dir = s.server.dir.path().to_path_buf();
    let (old_key, _) = active_key(&dir);
    let client = common::kube_client(&s.server.kubeconfig()).await;
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    for i in 0..200 {
        let secret = Secret {
            metadata: ObjectMeta { name: Some(format!("before-{i}")), ..Default::default() },
            string_data: Some(BTreeMap::from([("v".to_string(), format!("before-{i}"))])),
            ..Default::default()
        };
        secrets.create(&PostParams::default(), &secret).await.expect("create");
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let secrets: Api<Secret> = Api::namespaced(secrets.clone().into_client(), &format!("w{w}"));
            let ns = format!("w{w}");
            let stop = stop_rx.clone();
            let (ok, out) = kubectl(&s.server, &["create", "namespace", &ns]);
            assert!(ok, "{out}");
            tokio::spawn(keep_writing(secrets, stop))
        })
        .collect();
    // The writers are under way before the rotation starts.
    eventually("the writers to write", || raw_all(&s.etcd, "/registry/secrets/w2/").len() >= 3);
    let started = Instant::now();
    let rotation = {
        let data_dir = dir.to_str().expect("utf-8").to_string();
        let url = format!("https://127.0.0.1:{}", s.server.port);
        tokio::task::spawn_blocking(move || {
            ferrok(&["secrets-encrypt", "rotate-keys", "--data-dir", &data_dir, "--server", &url])
        })
        .await
        .expect("rotate")
    };
    let took = started.elapsed();
    // Writes go on a little after the rotation, then stop.
    let after = raw_all(&s.etcd, "/registry/secrets/w0/").len();
    eventually("the writers to go on", || raw_all(&s.etcd, "/registry/secrets/w0/").len() >= after + 3);
    let _ = stop_tx.send(true);
    let mut written = BTreeMap::new();
    for (w, writer) in writers.into_iter().enumerate() {
        for (name, value) in writer.await.expect("writer") {
            written.insert((format!("w{w}"), name), value);
        }
    }
    let (ok, out, err) = rotation;
    assert!(ok, "rotate-keys failed: {err}");
    let (new_key, keys) = active_key(&dir);
    assert_ne!(new_key, old_key);
    assert_eq!(keys, 1, "the old key is dropped");
    assert!(out.contains(&new_key), "{out}");
    eprintln!(
        "rotate-keys of {} secrets under writes took {took:?}: {out}",
        raw_all(&s.etcd, "/registry/secrets/").len()
    );
    assert_eq!(mode(&config_file(&dir)), 0o600);

    // Every stored secret carries the new key; every one reads as written.
    let prefix = format!("k8s:enc:aescbc:v1:{new_key}:");
    let stored = raw_all(&s.etcd, "/registry/secrets/");
    for (key, value) in &stored {
        assert!(
            value.starts_with(prefix.as_bytes()),
            "{key} is not under the new key: {}",
            String::from_utf8_lossy(&value[..50.min(value.len())])
        );
    }
    for i in 0..200 {
        let got = secrets.get(&format!("before-{i}")).await.expect("get");
        assert_eq!(got.data.expect("data")["v"].0, format!("before-{i}").into_bytes());
    }
    assert!(written.len() > 10, "the writers wrote {} secrets", written.len());
    for ((ns, name), value) in &written {
        let api: Api<Secret> = Api::namespaced(secrets.clone().into_client(), ns);
        let got = api.get(name).await.unwrap_or_else(|e| panic!("{ns}/{name}: {e}"));
        assert_eq!(got.data.expect("data")["v"].0, value.as_bytes(), "{ns}/{name}");
    }
    let (ok, out) = kubectl(&s.server, &["get", "secrets", "-A", "-o", "name"]);
    assert!(ok && out.lines().count() >= 200 + written.len(), "{out}");

    let (ok, out, err) = secrets_encrypt(&s, &["status"]);
    assert!(ok, "{err}");
    assert!(out.contains("Current Rotation Stage: reencrypt_finished"), "{out}");
    assert!(out.contains("All hashes match"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("AES-CBC")).count(), 1, "{out}");
}

/// Waits for a server that must fail at start; its stderr.
fn start_fails(dir: &Path, port: u16) -> String {
    start_fails_with(dir, port, &[])
}

fn start_fails_with(dir: &Path, port: u16, extra: &[&str]) -> String {
    let mut child = Command::new(common::ferrok_bin())
        .args(["server", "--disable-agent", "--data-dir"])
        .arg(dir)
        .args(["--https-listen-port", &port.to_string(), "--bind-address", "127.0.0.1"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferrok server");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success());
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with a corrupt encryption config");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("stderr");
    err
}

#[test]
fn enabling_later_encrypts_what_was_stored_and_disabling_decrypts_it() {
    let (port, etcd_port) = (free_port(), free_port());
    let s = start(tempfile::tempdir().expect("tempdir"), port, etcd_port, &[]);
    let (ok, out) = kubectl(&s.server, &["create", "secret", "generic", "early", "--from-literal=k=early-plain-value"]);
    assert!(ok, "{out}");
    assert!(contains(&raw(&s.etcd, "/registry/secrets/default/early"), &B64.encode("early-plain-value")));
    let (ok, out, err) = secrets_encrypt(&s, &["status"]);
    assert!(ok, "{err}");
    assert!(out.contains("Encryption Status: Disabled"), "{out}");
    assert!(!config_file(s.server.dir.path()).exists());
    let (ok, _, err) = secrets_encrypt(&s, &["rotate-keys"]);
    assert!(!ok && err.starts_with("error: ") && err.contains("enable") && err.lines().count() == 1, "{err}");

    // enable while the server runs: in force at once, what was stored rewritten.
    let (ok, out, err) = secrets_encrypt(&s, &["enable"]);
    assert!(ok, "{err}");
    assert!(out.contains("enabled on the running server"), "{out}");
    assert_eq!(mode(&config_file(s.server.dir.path())), 0o600);
    let (key, _) = active_key(s.server.dir.path());
    let prefix = format!("k8s:enc:aescbc:v1:{key}:");
    assert!(raw(&s.etcd, "/registry/secrets/default/early").starts_with(prefix.as_bytes()));
    let (ok, out, _) = secrets_encrypt(&s, &["status"]);
    assert!(ok && out.contains("Encryption Status: Enabled") && out.contains("All hashes match"), "{out}");
    let (ok, out, _) = secrets_encrypt(&s, &["enable"]);
    assert!(ok && out.contains("already enabled"), "{out}");

    // And from the file after a restart.
    let (dir, port) = s.server.stop();
    let s = start(dir, port, etcd_port, &[]);
    eventually("the early secret still encrypted", || {
        raw(&s.etcd, "/registry/secrets/default/early").starts_with(prefix.as_bytes())
    });
    let (ok, out) = kubectl(&s.server, &["get", "secret", "early", "-o", "jsonpath={.data.k}"]);
    assert!(ok && B64.decode(out.trim()).expect("base64") == b"early-plain-value", "{out}");
    // The service-account and bootstrap secrets the server made are encrypted too.
    for (k, v) in raw_all(&s.etcd, "/registry/secrets/") {
        assert!(v.starts_with(prefix.as_bytes()), "{k}");
    }
    let (ok, out, _) = secrets_encrypt(&s, &["status"]);
    assert!(ok && out.contains("Encryption Status: Enabled") && out.contains("reencrypt_finished"), "{out}");

    // disable: plain again after the next start, the key kept to read.
    let (ok, out, err) = secrets_encrypt(&s, &["disable"]);
    assert!(ok && out.contains("disabled"), "{out}{err}");
    let (dir, port) = s.server.stop();
    let s = start(dir, port, etcd_port, &[]);
    eventually("the early secret decrypted", || {
        contains(&raw(&s.etcd, "/registry/secrets/default/early"), &B64.encode("early-plain-value"))
    });
    let (ok, out, _) = secrets_encrypt(&s, &["status"]);
    assert!(ok && out.contains("Encryption Status: Disabled"), "{out}");

    // A corrupt file stops the start with one line naming it; nothing is lost.
    let (dir, port) = s.server.stop();
    let file = config_file(dir.path());
    let good = std::fs::read(&file).expect("config");
    std::fs::write(&file, b"{\"kind\": \"EncryptionConfiguration\", \"apiVersion\": ").expect("corrupt");
    let err = start_fails(dir.path(), port);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains(&file.display().to_string()), "{err}");
    // A key of the wrong size, too.
    let mut bad: serde_json::Value = serde_json::from_slice(&good).expect("json");
    bad["resources"][0]["providers"][1]["aescbc"]["keys"][0]["secret"] = B64.encode([0u8; 5]).into();
    std::fs::write(&file, serde_json::to_vec(&bad).expect("json")).expect("bad key");
    let err = start_fails(dir.path(), port);
    assert!(
        err.lines()
            .any(|l| l.starts_with("error:") && l.contains(&file.display().to_string()) && l.contains("32 bytes")),
        "{err}"
    );
    std::fs::write(&file, &good).expect("restore");
    let s = start(dir, port, etcd_port, &[]);
    let (ok, out) = kubectl(&s.server, &["get", "secret", "early", "-o", "jsonpath={.data.k}"]);
    assert!(ok && B64.decode(out.trim()).expect("base64") == b"early-plain-value", "{out}");

    // Bad input to the command: one line naming the flag.
    let (ok, _, err) = ferrok(&["secrets-encrypt", "enable", "--data-dir", "/nonexistent/ferrok"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("--data-dir"), "{err}");
    let (ok, _, err) = ferrok(&["secrets-encrypt", "enable", "--secrets-encryption-provider", "rot13"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("--secrets-encryption-provider"), "{err}");
}

#[test]
fn a_pod_reads_an_encrypted_secret_from_its_volume_and_env() {
    let node = Node::start(&["--secrets-encryption", "--datastore-listen", "http://127.0.0.1:2379"]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: default}}
stringData: {{password: s3cret-in-a-volume}}
---
apiVersion: v1
kind: Pod
metadata: {{name: reader, namespace: default}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "100000"]
    env:
    - name: PASSWORD
      valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}
    volumeMounts:
    - {{name: s, mountPath: /etc/creds}}
  volumes:
  - {{name: s, secret: {{secretName: creds}}}}
"#
    ));
    node.eventually("the reader running", 90, || node.get(&["pod", "reader"], "{.status.phase}") == "Running");
    assert_eq!(node.exec("default", "reader", "c", "cat /etc/creds/password").trim(), "s3cret-in-a-volume");
    assert_eq!(node.exec("default", "reader", "c", "echo $PASSWORD").trim(), "s3cret-in-a-volume");
    // The service-account token the kubelet projected works against the API.
    let token = node.exec("default", "reader", "c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token");
    assert!(token.trim().split('.').count() == 3, "{token}");
    // In the store (the node's own etcd face, inside its network namespace): ciphertext.
    let (ok, stored) = node.on_host(&[
        "env",
        "ETCDCTL_API=3",
        "etcdctl",
        "--endpoints=127.0.0.1:2379",
        "get",
        "/registry/secrets/default/creds",
        "--print-value-only",
    ]);
    assert!(ok && stored.starts_with("k8s:enc:aescbc:v1:aescbc-key-"), "{stored}");
    assert!(!stored.contains("s3cret"), "{stored}");
    let file = node.dir.path().join("server").join("cred").join("encryption-config.json");
    assert_eq!(mode(&file), 0o600);
}

/// One of several servers on one etcd.
struct Member {
    server: ApiServer,
    name: &'static str,
}

fn member_flags(etcd: &str, name: &str, ip: &str) -> Vec<String> {
    ["--datastore-endpoint", etcd, "--token", HA_TOKEN, "--secrets-encryption", "--node-name", name]
        .iter()
        .map(|s| s.to_string())
        .chain(["--advertise-address".to_string(), ip.to_string()])
        .collect()
}

fn start_member(dir: tempfile::TempDir, port: u16, etcd: &str, name: &'static str, ip: &str) -> Member {
    let flags = member_flags(etcd, name, ip);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Member { server: ApiServer::start_with(dir, port, &flags), name }
}

const HA_TOKEN: &str = "secrets-encryption-ha-test-secret";

fn member_status(m: &Member) -> String {
    let (ok, out, err) = secrets_encrypt_at(m.server.dir.path(), m.server.port, &["status"]);
    assert!(ok, "status through {}: {err}", m.name);
    out
}

/// Reads every Secret of `secrets` until told to stop; panics on any
/// error but NotFound (a secret deleted meanwhile). How many it read.
async fn keep_reading(secrets: Api<Secret>, stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let mut reads = 0;
    while !*stop.borrow() {
        let list = secrets.list(&Default::default()).await.unwrap_or_else(|e| panic!("list: {e}"));
        for s in list.items {
            let name = s.metadata.name.clone().expect("name");
            assert!(s.data.is_some(), "{name} listed without data");
            match secrets.get(&name).await {
                Ok(_) => reads += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => panic!("get {name}: {e}"),
            }
        }
    }
    reads
}

/// The raw values under `prefix` in etcd all carry `key`'s prefix.
fn all_sealed_with(etcd: &str, prefix: &str, key: &str) {
    let want = format!("k8s:enc:aescbc:v1:{key}:");
    for (k, v) in raw_all(etcd, prefix) {
        assert!(
            v.starts_with(want.as_bytes()),
            "{k} is not sealed with {key}: {}",
            String::from_utf8_lossy(&v[..50.min(v.len())])
        );
    }
}

fn secret(name: &str, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        data: Some(BTreeMap::from([("v".to_string(), ByteString(value.as_bytes().to_vec()))])),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_on_one_etcd_share_the_keys_and_rotate_them_together() {
    let t0 = Instant::now();
    let stage = |what: &str| eprintln!("[{:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let etcd = common::start_etcd().await;
    let url = etcd.url();
    let (pa, pb) = (free_port(), free_port());
    let (u, v) = (url.clone(), url.clone());
    let a = tokio::task::spawn_blocking(move || {
        start_member(tempfile::tempdir().expect("tempdir"), pa, &u, "a", "127.0.0.1")
    })
    .await
    .expect("start a");
    let b = tokio::task::spawn_blocking(move || {
        start_member(tempfile::tempdir().expect("tempdir"), pb, &v, "b", "127.0.0.2")
    })
    .await
    .expect("start b");
    stage("both servers ready");
    // b installed a's configuration instead of making a key of its own.
    let (fa, fb) = (config_file(a.server.dir.path()), config_file(b.server.dir.path()));
    assert_eq!(std::fs::read(&fa).expect("a's config"), std::fs::read(&fb).expect("b's config"));
    assert_eq!(mode(&fb), 0o600);
    let (old_key, _) = active_key(a.server.dir.path());
    // The keys are not readable in the datastore.
    let (_, dump, _) = common::etcdctl(&url, &["get", "--prefix", "/bootstrap/"], None);
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&fa).expect("config")).expect("json");
    let secret_b64 = file["resources"][0]["providers"][0]["aescbc"]["keys"][0]["secret"].as_str().expect("secret");
    assert!(!dump.contains(secret_b64) && !dump.contains(&old_key), "the keys are in clear in etcd");

    // A Secret written through a is read through b; etcd holds ciphertext.
    let (ok, out) = kubectl(&a.server, &["create", "secret", "generic", "via-a", "--from-literal=k=made-through-a"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&b.server, &["get", "secret", "via-a", "-o", "jsonpath={.data.k}"]);
    assert!(ok && B64.decode(out.trim()).expect("base64") == b"made-through-a", "{out}");
    let stored = raw(&url, "/registry/secrets/default/via-a");
    assert!(stored.starts_with(format!("k8s:enc:aescbc:v1:{old_key}:").as_bytes()));
    assert!(!contains(&stored, "made-through-a") && !contains(&stored, &B64.encode("made-through-a")));
    for m in [&a, &b] {
        let out = member_status(m);
        assert!(out.contains("Server Encryption Hashes: All hashes match"), "{}: {out}", m.name);
    }
    let (_, hashes, _) = common::etcdctl(&url, &["get", "--prefix", "/ferrok/encryption-hashes/"], None);
    assert_eq!(hashes.lines().filter(|l| l.starts_with("/ferrok/encryption-hashes/")).count(), 2, "{hashes}");
    stage("shared");

    // A writer through b and a reader through a, while a rotates the keys.
    let client_a = common::kube_client(&a.server.kubeconfig()).await;
    let client_b = common::kube_client(&b.server.kubeconfig()).await;
    let (ok, out) = kubectl(&a.server, &["create", "namespace", "busy"]);
    assert!(ok, "{out}");
    let on_a: Api<Secret> = Api::namespaced(client_a.clone(), "busy");
    let on_b: Api<Secret> = Api::namespaced(client_b.clone(), "busy");
    for i in 0..100 {
        on_a.create(&PostParams::default(), &secret(&format!("before-{i}"), &format!("before-{i}")))
            .await
            .expect("create");
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(keep_writing(on_b.clone(), stop_rx.clone()));
    let reader = tokio::spawn(keep_reading(on_a.clone(), stop_rx.clone()));
    let reader_b = tokio::spawn(keep_reading(on_b.clone(), stop_rx));
    eventually("the writer to write", || raw_all(&url, "/registry/secrets/busy/busy-").len() >= 3);
    let started = Instant::now();
    let (dir_a, port_a) = (a.server.dir.path().to_path_buf(), a.server.port);
    let (ok, out, err) = tokio::task::spawn_blocking(move || secrets_encrypt_at(&dir_a, port_a, &["rotate-keys"]))
        .await
        .expect("rotate");
    let took = started.elapsed();
    assert!(ok, "rotate-keys through a: {err}");
    let after = raw_all(&url, "/registry/secrets/busy/").len();
    eventually("the writer to go on", || raw_all(&url, "/registry/secrets/busy/").len() >= after + 3);
    let _ = stop_tx.send(true);
    let written = writer.await.expect("writer");
    let reads = reader.await.expect("reader on a") + reader_b.await.expect("reader on b");
    stage(&format!("rotated in {took:?} under {} writes and {reads} reads: {}", written.len(), out.trim()));

    // One key on both servers, the new one; every value sealed with it.
    let (new_key, keys) = active_key(a.server.dir.path());
    assert_ne!(new_key, old_key);
    assert_eq!(keys, 1, "the old key is dropped");
    assert_eq!(std::fs::read(&fa).expect("a's config"), std::fs::read(&fb).expect("b's config"));
    all_sealed_with(&url, "/registry/secrets/", &new_key);
    assert!(written.len() > 5, "the writer wrote {} secrets", written.len());
    for api in [&on_a, &on_b] {
        for (name, value) in &written {
            let got = api.get(name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got.data.expect("data")["v"].0, value.as_bytes(), "{name}");
        }
        for i in 0..100 {
            let got = api.get(&format!("before-{i}")).await.expect("get");
            assert_eq!(got.data.expect("data")["v"].0, format!("before-{i}").into_bytes());
        }
    }
    for m in [&a, &b] {
        let out = member_status(m);
        assert!(out.contains("Current Rotation Stage: reencrypt_finished"), "{}: {out}", m.name);
        assert!(out.contains("Server Encryption Hashes: All hashes match"), "{}: {out}", m.name);
        assert!(out.contains(&new_key) && !out.contains(&old_key), "{}: {out}", m.name);
    }

    // b restarted after the rotation reads everything.
    let Member { server, .. } = b;
    let (dir_b, port_b) = server.stop();
    let u = url.clone();
    let b = tokio::task::spawn_blocking(move || start_member(dir_b, port_b, &u, "b", "127.0.0.2"))
        .await
        .expect("restart b");
    let on_b: Api<Secret> = Api::namespaced(common::kube_client(&b.server.kubeconfig()).await, "busy");
    for (name, value) in &written {
        let got = on_b.get(name).await.unwrap_or_else(|e| panic!("{name} after b's restart: {e}"));
        assert_eq!(got.data.expect("data")["v"].0, value.as_bytes(), "{name}");
    }
    let (ok, out) = kubectl(&b.server, &["get", "secret", "via-a", "-o", "jsonpath={.data.k}"]);
    assert!(ok && B64.decode(out.trim()).expect("base64") == b"made-through-a", "{out}");
    stage("b restarted");

    // A server whose own file holds a key the cluster never had is refused,
    // with one line naming the file; the file is left as it was.
    let c = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(c.path().join("server")).expect("mkdir");
    let c_dir = c.path().to_str().expect("utf-8").to_string();
    let (ok, _, err) = ferrok(&["secrets-encrypt", "enable", "--data-dir", &c_dir, "--server", "https://127.0.0.1:1"]);
    assert!(ok, "{err}");
    let foreign = std::fs::read(config_file(c.path())).expect("c's config");
    let flags = member_flags(&url, "c", "127.0.0.3");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let err = start_fails_with(c.path(), free_port(), &flags);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    let c_file = config_file(c.path()).display().to_string();
    assert!(errors[0].contains(&c_file) && errors[0].contains("cluster"), "{err}");
    assert_eq!(std::fs::read(config_file(c.path())).expect("c's config"), foreign, "c's file was changed");
    let out = member_status(&a);
    assert!(out.contains("All hashes match"), "{out}");
    stage("foreign key refused");
}

#[test]
fn a_server_restarted_in_the_middle_of_a_rotation_finishes_it() {
    let (port, etcd_port) = (free_port(), free_port());
    let s = start(tempfile::tempdir().expect("tempdir"), port, etcd_port, &["--secrets-encryption"]);
    for i in 0..30 {
        let (ok, out) = kubectl(
            &s.server,
            &["create", "secret", "generic", &format!("s{i}"), &format!("--from-literal=v=value-{i}")],
        );
        assert!(ok, "{out}");
    }
    let (old_key, _) = active_key(s.server.dir.path());
    let (dir, port) = s.server.stop();

    // What a rotation stopped at `prepare` leaves: a new key every server
    // reads, the old one still writing, the stage persisted beside the file.
    let file = config_file(dir.path());
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).expect("config")).expect("json");
    let keys = config["resources"][0]["providers"][0]["aescbc"]["keys"].as_array_mut().expect("keys");
    keys.push(serde_json::json!({"name": "aescbc-key-interrupted", "secret": B64.encode([7u8; 32])}));
    std::fs::write(&file, serde_json::to_vec_pretty(&config).expect("json")).expect("write config");
    let state = file.with_file_name("encryption-state.json");
    std::fs::write(&state, r#"{"stage": "prepare", "newKey": "aescbc-key-interrupted"}"#).expect("write state");

    let s = start(dir, port, etcd_port, &["--secrets-encryption"]);
    eventually("the rotation finished", || {
        let (ok, out, _) = secrets_encrypt(&s, &["status"]);
        ok && out.contains("Current Rotation Stage: reencrypt_finished")
    });
    let (key, keys) = active_key(s.server.dir.path());
    assert_eq!((key.as_str(), keys), ("aescbc-key-interrupted", 1), "the old key {old_key} is dropped");
    all_sealed_with(&s.etcd, "/registry/secrets/", "aescbc-key-interrupted");
    for i in 0..30 {
        let (ok, out) = kubectl(&s.server, &["get", "secret", &format!("s{i}"), "-o", "jsonpath={.data.v}"]);
        assert!(ok && B64.decode(out.trim()).expect("base64") == format!("value-{i}").as_bytes(), "{out}");
    }
    let persisted: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).expect("state")).expect("json");
    assert_eq!(persisted["stage"], "reencrypt_finished");
    assert_eq!(mode(&state), 0o600);
    // And after one more restart, still everything.
    let (dir, port) = s.server.stop();
    let s = start(dir, port, etcd_port, &[]);
    let (ok, out) = kubectl(&s.server, &["get", "secret", "s7", "-o", "jsonpath={.data.v}"]);
    assert!(ok && B64.decode(out.trim()).expect("base64") == b"value-7", "{out}");
}
