//! Property tests over the API server's input paths, without a server:
//! random and hostile bodies through the JSON, YAML and protobuf decoders,
//! the four patch forms, the typed decoders, and the label and field
//! selector parsers. The property is the same everywhere: an answer (Ok
//! or an error), never a panic. Seeded, so a failure names a case that
//! fails again; bounded, so `cargo test` stays quick.

#[path = "common/hostile.rs"]
mod hostile;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue};
use ferrok::apiserver::call::decode_body;
use ferrok::apiserver::handlers::apply_json_patch;
use ferrok::apiserver::patch::managed_fields::{self, Writer};
use ferrok::apiserver::patch::patch_meta::SchemaNode;
use ferrok::apiserver::patch::strategic::{strategic_merge, MergeRules};
use ferrok::apiserver::registry::Registry;
use ferrok::apiserver::selector::{FieldSelector, LabelSelector};
use hostile::Rng;
use serde_json::Value;

/// Cases per target, and the most time one target may take.
const CASES: usize = 3000;
const BUDGET: Duration = Duration::from_secs(6);

/// Runs `case` for up to CASES seeds within BUDGET; returns how many ran.
/// A panic fails the test with its target and seed.
fn run(target: &str, mut case: impl FnMut(&mut Rng)) -> usize {
    let started = Instant::now();
    let mut n = 0;
    while n < CASES && started.elapsed() < BUDGET {
        let seed = 0x5eed_0000 + n as u64;
        let mut rng = Rng::new(seed);
        if catch_unwind(AssertUnwindSafe(|| case(&mut rng))).is_err() {
            panic!("{target}: seed {seed:#x} panicked");
        }
        n += 1;
    }
    eprintln!("{target}: {n} inputs, none panicked");
    n
}

fn headers(content_type: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_str(content_type).expect("header"));
    h
}

#[test]
fn decoders_answer_every_body() {
    let json = headers("application/json");
    let yaml = headers("application/yaml");
    let proto = headers("application/vnd.kubernetes.protobuf");
    let mut total = 0;
    total += run("json", |rng| {
        let v = hostile::object_like(rng, "v1", "Pod");
        let bytes = hostile::mutate(rng, v.to_string().as_bytes());
        let _ = decode_body(&json, &Bytes::from(bytes));
    });
    total += run("yaml", |rng| {
        let v = hostile::value(rng, 4);
        let text = serde_yaml_ng::to_string(&v).unwrap_or_default();
        let bytes = if rng.chance(50) { hostile::mutate(rng, text.as_bytes()) } else { text.into_bytes() };
        let _ = decode_body(&yaml, &Bytes::from(bytes));
    });
    total += run("protobuf", |rng| {
        let _ = decode_body(&proto, &Bytes::from(hostile::protobuf(rng)));
    });
    eprintln!("decoders: {total} inputs");
}

#[test]
fn typed_decoders_refuse_wrong_shapes_without_panicking() {
    let registry = Registry::builtin();
    let kinds: Vec<_> = registry.all().into_iter().filter(|r| !r.ephemeral).collect();
    run("typed decode", |rng| {
        let r = rng.pick(&kinds);
        let obj = hostile::object_like(rng, &r.api_version(), &r.kind);
        if let Ok((mut decoded, _)) = r.strategy.decode(&obj) {
            r.strategy.default(&mut decoded);
            let _ = r.strategy.validate(&decoded);
            let _ = r.strategy.cells(&decoded);
        }
    });
}

#[test]
fn patches_merge_hostile_documents() {
    let registry = Registry::builtin();
    let kinds: Vec<_> = registry.all().into_iter().filter(|r| !r.ephemeral).collect();
    let schemas: Vec<_> = kinds.iter().map(|r| r.strategy.patch_schema()).collect();
    let mut total = 0;
    total += run("strategic merge", |rng| {
        let i = rng.below(kinds.len());
        let node = SchemaNode::of(schemas[i].as_deref());
        let mut doc = hostile::object_like(rng, &kinds[i].api_version(), &kinds[i].kind);
        let patch = hostile::object_like(rng, &kinds[i].api_version(), &kinds[i].kind);
        strategic_merge(&mut doc, &patch, node, MergeRules::Strategic);
    });
    total += run("merge patch", |rng| {
        let mut doc = hostile::value(rng, 4);
        json_patch::merge(&mut doc, &hostile::value(rng, 4));
    });
    total += run("json patch", |rng| {
        let doc = hostile::object_like(rng, "v1", "Pod");
        let ops: Vec<Value> = (0..rng.below(4))
            .map(|_| {
                let path = ["/spec", "/spec/containers/0", "/spec/containers/-", "/metadata/labels/é", "", "/x~1y"];
                serde_json::json!({"op": rng.pick(&["add", "remove", "replace", "move", "copy", "test"]),
                    "path": rng.pick(&path), "from": rng.pick(&path), "value": hostile::value(rng, 2)})
            })
            .collect();
        let _ = apply_json_patch(&doc, &Value::Array(ops));
    });
    total += run("server-side apply", |rng| {
        let i = rng.below(kinds.len());
        let writer = Writer { manager: "fuzz", api_version: "v1", schema: SchemaNode::of(schemas[i].as_deref()) };
        let live = hostile::object_like(rng, &kinds[i].api_version(), &kinds[i].kind);
        let config = hostile::object_like(rng, &kinds[i].api_version(), &kinds[i].kind);
        if let Ok(mut merged) = managed_fields::apply(Some(&live), &config, &writer, rng.chance(50)) {
            let other = Writer { manager: "other", ..writer };
            managed_fields::record_update(Some(&live), &mut merged, &other, None);
        }
        let _ = managed_fields::apply(None, &config, &writer, false);
    });
    eprintln!("patches: {total} inputs");
}

#[test]
fn selectors_parse_or_refuse() {
    let mut total = 0;
    total += run("label selector", |rng| {
        let s = hostile::selector(rng);
        if let Ok(sel) = LabelSelector::parse(&s) {
            let _ = sel.matches_object(&hostile::object_like(rng, "v1", "Pod"));
        }
    });
    total += run("field selector", |rng| {
        let s = hostile::selector(rng);
        let (group, kind) = *rng.pick(&[("", "Pod"), ("", "Node"), ("", "ConfigMap"), ("batch", "Job")]);
        if let Ok(sel) = FieldSelector::parse(&s, group, kind) {
            let _ = sel.matches(&hostile::object_like(rng, "v1", kind));
        }
    });
    total += run("generateName", |rng| {
        let prefix = if rng.chance(50) {
            hostile::string(rng)
        } else {
            hostile::straddling(70, 50 + rng.below(12), *rng.pick(&['é', '日', '😀']))
        };
        let name = ferrok::apiserver::meta::generate_name(&prefix);
        assert!(name.len() <= 63, "{name:?}");
    });
    eprintln!("selectors and names: {total} inputs");
}
