//! `softrdma perf` against the real perftest binaries (running on our
//! libibverbs.so.1) where the two sides' out-of-band sequences differ by
//! mode: regression tests for what the interop suite against Linux rxe
//! found (docs/INTEROP.md). softrdma against softrdma cannot show these —
//! both ends would make the same mistake.
//!
//! * ib_send_bw without `-a` syncs once before the run and then closes; an
//!   extra per-size handshake on our side made ib_send_bw close first and
//!   reset the connection (in either role).
//! * ib_send_lat's client receives all `-n` messages before it moves on;
//!   ours left the last one in the queue, and under `-a` the next size's
//!   receives overflowed the queue.
//! * `-b` (duplex): both sides post, a handshake starts each size (send_bw
//!   under `-a` ends each with another), the bandwidth reports are
//!   exchanged and both print their sum.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(240);

fn perftest(bin: &str, port: u16, args: &[&str]) -> Command {
    let mut c = common::command(bin);
    c.args(["-d", "srdma0", "-F", "-p"])
        .arg(port.to_string())
        .args(args);
    c
}

fn softrdma_perf(port: u16, args: &[&str]) -> Command {
    let tool = common::profile_dir().join("softrdma");
    assert!(
        tool.exists(),
        "{} is missing: build it first (cargo build --release --bin softrdma; scripts/test does)",
        tool.display()
    );
    let mut c = Command::new(tool);
    c.arg("perf")
        .args(args)
        .args(["-d", "srdma0", "-p"])
        .arg(port.to_string())
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn send_bw_one_size_in_both_roles() {
    let port = common::next_port();
    let (s, c) = common::pair(
        perftest("ib_send_bw", port, &["-n", "50"]),
        softrdma_perf(port, &["send_bw", "-n", "50"]),
        port,
        TIMEOUT,
    );
    common::assert_pair_ok("ib_send_bw server / softrdma perf send_bw client", &s, &c);
    let port = common::next_port();
    let (s, c) = common::pair(
        softrdma_perf(port, &["send_bw", "-n", "50"]),
        perftest("ib_send_bw", port, &["-n", "50"]),
        port,
        TIMEOUT,
    );
    common::assert_pair_ok("softrdma perf send_bw server / ib_send_bw client", &s, &c);
}

#[test]
fn send_lat_sweep_with_our_client() {
    let port = common::next_port();
    let (s, c) = common::pair(
        perftest("ib_send_lat", port, &["-a", "-n", "5"]),
        softrdma_perf(port, &["send_lat", "-a", "-n", "5"]),
        port,
        TIMEOUT,
    );
    common::assert_pair_ok(
        "ib_send_lat -a server / softrdma perf send_lat -a client",
        &s,
        &c,
    );
    let rows = c
        .stdout
        .lines()
        .filter(|l| l.starts_with(' ') && l.split_whitespace().count() >= 9)
        .filter(|l| l.split_whitespace().all(|w| w.parse::<f64>().is_ok()))
        .count();
    assert_eq!(rows, 23, "one row per size, 2 B to 8 MiB\n{}", c.text());
}

/// The table rows of a perftest-style output (the lines under the header).
fn table(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with(" #bytes"))
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .map(str::to_string)
        .collect()
}

/// Duplex runs against the real binaries, in both roles: the sequences
/// match (both exit 0) and both sides print the same summed rows.
#[test]
fn bidirectional_runs_in_both_roles() {
    for (bin, test, args) in [
        ("ib_write_bw", "write_bw", &["-b", "-n", "100"][..]),
        ("ib_read_bw", "read_bw", &["-b", "-n", "100"][..]),
        ("ib_atomic_bw", "atomic_bw", &["-b", "-n", "100"][..]),
        ("ib_send_bw", "send_bw", &["-b", "-n", "100"][..]),
        ("ib_write_bw", "write_bw", &["-b", "-a", "-n", "5"][..]),
        ("ib_send_bw", "send_bw", &["-b", "-a", "-n", "5"][..]),
    ] {
        let sizes = if args.contains(&"-a") { 23 } else { 1 };
        for ours_serve in [true, false] {
            let port = common::next_port();
            let (ours, theirs) = (
                softrdma_perf(port, &[&[test], args].concat()),
                perftest(bin, port, args),
            );
            let what = format!("{bin} {args:?}, softrdma perf serving: {ours_serve}");
            let (s, c) = if ours_serve {
                common::pair(ours, theirs, port, TIMEOUT)
            } else {
                common::pair(theirs, ours, port, TIMEOUT)
            };
            common::assert_pair_ok(&what, &s, &c);
            let (ts, tc) = (table(&s.stdout), table(&c.stdout));
            assert_eq!(ts.len(), sizes, "{what}: one row per size\n{}", s.text());
            assert_eq!(ts, tc, "{what}: both sides print the sum");
        }
    }
}

/// `-D` on the latency tests, against the real binaries serving: the two
/// sides agree on the run (both exit 0), and ours prints perftest's
/// duration report — its header exactly as perftest prints it here, one
/// row of size, iterations, t_avg and tps, consistent with each other
/// (t_avg × tps × the round-trip factor is a second, to t_avg's rounding).
#[test]
fn duration_latency_reports_as_perftest() {
    for (bin, test, rtt) in [
        ("ib_write_lat", "write_lat", 2.0),
        ("ib_send_lat", "send_lat", 2.0),
        ("ib_read_lat", "read_lat", 1.0),
    ] {
        let port = common::next_port();
        let (s, c) = common::pair(
            perftest(bin, port, &["-D", "2"]),
            softrdma_perf(port, &[test, "-D", "2"]),
            port,
            TIMEOUT,
        );
        let what = format!("{bin} -D 2 server / softrdma perf {test} -D 2 client");
        common::assert_pair_ok(&what, &s, &c);
        let header = |out: &str| {
            out.lines()
                .find(|l| l.starts_with(" #bytes"))
                .map(str::to_string)
        };
        let ours = header(&c.stdout);
        assert_eq!(
            ours.as_deref(),
            Some(" #bytes        #iterations       t_avg[usec]    tps average"),
            "{what}\n{}",
            c.text()
        );
        if bin != "ib_read_lat" {
            // perftest's read_lat server prints no table.
            assert_eq!(
                header(&s.stdout),
                ours,
                "{what}: perftest's own header\n{}",
                s.text()
            );
        }
        let rows = table(&c.stdout);
        assert_eq!(rows.len(), 1, "{what}\n{}", c.text());
        let f: Vec<f64> = rows[0]
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect();
        assert_eq!(f.len(), 4, "{what}: {}", rows[0]);
        assert_eq!(f[0], 2.0, "perftest's default latency size");
        assert!(f[1] > 0.0 && f[3] > 0.0, "{what}: {}", rows[0]);
        let t_avg = 1e6 / (f[3] * rtt);
        assert!(
            (t_avg - f[2]).abs() <= 0.005 + 1e-9,
            "{what}: t_avg {} against tps {} ({t_avg})",
            f[2],
            f[3]
        );
        // The row as perftest formats it (REPORT_FMT_LAT_DUR and tps).
        assert_eq!(
            rows[0],
            format!(
                " {:<7}       {}            {:<7.2}        {:<7.2}",
                2, f[1] as u64, f[2], f[3]
            ),
            "{what}"
        );
    }
}
