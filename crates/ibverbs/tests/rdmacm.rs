//! rdma-core's rdma_cm examples and perftest's `-R`, unmodified, between two
//! processes on this host, through softrdma's librdmacm.so.1 and
//! libibverbs.so.1: `rping` (several sizes, its data checked on both
//! sides), `ucmatose` with several connections, `udaddy` (UD, SIDR),
//! perftest's eight tests with `-R`, its two send tests with `-R -c UD`
//! (SIDR), and a client turned away by a port nobody listens on.
//!
//! The server is started first; a client that is rejected because the
//! server has not listened yet (REJ "invalid service ID", which is what
//! rdma_cm answers then) is started again, a bounded number of times.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

struct Done {
    ok: bool,
    /// Standard output alone (rping's ping lines), and both.
    stdout: String,
    out: String,
}

/// `name args` with our two libraries, its output to a file (rping -v
/// prints more than a pipe holds).
fn spawn(name: &str, args: &[&str], tag: &str) -> (Child, tempfile::TempDir) {
    spawn_at(name, args, tag, "127.0.0.1")
}

/// [`spawn`] with the device on `addr`. Its output goes to files in a
/// directory of its own (removed with the returned handle).
fn spawn_at(name: &str, args: &[&str], tag: &str, addr: &str) -> (Child, tempfile::TempDir) {
    common::require_rdmacm();
    let logs = tempfile::Builder::new()
        .prefix(&format!("softrdma-rdmacm-{name}-{tag}-"))
        .tempdir()
        .expect("a scratch directory");
    let f = std::fs::File::create(logs.path().join("out")).unwrap();
    let e = std::fs::File::create(logs.path().join("err")).unwrap();
    let mut c: Command = common::command(name);
    c.args(args)
        .env("SOFTRDMA_DEVICES", format!("srdma0={addr}"))
        .env("SOFTRDMA_IBV_STATS", "0")
        .stdout(Stdio::from(f))
        .stderr(Stdio::from(e));
    (c.spawn().expect("spawn"), logs)
}

fn wait(mut child: Child, logs: tempfile::TempDir, deadline: Instant) -> Done {
    let ok = loop {
        match child.try_wait().expect("wait") {
            Some(s) => break s.success(),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let stdout = std::fs::read_to_string(logs.path().join("out")).unwrap_or_default();
    let stderr = std::fs::read_to_string(logs.path().join("err")).unwrap_or_default();
    Done {
        ok,
        out: format!("{stdout}{stderr}"),
        stdout,
    }
}

/// Whether a process listens on `port` (rdma_cm's TCP or UDP port space)
/// at `addr`: softrdma's port steering lists its listeners in a file next
/// to the address's state (crates/udp's steer.rs).
fn listening_at(addr: &str, port: u16) -> bool {
    let uid = this_uid();
    let dirs = [
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        Some(PathBuf::from(format!("/run/user/{uid}"))),
        Some(PathBuf::from(format!("/tmp/softrdma-{uid}"))),
    ];
    let want = [
        format!("{:08x}", 0x0106_0000 | port as u32),
        format!("{:08x}", 0x0111_0000 | port as u32),
    ];
    dirs.iter().flatten().any(|d| {
        std::fs::read_to_string(d.join(format!("{addr}-4791.listen"))).is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("listen ") && want.iter().any(|w| l.ends_with(w.as_str())))
        })
    })
}

/// This user's id, from /proc (no libc call needed for it).
fn this_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("Uid in /proc/self/status")
}

/// One pair at a time: on a 2-core host, pairs side by side only test the
/// scheduler.
static ONE_PAIR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run a server, then — once it listens on `port` — a client against it
/// (again if it was turned away as not listened to yet, at most 100
/// times); both must succeed.
fn pair_on(port: u16, name: &str, server: &[&str], client: &[&str]) -> (Done, Done) {
    let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = Instant::now() + TIMEOUT;
    let (mut srv, spath) = spawn(name, server, "server");
    wait_listening(&mut srv, "127.0.0.1", port, deadline);
    let mut tries = 0;
    let cli = loop {
        let (c, cpath) = spawn(name, client, "client");
        let d = wait(c, cpath, deadline);
        tries += 1;
        // Not listening yet: a REJ "invalid service ID" (8), or for UD a
        // SIDR_REP "service ID not supported" (1).
        let early = (d.out.contains("REJECTED") && d.out.contains("error: 8"))
            || (d.out.contains("UNREACHABLE") && d.out.contains("error: 1."))
            || d.out.contains("RDMA_CM_EVENT_REJECTED, error 8")
            || d.out.contains("event: RDMA_CM_EVENT_REJECTED, error: 8");
        if d.ok || !early || tries == 100 || Instant::now() >= deadline {
            break d;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let s = wait(
        srv,
        spath,
        deadline.max(Instant::now()) + Duration::from_secs(5),
    );
    assert!(
        s.ok && cli.ok,
        "{name} failed\n=== server {server:?}:\n{}\n=== client {client:?}:\n{}",
        s.out,
        cli.out
    );
    (s, cli)
}

/// Whether perftest's output has its result row: bytes, then the `iters`
/// iterations asked for.
fn has_result_row(out: &str, iters: u32) -> bool {
    let iters = iters.to_string();
    out.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 3 && f[0].parse::<u64>().is_ok() && f[1] == iters
    })
}

/// Wait until the server `srv` listens on `port` at `addr` (or exits, or
/// `deadline` passes).
fn wait_listening(srv: &mut Child, addr: &str, port: u16, deadline: Instant) {
    while !listening_at(addr, port) && Instant::now() < deadline {
        if srv.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pair(name: &str, server: &[&str], client: &[&str]) -> (Done, Done) {
    let port = server
        .iter()
        .zip(server.iter().skip(1))
        .find(|(a, _)| **a == "-p")
        .and_then(|(_, p)| p.parse().ok())
        .expect("the server's -p port");
    pair_on(port, name, server, client)
}

fn port() -> String {
    common::next_port().to_string()
}

/// The ping lines rping -v printed (`prefix` "ping data: " or "server ping
/// data: ").
fn pings<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter_map(|l| l.strip_prefix(prefix)).collect()
}

#[test]
fn rping_moves_the_exact_data_at_every_size() {
    for size in ["32", "200", "1000"] {
        let p = port();
        let args = |role: &'static str| {
            vec![
                role,
                "-v",
                "-C",
                "100",
                "-S",
                size,
                "-a",
                "127.0.0.1",
                "-p",
                &p,
            ]
        };
        let (s, c) = pair("rping", &args("-s"), &args("-c"));
        let cp = pings(&c.stdout, "ping data: ");
        let sp = pings(&s.stdout, "server ping data: ");
        assert_eq!(cp.len(), 100, "client pings at -S {size}:\n{}", c.out);
        // What the server READ from the client is what the client got back
        // by the server's WRITE: rping's pattern, byte for byte.
        assert_eq!(sp, cp, "-S {size}");
        let n: usize = size.parse().unwrap();
        for (i, l) in cp.iter().enumerate() {
            let body = l
                .strip_prefix(&format!("rdma-ping-{i}: "))
                .unwrap_or_else(|| panic!("ping {i}: {l}"));
            // rping's pattern: 'A' + i onwards, 'A'..='z' wrapping, to
            // fill the buffer but its last byte.
            let want: String = (0..body.len())
                .map(|k| (65 + ((i + k) % 58) as u8) as char)
                .collect();
            assert_eq!(body, want, "ping {i} at -S {size}");
            assert_eq!(l.len(), n - 1, "ping {i} at -S {size}");
        }
    }
}

#[test]
fn ucmatose_with_several_connections() {
    let p = port();
    let (s, c) = pair(
        "ucmatose",
        &["-c", "4", "-p", &p],
        &["-s", "127.0.0.1", "-c", "4", "-p", &p],
    );
    assert!(s.out.contains("test complete"), "{}", s.out);
    assert!(c.out.contains("test complete"), "{}", c.out);
    assert!(c.out.contains("return status 0"), "{}", c.out);
}

#[test]
fn udaddy_resolves_a_ud_service_and_exchanges_datagrams() {
    // udaddy takes no port option (its -p is the port space): its own, 7174.
    let (s, c) = pair_on(7174, "udaddy", &[], &["-s", "127.0.0.1"]);
    assert!(s.out.contains("data transfers complete"), "{}", s.out);
    assert!(c.out.contains("data transfers complete"), "{}", c.out);
}

#[test]
fn a_port_nobody_listens_on_is_rejected() {
    let p = port();
    let (c, path) = spawn(
        "rping",
        &["-c", "-C", "1", "-a", "127.0.0.1", "-p", &p],
        "lonely",
    );
    let d = wait(c, path, Instant::now() + TIMEOUT);
    assert!(!d.ok, "rping connected to nobody:\n{}", d.out);
    // rping reports the event and its status (the REJ reason: 8, invalid
    // service ID), as against the kernel's rdma_cm.
    assert!(d.out.contains("RDMA_CM_EVENT_REJECTED"), "{}", d.out);
}

/// perftest's eight tests with `-R` (rdma_cm sets up both the control
/// connection, over which perftest exchanges its parameters, and the data
/// QP): each completes on both sides and prints its result row.
#[test]
fn perftest_eight_tests_over_rdma_cm() {
    for (tool, lat) in [
        ("ib_write_bw", false),
        ("ib_read_bw", false),
        ("ib_send_bw", false),
        ("ib_atomic_bw", false),
        ("ib_write_lat", true),
        ("ib_read_lat", true),
        ("ib_send_lat", true),
        ("ib_atomic_lat", true),
    ] {
        let p = port();
        let srv = ["-R", "-n", "200", "-p", &p];
        let cli = ["-R", "-n", "200", "-p", &p, "127.0.0.1"];
        let t0 = Instant::now();
        let (s, c) = pair(tool, &srv, &cli);
        eprintln!("{tool} -R: {:?}", t0.elapsed());
        let out = if lat { &c.out } else { &s.out };
        assert!(
            has_result_row(out, 200),
            "{tool} -R printed no result row:\n{}\n{}",
            s.out,
            c.out
        );
        for d in [&s, &c] {
            assert!(d.out.contains("rdma_cm QPs\t : ON"), "{tool}: {}", d.out);
        }
    }
}

/// perftest's send tests over UD with `-R`: after the RC control
/// connection's handshake its client resolves the server's UD service at
/// once while its server creates, binds and listens on it, so the client's
/// SIDR_REQ can come before the listen — perftest's own race, which the
/// kernel's CM answers as ours does ("service ID not supported"); 4.5-0.17's
/// retry then uses memory it freed and the client fails (fixed upstream,
/// perftest 3d9d8d0). Only that outcome starts the pair again (a bounded
/// number of times, a new port each); any other failure fails the test.
/// See docs/INTEROP.md. On an address of its own: UD loses the datagrams a
/// member leaving a shared port's group costs (docs/DESIGN.md), and the
/// count-exact test would wait for them.
#[test]
fn perftest_ud_send_tests_over_rdma_cm() {
    let addr = format!("127.0.0.{}", 100 + std::process::id() % 100);
    for (tool, lat) in [("ib_send_bw", false), ("ib_send_lat", true)] {
        let mut tries = 0;
        let (s, c) = loop {
            tries += 1;
            let p = port();
            let srv = ["-R", "-c", "UD", "-n", "200", "-p", &p];
            let cli = ["-R", "-c", "UD", "-n", "200", "-p", &p, &addr];
            let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
            let deadline = Instant::now() + TIMEOUT;
            let (mut sv, spath) = spawn_at(tool, &srv, "ud-server", &addr);
            wait_listening(&mut sv, &addr, p.parse().unwrap(), deadline);
            let (cl, cpath) = spawn_at(tool, &cli, "ud-client", &addr);
            let c = wait(cl, cpath, deadline);
            let raced = !c.ok
                && c.out
                    .contains("Event: RDMA_CM_EVENT_UNREACHABLE; error: 1.");
            if raced && tries < 10 {
                // The server waits for a client that is gone.
                let _ = sv.kill();
                let _ = wait(sv, spath, Instant::now());
                eprintln!(
                    "{tool} -R -c UD: the client's SIDR_REQ came before the listen (try {tries})"
                );
                continue;
            }
            let s = wait(
                sv,
                spath,
                deadline.max(Instant::now()) + Duration::from_secs(5),
            );
            assert!(
                s.ok && c.ok,
                "{tool} -R -c UD failed (try {tries})\n=== server:\n{}\n=== client:\n{}",
                s.out,
                c.out
            );
            break (s, c);
        };
        let out = if lat { &c.out } else { &s.out };
        assert!(
            has_result_row(out, 200),
            "{tool} -R -c UD printed no result row:\n{}\n{}",
            s.out,
            c.out
        );
        for d in [&s, &c] {
            assert!(d.out.contains("rdma_cm QPs\t : ON"), "{tool}: {}", d.out);
            assert!(d.out.contains("Connection type : UD"), "{tool}: {}", d.out);
        }
    }
}

/// A synchronous client (`rdma_create_id` with no event channel) connects
/// an ID that has no QP, as librdmacm lets it (`tests/c/cm_sync_noqp.c`):
/// `rdma_connect` returns 0 with CONNECT_RESPONSE in `id->event`, the
/// client moves its own QP with `rdma_init_qp_attr` and calls
/// `rdma_establish`, and both sides see the connection made and ended.
/// (librdmacm's synchronous completion fails a call only on the event's
/// status; ours wanted ESTABLISHED and failed this one with EIO.)
#[test]
fn a_synchronous_connect_without_a_qp_returns_the_connect_response() {
    common::require_rdmacm();
    let exe = common::compile_c("cm_sync_noqp", &["-lrdmacm"]);
    let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let p = common::next_port();
    let cmd = |role: &str| {
        let mut c = Command::new(&exe);
        c.args([role, &p.to_string()])
            .env("LD_LIBRARY_PATH", common::lib_dir())
            .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let mut srv = cmd("server").spawn().expect("spawn the server");
    wait_listening(&mut srv, "127.0.0.1", p, Instant::now() + TIMEOUT);
    let cli = common::run(cmd("client"), TIMEOUT);
    let s = common::wait(srv, TIMEOUT);
    assert!(
        cli.ok() && s.ok(),
        "=== server:\n{}\n=== client:\n{}",
        s.text(),
        cli.text()
    );
    assert_eq!(s.stdout, "listening\nestablished\ndisconnected\n");
    assert_eq!(cli.stdout, "connected\n");
}
