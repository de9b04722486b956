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

/// `demo --json` (what `cargo xtask bench check` reads) prints one JSON
/// object on stdout, the human lines going to stderr, with a p50 for every
/// path the guard's ratios name: the baselines, both ring paths and the two
/// floors.
#[test]
fn the_demo_json_names_every_path() {
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--json", "--calls", "30"])
        .output()
        .unwrap();
    assert!(out.status.success(), "demo --json: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stdout:\n{text}");
    assert!(
        lines[0].starts_with(r#"{"paths":[{"path":"tcp","p50_us":"#) && lines[0].ends_with("}]}"),
        "{text}"
    );
    for path in ["uds", "shm-h2", "shm-fast", "tonic-inproc", "tonic-h2-mem"] {
        assert!(
            lines[0].contains(&format!(r#"{{"path":"{path}","p50_us":"#)),
            "no {path} in {text}"
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("shm-fast/tcp p50"),
        "human lines on stderr: {err}"
    );
}
