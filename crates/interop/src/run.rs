//! Running one combination: both programs with deadlines, the capture
//! around them, and every check on what they printed and sent.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::capture::{self, Capture, Verdict};
use crate::matrix::{Combo, Gid, Ours, Program};
use crate::peer::{Peer, VmJob};
use crate::proc;

/// What a run needs besides the peer.
pub struct Env {
    /// `target/release/softrdma`.
    pub softrdma: PathBuf,
    /// Where captures and logs go.
    pub out: PathBuf,
    /// rxe's path MTU at this boot (1024 or 4096).
    pub path_mtu: u32,
    /// `XDG_RUNTIME_DIR` of our programs: where softrdma keeps the port
    /// steering state of an address (mode 0700). The suite's own, so that
    /// another softrdma on this host using the same address in another
    /// network namespace (another rxe peer's 10.91.47.1) shares nothing
    /// with it.
    pub rundir: PathBuf,
}

impl Env {
    /// Where `scripts/build-ibverbs` puts the drop-in `libibverbs.so.1`:
    /// next to `softrdma`.
    pub fn libibverbs_dir(&self) -> String {
        self.softrdma
            .parent()
            .expect("softrdma lives in a directory")
            .join("ibverbs")
            .to_string_lossy()
            .into_owned()
    }
}

/// A figure from the client's result row.
#[derive(Debug, Clone, Copy)]
pub enum Figure {
    /// Size, average bandwidth in MB/s (perftest's: 2^20 B/s), Mpps.
    Bw { size: u64, mb_s: f64, mpps: f64 },
    /// Size, typical and average latency in µs.
    Lat { size: u64, typical: f64, avg: f64 },
}

/// How one combination went.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub combo: Combo,
    pub path_mtu: u32,
    pub problems: Vec<String>,
    pub secs: f64,
    pub figure: Option<Figure>,
    pub verdict: Verdict,
    /// Our transport counters (`--stats`), where printed.
    pub counters: Option<String>,
    /// Frames netem discarded in the VM (loss runs).
    pub netem_dropped: Option<u64>,
    /// The VM stopped answering during this run.
    pub vm_dead: bool,
    /// What happened to an earlier attempt, when this one is a rerun.
    pub rerun_of: Option<String>,
    /// What the table should say about a pass (a tolerated exit).
    pub notes: Vec<String>,
}

impl Outcome {
    pub fn pass(&self) -> bool {
        self.problems.is_empty()
    }
}

const PORT: u16 = 18515;
/// rping's default port (its `-p`).
const RPING_PORT: u16 = 7174;
/// rping's default buffer size (its `-S`).
const RPING_SIZE: u32 = 64;

/// Whether the program pair connects by rdma_cm (its listener is an
/// rdma_cm ID, not a TCP socket).
fn by_rdma_cm(c: &Combo) -> bool {
    matches!(c.program, Program::Rping | Program::LibraryCm(_))
}

/// The port a server listens on: TCP for the verbs tools' exchange, the
/// rdma_cm port (RDMA_PS_TCP) for rping and perftest -R.
fn port_of(c: &Combo) -> u16 {
    match c.program {
        Program::Rping => RPING_PORT,
        _ => PORT,
    }
}

/// Markers of a failure in either program's output.
const BAD: [&str; 8] = [
    "Failed",
    "Couldn't",
    "Completion with error",
    "Unable",
    "ncompatib",
    "invalid data",
    "DATA MISMATCH",
    "softrdma:",
];

/// Whether a loss run also drops what the VM sends (netem in the VM).
///
/// Not for `ibv_rc_pingpong`: it has no closing handshake, so the side that
/// finishes first exits right after ACKing the other's last message, and a
/// lost final ACK leaves the other side retransmitting into a destroyed
/// QP. Our pingpong lingers to answer that (`Pp::linger`); rdma-core's does
/// not, so an ACK that netem drops in the VM fails the run whatever our
/// side does (ours: "transport retry counter exceeded"; rxe, which retries
/// for ever at `retry_cnt` 7: it never finishes). The pingpong loss runs
/// therefore lose only what we send — rxe still sees gaps (its NAKs against
/// our go-back-N) and lost ACKs (its retransmissions against our
/// responder); rxe's lost packets against our side are the perftest loss
/// runs' part, which end with a TCP handshake.
pub fn vm_loss(c: &Combo) -> bool {
    c.loss && !matches!(c.program, Program::Pingpong(_))
}

fn limit_for(c: &Combo) -> Duration {
    Duration::from_secs(if c.all {
        300
    } else if c.loss {
        180
    } else {
        60
    })
}

/// The addresses the programs name on their command lines: the host's
/// (for the VM's client), the VM's own (its server binds it), the VM's
/// (for our client) and our own (our server binds it). IPv4 for an IPv4
/// GID; for an IPv6 GID (rping) the link-local ones with the interface on
/// the side that names them, `fe80::…%eth0` in the VM, `%rxebr0` here.
pub struct Addrs {
    pub host_for_vm: String,
    pub vm_self: String,
    pub vm_for_host: String,
    pub host_self: String,
}

/// The IPv6 link-local address of a MAC (EUI-64, as the VMs' kernels form
/// theirs): 52:54:00:91:47:11 -> fe80::5054:ff:fe91:4711.
pub fn link_local(mac: &str) -> Option<std::net::Ipv6Addr> {
    let b: Vec<u8> = mac
        .split(':')
        .map(|x| u8::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let [m0, m1, m2, m3, m4, m5] = b[..] else {
        return None;
    };
    let g = |hi: u8, lo: u8| (hi as u16) << 8 | lo as u16;
    Some(std::net::Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        g(m0 ^ 2, m1),
        g(m2, 0xff),
        g(0xfe, m3),
        g(m4, m5),
    ))
}

pub fn addrs(peer: &Peer, c: &Combo) -> Addrs {
    let vm = &peer.vms[0];
    match (c.gid, by_rdma_cm(c)) {
        (Gid::V6, true) => {
            let vm_ll = link_local(&vm.mac).map_or(String::new(), |a| a.to_string());
            Addrs {
                host_for_vm: format!("{}%eth0", peer.host_ll),
                vm_self: format!("{vm_ll}%eth0"),
                vm_for_host: format!("{vm_ll}%rxebr0"),
                host_self: format!("{}%rxebr0", peer.host_ll),
            }
        }
        _ => Addrs {
            host_for_vm: peer.host_ip.clone(),
            vm_self: vm.ip.clone(),
            vm_for_host: vm.ip.clone(),
            host_self: peer.host_ip.clone(),
        },
    }
}

/// rping's command line (after `rping`): `-s -a <own address>` as the
/// server, `-c -a <server>` as the client.
fn rping_args(c: &Combo, server: bool, addr: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![if server { "-s" } else { "-c" }.into()];
    v.extend(["-a".into(), addr.into(), "-v".into()]);
    v.extend(["-C".into(), c.iters.to_string()]);
    if let Some(size) = c.size {
        v.extend(["-S".into(), size.to_string()]);
    }
    v
}

/// The VM-side command line; `vm` is the VM's own address (an rping
/// server binds it).
fn vm_cmd(c: &Combo, env: &Env, host: Option<&str>, vm: &str) -> String {
    let gid = c.gid.index();
    let mut s = match c.program {
        Program::Perf(t) | Program::RxePair(t) | Program::Library(t) => {
            format!("ib_{t} -d rxe0 -F -x {gid} -n {}", c.iters)
        }
        Program::LibraryCm(t) => format!("ib_{t} -R -d rxe0 -F -x {gid} -n {}", c.iters),
        Program::Pingpong(t) => format!("ibv_{t}_pingpong -d rxe0 -g {gid} -n {} -c", c.iters),
        Program::Rping => {
            return format!(
                "rping {}",
                rping_args(c, host.is_none(), host.unwrap_or(vm)).join(" ")
            )
        }
    };
    for f in common_flags(c, env) {
        s.push(' ');
        s.push_str(&f);
    }
    if let Some(h) = host {
        s += &format!(" {h}");
    }
    s
}

/// Flags both sides take alike, each with its value (`-q 4`).
fn common_flags(c: &Combo, env: &Env) -> Vec<String> {
    let mut v = Vec::new();
    if c.qps > 1 {
        v.push(format!("-q {}", c.qps));
    }
    if c.all {
        v.push("-a".into());
    }
    if let Some(a) = c.atomic {
        v.push(format!("-A {a}"));
    }
    if let Program::Pingpong(t) = c.program {
        let size = c
            .size
            .unwrap_or(if t == "ud" { env.path_mtu } else { 16384 });
        v.push(format!("-s {size}"));
        if t != "ud" {
            v.push(format!("-m {}", env.path_mtu));
        }
    } else if let Some(s) = c.size {
        v.push(format!("-s {s}"));
    }
    v
}

/// Our command line (after `softrdma`, or the program on our libraries);
/// `me` is our own address (an rping server binds it).
fn our_args(c: &Combo, env: &Env, host: Option<&str>, seed: u64, me: &str) -> Vec<String> {
    if c.program == Program::Rping {
        return rping_args(c, host.is_none(), host.unwrap_or(me));
    }
    // Our GID index is rxe's: our table is laid out as its (see
    // `Gid::index`).
    let gid = c.gid.index().to_string();
    let mut v: Vec<String> = match c.program {
        Program::Perf(t) => vec!["perf".into(), t.into(), "-F".into(), "-x".into(), gid],
        Program::Pingpong(t) => vec![
            "pingpong".into(),
            "--transport".into(),
            t.into(),
            "-g".into(),
            gid,
            "-c".into(),
        ],
        // perftest itself on our library, as rxe users type it.
        Program::Library(_) => vec!["-d".into(), "srdma4".into(), "-x".into(), gid, "-F".into()],
        // rdma_cm picks the device and GID by address.
        Program::LibraryCm(_) => vec!["-R".into(), "-d".into(), "srdma4".into(), "-F".into()],
        Program::RxePair(_) | Program::Rping => unreachable!("handled above"),
    };
    v.push("-n".into());
    v.push(c.iters.to_string());
    for f in common_flags(c, env) {
        v.extend(f.split_whitespace().map(str::to_string));
    }
    if c.gid == Gid::V6 {
        v.push("-d".into());
        v.push("srdma6".into());
    }
    if let Program::Perf(_) = c.program {
        v.push("--stats".into());
    }
    if c.loss {
        v.push("--fault".into());
        v.push(format!("loss=0.02,seed={seed}"));
    }
    if let Some(h) = host {
        v.push(h.into());
    }
    v
}

/// rping -v's ping lines (`ping data: ` on the client, `server ping data:
/// ` on the server) checked byte for byte: the client must print `iters`
/// pings, each `rdma-ping-<i>: ` and then rping's pattern (`'A' + i`
/// onwards, `'A'..='z'` wrapping) to fill the buffer but its last byte, so
/// `size - 1` characters a line; and the server must print the same lines
/// (what it READ from the client is what the client got back by the
/// server's WRITE). What is wrong, if anything.
pub fn check_pings(server: &str, client: &str, iters: usize, size: usize) -> Vec<String> {
    let pings = |text: &str, prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    };
    let cp = pings(client, "ping data: ");
    let sp = pings(server, "server ping data: ");
    let mut bad = Vec::new();
    if cp.len() != iters {
        bad.push(format!(
            "the rping client printed {} pings, expected {iters}",
            cp.len()
        ));
    }
    for (i, l) in cp.iter().enumerate() {
        let want: String = format!("rdma-ping-{i}: ")
            .chars()
            .chain((0..).map(|k| (b'A' + ((i + k) % 58) as u8) as char))
            .take(size.saturating_sub(1))
            .collect();
        if *l != want {
            bad.push(format!(
                "rping client's ping {i} is not rping's pattern at -S {size}: {:?}",
                l.chars().take(80).collect::<String>()
            ));
            break;
        }
    }
    if sp != cp {
        let at = sp.iter().zip(&cp).position(|(a, b)| a != b);
        bad.push(format!(
            "the rping server printed {} pings, not the client's {} (first difference: ping {})",
            sp.len(),
            cp.len(),
            at.map_or("-".into(), |i| i.to_string())
        ));
    }
    bad
}

/// Whether rping's output ends in its own teardown race: rping's main
/// thread, its pings done and DISCONNECTED seen, destroys its ID and event
/// channel while its CM thread goes back to rdma_get_cm_event on that
/// channel; the call fails and the thread calls `exit(-1)` (rping.c,
/// `cm_thread`). librdmacm's read(2) gets EBADF ("Bad file descriptor",
/// seen in the VM's rping server, 1 run in 20 under TCG), ours EINVAL (a
/// destroyed channel). Only this, as its last line after the DISCONNECT
/// message; everything rping printed before is checked as usual.
pub fn rping_teardown_race(text: &str) -> bool {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some(last) = lines.last() else {
        return false;
    };
    let disconnected = lines.iter().any(|l| l.contains("DISCONNECT EVENT..."));
    disconnected
        && matches!(
            last.trim(),
            "rdma_get_cm_event: Bad file descriptor" | "rdma_get_cm_event: Invalid argument"
        )
}

/// Rows of perftest's result table in `text` (each row's numbers).
pub fn result_rows(text: &str) -> Vec<Vec<f64>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for l in text.lines() {
        if l.contains("#bytes") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let nums: Option<Vec<f64>> = l.split_whitespace().map(|w| w.parse().ok()).collect();
        match nums {
            Some(n) if n.len() >= 5 => rows.push(n),
            _ => {}
        }
    }
    rows
}

fn figure(test: &str, rows: &[Vec<f64>]) -> Option<Figure> {
    let r = rows.last()?;
    Some(if test.ends_with("_bw") {
        Figure::Bw {
            size: r[0] as u64,
            mb_s: r[3],
            mpps: r[4],
        }
    } else {
        Figure::Lat {
            size: r[0] as u64,
            typical: *r.get(4)?,
            avg: *r.get(5)?,
        }
    })
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(n)..].join(" / ")
}

/// Run one combination.
pub fn run(peer: &Peer, env: &Env, c: &Combo, idx: usize) -> Outcome {
    let t0 = Instant::now();
    let mut o = Outcome {
        combo: c.clone(),
        path_mtu: env.path_mtu,
        problems: Vec::new(),
        secs: 0.0,
        figure: None,
        verdict: Verdict::default(),
        counters: None,
        netem_dropped: None,
        vm_dead: false,
        rerun_of: None,
        notes: Vec::new(),
    };
    let tag = format!("{:03}-{}", idx, slug(c));
    let pcap = env.out.join(format!("{tag}.pcap"));
    let vm1 = &peer.vms[0];
    let host_ips: Vec<IpAddr> = match c.program {
        // rxe against rxe: "host" is the client VM.
        Program::RxePair(_) => vec![peer.vms[1].ip.parse().expect("an IP")],
        _ => vec![
            peer.host_ip.parse().expect("an IP"),
            peer.host_ll.parse().expect("an IP"),
        ],
    };
    if vm_loss(c) {
        let r = peer.exec(
            vm1.n,
            "tc qdisc replace dev eth0 root netem loss 2%",
            Duration::from_secs(20),
        );
        if !r.ok() {
            o.problems.push(format!(
                "cannot add netem loss in the VM: {}",
                r.text.trim()
            ));
            o.secs = t0.elapsed().as_secs_f64();
            return o;
        }
    }
    let cap = match Capture::start(peer, &pcap, &vm1.mac) {
        Ok(cap) => Some(cap),
        Err(e) => {
            o.problems.push(e);
            None
        }
    };
    let limit = limit_for(c);
    let (ours_out, vm_code, vm_log) = match c.program {
        Program::RxePair(_) => rxe_pair(peer, env, c, &tag, limit, &mut o),
        _ => ours_and_vm(peer, env, c, &tag, limit, idx as u64, &mut o),
    };
    if vm_loss(c) {
        let s = peer.exec(vm1.n, "tc -s qdisc show dev eth0", Duration::from_secs(20));
        o.netem_dropped = s
            .text
            .split("dropped ")
            .nth(1)
            .and_then(|x| x.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|x| x.parse().ok());
        let _ = peer.exec(vm1.n, "tc qdisc del dev eth0 root", Duration::from_secs(20));
    }
    if let Some(cap) = cap {
        let counts = cap.stop();
        o.verdict = capture::check(&env.softrdma, &pcap, &host_ips, &counts);
        for p in &o.verdict.problems {
            o.problems.push(format!("capture: {p}"));
        }
    }
    let ours_text = ours_out
        .as_ref()
        .map(|x| x.text.clone())
        .unwrap_or_default();
    // The command lines, as a reader would retype them.
    let a = addrs(peer, c);
    let (vm_host, our_host) = match c.ours {
        Ours::Server => (Some(a.host_for_vm.as_str()), None),
        Ours::Client => (None, Some(a.vm_for_host.as_str())),
    };
    let lines = match c.program {
        Program::RxePair(_) => format!(
            "VM 1: {}\nVM 2: {}",
            vm_cmd(c, env, None, &vm1.ip),
            vm_cmd(c, env, Some(&vm1.ip), &peer.vms[1].ip)
        ),
        _ => format!(
            "VM 1: {}\nours: {} {}",
            vm_cmd(c, env, vm_host, &a.vm_self),
            match c.program {
                Program::Library(t) | Program::LibraryCm(t) =>
                    format!("LD_LIBRARY_PATH={} ib_{t}", env.libibverbs_dir()),
                Program::Rping => format!("LD_LIBRARY_PATH={} rping", env.libibverbs_dir()),
                _ => "softrdma".to_string(),
            },
            our_args(c, env, our_host, idx as u64, &a.host_self).join(" ")
        ),
    };
    let _ = std::fs::write(
        env.out.join(format!("{tag}.log")),
        format!(
            "{lines}\n== {c} (path MTU {})\n== ours: {}\n{}\n== VM: exit {:?}\n{}\n",
            env.path_mtu,
            ours_out.as_ref().map(|x| x.status()).unwrap_or_default(),
            ours_text,
            vm_code,
            vm_log
        ),
    );
    // rping's own teardown race, on either side (see `rping_teardown_race`).
    let ours_race = c.program == Program::Rping
        && ours_out
            .as_ref()
            .is_some_and(|x| x.code == Some(255) && rping_teardown_race(&x.text));
    let vm_race =
        c.program == Program::Rping && vm_code == Some(255) && rping_teardown_race(&vm_log);
    for (race, who) in [(ours_race, "ours"), (vm_race, "the VM's")] {
        if race {
            o.notes.push(format!(
                "{who} rping exited 255 after its pings: its CM thread's rdma_get_cm_event on the channel main had destroyed"
            ));
        }
    }
    if let Some(out) = &ours_out {
        if !out.ok() && !ours_race {
            o.problems.push(format!(
                "softrdma: {}: {}",
                out.status(),
                tail(&out.text, 3)
            ));
        }
    }
    match vm_code {
        Some(0) => {}
        Some(_) if vm_race => {}
        Some(k) => o
            .problems
            .push(format!("VM program: exit {k}: {}", tail(&vm_log, 3))),
        None => o
            .problems
            .push(format!("VM program: did not finish: {}", tail(&vm_log, 3))),
    }
    for (who, text) in [("softrdma", ours_text.as_str()), ("VM", vm_log.as_str())] {
        if let Some(l) = text.lines().find(|l| BAD.iter().any(|b| l.contains(b))) {
            let msg = format!("{who} printed: {}", l.trim());
            if !o.problems.contains(&msg) {
                o.problems.push(msg);
            }
        }
    }
    o.counters = ours_text
        .lines()
        .find(|l| l.contains("softrdma counters:"))
        .map(|l| l.trim().to_string());
    match c.program {
        Program::Perf(t) | Program::RxePair(t) | Program::Library(t) | Program::LibraryCm(t) => {
            // The client measures (a bw server prints the client's report).
            let client_text = match (c.program, c.ours) {
                (Program::RxePair(_), _) | (_, Ours::Server) => &vm_log,
                (_, Ours::Client) => &ours_text,
            };
            let rows = result_rows(client_text);
            let want = if c.all {
                if t.starts_with("read") || t.starts_with("write") || t.starts_with("send") {
                    23
                } else {
                    1
                }
            } else {
                1
            };
            if rows.len() < want {
                o.problems.push(format!(
                    "the client printed {} result rows, expected {want}",
                    rows.len()
                ));
            }
            o.figure = figure(t, &rows);
        }
        Program::Pingpong(_) => {
            for (who, text) in [("softrdma", &ours_text), ("VM", &vm_log)] {
                if !text.contains("iters in") {
                    o.problems
                        .push(format!("{who} did not report its iterations"));
                }
            }
        }
        Program::Rping => {
            let (server, client) = match c.ours {
                Ours::Server => (&ours_text, &vm_log),
                Ours::Client => (&vm_log, &ours_text),
            };
            let size = c.size.unwrap_or(RPING_SIZE) as usize;
            o.problems
                .extend(check_pings(server, client, c.iters as usize, size));
        }
    }
    if !o.pass() && !peer.healthy(vm1.n) {
        o.vm_dead = true;
        o.problems.push("the VM stopped answering".into());
    }
    o.secs = t0.elapsed().as_secs_f64();
    o
}

fn slug(c: &Combo) -> String {
    c.to_string()
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect::<String>()
        .replace("__", "_")
}

/// Our program and the VM's, each in its role.
fn ours_and_vm(
    peer: &Peer,
    env: &Env,
    c: &Combo,
    tag: &str,
    limit: Duration,
    seed: u64,
    o: &mut Outcome,
) -> (Option<proc::Output>, Option<i32>, String) {
    let vm1 = &peer.vms[0];
    let a = addrs(peer, c);
    let port = port_of(c);
    let listener = if by_rdma_cm(c) {
        format!("an rdma_cm ID on port {port}")
    } else {
        format!("TCP {port}")
    };
    let ours = |host: Option<&str>| {
        let args = our_args(c, env, host, seed, &a.host_self);
        let mut cmd = match c.program {
            // Debian's programs on our libraries.
            Program::Library(t) | Program::LibraryCm(t) => {
                let mut cmd = peer.ns(&[&format!("ib_{t}")]);
                cmd.env("LD_LIBRARY_PATH", env.libibverbs_dir());
                cmd
            }
            Program::Rping => {
                let mut cmd = peer.ns(&["rping"]);
                cmd.env("LD_LIBRARY_PATH", env.libibverbs_dir());
                cmd
            }
            _ => peer.ns(&[env.softrdma.to_str().expect("utf-8 path")]),
        };
        cmd.args(&args)
            .env(
                "SOFTRDMA_DEVICES",
                format!("srdma4={},srdma6={}", peer.host_ip, peer.host_ll),
            )
            .env("XDG_RUNTIME_DIR", &env.rundir);
        proc::spawn(cmd, limit)
    };
    let mut job: Option<VmJob> = None;
    let ours_out = match c.ours {
        Ours::Server => match ours(None) {
            Err(e) => {
                o.problems.push(format!("cannot start softrdma: {e}"));
                None
            }
            Ok(mut me) => {
                let up =
                    proc::wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
                        let l = if by_rdma_cm(c) {
                            let me = match c.gid {
                                Gid::V4 => &peer.host_ip,
                                Gid::V6 => &peer.host_ll,
                            };
                            cm_listening(env, me, port)
                        } else {
                            peer.ns_listening(port)
                        };
                        l || !me.running()
                    });
                if up && me.running() {
                    let cmd = vm_cmd(c, env, Some(&a.host_for_vm), &a.vm_self);
                    match peer.spawn_in_vm(vm1.n, tag, &cmd) {
                        Ok(j) => job = Some(j),
                        Err(e) => o.problems.push(e),
                    }
                } else {
                    o.problems
                        .push(format!("softrdma never listened ({listener})"));
                }
                Some(me.wait())
            }
        },
        Ours::Client => {
            match peer.spawn_in_vm(vm1.n, tag, &vm_cmd(c, env, None, &a.vm_self)) {
                Ok(j) => job = Some(j),
                Err(e) => o.problems.push(e),
            }
            if job.is_some()
                && !proc::wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
                    if by_rdma_cm(c) {
                        peer.vm_cm_listening(vm1.n, port)
                    } else {
                        peer.vm_listening(vm1.n, port)
                    }
                })
            {
                o.problems
                    .push(format!("the VM's program never listened ({listener})"));
            }
            // perftest -R: see `HeldReq`.
            let held = match c.program {
                Program::LibraryCm(_) => match HeldReq::install(peer, &vm1.ip) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        o.problems.push(e);
                        None
                    }
                },
                _ => None,
            };
            let out = match ours(Some(&a.vm_for_host)) {
                Ok(me) => Some(me.wait()),
                Err(e) => {
                    o.problems.push(format!("cannot start softrdma: {e}"));
                    None
                }
            };
            if let Some(h) = held {
                let n = h.remove();
                if n != 1 {
                    o.problems.push(format!(
                        "the nft rule held {n} REQs back, expected the test connection's one"
                    ));
                }
            }
            out
        }
    };
    let (code, log) = match &job {
        Some(j) => peer.wait_vm(j, Duration::from_secs(30).min(limit)),
        None => (Some(-1), String::new()),
    };
    (ours_out, code, log)
}

/// Whether one of our processes listens on rdma_cm port `port`
/// (RDMA_PS_TCP) at address `ip`: softrdma's port steering lists the
/// services it takes REQs for in `<rundir>/<ip>-4791.listen`, a line
/// `listen <slot> <service ID's low 32 bits>` each (crates/udp, steer.rs).
fn cm_listening(env: &Env, ip: &str, port: u16) -> bool {
    let want = format!("{:08x}", 0x0106_0000 | port as u32);
    std::fs::read_to_string(env.rundir.join(format!("{ip}-4791.listen"))).is_ok_and(|t| {
        t.lines()
            .any(|l| l.starts_with("listen ") && l.ends_with(want.as_str()))
    })
}

/// perftest -R with our client against the VM's server: perftest's own
/// race, which the suite takes out of the way by holding back one REQ.
///
/// perftest connects twice: a control connection for its handshake, then
/// the test connection. Its server listens for the second only after the
/// handshake, its client connects right after it, so a fast client's REQ
/// reaches a server that does not listen yet, which the kernel's CM
/// rejects at once ("invalid service ID"); perftest 4.5's retry after that
/// REJ reuses the rdma_cm IDs it has just destroyed and fails
/// (linux-rdma/perftest#93). Against the VM, our client is the fast one:
/// its REQ came 1 ms after the handshake and the REJ 2 ms later, where a
/// kernel client in another VM takes 22 ms (golden/cm/cm_write_bw_R).
///
/// So an nftables rule in the namespace drops the first transmission of
/// the second REQ our side sends to the VM (UDP 4791, BTH DestQP 1, MAD
/// class CM, attribute REQ): our CM sends it again after the CM response
/// timeout (4.3 s), by then the VM's server listens, and the test
/// connection comes up through a REQ retransmission the kernel accepts.
struct HeldReq<'a> {
    peer: &'a Peer,
}

const NFT_TABLE: &str = "softrdma_interop_cm";

impl<'a> HeldReq<'a> {
    fn nft(peer: &Peer, args: &str) -> proc::Output {
        let mut v = vec!["nft"];
        v.extend(args.split_whitespace());
        proc::run(peer.ns(&v), Duration::from_secs(10))
    }

    fn install(peer: &'a Peer, vm: &str) -> Result<HeldReq<'a>, String> {
        let _ = Self::nft(peer, &format!("delete table inet {NFT_TABLE}"));
        for cmd in [
            format!("add table inet {NFT_TABLE}"),
            format!("add chain inet {NFT_TABLE} out {{ type filter hook output priority 0 ; }}"),
            // UDP header 8 bytes, BTH 12, DETH 8, then the MAD: BTH
            // DestQP at bits 104..128, the MAD's class at 232..240 and its
            // attribute ID at 352..368 from the UDP header. numgen counts
            // the REQs only: the first (control) passes, the second is
            // dropped, its retransmission passes.
            format!(
                "add rule inet {NFT_TABLE} out ip daddr {vm} udp dport 4791 \
                 @th,104,24 1 @th,232,8 0x07 @th,352,16 0x0010 \
                 numgen inc mod 2 1 counter drop"
            ),
        ] {
            let o = Self::nft(peer, &cmd);
            if !o.ok() {
                let _ = Self::nft(peer, &format!("delete table inet {NFT_TABLE}"));
                return Err(format!("nft {cmd}: {}: {}", o.status(), o.text.trim()));
            }
        }
        Ok(HeldReq { peer })
    }

    /// Remove the rule; how many REQs it dropped.
    fn remove(self) -> u64 {
        let l = Self::nft(self.peer, &format!("list table inet {NFT_TABLE}"));
        let _ = Self::nft(self.peer, &format!("delete table inet {NFT_TABLE}"));
        l.text
            .split("counter packets ")
            .nth(1)
            .and_then(|x| x.split_whitespace().next())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0)
    }
}

/// perftest against perftest between VM 1 (server) and VM 2 (client).
fn rxe_pair(
    peer: &Peer,
    env: &Env,
    c: &Combo,
    tag: &str,
    limit: Duration,
    o: &mut Outcome,
) -> (Option<proc::Output>, Option<i32>, String) {
    let (vm1, vm2) = (&peer.vms[0], &peer.vms[1]);
    let srv = match peer.spawn_in_vm(vm1.n, &format!("{tag}-s"), &vm_cmd(c, env, None, &vm1.ip)) {
        Ok(j) => j,
        Err(e) => {
            o.problems.push(e);
            return (None, Some(-1), String::new());
        }
    };
    if !proc::wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        peer.vm_listening(vm1.n, PORT)
    }) {
        o.problems.push("VM 1 never listened on TCP 18515".into());
    }
    let cli = peer.spawn_in_vm(
        vm2.n,
        &format!("{tag}-c"),
        &vm_cmd(c, env, Some(&vm1.ip), &vm2.ip),
    );
    let (code, log) = match &cli {
        Ok(j) => peer.wait_vm(j, limit),
        Err(e) => (None, e.clone()),
    };
    let (scode, slog) = peer.wait_vm(&srv, Duration::from_secs(30));
    if scode != Some(0) {
        o.problems
            .push(format!("VM 1 (server): exit {scode:?}: {}", tail(&slog, 3)));
    }
    (None, code, log)
}

/// The path of the `softrdma` binary next to this test binary's profile
/// directory (`target/release/softrdma` for `cargo test --release`).
pub fn find_softrdma() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/<test binary>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("unexpected test binary location")?;
    let p = dir.join("softrdma");
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "{} does not exist: build it first (cargo build --release --bin softrdma; ./scripts/test does)",
            p.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping -v's lines as rping 44 prints them (rping_test_client's
    /// pattern: ping i starts at 'A' + i, wraps after 'z').
    fn rping_lines(prefix: &str, iters: usize, size: usize) -> String {
        (0..iters)
            .map(|i| {
                let mut l = format!("rdma-ping-{i}: ");
                let mut ch = b'A' + (i % 58) as u8;
                while l.len() < size - 1 {
                    l.push(ch as char);
                    ch = if ch == b'z' { b'A' } else { ch + 1 };
                }
                format!("{prefix}{l}\n")
            })
            .collect()
    }

    #[test]
    fn link_local_addresses_are_the_macs_eui64() {
        assert_eq!(
            link_local("52:54:00:91:47:11").unwrap().to_string(),
            "fe80::5054:ff:fe91:4711"
        );
        assert!(link_local("52:54:00:91:47").is_none());
    }

    #[test]
    fn only_rpings_own_teardown_race_is_tolerated() {
        let race = "server ping data: x\nserver DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\nrdma_get_cm_event: Bad file descriptor\n";
        assert!(rping_teardown_race(race));
        assert!(rping_teardown_race(
            &race.replace("Bad file descriptor", "Invalid argument")
        ));
        // Not after a disconnect, or something else last: a failure.
        assert!(!rping_teardown_race(
            "rdma_get_cm_event: Bad file descriptor\n"
        ));
        assert!(!rping_teardown_race(&format!(
            "{race}cq completion failed status 12\n"
        )));
        assert!(!rping_teardown_race(""));
    }

    #[test]
    fn rping_pings_are_checked_byte_for_byte() {
        for size in [64, 10_000] {
            let c = rping_lines("ping data: ", 10, size);
            let s = rping_lines("server ping data: ", 10, size);
            assert!(check_pings(&s, &c, 10, size).is_empty(), "-S {size}");
            // A missing ping, a wrong byte, a line cut by interleaved
            // stderr: each is reported.
            assert!(!check_pings(&s, &c, 11, size).is_empty());
            let bad = c.replacen("CDEF", "CDEG", 1);
            assert!(!check_pings(&s, &bad, 10, size).is_empty());
            let cut = format!("{}\nclient DISCONNECT EVENT...\n", &c[..c.len() - 20]);
            assert!(!check_pings(&s, &cut, 10, size).is_empty());
            let s9: String = s.lines().take(9).map(|l| format!("{l}\n")).collect();
            assert!(!check_pings(&s9, &c, 10, size).is_empty());
        }
    }
}
