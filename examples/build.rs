//! Generates the example services from proto/.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &["proto/helloworld.proto", "proto/routeguide.proto"],
        &["proto"],
    )?;
    Ok(())
}
