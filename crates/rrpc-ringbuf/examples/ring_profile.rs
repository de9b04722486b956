//! Single-threaded, deterministic ring workload for instruction-count
//! profiling (`valgrind --tool=callgrind`), stable on a noisy machine:
//! one in-process shm connection, bursts of `burst` messages of `size` bytes
//! written zero-copy and then read, `count` messages in all.
//!
//! `cargo build --release -p rrpc-ringbuf --example ring_profile`, then
//! `valgrind --tool=callgrind target/release/examples/ring_profile 64 100000`.

use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::{Fabric, FabricAddr, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let count: u64 = args.next().map_or(Ok(100_000), |s| s.parse())?;
    let burst: u64 = args.next().map_or(Ok(64), |s| s.parse())?;
    let dir = std::env::temp_dir().join(format!("rrpc-rb-prof-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display()))?;
    let cfg = RingConfig::default();
    let fabric = Fabric::shm();
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
    let (f2, c2) = (fabric.clone(), cfg.clone());
    let server = std::thread::spawn(move || {
        let local = LocalRing::new(&f2, &c2).unwrap();
        let c = listener
            .accept()
            .unwrap()
            .accept(
                f2.create_qp(&QpConfig::default()).unwrap(),
                local.add_to_offer(Offer::new()),
            )
            .unwrap();
        let (tx, rx) = local.connect(&c).unwrap();
        (c, tx, rx)
    });
    let local = LocalRing::new(&fabric, &cfg)?;
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default())?,
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )?;
    let (mut tx, _rx) = local.connect(&c)?;
    let (_c2, _tx2, mut rx) = server.join().expect("server thread");
    let _ = std::fs::remove_dir_all(&dir);
    let mut sent = 0u64;
    let mut got = 0u64;
    let mut sink = 0u64;
    let t0 = std::time::Instant::now();
    while got < count {
        let end = (sent + burst).min(count);
        while sent < end {
            match tx.try_reserve(size) {
                Ok(mut g) => {
                    g[0] = sent as u8;
                    g.commit()?;
                    sent += 1;
                }
                Err(Error::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        tx.flush()?;
        loop {
            match rx.try_recv() {
                Ok(m) => {
                    sink = sink.wrapping_add(u64::from(m[0]));
                    got += 1;
                }
                Err(Error::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let el = t0.elapsed();
    println!(
        "{count} messages of {size} B in {:?}: {:.0} msgs/s ({sink})",
        el,
        count as f64 / el.as_secs_f64()
    );
    Ok(())
}
