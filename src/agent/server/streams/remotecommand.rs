//! The remotecommand protocol of exec and attach, on the client's side of
//! the node: the options in the query, the protocol negotiation (SPDY's
//! `X-Stream-Protocol-Version` or WebSocket subprotocols, as upstream's
//! kubelet), the streams or channels a client opens, and the error-stream
//! status in the form each protocol version expects.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};

use super::spdy::{self, StreamWriter};
use crate::websocket::{self, Message, Sender};

pub const V4: &str = "v4.channel.k8s.io";
pub const V3: &str = "v3.channel.k8s.io";
pub const V2: &str = "v2.channel.k8s.io";
pub const V1: &str = "channel.k8s.io";

/// SPDY protocol versions the kubelet accepts (upstream's order).
pub const SPDY_PROTOCOLS: &[&str] = &[V4, V3, V2, V1];

/// WebSocket subprotocols of remotecommand (upstream's list; "" is a client
/// that names none, served as `channel.k8s.io`).
pub const WEBSOCKET_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
    "",
];

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: a client's message on this channel half-closes the channel it names.
pub const CLOSE: u8 = 255;

/// How long a SPDY client has to open all its streams (upstream's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// What an exec or attach asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStreams,
    #[error("invalid query: {0}")]
    Query(String),
}

fn flag(q: &HashMap<String, Vec<String>>, names: &[&str]) -> bool {
    names.iter().any(|n| q.get(*n).and_then(|v| v.first()).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")))
}

impl Options {
    /// From the query: `command` (repeated), `stdin`/`input`, `stdout`/`output`,
    /// `stderr`/`error`, `tty` — "1" as the API server sends them, or "true" as
    /// kubectl does. A TTY merges stderr into stdout, so stderr is dropped (as upstream).
    pub fn from_query(query: Option<&str>) -> Result<Options, OptionsError> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or("")).map_err(|e| OptionsError::Query(e.to_string()))?;
        let mut q: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in pairs {
            q.entry(k).or_default().push(v);
        }
        let tty = flag(&q, &["tty"]);
        let opts = Options {
            command: q.remove("command").unwrap_or_default(),
            stdin: flag(&q, &["stdin", "input"]),
            stdout: flag(&q, &["stdout", "output"]),
            stderr: flag(&q, &["stderr", "error"]) && !tty,
            tty,
        };
        if !opts.stdin && !opts.stdout && !opts.stderr {
            return Err(OptionsError::NoStreams);
        }
        Ok(opts)
    }
}

/// The status the runtime reported on its (v4) error stream, as the
/// client's protocol wants it: the Status JSON for v4 and v5, the message
/// text (nothing on success) before v4.
pub fn status_for_client(runtime_status: &[u8], json_status: bool) -> Vec<u8> {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(runtime_status).ok();
    let success = runtime_status.is_empty()
        || parsed.as_ref().and_then(|s| s.get("status")).and_then(|s| s.as_str()) == Some("Success");
    if json_status {
        if runtime_status.is_empty() {
            return serde_json::to_vec(&success_status()).unwrap_or_default();
        }
        return match parsed {
            Some(_) => runtime_status.to_vec(),
            // Plain text from an older runtime: wrap it.
            None => serde_json::to_vec(&failure_status(&String::from_utf8_lossy(runtime_status))).unwrap_or_default(),
        };
    }
    if success {
        return Vec::new();
    }
    match parsed.as_ref().and_then(|s| s.get("message")).and_then(|m| m.as_str()) {
        Some(m) => m.as_bytes().to_vec(),
        None => runtime_status.to_vec(),
    }
}

pub fn success_status() -> serde_json::Value {
    json!({"metadata": {}, "status": "Success"})
}

pub fn failure_status(message: &str) -> serde_json::Value {
    json!({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500})
}

/// The client's end of an exec or attach, whichever protocol it speaks.
pub struct ClientStreams {
    pub stdin: Option<mpsc::Receiver<Vec<u8>>>,
    pub resize: Option<mpsc::Receiver<Vec<u8>>>,
    pub output: ClientOutput,
}

pub enum ClientOutput {
    Spdy {
        session: spdy::Session,
        stdout: Option<StreamWriter>,
        stderr: Option<StreamWriter>,
        error: StreamWriter,
        json_status: bool,
    },
    WebSocket {
        sender: Sender,
        base64: bool,
        json_status: bool,
        gone: watch::Receiver<bool>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Spdy(#[from] spdy::SessionError),
    #[error(transparent)]
    WebSocket(#[from] websocket::WebSocketError),
    #[error("timed out waiting for the client's streams")]
    StreamTimeout,
    #[error("the client went away")]
    Gone,
}

impl ClientOutput {
    async fn channel(&self, channel: u8, data: &[u8]) -> Result<(), ClientError> {
        match self {
            ClientOutput::Spdy { stdout, stderr, error, .. } => {
                let w = match channel {
                    STDOUT => stdout.as_ref(),
                    STDERR => stderr.as_ref(),
                    _ => Some(error),
                };
                if let Some(w) = w {
                    w.write(data).await?;
                }
            }
            ClientOutput::WebSocket { sender, base64, .. } => {
                if *base64 {
                    let mut text = vec![b'0' + channel];
                    text.extend(base64::engine::general_purpose::STANDARD.encode(data).into_bytes());
                    sender.send(websocket::OP_TEXT, &text).await?;
                } else {
                    let mut msg = Vec::with_capacity(data.len() + 1);
                    msg.push(channel);
                    msg.extend_from_slice(data);
                    sender.binary(&msg).await?;
                }
            }
        }
        Ok(())
    }

    pub async fn stdout(&self, data: &[u8]) -> Result<(), ClientError> {
        self.channel(STDOUT, data).await
    }

    pub async fn stderr(&self, data: &[u8]) -> Result<(), ClientError> {
        self.channel(STDERR, data).await
    }

    /// Writes the final status (the runtime's v4 Status JSON, translated)
    /// and ends the connection.
    pub async fn finish(self, runtime_status: &[u8]) {
        let json_status = match &self {
            ClientOutput::Spdy { json_status, .. } | ClientOutput::WebSocket { json_status, .. } => *json_status,
        };
        let status = status_for_client(runtime_status, json_status);
        if !status.is_empty() {
            let _ = self.channel(ERROR, &status).await;
        }
        match self {
            ClientOutput::Spdy { session, stdout, stderr, error, .. } => {
                for w in [stdout.as_ref(), stderr.as_ref(), Some(&error)].into_iter().flatten() {
                    let _ = w.close().await;
                }
                session.close().await;
            }
            ClientOutput::WebSocket { sender, .. } => sender.close(websocket::CLOSE_NORMAL).await,
        }
    }

    /// Resolves when the client has gone away.
    pub async fn gone(&self) {
        match self {
            ClientOutput::Spdy { session, .. } => session.closed().await,
            ClientOutput::WebSocket { gone, .. } => {
                let mut gone = gone.clone();
                let _ = gone.wait_for(|g| *g).await;
            }
        }
    }
}

/// Waits for the SPDY streams a client of `protocol` opens for `opts`
/// (upstream's waitForStreams): error always, stdin/stdout/stderr as asked,
/// resize with a TTY from v3 on.
pub async fn spdy_client(
    session: spdy::Session,
    mut incoming: mpsc::Receiver<spdy::Stream>,
    protocol: &str,
    opts: &Options,
) -> Result<ClientStreams, ClientError> {
    let resize_supported = matches!(protocol, V4 | V3);
    let expected =
        1 + [opts.stdin, opts.stdout, opts.stderr, opts.tty && resize_supported].iter().filter(|b| **b).count();
    let mut by_type: HashMap<String, spdy::Stream> = HashMap::new();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while by_type.len() < expected {
        let stream = tokio::time::timeout_at(deadline, incoming.recv())
            .await
            .map_err(|_| ClientError::StreamTimeout)?
            .ok_or(ClientError::Gone)?;
        match stream.headers.get("streamtype") {
            Some(kind @ ("error" | "stdin" | "stdout" | "stderr" | "resize")) => {
                by_type.insert(kind.to_string(), stream);
            }
            other => {
                tracing::debug!(stream_type = ?other, "unexpected stream type; resetting it");
                let _ = stream.writer.reset().await;
            }
        }
    }
    // Later streams are not expected; keep draining so the session never stalls.
    tokio::spawn(async move { while incoming.recv().await.is_some() {} });
    let error = by_type.remove("error").ok_or(ClientError::StreamTimeout)?;
    let mut take = |name: &str| by_type.remove(name);
    let (stdin, stdout, stderr, resize) = (take("stdin"), take("stdout"), take("stderr"), take("resize"));
    Ok(ClientStreams {
        stdin: stdin.map(|s| s.reader.into_inner()),
        resize: resize.map(|s| s.reader.into_inner()),
        output: ClientOutput::Spdy {
            session,
            stdout: stdout.map(|s| s.writer),
            stderr: stderr.map(|s| s.writer),
            error: error.writer,
            json_status: protocol == V4,
        },
    })
}

/// Serves the channels of a WebSocket client of subprotocol `protocol`.
pub fn websocket_client<IO>(io: IO, protocol: &str, opts: &Options) -> ClientStreams
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let base64 = protocol.contains("base64");
    let supports_close = protocol == "v5.channel.k8s.io";
    let json_status = protocol.starts_with("v4.") || protocol.starts_with("v5.");
    let (read, write) = tokio::io::split(io);
    let sender = Sender::spawn(write);
    let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(32);
    let (resize_tx, resize_rx) = mpsc::channel::<Vec<u8>>(8);
    let (gone_tx, gone) = watch::channel(false);
    let reader_sender = sender.clone();
    let want_stdin = opts.stdin;
    tokio::spawn(async move {
        let mut reader = websocket::FrameReader::new(read, true);
        let mut stdin_tx = want_stdin.then_some(stdin_tx);
        loop {
            let msg = match websocket::next_data(&mut reader, &reader_sender).await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    tracing::debug!("websocket stream client closed");
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "websocket stream client read failed");
                    break;
                }
            };
            let (channel, data) = match decode_channel_message(msg, base64) {
                Some(x) => x,
                None => continue,
            };
            tracing::trace!(channel, len = data.len(), "websocket stream message");
            match channel {
                STDIN => {
                    if let Some(tx) = &stdin_tx {
                        if !data.is_empty() && tx.send(data).await.is_err() {
                            stdin_tx = None;
                        }
                    }
                }
                RESIZE => {
                    let _ = resize_tx.send(data).await;
                }
                CLOSE if supports_close && data.first() == Some(&STDIN) => {
                    tracing::debug!("websocket stream client closed stdin");
                    stdin_tx = None;
                }
                _ => {}
            }
        }
        let _ = gone_tx.send(true);
    });
    ClientStreams {
        stdin: opts.stdin.then_some(stdin_rx),
        resize: opts.tty.then_some(resize_rx),
        output: ClientOutput::WebSocket { sender, base64, json_status, gone },
    }
}

/// The channel and data of a client's message: in the binary protocols a
/// message (text or binary frames alike, as upstream's wsstream reads them)
/// starts with the channel byte; in the base64 ones a text message starts
/// with the channel as a digit.
pub fn decode_channel_message(msg: Message, base64: bool) -> Option<(u8, Vec<u8>)> {
    match msg {
        Message::Binary(data) | Message::Text(data) if !base64 => {
            let (&channel, rest) = data.split_first()?;
            Some((channel, rest.to_vec()))
        }
        Message::Text(text) if base64 => {
            let (&digit, rest) = text.split_first()?;
            let channel = digit.checked_sub(b'0')?;
            let data = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
            Some((channel, data))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_accept_the_apiservers_and_kubectls_spellings() {
        let o = Options::from_query(Some("command=sh&command=-c&command=echo+hi&input=1&output=1&error=1")).unwrap();
        assert_eq!(
            o,
            Options {
                command: vec!["sh".into(), "-c".into(), "echo hi".into()],
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        let o = Options::from_query(Some("command=ls&stdout=true&stderr=true&tty=true")).unwrap();
        assert!(o.tty && o.stdout && !o.stderr, "a TTY drops stderr");
        assert_eq!(Options::from_query(Some("command=ls")), Err(OptionsError::NoStreams));
        assert_eq!(Options::from_query(Some("command=ls&stdout=0")), Err(OptionsError::NoStreams));
    }

    #[test]
    fn status_translation_per_protocol() {
        let exit7 = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 7","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;
        assert_eq!(status_for_client(exit7, true), exit7.to_vec());
        assert_eq!(
            status_for_client(exit7, false),
            b"command terminated with non-zero exit code: exit status 7".to_vec()
        );
        let ok = br#"{"metadata":{},"status":"Success"}"#;
        assert_eq!(status_for_client(ok, false), Vec::<u8>::new());
        assert_eq!(status_for_client(ok, true), ok.to_vec());
        let empty: serde_json::Value = serde_json::from_slice(&status_for_client(b"", true)).unwrap();
        assert_eq!(empty["status"], "Success");
        let text: serde_json::Value = serde_json::from_slice(&status_for_client(b"boom", true)).unwrap();
        assert_eq!(text["status"], "Failure");
        assert_eq!(text["message"], "boom");
    }

    #[test]
    fn channel_messages_in_binary_and_base64() {
        assert_eq!(decode_channel_message(Message::Binary(b"\x00hi".to_vec()), false), Some((STDIN, b"hi".to_vec())));
        assert_eq!(decode_channel_message(Message::Binary(vec![255, 0]), false), Some((CLOSE, vec![0])));
        assert_eq!(decode_channel_message(Message::Text(b"0aGk=".to_vec()), true), Some((STDIN, b"hi".to_vec())));
        assert_eq!(decode_channel_message(Message::Text(b"4e30=".to_vec()), true), Some((RESIZE, b"{}".to_vec())));
        assert_eq!(decode_channel_message(Message::Binary(vec![]), false), None);
        assert_eq!(decode_channel_message(Message::Text(b"\x00hi".to_vec()), false), Some((STDIN, b"hi".to_vec())));
        assert_eq!(decode_channel_message(Message::Binary(b"0aGk=".to_vec()), true), None);
    }

    #[tokio::test]
    async fn websocket_channels_map_to_streams_and_v5_closes_stdin() {
        use tokio::io::AsyncWriteExt;
        let (client, server) = tokio::io::duplex(1 << 16);
        let opts = Options { command: vec![], stdin: true, stdout: true, stderr: true, tty: true };
        let mut streams = websocket_client(server, "v5.channel.k8s.io", &opts);
        let (cr, mut cw) = tokio::io::split(client);
        let key = Some([7, 7, 7, 7]);
        for frame in [&b"\x00abc"[..], b"\x04{\"Width\":80,\"Height\":24}", b"\xff\x00"] {
            cw.write_all(&websocket::encode_frame(websocket::OP_BINARY, true, frame, key)).await.unwrap();
        }
        let mut stdin = streams.stdin.take().unwrap();
        assert_eq!(stdin.recv().await.unwrap(), b"abc");
        assert_eq!(stdin.recv().await, None, "channel 255 half-closed stdin");
        assert_eq!(streams.resize.as_mut().unwrap().recv().await.unwrap(), br#"{"Width":80,"Height":24}"#);
        streams.output.stdout(b"out").await.unwrap();
        streams.output.finish(b"").await;
        let mut r = websocket::FrameReader::new(cr, false);
        assert_eq!(r.next().await.unwrap(), Some(Message::Binary(b"\x01out".to_vec())));
        match r.next().await.unwrap() {
            Some(Message::Binary(m)) => {
                assert_eq!(m[0], ERROR);
                let s: serde_json::Value = serde_json::from_slice(&m[1..]).unwrap();
                assert_eq!(s["status"], "Success");
            }
            other => panic!("expected the status, got {other:?}"),
        }
        assert_eq!(r.next().await.unwrap(), Some(Message::Close(Some(1000))));
    }
}
