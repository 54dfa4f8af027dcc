//! `pods/log` asked for as a WebSocket, as upstream serves it (and as the
//! conformance suite reads it): 101 with the subprotocol chosen from ""
//! (binary), `binary.k8s.io` (binary messages) and `base64.binary.k8s.io`
//! (base64 text messages), the log sent, the socket closed at its end (or,
//! with follow=true, when the container exits). The client is written
//! here over the `kube` client's connection, so nothing of ferrok's own
//! WebSocket code reads what it sends. Needs root and what `scripts/deps`
//! installs.

mod common;

use std::time::Duration;

use base64::Engine;
use common::node::{Node, BUSYBOX};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt};

const LIMIT: Duration = Duration::from_secs(30);

/// One message as a client reads it: opcode and payload (fragments
/// joined); None at a close frame or the end of the connection.
async fn read_message(io: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
    let mut message: Option<(u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 2];
        io.read_exact(&mut head).await.ok()?;
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
        assert_eq!(head[1] & 0x80, 0, "a server's frames are not masked");
        let len = match head[1] & 0x7f {
            126 => u64::from(io.read_u16().await.ok()?),
            127 => io.read_u64().await.ok()?,
            n => u64::from(n),
        };
        let mut payload = vec![0u8; len as usize];
        io.read_exact(&mut payload).await.ok()?;
        match opcode {
            0x8 => return None,
            0x9 | 0xA => continue,
            0x0 => message.as_mut().expect("a continuation after a first frame").1.extend(payload),
            op => message = Some((op, payload)),
        }
        if fin {
            return message;
        }
    }
}

/// What the answer to a WebSocket request for `path` was: its status and
/// subprotocol, and for a 101 every message until the server closed.
async fn open(client: &kube::Client, path: &str, protocols: &[&str]) -> (u16, Option<String>, Vec<(u8, Vec<u8>)>) {
    let mut req = axum::http::Request::builder()
        .method("GET")
        .uri(path)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
    if !protocols.is_empty() {
        req = req.header("Sec-WebSocket-Protocol", protocols.join(", "));
    }
    let req = req.body(kube::client::Body::empty()).expect("request");
    let resp = client.send(req).await.expect("send");
    let code = resp.status().as_u16();
    let protocol = resp.headers().get("sec-websocket-protocol").map(|v| v.to_str().expect("protocol").to_string());
    if code != 101 {
        return (code, protocol, Vec::new());
    }
    let accept = resp.headers().get("sec-websocket-accept").map(|v| v.to_str().expect("accept").to_string());
    assert_eq!(accept.as_deref(), Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "RFC 6455's accept key");
    let upgraded = hyper::upgrade::on(resp).await.expect("upgraded");
    let mut io = TokioIo::new(upgraded);
    let mut messages = Vec::new();
    let read_all = async {
        while let Some(m) = read_message(&mut io).await {
            messages.push(m);
        }
    };
    tokio::time::timeout(LIMIT, read_all).await.expect("the server closes the socket");
    (code, protocol, messages)
}

fn joined(messages: &[(u8, Vec<u8>)], opcode: u8) -> String {
    let mut out = Vec::new();
    for (op, data) in messages {
        assert_eq!(*op, opcode, "message kind");
        out.extend_from_slice(data);
    }
    String::from_utf8(out).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_logs_stream_over_websocket_as_upstream_serves_them() {
    let node = tokio::task::spawn_blocking(|| {
        // About logs, not eviction: a host disk more than 90 % full
        // (shared build machines) must not taint the node.
        let node = Node::start(&[
            "--kubelet-arg",
            "eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
        ]);
        node.apply(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: alive, namespace: default}}
spec:
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["/bin/sh", "-c", "echo container is alive; sleep 600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: brief, namespace: default}}
spec:
  restartPolicy: Never
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["/bin/sh", "-c", "echo first; sleep 8; echo last"]}}
"#
        ));
        node.eventually("alive logged", 90, || node.kubectl(&["logs", "alive"]).1 == "container is alive\n");
        node.eventually("brief runs", 90, || node.kubectl(&["logs", "brief"]).1 == "first\n");
        node
    })
    .await
    .expect("node");
    let client = common::kube_client(&node.kubeconfig()).await;
    let log = "/api/v1/namespaces/default/pods/alive/log?container=main";

    // binary.k8s.io (what the conformance suite asks for): binary
    // messages, the first an empty one, then the log, then a close.
    let (code, protocol, messages) = open(&client, log, &["binary.k8s.io"]).await;
    assert_eq!((code, protocol.as_deref()), (101, Some("binary.k8s.io")));
    assert_eq!(joined(&messages, 0x2), "container is alive\n");
    assert!(messages.first().is_some_and(|(_, m)| m.is_empty()), "{messages:?}");

    // base64.binary.k8s.io: text messages of base64.
    let (code, protocol, messages) = open(&client, log, &["base64.binary.k8s.io"]).await;
    assert_eq!((code, protocol.as_deref()), (101, Some("base64.binary.k8s.io")));
    let decoded: Vec<u8> = messages
        .iter()
        .flat_map(|(op, m)| {
            assert_eq!(*op, 0x1, "text messages");
            base64::engine::general_purpose::STANDARD.decode(m).expect("base64")
        })
        .collect();
    assert_eq!(String::from_utf8_lossy(&decoded), "container is alive\n");

    // No subprotocol offered: binary, none named in the answer; the
    // client's first supported choice wins.
    let (code, protocol, messages) = open(&client, log, &[]).await;
    assert_eq!((code, protocol), (101, None));
    assert_eq!(joined(&messages, 0x2), "container is alive\n");
    let (code, protocol, _) = open(&client, log, &["v4.channel.k8s.io", "base64.binary.k8s.io", "binary.k8s.io"]).await;
    assert_eq!((code, protocol.as_deref()), (101, Some("base64.binary.k8s.io")));
    let (code, _, _) = open(&client, log, &["v4.channel.k8s.io"]).await;
    assert_eq!(code, 403, "no subprotocol in common");

    // An error before the stream is an HTTP answer, not a socket.
    let (code, _, _) =
        open(&client, "/api/v1/namespaces/default/pods/alive/log?container=nope", &["binary.k8s.io"]).await;
    assert_eq!(code, 400);

    // follow=true: the socket stays open while the container runs and
    // closes once it has exited, with every line.
    let started = std::time::Instant::now();
    let follow = "/api/v1/namespaces/default/pods/brief/log?follow=true";
    let (code, _, messages) = open(&client, follow, &["binary.k8s.io"]).await;
    assert_eq!(code, 101);
    assert_eq!(joined(&messages, 0x2), "first\nlast\n");
    assert!(started.elapsed() >= Duration::from_secs(1), "closed before the container ended");

    tokio::task::spawn_blocking(move || drop(node)).await.expect("stop node");
}
