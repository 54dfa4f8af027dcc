// Generates the etcd v3 gRPC types, servers and clients from proto/, and
// deflates the built-in kinds' OpenAPI components.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    git_version();
    // The executable is linked as a fixed-address (non-PIE) binary, as k3s's
    // is: the 2.5 MB of load-time relocations a PIE carries (.rela.dyn) go
    // away, and so do the copy-on-write pages they dirty at every start.
    println!("cargo:rustc-link-arg-bins=-no-pie");
    // The built-in kinds' OpenAPI components, deflated into the binary
    // (src/apiserver/builtin_schemas.rs).
    println!("cargo:rerun-if-changed=src/apiserver/builtin_schemas.json");
    let schemas = std::fs::read("src/apiserver/builtin_schemas.json")?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("builtin_schemas.json.deflate"), miniz_oxide::deflate::compress_to_vec(&schemas, 10))?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/etcdserverpb/rpc.proto", "proto/mvccpb/kv.proto"], &["proto"])?;
    Ok(())
}

/// The commit ferrok is built from and its date, for `/version`'s
/// `gitCommit` and `buildDate` (clients and the conformance suite expect a
/// commit hash): `FERROK_GIT_COMMIT`/`FERROK_BUILD_DATE` when a packager
/// sets them, else git's HEAD, else zeros (a source tarball without git).
fn git_version() {
    println!("cargo:rerun-if-env-changed=FERROK_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=FERROK_BUILD_DATE");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).env("TZ", "UTC").output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let is_hash = |c: &str| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit());
    let commit = std::env::var("FERROK_GIT_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .filter(|c| is_hash(c))
        .unwrap_or_else(|| "0".repeat(40));
    let date = std::env::var("FERROK_BUILD_DATE")
        .ok()
        .or_else(|| git(&["log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ"]))
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
    println!("cargo:rustc-env=FERROK_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=FERROK_BUILD_DATE={date}");
    // Built again when HEAD moves: HEAD itself, the branch it names, and
    // packed refs (only files that exist, or cargo would run this each time).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = std::path::PathBuf::from(dir);
        let mut watched = vec![dir.join("HEAD"), dir.join("packed-refs")];
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(dir.join(head));
        }
        for path in watched.into_iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
