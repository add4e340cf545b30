//! What the CLI's end-to-end tests share.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback address of this test process's own (127.<pid>.<n>): a device
/// on it shares UDP port 4791 with no other test running alongside.
pub fn own_address() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(2);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 254 + 1;
    let pid = std::process::id() % 65536;
    format!("127.{}.{}.{n}", pid >> 8, pid & 0xff)
}

/// A counter from `softrdma perf --stats`' line: the number after `name`.
pub fn counter(out: &str, name: &str) -> u64 {
    let at = out
        .find(name)
        .unwrap_or_else(|| panic!("no `{name}` in:\n{out}"));
    out[at + name.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("`{name}` has no number in:\n{out}"))
}

/// Longest a child of these tests may run ([`finish`]).
pub const LIMIT: Duration = Duration::from_secs(90);

/// `softrdma SUBCOMMAND ARGS` with `env` added, stdin closed, its output
/// piped.
pub fn spawn_tool<S: AsRef<std::ffi::OsStr>>(
    subcommand: &str,
    args: &[S],
    env: &[(&str, &str)],
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg(subcommand)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run softrdma {subcommand}: {e}"))
}

/// `softrdma perf ARGS`, its output piped.
pub fn spawn(args: &[&str]) -> Child {
    spawn_env(args, &[])
}

/// `softrdma perf ARGS` with `env` added.
pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Child {
    spawn_tool("perf", args, env)
}

/// Wait for `c` with a deadline; kill it (ours, by pid) if it overstays.
/// Its piped output is read all along, so a child that prints more than a
/// pipe holds does not stall on it.
pub fn finish(mut c: Child, what: &str) -> Output {
    fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(c.stdout.take()), drain(c.stderr.take()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().expect("try_wait") {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "{what} still running after {LIMIT:?}; killed.\n{}\n{}",
                String::from_utf8_lossy(&out.join().unwrap()),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// A TCP port free now, for perf's exchange channel.
pub fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}
