//! A SPDY/3.1 session over any byte stream, usable from either end: the
//! kubelet side for kubectl's connections and the client side towards
//! containerd's streaming server. One task reads frames and routes DATA to
//! the stream it belongs to; one task owns the write half and sends frames
//! in the order they are queued, so a stream's SYN_REPLY always precedes its
//! data.
//!
//! Flow control: moby/spdystream (the Go side of kubectl, client-go and
//! containerd) never sends WINDOW_UPDATE and ignores the ones it gets, so
//! this session does the same: it neither waits for window updates nor
//! sends them. Back-pressure comes from the per-stream queues: when a
//! stream's reader falls behind, reading the connection pauses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use super::frame::{payload_len, Frame, FrameCodec, FrameError, Headers, FLAG_FIN, MAX_PAYLOAD, RST_CANCEL};
use crate::sync::LockExt;

/// Largest DATA frame we send.
const DATA_CHUNK: usize = 32 * 1024;
/// DATA frames queued per stream before reading the connection pauses.
const STREAM_QUEUE: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the SPDY connection is closed")]
    Closed,
    #[error(transparent)]
    Frame(#[from] FrameError),
}

enum Command {
    Frame(Frame),
    Shutdown(oneshot::Sender<()>),
}

struct Shared {
    out: mpsc::Sender<Command>,
    streams: Mutex<HashMap<u32, mpsc::Sender<Vec<u8>>>>,
    next_id: AtomicU32,
    closed: watch::Receiver<bool>,
}

/// One SPDY connection; clones share it.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

/// A stream: the headers it was opened with, and its two halves.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

/// What the peer sends on a stream; `None` once it half-closed (FIN),
/// reset it, or the connection ended.
pub struct StreamReader {
    rx: mpsc::Receiver<Vec<u8>>,
}

impl StreamReader {
    pub async fn read(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }

    /// The queue of data frames itself (closed at FIN).
    pub fn into_inner(self) -> mpsc::Receiver<Vec<u8>> {
        self.rx
    }
}

/// Our side of a stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Command>,
}

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub async fn write(&self, mut data: &[u8]) -> Result<(), SessionError> {
        while !data.is_empty() {
            let n = data.len().min(DATA_CHUNK);
            self.send(Frame::Data { stream_id: self.id, flags: 0, data: data[..n].to_vec() }).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Half-closes our side (a DATA frame with FIN).
    pub async fn close(&self) -> Result<(), SessionError> {
        self.send(Frame::Data { stream_id: self.id, flags: FLAG_FIN, data: Vec::new() }).await
    }

    /// Aborts the stream in both directions.
    pub async fn reset(&self) -> Result<(), SessionError> {
        self.send(Frame::RstStream { stream_id: self.id, status: RST_CANCEL }).await
    }

    async fn send(&self, frame: Frame) -> Result<(), SessionError> {
        self.out.send(Command::Frame(frame)).await.map_err(|_| SessionError::Closed)
    }
}

impl Session {
    /// The accepting side (kubelet): the peer opens odd streams.
    pub fn server<IO>(io: IO) -> (Session, mpsc::Receiver<Stream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::start(io, false)
    }

    /// The dialling side: we open odd streams.
    pub fn client<IO>(io: IO) -> (Session, mpsc::Receiver<Stream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::start(io, true)
    }

    fn start<IO>(io: IO, client: bool) -> (Session, mpsc::Receiver<Stream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel(64);
        let (incoming_tx, incoming) = mpsc::channel(64);
        let (closed_tx, closed) = watch::channel(false);
        let shared = Arc::new(Shared {
            out,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(if client { 1 } else { 2 }),
            closed,
        });
        tokio::spawn(write_loop(write, out_rx));
        tokio::spawn(read_loop(read, shared.clone(), incoming_tx, closed_tx, client));
        (Session { shared }, incoming)
    }

    /// Opens a stream with `headers`.
    pub async fn open(&self, headers: Headers) -> Result<Stream, SessionError> {
        let id = self.shared.next_id.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        self.shared.streams.locked().insert(id, tx);
        let frame =
            Frame::SynStream { stream_id: id, associated_to: 0, priority: 0, flags: 0, headers: headers.clone() };
        self.shared.out.send(Command::Frame(frame)).await.map_err(|_| SessionError::Closed)?;
        Ok(Stream { id, headers, reader: StreamReader { rx }, writer: self.writer(id) })
    }

    fn writer(&self, id: u32) -> StreamWriter {
        StreamWriter { id, out: self.shared.out.clone() }
    }

    /// Sends GOAWAY, flushes what is queued and closes our half of the connection.
    pub async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.shared.out.send(Command::Shutdown(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Resolves once the peer closed the connection (or it failed).
    pub async fn closed(&self) {
        let mut closed = self.shared.closed.clone();
        let _ = closed.wait_for(|c| *c).await;
    }
}

async fn write_loop<W: AsyncWrite>(write: W, mut commands: mpsc::Receiver<Command>) {
    let mut codec = FrameCodec::new();
    let mut write = std::pin::pin!(write);
    let mut buf = Vec::with_capacity(DATA_CHUNK + 64);
    while let Some(cmd) = commands.recv().await {
        let (frame, ack) = match cmd {
            Command::Frame(f) => (f, None),
            Command::Shutdown(ack) => (Frame::GoAway { last_good_stream_id: 0, status: 0 }, Some(ack)),
        };
        buf.clear();
        if let Err(e) = codec.encode(&frame, &mut buf) {
            tracing::warn!(error = %e, "cannot encode a SPDY frame");
            continue;
        }
        let mut ok = write.write_all(&buf).await.is_ok();
        if ok && (ack.is_some() || commands.is_empty()) {
            ok = write.flush().await.is_ok();
        }
        if let Some(ack) = ack {
            let _ = write.shutdown().await;
            let _ = ack.send(());
            return;
        }
        if !ok {
            tracing::debug!("SPDY connection write failed");
            return;
        }
    }
    let _ = write.flush().await;
    let _ = write.shutdown().await;
}

async fn read_loop<R: AsyncRead>(
    read: R,
    shared: Arc<Shared>,
    incoming: mpsc::Sender<Stream>,
    closed: watch::Sender<bool>,
    client: bool,
) {
    let mut read = std::pin::pin!(read);
    let mut codec = FrameCodec::new();
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 8];
        if let Err(e) = read.read_exact(&mut head).await {
            tracing::debug!(error = %e, "SPDY peer closed the connection");
            break;
        }
        let len = payload_len(&head);
        if len > MAX_PAYLOAD {
            break;
        }
        payload.resize(len, 0);
        if read.read_exact(&mut payload).await.is_err() {
            break;
        }
        let frame = match codec.decode(&head, &payload) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "bad SPDY frame; closing the connection");
                break;
            }
        };
        if !matches!(frame, Frame::Data { .. }) {
            tracing::trace!(?frame, "SPDY control frame");
        }
        if !handle(frame, &shared, &incoming, client).await {
            break;
        }
    }
    shared.streams.locked().clear();
    let _ = closed.send(true);
}

/// Acts on one frame; false ends the session.
async fn handle(frame: Frame, shared: &Arc<Shared>, incoming: &mpsc::Sender<Stream>, client: bool) -> bool {
    let session = Session { shared: shared.clone() };
    match frame {
        Frame::SynStream { stream_id, flags, headers, .. } => {
            // Streams the peer opens carry the peer's parity.
            if stream_id == 0 || (stream_id % 2 == 1) == client {
                let _ = session.writer(stream_id).send(Frame::RstStream { stream_id, status: 1 }).await;
                return true;
            }
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            if flags & FLAG_FIN == 0 {
                shared.streams.locked().insert(stream_id, tx);
            }
            let reply = Frame::SynReply { stream_id, flags: 0, headers: Headers::new() };
            if shared.out.send(Command::Frame(reply)).await.is_err() {
                return false;
            }
            let stream =
                Stream { id: stream_id, headers, reader: StreamReader { rx }, writer: session.writer(stream_id) };
            if incoming.send(stream).await.is_err() {
                // Nobody accepts streams any more: refuse it.
                shared.streams.locked().remove(&stream_id);
                let _ = session.writer(stream_id).send(Frame::RstStream { stream_id, status: 3 }).await;
            }
        }
        Frame::Data { stream_id, flags, data } => {
            let tx = shared.streams.locked().get(&stream_id).cloned();
            if let Some(tx) = tx {
                if !data.is_empty() && tx.send(data).await.is_err() {
                    shared.streams.locked().remove(&stream_id);
                }
            }
            if flags & FLAG_FIN != 0 {
                shared.streams.locked().remove(&stream_id);
            }
        }
        Frame::SynReply { stream_id, flags, .. } => {
            if flags & FLAG_FIN != 0 {
                shared.streams.locked().remove(&stream_id);
            }
        }
        Frame::Headers { stream_id, flags, .. } => {
            if flags & FLAG_FIN != 0 {
                shared.streams.locked().remove(&stream_id);
            }
        }
        Frame::RstStream { stream_id, .. } => {
            shared.streams.locked().remove(&stream_id);
        }
        Frame::Ping { id } => {
            // Echo the peer's pings; ours (our parity) need no answer.
            if (id % 2 == 1) != client {
                let _ = shared.out.send(Command::Frame(Frame::Ping { id })).await;
            }
        }
        Frame::GoAway { .. } => return false,
        Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streams_carry_data_and_half_close_both_ways() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (client, _none) = Session::client(a);
        let (server, mut accepted) = Session::server(b);
        let mut opened = client.open(Headers::new().with("streamType", "stdin")).await.unwrap();
        let mut got = accepted.recv().await.unwrap();
        assert_eq!(got.headers.get("streamtype"), Some("stdin"));
        let big = vec![7u8; 200_000];
        opened.writer.write(&big).await.unwrap();
        opened.writer.close().await.unwrap();
        let mut seen = Vec::new();
        while let Some(chunk) = got.reader.read().await {
            seen.extend(chunk);
        }
        assert_eq!(seen, big, "all data, then EOF at FIN");
        got.writer.write(b"back").await.unwrap();
        got.writer.close().await.unwrap();
        assert_eq!(opened.reader.read().await.unwrap(), b"back");
        assert_eq!(opened.reader.read().await, None);
        server.close().await;
        tokio::time::timeout(std::time::Duration::from_secs(5), client.closed()).await.unwrap();
    }

    #[tokio::test]
    async fn reset_ends_only_that_stream() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (client, _none) = Session::client(a);
        let (_server, mut accepted) = Session::server(b);
        let one = client.open(Headers::new().with("requestid", "1")).await.unwrap();
        let mut two = client.open(Headers::new().with("requestid", "2")).await.unwrap();
        let mut one_seen = accepted.recv().await.unwrap();
        let two_seen = accepted.recv().await.unwrap();
        one.writer.reset().await.unwrap();
        assert_eq!(one_seen.reader.read().await, None);
        two_seen.writer.write(b"alive").await.unwrap();
        assert_eq!(two.reader.read().await.unwrap(), b"alive");
    }
}
