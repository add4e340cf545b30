//! `softrdma pingpong` against itself, two processes on loopback, as a user
//! runs rdma-core's `ibv_{rc,uc,ud}_pingpong`: a server without a host, a
//! client with one. Each run checks the exit codes and every output line
//! (addresses that match across the two ends, byte and iteration counts),
//! with `-c` validating the data that moved and `-e` sleeping on events.
//! The out-of-band exchange is also checked from the outside: a fake peer
//! in this test reads and writes rdma-core's 52-byte records over TCP.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
mod common;
use common::{finish, own_address, spawn_tool};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest a pingpong process may run in these tests.
const LIMIT: Duration = Duration::from_secs(60);

fn softrdma() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
}

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(args: &[String]) -> Child {
    spawn_env(args, &[])
}

fn spawn_env(args: &[String], env: &[(&str, &str)]) -> Child {
    spawn_tool("pingpong", args, env)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8(o.stdout.clone()).expect("UTF-8 stdout"),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One address line: (LID, QPN, PSN, GID).
fn parse_addr(line: &str, local: bool, ud: bool) -> (u32, u32, u32, String) {
    let head = if local {
        "  local address:  LID 0x"
    } else {
        "  remote address: LID 0x"
    };
    let rest = line
        .strip_prefix(head)
        .unwrap_or_else(|| panic!("address line {line:?}"));
    let sep = if local && ud { ": GID " } else { ", GID " };
    let (nums, gid) = rest
        .split_once(sep)
        .unwrap_or_else(|| panic!("GID in {line:?}"));
    let hex = |s: &str, prefix: &str, width: usize| {
        let h = s
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{prefix} in {line:?}"));
        assert_eq!(h.len(), width, "field width in {line:?}");
        u32::from_str_radix(h, 16).unwrap_or_else(|_| panic!("hex in {line:?}"))
    };
    let f: Vec<&str> = nums.split(", ").collect();
    assert_eq!(f.len(), 3, "{line:?}");
    (
        hex(f[0], "", 4),
        hex(f[1], "QPN 0x", 6),
        hex(f[2], "PSN 0x", 6),
        gid.to_string(),
    )
}

/// `"%lld bytes in %.2f seconds = %.2f Mbit/sec"` and
/// `"%d iters in %.2f seconds = %.2f usec/iter"`.
fn check_rates(lines: &[&str], bytes: u64, iters: u32) {
    let l = lines[0];
    let r = l
        .strip_prefix(&format!("{bytes} bytes in "))
        .unwrap_or_else(|| panic!("byte count line {l:?}, want {bytes} bytes"));
    let (secs, rate) = r
        .split_once(" seconds = ")
        .unwrap_or_else(|| panic!("{l:?}"));
    two_decimals(secs, l);
    two_decimals(rate.strip_suffix(" Mbit/sec").expect("Mbit/sec"), l);
    let l = lines[1];
    let r = l
        .strip_prefix(&format!("{iters} iters in "))
        .unwrap_or_else(|| panic!("iteration line {l:?}, want {iters} iters"));
    let (secs, per) = r
        .split_once(" seconds = ")
        .unwrap_or_else(|| panic!("{l:?}"));
    two_decimals(secs, l);
    two_decimals(per.strip_suffix(" usec/iter").expect("usec/iter"), l);
}

fn two_decimals(s: &str, line: &str) {
    let (i, d) = s
        .split_once('.')
        .unwrap_or_else(|| panic!("{s:?} in {line:?}"));
    assert!(
        !i.is_empty() && i.bytes().all(|c| c.is_ascii_digit()) && d.len() == 2,
        "{s:?} is not %.2f in {line:?}"
    );
    assert!(d.bytes().all(|c| c.is_ascii_digit()), "{line:?}");
}

struct Run {
    transport: &'static str,
    /// Flags for both ends.
    flags: Vec<String>,
    host: &'static str,
    size: u32,
    iters: u32,
}

impl Run {
    fn new(transport: &'static str, flags: &[&str]) -> Run {
        let get = |k: &str| {
            flags
                .iter()
                .position(|f| *f == k)
                .map(|i| flags[i + 1].parse::<u32>().unwrap())
        };
        Run {
            transport,
            flags: flags.iter().map(|s| s.to_string()).collect(),
            host: "127.0.0.1",
            size: get("-s").unwrap_or(if transport == "ud" { 1024 } else { 4096 }),
            iters: get("-n").unwrap_or(1000),
        }
    }

    fn host(mut self, h: &'static str) -> Run {
        self.host = h;
        self
    }

    /// Server and client; both must succeed and agree on each other's
    /// addresses.
    fn pair(&self) {
        let port = free_port().to_string();
        let mut common = vec!["--transport".to_string(), self.transport.to_string()];
        common.extend(["-p".to_string(), port]);
        common.extend(self.flags.iter().cloned());
        // UC and UD have no retransmission: on 127.0.0.1 they share port
        // 4791 with the tests running alongside, and a process leaving
        // that reuseport group can cost a datagram in flight to another
        // member (DESIGN.md, "Sharing port 4791"), which hangs a
        // ping-pong. Over IPv4 they get a loopback address of their own
        // (as perf_e2e's `checked_alone`); ::1 has no second address.
        let iso = (self.transport != "rc" && self.host == "127.0.0.1").then(own_address);
        let dev = iso.as_ref().map(|a| format!("iso={a}"));
        let env: Vec<(&str, &str)> = dev
            .as_deref()
            .map(|d| vec![("SOFTRDMA_DEVICES", d)])
            .unwrap_or_default();
        if iso.is_some() {
            common.extend(["-d".to_string(), "iso".to_string()]);
        }
        let server = spawn_env(&common, &env);
        let mut cargs = common.clone();
        // -R connects to the server's device address (rdma_cm's), not to
        // a TCP listener on any address.
        let cm = self.flags.iter().any(|f| f == "-R");
        match &iso {
            Some(a) if cm => cargs.push(a.to_string()),
            _ => cargs.push(self.host.to_string()),
        }
        let client = spawn_env(&cargs, &env);
        let c = finish(client, "client");
        let s = finish(server, "server");
        let what = format!("pingpong --transport {} {:?}", self.transport, self.flags);
        let (so, se) = text(&s);
        let (co, ce) = text(&c);
        assert!(
            s.status.success() && c.status.success(),
            "{what}: server {} client {}\nserver stdout:\n{so}\nserver stderr:\n{se}\nclient stdout:\n{co}\nclient stderr:\n{ce}",
            s.status,
            c.status
        );
        let sl: Vec<&str> = so.lines().collect();
        let cl: Vec<&str> = co.lines().collect();
        assert_eq!(sl.len(), 4, "{what}: server output\n{so}");
        assert_eq!(cl.len(), 4, "{what}: client output\n{co}");
        let ud = self.transport == "ud";
        let s_local = parse_addr(sl[0], true, ud);
        let s_remote = parse_addr(sl[1], false, ud);
        let c_local = parse_addr(cl[0], true, ud);
        let c_remote = parse_addr(cl[1], false, ud);
        // -R over UD: SIDR carries no PSN (a UD QP's means nothing to its
        // peer), so each side shows the other's as 0.
        let sidr = ud && self.flags.iter().any(|f| f == "-R");
        let (s_local, c_local) = if sidr {
            assert_eq!((s_remote.2, c_remote.2), (0, 0), "{what}: SIDR PSNs");
            (
                (s_local.0, s_local.1, 0, s_local.3),
                (c_local.0, c_local.1, 0, c_local.3),
            )
        } else {
            (s_local, c_local)
        };
        assert_eq!(
            s_local, c_remote,
            "{what}: client sees the server's address"
        );
        assert_eq!(
            c_local, s_remote,
            "{what}: server sees the client's address"
        );
        let gid = match &iso {
            Some(a) => format!("::ffff:{a}"),
            None if self.host.contains(':') => "::1".to_string(),
            None => "::ffff:127.0.0.1".to_string(),
        };
        assert_eq!(s_local.3, gid, "{what}");
        assert_eq!(c_local.3, gid, "{what}");
        assert_eq!((s_local.0, c_local.0), (0, 0), "RoCE LIDs are 0");
        assert_ne!(s_local.1, c_local.1, "two QPs");
        let bytes = self.size as u64 * self.iters as u64 * 2;
        check_rates(&sl[2..], bytes, self.iters);
        check_rates(&cl[2..], bytes, self.iters);
        assert!(se.is_empty() && ce.is_empty(), "{what}: stderr\n{se}\n{ce}");
    }
}

#[test]
fn rc_sizes_with_validation() {
    for flags in [
        &["-n", "200", "-c"][..],
        &["-n", "200", "-c", "-s", "1"],
        &["-n", "100", "-c", "-s", "65539", "-m", "4096"],
        &["-n", "50", "-c", "-s", "1048579", "-m", "2048", "-r", "20"],
    ] {
        Run::new("rc", flags).pair();
    }
}

#[test]
fn uc_sizes_with_validation() {
    for flags in [
        &["-n", "200", "-c"][..],
        &["-n", "200", "-c", "-s", "3"],
        &["-n", "100", "-c", "-s", "20000", "-m", "256"],
    ] {
        Run::new("uc", flags).pair();
    }
}

#[test]
fn ud_sizes_with_validation() {
    for flags in [
        &["-n", "200", "-c"][..],
        &["-n", "200", "-c", "-s", "1"],
        &["-n", "100", "-c", "-s", "4096"],
    ] {
        Run::new("ud", flags).pair();
    }
}

/// `-R`: the QP connected through rdma_cm (RC and UC by REQ/REP/RTU, UD
/// by SIDR), the data checked.
#[test]
fn rdma_cm_on_every_transport() {
    for t in ["rc", "uc", "ud"] {
        Run::new(t, &["-R", "-n", "200", "-c"]).pair();
    }
    Run::new("rc", &["-R", "-n", "100", "-c", "-e", "-s", "10000"]).pair();
}

#[test]
fn event_mode_on_every_transport() {
    for t in ["rc", "uc", "ud"] {
        Run::new(t, &["-n", "200", "-e", "-c", "-s", "2000"]).pair();
    }
    Run::new("rc", &["-n", "100", "-e", "-r", "3", "-s", "10000"]).pair();
}

#[test]
fn over_ipv6() {
    Run::new("rc", &["-n", "100", "-c"]).host("::1").pair();
    Run::new("ud", &["-n", "100", "-c", "-e"])
        .host("::1")
        .pair();
}

/// `-c` really checks: a client that does not mark its pages leaves the
/// server with 0x7b where it expects 0, page by page, and exit status 1.
#[test]
fn validation_reports_bad_pages() {
    let port = free_port().to_string();
    let server = spawn(&[
        "-p".into(),
        port.clone(),
        "-n".into(),
        "20".into(),
        "-s".into(),
        "10000".into(),
        "-c".into(),
    ]);
    let client = spawn(&[
        "-p".into(),
        port,
        "-n".into(),
        "20".into(),
        "-s".into(),
        "10000".into(),
        "127.0.0.1".into(),
    ]);
    let c = finish(client, "client");
    let s = finish(server, "server");
    assert!(c.status.success(), "client: {:?}", text(&c));
    assert_eq!(s.status.code(), Some(1), "server: {:?}", text(&s));
    let (so, _) = text(&s);
    let bad: Vec<&str> = so.lines().skip(4).collect();
    // 10000 bytes are three pages of 4096.
    assert_eq!(
        bad,
        [
            "invalid data in page 0",
            "invalid data in page 1",
            "invalid data in page 2"
        ],
        "{so}"
    );
}

/// A message larger than the receive buffer fails both ends with the
/// statuses rdma-core's programs print.
#[test]
fn mismatched_sizes_fail_with_completion_errors() {
    let port = free_port().to_string();
    // The responder sends its fatal NAK once: on a device of its own, as
    // UC and UD in `Run::pair`, so that no other test's process leaving
    // 127.0.0.1's port group can cost it (the client would then end in a
    // retry-exceeded error instead).
    let dev = format!("iso={}", own_address());
    let env = [("SOFTRDMA_DEVICES", dev.as_str())];
    let server = spawn_env(
        &[
            "-d".into(),
            "iso".into(),
            "-p".into(),
            port.clone(),
            "-n".into(),
            "5".into(),
        ],
        &env,
    );
    let client = spawn_env(
        &[
            "-d".into(),
            "iso".into(),
            "-p".into(),
            port,
            "-n".into(),
            "5".into(),
            "-s".into(),
            "5000".into(),
            "127.0.0.1".into(),
        ],
        &env,
    );
    let c = finish(client, "client");
    let s = finish(server, "server");
    assert_eq!(c.status.code(), Some(1));
    assert_eq!(s.status.code(), Some(1));
    assert_eq!(
        text(&s).1.trim_end(),
        "Failed status local length error (1) for wr_id 1"
    );
    assert_eq!(
        text(&c).1.trim_end(),
        "Failed status remote invalid request error (9) for wr_id 2"
    );
}

/// The client's side of the exchange, seen by a fake server: one 52-byte
/// record `%04x:%06x:%06x:<32 hex>` and NUL that matches the printed local
/// address, then (after the reply) `done` and NUL. A reply without a GID
/// cannot be reached over RoCE: the client says so and fails.
#[test]
fn client_exchange_is_rdma_cores() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let client = spawn(&[
        "--transport".into(),
        "uc".into(),
        "-p".into(),
        port,
        "127.0.0.1".into(),
    ]);
    l.set_nonblocking(true).unwrap();
    let start = Instant::now();
    let mut s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(_) if start.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("the client never connected: {e}"),
        }
    };
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut m = [0u8; 52];
    s.read_exact(&mut m).unwrap();
    let rec = std::str::from_utf8(&m[..51]).expect("text record");
    assert_eq!(m[51], 0, "NUL-terminated");
    let f: Vec<&str> = rec.split(':').collect();
    assert_eq!(
        f.iter().map(|x| x.len()).collect::<Vec<_>>(),
        [4, 6, 6, 32],
        "{rec}"
    );
    assert!(
        rec.bytes().all(|c| c == b':' || c.is_ascii_hexdigit()),
        "{rec}"
    );
    assert_eq!(
        f[3], "00000000000000000000ffff7f000001",
        "the GID's bytes in order"
    );
    // A peer without a GID (rdma-core's programs run without -g).
    s.write_all(b"0000:000123:000456:00000000000000000000000000000000\0")
        .unwrap();
    let mut done = [0u8; 5];
    s.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done\0");
    assert_eq!(s.read(&mut done).unwrap(), 0, "nothing after done");
    let c = finish(client, "client");
    assert_eq!(c.status.code(), Some(1));
    let (out, err) = text(&c);
    let lines: Vec<&str> = out.lines().collect();
    let (lid, qpn, psn, gid) = parse_addr(lines[0], true, false);
    assert_eq!(
        format!("{lid:04x}:{qpn:06x}:{psn:06x}"),
        format!("{}:{}:{}", f[0], f[1], f[2]),
        "the record is the printed local address"
    );
    assert_eq!(gid, "::ffff:127.0.0.1");
    assert_eq!(
        lines[1],
        "  remote address: LID 0x0000, QPN 0x000123, PSN 0x000456, GID ::"
    );
    assert!(err.contains("The peer sent no GID"), "{err}");
}

/// The server's side, seen by a fake client: it reads exactly one 52-byte
/// record, and a malformed one ends the run with a message, status 1.
#[test]
fn server_rejects_a_malformed_record() {
    let port = free_port();
    let server = spawn(&["-p".into(), port.to_string()]);
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("the server never listened: {e}"),
        }
    };
    let mut m = [0u8; 52];
    m[..11].copy_from_slice(b"not-a-dest!");
    s.write_all(&m).unwrap();
    let out = finish(server, "server");
    assert_eq!(out.status.code(), Some(1));
    let (o, e) = text(&out);
    assert!(o.starts_with("  local address:  LID 0x0000, QPN 0x"), "{o}");
    assert!(
        e.contains("couldn't parse the peer's address record"),
        "{e}"
    );
}

/// Argument checks that fail before any peer is involved.
#[test]
fn bad_arguments_are_named() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--transport", "ud", "-s", "5000", "127.0.0.1"],
            "Requested size larger than port MTU (4096)",
        ),
        (&["-m", "1000", "127.0.0.1"], "Invalid MTU 1000"),
        (&["-g", "1", "127.0.0.1"], "can't read sgid of index 1"),
        (
            &["--transport", "ud", "-g", "3", "127.0.0.1"],
            "Could not get local gid for gid index 3",
        ),
    ];
    for (args, msg) in cases {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = finish(spawn(&args), "pingpong");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let (_, e) = text(&out);
        assert!(e.contains(msg), "{args:?}: {e}");
    }
}

/// With `-d`, a server opens its device and prints its local address before
/// any client connects, as rdma-core's do (a script may wait for that line);
/// an unknown device is named.
#[test]
fn named_device_server_prints_its_address_first() {
    let port = free_port().to_string();
    let devs = ("SOFTRDMA_DEVICES", "ppdev=127.0.0.1");
    let mut server = softrdma()
        .args(["pingpong", "-d", "ppdev", "-p", &port, "-n", "50", "-c"])
        .env(devs.0, devs.1)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the server");
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let _ = tx.send(first.clone());
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        (first, rest)
    });
    let first = match rx.recv_timeout(LIMIT) {
        Ok(l) => l,
        Err(_) => {
            let _ = server.kill();
            panic!("the server printed nothing within {LIMIT:?}");
        }
    };
    assert!(
        first.starts_with("  local address:  LID 0x0000, QPN 0x"),
        "{first:?}"
    );
    let client = softrdma()
        .args([
            "pingpong",
            "-d",
            "ppdev",
            "-p",
            &port,
            "-n",
            "50",
            "-c",
            "127.0.0.1",
        ])
        .env(devs.0, devs.1)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the client");
    let c = finish(client, "client");
    let s = finish(server, "server");
    assert!(c.status.success(), "client: {:?}", text(&c));
    assert!(s.status.success(), "server: {:?}", text(&s));
    let (_, rest) = reader.join().unwrap();
    assert_eq!(rest.len(), 3, "{rest:?}");
    let (_, qpn, psn, _) = parse_addr(&first, true, false);
    let (co, _) = text(&c);
    let (_, rqpn, rpsn, _) = parse_addr(co.lines().nth(1).unwrap(), false, false);
    assert_eq!((qpn, psn), (rqpn, rpsn));

    let out = finish(
        {
            let mut c = softrdma();
            c.args(["pingpong", "-d", "nosuch", "127.0.0.1"])
                .env(devs.0, devs.1)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        },
        "pingpong -d nosuch",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out).1.trim_end(), "IB device nosuch not found");
}
