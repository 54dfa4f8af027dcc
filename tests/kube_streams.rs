//! The `kube` crate's exec, attach and port-forward (WebSocket: v5/v4
//! channels for exec and attach, the `v4.channel.k8s.io` port-forward
//! channels) against a ferrok node. Needs root and what `scripts/deps`
//! installs.

mod common;

use std::time::Duration;

use common::node::Node;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(30);

async fn read_all(r: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let mut out = Vec::new();
    if let Some(mut r) = r {
        tokio::time::timeout(LIMIT, r.read_to_end(&mut out)).await.expect("stream ends in time").expect("read");
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn exec_streams_and_status(pods: &Api<Pod>) {
    // stdin in, stdout and stderr out, success status.
    let mut p = pods
        .exec("box", ["sh", "-c", "cat; echo to-stderr >&2"], &AttachParams::default().stdin(true))
        .await
        .expect("exec");
    let mut stdin = p.stdin().expect("stdin");
    let (stdout, stderr, status) = (p.stdout(), p.stderr(), p.take_status().expect("status"));
    stdin.write_all(b"from stdin\n").await.expect("write stdin");
    stdin.shutdown().await.expect("close stdin");
    drop(stdin);
    let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
    assert_eq!(out, "from stdin\n");
    assert_eq!(err, "to-stderr\n");
    let status = tokio::time::timeout(LIMIT, status).await.expect("status in time").expect("a status");
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    tokio::time::timeout(LIMIT, p.join()).await.expect("join in time").expect("join");

    // 4 MiB through stdin, checked inside the pod.
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let want = format!("{:x}", sha2::Sha256::digest(&data));
    let mut p = pods
        .exec("box", ["busybox", "sha256sum"], &AttachParams::default().stdin(true).stderr(false))
        .await
        .expect("exec");
    let mut stdin = p.stdin().expect("stdin");
    let stdout = p.stdout();
    let writer = tokio::spawn(async move {
        stdin.write_all(&data).await.expect("write stdin");
        stdin.shutdown().await.expect("close stdin");
    });
    let sum = read_all(stdout).await;
    writer.await.expect("writer");
    assert!(sum.starts_with(&want), "sha256sum in the pod: {sum:?}, want {want}");
    tokio::time::timeout(LIMIT, p.join()).await.expect("join in time").expect("join");

    // A non-zero exit: the status carries the code.
    let mut p = pods.exec("box", ["sh", "-c", "exit 7"], &AttachParams::default()).await.expect("exec");
    let status = tokio::time::timeout(LIMIT, p.take_status().expect("status")).await.expect("in time").expect("status");
    assert_eq!(status.status.as_deref(), Some("Failure"), "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"), "{status:?}");
    let causes = status.details.as_ref().and_then(|d| d.causes.clone()).unwrap_or_default();
    assert!(
        causes.iter().any(|c| c.reason.as_deref() == Some("ExitCode") && c.message.as_deref() == Some("7")),
        "{status:?}"
    );
    let _ = tokio::time::timeout(LIMIT, p.join()).await.expect("join in time");
}

async fn attach_to_shell(pods: &Api<Pod>) {
    let mut p = pods.attach("shell", &AttachParams::interactive_tty()).await.expect("attach");
    let mut stdin = p.stdin().expect("stdin");
    let mut stdout = p.stdout().expect("stdout");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + LIMIT;
    // The shell may not be reading the instant the attach starts: repeat.
    while !String::from_utf8_lossy(&seen).contains("attached-42") {
        assert!(tokio::time::Instant::now() < deadline, "attach saw {:?}", String::from_utf8_lossy(&seen));
        stdin.write_all(b"echo attached-$((6*7))\n").await.expect("write");
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), stdout.read(&mut buf)).await {
            assert!(n > 0, "attach output ended: {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    }
    p.abort();
}

/// One forward with two ports: an HTTP GET to httpd and a line to the echo server.
async fn forward_once(pods: Api<Pod>, i: usize) {
    let mut pf = pods.portforward("box", &[8080, 9090]).await.expect("portforward");
    let mut web = pf.take_stream(8080).expect("8080");
    let mut echo = pf.take_stream(9090).expect("9090");
    web.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.expect("request");
    // The WebSocket closes only when all of its ports' connections have
    // ended (as upstream's kubelet), so read the response up to its body.
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !String::from_utf8_lossy(&body).contains("hello from httpd\n") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, web.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("forward {i}: response so far {:?}", String::from_utf8_lossy(&body)))
            .expect("read");
        assert!(n > 0, "forward {i}: response ended early: {:?}", String::from_utf8_lossy(&body));
        body.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&body);
    assert!(body.starts_with("HTTP/1.") && body.contains(" 200 "), "forward {i}: {body:?}");
    let line = format!("forward {i} {}\n", "y".repeat(5000 * i));
    echo.write_all(line.as_bytes()).await.expect("echo write");
    let mut got = vec![0u8; line.len()];
    tokio::time::timeout(LIMIT, echo.read_exact(&mut got)).await.expect("echo in time").expect("echo read");
    assert_eq!(String::from_utf8_lossy(&got), line, "forward {i}");
    drop((web, echo));
    pf.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_crate_exec_attach_and_portforward() {
    let node = tokio::task::spawn_blocking(|| {
        let node = Node::start(&[]);
        node.run_stream_pods();
        node
    })
    .await
    .expect("node");
    let client = common::kube_client(&node.kubeconfig()).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    exec_streams_and_status(&pods).await;
    attach_to_shell(&pods).await;
    // Several forwards at once, each its own WebSocket.
    let forwards: Vec<_> = (0..6).map(|i| tokio::spawn(forward_once(pods.clone(), i))).collect();
    for f in forwards {
        f.await.expect("forward");
    }
    tokio::task::spawn_blocking(move || drop(node)).await.expect("stop node");
}
