//! Generates the test service from proto/test.proto.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(&["proto/test.proto"], &["proto"])?;
    Ok(())
}
