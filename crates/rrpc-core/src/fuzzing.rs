//! Entry points for `cargo fuzz` (the workspace's `fuzz/` crate) into
//! parsers of peer-written bytes that are not public API. Built only with
//! `--cfg fuzzing`, which cargo-fuzz sets.

/// The peer's verbs endpoint as the handshake carries it
/// (`QpAddress::decode`), re-encoded when it decodes.
///
/// # Errors
/// The decoder's error, as text.
#[cfg(feature = "verbs")]
pub fn verbs_endpoint(bytes: &[u8]) -> Result<Vec<u8>, String> {
    crate::provider::verbs::qp_address::QpAddress::decode(bytes)
        .map(|e| e.encode())
        .map_err(|e| e.to_string())
}
