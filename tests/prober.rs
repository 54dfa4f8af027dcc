//! Probes and lifecycle hooks against a real containerd: a containerd of
//! the test's own in a temporary folder, a one-layer busybox image built
//! here and imported with `ctr`, one hostNetwork pod sandbox (no CNI
//! needed) running one container. Exec probes go through CRI ExecSync;
//! httpGet probes and hooks reach busybox's httpd in the pod.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ExecAction, HTTPGetAction, LifecycleHandler, ObjectReference, Pod, PodSpec,
    PodStatus, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use ferrok::agent::containerd::{check_host, Containerd, ContainerdConfig, ContainerdPaths};
use ferrok::agent::cri::{api, Cri};
use ferrok::agent::lifecycle::run_handler;
use ferrok::agent::prober::exec::exec_sync;
use ferrok::agent::prober::{
    EventSink, ProbeManager, ProbeOutcome, ProbeResult, ProbeTarget, ProbeType, Prober, RuntimeProber,
};
use ferrok::client::events::EventType;

const IMAGE: &str = "docker.io/ferrok/probe-busybox:test";
const APPLETS: &[&str] = &["sh", "sleep", "true", "false", "echo", "cat", "touch", "mkdir", "httpd", "test", "rm"];

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An OCI image-layout tarball of one layer: /bin/busybox and its applets.
fn busybox_image(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let layer_path = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer_path)
        .arg("."));
    let layer = std::fs::read(&layer_path).unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["sleep", "100000"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    })
    .to_string();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config.as_bytes()), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()}],
    })
    .to_string();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest.as_bytes()), "size": manifest.len(),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": IMAGE, "org.opencontainers.image.ref.name": "test"},
        }],
    })
    .to_string();
    let layout = dir.join("layout");
    let blobs = layout.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [&layer[..], config.as_bytes(), manifest.as_bytes()] {
        std::fs::write(blobs.join(&sha256(blob)["sha256:".len()..]), blob).unwrap();
    }
    std::fs::write(layout.join("index.json"), index).unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let tarball = dir.join("image.tar");
    run(Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&tarball).arg("."));
    tarball
}

fn host_namespaces() -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Node as i32,
        pid: api::NamespaceMode::Container as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

const POD_UID: &str = "6a1f-probe-test";

fn sandbox_config(logs: &Path) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "probes".into(),
            uid: POD_UID.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        // A hostNetwork sandbox has the node's UTS namespace: no hostname of its own.
        hostname: String::new(),
        log_directory: logs.to_string_lossy().into_owned(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(host_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod as the API would have it: hostNetwork, so probed on the host IP.
fn pod(container: &Container) -> Pod {
    let mut pod = Pod {
        spec: Some(PodSpec { host_network: Some(true), containers: vec![container.clone()], ..Default::default() }),
        status: Some(PodStatus { host_ip: Some("127.0.0.1".into()), ..Default::default() }),
        ..Default::default()
    };
    pod.metadata.name = Some("probes".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some(POD_UID.into());
    pod
}

fn exec_probe(command: &[&str]) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(command.iter().map(|s| s.to_string()).collect()) }),
        ..Default::default()
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<String>>);

impl EventSink for Events {
    fn event(&self, _regarding: ObjectReference, _t: EventType, reason: &str, message: &str) {
        self.0.lock().unwrap().push(format!("{reason}: {message}"));
    }
}

struct Pod1 {
    cri: Cri,
    container_id: String,
    container: Container,
    pod: Pod,
    http_port: u16,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_hooks_with_a_real_containerd() {
    if unsafe { libc::geteuid() } != 0 || !Path::new("/bin/busybox").exists() {
        eprintln!("skipped: needs root, containerd and busybox-static (scripts/deps)");
        return;
    }
    let dir = tempfile::Builder::new().prefix("fp").tempdir_in("/tmp").unwrap();
    let image = busybox_image(dir.path());
    let (handlers, cni_bin_dir) = check_host(false).expect("containerd, runc and CNI plugins are installed");
    let paths = ContainerdPaths::new(&dir.path().join("agent"));
    let config = ContainerdConfig {
        paths: paths.clone(),
        sandbox_image: IMAGE.into(),
        handlers,
        cni_bin_dir,
        max_container_log_line_size: 16384,
    };
    let containerd = Containerd::start(&config).await.expect("containerd starts");
    let cri = Cri::connect(containerd.socket()).unwrap();
    cri.wait_ready(Duration::from_secs(20)).await.expect("containerd answers");
    run(Command::new("ctr").arg("-a").arg(containerd.socket()).args(["-n", "k8s.io", "images", "import"]).arg(&image));

    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let sandbox = sandbox_config(&logs);
    let sandbox_id = cri
        .runtime()
        .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;

    let outcome = std::panic::AssertUnwindSafe(async {
        let http_port = free_port();
        let container = Container {
            name: "app".into(),
            env: Some(vec![EnvVar { name: "GREETING".into(), value: Some("hello".into()), ..Default::default() }]),
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: http_port.into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: IMAGE.into(), ..Default::default() }),
            command: vec!["sleep".into(), "100000".into()],
            log_path: "app.log".into(),
            linux: Some(api::LinuxContainerConfig {
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(host_namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let container_id = cri
            .runtime()
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await
            .expect("CreateContainer")
            .into_inner()
            .container_id;
        cri.runtime()
            .start_container(api::StartContainerRequest { container_id: container_id.clone() })
            .await
            .expect("StartContainer");
        let pod = pod(&container);
        let p = Pod1 { cri: cri.clone(), container_id, container, pod, http_port };
        exec_probes(&p).await;
        http_probes_and_hooks(&p).await;
        exec_hooks(&p).await;
        manager_drives_real_probes(&p).await;
    })
    .catch_unwind()
    .await;

    let _ = cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() }).await;
    let _ = cri.runtime().remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id }).await;
    containerd.stop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn target(p: &Pod1) -> ProbeTarget {
    ProbeTarget {
        pod: Arc::new(p.pod.clone()),
        container: Arc::new(p.container.clone()),
        container_id: p.container_id.clone(),
        pod_ip: "127.0.0.1".parse().ok(),
    }
}

async fn exec_probes(p: &Pod1) {
    let prober = RuntimeProber::new(p.cri.clone());
    let t = target(p);
    let probe = |spec: Probe| {
        let prober = prober.clone();
        let t = t.clone();
        async move { prober.probe(ProbeType::Liveness, &spec, &t).await }
    };
    assert_eq!(probe(exec_probe(&["true"])).await, ProbeResult::Success);
    assert_eq!(
        probe(exec_probe(&["sh", "-c", "echo out; echo err >&2; exit 3"])).await,
        ProbeResult::Failure("out\nerr\n".into())
    );
    // $(VAR) comes from the container's env, as upstream expands it.
    assert_eq!(probe(exec_probe(&["test", "$(GREETING)", "=", "hello"])).await, ProbeResult::Success);
    let started = Instant::now();
    let mut slow = exec_probe(&["sleep", "10"]);
    slow.timeout_seconds = Some(1);
    assert_eq!(probe(slow).await, ProbeResult::Failure("command \"sleep 10\" timed out".into()));
    assert!(started.elapsed() < Duration::from_secs(5), "the timeout was not kept: {:?}", started.elapsed());
    match probe(exec_probe(&["/no/such/program"])).await {
        ProbeResult::Unknown(e) => assert!(e.starts_with("rpc error: code = "), "{e}"),
        ProbeResult::Failure(_) => {} // some runtimes report exit code 127/126 instead
        other => panic!("a missing program: {other:?}"),
    }
    let mut gone = t.clone();
    gone.container_id = "0000000000000000000000000000000000000000000000000000000000000000".into();
    match prober.probe(ProbeType::Liveness, &exec_probe(&["true"]), &gone).await {
        ProbeResult::Unknown(e) => assert!(e.starts_with("rpc error: code = NotFound desc = "), "{e}"),
        other => panic!("a missing container: {other:?}"),
    }
}

async fn http_probes_and_hooks(p: &Pod1) {
    let port = p.http_port;
    let serve = format!("mkdir -p /www && echo ok > /www/healthz && httpd -p 127.0.0.1:{port} -h /www");
    let started = exec_sync(&p.cri, &p.container_id, &["sh".into(), "-c".into(), serve], None).await;
    assert!(started.result.is_ok(), "httpd: {:?} {}", started.result, String::from_utf8_lossy(&started.output));
    let prober = RuntimeProber::new(p.cri.clone());
    let http = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(port.into()),
            path: Some(path.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut ready = false;
    for _ in 0..50 {
        if prober.probe(ProbeType::Readiness, &http("/healthz"), &target(p)).await == ProbeResult::Success {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "busybox httpd in the pod answers /healthz");
    assert_eq!(
        prober.probe(ProbeType::Readiness, &http("/missing"), &target(p)).await,
        ProbeResult::Failure("HTTP probe failed with statuscode: 404".into())
    );
    let tcp =
        |port: IntOrString| Probe { tcp_socket: Some(TCPSocketAction { port, host: None }), ..Default::default() };
    assert_eq!(
        prober.probe(ProbeType::Liveness, &tcp(IntOrString::String("web".into())), &target(p)).await,
        ProbeResult::Success,
        "a named port of the container"
    );
    let closed = free_port();
    assert_eq!(
        prober.probe(ProbeType::Liveness, &tcp(IntOrString::Int(closed.into())), &target(p)).await,
        ProbeResult::Failure(format!("dial tcp 127.0.0.1:{closed}: connect: connection refused"))
    );
    // A hook with no host goes to the pod: the runtime reports no IP for a
    // hostNetwork sandbox, so the pod's host IP is used.
    let hook = LifecycleHandler {
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(port.into()),
            path: Some("/healthz".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    run_handler(&p.cri, &p.pod, &p.container, &p.container_id, &hook).await.expect("HTTP hook");
}

async fn exec_hooks(p: &Pod1) {
    let exec = |cmd: &[&str]| LifecycleHandler {
        exec: Some(ExecAction { command: Some(cmd.iter().map(|s| s.to_string()).collect()) }),
        ..Default::default()
    };
    let err =
        run_handler(&p.cri, &p.pod, &p.container, &p.container_id, &exec(&["sh", "-c", "exit 1"])).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Exec lifecycle hook ([sh -c exit 1]) for Container \"app\" in Pod \"probes_default({POD_UID})\" failed - error: command 'sh -c exit 1' exited with 1: , message: \"\""
        )
    );
    let err = run_handler(
        &p.cri,
        &p.pod,
        &p.container,
        &p.container_id,
        &exec(&["sh", "-c", "echo bye; echo no >&2; exit 2"]),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.ends_with(
            "error: command 'sh -c echo bye; echo no >&2; exit 2' exited with 2: no\n, message: \"bye\\nno\\n\""
        ),
        "{err}"
    );
    run_handler(&p.cri, &p.pod, &p.container, &p.container_id, &exec(&["touch", "/tmp/hooked"]))
        .await
        .expect("hook runs");
    let check = exec_sync(&p.cri, &p.container_id, &["test".into(), "-f".into(), "/tmp/hooked".into()], None).await;
    assert!(check.result.is_ok(), "the hook ran in the container");
}

async fn manager_drives_real_probes(p: &Pod1) {
    let events = Arc::new(Events::default());
    let (manager, mut updates) = ProbeManager::new(p.cri.clone(), events.clone());
    let mut liveness = exec_probe(&["sh", "-c", "echo sick; exit 1"]);
    liveness.period_seconds = Some(1);
    liveness.failure_threshold = Some(2);
    let mut readiness = exec_probe(&["cat", "/tmp/ready"]);
    readiness.period_seconds = Some(1);
    let container =
        Container { liveness_probe: Some(liveness), readiness_probe: Some(readiness), ..p.container.clone() };
    manager.add_container(&p.pod, &container, &p.container_id, SystemTime::now(), None);
    assert!(!manager.is_ready(POD_UID, "app"));

    let mut seen: HashMap<ProbeType, ProbeOutcome> = HashMap::new();
    let wait = |seen: &HashMap<ProbeType, ProbeOutcome>| seen.get(&ProbeType::Liveness) == Some(&ProbeOutcome::Failure);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !wait(&seen) {
        let u =
            tokio::time::timeout_at(deadline, updates.recv()).await.expect("a liveness failure within 15 s").unwrap();
        assert_eq!(u.container_id, p.container_id);
        if u.probe_type == ProbeType::Liveness {
            assert_eq!(u.message.as_deref(), Some("sick\n"));
        }
        seen.insert(u.probe_type, u.result);
    }
    assert!(!manager.is_ready(POD_UID, "app"));
    let touched = exec_sync(&p.cri, &p.container_id, &["touch".into(), "/tmp/ready".into()], None).await;
    assert!(touched.result.is_ok());
    let u = tokio::time::timeout(Duration::from_secs(10), updates.recv()).await.expect("ready within 10 s").unwrap();
    assert_eq!((u.probe_type, u.result), (ProbeType::Readiness, ProbeOutcome::Success));
    assert!(manager.is_ready(POD_UID, "app"));
    let events = events.0.lock().unwrap().clone();
    assert!(events.iter().any(|e| e == "Unhealthy: Liveness probe failed: sick\n"), "{events:?}");
    assert!(
        events.iter().any(|e| e.starts_with("Unhealthy: Readiness probe failed: cat: can't open '/tmp/ready'")),
        "{events:?}"
    );
    manager.remove_pod(POD_UID);
    assert_eq!(manager.worker_count(), 0);
}
