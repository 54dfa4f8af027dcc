//! kubectl exec, attach and port-forward through ferrok, end to end: the
//! API server passes the upgrade through to the node's kubelet API, which
//! serves SPDY/3.1 (kubectl 1.27) or WebSocket (kubectl 1.33: v5 channels
//! for exec and attach, SPDY tunnelled in WebSocket for port-forward) and
//! bridges to containerd's streaming server. Needs root and what
//! `scripts/deps` installs.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::node::Node;
use sha2::{Digest, Sha256};

/// `kubectl.1.NN` beside the file `kubectl` links to.
fn kubectl_version(minor: u32) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    let kubectl =
        path.split(':').map(|d| PathBuf::from(d).join("kubectl")).find(|p| p.exists()).expect("kubectl on PATH");
    let real = std::fs::canonicalize(kubectl).expect("kubectl");
    real.parent().expect("folder").join(format!("kubectl.1.{minor}")).to_string_lossy().into_owned()
}

fn kubectl(node: &Node, bin: &str) -> Command {
    let mut c = Command::new(bin);
    c.env("KUBECONFIG", node.kubeconfig()).env("HOME", node.dir.path());
    c
}

/// Runs kubectl with `input` on stdin: exit code, stdout, stderr.
fn run(node: &Node, bin: &str, args: &[&str], input: &[u8]) -> (i32, Vec<u8>, String) {
    let mut child = kubectl(node, bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("kubectl ends");
    let _ = writer.join();
    (out.status.code().unwrap_or(-1), out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Collects a child's stdout (and stderr) as it comes.
fn collect(child: &mut Child) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    seen
}

fn exec_suite(node: &Node, bin: &str) {
    let label = bin.rsplit('/').next().unwrap_or(bin);
    // Output.
    let (code, out, err) = run(node, bin, &["exec", "box", "--", "sh", "-c", "echo out; echo err >&2"], b"");
    assert_eq!((code, String::from_utf8_lossy(&out).as_ref()), (0, "out\n"), "{label}: {err}");
    assert!(err.contains("err"), "{label}: stderr {err:?}");
    // Exit code.
    let (code, _, err) = run(node, bin, &["exec", "box", "--", "sh", "-c", "exit 7"], b"");
    assert_eq!(code, 7, "{label}: {err}");
    // stdin EOF ends cat.
    let (code, out, err) = run(node, bin, &["exec", "-i", "box", "--", "cat"], b"hi\n");
    assert_eq!((code, String::from_utf8_lossy(&out).as_ref()), (0, "hi\n"), "{label}: {err}");
    // 10 MiB each way, as kubectl cp moves files (a tar stream over exec).
    let data: Vec<u8> = {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..10 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    // (Not `sh -c 'cat > /tmp/in'`: busybox sh execs its last command, so the
    // process then holds no exec stdout, and containerd's CRI exec IO closes
    // stdin as soon as stdout ends (pkg/cri/io/exec_io.go, attachOutput), with
    // most of the upload unread. The first `cat` keeps stdout open. Upstream's
    // kubelet proxies to the same containerd code, so it behaves alike;
    // `kubectl cp` runs tar with stdout open and is not affected: tests/cp.rs.)
    let (code, _, err) = run(node, bin, &["exec", "-i", "box", "--", "sh", "-c", "cat | cat > /tmp/in"], &data);
    assert_eq!(code, 0, "{label}: {err}");
    let (code, sum, err) = run(node, bin, &["exec", "box", "--", "busybox", "sha256sum", "/tmp/in"], b"");
    assert_eq!(code, 0, "{label}: {err}");
    if !String::from_utf8_lossy(&sum).starts_with(&sha(&data)) {
        let (_, size, _) = run(
            node,
            bin,
            &["exec", "box", "--", "sh", "-c", "wc -c < /tmp/in; head -c 16 /tmp/in | od -An -tx1"],
            b"",
        );
        let log: Vec<String> = node
            .log()
            .lines()
            .filter(|l| l.contains("stream") || l.contains("websocket") || l.contains("exec"))
            .map(String::from)
            .collect();
        let cd = std::fs::read_to_string(node.dir.path().join("agent/containerd/containerd.log")).unwrap_or_default();
        let cd: Vec<&str> = cd.lines().filter(|l| l.contains("xec") || l.contains("tream")).collect();
        panic!(
            "{label}: upload corrupted: {} (want {} bytes)\n{}\n--- containerd ---\n{}",
            String::from_utf8_lossy(&size),
            data.len(),
            log.join("\n"),
            cd[cd.len().saturating_sub(30)..].join("\n")
        );
    }
    let (code, back, err) = run(node, bin, &["exec", "box", "--", "cat", "/tmp/in"], b"");
    assert_eq!(code, 0, "{label}: {err}");
    assert_eq!(back.len(), data.len(), "{label}: download length");
    assert_eq!(sha(&back), sha(&data), "{label}: download corrupted");
    // A terminal: script gives kubectl a pty of a known size, which reaches
    // the process through the resize stream (polled for inside the pod).
    let cmd = format!(
        "stty rows 33 cols 101; KUBECONFIG={} HOME={} {bin} exec -it box -- sh -c 'for i in $(seq 50); do s=$(busybox stty size); [ \"$s\" = \"33 101\" ] && break; usleep 100000; done; echo size=$s'",
        node.kubeconfig().display(),
        node.dir.path().display()
    );
    let mut script = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script");
    // Keep the terminal's input open until kubectl is done (EOF would close the process' stdin).
    let keep_open = script.stdin.take();
    let out = script.wait_with_output().expect("script ends");
    drop(keep_open);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("size=33 101"), "{label}: exec -it saw {text:?} {}", String::from_utf8_lossy(&out.stderr));
    // Attach to a container started with stdin and a TTY.
    let mut child = kubectl(node, bin)
        .args(["attach", "-i", "shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl attach");
    let seen = collect(&mut child);
    let mut stdin = child.stdin.take().expect("stdin");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The shell may not be listening the instant the attach starts: repeat.
        let _ = stdin.write_all(b"echo attached-$((6*7))\n");
        let _ = stdin.flush();
        std::thread::sleep(Duration::from_millis(300));
        if seen.lock().unwrap().contains("attached-42") {
            break;
        }
        assert!(Instant::now() < deadline, "{label}: attach saw {:?}", seen.lock().unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn port_forward_suite(node: &Node, bin: &str) {
    let label = bin.rsplit('/').next().unwrap_or(bin);
    let (web, echo, closed) = (common::free_port(), common::free_port(), common::free_port());
    let mut child = kubectl(node, bin)
        .args(["port-forward", "pod/box", &format!("{web}:8080"), &format!("{echo}:9090"), &format!("{closed}:7777")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let seen = collect(&mut child);
    common::eventually(&format!("{label} port-forward listening"), || {
        seen.lock().unwrap().matches("Forwarding from").count() >= 3
    });
    let get = |port: u16| -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body
    };
    assert!(get(web).contains("hello from httpd"), "{label}: {}", seen.lock().unwrap());
    // 20 connections at once to an echo server, each with its own data.
    let workers: Vec<_> = (0..20)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", echo)).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let line = format!("connection {i} {}\n", "x".repeat(1000 * i));
                s.write_all(line.as_bytes()).unwrap();
                let mut r = BufReader::new(s);
                let mut got = String::new();
                r.read_line(&mut got).unwrap();
                assert_eq!(got, line, "connection {i}");
            })
        })
        .collect();
    for w in workers {
        w.join().expect("echo connection");
    }
    // A closed port: that connection fails and the error is reported ...
    let mut s = std::net::TcpStream::connect(("127.0.0.1", closed)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut nothing = Vec::new();
    let _ = s.read_to_end(&mut nothing);
    assert!(nothing.is_empty());
    common::eventually(&format!("{label} reports the failed dial"), || {
        seen.lock().unwrap().contains("error forwarding port 7777")
    });
    // Only that request failed on the node (the unit test
    // `spdy_pairs_forward_and_a_failed_dial_stays_on_its_error_stream` shows the
    // other streams carry on); client-go itself ends the whole forward on a
    // stream error ("lost connection to pod"), so kubectl is not asked again.
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn kubectl_exec_attach_and_port_forward_old_and_new() {
    let node = Node::start(&[]);
    node.run_stream_pods();
    for minor in [33, 27] {
        let bin = kubectl_version(minor);
        exec_suite(&node, &bin);
        port_forward_suite(&node, &bin);
    }
    // Each protocol was really spoken: WebSocket v5 channels and SPDY tunnelled
    // in WebSocket (kubectl 1.33), plain SPDY/3.1 (kubectl 1.27).
    let log = node.log();
    for protocol in [
        r#"protocol=WebSocket("v5.channel.k8s.io")"#,
        r#"protocol=WebSocket("SPDY/3.1+portforward.k8s.io")"#,
        r#"protocol=Spdy("v4.channel.k8s.io")"#,
        r#"protocol=Spdy("portforward.k8s.io")"#,
    ] {
        let seen: Vec<&str> = log.lines().filter(|l| l.contains("upgrade")).collect();
        assert!(log.contains(protocol), "no {protocol} in the node log: {seen:?}");
    }
}
