//! The in-process controllers of `ferrok server`: every namespace gets a
//! `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap, and
//! deleting a namespace deletes what is in it, then the namespace.

mod common;

use common::{create, eventually, kubectl};

use std::time::Duration;

#[test]
fn namespaces_get_defaults_and_delete_their_contents() {
    let s = common::ApiServer::start();
    assert!(kubectl(&s, &["create", "namespace", "team"]).0);
    eventually("the default ServiceAccount", || kubectl(&s, &["get", "sa", "default", "-n", "team"]).0);
    eventually("kube-root-ca.crt", || {
        let (ok, out) =
            kubectl(&s, &["get", "cm", "kube-root-ca.crt", "-n", "team", "-o", "jsonpath={.data.ca\\.crt}"]);
        ok && out.starts_with("-----BEGIN CERTIFICATE-----")
    });
    // Both come back when deleted.
    assert!(kubectl(&s, &["delete", "sa", "default", "-n", "team"]).0);
    eventually("the default ServiceAccount again", || kubectl(&s, &["get", "sa", "default", "-n", "team"]).0);
    assert!(kubectl(&s, &["create", "configmap", "data", "-n", "team", "--from-literal=a=b"]).0);
    assert!(kubectl(&s, &["create", "deployment", "web", "-n", "team", "--image=busybox:1.36"]).0);
    let (ok, out) = kubectl(&s, &["delete", "namespace", "team", "--wait=false"]);
    assert!(ok, "{out}");
    eventually("the namespace to be gone", || {
        let (_, out) = kubectl(&s, &["get", "namespace", "team"]);
        out.contains("NotFound")
    });
    let (_, out) = kubectl(&s, &["get", "--raw", "/api/v1/namespaces/team/configmaps"]);
    assert!(out.contains("\"items\":[]"), "{out}");
}

/// A ConfigMap owned by another, as controllers create them.
fn owned(name: &str, owner: &str, uid: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","ownerReferences":[{{"apiVersion":"v1","kind":"ConfigMap","name":"{owner}","uid":"{uid}","blockOwnerDeletion":true}}]}}}}"#
    )
}

#[test]
fn garbage_collector_in_all_three_modes() {
    let s = common::ApiServer::start();
    let gone = |name: &str| kubectl(&s, &["get", "cm", name]).1.contains("NotFound");
    for mode in ["background", "foreground", "orphan"] {
        let owner = format!("owner-{mode}");
        assert!(kubectl(&s, &["create", "configmap", &owner]).0);
        let (_, uid) = kubectl(&s, &["get", "cm", &owner, "-o", "jsonpath={.metadata.uid}"]);
        let dependent = format!("dep-{mode}");
        create(&s, &owned(&dependent, &owner, uid.trim()));
        let (ok, out) = kubectl(&s, &["delete", "cm", &owner, &format!("--cascade={mode}"), "--wait=false"]);
        assert!(ok, "{out}");
        eventually(&format!("the owner to go ({mode})"), || gone(&owner));
        match mode {
            "orphan" => {
                std::thread::sleep(Duration::from_millis(500));
                let (ok, refs) = kubectl(&s, &["get", "cm", &dependent, "-o", "jsonpath={.metadata.ownerReferences}"]);
                assert!(ok && refs.trim().is_empty(), "orphaned dependent kept its owner reference: {refs}");
            }
            _ => eventually(&format!("the dependent to go ({mode})"), || gone(&dependent)),
        }
    }
    // A dependent created for an owner that does not exist is collected too.
    create(&s, &owned("stray", "nobody", "00000000-0000-4000-8000-000000000000"));
    eventually("the stray dependent to go", || gone("stray"));
}

#[test]
fn foreground_deletion_breaks_a_circle_of_owners_and_spares_shared_dependents() {
    let s = common::ApiServer::start();
    let gone = |name: &str| kubectl(&s, &["get", "cm", name]).1.contains("NotFound");
    let uid = |name: &str| kubectl(&s, &["get", "cm", name, "-o", "jsonpath={.metadata.uid}"]).1.trim().to_string();
    let own = |name: &str, owners: &[&str]| {
        let refs: Vec<String> = owners
            .iter()
            .map(|o| {
                format!(
                    r#"{{"apiVersion":"v1","kind":"ConfigMap","name":"{o}","uid":"{}","blockOwnerDeletion":true}}"#,
                    uid(o)
                )
            })
            .collect();
        let patch = format!(r#"{{"metadata":{{"ownerReferences":[{}]}}}}"#, refs.join(","));
        let (ok, out) = kubectl(&s, &["patch", "cm", name, "--type=merge", "-p", &patch]);
        assert!(ok, "{out}");
    };
    // c1 is owned by c3, c2 by c1, c3 by c2, each blocking its owner's
    // deletion (upstream's "should not be blocked by dependency circle").
    for name in ["c1", "c2", "c3", "keeper", "shared"] {
        assert!(kubectl(&s, &["create", "configmap", name]).0);
    }
    own("c1", &["c3"]);
    own("c2", &["c1"]);
    own("c3", &["c2"]);
    // `shared` has c1 and a living owner besides.
    own("shared", &["c1", "keeper"]);
    let (ok, out) = kubectl(&s, &["delete", "cm", "c1", "--cascade=foreground", "--wait=false"]);
    assert!(ok, "{out}");
    for name in ["c1", "c2", "c3"] {
        eventually(&format!("{name} to go"), || gone(name));
    }
    let (ok, owners) = kubectl(&s, &["get", "cm", "shared", "-o", "jsonpath={.metadata.ownerReferences[*].name}"]);
    assert!(ok, "{owners}");
    assert_eq!(owners.trim(), "keeper", "the shared dependent lets go of its deleted owner only");
}
