//! The responder: executes inbound requests and queues its responses.
//!
//! Responses leave in PSN order through one bounded queue: a READ's response
//! stream, an atomic's acknowledgement and plain ACKs/NAKs. Consecutive ACKs
//! coalesce into the newest (an ACK for PSN n acknowledges everything before
//! it), so a burst of requests costs one ACK. READ and atomic requests are
//! remembered in a small ring (`max_dest_rd_atomic` entries) so that a
//! duplicate is answered again — a READ re-read, an atomic from its cached
//! result, never executed twice.

use std::collections::VecDeque;

use softrdma_wire::bth::{BthRepr, DEFAULT_PKEY};
use softrdma_wire::ext::*;
use softrdma_wire::opcode::Flags;
use softrdma_wire::packet::{ExtRepr, PacketRepr};
use softrdma_wire::{Opcode, Packet, Psn};

use super::attr::AccessFlags;
use super::reorder::{Hold, Staging};
use super::state::QpType;
use super::Qp;
use crate::cq::CqId;
use crate::endpoint::{Ctx, RxMeta};
use crate::mr::{Host, MemRef, Memory, PdId, RemoteAccessError, Span};
use crate::transmit::{Seg, Segs, Transmit};
use crate::wc::{wc_flags, Completion, WcOpcode, WcStatus};
use crate::Event;

/// A response waiting to be sent.
#[derive(Debug, Clone, Copy)]
enum Resp {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
        /// Answers a duplicate (see `Responder::reads_and_atomics_queued`).
        replay: bool,
    },
    /// A READ response stream: `idx` of `npkts` packets sent so far. The
    /// bytes are `len` at offset `off` of `mem`, translated as each packet
    /// is built.
    Read {
        psn: Psn,
        mem: MemRef,
        off: u64,
        len: u64,
        idx: u32,
        npkts: u32,
        msn: u32,
        /// Answers a duplicate (see `Responder::reads_and_atomics_queued`).
        replay: bool,
    },
}

/// A remembered READ or atomic, for duplicates.
#[derive(Debug, Clone, Copy)]
enum Res {
    Read { first: Psn, npkts: u32 },
    Atomic { psn: Psn, orig: u64 },
}

/// The message being received, for multi-packet SEND and WRITE.
#[derive(Debug, Clone, Copy, Default)]
enum Cur {
    #[default]
    Idle,
    Send {
        wr_id: u64,
        nsge: u8,
        capacity: u64,
        offset: u64,
    },
    /// The next byte goes to offset `off` of `mem`.
    Write {
        mem: MemRef,
        off: u64,
        remaining: u64,
        total: u64,
    },
    /// UC: the rest of a message is being dropped.
    Dropping,
}

/// What went wrong with a request, and what the requester will be told.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Drop silently (UC/UD).
    Drop,
    Nak(NakCode, Event),
    /// UC/UD: the QP enters ERR at once (there is no NAK to send first).
    Fatal,
}

#[derive(Debug)]
pub(crate) struct Responder {
    pub epsn: Psn,
    pub msn: u32,
    /// A NAK (sequence or RNR) for `epsn` went out; stay quiet until it arrives.
    nak_sent: bool,
    cur: Cur,
    /// The SGEs of the receive WQE `cur` (or `spare`) holds.
    sges: [Span; crate::MAX_SGE],
    /// UC: a receive WQE taken for a message that was then dropped, reused
    /// by the next message.
    spare: Option<(u64, u8, u64)>,
    res: Vec<Option<Res>>,
    res_next: usize,
    out: VecDeque<Resp>,
    out_cap: usize,
    /// A fatal NAK is queued: once this many queue entries (the NAK and
    /// what is ahead of it; a READ response stream counts once) have left,
    /// the QP goes to ERR and raises the event.
    fatal: Option<(usize, Event)>,
    /// The requester offered selective repeat and this endpoint accepts:
    /// hold what arrives ahead of `epsn`, mark responses (see `reorder`).
    pub peer_sr: bool,
    /// Requests held ahead of `epsn`, allocated at the first one.
    held: Option<Box<Staging>>,
    /// XRC target: the SRQ the request being executed names, with its PD
    /// and CQ (set by each request from its XRCETH).
    xrc: Option<XrcTarget>,
}

/// Where an XRC target QP delivers one request: the XRC SRQ its XRCETH
/// names, whose PD checks the memory the request reaches and whose CQ
/// gets its receive completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct XrcTarget {
    srqn: u32,
    pd: PdId,
    cq: CqId,
}

impl Responder {
    /// No receive is held for a message in progress (nor a UC spare),
    /// nothing is held ahead of `epsn` and no NAK waits for its answer: the
    /// receive queue's WQEs are all unused.
    pub fn recv_idle(&self) -> bool {
        matches!(self.cur, Cur::Idle)
            && self.spare.is_none()
            && !self.nak_sent
            && self.held.as_ref().is_none_or(|h| h.count == 0)
    }

    /// Let go of the receive WQEs a message in progress (`cur`) and a UC
    /// drop (`spare`) hold, oldest first, as (`wr_id`) for the caller to
    /// complete: the QP is leaving service, and every WR must end.
    pub fn take_held_recvs(&mut self) -> [Option<u64>; 2] {
        let cur = match std::mem::take(&mut self.cur) {
            Cur::Send { wr_id, .. } => Some(wr_id),
            _ => None,
        };
        [cur, self.spare.take().map(|(wr_id, _, _)| wr_id)]
    }

    pub fn new(resources: usize) -> Responder {
        let out_cap = resources + 8;
        Responder {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            cur: Cur::Idle,
            sges: [Span::default(); crate::MAX_SGE],
            spare: None,
            res: vec![None; resources],
            res_next: 0,
            out: VecDeque::with_capacity(out_cap),
            out_cap,
            fatal: None,
            peer_sr: false,
            held: None,
            xrc: None,
        }
    }

    /// Give the held requests' buffers back to the endpoint's pool.
    pub fn release_held(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(h) = self.held.as_mut() {
            h.clear(&mut ctx.reorder);
        }
    }

    /// Selective repeat: queue a sequence NAK for `epsn`, prompted by the
    /// request with PSN `trigger`, unless the newest queued response is
    /// that NAK already. A positive ACK just before it goes: the NAK
    /// acknowledges everything before `epsn` too.
    ///
    /// Between peers that negotiated selective repeat the NAK's MSN field
    /// carries `trigger` (IRN's NACK names the packet that prompted it the
    /// same way): the requester resends `epsn` again only for a trigger it
    /// sent after its last resend of it, so the NAKs of requests that were
    /// already on their way do not each cost a resend. The requester has
    /// no other use for a NAK's MSN.
    fn push_seq_nak(&mut self, trigger: Psn, ctx: &mut Ctx<'_>) {
        let (epsn, msn) = (self.epsn, trigger.value());
        match self.out.back() {
            Some(Resp::Ack {
                psn,
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                ..
            }) if *psn == epsn => return,
            Some(Resp::Ack {
                syndrome: Syndrome::Ack { .. },
                ..
            }) => {
                self.out.pop_back();
            }
            _ => {}
        }
        if !self.has_room() {
            return;
        }
        self.nak_sent = true;
        ctx.stats.seq_naks_sent += 1;
        self.out.push_back(Resp::Ack {
            psn: epsn,
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn,
        });
    }

    pub fn reset_psn(&mut self, psn: Psn) {
        self.epsn = psn;
    }

    pub fn set_resources(&mut self, n: usize) {
        self.res = vec![None; n];
        self.res_next = 0;
        self.out_cap = n + 8;
        self.out.reserve(self.out_cap);
    }

    pub fn clear_output(&mut self) {
        self.out.clear();
    }

    /// A response is queued: the scheduler's test for "this QP has work".
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    fn has_room(&self) -> bool {
        self.out.len() < self.out_cap
    }

    fn push_ack(&mut self, psn: Psn, msn: u32) {
        if let Some(Resp::Ack {
            syndrome: Syndrome::Ack { .. },
            ..
        }) = self.out.back()
        {
            self.out.pop_back();
        }
        self.out.push_back(Resp::Ack {
            psn,
            syndrome: Syndrome::ACK_UNLIMITED,
            msn,
        });
    }

    fn remember(&mut self, r: Res) {
        let n = self.res.len();
        self.res[self.res_next] = Some(r);
        self.res_next = (self.res_next + 1) % n;
    }

    /// READ and atomic requests accepted and not yet answered in full,
    /// held against `max_dest_rd_atomic`. Replays for duplicates do not
    /// count: they are not new requests, and a requester that times out
    /// while a long READ stream is still queued here asks for it again and
    /// again — counted, those replays made a legal new READ or atomic look
    /// like one too many and the QP fail with an invalid request NAK.
    fn reads_and_atomics_queued(&self) -> usize {
        self.out
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Resp::Read { replay: false, .. } | Resp::Atomic { replay: false, .. }
                )
            })
            .count()
    }
}

/// Every kind of remote access fault is one NAK on the wire.
/// Requests held behind a gap before selective repeat NAKs it, unless one
/// of them asks for an ACK first: TCP's duplicate-ACK threshold (RFC 5681)
/// for the same trade — a packet overtaken by fewer is not resent, a lost
/// one waits for this many more arrivals (or the next ACK request, at most
/// `ACK_REQ_EVERY` packets on) before its NAK.
const DUPTHRESH: u32 = 3;

fn nak_for(_: RemoteAccessError) -> Fault {
    Fault::Nak(NakCode::RemoteAccessError, Event::QpAccessErr(0))
}

impl Qp {
    /// The PD the responder checks memory against: the QP's own, or for an
    /// XRC target the PD of the SRQ the current request names.
    fn rx_pd(&self) -> PdId {
        self.resp.xrc.map_or(self.pd, |t| t.pd)
    }

    /// The CQ receive completions go to: the QP's, or for an XRC target
    /// that of the SRQ the current request names.
    pub(crate) fn rx_cq(&self) -> CqId {
        self.resp.xrc.map_or(self.recv_cq, |t| t.cq)
    }

    /// The XRC SRQ a request's XRCETH names, if it exists and belongs to
    /// this target's XRC domain.
    fn xrc_target(&self, repr: &PacketRepr, ctx: &Ctx<'_>) -> Option<XrcTarget> {
        let srqn = repr.ext.xrceth?.srqn;
        let slot = ctx.srqs.get(srqn as usize)?.as_ref()?;
        let x = slot.xrc?;
        if Some(x.xrcd) != self.xrcd {
            return None;
        }
        Some(XrcTarget {
            srqn,
            pd: slot.pd,
            cq: x.cq,
        })
    }

    /// A request packet for this QP (the responder side).
    pub(crate) fn handle_request(
        &mut self,
        meta: &RxMeta,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        match self.qp_type {
            QpType::Rc | QpType::XrcRecv => self.request_rc(pkt, repr, ctx, mem),
            // An initiator has no responder: a request for it is not ours.
            QpType::XrcSend => ctx.stats.malformed += 1,
            QpType::Uc => self.request_uc(pkt, repr, ctx, mem),
            QpType::Ud => self.request_ud(meta, pkt, repr, ctx, mem),
        }
    }

    fn request_rc(
        &mut self,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        if self.resp.fatal.is_some() {
            // Going to ERR once the fatal NAK has left: not ready.
            ctx.stats.dropped_no_qp += 1;
            return;
        }
        if ctx.sr && self.sr_allowed && pkt.bth().softrdma_sr() {
            self.resp.peer_sr = true;
        }
        let psn = repr.bth.psn;
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            ctx.stats.out_of_sequence += 1;
            if self.resp.peer_sr {
                self.hold_ahead(pkt, repr, ctx);
                return;
            }
            if !self.resp.nak_sent && self.resp.has_room() {
                self.resp.nak_sent = true;
                ctx.stats.seq_naks_sent += 1;
                let (epsn, msn) = (self.resp.epsn, self.resp.msn);
                self.resp.out.push_back(Resp::Ack {
                    psn: epsn,
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn,
                });
            }
            return;
        }
        if d < 0 {
            ctx.stats.duplicates += 1;
            self.duplicate(pkt, repr, ctx);
            return;
        }
        if !self.resp.has_room() {
            ctx.stats.responder_busy += 1;
            return; // back-pressure: the requester will resend
        }
        let advanced = self.accept(pkt, repr, ctx, mem);
        if advanced && self.resp.held.as_ref().is_some_and(|h| h.count > 0) {
            self.run_held(repr.bth.psn, repr.bth.ack_req, ctx, mem);
        }
    }

    /// Selective repeat: a request ahead of `epsn`. Hold it, and NAK the
    /// gap before it once [`DUPTHRESH`] requests wait behind the gap (so a
    /// packet merely overtaken by one or two others is not resent), and
    /// again whenever a held request asks for an ACK (the requester waits
    /// on that answer; it also repairs a lost NAK or a lost resend without
    /// the retransmission timer).
    fn hold_ahead(&mut self, pkt: &Packet<&[u8]>, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        let epsn = self.resp.epsn;
        let held = self
            .resp
            .held
            .get_or_insert_with(|| Box::new(Staging::new()));
        match held.hold(&mut ctx.reorder, epsn, repr.bth.psn, pkt.bytes()) {
            Hold::Kept => ctx.stats.held_out_of_order += 1,
            Hold::Already => ctx.stats.duplicates += 1,
            Hold::Dropped => ctx.stats.hold_dropped += 1,
        }
        if repr.bth.ack_req || (!self.resp.nak_sent && held.count >= DUPTHRESH) {
            self.resp.push_seq_nak(repr.bth.psn, ctx);
        }
    }

    /// Execute the held requests that follow `epsn` without a gap, in
    /// order, as if they had just arrived. `ack_asked`: the request that
    /// filled the gap asked for an ACK; it is sent for the whole run. If a
    /// gap remains with requests held behind it, its packet is lost (the
    /// held ones were sent after it, an RTT ago): NAK it at once.
    fn run_held(
        &mut self,
        trigger: Psn,
        mut ack_asked: bool,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        loop {
            let epsn = self.resp.epsn;
            let Some(slot) = (self.resp.held.as_mut()).and_then(|h| h.take(&mut ctx.reorder, epsn))
            else {
                break;
            };
            let buf = ctx.reorder.take(slot);
            let done = match Packet::new_checked(&buf[..]) {
                Ok(pkt) => match PacketRepr::parse(&pkt) {
                    Ok(repr) => {
                        ack_asked |= repr.bth.ack_req;
                        self.resp.fatal.is_none()
                            && self.resp.has_room()
                            && self.accept(&pkt, &repr, ctx, mem)
                    }
                    Err(_) => false,
                },
                Err(_) => false,
            };
            ctx.reorder.put_back(slot, buf);
            if !done {
                // An RNR NAK, a fatal NAK or a full response queue: the
                // requester goes back to `epsn` and resends the rest anyway.
                self.resp.release_held(ctx);
                return;
            }
        }
        if self.resp.held.as_ref().is_some_and(|h| h.count > 0) {
            self.resp.push_seq_nak(trigger, ctx);
        } else if ack_asked {
            let (last, msn) = (self.resp.epsn.sub(1), self.resp.msn);
            self.resp.push_ack(last, msn);
        }
    }

    /// Execute an in-sequence request and queue what it answers. Returns
    /// whether `epsn` moved past it.
    fn accept(
        &mut self,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) -> bool {
        let psn = repr.bth.psn;
        match self.execute(pkt, repr, ctx, mem) {
            Ok(true) => {
                self.resp.nak_sent = false;
                if pkt.info().has(Flags::READ) {
                    // epsn advanced by the READ itself
                } else {
                    self.resp.epsn = psn.next();
                }
                if repr.bth.ack_req && !pkt.info().flags.intersects(Flags::READ | Flags::ATOMIC) {
                    let msn = self.resp.msn;
                    self.resp.push_ack(psn, msn);
                }
                return true;
            }
            Ok(false) => {} // RNR NAK queued; epsn unchanged
            Err(Fault::Drop) => {}
            Err(Fault::Fatal) => self.fatal_now(Event::QpFatal(self.qpn), ctx),
            Err(Fault::Nak(code, ev)) => {
                match code {
                    NakCode::RemoteAccessError => ctx.stats.access_naks_sent += 1,
                    NakCode::InvalidRequest => ctx.stats.invalid_naks_sent += 1,
                    _ => {}
                }
                let msn = self.resp.msn;
                self.resp.out.push_back(Resp::Ack {
                    psn,
                    syndrome: Syndrome::Nak(code),
                    msn,
                });
                let ev = match ev {
                    Event::QpAccessErr(_) => Event::QpAccessErr(self.qpn),
                    Event::QpFatal(_) => Event::QpFatal(self.qpn),
                    _ => Event::QpReqErr(self.qpn),
                };
                self.resp.fatal = Some((self.resp.out.len(), ev));
            }
        }
        false
    }

    /// Execute an in-sequence request. `Ok(true)`: done, advance; `Ok(false)`:
    /// receiver not ready (an RNR NAK is queued).
    fn execute(
        &mut self,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) -> Result<bool, Fault> {
        let info = pkt.info();
        let rc = self.qp_type.is_reliable();
        let invalid = if rc {
            Fault::Nak(NakCode::InvalidRequest, Event::QpReqErr(0))
        } else {
            Fault::Drop
        };
        // Opcode sequence: a message in progress continues, otherwise one starts.
        let starts = info.starts_message() || info.flags.intersects(Flags::READ | Flags::ATOMIC);
        let seq_ok = match self.resp.cur {
            Cur::Send { .. } => info.has(Flags::SEND) && !starts,
            Cur::Write { .. } => info.has(Flags::WRITE) && !starts,
            _ => starts,
        };
        if !seq_ok {
            return Err(invalid);
        }
        if self.qp_type == QpType::XrcRecv {
            // Every XRC request names its SRQ; one this target may not
            // deliver to is an invalid request (IBA Annex A14).
            let t = self.xrc_target(repr, ctx).ok_or(invalid)?;
            // A message's later packets name the SRQ its first one did.
            if !starts && self.resp.xrc.is_some_and(|p| p.srqn != t.srqn) {
                return Err(invalid);
            }
            self.resp.xrc = Some(t);
        }
        let mtu = self.mtu() as usize;
        let data = pkt.payload();
        let ends = info.ends_message();
        if info.flags.intersects(Flags::SEND | Flags::WRITE) {
            let full = info.flags.intersects(Flags::FIRST | Flags::MIDDLE);
            if data.len() > mtu || (full && data.len() != mtu) {
                return Err(invalid);
            }
        }
        if info.has(Flags::SEND) {
            if info.starts_message() {
                let Some((wr_id, nsge, cap)) = self.take_recv(ctx) else {
                    return self.not_ready(repr.bth.psn, ctx);
                };
                self.resp.cur = Cur::Send {
                    wr_id,
                    nsge,
                    capacity: cap,
                    offset: 0,
                };
            }
            let Cur::Send {
                wr_id,
                nsge,
                capacity,
                offset,
            } = self.resp.cur
            else {
                unreachable!("checked by the sequence test")
            };
            let end = offset + data.len() as u64;
            if end > capacity {
                // The receive buffer is too small: its WQE completes in error.
                let c = Completion::new(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, self.qpn);
                ctx.complete(self.rx_cq(), c, false);
                self.resp.cur = Cur::Idle;
                return Err(invalid);
            }
            let sges = &self.resp.sges[..nsge as usize];
            if super::queue::scatter(&ctx.mrs, sges, offset, data, mem).is_err() {
                // A region of the receive buffer was deregistered while the
                // WQE was posted or half filled: rxe's malformed-WQE case.
                let c = Completion::new(wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qpn);
                ctx.complete(self.rx_cq(), c, false);
                self.resp.cur = Cur::Idle;
                return Err(self.local_fault());
            }
            self.resp.cur = Cur::Send {
                wr_id,
                nsge,
                capacity,
                offset: end,
            };
            if ends {
                let mut c = Completion::new(wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
                c.byte_len = end as u32;
                if let Some(i) = repr.ext.immdt {
                    c.wc_flags |= wc_flags::WITH_IMM;
                    c.imm_or_inv = i.imm;
                }
                if let Some(i) = repr.ext.ieth {
                    if !ctx.mrs.invalidate_rkey(self.rx_pd(), i.rkey) {
                        self.resp.cur = Cur::Idle;
                        let c = Completion::new(
                            wr_id,
                            WcStatus::RemInvReqErr,
                            WcOpcode::Recv,
                            self.qpn,
                        );
                        ctx.complete(self.rx_cq(), c, false);
                        return Err(invalid);
                    }
                    c.wc_flags |= wc_flags::WITH_INV;
                    c.imm_or_inv = i.rkey;
                }
                ctx.complete(self.rx_cq(), c, repr.bth.solicited);
                self.resp.cur = Cur::Idle;
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            }
            return Ok(true);
        }
        if info.has(Flags::WRITE) {
            // Where this packet's bytes go: a new message's RETH, or the
            // message in progress. Nothing is stored until the packet is
            // accepted, so an RNR NAK (a WRITE with immediate finding no
            // receive) leaves the responder as the retransmission expects it.
            let (target, off, remaining, total) = match (repr.ext.reth, self.resp.cur) {
                (Some(reth), _) => {
                    if !self.allows(AccessFlags::REMOTE_WRITE) {
                        return Err(self.access_fault());
                    }
                    let len = reth.dma_len as u64;
                    if len > crate::MAX_MSG_SIZE {
                        return Err(invalid);
                    }
                    let (target, off) = ctx
                        .mrs
                        .resolve_remote(
                            self.qpn,
                            self.rx_pd(),
                            reth.rkey,
                            reth.va,
                            len,
                            AccessFlags::REMOTE_WRITE,
                        )
                        .map_err(|e| if rc { nak_for(e) } else { Fault::Drop })?;
                    (target, off, len, len)
                }
                (
                    None,
                    Cur::Write {
                        mem,
                        off,
                        remaining,
                        total,
                    },
                ) => (mem, off, remaining, total),
                (None, _) => unreachable!("checked by the sequence test"),
            };
            let n = data.len() as u64;
            if n > remaining || (ends && n != remaining) {
                self.resp.cur = Cur::Idle;
                return Err(invalid);
            }
            // Translated now, for this packet alone: the region may have
            // been deregistered since the message's first packet.
            let gone = || {
                if rc {
                    nak_for(RemoteAccessError::BadRkey)
                } else {
                    Fault::Drop
                }
            };
            let Some(at) = ctx.mrs.locate(target, off, n) else {
                self.resp.cur = Cur::Idle;
                return Err(gone());
            };
            let addr = at.addr;
            let mut imm_wqe = None;
            if ends && info.has(Flags::IMMDT) {
                match self.take_recv(ctx) {
                    Some(w) => imm_wqe = Some(w),
                    None => return self.not_ready(repr.bth.psn, ctx),
                }
            }
            if info.has(Flags::ATOMIC_WRITE) {
                // One aligned 64-bit word, as rxe's atomic_write_reply
                // checks it: 8 bytes, an aligned VA and an aligned host
                // address (the region may start off a word boundary); else
                // an Invalid Request NAK.
                let Ok(word) = <[u8; 8]>::try_from(data) else {
                    return Err(invalid);
                };
                let va_aligned = repr.ext.reth.is_some_and(|r| r.va.is_multiple_of(8));
                if total != 8 || !va_aligned || !addr.is_multiple_of(8) {
                    return Err(invalid);
                }
                if at.store_u64(mem, word).is_err() {
                    self.resp.spare = imm_wqe;
                    return Err(gone());
                }
            } else if n > 0 && place(at, mem, data, ends).is_err() {
                // An implicit region's page is not there (or not
                // writable): the remote access error of a range outside
                // a region; bytes of this packet before the hole may have
                // landed, as a faulting DMA leaves them. A receive taken
                // for the immediate is left aside, as a dropped message
                // leaves it: UC's next message uses it, RC's ERR flushes
                // it.
                self.resp.cur = Cur::Idle;
                self.resp.spare = imm_wqe;
                return Err(gone());
            }
            self.resp.cur = Cur::Write {
                mem: target,
                off: off + n,
                remaining: remaining - n,
                total,
            };
            if ends {
                self.resp.cur = Cur::Idle;
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                if let Some((wr_id, _, _)) = imm_wqe {
                    let c = Completion::received_write_imm(
                        wr_id,
                        self.qpn,
                        total as u32,
                        repr.ext.immdt.map_or(0, |i| i.imm),
                    );
                    ctx.complete(self.rx_cq(), c, repr.bth.solicited);
                }
            }
            return Ok(true);
        }
        if info.has(Flags::READ) {
            let reth = repr.ext.reth.expect("table: READ has RETH");
            if !self.allows(AccessFlags::REMOTE_READ) {
                return Err(self.access_fault());
            }
            if self.resp.reads_and_atomics_queued() >= self.resp.res.len() {
                return Err(invalid);
            }
            let len = reth.dma_len as u64;
            if len > crate::MAX_MSG_SIZE {
                // IBA's largest message; rxe's check_length NAKs it too.
                return Err(invalid);
            }
            let npkts = len.div_ceil(mtu as u64).max(1);
            // Half the PSN space or more in one response: its PSNs could
            // not be told from those before it (see `MAX_MSG_PSNS`).
            if npkts >= crate::MAX_MSG_PSNS {
                return Err(invalid);
            }
            let npkts = npkts as u32;
            let (target, off) = ctx
                .mrs
                .resolve_remote(
                    self.qpn,
                    self.rx_pd(),
                    reth.rkey,
                    reth.va,
                    len,
                    AccessFlags::REMOTE_READ,
                )
                .map_err(nak_for)?;
            let psn = repr.bth.psn;
            self.resp.remember(Res::Read { first: psn, npkts });
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            let msn = self.resp.msn;
            self.resp.out.push_back(Resp::Read {
                psn,
                mem: target,
                off,
                len,
                idx: 0,
                npkts,
                msn,
                replay: false,
            });
            self.resp.epsn = psn.add(npkts);
            // The READ's response takes PSNs psn+1.. too: nothing held
            // for them is a request (see `Staging`).
            if let Some(h) = self.resp.held.as_mut() {
                h.skip(&mut ctx.reorder, psn.next(), npkts - 1);
            }
            return Ok(true);
        }
        if info.has(Flags::ATOMIC) {
            let a = repr.ext.atomic_eth.expect("table: atomics have AtomicETH");
            if !self.allows(AccessFlags::REMOTE_ATOMIC) {
                return Err(self.access_fault());
            }
            if self.resp.reads_and_atomics_queued() >= self.resp.res.len() {
                return Err(invalid);
            }
            if !a.va.is_multiple_of(8) {
                return Err(invalid);
            }
            let (target, off) = ctx
                .mrs
                .resolve_remote(
                    self.qpn,
                    self.rx_pd(),
                    a.rkey,
                    a.va,
                    8,
                    AccessFlags::REMOTE_ATOMIC,
                )
                .map_err(nak_for)?;
            let at = ctx
                .mrs
                .locate(target, off, 8)
                .ok_or(nak_for(RemoteAccessError::BadRkey))?;
            let addr = at.addr;
            // An aligned VA can still land on a misaligned host address (a
            // region registered at buf + 4 with an aligned iova); the memory
            // behind `Memory::compare_swap` needs a real 8-byte word. rxe's
            // atomic_reply checks the translated address likewise
            // (RESPST_ERR_MISALIGNED_ATOMIC: Invalid Request NAK).
            if !addr.is_multiple_of(8) {
                return Err(invalid);
            }
            // RC's COMPARE SWAP, or XRC's (RC's opcode plus 0xa0). An
            // implicit region's word may not be there: a remote access
            // error, as for a word outside a region.
            let orig = if repr.bth.opcode.0 & 0x1f == Opcode::RC_COMPARE_SWAP.0 {
                at.compare_swap(mem, a.compare, a.swap_add)
            } else {
                at.fetch_add(mem, a.swap_add)
            }
            .map_err(|_| nak_for(RemoteAccessError::BadRkey))?;
            let psn = repr.bth.psn;
            self.resp.remember(Res::Atomic { psn, orig });
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            let msn = self.resp.msn;
            self.resp.out.push_back(Resp::Atomic {
                psn,
                orig,
                msn,
                replay: false,
            });
            return Ok(true);
        }
        Err(invalid)
    }

    /// A receive buffer could not be written (its region is gone): for RC
    /// rxe's class A answer, a Remote Operational Error NAK and ERR; UC and
    /// UD have no one to tell and go to ERR.
    fn local_fault(&self) -> Fault {
        if self.qp_type.is_reliable() {
            Fault::Nak(NakCode::RemoteOperationalError, Event::QpFatal(0))
        } else {
            Fault::Fatal
        }
    }

    fn access_fault(&self) -> Fault {
        if self.qp_type.is_reliable() {
            Fault::Nak(NakCode::RemoteAccessError, Event::QpAccessErr(0))
        } else {
            Fault::Drop
        }
    }

    /// No receive WQE: RNR NAK (RC) or drop the message (UC).
    fn not_ready(&mut self, psn: Psn, ctx: &mut Ctx<'_>) -> Result<bool, Fault> {
        if !self.qp_type.is_reliable() {
            ctx.stats.dropped_messages += 1;
            self.resp.cur = Cur::Dropping;
            return Err(Fault::Drop);
        }
        ctx.stats.rnr_naks_sent += 1;
        self.resp.nak_sent = true;
        let msn = self.resp.msn;
        let timer = self.attr.min_rnr_timer;
        self.resp.out.push_back(Resp::Ack {
            psn,
            syndrome: Syndrome::RnrNak { timer },
            msn,
        });
        Ok(false)
    }

    /// Take a receive WQE (the spare one, the SRQ's, or the QP's own),
    /// loading its SGEs into the responder.
    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<(u64, u8, u64)> {
        if let Some(s) = self.resp.spare.take() {
            return Some(s);
        }
        let w = match self.resp.xrc.map(|t| t.srqn).or(self.srq) {
            Some(srq) => ctx.srq_pop(srq, &mut self.resp.sges)?,
            None => self.rq.pop(&mut self.resp.sges)?,
        };
        Some((w.wr_id, w.nsge, w.length))
    }

    /// A request behind `epsn`: answer it again without executing it twice.
    fn duplicate(&mut self, pkt: &Packet<&[u8]>, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        if self.qp_type != QpType::XrcRecv {
            return self.answer_duplicate(pkt, repr, ctx);
        }
        // A duplicate is answered under the SRQ it names, as the first
        // time; the message in progress keeps its own.
        let Some(t) = self.xrc_target(repr, ctx) else {
            return;
        };
        let current = self.resp.xrc.replace(t);
        self.answer_duplicate(pkt, repr, ctx);
        self.resp.xrc = current;
    }

    fn answer_duplicate(&mut self, pkt: &Packet<&[u8]>, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        if !self.resp.has_room() {
            ctx.stats.responder_busy += 1;
            return;
        }
        let psn = repr.bth.psn;
        let info = pkt.info();
        let msn = self.resp.msn;
        if info.has(Flags::READ) {
            let Some(reth) = repr.ext.reth else { return };
            // The PSNs the original READ's response has left from `psn` on:
            // a replay never answers past them (into PSNs of later requests).
            let left = self.resp.res.iter().flatten().find_map(|r| match *r {
                Res::Read { first, npkts } if psn.in_window(first, npkts) => {
                    Some(npkts - first.distance_to(psn))
                }
                _ => None,
            });
            let Some(left) = left else {
                return;
            };
            let len = reth.dma_len as u64;
            let npkts = len.div_ceil(self.mtu() as u64).max(1);
            if npkts > left as u64 {
                return;
            }
            let npkts = npkts as u32;
            let Ok((target, off)) = ctx.mrs.resolve_remote(
                self.qpn,
                self.rx_pd(),
                reth.rkey,
                reth.va,
                len,
                AccessFlags::REMOTE_READ,
            ) else {
                return;
            };
            self.resp.out.push_back(Resp::Read {
                psn,
                mem: target,
                off,
                len,
                idx: 0,
                npkts,
                msn,
                replay: true,
            });
        } else if info.has(Flags::ATOMIC) {
            let cached = self.resp.res.iter().flatten().find_map(|r| match *r {
                Res::Atomic { psn: p, orig } if p == psn => Some(orig),
                _ => None,
            });
            if let Some(orig) = cached {
                self.resp.out.push_back(Resp::Atomic {
                    psn,
                    orig,
                    msn,
                    replay: true,
                });
            }
        } else {
            // SEND/WRITE: acknowledge everything received so far — or,
            // with requests held behind a gap, NAK the gap: a plain ACK
            // would tell a selective-repeat requester nothing is held.
            if self.resp.held.as_ref().is_some_and(|h| h.count > 0) {
                self.resp.push_seq_nak(psn, ctx);
                return;
            }
            let last = self.resp.epsn.sub(1);
            self.resp.push_ack(last, msn);
        }
    }

    fn request_uc(
        &mut self,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        let psn = repr.bth.psn;
        let info = pkt.info();
        if psn != self.resp.epsn {
            // A gap: whatever message was in progress is lost.
            if let Cur::Send {
                wr_id,
                nsge,
                capacity,
                ..
            } = self.resp.cur
            {
                self.resp.spare = Some((wr_id, nsge, capacity));
            }
            if !matches!(self.resp.cur, Cur::Idle) {
                ctx.stats.dropped_messages += 1;
            }
            self.resp.cur = if info.starts_message() {
                Cur::Idle
            } else {
                Cur::Dropping
            };
            self.resp.epsn = psn;
        }
        self.resp.epsn = psn.next();
        if matches!(self.resp.cur, Cur::Dropping) {
            if info.starts_message() {
                self.resp.cur = Cur::Idle;
            } else {
                return;
            }
        }
        let r = self.execute(pkt, repr, ctx, mem);
        if let Err(Fault::Fatal) = r {
            self.fatal_now(Event::QpFatal(self.qpn), ctx);
            return;
        }
        if r.is_err() {
            if let Cur::Send {
                wr_id,
                nsge,
                capacity,
                ..
            } = self.resp.cur
            {
                self.resp.spare = Some((wr_id, nsge, capacity));
            }
            self.resp.cur = if info.ends_message() {
                Cur::Idle
            } else {
                Cur::Dropping
            };
        }
    }

    fn request_ud(
        &mut self,
        meta: &RxMeta,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        let Some(deth) = repr.ext.deth else { return };
        if deth.qkey != self.attr.qkey {
            ctx.stats.bad_qkey += 1;
            return;
        }
        let data = pkt.payload();
        let Some((wr_id, nsge, cap)) = self.take_recv(ctx) else {
            ctx.stats.dropped_messages += 1;
            return;
        };
        let total = 40 + data.len() as u64;
        if total > cap {
            let c = Completion::new(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.rx_cq(), c, false);
            return;
        }
        let grh = meta.grh(pkt.bytes().len());
        let sges = &self.resp.sges[..nsge as usize];
        let written = super::queue::scatter(&ctx.mrs, sges, 0, &grh, mem)
            .and_then(|()| super::queue::scatter(&ctx.mrs, sges, 40, data, mem));
        if written.is_err() {
            let c = Completion::new(wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.rx_cq(), c, false);
            self.fatal_now(Event::QpFatal(self.qpn), ctx);
            return;
        }
        let mut c = Completion::new(wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        c.byte_len = total as u32;
        c.src_qp = deth.src_qp;
        c.wc_flags |= wc_flags::GRH;
        c.sl = if meta.over_ipv4() { 2 } else { 1 };
        if let Some(i) = repr.ext.immdt {
            c.wc_flags |= wc_flags::WITH_IMM;
            c.imm_or_inv = i.imm;
        }
        ctx.complete(self.rx_cq(), c, repr.bth.solicited);
    }

    /// Raise `ev` and enter ERR now.
    fn fatal_now(&mut self, ev: Event, ctx: &mut Ctx<'_>) {
        self.resp.fatal = None;
        ctx.push_event(ev);
        self.enter_error(ctx);
    }

    /// The next response packet, if any.
    /// All the responder has to send is one positive ACK (no READ or
    /// atomic response, no NAK, nothing fatal): a request of this QP may
    /// go ahead of it (see `Sched::poll_transmit`). The two streams are
    /// independent (their own PSN spaces), so the order changes no
    /// semantics; only which packet the peer sees first.
    pub(crate) fn only_ack_queued(&self) -> bool {
        self.resp.fatal.is_none()
            && self.resp.out.len() == 1
            && matches!(
                self.resp.out.front(),
                Some(Resp::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                })
            )
    }

    /// The notification point's CNP to this QP's peer, as RoCEv2 (Annex
    /// A17.9.3) and RNICs send it: a BTH with opcode 0x81, BECN set, P_Key
    /// 0xffff, the peer's QP number and PSN 0, then 16 reserved zero bytes
    /// and the ICRC (`81 00 ff ff 40 <qpn> 00 00 00 00`, 32 bytes in all).
    pub(crate) fn emit_cnp(&self, buf: &mut [u8]) -> Transmit {
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::CNP,
                solicited: false,
                migreq: false,
                pad: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: true,
                dest_qp: self.attr.dest_qp_num,
                ack_req: false,
                psn: Psn::new(0),
            },
            ext: ExtRepr::default(),
            payload_len: 0,
        };
        repr.emit_headers(buf);
        Transmit {
            dgid: self.attr.av.dgid,
            src_qpn: self.qpn,
            head_len: repr.header_len(),
            segs: Segs::default(),
            pad: 0,
        }
    }

    pub(crate) fn poll_response(
        &mut self,
        buf: &mut [u8],
        ctx: &mut Ctx<'_>,
        memory: &impl Memory,
    ) -> Option<Transmit> {
        let front = *self.resp.out.front()?;
        let mut segs = Segs::default();
        // Payload copied into `buf` after the headers (an implicit region's).
        let mut copied = 0;
        let mtu = self.mtu() as u64;
        let queued = self.resp.out.len();
        let mut gone = false;
        let (op, psn, ext, payload_len) = 'pick: {
            match front {
                Resp::Ack { psn, syndrome, msn } => {
                    self.resp.out.pop_front();
                    let ext = ExtRepr {
                        aeth: Some(AethRepr::new(syndrome, msn)),
                        ..Default::default()
                    };
                    (Opcode::RC_ACKNOWLEDGE, psn, ext, 0)
                }
                Resp::Atomic { psn, orig, msn, .. } => {
                    self.resp.out.pop_front();
                    let ext = ExtRepr {
                        aeth: Some(AethRepr::new(Syndrome::ACK_UNLIMITED, msn)),
                        atomic_ack_eth: Some(AtomicAckEthRepr { orig }),
                        ..Default::default()
                    };
                    (Opcode::RC_ATOMIC_ACKNOWLEDGE, psn, ext, 0)
                }
                Resp::Read {
                    psn,
                    mem,
                    off: base,
                    len,
                    idx,
                    npkts,
                    msn,
                    ..
                } => {
                    let off = idx as u64 * mtu;
                    let n = (len - off.min(len)).min(mtu);
                    let op = match (idx, npkts) {
                        (_, 1) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (0, _) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (i, n) if i + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                        _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let hl = op.info().expect("table").header_len as usize;
                    // An implicit region's bytes are copied in, checked,
                    // right after the headers.
                    let at = ctx.mrs.locate(mem, base + off, n).filter(|h| {
                        !h.checked
                            || memory
                                .read_checked(h.addr, &mut buf[hl..hl + n as usize])
                                .is_ok()
                    });
                    let Some(at) = at else {
                        // The region was deregistered while its READ was being
                        // answered (or an implicit region's page is not
                        // there): not one byte more of it goes out. As rxe's
                        // read_reply (rxe_recheck_mr failing), NAK this PSN with
                        // a remote access error and go to ERR.
                        self.resp.out.pop_front();
                        gone = true;
                        let ext = ExtRepr {
                            aeth: Some(AethRepr::new(
                                Syndrome::Nak(NakCode::RemoteAccessError),
                                self.resp.msn,
                            )),
                            ..Default::default()
                        };
                        break 'pick (Opcode::RC_ACKNOWLEDGE, psn.add(idx), ext, 0);
                    };
                    if at.checked {
                        copied = n as usize;
                    } else {
                        segs.push(Seg {
                            addr: at.addr,
                            len: n as u32,
                        });
                    }
                    let ext = ExtRepr {
                        aeth: op
                            .info()
                            .expect("table")
                            .has(Flags::AETH)
                            .then(|| AethRepr::new(Syndrome::ACK_UNLIMITED, msn)),
                        ..Default::default()
                    };
                    if idx + 1 >= npkts {
                        self.resp.out.pop_front();
                    } else if let Some(Resp::Read { idx, .. }) = self.resp.out.front_mut() {
                        *idx += 1;
                    }
                    (op, psn.add(idx), ext, n as usize)
                }
            }
        };
        // An XRC target answers with XRC's responses: RC's, moved to 0xa0.
        let op = if self.qp_type == QpType::XrcRecv {
            Opcode(op.0 | 0xa0)
        } else {
            op
        };
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: op,
                solicited: false,
                migreq: false,
                pad: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: self.attr.dest_qp_num,
                ack_req: false,
                psn,
            },
            ext,
            payload_len,
        };
        repr.emit_headers(buf);
        if self.resp.peer_sr {
            buf[softrdma_wire::bth::field::FECN_BECN] |= softrdma_wire::bth::SOFTRDMA_SR;
        }
        if gone {
            self.fatal_now(Event::QpAccessErr(self.qpn), ctx);
        }
        // The fatal NAK's countdown is in queue entries, not packets: a READ
        // response stream ahead of it is one entry, and the QP may go to
        // ERR only once the NAK itself has left.
        let entry_done = self.resp.out.len() < queued;
        if let (Some((left, ev)), true) = (self.resp.fatal.as_mut(), entry_done) {
            *left -= 1;
            if *left == 0 {
                let ev = *ev;
                self.resp.fatal = None;
                ctx.push_event(ev);
                self.enter_error(ctx);
            }
        }
        Some(Transmit {
            dgid: self.attr.av.dgid,
            src_qpn: self.qpn,
            head_len: repr.header_len() + copied,
            segs,
            pad: repr.pad_len() as u8,
        })
    }
}

/// Place a WRITE packet's bytes at `at`. In the message's last packet the
/// final eight bytes land after all the others (a fence between the two
/// copies; packets are placed in PSN order, out-of-order ones held back),
/// so a target that polls the end of its buffer — perftest's `write_lat`
/// — sees the whole message once it sees its end, as it does through the
/// shared-memory lane's copy. IBA
/// leaves the order of a WRITE's bytes undefined; softrdma defines it
/// (docs/DESIGN.md, "The order a WRITE's bytes land in").
fn place(at: Host, mem: &mut impl Memory, data: &[u8], last: bool) -> Result<(), crate::mr::Fault> {
    if !last || data.len() <= 8 {
        return at.write(mem, data);
    }
    let (head, tail) = data.split_at(data.len() - 8);
    at.write(mem, head)?;
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    Host {
        addr: at.addr + head.len() as u64,
        ..at
    }
    .write(mem, tail)
}

#[cfg(test)]
mod place_tests {
    use super::place;
    use crate::mr::{Fault, Host, Memory, VecMemory};

    /// VecMemory that records each write's address and length, in order.
    struct Logged(VecMemory, Vec<(u64, usize)>);

    impl Memory for Logged {
        fn read(&self, addr: u64, out: &mut [u8]) {
            self.0.read(addr, out)
        }
        fn write(&mut self, addr: u64, data: &[u8]) {
            self.1.push((addr, data.len()));
            self.0.write(addr, data)
        }
        fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64 {
            self.0.compare_swap(addr, compare, swap)
        }
        fn fetch_add(&mut self, addr: u64, add: u64) -> u64 {
            self.0.fetch_add(addr, add)
        }
        fn store_u64(&mut self, addr: u64, bytes: [u8; 8]) {
            self.0.store_u64(addr, bytes)
        }
        fn read_checked(&self, addr: u64, out: &mut [u8]) -> Result<(), Fault> {
            self.0.read_checked(addr, out)
        }
        fn write_checked(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
            self.1.push((addr, data.len()));
            self.0.write_checked(addr, data)
        }
        fn compare_swap_checked(
            &mut self,
            addr: u64,
            compare: u64,
            swap: u64,
        ) -> Result<u64, Fault> {
            self.0.compare_swap_checked(addr, compare, swap)
        }
        fn fetch_add_checked(&mut self, addr: u64, add: u64) -> Result<u64, Fault> {
            self.0.fetch_add_checked(addr, add)
        }
        fn store_u64_checked(&mut self, addr: u64, bytes: [u8; 8]) -> Result<(), Fault> {
            self.0.store_u64_checked(addr, bytes)
        }
    }

    /// The last packet of a WRITE places its final eight bytes in a copy
    /// of their own, after the rest (checked regions too); other packets,
    /// and a last packet of at most eight bytes, in one copy. The bytes are
    /// the packet's, in place.
    #[test]
    fn a_writes_last_eight_bytes_land_last() {
        for checked in [false, true] {
            let base = 0x1000;
            let data: Vec<u8> = (0..100u8).collect();
            // (bytes, the message's last packet, the writes expected)
            type Case<'a> = (&'a [u8], bool, Vec<(u64, usize)>);
            let cases: [Case<'_>; 4] = [
                (&data, true, vec![(base, 92), (base + 92, 8)]),
                (&data, false, vec![(base, 100)]),
                (&data[..8], true, vec![(base, 8)]),
                (&data[..9], true, vec![(base, 1), (base + 1, 8)]),
            ];
            for (bytes, last, want) in cases {
                let mut m = Logged(VecMemory::new(base, 256), Vec::new());
                let at = Host {
                    addr: base,
                    checked,
                };
                place(at, &mut m, bytes, last).unwrap();
                assert_eq!(
                    m.1,
                    want,
                    "{} bytes, last {last}, checked {checked}",
                    bytes.len()
                );
                assert_eq!(m.0.slice(base, bytes.len()), bytes);
            }
        }
    }
}
