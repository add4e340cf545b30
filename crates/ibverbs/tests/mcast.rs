//! UD multicast through the C ABI, on loopback only, as two receiver
//! processes on one device address (127.0.0.1, sharing port 4791) and
//! sender processes:
//!
//! * the verbs (`ibv_attach_mcast` / `ibv_detach_mcast`, `tests/c/mcast.c`):
//!   four QPs per receiver; every QP attached with the right Q_Key gets
//!   every datagram, exact; the one with another Q_Key gets only the
//!   datagram sent with its own; a detached QP gets nothing more;
//! * rdma_cm (`rdma_join_multicast*` / `rdma_leave_multicast`,
//!   `tests/c/mcast_cm.c`): two IDs per receiver, MULTICAST_JOIN's
//!   parameters as the kernel's for RoCE, a send-only sender using them,
//!   and an ID that left getting nothing more.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const STEP: Duration = Duration::from_secs(30);

struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Proc {
    fn spawn(exe: &std::path::Path, args: &[&str], name: &str) -> Proc {
        let mut child = Command::new(exe)
            .args(args)
            .env("LD_LIBRARY_PATH", common::lib_dir())
            .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
            .env("SOFTRDMA_IBV_LOG", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            stdin,
            lines,
            name: name.into(),
        }
    }

    /// The next line, which must be `want`, within [`STEP`].
    fn expect(&mut self, want: &str) {
        match self.lines.recv_timeout(STEP) {
            Ok(l) => assert_eq!(l, want, "{}", self.name),
            Err(e) => {
                let _ = self.child.kill();
                let st = self.child.wait();
                panic!("{}: no '{want}' ({e}); status {st:?}", self.name);
            }
        }
    }

    fn finish(mut self) {
        let _ = self.stdin.flush();
        drop(self.stdin);
        for _ in 0..(STEP.as_millis() / 20) {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "{} exited {st:?}", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("{} did not exit", self.name);
    }
}

fn send(exe: &std::path::Path, phase: &str) {
    let mut s = Proc::spawn(exe, &["send", phase], &format!("sender {phase}"));
    s.expect("sent");
    s.finish();
}

#[test]
fn datagrams_to_a_group_reach_every_attached_qp_of_two_processes() {
    let exe = common::compile_c("mcast", &[]);
    let mut rx: Vec<Proc> = (0..2)
        .map(|i| Proc::spawn(&exe, &["recv"], &format!("receiver {i}")))
        .collect();
    for r in &mut rx {
        r.expect("ready");
    }
    send(&exe, "1");
    for r in &mut rx {
        r.expect("detached");
    }
    send(&exe, "2");
    for r in &mut rx {
        r.expect("done");
    }
    for r in rx {
        r.finish();
    }
}

#[test]
fn rdma_cm_joins_sends_to_and_leaves_a_group() {
    common::require_rdmacm();
    let exe = common::compile_c("mcast_cm", &["-lrdmacm"]);
    let mut rx: Vec<Proc> = (0..2)
        .map(|i| Proc::spawn(&exe, &["recv"], &format!("cm receiver {i}")))
        .collect();
    for r in &mut rx {
        r.expect("ready");
    }
    send(&exe, "1");
    for r in &mut rx {
        r.expect("left");
    }
    send(&exe, "2");
    for r in &mut rx {
        r.expect("done");
    }
    for r in rx {
        r.finish();
    }
}
