//! `softrdma`: the command-line tools of softrdma.
//!
//! Each subcommand lives in its own module under `cmd/`; this file only
//! parses the command line and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` for what the tools report: a reader that stopped reading
/// (`softrdma perf … | head -1`) is not an error (`println!` panicked).
macro_rules! outln {
    () => { $crate::out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!`, the same way.
macro_rules! out {
    ($($t:tt)*) => { $crate::out(format_args!($($t)*)) };
}

mod cmd;

/// Write to standard output. Once the reader has closed the pipe, what
/// follows is dropped and the run goes on to its normal end (children
/// waited for, resources released) and exit status; any other failure
/// panics as `println!` would.
pub fn out(a: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    static CLOSED: AtomicBool = AtomicBool::new(false);
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(a) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CLOSED.store(true, Ordering::Relaxed);
            return;
        }
        panic!("failed printing to stdout: {e}");
    }
}

/// Whether `e`, or an error it wraps, is a write into a closed pipe.
fn broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[derive(Parser)]
#[command(name = "softrdma", version, about = "RDMA in software: RoCEv2 tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// nccl-tests' benchmarks over softrdma: all_reduce_perf, all_gather_perf, ...
    Coll(cmd::coll::Args),
    /// Decode the RoCEv2 packets of a pcap file, one line each (CM MADs to
    /// QP 1 field by field).
    Decode(cmd::decode::Args),
    /// Show the devices and their attributes (like ibv_devinfo).
    Devinfo(cmd::devinfo::Args),
    /// perftest-style benchmarks: write_bw, read_lat, send_bw, atomic_lat, ...
    Perf(cmd::perf::Args),
    /// rdma-core's ibv_rc/uc/ud_pingpong: same flags, exchange and output.
    Pingpong(cmd::pingpong::Args),
    /// Run an unmodified RDMA program on softrdma: our libraries, and the
    /// /sys/class/infiniband and /dev/infiniband files it looks for.
    Run(cmd::run::Args),
    /// Packet-level RoCE fabric simulator running the real transport.
    Sim(cmd::sim::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Coll(a) => cmd::coll::run(a),
        Cmd::Decode(a) => cmd::decode::run(a),
        Cmd::Devinfo(a) => cmd::devinfo::run(a),
        Cmd::Perf(a) => cmd::perf::run(a),
        Cmd::Pingpong(a) => cmd::pingpong::run(a),
        Cmd::Run(a) => cmd::run::run(a),
        Cmd::Sim(a) => cmd::sim::run(a),
    };
    match r {
        Ok(code) => code,
        // `decode … | head`: the reader has what it wanted.
        Err(e) if broken_pipe(&*e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::from(2)
        }
    }
}
