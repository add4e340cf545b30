//! Queue pairs: the IBA state machine, attributes, and the three pieces one
//! QP owns — requester, completer, responder — each in its own module as an
//! `impl Qp` block over its own state struct.

pub mod attr;
mod completer;
pub(crate) mod queue;
pub(crate) mod reorder;
mod requester;
mod responder;
pub mod state;

use softrdma_wire::Psn;

use crate::cq::CqId;
use crate::endpoint::Ctx;
use crate::mr::PdId;
use crate::wc::{Completion, WcOpcode, WcStatus};
use crate::Nanos;
use attr::{AccessFlags, AttrMask, QpAttr};
use queue::{RecvQueue, SendQueue};
use state::{QpState, QpType};

pub(crate) use completer::Completer;
pub(crate) use requester::{Requester, Stop};
pub(crate) use responder::Responder;

/// Capacities a QP is created with (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// Most PSNs a requester keeps unacknowledged (its window).
pub const MAX_UNACKED_PSNS: u32 = 256;
/// Request an ACK at least every this many packets inside a long message.
pub const ACK_REQ_EVERY: u32 = 64;

/// One queue pair.
#[derive(Debug)]
pub struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: PdId,
    pub state: QpState,
    pub attr: QpAttr,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<u32>,
    /// XRC target QPs: the XRC domain whose SRQs it delivers to.
    pub xrcd: Option<u32>,
    pub sq_sig_all: bool,
    pub cap: QpCap,
    pub(crate) sq: SendQueue,
    pub(crate) rq: RecvQueue,
    pub(crate) req: Requester,
    pub(crate) comp: Completer,
    pub(crate) resp: Responder,
    /// Selective repeat may be offered and accepted on this QP (if the
    /// endpoint's is on): not while its peer is reached through
    /// shared-memory rings (`Endpoint::set_qp_selective_repeat`).
    pub(crate) sr_allowed: bool,
    /// Requests not yet started from send queue index `hold_from` on
    /// wait, in RTS, for those before them to complete, to be carried out
    /// by the connection's offload then (`Endpoint::post_send_offload`,
    /// `Endpoint::offload_held`) instead of going on the wire behind them.
    pub(crate) offload_hold: bool,
    pub(crate) hold_from: u64,
    /// In `Endpoint::holding` (so a hold that starts again does not look
    /// the list through).
    pub(crate) hold_listed: bool,
}

impl Qp {
    pub(crate) fn new(qpn: u32, init: &crate::endpoint::QpInit) -> Qp {
        let cap = init.cap;
        Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            state: QpState::Reset,
            attr: QpAttr::default(),
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            xrcd: None,
            sq_sig_all: init.sq_sig_all,
            cap,
            sq: SendQueue::new(cap.max_send_wr, cap.max_send_sge, cap.max_inline_data),
            rq: RecvQueue::new(cap.max_recv_wr.max(1), cap.max_recv_sge.max(1)),
            req: Requester::default(),
            comp: Completer::default(),
            resp: Responder::new(1),
            sr_allowed: true,
            offload_hold: false,
            hold_from: 0,
            hold_listed: false,
        }
    }

    /// SQD: once no request is in flight (the oldest one, if any, not yet
    /// started — the requester starts none in SQD), the drain is over:
    /// `sq_draining` turns false and, if the modify to SQD asked
    /// (`en_sqd_async_notify`), `IBV_EVENT_SQ_DRAINED` is raised, once.
    pub(crate) fn note_drained(&mut self, ctx: &mut Ctx<'_>) {
        if self.state != QpState::Sqd || !self.attr.sq_draining {
            return;
        }
        let busy = self
            .sq
            .get(self.sq.tail)
            .is_some_and(|w| w.state != queue::SendState::Posted);
        if busy {
            return;
        }
        self.attr.sq_draining = false;
        if self.attr.en_sqd_async_notify {
            ctx.push_event(crate::Event::SqDrained(self.qpn));
        }
    }

    /// Nothing is in the send queue: every request posted so far has been
    /// completed (for RC: acknowledged, so executed by the responder).
    pub fn send_queue_empty(&self) -> bool {
        self.sq.head == self.sq.tail
    }

    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// Apply a modify whose mask and values the caller has validated.
    pub(crate) fn apply(&mut self, a: &QpAttr, mask: AttrMask, next: QpState, ctx: &mut Ctx<'_>) {
        let m = |b| mask.contains(b);
        if m(AttrMask::ACCESS_FLAGS) {
            self.attr.qp_access_flags = a.qp_access_flags;
        }
        if m(AttrMask::PKEY_INDEX) {
            self.attr.pkey_index = a.pkey_index;
        }
        if m(AttrMask::PORT) {
            self.attr.port_num = a.port_num;
        }
        if m(AttrMask::QKEY) {
            self.attr.qkey = a.qkey;
        }
        if m(AttrMask::AV) {
            self.attr.av = a.av;
        }
        if m(AttrMask::PATH_MTU) {
            self.attr.path_mtu = a.path_mtu;
        }
        if m(AttrMask::TIMEOUT) {
            self.attr.timeout = a.timeout;
        }
        if m(AttrMask::RETRY_CNT) {
            self.attr.retry_cnt = a.retry_cnt;
        }
        if m(AttrMask::RNR_RETRY) {
            self.attr.rnr_retry = a.rnr_retry;
        }
        if m(AttrMask::RQ_PSN) {
            self.attr.rq_psn = a.rq_psn;
            self.resp.reset_psn(Psn::new(a.rq_psn));
        }
        if m(AttrMask::MAX_QP_RD_ATOMIC) {
            self.attr.max_rd_atomic = a.max_rd_atomic;
        }
        if m(AttrMask::MIN_RNR_TIMER) {
            self.attr.min_rnr_timer = a.min_rnr_timer;
        }
        if m(AttrMask::SQ_PSN) {
            self.attr.sq_psn = a.sq_psn;
            self.req.reset_psn(Psn::new(a.sq_psn));
            self.comp.reset_psn(Psn::new(a.sq_psn));
        }
        if m(AttrMask::MAX_DEST_RD_ATOMIC) {
            self.attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
            self.resp
                .set_resources(a.max_dest_rd_atomic.max(1) as usize);
        }
        if m(AttrMask::DEST_QPN) {
            self.attr.dest_qp_num = a.dest_qp_num;
        }
        if m(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            self.attr.en_sqd_async_notify = a.en_sqd_async_notify;
        }
        let prev = self.state;
        self.state = next;
        self.attr.qp_state = next;
        if prev != next {
            // Requests held for the offload are the requester's again: a
            // QP back in RTS sends them (nothing else would wake a drain).
            self.offload_hold = false;
        }
        // Entering SQD starts a drain of what is in flight (`sq_draining`
        // until then); leaving SQD ends it.
        if next != QpState::Sqd {
            self.attr.sq_draining = false;
        } else if prev != QpState::Sqd {
            self.attr.sq_draining = true;
            self.note_drained(ctx);
        }
        if prev != QpState::Rts
            && next == QpState::Rts
            // Selective repeat is offered on RC only; XRC goes back N.
            && self.qp_type == QpType::Rc
            && self.req.sr == requester::SrMode::Off
            && ctx.sr
            && self.sr_allowed
        {
            self.req.sr = requester::SrMode::Offer;
        }
        if m(AttrMask::RETRY_CNT) || (prev != QpState::Rts && next == QpState::Rts) {
            self.comp.retry_left = self.attr.retry_cnt;
            self.comp.rnr_left = self.attr.rnr_retry;
        }
        match next {
            QpState::Reset => {
                self.resp.release_held(ctx);
                self.reset();
                // What the QP left in its CQs goes with its queues, as the
                // mlx4/mlx5 providers clean the CQs on RESET (`mlx5_cq_clean`):
                // a QP brought back up must not hand its poller the flushes
                // of its previous life (rdma-core's tests restate QPs after
                // an error and poll on).
                for cq in [self.send_cq, self.recv_cq] {
                    if let Some(Some(q)) = ctx.cqs.get_mut(cq.0 as usize) {
                        q.purge_qp(self.qpn);
                    }
                }
            }
            QpState::Err if prev != QpState::Err => self.flush_entering_err(ctx),
            _ => {}
        }
    }

    /// RESET: forget every queued request without completions, as IBA says.
    fn reset(&mut self) {
        let cap = self.cap;
        self.sq = SendQueue::new(cap.max_send_wr, cap.max_send_sge, cap.max_inline_data);
        self.rq = RecvQueue::new(cap.max_recv_wr.max(1), cap.max_recv_sge.max(1));
        self.req = Requester::default();
        self.comp = Completer::default();
        self.resp = Responder::new(1);
        // A UD QP's path MTU is the port's, set when it was created; no
        // modify can set it again, so RESET must not forget it.
        let mtu = self.attr.path_mtu;
        self.attr = QpAttr::default();
        if self.qp_type == QpType::Ud {
            self.attr.path_mtu = mtu;
        }
    }

    /// Enter ERR and complete every outstanding work request with a flush
    /// error, in order (send queue, then the QP's own receive queue).
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        ctx.state_changed(self.qpn);
        self.flush_entering_err(ctx);
    }

    /// [`Qp::flush`] as the QP enters ERR: a QP on an SRQ is told its last
    /// WQE was reached then, once (not again at each post a QP in ERR
    /// flushes).
    fn flush_entering_err(&mut self, ctx: &mut Ctx<'_>) {
        self.flush(ctx);
        if self.srq.is_some() {
            ctx.push_event(crate::Event::QpLastWqeReached(self.qpn));
        }
    }

    pub(crate) fn flush(&mut self, ctx: &mut Ctx<'_>) {
        self.offload_hold = false;
        while let Some(w) = self.sq.pop_tail() {
            let mut c =
                Completion::new(w.wr_id, WcStatus::WrFlushErr, wc_opcode_of(&w.op), self.qpn);
            c.byte_len = 0;
            ctx.complete(self.send_cq, c, false);
        }
        self.sq.send = self.sq.tail;
        // A receive a message in progress took (from the RQ or the SRQ),
        // or one a dropped UC message left aside, is the oldest of the
        // QP's receives: it ends first. It goes to the CQ the message's
        // completion would have gone to (an XRC target: its SRQ's).
        let rx_cq = self.rx_cq();
        for wr_id in self.resp.take_held_recvs().into_iter().flatten() {
            let c = Completion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            ctx.complete(rx_cq, c, false);
        }
        let mut sges = [crate::mr::Span::default(); crate::MAX_SGE];
        if self.srq.is_none() {
            while let Some(w) = self.rq.pop(&mut sges) {
                let c = Completion::new(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
                ctx.complete(self.recv_cq, c, false);
            }
        }
        self.resp.clear_output();
        self.resp.release_held(ctx);
        self.comp.stop_timers();
    }

    /// Receives queued on the QP's own receive queue.
    pub fn recv_queued(&self) -> u32 {
        self.rq.len()
    }

    /// Send work requests posted and not yet completed (or flushed).
    pub fn sends_outstanding(&self) -> u64 {
        self.sq.head - self.sq.tail
    }

    /// No send or receive work request is queued.
    pub(crate) fn queues_empty(&self) -> bool {
        self.sq.head == self.sq.tail && self.rq.len() == 0
    }

    /// Selective repeat was negotiated for this QP's requests.
    pub fn selective_repeat(&self) -> bool {
        self.req.sr == requester::SrMode::On
    }

    /// The earliest timer this QP has armed.
    pub(crate) fn next_timeout(&self) -> Option<Nanos> {
        self.comp.next_timeout()
    }

    /// Whether the QP's send-side attributes allow remote `need`.
    pub(crate) fn allows(&self, need: AccessFlags) -> bool {
        self.attr.qp_access_flags.contains(need)
    }
}

/// The completion opcode a send operation reports.
pub(crate) fn wc_opcode_of(op: &crate::wr::SendOp) -> WcOpcode {
    use crate::wr::SendOp::*;
    match op {
        Send | SendWithImm { .. } | SendWithInv { .. } => WcOpcode::Send,
        Write { .. } | WriteWithImm { .. } => WcOpcode::RdmaWrite,
        AtomicWrite { .. } => WcOpcode::AtomicWrite,
        Read { .. } => WcOpcode::RdmaRead,
        CompareSwap { .. } => WcOpcode::CompSwap,
        FetchAdd { .. } => WcOpcode::FetchAdd,
        BindMw(_) => WcOpcode::BindMw,
        LocalInv { .. } => WcOpcode::LocalInv,
    }
}
