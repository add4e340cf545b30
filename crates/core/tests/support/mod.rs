//! Test support: a simulated host (one `Endpoint` plus its memory) that the
//! deterministic network simulator drives, and helpers to connect QPs.
//!
//! The host does what the real UDP backend does with a `Transmit`: headers
//! from the core, payload copied from memory segments, pad, then the ICRC
//! over IPv4 pseudo-headers (ID 0, DF — what our sockets send). On receive
//! it checks the ICRC exactly and drops corrupted datagrams, as the real
//! receive path does for softrdma peers.
//!
//! For tests that assert exact packets: a shared [`Trace`] records every
//! datagram the hosts send (decoded, one [`Pkt::line`] each), drop rules
//! ([`Host::drop_next`]) lose chosen datagrams deterministically, [`forge`]
//! builds datagrams a peer never sent (for `Sim::inject`), and
//! [`Host::take`] / [`Host::deliver`] carry packets by hand where the test
//! needs an interleaving the simulator would not produce. [`Host::pace`]
//! models a sender with a finite packet rate.
#![allow(dead_code)]

mod guarded;
pub use guarded::GuardedMemory;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use softrdma_core::cq::CqId;
use softrdma_core::mr::{KeySource, Memory, PdId};
use softrdma_core::qp::attr::{AccessFlags, AttrMask, Mtu, QpAttr};
use softrdma_core::qp::state::{required_mask, QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::{Completion, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Endpoint, EndpointConfig, Error, QpInit, RxMeta, Transmit, HEAD_ROOM};
use softrdma_netsim::{Node, NodeId, Sim};
use softrdma_wire::bth::{BthRepr, DEFAULT_PKEY};
use softrdma_wire::ext::{NakCode, RethRepr, Syndrome};
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::{icrc, Opcode, Packet, PacketRepr, Psn};

pub const MEM_BASE: u64 = 0x1000_0000;

/// Most packets a host takes from its endpoint per scheduling decision, as
/// the engine does (`softrdma_verbs`' `TX_BURST`).
pub const BURST: usize = 16;

pub fn gid_of(node: NodeId) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, node as u8 + 1]);
    g
}

fn v4(g: &[u8; 16]) -> [u8; 4] {
    g[12..].try_into().unwrap()
}

/// Every datagram a host sent or received, decoded, for tests that assert
/// exact packets.
#[derive(Debug, Clone)]
pub struct Wire {
    pub from: NodeId,
    pub bytes: Vec<u8>,
}

/// A test's rule for losing datagrams on purpose: the next `times`
/// datagrams this host sends for which `pred` holds are dropped before they
/// reach the network.
pub struct DropRule {
    pub times: usize,
    pub pred: Box<dyn FnMut(&PacketRepr) -> bool>,
}

pub struct Host {
    pub id: NodeId,
    pub ep: Endpoint,
    /// Fails the test on any access outside a live region (see
    /// [`GuardedMemory`]); refreshed at every call into the endpoint.
    pub mem: GuardedMemory,
    pub icrc_drops: u64,
    /// Datagrams this host sent, if recording.
    pub sent: Vec<Vec<u8>>,
    pub record: bool,
    /// Shared with the other hosts of a test: every datagram sent, in order.
    pub trace: Option<Trace>,
    /// Datagrams to lose on purpose (see [`Host::drop_next`]).
    pub drops: Vec<DropRule>,
    /// Send at most `.0` datagrams, then pause for `.1` ns: a sender with a
    /// finite packet rate, whose IO loop takes in packets between batches,
    /// so ACKs can arrive while a window is still being (re)sent. `None`:
    /// everything ready goes at once.
    pub pace: Option<(usize, u64)>,
    /// Pacing: datagrams sent in the current batch, and when the next may go.
    batch: usize,
    next_tx: u64,
    /// Heads of a burst (`Endpoint::poll_transmit_burst`), and the
    /// datagrams built from it and not yet handed to the network: the
    /// engine's way, one scheduling decision per run of a QP's packets.
    heads: Vec<u8>,
    built: VecDeque<(NodeId, Vec<u8>)>,
    /// Most packets per burst (and no more than a paced host's batch has
    /// room for: what is built never waits in `built` across a pause).
    pub burst: usize,
    /// Check the scheduler's invariants (`Endpoint::check_scheduler`, a
    /// scan of every QP) each time the host has sent all it can and after
    /// each timer; tests with thousands of QPs turn it off and check at
    /// points of their own.
    pub check_sched: bool,
}

impl Host {
    pub fn new(id: NodeId, mem_len: usize, seed: u64) -> Host {
        let cfg = EndpointConfig {
            key_source: KeySource::seeded(seed),
            qpn_base: 0x100 * (id as u32 + 1),
            ..Default::default()
        };
        Host {
            id,
            ep: Endpoint::new(cfg),
            mem: GuardedMemory::new(MEM_BASE, mem_len),
            icrc_drops: 0,
            sent: Vec::new(),
            record: false,
            trace: None,
            drops: Vec::new(),
            pace: None,
            batch: 0,
            next_tx: 0,
            heads: vec![0; BURST * HEAD_ROOM],
            built: VecDeque::new(),
            burst: BURST,
            check_sched: true,
        }
    }

    /// Drop the next `times` datagrams this host sends that match `pred`
    /// (`usize::MAX`: all of them, for as long as the rule stands).
    pub fn drop_next(&mut self, times: usize, pred: impl FnMut(&PacketRepr) -> bool + 'static) {
        self.drops.push(DropRule {
            times,
            pred: Box::new(pred),
        });
    }

    /// Whether a drop rule takes this datagram (and uses up one of its drops).
    fn should_drop(&mut self, r: &PacketRepr) -> bool {
        for rule in &mut self.drops {
            if rule.times > 0 && (rule.pred)(r) {
                rule.times -= 1;
                return true;
            }
        }
        false
    }

    /// Post a send work request with one SGE over `[addr, addr + len)` of
    /// this host's memory (no SGE at all when `len` is 0).
    pub fn post(
        &mut self,
        q: &QpEnd,
        wr_id: u64,
        op: SendOp,
        addr: u64,
        len: u32,
        flags: SendFlags,
    ) -> Result<(), Error> {
        self.post_via(q, wr_id, op, addr, len, flags, None)
            .map(|_| ())
    }

    /// [`Host::post`] through `off` if given (`Endpoint::post_send_offload`,
    /// the shared-memory transport's way): whether it was carried out at
    /// once.
    #[allow(clippy::too_many_arguments)]
    pub fn post_via(
        &mut self,
        q: &QpEnd,
        wr_id: u64,
        op: SendOp,
        addr: u64,
        len: u32,
        flags: SendFlags,
        off: Option<&mut dyn softrdma_core::Offload>,
    ) -> Result<bool, Error> {
        let sge = [Sge {
            addr,
            length: len,
            lkey: q.lkey,
        }];
        let sgl: &[Sge] = if len == 0 { &[] } else { &sge };
        let wr = SendWr {
            wr_id,
            op,
            sgl,
            flags,
            ud: None,
        };
        self.sync();
        match off {
            Some(o) => self.ep.post_send_offload(q.qpn, &wr, &self.mem, o),
            None => self.ep.post_send(q.qpn, &wr, &self.mem).map(|_| false),
        }
    }

    /// Tell the guarded memory which regions are live now.
    pub fn sync(&mut self) {
        self.mem.sync(self.ep.mrs());
    }

    /// Post a receive of one SGE over `[addr, addr + len)`.
    pub fn post_recv(&mut self, q: &QpEnd, wr_id: u64, addr: u64, len: u32) {
        let sge = [Sge {
            addr,
            length: len,
            lkey: q.lkey,
        }];
        self.ep
            .post_recv(q.qpn, &RecvWr { wr_id, sgl: &sge })
            .unwrap();
    }

    pub fn poll_cq(&mut self, cq: CqId) -> Vec<Completion> {
        let mut out = [Completion {
            wr_id: 0,
            status: softrdma_core::wc::WcStatus::Success,
            opcode: softrdma_core::wc::WcOpcode::Send,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: 0,
            vendor_err: 0,
            sl: 0,
        }; 64];
        let mut v = Vec::new();
        loop {
            let n = self.ep.poll_cq(cq, &mut out).unwrap();
            v.extend_from_slice(&out[..n]);
            if n < out.len() {
                return v;
            }
        }
    }
}

impl Node for Host {
    fn handle_packet(&mut self, now: u64, from: NodeId, bytes: &[u8]) {
        let src = gid_of(from);
        let dst = gid_of(self.id);
        let check = icrc::verify_ipv4_hidden((v4(&src), 4791), (v4(&dst), 4791), bytes, false);
        if check != icrc::HiddenCheck::Exact {
            self.icrc_drops += 1;
            return;
        }
        let meta = RxMeta {
            sgid: src,
            dgid: dst,
            traffic_class: 0,
            hop_limit: 64,
        };
        self.sync();
        self.ep.handle_packet(now, &meta, bytes, &mut self.mem);
    }

    fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<(NodeId, usize)> {
        if let Some((batch, gap)) = self.pace {
            if now < self.next_tx {
                return None;
            }
            if self.batch == batch {
                self.batch = 0;
                self.next_tx = now + gap;
                return None;
            }
        }
        loop {
            let Some((to, n)) = self.build(now, buf) else {
                self.batch = 0;
                self.check();
                return None;
            };
            let pkt = Packet::new_checked(&buf[..n]).expect("the core emits valid packets");
            let repr = PacketRepr::parse(&pkt).expect("the core emits valid packets");
            let dropped = self.should_drop(&repr);
            if let Some(t) = &self.trace {
                t.borrow_mut().push(Pkt {
                    t: now,
                    from: self.id,
                    to,
                    dropped,
                    sr: pkt.bth().softrdma_sr(),
                    repr,
                    payload: pkt.payload().to_vec(),
                });
            }
            if !dropped {
                self.batch += 1;
                return Some((to, n));
            }
        }
    }

    fn poll_timeout(&self) -> Option<u64> {
        let ep = self.ep.poll_timeout();
        match self.pace {
            // A paused sender wakes up to send the rest.
            Some(_) if self.next_tx > 0 => Some(ep.map_or(self.next_tx, |t| t.min(self.next_tx))),
            _ => ep,
        }
    }

    fn handle_timeout(&mut self, now: u64) {
        if now >= self.next_tx {
            self.next_tx = 0;
        }
        self.sync();
        self.ep.handle_timeout(now);
        self.check();
    }
}

impl Host {
    /// Panic if the scheduler forgot a QP (see [`Host::check_sched`]).
    pub fn check(&self) {
        if self.check_sched {
            if let Err(e) = self.ep.check_scheduler() {
                panic!("node {}: scheduler invariant broken: {e}", self.id);
            }
        }
    }
}

impl Host {
    /// What the real UDP backend does with a `Transmit`: one datagram with
    /// payload, pad and ICRC, built from each packet of a burst.
    fn build(&mut self, now: u64, buf: &mut [u8]) -> Option<(NodeId, usize)> {
        if self.built.is_empty() {
            self.sync();
            let burst = self.burst.clamp(1, BURST);
            // A paced host builds no more than its batch has room for, so
            // nothing built waits across a pause.
            let max = match self.pace {
                Some((batch, _)) => burst.min(batch.saturating_sub(self.batch)).max(1),
                None => burst,
            };
            let mut out = [Transmit::default(); BURST];
            let n = self
                .ep
                .poll_transmit_burst(now, &mut self.heads, &mut out[..max], &self.mem);
            for (k, t) in out[..n].iter().enumerate() {
                let head = &self.heads[k * HEAD_ROOM..k * HEAD_ROOM + t.head_len];
                let mut d = head.to_vec();
                for s in t.segs.as_slice() {
                    let at = d.len();
                    d.resize(at + s.len as usize, 0);
                    self.mem.read(s.addr, &mut d[at..]);
                }
                d.resize(d.len() + t.pad as usize + 4, 0);
                let dst_node = (t.dgid[15] - 1) as NodeId;
                let src = v4(&gid_of(self.id));
                let udp_len = (d.len() + 8) as u16;
                let ip = icrc::ipv4_header(src, v4(&t.dgid), 0, true, udp_len);
                let udp = icrc::udp_header(4791, 4791, udp_len);
                icrc::fill(&ip, &udp, &mut d);
                if self.record {
                    self.sent.push(d.clone());
                }
                self.built.push_back((dst_node, d));
            }
        }
        let (to, d) = self.built.pop_front()?;
        buf[..d.len()].copy_from_slice(&d);
        Some((to, d.len()))
    }
}

/// One QP on a host with its CQs and a registered region covering all memory.
#[derive(Debug, Clone, Copy)]
pub struct QpEnd {
    pub node: NodeId,
    pub qpn: u32,
    pub pd: PdId,
    pub scq: CqId,
    pub rcq: CqId,
    pub lkey: u32,
    pub rkey: u32,
}

pub struct Opts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub access: AccessFlags,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub cap: QpCap,
    pub psn_a: u32,
    pub psn_b: u32,
    pub rd_atomic: u8,
    pub sq_sig_all: bool,
    /// Offer and accept selective repeat. Off by default: most tests pin
    /// down IBA's go-back-N, packet by packet; `rc_selective_repeat` and
    /// the property tests turn it on.
    pub selective_repeat: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            qp_type: QpType::Rc,
            mtu: Mtu::B1024,
            access: AccessFlags::LOCAL_WRITE
                .union(AccessFlags::REMOTE_WRITE)
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            psn_a: 100,
            psn_b: 0xfffff0,
            rd_atomic: 16,
            sq_sig_all: false,
            selective_repeat: false,
        }
    }
}

/// Create a QP with its own CQs and a full-memory MR on a host.
pub fn make_qp(h: &mut Host, o: &Opts) -> QpEnd {
    let pd = h.ep.alloc_pd();
    let len = h.mem.bytes.len() as u64;
    let (lkey, rkey) = h.ep.reg_mr(pd, MEM_BASE, MEM_BASE, len, o.access).unwrap();
    make_qp_in(h, o, pd, (lkey, rkey), None)
}

/// Create a QP with its own CQs in an existing protection domain whose
/// full-memory MR has `keys`, optionally attached to a shared receive queue.
pub fn make_qp_in(h: &mut Host, o: &Opts, pd: PdId, keys: (u32, u32), srq: Option<u32>) -> QpEnd {
    let (lkey, rkey) = keys;
    let scq = h.ep.create_cq(4096).unwrap();
    let rcq = h.ep.create_cq(4096).unwrap();
    let qpn =
        h.ep.create_qp(QpInit {
            qp_type: o.qp_type,
            pd,
            send_cq: scq,
            recv_cq: rcq,
            srq,
            cap: o.cap,
            sq_sig_all: o.sq_sig_all,
        })
        .unwrap();
    QpEnd {
        node: h.id,
        qpn,
        pd,
        scq,
        rcq,
        lkey,
        rkey,
    }
}

/// Bring a QP through INIT, RTR, RTS towards `remote`.
pub fn connect(h: &mut Host, me: &QpEnd, remote: &QpEnd, sq_psn: u32, rq_psn: u32, o: &Opts) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        ..Default::default()
    };
    let init_mask = match o.qp_type {
        QpType::Ud => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        _ => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    };
    h.ep.modify_qp(me.qpn, &a, init_mask).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = o.rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.av.dgid = gid_of(remote.node);
    let rtr_mask = required_mask(QpState::Init, QpState::Rtr, o.qp_type).expect("INIT->RTR exists");
    h.ep.modify_qp(me.qpn, &a, rtr_mask).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.rd_atomic;
    let rts_mask = required_mask(QpState::Rtr, QpState::Rts, o.qp_type).expect("RTR->RTS exists");
    h.ep.modify_qp(me.qpn, &a, rts_mask).unwrap();
}

/// Two hosts with one connected QP pair.
pub fn pair(seed: u64, mem: usize, o: &Opts) -> (Sim<Host>, QpEnd, QpEnd) {
    pair_with(seed, mem, o, |_, _| {})
}

/// [`pair`], with `f` applied to each host's endpoint before its QP is made.
pub fn pair_with(
    seed: u64,
    mem: usize,
    o: &Opts,
    f: impl Fn(NodeId, &mut softrdma_core::Endpoint),
) -> (Sim<Host>, QpEnd, QpEnd) {
    pair_with_qps(seed, mem, o, f, |_, _| {})
}

/// [`pair_with`], with `g` applied to each host's endpoint and its QP once
/// the QP is made, before it is connected.
pub fn pair_with_qps(
    seed: u64,
    mem: usize,
    o: &Opts,
    f: impl Fn(NodeId, &mut softrdma_core::Endpoint),
    g: impl Fn(&mut softrdma_core::Endpoint, &QpEnd),
) -> (Sim<Host>, QpEnd, QpEnd) {
    let mut sim = Sim::new(seed);
    let a = sim.add_node(Host::new(0, mem, seed ^ 0xa));
    let b = sim.add_node(Host::new(1, mem, seed ^ 0xb));
    for n in [a, b] {
        sim.node_mut(n).ep.set_selective_repeat(o.selective_repeat);
        f(n, &mut sim.node_mut(n).ep);
    }
    let qa = make_qp(sim.node_mut(a), o);
    let qb = make_qp(sim.node_mut(b), o);
    g(&mut sim.node_mut(a).ep, &qa);
    g(&mut sim.node_mut(b).ep, &qb);
    connect(sim.node_mut(a), &qa, &qb, o.psn_a, o.psn_b, o);
    connect(sim.node_mut(b), &qb, &qa, o.psn_b, o.psn_a, o);
    (sim, qa, qb)
}

/// Fill memory with a pattern that differs per address and seed.
pub fn pattern(h: &mut Host, addr: u64, len: usize, seed: u8) {
    let s = h.mem.slice_mut(addr, len);
    for (i, b) in s.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8);
    }
}

// ---- Packet traces -------------------------------------------------------

/// One datagram as a test sees it: when and by whom it was sent, its decoded
/// headers, and whether a drop rule lost it.
#[derive(Debug, Clone)]
pub struct Pkt {
    pub t: u64,
    pub from: NodeId,
    pub to: NodeId,
    pub dropped: bool,
    /// The selective-repeat bit (offer, or acceptance) is set.
    pub sr: bool,
    pub repr: PacketRepr,
    pub payload: Vec<u8>,
}

/// Every datagram the hosts of a test sent, in the order they sent them.
pub type Trace = Rc<RefCell<Vec<Pkt>>>;

/// Give every host of `sim` one shared trace and return it.
pub fn trace(sim: &mut Sim<Host>, nodes: &[NodeId]) -> Trace {
    let t: Trace = Rc::new(RefCell::new(Vec::new()));
    for &n in nodes {
        sim.node_mut(n).trace = Some(t.clone());
    }
    t
}

/// The short name of an opcode: its IBA name without "RC" and "RDMA", e.g.
/// `WRITE_FIRST`, `READ_RESPONSE_LAST`, `ACKNOWLEDGE`, `UC_SEND_ONLY`.
pub fn op_name(op: softrdma_wire::Opcode) -> String {
    let n = op.name().replace("RDMA ", "");
    let n = n.strip_prefix("RC ").unwrap_or(&n);
    n.to_uppercase().replace(' ', "_")
}

/// An AETH syndrome as a trace line shows it.
pub fn syndrome_name(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { .. } => "ACK".into(),
        Syndrome::RnrNak { timer } => format!("RNR-NAK timer={timer}"),
        Syndrome::Nak(NakCode::PsnSequenceError) => "NAK-SEQ".into(),
        Syndrome::Nak(NakCode::InvalidRequest) => "NAK-INV-REQ".into(),
        Syndrome::Nak(NakCode::RemoteAccessError) => "NAK-ACCESS".into(),
        Syndrome::Nak(NakCode::RemoteOperationalError) => "NAK-OP".into(),
        Syndrome::Nak(c) => format!("NAK-{}", c.bits()),
        Syndrome::Reserved(b) => format!("RESERVED-{b:#x}"),
    }
}

impl Pkt {
    pub fn psn(&self) -> u32 {
        self.repr.bth.psn.value()
    }

    /// `A WRITE_FIRST 100`, `B ACKNOWLEDGE 103 [NAK-SEQ msn=0]`, with
    /// ` ackreq` when the AckReq bit is set and ` DROPPED` when a drop rule
    /// took it. Node 0 is `A`, node 1 is `B`.
    pub fn line(&self) -> String {
        let side = (b'A' + self.from as u8) as char;
        let mut s = format!("{side} {} {}", op_name(self.repr.bth.opcode), self.psn());
        if self.repr.bth.ack_req {
            s.push_str(" ackreq");
        }
        if let Some(a) = self.repr.ext.aeth {
            s.push_str(&format!(" [{} msn={}]", syndrome_name(a.kind()), a.msn));
        }
        if self.sr {
            s.push_str(" sr");
        }
        if self.dropped {
            s.push_str(" DROPPED");
        }
        s
    }
}

/// The trace as lines (see [`Pkt::line`]).
pub fn lines(t: &Trace) -> Vec<String> {
    t.borrow().iter().map(Pkt::line).collect()
}

/// A datagram as `from` would send it to `to`: `repr`'s headers, `payload`,
/// pad and a correct ICRC, for [`Sim::inject`].
pub fn forge(from: NodeId, to: NodeId, repr: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut buf, payload);
    let udp_len = (buf.len() + 8) as u16;
    let ip = icrc::ipv4_header(v4(&gid_of(from)), v4(&gid_of(to)), 0, true, udp_len);
    let udp = icrc::udp_header(4791, 4791, udp_len);
    icrc::fill(&ip, &udp, &mut buf);
    buf
}

/// A request packet to B's QP `qb` as A's QP would build it: `opcode` at
/// PSN `psn`, asking for an ACK if `ack_req`, with the extension headers
/// `ext` and `payload_len` bytes of payload (the pad rounds it to a word).
pub fn request(
    qb: &QpEnd,
    opcode: Opcode,
    psn: u32,
    ack_req: bool,
    ext: ExtRepr,
    payload_len: usize,
) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            opcode,
            solicited: false,
            migreq: false,
            pad: ((4 - payload_len % 4) % 4) as u8,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: qb.qpn,
            ack_req,
            psn: Psn::new(psn),
        },
        ext,
        payload_len,
    }
}

/// A READ request from A to B as A's QP would send it.
pub fn read_request(qb: &QpEnd, psn: u32, va: u64, rkey: u32, dma_len: u32) -> PacketRepr {
    let reth = Some(RethRepr { va, rkey, dma_len });
    let ext = ExtRepr {
        reth,
        ..Default::default()
    };
    request(qb, Opcode::RC_RDMA_READ_REQUEST, psn, true, ext, 0)
}

// ---- Completions ---------------------------------------------------------

/// (wr_id, status) of each completion, the part most assertions look at.
pub fn statuses(v: &[Completion]) -> Vec<(u64, WcStatus)> {
    v.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// The memory regions of a test are all of a host's memory, so every
/// `[addr, addr + len)` below is inside them.
pub fn region(base_mib: u64) -> u64 {
    MEM_BASE + (base_mib << 20)
}

pub const SEC: u64 = 1_000_000_000;
pub const US: u64 = 1_000;

// ---- Carrying packets by hand --------------------------------------------

impl Host {
    /// Up to `max` datagrams the host has to send now, for tests that carry
    /// packets by hand instead of through a simulated link (`usize::MAX`:
    /// all of them).
    pub fn take(&mut self, now: u64, max: usize) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; softrdma_netsim::MAX_DATAGRAM];
        let mut out = Vec::new();
        // A burst of no more than asked for: what is not taken is not built
        // (a test deregisters memory or delivers packets in between).
        let burst = self.burst;
        while out.len() < max {
            self.burst = burst.min(max - out.len());
            let Some((_, n)) = Node::poll_transmit(self, now, &mut buf) else {
                break;
            };
            out.push(buf[..n].to_vec());
        }
        self.burst = burst;
        out
    }

    /// Fire the host's timers due at `now`.
    pub fn handle_timeout_at(&mut self, now: u64) {
        self.sync();
        self.ep.handle_timeout(now);
    }

    /// Hand the host a datagram from node `from`.
    pub fn deliver(&mut self, now: u64, from: NodeId, bytes: &[u8]) {
        Node::handle_packet(self, now, from, bytes);
    }
}

/// The trace line (see [`Pkt::line`]) of a datagram sent by `from`.
pub fn describe(from: NodeId, bytes: &[u8]) -> String {
    let pkt = Packet::new_checked(bytes).unwrap();
    Pkt {
        t: 0,
        from,
        to: 1 - from,
        dropped: false,
        sr: pkt.bth().softrdma_sr(),
        repr: PacketRepr::parse(&pkt).unwrap(),
        payload: pkt.payload().to_vec(),
    }
    .line()
}

pub fn describe_all(from: NodeId, v: &[Vec<u8>]) -> Vec<String> {
    v.iter().map(|b| describe(from, b)).collect()
}
