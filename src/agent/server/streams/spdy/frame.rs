//! SPDY/3.1 frames (draft 3.1 §2.6): their in-memory form, the header
//! block layout, and the byte codec. The codec owns the connection's two
//! header compression streams, so one `FrameCodec` serves one connection.

use super::zlib::{HeaderCompressionError, HeaderDeflater, HeaderInflater};

pub const VERSION: u16 = 3;
pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Largest frame payload (24-bit length).
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// Largest decompressed header block we accept.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

/// RST_STREAM status codes.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_INVALID_STREAM: u32 = 2;
pub const RST_REFUSED_STREAM: u32 = 3;
pub const RST_CANCEL: u32 = 5;
pub const RST_INTERNAL_ERROR: u32 = 6;

/// Header names (lowercase) and values; several values of one name are
/// NUL-separated on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.0.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.split('\0').next().unwrap_or_default())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Vec<u8>,
    },
    /// A control frame of a type SPDY/3.1 does not define (ignored, as the spec asks).
    Unknown {
        frame_type: u16,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("invalid SPDY {0} frame")]
    Invalid(&'static str),
    #[error("SPDY frame of {0} bytes is too large")]
    TooLarge(usize),
    #[error(transparent)]
    Headers(#[from] HeaderCompressionError),
}

/// The 8-byte common header: whether a control frame, its flags and payload length.
pub fn payload_len(head: &[u8; 8]) -> usize {
    (usize::from(head[5]) << 16) | (usize::from(head[6]) << 8) | usize::from(head[7])
}

/// Encoder and decoder of one connection.
#[derive(Default)]
pub struct FrameCodec {
    inflater: HeaderInflater,
    deflater: HeaderDeflater,
}

fn be32(b: &[u8], at: usize) -> Result<u32, FrameError> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]])).ok_or(FrameError::Invalid("short"))
}

impl FrameCodec {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one frame from its header and payload.
    pub fn decode(&mut self, head: &[u8; 8], payload: &[u8]) -> Result<Frame, FrameError> {
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            let stream_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
            return Ok(Frame::Data { stream_id, flags, data: payload.to_vec() });
        }
        let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let id = |at| be32(payload, at).map(|v| v & 0x7fff_ffff);
        Ok(match u16::from_be_bytes([head[2], head[3]]) {
            TYPE_SYN_STREAM => {
                if payload.len() < 10 {
                    return Err(FrameError::Invalid("SYN_STREAM"));
                }
                Frame::SynStream {
                    stream_id: id(0)?,
                    associated_to: id(4)?,
                    priority: payload[8] >> 5,
                    flags,
                    headers: self.read_headers(&payload[10..])?,
                }
            }
            TYPE_SYN_REPLY => Frame::SynReply {
                stream_id: id(0)?,
                flags,
                headers: self.read_headers(payload.get(4..).ok_or(FrameError::Invalid("SYN_REPLY"))?)?,
            },
            TYPE_RST_STREAM => Frame::RstStream { stream_id: id(0)?, status: be32(payload, 4)? },
            TYPE_SETTINGS => {
                let n = be32(payload, 0)? as usize;
                if payload.len() != 4 + n * 8 {
                    return Err(FrameError::Invalid("SETTINGS"));
                }
                let entries = (0..n)
                    .map(|i| {
                        let at = 4 + i * 8;
                        let word = be32(payload, at)?;
                        Ok(((word >> 24) as u8, word & 0x00ff_ffff, be32(payload, at + 4)?))
                    })
                    .collect::<Result<_, FrameError>>()?;
                Frame::Settings { flags, entries }
            }
            TYPE_PING => Frame::Ping { id: be32(payload, 0)? },
            TYPE_GOAWAY => Frame::GoAway { last_good_stream_id: id(0)?, status: be32(payload, 4).unwrap_or(0) },
            TYPE_HEADERS => Frame::Headers {
                stream_id: id(0)?,
                flags,
                headers: self.read_headers(payload.get(4..).ok_or(FrameError::Invalid("HEADERS"))?)?,
            },
            TYPE_WINDOW_UPDATE => Frame::WindowUpdate { stream_id: id(0)?, delta: id(4)? },
            other => Frame::Unknown { frame_type: other },
        })
    }

    /// Appends the wire form of `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let (kind, flags, body): (u16, u8, Vec<u8>) = match frame {
            Frame::Data { stream_id, flags, data } => {
                if data.len() > MAX_PAYLOAD {
                    return Err(FrameError::TooLarge(data.len()));
                }
                out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                push_flags_len(out, *flags, data.len());
                out.extend_from_slice(data);
                return Ok(());
            }
            Frame::SynStream { stream_id, associated_to, priority, flags, headers } => {
                let mut b = Vec::new();
                b.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                b.extend_from_slice(&(associated_to & 0x7fff_ffff).to_be_bytes());
                b.push((priority & 0x7) << 5);
                b.push(0);
                b.extend(self.write_headers(headers)?);
                (TYPE_SYN_STREAM, *flags, b)
            }
            Frame::SynReply { stream_id, flags, headers } => {
                let mut b = (stream_id & 0x7fff_ffff).to_be_bytes().to_vec();
                b.extend(self.write_headers(headers)?);
                (TYPE_SYN_REPLY, *flags, b)
            }
            Frame::Headers { stream_id, flags, headers } => {
                let mut b = (stream_id & 0x7fff_ffff).to_be_bytes().to_vec();
                b.extend(self.write_headers(headers)?);
                (TYPE_HEADERS, *flags, b)
            }
            Frame::RstStream { stream_id, status } => (TYPE_RST_STREAM, 0, pair(*stream_id & 0x7fff_ffff, *status)),
            Frame::Settings { flags, entries } => {
                let mut b = (entries.len() as u32).to_be_bytes().to_vec();
                for (f, id, value) in entries {
                    b.extend_from_slice(&((u32::from(*f) << 24) | (id & 0x00ff_ffff)).to_be_bytes());
                    b.extend_from_slice(&value.to_be_bytes());
                }
                (TYPE_SETTINGS, *flags, b)
            }
            Frame::Ping { id } => (TYPE_PING, 0, id.to_be_bytes().to_vec()),
            Frame::GoAway { last_good_stream_id, status } => {
                (TYPE_GOAWAY, 0, pair(*last_good_stream_id & 0x7fff_ffff, *status))
            }
            Frame::WindowUpdate { stream_id, delta } => {
                (TYPE_WINDOW_UPDATE, 0, pair(*stream_id & 0x7fff_ffff, delta & 0x7fff_ffff))
            }
            Frame::Unknown { .. } => return Err(FrameError::Invalid("unknown")),
        };
        if body.len() > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(body.len()));
        }
        out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        push_flags_len(out, flags, body.len());
        out.extend_from_slice(&body);
        Ok(())
    }

    fn read_headers(&mut self, compressed: &[u8]) -> Result<Headers, FrameError> {
        let block = self.inflater.inflate(compressed, MAX_HEADER_BLOCK)?;
        parse_header_block(&block)
    }

    fn write_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        Ok(self.deflater.deflate(&header_block(headers))?)
    }
}

fn pair(a: u32, b: u32) -> Vec<u8> {
    let mut v = a.to_be_bytes().to_vec();
    v.extend_from_slice(&b.to_be_bytes());
    v
}

fn push_flags_len(out: &mut Vec<u8>, flags: u8, len: usize) {
    out.push(flags);
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
}

/// The uncompressed header block: a count, then length-prefixed names and
/// values; values of a repeated name joined by NUL (names must be unique).
pub fn header_block(headers: &Headers) -> Vec<u8> {
    let mut merged: Vec<(String, String)> = Vec::new();
    for (name, value) in &headers.0 {
        let name = name.to_ascii_lowercase();
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => {
                v.push('\0');
                v.push_str(value);
            }
            None => merged.push((name, value.clone())),
        }
    }
    let mut b = (merged.len() as u32).to_be_bytes().to_vec();
    for (name, value) in merged {
        b.extend_from_slice(&(name.len() as u32).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(value.len() as u32).to_be_bytes());
        b.extend_from_slice(value.as_bytes());
    }
    b
}

pub fn parse_header_block(block: &[u8]) -> Result<Headers, FrameError> {
    let count = be32(block, 0)? as usize;
    let mut at = 4;
    let take = |at: &mut usize| -> Result<String, FrameError> {
        let len = be32(block, *at)? as usize;
        let bytes = block.get(*at + 4..*at + 4 + len).ok_or(FrameError::Invalid("header block"))?;
        *at += 4 + len;
        String::from_utf8(bytes.to_vec()).map_err(|_| FrameError::Invalid("header block"))
    };
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = take(&mut at)?;
        let value = take(&mut at)?;
        if name.is_empty() {
            return Err(FrameError::Invalid("header block"));
        }
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(Headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frames: Vec<Frame>) {
        let (mut tx, mut rx) = (FrameCodec::new(), FrameCodec::new());
        let mut wire = Vec::new();
        for f in &frames {
            tx.encode(f, &mut wire).unwrap();
        }
        let mut at = 0;
        for want in frames {
            let head: [u8; 8] = wire[at..at + 8].try_into().unwrap();
            let len = payload_len(&head);
            let got = rx.decode(&head, &wire[at + 8..at + 8 + len]).unwrap();
            assert_eq!(got, want);
            at += 8 + len;
        }
        assert_eq!(at, wire.len());
    }

    #[test]
    fn every_frame_type_round_trips() {
        let h = Headers::new().with("streamType", "error").with("port", "8080").with("requestid", "0");
        round_trip(vec![
            Frame::SynStream { stream_id: 1, associated_to: 0, priority: 0, flags: 0, headers: h.clone() },
            Frame::SynReply { stream_id: 1, flags: 0, headers: Headers::new() },
            Frame::Data { stream_id: 1, flags: 0, data: b"hello".to_vec() },
            Frame::Data { stream_id: 1, flags: FLAG_FIN, data: vec![] },
            Frame::SynStream { stream_id: 3, associated_to: 1, priority: 7, flags: FLAG_FIN, headers: h },
            Frame::Headers { stream_id: 3, flags: 0, headers: Headers::new().with("a", "b") },
            Frame::RstStream { stream_id: 3, status: RST_CANCEL },
            Frame::Settings { flags: 0, entries: vec![(0, 7, 65536), (1, 4, 100)] },
            Frame::Ping { id: 2 },
            Frame::WindowUpdate { stream_id: 1, delta: 1000 },
            Frame::GoAway { last_good_stream_id: 3, status: 0 },
        ]);
    }

    #[test]
    fn repeated_names_are_joined_with_nul() {
        let h = Headers::new()
            .with("X-Stream-Protocol-Version", "v4.channel.k8s.io")
            .with("x-stream-protocol-version", "v3");
        let parsed = parse_header_block(&header_block(&h)).unwrap();
        assert_eq!(parsed.0, vec![("x-stream-protocol-version".to_string(), "v4.channel.k8s.io\0v3".to_string())]);
        assert_eq!(parsed.get("X-Stream-Protocol-Version"), Some("v4.channel.k8s.io"));
    }

    #[test]
    fn truncated_blocks_and_wrong_versions_are_errors() {
        assert!(parse_header_block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        let head = [0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4];
        assert!(matches!(FrameCodec::new().decode(&head, &[0, 0, 0, 1]), Err(FrameError::Version(2))));
    }
}
