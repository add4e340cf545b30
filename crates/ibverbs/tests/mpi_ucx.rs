//! Open MPI over UCX's `rc_verbs` on softrdma's libibverbs.so.1: `mpirun
//! -np 2 --mca pml ucx` with `UCX_TLS=rc_verbs,ud_verbs,self` (no shared
//! memory transport: the ranks' messages go through softrdma's RC QPs;
//! `ud_verbs` is there for UCP's wire-up) on the one test device.
//!
//! Two programs, compiled here with mpicc (libopenmpi-dev): this file's
//! tests/mpi/allreduce_check.c, which checks every element of
//! `MPI_Allreduce(SUM)` results from 4 KiB to 16 MiB (UCX's eager and
//! rendezvous protocols), and the peers kit's mpi_allreduce.c
//! (`../shared/peers/`, the program issue 16 names), which must report
//! all its sizes and no wrong result.
//!
//! mpirun runs under `softrdma run` (its ranks inherit the mount namespace
//! with the `/dev/infiniband` node UCX opens, which appears only for root:
//! this file needs root; scripts/test-unprivileged leaves it out), bounded
//! by `timeout`, which stops mpirun and through it the ranks.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

const TIMEOUT_SECS: u64 = 180;

fn softrdma_tool() -> PathBuf {
    let p = common::profile_dir().join("softrdma");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build --release --bin softrdma; scripts/test does)",
        p.display()
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

fn require_mpirun() {
    let o = Command::new("mpirun")
        .arg("--version")
        .output()
        .expect("mpirun is needed for this test: apt-get install -y openmpi-bin");
    assert!(o.status.success(), "mpirun --version failed: {o:?}");
}

/// `src` compiled with mpicc into this test's scratch directory.
fn mpicc(src: &Path) -> PathBuf {
    assert!(src.exists(), "{} is missing", src.display());
    let exe = scratch().join(src.file_stem().expect("a file name"));
    let o = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(src)
        .output()
        .expect("mpicc is needed for this test: apt-get install -y libopenmpi-dev");
    assert!(
        o.status.success(),
        "mpicc {} failed (mpi.h comes with libopenmpi-dev)\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

/// This test binary's scratch directory, made once (a fresh name, not this
/// process's id: a pid can be reused by a later run on a busy machine).
fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("mpi_ucx-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a scratch directory under CARGO_TARGET_TMPDIR")
    })
    .path()
    .to_path_buf()
}

/// What a job printed, and the UCX debug logs of its ranks.
struct Job {
    out: common::Output,
    ucx_log: String,
}

/// `mpirun -np 2 --mca pml ucx` over `rc_verbs` running `prog ARGS`, one
/// job at a time (two at once on two cores only measure the scheduler).
fn mpirun(prog: &Path, args: &[&str]) -> Job {
    require_mpirun();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // UCX's debug log (the lanes of each endpoint) goes to files, one per
    // rank: on the job's stdout it is more than a pipe holds, and the pipe
    // is read only once the job has ended.
    let logs = scratch().join(format!(
        "ucx-{}",
        prog.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();
    let mut c = Command::new("timeout");
    c.args(["-k", "10", &TIMEOUT_SECS.to_string()])
        .arg(softrdma_tool())
        .arg("run")
        .arg("--lib-dir")
        .arg(common::lib_dir())
        .arg("--")
        .args([
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
        ])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args(["--mca", "pml", "ucx", "--mca", "btl", "^openib"])
        .args(["-x", "UCX_TLS=rc_verbs,ud_verbs,self"])
        .args(["-x", "UCX_NET_DEVICES=srdma0:1"])
        // The lanes each endpoint gets, to check what carried the data.
        .args(["-x", "UCX_LOG_LEVEL=debug", "-x"])
        .arg(format!("UCX_LOG_FILE={}/%p.log", logs.display()))
        .arg(prog)
        .args(args)
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
        .env_remove("SOFTRDMA_MTU")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // `timeout` ends it first; this only collects the output.
    let out = common::run(c, Duration::from_secs(TIMEOUT_SECS + 30));
    let mut ucx_log = String::new();
    for f in std::fs::read_dir(&logs).unwrap() {
        ucx_log += &std::fs::read_to_string(f.unwrap().path()).unwrap();
    }
    Job { out, ucx_log }
}

fn check_ran_on_rc(what: &str, j: &Job) {
    assert!(j.out.ok(), "{what} failed\n{}", j.out.text());
    let rc_am = j
        .ucx_log
        .lines()
        .any(|l| l.contains("lane[") && l.contains("rc_verbs/srdma0:1") && l.contains(" am "));
    assert!(
        rc_am,
        "{what}: UCX put no AM lane on rc_verbs/srdma0:1\n{}\n--- UCX log\n{}",
        j.out.text(),
        j.ucx_log
    );
}

#[test]
fn allreduce_every_element_over_rc_verbs() {
    require_root();
    let exe = mpicc(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/allreduce_check.c"));
    let j = mpirun(&exe, &[]);
    check_ran_on_rc("allreduce_check", &j);
    let o = &j.out;
    let oks: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("ok ")).collect();
    assert_eq!(
        oks,
        ["ok 4096", "ok 65536", "ok 1048576", "ok 16777216"],
        "{}",
        o.text()
    );
}

#[test]
fn peers_mpi_allreduce_over_rc_verbs() {
    require_root();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/mpi_allreduce.c");
    assert!(
        src.exists(),
        "{} is missing: this test runs the peers kit's program (../shared/peers next to the checkout)",
        src.display()
    );
    let exe = mpicc(&src);
    // 0.02 s per size: the program still runs at least 3 timed calls.
    let j = mpirun(&exe, &["0.02"]);
    check_ran_on_rc("mpi_allreduce", &j);
    let o = &j.out;
    assert!(!o.stderr.contains("wrong result"), "{}", o.text());
    let sizes: Vec<&str> = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("allreduce "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        sizes,
        ["4096", "65536", "1048576", "16777216", "67108864"],
        "{}",
        o.text()
    );
}
