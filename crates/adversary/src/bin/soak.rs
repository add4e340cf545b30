//! `softrdma-soak`: hours of mixed RC traffic between two processes under
//! injected faults, every byte checked, memory and descriptors watched.
//!
//! Two processes (this binary re-executed as the peer, through the
//! end-to-end harness of `crates/verbs/tests/support`), each with its own
//! device context on its own loopback address and with [`FaultConfig`]
//! impairments on everything it sends. They run in rounds, in lock step
//! over the out-of-band channel. In each round, on every QP and in both
//! directions at once:
//!
//! * fresh regions are registered (a target, a source, a receive buffer)
//!   and a throw-away region is registered and deregistered while the
//!   round's traffic is in flight;
//! * WRITE, READ, FETCH_ADD, SEND and WRITE_WITH_IMM, of sizes drawn from a
//!   plan both processes compute from the seed, so each can check what the
//!   other did to its memory without being told;
//! * every completion's status, every READ's bytes, every atomic's original
//!   value, every received message and, after the round, every byte of the
//!   target region are compared with what they must be;
//! * then the round's regions are deregistered, and every few rounds one QP
//!   is taken to RESET and connected again with new PSNs.
//!
//! Each process samples its RSS and open descriptors every few seconds; the
//! run fails if either grows beyond the bound after warm-up (see
//! `softrdma_adversary::procstat`). Any mismatch, error completion or
//! timeout fails it at once.

#[path = "../../../verbs/tests/support/mod.rs"]
mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use softrdma_adversary::procstat::{self, Bound, Sample};
use softrdma_adversary::Rng;
use softrdma_verbs::*;
use support::{assert_bytes, blank, cap, pattern, psn, wait_cq, Oob, Region};

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Mixed RC traffic between two processes under injected faults, every byte checked; fails if RSS or descriptors grow"
)]
struct Args {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// QPs (pairs) carrying traffic at once.
    #[arg(long, default_value_t = 4)]
    qps: usize,
    /// Largest WRITE and READ, in bytes (SENDs are at most a quarter).
    #[arg(long, default_value_t = 256 * 1024)]
    max_size: usize,
    /// Faults injected on both sides' sends (the peer's seed is this + 1).
    #[arg(
        long,
        default_value = "loss=0.02,reorder=0.02,dup=0.01,corrupt=0.005,seed=1"
    )]
    fault: FaultConfig,
    /// Every this many rounds one QP (in turn) is reset and reconnected.
    #[arg(long, default_value_t = 5)]
    reset_every: u64,
    /// Seconds between RSS/descriptor samples.
    #[arg(long, default_value_t = 5)]
    sample_every: u64,
    /// Seconds of warm-up that set the baseline (default: a quarter of the
    /// run, at most 60).
    #[arg(long)]
    warmup: Option<u64>,
    /// How far RSS may rise above the warm-up maximum, in MiB.
    #[arg(long, default_value_t = 16)]
    rss_margin_mib: u64,
    /// Loopback addresses of this process and the peer.
    #[arg(long, default_value = "127.0.0.21")]
    addr: IpAddr,
    #[arg(long, default_value = "127.0.0.22")]
    peer_addr: IpAddr,
    /// Local ACK timeout exponent (4.096 µs × 2^N). The default, 15
    /// (134 ms), trades speed for robustness: a lost tail waits that long,
    /// but with retry_cnt 7 a process must be starved of the CPU for over a
    /// second before a QP fails with RETRY_EXC_ERR. At 12 (17 ms) a soak
    /// run at nice 10 next to a compiler on 2 cores failed that way after
    /// 220 s.
    #[arg(long, default_value_t = 15)]
    ack_timeout: u8,
    /// Plan seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const TEST: &str = "softrdma-soak";

fn main() {
    // In the peer process the harness passes test-runner arguments; the
    // configuration comes over the out-of-band channel instead.
    let args = if std::env::var_os(support::ROLE_ENV).is_some() {
        None
    } else {
        Some(Args::parse())
    };
    support::two_processes(
        TEST,
        |mut oob| {
            let cfg = decode_args(&oob.recv());
            Side::run(cfg, 1, oob);
        },
        |mut oob| {
            let cfg = args.expect("parent has arguments");
            oob.send(&encode_args(&cfg));
            Side::run(cfg, 0, oob);
        },
    );
}

/// The parent's arguments as the peer needs them (a few words over the
/// out-of-band channel; clap parses them back).
fn encode_args(a: &Args) -> Vec<u8> {
    let f = &a.fault;
    format!(
        "--duration={} --qps={} --max-size={} --fault=loss={},reorder={},dup={},corrupt={},seed={} --reset-every={} --sample-every={} --warmup={} --rss-margin-mib={} --addr={} --peer-addr={} --ack-timeout={} --seed={}",
        a.duration, a.qps, a.max_size, f.loss, f.reorder, f.dup, f.corrupt, f.seed.wrapping_add(1),
        a.reset_every, a.sample_every, warmup(a).as_secs(), a.rss_margin_mib, a.peer_addr, a.addr, a.ack_timeout, a.seed
    )
    .into_bytes()
}

fn decode_args(b: &[u8]) -> Args {
    let s = String::from_utf8(b.to_vec()).expect("arguments are text");
    Args::parse_from(std::iter::once("softrdma-soak").chain(s.split(' ')))
}

fn warmup(a: &Args) -> Duration {
    Duration::from_secs(a.warmup.unwrap_or((a.duration / 4).min(60)))
}

/// What one round does on one QP, the same in both processes.
#[derive(Debug, Clone, Copy)]
struct Op {
    write: usize,
    read: usize,
    send: usize,
    add: u64,
}

/// Layout of the target region a peer writes, reads and adds to: an 8-byte
/// counter, the WRITE area, the READ area (never written in the round).
const COUNTER: usize = 0;
const W_AT: usize = 8;

fn plan(seed: u64, round: u64, qps: usize, max: usize) -> Vec<Op> {
    let mut r = Rng::new(seed ^ round.wrapping_mul(0x0100_0000_01b3));
    (0..qps)
        .map(|_| {
            // Sizes spread over orders of magnitude: 1 byte to `max`.
            let mut size = |m: usize| {
                let bits = r.below(usize::BITS as u64 - m.leading_zeros() as u64) as u32;
                (1 + r.below(1u64 << bits) as usize).min(m)
            };
            Op {
                write: size(max),
                read: size(max),
                send: size((max / 4).max(1)),
                add: r.next_u64() | 1,
            }
        })
        .collect()
}

/// Seeds of the bytes each process puts where: both can compute them.
fn seed_of(what: u64, side: usize, round: u64, qp: usize) -> u64 {
    what << 56 ^ (side as u64) << 48 ^ round << 8 ^ qp as u64
}
const TARGET: u64 = 1;
const WDATA: u64 = 2;
const SDATA: u64 = 3;

/// Counters of the run.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    rounds: u64,
    resets: u64,
    regs: u64,
    bytes_moved: u64,
    bytes_checked: u64,
}

struct Side {
    args: Args,
    me: usize,
    ctx: Context,
    pd: Pd,
    scq: Cq,
    rcq: Cq,
    qps: Vec<Qp>,
    oob: Oob,
    totals: Totals,
    start: Instant,
    samples: Vec<Sample>,
}

impl Side {
    fn run(args: Args, me: usize, mut oob: Oob) {
        let dev = DeviceInfo {
            name: "srdma-soak".into(),
            addr: args.addr,
        };
        let ctx = Context::open(
            &dev,
            &OpenOptions {
                fault: Some(args.fault),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("opening a device on {}: {e}", args.addr));
        let pd = ctx.alloc_pd();
        let depth = (args.qps * 8) as u32;
        let scq = ctx.create_cq(depth, None).expect("create_cq");
        let rcq = ctx.create_cq(depth, None).expect("create_cq");
        let qps: Vec<Qp> = (0..args.qps)
            .map(|_| support::qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(8, 4)))
            .collect();
        let mine: Vec<support::QpAddr> = qps
            .iter()
            .enumerate()
            .map(|(i, q)| support::addr_of(&ctx, q, psn((me * 100 + i) as u32)))
            .collect();
        for a in &mine {
            oob.send_addr(a);
        }
        for (i, q) in qps.iter().enumerate() {
            let r = oob.recv_addr();
            support::connect_with(q, QpType::Rc, mine[i].psn, &r, args.ack_timeout);
        }
        let mut s = Side {
            args,
            me,
            ctx,
            pd,
            scq,
            rcq,
            qps,
            oob,
            totals: Totals::default(),
            start: Instant::now(),
            samples: Vec::new(),
        };
        s.sample();
        if me == 0 {
            println!(
                "soak: {} s, {} QPs, sizes up to {} B, faults {:?} (peer seed +1), QP reset every {} rounds, ACK timeout exponent {}, RSS bound: warm-up maximum + {} MiB + 8 B per registration after {} s of warm-up, descriptors: warm-up maximum",
                s.args.duration, s.args.qps, s.args.max_size, s.args.fault, s.args.reset_every, s.args.ack_timeout,
                s.args.rss_margin_mib, warmup(&s.args).as_secs()
            );
            println!(
                "t_s\trounds\tresets\tregs\tMB_moved\tMB_checked\tA_rss_kib\tA_fds\tB_rss_kib\tB_fds"
            );
        }
        s.rounds();
    }

    fn sample(&mut self) {
        let x =
            procstat::sample(self.start.elapsed(), self.totals.regs).expect("reading /proc/self");
        self.samples.push(x);
    }

    fn rounds(mut self) {
        let end = Duration::from_secs(self.args.duration);
        let every = Duration::from_secs(self.args.sample_every.max(1));
        let mut next_sample = every;
        // One sample is always taken at the end of the warm-up, whatever
        // the sampling period: the baseline needs it (see `Bound`).
        let warm = warmup(&self.args);
        let mut warm_sampled = false;
        let mut peer_samples: Vec<Sample> = Vec::new();
        let mut round = 0u64;
        loop {
            // The parent decides; the peer follows.
            let go = if self.me == 0 {
                let go = self.start.elapsed() < end;
                self.oob.send(&[go as u8]);
                go
            } else {
                self.oob.recv() == [1]
            };
            if !go {
                break;
            }
            self.round(round);
            round += 1;
            if self.args.reset_every > 0 && round.is_multiple_of(self.args.reset_every) {
                self.reset(
                    (round / self.args.reset_every) as usize % self.qps.len(),
                    round,
                );
            }
            // Sample at round boundaries, on the parent's clock.
            let due = if self.me == 0 {
                let now = self.start.elapsed();
                let due = now >= next_sample || (!warm_sampled && now >= warm);
                warm_sampled |= due && now >= warm;
                self.oob.send(&[due as u8]);
                due
            } else {
                self.oob.recv() == [1]
            };
            if due {
                self.sample();
                let mine = *self.samples.last().expect("sampled");
                if self.me == 1 {
                    self.oob
                        .send_u64s(&[mine.at_s, mine.rss_kib, mine.fds, mine.regs]);
                } else {
                    let v = self.oob.recv_u64s();
                    let peer = Sample {
                        at_s: mine.at_s,
                        rss_kib: v[1],
                        fds: v[2],
                        regs: v[3],
                    };
                    peer_samples.push(peer);
                    let t = &self.totals;
                    println!(
                        "{}\t{}\t{}\t{}\t{:.1}\t{:.1}\t{}\t{}\t{}\t{}",
                        mine.at_s,
                        t.rounds,
                        t.resets,
                        t.regs,
                        t.bytes_moved as f64 / 1e6,
                        t.bytes_checked as f64 / 1e6,
                        mine.rss_kib,
                        mine.fds,
                        peer.rss_kib,
                        peer.fds
                    );
                    while next_sample <= self.start.elapsed() {
                        next_sample += every;
                    }
                }
            }
        }
        self.finish(peer_samples);
    }

    fn finish(mut self, peer_samples: Vec<Sample>) {
        let (st, ps) = self.ctx.stats();
        let t = self.totals;
        let mine = [
            t.rounds,
            t.resets,
            t.regs,
            t.bytes_moved,
            t.bytes_checked,
            st.retransmits,
            st.timeouts,
            st.seq_naks_sent,
            st.duplicates,
            st.out_of_sequence,
            ps.icrc_bad,
            ps.fault_drops,
            ps.fault_dups,
            ps.fault_corrupts,
            ps.fault_reorders,
            st.rnr_naks_sent,
        ];
        if self.me == 1 {
            self.oob.send_u64s(&mine);
            return;
        }
        let peer = self.oob.recv_u64s();
        let names = [
            "rounds",
            "QP resets",
            "registrations",
            "bytes moved",
            "bytes checked",
            "retransmits",
            "timeouts",
            "seq NAKs sent",
            "duplicates",
            "out of sequence",
            "ICRC bad (dropped)",
            "faults: drops",
            "faults: dups",
            "faults: corrupts",
            "faults: reorders",
            "RNR NAKs sent",
        ];
        println!("summary\tA\tB");
        for (i, n) in names.iter().enumerate() {
            println!("{n}\t{}\t{}", mine[i], peer[i]);
        }
        let bound = Bound {
            warmup: warmup(&self.args),
            rss_margin_kib: self.args.rss_margin_mib * 1024,
        };
        for (who, series) in [
            ("A (this process)", &self.samples),
            ("B (peer)", &peer_samples),
        ] {
            let after = series
                .iter()
                .filter(|s| s.at_s > bound.warmup.as_secs())
                .count();
            if after == 0 {
                println!(
                    "{who}: no sample after the warm-up; RSS/fd bound not checked (run longer)"
                );
                continue;
            }
            if let Some(v) = bound.violation(series) {
                panic!("{who}: {v}");
            }
            let max = series.iter().map(|s| s.rss_kib).max().unwrap_or(0);
            let fds = series.iter().map(|s| s.fds).max().unwrap_or(0);
            println!("{who}: flat after warm-up ({after} samples; RSS max {max} KiB, descriptors max {fds})");
        }
        println!("soak: PASS");
    }

    /// One round on every QP at once (see the module docs).
    fn round(&mut self, round: u64) {
        let me = self.me;
        let peer = 1 - me;
        let ops = plan(self.args.seed, round, self.qps.len(), self.args.max_size);
        let access = support::ALL_REMOTE;
        // My regions: the target the peer works on, my source, my receive
        // buffer.
        let mut tgts = Vec::new();
        let mut srcs = Vec::new();
        let mut rcvs = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let tlen = W_AT + op.write + op.read;
            tgts.push(support::mr_with(
                &self.pd,
                tlen,
                seed_of(TARGET, me, round, i),
                access,
            ));
            let mut src = pattern(seed_of(WDATA, me, round, i), op.write);
            src.extend(pattern(seed_of(SDATA, me, round, i), op.send));
            src.resize(op.write + op.send + op.read + 8, 0);
            srcs.push(
                self.pd
                    .reg_mr(src, AccessFlags::LOCAL_WRITE)
                    .expect("reg_mr"),
            );
            rcvs.push(
                self.pd
                    .reg_mr(vec![0u8; 2 * op.send], AccessFlags::LOCAL_WRITE)
                    .expect("reg_mr"),
            );
            self.totals.regs += 3;
        }
        for t in &tgts {
            self.oob.send_region(&Region::of(t));
        }
        let remote: Vec<Region> = (0..ops.len()).map(|_| self.oob.recv_region()).collect();
        for (i, (qp, op)) in self.qps.iter().zip(&ops).enumerate() {
            let r = &rcvs[i];
            support::post_recv(qp, 2 * i as u64, r.sge(0, op.send as u32));
            support::post_recv(qp, 2 * i as u64 + 1, r.sge(op.send, op.send as u32));
        }
        self.oob.signal("posted");
        self.oob.expect("posted");
        let f = SendFlags::SIGNALED;
        for (i, (qp, op)) in self.qps.iter().zip(&ops).enumerate() {
            let s = &srcs[i];
            let rm = &remote[i];
            let wid = |k: u64| (i as u64) << 8 | k;
            let post = |w: &SendWr<'_>| qp.post_send(w).expect("post_send");
            post(&support::wr(
                wid(0),
                SendOp::Write {
                    remote_addr: rm.at(W_AT),
                    rkey: rm.rkey,
                },
                &[s.sge(0, op.write as u32)],
                f,
            ));
            post(&support::wr(
                wid(1),
                SendOp::Read {
                    remote_addr: rm.at(W_AT + op.write),
                    rkey: rm.rkey,
                },
                &[s.sge(op.write + op.send, op.read as u32)],
                f,
            ));
            post(&support::wr(
                wid(2),
                SendOp::FetchAdd {
                    remote_addr: rm.at(COUNTER),
                    rkey: rm.rkey,
                    add: op.add,
                },
                &[s.sge(op.write + op.send + op.read, 8)],
                f,
            ));
            post(&support::wr(
                wid(3),
                SendOp::Send,
                &[s.sge(op.write, op.send as u32)],
                f,
            ));
            post(&support::wr(
                wid(4),
                SendOp::WriteWithImm {
                    remote_addr: rm.at(W_AT),
                    rkey: rm.rkey,
                    imm: round as u32,
                },
                &[],
                f,
            ));
        }
        // Registration churn while the traffic is in flight.
        let junk = support::mr_with(&self.pd, 4096 + round as usize % 8192, round, access);
        self.totals.regs += 1;
        drop(junk);

        let n = self.qps.len();
        for c in wait_cq(&self.scq, 5 * n, "the round's sends") {
            if c.status != WcStatus::Success {
                // What the transport saw, for the post-mortem.
                let (st, ps) = self.ctx.stats();
                let q = self.qps[(c.wr_id >> 8) as usize].query().map(|q| q.0);
                panic!(
                    "round {round}, side {me}: {c:?} (QP now {q:?})
{st:?}
{ps:?}"
                );
            }
        }
        for c in wait_cq(&self.rcq, 2 * n, "the round's receives") {
            assert_eq!(c.status, WcStatus::Success, "round {round}: {c:?}");
            let i = (c.wr_id / 2) as usize;
            let op = ops[i];
            match c.opcode {
                WcOpcode::Recv => {
                    assert_eq!(
                        c.byte_len as usize, op.send,
                        "round {round} QP {i}: SEND length"
                    );
                    let off = if c.wr_id % 2 == 0 { 0 } else { op.send };
                    let got = support::read_mr(&rcvs[i], off, op.send);
                    let want = pattern(seed_of(SDATA, peer, round, i), op.send);
                    assert_bytes(&got, &want, &format!("round {round} QP {i}: SEND data"));
                    self.totals.bytes_checked += op.send as u64;
                }
                WcOpcode::RecvRdmaWithImm => {
                    assert_eq!(
                        c.imm_or_inv, round as u32,
                        "round {round} QP {i}: immediate"
                    );
                    assert_eq!(c.byte_len, 0);
                }
                o => panic!("round {round} QP {i}: unexpected receive opcode {o:?}"),
            }
        }
        // READs and atomics: what the peer's target held.
        for (i, op) in ops.iter().enumerate() {
            let ptgt = pattern(seed_of(TARGET, peer, round, i), W_AT + op.write + op.read);
            let got = support::read_mr(&srcs[i], op.write + op.send, op.read);
            assert_bytes(
                &got,
                &ptgt[W_AT + op.write..],
                &format!("round {round} QP {i}: READ data"),
            );
            let orig = support::read_u64(&srcs[i], op.write + op.send + op.read);
            let want = u64::from_ne_bytes(ptgt[..8].try_into().expect("8 bytes"));
            assert_eq!(orig, want, "round {round} QP {i}: FETCH_ADD original value");
            self.totals.bytes_checked += op.read as u64 + 8;
            self.totals.bytes_moved += (op.write + op.read + op.send + 8) as u64;
        }
        self.oob.signal("done");
        self.oob.expect("done");
        // The peer's operations on my targets have all completed there:
        // every byte of each target is now known.
        for (i, op) in ops.iter().enumerate() {
            let mut want = pattern(seed_of(TARGET, me, round, i), W_AT + op.write + op.read);
            let c = u64::from_ne_bytes(want[..8].try_into().expect("8 bytes"));
            want[..8].copy_from_slice(&c.wrapping_add(ops[i].add).to_ne_bytes());
            want[W_AT..W_AT + op.write]
                .copy_from_slice(&pattern(seed_of(WDATA, peer, round, i), op.write));
            let got = support::read_mr(&tgts[i], 0, want.len());
            assert_bytes(
                &got,
                &want,
                &format!(
                    "round {round} QP {i}: target region after the peer's WRITE and FETCH_ADD"
                ),
            );
            self.totals.bytes_checked += want.len() as u64;
        }
        self.totals.rounds += 1;
        // Deregistration of everything the round registered happens here.
    }

    /// Take QP `i` to RESET and connect it again with new PSNs.
    fn reset(&mut self, i: usize, round: u64) {
        let qp = &self.qps[i];
        qp.modify(
            &QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            },
            AttrMask::STATE,
        )
        .expect("modify to RESET");
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
            ..Default::default()
        };
        qp.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .expect("modify RESET->INIT");
        let mine = support::addr_of(
            &self.ctx,
            qp,
            psn((round as u32) << 4 | (self.me * 8 + i) as u32),
        );
        self.oob.send_addr(&mine);
        let theirs = self.oob.recv_addr();
        support::connect_with(qp, QpType::Rc, mine.psn, &theirs, self.args.ack_timeout);
        // Nothing may reach the peer's QP before it is ready again.
        self.oob.signal("reconnected");
        self.oob.expect("reconnected");
        let mut none = [blank(); 1];
        assert_eq!(
            self.scq.poll(&mut none).expect("poll"),
            0,
            "a completion after the reset"
        );
        self.totals.resets += 1;
    }
}
