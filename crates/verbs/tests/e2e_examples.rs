//! The examples in `crates/verbs/examples`, run as a user runs them: a
//! server process and a client process on loopback, their output checked
//! line by line. Cargo builds the examples with the tests; the async one
//! needs the `tokio` feature (`scripts/test` turns it on) and this test
//! fails, saying so, when it was not built.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/<test binary> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("test binary");
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "example {name} was not built at {} (cargo test builds examples; async_server needs --features tokio, as scripts/test passes)",
        p.display()
    );
    p
}

/// A started example process, killed (by its pid) if the test ends first.
struct Proc(Child, &'static str);

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Wait for the example `who` (client or server) to exit by itself; fail
/// after [`LIMIT`] (the process is then killed by `Proc`'s drop).
fn exit_of(p: &mut Proc, who: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            t0.elapsed() < LIMIT,
            "{} {who} still running after {LIMIT:?}",
            p.1
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start `name serve 127.0.0.1:0` and read the address it listens on.
fn server(name: &'static str) -> (Proc, String, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(example(name))
        .args(["serve", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example server");
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut l = String::new();
    out.read_line(&mut l).expect("the server's first line");
    let addr = l
        .trim()
        .strip_prefix("serving on ")
        .unwrap_or_else(|| panic!("{name}: first line {l:?}"))
        .to_string();
    (Proc(c, name), addr, out)
}

/// Run `name connect addr args..` to its end; its stdout, or a failure.
fn client(name: &'static str, addr: &str, args: &[&str]) -> String {
    let c = Command::new(example(name))
        .arg("connect")
        .arg(addr)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example client");
    let mut p = Proc(c, name);
    let st = exit_of(&mut p, "client");
    let mut out = String::new();
    p.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    p.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(st.success(), "{name} client failed ({st}):\n{out}\n{err}");
    out
}

/// The server's remaining output once it has exited by itself.
fn finish(mut p: Proc, mut out: BufReader<std::process::ChildStdout>) -> String {
    let st = exit_of(&mut p, "server");
    let mut s = String::new();
    out.read_to_string(&mut s).unwrap();
    assert!(st.success(), "{} server failed ({st}):\n{s}", p.1);
    s
}

#[test]
fn remote_memory() {
    let (srv, addr, out) = server("remote_memory");
    let c = client("remote_memory", &addr, &[]);
    assert_eq!(
        c,
        "client: wrote 4096 bytes, read them back: identical\n\
         client: compare-and-swap 0 -> 42 found 0\n"
    );
    let s = finish(srv, out);
    // (i * 7 + 3) as u8 for i in 0..16
    assert_eq!(
        s,
        "server: bytes 0..16 now [03, 0a, 11, 18, 1f, 26, 2d, 34, 3b, 42, 49, 50, 57, 5e, 65, 6c]\n\
         server: counter at 4096 is 42\n"
    );
}

/// `N round trips of 8 B: min .. us, typical .. us, p99 .. us`, with
/// min ≤ typical ≤ p99.
fn round_trips(line: &str, n: usize) {
    let prefix = format!("{n} round trips of 8 B: min ");
    let rest = line
        .trim()
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{line:?}"));
    let v: Vec<f64> = rest
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(v.len(), 4, "{line:?}"); // min, typical, "99" of p99, p99
    assert!(v[0] > 0.0 && v[0] <= v[1] && v[1] <= v[3], "{line:?}");
}

#[test]
fn pingpong() {
    let (srv, addr, out) = server("pingpong");
    let c = client("pingpong", &addr, &["500"]);
    round_trips(&c, 500);
    assert_eq!(finish(srv, out), "");
}

#[test]
fn rpc() {
    let (srv, addr, out) = server("rpc");
    let c = client("rpc", &addr, &["3000"]);
    assert!(
        c.starts_with("client: 3000 calls answered correctly, 8 in flight, "),
        "{c}"
    );
    assert_eq!(finish(srv, out), "server: answered 3000 calls\n");
}

/// Two clients at once against one async server; it serves both on one
/// thread and keeps running (killed by its pid at the end).
#[test]
fn async_server() {
    let (srv, addr, mut out) = server("async_server");
    let a2 = addr.clone();
    let other = std::thread::spawn(move || client("async_server", &a2, &["300"]));
    let c = client("async_server", &addr, &["500"]);
    round_trips(&c, 500);
    round_trips(&other.join().unwrap(), 300);
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(l.split(": ").last().unwrap_or("").trim().to_string());
    }
    lines.sort();
    assert_eq!(lines, ["echoed 300 messages", "echoed 500 messages"]);
    drop(srv);
}
