//! Decodes Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`)
//! into the JSON a client would have sent for the same object.
//!
//! The body is the magic `k8s\0` followed by a `runtime.Unknown` message
//! (1 typeMeta {1 apiVersion, 2 kind}, 2 raw, 3 contentEncoding, 4 contentType);
//! `raw` is the object's own message. A plain wire-format reader walks it,
//! driven by the generated table in `schema.rs` (tags, JSON names, value types,
//! and the apimachinery types with their own JSON forms).

mod schema;
mod table;

use base64::Engine;
use serde_json::{Map, Number, Value};

use schema::{FIELDS, KINDS, MESSAGES};
use table::{Field, Message, Special, Ty, INLINE, MAP, OMIT, REP};

/// The 4 bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// How deep messages may nest (JSONSchemaProps is recursive).
const MAX_DEPTH: u32 = 100;

/// Kinds every group version accepts as bodies, decoded as their meta.k8s.io/v1 message.
const META_OPTION_KINDS: &[&str] =
    &["DeleteOptions", "CreateOptions", "UpdateOptions", "PatchOptions", "GetOptions", "ListOptions"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    #[error("the body does not start with the Kubernetes protobuf prefix \"k8s\\x00\"")]
    MissingMagic,
    #[error("no protobuf schema for apiVersion {api_version:?}, kind {kind:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("truncated protobuf data")]
    Truncated,
    #[error("malformed protobuf data: {0}")]
    Malformed(String),
    #[error("unsupported protobuf content encoding {0:?}")]
    UnsupportedEncoding(String),
}

type Result<T> = std::result::Result<T, ProtobufError>;

/// Decodes a whole body: magic, `runtime.Unknown` envelope, then the object,
/// with `apiVersion` and `kind` set from the envelope's type meta.
pub fn decode(body: &[u8]) -> Result<Value> {
    decode_depth(body, 0)
}

fn decode_depth(body: &[u8], depth: u32) -> Result<Value> {
    let rest = body.strip_prefix(MAGIC.as_slice()).ok_or(ProtobufError::MissingMagic)?;
    let (mut api_version, mut kind, mut raw, mut encoding, mut content_type) =
        (String::new(), String::new(), &[][..], String::new(), String::new());
    let mut r = Reader::new(rest);
    while let Some((tag, wt)) = r.key()? {
        match (tag, wt) {
            (1, LEN) => {
                let mut tm = Reader::new(r.bytes()?);
                while let Some((tag, wt)) = tm.key()? {
                    match (tag, wt) {
                        (1, LEN) => api_version = tm.string()?,
                        (2, LEN) => kind = tm.string()?,
                        _ => tm.skip(wt)?,
                    }
                }
            }
            (2, LEN) => raw = r.bytes()?,
            (3, LEN) => encoding = r.string()?,
            (4, LEN) => content_type = r.string()?,
            _ => r.skip(wt)?,
        }
    }
    if !encoding.is_empty() {
        return Err(ProtobufError::UnsupportedEncoding(encoding));
    }
    let mut obj = match content_type.as_str() {
        "" | "application/vnd.kubernetes.protobuf" => {
            let idx = lookup(&api_version, &kind)
                .ok_or_else(|| ProtobufError::UnknownKind { api_version: api_version.clone(), kind: kind.clone() })?;
            message(idx, raw, depth)?
        }
        "application/json" => {
            serde_json::from_slice(raw).map_err(|e| ProtobufError::Malformed(format!("embedded JSON: {e}")))?
        }
        other => return Err(ProtobufError::UnsupportedEncoding(other.to_string())),
    };
    if let Value::Object(map) = &mut obj {
        if !api_version.is_empty() {
            map.insert("apiVersion".into(), Value::String(api_version));
        }
        if !kind.is_empty() {
            map.insert("kind".into(), Value::String(kind));
        }
    }
    Ok(obj)
}

/// The message of a top-level kind.
fn lookup(api_version: &str, kind: &str) -> Option<u16> {
    let find = |av: &str| KINDS.binary_search_by(|(a, k, _)| (*a, *k).cmp(&(av, kind))).ok().map(|i| KINDS[i].2);
    find(api_version).or_else(|| if META_OPTION_KINDS.contains(&kind) { find("meta.k8s.io/v1") } else { None })
}

// ---------------------------------------------------------------- wire format

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(ProtobufError::Truncated)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtobufError::Malformed("varint longer than 10 bytes".into()))
    }

    /// The next field key, or None at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let tag = u32::try_from(k >> 3).map_err(|_| ProtobufError::Malformed("field number out of range".into()))?;
        if tag == 0 {
            return Err(ProtobufError::Malformed("field number 0".into()));
        }
        Ok(Some((tag, (k & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(ProtobufError::Truncated)?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| ProtobufError::Truncated)?)
    }

    fn string(&mut self) -> Result<String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }

    fn fixed64(&mut self) -> Result<u64> {
        let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| ProtobufError::Truncated)?;
        Ok(u64::from_le_bytes(b))
    }

    fn fixed32(&mut self) -> Result<u32> {
        let b: [u8; 4] = self.take(4)?.try_into().map_err(|_| ProtobufError::Truncated)?;
        Ok(u32::from_le_bytes(b))
    }

    fn skip(&mut self, wt: u8) -> Result<()> {
        match wt {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.take(4).map(drop),
            other => Err(ProtobufError::Malformed(format!("unsupported wire type {other}"))),
        }
    }
}

// ---------------------------------------------------------------- messages

fn fields_of(msg: &Message) -> &'static [Field] {
    &FIELDS[msg.first as usize..msg.first as usize + msg.len as usize]
}

fn field_by_tag(msg: &Message, tag: u32) -> Option<&'static Field> {
    let tag = u16::try_from(tag).ok()?;
    let fields = fields_of(msg);
    fields.binary_search_by_key(&tag, |f| f.tag).ok().map(|i| &fields[i])
}

/// Decodes one message into its JSON form.
fn message(idx: u16, data: &[u8], depth: u32) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(ProtobufError::Malformed("messages nested too deeply".into()));
    }
    let msg = &MESSAGES[idx as usize];
    match msg.special {
        Special::Plain => plain(msg, data, depth).map(Value::Object),
        Special::Time => {
            if data.is_empty() {
                return Ok(Value::Null);
            }
            let (secs, _) = timestamp(data)?;
            Ok(Value::String(format_time(secs, None)))
        }
        Special::MicroTime => {
            if data.is_empty() {
                return Ok(Value::Null);
            }
            let (secs, nanos) = timestamp(data)?;
            // Go normalises nanos outside [0, 1e9) into the seconds.
            let total = i128::from(secs) * 1_000_000_000 + i128::from(nanos);
            let secs = total.div_euclid(1_000_000_000) as i64;
            let micros = (total.rem_euclid(1_000_000_000) / 1000) as u32;
            Ok(Value::String(format_time(secs, Some(micros))))
        }
        Special::Duration => {
            let mut ns = 0i64;
            let mut r = Reader::new(data);
            while let Some((tag, wt)) = r.key()? {
                match (tag, wt) {
                    (1, VARINT) => ns = r.varint()? as i64,
                    _ => r.skip(wt)?,
                }
            }
            Ok(Value::String(go_duration(ns)))
        }
        Special::Quantity => {
            let s = single_bytes(data)?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            Ok(Value::String(if s.is_empty() { "0".into() } else { s }))
        }
        Special::IntOrString => {
            let (mut ty, mut int, mut s) = (0u64, 0i32, String::new());
            let mut r = Reader::new(data);
            while let Some((tag, wt)) = r.key()? {
                match (tag, wt) {
                    (1, VARINT) => ty = r.varint()?,
                    (2, VARINT) => int = r.varint()? as i32,
                    (3, LEN) => s = r.string()?,
                    _ => r.skip(wt)?,
                }
            }
            Ok(if ty == 1 { Value::String(s) } else { Value::from(int) })
        }
        Special::RawExtension => match single_bytes(data)? {
            None | Some([]) => Ok(Value::Null),
            Some(raw) if raw.starts_with(MAGIC) => decode_depth(raw, depth + 1),
            Some(raw) => raw_json(raw),
        },
        Special::FieldsV1 | Special::Json => match single_bytes(data)? {
            None | Some([]) => Ok(Value::Null),
            Some(raw) => raw_json(raw),
        },
        Special::StringList => {
            let mut items = Vec::new();
            let mut r = Reader::new(data);
            while let Some((tag, wt)) = r.key()? {
                match (tag, wt) {
                    (1, LEN) => items.push(Value::String(r.string()?)),
                    _ => r.skip(wt)?,
                }
            }
            Ok(Value::Array(items))
        }
        Special::SchemaOrArray | Special::SchemaOrBool | Special::SchemaOrStringArray => {
            let (mut schema, mut list, mut allows) = (None, Vec::new(), false);
            let mut r = Reader::new(data);
            while let Some((tag, wt)) = r.key()? {
                let f = field_by_tag(msg, tag);
                match (f, wt) {
                    (Some(f), LEN) if f.ty == Ty::Msg && f.flags & REP == 0 => {
                        schema = Some(message(f.msg, r.bytes()?, depth + 1)?)
                    }
                    (Some(f), LEN) if f.ty == Ty::Msg => list.push(message(f.msg, r.bytes()?, depth + 1)?),
                    (Some(f), LEN) if f.ty == Ty::Str => list.push(Value::String(r.string()?)),
                    (Some(f), VARINT) if f.ty == Ty::Bool => allows = r.varint()? != 0,
                    _ => r.skip(wt)?,
                }
            }
            Ok(match msg.special {
                Special::SchemaOrBool => schema.unwrap_or(Value::Bool(allows)),
                _ if !list.is_empty() => Value::Array(list),
                _ => schema.unwrap_or(Value::Null),
            })
        }
    }
}

/// A message of the common shape {1 bytes}: the last value of field 1.
fn single_bytes(data: &[u8]) -> Result<Option<&[u8]>> {
    let mut out = None;
    let mut r = Reader::new(data);
    while let Some((tag, wt)) = r.key()? {
        match (tag, wt) {
            (1, LEN) => out = Some(r.bytes()?),
            _ => r.skip(wt)?,
        }
    }
    Ok(out)
}

fn timestamp(data: &[u8]) -> Result<(i64, i32)> {
    let (mut secs, mut nanos) = (0i64, 0i32);
    let mut r = Reader::new(data);
    while let Some((tag, wt)) = r.key()? {
        match (tag, wt) {
            (1, VARINT) => secs = r.varint()? as i64,
            (2, VARINT) => nanos = r.varint()? as i32,
            _ => r.skip(wt)?,
        }
    }
    Ok((secs, nanos))
}

fn raw_json(raw: &[u8]) -> Result<Value> {
    serde_json::from_slice(raw).map_err(|e| ProtobufError::Malformed(format!("embedded raw JSON: {e}")))
}

/// An ordinary message: an object of its fields, by their JSON names.
fn plain(msg: &Message, data: &[u8], depth: u32) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    let mut r = Reader::new(data);
    while let Some((tag, wt)) = r.key()? {
        let Some(f) = field_by_tag(msg, tag) else {
            r.skip(wt)?;
            continue;
        };
        if f.flags & MAP != 0 {
            expect(msg, f, wt, LEN)?;
            let (k, v) = map_entry(msg, f, r.bytes()?, depth)?;
            match out.entry(f.name).or_insert_with(|| Value::Object(Map::new())) {
                Value::Object(m) => {
                    m.insert(k, v);
                }
                _ => unreachable!("map fields hold objects"),
            }
        } else if f.flags & REP != 0 {
            let arr = match out.entry(f.name).or_insert_with(|| Value::Array(Vec::new())) {
                Value::Array(a) => a,
                _ => unreachable!("repeated fields hold arrays"),
            };
            if wt == LEN && packable(f.ty) {
                let mut p = Reader::new(r.bytes()?);
                while p.pos < p.buf.len() {
                    arr.push(scalar(msg, f, native_wire_type(f.ty), &mut p)?);
                }
            } else {
                arr.push(value(msg, f, wt, &mut r, depth)?);
            }
        } else if f.flags & INLINE != 0 {
            expect(msg, f, wt, LEN)?;
            if let Value::Object(inner) = message(f.msg, r.bytes()?, depth + 1)? {
                out.extend(inner);
            }
        } else {
            let v = value(msg, f, wt, &mut r, depth)?;
            if f.flags & OMIT != 0 && is_zero(&v) {
                out.remove(f.name);
            } else {
                out.insert(f.name.to_string(), v);
            }
        }
    }
    Ok(out)
}

fn map_entry(owner: &Message, f: &Field, data: &[u8], depth: u32) -> Result<(String, Value)> {
    let (mut key, mut val) = (None, None);
    let mut r = Reader::new(data);
    while let Some((tag, wt)) = r.key()? {
        match tag {
            1 => {
                let k = Field { name: "key", tag: 1, ty: f.key, key: f.key, msg: 0, flags: 0 };
                key = Some(match scalar(owner, &k, wt, &mut r)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                });
            }
            2 => val = Some(value(owner, f, wt, &mut r, depth)?),
            _ => r.skip(wt)?,
        }
    }
    let val = match val {
        Some(v) => v,
        None if f.ty == Ty::Msg => message(f.msg, &[], depth + 1)?,
        None => zero(f.ty),
    };
    Ok((key.unwrap_or_default(), val))
}

fn expect(owner: &Message, f: &Field, got: u8, want: u8) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(ProtobufError::Malformed(format!(
            "{} field {} ({}) has wire type {got}, expected {want}",
            owner.name, f.tag, f.name
        )))
    }
}

/// One value of a field (a map's value, a list's element, or a singular field).
fn value(owner: &Message, f: &Field, wt: u8, r: &mut Reader, depth: u32) -> Result<Value> {
    if f.ty == Ty::Msg {
        expect(owner, f, wt, LEN)?;
        message(f.msg, r.bytes()?, depth + 1)
    } else {
        scalar(owner, f, wt, r)
    }
}

fn scalar(owner: &Message, f: &Field, wt: u8, r: &mut Reader) -> Result<Value> {
    expect(owner, f, wt, native_wire_type(f.ty))?;
    Ok(match f.ty {
        Ty::Str => Value::String(r.string()?),
        Ty::Bytes => Value::String(base64::engine::general_purpose::STANDARD.encode(r.bytes()?)),
        Ty::Bool => Value::Bool(r.varint()? != 0),
        Ty::I32 => Value::from(r.varint()? as i32),
        Ty::I64 => Value::from(r.varint()? as i64),
        Ty::U32 => Value::from(r.varint()? as u32),
        Ty::U64 => Value::from(r.varint()?),
        Ty::F64 => float(f64::from_bits(r.fixed64()?)),
        Ty::F32 => float(f64::from(f32::from_bits(r.fixed32()?))),
        Ty::Msg => unreachable!("messages are not scalars"),
    })
}

fn native_wire_type(ty: Ty) -> u8 {
    match ty {
        Ty::Str | Ty::Bytes | Ty::Msg => LEN,
        Ty::Bool | Ty::I32 | Ty::I64 | Ty::U32 | Ty::U64 => VARINT,
        Ty::F64 => I64,
        Ty::F32 => I32,
    }
}

fn packable(ty: Ty) -> bool {
    native_wire_type(ty) != LEN
}

/// Go writes integral floats without a fraction ("1", not "1.0").
fn float(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        Value::from(x as i64)
    } else {
        Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
    }
}

fn zero(ty: Ty) -> Value {
    match ty {
        Ty::Str | Ty::Bytes => Value::String(String::new()),
        Ty::Bool => Value::Bool(false),
        Ty::Msg => Value::Object(Map::new()),
        _ => Value::from(0),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
    }
}

// ---------------------------------------------------------------- Go formats

/// RFC 3339 in UTC, as Go's metav1.Time (seconds) and MicroTime (micros) write it.
fn format_time(secs: i64, micros: Option<u32>) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    match micros {
        Some(us) => format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z"),
        None => format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A duration in nanoseconds as Go's time.Duration.String writes it.
use crate::duration::format_nanos as go_duration;

#[cfg(test)]
mod tests;
