//! Images on a node with no registry: tarball import into a real
//! containerd (OCI layout and docker save; plain, gzip, zstd), the
//! `ferrok images` command, the built-in pause image running a real pod
//! sandbox, the images folder, and pulls from a real registry on 127.0.0.1
//! configured through registries.yaml. Each test runs its own containerd.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::images::{busybox_docker_archive, busybox_oci_tar, gzip_file, zstd_file, Registry, TestContainerd};
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::StatSnapshotRequest;
use containerd_client::services::v1::{DeleteImageRequest, InfoRequest};
use ferrok::agent::cri::{api, namespaced, Cri};
use ferrok::agent::images::dir::FileOutcome;
use ferrok::agent::images::{self, ImagesDir, PullError, Puller, Registries};

async fn image_status(cri: &Cri, image: &str) -> Option<api::Image> {
    let req = api::ImageStatusRequest {
        image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
        verbose: false,
    };
    cri.images().image_status(req).await.expect("ImageStatus").into_inner().image
}

/// Runs containerd's garbage collector now (a synchronous image delete does).
async fn collect_garbage(cri: &Cri, tar_dir: &Path) {
    let tar = tar_dir.join("gc-trigger.tar");
    std::fs::write(&tar, images::pause::pause_image_tar("ferrok.local/gc-trigger:1").unwrap()).unwrap();
    images::import_file(cri, &tar).await.expect("import the GC trigger");
    let req = namespaced(DeleteImageRequest { name: "ferrok.local/gc-trigger:1".into(), sync: true, target: None });
    ImagesClient::new(cri.channel()).delete(req).await.expect("sync delete");
}

async fn has_content(cri: &Cri, digest: &str) -> bool {
    ContentClient::new(cri.channel()).info(namespaced(InfoRequest { digest: digest.into() })).await.is_ok()
}

async fn has_snapshot(cri: &Cri, chain_id: &str) -> bool {
    let req = StatSnapshotRequest { snapshotter: "overlayfs".into(), key: chain_id.into() };
    SnapshotsClient::new(cri.channel()).stat(namespaced(req)).await.is_ok()
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn layer_digest_of_oci_tar(tar: &Path) -> String {
    let mut archive = tar::Archive::new(std::fs::File::open(tar).unwrap());
    let mut biggest = (0u64, String::new());
    for e in archive.entries().unwrap() {
        let e = e.unwrap();
        let p = e.path().unwrap().display().to_string();
        if let Some(hex) = p.strip_prefix("blobs/sha256/") {
            if e.size() > biggest.0 {
                biggest = (e.size(), format!("sha256:{hex}"));
            }
        }
    }
    biggest.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_and_docker_archives_import_plain_gzip_and_zstd() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let plain = dir.path().join("oci.tar");
    busybox_oci_tar(&plain, "docker.io/library/busybox:oci-plain");
    let gz = dir.path().join("oci-gz.bin");
    busybox_oci_tar(&dir.path().join("g.tar"), "busybox:oci-gzip");
    gzip_file(&dir.path().join("g.tar"), &gz);
    let zst = dir.path().join("oci-zstd.tar");
    busybox_oci_tar(&dir.path().join("z.tar"), "busybox:oci-zstd");
    // The name says .tar: the magic bytes say zstd.
    zstd_file(&dir.path().join("z.tar"), &zst);
    let docker = dir.path().join("docker.tar");
    busybox_docker_archive(&docker, "busybox:docker");
    let multi = dir.path().join("multi.tar");
    common::images::busybox_oci_multiplatform_tar(&multi, "registry.example.com/multi/busybox:2");
    let docker_zst = dir.path().join("docker.tar.zst");
    busybox_docker_archive(&dir.path().join("d2.tar"), "example.com/tools/busybox:docker-zstd");
    zstd_file(&dir.path().join("d2.tar"), &docker_zst);

    for (file, want) in [
        (&plain, "docker.io/library/busybox:oci-plain"),
        (&gz, "docker.io/library/busybox:oci-gzip"),
        (&zst, "docker.io/library/busybox:oci-zstd"),
        (&docker, "docker.io/library/busybox:docker"),
        (&docker_zst, "example.com/tools/busybox:docker-zstd"),
        (&multi, "registry.example.com/multi/busybox:2"),
    ] {
        let names = images::import_file(&cri, file).await.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(names, [want], "{}", file.display());
        let found = image_status(&cri, want).await.unwrap_or_else(|| panic!("CRI does not see {want}"));
        assert!(found.repo_tags.contains(&want.to_string()), "{found:?}");
        assert!(found.size > 1_000_000, "size {}", found.size);
        assert!(images::is_protected(&cri, want).await.unwrap(), "{want} is not protected");
        assert!(images::is_protected(&cri, &found.id).await.unwrap(), "{} is not protected by ID", found.id);
    }
    // The same image imported twice is one CRI image with several names.
    let a = image_status(&cri, "busybox:oci-plain").await.unwrap();
    let b = image_status(&cri, "busybox:oci-gzip").await.unwrap();
    assert_eq!(a.id, b.id);
    let protected = images::protected_refs(&cri).await.unwrap();
    assert!(protected.contains("docker.io/library/busybox:docker"), "{protected:?}");

    // Importing again is idempotent.
    assert_eq!(images::import_file(&cri, &plain).await.unwrap(), ["docker.io/library/busybox:oci-plain"]);

    // Unpacked: the layer's snapshot is there, named by its chain ID (for
    // one layer, its diff ID).
    let chain_id = sha256(&common::images::busybox_image().layer);
    assert!(has_snapshot(&cri, &chain_id).await, "no snapshot {chain_id}");

    // The GC labels keep layers and snapshots alive once the import's lease is gone.
    let layer = layer_digest_of_oci_tar(&plain);
    collect_garbage(&cri, dir.path()).await;
    assert!(has_content(&cri, &layer).await, "the garbage collector removed an imported layer");
    assert!(has_snapshot(&cri, &chain_id).await, "the garbage collector removed an imported snapshot");
    node.stop().await;
}

/// A `docker save` of two images sharing a layer, the second's layer a
/// symlink to the first's (as docker writes it).
fn docker_archive_with_shared_layer(path: &Path) {
    let image = common::images::busybox_image();
    let config = format!("{}.json", &sha256(&image.config)[7..]);
    let manifest = serde_json::json!([
        { "Config": config, "RepoTags": ["busybox:a"], "Layers": ["first/layer.tar"] },
        { "Config": config, "RepoTags": ["busybox:b", "example.com/b:2"], "Layers": ["second/layer.tar"] },
    ]);
    let mut b = tar::Builder::new(Vec::new());
    let file = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    file(&mut b, &config, &image.config);
    file(&mut b, "first/layer.tar", &image.layer);
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "second/layer.tar", "../first/layer.tar").unwrap();
    file(&mut b, "manifest.json", &serde_json::to_vec(&manifest).unwrap());
    std::fs::write(path, b.into_inner().unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_archive_of_several_images_sharing_a_layer() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let tar = dir.path().join("two.tar");
    docker_archive_with_shared_layer(&tar);
    let names = images::import_file(&node.cri, &tar).await.unwrap();
    assert_eq!(names, ["docker.io/library/busybox:a", "docker.io/library/busybox:b", "example.com/b:2"]);
    for name in &names {
        assert!(image_status(&node.cri, name).await.is_some(), "{name}");
    }
    assert!(has_snapshot(&node.cri, &sha256(&common::images::busybox_image().layer)).await);
    node.stop().await;
}

fn run(program: &Path, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(out.status.success(), "{} {args:?}: {}", program.display(), String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tarballs_written_by_skopeo_and_ctr_import() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let registry = Registry::start(&dir.path().join("registry"), None);
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, "busybox:1");
    registry.push(&tar, "library/busybox:1");
    let skopeo = common::images::require_binary("skopeo", "skopeo");
    let source = format!("docker://{}/library/busybox:1", registry.host());
    let docker = dir.path().join("skopeo-docker.tar");
    let oci = dir.path().join("skopeo-oci.tar");
    for dest in [
        format!("docker-archive:{}:busybox:skopeo-docker", docker.display()),
        format!("oci-archive:{}:docker.io/library/busybox:skopeo-oci", oci.display()),
    ] {
        run(&skopeo, &["--insecure-policy", "copy", "--quiet", "--src-tls-verify=false", &source, &dest]);
    }
    assert_eq!(images::import_file(&cri, &docker).await.unwrap(), ["docker.io/library/busybox:skopeo-docker"]);
    assert_eq!(images::import_file(&cri, &oci).await.unwrap(), ["docker.io/library/busybox:skopeo-oci"]);

    // ctr's export of an imported image imports back.
    let ctr = common::images::require_binary("ctr", "containerd");
    let exported = dir.path().join("ctr-export.tar");
    let address = node.paths.socket.display().to_string();
    run(
        &ctr,
        &[
            "-a",
            &address,
            "-n",
            "k8s.io",
            "images",
            "export",
            exported.to_str().unwrap(),
            "docker.io/library/busybox:skopeo-oci",
        ],
    );
    images::remove_image(&cri, "busybox:skopeo-oci").await.unwrap();
    assert!(image_status(&cri, "busybox:skopeo-oci").await.is_none());
    assert_eq!(images::import_file(&cri, &exported).await.unwrap(), ["docker.io/library/busybox:skopeo-oci"]);
    for name in ["busybox:skopeo-docker", "busybox:skopeo-oci"] {
        assert!(image_status(&cri, name).await.is_some(), "{name}");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_or_truncated_tarballs_fail_clearly_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let good = dir.path().join("good.tar");
    busybox_oci_tar(&good, "busybox:bad");
    let bytes = std::fs::read(&good).unwrap();
    let layer = layer_digest_of_oci_tar(&good);

    let truncated = dir.path().join("truncated.tar");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let gz_truncated = dir.path().join("truncated.tar.gz");
    gzip_file(&good, &dir.path().join("full.tar.gz"));
    let gz = std::fs::read(dir.path().join("full.tar.gz")).unwrap();
    std::fs::write(&gz_truncated, &gz[..gz.len() - 100]).unwrap();
    let garbage = dir.path().join("garbage.tar");
    std::fs::write(&garbage, vec![0x42u8; 4096]).unwrap();
    // One byte of the config changed: its digest no longer matches its name.
    let tampered = dir.path().join("tampered.tar");
    let mut t = bytes.clone();
    let at = t.windows(12).position(|w| w == b"\"PATH=/bin\"]").expect("config in the tarball");
    t[at + 7] = b'X';
    std::fs::write(&tampered, &t).unwrap();
    let missing = dir.path().join("missing.tar");
    // The layer left out of the tarball.
    let no_layer = dir.path().join("no-layer.tar");
    let mut out = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(std::io::Cursor::new(bytes.clone()));
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().display().to_string() != format!("blobs/sha256/{}", &layer[7..]) {
            let mut h = e.header().clone();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            out.append_data(&mut h, e.path().unwrap(), data.as_slice()).unwrap();
        }
    }
    std::fs::write(&no_layer, out.into_inner().unwrap()).unwrap();

    // The layer-less tarball goes first: once the tampered import has written
    // the layer into containerd, a tarball without it imports (as ctr's).
    for (file, why) in [
        (&no_layer, &format!("layer 1 of docker.io/library/busybox:bad {layer} is not in the archive") as &str),
        (&truncated, "truncated"),
        (&gz_truncated, "truncated"),
        (&garbage, "not a tar file"),
        (&tampered, "digest is sha256:"),
        (&missing, "cannot read"),
    ] {
        let err = match images::import_file(&cri, file).await {
            Ok(imported) => panic!("{} ({why}) imported {imported:?}", file.display()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(err.contains(why), "{} gave {err}", file.display());
        assert!(!err.contains('\n'), "{err}");
        assert!(image_status(&cri, "busybox:bad").await.is_none(), "{} left an image", file.display());
    }
    // The tampered import wrote the layer before failing; with its lease
    // gone the garbage collector takes it.
    collect_garbage(&cri, dir.path()).await;
    assert!(!has_content(&cri, &layer).await, "a failed import left its layer behind");
    node.stop().await;
}

fn ferrok(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(common::ferrok_bin()).args(args).output().expect("run ferrok");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrok_images_imports_lists_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let data_dir = dir.path().display().to_string();
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, "busybox:cli");
    let docker = dir.path().join("docker.tar");
    busybox_docker_archive(&docker, "busybox:cli2");

    let (ok, out, err) =
        ferrok(&["images", "import", "--data-dir", &data_dir, tar.to_str().unwrap(), docker.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out, "imported docker.io/library/busybox:cli\nimported docker.io/library/busybox:cli2\n");

    let endpoint = format!("unix://{}", node.paths.socket.display());
    let (ok, out, err) = ferrok(&["images", "list", "--container-runtime-endpoint", &endpoint]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].split_whitespace().collect::<Vec<_>>() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE", "PINNED"],
        "{out}"
    );
    let row = lines.iter().find(|l| l.split_whitespace().nth(1) == Some("cli")).unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[0], "docker.io/library/busybox", "{out}");
    assert_eq!(cells[2].len(), 12, "{out}");
    assert!(cells[3].ends_with("MB"), "{out}");
    assert_eq!(cells[4], "true", "{out}");

    let (ok, out, err) = ferrok(&["images", "rm", "--data-dir", &data_dir, "busybox:cli"]);
    assert!(ok, "{err}");
    assert_eq!(out, "Deleted: docker.io/library/busybox:cli\n");
    let (_, out, _) = ferrok(&["images", "list", "--data-dir", &data_dir]);
    assert!(!out.lines().any(|l| l.split_whitespace().nth(1) == Some("cli")), "{out}");
    assert!(out.lines().any(|l| l.split_whitespace().nth(1) == Some("cli2")), "{out}");

    // Errors: one line, naming the file or the image, non-zero exit.
    let broken = dir.path().join("broken.tar");
    std::fs::write(&broken, b"not an image").unwrap();
    for (args, names) in [
        (vec!["images", "import", "--data-dir", &data_dir, broken.to_str().unwrap()], broken.display().to_string()),
        (vec!["images", "import", "--data-dir", &data_dir, "/nonexistent/x.tar"], "/nonexistent/x.tar".to_string()),
        (vec!["images", "rm", "--data-dir", &data_dir, "nosuch:1"], "nosuch:1".to_string()),
        (
            vec!["images", "list", "--data-dir", "/nonexistent-dir"],
            "/nonexistent-dir/agent/containerd/containerd.sock".to_string(),
        ),
    ] {
        let (ok, _, err) = ferrok(&args);
        assert!(!ok, "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(&names), "{args:?}: {err}");
    }
    node.stop().await;
}

fn sandbox_config(dir: &Path, name: &str) -> api::PodSandboxConfig {
    let logs = dir.join("pods").join(name);
    std::fs::create_dir_all(&logs).unwrap();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        // No hostname: a host-network sandbox has the node's.
        log_directory: logs.display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                // Host network: no CNI needed for this test.
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_pause_image_runs_a_pod_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    assert!(image_status(&cri, images::PAUSE_IMAGE).await.is_none());
    assert!(images::ensure_pause_image(&cri, images::PAUSE_IMAGE).await.unwrap(), "not imported");
    assert!(!images::ensure_pause_image(&cri, images::PAUSE_IMAGE).await.unwrap(), "imported twice");
    assert!(image_status(&cri, images::PAUSE_IMAGE).await.is_some());
    assert!(images::is_protected(&cri, images::PAUSE_IMAGE).await.unwrap());
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, "busybox:run");
    images::import_file(&cri, &tar).await.unwrap();

    let config = sandbox_config(dir.path(), "pause-test");
    let started = Instant::now();
    let sandbox = cri
        .runtime()
        .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox with the built-in pause image: {}", e.message()))
        .into_inner()
        .pod_sandbox_id;
    eprintln!("RunPodSandbox took {:?}", started.elapsed());
    let status = cri
        .runtime()
        .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: false })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);

    // A container from an imported image starts at once (already unpacked).
    let container = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: "hello".into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: "busybox:run".into(), ..Default::default() }),
        command: vec!["sh".into(), "-c".into(), "echo hello from $(id -un); cat /etc/group | grep -c nobody".into()],
        log_path: "hello.log".into(),
        ..Default::default()
    };
    let id = cri
        .runtime()
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(container),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {}", e.message()))
        .into_inner()
        .container_id;
    cri.runtime().start_container(api::StartContainerRequest { container_id: id.clone() }).await.unwrap();
    let log = Path::new(&config.log_directory).join("hello.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("hello from root") && text.contains(" 1\n") {
            break;
        }
        assert!(Instant::now() < deadline, "container log: {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let req = api::ContainerStatusRequest { container_id: id.clone(), verbose: false };
        let status = cri.runtime().container_status(req).await.unwrap().into_inner().status.unwrap();
        if status.state == api::ContainerState::ContainerExited as i32 {
            assert_eq!(status.exit_code, 0, "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the container did not exit: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The pause process is PID 1 of the pod's pid namespace, where signals
    // left at their default disposition are ignored; ours waits for
    // SIGTERM, so it exits at once (CRI itself stops sandboxes with SIGKILL).
    let verbose = cri
        .runtime()
        .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: true })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(verbose.info.get("info").expect("verbose sandbox info")).unwrap();
    let pid = info["pid"].as_i64().expect("sandbox pid") as i32;
    assert!(std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap().starts_with("/pause"));
    // SAFETY: kill(2) of the sandbox process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = cri
            .runtime()
            .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
            .state;
        if state == api::PodSandboxState::SandboxNotready as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "pause (PID 1) did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await.unwrap();
    cri.runtime().remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: sandbox }).await.unwrap();
    node.stop().await;
}

async fn eventually_present(cri: &Cri, image: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while image_status(cri, image).await.is_none() {
        assert!(Instant::now() < deadline, "{image} did not appear within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_folder_imports_at_start_and_when_a_file_lands() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let folder = node.agent_dir.join("images");
    std::fs::create_dir_all(&folder).unwrap();
    busybox_oci_tar(&folder.join("early.tar"), "busybox:early");
    std::fs::write(folder.join("README"), "not an image").unwrap();

    let (task, outcomes) = ImagesDir::for_agent(&node.agent_dir, cri.clone(), None).start().await.unwrap();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(
        outcomes[0].1.as_ref().map_err(ToString::to_string),
        Ok(&FileOutcome::Imported(vec!["docker.io/library/busybox:early".into()]))
    );
    assert!(image_status(&cri, "busybox:early").await.is_some());

    // Written in place (IN_CLOSE_WRITE) and moved in (IN_MOVED_TO).
    busybox_docker_archive(&folder.join("written.tar"), "busybox:written");
    let outside = dir.path().join("moved.tar.part");
    busybox_oci_tar(&dir.path().join("m.tar"), "busybox:moved");
    gzip_file(&dir.path().join("m.tar"), &outside);
    std::fs::rename(&outside, folder.join("moved.tar.gz")).unwrap();
    eventually_present(&cri, "busybox:written", Duration::from_secs(30)).await;
    eventually_present(&cri, "busybox:moved", Duration::from_secs(30)).await;
    // CRI may see an image a moment before the import has noted it.
    task.stop().await;

    // A second start finds everything imported and unchanged.
    let (_task, outcomes) = ImagesDir::for_agent(&node.agent_dir, cri.clone(), None).start().await.unwrap();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(outcomes.iter().all(|(_, o)| matches!(o, Ok(FileOutcome::Unchanged))), "{outcomes:?}");
    // Touched but the same bytes: still unchanged; removed image: imported again.
    let f = std::fs::File::options().append(true).open(folder.join("early.tar")).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5)).unwrap();
    drop(f);
    images::remove_image(&cri, "busybox:written").await.unwrap();
    let dir2 = ImagesDir::for_agent(&node.agent_dir, cri.clone(), None);
    assert_eq!(dir2.handle(&folder.join("early.tar")).await.map_err(|e| e.to_string()), Ok(FileOutcome::Unchanged));
    assert_eq!(
        dir2.handle(&folder.join("written.tar")).await.map_err(|e| e.to_string()),
        Ok(FileOutcome::Imported(vec!["docker.io/library/busybox:written".into()]))
    );
    node.stop().await;
}

/// Pulls with CRI PullImage, credentials from registries.yaml.
struct CriPuller {
    cri: Cri,
    registries: Registries,
}

#[async_trait::async_trait]
impl Puller for CriPuller {
    async fn pull(&self, reference: &str) -> Result<(), PullError> {
        let req = api::PullImageRequest {
            image: Some(api::ImageSpec { image: reference.into(), ..Default::default() }),
            auth: self.registries.auth_for(reference),
            sandbox_config: None,
        };
        self.cri.images().pull_image(req).await.map(|_| ()).map_err(|s| s.message().into())
    }
}

fn configure_registries(node: &TestContainerd, yaml: &str) -> Registries {
    let file = node.agent_dir.join("etc").join("registries.yaml");
    std::fs::write(&file, yaml).unwrap();
    let registries = Registries::load(&file).unwrap();
    registries.write_hosts(&node.paths.certs_d).unwrap();
    registries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_list_pulls_from_a_plain_http_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let registry = Registry::start(&dir.path().join("registry"), None);
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, "busybox:1");
    registry.push(&tar, "library/busybox:1");
    // The mirrored registry is a local port nothing listens on (not
    // docker.io: a test must never reach out should the mirror fail).
    let upstream = format!("127.0.0.1:{}", common::free_port());
    let image = format!("{upstream}/library/busybox:1");
    let registries = configure_registries(
        &node,
        &format!("mirrors:\n  \"{upstream}\":\n    endpoint:\n      - \"http://{}\"\n", registry.host()),
    );

    let folder = node.agent_dir.join("images");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("pull.txt"), format!("# images this node needs\n{image}   # from the mirror\n\n"))
        .unwrap();
    let puller = Arc::new(CriPuller { cri: cri.clone(), registries });
    let (_task, outcomes) = ImagesDir::for_agent(&node.agent_dir, cri.clone(), Some(puller)).start().await.unwrap();
    assert_eq!(
        outcomes[0].1.as_ref().map_err(ToString::to_string),
        Ok(&FileOutcome::Pulled { pulled: vec![image.clone()], present: vec![], failed: vec![] }),
        "{outcomes:?}"
    );
    let found = image_status(&cri, &image).await.expect("pulled image");
    assert!(
        found.repo_digests.iter().any(|d| d.starts_with(&format!("{upstream}/library/busybox@sha256:"))),
        "{found:?}"
    );
    // A pulled image is not protected: the node's image GC may take it.
    assert!(!images::is_protected(&cri, &image).await.unwrap());

    // A list naming it again finds it present.
    std::fs::write(folder.join("again.txt"), format!("{image}\n")).unwrap();
    let again = ImagesDir::for_agent(&node.agent_dir, cri.clone(), None)
        .handle(&folder.join("again.txt"))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(again, Ok(FileOutcome::Pulled { pulled: vec![], present: vec![image.clone()], failed: vec![] }));

    // "*" mirrors every registry (containerd's certs.d/_default).
    let other = format!("127.0.0.1:{}/library/busybox:1", common::free_port());
    let registries =
        configure_registries(&node, &format!("mirrors:\n  \"*\":\n    endpoint: [\"http://{}\"]\n", registry.host()));
    CriPuller { cri: cri.clone(), registries }
        .pull(&other)
        .await
        .unwrap_or_else(|e| panic!("pull through the * mirror: {e}"));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn htpasswd_registry_pulls_with_configured_credentials_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestContainerd::start(dir.path()).await;
    let cri = node.cri.clone();
    let registry = Registry::start(&dir.path().join("registry"), Some(("ferrok", "s3cret")));
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, "busybox:1");
    registry.push(&tar, "library/busybox:1");
    let host = registry.host();
    let image = format!("{host}/library/busybox:1");
    let mirror_only = format!("mirrors:\n  \"{host}\":\n    endpoint: [\"http://{host}\"]\n");

    let without = CriPuller { cri: cri.clone(), registries: configure_registries(&node, &mirror_only) };
    assert!(without.registries.auth_for(&image).is_none());
    let err = without.pull(&image).await.expect_err("pulled without credentials").to_string();
    assert!(err.contains("401") || err.to_lowercase().contains("unauthorized"), "{err}");
    assert!(image_status(&cri, &image).await.is_none());

    let with_auth =
        format!("{mirror_only}configs:\n  \"{host}\":\n    auth:\n      username: ferrok\n      password: s3cret\n");
    let with = CriPuller { cri: cri.clone(), registries: configure_registries(&node, &with_auth) };
    with.pull(&image).await.unwrap_or_else(|e| panic!("pull with credentials: {e}"));
    assert!(image_status(&cri, &image).await.is_some());
    node.stop().await;
}
