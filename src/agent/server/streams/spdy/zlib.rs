//! SPDY/3 header-block compression: one zlib stream per direction of a
//! connection, shared by every SYN_STREAM, SYN_REPLY and HEADERS frame,
//! with the spec's preset dictionary (SPDY/3 §2.6.10.1) and a sync flush
//! after each block.
//!
//! flate2 (on miniz_oxide) cannot take a preset dictionary, so the reading
//! side parses the zlib header itself and drives miniz_oxide's raw inflater
//! over a 32 KiB wrapping window that starts out holding the dictionary:
//! back-references into the dictionary then resolve like any other. The
//! writing side emits a plain zlib stream without FDICT, which Go's
//! `zlib.NewReaderDict` (spdystream, kubectl, containerd) accepts.

use flate2::{Compress, Compression, FlushCompress};
use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};
use miniz_oxide::inflate::TINFLStatus;

/// The SPDY/3 header dictionary (1423 bytes, Adler-32 0xe3c6a7c2).
pub const HEADER_DICTIONARY: &[u8] =
    b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\x00\x00\
      \x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset\x00\x00\
      \x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges\x00\x00\
      \x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-control\x00\
      \x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\x00\x00\
      \x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location\x00\x00\x00\
      \x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04dat\
      e\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\
      \x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\x00\x0dif-non\
      e-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\x0dlast-modi\
      fied\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00\x00\x12\
      proxy-authenticate\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07r\
      eferer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07tr\
      ailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\x00\
      \x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\
      \x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\
      \x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\x0a\
      set-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin100101201202205206300302303304305\
      306307402405406407408409410411412413414415416417502504505203 Non-Authoritative Information2\
      04 No Content301 Moved Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found\
      500 Internal Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun \
      Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,i\
      mage/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascri\
      pt,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

const WINDOW: usize = miniz_oxide::inflate::core::TINFL_LZ_DICT_SIZE;

#[derive(Debug, thiserror::Error)]
pub enum HeaderCompressionError {
    #[error("invalid zlib header in SPDY header block")]
    ZlibHeader,
    #[error("SPDY header block uses an unknown dictionary {0:#x}")]
    Dictionary(u32),
    #[error("corrupt SPDY header block ({0:?})")]
    Inflate(TINFLStatus),
    #[error("SPDY header block too large")]
    TooLarge,
    #[error("compressing a SPDY header block: {0}")]
    Deflate(String),
}

/// Decompresses the header blocks one peer sends on a connection.
pub struct HeaderInflater {
    state: Box<DecompressorOxide>,
    window: Vec<u8>,
    pos: usize,
    /// Bytes of the zlib header still to be seen (2, or 6 with FDICT).
    header: Vec<u8>,
    header_done: bool,
}

impl Default for HeaderInflater {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderInflater {
    pub fn new() -> Self {
        let mut window = vec![0u8; WINDOW];
        window[..HEADER_DICTIONARY.len()].copy_from_slice(HEADER_DICTIONARY);
        HeaderInflater {
            state: Box::default(),
            window,
            pos: HEADER_DICTIONARY.len(),
            header: Vec::with_capacity(6),
            header_done: false,
        }
    }

    /// Inflates the next compressed header block (everything up to its sync flush).
    pub fn inflate(&mut self, mut input: &[u8], limit: usize) -> Result<Vec<u8>, HeaderCompressionError> {
        if !self.header_done {
            while !self.header_done && !input.is_empty() {
                self.header.push(input[0]);
                input = &input[1..];
                self.check_header()?;
            }
        }
        let mut out = Vec::new();
        loop {
            let flags = inflate_flags::TINFL_FLAG_HAS_MORE_INPUT;
            let (status, used, written) = decompress(&mut self.state, input, &mut self.window, self.pos, flags);
            out.extend_from_slice(&self.window[self.pos..self.pos + written]);
            if out.len() > limit {
                return Err(HeaderCompressionError::TooLarge);
            }
            self.pos = (self.pos + written) & (WINDOW - 1);
            input = &input[used..];
            match status {
                TINFLStatus::HasMoreOutput => continue,
                TINFLStatus::NeedsMoreInput | TINFLStatus::Done if input.is_empty() => return Ok(out),
                TINFLStatus::NeedsMoreInput => continue,
                other => return Err(HeaderCompressionError::Inflate(other)),
            }
        }
    }

    fn check_header(&mut self) -> Result<(), HeaderCompressionError> {
        if self.header.len() < 2 {
            return Ok(());
        }
        let (cmf, flg) = (self.header[0], self.header[1]);
        if cmf & 0x0f != 8 || cmf >> 4 > 7 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
            return Err(HeaderCompressionError::ZlibHeader);
        }
        let fdict = flg & 0x20 != 0;
        if !fdict {
            self.header_done = true;
        } else if self.header.len() == 6 {
            let id = u32::from_be_bytes([self.header[2], self.header[3], self.header[4], self.header[5]]);
            if id != adler32(HEADER_DICTIONARY) {
                return Err(HeaderCompressionError::Dictionary(id));
            }
            self.header_done = true;
        }
        Ok(())
    }
}

/// Compresses the header blocks we send on a connection.
pub struct HeaderDeflater {
    z: Compress,
}

impl Default for HeaderDeflater {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDeflater {
    pub fn new() -> Self {
        HeaderDeflater { z: Compress::new(Compression::default(), true) }
    }

    /// The compressed block, ending in a sync flush so the peer can decode it whole.
    pub fn deflate(&mut self, block: &[u8]) -> Result<Vec<u8>, HeaderCompressionError> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let start_in = self.z.total_in();
        loop {
            let consumed = (self.z.total_in() - start_in) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(block.len() + 64);
            }
            self.z
                .compress_vec(&block[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| HeaderCompressionError::Deflate(e.to_string()))?;
            let consumed = (self.z.total_in() - start_in) as usize;
            // Done once all input is in and the flush left spare room.
            if consumed == block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// Adler-32, for the dictionary id of an FDICT header.
pub fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

#[cfg(test)]
mod tests {
    use super::*;

    const PY_BLOCK_1: &[u8] = &[
        0x78, 0xbb, 0xe3, 0xc6, 0xa7, 0xc2, 0x02, 0xe5, 0x0e, 0x70, 0x3a, 0x2b, 0x29, 0x4a, 0x4d, 0xcc, 0x85, 0x16,
        0x25, 0xac, 0xa9, 0xa0, 0x80, 0x06, 0x32, 0x24, 0x2b, 0x74, 0x21, 0x12, 0xba, 0xc0, 0x5c, 0x58, 0x92, 0x9f,
        0x9c, 0x9f, 0xa3, 0x8b, 0x48, 0xb8, 0x82, 0x65, 0x26, 0x7a, 0x40, 0xe3, 0x81, 0x05, 0x62, 0x8e, 0x5e, 0xb6,
        0x45, 0xb1, 0x5e, 0x66, 0x3e, 0x00, 0x00, 0x00, 0xff, 0xff,
    ];
    const PY_BLOCK_2: &[u8] = &[
        0xc2, 0x6a, 0x18, 0x30, 0xf9, 0xa7, 0xe4, 0x83, 0x4b, 0x75, 0x60, 0x21, 0x5f, 0x04, 0xa2, 0x39, 0x2d, 0x0c,
        0x2c, 0x0c, 0x18, 0x2c, 0x0d, 0x2c, 0x0d, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff,
    ];

    #[test]
    fn dictionary_is_the_specs() {
        assert_eq!(HEADER_DICTIONARY.len(), 1423);
        assert_eq!(adler32(HEADER_DICTIONARY), 0xe3c6_a7c2);
        assert!(HEADER_DICTIONARY.ends_with(b"utf-,*,enq=0."));
    }

    /// Blocks made by Python's zlib with `compressobj(zdict=…)` and
    /// Z_SYNC_FLUSH, the way Go's spdy framer writes them.
    #[test]
    fn inflates_blocks_compressed_with_the_dictionary() {
        let mut inflater = HeaderInflater::new();
        let one = inflater.inflate(PY_BLOCK_1, 1 << 20).unwrap();
        let mut want = 2u32.to_be_bytes().to_vec();
        for (k, v) in [("streamtype", "error"), ("x-stream-protocol-version", "v4.channel.k8s.io")] {
            want.extend_from_slice(&(k.len() as u32).to_be_bytes());
            want.extend_from_slice(k.as_bytes());
            want.extend_from_slice(&(v.len() as u32).to_be_bytes());
            want.extend_from_slice(v.as_bytes());
        }
        assert_eq!(one, want);
        // The second block continues the same stream (and refers back into the first).
        let two = inflater.inflate(PY_BLOCK_2, 1 << 20).unwrap();
        assert!(two.windows(6).any(|w| w == b"stdout"));
        assert!(two.windows(9).any(|w| w == b"8080\x009090"));
    }

    #[test]
    fn wrong_dictionary_id_is_refused() {
        let mut bad = PY_BLOCK_1.to_vec();
        bad[5] ^= 1;
        assert!(matches!(HeaderInflater::new().inflate(&bad, 1 << 20), Err(HeaderCompressionError::Dictionary(_))));
    }

    #[test]
    fn deflated_blocks_round_trip_across_many_frames() {
        let (mut d, mut i) = (HeaderDeflater::new(), HeaderInflater::new());
        for n in 0..200 {
            let block: Vec<u8> = format!("streamtype data requestid {n} port 80{n}").into_bytes().repeat(n % 7 + 1);
            let packed = d.deflate(&block).unwrap();
            assert_eq!(i.inflate(&packed, 1 << 20).unwrap(), block, "block {n}");
        }
        // Big enough to wrap the 32 KiB window.
        let big: Vec<u8> = (0..100_000u32).map(|n| (n * 7 % 251) as u8).collect();
        let packed = d.deflate(&big).unwrap();
        assert_eq!(i.inflate(&packed, 1 << 20).unwrap(), big);
    }

    #[test]
    fn oversized_blocks_are_refused() {
        let (mut d, mut i) = (HeaderDeflater::new(), HeaderInflater::new());
        let packed = d.deflate(&[0u8; 5000]).unwrap();
        assert!(matches!(i.inflate(&packed, 4096), Err(HeaderCompressionError::TooLarge)));
    }
}
