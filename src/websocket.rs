//! WebSocket (RFC 6455), the server side that the kubelet API and the API
//! server both speak (a ground module: upstream keeps it in apimachinery's
//! `wsstream`): the opening handshake (Sec-WebSocket-Accept, subprotocol
//! choice), the frame codec with fragmentation, ping/pong and close, a
//! sender that several tasks share, a byte-stream view of binary messages
//! (for SPDY tunnelled in WebSocket), and a one-way stream of a body as
//! messages (upstream's `wsstream.Reader`, for `pods/log`). Frames we send
//! are unmasked, as a server's must be; frames we read must be masked, as
//! a client's must be.

use axum::http::{header, HeaderMap, HeaderValue};
use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest message we accept (kubectl sends stdin in 32 KiB pieces).
pub const MAX_MESSAGE: usize = 16 << 20;

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

pub const CLOSE_NORMAL: u16 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum WebSocketError {
    #[error("websocket: {0}")]
    Io(#[from] std::io::Error),
    #[error("websocket protocol error: {0}")]
    Protocol(&'static str),
    #[error("websocket message larger than {MAX_MESSAGE} bytes")]
    TooLarge,
    #[error("the websocket connection is closed")]
    Closed,
}

/// `Connection: Upgrade` and `Upgrade: websocket` (upstream's IsWebSocketRequest).
pub fn is_websocket_request(headers: &HeaderMap) -> bool {
    header_has_token(headers, "connection", "upgrade")
        && headers
            .get("upgrade")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether a comma-separated header holds `token` (case-insensitive).
pub fn header_has_token(headers: &HeaderMap, name: &str, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Whether the opening handshake is one we answer (version 13, a key);
/// the reason when not.
pub fn check_handshake(headers: &HeaderMap) -> Result<(), &'static str> {
    let version_ok =
        headers.get("sec-websocket-version").and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() == "13");
    let key_ok = headers.get("sec-websocket-key").and_then(|v| v.to_str().ok()).is_some_and(|v| !v.trim().is_empty());
    if version_ok && key_ok {
        Ok(())
    } else {
        Err("bad websocket handshake: Sec-WebSocket-Version 13 and a key are required")
    }
}

/// The headers of the 101 answer to a handshake whose `request` headers
/// these are, with the subprotocol chosen ("" for none).
pub fn accept_headers(request: &HeaderMap, protocol: &str, answer: &mut HeaderMap) {
    answer.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    answer.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let key = request.get("sec-websocket-key").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if let Ok(v) = HeaderValue::from_str(&accept_key(key)) {
        answer.insert("sec-websocket-accept", v);
    }
    if let Ok(v) = HeaderValue::from_str(protocol) {
        if !protocol.is_empty() {
            answer.insert("sec-websocket-protocol", v);
        }
    }
}

/// The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key.
pub fn accept_key(key: &str) -> String {
    let digest =
        ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, format!("{}{GUID}", key.trim()).as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// The subprotocols the client offers, in its order of preference.
pub fn offered_protocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The first offered protocol we support (the client's preference wins, as
/// in upstream's wsstream handshake); "" stands for "no subprotocol", chosen
/// when the client offers none and "" is supported.
pub fn select_protocol(offered: &[String], supported: &[&str]) -> Option<String> {
    if offered.is_empty() {
        return supported.contains(&"").then(String::new);
    }
    offered.iter().find(|p| supported.contains(&p.as_str())).cloned()
}

/// One frame's wire form (mask only for a client's frames).
pub fn encode_frame(opcode: u8, fin: bool, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(if fin { 0x80 } else { 0 } | opcode);
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// A whole message (fragments joined), or a control frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
}

/// Reads frames from a byte stream and joins fragmented messages.
pub struct FrameReader<R> {
    read: R,
    expect_masked: bool,
    partial: Option<(u8, Vec<u8>)>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// `expect_masked`: true on the server side (client frames are masked).
    pub fn new(read: R, expect_masked: bool) -> Self {
        FrameReader { read, expect_masked, partial: None }
    }

    /// The next message; `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<Message>, WebSocketError> {
        loop {
            let mut head = [0u8; 2];
            match self.read.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let fin = head[0] & 0x80 != 0;
            if head[0] & 0x70 != 0 {
                return Err(WebSocketError::Protocol("reserved bits set"));
            }
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            if masked != self.expect_masked {
                return Err(WebSocketError::Protocol("wrong masking"));
            }
            let len = match head[1] & 0x7f {
                126 => u64::from(self.read.read_u16().await?),
                127 => self.read.read_u64().await?,
                n => u64::from(n),
            };
            if len > MAX_MESSAGE as u64 {
                return Err(WebSocketError::TooLarge);
            }
            let mut key = [0u8; 4];
            if masked {
                self.read.read_exact(&mut key).await?;
            }
            let mut payload = vec![0u8; len as usize];
            self.read.read_exact(&mut payload).await?;
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= key[i % 4];
                }
            }
            if opcode >= 0x8 {
                if !fin || payload.len() > 125 {
                    return Err(WebSocketError::Protocol("bad control frame"));
                }
                return Ok(Some(match opcode {
                    OP_CLOSE => Message::Close(payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]))),
                    OP_PING => Message::Ping(payload),
                    OP_PONG => Message::Pong(payload),
                    _ => return Err(WebSocketError::Protocol("unknown control opcode")),
                }));
            }
            let (op, mut data) = match (opcode, self.partial.take()) {
                (OP_CONTINUATION, Some((op, mut data))) => {
                    data.extend_from_slice(&payload);
                    (op, data)
                }
                (OP_CONTINUATION, None) => return Err(WebSocketError::Protocol("continuation without a start")),
                (OP_TEXT | OP_BINARY, None) => (opcode, payload),
                (OP_TEXT | OP_BINARY, Some(_)) => {
                    return Err(WebSocketError::Protocol("new message inside a fragmented one"))
                }
                _ => return Err(WebSocketError::Protocol("unknown opcode")),
            };
            if data.len() > MAX_MESSAGE {
                return Err(WebSocketError::TooLarge);
            }
            if !fin {
                self.partial = Some((op, std::mem::take(&mut data)));
                continue;
            }
            return Ok(Some(if op == OP_TEXT { Message::Text(data) } else { Message::Binary(data) }));
        }
    }
}

enum Outgoing {
    Frame(Vec<u8>),
    Close(u16, oneshot::Sender<()>),
}

/// Sends frames on a connection; clones share it, frames keep their order.
#[derive(Clone)]
pub struct Sender {
    tx: mpsc::Sender<Outgoing>,
}

impl Sender {
    /// Starts the task that owns the write half.
    pub fn spawn<W: AsyncWrite + Send + 'static>(write: W) -> Sender {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(64);
        tokio::spawn(async move {
            let mut write = std::pin::pin!(write);
            while let Some(out) = rx.recv().await {
                match out {
                    Outgoing::Frame(bytes) => {
                        if write.write_all(&bytes).await.is_err() {
                            return;
                        }
                        if rx.is_empty() && write.flush().await.is_err() {
                            return;
                        }
                    }
                    Outgoing::Close(code, ack) => {
                        let _ = write.write_all(&encode_frame(OP_CLOSE, true, &code.to_be_bytes(), None)).await;
                        let _ = write.flush().await;
                        let _ = write.shutdown().await;
                        let _ = ack.send(());
                        return;
                    }
                }
            }
            let _ = write.shutdown().await;
        });
        Sender { tx }
    }

    pub async fn send(&self, opcode: u8, payload: &[u8]) -> Result<(), WebSocketError> {
        let frame = encode_frame(opcode, true, payload, None);
        self.tx.send(Outgoing::Frame(frame)).await.map_err(|_| WebSocketError::Closed)
    }

    pub async fn binary(&self, payload: &[u8]) -> Result<(), WebSocketError> {
        self.send(OP_BINARY, payload).await
    }

    /// Sends a close frame after everything queued, then ends the connection.
    pub async fn close(&self, code: u16) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Outgoing::Close(code, ack)).await.is_ok() {
            let _ = done.await;
        }
    }
}

/// Reads data messages, answering pings; `None` at close or end of stream.
pub async fn next_data<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    sender: &Sender,
) -> Result<Option<Message>, WebSocketError> {
    loop {
        match reader.next().await? {
            Some(Message::Ping(p)) => sender.send(OP_PONG, &p).await?,
            Some(Message::Pong(_)) => {}
            Some(Message::Close(_)) | None => return Ok(None),
            Some(m) => return Ok(Some(m)),
        }
    }
}

/// A byte stream over binary messages: what is written to the returned end
/// goes out as binary messages, and binary messages read come out of it.
/// Used for SPDY tunnelled in WebSocket (`SPDY/3.1+portforward.k8s.io`).
pub fn tunnel<IO>(io: IO) -> tokio::io::DuplexStream
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (read, write) = tokio::io::split(io);
    let sender = Sender::spawn(write);
    let (mut from_tunnel, mut into_tunnel) = tokio::io::split(ours);
    let inbound_sender = sender.clone();
    tokio::spawn(async move {
        let mut reader = FrameReader::new(read, true);
        while let Ok(Some(msg)) = next_data(&mut reader, &inbound_sender).await {
            if let Message::Binary(data) | Message::Text(data) = msg {
                if into_tunnel.write_all(&data).await.is_err() {
                    break;
                }
            }
        }
        let _ = into_tunnel.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from_tunnel.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sender.binary(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        sender.close(CLOSE_NORMAL).await;
    });
    theirs
}

/// The subprotocols of a one-way stream (upstream's
/// `NewDefaultReaderProtocols`): "" and `binary.k8s.io` send binary
/// messages, `base64.binary.k8s.io` base64 text ones.
pub const READER_PROTOCOLS: &[&str] = &["", "binary.k8s.io", BASE64_BINARY];
/// The reader subprotocol of base64 text messages.
pub const BASE64_BINARY: &str = "base64.binary.k8s.io";

/// Sends `body` on the connection `io` as messages (binary, or base64
/// text), an empty one first, and closes it at the body's end (upstream's
/// `wsstream.Reader`). What the client sends is read and dropped (its pings
/// answered); its close, or a connection gone, ends the copy.
pub async fn send_stream<IO>(io: IO, body: axum::body::Body, base64_text: bool)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    use futures_util::StreamExt;
    let (read, write) = tokio::io::split(io);
    let sender = Sender::spawn(write);
    let (opcode, encode): (u8, fn(&[u8]) -> Vec<u8>) = if base64_text {
        (OP_TEXT, |b| base64::engine::general_purpose::STANDARD.encode(b).into_bytes())
    } else {
        (OP_BINARY, |b| b.to_vec())
    };
    let receiving = sender.clone();
    let mut client_gone = std::pin::pin!(async move {
        let mut reader = FrameReader::new(read, true);
        while let Ok(Some(_)) = next_data(&mut reader, &receiving).await {}
    });
    let mut chunks = body.into_data_stream();
    if sender.send(opcode, &[]).await.is_err() {
        return;
    }
    loop {
        let chunk = tokio::select! {
            chunk = chunks.next() => chunk,
            _ = &mut client_gone => break,
        };
        match chunk {
            Some(Ok(bytes)) if bytes.is_empty() => {}
            Some(Ok(bytes)) => {
                if sender.send(opcode, &encode(&bytes)).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "the streamed body failed");
                break;
            }
            None => break,
        }
    }
    sender.close(CLOSE_NORMAL).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_matches_rfc_6455_example() {
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn the_clients_preference_wins() {
        let offered = vec!["v5.channel.k8s.io".to_string(), "v4.channel.k8s.io".to_string()];
        assert_eq!(
            select_protocol(&offered, &["v4.channel.k8s.io", "v5.channel.k8s.io"]).as_deref(),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(select_protocol(&offered, &["channel.k8s.io"]), None);
        assert_eq!(select_protocol(&[], &["", "channel.k8s.io"]).as_deref(), Some(""));
        assert_eq!(select_protocol(&[], &["channel.k8s.io"]), None);
        let mut h = HeaderMap::new();
        h.append("sec-websocket-protocol", "a, b".parse().unwrap());
        h.append("sec-websocket-protocol", "c".parse().unwrap());
        h.append("connection", "keep-alive, Upgrade".parse().unwrap());
        h.append("upgrade", "WebSocket".parse().unwrap());
        assert_eq!(offered_protocols(&h), ["a", "b", "c"]);
        assert!(is_websocket_request(&h));
    }

    #[tokio::test]
    async fn reads_masked_fragmented_messages_with_control_frames_between() {
        let key = Some([1, 2, 3, 4]);
        let mut wire = encode_frame(OP_BINARY, false, b"\x01hel", key);
        wire.extend(encode_frame(OP_PING, true, b"p", key));
        wire.extend(encode_frame(OP_CONTINUATION, true, b"lo", key));
        wire.extend(encode_frame(OP_TEXT, true, &vec![b'x'; 70_000], key));
        wire.extend(encode_frame(OP_CLOSE, true, &1000u16.to_be_bytes(), key));
        let mut r = FrameReader::new(&wire[..], true);
        assert_eq!(r.next().await.unwrap(), Some(Message::Ping(b"p".to_vec())));
        assert_eq!(r.next().await.unwrap(), Some(Message::Binary(b"\x01hello".to_vec())));
        assert_eq!(r.next().await.unwrap(), Some(Message::Text(vec![b'x'; 70_000])));
        assert_eq!(r.next().await.unwrap(), Some(Message::Close(Some(1000))));
        assert_eq!(r.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn unmasked_client_frames_are_refused() {
        let wire = encode_frame(OP_BINARY, true, b"x", None);
        assert!(FrameReader::new(&wire[..], true).next().await.is_err());
    }

    #[tokio::test]
    async fn a_stream_is_sent_as_messages_then_closed() {
        for (base64_text, want) in
            [(false, (OP_BINARY, b"log line\n".to_vec())), (true, (OP_TEXT, b"bG9nIGxpbmUK".to_vec()))]
        {
            let (client, server) = tokio::io::duplex(1 << 16);
            tokio::spawn(send_stream(server, axum::body::Body::from("log line\n"), base64_text));
            let mut r = FrameReader::new(client, false);
            let empty = if base64_text { Message::Text(Vec::new()) } else { Message::Binary(Vec::new()) };
            assert_eq!(r.next().await.unwrap(), Some(empty));
            let got = match r.next().await.unwrap() {
                Some(Message::Binary(b)) => (OP_BINARY, b),
                Some(Message::Text(t)) => (OP_TEXT, t),
                other => panic!("{other:?}"),
            };
            assert_eq!(got, want);
            assert_eq!(r.next().await.unwrap(), Some(Message::Close(Some(CLOSE_NORMAL))));
        }
    }

    #[tokio::test]
    async fn tunnel_carries_bytes_both_ways() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut stream = tunnel(server);
        let (cr, mut cw) = tokio::io::split(client);
        cw.write_all(&encode_frame(OP_BINARY, true, b"abc", Some([9, 9, 9, 9]))).await.unwrap();
        let mut got = [0u8; 3];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abc");
        stream.write_all(b"xyz").await.unwrap();
        let mut r = FrameReader::new(cr, false);
        assert_eq!(r.next().await.unwrap(), Some(Message::Binary(b"xyz".to_vec())));
    }
}
