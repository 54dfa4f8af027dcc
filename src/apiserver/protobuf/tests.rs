//! Protobuf bodies built by hand, as gogo-protobuf (client-go) writes them:
//! non-pointer fields are always present, zero or not.

use serde_json::json;

use super::*;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field.
fn v(tag: u32, val: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(tag) << 3, &mut out);
    varint(val, &mut out);
    out
}

/// A length-delimited field (string, bytes, message, map entry).
fn b(tag: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(tag) << 3 | 2, &mut out);
    varint(data.len() as u64, &mut out);
    out.extend_from_slice(data);
    out
}

fn s(tag: u32, text: &str) -> Vec<u8> {
    b(tag, text.as_bytes())
}

fn msg(tag: u32, parts: &[Vec<u8>]) -> Vec<u8> {
    b(tag, &parts.concat())
}

/// A map<string, string> entry.
fn entry(tag: u32, key: &str, val: &str) -> Vec<u8> {
    msg(tag, &[s(1, key), s(2, val)])
}

/// The `k8s\0` + runtime.Unknown envelope.
fn envelope(api_version: &str, kind: &str, raw: &[Vec<u8>]) -> Vec<u8> {
    [MAGIC.to_vec(), msg(1, &[s(1, api_version), s(2, kind)]), msg(2, raw), s(3, ""), s(4, "")].concat()
}

/// ObjectMeta as client-go writes it for a new object: every string, even empty.
fn meta(name: &str, extra: &[Vec<u8>]) -> Vec<u8> {
    let mut parts = vec![s(1, name), s(2, ""), s(3, ""), s(4, ""), s(5, ""), s(6, ""), v(7, 0), b(8, &[])];
    parts.extend_from_slice(extra);
    msg(1, &parts)
}

#[test]
fn config_map() {
    let body = envelope(
        "v1",
        "ConfigMap",
        &[
            meta("x", &[entry(11, "app", "web")]),
            entry(2, "k", "v"),
            entry(2, "other", ""),
            msg(3, &[s(1, "bin"), b(2, &[0, 1, 2, 255])]),
        ],
    );
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": {"app": "web"}},
            "data": {"k": "v", "other": ""},
            "binaryData": {"bin": "AAEC/w=="},
        })
    );
}

#[test]
fn secret_bytes() {
    let body = envelope(
        "v1",
        "Secret",
        &[meta("s", &[]), msg(2, &[s(1, "a"), s(2, "b")]), msg(2, &[s(1, "empty")]), s(3, "Opaque"), v(5, 1)],
    );
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s"},
            "data": {"a": "Yg==", "empty": ""},
            "type": "Opaque",
            "immutable": true,
        })
    );
}

#[test]
fn deployment_int_or_string() {
    let labels = || entry(1, "app", "d");
    let spec = msg(
        2,
        &[
            v(1, 0), // replicas: a pointer, 0 stays
            msg(2, &[labels()]),
            msg(
                3,
                &[
                    meta("", &[entry(11, "app", "d")]),
                    msg(2, &[msg(2, &[s(1, "busybox"), s(2, "busybox:1.36"), v(16, 0), msg(8, &[])])]),
                ],
            ),
            msg(
                4,
                &[
                    s(1, "RollingUpdate"),
                    msg(2, &[msg(1, &[v(1, 0), v(2, 0), s(3, "")]), msg(2, &[v(1, 1), v(2, 0), s(3, "25%")])]),
                ],
            ),
            v(5, 0), // minReadySeconds: omitempty, dropped
            v(7, 0), // paused: omitempty, dropped
            v(9, 600),
        ],
    );
    let body = envelope("apps/v1", "Deployment", &[meta("d", &[]), spec, msg(3, &[])]);
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "d"}},
                "template": {
                    "metadata": {"labels": {"app": "d"}},
                    "spec": {"containers": [{"name": "busybox", "image": "busybox:1.36", "resources": {}}]},
                },
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                "progressDeadlineSeconds": 600,
            },
            "status": {},
        })
    );
}

#[test]
fn pod_resources_and_time() {
    let container = msg(
        2,
        &[
            s(1, "c"),
            s(2, "busybox:1.36"),
            s(3, "sleep"),
            s(3, "10"),
            msg(6, &[s(1, ""), v(2, 0), v(3, 8080), s(4, "TCP"), s(5, "")]),
            msg(7, &[s(1, "FROM_CM"), s(2, ""), msg(3, &[msg(3, &[msg(1, &[s(1, "cm")]), s(2, "key")])])]),
            msg(
                8,
                &[msg(1, &[s(1, "cpu"), msg(2, &[s(1, "500m")])]), msg(2, &[s(1, "memory"), msg(2, &[s(1, "64Mi")])])],
            ),
            v(16, 0),
            v(18, 0),
        ],
    );
    let volume = msg(1, &[s(1, "cfg"), msg(2, &[msg(19, &[msg(1, &[s(1, "cm")]), v(3, 0o644)])])]);
    let spec = msg(2, &[volume, container, s(3, "Never"), v(4, 0), v(11, 0), v(21, 0)]);
    let body = envelope("v1", "Pod", &[meta("p", &[]), spec]);
    // A creationTimestamp (nanos are dropped, as upstream's Time does).
    let body_with_time = envelope("v1", "Pod", &[msg(1, &[s(1, "p"), msg(8, &[v(1, 1_700_000_000), v(2, 999)])])]);

    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "volumes": [{"name": "cfg", "configMap": {"name": "cm", "defaultMode": 420}}],
                "containers": [{
                    "name": "c",
                    "image": "busybox:1.36",
                    "command": ["sleep", "10"],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "key"}}}],
                    "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "64Mi"}},
                }],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
            },
        })
    );
    assert_eq!(
        decode(&body_with_time).unwrap(),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "creationTimestamp": "2023-11-14T22:13:20Z"}})
    );
}

#[test]
fn micro_time_duration_and_options() {
    // coordination.k8s.io/v1 Lease: renewTime is a MicroTime.
    let body = envelope(
        "coordination.k8s.io/v1",
        "Lease",
        &[meta("l", &[]), msg(2, &[s(1, "me"), v(2, 15), msg(4, &[v(1, 86_400 * 365), v(2, 123_456_789)])])],
    );
    assert_eq!(
        decode(&body).unwrap(),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
               "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15, "renewTime": "1971-01-01T00:00:00.123456Z"}})
    );
    // DeleteOptions under a group version (client-go encodes them with the client's version).
    let body = envelope("apps/v1", "DeleteOptions", &[v(1, 0), s(4, "Foreground"), s(5, "All")]);
    assert_eq!(
        decode(&body).unwrap(),
        json!({"apiVersion": "apps/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "propagationPolicy": "Foreground", "dryRun": ["All"]})
    );
    assert_eq!(go_duration(0), "0s");
    assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
    assert_eq!(go_duration(30_000_000_000), "30s");
    assert_eq!(go_duration(90_500_000_000), "1m30.5s");
    assert_eq!(go_duration(1_500_000), "1.5ms");
    assert_eq!(go_duration(2_000), "2µs");
    assert_eq!(go_duration(-5), "-5ns");
    assert_eq!(format_time(0, None), "1970-01-01T00:00:00Z");
    assert_eq!(format_time(951_825_600, Some(7)), "2000-02-29T12:00:00.000007Z");
    assert_eq!(format_time(-1, None), "1969-12-31T23:59:59Z");
}

#[test]
fn raw_extension_and_packed() {
    // apps/v1 ControllerRevision: data is a RawExtension holding JSON.
    let body =
        envelope("apps/v1", "ControllerRevision", &[meta("r", &[]), msg(2, &[s(1, r#"{"spec":{"x":1}}"#)]), v(3, 4)]);
    assert_eq!(
        decode(&body).unwrap(),
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "r"}, "data": {"spec": {"x": 1}}, "revision": 4})
    );
    // A packed repeated int64 (SupplementalGroups) and a negative int64 (10-byte varint).
    let sc = msg(14, &[b(4, &[1, 2, 0x80, 0x01]), v(5, (-7i64) as u64)]);
    let body = envelope("v1", "Pod", &[meta("p", &[]), msg(2, &[sc])]);
    assert_eq!(
        decode(&body).unwrap()["spec"]["securityContext"],
        json!({"supplementalGroups": [1, 2, 128], "fsGroup": -7})
    );
}

#[test]
fn crd_schema_and_nested_inline() {
    let f64_field = |tag: u32, x: f64| {
        let mut out = Vec::new();
        varint(u64::from(tag) << 3 | 1, &mut out);
        out.extend_from_slice(&x.to_bits().to_le_bytes());
        out
    };
    let string_schema = [s(5, "string"), v(10, 0)];
    let schema = msg(
        1,
        &[
            s(5, "object"),
            v(10, 0), // exclusiveMaximum: omitempty, dropped
            msg(
                29,
                &[
                    s(1, "spec"),
                    msg(
                        2,
                        &[
                            s(5, "object"),
                            msg(29, &[s(1, "size"), msg(2, &[s(5, "integer"), f64_field(11, 1.0), f64_field(9, 2.5)])]),
                        ],
                    ),
                ],
            ),
            msg(29, &[s(1, "tags"), msg(2, &[s(5, "array"), msg(24, &[msg(1, &string_schema)])])]),
            msg(29, &[s(1, "extra"), msg(2, &[s(5, "object"), msg(30, &[v(1, 1)]), msg(8, &[s(1, r#"{"a":1}"#)])])]),
            v(38, 1),
            s(99, "an unknown field is skipped"),
        ],
    );
    let version = msg(7, &[s(1, "v1"), v(2, 1), v(3, 1), msg(4, &[schema])]);
    let spec = msg(
        2,
        &[
            s(1, "example.com"),
            msg(3, &[s(1, "widgets"), s(2, ""), s(4, "Widget"), s(5, "")]),
            s(4, "Namespaced"),
            version,
            v(10, 0),
        ],
    );
    let body =
        envelope("apiextensions.k8s.io/v1", "CustomResourceDefinition", &[meta("widgets.example.com", &[]), spec]);
    assert_eq!(
        decode(&body).unwrap(),
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "kind": "Widget"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 2.5}}},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "extra": {"type": "object", "additionalProperties": true, "default": {"a": 1}},
                    },
                    "x-kubernetes-preserve-unknown-fields": true,
                }}}],
            },
        })
    );
    // ValidatingWebhook rules: RuleWithOperations embeds Rule (json:",inline").
    let webhook = msg(
        2,
        &[
            s(1, "w.example.com"),
            msg(3, &[s(1, "CREATE"), msg(2, &[s(1, ""), s(2, "v1"), s(3, "pods"), s(4, "*")])]),
            s(6, "None"),
        ],
    );
    let body =
        envelope("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", &[meta("w", &[]), webhook]);
    assert_eq!(
        decode(&body).unwrap()["webhooks"],
        json!([{"name": "w.example.com", "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "*"}], "sideEffects": "None"}])
    );
}

#[test]
fn errors() {
    assert_eq!(decode(b"{\"kind\":\"Pod\"}"), Err(ProtobufError::MissingMagic));
    assert_eq!(
        decode(&envelope("v1", "NoSuchKind", &[])),
        Err(ProtobufError::UnknownKind { api_version: "v1".into(), kind: "NoSuchKind".into() })
    );
    let good = envelope("v1", "ConfigMap", &[meta("x", &[]), entry(2, "k", "v")]);
    for cut in [5, 9, good.len() - 1] {
        assert_eq!(decode(&good[..cut]), Err(ProtobufError::Truncated), "cut at {cut}");
    }
    // A string field sent as a varint.
    let bad = envelope("v1", "ConfigMap", &[msg(1, &[v(1, 3)])]);
    assert!(matches!(decode(&bad), Err(ProtobufError::Malformed(_))));
    // Every indexed kind decodes an empty object.
    for (av, kind, _) in KINDS.iter() {
        let out = decode(&envelope(av, kind, &[])).unwrap();
        assert_eq!(out, json!({"apiVersion": av, "kind": kind}));
    }
}
