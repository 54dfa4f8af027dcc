//! The HPACK (RFC 7541) that `AuthorityFix` needs: a decoder of the
//! client's header blocks, and a stateless encoder of the rewritten ones.
//!
//! The decoder keeps the client's dynamic table, as it must to read any
//! later block. Huffman strings are decoded with the canonical code's
//! first-code-per-length tables, built once: a few array reads per bit.
//!
//! The encoder never inserts into the server's dynamic table (static
//! indexes and literals without indexing only), so the server's table stays
//! empty and nothing has to be kept in step with it.

use std::collections::VecDeque;
use std::sync::OnceLock;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("integer overflows its representation")]
    Integer,
    #[error("header block ends inside a representation")]
    Truncated,
    #[error("index {0} is in neither table")]
    Index(usize),
    #[error("invalid Huffman string")]
    Huffman,
    #[error("dynamic table size {0} exceeds the announced {1}")]
    TableSize(usize, usize),
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The Huffman code's length in bits of each symbol, 0..=255 and EOS
/// (RFC 7541 Appendix B). The code is canonical, so the lengths define it.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28,
    28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12,
    10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6,
    5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22,
    22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20,
    22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28,
    27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28,
    27, 27, 27, 27, 27, 26, 30,
];
const EOS: u16 = 256;
const MAX_CODE_LEN: usize = 30;

/// The canonical code by length: codes of `len` bits run from `first[len]`
/// for `count[len]` symbols, which are `symbols[offset[len]..]`.
struct Huffman {
    first: [u32; MAX_CODE_LEN + 1],
    count: [u32; MAX_CODE_LEN + 1],
    offset: [usize; MAX_CODE_LEN + 1],
    symbols: Vec<u16>,
}

fn huffman() -> &'static Huffman {
    static TABLE: OnceLock<Huffman> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut symbols: Vec<u16> = (0..=EOS).collect();
        symbols.sort_by_key(|&s| (HUFFMAN_LENGTHS[usize::from(s)], s));
        let mut h = Huffman {
            first: [0; MAX_CODE_LEN + 1],
            count: [0; MAX_CODE_LEN + 1],
            offset: [0; MAX_CODE_LEN + 1],
            symbols,
        };
        for &len in &HUFFMAN_LENGTHS {
            h.count[usize::from(len)] += 1;
        }
        let (mut code, mut at) = (0u32, 0usize);
        for len in 1..=MAX_CODE_LEN {
            code = (code + h.count[len - 1]) << 1;
            h.first[len] = code;
            h.offset[len] = at;
            at += h.count[len] as usize;
        }
        h
    })
}

/// Decodes a Huffman-coded string (RFC 7541 5.2): the padding must be the
/// EOS code's leading ones, at most 7 bits, and EOS itself may not appear.
fn decode_huffman(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let h = huffman();
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in bytes {
        for bit in (0..8).rev() {
            code = code << 1 | u32::from(byte >> bit & 1);
            len += 1;
            if len > MAX_CODE_LEN {
                return Err(HpackError::Huffman);
            }
            let index = code.wrapping_sub(h.first[len]);
            if code >= h.first[len] && index < h.count[len] {
                let symbol = h.symbols[h.offset[len] + index as usize];
                if symbol == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, all ones.
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(())
}

/// Reads an integer with an `n`-bit prefix (RFC 7541 5.1) at `at`.
fn integer(block: &[u8], at: &mut usize, n: u8) -> Result<usize, HpackError> {
    let mask = (1usize << n) - 1;
    let first = *block.get(*at).ok_or(HpackError::Truncated)?;
    *at += 1;
    let mut value = usize::from(first) & mask;
    if value < mask {
        return Ok(value);
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        let add = usize::from(byte & 0x7f).checked_shl(shift).filter(|_| shift <= 28).ok_or(HpackError::Integer)?;
        value = value.checked_add(add).ok_or(HpackError::Integer)?;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// Reads a string literal (RFC 7541 5.2) at `at`.
fn string(block: &[u8], at: &mut usize) -> Result<Vec<u8>, HpackError> {
    let huffman = block.get(*at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(block, at, 7)?;
    let end = at.checked_add(len).filter(|&e| e <= block.len()).ok_or(HpackError::Truncated)?;
    let raw = &block[*at..end];
    *at = end;
    if !huffman {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::with_capacity(len * 8 / 5);
    decode_huffman(raw, &mut out)?;
    Ok(out)
}

/// A header field: name and value.
pub type Field = (Vec<u8>, Vec<u8>);

/// The receiving side of one connection's header compression.
pub struct Decoder {
    /// Newest first.
    dynamic: VecDeque<Field>,
    size: usize,
    max_size: usize,
    /// What the server announced (SETTINGS_HEADER_TABLE_SIZE).
    allowed: usize,
}

impl Decoder {
    pub fn new(allowed: usize) -> Self {
        Decoder { dynamic: VecDeque::new(), size: 0, max_size: allowed, allowed }
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            1..=61 => {
                let (n, v) = STATIC_TABLE[index - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            _ => index
                .checked_sub(62)
                .and_then(|i| self.dynamic.get(i))
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
                .ok_or(HpackError::Index(index)),
        }
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.dynamic.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max_size {
            // An entry larger than the table empties it (RFC 7541 4.4).
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.dynamic.push_front((name, value));
    }

    /// The fields of one header block, in order.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut at = 0;
        while at < block.len() {
            let first = block[at];
            if first & 0x80 != 0 {
                let index = integer(block, &mut at, 7)?;
                let (n, v) = self.entry(index)?;
                fields.push((n.to_vec(), v.to_vec()));
            } else if first & 0xe0 == 0x20 {
                let size = integer(block, &mut at, 5)?;
                if size > self.allowed {
                    return Err(HpackError::TableSize(size, self.allowed));
                }
                self.max_size = size;
                self.evict_to(size);
            } else {
                // A literal: with incremental indexing (01), without (0000)
                // or never indexed (0001).
                let indexing = first & 0x40 != 0;
                let index = integer(block, &mut at, if indexing { 6 } else { 4 })?;
                let name = match index {
                    0 => string(block, &mut at)?,
                    i => self.entry(i)?.0.to_vec(),
                };
                let value = string(block, &mut at)?;
                if indexing {
                    self.insert(name.clone(), value.clone());
                }
                fields.push((name, value));
            }
        }
        Ok(fields)
    }
}

fn put_integer(out: &mut Vec<u8>, flags: u8, n: u8, value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Encodes `fields` without touching the receiver's dynamic table: a field
/// the static table holds whole is indexed, any other is a literal without
/// indexing (its name indexed when the static table has it), raw strings.
pub fn encode<'a>(fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        let whole = STATIC_TABLE.iter().position(|&(n, v)| n.as_bytes() == name && v.as_bytes() == value);
        if let Some(i) = whole {
            put_integer(&mut out, 0x80, 7, i + 1);
            continue;
        }
        match STATIC_TABLE.iter().position(|&(n, _)| n.as_bytes() == name) {
            Some(i) => put_integer(&mut out, 0x00, 4, i + 1),
            None => {
                put_integer(&mut out, 0x00, 4, 0);
                put_integer(&mut out, 0x00, 7, name.len());
                out.extend_from_slice(name);
            }
        }
        put_integer(&mut out, 0x00, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    fn pairs(fields: &[(&str, &str)]) -> Vec<Field> {
        fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn rfc_7541_huffman_requests_decode_with_the_dynamic_table() {
        // RFC 7541 C.4: three requests on one connection, Huffman-coded.
        let mut d = Decoder::new(4096);
        let first = d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")).expect("C.4.1");
        assert_eq!(
            first,
            pairs(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")])
        );
        let second = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).expect("C.4.2");
        assert_eq!(
            second,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        let third = d.decode(&hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf")).expect("C.4.3");
        assert_eq!(
            third,
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(d.size, 164);
    }

    #[test]
    fn what_another_encoder_writes_reads_back() {
        let mut theirs = loona_hpack::Encoder::new();
        let mut d = Decoder::new(4096);
        let fields = [(":method", "POST"), (":path", "/etcdserverpb.KV/Txn"), ("te", "trailers"), ("x", "é")];
        for _ in 0..3 {
            let block = theirs.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
            assert_eq!(d.decode(&block).expect("decode"), pairs(&fields));
        }
    }

    #[test]
    fn the_encoder_is_read_by_another_decoder_and_leaves_its_table_empty() {
        let fields = pairs(&[(":method", "POST"), (":authority", "127.0.0.1:2379"), ("grpc-timeout", "5S")]);
        let block = encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut theirs = loona_hpack::Decoder::new();
        assert_eq!(theirs.decode(&block).expect("decode"), fields);
        let mut ours = Decoder::new(4096);
        assert_eq!(ours.decode(&block).expect("decode"), fields);
        assert!(ours.dynamic.is_empty());
    }

    #[test]
    fn bad_blocks_are_errors() {
        let mut d = Decoder::new(4096);
        assert_eq!(d.decode(&[0xbe]), Err(HpackError::Index(62)));
        assert_eq!(d.decode(&[0x41, 0x85, 0xf1]), Err(HpackError::Truncated));
        // Padding that is not the EOS prefix.
        assert_eq!(d.decode(&[0x41, 0x81, 0x00]), Err(HpackError::Huffman));
        assert_eq!(d.decode(&[0x3f, 0xe2, 0x1f]), Err(HpackError::TableSize(4097, 4096)));
        assert_eq!(d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), Err(HpackError::Integer));
    }

    #[test]
    fn a_smaller_table_evicts_the_oldest() {
        let mut d = Decoder::new(4096);
        d.decode(&[&[0x40, 0x01, b'a', 0x01, b'1'][..], &[0x40, 0x01, b'b', 0x01, b'2']].concat()).expect("insert");
        assert_eq!(d.size, 68);
        // Size update to 34 bytes: only the newest entry fits.
        d.decode(&[0x3f, 0x03]).expect("resize");
        assert_eq!(d.decode(&[0xbe]).expect("index"), pairs(&[("b", "2")]));
        assert_eq!(d.decode(&[0xbf]), Err(HpackError::Index(63)));
    }
}
