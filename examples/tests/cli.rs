//! Every example binary starts and parses its command line: `--help` exits 0
//! and documents `--transport` (the switch between `http://`, `shm://` and
//! `rdma://`). Having an integration test also makes `cargo test` build the
//! binaries, which the soft-RoCE suite (`cargo xtask rxe`) then runs.

use std::process::Command;

#[test]
fn every_example_documents_its_transport_switch() {
    for exe in [
        env!("CARGO_BIN_EXE_helloworld-server"),
        env!("CARGO_BIN_EXE_helloworld-client"),
        env!("CARGO_BIN_EXE_routeguide-server"),
        env!("CARGO_BIN_EXE_routeguide-client"),
        env!("CARGO_BIN_EXE_demo"),
    ] {
        let out = Command::new(exe).arg("--help").output().unwrap();
        assert!(out.status.success(), "{exe} --help: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--transport"), "{exe} --help:\n{text}");
    }
}

/// The README's snippet is this example's code: each of its lines appears
/// in `src/readme.rs`, in order (so the README shows code that compiles),
/// and the example runs: one call on the `rrpc://` port, carried by shm,
/// and one from a plain tonic channel on the same port.
#[test]
fn the_readme_example_is_built_and_runs() {
    let readme = include_str!("../../README.md");
    let start = readme.find("```rust").expect("a rust block in the README");
    let body = &readme[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    let block = &body[..body.find("```").expect("closed")];
    let source = include_str!("../src/readme.rs");
    let mut lines = source.lines().map(str::trim);
    for want in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(
            lines.any(|l| l == want),
            "README line not in examples/src/readme.rs (in order): {want:?}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_readme")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "readme example: {out:?}");
    assert!(
        text.contains("Hello rrpc!") && text.contains("Shm") && text.contains("Hello tonic!"),
        "readme example printed: {text}"
    );
}
