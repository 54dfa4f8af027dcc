//! port-forward on the node, in its three client protocols:
//! - SPDY/3.1 (`portforward.k8s.io`): the client opens an error and a data
//!   stream per connection, paired by the `requestID` header, with the
//!   target in the `port` header;
//! - WebSocket channels (`v4.channel.k8s.io`, …): the ports come in the
//!   query, data on channel 2i and errors on 2i+1, each channel's first
//!   server message being the port as 2 little-endian bytes;
//! - SPDY tunnelled in WebSocket binary messages
//!   (`SPDY/3.1+portforward.k8s.io`, what kubectl 1.31+ tries first).
//!
//! A failed dial is reported on that request's error stream only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::netns;
use super::remotecommand::decode_channel_message;
use super::spdy::{self, Stream, StreamReader, StreamWriter};
use crate::websocket::{self, Sender};

/// The SPDY protocol name, and the WebSocket subprotocols we serve.
pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
pub const WEBSOCKET_PROTOCOLS: &[&str] =
    &[TUNNEL_PROTOCOL, "v4.channel.k8s.io", "v4.base64.channel.k8s.io", "portforward.k8s.io", ""];

/// How long the second stream of a pair may keep the client waiting (upstream's default).
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);

/// Where to forward to: the pod's network namespace, and its name and UID for messages.
#[derive(Clone, Debug)]
pub struct PortForwardTarget {
    pub netns: PathBuf,
    /// `namespace/name`, as upstream's messages name it.
    pub pod: String,
    pub uid: String,
}

impl PortForwardTarget {
    fn error_message(&self, port: impl std::fmt::Display, err: impl std::fmt::Display) -> String {
        format!("error forwarding port {port} to pod {}, uid {}: {err}", self.pod, self.uid)
    }
}

/// Serves a SPDY port-forward session until the client closes it.
pub async fn serve_spdy(session: spdy::Session, mut incoming: mpsc::Receiver<Stream>, target: Arc<PortForwardTarget>) {
    let mut pending: HashMap<String, (Option<Stream>, Option<Stream>, tokio::time::Instant)> = HashMap::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(1), incoming.recv()).await;
        let now = tokio::time::Instant::now();
        // Pairs whose other half never came: reset, as upstream does after its timeout.
        let stale: Vec<String> =
            pending.iter().filter(|(_, p)| now > p.2 + PAIR_TIMEOUT).map(|(k, _)| k.clone()).collect();
        for key in stale {
            if let Some((e, d, _)) = pending.remove(&key) {
                for s in [e, d].into_iter().flatten() {
                    let _ = s.writer.reset().await;
                }
            }
        }
        let stream = match next {
            Err(_) => continue,
            Ok(None) => break,
            Ok(Some(s)) => s,
        };
        let kind = stream.headers.get("streamtype").unwrap_or_default().to_string();
        let request_id = match stream.headers.get("requestid") {
            Some(id) => id.to_string(),
            // Clients before requestID: the data stream follows its error stream.
            None if kind == "data" => stream.id.saturating_sub(2).to_string(),
            None => stream.id.to_string(),
        };
        let entry = pending.entry(request_id.clone()).or_insert((None, None, now));
        match kind.as_str() {
            "error" => entry.0 = Some(stream),
            "data" => entry.1 = Some(stream),
            other => {
                tracing::debug!(stream_type = other, "unexpected port-forward stream; resetting it");
                let _ = stream.writer.reset().await;
                continue;
            }
        }
        let complete = pending.get(&request_id).is_some_and(|p| p.0.is_some() && p.1.is_some());
        if complete {
            if let Some((Some(error), Some(data), _)) = pending.remove(&request_id) {
                tokio::spawn(forward_pair(error, data, target.clone()));
            }
        }
    }
    session.close().await;
}

/// One connection of a SPDY port-forward: dial the port in the `port` header.
async fn forward_pair(error: Stream, data: Stream, target: Arc<PortForwardTarget>) {
    let port_text = data.headers.get("port").unwrap_or_default().to_string();
    let result = match port_text.parse::<u16>() {
        Ok(port) if port > 0 => netns::dial(&target.netns, port).await.map_err(|e| e.to_string()),
        _ => Err(format!("invalid port {port_text:?}")),
    };
    match result {
        Err(e) => {
            let msg = target.error_message(&port_text, e);
            tracing::debug!(%msg, "port-forward dial failed");
            let _ = error.writer.write(msg.as_bytes()).await;
        }
        Ok(tcp) => copy_stream(tcp, data.reader, data.writer.clone()).await,
    }
    let _ = data.writer.close().await;
    let _ = error.writer.close().await;
}

/// Copies between a pod connection and a SPDY data stream until the pod side
/// ends; the client's FIN half-closes the pod connection.
async fn copy_stream(tcp: tokio::net::TcpStream, mut from_client: StreamReader, to_client: StreamWriter) {
    let (mut rd, mut wr) = tcp.into_split();
    let upstream = async move {
        while let Some(d) = from_client.read().await {
            if wr.write_all(&d).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let upstream = tokio::spawn(upstream);
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to_client.write(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    upstream.abort();
}

/// Serves a port-forward over WebSocket channels for the `ports` asked.
pub async fn serve_websocket<IO>(io: IO, protocol: &str, ports: Vec<u16>, target: Arc<PortForwardTarget>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let base64 = protocol.contains("base64");
    let (read, write) = tokio::io::split(io);
    let sender = Sender::spawn(write);
    let channel_sender = sender.clone();
    let send = move |channel: u8, data: Vec<u8>| {
        let sender = channel_sender.clone();
        async move {
            if base64 {
                let mut text = vec![b'0' + channel];
                text.extend(base64::engine::general_purpose::STANDARD.encode(&data).into_bytes());
                sender.send(websocket::OP_TEXT, &text).await
            } else {
                let mut msg = vec![channel];
                msg.extend(data);
                sender.binary(&msg).await
            }
        }
    };
    // Each channel opens with its port.
    for (i, port) in ports.iter().enumerate() {
        let _ = send(2 * i as u8, port.to_le_bytes().to_vec()).await;
        let _ = send(2 * i as u8 + 1, port.to_le_bytes().to_vec()).await;
    }
    let mut to_pod: Vec<mpsc::Sender<Vec<u8>>> = Vec::new();
    let mut tasks = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(32);
        to_pod.push(tx);
        let target = target.clone();
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            let data_ch = 2 * i as u8;
            let tcp = match netns::dial(&target.netns, port).await {
                Ok(t) => t,
                Err(e) => {
                    let _ = send(data_ch + 1, target.error_message(port, e).into_bytes()).await;
                    return;
                }
            };
            let (mut rd, mut wr) = tcp.into_split();
            let up = tokio::spawn(async move {
                while let Some(d) = rx.recv().await {
                    if wr.write_all(&d).await.is_err() {
                        return;
                    }
                }
                let _ = wr.shutdown().await;
            });
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if send(data_ch, buf[..n].to_vec()).await.is_err() {
                            break;
                        }
                    }
                }
            }
            up.abort();
        }));
    }
    // Client messages go to the pod connections until the client closes ...
    let reader_sender = sender.clone();
    let reading = async move {
        let mut reader = websocket::FrameReader::new(read, true);
        while let Ok(Some(msg)) = websocket::next_data(&mut reader, &reader_sender).await {
            let Some((channel, data)) = decode_channel_message(msg, base64) else { continue };
            if channel % 2 == 0 && !data.is_empty() {
                if let Some(tx) = to_pod.get(usize::from(channel / 2)) {
                    let _ = tx.send(data).await;
                }
            }
        }
    };
    // ... or every pod connection has ended (upstream closes the connection then).
    let mut all_done = futures_util::future::join_all(tasks.iter_mut());
    tokio::select! {
        _ = reading => {}
        _ = &mut all_done => {}
    }
    drop(all_done);
    for t in &tasks {
        t.abort();
    }
    sender.close(websocket::CLOSE_NORMAL).await;
}

/// Why a port-forward request names no ports to forward.
#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error("{0}")]
    Query(#[from] serde_urlencoded::de::Error),
    #[error("unable to parse {0:?} as a port: must be 1-65535")]
    InvalidPort(String),
    #[error("query parameter \"port\" is required")]
    NoPort,
}

/// The ports of a WebSocket port-forward: `ports` (kubectl, kube-rs) or
/// `port` (the API server's form), repeated or comma-separated.
pub fn ports_from_query(query: Option<&str>) -> Result<Vec<u16>, PortsError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))?;
    let mut ports = Vec::new();
    for (k, v) in pairs {
        if k != "ports" && k != "port" {
            continue;
        }
        for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => ports.push(n),
                _ => return Err(PortsError::InvalidPort(p.to_string())),
            }
        }
    }
    if ports.is_empty() {
        return Err(PortsError::NoPort);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::server::streams::spdy::{Headers, Session};

    #[test]
    fn ports_come_from_either_spelling() {
        assert_eq!(ports_from_query(Some("ports=80,8080")).unwrap(), vec![80, 8080]);
        assert_eq!(ports_from_query(Some("port=80&port=81")).unwrap(), vec![80, 81]);
        assert!(ports_from_query(Some("ports=0")).is_err());
        assert!(ports_from_query(Some("ports=http")).is_err());
        assert!(ports_from_query(None).is_err());
    }

    fn target() -> Arc<PortForwardTarget> {
        Arc::new(PortForwardTarget { netns: "/proc/self/ns/net".into(), pod: "default/p".into(), uid: "u".into() })
    }

    async fn pair(client: &Session, id: &str, port: u16) -> (spdy::Stream, spdy::Stream) {
        let h = |t: &str| Headers::new().with("streamType", t).with("port", &port.to_string()).with("requestID", id);
        let e = client.open(h("error")).await.unwrap();
        let d = client.open(h("data")).await.unwrap();
        (e, d)
    }

    /// Our own namespace stands in for the pod's: an echo server on
    /// loopback, and a closed port whose error leaves the other pair working.
    #[tokio::test]
    async fn spdy_pairs_forward_and_a_failed_dial_stays_on_its_error_stream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = c.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let (a, b) = tokio::io::duplex(1 << 16);
        let (client, _none) = Session::client(a);
        let (server, incoming) = Session::server(b);
        tokio::spawn(serve_spdy(server, incoming, target()));

        let (mut bad_err, _bad_data) = pair(&client, "0", closed_port).await;
        let (_ok_err, mut ok_data) = pair(&client, "1", port).await;
        let msg = String::from_utf8(bad_err.reader.read().await.unwrap()).unwrap();
        assert!(
            msg.starts_with(&format!("error forwarding port {closed_port} to pod default/p, uid u: failed to connect")),
            "{msg}"
        );
        ok_data.writer.write(b"ping").await.unwrap();
        assert_eq!(ok_data.reader.read().await.unwrap(), b"ping");
        ok_data.writer.close().await.unwrap();
        assert_eq!(ok_data.reader.read().await, None, "the pod side closed after our FIN");
    }
}
