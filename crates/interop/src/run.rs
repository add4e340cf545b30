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
}

impl Outcome {
    pub fn pass(&self) -> bool {
        self.problems.is_empty()
    }
}

const PORT: u16 = 18515;

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

/// The VM-side command line.
fn vm_cmd(c: &Combo, env: &Env, host: Option<&str>) -> String {
    let gid = match c.gid {
        Gid::V4 => 1,
        Gid::V6 => 0,
    };
    let mut s = match c.program {
        Program::Perf(t) | Program::RxePair(t) | Program::Library(t) => {
            format!("ib_{t} -d rxe0 -F -x {gid} -n {}", c.iters)
        }
        Program::Pingpong(t) => format!("ibv_{t}_pingpong -d rxe0 -g {gid} -n {} -c", c.iters),
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

/// Our command line (after `softrdma`).
fn our_args(c: &Combo, env: &Env, host: Option<&str>, seed: u64) -> Vec<String> {
    let mut v: Vec<String> = match c.program {
        Program::Perf(t) => vec![
            "perf".into(),
            t.into(),
            "-F".into(),
            "-x".into(),
            "0".into(),
        ],
        Program::Pingpong(t) => vec![
            "pingpong".into(),
            "--transport".into(),
            t.into(),
            "-g".into(),
            "0".into(),
            "-c".into(),
        ],
        // perftest itself on our library: its own flags.
        Program::Library(_) => vec![
            "-d".into(),
            "srdma4".into(),
            "-x".into(),
            "0".into(),
            "-F".into(),
        ],
        Program::RxePair(_) => unreachable!("no softrdma side"),
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
    let (vm_host, our_host) = match c.ours {
        Ours::Server => (Some(peer.host_ip.as_str()), None),
        Ours::Client => (None, Some(vm1.ip.as_str())),
    };
    let lines = match c.program {
        Program::RxePair(_) => format!(
            "VM 1: {}\nVM 2: {}",
            vm_cmd(c, env, None),
            vm_cmd(c, env, Some(&vm1.ip))
        ),
        _ => format!(
            "VM 1: {}\nours: {} {}",
            vm_cmd(c, env, vm_host),
            match c.program {
                Program::Library(t) => format!("LD_LIBRARY_PATH={} ib_{t}", env.libibverbs_dir()),
                _ => "softrdma".to_string(),
            },
            our_args(c, env, our_host, idx as u64).join(" ")
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
    if let Some(out) = &ours_out {
        if !out.ok() {
            o.problems.push(format!(
                "softrdma: {}: {}",
                out.status(),
                tail(&out.text, 3)
            ));
        }
    }
    match vm_code {
        Some(0) => {}
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
        Program::Perf(t) | Program::RxePair(t) | Program::Library(t) => {
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
    let ours = |host: Option<&str>| {
        let args = our_args(c, env, host, seed);
        let mut cmd = match c.program {
            Program::Library(t) => {
                let mut cmd = peer.ns(&[&format!("ib_{t}")]);
                cmd.env("LD_LIBRARY_PATH", env.libibverbs_dir());
                cmd
            }
            _ => peer.ns(&[env.softrdma.to_str().expect("utf-8 path")]),
        };
        cmd.args(&args).env(
            "SOFTRDMA_DEVICES",
            format!("srdma4={},srdma6={}", peer.host_ip, peer.host_ll),
        );
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
                        peer.ns_listening(PORT) || !me.running()
                    });
                if up && me.running() {
                    match peer.spawn_in_vm(vm1.n, tag, &vm_cmd(c, env, Some(&peer.host_ip))) {
                        Ok(j) => job = Some(j),
                        Err(e) => o.problems.push(e),
                    }
                } else {
                    o.problems
                        .push("softrdma never listened on TCP 18515".into());
                }
                Some(me.wait())
            }
        },
        Ours::Client => {
            match peer.spawn_in_vm(vm1.n, tag, &vm_cmd(c, env, None)) {
                Ok(j) => job = Some(j),
                Err(e) => o.problems.push(e),
            }
            if job.is_some()
                && !proc::wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
                    peer.vm_listening(vm1.n, PORT)
                })
            {
                o.problems
                    .push("the VM's program never listened on TCP 18515".into());
            }
            match ours(Some(&vm1.ip)) {
                Ok(me) => Some(me.wait()),
                Err(e) => {
                    o.problems.push(format!("cannot start softrdma: {e}"));
                    None
                }
            }
        }
    };
    let (code, log) = match &job {
        Some(j) => peer.wait_vm(j, Duration::from_secs(30).min(limit)),
        None => (Some(-1), String::new()),
    };
    (ours_out, code, log)
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
    let srv = match peer.spawn_in_vm(vm1.n, &format!("{tag}-s"), &vm_cmd(c, env, None)) {
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
    let cli = peer.spawn_in_vm(vm2.n, &format!("{tag}-c"), &vm_cmd(c, env, Some(&vm1.ip)));
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
