//! Port 4791 shared by several processes of one unprivileged user: each
//! gets exactly the datagrams for its own QPN slot, through a clean close,
//! a SIGKILL and a new join; a process of another user can neither join
//! the group nor take the address.
//!
//! The member processes are copies of this test binary (`member`, below).
//! Run as root, they run as the unprivileged user `softrdma-test` (created
//! if missing; the test fails if it cannot be created or switched to) and
//! root plays the other user. Run as another user, they run as that user
//! and the other-user test says it needs root to have a second user.

mod common;

use common::*;
use softrdma_udp::{Port, PortConfig};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SOFTRDMA_UDP_SHARING_MEMBER";
const TEST_USER: &str = "softrdma-test";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The uid and gid of the unprivileged test user, creating it if needed
/// (once per process: tests that ran `useradd` side by side raced).
fn test_user() -> (u32, u32) {
    static USER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *USER.get_or_init(create_test_user)
}

fn create_test_user() -> (u32, u32) {
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").args([flag, TEST_USER]).output().ok()?;
        String::from_utf8(o.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        let ok = Command::new("useradd")
            .args(["-m", TEST_USER])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cannot create the unprivileged user {TEST_USER} (useradd failed)"
        );
    }
    let uid = id("-u").unwrap_or_else(|| panic!("no uid for {TEST_USER}"));
    let gid = id("-g").unwrap_or_else(|| panic!("no gid for {TEST_USER}"));
    assert_ne!(uid, 0, "{TEST_USER} must not be root");
    (uid, gid)
}

/// A member process and its reply lines.
struct Member {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    slot: u32,
}

impl Member {
    fn spawn(addr: IpAddr) -> Member {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = if is_root() {
            let (uid, gid) = test_user();
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--clear-groups",
            ])
            .arg(&exe);
            // Root's runtime directory is not the member's.
            c.env_remove("XDG_RUNTIME_DIR");
            c
        } else {
            Command::new(&exe)
        };
        let mut child = cmd
            .args(["member", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, addr.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning a member (setpriv when root)");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                // libtest may print "test member ... " on the same line.
                if let Some(i) = l.find("MEMBER ") {
                    if tx.send(l[i + 7..].trim().to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let mut m = Member {
            child,
            stdin,
            lines,
            slot: 0,
        };
        let l = m.reply();
        let v: Vec<u32> = l
            .strip_prefix("SLOT ")
            .unwrap_or_else(|| panic!("member did not join: {l}"))
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        m.slot = v[0];
        // SAFETY: geteuid has no preconditions.
        let want_uid = if is_root() {
            test_user().0
        } else {
            unsafe { libc::geteuid() }
        };
        assert_eq!(
            v[1], want_uid,
            "the member runs as the unprivileged user: {l}"
        );
        m
    }

    fn reply(&mut self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("member replies")
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.reply()
    }

    /// Wait for `want` datagrams of our own; returns (own, wrongly
    /// delivered, wrong-slot drops, repairs) since the last report.
    fn report(&mut self, want: usize) -> [u64; 4] {
        let l = self.ask(&format!("report {want}"));
        let v: Vec<u64> = l
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        v.try_into().unwrap_or_else(|_| panic!("bad report: {l}"))
    }

    fn qpn(&self) -> u32 {
        self.slot << 16 | 0x0107
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send `n` datagrams to each of `qpns` at `to`, from QPs of several
/// source-port buckets.
fn spray(from: &mut Port, to: IpAddr, qpns: &[u32], n: u32) {
    let gid = match to {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let pkts: Vec<(u32, Pkt)> = qpns
        .iter()
        .flat_map(|&q| (0..n).map(move |i| (q, send_only(q, i, 32))))
        .collect();
    let mut tx = from.tx();
    for (k, (_, p)) in pkts.iter().enumerate() {
        tx.push(gid, 0x01_0000 + k as u32 % 7, &p.head, &[&p.payload], p.pad)
            .unwrap();
    }
    tx.finish().unwrap();
}

const N: u32 = 40;

/// One round: N datagrams to each member, N to `extra` (slots nobody
/// owns, or a dead member's); every member must get exactly its N, and the
/// only datagrams that reached a wrong socket are the extra ones.
fn exact_round(sender: &mut Port, addr: IpAddr, members: &mut [&mut Member], extra: &[u32]) {
    // The extra datagrams go first, but a member that has its own N may
    // still report before loopback's backlog has handed it a misdirected
    // one (on a loaded machine softirq work is deferred to ksoftirqd): so
    // the count of misdirected datagrams is awaited, not sampled once.
    let mut qpns = extra.to_vec();
    qpns.extend(members.iter().map(|m| m.qpn()));
    spray(sender, addr, &qpns, N);
    let want_wrong = N as u64 * extra.len() as u64;
    let mut wrong = 0;
    for m in members.iter_mut() {
        let [own, foreign, w, _] = m.report(N as usize);
        assert_eq!((own, foreign), (N as u64, 0), "member of slot {}", m.slot);
        wrong += w;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while wrong < want_wrong && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        for m in members.iter_mut() {
            let [own, foreign, w, _] = m.report(0);
            assert_eq!((own, foreign), (0, 0), "member of slot {}", m.slot);
            wrong += w;
        }
    }
    assert_eq!(wrong, want_wrong, "misdirected datagrams");
}

#[test]
fn members_share_through_close_kill_and_join() {
    let addr = v4(61);
    let mut sender = port_v4(62);
    let mut a = Member::spawn(addr);
    let mut b = Member::spawn(addr);
    let mut c = Member::spawn(addr);
    let mut d = Member::spawn(addr);
    let mut slots = vec![a.slot, b.slot, c.slot, d.slot];
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), 4, "distinct slots");
    let unowned = (1..=255u32).find(|s| !slots.contains(s)).unwrap() << 16 | 1;

    exact_round(
        &mut sender,
        addr,
        &mut [&mut a, &mut b, &mut c, &mut d],
        &[unowned],
    );

    // A clean close re-steers before the socket goes: nothing is lost.
    assert_eq!(b.ask("close"), "CLOSED");
    exact_round(&mut sender, addr, &mut [&mut a, &mut c, &mut d], &[unowned]);

    // SIGKILL: the kernel moves the last member into the dead one's index
    // and nobody re-steers. The dead slot's datagrams (its peers
    // retransmitting) now reach the moved member, which takes them as the
    // evidence and repairs the table.
    let dead = a.qpn();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    spray(&mut sender, addr, &[dead], 4);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut repairs = 0;
    while repairs == 0 && Instant::now() < deadline {
        repairs = c.report(0)[3] + d.report(0)[3];
        if repairs == 0 {
            spray(&mut sender, addr, &[dead], 1);
        }
    }
    assert_eq!(repairs, 1, "one member repaired the table");
    exact_round(&mut sender, addr, &mut [&mut c, &mut d], &[unowned, dead]);

    // A new member joins the repaired group and gets a free slot.
    let mut e = Member::spawn(addr);
    assert!(e.slot != c.slot && e.slot != d.slot);
    exact_round(&mut sender, addr, &mut [&mut c, &mut d, &mut e], &[unowned]);
    for m in [&mut c, &mut d, &mut e] {
        assert_eq!(m.ask("quit"), "BYE");
    }
}

#[test]
fn another_user_can_neither_join_nor_take_the_address() {
    if !is_root() {
        eprintln!(
            "this test needs a second user: run as root, it puts the members under \
             {TEST_USER} and tries to intrude as root; as a normal user there is no other user to be"
        );
        return;
    }
    let addr = v4(63);
    let mut sender = port_v4(64);
    let mut a = Member::spawn(addr);
    let mut b = Member::spawn(addr);
    let unowned = (1..=255u32).find(|&s| s != a.slot && s != b.slot).unwrap() << 16 | 1;

    // Root is another user here: no joining, with or without sharing.
    let e = Port::open(PortConfig::new(addr))
        .err()
        .expect("join refused");
    assert!(e.to_string().contains("does not share it"), "{e}");
    let e = Port::open(PortConfig {
        shared: false,
        ..PortConfig::new(addr)
    })
    .err()
    .expect("bind refused");
    assert!(e.to_string().contains("another process owns"), "{e}");
    // Nor by hand: SO_REUSEPORT, SO_REUSEADDR, or the wildcard address.
    let here = SocketAddr::new(addr, 4791);
    let any = SocketAddr::new("0.0.0.0".parse().unwrap(), 4791);
    for (reuseport, reuseaddr, at) in [
        (true, false, here),
        (false, true, here),
        (true, true, here),
        (true, false, any),
        (false, true, any),
    ] {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        s.set_reuse_port(reuseport).unwrap();
        s.set_reuse_address(reuseaddr).unwrap();
        let r = s.bind(&at.into());
        assert_eq!(
            r.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::AddrInUse),
            "bind {at} reuseport {reuseport} reuseaddr {reuseaddr}"
        );
    }
    // The members' state is not readable by the intruder's processes
    // either: it sits in the member user's 0700 runtime directory (root
    // can read anything; the mode is what another user meets).
    exact_round(&mut sender, addr, &mut [&mut a, &mut b], &[unowned]);
}

/// A member process; does nothing unless started by the tests above.
/// Commands on stdin, replies on stdout prefixed `MEMBER`.
#[test]
fn member() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let say = |s: String| {
        println!("MEMBER {s}");
        std::io::stdout().flush().unwrap();
    };
    let mut port = Some(Port::open(PortConfig::new(addr.parse().unwrap())).unwrap());
    let p = port.as_ref().unwrap();
    assert!(steered(p), "{:?}", p.steering());
    let slot = p.slot() as u32;
    // SAFETY: geteuid has no preconditions.
    say(format!("SLOT {slot} {}", unsafe { libc::geteuid() }));
    let (tx, cmds) = mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let (mut own, mut foreign) = (0u64, 0u64);
    let (mut wrong0, mut repairs0) = (0u64, 0u64);
    let mut pending: Option<(usize, Instant)> = None;
    // Every wait is bounded: the parent's tests time out, and so do we.
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        let got = match port.as_mut() {
            Some(p) => p
                .recv(|_, d| {
                    if qpn(d) >> 16 == slot {
                        own += 1
                    } else {
                        foreign += 1
                    }
                })
                .unwrap(),
            None => 0,
        };
        if let Some((want, since)) = pending {
            if own as usize >= want || since.elapsed() > Duration::from_secs(5) {
                // Take in what is still queued, then report.
                if let Some(p) = port.as_mut() {
                    while p
                        .recv(|_, d| {
                            if qpn(d) >> 16 == slot {
                                own += 1
                            } else {
                                foreign += 1
                            }
                        })
                        .unwrap()
                        > 0
                    {}
                }
                let s = port.as_ref().map(|p| p.stats()).unwrap_or_default();
                say(format!(
                    "{own} {foreign} {} {}",
                    s.rx_wrong_slot - wrong0,
                    s.steer_repairs - repairs0
                ));
                (own, foreign, wrong0, repairs0) = (0, 0, s.rx_wrong_slot, s.steer_repairs);
                pending = None;
            }
        }
        match cmds.try_recv() {
            Ok(c) if c.starts_with("report ") => {
                pending = Some((c[7..].parse().unwrap(), Instant::now()));
            }
            Ok(c) if c == "close" => {
                port = None;
                say("CLOSED".into());
            }
            Ok(c) if c == "quit" => {
                drop(port.take()); // leave the group first
                say("BYE".into());
                return;
            }
            Ok(c) => panic!("unknown command {c}"),
            Err(mpsc::TryRecvError::Disconnected) => return,
            Err(mpsc::TryRecvError::Empty) => {
                if got == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }
}
