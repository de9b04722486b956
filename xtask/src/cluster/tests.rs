//! Tests of the cluster launcher: host files, plans, ssh command lines and
//! quoting, the stop script, and the local supervisor with shell-script
//! hosts (results collected, a failed host stopping everything, a server
//! that never gets ready).

use super::*;

const HOSTS: &str = r#"
[defaults]
user = "bench"
ssh_key = "/k/id"
ssh_options = ["IdentitiesOnly=yes"]
bin_dir = "/opt/rrpc"
port = 6000

[[hosts]]
name = "srv"
address = "127.0.0.1"
role = "server"
rdma_device = "mlx5_0"
numa_node = 1

[[hosts]]
name = "c1"
address = "127.0.0.1"
role = "client"
clients = 4
rdma_device = "mlx5_1"

[[hosts]]
name = "c2"
address = "127.0.0.1"
role = "client"
rdma_device = "mlx5_0"
user = "other"
ssh_port = 2222
ssh_options = ["UserKnownHostsFile=/k/known", "StrictHostKeyChecking=yes"]
"#;

fn argv(c: &Command) -> Vec<String> {
    std::iter::once(c.get_program())
        .chain(c.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn parses_and_applies_defaults() {
    let f = HostsFile::parse(HOSTS).unwrap();
    assert_eq!(f.hosts.len(), 3);
    assert_eq!(f.hosts[1].user.as_deref(), Some("bench"));
    assert_eq!(f.hosts[2].user.as_deref(), Some("other"));
    assert_eq!(f.hosts[2].bin_dir.as_deref(), Some(Path::new("/opt/rrpc")));
    assert_eq!(
        f.hosts[1].ssh_options.as_deref(),
        Some(&["IdentitiesOnly=yes".to_owned()][..])
    );
    assert_eq!(
        f.hosts[2].ssh_options.as_ref().map(Vec::len),
        Some(2),
        "a host's list replaces the default one"
    );
}

#[test]
fn rejects_bad_files() {
    assert!(HostsFile::parse("hosts = []").is_err());
    let two_servers = HOSTS.replace("role = \"client\"\nclients = 4", "role = \"server\"");
    assert!(
        HostsFile::parse(&two_servers)
            .unwrap_err()
            .to_string()
            .contains("exactly one server")
    );
    let dup = HOSTS.replace("name = \"c2\"", "name = \"c1\"");
    let flag = HOSTS.replace("\"StrictHostKeyChecking=yes\"", "\"-F/dev/null\"");
    assert!(
        HostsFile::parse(&flag)
            .unwrap_err()
            .to_string()
            .contains("must be an `ssh -o` option")
    );
    assert!(HostsFile::parse(&dup).is_err());
    let tcp_client = HOSTS.replace("rdma_device = \"mlx5_1\"\n", "");
    assert!(
        HostsFile::parse(&tcp_client)
            .unwrap_err()
            .to_string()
            .contains("host c1 has no rdma_device but the server has one"),
        "a client without a device cannot reach an rdma:// server"
    );
    assert!(HostsFile::parse(&HOSTS.replace("clients = 4", "bogus = 1")).is_err());
}

#[test]
fn plans_server_then_clients() {
    let f = HostsFile::parse(HOSTS).unwrap();
    let p = plan(&f, "rpc", Path::new("/local"), true).unwrap();
    assert_eq!(p.len(), 3);
    assert_eq!(p[0].program, Path::new("/opt/rrpc/rpc"));
    assert_eq!(
        p[0].args,
        ["--role", "server", "--listen", "127.0.0.1:6000"]
    );
    assert_eq!(
        p[1].args,
        [
            "--role",
            "client",
            "--connect",
            "127.0.0.1:6000",
            "--clients",
            "4",
            "--duration-ms",
            "1000"
        ]
    );
    assert_eq!(p[2].args[5], "2", "quick default clients");
    assert!(
        p[0].env
            .contains(&("RRPC_BENCH_RDMA_DEVICE".into(), "mlx5_0".into()))
    );
    assert!(plan(&f, "fabric", Path::new("/x"), true).is_err());
}

#[test]
fn ssh_command_lines() {
    let f = HostsFile::parse(HOSTS).unwrap();
    let p = plan(&f, "rpc", Path::new("/local"), false).unwrap();
    let start = argv(&start_command(LauncherKind::Ssh, &p[0], "R1"));
    assert_eq!(
        start,
        [
            "ssh",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-i",
            "/k/id",
            "bench@127.0.0.1",
            "--",
            "exec setsid -w sh -c 'echo $$ > /tmp/rrpc-bench-R1-srv.pid; exec env RRPC_BENCH_RDMA_DEVICE=mlx5_0 numactl --cpunodebind=1 --membind=1 \
             /opt/rrpc/rpc --role server --listen 127.0.0.1:6000'"
        ]
    );
    let c2 = argv(&start_command(LauncherKind::Ssh, &p[2], "R1"));
    assert_eq!(
        &c2[1..5],
        [
            "-o",
            "UserKnownHostsFile=/k/known",
            "-o",
            "StrictHostKeyChecking=yes"
        ],
        "the hosts file's options come first, so they override xtask's"
    );
    assert_eq!(&c2[11..15], ["-i", "/k/id", "-p", "2222"]);
    assert_eq!(c2[15], "other@127.0.0.1");
    assert!(c2[17].contains("--duration-ms 10000"));
    let stop = argv(&stop_command(LauncherKind::Ssh, &p[0], "R1").unwrap());
    assert_eq!(stop[12], "--");
    assert!(stop[13].contains("kill -TERM -$g"), "{}", stop[13]);
    assert!(stop[13].contains("/tmp/rrpc-bench-R1-srv.pid"));
    assert!(stop_command(LauncherKind::Local, &p[0], "R1").is_none());
}

/// Runs the remote half of the ssh stop command with a local `sh`: it must wait for a pid
/// file written late and then stop that process group.
#[test]
fn stop_script_waits_for_a_late_pid_file_and_kills_the_group() {
    let f = HostsFile::parse(HOSTS).unwrap();
    let p = plan(&f, "rpc", Path::new("/local"), true).unwrap();
    let run_id = format!("stoptest-{}", std::process::id());
    let stop = argv(&stop_command(LauncherKind::Ssh, &p[1], &run_id).unwrap());
    let script = stop.last().unwrap().clone();
    let pf = PathBuf::from(pid_file(&run_id, &p[1]));
    let mut target = Command::new("sh")
        .args(["-c", "sleep 30 & sleep 30; wait"])
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = target.id() as i32;
    let writer = {
        let pf = pf.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::write(&pf, format!("{pgid}\n")).unwrap();
        })
    };
    // `sh` is dash on Debian: stricter than the bash login shells ssh usually runs.
    let status = Command::new("sh").args(["-c", &script]).status().unwrap();
    writer.join().unwrap();
    assert!(status.success());
    assert!(!pf.exists(), "the stop removes the pid file");
    // Checked before reaping `target` (a zombie does not count): the stop killed the group.
    let deadline = Instant::now() + Duration::from_secs(5);
    while crate::bench::tests::live_members(pgid) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let live = crate::bench::tests::live_members(pgid);
    kill_group(&mut target, Duration::from_millis(100)); // cleanup if the stop failed
    assert_eq!(live, 0, "process group {pgid} still has live members");
}

#[test]
fn quoting() {
    assert_eq!(sh_quote("abc/d-1:2"), "abc/d-1:2");
    assert_eq!(sh_quote("a b"), "'a b'");
    assert_eq!(sh_quote("it's"), "'it'\\''s'");
    assert_eq!(sh_quote(""), "''");
}

fn sh_proc(name: &str, role: Role, script: &str) -> Proc {
    Proc {
        host: Host {
            name: name.into(),
            address: "127.0.0.1".into(),
            role,
            user: None,
            ssh_key: None,
            ssh_port: None,
            ssh_options: None,
            rdma_device: None,
            numa_node: None,
            bin_dir: None,
            clients: None,
        },
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
    }
}

fn server_pid_file() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("xtask-cluster-{}-{n}", std::process::id()))
}

#[test]
fn local_supervisor_collects_results_and_stops_the_server() {
    let pf = server_pid_file();
    let server = sh_proc(
        "srv",
        Role::Server,
        &format!("echo $$ > {}; echo READY; exec sleep 30", pf.display()),
    );
    let res = r#"RESULT {"clients":2,"ops":100,"secs":1.0,"p50_us":5.0,"p99_us":9.0}"#;
    let c1 = sh_proc("c1", Role::Client, &format!("echo '{res}'"));
    let c2 = sh_proc("c2", Role::Client, &format!("sleep 0.1; echo '{res}'"));
    let out = supervise(
        LauncherKind::Local,
        &[server, c1, c2],
        "t",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].0, "c2");
    assert_eq!(out[1].1.ops, 100);
    assert_server_group_stopped(&pf);
}

/// The server wrote its pid to `pf`: its whole process group is gone.
fn assert_server_group_stopped(pf: &std::path::Path) {
    let pid: i32 = std::fs::read_to_string(pf).unwrap().trim().parse().unwrap();
    std::fs::remove_file(pf).unwrap();
    assert_eq!(
        crate::bench::tests::live_members(pid),
        0,
        "server group stopped"
    );
}

#[test]
fn a_failed_host_stops_everything() {
    let pf = server_pid_file();
    let server = sh_proc(
        "srv",
        Role::Server,
        &format!("echo $$ > {}; echo READY; exec sleep 30", pf.display()),
    );
    let slow = sh_proc("c1", Role::Client, "exec sleep 30");
    let bad = sh_proc("c2", Role::Client, "exit 3");
    let t = Instant::now();
    let err = supervise(
        LauncherKind::Local,
        &[server, slow, bad],
        "t",
        Duration::from_secs(10),
    )
    .unwrap_err();
    assert!(err.to_string().contains("host c2 failed"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "did not wait for the slow client"
    );
    assert_server_group_stopped(&pf);
}

#[test]
fn server_that_never_gets_ready_is_an_error() {
    let server = sh_proc("srv", Role::Server, "exit 0");
    let c = sh_proc("c1", Role::Client, "true");
    let err = supervise(
        LauncherKind::Local,
        &[server, c],
        "t",
        Duration::from_secs(5),
    )
    .unwrap_err();
    assert!(err.to_string().contains("exited before READY"), "{err}");
}
