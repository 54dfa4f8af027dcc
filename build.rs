// Generates the etcd v3 gRPC types, servers and clients from proto/, and
// deflates the built-in kinds' OpenAPI components.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
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
