//! Compiles the gRPC face's proto (`proto/kv.proto`) with tonic-prost-build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::compile_protos("proto/kv.proto")?;
    Ok(())
}
