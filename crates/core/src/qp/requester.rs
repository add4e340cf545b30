//! The requester: turns send work requests into request packets.
//!
//! It walks the send queue from `sq.send`, packet by packet. PSNs are a pure
//! function of queue order (each WQE starts where the previous one ended), so
//! go-back-N is just moving `sq.send` and `pkt_idx` back: a resent packet gets
//! exactly the PSN, opcode and payload it had the first time, and a resumed
//! READ asks only for the responses still missing.

use softrdma_wire::bth::{BthRepr, DEFAULT_PKEY};
use softrdma_wire::ext::*;
use softrdma_wire::packet::{ExtRepr, PacketRepr};
use softrdma_wire::{Opcode, Psn};

use super::attr::local_ack_timeout_ns;
use super::queue::{copy_checked, gather, SendState};
use super::state::{QpState, QpType};
use super::{Qp, ACK_REQ_EVERY};
use crate::endpoint::Ctx;
use crate::mr::Memory;
use crate::transmit::Transmit;
use crate::wc::{Completion, WcStatus};
use crate::wr::SendOp;
use crate::Nanos;

#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Next packet to send within the WQE at `sq.send`.
    pub pkt_idx: u32,
    /// PSN of the next WQE to be started (one past the last PSN assigned).
    pub next_psn: Psn,
    /// One past the highest PSN ever sent: responses at or beyond it answer
    /// nothing we sent.
    pub hwm: Psn,
    /// Packets since the last one that requested an ACK.
    pub noack: u32,
    /// The next request packet asks for an ACK: congestion control times
    /// it for an RTT sample (set by the scheduler, cleared when sent).
    pub ask_ack: bool,
    /// READ and atomic WQEs sent and not yet completed.
    pub rd_atomic_inflight: u32,
    /// Where selective repeat stands on this QP.
    pub sr: SrMode,
    /// Selective repeat is resending one packet: the position (send queue
    /// index, packet index) to go on from once it has gone.
    pub resume: Option<(u64, u32)>,
}

/// Selective repeat on one QP's requester (docs/CONGESTION.md).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SrMode {
    /// Not offered (UC, UD, or turned off): go-back-N.
    #[default]
    Off,
    /// Offered in every request; the first response says whether the peer
    /// accepts.
    Offer,
    /// The peer accepted: a sequence NAK asks for the one packet it names.
    On,
    /// The peer answered without accepting: go-back-N, offer withdrawn.
    Gbn,
}

impl Requester {
    pub fn reset_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.hwm = psn;
        self.pkt_idx = 0;
    }
}

/// Position of a packet within its message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pos {
    First,
    Middle,
    Last,
    Only,
}

fn pos(idx: u32, n: u32) -> Pos {
    match (idx, n) {
        (_, 1) => Pos::Only,
        (0, _) => Pos::First,
        (i, n) if i + 1 == n => Pos::Last,
        _ => Pos::Middle,
    }
}

/// The BTH opcode for an operation at a position. Returns `None` for
/// combinations IBA does not define (validated away at post time).
fn opcode(t: QpType, op: &SendOp, p: Pos) -> Option<Opcode> {
    use SendOp::*;
    let base = match t {
        QpType::Rc => 0x00,
        QpType::XrcSend => 0xa0,
        QpType::XrcRecv => return None,
        QpType::Uc => 0x20,
        QpType::Ud => {
            return match op {
                Send => Some(Opcode::UD_SEND_ONLY),
                SendWithImm { .. } => Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE),
                _ => None,
            }
        }
    };
    let off = match (op, p) {
        (Send | SendWithImm { .. } | SendWithInv { .. }, Pos::First) => 0x00,
        (Send | SendWithImm { .. } | SendWithInv { .. }, Pos::Middle) => 0x01,
        (Send, Pos::Last) => 0x02,
        (SendWithImm { .. }, Pos::Last) => 0x03,
        (Send, Pos::Only) => 0x04,
        (SendWithImm { .. }, Pos::Only) => 0x05,
        (SendWithInv { .. }, Pos::Last) if t.is_reliable() => 0x16,
        (SendWithInv { .. }, Pos::Only) if t.is_reliable() => 0x17,
        (Write { .. } | WriteWithImm { .. }, Pos::First) => 0x06,
        (Write { .. } | WriteWithImm { .. }, Pos::Middle) => 0x07,
        (Write { .. }, Pos::Last) => 0x08,
        (WriteWithImm { .. }, Pos::Last) => 0x09,
        (Write { .. }, Pos::Only) => 0x0a,
        (WriteWithImm { .. }, Pos::Only) => 0x0b,
        (Read { .. }, _) if t.is_reliable() => 0x0c,
        (CompareSwap { .. }, _) if t.is_reliable() => 0x13,
        (FetchAdd { .. }, _) if t.is_reliable() => 0x14,
        (AtomicWrite { .. }, Pos::Only) if t == QpType::Rc => 0x1d,
        _ => return None,
    };
    Some(Opcode(base + off))
}

/// PSNs a message occupies.
pub(crate) fn packets_for(op: &SendOp, length: u32, mtu: u32) -> u32 {
    if op.is_atomic() {
        1
    } else {
        length.div_ceil(mtu).max(1)
    }
}

/// Why the requester has no packet to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Nothing it may send whatever the gates say: no work, a fence, the
    /// READ/atomic limit, an RNR back-off, a draining or unready QP.
    Idle,
    /// The next packet, with this PSN, is at or past the gate's limit.
    Gate(Psn),
    /// Work that sends no packet: a bind or local invalidate to carry out,
    /// a finished WQE to complete. The scheduler visits the QP for it.
    Local,
}

/// The packet the requester would send next.
#[derive(Clone, Copy)]
struct Next {
    idx: u64,
    wqe: super::queue::SendWqe,
    first_psn: Psn,
    npkts: u32,
    k: u32,
    psn: Psn,
}

impl Qp {
    /// `w` asked for a fence (IBV_SEND_FENCE) and a READ or atomic before
    /// it is still outstanding: it waits, and so does everything behind it.
    fn fenced(&self, w: &super::queue::SendWqe) -> bool {
        w.flags.contains(crate::wr::SendFlags::FENCE) && self.req.rd_atomic_inflight > 0
    }

    /// `w`, at send queue index `idx` and not started yet, waits to be
    /// carried out by the connection's offload (`Qp::offload_hold`; in SQD
    /// nothing starts anyway).
    fn held(&self, idx: u64, w: &super::queue::SendWqe) -> bool {
        self.offload_hold
            && idx >= self.hold_from
            && w.state == SendState::Posted
            && self.state == QpState::Rts
    }

    /// Carry out the bind and invalidate WQEs the requester has reached, in
    /// order, as rxe's `rxe_do_local_ops` does: they send nothing, and
    /// complete in order once what is before them has.
    fn run_local_ops(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(w) = self.sq.get(self.sq.send).copied() {
            if !w.op.is_local() || w.state != SendState::Posted || self.held(self.sq.send, &w) {
                return;
            }
            if self.fenced(&w) {
                return;
            }
            let status = match w.op {
                SendOp::BindMw(b) => match ctx.mrs.bind_mw(self.qpn, self.pd, &b) {
                    Ok(_) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                },
                SendOp::LocalInv { rkey } if ctx.mrs.invalidate_rkey(self.pd, rkey) => {
                    WcStatus::Success
                }
                _ => WcStatus::LocQpOpErr,
            };
            let idx = self.sq.send;
            self.sq.get_mut(idx).expect("present").state = SendState::Done(status);
            if status != WcStatus::Success {
                // Nothing after it starts: the requester stays on it (a
                // finished WQE, which `poll_request` does not send) until
                // it is the oldest, then it fails and the QP with it. Moving
                // on would hand the next WQE — another local operation,
                // which has no packet — to the packet builder.
                if idx == self.sq.tail {
                    self.settle_done(ctx);
                }
                return;
            }
            self.sq.send = idx + 1;
            self.req.pkt_idx = 0;
            if idx == self.sq.tail {
                self.settle_done(ctx);
            }
        }
    }

    /// The next request packet, if one may go: the protocol's own rules,
    /// then the transmit gate's `limit` (RC only: a packet whose PSN is not
    /// before it waits). Pure, so the scheduler asks it to decide whether
    /// the QP belongs on its ready list.
    fn next_request(&self, limit: Psn) -> Result<Next, Stop> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.comp.rnr_waiting() {
            return Err(Stop::Idle);
        }
        let idx = self.sq.send;
        let wqe = *self.sq.get(idx).ok_or(Stop::Idle)?;
        if self.held(idx, &wqe) {
            return Err(Stop::Idle);
        }
        match wqe.state {
            // Binds and invalidates send nothing but are the requester's
            // work; a finished WQE at the tail still has to complete.
            SendState::Posted if wqe.op.is_local() => {
                return if self.state == QpState::Rts && !self.fenced(&wqe) {
                    Err(Stop::Local)
                } else {
                    Err(Stop::Idle)
                };
            }
            SendState::Done(_) if idx == self.sq.tail => return Err(Stop::Local),
            SendState::Done(_) => return Err(Stop::Idle),
            _ => {}
        }
        let rc = self.qp_type.is_reliable();
        if wqe.state == SendState::Posted {
            if self.state == QpState::Sqd {
                return Err(Stop::Idle); // draining: start nothing new
            }
            if rc {
                if self.fenced(&wqe) {
                    return Err(Stop::Idle);
                }
                if wqe.op.is_read_or_atomic()
                    && self.req.rd_atomic_inflight >= (self.attr.max_rd_atomic as u32).max(1)
                {
                    return Err(Stop::Idle);
                }
            }
        }
        let first_psn = if wqe.state == SendState::Posted {
            self.req.next_psn
        } else {
            wqe.first_psn
        };
        let npkts = packets_for(&wqe.op, wqe.length, self.mtu());
        let k = self.req.pkt_idx;
        let psn = first_psn.add(k);
        if rc && !psn.before(limit) {
            return Err(Stop::Gate(psn));
        }
        Ok(Next {
            idx,
            wqe,
            first_psn,
            npkts,
            k,
            psn,
        })
    }

    /// Whether a request packet may go now under `limit`, and if not, why.
    pub(crate) fn request_ready(&self, limit: Psn) -> Result<(), Stop> {
        self.next_request(limit).map(|_| ())
    }

    /// Build the next request packet, if the send queue has one to send now
    /// and its PSN is before the transmit gate's `limit`.
    pub(crate) fn poll_request(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        ctx: &mut Ctx<'_>,
        limit: Psn,
        mem: &impl Memory,
    ) -> Option<Transmit> {
        let mut t = Transmit::default();
        self.poll_request_into(now, buf, ctx, limit, mem, &mut t)
            .map(|()| t)
    }

    /// [`Qp::poll_request`] into `out` (a burst's slot: no packet-sized
    /// value built and moved per packet). `out` is unspecified when it
    /// returns `None`.
    pub(crate) fn poll_request_into(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        ctx: &mut Ctx<'_>,
        limit: Psn,
        mem: &impl Memory,
        out: &mut Transmit,
    ) -> Option<()> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.comp.rnr_waiting() {
            return None;
        }
        if self.state == QpState::Rts {
            self.run_local_ops(ctx);
        }
        let idx = self.sq.send;
        if let SendState::Done(_) = self.sq.get(idx)?.state {
            // Nothing more of it goes out; it completes once it is the oldest.
            if idx == self.sq.tail {
                self.settle_done(ctx);
            }
            return None;
        }
        let Next {
            idx,
            wqe,
            first_psn,
            npkts,
            k,
            psn,
        } = self.next_request(limit).ok()?;
        let mtu = self.mtu();
        let rc = self.qp_type.is_reliable();

        let is_read = matches!(wqe.op, SendOp::Read { .. });
        let p = if is_read || wqe.op.is_atomic() {
            Pos::Only
        } else {
            pos(k, npkts)
        };
        let op = opcode(self.qp_type, &wqe.op, p).expect("validated at post");
        let info = op.info().expect("table");
        let off = k as u64 * mtu as u64;
        let mut ext = ExtRepr::default();
        let mut payload_len = 0usize;
        out.segs.clear();
        match wqe.op {
            SendOp::Read { remote_addr, rkey } => {
                ext.reth = Some(RethRepr {
                    va: remote_addr + off,
                    rkey,
                    dma_len: (wqe.length as u64 - off.min(wqe.length as u64)) as u32,
                });
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
            }
            _ => {
                payload_len = (wqe.length as u64 - off).min(mtu as u64) as usize;
                match wqe.op {
                    SendOp::Write { remote_addr, rkey }
                    | SendOp::AtomicWrite { remote_addr, rkey }
                    | SendOp::WriteWithImm {
                        remote_addr, rkey, ..
                    } if matches!(p, Pos::First | Pos::Only) => {
                        ext.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey,
                            dma_len: wqe.length,
                        });
                    }
                    _ => {}
                }
                if info.has(softrdma_wire::opcode::Flags::IMMDT) {
                    if let SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } = wqe.op {
                        ext.immdt = Some(ImmDtRepr { imm });
                    }
                }
                if let (SendOp::SendWithInv { rkey }, true) =
                    (wqe.op, info.has(softrdma_wire::opcode::Flags::IETH))
                {
                    ext.ieth = Some(IethRepr { rkey });
                }
            }
        }
        if info.has(softrdma_wire::opcode::Flags::XRCETH) {
            ext.xrceth = Some(XrcEthRepr { srqn: wqe.xrc_srqn });
        }
        let (dest_qp, dgid) = match (self.qp_type, wqe.ud) {
            (QpType::Ud, Some(ud)) => {
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                    self.attr.qkey
                } else {
                    ud.remote_qkey
                };
                ext.deth = Some(DethRepr {
                    qkey,
                    src_qp: self.qpn,
                });
                (ud.remote_qpn, ud.gid)
            }
            _ => (self.attr.dest_qp_num, self.attr.av.dgid),
        };
        let ends = matches!(p, Pos::Last | Pos::Only);
        // The last packet the gate lets through asks for the ACK that will
        // open it again. While a selective-repeat resend of the oldest PSN
        // is unanswered, the window opens only when that one is
        // acknowledged and its packet asked for the answer: then only the
        // first packet after the resend asks too (if the resend was lost,
        // that packet arrives held, and its NAK, naming a trigger sent
        // after the resend, sends it again without waiting for the resend
        // timer). Every later one would cost a NAK that says nothing new,
        // once per opening of the gate.
        let unanswered = self.comp.resend_unanswered();
        let gate_ask = rc && !psn.next().before(limit) && (!unanswered || !self.comp.resend_probed);
        let ack_req = rc
            && (ends
                || self.req.ask_ack
                // A resend by selective repeat: the answer says what the
                // responder lacks next.
                || self.req.resume.is_some()
                || self.req.noack + 1 >= ACK_REQ_EVERY
                || gate_ask);
        if gate_ask && self.req.resume.is_none() && unanswered {
            self.comp.resend_probed = true;
        }
        let solicited = ends
            && wqe.flags.contains(crate::wr::SendFlags::SOLICITED)
            && matches!(
                wqe.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::WriteWithImm { .. }
            );
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: op,
                solicited,
                migreq: false,
                pad: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp,
                ack_req,
                psn,
            },
            ext,
            payload_len,
        };
        repr.emit_headers(buf);
        if matches!(self.req.sr, SrMode::Offer | SrMode::On) {
            buf[softrdma_wire::bth::field::FECN_BECN] |= softrdma_wire::bth::SOFTRDMA_SR;
        }
        let mut head_len = repr.header_len();
        if payload_len > 0 {
            if wqe.inline_len > 0 {
                let data = &self.sq.inline(idx)[off as usize..off as usize + payload_len];
                buf[head_len..head_len + payload_len].copy_from_slice(data);
                head_len += payload_len;
            } else if gather(
                &ctx.mrs,
                self.sq.sges(idx),
                off,
                payload_len as u64,
                &mut out.segs,
            )
            .and_then(|checked| {
                // Bytes of an implicit region are copied in here, checked,
                // rather than handed on as segments.
                if checked {
                    copy_checked(
                        &mut out.segs,
                        mem,
                        &mut buf[head_len..head_len + payload_len],
                    )?;
                    head_len += payload_len;
                }
                Ok(())
            })
            .is_err()
            {
                // An SGE's region was deregistered after the post (or an
                // implicit region's page is not there): the local
                // protection error IBA defines (rxe's finish_packet gives
                // LOC_PROT_ERR for a range it cannot copy, LOC_QP_OP_ERR for
                // an lkey it cannot find; mlx5 gives LOC_PROT_ERR for both).
                self.sq.get_mut(idx).expect("present").state =
                    SendState::Done(WcStatus::LocProtErr);
                if idx == self.sq.tail {
                    self.settle_done(ctx);
                }
                return None;
            }
        }

        // Advance.
        if wqe.state == SendState::Posted {
            let w = self.sq.get_mut(idx).expect("present");
            w.state = SendState::Sent;
            w.first_psn = first_psn;
            w.npkts = npkts;
            self.req.next_psn = first_psn.add(npkts);
            if wqe.op.is_read_or_atomic() {
                self.req.rd_atomic_inflight += 1;
            }
        }
        let hwm_before = self.req.hwm;
        let consumed = if is_read { npkts - k } else { 1 };
        let after = psn.add(consumed);
        if psn.before(self.req.hwm) {
            ctx.stats.retransmits += 1;
        }
        if after.after(self.req.hwm) {
            self.req.hwm = after;
        }
        self.req.ask_ack = false;
        if ack_req {
            self.req.noack = 0;
        } else {
            self.req.noack += 1;
        }
        if is_read || wqe.op.is_atomic() || k + 1 >= npkts {
            self.sq.send = idx + 1;
            self.req.pkt_idx = 0;
        } else {
            self.req.pkt_idx = k + 1;
        }
        if let Some((i, k)) = self.req.resume.take() {
            // Selective repeat resent the one packet it was asked for: on
            // from where the requester was.
            self.sq.send = i;
            self.req.pkt_idx = k;
            self.comp
                .arm_resend_timer(now, local_ack_timeout_ns(self.attr.timeout));
        } else if self.req.sr == SrMode::On && ack_req && !psn.before(hwm_before) {
            self.comp.time_packet(psn, now);
        }
        if rc {
            self.comp.arm_timer(now, self.attr.timeout);
        } else if ends {
            // UC and UD complete once the last packet is on its way.
            let w = self.sq.pop_tail().expect("tail is the WQE just sent");
            if w.signaled {
                let mut c = Completion::new(
                    w.wr_id,
                    WcStatus::Success,
                    super::wc_opcode_of(&w.op),
                    self.qpn,
                );
                c.byte_len = w.length;
                ctx.complete(self.send_cq, c, false);
            }
        }
        out.dgid = dgid;
        out.src_qpn = self.qpn;
        out.head_len = head_len;
        out.pad = repr.pad_len() as u8;
        Some(())
    }
}
