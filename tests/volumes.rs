//! The node's VolumeManager against a real `ferrok server`: pods created
//! through the API (bound to a node that does not exist: nothing runs
//! them), their volumes materialised on this host's file system, kept
//! current as their sources change, and removed without a trace.
//! These tests mount tmpfs and bind mounts: they run as root.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrok::agent::volume_manager::{Plugin, VolumeError, VolumeManager};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

async fn start() -> (common::ApiServer, kube::Client) {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;
    (server, client)
}

/// Unmounts whatever a failed test left under `dir`, so the temporary
/// folder can go.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let mut left = mounts_under(&self.0);
        left.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in left {
            let c = std::ffi::CString::new(m.to_str().unwrap_or_default()).unwrap_or_default();
            // SAFETY: a valid C string alive for the call.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// (mount point, fs type, super options) of every mount.
fn mountinfo() -> Vec<(PathBuf, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            Some((PathBuf::from(f[4].replace("\\040", " ")), f[dash + 1].to_string(), f.get(dash + 3)?.to_string()))
        })
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    mountinfo().into_iter().map(|m| m.0).filter(|p| p.starts_with(&dir)).collect()
}

fn mount_of(path: &Path) -> Option<(String, String)> {
    let path = std::fs::canonicalize(path).ok()?;
    mountinfo().into_iter().rfind(|m| m.0 == path).map(|m| (m.1, m.2))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_default_objects(client: &kube::Client) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sa = sas.get_opt("default").await.expect("get sa");
        let ca = cms.get_opt("kube-root-ca.crt").await.expect("get ca");
        if sa.is_some() && ca.is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "no default ServiceAccount or kube-root-ca.crt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create<K>(client: &kube::Client, obj: serde_json::Value) -> K
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let obj: K = serde_json::from_value(obj).expect("object");
    let api: Api<K> = Api::namespaced(client.clone(), obj.meta().namespace.as_deref().unwrap_or("default"));
    api.create(&PostParams::default(), &obj).await.expect("create")
}

/// A PersistentVolume and a claim bound to it (status written by hand:
/// there is no binder controller to do it).
async fn bound_claim(client: &kube::Client, claim: &str, volume: &str, source: serde_json::Value) {
    let mut pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "claimRef": {"namespace": "default", "name": claim}},
    });
    for (k, v) in source.as_object().expect("source") {
        pv["spec"][k] = v.clone();
    }
    if pv["spec"].get("local").is_some() {
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["nowhere"]}]}]}});
    }
    let pv: PersistentVolume = serde_json::from_value(pv).expect("pv");
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.expect("create pv");
    let _: PersistentVolumeClaim = create(
        client,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": volume, "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .patch_status(claim, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Bound"}})))
        .await
        .expect("bind claim");
}

fn volume_dir(pods: &Path, uid: &str, plugin: Plugin, name: &str) -> PathBuf {
    pods.join(uid).join("volumes").join(plugin.dir_name()).join(name)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_volume_kind_is_materialised_followed_and_removed() {
    let (_server, client) = start().await;
    wait_for_default_objects(&client).await;
    let host = tempfile::tempdir().expect("tempdir");
    let pods_dir = host.path().join("pods");
    let _guard = MountGuard(host.path().to_path_buf());
    let host_dir = host.path().join("host/dir");
    let host_pv = host.path().join("host/pv");
    let local_pv = host.path().join("local-pv");
    std::fs::create_dir_all(&local_pv).expect("local pv");
    std::fs::write(local_pv.join("existing"), "on the local volume").expect("local file");

    let _: ConfigMap = create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "default"},
               "data": {"a": "1", "b": "2"}}),
    )
    .await;
    let _: Secret = create(
        &client,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-secret", "namespace": "default"},
               "data": {"password": "czNjcmV0"}}),
    )
    .await;
    bound_claim(&client, "data-host", "pv-host", json!({"hostPath": {"path": host_pv, "type": "DirectoryOrCreate"}}))
        .await;
    bound_claim(&client, "data-local", "pv-local", json!({"local": {"path": local_pv}})).await;

    let pod: Pod = create(
        &client,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "everything", "namespace": "default",
                         "labels": {"app": "web", "tier": "front"}, "annotations": {"note": "say \"hi\""}},
            "spec": {
                "nodeName": "nowhere",
                "securityContext": {"fsGroup": 2000},
                "containers": [{
                    "name": "app", "image": "busybox",
                    "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}},
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "scratch", "mountPath": "/per-pod", "subPathExpr": "logs/$(POD_NAME)"},
                        {"name": "mem", "mountPath": "/mem"},
                        {"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"},
                        {"name": "config", "mountPath": "/etc/config"},
                        {"name": "config", "mountPath": "/etc/a", "subPath": "a"},
                        {"name": "config-items", "mountPath": "/etc/items"},
                        {"name": "secret", "mountPath": "/etc/secret"},
                        {"name": "optional", "mountPath": "/etc/optional"},
                        {"name": "podinfo", "mountPath": "/etc/podinfo"},
                        {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                        {"name": "claim-host", "mountPath": "/data"},
                        {"name": "claim-local", "mountPath": "/local"},
                    ],
                }],
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    {"name": "host", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}},
                    {"name": "config", "configMap": {"name": "app-config"}},
                    {"name": "config-items", "configMap": {"name": "app-config", "defaultMode": 0o640,
                        "items": [{"key": "a", "path": "nested/a.txt", "mode": 0o600}, {"key": "b", "path": "b.txt"}]}},
                    {"name": "secret", "secret": {"secretName": "app-secret", "defaultMode": 0o400}},
                    {"name": "optional", "configMap": {"name": "not-there", "optional": true}},
                    {"name": "podinfo", "downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "cpu_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1m"}},
                        {"path": "mem_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
                    ]}},
                    // The volume upstream's ServiceAccount admission plugin adds.
                    {"name": "kube-api-access-abcde", "projected": {"defaultMode": 0o644, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ]}},
                    {"name": "claim-host", "persistentVolumeClaim": {"claimName": "data-host"}},
                    {"name": "claim-local", "persistentVolumeClaim": {"claimName": "data-local", "readOnly": true}},
                ],
            },
        }),
    )
    .await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let vm = VolumeManager::new(client.clone(), pods_dir.clone(), "nowhere".into());
    let volumes = vm.mount_pod(&pod).await.unwrap_or_else(|e| panic!("mount_pod: {:?}", e.event_messages()));
    let dir = |plugin, name: &str| volume_dir(&pods_dir, &uid, plugin, name);
    let gid = |p: &Path| std::fs::metadata(p).expect("metadata").gid();

    // emptyDir: a 0777 folder, group fsGroup with setgid; Memory: a sized tmpfs.
    let scratch = dir(Plugin::EmptyDir, "scratch");
    assert_eq!(mode(&scratch), 0o2777);
    assert_eq!(gid(&scratch), 2000);
    let mem = dir(Plugin::EmptyDir, "mem");
    let (fstype, options) = mount_of(&mem).expect("mem is mounted");
    assert_eq!(fstype, "tmpfs");
    assert!(options.contains("size=16384k"), "{options}");

    // hostPath: created 0755, not materialised.
    assert_eq!(mode(&host_dir), 0o755);
    assert_eq!(volumes.volumes["host"].path, host_dir);

    // configMap: the atomic writer's layout, modes, fsGroup.
    let config = dir(Plugin::ConfigMap, "config");
    assert_eq!(read(&config.join("a")), "1");
    assert_eq!(read(&config.join("b")), "2");
    assert_eq!(std::fs::read_link(config.join("a")).expect("link"), Path::new("..data/a"));
    assert!(std::fs::read_link(config.join("..data")).expect("..data").to_str().expect("name").starts_with("..20"));
    assert_eq!(mode(&config.join("a")), 0o644);
    assert_eq!(gid(&config.join("a")), 2000);
    assert!(mount_of(&config).is_none(), "configMap volumes live on disk");
    let items = dir(Plugin::ConfigMap, "config-items");
    assert_eq!(read(&items.join("nested/a.txt")), "1");
    assert_eq!(mode(&items.join("nested/a.txt")), 0o640, "0600 widened by fsGroup to group-read");
    assert_eq!(mode(&items.join("b.txt")), 0o640);
    assert!(!items.join("a").exists());

    // secret: on a tmpfs.
    let secret = dir(Plugin::Secret, "secret");
    assert_eq!(read(&secret.join("password")), "s3cret");
    assert_eq!(mode(&secret.join("password")), 0o440);
    assert_eq!(mount_of(&secret).expect("secret is mounted").0, "tmpfs");

    // An optional configMap that does not exist: an empty volume.
    let optional = dir(Plugin::ConfigMap, "optional");
    let names: Vec<String> = std::fs::read_dir(&optional)
        .expect("optional")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("..")), "{names:?}");

    // downwardAPI.
    let podinfo = dir(Plugin::DownwardApi, "podinfo");
    assert_eq!(read(&podinfo.join("labels")), "app=\"web\"\ntier=\"front\"");
    assert_eq!(read(&podinfo.join("annotations")), "note=\"say \\\"hi\\\"\"");
    assert_eq!(read(&podinfo.join("name")), "everything");
    assert_eq!(read(&podinfo.join("cpu_limit")), "250");
    assert_eq!(read(&podinfo.join("mem_limit")), "64");

    // The kube-api-access projected volume.
    let access = dir(Plugin::Projected, "kube-api-access-abcde");
    assert_eq!(read(&access.join("namespace")), "default");
    let ca: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let ca = ca.get("kube-root-ca.crt").await.expect("ca");
    assert_eq!(read(&access.join("ca.crt")), ca.data.expect("data")["ca.crt"]);
    assert_eq!(mode(&access.join("token")), 0o640, "tokens are 0600, group-readable with fsGroup");
    let token = read(&access.join("token"));
    assert_eq!(token.split('.').count(), 3, "a JWT");
    assert_eq!(
        review(&client, &token).await.as_deref(),
        Some("system:serviceaccount:default:default"),
        "the API server accepts the token"
    );

    // Claims: a hostPath PV mounts the host path; a local PV is bound in.
    assert_eq!(volumes.volumes["claim-host"].path, host_pv);
    assert!(host_pv.is_dir());
    let local = volumes.volumes["claim-local"].path.clone();
    assert_eq!(local, dir(Plugin::LocalVolume, "pv-local"));
    assert_eq!(read(&local.join("existing")), "on the local volume");
    assert!(volumes.volumes["claim-local"].read_only);
    assert!(std::fs::write(local.join("new"), "x").is_err(), "a read-only claim is mounted read-only");

    // The container's CRI mounts.
    let container: &Container = &pod.spec.as_ref().expect("spec").containers[0];
    let env: BTreeMap<String, String> = [("POD_NAME".to_string(), "everything".to_string())].into_iter().collect();
    let mounts = volumes.mounts_for(container, &env).expect("mounts");
    let by_path: BTreeMap<&str, &ferrok::agent::cri::api::Mount> =
        mounts.iter().map(|m| (m.container_path.as_str(), m)).collect();
    assert_eq!(mounts.len(), 13);
    assert_eq!(by_path["/scratch"].host_path, scratch.to_str().expect("utf-8"));
    assert!(!by_path["/scratch"].readonly);
    assert!(by_path["/etc/config"].readonly && by_path["/etc/secret"].readonly && by_path["/local"].readonly);
    assert_eq!(by_path["/host"].propagation, 1, "HostToContainer");
    let per_pod = PathBuf::from(&by_path["/per-pod"].host_path);
    assert!(per_pod.starts_with(pods_dir.join(&uid).join("volume-subpaths/scratch/app")), "{}", per_pod.display());
    assert!(scratch.join("logs/everything").is_dir(), "subPathExpr folder created in the volume");
    let sub_a = PathBuf::from(&by_path["/etc/a"].host_path);
    assert_eq!(read(&sub_a), "1");
    assert!(mount_of(&sub_a).is_some(), "a subPath is a bind mount of its own");
    // A link a container planted in its emptyDir cannot lead a subPath out.
    std::os::unix::fs::symlink("/etc", scratch.join("escape")).expect("symlink");
    let evil: Container = serde_json::from_value(json!({"name": "evil", "volumeMounts": [
        {"name": "scratch", "mountPath": "/x", "subPath": "escape/shadow"}]}))
    .expect("container");
    match volumes.mounts_for(&evil, &env) {
        Err(VolumeError::SubPathOutside { .. }) => {}
        other => panic!("a subPath through a link out of the volume: {other:?}"),
    }
    assert!(!pods_dir.join(&uid).join("volume-subpaths/scratch/evil").exists());
    // Asking again reuses the same bind.
    let again = volumes.mounts_for(container, &env).expect("mounts again");
    assert_eq!(again, mounts);

    // Idempotent: the same answer, nothing rewritten.
    let data_before = std::fs::read_link(config.join("..data")).expect("..data");
    let token_before = read(&access.join("token"));
    assert_eq!(vm.mount_pod(&pod).await.expect("again"), volumes);
    assert_eq!(std::fs::read_link(config.join("..data")).expect("..data"), data_before);
    assert_eq!(read(&access.join("token")), token_before);

    // Shared watches, one per object.
    let followed: Vec<String> = vm.followed_sources().iter().map(|k| format!("{:?}/{}", k.kind, k.name)).collect();
    assert_eq!(
        followed,
        ["ConfigMap/app-config", "ConfigMap/kube-root-ca.crt", "ConfigMap/not-there", "Secret/app-secret"],
    );

    // The configMap changes: the volume follows, the subPath copy does not.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.patch("app-config", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "updated", "c": "3"}})))
        .await
        .expect("update configmap");
    eventually("the configMap volume to follow", Duration::from_secs(10), || {
        std::fs::read_to_string(config.join("a")).is_ok_and(|s| s == "updated")
    })
    .await;
    eventually("the new key", Duration::from_secs(5), || config.join("c").exists()).await;
    eventually("the items volume to follow", Duration::from_secs(5), || {
        std::fs::read_to_string(items.join("nested/a.txt")).is_ok_and(|s| s == "updated")
    })
    .await;
    assert_eq!(read(&sub_a), "1", "a subPath mount does not follow updates");
    let ts_dirs = std::fs::read_dir(&config)
        .expect("config")
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("..20")));
    assert_eq!(ts_dirs.count(), 1, "the old data dir is removed");

    // An optional source that appears fills its volume.
    let _: ConfigMap = create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-there", "namespace": "default"},
               "data": {"late": "arrival"}}),
    )
    .await;
    eventually("the optional configMap to appear", Duration::from_secs(10), || {
        std::fs::read_to_string(optional.join("late")).is_ok_and(|s| s == "arrival")
    })
    .await;

    // The pod's labels change: the downwardAPI file follows.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let updated = pods
        .patch("everything", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})))
        .await
        .expect("relabel");
    vm.pod_updated(&updated).await;
    eventually("the labels file to follow", Duration::from_secs(5), || {
        std::fs::read_to_string(podinfo.join("labels")).is_ok_and(|s| s == "app=\"web\"\ntier=\"back\"")
    })
    .await;
    // The pod worker retrying with its older copy changes nothing back.
    vm.mount_pod(&pod).await.expect("mount with an older copy");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read(&podinfo.join("labels")), "app=\"web\"\ntier=\"back\"");

    // Usage of emptyDirs, for eviction.
    std::fs::write(scratch.join("blob"), vec![7u8; 1 << 20]).expect("write scratch");
    std::fs::write(mem.join("blob"), vec![7u8; 2 << 20]).expect("write mem");
    let usage = vm.usage(&uid).expect("usage");
    assert!(usage["scratch"] >= 1 << 20, "{usage:?}");
    assert!(usage["mem"] >= 2 << 20 && usage["mem"] < 4 << 20, "{usage:?}");
    assert_eq!(usage.len(), 2);

    assert_eq!(vm.pods_on_disk(), vec![uid.clone()]);

    // Unmount: nothing left, not a mount, not a file; the host's data stays.
    vm.unmount_pod(&uid).await.expect("unmount");
    assert_eq!(mounts_under(&pods_dir), Vec::<PathBuf>::new());
    assert!(!pods_dir.join(&uid).exists());
    assert!(vm.pods_on_disk().is_empty());
    assert!(vm.followed_sources().is_empty(), "watches stop with their last pod");
    assert_eq!(read(&local_pv.join("existing")), "on the local volume");
    assert!(host_dir.is_dir() && host_pv.is_dir());
    vm.unmount_pod(&uid).await.expect("a second unmount is a no-op");
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_read_as_upstream_and_retries_finish_the_job() {
    let (_server, client) = start().await;
    wait_for_default_objects(&client).await;
    let host = tempfile::tempdir().expect("tempdir");
    let pods_dir = host.path().join("pods");
    let _guard = MountGuard(host.path().to_path_buf());
    let not_a_dir = host.path().join("file");
    std::fs::write(&not_a_dir, "x").expect("file");
    let _: PersistentVolumeClaim = create(
        &client,
        // No class: the default local-path class would provision it.
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pending", "namespace": "default"},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": ""}}),
    )
    .await;
    let pod: Pod = create(
        &client,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "broken", "namespace": "default"},
            "spec": {
                "nodeName": "nowhere",
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "keys", "configMap": {"name": "shared", "items": [{"key": "nope", "path": "x"}]}},
                    {"name": "sec", "secret": {"secretName": "creds"}},
                    {"name": "dir", "hostPath": {"path": not_a_dir, "type": "Directory"}},
                    {"name": "unbound", "persistentVolumeClaim": {"claimName": "pending"}},
                    {"name": "missing", "persistentVolumeClaim": {"claimName": "ghost"}},
                    {"name": "ok", "emptyDir": {}},
                ],
            },
        }),
    )
    .await;
    let _: ConfigMap = create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared", "namespace": "default"}, "data": {"k": "v"}}),
    )
    .await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let vm = VolumeManager::new(client.clone(), pods_dir.clone(), "nowhere".into());
    let err = vm.mount_pod(&pod).await.expect_err("volumes are missing");
    assert!(matches!(err, VolumeError::SetUp(_)));
    assert_eq!(err.event_reason(), "FailedMount");
    let d = not_a_dir.display();
    assert_eq!(
        err.event_messages(),
        [
            "MountVolume.SetUp failed for volume \"cfg\" : configmap \"app-config\" not found".to_string(),
            "MountVolume.SetUp failed for volume \"keys\" : configmap references non-existent config key: nope".into(),
            "MountVolume.SetUp failed for volume \"sec\" : secret \"creds\" not found".into(),
            format!("MountVolume.SetUp failed for volume \"dir\" : hostPath type check failed: {d} is not a directory"),
            "MountVolume.SetUp failed for volume \"unbound\" : persistentvolumeclaim \"pending\" is not bound".into(),
            "MountVolume.SetUp failed for volume \"missing\" : persistentvolumeclaim \"ghost\" not found".into(),
        ]
    );
    // The volume that could be set up is there already.
    assert!(volume_dir(&pods_dir, &uid, Plugin::EmptyDir, "ok").is_dir());

    // A second pod shares the watch of `shared`.
    let other: Pod = create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": "default"},
               "spec": {"nodeName": "nowhere", "containers": [{"name": "app", "image": "busybox"}],
                        "volumes": [{"name": "s", "configMap": {"name": "shared"}}]}}),
    )
    .await;
    let other_uid = other.metadata.uid.clone().expect("uid");
    vm.mount_pod(&other).await.expect("other pod");
    let shared = vm.followed_sources().iter().filter(|k| k.name == "shared").count();
    assert_eq!(shared, 1, "one watch per object, whatever the number of pods");

    // After a restart (a new manager over the same folder), setting the pod
    // up again rewrites nothing that is already right.
    let other_volume = volume_dir(&pods_dir, &other_uid, Plugin::ConfigMap, "s");
    let data_before = std::fs::read_link(other_volume.join("..data")).expect("..data");
    std::fs::write(volume_dir(&pods_dir, &uid, Plugin::EmptyDir, "ok").join("kept"), "x").expect("write");
    {
        let restarted = VolumeManager::new(client.clone(), pods_dir.clone(), "nowhere".into());
        assert_eq!(restarted.pods_on_disk().len(), 2);
        let again = restarted.mount_pod(&other).await.expect("other pod after a restart");
        assert_eq!(again.volumes["s"].path, other_volume);
        assert_eq!(std::fs::read_link(other_volume.join("..data")).expect("..data"), data_before);
        restarted.mount_pod(&pod).await.expect_err("still broken");
        assert_eq!(read(&volume_dir(&pods_dir, &uid, Plugin::EmptyDir, "ok").join("kept")), "x");
    }

    // Fix what can be fixed from the API; the next call finishes the rest.
    let _: ConfigMap = create(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "default"}, "data": {"x": "1"}}),
    )
    .await;
    let _: Secret = create(
        &client,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "default"}, "stringData": {"u": "me"}}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.patch("shared", &PatchParams::default(), &Patch::Merge(json!({"data": {"nope": "now here"}})))
        .await
        .expect("patch");
    let deadline = Instant::now() + Duration::from_secs(10);
    let remaining = loop {
        let err = vm.mount_pod(&pod).await.expect_err("the host path and the claims are still wrong");
        let messages = err.event_messages();
        if messages.len() == 3 || Instant::now() > deadline {
            break messages;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(remaining.len(), 3, "{remaining:?}");
    assert!(remaining.iter().all(|m| m.contains("\"dir\"") || m.contains("\"unbound\"") || m.contains("\"missing\"")));
    assert_eq!(read(&volume_dir(&pods_dir, &uid, Plugin::ConfigMap, "cfg").join("x")), "1");
    assert_eq!(read(&volume_dir(&pods_dir, &uid, Plugin::Secret, "sec").join("u")), "me");
    assert_eq!(read(&volume_dir(&pods_dir, &uid, Plugin::ConfigMap, "keys").join("x")), "now here");

    vm.unmount_pod(&uid).await.expect("unmount");
    assert_eq!(vm.followed_sources().iter().filter(|k| k.name == "shared").count(), 1, "still used by the other pod");
    vm.unmount_pod(&other_uid).await.expect("unmount other");
    assert!(vm.followed_sources().is_empty());
    assert_eq!(mounts_under(&pods_dir), Vec::<PathBuf>::new());
    assert!(vm.pods_on_disk().is_empty());
}

async fn review(client: &kube::Client, token: &str) -> Option<String> {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
        ..Default::default()
    };
    let status = reviews.create(&PostParams::default(), &review).await.expect("token review").status?;
    status.authenticated.filter(|a| *a).and(status.user).and_then(|u| u.username)
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_are_renewed_in_place() {
    let (_server, client) = start().await;
    wait_for_default_objects(&client).await;
    let host = tempfile::tempdir().expect("tempdir");
    let pods_dir = host.path().join("pods");
    let _guard = MountGuard(host.path().to_path_buf());
    let pod: Pod = create(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tokened", "namespace": "default"},
               "spec": {"nodeName": "nowhere", "containers": [{"name": "app", "image": "busybox"}],
                        "volumes": [{"name": "token", "projected": {"sources": [
                            {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 600}}]}}]}}),
    )
    .await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let vm = VolumeManager::new(client.clone(), pods_dir.clone(), "nowhere".into());
    // Renewal is due at 80% of 600 s; make it 2 s so the test can see it.
    vm.renew_tokens_after(Duration::from_secs(2));
    let t0 = Instant::now();
    vm.mount_pod(&pod).await.expect("mount");
    let volume = volume_dir(&pods_dir, &uid, Plugin::Projected, "token");
    let first = read(&volume.join("token"));
    let data_before = std::fs::read_link(volume.join("..data")).expect("..data");
    let payload = |t: &str| -> serde_json::Value {
        use base64::Engine;
        let part = t.split('.').nth(1).expect("payload");
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).expect("base64"))
            .expect("claims")
    };
    let claims = payload(&first);
    assert_eq!(claims["aud"], json!(["vault"]));
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], json!(uid), "bound to the pod");
    assert_eq!(mode(&volume.join("token")), 0o644);

    eventually("the token to be renewed", Duration::from_secs(6), || {
        std::fs::read_to_string(volume.join("token")).is_ok_and(|t| !t.is_empty() && t != first)
    })
    .await;
    let second = read(&volume.join("token"));
    assert!(t0.elapsed() >= Duration::from_secs(2), "renewed before it was due");
    assert_ne!(std::fs::read_link(volume.join("..data")).expect("..data"), data_before, "rewritten atomically");
    let renewed = payload(&second);
    assert_eq!(renewed["aud"], json!(["vault"]));
    assert_eq!(renewed["kubernetes.io"]["pod"]["uid"], json!(uid));
    assert!(renewed["exp"].as_i64() > claims["exp"].as_i64(), "{renewed} vs {claims}");
    vm.unmount_pod(&uid).await.expect("unmount");
    assert!(!pods_dir.join(&uid).exists());
}
