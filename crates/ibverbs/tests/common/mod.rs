//! Running the real Debian RDMA binaries on softrdma's libibverbs.so.1.
//!
//! The library cargo built for these tests (`target/<profile>/deps/
//! libsoftrdma_ibverbs.so`: the crate is also an rlib so that cargo builds
//! it for integration tests, and test builds do not copy it up a level) is
//! copied under its soname into
//! `target/<profile>/ibverbs/`, and every program runs with
//! `LD_LIBRARY_PATH` pointing there and one device, `srdma0` on 127.0.0.1.
//! A missing binary fails the test and names the package to install: these
//! tests exist to run those programs, so skipping would hide a gap.
//!
//! Pairs (a server and a client process, as the tools are used across two
//! hosts) run one at a time within a test binary: the CI machine has two
//! cores, and two pairs at once would only measure the scheduler.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// `target/<profile>`, found from this test executable
/// (`target/<profile>/deps/<test>-<hash>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// The directory holding `libibverbs.so.1` (our build), for
/// `LD_LIBRARY_PATH`.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile = profile_dir();
        let built = profile.join("deps").join("libsoftrdma_ibverbs.so");
        assert!(
            built.exists(),
            "{} is missing: cargo builds it with this package's tests",
            built.display()
        );
        let dir = profile.join("ibverbs");
        let dst = dir.join("libibverbs.so.1");
        let fresh = |p: &Path| {
            let (Ok(a), Ok(b)) = (std::fs::metadata(p), std::fs::metadata(&built)) else {
                return false;
            };
            a.len() == b.len() && a.modified().ok() >= b.modified().ok()
        };
        if fresh(&dst) {
            // Up to date (scripts/build-ibverbs made it): nothing to write,
            // which also lets an unprivileged user run these tests from a
            // checkout it cannot write to (scripts/test-unprivileged).
            return dir;
        }
        std::fs::create_dir_all(&dir).unwrap();
        // Copy, then rename: a process still running from an earlier copy
        // keeps its mapping intact.
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        std::fs::copy(&built, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("libibverbs.so.1")).unwrap();
        dir
    })
}

/// `librdmacm.so.1` (our build, which `scripts/build-ibverbs` and a
/// workspace build make) next to `libibverbs.so.1`; panics saying how to
/// build it if it is missing.
#[allow(dead_code)]
pub fn require_rdmacm() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let dir = lib_dir();
        let built = profile_dir().join("libsoftrdma_rdmacm.so");
        assert!(
            built.exists(),
            "{} is missing: build it with scripts/build-ibverbs (or cargo build --release -p softrdma-rdmacm)",
            built.display()
        );
        let dst = dir.join("librdmacm.so.1");
        let fresh = std::fs::metadata(&dst)
            .ok()
            .zip(std::fs::metadata(&built).ok())
            .is_some_and(|(a, b)| a.len() == b.len() && a.modified().ok() >= b.modified().ok());
        if !fresh {
            let tmp = dir.join(format!(".librdmacm.so.1.{}", std::process::id()));
            std::fs::copy(&built, &tmp).unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
        }
    });
}

/// The path of an installed tool; panics naming its Debian package.
pub fn tool(name: &str) -> PathBuf {
    let pkg = if name.starts_with("ib_") {
        "perftest"
    } else if ["rping", "ucmatose", "udaddy"].contains(&name) {
        "rdmacm-utils"
    } else if name.starts_with("fi_") {
        "libfabric-bin"
    } else {
        "ibverbs-utils"
    };
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is not installed: apt-get install -y {pkg} (these tests run the real binaries)");
}

/// A command for `name` set up to use our library and the one test device.
pub fn command(name: &str) -> Command {
    let mut c = Command::new(tool(name));
    c.env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
        .env("SOFTRDMA_IBV_LOG", "1")
        .env("SOFTRDMA_IBV_STATS", "1")
        .env_remove("SOFTRDMA_MTU")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// What a finished program printed.
#[derive(Debug)]
pub struct Output {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.status == Some(0)
    }
    pub fn text(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Wait for `child` until `deadline`, then kill it; collect its output.
fn finish(mut child: Child, deadline: Instant) -> Output {
    let status = loop {
        match child.try_wait().expect("wait") {
            Some(s) => break s.code(),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Wait for a started program (killed after `timeout`); its output.
pub fn wait(child: Child, timeout: Duration) -> Output {
    finish(child, Instant::now() + timeout)
}

/// Run one program to completion (killed after `timeout`).
pub fn run(mut cmd: Command, timeout: Duration) -> Output {
    let child = cmd.spawn().expect("spawn");
    finish(child, Instant::now() + timeout)
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TCP port for one pair's out-of-band exchange, different for every
/// pair of every test binary run at about the same time.
pub fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 200) as u16 * 50;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 50
}

/// Whether some socket listens on TCP `port` (IPv4 or IPv6).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(3) == Some("0A") && l.contains(&want))
        })
    })
}

/// Run a server and a client against it (the client gets `127.0.0.1` as
/// its last argument), both killed after `timeout`. The client starts
/// once the server listens on `port`.
pub fn pair(
    server: Command,
    mut client: Command,
    port: u16,
    timeout: Duration,
) -> (Output, Output) {
    let _one_at_a_time = serial();
    let deadline = Instant::now() + timeout;
    let mut server = server;
    let mut srv = server.spawn().expect("spawn server");
    let t0 = Instant::now();
    while !listening(port) && t0.elapsed() < Duration::from_secs(20) {
        if srv.try_wait().expect("wait").is_some() {
            // It ended before listening: report it, with an idle client.
            let s = finish(srv, deadline);
            let c = Output {
                status: None,
                stdout: String::new(),
                stderr: "(not started: the server ended first)".into(),
            };
            return (s, c);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = client.arg("127.0.0.1").spawn().expect("spawn client");
    let c = finish(cli, deadline);
    // The server ends shortly after the client; give it a little longer.
    let s = finish(srv, deadline.max(Instant::now()) + Duration::from_secs(5));
    (s, c)
}

/// Assert both ends succeeded, printing everything they said if not.
pub fn assert_pair_ok(what: &str, s: &Output, c: &Output) {
    assert!(
        s.ok() && c.ok(),
        "{what} failed\n=== server: {}\n=== client: {}",
        s.text(),
        c.text()
    );
}

/// A test program compiled from `tests/c` ([`compile_c`]): its path, in a
/// directory of its own that goes when this does.
pub struct CProgram {
    exe: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for CProgram {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.exe
    }
}

impl AsRef<std::ffi::OsStr> for CProgram {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.exe.as_os_str()
    }
}

/// Compile one of `tests/c/*.c` against the system headers, linking
/// `-libverbs` (and `extra`); it runs with our library first.
pub fn compile_c(name: &str, extra: &[&str]) -> CProgram {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let dir = tempfile::Builder::new()
        .prefix("softrdma-ctest-")
        .tempdir()
        .expect("a scratch directory");
    let prog = CProgram {
        exe: dir.path().join(name),
        _dir: dir,
    };
    let out = std::process::Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-o")
        .arg(&prog.exe)
        .arg(&src)
        .arg("-libverbs")
        .args(extra)
        .output()
        .expect("cc is missing: apt-get install -y gcc libibverbs-dev");
    assert!(
        out.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    prog
}
