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
    let data_dir = s.server.dir.path().to_str().expect("utf-8 path").to_string();
    let url = format!("https://127.0.0.1:{}", s.server.port);
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
    let mut child = Command::new(common::ferrok_bin())
        .args(["server", "--disable-agent", "--data-dir"])
        .arg(dir)
        .args(["--https-listen-port", &port.to_string(), "--bind-address", "127.0.0.1"])
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

    // enable: the file now, the encryption from the next start on.
    let (ok, out, err) = secrets_encrypt(&s, &["enable"]);
    assert!(ok, "{err}");
    assert!(out.contains("restart the server"), "{out}");
    assert_eq!(mode(&config_file(s.server.dir.path())), 0o600);
    let (ok, out, _) = secrets_encrypt(&s, &["status"]);
    assert!(ok && out.contains("Encryption Status: Disabled") && out.contains("restart the server"), "{out}");

    let (dir, port) = s.server.stop();
    let s = start(dir, port, etcd_port, &[]);
    let (key, _) = active_key(s.server.dir.path());
    let prefix = format!("k8s:enc:aescbc:v1:{key}:");
    eventually("the early secret re-encrypted", || {
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
