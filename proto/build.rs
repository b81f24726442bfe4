//! Compiles `proto/*.proto` with a vendored protoc, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    println!("cargo:rerun-if-changed=proto/cluster.proto");
    println!("cargo:rerun-if-changed=proto/agent.proto");
    // A file's bytes stay `Bytes` from the link's buffer to the disk, and a tunnel's between nodes
    // (no copy when decoded).
    tonic_prost_build::configure()
        .bytes(".computerd.agent.v1.FileChunk.data")
        .bytes(".computerd.cluster.v1.TunnelChunk.data")
        .compile_protos(&["proto/cluster.proto", "proto/agent.proto"], &["proto"])?;
    Ok(())
}
