//! Cluster mode: `cargo xtask bench rpc --hosts hosts.toml [--launcher ssh|local]`.
//!
//! A hosts file lists machines and their roles (one `server`, any number of `client`s), the RDMA
//! device and NUMA node to use, and where the built binaries are. xtask builds a *plan* (one
//! process per host), starts the server, waits for its `READY` line, starts every client, collects
//! each client's `RESULT {json}` line, and stops everything it started: after the run, on Ctrl-C,
//! and as soon as any host fails (non-zero exit, early exit, or no `READY` in time).
//!
//! The `ssh` launcher runs each process as
//! `ssh [-o option]... -o BatchMode=yes ... [-i key] [-p port] user@address -- <remote>`,
//! where the remote command records its process-group id in a pid file so a second ssh can kill
//! the whole remote group. The remote process runs under `setsid -w`: in an ssh session the shell
//! leads its process group, so plain `setsid` forks and exits 0 at once, and ssh reported 0 for a
//! server or client that failed. The `local` launcher runs the same plan as local processes (each in its
//! own process group): it is how the mode is tested on one machine.
//! `xtask/loopback-ssh.sh` runs the `ssh` launcher for real against a throwaway `sshd` on
//! 127.0.0.1 (see the script's header), and the cross-host suite (`cargo xtask rxe --hosts 2`,
//! [`crate::rxe_hosts`]) runs it between two soft-RoCE VMs over `rdma://`.
//!
//! **Transport**: tonic over TCP; rrpc over `rdma://` (fast path) when the hosts name an
//! `rdma_device` (the server's and every client's, or none: a client cannot reach an `rdma://`
//! server over TCP). Each client reports what carried its calls, read from its live connections
//! (`Verbs { device, peer }`), and fails if `rdma://` was not carried by verbs; the table has it
//! in its `carrier` column.
//!
//! With `--no-build` the binaries are not built (they must be in each host's `bin_dir`).
//!
//! ```toml
//! [defaults]              # optional; every field but `port` can also be set per host
//! user = "bench"
//! ssh_key = "/home/bench/.ssh/id_ed25519"   # ssh -i
//! ssh_port = 22                             # ssh -p
//! # Extra `ssh -o` options, given before xtask's own (BatchMode=yes, ConnectTimeout=10,
//! # StrictHostKeyChecking=accept-new), so they win: ssh keeps the first value of an option.
//! # A host's list replaces the default list.
//! ssh_options = ["UserKnownHostsFile=/home/bench/.ssh/known_hosts_bench", "IdentitiesOnly=yes"]
//! bin_dir = "/opt/rrpc/target/release"
//! port = 50051            # server port
//! ready_timeout_secs = 30 # how long the server may take to print READY (ssh + start)
//! duration_ms = 10000     # each client's measured time (default 10000, 1000 with --quick)
//!
//! [[hosts]]
//! name = "srv"
//! address = "10.0.0.1"
//! role = "server"
//! rdma_device = "mlx5_0"
//! numa_node = 0
//!
//! [[hosts]]
//! name = "c1"
//! address = "10.0.0.2"
//! role = "client"
//! clients = 16            # concurrent client connections on this host
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::plot::TableFile;
use crate::util::{build_bench, kill_group};
use crate::{BenchArgs, signals};

/// How processes are started.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LauncherKind {
    /// `ssh` to each host.
    Ssh,
    /// Local processes (same plan, same supervisor): for testing on one machine.
    Local,
}

/// A host's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Runs the server.
    Server,
    /// Runs load-generating clients.
    Client,
}

/// Values every host inherits unless it sets its own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Defaults {
    user: Option<String>,
    ssh_key: Option<PathBuf>,
    ssh_port: Option<u16>,
    ssh_options: Option<Vec<String>>,
    bin_dir: Option<PathBuf>,
    port: Option<u16>,
    clients: Option<u32>,
    ready_timeout_secs: Option<u64>,
    duration_ms: Option<u64>,
}

/// One `[[hosts]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Host {
    pub(crate) name: String,
    pub(crate) address: String,
    pub(crate) role: Role,
    pub(crate) user: Option<String>,
    pub(crate) ssh_key: Option<PathBuf>,
    pub(crate) ssh_port: Option<u16>,
    /// Extra `ssh -o` options (`Key=Value`), before xtask's own.
    pub(crate) ssh_options: Option<Vec<String>>,
    pub(crate) rdma_device: Option<String>,
    pub(crate) numa_node: Option<u32>,
    pub(crate) bin_dir: Option<PathBuf>,
    pub(crate) clients: Option<u32>,
}

/// A parsed hosts file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostsFile {
    #[serde(default)]
    defaults: Defaults,
    hosts: Vec<Host>,
}

impl HostsFile {
    /// Parses and validates: unique names, exactly one server, at least one client.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let mut f: HostsFile = toml::from_str(text).context("parsing hosts file")?;
        let mut seen = std::collections::HashSet::new();
        for h in &mut f.hosts {
            if !seen.insert(h.name.clone()) {
                bail!("duplicate host name `{}`", h.name);
            }
            if h.name.is_empty()
                || !h
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                bail!("host name `{}` must be [A-Za-z0-9_-]+", h.name);
            }
            h.user = h.user.take().or_else(|| f.defaults.user.clone());
            h.ssh_key = h.ssh_key.take().or_else(|| f.defaults.ssh_key.clone());
            h.ssh_port = h.ssh_port.or(f.defaults.ssh_port);
            h.ssh_options = h
                .ssh_options
                .take()
                .or_else(|| f.defaults.ssh_options.clone());
            for o in h.ssh_options.iter().flatten() {
                if o.trim().is_empty() || o.starts_with('-') {
                    bail!(
                        "host {}: ssh option `{o}` must be an `ssh -o` option such as \
                         `UserKnownHostsFile=/path`",
                        h.name
                    );
                }
            }
            h.bin_dir = h.bin_dir.take().or_else(|| f.defaults.bin_dir.clone());
            h.clients = h.clients.or(f.defaults.clients);
        }
        let servers = f.hosts.iter().filter(|h| h.role == Role::Server).count();
        if servers != 1 {
            bail!("hosts file needs exactly one server, found {servers}");
        }
        if !f.hosts.iter().any(|h| h.role == Role::Client) {
            bail!("hosts file needs at least one client");
        }
        // rdma:// or TCP is chosen by each host's device: all must agree.
        let rdma = f.server().rdma_device.is_some();
        if let Some(h) = f.hosts.iter().find(|h| h.rdma_device.is_some() != rdma) {
            bail!(
                "host {} has {} rdma_device but the server has {}: the server and every \
                 client need one (rrpc over rdma://) or none does (tonic over TCP)",
                h.name,
                if rdma { "no" } else { "an" },
                if rdma { "one" } else { "none" },
            );
        }
        Ok(f)
    }

    fn server(&self) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.role == Role::Server)
            .expect("validated")
    }
}

/// One process of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Proc {
    pub(crate) host: Host,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
}

/// The processes for `suite` on these hosts (server first).
pub(crate) fn plan(
    f: &HostsFile,
    suite: &str,
    local_bin_dir: &Path,
    quick: bool,
) -> Result<Vec<Proc>> {
    if suite != "rpc" {
        bail!(
            "cluster mode runs the `rpc` suite (tonic over TCP across hosts, rrpc over rdma:// \
             when built with verbs); `{suite}` measures one host's memory system and has no \
             multi-host form"
        );
    }
    let port = f.defaults.port.unwrap_or(50_051);
    let server = f.server();
    let duration_ms = f
        .defaults
        .duration_ms
        .unwrap_or(if quick { 1000 } else { 10_000 })
        .to_string();
    let mut out = Vec::new();
    for h in std::iter::once(server).chain(f.hosts.iter().filter(|h| h.role == Role::Client)) {
        let bin_dir = h
            .bin_dir
            .clone()
            .unwrap_or_else(|| local_bin_dir.to_path_buf());
        // The roles serve and call rrpc over rdma:// on this device (the
        // variable `rrpc_bench::rpc::RDMA_DEVICE_ENV` names); the NUMA node
        // is applied by numactl (`start_command`).
        let mut env = Vec::new();
        if let Some(d) = &h.rdma_device {
            env.push(("RRPC_BENCH_RDMA_DEVICE".to_owned(), d.clone()));
        }
        let args = match h.role {
            Role::Server => vec![
                "--role".into(),
                "server".into(),
                "--listen".into(),
                format!(
                    "{}:{port}",
                    if is_loopback(&h.address) {
                        h.address.as_str()
                    } else {
                        "0.0.0.0"
                    }
                ),
            ],
            Role::Client => vec![
                "--role".into(),
                "client".into(),
                "--connect".into(),
                format!("{}:{port}", server.address),
                "--clients".into(),
                h.clients.unwrap_or(if quick { 2 } else { 16 }).to_string(),
                "--duration-ms".into(),
                duration_ms.clone(),
            ],
        };
        out.push(Proc {
            host: h.clone(),
            program: bin_dir.join(suite),
            args,
            env,
        });
    }
    Ok(out)
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost" || addr.starts_with("127.") || addr == "::1"
}

/// Quotes a word for a POSIX shell.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn pid_file(run_id: &str, p: &Proc) -> String {
    format!("/tmp/rrpc-bench-{run_id}-{}.pid", p.host.name)
}

fn ssh_base(h: &Host) -> Command {
    let mut c = Command::new("ssh");
    for o in h.ssh_options.iter().flatten() {
        c.arg("-o").arg(o);
    }
    c.args([
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "StrictHostKeyChecking=accept-new",
    ]);
    if let Some(k) = &h.ssh_key {
        c.arg("-i").arg(k);
    }
    if let Some(p) = h.ssh_port {
        c.arg("-p").arg(p.to_string());
    }
    let target = match &h.user {
        Some(u) => format!("{u}@{}", h.address),
        None => h.address.clone(),
    };
    c.arg(target).arg("--");
    c
}

/// The command that starts `p` (ssh or local).
pub(crate) fn start_command(kind: LauncherKind, p: &Proc, run_id: &str) -> Command {
    let mut words: Vec<String> = Vec::new();
    if let Some(n) = p.host.numa_node
        && (kind == LauncherKind::Ssh || which("numactl"))
    {
        {
            words.extend([
                "numactl".to_owned(),
                format!("--cpunodebind={n}"),
                format!("--membind={n}"),
            ]);
        }
    }
    words.push(p.program.to_string_lossy().into_owned());
    words.extend(p.args.iter().cloned());
    match kind {
        LauncherKind::Local => {
            let mut c = Command::new(&words[0]);
            c.args(&words[1..]).envs(p.env.iter().map(|(k, v)| (k, v)));
            c
        }
        LauncherKind::Ssh => {
            // `exec env K=V ... cmd`, or `exec cmd` with no variables.
            let env: String = if p.env.is_empty() {
                String::new()
            } else {
                let vars: Vec<String> = p
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={}", sh_quote(v)))
                    .collect();
                format!("env {} ", vars.join(" "))
            };
            let inner = format!(
                "echo $$ > {pf}; exec {env}{}",
                words
                    .iter()
                    .map(|w| sh_quote(w))
                    .collect::<Vec<_>>()
                    .join(" "),
                pf = pid_file(run_id, p)
            );
            let mut c = ssh_base(&p.host);
            c.arg(format!("exec setsid -w sh -c {}", sh_quote(&inner)));
            c
        }
    }
}

/// The command that stops `p`'s remote process group (ssh only; local groups are killed directly).
///
/// Plain POSIX `sh` (no `kill --`: dash, Debian's `sh`, rejects it). It waits up to a second for
/// the pid file (a process whose ssh was started just before the stop
/// may not have written it yet: without the wait it would be left running), sends SIGTERM, waits
/// up to a second for the group to go, then SIGKILLs what is left.
pub(crate) fn stop_command(kind: LauncherKind, p: &Proc, run_id: &str) -> Option<Command> {
    match kind {
        LauncherKind::Local => None,
        LauncherKind::Ssh => {
            let pf = pid_file(run_id, p);
            let mut c = ssh_base(&p.host);
            c.arg(format!(
                "i=0; while [ ! -f {pf} ] && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; \
                 if [ -f {pf} ]; then g=$(cat {pf}); kill -TERM -$g 2>/dev/null; \
                 i=0; while kill -0 -$g 2>/dev/null && [ $i -lt 10 ]; do sleep 0.1; \
                 i=$((i+1)); done; kill -KILL -$g 2>/dev/null; rm -f {pf}; fi"
            ));
            Some(c)
        }
    }
}

fn which(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

struct Running {
    proc_: Proc,
    child: Child,
    lines: Receiver<String>,
    exited: Option<std::process::ExitStatus>,
    stop: Option<Command>,
}

impl Running {
    fn start(kind: LauncherKind, p: &Proc, run_id: &str) -> Result<Self> {
        let mut cmd = start_command(kind, p, run_id);
        cmd.stdout(Stdio::piped())
            .stdin(Stdio::null())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} on {}", p.program.display(), p.host.name))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let name = p.host.name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[{name}] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Running {
            proc_: p.clone(),
            child,
            lines: rx,
            exited: None,
            stop: stop_command(kind, p, run_id),
        })
    }

    fn poll(&mut self) -> Result<Option<std::process::ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait()?;
        }
        Ok(self.exited)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.stop.take() {
            let _ = c.stdin(Stdio::null()).stdout(Stdio::null()).status();
        }
        if self.exited.is_none() {
            kill_group(&mut self.child, Duration::from_secs(2));
        }
    }
}

/// Stops every process in `running` (clients first, then the server).
fn stop_all(running: &mut [Running]) {
    for r in running.iter_mut().rev() {
        r.stop();
    }
}

/// One client's result line: `RESULT {json}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClientResult {
    /// Concurrent clients on that host.
    pub(crate) clients: u32,
    /// Completed RPCs.
    pub(crate) ops: u64,
    /// Measured seconds.
    pub(crate) secs: f64,
    /// Median latency.
    pub(crate) p50_us: f64,
    /// 99th percentile latency.
    pub(crate) p99_us: f64,
    /// What carried the calls (e.g. `Verbs { device: "rxe0", peer: Some(10.99.1.1) }`), read
    /// from the live connections; absent from older binaries.
    #[serde(default)]
    pub(crate) carrier: Option<String>,
}

/// Runs a plan: server first (waits for `READY`), then clients; returns each client's result.
/// Stops everything on failure, Ctrl-C, or completion.
pub(crate) fn supervise(
    kind: LauncherKind,
    procs: &[Proc],
    run_id: &str,
    ready_timeout: Duration,
) -> Result<Vec<(String, ClientResult)>> {
    let mut running: Vec<Running> = Vec::new();
    let result = (|| -> Result<Vec<(String, ClientResult)>> {
        let (server, clients) = procs.split_first().context("empty plan")?;
        running.push(Running::start(kind, server, run_id)?);
        let deadline = Instant::now() + ready_timeout;
        loop {
            if signals::interrupted() {
                bail!("interrupted");
            }
            if let Ok(line) = running[0].lines.recv_timeout(Duration::from_millis(20))
                && line.starts_with("READY")
            {
                break;
            }
            if let Some(st) = running[0].poll()? {
                bail!("server on {} exited before READY ({st})", server.host.name);
            }
            if Instant::now() > deadline {
                bail!(
                    "server on {} not READY within {ready_timeout:?}",
                    server.host.name
                );
            }
        }
        for c in clients {
            running.push(Running::start(kind, c, run_id)?);
        }
        let bar = indicatif::ProgressBar::new(clients.len() as u64);
        bar.set_message("client hosts done");
        let mut results: BTreeMap<usize, ClientResult> = BTreeMap::new();
        let mut done = 0;
        while done < clients.len() {
            if signals::interrupted() {
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(20));
            if let Some(st) = running[0].poll()? {
                bail!(
                    "server on {} exited during the run ({st})",
                    server.host.name
                );
            }
            done = 0;
            for (i, r) in running.iter_mut().enumerate().skip(1) {
                while let Ok(line) = r.lines.try_recv() {
                    if let Some(json) = line.strip_prefix("RESULT ") {
                        let res: ClientResult = serde_json::from_str(json)
                            .with_context(|| format!("bad RESULT from {}", r.proc_.host.name))?;
                        results.insert(i, res);
                    }
                }
                match r.poll()? {
                    Some(st) if !st.success() => bail!("host {} failed ({st})", r.proc_.host.name),
                    Some(_) => done += 1,
                    None => {}
                }
            }
            bar.set_position(done as u64);
        }
        bar.finish_and_clear();
        // Drain lines printed right before exit.
        for (i, r) in running.iter_mut().enumerate().skip(1) {
            for line in r.lines.iter() {
                if let Some(json) = line.strip_prefix("RESULT ") {
                    results.insert(i, serde_json::from_str(json)?);
                }
            }
        }
        let mut out = Vec::new();
        for (i, r) in running.iter().enumerate().skip(1) {
            let res = results
                .remove(&i)
                .with_context(|| format!("host {} printed no RESULT line", r.proc_.host.name))?;
            out.push((r.proc_.host.name.clone(), res));
        }
        Ok(out)
    })();
    stop_all(&mut running);
    result
}

/// Entry point of cluster mode.
pub(crate) fn run(
    args: &BenchArgs,
    hosts: &Path,
    root: &Path,
    bin_dir: &Path,
    out: &Path,
) -> Result<()> {
    let text =
        std::fs::read_to_string(hosts).with_context(|| format!("reading {}", hosts.display()))?;
    let file = HostsFile::parse(&text)?;
    let suite = if args.suite == "all" {
        "rpc"
    } else {
        args.suite.as_str()
    };
    let procs = plan(&file, suite, bin_dir, args.quick)?;
    if args.launcher == LauncherKind::Local
        && let Some(h) = file.hosts.iter().find(|h| !is_loopback(&h.address))
    {
        {
            bail!(
                "--launcher local runs everything here, but host {} has address {}",
                h.name,
                h.address
            );
        }
    }
    if args.no_build {
        // Hosts without a bin_dir of their own run the local build: it must be there.
        if let Some(p) = procs
            .iter()
            .find(|p| p.host.bin_dir.is_none() && !p.program.is_file())
        {
            bail!(
                "--no-build: {} is not built (build it with `cargo build --profile {} -p rrpc-bench`)",
                p.program.display(),
                args.profile()
            );
        }
    } else {
        build_bench(root, args.profile(), &[suite])?;
    }
    let run_id = format!("{}-{}", crate::util::utc_timestamp(), std::process::id());
    eprintln!(
        "cluster run {run_id}: {} processes via {:?}",
        procs.len(),
        args.launcher
    );
    let ready = Duration::from_secs(file.defaults.ready_timeout_secs.unwrap_or(30));
    let results = supervise(args.launcher, &procs, &run_id, ready)?;
    let table = cluster_table(&results, args.quick, &file);
    let md = table_markdown(&table);
    std::fs::write(out.join("cluster_throughput.md"), &md)?;
    std::fs::write(
        out.join("cluster_throughput.json"),
        serde_json::to_string_pretty(&table)?,
    )?;
    let csv: Vec<String> = std::iter::once(table.columns.join(","))
        .chain(
            table
                .rows
                .iter()
                .map(|r| r.iter().map(csv_cell).collect::<Vec<_>>().join(",")),
        )
        .collect();
    std::fs::write(out.join("cluster_throughput.csv"), csv.join("\n") + "\n")?;
    std::fs::write(
        out.join("summary.md"),
        format!("# rrpc cluster run\n\n{md}"),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&table)?);
    } else {
        println!("{md}");
        eprintln!("results: {}", out.display());
    }
    Ok(())
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break (a carrier does).
fn csv_cell(v: &serde_json::Value) -> String {
    let s = cell(v);
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

fn cluster_table(results: &[(String, ClientResult)], quick: bool, f: &HostsFile) -> TableFile {
    let mut rows = Vec::new();
    let (mut ops, mut clients, mut krps) = (0u64, 0u32, 0.0f64);
    for (host, r) in results {
        let k = r.ops as f64 / r.secs.max(1e-9) / 1e3;
        rows.push(vec![
            host.as_str().into(),
            r.clients.into(),
            r.ops.into(),
            k.into(),
            r.p50_us.into(),
            r.p99_us.into(),
            r.carrier.clone().into(),
        ]);
        ops += r.ops;
        clients += r.clients;
        krps += k;
    }
    rows.push(vec![
        "total".into(),
        clients.into(),
        ops.into(),
        krps.into(),
        serde_json::Value::Null,
        serde_json::Value::Null,
        serde_json::Value::Null,
    ]);
    let over = if f.server().rdma_device.is_some() {
        "rrpc over rdma://"
    } else {
        "tonic over TCP"
    };
    TableFile {
        suite: "rpc".into(),
        quick,
        machine: serde_json::json!({ "hosts": f.hosts.iter().map(|h| serde_json::json!({
            "name": h.name, "address": h.address, "role": h.role, "rdma_device": h.rdma_device,
            "numa_node": h.numa_node })).collect::<Vec<_>>() }),
        experiment: "cluster_throughput".into(),
        title: format!("Cluster: small-RPC throughput per client host ({over})"),
        columns: [
            "host", "clients", "ops", "krps", "p50_us", "p99_us", "carrier",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes: vec![format!(
            "{} client host(s), 1 server; throughput summed over hosts",
            results.len()
        )],
        plot: None,
        more_plots: Vec::new(),
    }
}

fn table_markdown(t: &TableFile) -> String {
    let mut s = format!(
        "### {}\n\n| {} |\n|{}|\n",
        t.title,
        t.columns.join(" | "),
        t.columns
            .iter()
            .map(|_| " ---: ")
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in &t.rows {
        let cells: Vec<String> = r
            .iter()
            .map(|v| match v.as_f64() {
                Some(f) if v.is_f64() => format!("{f:.2}"),
                _ => cell(v),
            })
            .collect();
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    for n in &t.notes {
        s.push_str(&format!("\n- {n}\n"));
    }
    s
}

#[cfg(test)]
mod tests;
