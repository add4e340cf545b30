//! The endpoint: one soft RNIC's transport state — protection domains,
//! memory regions, completion queues, shared receive queues and queue pairs —
//! and the sans-IO surface an IO layer drives.

use std::collections::VecDeque;

use softrdma_wire::opcode::{Flags, Transport};
use softrdma_wire::{Packet, PacketRepr};

use crate::cc::CcConfig;
use crate::cq::{Armed, Cq, CqId, Pushed};
use crate::mr::{KeySource, Memory, MrTable, MwBind, MwId, MwType, PdId, Rereg, Span};
use crate::qp::attr::{AccessFlags, AttrLimits, AttrMask, Mtu, QpAttr};
use crate::qp::queue::{RecvQueue, RecvWqe, SendState, SendWqe};
use crate::qp::state::{check_modify, QpState, QpType};
use crate::qp::{Qp, QpCap, MAX_UNACKED_PSNS};
use crate::sched::{Before, Sched};
use crate::stats::Stats;
use crate::transmit::{Transmit, HEAD_ROOM};
use crate::wc::Completion;
use crate::wr::{RecvWr, SendOp, SendWr};
use crate::{Error, Nanos, MAX_INLINE, MAX_MSG_SIZE, MAX_SGE};

/// Asynchronous events (`ibv_get_async_event`) and completion notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An armed CQ got a completion: signal its completion channel.
    CompNotify(CqId),
    /// A CQ overflowed: it lost a completion and is in the error state
    /// (`IBV_EVENT_CQ_ERR`, raised once per CQ).
    CqErr(CqId),
    /// The responder saw an invalid request and moved the QP to ERR
    /// (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr(u32),
    /// The responder saw an access violation (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr(u32),
    /// The QP entered ERR because a work request could not be completed
    /// (`IBV_EVENT_QP_FATAL`): a receive WQE whose buffer's region was
    /// deregistered, or a completion into a CQ in the error state.
    QpFatal(u32),
    /// A QP attached to an SRQ entered ERR (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached(u32),
    /// A QP moved to SQD with `en_sqd_async_notify` has no request in
    /// flight any more (`IBV_EVENT_SQ_DRAINED`, once per entry to SQD).
    SqDrained(u32),
}

/// How an endpoint is set up.
#[derive(Debug)]
pub struct EndpointConfig {
    /// Where memory keys come from (the core reads no randomness of its
    /// own): the real stack passes the operating system's CSPRNG; the
    /// default is a fixed seed, deterministic and so only for tests.
    pub key_source: KeySource,
    /// QP numbers are `qpn_base + index`; several processes sharing one
    /// address pick disjoint ranges (the verbs layer gives each 64K), and
    /// `qpn_base + max_qp` must stay within the 24-bit QPN space.
    pub qpn_base: u32,
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_qp_wr: u32,
    /// `max_qp_rd_atom` / `max_qp_init_rd_atom`.
    pub max_rd_atom: u8,
    pub port_mtu: Mtu,
    pub max_events: usize,
    /// Most unacknowledged bytes towards one destination GID across all
    /// its RC QPs (counted as [`crate::gate`] says), so that a sender with
    /// many QPs cannot overrun its receiver's socket buffer. A larger value
    /// keeps more in flight on a long path; a smaller one protects a
    /// smaller receive buffer. `u64::MAX` turns it off. At least 1 (one
    /// packet in flight at a time): 0 would hold every RC QP forever, and
    /// [`EndpointConfig::validate`] refuses it.
    pub max_inflight_per_dest: u64,
    /// Bytes a ready QP sends per turn of the scheduler's round robin. A
    /// larger quantum gives longer runs from one QP (longer GSO trains,
    /// fewer list rotations); a smaller one interleaves QPs more finely, so
    /// a short message waits less behind long ones.
    pub sched_quantum: u32,
    /// Congestion control of every RC/UC QP created (`set_qp_cc` changes
    /// one), and the line rate its reaction point starts at and returns to.
    pub cc: CcConfig,
    pub line_rate: u64,
    /// Offer selective repeat on every RC QP, and accept it from peers that
    /// offer it (see `qp::reorder`; negotiated per QP and direction in the
    /// first packets, so a peer that speaks only go-back-N — rxe, an RNIC —
    /// sees go-back-N).
    pub selective_repeat: bool,
    /// Out-of-order request packets the endpoint holds at most, over all
    /// its QPs (each buffer about 4 KiB, allocated as the high-water mark
    /// grows). Beyond it an out-of-order packet is dropped and resent.
    pub reorder_slots: u32,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            key_source: KeySource::default(),
            qpn_base: 0x11,
            max_qp: 16384,
            max_cq: 1024,
            // mlx5's: libfabric's rxm asks for 262144-entry CQs and does
            // not clamp to the device. A CQ's ring grows as completions
            // queue (see `Cq::new`), so a deep CQ costs nothing until used.
            max_cqe: (1 << 22) - 1,
            max_qp_wr: 1 << 14,
            // rxe's max_qp_rd_atom: perftest makes the peer's advertised
            // out_reads our RTS max_rd_atomic without clamping it, so a
            // smaller limit here fails read and atomic tests against rxe.
            max_rd_atom: 128,
            port_mtu: Mtu::B4096,
            max_events: 4096,
            // What a receiver's UDP socket buffer holds: the UDP backend
            // asks for 8 MiB, and the kernel charges a 4 KiB datagram about
            // twice its length, so 4 MiB of packets fit with room to spare.
            max_inflight_per_dest: 4 << 20,
            // Four 4 KiB packets: runs long enough for GSO to batch, short
            // enough that 100 busy QPs delay a small message by 1.6 MB of
            // wire time, not a whole message each.
            sched_quantum: 16 << 10,
            cc: CcConfig::None,
            line_rate: 100_000_000_000,
            selective_repeat: true,
            // Four windows of 256 packets: a few QPs repairing losses at
            // once, 4.3 MB at most.
            reorder_slots: 1024,
        }
    }
}

impl EndpointConfig {
    /// Refuse a configuration the endpoint could not run with, naming the
    /// field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_inflight_per_dest == 0 {
            return Err(Error::InvalidArgument(
                "EndpointConfig::max_inflight_per_dest is 0, which no RC QP could ever send \
                 under; it must be at least 1 (u64::MAX turns the budget off)",
            ));
        }
        Ok(())
    }
}

/// The CQ of a QP that has none (an XRC target): no slot, so nothing is
/// ever completed to it.
const NO_CQ: CqId = CqId(u32::MAX);

/// Everything `create_qp` needs (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<u32>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
}

/// What the IO layer knows about a received datagram beyond its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxMeta {
    /// Source and destination GIDs (IPv6, or IPv4-mapped `::ffff:a.b.c.d`).
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub traffic_class: u8,
    pub hop_limit: u8,
}

impl RxMeta {
    fn is_v4(g: &[u8; 16]) -> bool {
        g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
    }

    /// Whether the packet came over IPv4 (its source GID is IPv4-mapped).
    pub(crate) fn over_ipv4(&self) -> bool {
        Self::is_v4(&self.sgid)
    }

    /// The 40-byte GRH a UD receive buffer starts with: for RoCEv2 over
    /// IPv4, 20 undefined (zero) bytes then the IPv4 header; over IPv6, the
    /// IPv6 header. `roce_len` is the UDP payload length.
    pub fn grh(&self, roce_len: usize) -> [u8; 40] {
        let mut g = [0u8; 40];
        let udp_len = (roce_len + 8) as u16;
        if Self::is_v4(&self.sgid) {
            let mut ip = softrdma_wire::frame::Ipv4Repr {
                tos: self.traffic_class,
                total_len: udp_len + 20,
                ident: 0,
                flags_frag: softrdma_wire::frame::Ipv4Repr::DF,
                ttl: self.hop_limit,
                protocol: softrdma_wire::frame::IPPROTO_UDP,
                checksum: 0,
                src: self.sgid[12..].try_into().expect("4 bytes"),
                dst: self.dgid[12..].try_into().expect("4 bytes"),
            };
            ip.checksum = ip.compute_checksum();
            ip.emit(&mut g[20..]);
        } else {
            softrdma_wire::frame::Ipv6Repr {
                traffic_class: self.traffic_class,
                flow_label: 0,
                payload_len: udp_len,
                next_header: softrdma_wire::frame::IPPROTO_UDP,
                hop_limit: self.hop_limit,
                src: self.sgid,
                dst: self.dgid,
            }
            .emit(&mut g);
        }
        g
    }
}

/// One shared receive queue: its PD and receives, and for an XRC SRQ its
/// domain and the CQ its receive completions go to (an XRC target QP has
/// neither PD nor CQ of its own).
#[derive(Debug)]
pub(crate) struct SrqSlot {
    pub pd: PdId,
    pub q: RecvQueue,
    pub xrc: Option<XrcSrq>,
}

/// What makes an SRQ an XRC SRQ (`IBV_SRQT_XRC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XrcSrq {
    pub xrcd: u32,
    pub cq: CqId,
}

/// The resources QPs share; handed to a QP's pieces as their context.
#[derive(Debug)]
pub(crate) struct Shared {
    pub mrs: MrTable,
    pub cqs: Vec<Option<Cq>>,
    pub srqs: Vec<Option<SrqSlot>>,
    pub stats: Stats,
    pub events: VecDeque<Event>,
    pub max_events: usize,
    /// QPs that lost a completion to a CQ in the error state and still have
    /// to be moved to ERR (done by the endpoint, which owns the QPs: see
    /// `Endpoint::fail_qps_of_dead_cqs`). At most one entry per QP.
    pub fatal: Vec<u32>,
    /// QPs whose state changed since [`Endpoint::take_state_changes`] last
    /// ran, kept only once someone asked for them.
    pub state_changes: Option<Vec<u32>>,
    /// Bumped by every QP state change, recorded or not: a layer that
    /// caches "this QP is in RTS" outside the endpoint compares it.
    pub state_epoch: u64,
    /// Selective repeat is offered and accepted (`EndpointConfig`).
    pub sr: bool,
    /// Out-of-order requests held, for every QP.
    pub reorder: crate::qp::reorder::ReorderPool,
}

impl Shared {
    pub fn state_changed(&mut self, qpn: u32) {
        self.state_epoch = self.state_epoch.wrapping_add(1);
        if let Some(v) = self.state_changes.as_mut() {
            if !v.contains(&qpn) {
                v.push(qpn);
            }
        }
    }
}

/// What a QP's requester, completer and responder may touch besides the QP.
pub(crate) type Ctx<'a> = Shared;

impl Shared {
    /// Deliver a completion to a CQ, raising the notification or overflow
    /// event it calls for; a completion the CQ cannot take condemns its QP
    /// (see `cq`).
    pub fn complete(&mut self, cq: CqId, c: Completion, solicited: bool) {
        let Some(Some(q)) = self.cqs.get_mut(cq.0 as usize) else {
            return;
        };
        match q.push(c, solicited) {
            Pushed::Queued { notify: true } => self.push_event(Event::CompNotify(cq)),
            Pushed::Queued { notify: false } => {}
            Pushed::Lost { overflow } => {
                self.stats.cq_overflows += 1;
                if overflow {
                    self.push_event(Event::CqErr(cq));
                }
                if !self.fatal.contains(&c.qp_num) {
                    self.fatal.push(c.qp_num);
                }
            }
        }
    }

    /// A request the offload carried out: counted, and completed
    /// successfully into the QP's send CQ if it was signaled.
    fn complete_offloaded(
        &mut self,
        qp: &Qp,
        wr_id: u64,
        op: &SendOp,
        byte_len: u32,
        signaled: bool,
    ) {
        self.stats.offloaded += 1;
        if signaled {
            let mut c = Completion::new(
                wr_id,
                crate::wc::WcStatus::Success,
                crate::qp::wc_opcode_of(op),
                qp.qpn,
            );
            c.byte_len = byte_len;
            self.complete(qp.send_cq, c, false);
        }
    }

    pub fn push_event(&mut self, e: Event) {
        if self.events.contains(&e) {
            return; // an undelivered identical event says it already
        }
        if self.events.len() < self.max_events {
            self.events.push_back(e);
        }
    }

    pub fn srq_pop(&mut self, srq: u32, out: &mut [Span; MAX_SGE]) -> Option<RecvWqe> {
        self.srqs.get_mut(srq as usize)?.as_mut()?.q.pop(out)
    }
}

/// The local buffer of a work request offered to an [`Offload`].
#[derive(Debug, Clone, Copy)]
pub enum OffloadLocal<'a> {
    /// The scatter/gather list as host addresses and lengths, translated
    /// through the region table during this call (for a READ or atomic,
    /// where the result goes; checked for `LOCAL_WRITE`). No entry is
    /// empty.
    Host(&'a [(u64, u32)]),
    /// An inline WRITE's bytes, copied at post.
    Inline(&'a [u8]),
}

impl OffloadLocal<'_> {
    /// The bytes it names, in all.
    pub fn bytes(&self) -> u64 {
        match *self {
            OffloadLocal::Host(h) => h.iter().map(|&(_, l)| l as u64).sum(),
            OffloadLocal::Inline(b) => b.len() as u64,
        }
    }
}

/// A connection that can carry out one-sided operations itself, at post,
/// instead of sending them: the shared-memory transport reaching a peer
/// process's registered memory directly, as an RNIC's loopback would. The
/// core keeps every semantic it does not judge: what the offload refuses
/// goes on the wire as usual.
pub trait Offload {
    /// Carry out `op` (an RDMA WRITE, READ, atomic or ATOMIC WRITE; or a
    /// SEND, with or without immediate, or an RDMA WRITE with immediate,
    /// into a receive the peer has made reachable) with `local` as its data
    /// or result buffer. Return true if it was carried out completely and
    /// successfully; false if it was not touched at all — or, for a WRITE
    /// with immediate, if its receive was not filled: its bytes may be in
    /// place already, and the message sent instead places the same bytes
    /// again (as a retransmission does).
    fn one_sided(&mut self, op: &SendOp, local: OffloadLocal<'_>) -> bool;

    /// Whether `op` would be carried out if nothing of its QP's were still
    /// on its way to the responder — or will be once a passing cause is
    /// gone (a SEND: the peer's receives behind, not missing): the
    /// offload's own judgement, without touching anything. The core starts
    /// holding requests back behind ones on the wire, to carry them out
    /// here once those complete (see [`Endpoint::offload_held`]), only for
    /// a request this says yes to; and when one it holds is refused, the
    /// rest go on waiting only if this says yes to it. Requests posted
    /// while a hold lasts are held whatever it says (they may not pass
    /// the ones held before them).
    /// `len` is the request's length in bytes.
    fn would_carry(&mut self, op: &SendOp, len: u64) -> bool {
        let _ = (op, len);
        true
    }
}

/// When a receive's scatter/gather entries are checked against the region
/// table (key, PD, bounds, `LOCAL_WRITE`). Either way every byte placed is
/// translated through the table when it is written, so neither can reach
/// memory that is not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvCheck {
    /// When posted: a bad SGE fails the post with an error naming it.
    AtPost,
    /// When a message needs them, as an RNIC reads its receive WQEs (rxe
    /// and mlx5 check nothing at post): a bad SGE is queued, the receive
    /// that has to place bytes in it completes `LOC_PROT_ERR`, and an RC
    /// sender gets `REM_OP_ERR`. What the C ABI's `ibv_post_recv` does.
    Deferred,
}

/// One soft RNIC's transport.
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    qps: Vec<Option<Qp>>,
    shared: Shared,
    next_pd: u32,
    /// The next XRC domain number (0 is none).
    next_xrcd: u32,
    /// Which QP sends next, and when a waiting one may again.
    sched: Sched,
    /// UD QPs attached to multicast groups.
    mcast: crate::mcast::McastTable,
    /// QPs holding requests back for an offload (`Qp::offload_hold`),
    /// listed once per hold (`Qp::hold_listed`); one that no longer does leaves at
    /// the next [`Endpoint::offload_held`].
    holding: Vec<u32>,
}

impl Endpoint {
    /// An endpoint with `cfg`, or the error [`EndpointConfig::validate`]
    /// finds in it.
    pub fn try_new(cfg: EndpointConfig) -> Result<Endpoint, Error> {
        cfg.validate()?;
        Ok(Endpoint::new(cfg))
    }

    /// An endpoint with `cfg`.
    ///
    /// # Panics
    ///
    /// If [`EndpointConfig::validate`] refuses `cfg` (with its message;
    /// [`Endpoint::try_new`] returns it instead).
    pub fn new(mut cfg: EndpointConfig) -> Endpoint {
        if let Err(e) = cfg.validate() {
            panic!("{e}");
        }
        let keys = std::mem::take(&mut cfg.key_source);
        Endpoint {
            shared: Shared {
                mrs: MrTable::new(keys),
                cqs: Vec::new(),
                srqs: Vec::new(),
                stats: Stats::default(),
                events: VecDeque::with_capacity(cfg.max_events.min(1024)),
                max_events: cfg.max_events,
                fatal: Vec::new(),
                state_changes: None,
                state_epoch: 0,
                sr: cfg.selective_repeat,
                reorder: crate::qp::reorder::ReorderPool::new(cfg.reorder_slots as usize),
            },
            qps: Vec::new(),
            next_pd: 1,
            next_xrcd: 1,
            sched: Sched::new(cfg.sched_quantum, cfg.max_inflight_per_dest),
            mcast: Default::default(),
            holding: Vec::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Offer and accept selective repeat on QPs that reach RTS from now on
    /// (`EndpointConfig::selective_repeat`).
    pub fn set_selective_repeat(&mut self, on: bool) {
        self.cfg.selective_repeat = on;
        self.shared.sr = on;
    }

    /// Out-of-order requests selective repeat holds now, over all QPs.
    pub fn held_packets(&self) -> usize {
        self.shared.reorder.in_use()
    }

    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// Register `len` bytes at `host_addr`, visible remotely at `iova`.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        host_addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(u32, u32), Error> {
        self.shared.mrs.register(pd, iova, host_addr, len, access)
    }

    /// Register an implicit on-demand region of `pd`: the owner's whole
    /// address space at iova = host address, every access to it
    /// [checked](crate::mr::Mr::checked) (an address not mapped, or not
    /// writable, ends the access with IBA's access error instead of a
    /// fault).
    pub fn reg_mr_implicit(&mut self, pd: PdId, access: AccessFlags) -> Result<(u32, u32), Error> {
        self.shared.mrs.register_implicit(pd, access)
    }

    /// Deregister a region. When this returns, nothing the endpoint does
    /// afterwards reads or writes the region's memory: work in flight that
    /// names it fails instead (a remote access NAK for a peer's WRITE or
    /// READ, a local protection error for our own work requests). Payload
    /// segments of a [`Transmit`] returned *before* this call may still
    /// point into it, until the caller has sent them.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), Error> {
        self.shared.mrs.deregister(lkey).map(|_| ())
    }

    /// `ibv_rereg_mr`: change a region's PD, access or translation in
    /// place, keeping its keys (see `mr::rereg`). As with `dereg_mr`, once
    /// this returns nothing posted or begun before it reaches memory
    /// through the old registration: that work fails as if the region had
    /// been deregistered.
    pub fn rereg_mr(&mut self, lkey: u32, change: &Rereg) -> Result<(), Error> {
        self.shared.mrs.reregister(lkey, change).map(|_| ())
    }

    pub fn mrs(&self) -> &MrTable {
        &self.shared.mrs
    }

    /// `ibv_alloc_mw`: a memory window in `pd`; returns its handle (stable
    /// whatever binds do to the rkey) and its first rkey.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> Result<(MwId, u32), Error> {
        self.shared.mrs.alloc_mw(pd, kind)
    }

    /// `ibv_dealloc_mw`. Like deregistration, nothing in flight reaches
    /// memory through the window afterwards.
    pub fn dealloc_mw(&mut self, mw: MwId) -> Result<(), Error> {
        self.shared.mrs.dealloc_mw(mw)
    }

    /// `ibv_bind_mw` for a type-1 window: posts the bind work request on
    /// `qpn` (the window's rkey moves on by one in its low 8 bits, as
    /// `ibv_inc_rkey` does) and returns the rkey the window will have once
    /// it executes. `bind.mw_rkey` is the window's current rkey (the bind
    /// fails with `MW_BIND_ERR` if the window no longer has it when it
    /// executes); `bind.new_rkey` is ignored. A type-2 window is bound by
    /// posting [`SendOp::BindMw`] instead.
    pub fn bind_mw(
        &mut self,
        qpn: u32,
        wr_id: u64,
        bind: MwBind,
        flags: crate::wr::SendFlags,
        mem: &impl Memory,
    ) -> Result<u32, Error> {
        match self.shared.mrs.get_mw(MwId::of_rkey(bind.mw_rkey)) {
            Some(w) if w.kind == MwType::Type1 => {}
            Some(_) => {
                return Err(Error::InvalidArgument(
                    "ibv_bind_mw binds type-1 windows; bind a type-2 window with a BIND_MW work request",
                ))
            }
            None => return Err(Error::InvalidArgument("no memory window has this rkey")),
        }
        let r = bind.mw_rkey;
        let new_rkey = (r & !0xff) | (r.wrapping_add(1) & 0xff);
        let wr = SendWr {
            wr_id,
            op: SendOp::BindMw(MwBind { new_rkey, ..bind }),
            sgl: &[],
            flags,
            ud: None,
        };
        self.post_send(qpn, &wr, mem)?;
        Ok(new_rkey)
    }

    pub fn create_cq(&mut self, depth: u32) -> Result<CqId, Error> {
        if depth == 0 || depth > self.cfg.max_cqe {
            return Err(Error::InvalidArgument("CQ depth must be 1..=max_cqe"));
        }
        let slot = match self.shared.cqs.iter().position(|c| c.is_none()) {
            Some(i) => i,
            None if self.shared.cqs.len() < self.cfg.max_cq as usize => {
                self.shared.cqs.push(None);
                self.shared.cqs.len() - 1
            }
            None => return Err(Error::OutOfResources("completion queues")),
        };
        self.shared.cqs[slot] = Some(Cq::new(depth as usize));
        Ok(CqId(slot as u32))
    }

    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), Error> {
        let c = self.cq_mut(cq)?;
        if c.users > 0 {
            return Err(Error::Busy("completion queue"));
        }
        self.shared.cqs[cq.0 as usize] = None;
        Ok(())
    }

    fn cq_mut(&mut self, cq: CqId) -> Result<&mut Cq, Error> {
        self.shared
            .cqs
            .get_mut(cq.0 as usize)
            .and_then(|c| c.as_mut())
            .ok_or(Error::NoSuchCq(cq.0))
    }

    /// Move up to `out.len()` completions out of a CQ; returns how many.
    /// A CQ in the error state (it overflowed) still gives up what it held
    /// before; once empty it fails with [`Error::CqOverflowed`].
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> Result<usize, Error> {
        let c = self.cq_mut(cq)?;
        if c.error && c.ring.is_empty() && !out.is_empty() {
            return Err(Error::CqOverflowed(cq.0));
        }
        let n = out.len().min(c.ring.len());
        for (slot, wc) in out.iter_mut().zip(c.ring.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    /// `ibv_resize_cq`: change a CQ's depth, keeping its completions. The
    /// new depth must hold the completions queued now; a CQ in the error
    /// state cannot be resized (only destroyed).
    pub fn resize_cq(&mut self, cq: CqId, depth: u32) -> Result<(), Error> {
        if depth == 0 || depth > self.cfg.max_cqe {
            return Err(Error::InvalidArgument("CQ depth must be 1..=max_cqe"));
        }
        let c = self.cq_mut(cq)?;
        if c.error {
            return Err(Error::CqOverflowed(cq.0));
        }
        if (depth as usize) < c.ring.len() {
            return Err(Error::CqTooSmall {
                depth,
                queued: c.ring.len(),
            });
        }
        c.resize(depth as usize);
        Ok(())
    }

    /// The depth of a CQ (what `ibv_create_cq`/`ibv_resize_cq` return in
    /// `cq->cqe`).
    /// Whether the CQ is armed (`req_notify_cq` since its last event): its
    /// application is about to sleep on the completion channel.
    pub fn cq_armed(&self, cq: CqId) -> Result<bool, Error> {
        self.shared
            .cqs
            .get(cq.0 as usize)
            .and_then(|c| c.as_ref())
            .map(|c| !matches!(c.armed, crate::cq::Armed::No))
            .ok_or(Error::NoSuchCq(cq.0))
    }

    /// For a CQ that is neither armed nor in the error state: how many more
    /// completions it can take before it overflows, and whether it is
    /// empty. A layer that queues completions outside the endpoint for a
    /// while (the verbs layer's lanes) does so only for such a CQ, at most
    /// that many, and hands them back with [`Endpoint::complete_external`]
    /// before anything else completes into it.
    pub fn cq_room(&self, cq: CqId) -> Option<(usize, bool)> {
        let c = self.shared.cqs.get(cq.0 as usize)?.as_ref()?;
        (!c.error && matches!(c.armed, crate::cq::Armed::No))
            .then(|| (c.depth.saturating_sub(c.ring.len()), c.ring.is_empty()))
    }

    /// Deliver a completion produced outside the endpoint (see
    /// [`Endpoint::cq_room`]), as the endpoint delivers its own: queued,
    /// or, on a full CQ, lost with the CQ's overflow and the QP's error.
    pub fn complete_external(&mut self, cq: CqId, c: Completion) {
        self.shared.complete(cq, c, false);
    }

    pub fn cq_depth(&self, cq: CqId) -> Result<u32, Error> {
        self.shared
            .cqs
            .get(cq.0 as usize)
            .and_then(|c| c.as_ref())
            .map(|c| c.depth as u32)
            .ok_or(Error::NoSuchCq(cq.0))
    }

    /// Move every QP that lost a completion to a CQ in the error state to
    /// ERR, raising `QpFatal` for it. Called on every path that can create
    /// completions, before the QP could send or complete anything more.
    fn fail_qps_of_dead_cqs(&mut self) {
        while let Some(qpn) = self.shared.fatal.pop() {
            let Some(s) = self.slot(qpn) else {
                continue; // destroyed meanwhile
            };
            let qp = self.qps[s].as_mut().expect("slot checked");
            if matches!(qp.state, QpState::Err | QpState::Reset) {
                continue;
            }
            // Its flush completions are lost too (the CQ takes none), and
            // queue this QP again; it is in ERR by then and skipped.
            qp.enter_error(&mut self.shared);
            self.shared.push_event(Event::QpFatal(qpn));
            let now = self.sched.now;
            self.sched.sync(s, qp, now, None);
            self.sched.settle_timers(&self.qps);
        }
    }

    /// Arm a CQ's notification (`ibv_req_notify_cq`): the next completion
    /// added to it (with `solicited_only`, the next solicited or
    /// unsuccessful one) raises [`Event::CompNotify`] once. Completions
    /// already waiting raise nothing, as in verbs: arm, then poll again.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), Error> {
        let c = self.cq_mut(cq)?;
        c.armed = if solicited_only {
            Armed::Solicited
        } else {
            Armed::Any
        };
        Ok(())
    }

    pub fn create_srq(&mut self, pd: PdId, depth: u32, max_sge: u32) -> Result<u32, Error> {
        self.create_srq_slot(pd, depth, max_sge, None)
    }

    /// `ibv_open_xrcd`: a new XRC domain. XRC SRQs and XRC target QPs are
    /// created in one; a target QP delivers only to SRQs of its domain.
    pub fn alloc_xrcd(&mut self) -> u32 {
        let x = self.next_xrcd;
        self.next_xrcd += 1;
        x
    }

    /// `ibv_close_xrcd`: refused (`Busy`) while an XRC SRQ or target QP
    /// of the domain exists.
    pub fn dealloc_xrcd(&mut self, xrcd: u32) -> Result<(), Error> {
        let srq = self
            .shared
            .srqs
            .iter()
            .flatten()
            .any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd));
        let qp = self.qps.iter().flatten().any(|q| q.xrcd == Some(xrcd));
        if srq || qp {
            return Err(Error::Busy(
                "XRC domain (it still has XRC SRQs or target QPs)",
            ));
        }
        Ok(())
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of XRC domain
    /// `xrcd`, its receives checked against `pd` and completed on `cq`.
    /// Its number (`ibv_get_srq_num`) is the one returned: what an XRC
    /// sender puts in the XRCETH.
    pub fn create_xrc_srq(
        &mut self,
        pd: PdId,
        xrcd: u32,
        cq: CqId,
        depth: u32,
        max_sge: u32,
    ) -> Result<u32, Error> {
        if xrcd == 0 || xrcd >= self.next_xrcd {
            return Err(Error::InvalidArgument(
                "XRC SRQ of an XRC domain this device never opened",
            ));
        }
        self.cq_mut(cq)?;
        let srq = self.create_srq_slot(pd, depth, max_sge, Some(XrcSrq { xrcd, cq }))?;
        self.cq_mut(cq)?.users += 1;
        Ok(srq)
    }

    fn create_srq_slot(
        &mut self,
        pd: PdId,
        depth: u32,
        max_sge: u32,
        xrc: Option<XrcSrq>,
    ) -> Result<u32, Error> {
        if depth == 0 || depth > self.cfg.max_qp_wr || max_sge == 0 || max_sge as usize > MAX_SGE {
            return Err(Error::InvalidArgument("SRQ depth or max_sge out of range"));
        }
        if self.shared.srqs.len() >= 1 << 24 && !self.shared.srqs.iter().any(|s| s.is_none()) {
            return Err(Error::OutOfResources("SRQ numbers (24 bits)"));
        }
        let slot = self
            .shared
            .srqs
            .iter()
            .position(|s| s.is_none())
            .unwrap_or_else(|| {
                self.shared.srqs.push(None);
                self.shared.srqs.len() - 1
            });
        self.shared.srqs[slot] = Some(SrqSlot {
            pd,
            q: RecvQueue::new(depth, max_sge),
            xrc,
        });
        Ok(slot as u32)
    }

    pub fn destroy_srq(&mut self, srq: u32) -> Result<(), Error> {
        // XRC target QPs name no SRQ of their own (each request names
        // one), so they never hold an SRQ: a request for a destroyed XRC
        // SRQ is refused with an invalid request NAK.
        if self.qps.iter().flatten().any(|q| q.srq == Some(srq)) {
            return Err(Error::Busy("shared receive queue"));
        }
        match self.shared.srqs.get_mut(srq as usize) {
            Some(s @ Some(_)) => {
                if let Some(x) = s.as_ref().and_then(|s| s.xrc) {
                    if let Some(Some(c)) = self.shared.cqs.get_mut(x.cq.0 as usize) {
                        c.users = c.users.saturating_sub(1);
                    }
                }
                *s = None;
                Ok(())
            }
            _ => Err(Error::NoSuchSrq(srq)),
        }
    }

    fn translate_recv(
        &self,
        pd: PdId,
        wr: &RecvWr<'_>,
        max_sge: u32,
        check: RecvCheck,
        out: &mut [Span; MAX_SGE],
    ) -> Result<usize, Error> {
        if wr.sgl.len() > max_sge as usize {
            return Err(Error::TooManySge {
                got: wr.sgl.len(),
                max: max_sge,
            });
        }
        for (o, s) in out.iter_mut().zip(wr.sgl) {
            let r = self.shared.mrs.resolve_local(
                pd,
                s.lkey,
                s.addr,
                s.length,
                AccessFlags::LOCAL_WRITE,
            );
            *o = match (r, check) {
                (Ok(span), _) => span,
                // A reference to no registration: every access of its bytes
                // fails, as one to a deregistered region does.
                (Err(_), RecvCheck::Deferred) => Span {
                    len: s.length,
                    ..Span::default()
                },
                (Err(_), RecvCheck::AtPost) => {
                    return Err(Error::InvalidArgument(
                        "receive SGE not covered by a local-writable MR of the QP's PD",
                    ))
                }
            };
        }
        Ok(wr.sgl.len())
    }

    /// `ibv_post_srq_recv`, its SGEs checked at post ([`RecvCheck::AtPost`]).
    pub fn post_srq_recv(&mut self, srq: u32, wr: &RecvWr<'_>) -> Result<(), Error> {
        self.post_srq_recv_with(srq, wr, RecvCheck::AtPost)
    }

    /// `ibv_post_srq_recv` with the SGE checks `check` says.
    pub fn post_srq_recv_with(
        &mut self,
        srq: u32,
        wr: &RecvWr<'_>,
        check: RecvCheck,
    ) -> Result<(), Error> {
        let (pd, max_sge, full, depth) = match self.shared.srqs.get(srq as usize) {
            Some(Some(SrqSlot { pd, q, .. })) => (*pd, q.max_sge, q.is_full(), q.depth),
            _ => return Err(Error::NoSuchSrq(srq)),
        };
        if full {
            return Err(Error::QueueFull {
                queue: "shared receive queue",
                depth,
            });
        }
        let mut segs = [Span::default(); MAX_SGE];
        let n = self.translate_recv(pd, wr, max_sge, check, &mut segs)?;
        self.shared.srqs[srq as usize]
            .as_mut()
            .expect("checked")
            .q
            .push(wr.wr_id, &segs[..n]);
        Ok(())
    }

    pub fn create_qp(&mut self, init: QpInit) -> Result<u32, Error> {
        match init.qp_type {
            QpType::XrcRecv => Err(Error::InvalidArgument(
                "an XRC_RECV (target) QP belongs to an XRC domain: create it with create_xrc_tgt_qp",
            )),
            QpType::XrcSend if init.srq.is_some() || init.cap.max_recv_wr > 0 => {
                Err(Error::InvalidArgument(
                    "an XRC_SEND (initiator) QP has no receive queue: no SRQ, max_recv_wr 0",
                ))
            }
            _ => self.create_qp_in(init, None),
        }
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: an XRC target QP of
    /// domain `xrcd`. It has no send or receive queue, PD or CQ: each
    /// request it takes names an XRC SRQ of `xrcd`, whose PD checks the
    /// memory it reaches and whose CQ gets its receive completions.
    pub fn create_xrc_tgt_qp(&mut self, xrcd: u32) -> Result<u32, Error> {
        if xrcd == 0 || xrcd >= self.next_xrcd {
            return Err(Error::InvalidArgument(
                "XRC target QP of an XRC domain this device never opened",
            ));
        }
        let init = QpInit {
            qp_type: QpType::XrcRecv,
            pd: PdId(0),
            send_cq: NO_CQ,
            recv_cq: NO_CQ,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        self.create_qp_in(init, Some(xrcd))
    }

    fn create_qp_in(&mut self, init: QpInit, xrcd: Option<u32>) -> Result<u32, Error> {
        let c = init.cap;
        if c.max_send_wr == 0
            || c.max_send_wr > self.cfg.max_qp_wr
            || c.max_recv_wr > self.cfg.max_qp_wr
        {
            return Err(Error::InvalidArgument(
                "max_send_wr/max_recv_wr out of range",
            ));
        }
        if c.max_send_sge as usize > MAX_SGE || c.max_recv_sge as usize > MAX_SGE {
            return Err(Error::TooManySge {
                got: c.max_send_sge.max(c.max_recv_sge) as usize,
                max: MAX_SGE as u32,
            });
        }
        if c.max_inline_data as usize > MAX_INLINE {
            return Err(Error::InlineTooLong {
                got: c.max_inline_data as usize,
                max: MAX_INLINE as u32,
            });
        }
        let has_cqs = xrcd.is_none();
        if has_cqs {
            self.cq_mut(init.send_cq)?;
            self.cq_mut(init.recv_cq)?;
        }
        if let Some(s) = init.srq {
            if !matches!(self.shared.srqs.get(s as usize), Some(Some(_))) {
                return Err(Error::NoSuchSrq(s));
            }
        }
        let slot = match self.qps.iter().position(|q| q.is_none()) {
            Some(i) => i,
            None if self.qps.len() < self.cfg.max_qp as usize => {
                self.qps.push(None);
                self.qps.len() - 1
            }
            None => return Err(Error::OutOfResources("queue pairs")),
        };
        let qpn = self.cfg.qpn_base + slot as u32;
        if qpn >= 1 << 24 {
            return Err(Error::OutOfResources(
                "QP numbers: qpn_base + max_qp passes the 24-bit QPN space",
            ));
        }
        let mut qp = Qp::new(qpn, &init);
        qp.xrcd = xrcd;
        if init.qp_type == QpType::Ud {
            qp.attr.path_mtu = self.cfg.port_mtu;
        }
        if has_cqs {
            self.cq_mut(init.send_cq)?.users += 1;
            self.cq_mut(init.recv_cq)?.users += 1;
        }
        self.qps[slot] = Some(qp);
        self.sched.on_create(slot);
        if init.qp_type != QpType::Ud && self.cfg.cc != CcConfig::None {
            self.sched
                .set_cc(slot, &self.cfg.cc, self.cfg.line_rate.max(1));
        }
        Ok(qpn)
    }

    fn slot(&self, qpn: u32) -> Option<usize> {
        let s = qpn.checked_sub(self.cfg.qpn_base)? as usize;
        (s < self.qps.len() && self.qps[s].is_some()).then_some(s)
    }

    pub fn qp(&self, qpn: u32) -> Result<&Qp, Error> {
        self.slot(qpn)
            .and_then(|s| self.qps[s].as_ref())
            .ok_or(Error::NoSuchQp(qpn))
    }

    /// `ibv_modify_qp`: check the transition and the values, then apply.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<(), Error> {
        let limits = AttrLimits {
            max_qp_rd_atom: self.cfg.max_rd_atom,
            max_qp_init_rd_atom: self.cfg.max_rd_atom,
            active_mtu: self.cfg.port_mtu,
            gid_table_len: 16,
        };
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        let qp = self.qps[s].as_mut().expect("slot checked");
        let next = check_modify(
            qp.state,
            qp.qp_type,
            mask,
            mask.contains(AttrMask::STATE).then_some(attr.qp_state),
        )?;
        attr.validate(mask, &limits)?;
        qp.apply(attr, mask, next, &mut self.shared);
        self.shared.state_changed(qpn);
        if next == QpState::Reset {
            self.sched.on_reset(s);
        }
        self.sync(s);
        Ok(())
    }

    /// `ibv_attach_mcast`: deliver datagrams for multicast group `mgid`
    /// (destination QP 0xFFFFFF) to UD QP `qpn` too. Attaching twice is a
    /// no-op, as on rxe. Returns whether `mgid` is a group new to this
    /// endpoint (the IO layer then joins it).
    pub fn attach_mcast(&mut self, qpn: u32, mgid: [u8; 16]) -> Result<bool, Error> {
        use crate::mcast::AttachError as A;
        let qp = self.qp(qpn)?;
        if qp.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(
                "only a UD QP can be attached to a multicast group",
            ));
        }
        if !crate::mcast::is_multicast_gid(&mgid) {
            return Err(Error::InvalidArgument(
                "the GID is not a multicast GID (ff00::/8, or ::ffff:224.0.0.0/4 for IPv4)",
            ));
        }
        self.mcast.attach(mgid, qpn).map_err(|e| {
            Error::OutOfResources(match e {
                A::Groups => "multicast groups (max_mcast_grp)",
                A::PerGroup => "QPs attached to this multicast group (max_mcast_qp_attach)",
                A::Total => "multicast attachments (max_total_mcast_qp_attach)",
            })
        })
    }

    /// `ibv_detach_mcast`. Returns whether the group is now without QPs
    /// here (the IO layer then leaves it).
    pub fn detach_mcast(&mut self, qpn: u32, mgid: [u8; 16]) -> Result<bool, Error> {
        self.qp(qpn)?;
        if !self.mcast.detach(mgid, qpn) {
            return Err(Error::InvalidArgument(
                "the QP is not attached to that multicast group",
            ));
        }
        Ok(self.mcast.find(&mgid).is_none())
    }

    /// The multicast groups some QP of this endpoint is attached to.
    pub fn mcast_groups(&self) -> impl Iterator<Item = &[u8; 16]> {
        self.mcast.groups()
    }

    /// A multicast datagram: to each attached QP that can take it, as a
    /// unicast UD datagram (each checks its Q_Key).
    fn handle_multicast(
        &mut self,
        now: Nanos,
        meta: &RxMeta,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        mem: &mut impl Memory,
    ) {
        let Some((g, n)) = self.mcast.find(&meta.dgid) else {
            self.shared.stats.dropped_no_qp += 1;
            return;
        };
        if pkt.info().transport != Transport::Ud {
            self.shared.stats.malformed += 1;
            return;
        }
        for k in 0..n {
            let Some(s) = self.slot(self.mcast.member(g, k)) else {
                continue;
            };
            let qp = self.qps[s].as_mut().expect("slot checked");
            if !matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) {
                self.shared.stats.dropped_no_qp += 1;
                continue;
            }
            let before = Before::of(qp, &self.shared.stats);
            self.shared.stats.requests_rx += 1;
            qp.handle_request(meta, pkt, repr, &mut self.shared, mem);
            self.sched
                .sync(s, qp, now, Some((before, &mut self.shared.stats)));
        }
        self.sched.settle_timers(&self.qps);
        self.fail_qps_of_dead_cqs();
    }

    /// Destroy a QP. Outstanding work is flushed to its CQs first, so the
    /// application sees every work request end.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        self.sched.on_destroy(s);
        let mut qp = self.qps[s].take().expect("slot checked");
        self.mcast.detach_all(qpn);
        self.shared.state_changed(qpn);
        self.sched.settle_timers(&self.qps);
        if qp.state != QpState::Reset {
            qp.enter_error(&mut self.shared);
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(Some(c)) = self.shared.cqs.get_mut(cq.0 as usize) {
                c.users = c.users.saturating_sub(1);
            }
        }
        // Before the slot (and so the QP number) can be reused.
        self.fail_qps_of_dead_cqs();
        Ok(())
    }

    /// `ibv_post_send`: validate and queue one work request.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr<'_>, mem: &impl Memory) -> Result<(), Error> {
        self.post_send_inner(qpn, wr, None, mem, None).map(|_| ())
    }

    /// `ibv_post_send` on an XRC initiator QP: `remote_srqn`
    /// (`wr.qp_type.xrc.remote_srqn`, `ibv_wr_set_xrc_srqn`) is the XRC
    /// SRQ at the target that the request is for, carried in its XRCETH.
    pub fn post_send_xrc(
        &mut self,
        qpn: u32,
        wr: &SendWr<'_>,
        remote_srqn: u32,
        mem: &impl Memory,
    ) -> Result<(), Error> {
        self.post_send_inner(qpn, wr, Some(remote_srqn), mem, None)
            .map(|_| ())
    }

    /// `ibv_post_send` on a connection that can carry one-sided operations
    /// out at once ([`Offload`], the shared-memory transport): validated
    /// exactly as [`Endpoint::post_send`], then, if the QP is in RTS with
    /// nothing outstanding on its send queue (so every earlier request has
    /// been executed by the responder and nothing can be reordered) and
    /// the request is an RDMA WRITE, READ or atomic, offered to `off` with
    /// its local buffer translated now. If `off` carries it out, the work
    /// request completes at once (if signaled) and nothing is queued; if
    /// not — the remote region is not reachable that way, or a check the
    /// offload does not judge itself would fail — it is queued and goes on
    /// the wire, where the responder gives it IBA's outcome. Returns
    /// whether `off` carried it out. RC only (see the UC note inside).
    ///
    /// A request posted behind requests still on the wire is not offered
    /// (it may not overtake them): if `off` could carry it
    /// ([`Offload::would_carry`]), or the QP already holds requests, it is
    /// held — queued unsent — until those ahead of it complete, and then
    /// carried out by the offload ([`Endpoint::offload_held`]); returns
    /// true if that happened within this call.
    pub fn post_send_offload(
        &mut self,
        qpn: u32,
        wr: &SendWr<'_>,
        mem: &impl Memory,
        off: &mut dyn Offload,
    ) -> Result<bool, Error> {
        self.post_send_inner(qpn, wr, None, mem, Some(off))
    }

    fn post_send_inner(
        &mut self,
        qpn: u32,
        wr: &SendWr<'_>,
        xrc_srqn: Option<u32>,
        mem: &impl Memory,
        mut off: Option<&mut dyn Offload>,
    ) -> Result<bool, Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        let qp = self.qps[s].as_mut().expect("slot checked");
        if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(Error::InvalidState {
                what: "post a send work request",
                state: qp.state,
            });
        }
        let tname = qp.qp_type.name();
        match (qp.qp_type, xrc_srqn) {
            (QpType::XrcRecv, _) => {
                return Err(Error::InvalidArgument(
                    "an XRC_RECV (target) QP has no send queue: post on the XRC_SEND QP",
                ))
            }
            (QpType::XrcSend, None) => {
                return Err(Error::InvalidArgument(
                    "XRC_SEND work request without a remote SRQ number (qp_type.xrc.remote_srqn)",
                ))
            }
            (QpType::XrcSend, Some(n)) if n >= 1 << 24 => {
                return Err(Error::InvalidArgument(
                    "remote SRQ number does not fit in 24 bits",
                ))
            }
            (t, Some(_)) if t != QpType::XrcSend => {
                return Err(Error::InvalidArgument(
                    "a remote SRQ number is for XRC_SEND QPs only",
                ))
            }
            _ => {}
        }
        let ok_op = match qp.qp_type {
            QpType::Rc => true,
            // XRC has no ATOMIC WRITE opcode.
            QpType::XrcSend => !matches!(wr.op, SendOp::AtomicWrite { .. }),
            QpType::XrcRecv => false,
            QpType::Uc => matches!(
                wr.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::Write { .. }
                    | SendOp::WriteWithImm { .. }
                    | SendOp::BindMw(_)
                    | SendOp::LocalInv { .. }
            ),
            QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }),
        };
        if !ok_op {
            return Err(Error::UnsupportedOp {
                op: wr.op.name(),
                qp_type: tname,
            });
        }
        if qp.qp_type.is_reliable() && wr.op.is_read_or_atomic() && qp.attr.max_rd_atomic == 0 {
            // rxe and RNICs accept the post and never issue the request:
            // with no READ/atomic credits the send queue stalls for good.
            return Err(Error::InvalidArgument(
                "RDMA READ or atomic on a QP whose max_rd_atomic is 0: hardware would never \
                 issue it (the send queue stalls); set max_rd_atomic >= 1 at RTR->RTS",
            ));
        }
        if wr.op.is_local() && !wr.sgl.is_empty() {
            return Err(Error::InvalidArgument(
                "BIND_MW and LOCAL_INV take no scatter/gather list",
            ));
        }
        if qp.qp_type == QpType::Ud && wr.ud.is_none() {
            return Err(Error::InvalidArgument("UD send without an address handle"));
        }
        if qp.sq.is_full() {
            return Err(Error::QueueFull {
                queue: "send queue",
                depth: qp.sq.depth,
            });
        }
        if wr.sgl.len() > qp.cap.max_send_sge as usize {
            return Err(Error::TooManySge {
                got: wr.sgl.len(),
                max: qp.cap.max_send_sge,
            });
        }
        let length: u64 = wr.sgl.iter().map(|s| s.length as u64).sum();
        if length > MAX_MSG_SIZE {
            return Err(Error::InvalidArgument("message longer than 2 GiB"));
        }
        if length.div_ceil(qp.mtu() as u64) >= crate::MAX_MSG_PSNS {
            return Err(Error::InvalidArgument(
                "a message of 2^23 packets or more at this path MTU (half the PSN space)",
            ));
        }
        if qp.qp_type == QpType::Ud && length > qp.mtu() as u64 {
            return Err(Error::InvalidArgument(
                "UD message longer than the path MTU",
            ));
        }
        if wr.op.is_atomic() && (wr.sgl.len() != 1 || length != 8) {
            return Err(Error::InvalidArgument(
                "an atomic needs one 8-byte SGE for the result",
            ));
        }
        if let SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } =
            wr.op
        {
            if !remote_addr.is_multiple_of(8) {
                return Err(Error::InvalidArgument(
                    "atomic target address is not 8-byte aligned",
                ));
            }
        }
        if let SendOp::AtomicWrite { remote_addr, .. } = wr.op {
            if length != 8 {
                return Err(Error::InvalidArgument(
                    "an ATOMIC WRITE carries exactly 8 bytes",
                ));
            }
            if !remote_addr.is_multiple_of(8) {
                return Err(Error::InvalidArgument(
                    "ATOMIC WRITE target address is not 8-byte aligned",
                ));
            }
        }
        let inline = wr.flags.contains(crate::wr::SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        // An ATOMIC WRITE's 8 bytes fit in any WQE (see `SendQueue::new`).
        let atomic_write = matches!(wr.op, SendOp::AtomicWrite { .. });
        if inline && !atomic_write && length > qp.cap.max_inline_data as u64 {
            return Err(Error::InlineTooLong {
                got: length as usize,
                max: qp.cap.max_inline_data,
            });
        }
        let mut segs = arrayvec::ArrayVec::<Span, MAX_SGE>::new();
        let mut ibuf = arrayvec::ArrayVec::<u8, MAX_INLINE>::new();
        let need = if matches!(wr.op, SendOp::Read { .. }) || wr.op.is_atomic() {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::EMPTY
        };
        for sge in wr.sgl.iter() {
            if inline {
                // Inline data is copied now; no key is checked (verbs semantics).
                let at = ibuf.len();
                ibuf.extend(std::iter::repeat_n(0, sge.length as usize));
                mem.read(sge.addr, &mut ibuf[at..]);
                continue;
            }
            let span = self
                .shared
                .mrs
                .resolve_local(qp.pd, sge.lkey, sge.addr, sge.length, need)
                .map_err(|e| match e {
                    crate::mr::LocalAccessError::BadLkey => {
                        Error::InvalidArgument("SGE lkey matches no memory region")
                    }
                    crate::mr::LocalAccessError::WrongPd => {
                        Error::InvalidArgument("SGE memory region is in another protection domain")
                    }
                    crate::mr::LocalAccessError::OutOfBounds => {
                        Error::InvalidArgument("SGE is not inside its memory region")
                    }
                    crate::mr::LocalAccessError::AccessDenied => Error::InvalidArgument(
                        "SGE memory region lacks LOCAL_WRITE for a READ/atomic result",
                    ),
                })?;
            segs.push(span);
        }
        let ilen = ibuf.len();
        let nsge = segs.len();
        let signaled = qp.sq_sig_all || wr.flags.contains(crate::wr::SendFlags::SIGNALED);
        let mut hold = false;
        if let Some(o) = off.as_deref_mut() {
            // RC only: a UC send queue retires a request once its last
            // packet is built, not once the responder has executed it, so
            // an empty UC queue does not order an offloaded WRITE after an
            // earlier SEND still on its way.
            if qp.qp_type == QpType::Rc && qp.state == QpState::Rts && offloadable(&wr.op) {
                let mut host = arrayvec::ArrayVec::<(u64, u32), MAX_SGE>::new();
                let mapped = inline || offload_spans(&self.shared.mrs, &segs, &mut host);
                if qp.sq.head == qp.sq.tail {
                    let local = if inline {
                        OffloadLocal::Inline(&ibuf)
                    } else {
                        OffloadLocal::Host(&host)
                    };
                    if mapped && o.one_sided(&wr.op, local) {
                        self.shared.complete_offloaded(
                            qp,
                            wr.wr_id,
                            &wr.op,
                            length as u32,
                            signaled,
                        );
                        return Ok(true);
                    }
                } else {
                    // Requests ahead of it are on the wire (or wait to go):
                    // it may not overtake them. Sent behind them it would
                    // go the packet way for good — a streaming poster's
                    // queue never empties again — so, if the offload could
                    // carry it, it waits for them instead (see
                    // `Endpoint::offload_held`).
                    hold = mapped && (qp.offload_hold || o.would_carry(&wr.op, length));
                }
            }
        }
        qp.sq.push(
            SendWqe {
                wr_id: wr.wr_id,
                op: wr.op,
                flags: wr.flags,
                ud: wr.ud,
                xrc_srqn: xrc_srqn.unwrap_or(0),
                nsge: nsge as u8,
                inline_len: ilen as u16,
                length: length as u32,
                state: SendState::Posted,
                first_psn: Default::default(),
                npkts: 0,
                signaled,
            },
            &segs,
            &ibuf,
        );
        if qp.state == QpState::Err {
            qp.flush(&mut self.shared);
        }
        if hold {
            if !qp.offload_hold {
                // This one and what follows; what is before it goes on.
                qp.offload_hold = true;
                qp.hold_from = qp.sq.head - 1;
                if !qp.hold_listed {
                    qp.hold_listed = true;
                    self.holding.push(qpn);
                }
            }
            if let Some(o) = off {
                self.drain_held(s, o);
            }
            let qp = self.qps[s].as_ref().expect("slot checked");
            if qp.sq.head == qp.sq.tail {
                // Carried out, after everything posted before it.
                return Ok(true);
            }
        }
        self.sync(s); // the doorbell
        Ok(false)
    }

    /// Carry out the requests QPs hold back for their offload (see
    /// [`Endpoint::post_send_offload`]) once everything ahead of them has
    /// completed, in order, through the offload `off` gives for the QP.
    /// A request the offload refuses goes on the wire as any other — alone
    /// if the offload could carry what follows it, which waits for its
    /// answer, else with the rest (so do those of a QP `off` gives none
    /// for). Call it after anything that may complete requests: handling
    /// packets, and the requester's turn (a bind or invalidate completes
    /// there). Returns whether it gave any request to the requester (then
    /// there is something to transmit). Cheap when nothing is held
    /// ([`Endpoint::holds_for_offload`]).
    pub fn offload_held<O: Offload>(&mut self, mut off: impl FnMut(u32) -> Option<O>) -> bool {
        let mut released = false;
        let mut i = 0;
        while i < self.holding.len() {
            let qpn = self.holding[i];
            let s = match self.slot(qpn) {
                Some(s) if self.qps[s].as_ref().is_some_and(|q| q.offload_hold) => s,
                slot => {
                    // Not holding (or gone): off the list.
                    if let Some(q) = slot.and_then(|s| self.qps[s].as_mut()) {
                        q.hold_listed = false;
                    }
                    self.holding.swap_remove(i);
                    continue;
                }
            };
            match off(qpn) {
                Some(mut o) => released |= self.drain_held(s, &mut o),
                None => {
                    self.qps[s].as_mut().expect("slot checked").offload_hold = false;
                    self.sync(s);
                    released = true;
                }
            }
            let q = self.qps[s].as_mut().expect("slot checked");
            if q.offload_hold {
                i += 1;
            } else {
                q.hold_listed = false;
                self.holding.swap_remove(i);
            }
        }
        released
    }

    /// Some QP holds requests back for its offload.
    #[inline]
    pub fn holds_for_offload(&self) -> bool {
        !self.holding.is_empty()
    }

    /// QP slot `s`'s held requests, oldest first, through `off`, while the
    /// oldest request of its send queue is a held one (so nothing of the
    /// QP's is on the wire or unanswered) and the QP is in RTS. The first
    /// one `off` refuses goes on the wire; if `off` could carry what
    /// follows it (`Offload::would_carry`: say the peer's receives are
    /// behind, not gone) the rest wait for its answer, else they go too.
    /// Returns whether one was refused (the requester has it now).
    fn drain_held(&mut self, s: usize, off: &mut dyn Offload) -> bool {
        let Endpoint { qps, shared, .. } = self;
        let Some(qp) = qps[s].as_mut() else {
            return false;
        };
        let mut refused = false;
        while qp.offload_hold && qp.state == QpState::Rts {
            let idx = qp.sq.tail;
            let Some(w) = qp.sq.get(idx).copied() else {
                // All carried out: the queue is empty, the hold over.
                qp.offload_hold = false;
                break;
            };
            if w.state != SendState::Posted || idx < qp.hold_from {
                break; // the oldest is on the wire (or to go, or complete)
            }
            let inline =
                w.flags.contains(crate::wr::SendFlags::INLINE) && !w.op.is_read_or_atomic();
            let mut host = arrayvec::ArrayVec::<(u64, u32), MAX_SGE>::new();
            let carried = offloadable(&w.op)
                && (inline || offload_spans(&shared.mrs, qp.sq.sges(idx), &mut host))
                && off.one_sided(
                    &w.op,
                    if inline {
                        OffloadLocal::Inline(qp.sq.inline(idx))
                    } else {
                        OffloadLocal::Host(&host)
                    },
                );
            if !carried {
                if off.would_carry(&w.op, w.length as u64) {
                    qp.hold_from = idx + 1;
                } else {
                    qp.offload_hold = false;
                }
                refused = true;
                break;
            }
            shared.complete_offloaded(qp, w.wr_id, &w.op, w.length, w.signaled);
            shared.stats.offloaded_after_hold += 1;
            qp.sq.pop_tail();
        }
        if refused {
            self.sync(s);
        }
        refused
    }

    /// `ibv_post_recv`, its SGEs checked at post ([`RecvCheck::AtPost`]).
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), Error> {
        self.post_recv_with(qpn, wr, RecvCheck::AtPost)
    }

    /// `ibv_post_recv` with the SGE checks `check` says.
    pub fn post_recv_with(
        &mut self,
        qpn: u32,
        wr: &RecvWr<'_>,
        check: RecvCheck,
    ) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        let (pd, max_sge, srq, state) = {
            let q = self.qps[s].as_ref().expect("slot checked");
            (q.pd, q.cap.max_recv_sge, q.srq, q.state)
        };
        if srq.is_some() {
            return Err(Error::InvalidArgument(
                "QP uses a shared receive queue; post to the SRQ",
            ));
        }
        let qp_type = self.qps[s].as_ref().expect("slot checked").qp_type;
        if qp_type.is_xrc() {
            return Err(Error::InvalidArgument(
                "XRC QPs have no receive queue: post receives to an XRC SRQ",
            ));
        }
        if state == QpState::Reset {
            return Err(Error::InvalidState {
                what: "post a receive work request",
                state,
            });
        }
        let mut segs = [Span::default(); MAX_SGE];
        let n = self.translate_recv(pd, wr, max_sge, check, &mut segs)?;
        let qp = self.qps[s].as_mut().expect("slot checked");
        if qp.rq.is_full() {
            return Err(Error::QueueFull {
                queue: "receive queue",
                depth: qp.rq.depth,
            });
        }
        qp.rq.push(wr.wr_id, &segs[..n]);
        if qp.state == QpState::Err {
            qp.flush(&mut self.shared);
        }
        Ok(())
    }

    /// Check a receive as [`Endpoint::post_recv_with`] does, without
    /// queueing it: its SGEs as the receive queue would keep them go to
    /// `out`; returns how many. For a layer that keeps a QP's receives
    /// itself for a while (the shared-memory receive lane), handing them
    /// back with [`Endpoint::requeue_recv`]; the queue's depth is then its
    /// to keep.
    pub fn check_recv(
        &self,
        qpn: u32,
        wr: &RecvWr<'_>,
        check: RecvCheck,
        out: &mut [Span; MAX_SGE],
    ) -> Result<usize, Error> {
        let q = self.qp(qpn)?;
        if q.srq.is_some() || q.qp_type.is_xrc() || q.state == QpState::Reset {
            return Err(Error::InvalidArgument(
                "receive lane: QP has no receive queue of its own in use",
            ));
        }
        self.translate_recv(q.pd, wr, q.cap.max_recv_sge, check, out)
    }

    /// Take every receive queued on RC QP `qpn`, oldest first, handing
    /// each (its `wr_id` and SGEs) to `f` — only if none is in use (no
    /// message in progress, nothing held, no NAK outstanding, see
    /// `Responder::recv_idle`) and the QP is in RTR or RTS; false (nothing
    /// taken) otherwise.
    pub fn take_recvs(&mut self, qpn: u32, mut f: impl FnMut(u64, &[Span])) -> bool {
        let Some(s) = self.slot(qpn) else {
            return false;
        };
        let q = self.qps[s].as_mut().expect("slot checked");
        if q.qp_type != QpType::Rc
            || q.srq.is_some()
            || !matches!(q.state, QpState::Rtr | QpState::Rts)
            || !q.resp.recv_idle()
        {
            return false;
        }
        let mut sges = [Span::default(); MAX_SGE];
        while let Some(w) = q.rq.pop(&mut sges) {
            f(w.wr_id, &sges[..w.nsge as usize]);
        }
        true
    }

    /// Take the oldest receive queued on `qpn` (not one a message in
    /// progress holds: that one has left the queue), handing its `wr_id`
    /// and SGEs to `f`; false if none is queued.
    pub fn pop_recv(&mut self, qpn: u32, f: impl FnOnce(u64, &[Span])) -> bool {
        let Some(s) = self.slot(qpn) else {
            return false;
        };
        let q = self.qps[s].as_mut().expect("slot checked");
        let mut sges = [Span::default(); MAX_SGE];
        match q.rq.pop(&mut sges) {
            Some(w) => {
                f(w.wr_id, &sges[..w.nsge as usize]);
                true
            }
            None => false,
        }
    }

    /// Queue a receive checked by [`Endpoint::check_recv`] (or taken by
    /// [`Endpoint::take_recvs`]) back on `qpn`'s receive queue, behind what
    /// is there; in ERR it completes flushed at once, as a post does.
    pub fn requeue_recv(&mut self, qpn: u32, wr_id: u64, sges: &[Span]) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        let qp = self.qps[s].as_mut().expect("slot checked");
        if qp.rq.is_full() || sges.len() > qp.rq.max_sge as usize {
            return Err(Error::QueueFull {
                queue: "receive queue",
                depth: qp.rq.depth,
            });
        }
        qp.rq.push(wr_id, sges);
        if qp.state == QpState::Err {
            qp.flush(&mut self.shared);
        }
        Ok(())
    }

    /// A received RoCEv2 datagram (UDP payload, ICRC included and already
    /// verified by the caller). Anything malformed is counted and dropped.
    pub fn handle_packet(
        &mut self,
        now: Nanos,
        meta: &RxMeta,
        bytes: &[u8],
        mem: &mut impl Memory,
    ) {
        let st = &mut self.shared.stats;
        st.rx_packets += 1;
        st.rx_bytes += bytes.len() as u64;
        let Ok(pkt) = Packet::new_checked(bytes) else {
            st.malformed += 1;
            return;
        };
        let Ok(repr) = PacketRepr::parse(&pkt) else {
            st.malformed += 1;
            return;
        };
        let info = pkt.info();
        if info.transport == Transport::Cnp {
            // For the reaction point of the QP it names, if it came from
            // that QP's peer.
            st.cnps_received += 1;
            if let Some(s) = self.slot(repr.bth.dest_qp) {
                let qp = self.qps[s].as_ref().expect("slot checked");
                if qp.qp_type != QpType::Ud && qp.attr.av.dgid == meta.sgid {
                    self.sched.on_cnp(s, now);
                    self.sched.sync(s, qp, now, None);
                    self.sched.settle_timers(&self.qps);
                }
            }
            return;
        }
        if repr.bth.pkey & 0x7fff != 0x7fff {
            st.malformed += 1;
            return;
        }
        if repr.bth.dest_qp == crate::mcast::MULTICAST_QPN {
            self.handle_multicast(now, meta, &pkt, &repr, mem);
            return;
        }
        let Some(s) = self.slot(repr.bth.dest_qp) else {
            self.shared.stats.dropped_no_qp += 1;
            return;
        };
        let qp = self.qps[s].as_mut().expect("slot checked");
        let want = match qp.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
            QpType::XrcSend | QpType::XrcRecv => Transport::Xrc,
        };
        if info.transport != want {
            self.shared.stats.malformed += 1;
            return;
        }
        if qp.qp_type != QpType::Ud && meta.sgid != qp.attr.av.dgid {
            self.shared.stats.wrong_source += 1; // not from the connected peer
            return;
        }
        let before = Before::of(qp, &self.shared.stats);
        if info.has(Flags::RESPONSE) {
            if matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
                qp.handle_response(now, &pkt, &repr, &mut self.shared, mem);
                qp.note_drained(&mut self.shared);
            } else {
                self.shared.stats.dropped_no_qp += 1;
                return;
            }
        } else if matches!(
            qp.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            self.shared.stats.requests_rx += 1;
            qp.handle_request(meta, &pkt, &repr, &mut self.shared, mem);
            if meta.traffic_class & 3 == 3 && qp.qp_type != QpType::Ud {
                // ECN-CE: the notification point owes the sender a CNP.
                self.shared.stats.ce_received += 1;
                self.sched.on_ce(s, now);
            }
        } else {
            self.shared.stats.dropped_no_qp += 1;
            return;
        }
        self.sched
            .sync(s, qp, now, Some((before, &mut self.shared.stats)));
        self.sched.settle_timers(&self.qps);
        self.fail_qps_of_dead_cqs();
    }

    /// The next packet to send: headers (and inline payload) are written
    /// into `buf`, which must hold at least 4096 + 128 bytes. The payload
    /// segments stay valid only until the next call into the endpoint (see
    /// [`Transmit`]). Only QPs on the scheduler's ready list are looked at.
    pub fn poll_transmit(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        mem: &impl Memory,
    ) -> Option<Transmit> {
        let mut one = [Transmit::default()];
        (self.poll_transmit_burst(now, buf, &mut one, mem) == 1).then_some(one[0])
    }

    /// The next packets to send, as a NIC's send engine fetches a run of
    /// one QP's packets per scheduling decision: up to `out.len()`, all of
    /// one QP, the `k`th with its head written into
    /// `bufs[k * HEAD_ROOM..(k + 1) * HEAD_ROOM]` (`bufs` must hold at least
    /// one [`HEAD_ROOM`]; it bounds the burst too). Returns how many were
    /// written to `out`; 0 when nothing is ready. The packets are exactly
    /// those as many `poll_transmit` calls would give, in the same order;
    /// the scheduler's bookkeeping (filing, budget, timers) runs once per
    /// burst instead of once per packet. Their payload segments stay valid
    /// until the next call into the endpoint, as [`Transmit`] says.
    pub fn poll_transmit_burst(
        &mut self,
        now: Nanos,
        bufs: &mut [u8],
        out: &mut [Transmit],
        mem: &impl Memory,
    ) -> usize {
        assert!(
            bufs.len() >= HEAD_ROOM,
            "poll_transmit needs a 4224-byte buffer"
        );
        // A completion lost in the previous call stops its QP before it
        // sends again.
        self.fail_qps_of_dead_cqs();
        self.sched
            .poll_transmit(&mut self.qps, &mut self.shared, now, bufs, out, mem)
    }

    /// Whether this endpoint has something to send now and all of it is
    /// lone positive ACKs: what a caller may hold back for a moment to
    /// send with the application's reply (false when nothing is ready).
    /// See [`Sched::only_acks_ready`](crate::sched).
    pub fn only_acks_ready(&self) -> bool {
        self.sched.only_acks_ready(&self.qps)
    }

    /// The earliest time `handle_timeout` should be called. O(1).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.sched.poll_timeout()
    }

    /// Fire the timers due at `now` (retransmission, RNR back-off, pacing);
    /// only QPs with an expired timer are visited.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.sched
            .handle_timeout(&mut self.qps, &mut self.shared, now);
        self.fail_qps_of_dead_cqs();
    }

    /// Re-file slot `s` with the scheduler after a command on its QP.
    fn sync(&mut self, s: usize) {
        if let Some(qp) = self.qps[s].as_ref() {
            let now = self.sched.now;
            self.sched.sync(s, qp, now, None);
        }
        self.sched.settle_timers(&self.qps);
    }

    /// Run congestion control `cc` on an RC/UC QP, its reaction point
    /// starting at `line_rate` bits/s (replacing any controller it had).
    pub fn set_qp_cc(&mut self, qpn: u32, cc: &CcConfig, line_rate: u64) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        if line_rate == 0 {
            return Err(Error::InvalidArgument(
                "a line rate of 0 bits/s never sends",
            ));
        }
        self.sched.set_cc(s, cc, line_rate);
        self.sync(s);
        Ok(())
    }

    /// In-band telemetry for a QP's controller: the INT records a switch
    /// fabric stamped on its data and the receiver echoed in an ACK (the
    /// simulator delivers these; on the wire nothing stamps INT).
    pub fn on_int(
        &mut self,
        qpn: u32,
        now: Nanos,
        hops: &[crate::cc::IntHop],
    ) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        self.sched.on_int(s, now, hops);
        self.sync(s);
        Ok(())
    }

    /// A QP's congestion controller, if it runs one.
    pub fn qp_cc(&self, qpn: u32) -> Result<Option<&crate::cc::Controller>, Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        Ok(self.sched.cc(s))
    }

    /// Pace a QP's requests at `bits_per_sec` (of [`Transmit::wire_len`]
    /// bytes), or `None` for line rate: the congestion-control hook for
    /// rate-based algorithms. The new rate applies to a pacing wait already
    /// running as well (see [`crate::gate`]).
    pub fn set_qp_rate(&mut self, qpn: u32, bits_per_sec: Option<u64>) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        if bits_per_sec == Some(0) {
            return Err(Error::InvalidArgument(
                "a QP rate of 0 bits/s never sends; None means line rate",
            ));
        }
        let now = self.sched.now;
        self.sched.gate_mut(s).set_rate(now, bits_per_sec);
        self.sync(s);
        Ok(())
    }

    /// Set a QP's window: at most `psns` unacknowledged PSNs (1..=256) and,
    /// if given, `bytes` unacknowledged bytes: the congestion-control hook
    /// for window-based algorithms. Resets the loss back-off.
    pub fn set_qp_window(&mut self, qpn: u32, psns: u32, bytes: Option<u64>) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        if psns == 0 || psns > MAX_UNACKED_PSNS {
            return Err(Error::InvalidArgument(
                "a QP window must be 1..=256 unacknowledged PSNs",
            ));
        }
        self.sched.gate_mut(s).set_window(psns, bytes);
        self.sync(s);
        Ok(())
    }

    /// Whether QP `qpn`'s requests leave behind a lone queued ACK instead
    /// of passing it (see the scheduler's `set_acks_first`): for a QP whose
    /// packets reach a receiver that may take a reply and the ACK behind
    /// it in different passes.
    pub fn set_qp_acks_first(&mut self, qpn: u32, on: bool) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        self.sched.set_acks_first(s, on);
        Ok(())
    }

    /// Whether QP `qpn` offers and accepts selective repeat (when the
    /// endpoint does), from its next move to RTS on: not for a QP whose
    /// peer is reached through shared-memory rings. Those neither lose nor
    /// reorder, so a request arrives ahead of the expected PSN only after
    /// an RNR or sequence NAK sent the requester back; holding it then
    /// executes a held SEND with no receive to take (the receive lane gives
    /// the core one receive per arriving packet), an RNR NAK each: `perf
    /// send_bw -s 65536` over shared memory ran into ~1,000 RNR NAKs and
    /// ~450,000 sequence NAKs and moved 0.8 GB/s, against ~20 RNR NAKs
    /// and 4.5-10 GB/s going back N.
    pub fn set_qp_selective_repeat(&mut self, qpn: u32, on: bool) -> Result<(), Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        let qp = self.qps[s].as_mut().expect("slot checked");
        qp.sr_allowed = on;
        if !on {
            qp.resp.peer_sr = false;
        }
        Ok(())
    }

    /// A QP's transmit gate: its window, back-off and rate.
    pub fn qp_gate(&self, qpn: u32) -> Result<&crate::gate::TxGate, Error> {
        let s = self.slot(qpn).ok_or(Error::NoSuchQp(qpn))?;
        Ok(self.sched.gate(s))
    }

    /// Unacknowledged bytes towards `gid` across all its RC QPs.
    pub fn dest_inflight(&self, gid: &[u8; 16]) -> u64 {
        self.sched.dest_inflight(gid)
    }

    /// Check the scheduler's invariants: no QP with work is forgotten (every
    /// one that may send is on the ready list, every one held by a gate has
    /// a timer or a wake-up coming), and its lists, budgets and timers are
    /// consistent. Scans every QP: for tests and debugging, not hot paths.
    pub fn check_scheduler(&self) -> Result<(), String> {
        self.sched.check(&self.qps)
    }

    /// Whether no work queue holds a work request (so no queued work can
    /// point into memory that is about to be freed).
    pub fn all_queues_idle(&self) -> bool {
        self.qps.iter().flatten().all(|q| q.queues_empty())
            && self.shared.srqs.iter().flatten().all(|s| s.q.len() == 0)
    }

    /// The QPs whose state (or attributes) changed since the last call —
    /// by `modify_qp`, `destroy_qp` or an error the transport met — each
    /// once, for a layer that mirrors QP states elsewhere (the shared-memory
    /// transport publishes them to peer processes). Nothing is recorded
    /// before the first call.
    pub fn take_state_changes(&mut self, mut f: impl FnMut(u32, Option<&Qp>)) {
        let Some(v) = self.shared.state_changes.as_mut() else {
            self.shared.state_changes = Some(Vec::new());
            return;
        };
        // `f` cannot reach the endpoint, so nothing is recorded meanwhile:
        // the list (and its allocation) goes back empty.
        let mut v = std::mem::take(v);
        for &qpn in &v {
            f(qpn, self.slot(qpn).and_then(|s| self.qps[s].as_ref()));
        }
        v.clear();
        self.shared.state_changes = Some(v);
    }

    /// A count of QP state changes so far (any QP, any cause: a modify,
    /// an error the transport ran into, a destroy). A layer that acts on a
    /// QP's state outside the endpoint (the verbs layer's lock-free lane
    /// for shared memory) re-checks whenever it moved.
    pub fn state_epoch(&self) -> u64 {
        self.shared.state_epoch
    }

    /// The next asynchronous event or completion notification.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.fail_qps_of_dead_cqs();
        self.shared.events.pop_front()
    }
}

/// What an offload may carry out: an RDMA WRITE, READ, atomic or ATOMIC
/// WRITE, a SEND with or without immediate, or an RDMA WRITE with
/// immediate.
fn offloadable(op: &SendOp) -> bool {
    op.is_one_sided()
        || matches!(
            op,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::WriteWithImm { .. }
        )
}

/// The host spans of `segs`' entries with bytes (zero-length ones move
/// nothing and are left out, so every span handed to an offload has bytes
/// behind it) into `out`; false if one lies in an implicit region, whose
/// bytes are never handed out as host addresses (they may not be there):
/// such work goes the packet way, copied checked.
fn offload_spans(
    mrs: &MrTable,
    segs: &[Span],
    out: &mut arrayvec::ArrayVec<(u64, u32), MAX_SGE>,
) -> bool {
    for sp in segs.iter().filter(|sp| sp.len > 0) {
        match mrs.locate(sp.mem, sp.off, sp.len as u64) {
            Some(h) if !h.checked => out.push((h.addr, sp.len)),
            _ => return false,
        }
    }
    true
}
