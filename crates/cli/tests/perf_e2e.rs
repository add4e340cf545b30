//! `softrdma perf` end to end: every benchmark between two processes on
//! loopback with `--check` (the data that moved is verified byte for byte
//! and a mismatch fails the run), over each transport it allows, with
//! several QPs, completion events, an impaired link, and with server and
//! client started as separate commands the way perftest users run them.
//!
//! Iteration counts are small: these tests are about correctness, and the
//! tables' figures are never asserted.

mod common;
use common::{finish, free_port, own_address, spawn, spawn_env};
use std::process::{Command, Stdio};

/// Run `perf ARGS --loopback --check`; it must succeed and say every byte
/// was verified. Returns stdout.
fn checked(args: &[&str]) -> String {
    checked_env(args, &[])
}

/// [`checked`] for UC and UD, which have no retransmission, on a device of
/// its own (a loopback address no other test uses). Processes sharing an
/// address share its UDP port 4791 through a reuseport group, and a member
/// leaving the group moves the last member to its index: datagrams to the
/// moved member can be lost during the two system calls of the leave (see
/// DESIGN.md, "Several processes, one port"). RC retransmits them; UC and
/// UD may lose them, as their semantics allow, and a count-exact benchmark
/// over them would then wait forever for the lost message. So these runs
/// do not share their port with the tests running alongside.
fn checked_alone(args: &[&str]) -> String {
    let addr = own_address();
    let dev = format!("iso={addr}");
    let mut a = args.to_vec();
    a.extend(["-d", "iso"]);
    checked_env(&a, &[("SOFTRDMA_DEVICES", &dev)])
}

fn checked_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut a = args.to_vec();
    a.extend(["--loopback", "--check"]);
    let what = a.join(" ");
    let o = finish(spawn_env(&a, env), &what);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "perf {what}: {}\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    assert!(
        out.lines().any(|l| l == " --check: every byte verified"),
        "perf {what}: no verification line\n{out}"
    );
    out
}

/// The result row for `size`: the line under the table header that starts
/// with it.
fn row(out: &str, size: u64) -> &str {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(" #bytes"));
    assert!(lines.next().is_some(), "no table header in\n{out}");
    lines
        .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
        .unwrap_or_else(|| panic!("no row for {size} bytes in\n{out}"))
}

#[test]
fn every_benchmark_verifies_its_data() {
    let cases: [(&str, &str, u64); 8] = [
        ("write_bw", "RDMA_Write BW Test", 65536),
        ("write_lat", "RDMA_Write Latency Test", 2),
        ("read_bw", "RDMA_Read BW Test", 65536),
        ("read_lat", "RDMA_Read Latency Test", 2),
        ("send_bw", "Send BW Test", 65536),
        ("send_lat", "Send Latency Test", 2),
        ("atomic_bw", "Atomic FETCH_AND_ADD BW Test", 8),
        ("atomic_lat", "Atomic FETCH_AND_ADD Latency Test", 8),
    ];
    for (test, title, size) in cases {
        let out = checked(&[test, "-n", "200"]);
        assert!(
            out.lines().any(|l| l.trim() == title),
            "{test}: title {title:?} missing\n{out}"
        );
        let r = row(&out, size);
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f[1], "200", "{test}: iterations in {r:?}");
    }
}

/// send_bw over RC, UC and UD at sizes that make the buffers cycle through
/// several slots (and, for UD, slots that also hold the GRH), with one and
/// several QPs.
#[test]
fn send_bw_on_every_transport() {
    for conn in ["RC", "UC", "UD"] {
        let run = if conn == "RC" { checked } else { checked_alone };
        for size in ["1", "1000", "2048", "4096"] {
            let out = run(&["send_bw", "-c", conn, "-s", size, "-n", "300"]);
            row(&out, size.parse().unwrap());
        }
        run(&["send_bw", "-c", conn, "-s", "64", "-q", "3", "-n", "200"]);
    }
    checked_alone(&["send_lat", "-c", "UD", "-s", "100", "-n", "200"]);
    checked_alone(&["write_lat", "-c", "UC", "-s", "100", "-n", "200"]);
    checked_alone(&["write_bw", "-c", "UC", "-s", "3000", "-n", "200"]);
}

#[test]
fn several_qps_events_and_compare_swap() {
    checked(&["write_bw", "-q", "4", "-s", "100", "-n", "300"]);
    checked(&["read_bw", "-q", "4", "-s", "5000", "-n", "200"]);
    checked(&["atomic_bw", "-q", "2", "-A", "CMP_AND_SWAP", "-n", "200"]);
    checked(&["send_lat", "-e", "-n", "200"]);
    checked(&["send_bw", "-e", "-n", "200", "-s", "10000"]);
    checked(&["read_lat", "-e", "-n", "200", "-s", "4097"]);
    checked(&["send_bw", "-a", "-n", "20"]);
}

/// Loss, reordering, duplication and corruption injected at the IO layer of
/// both processes: RC recovers and every byte still arrives.
#[test]
fn lossy_link_still_delivers_every_byte() {
    let f = "loss=0.02,reorder=0.02,dup=0.01,corrupt=0.001,seed=5";
    checked(&["write_bw", "-s", "8192", "-n", "300", "--fault", f]);
    checked(&["read_bw", "-s", "10000", "-n", "200", "--fault", f]);
    checked(&["send_bw", "-s", "3000", "-n", "300", "--fault", f]);
    checked(&["atomic_bw", "-n", "300", "--fault", f]);
}

/// Server and client as two commands, perftest style: both print the
/// table, both exit 0, and the server's `--check` of the written memory
/// holds.
#[test]
fn server_and_client_as_separate_commands() {
    for test in ["write_bw", "read_bw", "send_bw"] {
        let port = free_port();
        let common = [test, "-p", &port, "-n", "200", "-s", "4000", "--check"];
        let server = spawn(&common);
        let mut ca = common.to_vec();
        ca.push("127.0.0.1");
        // perf's client retries its connection while the server starts.
        let client = spawn(&ca);
        let c = finish(client, &format!("{test} client"));
        let s = finish(server, &format!("{test} server"));
        for (who, o) in [("server", &s), ("client", &c)] {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success(),
                "{test} {who}: {}\n{out}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            let r = row(&out, 4000);
            assert_eq!(
                r.split_whitespace().nth(1),
                Some("200"),
                "{test} {who}: {r}"
            );
            assert!(
                out.contains(" --check: every byte verified"),
                "{test} {who}\n{out}"
            );
        }
    }
}

/// Bidirectional runs (`-b`, perftest's duplex mode) as two commands: both
/// sides post at once, each verifies what the other wrote, read or sent
/// into it, and both print the same row: the sum of the two directions'
/// reports, exchanged as perftest exchanges them. Over UDP and over shared
/// memory, for every bandwidth test (send_bw with `-a` too, whose sizes
/// each end in a handshake).
#[test]
fn bidirectional_runs_verify_both_directions() {
    for transport in ["udp", "shm"] {
        for (test, extra) in [
            ("write_bw", &["-s", "4000", "-n", "200"][..]),
            ("read_bw", &["-s", "4000", "-n", "200"][..]),
            ("atomic_bw", &["-n", "200"][..]),
            ("send_bw", &["-s", "4000", "-n", "200"][..]),
            ("send_bw", &["-a", "-n", "10"][..]),
        ] {
            let port = free_port();
            let mut common = vec![test, "-b", "-p", &port, "--check", "--transport", transport];
            common.extend(extra);
            let server = spawn(&common);
            let mut ca = common.clone();
            ca.push("127.0.0.1");
            let c = finish(spawn(&ca), &format!("{test} -b client"));
            let s = finish(server, &format!("{test} -b server"));
            let mut rows = Vec::new();
            for (who, o) in [("server", &s), ("client", &c)] {
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                assert!(
                    o.status.success() && out.contains(" --check: every byte verified"),
                    "{test} -b {extra:?} over {transport}, {who}: {}\n{out}\n{}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                );
                let table: Vec<String> = out
                    .lines()
                    .skip_while(|l| !l.starts_with(" #bytes"))
                    .skip(1)
                    .take_while(|l| !l.starts_with("---"))
                    .map(str::to_string)
                    .collect();
                assert!(!table.is_empty(), "{test} -b {who}: no rows\n{out}");
                rows.push(table);
            }
            assert_eq!(
                rows[0], rows[1],
                "{test} -b {extra:?} over {transport}: both sides print the sum"
            );
        }
    }
    let o = finish(spawn(&["write_lat", "-b", "--loopback"]), "write_lat -b");
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("bandwidth tests only"),
        "a latency test refuses -b by name: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `#iterations` of a bandwidth row is perftest's `iters × num_of_qps`:
/// the messages of all QPs, on the client, on a send_bw server (which
/// counts what it received) and in a bidirectional row.
#[test]
fn iterations_column_counts_every_qp() {
    let out = checked(&["write_bw", "-q", "2", "-s", "100", "-n", "50"]);
    assert_eq!(row(&out, 100).split_whitespace().nth(1), Some("100"));
    let out = checked(&["send_bw", "-b", "-q", "3", "-s", "100", "-n", "50"]);
    assert_eq!(row(&out, 100).split_whitespace().nth(1), Some("150"));
    let port = free_port();
    let common = ["send_bw", "-p", &port, "-q", "2", "-s", "100", "-n", "50"];
    let server = spawn(&common);
    let mut ca = common.to_vec();
    ca.push("127.0.0.1");
    let c = finish(spawn(&ca), "send_bw -q 2 client");
    let s = finish(server, "send_bw -q 2 server");
    for (who, o) in [("server", &s), ("client", &c)] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{who}: {}\n{out}", o.status);
        assert_eq!(
            row(&out, 100).split_whitespace().nth(1),
            Some("100"),
            "send_bw -q 2 -n 50, {who}"
        );
    }
}

/// `-l` (perftest's post list): send WRs posted a list per call, CQ
/// moderation the list size unless `-Q` says otherwise, the banner's
/// `Post List` line; refused where perftest refuses it.
#[test]
fn post_list_posts_whole_lists() {
    let out = checked(&["write_bw", "-l", "8", "-s", "1000", "-n", "200"]);
    assert!(out.contains(" Post List       : 8\n"), "{out}");
    assert!(out.contains(" CQ Moderation   : 8\n"), "{out}");
    assert_eq!(row(&out, 1000).split_whitespace().nth(1), Some("200"));
    let out = checked(&["send_bw", "-l", "4", "-Q", "2", "-q", "2", "-n", "100"]);
    assert!(out.contains(" CQ Moderation   : 2\n"), "{out}");
    checked(&["read_bw", "-l", "16", "-s", "100", "-n", "160"]);
    checked(&["atomic_bw", "-b", "-l", "4", "-n", "100"]);
    for (args, says) in [
        (
            &["write_lat", "-l", "2"][..],
            "Post list is supported in BW tests only",
        ),
        (
            &["write_bw", "-l", "3", "-n", "100"][..],
            "multiple of post list size",
        ),
        (
            &["write_bw", "-l", "4", "-Q", "3"][..],
            "multiple of CQ moderation",
        ),
    ] {
        let mut a = args.to_vec();
        a.push("--loopback");
        let o = finish(spawn(&a), &a.join(" "));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{a:?}: {err}");
    }
}

/// perftest's flags softrdma does not implement are refused by name (with
/// what they do), never run as if they had not been given.
#[test]
fn unsupported_perftest_flags_are_refused_by_name() {
    for (args, says) in [
        (
            &["write_bw", "--run_infinitely"][..],
            "perftest's --run_infinitely",
        ),
        (&["write_lat", "-X", "1"][..], "perftest's -X/--vector"),
        (&["read_lat", "-g"][..], "perftest's -g/--mcg"),
        (&["send_bw", "-S", "3"][..], "perftest's -S/--sl"),
        (&["write_bw", "--out_json"][..], "perftest's --out_json"),
        (&["send_lat", "--use-srq"][..], "perftest's --use-srq"),
        (
            &["write_lat", "-D", "2", "-H"][..],
            "-U, -H or -C with -D on a latency test",
        ),
    ] {
        let mut a = args.to_vec();
        a.push("--loopback");
        let o = finish(spawn(&a), &a.join(" "));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(says) && err.contains("does not support"),
            "{a:?}: {err}"
        );
    }
}

/// `-D` on a latency test over the loopback pair, with perftest's default
/// margin and with `-f`'s: perftest's duration table (header, one row of
/// size, iterations, t_avg and tps consistent with each other); and `-f`
/// as large as half of `-D` refused with perftest's words.
#[test]
fn duration_latency_with_and_without_a_margin() {
    for args in [
        &["write_lat", "-D", "2"][..],
        &["send_lat", "-D", "3", "-f", "1"][..],
    ] {
        let mut a = args.to_vec();
        a.push("--loopback");
        let o = finish(spawn(&a), &a.join(" "));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{a:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut lines = out.lines().skip_while(|l| !l.starts_with(" #bytes"));
        assert_eq!(
            lines.next(),
            Some(" #bytes        #iterations       t_avg[usec]    tps average"),
            "{a:?}\n{out}"
        );
        let f: Vec<f64> = lines
            .next()
            .expect("a row")
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect();
        assert_eq!(f.len(), 4, "{a:?}\n{out}");
        assert!(f[1] >= 1.0, "{a:?}: iterations\n{out}");
        assert!(
            (1e6 / (2.0 * f[3]) - f[2]).abs() <= 0.005 + 1e-9,
            "{a:?}: t_avg against tps\n{out}"
        );
    }
    let a = ["write_bw", "-D", "4", "-f", "2", "--loopback"];
    let o = finish(spawn(&a), &a.join(" "));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("DURATION > 2*MARGIN"),
        "{err}"
    );
}

/// `-U` and `-H` print every interval, as perftest's lists: `#, usec`,
/// then `i, value` — all `-n` − 1 in the order taken, then sorted less the
/// two largest — before the result line, the header again and the row,
/// whose t_min is the sorted list's first; `-C` the same in cycles.
/// Bandwidth tests refuse them, as perftest does.
#[test]
fn latency_samples_unsorted_sorted_and_in_cycles() {
    let n = 40;
    for (test, cycles) in [("write_lat", false), ("read_lat", true)] {
        let mut args = vec![test, "-n", "40", "-U", "-H"];
        if cycles {
            args.push("-C");
        }
        let out = checked(&args);
        let lines: Vec<&str> = out.lines().collect();
        let units = if cycles { "#, cycles" } else { "#, usec" };
        let lists: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == units).collect();
        assert_eq!(lists.len(), 2, "{test}: two lists in\n{out}");
        let list = |from: usize| -> Vec<f64> {
            lines[from + 1..]
                .iter()
                .take_while(|l| !l.starts_with('#') && !l.starts_with("---"))
                .enumerate()
                .map(|(i, l)| {
                    let (k, v) = l
                        .split_once(", ")
                        .unwrap_or_else(|| panic!("{test}: {l:?}"));
                    assert_eq!(k, (i + 1).to_string(), "{test}: numbered from 1");
                    v.parse::<f64>().unwrap()
                })
                .collect()
        };
        let (unsorted, sorted) = (list(lists[0]), list(lists[1]));
        assert_eq!(unsorted.len(), n - 1, "{test}: every interval");
        assert_eq!(sorted.len(), n - 3, "{test}: less the two largest");
        assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{test}: sorted");
        let mut all = unsorted.clone();
        all.sort_by(|a, b| a.total_cmp(b));
        assert_eq!(&all[..n - 3], &sorted[..], "{test}: the same intervals");
        if cycles {
            assert!(
                unsorted.iter().all(|c| *c >= 1.0 && c.fract() == 0.0),
                "{test}: whole cycles"
            );
        }
        let after = lists[1] + 1 + sorted.len();
        assert!(
            lines[after].starts_with("---"),
            "{test}: the result line after the lists"
        );
        assert!(
            lines[after + 1].starts_with(" #bytes"),
            "{test}: the header again"
        );
        let min: f64 = row(&out, 2)
            .split_whitespace()
            .nth(2)
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (min - sorted[0]).abs() <= 0.005 + sorted[0] * 1e-5,
            "{test}: t_min {min} vs {}",
            sorted[0]
        );
    }
    let a = ["write_bw", "-H", "--loopback"];
    let o = finish(spawn(&a), &a.join(" "));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("available only on latency tests"),
        "{err}"
    );
}

/// `-N` cancels the peak, as perftest's: the peak column reads 0.00 while
/// the average is measured.
#[test]
fn no_peak_leaves_the_peak_column_empty() {
    let out = checked(&["write_bw", "-N", "-s", "4096", "-n", "300"]);
    let f: Vec<&str> = row(&out, 4096).split_whitespace().collect();
    assert_eq!(f[2], "0.00", "peak in {f:?}");
    assert!(f[3].parse::<f64>().unwrap() > 0.0, "average in {f:?}");
    let out = checked(&["write_bw", "-s", "4096", "-n", "300"]);
    let f: Vec<&str> = row(&out, 4096).split_whitespace().collect();
    assert!(
        f[2].parse::<f64>().unwrap() > 0.0,
        "without -N a peak: {f:?}"
    );
}

/// `--check` fails for bytes that never arrived: the memory a test's data
/// lands in starts out different from what is sent there. A client that
/// writes 8 bytes per message to a server that checks 4,000 leaves the rest
/// of each slot as it was, and the server must say so.
#[test]
fn check_catches_bytes_that_never_arrived() {
    let port = free_port();
    let server = spawn(&["write_bw", "-p", &port, "-s", "4000", "-n", "50", "--check"]);
    let client = spawn(&[
        "write_bw",
        "-p",
        &port,
        "-s",
        "8",
        "-n",
        "50",
        "--check",
        "127.0.0.1",
    ]);
    let c = finish(client, "write_bw client");
    let s = finish(server, "write_bw server");
    assert!(
        c.status.success(),
        "the client: {}",
        String::from_utf8_lossy(&c.stderr)
    );
    let out = String::from_utf8_lossy(&s.stdout);
    let err = String::from_utf8_lossy(&s.stderr);
    assert!(
        !s.status.success()
            && out.contains(" --check: DATA MISMATCH")
            && err.contains("written target of QP 0 differs at byte 8"),
        "the server: {}\n{out}\n{err}",
        s.status
    );
}

/// `SOFTRDMA_TRANSPORT` picks the transport: `auto` (the default) and
/// `shm` carry the one-sided test through shared memory between the two
/// processes of this host, `udp` over UDP, each verified byte for byte and
/// each saying which it used; an unknown value is refused by name instead
/// of being measured over something else.
#[test]
fn softrdma_transport_is_honoured() {
    let run = |v: &str| {
        let c = Command::new(env!("CARGO_BIN_EXE_softrdma"))
            .args([
                "perf",
                "write_bw",
                "--loopback",
                "--check",
                "-n",
                "20",
                "-s",
                "4096",
            ])
            .env("SOFTRDMA_TRANSPORT", v)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run softrdma perf");
        finish(c, &format!("write_bw with SOFTRDMA_TRANSPORT={v}"))
    };
    for (v, says) in [
        ("udp", " Transport      : UDP (RoCEv2)"),
        ("auto", " Transport      : shared memory"),
        ("shm", " Transport      : shared memory"),
    ] {
        let o = run(v);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{v}: {}\n{out}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            out.contains(says),
            "{v}: stdout does not say {says:?}:\n{out}"
        );
        assert!(out.contains(" --check: every byte verified"), "{v}\n{out}");
    }
    let o = run("rdma");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "rdma must be refused");
    assert!(
        err.contains("expected auto, udp or shm"),
        "rdma: stderr does not say why:\n{err}"
    );
}

/// `-R`: the exchange and the data QPs through rdma_cm, server and client
/// as separate processes; perftest's banner lines and every byte checked.
#[test]
fn write_bw_with_rdma_cm() {
    let port = "19387";
    let srv = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf", "write_bw", "-R", "--check", "-n", "200", "-p", port])
        .stdout(Stdio::piped())
        .spawn()
        .expect("server");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let cli = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "perf",
            "write_bw",
            "-R",
            "--check",
            "-n",
            "200",
            "-p",
            port,
            "127.0.0.1",
        ])
        .output()
        .expect("client");
    let srv = srv.wait_with_output().expect("server output");
    for (who, o) in [("client", &cli), ("server", &srv)] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{who}: {out}");
        assert!(out.contains(" rdma_cm QPs\t : ON"), "{who}: {out}");
        assert!(out.contains(" Data ex. method : rdma_cm"), "{who}: {out}");
        assert!(
            out.contains(" --check: every byte verified"),
            "{who}: {out}"
        );
    }
}

/// `-R -c UD` (perftest's send tests over UD with rdma_cm): each data QP's
/// service resolved by SIDR, rdma_cm's Q_Key, every byte checked; the
/// default size (64 KiB for send_bw) cut to the MTU as perftest does. On a
/// device of its own address, as `checked_alone` (UD loses what a member
/// leaving a shared port's group costs, and the count-exact test would
/// wait for it); both processes bounded by `finish`.
#[test]
fn ud_send_tests_with_rdma_cm() {
    for test in ["send_bw", "send_lat"] {
        let addr = own_address();
        let dev = format!("iso={addr}");
        let env = [("SOFTRDMA_DEVICES", dev.as_str())];
        let port = free_port().to_string();
        let common = [
            "-R", "-c", "UD", "--check", "-n", "200", "-d", "iso", "-p", &port,
        ];
        let mut sargs = vec![test];
        sargs.extend(common);
        let mut cargs = sargs.clone();
        cargs.push(&addr);
        let srv = spawn_env(&sargs, &env);
        let cli = finish(spawn_env(&cargs, &env), "client");
        let srv = finish(srv, "server");
        for (who, o) in [("client", &cli), ("server", &srv)] {
            let out = String::from_utf8_lossy(&o.stdout);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{test} {who}: {out}{err}");
            assert!(out.contains(" Connection type : UD"), "{test} {who}: {out}");
            assert!(out.contains(" rdma_cm QPs\t : ON"), "{test} {who}: {out}");
            assert!(
                out.contains(" --check: every byte verified"),
                "{test} {who}: {out}"
            );
            if test == "send_bw" {
                assert!(
                    err.contains(" Max msg size in UD is MTU 4096"),
                    "{who}: {err}"
                );
                assert!(
                    out.lines().any(|l| l.trim_start().starts_with("4096 ")),
                    "{who}: {out}"
                );
            }
        }
    }
}

/// `softrdma perf … | head -1` (and `decode`'s, `devinfo`'s): a reader
/// that stops reading is not an error — the run goes on to its normal end
/// and succeeds, with nothing on stderr (println! panicked with a
/// backtrace). Standard output is a pipe whose read end is closed before
/// the program starts, so its first write meets it closed.
#[test]
fn a_reader_that_stops_is_not_an_error() {
    let cap = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../wire/tests/golden/rc_read.pcap"
    );
    for args in [
        &[
            "perf",
            "write_lat",
            "-s",
            "8",
            "-n",
            "1000",
            "--loopback",
            "--tsv",
        ][..],
        &["decode", cap],
        &["decode", "--json", cap],
        &["devinfo"],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let c = Command::new(env!("CARGO_BIN_EXE_softrdma"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .expect("run softrdma");
        let out = finish(c, "softrdma into a closed pipe");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "softrdma {args:?} into a closed pipe: {:?}, stderr {stderr:?}",
            out.status
        );
    }
}
