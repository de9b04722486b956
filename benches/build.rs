//! Compiles the rpc suite's proto (`proto/bench.proto`) and the soak's
//! (`proto/soak.proto`) with tonic-prost-build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::compile_protos("proto/bench.proto")?;
    tonic_prost_build::compile_protos("proto/soak.proto")?;
    Ok(())
}
