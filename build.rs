// Generates the etcd v3 gRPC types, servers and clients from proto/.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/etcdserverpb/rpc.proto", "proto/mvccpb/kv.proto"], &["proto"])?;
    Ok(())
}
