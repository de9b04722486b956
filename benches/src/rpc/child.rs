//! The server in a child process of its own ([`serve_child`], [`ChildServer`]), so that each
//! side's CPU time and memory can be read from its own `/proc/<pid>`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

#[cfg(doc)]
use super::connect_to;
use super::pb::Req;
use super::{Transport, connect, rrpc_config, runtime, start_server};

/// Separate-process server role (`rpc --role serve --transport NAME [--cpu N]`, used by the
/// per-side CPU/memory experiments, Figs. 15–16): starts a server for `t` with the default
/// configuration on a one-worker runtime (pinned to `cpu` if given), prints `READY <target>`
/// and serves until its standard input closes, so it never outlives the process that
/// started it.
///
/// # Errors
/// Runtime or bind errors.
pub fn serve_child(t: Transport, cpu: Option<usize>) -> Result<()> {
    use std::io::{Read as _, Write as _};
    let rt = match cpu {
        Some(c) => runtime("bench-server", c)?,
        None => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?,
    };
    let server = start_server(&rt, t)?;
    // Wait until the server answers before saying READY.
    let probe = rt.block_on(async {
        let mut c = connect(&server).await?;
        c.unary(Req {
            payload: Vec::new(),
            resp_len: 0,
        })
        .await?;
        Ok::<_, anyhow::Error>(())
    });
    probe.context("probing the child server")?;
    println!("READY {}", server.target);
    std::io::stdout().flush()?;
    // RRPC_BENCH_POLLER_STATS: the server process's poller counters, every second, on stderr.
    if matches!(t, Transport::RrpcH2 | Transport::RrpcFast)
        && std::env::var_os("RRPC_BENCH_POLLER_STATS").is_some()
    {
        let poller = rrpc_tonic::RrpcContext::shared(&rrpc_config(t)).poller_handle()?;
        std::thread::spawn(move || {
            let mut before = poller.stats();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                let now = poller.stats();
                eprintln!(
                    "server {} poller, last 1 s: {:?}",
                    t.name(),
                    now.since(&before)
                );
                before = now;
            }
        });
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    drop(server);
    drop(rt);
    Ok(())
}

/// A server running in a child process ([`serve_child`]); stopped (stdin closed, then killed
/// after 2 s) on drop.
#[derive(Debug)]
pub struct ChildServer {
    child: std::process::Child,
    /// Transport it serves.
    pub transport: Transport,
    /// Where to connect ([`connect_to`]).
    pub target: String,
}

impl ChildServer {
    /// Starts this executable with `--role serve` and waits (up to 20 s) for its `READY` line.
    ///
    /// # Errors
    /// Spawn errors, a child that exits or stays silent.
    pub fn spawn(t: Transport, cpu: Option<usize>) -> Result<Self> {
        Self::spawn_with(t, cpu, &[])
    }

    /// [`ChildServer::spawn`] with extra environment variables for the child (e.g.
    /// `RRPC_BENCH_POLLER`).
    ///
    /// # Errors
    /// Spawn errors, a child that exits or stays silent.
    pub fn spawn_with(t: Transport, cpu: Option<usize>, env: &[(&str, &str)]) -> Result<Self> {
        use std::io::BufRead as _;
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(["--role", "serve", "--transport", t.name()]);
        cmd.envs(env.iter().copied());
        if let Some(c) = cpu {
            cmd.args(["--cpu", &c.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the server process")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(target) = line.strip_prefix("READY ") {
                    let _ = tx.send(target.to_owned());
                    break;
                }
            }
        });
        let mut me = ChildServer {
            child,
            transport: t,
            target: String::new(),
        };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(target) => {
                me.target = target;
                Ok(me)
            }
            Err(_) => Err(anyhow!(
                "server process for {} did not say READY within 20 s",
                t.name()
            )),
        }
    }

    /// The child's process id (for `/proc/<pid>`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
