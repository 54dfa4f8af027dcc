//! Hostile input, generated: random and almost-valid JSON values, strings
//! with multi-byte characters at awkward places, selectors made of the
//! grammar's own tokens in the wrong order, and protobuf bodies cut short.
//! A small seeded generator rather than proptest: the same inputs every run
//! (a failure names its seed and case), no shrinking needed for inputs this
//! small, and no extra crates to compile on a shared two-core machine.

#![allow(dead_code)]

use serde_json::{json, Map, Value};

/// xorshift64*: fast, seedable, good enough to pick among choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Pieces strings are made of: plain, multi-byte, control, directive-like.
const PIECES: &[&str] = &[
    "a",
    "web",
    "-",
    ".",
    "x1",
    "é",
    "日本",
    "😀",
    "\u{0}",
    "\u{202e}",
    "\"",
    "\\",
    "/",
    "%",
    " ",
    "=",
    ",",
    "(",
    ")",
    "!",
    "$patch",
    "null",
    "0",
    "-1",
    "9999999999999999999999",
    "k8s",
    "\n",
    "ü",
    "ß",
    "中文字符",
];

pub fn string(rng: &mut Rng) -> String {
    let n = if rng.chance(5) { 40 + rng.below(300) } else { rng.below(12) };
    (0..n).map(|_| *rng.pick(PIECES)).collect()
}

/// `len` bytes of ASCII then a multi-byte character across `at`: the shape
/// that broke generateName's slicing at byte 58.
pub fn straddling(len: usize, at: usize, ch: char) -> String {
    let mut s: String = "a".repeat(at.saturating_sub(1));
    s.push(ch);
    while s.len() < len {
        s.push('b');
    }
    s
}

/// Keys that mean something somewhere, and directives.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "generateName",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "managedFields",
    "resourceVersion",
    "spec",
    "status",
    "replicas",
    "selector",
    "matchLabels",
    "template",
    "containers",
    "initContainers",
    "image",
    "ports",
    "containerPort",
    "port",
    "protocol",
    "env",
    "value",
    "volumeMounts",
    "mountPath",
    "volumes",
    "tolerations",
    "conditions",
    "type",
    "data",
    "items",
    "resources",
    "limits",
    "cpu",
    "memory",
    "$patch",
    "$retainKeys",
    "$setElementOrder/containers",
    "$deleteFromPrimitiveList/finalizers",
    "strategy",
    "op",
    "path",
    "from",
    "uid",
];

pub fn scalar(rng: &mut Rng) -> Value {
    match rng.below(9) {
        0 => Value::Null,
        1 => json!(rng.chance(50)),
        2 => json!(rng.next() as i64),
        3 => json!(*rng.pick(&[0i64, -1, 1, i64::MAX, i64::MIN, 2147483648, 3])),
        4 => json!(*rng.pick(&[1.5f64, -0.0, 1e300, 3.0])),
        5 => json!(*rng.pick(&["replace", "delete", "merge", "add", "remove", "test", "move", "copy"])),
        _ => json!(string(rng)),
    }
}

pub fn value(rng: &mut Rng, depth: u32) -> Value {
    if depth == 0 || rng.chance(30) {
        return scalar(rng);
    }
    match rng.below(3) {
        0 => Value::Array((0..rng.below(4)).map(|_| value(rng, depth - 1)).collect()),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(5) {
                let k = if rng.chance(85) { rng.pick(KEYS).to_string() } else { string(rng) };
                m.insert(k, value(rng, depth - 1));
            }
            Value::Object(m)
        }
    }
}

/// An object shaped like a Kubernetes object, with parts of the wrong
/// shape or out of range: what a confused or hostile client sends.
pub fn object_like(rng: &mut Rng, api_version: &str, kind: &str) -> Value {
    let mut obj = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": format!("fz-{}", rng.next() % 100_000)},
        "spec": {"containers": [{"name": "c", "image": "i"}], "replicas": 1},
        "data": {"k": "v"},
    });
    for _ in 0..1 + rng.below(3) {
        let path = *rng.pick(&[
            "/metadata",
            "/metadata/name",
            "/metadata/generateName",
            "/metadata/labels",
            "/metadata/finalizers",
            "/metadata/ownerReferences",
            "/metadata/managedFields",
            "/spec",
            "/spec/replicas",
            "/spec/containers",
            "/spec/containers/0",
            "/spec/containers/0/ports",
            "/spec/containers/0/resources",
            "/spec/selector",
            "/data",
            "/data/k",
            "/status",
            "/kind",
            "/apiVersion",
        ]);
        let v = value(rng, 3);
        set_pointer(&mut obj, path, v);
    }
    if rng.chance(10) {
        obj = value(rng, 3);
    }
    obj
}

fn set_pointer(obj: &mut Value, path: &str, v: Value) {
    let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
    match obj.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last.to_string(), v);
        }
        Some(Value::Array(a)) => {
            if let Some(slot) = last.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                *slot = v;
            }
        }
        _ => {}
    }
}

const SELECTOR_TOKENS: &[&str] = &[
    "app",
    "tier",
    "a.b/c",
    "metadata.name",
    "spec.nodeName",
    "status.phase",
    "spec.unschedulable",
    "=",
    "==",
    "!=",
    " in ",
    " notin ",
    "!",
    "(",
    ")",
    ",",
    ">",
    "<",
    "web",
    "5",
    "é",
    "😀",
    " ",
    "",
    "\\",
    "=,",
    "x=y=z",
    "spec.bogus",
    "metadata.namespace",
];

pub fn selector(rng: &mut Rng) -> String {
    (0..rng.below(8)).map(|_| *rng.pick(SELECTOR_TOKENS)).collect()
}

/// Cuts, flips and splices `bytes`.
pub fn mutate(rng: &mut Rng, bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    match rng.below(4) {
        0 => out.truncate(rng.below(out.len() + 1)),
        1 => {
            for _ in 0..1 + rng.below(4) {
                if !out.is_empty() {
                    let i = rng.below(out.len());
                    out[i] ^= 1 << rng.below(8);
                }
            }
        }
        2 => {
            let i = rng.below(out.len() + 1);
            let junk: Vec<u8> = (0..rng.below(8)).map(|_| rng.next() as u8).collect();
            out.splice(i..i, junk);
        }
        _ => out = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
    }
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field(tag: u64, wire: u64, out: &mut Vec<u8>) {
    varint(tag << 3 | wire, out);
}

fn len_field(tag: u64, data: &[u8], out: &mut Vec<u8>) {
    field(tag, 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// Random protobuf fields, nested a little: the raw object of an envelope.
fn protobuf_fields(rng: &mut Rng, depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(6) {
        let tag = 1 + rng.below(20) as u64;
        match rng.below(4) {
            0 => {
                field(tag, 0, &mut out);
                varint(rng.next() >> rng.below(64), &mut out);
            }
            1 if depth > 0 => {
                let inner = protobuf_fields(rng, depth - 1);
                len_field(tag, &inner, &mut out);
            }
            2 => len_field(tag, string(rng).as_bytes(), &mut out),
            _ => {
                // A length that lies.
                field(tag, 2, &mut out);
                varint(rng.next() % 1_000_000, &mut out);
            }
        }
    }
    out
}

/// A Kubernetes protobuf body (`k8s\0` + runtime.Unknown) around random,
/// often truncated, fields.
pub fn protobuf(rng: &mut Rng) -> Vec<u8> {
    let kind = *rng.pick(&["Pod", "ConfigMap", "Secret", "Service", "Namespace", "Deployment", "Nope"]);
    let api_version = if kind == "Deployment" { "apps/v1" } else { "v1" };
    let mut type_meta = Vec::new();
    len_field(1, api_version.as_bytes(), &mut type_meta);
    len_field(2, kind.as_bytes(), &mut type_meta);
    let mut unknown = Vec::new();
    len_field(1, &type_meta, &mut unknown);
    len_field(2, &protobuf_fields(rng, 3), &mut unknown);
    let mut body = b"k8s\x00".to_vec();
    body.extend(unknown);
    if rng.chance(50) {
        body = mutate(rng, &body);
    }
    body
}
