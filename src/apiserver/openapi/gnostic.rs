//! The protobuf form of the Swagger 2.0 document
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`): gnostic's
//! `openapi.v2.Document` message, which kubectl up to 1.2x downloads for
//! `explain`, client-side validation and its server-side dry-run check.
//!
//! The message is written straight from the JSON document with prost's
//! wire-format primitives; the field numbers are those of gnostic's
//! `openapiv2/OpenAPIv2.proto`. Vendor extensions, defaults, enums and
//! examples are gnostic `Any`s holding YAML text: JSON is YAML, so they
//! carry the value's JSON. Keys the message has no field for are left out.

use prost::encoding::{encode_key, encode_varint, WireType};
use serde_json::{Map, Value};

type Buf = Vec<u8>;

fn len_delimited(buf: &mut Buf, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

/// A nested message, written even when empty (a oneof member is present).
fn message(buf: &mut Buf, tag: u32, write: impl FnOnce(&mut Buf)) {
    let mut inner = Vec::new();
    write(&mut inner);
    len_delimited(buf, tag, &inner);
}

fn string(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str).filter(|s| !s.is_empty()) {
        len_delimited(buf, tag, s.as_bytes());
    }
}

fn strings(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    match v {
        Some(Value::Array(items)) => items.iter().for_each(|s| string(buf, tag, Some(s))),
        one => string(buf, tag, one),
    }
}

fn boolean(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    if v == Some(&Value::Bool(true)) {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(1, buf);
    }
}

fn double(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    if let Some(f) = v.and_then(Value::as_f64).filter(|f| *f != 0.0) {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&f.to_le_bytes());
    }
}

fn int64(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    if let Some(i) = v.and_then(Value::as_i64).filter(|i| *i != 0) {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(i as u64, buf);
    }
}

/// gnostic's `Any`: `yaml = 2`.
fn any(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    if let Some(v) = v {
        message(buf, tag, |b| len_delimited(b, 2, v.to_string().as_bytes()));
    }
}

fn anys(buf: &mut Buf, tag: u32, v: Option<&Value>) {
    for item in v.and_then(Value::as_array).into_iter().flatten() {
        any(buf, tag, Some(item));
    }
}

/// `NamedAny`s (`name = 1`, `value = 2`) for the `x-` keys of `m`.
fn vendor_extensions(buf: &mut Buf, tag: u32, m: &Map<String, Value>) {
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        message(buf, tag, |b| {
            len_delimited(b, 1, k.as_bytes());
            any(b, 2, Some(v));
        });
    }
}

/// `Named*` entries (`name = 1`, `value = 2`) of a JSON object.
fn named(buf: &mut Buf, tag: u32, v: Option<&Value>, write: impl Fn(&mut Buf, &Value)) {
    for (name, value) in v.and_then(Value::as_object).into_iter().flatten() {
        message(buf, tag, |b| {
            len_delimited(b, 1, name.as_bytes());
            message(b, 2, |b| write(b, value));
        });
    }
}

/// `Schema`.
fn schema(buf: &mut Buf, s: &Value) {
    let Some(m) = s.as_object() else { return };
    string(buf, 1, m.get("$ref"));
    string(buf, 2, m.get("format"));
    string(buf, 3, m.get("title"));
    string(buf, 4, m.get("description"));
    any(buf, 5, m.get("default"));
    double(buf, 6, m.get("multipleOf"));
    double(buf, 7, m.get("maximum"));
    boolean(buf, 8, m.get("exclusiveMaximum"));
    double(buf, 9, m.get("minimum"));
    boolean(buf, 10, m.get("exclusiveMinimum"));
    int64(buf, 11, m.get("maxLength"));
    int64(buf, 12, m.get("minLength"));
    string(buf, 13, m.get("pattern"));
    int64(buf, 14, m.get("maxItems"));
    int64(buf, 15, m.get("minItems"));
    boolean(buf, 16, m.get("uniqueItems"));
    int64(buf, 17, m.get("maxProperties"));
    int64(buf, 18, m.get("minProperties"));
    strings(buf, 19, m.get("required"));
    anys(buf, 20, m.get("enum"));
    match m.get("additionalProperties") {
        // AdditionalPropertiesItem: schema = 1, boolean = 2 (a oneof, so
        // `false` is written too).
        Some(Value::Bool(b)) => message(buf, 21, |x| {
            encode_key(2, WireType::Varint, x);
            encode_varint(u64::from(*b), x);
        }),
        Some(additional) => message(buf, 21, |x| message(x, 1, |x| schema(x, additional))),
        None => {}
    }
    if m.contains_key("type") {
        // TypeItem: value = 1.
        message(buf, 22, |x| strings(x, 1, m.get("type")));
    }
    match m.get("items") {
        // ItemsItem: schema = 1, repeated.
        Some(Value::Array(items)) => message(buf, 23, |x| items.iter().for_each(|i| message(x, 1, |x| schema(x, i)))),
        Some(item) => message(buf, 23, |x| message(x, 1, |x| schema(x, item))),
        None => {}
    }
    for s in m.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        message(buf, 24, |x| schema(x, s));
    }
    if let Some(props) = m.get("properties") {
        // Properties: additional_properties = 1 (NamedSchema).
        message(buf, 25, |x| named(x, 1, Some(props), schema));
    }
    string(buf, 26, m.get("discriminator"));
    boolean(buf, 27, m.get("readOnly"));
    any(buf, 30, m.get("example"));
    vendor_extensions(buf, 31, m);
}

/// The fields of a primitive parameter or `PrimitivesItems` from `type` on,
/// which both number alike from where `type` is.
fn primitive_fields(buf: &mut Buf, m: &Map<String, Value>, ty: u32) {
    string(buf, ty, m.get("type"));
    string(buf, ty + 1, m.get("format"));
    if let Some(items) = m.get("items").and_then(Value::as_object) {
        message(buf, ty + 2, |x| primitive_fields(x, items, 1));
    }
    string(buf, ty + 3, m.get("collectionFormat"));
    any(buf, ty + 4, m.get("default"));
    double(buf, ty + 5, m.get("maximum"));
    boolean(buf, ty + 6, m.get("exclusiveMaximum"));
    double(buf, ty + 7, m.get("minimum"));
    boolean(buf, ty + 8, m.get("exclusiveMinimum"));
    int64(buf, ty + 9, m.get("maxLength"));
    int64(buf, ty + 10, m.get("minLength"));
    string(buf, ty + 11, m.get("pattern"));
    int64(buf, ty + 12, m.get("maxItems"));
    int64(buf, ty + 13, m.get("minItems"));
    boolean(buf, ty + 14, m.get("uniqueItems"));
    anys(buf, ty + 15, m.get("enum"));
    double(buf, ty + 16, m.get("multipleOf"));
    vendor_extensions(buf, ty + 17, m);
}

/// `Parameter`: a body parameter (1) or a non-body one (2) in its
/// sub-schema by where it goes (header 1, formData 2, query 3, path 4).
fn parameter(buf: &mut Buf, p: &Value) {
    let Some(m) = p.as_object() else { return };
    let place = m.get("in").and_then(Value::as_str).unwrap_or_default();
    if place == "body" {
        message(buf, 1, |b| {
            string(b, 1, m.get("description"));
            string(b, 2, m.get("name"));
            string(b, 3, m.get("in"));
            boolean(b, 4, m.get("required"));
            if let Some(s) = m.get("schema") {
                message(b, 5, |b| schema(b, s));
            }
            vendor_extensions(b, 6, m);
        });
        return;
    }
    let (tag, allows_empty) = match place {
        "header" => (1, false),
        "formData" => (2, true),
        "query" => (3, true),
        _ => (4, false),
    };
    message(buf, 2, |b| {
        message(b, tag, |b| {
            boolean(b, 1, m.get("required"));
            string(b, 2, m.get("in"));
            string(b, 3, m.get("description"));
            string(b, 4, m.get("name"));
            if allows_empty {
                boolean(b, 5, m.get("allowEmptyValue"));
            }
            primitive_fields(b, m, if allows_empty { 6 } else { 5 });
        })
    });
}

/// `ParametersItem`: a parameter (1) or a reference to one (2).
fn parameters_item(buf: &mut Buf, tag: u32, p: &Value) {
    message(buf, tag, |b| match p.get("$ref") {
        Some(r) => message(b, 2, |b| string(b, 1, Some(r))),
        None => message(b, 1, |b| parameter(b, p)),
    });
}

/// `Responses`: `NamedResponseValue`s, whose value is a `Response` (1).
fn responses(buf: &mut Buf, r: &Value) {
    let Some(m) = r.as_object() else { return };
    for (code, resp) in m.iter().filter(|(k, _)| !k.starts_with("x-")) {
        message(buf, 1, |b| {
            len_delimited(b, 1, code.as_bytes());
            message(b, 2, |b| match resp.get("$ref") {
                Some(r) => message(b, 2, |b| string(b, 1, Some(r))),
                None => message(b, 1, |b| {
                    string(b, 1, resp.get("description"));
                    if let Some(s) = resp.get("schema") {
                        // SchemaItem: schema = 1.
                        message(b, 2, |b| message(b, 1, |b| schema(b, s)));
                    }
                    if let Some(ext) = resp.as_object() {
                        vendor_extensions(b, 5, ext);
                    }
                }),
            });
        });
    }
    vendor_extensions(buf, 2, m);
}

fn operation(buf: &mut Buf, op: &Value) {
    let Some(m) = op.as_object() else { return };
    strings(buf, 1, m.get("tags"));
    string(buf, 2, m.get("summary"));
    string(buf, 3, m.get("description"));
    string(buf, 5, m.get("operationId"));
    strings(buf, 6, m.get("produces"));
    strings(buf, 7, m.get("consumes"));
    for p in m.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        parameters_item(buf, 8, p);
    }
    if let Some(r) = m.get("responses") {
        message(buf, 9, |b| responses(b, r));
    }
    strings(buf, 10, m.get("schemes"));
    boolean(buf, 11, m.get("deprecated"));
    vendor_extensions(buf, 13, m);
}

fn path_item(buf: &mut Buf, item: &Value) {
    let Some(m) = item.as_object() else { return };
    string(buf, 1, m.get("$ref"));
    for (method, tag) in [("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("options", 6), ("head", 7), ("patch", 8)]
    {
        if let Some(op) = m.get(method) {
            message(buf, tag, |b| operation(b, op));
        }
    }
    for p in m.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        parameters_item(buf, 9, p);
    }
    vendor_extensions(buf, 10, m);
}

/// `SecurityDefinitionsItem`: basic (1) or API key (2) schemes.
fn security_definition(buf: &mut Buf, d: &Value) {
    match d.get("type").and_then(Value::as_str) {
        Some("basic") => message(buf, 1, |b| {
            string(b, 1, d.get("type"));
            string(b, 2, d.get("description"));
        }),
        Some("apiKey") => message(buf, 2, |b| {
            string(b, 1, d.get("type"));
            string(b, 2, d.get("name"));
            string(b, 3, d.get("in"));
            string(b, 4, d.get("description"));
        }),
        _ => {}
    }
}

/// Writes the document into one buffer as it comes: its small fields,
/// then the `Definitions` message (one `NamedSchema` at a time), then the
/// `Paths` message (one `NamedPathItem` at a time). A section's length is
/// only known at its end: it is written then, and the section moved up to
/// the varint's size. Fields out of number order are valid protobuf.
pub struct ProtobufWriter {
    out: Buf,
    /// The open section's tag and where its content starts.
    open: Option<(u32, usize)>,
}

/// Room left for a section's length, the most a 32-bit varint takes.
const LENGTH_ROOM: usize = 5;

impl ProtobufWriter {
    /// A writer whose buffer starts at `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> ProtobufWriter {
        ProtobufWriter { out: Vec::with_capacity(capacity), open: None }
    }

    fn close(&mut self) {
        let Some((_, start)) = self.open.take() else { return };
        let len = self.out.len() - start;
        let mut varint = Vec::with_capacity(LENGTH_ROOM);
        encode_varint(len as u64, &mut varint);
        let at = start - LENGTH_ROOM;
        self.out.splice(at..start, varint);
    }

    fn section(&mut self, tag: u32) -> &mut Buf {
        if self.open.map(|(t, _)| t) != Some(tag) {
            self.close();
            encode_key(tag, WireType::LengthDelimited, &mut self.out);
            self.out.extend_from_slice(&[0; LENGTH_ROOM]);
            self.open = Some((tag, self.out.len()));
        }
        &mut self.out
    }
}

impl super::swagger::DocumentWriter for ProtobufWriter {
    fn start(&mut self, head: &Value) {
        let buf = &mut self.out;
        let Some(m) = head.as_object() else { return };
        string(buf, 1, m.get("swagger"));
        if let Some(info) = m.get("info") {
            message(buf, 2, |b| {
                string(b, 1, info.get("title"));
                string(b, 2, info.get("version"));
                string(b, 3, info.get("description"));
            });
        }
        string(buf, 3, m.get("host"));
        string(buf, 4, m.get("basePath"));
        strings(buf, 5, m.get("schemes"));
        strings(buf, 6, m.get("consumes"));
        strings(buf, 7, m.get("produces"));
        if let Some(params) = m.get("parameters") {
            message(buf, 10, |b| named(b, 1, Some(params), parameter));
        }
        for requirement in m.get("security").and_then(Value::as_array).into_iter().flatten() {
            // SecurityRequirement: NamedStringArray (StringArray: value = 1).
            message(buf, 12, |b| named(b, 1, Some(requirement), |b, scopes| strings(b, 1, Some(scopes))));
        }
        if let Some(defs) = m.get("securityDefinitions") {
            message(buf, 13, |b| named(b, 1, Some(defs), security_definition));
        }
        vendor_extensions(buf, 16, m);
    }

    fn definition(&mut self, name: &str, schema: &Value) {
        // Definitions (9): additional_properties = 1 (NamedSchema).
        message(self.section(9), 1, |b| {
            len_delimited(b, 1, name.as_bytes());
            message(b, 2, |b| self::schema(b, schema));
        });
    }

    fn path(&mut self, name: &str, item: &Value) {
        // Paths (8): path = 2 (NamedPathItem).
        message(self.section(8), 2, |b| {
            len_delimited(b, 1, name.as_bytes());
            message(b, 2, |b| path_item(b, item));
        });
    }

    fn finish(mut self) -> Vec<u8> {
        self.close();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Reads the length-delimited fields of one message level.
    fn fields(mut b: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = prost::encoding::decode_varint(&mut b).expect("key");
            let (tag, wire) = ((key >> 3) as u32, key & 7);
            match wire {
                0 => out.push((tag, prost::encoding::decode_varint(&mut b).expect("varint").to_le_bytes().to_vec())),
                1 => {
                    out.push((tag, b[..8].to_vec()));
                    b = &b[8..];
                }
                2 => {
                    let len = prost::encoding::decode_varint(&mut b).expect("len") as usize;
                    out.push((tag, b[..len].to_vec()));
                    b = &b[len..];
                }
                w => panic!("wire type {w}"),
            }
        }
        out
    }

    /// A whole document through the writer, as the server writes one.
    fn encode(doc: &Value) -> Vec<u8> {
        use crate::apiserver::openapi::swagger::DocumentWriter;
        let mut w = ProtobufWriter::with_capacity(0);
        w.start(doc);
        for (name, schema) in doc.get("definitions").and_then(Value::as_object).into_iter().flatten() {
            w.definition(name, schema);
        }
        for (name, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
            w.path(name, item);
        }
        w.finish()
    }

    fn field(b: &[u8], tag: u32) -> Vec<u8> {
        fields(b).into_iter().find(|(t, _)| *t == tag).map(|(_, v)| v).unwrap_or_else(|| panic!("no field {tag}"))
    }

    #[test]
    fn a_patch_operation_carries_its_gvk_and_an_inline_dry_run() {
        let doc = json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": {
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}": {"patch": {
            "operationId": "patchAppsV1NamespacedDeployment",
            "parameters": [{"$ref": "#/parameters/body-patch"}, {"name": "dryRun", "in": "query", "type": "string", "uniqueItems": true}],
            "x-kubernetes-group-version-kind": {"group": "apps", "kind": "Deployment", "version": "v1"},
        }}}});
        let b = encode(&doc);
        assert_eq!(field(&b, 1), b"2.0");
        assert_eq!(field(&field(&b, 2), 2), b"v1.33.0");
        let path = field(&field(&b, 8), 2);
        assert_eq!(field(&path, 1), b"/apis/apps/v1/namespaces/{namespace}/deployments/{name}");
        let patch = field(&field(&path, 2), 8);
        assert_eq!(field(&patch, 5), b"patchAppsV1NamespacedDeployment");
        let params: Vec<Vec<u8>> = fields(&patch).into_iter().filter(|(t, _)| *t == 8).map(|(_, v)| v).collect();
        assert_eq!(field(&field(&params[0], 2), 1), b"#/parameters/body-patch");
        let query = field(&field(&field(&params[1], 1), 2), 3);
        assert_eq!(field(&query, 4), b"dryRun");
        assert_eq!(field(&query, 6), b"string");
        let ext = field(&patch, 13);
        assert_eq!(field(&ext, 1), b"x-kubernetes-group-version-kind");
        let yaml = field(&field(&ext, 2), 2);
        let value: Value = serde_json::from_slice(&yaml).expect("the extension's YAML is its JSON");
        assert_eq!(value["kind"], "Deployment");
    }

    #[test]
    fn schemas_keep_refs_types_items_and_a_false_additional_properties() {
        let doc = json!({"definitions": {"a.B": {"type": "object", "required": ["x"], "additionalProperties": false,
            "properties": {"x": {"type": "array", "items": {"$ref": "#/definitions/a.C"}, "maxItems": 3}}}}});
        let b = encode(&doc);
        let named = field(&field(&b, 9), 1);
        assert_eq!(field(&named, 1), b"a.B");
        let s = field(&named, 2);
        assert_eq!(field(&s, 19), b"x");
        assert_eq!(field(&field(&s, 22), 1), b"object");
        assert_eq!(field(&field(&s, 21), 2), 0u64.to_le_bytes());
        let x = field(&field(&field(&s, 25), 1), 2);
        assert_eq!(field(&field(&field(&x, 23), 1), 1), b"#/definitions/a.C");
        assert_eq!(field(&x, 14), 3u64.to_le_bytes());
    }
}
