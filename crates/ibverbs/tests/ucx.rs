//! UCX (Debian's ucx-utils: ucx_perftest, unmodified) on softrdma's
//! libibverbs.so.1: the six UCP tests of issue 16's must-show
//! (`ucp_put_lat`, `ucp_put_bw`, `ucp_get`, `ucp_am_bw`, `tag_lat`,
//! `tag_bw`) between two processes on this host, over UCX's `rc_verbs`
//! (with `ud_verbs` beside it: UCP wires RC endpoints up through an
//! auxiliary transport) and over `ud_verbs` alone. Open MPI over UCX's
//! `rc_verbs` is tests/mpi_ucx.rs.
//!
//! Both processes run under `softrdma run`, which shows UCX the
//! `/dev/infiniband/uverbs0` node it insists on opening and the
//! `/sys/class/infiniband` GID types it reads (docs/INTEROP.md, UCX). The
//! node appears only for root (without a user namespace), so this file
//! needs root; scripts/test-unprivileged leaves it out.
//!
//! Each pair is bounded by a timeout; both processes must exit 0 (a
//! teardown that hangs after the measurement fails the test: that was
//! `ibv_get_async_event` waiting on a descriptor UCX had made
//! non-blocking) and the client must print UCX's `Final:` result line for
//! the iterations asked, with something measured. The numbers belong to
//! docs/PERFORMANCE.md, not to assertions.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);
const ITERS: u32 = 2000;

const TESTS: [&str; 6] = [
    "ucp_put_lat",
    "ucp_put_bw",
    "ucp_get",
    "ucp_am_bw",
    "tag_lat",
    "tag_bw",
];

/// `target/<profile>/softrdma`, which `scripts/test` builds first.
fn softrdma_tool() -> PathBuf {
    let p = common::profile_dir().join("softrdma");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build --release --bin softrdma; scripts/test does)",
        p.display()
    );
    p
}

fn ucx_perftest() -> PathBuf {
    let p = PathBuf::from("/usr/bin/ucx_perftest");
    assert!(
        p.exists(),
        "ucx_perftest is not installed: apt-get install -y ucx-utils (this test runs the real binary)"
    );
    p
}

fn require_root() {
    // SAFETY: geteuid has no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test needs root: UCX opens /dev/infiniband/uverbs0, which `softrdma run` shows only to root"
    );
}

/// `ucx_perftest ARGS` under `softrdma run`, with UCX limited to `tls` on
/// softrdma's one test device.
fn perftest(tls: &str, port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(softrdma_tool());
    c.arg("run")
        .arg("--lib-dir")
        .arg(common::lib_dir())
        .arg("--")
        .arg(ucx_perftest())
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
        .env("UCX_NET_DEVICES", "srdma0:1")
        .env("UCX_TLS", tls)
        .env_remove("SOFTRDMA_MTU")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The numbers of ucx_perftest's `Final:` line: iterations, then
/// 50th-percentile, average and overall latency, average and overall
/// bandwidth, average and overall message rate.
fn final_line(out: &str) -> Option<Vec<f64>> {
    out.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("Final:")?;
        let nums: Vec<f64> = rest
            .split_whitespace()
            .map(|w| w.parse::<f64>().ok())
            .collect::<Option<_>>()?;
        (nums.len() == 8).then_some(nums)
    })
}

/// Whether UCX's debug log (`UCX_LOG_LEVEL=debug`: the lanes of each
/// endpoint UCP wires up) put `tl` on softrdma's device for active
/// messages — what tag matching and the AM tests send on.
fn am_lane_on(log: &str, tl: &str) -> bool {
    let dev = format!("{tl}/srdma0:1");
    log.lines()
        .any(|l| l.contains("lane[") && l.contains(&dev) && l.contains(" am "))
}

fn run(tls: &str, test: &str) {
    let port = common::next_port();
    let what = format!("ucx_perftest -t {test} over UCX_TLS={tls}");
    let iters = ITERS.to_string();
    let mut client = perftest(
        tls,
        port,
        &["-t", test, "-s", "4096", "-n", &iters, "-w", "100"],
    );
    // UCX's debug log to a file: on stdout it could outgrow the pipe,
    // which is read only once the client has exited.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a scratch directory");
    let log = dir.path().join("ucx.log");
    client
        .env("UCX_LOG_LEVEL", "debug")
        .env("UCX_LOG_FILE", &log);
    let (s, c) = common::pair(perftest(tls, port, &[]), client, port, TIMEOUT);
    common::assert_pair_ok(&what, &s, &c);
    // The transport under test carries the endpoint (not only wire-up).
    let tl = tls.split(',').next().expect("a transport");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        am_lane_on(&log, tl),
        "{what}: UCX put no AM lane on {tl}/srdma0:1\n{}\n--- UCX log\n{log}",
        c.text()
    );
    let Some(f) = final_line(&c.stdout) else {
        panic!("{what}: no Final: result line\n{}", c.text());
    };
    assert_eq!(f[0], f64::from(ITERS), "{what}: iterations\n{}", c.text());
    // Something was measured: a latency and a message rate.
    assert!(
        f[2] > 0.0 && f[7] > 0.0,
        "{what}: empty result {f:?}\n{}",
        c.text()
    );
}

#[test]
fn six_ucp_tests_over_rc_verbs() {
    require_root();
    for t in TESTS {
        run("rc_verbs,ud_verbs,self", t);
    }
}

#[test]
fn six_ucp_tests_over_ud_verbs() {
    require_root();
    for t in TESTS {
        run("ud_verbs,self", t);
    }
}
