//! Tolerating the `:authority` that etcd 3.4 clients send.
//!
//! etcd's v3.4 client (Debian's etcdctl among them) dials some requests,
//! `etcdctl endpoint status` for one, with the whole endpoint URL as the
//! HTTP/2 `:authority` (`http://127.0.0.1:2379`; etcd's issue 13192). etcd's
//! Go server ignores it; the `h2` crate under tonic refuses the request as
//! malformed and resets the stream with PROTOCOL_ERROR. So every connection
//! is read through `AuthorityFix`, which decides on the connection's first
//! header block. Every other client opens with a valid authority (or
//! none), and grpc-go keeps one authority per connection, so such a
//! connection's bytes pass untouched from then on and the server's HPACK
//! decoder keeps the client's dynamic table itself. A connection whose
//! first block has the URL gets every header block rewritten: decoded
//! (HPACK), given a plain `host:port` authority (or none, when nothing
//! valid is left), and encoded again (`hpack`), without ever inserting into
//! the server's dynamic table, so that table stays empty and needs no
//! keeping in step. Rewriting every request cost about 8 % of the
//! datastore's CPU under 16 writing clients (perf, `benches/store.rs`).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may set: rewritten blocks
/// are cut to it, so they fit whatever the server announced.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this ends the connection.
const MAX_BLOCK: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("malformed HTTP/2 frame: {0}")]
    Frame(&'static str),
    #[error("header block of stream {0} exceeds {MAX_BLOCK} bytes")]
    BlockTooLarge(u32),
    #[error("cannot decode header block: {0}")]
    Hpack(#[from] super::hpack::HpackError),
}

/// The `:authority` a server accepts for `value`: the scheme and anything
/// after the host and port dropped; None when no valid authority is left.
pub fn plain_authority(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    let hostport = rest.split('/').next().unwrap_or_default();
    hostport.parse::<hyper::http::uri::Authority>().ok().map(|_| hostport.as_bytes().to_vec())
}

/// A header block being gathered from HEADERS and CONTINUATION frames.
struct Block {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The block's frames as they came, while the connection is undecided.
    raw: Option<Vec<u8>>,
}

/// One whole frame of the client's.
struct Frame<'a> {
    flags: u8,
    stream_id: u32,
    payload: &'a [u8],
    /// The frame as it came, its 9-byte head included.
    bytes: &'a [u8],
}

/// What the rewriter does with the client's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Up to the end of the first header block: frames are checked, and
    /// the block decides between `Rewrite` and `Passthrough`.
    Undecided,
    /// Every header block is decoded and encoded again.
    Rewrite,
    /// Bytes pass as they come: the client's authorities are valid, or
    /// the connection is not HTTP/2 with prior knowledge (the server
    /// answers that as it does).
    Passthrough,
}

/// The client-to-server byte stream, rewritten frame by frame.
pub struct HeaderRewriter {
    preface_seen: bool,
    mode: Mode,
    decoder: super::hpack::Decoder,
    block: Option<Block>,
}

impl Default for HeaderRewriter {
    fn default() -> Self {
        HeaderRewriter {
            preface_seen: false,
            mode: Mode::Undecided,
            // What the server announces (SETTINGS_HEADER_TABLE_SIZE's default).
            decoder: super::hpack::Decoder::new(4096),
            block: None,
        }
    }
}

impl HeaderRewriter {
    /// Moves every complete frame at the front of `input` to `output`,
    /// header blocks rewritten; an incomplete frame stays in `input`. Once
    /// the connection passes through, every byte moves as it is.
    pub fn feed(&mut self, input: &mut Vec<u8>, output: &mut Vec<u8>) -> Result<(), RewriteError> {
        if self.mode == Mode::Passthrough {
            output.append(input);
            return Ok(());
        }
        let mut at = 0;
        if !self.preface_seen {
            let seen = input.len().min(PREFACE.len());
            if input[..seen] != PREFACE[..seen] {
                self.mode = Mode::Passthrough;
                output.append(input);
                return Ok(());
            }
            if seen < PREFACE.len() {
                return Ok(());
            }
            output.extend_from_slice(PREFACE);
            self.preface_seen = true;
            at = PREFACE.len();
        }
        while input.len() - at >= FRAME_HEADER {
            let head = &input[at..at + FRAME_HEADER];
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            if input.len() - at < FRAME_HEADER + len {
                break;
            }
            let kind = head[3];
            let bytes = &input[at..at + FRAME_HEADER + len];
            let frame = Frame {
                flags: head[4],
                stream_id: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
                payload: &bytes[FRAME_HEADER..],
                bytes,
            };
            match kind {
                HEADERS => self.headers(frame, output)?,
                CONTINUATION => self.continuation(frame, output)?,
                _ if self.block.is_some() => return Err(RewriteError::Frame("a frame inside a header block")),
                _ => output.extend_from_slice(bytes),
            }
            at += FRAME_HEADER + len;
            if self.mode == Mode::Passthrough {
                break;
            }
        }
        input.drain(..at);
        if self.mode == Mode::Passthrough {
            output.append(input);
        }
        Ok(())
    }

    /// Whether the client's bytes now pass untouched.
    pub fn passes_through(&self) -> bool {
        self.mode == Mode::Passthrough
    }

    fn headers(&mut self, frame: Frame<'_>, output: &mut Vec<u8>) -> Result<(), RewriteError> {
        if self.block.is_some() {
            return Err(RewriteError::Frame("HEADERS inside a header block"));
        }
        let Frame { flags, stream_id, payload, bytes } = frame;
        let mut body = payload;
        if flags & PADDED != 0 {
            let (&pad, rest) = body.split_first().ok_or(RewriteError::Frame("padded HEADERS without a pad length"))?;
            let keep = rest.len().checked_sub(usize::from(pad)).ok_or(RewriteError::Frame("padding too long"))?;
            body = &rest[..keep];
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            let fields = body.get(..5).ok_or(RewriteError::Frame("HEADERS too short for its priority"))?;
            priority = Some([fields[0], fields[1], fields[2], fields[3], fields[4]]);
            body = &body[5..];
        }
        let raw = (self.mode == Mode::Undecided).then(|| bytes.to_vec());
        self.block =
            Some(Block { stream_id, end_stream: flags & END_STREAM != 0, priority, fragment: body.to_vec(), raw });
        if flags & END_HEADERS != 0 {
            self.finish(output)?;
        }
        Ok(())
    }

    fn continuation(&mut self, frame: Frame<'_>, output: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Frame { flags, stream_id, payload, bytes } = frame;
        let block = self.block.as_mut().ok_or(RewriteError::Frame("CONTINUATION without HEADERS"))?;
        if block.stream_id != stream_id {
            return Err(RewriteError::Frame("CONTINUATION of another stream"));
        }
        if block.fragment.len() + payload.len() > MAX_BLOCK {
            return Err(RewriteError::BlockTooLarge(stream_id));
        }
        block.fragment.extend_from_slice(payload);
        if let Some(raw) = &mut block.raw {
            raw.extend_from_slice(bytes);
        }
        if flags & END_HEADERS != 0 {
            self.finish(output)?;
        }
        Ok(())
    }

    /// Decodes the gathered block and writes it out again as one HEADERS
    /// frame and as many CONTINUATION frames as it needs; the connection's
    /// first block, when its authorities are valid as they are, goes out
    /// as it came and ends the rewriting.
    fn finish(&mut self, output: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Some(block) = self.block.take() else { return Ok(()) };
        let decoded = self.decoder.decode(&block.fragment)?;
        if let Some(raw) = &block.raw {
            let valid = decoded
                .iter()
                .filter(|(name, _)| name.as_slice() == b":authority")
                .all(|(_, value)| plain_authority(value).as_deref() == Some(value.as_slice()));
            if valid {
                output.extend_from_slice(raw);
                self.mode = Mode::Passthrough;
                return Ok(());
            }
            self.mode = Mode::Rewrite;
        }
        let fields: Vec<super::hpack::Field> = decoded
            .into_iter()
            .filter_map(|(name, value)| match name.as_slice() {
                b":authority" => plain_authority(&value).map(|authority| (name, authority)),
                _ => Some((name, value)),
            })
            .collect();
        let encoded = super::hpack::encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));

        let mut first = block.priority.map(Vec::from).unwrap_or_default();
        let room = MAX_FRAME - first.len();
        let (head, mut rest) = encoded.split_at(encoded.len().min(room));
        first.extend_from_slice(head);
        let mut flags = if block.end_stream { END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        let mut kind = HEADERS;
        let mut payload = first;
        loop {
            let last = rest.is_empty();
            write_frame(output, kind, if last { flags | END_HEADERS } else { flags }, block.stream_id, &payload);
            if last {
                return Ok(());
            }
            let (next, after) = rest.split_at(rest.len().min(MAX_FRAME));
            payload = next.to_vec();
            rest = after;
            kind = CONTINUATION;
            flags = 0;
        }
    }
}

fn write_frame(output: &mut Vec<u8>, kind: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let len = payload.len();
    output.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    output.extend_from_slice(&stream_id.to_be_bytes());
    output.extend_from_slice(payload);
}

/// A server-side connection whose incoming header blocks pass through a
/// `HeaderRewriter`; writes go to the client untouched.
pub struct AuthorityFix<T> {
    inner: T,
    rewriter: HeaderRewriter,
    input: Vec<u8>,
    output: Vec<u8>,
    eof: bool,
}

impl<T> AuthorityFix<T> {
    pub fn new(inner: T) -> Self {
        AuthorityFix { inner, rewriter: HeaderRewriter::default(), input: Vec::new(), output: Vec::new(), eof: false }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AuthorityFix<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = buf.remaining().min(this.output.len());
                buf.put_slice(&this.output[..n]);
                this.output.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passes_through() {
                // The undecided start's buffers are not needed again.
                this.input = Vec::new();
                this.output = Vec::new();
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // A frame cut short stays cut short: the server sees it so.
                this.eof = true;
                this.output.append(&mut this.input);
                continue;
            }
            this.input.extend_from_slice(read.filled());
            this.rewriter
                .feed(&mut this.input, &mut this.output)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<T: Connected> Connected for AuthorityFix<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(encoder: &mut loona_hpack::Encoder<'_>, stream_id: u32, fields: &[(&str, &str)]) -> Vec<u8> {
        let block = encoder.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let mut out = Vec::new();
        write_frame(&mut out, HEADERS, END_HEADERS, stream_id, &block);
        out
    }

    fn decoded_blocks(bytes: &[u8]) -> Vec<Vec<(String, String)>> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut at = PREFACE.len();
        let mut out = Vec::new();
        let mut block = Vec::new();
        while at < bytes.len() {
            let len = usize::from(bytes[at]) << 16 | usize::from(bytes[at + 1]) << 8 | usize::from(bytes[at + 2]);
            let payload = &bytes[at + FRAME_HEADER..at + FRAME_HEADER + len];
            if matches!(bytes[at + 3], HEADERS | CONTINUATION) {
                block.extend_from_slice(payload);
                if bytes[at + 4] & END_HEADERS != 0 {
                    let fields = decoder.decode(&std::mem::take(&mut block)).expect("decodable");
                    out.push(
                        fields
                            .into_iter()
                            .map(|(n, v)| (String::from_utf8(n).expect("utf8"), String::from_utf8(v).expect("utf8")))
                            .collect(),
                    );
                }
            }
            at += FRAME_HEADER + len;
        }
        out
    }

    #[test]
    fn plain_authorities_drop_the_scheme() {
        assert_eq!(plain_authority(b"http://127.0.0.1:2379").as_deref(), Some(&b"127.0.0.1:2379"[..]));
        assert_eq!(plain_authority(b"https://etcd.example:2379/").as_deref(), Some(&b"etcd.example:2379"[..]));
        assert_eq!(plain_authority(b"127.0.0.1:2379").as_deref(), Some(&b"127.0.0.1:2379"[..]));
        assert_eq!(plain_authority(b"unix:///run/etcd.sock"), None);
    }

    #[test]
    fn header_blocks_are_rewritten_and_other_frames_pass_through() {
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        let settings = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];
        wire.extend_from_slice(&settings);
        let request = [(":method", "POST"), (":authority", "http://127.0.0.1:2379"), (":path", "/x")];
        wire.extend(headers_frame(&mut client, 1, &request));
        let data = [0, 0, 2, 0x0, 0x1, 0, 0, 0, 1, 7, 8];
        wire.extend_from_slice(&data);
        // The second request leans on the client's dynamic table.
        wire.extend(headers_frame(&mut client, 3, &request));

        let mut rewriter = HeaderRewriter::default();
        let (mut input, mut output) = (Vec::new(), Vec::new());
        // Byte by byte: frames cut anywhere are gathered whole.
        for byte in wire {
            input.push(byte);
            rewriter.feed(&mut input, &mut output).expect("feed");
        }
        assert!(input.is_empty());
        assert!(output.starts_with(PREFACE));
        assert_eq!(&output[PREFACE.len()..PREFACE.len() + 9], &settings);
        assert!(output.windows(data.len()).any(|w| w == data));
        let expected: Vec<(String, String)> = [(":method", "POST"), (":authority", "127.0.0.1:2379"), (":path", "/x")]
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(decoded_blocks(&output), vec![expected.clone(), expected]);
    }

    #[test]
    fn a_connection_whose_first_authority_is_valid_passes_untouched() {
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let request = [(":method", "POST"), (":authority", "127.0.0.1:2379"), (":path", "/x")];
        let first = headers_frame(&mut client, 1, &request);
        // Cut in two: the block is judged whole, and goes out as it came.
        let (a, b) = first[FRAME_HEADER..].split_at(4);
        write_frame(&mut wire, HEADERS, 0, 1, a);
        write_frame(&mut wire, CONTINUATION, END_HEADERS, 1, b);
        // Later blocks lean on the client's dynamic table, which the
        // server's decoder now keeps itself.
        wire.extend(headers_frame(&mut client, 3, &request));
        wire.extend(headers_frame(&mut client, 5, &request));

        let mut rewriter = HeaderRewriter::default();
        let (mut input, mut output) = (Vec::new(), Vec::new());
        for byte in &wire {
            input.push(*byte);
            rewriter.feed(&mut input, &mut output).expect("feed");
        }
        assert!(rewriter.passes_through());
        assert!(input.is_empty());
        assert_eq!(output, wire);
        let fields: Vec<(String, String)> = request.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        assert_eq!(decoded_blocks(&output), vec![fields; 3]);
    }

    #[test]
    fn a_connection_whose_first_authority_is_a_url_is_rewritten_to_its_end() {
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        wire.extend(headers_frame(&mut client, 1, &[(":authority", "http://127.0.0.1:2379"), (":path", "/x")]));
        // A valid authority later does not end the rewriting: the server's
        // table is empty, and this block leans on the client's.
        wire.extend(headers_frame(&mut client, 3, &[(":authority", "127.0.0.1:2379"), (":path", "/x")]));
        let mut rewriter = HeaderRewriter::default();
        let (mut input, mut output) = (wire, Vec::new());
        rewriter.feed(&mut input, &mut output).expect("feed");
        assert!(!rewriter.passes_through());
        let plain =
            vec![(":authority".to_string(), "127.0.0.1:2379".to_string()), (":path".to_string(), "/x".to_string())];
        assert_eq!(decoded_blocks(&output), vec![plain.clone(), plain]);
    }

    #[test]
    fn continuations_padding_and_priority_are_folded_into_one_block() {
        let mut client = loona_hpack::Encoder::new();
        let block = client.encode([(&b":authority"[..], &b"http://h:1"[..]), (&b"te"[..], &b"trailers"[..])]);
        let (a, b) = block.split_at(3);
        let mut payload = vec![2]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0]);
        let mut wire = PREFACE.to_vec();
        write_frame(&mut wire, HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload);
        write_frame(&mut wire, CONTINUATION, END_HEADERS, 5, b);
        let (mut input, mut output) = (wire, Vec::new());
        HeaderRewriter::default().feed(&mut input, &mut output).expect("feed");
        let head = &output[PREFACE.len()..PREFACE.len() + FRAME_HEADER];
        assert_eq!((head[3], head[4]), (HEADERS, PRIORITY | END_STREAM | END_HEADERS));
        assert_eq!(&output[PREFACE.len() + FRAME_HEADER..PREFACE.len() + FRAME_HEADER + 5], &[0, 0, 0, 0, 16]);
        let fields = loona_hpack::Decoder::new().decode(&output[PREFACE.len() + FRAME_HEADER + 5..]).expect("decode");
        assert_eq!(fields, vec![(b":authority".to_vec(), b"h:1".to_vec()), (b"te".to_vec(), b"trailers".to_vec())]);
    }

    #[test]
    fn other_protocols_pass_through() {
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let (mut input, mut output) = (request.to_vec(), Vec::new());
        let mut rewriter = HeaderRewriter::default();
        rewriter.feed(&mut input, &mut output).expect("feed");
        input.extend_from_slice(PREFACE);
        rewriter.feed(&mut input, &mut output).expect("feed");
        assert_eq!(output, [&request[..], PREFACE].concat());
    }
}
