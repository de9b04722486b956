//! The integration tests' service in a process of its own, for tests that
//! kill the server (`tests/sigkill.rs`): `rrpc-test-server TRANSPORT URI`
//! serves on URI (port 0 allowed), prints `listening <uri>` once bound, and
//! runs until killed or until its stdin closes.

use std::io::Read;

use rrpc_integration_tests::{Harness, Transport, config};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(t), Some(uri)) = (args.next(), args.next()) else {
        eprintln!("usage: rrpc-test-server TRANSPORT URI");
        std::process::exit(2);
    };
    let Some(t) = Transport::from_name(&t) else {
        eprintln!("unknown transport {t}");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let h = rt.block_on(Harness::start_at(t, &uri, config(t), |s| s));
    println!("listening {}", h.uri);
    // Until the parent goes away (its end of our stdin closes).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(h);
}
