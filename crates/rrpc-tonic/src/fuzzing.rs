//! Entry points for `cargo fuzz` (the workspace's `fuzz/` crate) into
//! parsers of peer-written bytes that are not public API. Built only with
//! `--cfg fuzzing`, which cargo-fuzz sets.

/// A client's handshake section as the server reads it for shared queue
/// pairs (`sharing::parse_request`), re-encoded when it parses.
///
/// # Errors
/// The parser's refusal.
pub fn sharing_request(app: &[u8]) -> Result<Vec<u8>, String> {
    crate::sharing::fuzz_round_trip(app)
}
