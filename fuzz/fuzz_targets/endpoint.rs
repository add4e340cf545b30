//! Two live `Endpoint`s driven by the fuzzer: its bytes decode (with
//! `arbitrary`) into a sequence of actions — carry a packet one endpoint
//! emitted to the other, mutated or not, dropped, duplicated, reordered or
//! replayed; forge one; post sends of every opcode and receives; modify
//! QPs (ERR, RESET, SQD and back, arbitrary attributes); register and
//! deregister regions with work in flight; allocate, bind, invalidate and
//! deallocate memory windows; pace QPs and bound their windows; advance
//! virtual time; poll CQs and events.
//!
//! Checked at every step (a failure is a panic, which libFuzzer reports):
//! * no panic anywhere in the core;
//! * no access outside a live region, and no misaligned atomic: each
//!   endpoint's memory is a `GuardedMemory` whose live set is the harness's
//!   own record of what it registered and which deregistrations returned
//!   (not the core's table), read through for every transmitted payload
//!   segment too;
//! * what the core emits parses;
//! * no completion for a work request never posted, none twice;
//! * CQs never hold more than their depth, the event queue never more than
//!   `max_events`; after `handle_timeout(now)` no timer is already due;
//! * the scheduler's own check (`Endpoint::check_scheduler`) holds.
//!
//! At the end, all traffic is carried faithfully and timers fired until the
//! endpoints go quiet (bounded); then every window is deallocated, after
//! which every live region must deregister, the region table must be empty,
//! and a second settling pass, with no memory live at all, must touch none.

#![no_main]

use std::collections::{HashSet, VecDeque};

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use softrdma_core::cq::CqId;
use softrdma_core::mr::{GuardedMemory, KeySource, Memory, MwBind, MwId, MwType, PdId};
use softrdma_core::qp::attr::{AccessFlags, AttrMask, Mtu, QpAttr};
use softrdma_core::qp::state::{required_mask, transition_rule, QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::{Completion, WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
use softrdma_core::{Endpoint, EndpointConfig, QpInit, RxMeta};
use softrdma_wire::{Packet, PacketRepr};

/// Each endpoint's memory: small, so regions, gaps and bounds collide often.
const MEM: u64 = 64 << 10;
/// Distinct bases, so a host address of one side is never valid on the other.
const BASE: [u64; 2] = [0x10_0000, 0x40_0000];
/// Small enough that the first overflows if the fuzzer does not poll it
/// (and the CQ enters the error state for good, taking its QPs to ERR),
/// large enough that the others seldom do.
const CQ_DEPTH: [u32; 3] = [8, 32, 128];
const MAX_CQE: u32 = 256;
const MAX_EVENTS: usize = 32;
const QKEY: u32 = 0x1111_1111;
/// Packets one side may have emitted and not yet carried; past this the
/// oldest is lost, as on a full link.
const OUTBOX: usize = 256;
/// Old packets kept per direction for replay.
const HISTORY: usize = 32;
/// Keys the harness remembers per side (issued, stale and guessed alike).
const MAX_KEYS: usize = 64;
const MAX_ACTIONS: usize = 256;
/// How long the final settling may go on: rounds of carry-everything then
/// fire-the-next-timer.
const SETTLE_ROUNDS: usize = 64;
/// Transmits one call to `pump_all` may take from a side before it must
/// have run dry: the endpoint's output is bounded without new input.
const DRY_AFTER: usize = 1 << 14;

fn gid(side: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, side as u8 + 1]);
    g
}

// ---- The fuzzer's actions --------------------------------------------------

#[derive(Arbitrary, Debug)]
enum Action {
    /// Carry up to `n` packets from `from`'s outbox to its peer, in order
    /// (emitting more first if the outbox is empty).
    Deliver {
        from: bool,
        n: u8,
    },
    /// Emit up to `n` packets from `side` into its outbox without carrying them.
    Pump {
        side: bool,
        n: u8,
    },
    /// Take one packet out of the outbox, change it and carry it;
    /// `keep` leaves the original queued too (a duplicate).
    Mutate {
        from: bool,
        which: u8,
        m: Mutation,
        keep: bool,
        spoof: bool,
    },
    Drop {
        from: bool,
        which: u8,
    },
    Swap {
        from: bool,
        i: u8,
        j: u8,
    },
    /// Carry again a packet carried earlier.
    Replay {
        from: bool,
        which: u8,
        m: Option<Mutation>,
    },
    /// A packet no endpoint emitted: a BTH aimed at one of `to`'s QPs, then
    /// the fuzzer's bytes.
    Forge {
        to: bool,
        f: Forged,
    },
    /// Raw bytes as a datagram.
    Raw {
        to: bool,
        bytes: Vec<u8>,
    },
    PostSend {
        side: bool,
        qp: u8,
        w: Wr,
    },
    PostRecv {
        side: bool,
        qp: u8,
        sges: Vec<SgeSpec>,
        srq: bool,
    },
    Modify {
        side: bool,
        qp: u8,
        m: Modify,
    },
    Reconnect {
        pair: u8,
        psn_a: u32,
        psn_b: u32,
        mtu: u8,
        timeout: u8,
        retry: u8,
        rnr: u8,
    },
    RegMr {
        side: bool,
        r: RegSpec,
    },
    DeregMr {
        side: bool,
        which: u8,
    },
    /// An implicit on-demand region (the whole address space, every access
    /// checked): the guard grants it nothing, so an access to it that is
    /// not a checked one fails the run, and one outside the side's memory
    /// is the fault the core must turn into IBA's error.
    RegImplicit {
        side: bool,
        pd: bool,
        access: u8,
    },
    AllocMw {
        side: bool,
        pd: bool,
        type2: bool,
    },
    BindMw1 {
        side: bool,
        qp: u8,
        b: BindSpec,
        signaled: bool,
    },
    DeallocMw {
        side: bool,
        key: u8,
    },
    /// Advance virtual time by 2^(exp % 34) ns (up to ~17 s) and fire timers.
    Advance {
        exp: u8,
    },
    /// Advance to the earliest timer either side has and fire it.
    NextTimer,
    PollCq {
        side: bool,
        cq: u8,
        n: u8,
    },
    ReqNotify {
        side: bool,
        cq: u8,
        solicited: bool,
    },
    PollEvents {
        side: bool,
    },
    /// The congestion-control hooks: pace a QP (`None`: line rate) ...
    SetRate {
        side: bool,
        qp: u8,
        bps: Option<u32>,
    },
    /// `ibv_resize_cq` to 1..=256 entries.
    ResizeCq {
        side: bool,
        cq: u8,
        depth: u8,
    },
    /// ... or bound its window in PSNs and bytes.
    SetWindow {
        side: bool,
        qp: u8,
        psns: u16,
        bytes: Option<u32>,
    },
}

#[derive(Arbitrary, Debug, Clone)]
enum Mutation {
    FlipBit {
        byte: u8,
        bit: u8,
    },
    SetByte {
        off: u8,
        val: u8,
    },
    Opcode(u8),
    PsnDelta(i16),
    Psn(u32),
    /// Aim it at another QP of the receiver (by index).
    DestQp(u8),
    /// RETH (or whatever follows the BTH): virtual address, rkey, length.
    Va(u64),
    Rkey(u32),
    Len(u32),
    /// AETH syndrome and MSN, when the packet is an acknowledgement.
    Aeth(u32),
    Truncate(u16),
    Extend(Vec<u8>),
    Many(Vec<Mutation>),
}

#[derive(Arbitrary, Debug)]
struct Forged {
    qp: u8,
    opcode: u8,
    /// Byte 1 of the BTH: solicited, migration, pad count, version.
    flags: u8,
    ack_req: bool,
    psn: u32,
    /// Extension headers and payload, then a zero ICRC.
    rest: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct SgeSpec {
    /// Index into the side's regions (live or not).
    region: u8,
    off: u16,
    len: u16,
    /// Use this lkey instead of the region's.
    lkey: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum Key {
    /// The rkey of one of the peer's regions (live or not).
    PeerRegion(u8),
    /// Any key the harness has seen on the peer (windows, lkeys, stale ones).
    Peer(u8),
    /// A key of this side (for LOCAL_INV).
    Own(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum Remote {
    /// Offset into one of the peer's regions, in its iova space.
    Region(u8, u16),
    /// A small address: a zero-based window's offsets.
    Small(u16),
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Send,
    SendImm(u32),
    SendInv(Key),
    Write(Remote, Key),
    WriteImm(Remote, Key, u32),
    Read(Remote, Key),
    CompareSwap(Remote, Key, u64, u64),
    FetchAdd(Remote, Key, u64),
    BindMw(BindSpec),
    LocalInv(Key),
}

#[derive(Arbitrary, Debug)]
struct Wr {
    op: Op,
    sges: Vec<SgeSpec>,
    /// FENCE, SIGNALED, SOLICITED, INLINE (low 4 bits).
    flags: u8,
    /// UD: which of the peer's QPs, and whether the Q_Key is right.
    ud_qp: u8,
    bad_qkey: bool,
}

#[derive(Arbitrary, Debug)]
struct BindSpec {
    /// Index into the side's windows.
    window: u8,
    region: u8,
    off: u16,
    len: u16,
    /// REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED and beyond.
    access: u8,
    new_key: u8,
}

#[derive(Arbitrary, Debug)]
enum Modify {
    Err,
    Reset,
    Sqd,
    Rts,
    /// Any state, any mask, any values.
    Raw {
        state: u8,
        mask: u32,
        required: bool,
        access: u8,
        mtu: u8,
        psn: u32,
        dest_qp: u8,
        timeout: u8,
        retry: u8,
        rnr: u8,
        rd_atomic: u8,
        min_rnr: u8,
        qkey: u32,
    },
}

#[derive(Arbitrary, Debug)]
struct RegSpec {
    pd: bool,
    off: u16,
    len: u16,
    /// How the iova relates to the host address.
    iova: Iova,
    access: u8,
}

#[derive(Arbitrary, Debug)]
enum Iova {
    Same,
    /// Host address plus a small shift: misaligned against the host.
    Shift(u8),
    High(u32),
    /// Close to the top of the address space.
    NearTop(u16),
    Raw(u64),
}

// ---- The harness -------------------------------------------------------------

#[derive(Clone, Copy)]
struct Region {
    lkey: u32,
    rkey: u32,
    iova: u64,
    host: u64,
    len: u64,
    live: bool,
}

struct Window {
    /// Every rkey it may have now (a bind's outcome is known only later).
    keys: Vec<u32>,
    live: bool,
}

#[derive(Clone, Copy)]
struct QpRec {
    qpn: u32,
    ty: QpType,
}

struct Side {
    ep: Endpoint,
    mem: GuardedMemory,
    pds: [PdId; 2],
    cqs: [CqId; 3],
    srq: u32,
    qps: Vec<QpRec>,
    regions: Vec<Region>,
    windows: Vec<Window>,
    keys: Vec<u32>,
    /// Work requests posted and not yet completed.
    outstanding: HashSet<u64>,
    /// Packets emitted and not carried yet.
    outbox: VecDeque<Vec<u8>>,
    /// Packets carried, for replay.
    history: VecDeque<Vec<u8>>,
    tx: u64,
    rx: u64,
    head: Vec<u8>,
}

/// The QPs each side has: pair i on A talks to pair i on B.
const QPS: [(QpType, bool, Mtu); 7] = [
    (QpType::Rc, false, Mtu::B256),
    (QpType::Rc, false, Mtu::B1024),
    (QpType::Rc, true, Mtu::B256),
    (QpType::Uc, false, Mtu::B256),
    (QpType::Uc, true, Mtu::B512),
    (QpType::Ud, false, Mtu::B1024),
    (QpType::Ud, true, Mtu::B1024),
];

impl Side {
    fn new(i: usize) -> Side {
        let mut ep = Endpoint::new(EndpointConfig {
            key_source: KeySource::seeded(0x5eed + i as u64),
            qpn_base: 0x40 * (i as u32 + 1),
            max_qp: 16,
            max_cq: 8,
            max_cqe: MAX_CQE,
            max_qp_wr: 64,
            max_rd_atom: 4,
            port_mtu: Mtu::B4096,
            max_events: MAX_EVENTS,
            // A: a destination budget of a few packets and a short quantum,
            // so the scheduler's gates and rotation are hit; B: the defaults.
            max_inflight_per_dest: [8 << 10, 4 << 20][i],
            sched_quantum: [512, 16 << 10][i],
            // A runs DCQCN (its CNP and timer paths see the fuzzed wire),
            // B none.
            cc: [
                softrdma_core::cc::CcConfig::Dcqcn(softrdma_core::cc::dcqcn::Params::paper()),
                softrdma_core::cc::CcConfig::None,
            ][i],
            line_rate: 100_000_000_000,
            // Both offer and accept selective repeat, so fuzzed packets
            // reach the held-packet paths; A's pool is tiny, so a full
            // pool is hit too.
            selective_repeat: true,
            reorder_slots: [4, 1024][i],
        });
        let pds = [ep.alloc_pd(), ep.alloc_pd()];
        let cqs = CQ_DEPTH.map(|d| ep.create_cq(d).expect("cq"));
        let srq = ep.create_srq(pds[0], 8, 2).expect("srq");
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 3,
            max_recv_sge: 3,
            max_inline_data: 64,
        };
        let qps = QPS
            .iter()
            .enumerate()
            .map(|(k, &(ty, srq_on, _))| {
                let qpn = ep
                    .create_qp(QpInit {
                        qp_type: ty,
                        pd: pds[0],
                        send_cq: cqs[k % 3],
                        recv_cq: cqs[(k + 1) % 3],
                        srq: srq_on.then_some(srq),
                        cap,
                        sq_sig_all: k % 2 == 0,
                    })
                    .expect("qp");
                QpRec { qpn, ty }
            })
            .collect();
        let mut s = Side {
            ep,
            mem: GuardedMemory::new(BASE[i], MEM as usize),
            pds,
            cqs,
            srq,
            qps,
            regions: Vec::new(),
            windows: Vec::new(),
            keys: Vec::new(),
            outstanding: HashSet::new(),
            outbox: VecDeque::new(),
            history: VecDeque::new(),
            tx: 0,
            rx: 0,
            head: vec![0; 4096 + 128],
        };
        let all = AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_WRITE)
            .union(AccessFlags::REMOTE_READ)
            .union(AccessFlags::REMOTE_ATOMIC)
            .union(AccessFlags::MW_BIND);
        // A region at its own address, one whose iova is 4 bytes off its
        // host address (atomics must check the host's alignment), and a
        // read-only one; the rest of memory is registered by the fuzzer or
        // never.
        s.reg(0, 0, 16 << 10, Iova::Same, all);
        s.reg(0, 20 << 10, 8 << 10, Iova::Shift(4), all);
        s.reg(
            1,
            32 << 10,
            4 << 10,
            Iova::High(0x7000),
            AccessFlags::REMOTE_READ,
        );
        s.alloc_mw(0, MwType::Type2);
        s.alloc_mw(0, MwType::Type1);
        s
    }

    fn remember_key(&mut self, k: u32) {
        if self.keys.len() < MAX_KEYS && !self.keys.contains(&k) {
            self.keys.push(k);
        }
    }

    fn reg(&mut self, pd: usize, off: u64, len: u64, iova: Iova, access: AccessFlags) {
        let off = off % MEM;
        let len = len % (MEM - off + 1);
        let host = self.mem.base + off;
        let iova = match iova {
            Iova::Same => host,
            Iova::Shift(d) => host.wrapping_add(d as u64 % 16),
            Iova::High(h) => (h as u64) << 20,
            Iova::NearTop(d) => u64::MAX - d as u64,
            Iova::Raw(v) => v,
        };
        if let Ok((lkey, rkey)) = self.ep.reg_mr(self.pds[pd], iova, host, len, access) {
            if self.regions.len() < 32 {
                self.regions.push(Region {
                    lkey,
                    rkey,
                    iova,
                    host,
                    len,
                    live: true,
                });
                self.mem.grant(host, len);
                self.remember_key(lkey);
                self.remember_key(rkey);
            } else {
                // No room to remember it: take it back at once.
                self.ep.dereg_mr(lkey).expect("fresh region deregisters");
            }
        }
    }

    fn reg_implicit(&mut self, pd: usize, access: AccessFlags) {
        if let Ok((lkey, rkey)) = self.ep.reg_mr_implicit(self.pds[pd], access) {
            if self.regions.len() < 32 {
                // Not granted: only checked calls may reach it. SGEs and
                // remote addresses are drawn from a window straddling this
                // side's memory (its iova is its host address), so some
                // land and some fault; `host` 0 matches no grant, so its
                // deregistration revokes nothing.
                self.regions.push(Region {
                    lkey,
                    rkey,
                    iova: self.mem.base - 4096,
                    host: 0,
                    len: MEM + 8192,
                    live: true,
                });
                self.remember_key(lkey);
                self.remember_key(rkey);
            } else {
                self.ep.dereg_mr(lkey).expect("fresh region deregisters");
            }
        }
    }

    fn alloc_mw(&mut self, pd: usize, kind: MwType) {
        if self.windows.len() >= 8 {
            return;
        }
        if let Ok((_, rkey)) = self.ep.alloc_mw(self.pds[pd], kind) {
            self.windows.push(Window {
                keys: vec![rkey],
                live: true,
            });
            self.remember_key(rkey);
        }
    }

    fn region(&self, i: u8) -> Option<Region> {
        (!self.regions.is_empty()).then(|| self.regions[i as usize % self.regions.len()])
    }

    fn key(&self, i: u8) -> u32 {
        if self.keys.is_empty() {
            0
        } else {
            self.keys[i as usize % self.keys.len()]
        }
    }

    fn qp(&self, i: u8) -> QpRec {
        self.qps[i as usize % self.qps.len()]
    }

    fn sgl(&self, specs: &[SgeSpec], out: &mut [Sge; 4]) -> usize {
        let mut n = 0;
        for s in specs.iter().take(out.len()) {
            let Some(r) = self.region(s.region) else {
                break;
            };
            // Near the region's bounds, sometimes past them.
            let span = r.len + 16;
            let off = s.off as u64 % span;
            let len = (s.len as u64 % (span + 1)) as u32;
            out[n] = Sge {
                addr: r.iova.wrapping_add(off),
                length: len,
                lkey: s.lkey.unwrap_or(r.lkey),
            };
            n += 1;
        }
        n
    }

    /// Emit up to `n` packets into the outbox: copy each payload segment out
    /// of guarded memory at once (the segments are valid only until the
    /// next call into the endpoint).
    fn pump(&mut self, now: u64, n: usize) -> usize {
        let mut got = 0;
        while got < n {
            let Some(t) = self.ep.poll_transmit(now, &mut self.head, &self.mem) else {
                break;
            };
            let mut d = Vec::with_capacity(t.wire_len());
            d.extend_from_slice(&self.head[..t.head_len]);
            for s in t.segs.as_slice() {
                let at = d.len();
                d.resize(at + s.len as usize, 0);
                self.mem.read(s.addr, &mut d[at..]);
            }
            d.resize(d.len() + t.pad as usize + 4, 0);
            assert_eq!(d.len(), t.wire_len());
            let p = Packet::new_checked(&d[..]).expect("the core emits packets that parse");
            PacketRepr::parse(&p).expect("the core emits headers that parse");
            self.tx += 1;
            got += 1;
            if t.dgid != gid(0) && t.dgid != gid(1) {
                continue; // a UD destination nobody has
            }
            if self.outbox.len() == OUTBOX {
                self.outbox.pop_front();
            }
            self.outbox.push_back(d);
        }
        got
    }

    /// Receive a datagram from the peer (`sgid` its address, unless spoofed).
    fn receive(&mut self, now: u64, sgid: [u8; 16], dgid: [u8; 16], bytes: &[u8]) {
        let meta = RxMeta {
            sgid,
            dgid,
            traffic_class: 0,
            hop_limit: 64,
        };
        self.rx += 1;
        self.ep.handle_packet(now, &meta, bytes, &mut self.mem);
    }

    /// Poll up to `n` completions from one CQ, checking each against what
    /// was posted, and that the CQ held no more than its depth.
    fn poll_cq(&mut self, cq: usize, n: usize) {
        let mut out = [blank(); 2 * MAX_CQE as usize];
        let id = self.cqs[cq];
        let depth = self.ep.cq_depth(id).expect("the CQ exists") as usize;
        let want = n.min(out.len());
        let got = match self.ep.poll_cq(id, &mut out[..want]) {
            Ok(got) => got,
            // Overflowed: in the error state for good (IBA's CQ error).
            Err(softrdma_core::Error::CqOverflowed(_)) => return,
            Err(e) => panic!("poll_cq: {e}"),
        };
        assert!(got <= want);
        assert!(got <= depth, "CQ of depth {depth} held {got} completions");
        for c in &out[..got] {
            assert!(
                self.outstanding.remove(&c.wr_id),
                "completion {c:?} for a work request not outstanding"
            );
        }
    }

    fn drain(&mut self) {
        for cq in 0..3 {
            self.poll_cq(cq, 2 * MAX_CQE as usize);
        }
        let mut n = 0;
        while self.ep.poll_event().is_some() {
            n += 1;
            assert!(n <= MAX_EVENTS, "event queue holds more than max_events");
        }
    }

    fn fire(&mut self, now: u64) {
        self.ep.handle_timeout(now);
        if let Some(t) = self.ep.poll_timeout() {
            assert!(
                t > now,
                "a timer at {t} is still due after handle_timeout({now})"
            );
        }
    }
}

fn blank() -> Completion {
    Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_or_inv: 0,
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        vendor_err: 0,
        sl: 0,
    }
}

fn mtu_of(code: u8) -> Mtu {
    Mtu::ALL[code as usize % Mtu::ALL.len()]
}

fn access_of(bits: u8) -> AccessFlags {
    AccessFlags::from_bits_retain(bits as u32)
}

struct World {
    s: [Side; 2],
    now: u64,
    wr_ids: u64,
}

impl World {
    fn new() -> World {
        let mut w = World {
            s: [Side::new(0), Side::new(1)],
            now: 0,
            wr_ids: 0,
        };
        for (p, &(_, _, mtu)) in QPS.iter().enumerate() {
            w.connect(p, 100 + p as u32, 0xff_fff0 - p as u32, mtu, 1, 7, 7);
        }
        w
    }

    /// Bring pair `p` from wherever it is to RTS on both sides, through RESET.
    #[allow(clippy::too_many_arguments)]
    fn connect(
        &mut self,
        p: usize,
        psn_a: u32,
        psn_b: u32,
        mtu: Mtu,
        timeout: u8,
        retry: u8,
        rnr: u8,
    ) {
        for me in 0..2 {
            let peer = self.s[1 - me].qps[p].qpn;
            let q = self.s[me].qps[p];
            let (sq, rq) = if me == 0 {
                (psn_a, psn_b)
            } else {
                (psn_b, psn_a)
            };
            let mut a = QpAttr {
                qp_state: QpState::Reset,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE
                    .union(AccessFlags::REMOTE_READ)
                    .union(AccessFlags::REMOTE_ATOMIC),
                qkey: QKEY,
                path_mtu: mtu,
                dest_qp_num: peer,
                rq_psn: rq & 0xff_ffff,
                sq_psn: sq & 0xff_ffff,
                max_dest_rd_atomic: 4,
                max_rd_atomic: 4,
                min_rnr_timer: 1,
                timeout,
                retry_cnt: retry & 7,
                rnr_retry: rnr & 7,
                ..Default::default()
            };
            a.av.dgid = gid(1 - me);
            a.av.hop_limit = 64;
            let ep = &mut self.s[me].ep;
            let cur = ep.qp(q.qpn).expect("qp").state;
            if cur != QpState::Reset {
                ep.modify_qp(q.qpn, &a, AttrMask::STATE)
                    .expect("any state -> RESET");
            }
            for (from, to) in [
                (QpState::Reset, QpState::Init),
                (QpState::Init, QpState::Rtr),
                (QpState::Rtr, QpState::Rts),
            ] {
                a.qp_state = to;
                let mask = required_mask(from, to, q.ty).expect("transition exists");
                ep.modify_qp(q.qpn, &a, mask)
                    .unwrap_or_else(|e| panic!("{from:?}->{to:?} of {:?}: {e}", q.ty));
            }
        }
    }

    fn side(&mut self, b: bool) -> &mut Side {
        &mut self.s[b as usize]
    }

    /// Carry a datagram from side `from` to its peer.
    fn carry(&mut self, from: usize, bytes: &[u8], spoof: bool) {
        let now = self.now;
        let mut sgid = gid(from);
        if spoof {
            sgid[15] ^= 0x80;
        }
        self.s[1 - from].receive(now, sgid, gid(1 - from), bytes);
        let h = &mut self.s[from].history;
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(bytes.to_vec());
    }

    /// The next packet of `from`'s outbox at `which`, emitting one if none.
    fn take(&mut self, from: usize, which: u8) -> Option<Vec<u8>> {
        let now = self.now;
        let s = &mut self.s[from];
        if s.outbox.is_empty() {
            s.pump(now, 1);
        }
        if s.outbox.is_empty() {
            return None;
        }
        let i = which as usize % s.outbox.len();
        s.outbox.remove(i)
    }

    fn mutate(&self, to: usize, d: &mut Vec<u8>, m: &Mutation, depth: u8) {
        let set = |d: &mut Vec<u8>, off: usize, v: &[u8]| {
            if d.len() >= off + v.len() {
                d[off..off + v.len()].copy_from_slice(v);
            }
        };
        match m {
            Mutation::FlipBit { byte, bit } => {
                if !d.is_empty() {
                    let i = *byte as usize % d.len();
                    d[i] ^= 1 << (bit % 8);
                }
            }
            Mutation::SetByte { off, val } => set(d, *off as usize, &[*val]),
            Mutation::Opcode(o) => set(d, 0, &[*o]),
            Mutation::PsnDelta(x) => {
                if d.len() >= 12 {
                    let p = u32::from_be_bytes([0, d[9], d[10], d[11]]);
                    let p = p.wrapping_add(*x as i32 as u32) & 0xff_ffff;
                    d[9..12].copy_from_slice(&p.to_be_bytes()[1..]);
                }
            }
            Mutation::Psn(p) => set(d, 9, &(p & 0xff_ffff).to_be_bytes()[1..]),
            Mutation::DestQp(q) => {
                let qpn = self.s[to].qp(*q).qpn;
                set(d, 5, &qpn.to_be_bytes()[1..]);
            }
            Mutation::Va(v) => set(d, 12, &v.to_be_bytes()),
            Mutation::Rkey(k) => set(d, 20, &k.to_be_bytes()),
            Mutation::Len(l) => set(d, 24, &l.to_be_bytes()),
            Mutation::Aeth(a) => set(d, 12, &a.to_be_bytes()),
            Mutation::Truncate(n) => {
                let n = *n as usize % (d.len() + 1);
                d.truncate(n);
            }
            Mutation::Extend(v) => {
                let at = d.len().saturating_sub(4);
                let tail = d.split_off(at);
                d.extend_from_slice(&v[..v.len().min(256)]);
                d.extend_from_slice(&tail);
            }
            Mutation::Many(v) => {
                if depth < 2 {
                    for m in v.iter().take(8) {
                        self.mutate(to, d, m, depth + 1);
                    }
                }
            }
        }
    }

    fn step(&mut self, a: Action) {
        let now = self.now;
        match a {
            Action::Deliver { from, n } => {
                let f = from as usize;
                for _ in 0..n % 32 + 1 {
                    let Some(d) = self.take(f, 0) else { break };
                    self.carry(f, &d, false);
                }
            }
            Action::Pump { side, n } => {
                self.side(side).pump(now, n as usize % 64 + 1);
            }
            Action::Mutate {
                from,
                which,
                m,
                keep,
                spoof,
            } => {
                let f = from as usize;
                if let Some(mut d) = self.take(f, which) {
                    if keep {
                        self.s[f].outbox.push_front(d.clone());
                    }
                    self.mutate(1 - f, &mut d, &m, 0);
                    self.carry(f, &d, spoof);
                }
            }
            Action::Drop { from, which } => {
                self.take(from as usize, which);
            }
            Action::Swap { from, i, j } => {
                let o = &mut self.side(from).outbox;
                if !o.is_empty() {
                    let (i, j) = (i as usize % o.len(), j as usize % o.len());
                    o.swap(i, j);
                }
            }
            Action::Replay { from, which, m } => {
                let f = from as usize;
                let h = &self.s[f].history;
                if !h.is_empty() {
                    let mut d = h[which as usize % h.len()].clone();
                    if let Some(m) = m {
                        self.mutate(1 - f, &mut d, &m, 0);
                    }
                    self.carry(f, &d, false);
                }
            }
            Action::Forge { to, f } => {
                let t = to as usize;
                let qpn = self.s[t].qp(f.qp).qpn;
                let mut d = Vec::with_capacity(16 + f.rest.len());
                d.push(f.opcode);
                d.push(f.flags);
                d.extend_from_slice(&[0xff, 0xff, 0]);
                d.extend_from_slice(&qpn.to_be_bytes()[1..]);
                d.push(if f.ack_req { 0x80 } else { 0 });
                d.extend_from_slice(&(f.psn & 0xff_ffff).to_be_bytes()[1..]);
                d.extend_from_slice(&f.rest[..f.rest.len().min(4200)]);
                d.extend_from_slice(&[0; 4]);
                self.carry(1 - t, &d, false);
            }
            Action::Raw { to, bytes } => {
                let t = to as usize;
                self.carry(1 - t, &bytes, false);
            }
            Action::PostSend { side, qp, w } => self.post_send(side as usize, qp, w),
            Action::PostRecv {
                side,
                qp,
                sges,
                srq,
            } => {
                let wr_id = self.wr_ids + 1;
                self.wr_ids = wr_id;
                let s = self.side(side);
                let mut sgl = [Sge::default(); 4];
                let n = s.sgl(&sges, &mut sgl);
                let wr = RecvWr {
                    wr_id,
                    sgl: &sgl[..n],
                };
                let q = s.qp(qp);
                let r = if srq {
                    s.ep.post_srq_recv(s.srq, &wr)
                } else {
                    s.ep.post_recv(q.qpn, &wr)
                };
                if r.is_ok() {
                    s.outstanding.insert(wr_id);
                }
            }
            Action::Modify { side, qp, m } => self.modify(side as usize, qp, m),
            Action::Reconnect {
                pair,
                psn_a,
                psn_b,
                mtu,
                timeout,
                retry,
                rnr,
            } => {
                let p = pair as usize % QPS.len();
                self.connect(p, psn_a, psn_b, mtu_of(mtu), timeout % 32, retry, rnr);
            }
            Action::RegMr { side, r } => {
                let pd = r.pd as usize;
                self.side(side)
                    .reg(pd, r.off as u64, r.len as u64, r.iova, access_of(r.access));
            }
            Action::RegImplicit { side, pd, access } => {
                self.side(side).reg_implicit(pd as usize, access_of(access));
            }
            Action::DeregMr { side, which } => {
                let s = self.side(side);
                if let Some(r) = s.region(which) {
                    let i = which as usize % s.regions.len();
                    if s.ep.dereg_mr(r.lkey).is_ok() {
                        assert!(r.live, "a deregistered region deregistered again");
                        s.regions[i].live = false;
                        s.mem.revoke(r.host, r.len);
                    }
                }
            }
            Action::AllocMw { side, pd, type2 } => {
                let kind = if type2 { MwType::Type2 } else { MwType::Type1 };
                self.side(side).alloc_mw(pd as usize, kind);
            }
            Action::BindMw1 {
                side,
                qp,
                b,
                signaled,
            } => {
                let wr_id = self.wr_ids + 1;
                self.wr_ids = wr_id;
                let s = self.side(side);
                let Some(bind) = bind_of(s, &b) else { return };
                let q = s.qp(qp);
                let flags = if signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::default()
                };
                if let Ok(k) = s.ep.bind_mw(q.qpn, wr_id, bind, flags, &s.mem) {
                    s.outstanding.insert(wr_id);
                    let w = b.window as usize % s.windows.len();
                    if s.windows[w].keys.len() < 8 {
                        s.windows[w].keys.push(k);
                    }
                    s.remember_key(k);
                }
            }
            Action::DeallocMw { side, key } => {
                let s = self.side(side);
                let k = s.key(key);
                if s.ep.dealloc_mw(MwId::of_rkey(k)).is_ok() {
                    for w in &mut s.windows {
                        if w.keys.contains(&k) {
                            w.live = false;
                        }
                    }
                }
            }
            Action::Advance { exp } => {
                self.now += 1u64 << (exp % 34);
                let now = self.now;
                self.s[0].fire(now);
                self.s[1].fire(now);
            }
            Action::NextTimer => self.next_timer(),
            Action::PollCq { side, cq, n } => {
                self.side(side).poll_cq(cq as usize % 3, n as usize % 8 + 1);
            }
            Action::ReqNotify {
                side,
                cq,
                solicited,
            } => {
                let s = self.side(side);
                s.ep.req_notify_cq(s.cqs[cq as usize % 3], solicited)
                    .expect("the CQ exists");
            }
            Action::ResizeCq { side, cq, depth } => {
                let s = self.side(side);
                let _ = s.ep.resize_cq(s.cqs[cq as usize % 3], depth as u32 + 1);
            }
            Action::SetRate { side, qp, bps } => {
                let s = self.side(side);
                let q = s.qp(qp);
                // From 1 kbit/s up: slow enough that timers must pace it.
                let _ = s.ep.set_qp_rate(q.qpn, bps.map(|b| b as u64 * 1000));
            }
            Action::SetWindow {
                side,
                qp,
                psns,
                bytes,
            } => {
                let s = self.side(side);
                let q = s.qp(qp);
                let _ =
                    s.ep.set_qp_window(q.qpn, psns as u32 % 300, bytes.map(u64::from));
            }
            Action::PollEvents { side } => {
                let s = self.side(side);
                for _ in 0..MAX_EVENTS + 1 {
                    if s.ep.poll_event().is_none() {
                        return;
                    }
                }
                panic!("more than max_events events queued");
            }
        }
    }

    fn next_timer(&mut self) {
        let t = [0, 1]
            .iter()
            .filter_map(|&i| self.s[i].ep.poll_timeout())
            .min();
        if let Some(t) = t {
            self.now = self.now.max(t);
            let now = self.now;
            self.s[0].fire(now);
            self.s[1].fire(now);
        }
    }

    fn post_send(&mut self, side: usize, qp: u8, w: Wr) {
        self.wr_ids += 1;
        let wr_id = self.wr_ids;
        let (me, peer) = {
            let [a, b] = &mut self.s;
            if side == 0 {
                (a, &*b)
            } else {
                (b, &*a)
            }
        };
        let q = me.qp(qp);
        let key = |k: &Key| match *k {
            Key::PeerRegion(i) => peer.region(i).map_or(0, |r| r.rkey),
            Key::Peer(i) => peer.key(i),
            Key::Own(i) => me.key(i),
            Key::Raw(k) => k,
        };
        let remote = |r: &Remote| match *r {
            Remote::Region(i, off) => peer
                .region(i)
                .map_or(0, |r| r.iova.wrapping_add(off as u64 % (r.len + 16))),
            Remote::Small(x) => x as u64,
            Remote::Raw(x) => x,
        };
        let op = match &w.op {
            Op::Send => SendOp::Send,
            Op::SendImm(imm) => SendOp::SendWithImm { imm: *imm },
            Op::SendInv(k) => SendOp::SendWithInv { rkey: key(k) },
            Op::Write(r, k) => SendOp::Write {
                remote_addr: remote(r),
                rkey: key(k),
            },
            Op::WriteImm(r, k, imm) => SendOp::WriteWithImm {
                remote_addr: remote(r),
                rkey: key(k),
                imm: *imm,
            },
            Op::Read(r, k) => SendOp::Read {
                remote_addr: remote(r),
                rkey: key(k),
            },
            Op::CompareSwap(r, k, compare, swap) => SendOp::CompareSwap {
                remote_addr: remote(r),
                rkey: key(k),
                compare: *compare,
                swap: *swap,
            },
            Op::FetchAdd(r, k, add) => SendOp::FetchAdd {
                remote_addr: remote(r),
                rkey: key(k),
                add: *add,
            },
            Op::BindMw(b) => match bind_of(me, b) {
                Some(b) => SendOp::BindMw(b),
                None => return,
            },
            Op::LocalInv(k) => SendOp::LocalInv { rkey: key(k) },
        };
        let mut sgl = [Sge::default(); 4];
        let n = if op.is_local() {
            0
        } else {
            me.sgl(&w.sges, &mut sgl)
        };
        let flags = SendFlags(w.flags as u32 & 0xf);
        if flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic() {
            // The core copies inline data from the SGE's address as given,
            // checking no key (verbs semantics): the caller vouches for it.
            // Do what the safe verbs API does: translate each SGE through
            // the table, refusing one outside a region of the QP's PD.
            for s in &mut sgl[..n] {
                let pd = me.pds[0];
                match me.ep.mrs().check_local(
                    pd,
                    s.lkey,
                    s.addr,
                    s.length as u64,
                    AccessFlags::EMPTY,
                ) {
                    // An implicit region's inline bytes the safe API
                    // copies checked into a buffer of its own (or refuses):
                    // not the core's to read unchecked, so not posted here.
                    Ok(host) if !host.checked => s.addr = host.addr,
                    _ => return,
                }
            }
        }
        let ud = (q.ty == QpType::Ud).then(|| {
            let pq = peer.qp(w.ud_qp);
            UdDest {
                gid: gid(1 - side),
                remote_qpn: pq.qpn,
                remote_qkey: if w.bad_qkey { !QKEY } else { QKEY },
            }
        });
        let wr = SendWr {
            wr_id,
            op,
            sgl: &sgl[..n],
            flags,
            ud,
        };
        if me.ep.post_send(q.qpn, &wr, &me.mem).is_ok() {
            me.outstanding.insert(wr_id);
            if let SendOp::BindMw(b) = op {
                let k = (b.mw_rkey & !0xff) | (b.new_rkey & 0xff);
                if let Some(win) = me.windows.iter_mut().find(|x| x.keys.contains(&b.mw_rkey)) {
                    if win.keys.len() < 8 && !win.keys.contains(&k) {
                        win.keys.push(k);
                    }
                }
                me.remember_key(k);
            }
        }
    }

    fn modify(&mut self, side: usize, qp: u8, m: Modify) {
        let s = &mut self.s[side];
        let q = s.qp(qp);
        let cur = s.ep.qp(q.qpn).expect("qp").state;
        let mut a = QpAttr::default();
        let mask = match m {
            Modify::Err => {
                a.qp_state = QpState::Err;
                AttrMask::STATE
            }
            Modify::Reset => {
                a.qp_state = QpState::Reset;
                AttrMask::STATE
            }
            Modify::Sqd => {
                a.qp_state = QpState::Sqd;
                AttrMask::STATE
            }
            Modify::Rts => {
                a.qp_state = QpState::Rts;
                AttrMask::STATE
            }
            Modify::Raw {
                state,
                mask,
                required,
                access,
                mtu,
                psn,
                dest_qp,
                timeout,
                retry,
                rnr,
                rd_atomic,
                min_rnr,
                qkey,
            } => {
                let to = QpState::ALL[state as usize % QpState::ALL.len()];
                a.qp_state = to;
                a.pkey_index = 0;
                a.port_num = 1;
                a.qp_access_flags = access_of(access);
                a.qkey = qkey;
                a.path_mtu = mtu_of(mtu);
                a.av.dgid = gid(1 - side);
                a.av.hop_limit = 64;
                a.dest_qp_num = self.s[1 - side].qp(dest_qp).qpn;
                a.rq_psn = psn & 0xff_ffff;
                a.sq_psn = psn.rotate_left(7) & 0xff_ffff;
                a.timeout = timeout;
                a.retry_cnt = retry;
                a.rnr_retry = rnr;
                a.max_rd_atomic = rd_atomic;
                a.max_dest_rd_atomic = rd_atomic.rotate_left(4);
                a.min_rnr_timer = min_rnr;
                match (required, transition_rule(cur, to, q.ty)) {
                    // A well-formed mask with some of the optional bits.
                    (true, Some(r)) => r
                        .required
                        .union(AttrMask::STATE)
                        .union(r.optional.intersection(AttrMask::from_bits_retain(mask))),
                    _ => AttrMask::from_bits_retain(mask),
                }
            }
        };
        let s = &mut self.s[side];
        let _ = s.ep.modify_qp(q.qpn, &a, mask);
    }

    /// Carry everything faithfully and fire timers until both sides go
    /// quiet or the rounds run out.
    fn settle(&mut self) {
        for _ in 0..SETTLE_ROUNDS {
            let mut moved = false;
            for f in 0..2 {
                let now = self.now;
                let n = self.s[f].pump(now, DRY_AFTER);
                assert!(n < DRY_AFTER, "side {f} kept emitting without input");
                while let Some(d) = self.s[f].outbox.pop_front() {
                    self.carry(f, &d, false);
                    moved = true;
                }
            }
            if !moved {
                if self.s.iter().all(|s| s.ep.poll_timeout().is_none()) {
                    break;
                }
                self.next_timer();
            }
            for s in &mut self.s {
                s.drain();
            }
        }
        for s in &mut self.s {
            s.drain();
        }
    }

    /// Take back every window, then every region; afterwards nothing is
    /// live and nothing may be touched.
    fn teardown(&mut self) {
        for s in &mut self.s {
            for w in &mut s.windows {
                if !w.live {
                    continue;
                }
                let freed = w
                    .keys
                    .iter()
                    .filter(|&&k| s.ep.dealloc_mw(MwId::of_rkey(k)).is_ok())
                    .count();
                assert!(freed <= 1, "one window deallocated under two rkeys");
                w.live = false;
            }
            for r in &mut s.regions {
                if r.live {
                    s.ep.dereg_mr(r.lkey)
                        .unwrap_or_else(|e| panic!("live region with no windows: {e}"));
                    r.live = false;
                    s.mem.revoke(r.host, r.len);
                }
            }
            assert!(
                s.ep.mrs().is_empty(),
                "regions left after deregistering all"
            );
            assert!(s.mem.live().is_empty());
        }
    }

    /// The scheduler's own consistency check: no QP with work forgotten,
    /// lists, budgets and timers agreeing.
    fn check_scheduler(&self) {
        for (i, s) in self.s.iter().enumerate() {
            if let Err(e) = s.ep.check_scheduler() {
                panic!("side {i}: scheduler inconsistent: {e}");
            }
        }
    }

    fn check_counters(&self) {
        for s in &self.s {
            let st = s.ep.stats();
            assert_eq!(st.tx_packets, s.tx, "tx_packets counts every transmit");
            assert_eq!(st.rx_packets, s.rx, "rx_packets counts every datagram");
        }
    }
}

fn bind_of(s: &Side, b: &BindSpec) -> Option<MwBind> {
    if s.windows.is_empty() {
        return None;
    }
    let w = &s.windows[b.window as usize % s.windows.len()];
    let r = s.region(b.region)?;
    let span = r.len + 16;
    Some(MwBind {
        mw_rkey: *w.keys.last().expect("a window has a key"),
        new_rkey: b.new_key as u32,
        mr_lkey: r.lkey,
        addr: r.iova.wrapping_add(b.off as u64 % span),
        len: b.len as u64 % (span + 1),
        access: access_of(b.access),
    })
}

/// `SOFTRDMA_FUZZ_TRACE=1`: print each action (to read a crash's story).
fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_FUZZ_TRACE").is_some())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut w = World::new();
    let mut steps = 0;
    while steps < MAX_ACTIONS && !u.is_empty() {
        let Ok(a) = Action::arbitrary(&mut u) else {
            break;
        };
        if trace() {
            eprintln!("{steps:3} t={} {a:?}", w.now);
        }
        w.step(a);
        w.check_scheduler();
        steps += 1;
    }
    w.settle();
    w.check_scheduler();
    w.check_counters();
    w.teardown();
    w.settle();
    w.check_scheduler();
    w.check_counters();
});
