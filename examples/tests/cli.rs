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
