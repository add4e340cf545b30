//! The harness of the end-to-end tests: two (or three) real processes on
//! loopback, each with its own device context on the same address and UDP
//! port 4791, talking RoCEv2 through the kernel.
//!
//! * **Processes.** A test re-executes its own test binary
//!   (`current_exe() <name> --exact`) with [`ROLE_ENV`] naming the test and
//!   the peer's index; in that child the same test function sees the
//!   variable and plays the peer's role instead. Children's output is
//!   captured and shown when anything fails; a child still running when the
//!   test ends is killed by its pid.
//! * **Out of band.** The parent listens on an ephemeral TCP port of
//!   127.0.0.1 and each child connects to it. Messages are length-prefixed
//!   byte strings; helpers move QP addresses, memory-region handles and
//!   named synchronisation points.
//! * **Bounded waits.** Every wait (a completion, a TCP read, a child's exit)
//!   has a deadline and fails the test with a message that says what was
//!   awaited.
//!
//! Data is checked byte for byte against seeded patterns both processes can
//! compute.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softrdma_verbs::*;

pub const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// Names the test (and peer index) a re-executed test binary plays the
/// peer of.
pub const ROLE_ENV: &str = "SOFTRDMA_E2E_ROLE";
/// The parent's out-of-band address.
const OOB_ENV: &str = "SOFTRDMA_E2E_OOB";

/// The longest any single wait may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(30);
/// How long a child may run in all.
const CHILD_LIFETIME: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// Processes

/// Run `test` as two processes: `parent` here, `child` in a re-executed copy
/// of this test binary. Each gets the out-of-band channel to the other.
pub fn two_processes(test: &str, child: impl FnOnce(Oob), parent: impl FnOnce(Oob)) {
    set_test(test);
    if let Some((_, oob)) = as_child(test) {
        child(oob);
        return;
    }
    let mut peers = Peers::spawn(test, 1);
    let oob = peers.oob.remove(0);
    parent(oob);
    peers.finish();
}

/// [`two_processes`] for a child that ends by `SIGKILL` (it kills itself
/// at a point of its choosing): the test fails unless it did.
pub fn two_processes_child_killed(test: &str, child: impl FnOnce(Oob), parent: impl FnOnce(Oob)) {
    set_test(test);
    if let Some((_, oob)) = as_child(test) {
        child(oob);
        panic!("the child of {test} was to kill itself");
    }
    let mut peers = Peers::spawn(test, 1);
    let oob = peers.oob.remove(0);
    parent(oob);
    peers.finish_killed();
}

/// In a child process of `test`: its index and the channel to the parent.
pub fn as_child(test: &str) -> Option<(usize, Oob)> {
    let role = std::env::var(ROLE_ENV).ok()?;
    set_test(test);
    let (name, idx) = role.rsplit_once('#').expect("role is NAME#INDEX");
    assert_eq!(name, test, "child started for another test");
    let idx: usize = idx.parse().expect("role index");
    let addr: SocketAddr = std::env::var(OOB_ENV)
        .expect("out-of-band address")
        .parse()
        .expect("socket address");
    let mut s = TcpStream::connect_timeout(&addr, WAIT).expect("connect to the parent");
    s.write_all(&(idx as u32).to_le_bytes()).expect("hello");
    Some((idx, Oob::new(s, format!("parent of child {idx}"))))
}

/// Child processes of one test, with their captured output.
pub struct Peers {
    test: String,
    children: Vec<(Child, Arc<Mutex<String>>)>,
    /// The channel to each child, by index (taken by the test).
    pub oob: Vec<Oob>,
}

impl Peers {
    /// Start `n` peers of `test` and accept their out-of-band connections.
    pub fn spawn(test: &str, n: usize) -> Peers {
        set_test(test);
        let l = TcpListener::bind("127.0.0.1:0").expect("out-of-band listener");
        let addr = l.local_addr().unwrap();
        let exe = std::env::current_exe().expect("test binary");
        let mut p = Peers {
            test: test.to_string(),
            children: Vec::new(),
            oob: Vec::new(),
        };
        for i in 0..n {
            let mut c = Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_ENV, format!("{test}#{i}"))
                .env(OOB_ENV, addr.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the peer process");
            let out = Arc::new(Mutex::new(String::new()));
            for pipe in [
                c.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
                c.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
            ]
            .into_iter()
            .flatten()
            {
                let out = out.clone();
                std::thread::spawn(move || {
                    let mut pipe = pipe;
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = pipe.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        out.lock()
                            .unwrap()
                            .push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                });
            }
            p.children.push((c, out));
        }
        let mut slots: Vec<Option<Oob>> = (0..n).map(|_| None).collect();
        l.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + WAIT;
        while slots.iter().any(Option::is_none) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(WAIT)).unwrap();
                    let mut idx = [0u8; 4];
                    s.read_exact(&mut idx).expect("child's hello");
                    let i = u32::from_le_bytes(idx) as usize;
                    slots[i] = Some(Oob::new(s, format!("child {i}")));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    for (i, (c, _)) in p.children.iter_mut().enumerate() {
                        if let Ok(Some(st)) = c.try_wait() {
                            if slots[i].is_none() {
                                panic!(
                                    "peer {i} of {test} exited ({st}) before connecting:\n{}",
                                    p.output(i)
                                );
                            }
                        }
                    }
                    assert!(
                        Instant::now() < deadline,
                        "peers of {test} did not connect within {WAIT:?}"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        p.oob = slots.into_iter().map(Option::unwrap).collect();
        p
    }

    fn output(&self, i: usize) -> String {
        // Give the reader threads a moment to drain the pipes.
        std::thread::sleep(Duration::from_millis(50));
        self.children[i].1.lock().unwrap().clone()
    }

    /// Wait for every child to exit, and fail unless each succeeded.
    pub fn finish(&mut self) {
        let deadline = Instant::now() + CHILD_LIFETIME;
        for i in 0..self.children.len() {
            let st = loop {
                if let Some(st) = self.children[i].0.try_wait().expect("try_wait") {
                    break st;
                }
                if Instant::now() > deadline {
                    let _ = self.children[i].0.kill();
                    let _ = self.children[i].0.wait();
                    panic!(
                        "peer {i} of {} still running after {CHILD_LIFETIME:?}; killed it. Its output:\n{}",
                        self.test,
                        self.output(i)
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(
                st.success(),
                "peer {i} of {} failed ({st}). Its output:\n{}",
                self.test,
                self.output(i)
            );
        }
    }
}

/// Linux's SIGKILL (this file is also built into crates without libc).
const SIGKILL: i32 = 9;

impl Peers {
    /// Wait for every child to exit, and fail unless each was killed by
    /// `SIGKILL`.
    pub fn finish_killed(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + CHILD_LIFETIME;
        for i in 0..self.children.len() {
            let st = loop {
                if let Some(st) = self.children[i].0.try_wait().expect("try_wait") {
                    break st;
                }
                assert!(
                    Instant::now() < deadline,
                    "peer {i} of {} still running after {CHILD_LIFETIME:?}",
                    self.test
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            assert_eq!(
                st.signal(),
                Some(SIGKILL),
                "peer {i} of {} was to die by SIGKILL ({st}). Its output:\n{}",
                self.test,
                self.output(i)
            );
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if matches!(self.children[i].0.try_wait(), Ok(None)) {
                // Only ever our own child, by its pid.
                let _ = self.children[i].0.kill();
                let _ = self.children[i].0.wait();
            }
            if std::thread::panicking() {
                eprintln!(
                    "---- output of peer {i} of {} ----\n{}",
                    self.test,
                    self.output(i)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Out of band

/// A length-prefixed message channel to the other process.
pub struct Oob {
    s: TcpStream,
    peer: String,
}

impl Oob {
    fn new(s: TcpStream, peer: String) -> Oob {
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        Oob { s, peer }
    }

    pub fn send(&mut self, b: &[u8]) {
        let mut m = (b.len() as u32).to_le_bytes().to_vec();
        m.extend_from_slice(b);
        self.s
            .write_all(&m)
            .unwrap_or_else(|e| panic!("sending to the {}: {e}", self.peer));
    }

    pub fn recv(&mut self) -> Vec<u8> {
        self.recv_within(WAIT)
    }

    /// Receive, waiting at most `t` (the passive target waits longer).
    pub fn recv_within(&mut self, t: Duration) -> Vec<u8> {
        self.s.set_read_timeout(Some(t)).unwrap();
        let mut n = [0u8; 4];
        let what = |e: std::io::Error| -> ! {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                panic!("the {} closed the connection: it failed", self.peer)
            }
            panic!(
                "no message from the {} within {t:?} ({e}): it failed or hangs",
                self.peer
            )
        };
        self.s.read_exact(&mut n).unwrap_or_else(|e| what(e));
        let mut b = vec![0u8; u32::from_le_bytes(n) as usize];
        self.s.read_exact(&mut b).unwrap_or_else(|e| what(e));
        b
    }

    pub fn send_u64s(&mut self, v: &[u64]) {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.send(&b);
    }

    pub fn recv_u64s(&mut self) -> Vec<u64> {
        self.recv()
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Whether a message from the peer waits to be received (without
    /// waiting for one): for a loop that runs until the peer says so.
    pub fn arrived(&mut self) -> bool {
        self.s.set_nonblocking(true).unwrap();
        let r = self.s.peek(&mut [0u8; 1]);
        self.s.set_nonblocking(false).unwrap();
        match r {
            Ok(n) => n > 0,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("looking for a message from the {}: {e}", self.peer),
        }
    }

    /// Announce that step `what` is done.
    pub fn signal(&mut self, what: &str) {
        self.send(what.as_bytes());
    }

    /// Wait for the peer's `signal(what)`.
    pub fn expect(&mut self, what: &str) {
        let m = self.recv();
        assert_eq!(
            String::from_utf8_lossy(&m),
            what,
            "out of step with the {}",
            self.peer
        );
    }

    pub fn send_addr(&mut self, a: &QpAddr) {
        let (hi, lo) = gid_words(a.gid);
        self.send_u64s(&[a.qpn as u64, a.psn as u64, hi, lo]);
    }

    pub fn recv_addr(&mut self) -> QpAddr {
        let v = self.recv_u64s();
        assert_eq!(v.len(), 4, "a QP address is four words");
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&v[2].to_be_bytes());
        gid[8..].copy_from_slice(&v[3].to_be_bytes());
        QpAddr {
            qpn: v[0] as u32,
            psn: v[1] as u32,
            gid,
        }
    }

    pub fn send_region(&mut self, r: &Region) {
        self.send_u64s(&[r.addr, r.rkey as u64, r.len as u64]);
    }

    pub fn recv_region(&mut self) -> Region {
        let v = self.recv_u64s();
        assert_eq!(v.len(), 3, "a region is three words");
        Region {
            addr: v[0],
            rkey: v[1] as u32,
            len: v[2] as usize,
        }
    }
}

fn gid_words(g: [u8; 16]) -> (u64, u64) {
    (
        u64::from_be_bytes(g[..8].try_into().unwrap()),
        u64::from_be_bytes(g[8..].try_into().unwrap()),
    )
}

/// What a peer needs to connect a QP to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAddr {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
}

/// A remote memory region: what a WRITE, READ or atomic targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub rkey: u32,
    pub len: usize,
}

impl Region {
    pub fn of(mr: &Mr) -> Region {
        Region {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len(),
        }
    }

    pub fn at(&self, off: usize) -> u64 {
        assert!(off <= self.len, "offset {off} outside the remote region");
        self.addr + off as u64
    }
}

// ---------------------------------------------------------------------------
// Verbs helpers

thread_local! {
    /// The test this thread runs, as it names itself to [`two_processes`]
    /// and [`Peers::spawn`] (its processes agree on it).
    static TEST: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn set_test(test: &str) {
    TEST.with(|t| *t.borrow_mut() = Some(test.to_string()));
}

/// `127.0.0.1` as this test's own loopback address: `127.200-249.x.y`
/// from a hash of the test's name, the same in each of its processes (the
/// name they were started for, else libtest's thread name). Tests of one
/// binary run at once; on a shared address each one's contexts would join
/// and leave the others' `SO_REUSEPORT` group, and a datagram that arrives
/// while a member leaves can be lost (`crates/udp/src/steer.rs`, "Leave"):
/// harmless for RC, which retransmits — except for a fatal NAK, which its
/// responder sends once before going to ERR (as rxe does), so a test of a
/// remote violation would then end in a retry-exceeded error instead. The
/// sharing itself is what `e2e_passive` and `crates/udp/tests` test.
pub fn own_loopback(addr: IpAddr) -> IpAddr {
    if addr != V4 {
        return addr;
    }
    let name = TEST
        .with(|t| t.borrow().clone())
        .or_else(|| std::thread::current().name().map(str::to_string))
        .filter(|n| n != "main");
    let Some(name) = name else {
        return addr;
    };
    // FNV-1a.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    IpAddr::V4(Ipv4Addr::new(
        127,
        200 + (h % 50) as u8,
        (h >> 8) as u8,
        1 + ((h >> 16) % 254) as u8,
    ))
}

/// Open a device context on `addr` (each process its own, all sharing the
/// address and port 4791); `127.0.0.1` stands for the test's own loopback
/// address (see `own_loopback`).
pub fn open(addr: IpAddr) -> Context {
    open_with(addr, None)
}

/// [`open`] with a transport (None: as `SOFTRDMA_TRANSPORT` says).
pub fn open_with(addr: IpAddr, transport: Option<Transport>) -> Context {
    let addr = own_loopback(addr);
    let dev = DeviceInfo {
        name: "srdma-e2e".into(),
        addr,
    };
    let opts = OpenOptions {
        transport,
        ..OpenOptions::default()
    };
    Context::open(&dev, &opts).unwrap_or_else(|e| panic!("opening a device on {addr}: {e}"))
}

pub const ALL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// A registered region filled with `pattern(seed)`.
pub fn mr_with(pd: &Pd, len: usize, seed: u64, access: AccessFlags) -> Mr {
    pd.reg_mr(pattern(seed, len), access).expect("reg_mr")
}

pub fn cap(send: u32, recv: u32) -> QpCap {
    QpCap {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    }
}

/// A QP moved to INIT, accepting every remote operation (RC/UC) or with
/// the test Q_Key (UD).
pub fn qp_init(pd: &Pd, t: QpType, scq: &Cq, rcq: &Cq, srq: Option<&Srq>, cap: QpCap) -> Qp {
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: t,
            send_cq: scq,
            recv_cq: rcq,
            srq,
            cap,
            sq_sig_all: false,
        })
        .expect("create_qp");
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            .union(AccessFlags::REMOTE_READ)
            .union(AccessFlags::REMOTE_ATOMIC),
        qkey: QKEY,
        ..Default::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | if t == QpType::Ud {
            AttrMask::QKEY
        } else {
            AttrMask::ACCESS_FLAGS
        };
    qp.modify(&a, mask).expect("modify to INIT");
    qp
}

pub const QKEY: u32 = 0x1111_1111;

/// This QP's address for the peer.
pub fn addr_of(ctx: &Context, qp: &Qp, psn: u32) -> QpAddr {
    QpAddr {
        qpn: qp.qpn(),
        psn,
        gid: ctx.gid(),
    }
}

/// INIT → RTR → RTS towards `remote` (RC and UC; UD ignores `remote`).
pub fn connect(qp: &Qp, t: QpType, my_psn: u32, remote: &QpAddr) {
    connect_with(qp, t, my_psn, remote, 14)
}

/// [`connect`] with a local ACK timeout exponent.
pub fn connect_with(qp: &Qp, t: QpType, my_psn: u32, remote: &QpAddr, timeout: u8) {
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::B4096,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ..Default::default()
    };
    a.av.dgid = remote.gid;
    a.av.hop_limit = 64;
    let mask = required_mask(QpState::Init, QpState::Rtr, t).expect("INIT->RTR exists");
    qp.modify(&a, mask).expect("modify to RTR");
    a.qp_state = QpState::Rts;
    a.sq_psn = my_psn;
    a.timeout = timeout;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let mask = required_mask(QpState::Rtr, QpState::Rts, t).expect("RTR->RTS exists");
    qp.modify(&a, mask).expect("modify to RTS");
}

/// Exchange addresses over `oob` and connect each local QP to its peer
/// (the order of `qps` is the pairing).
pub fn exchange_and_connect(ctx: &Context, oob: &mut Oob, qps: &[&Qp], t: QpType, seed: u32) {
    let mine: Vec<QpAddr> = qps
        .iter()
        .enumerate()
        .map(|(i, q)| addr_of(ctx, q, psn(seed + i as u32)))
        .collect();
    for a in &mine {
        oob.send_addr(a);
    }
    for (i, q) in qps.iter().enumerate() {
        let r = oob.recv_addr();
        connect(q, t, mine[i].psn, &r);
    }
}

/// A 24-bit PSN from a seed, away from zero so wrap-around is exercised.
pub fn psn(seed: u32) -> u32 {
    seed.wrapping_mul(0x9e37_79b9).rotate_left(7) & 0x00ff_ffff | 0x00f0_0000
}

/// `len` pseudo-random bytes from `seed` (xorshift64*): both processes
/// compute the same bytes without sending them.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn read_mr(mr: &Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

pub fn read_u64(mr: &Mr, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b);
    u64::from_ne_bytes(b)
}

/// Assert two byte strings are equal, naming the first difference rather
/// than printing megabytes.
#[track_caller]
pub fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got[i..]
            .iter()
            .zip(&want[i..])
            .filter(|(a, b)| a != b)
            .count();
        panic!(
            "{what}: {n} of {} bytes differ, the first at offset {i}: got {:#04x}, want {:#04x}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// An empty completion slot to poll into.
pub fn blank() -> Completion {
    Completion::default()
}

/// What a caught panic said (`std::panic::catch_unwind`'s error), for an
/// assertion on its message.
pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Poll `cq` until `n` completions have arrived; fail after [`WAIT`].
///
/// Polling drives the device's progress from this thread, so it spins for
/// a while, then yields and finally naps between empty polls: on a 2-core
/// host the peer process needs the CPU too.
#[track_caller]
pub fn wait_cq(cq: &Cq, n: usize, what: &str) -> Vec<Completion> {
    let mut got = Vec::with_capacity(n);
    let mut buf = [blank(); 32];
    let start = Instant::now();
    let mut idle_since = Instant::now();
    let mut empty = 0u32;
    while got.len() < n {
        let want = (n - got.len()).min(buf.len());
        let k = cq.poll(&mut buf[..want]).expect("poll_cq");
        if k > 0 {
            got.extend_from_slice(&buf[..k]);
            empty = 0;
            idle_since = Instant::now();
            continue;
        }
        empty += 1;
        if start.elapsed() > WAIT {
            panic!(
                "{what}: {} of {n} completions within {WAIT:?}; got {:?}",
                got.len(),
                got.last()
            );
        }
        if idle_since.elapsed() > Duration::from_millis(2) {
            std::thread::sleep(Duration::from_micros(50));
        } else if empty.is_multiple_of(64) {
            std::thread::yield_now();
        }
    }
    got
}

/// Poll for `t` and assert nothing arrives.
#[track_caller]
pub fn assert_cq_empty(cq: &Cq, t: Duration, what: &str) {
    let start = Instant::now();
    let mut buf = [blank(); 4];
    while start.elapsed() < t {
        let k = cq.poll(&mut buf).expect("poll_cq");
        assert_eq!(k, 0, "{what}: unexpected completion {:?}", &buf[..k]);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Assert the usual fields of a completion.
#[track_caller]
pub fn assert_wc(c: &Completion, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) {
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (wr_id, status, opcode, byte_len),
        "completion {c:?}"
    );
}

/// A send work request over one SGE.
pub fn wr<'a>(wr_id: u64, op: SendOp, sgl: &'a [Sge], flags: SendFlags) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        sgl,
        flags,
        ud: None,
    }
}

pub fn post_recv(qp: &Qp, wr_id: u64, sge: Sge) {
    qp.post_recv(&RecvWr { wr_id, sgl: &[sge] })
        .expect("post_recv");
}

/// Wait until an async event satisfying `f` is queued; fail after [`WAIT`].
#[track_caller]
pub fn wait_async(ctx: &Context, what: &str, f: impl Fn(&AsyncEvent) -> bool) -> AsyncEvent {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        if let Some(e) = ctx.get_async_event() {
            if f(&e) {
                return e;
            }
            seen.push(e);
            continue;
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: no such async event within {WAIT:?}; saw {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait until `qp` reaches `state`; fail after [`WAIT`].
#[track_caller]
pub fn wait_state(qp: &Qp, state: QpState, what: &str) {
    let start = Instant::now();
    loop {
        let (s, _, _) = qp.query().expect("query_qp");
        if s == state {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: QP {:#x} is {s}, not {state}, after {WAIT:?}",
            qp.qpn()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
