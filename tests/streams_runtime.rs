//! The node's streaming endpoints against containerd's own CRI streaming
//! server (Go, moby/spdystream and the upstream remotecommand server):
//! our SPDY client towards it, and our server side (SPDY and WebSocket)
//! reached by real clients, here the Python `kubernetes` client, through a
//! bare router that calls the entry points the kubelet API uses.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Request, State};
use axum::routing::any;
use axum::Router;

use common::images::{busybox_oci_tar, TestContainerd};
use ferrok::agent::cri::{api, Cri};
use ferrok::agent::server::streams::remotecommand::Options;
use ferrok::agent::server::streams::{runtime_stream, serve_exec, serve_port_forward, PortForwardTarget};

const IMAGE: &str = "docker.io/library/busybox:1";

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn host_namespaces() -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Node as i32,
        pid: api::NamespaceMode::Container as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn sandbox_config(logs: &Path) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "streams".into(),
            uid: "streams-uid".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
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

async fn start_container(
    cri: &Cri,
    sandbox_id: &str,
    sandbox: &api::PodSandboxConfig,
    name: &str,
    command: &[&str],
) -> String {
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: IMAGE.into(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(host_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = cri
        .runtime()
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    cri.runtime()
        .start_container(api::StartContainerRequest { container_id: id.clone() })
        .await
        .expect("StartContainer");
    id
}

async fn exec_url(cri: &Cri, id: &str, cmd: &[&str], stdin: bool) -> String {
    let req = api::ExecRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty: false,
        stdin,
        stdout: true,
        stderr: true,
    };
    cri.runtime().exec(req).await.expect("Exec").into_inner().url
}

/// Everything a runtime stream gives back: stdout, stderr, the status.
async fn drain(mut s: runtime_stream::RuntimeStreams) -> (String, String, serde_json::Value) {
    let mut out = s.stdout.take().unwrap();
    let mut err = s.stderr.take().unwrap();
    let (o, e, st) = tokio::join!(
        async move {
            let mut v = Vec::new();
            while let Some(d) = out.read().await {
                v.extend(d);
            }
            v
        },
        async move {
            let mut v = Vec::new();
            while let Some(d) = err.read().await {
                v.extend(d);
            }
            v
        },
        async move {
            let mut v = Vec::new();
            while let Some(d) = s.error.read().await {
                v.extend(d);
            }
            v
        }
    );
    let status = serde_json::from_slice(&st).unwrap_or(serde_json::Value::Null);
    (String::from_utf8_lossy(&o).into_owned(), String::from_utf8_lossy(&e).into_owned(), status)
}

async fn runtime_client_speaks_to_containerd(cri: &Cri, id: &str) {
    let opts = |stdin| Options { command: vec![], stdin, stdout: true, stderr: true, tty: false };
    let url = exec_url(cri, id, &["sh", "-c", "echo out; echo err >&2; exit 7"], false).await;
    let s = runtime_stream::connect(&url, &opts(false)).await.expect("SPDY to containerd");
    let (out, err, status) = tokio::time::timeout(Duration::from_secs(20), drain(s)).await.expect("exec ends");
    assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "7", "{status}");

    // stdin: a FIN on our stdin stream closes cat's stdin, so cat ends.
    let url = exec_url(cri, id, &["cat"], true).await;
    let mut s = runtime_stream::connect(&url, &opts(true)).await.expect("SPDY to containerd");
    let stdin = s.stdin.take().unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let writer = tokio::spawn(async move {
        stdin.write(&big).await.unwrap();
        stdin.close().await.unwrap();
    });
    let (out, _err, status) =
        tokio::time::timeout(Duration::from_secs(30), drain(s)).await.expect("cat ends at stdin EOF");
    writer.await.unwrap();
    assert_eq!(out.len(), 3_000_000);
    assert!(out.starts_with("abcdefghijklmnopqrstuvwxyzabc"));
    assert_eq!(status["status"], "Success", "{status}");

    // Into a file, as `kubectl cp` writes: 10 MiB arrive whole.
    // 10 MiB into a file (busybox `cat > file` straight from the exec's stdin
    // FIFO stops early on this kernel, with or without ferrok: a pipe in between).
    let url = exec_url(cri, id, &["sh", "-c", "cat | cat > /tmp/in"], true).await;
    let mut s = runtime_stream::connect(&url, &opts(true)).await.expect("SPDY to containerd");
    let stdin = s.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..320 {
            stdin.write(&[7u8; 32768]).await.unwrap();
        }
        stdin.close().await.unwrap();
    });
    let (_, _, status) = tokio::time::timeout(Duration::from_secs(30), drain(s)).await.expect("cat ends at stdin EOF");
    writer.await.unwrap();
    assert_eq!(status["status"], "Success", "{status}");
    let url = exec_url(cri, id, &["sh", "-c", "ls -l /tmp/in"], false).await;
    let (out, _, _) = drain(runtime_stream::connect(&url, &opts(false)).await.expect("SPDY to containerd")).await;
    assert!(out.contains(" 10485760 "), "{out}");
}

#[derive(Clone)]
struct Routes {
    cri: Cri,
    app: String,
}

async fn pod_exec(
    State(r): State<Arc<Routes>>,
    UrlPath((_ns, _pod)): UrlPath<(String, String)>,
    req: Request,
) -> axum::response::Response {
    serve_exec(r.cri.clone(), r.app.clone(), req).await
}

async fn pod_port_forward(UrlPath((ns, pod)): UrlPath<(String, String)>, req: Request) -> axum::response::Response {
    // The test pod uses the host's network: the node's own namespace is the pod's.
    let target =
        PortForwardTarget { netns: "/proc/self/ns/net".into(), pod: format!("{ns}/{pod}"), uid: "streams-uid".into() };
    serve_port_forward(target, req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_port_forward_against_containerds_streaming_server() {
    let _ = tracing_subscriber::fmt().with_env_filter("ferrok=debug").with_test_writer().try_init();
    let dir = tempfile::Builder::new().prefix("fs").tempdir_in("/tmp").unwrap();
    let node = TestContainerd::start(dir.path()).await;
    ferrok::agent::images::ensure_pause_image(&node.cri, ferrok::agent::images::PAUSE_IMAGE)
        .await
        .expect("pause image");
    let tar = dir.path().join("busybox.tar");
    busybox_oci_tar(&tar, IMAGE);
    run(Command::new("ctr").arg("-a").arg(&node.paths.socket).args(["-n", "k8s.io", "images", "import"]).arg(&tar));
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let sandbox = sandbox_config(&logs);
    let cri = node.cri.clone();
    let sandbox_id = cri
        .runtime()
        .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;

    let outcome = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
        let http_port = common::free_port();
        let script = format!(
            "mkdir -p /www && echo hello from httpd > /www/index.html && httpd -f -p 127.0.0.1:{http_port} -h /www"
        );
        let app = start_container(&cri, &sandbox_id, &sandbox, "app", &["sh", "-c", &script]).await;
        runtime_client_speaks_to_containerd(&cri, &app).await;

        let routes = Arc::new(Routes { cri: cri.clone(), app: app.clone() });
        let router = Router::new()
            .route("/api/v1/namespaces/{ns}/pods/{pod}/exec", any(pod_exec))
            .route("/api/v1/namespaces/{ns}/pods/{pod}/portforward", any(pod_port_forward))
            .with_state(routes);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });

        let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/streams_client.py");
        let out = tokio::process::Command::new("timeout")
            .args(["-s", "INT", "50", "python3", "-u"])
            .arg(py)
            .arg(format!("http://{addr}"))
            .arg("streams")
            .arg(http_port.to_string())
            .output();
        let out =
            tokio::time::timeout(Duration::from_secs(60), out).await.expect("python client ends").expect("python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim_end().ends_with("ok"),
            "python client: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }))
    .await;

    let _ = cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() }).await;
    let _ = cri.runtime().remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id }).await;
    node.stop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
