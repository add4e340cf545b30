//! Child processes with deadlines: every command the suite runs goes
//! through here, so nothing can hang it.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a command ended.
#[derive(Debug, Clone)]
pub struct Output {
    /// Exit code; `None` if it was killed (deadline) or died by a signal.
    pub code: Option<i32>,
    pub timed_out: bool,
    /// stdout and stderr, interleaved only at line granularity (stderr last).
    pub text: String,
    pub secs: f64,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// `exit 0`, `exit 3`, `timed out after 60 s` or `killed by a signal`.
    pub fn status(&self) -> String {
        match (self.code, self.timed_out) {
            (_, true) => format!("timed out after {:.0} s", self.secs),
            (Some(c), _) => format!("exit {c}"),
            (None, _) => "killed by a signal".into(),
        }
    }
}

/// A started command whose output is being collected.
pub struct Running {
    child: Child,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
    started: Instant,
    deadline: Instant,
    pub what: String,
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Start `cmd` with stdout and stderr captured; it must end within `limit`.
pub fn spawn(mut cmd: Command, limit: Duration) -> std::io::Result<Running> {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let started = Instant::now();
    Ok(Running {
        child,
        out,
        err,
        started,
        deadline: started + limit,
        what,
    })
}

impl Running {
    /// The process id (to signal exactly this process).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait for the end, killing the process at its deadline.
    pub fn wait(mut self) -> Output {
        let mut timed_out = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() >= self.deadline => {
                    timed_out = true;
                    // Our own child, by its pid.
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        let mut text = String::new();
        for h in [self.out.take(), self.err.take()].into_iter().flatten() {
            text.push_str(&String::from_utf8_lossy(&h.join().unwrap_or_default()));
        }
        Output {
            code: if timed_out {
                None
            } else {
                status.and_then(|s| s.code())
            },
            timed_out,
            text,
            secs: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// Run `cmd` to completion within `limit`.
pub fn run(cmd: Command, limit: Duration) -> Output {
    match spawn(cmd, limit) {
        Ok(r) => r.wait(),
        Err(e) => Output {
            code: None,
            timed_out: false,
            text: format!("cannot start: {e}"),
            secs: 0.0,
        },
    }
}

/// Wait until `f` holds, polling every `step`, for at most `limit`.
pub fn wait_until(limit: Duration, step: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(step);
    }
}
