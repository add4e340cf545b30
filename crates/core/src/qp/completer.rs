//! The completer: turns ACKs, NAKs, read responses, atomic acknowledgements
//! and timer expiries into completions, retransmissions and error states.
//!
//! Responses arrive in PSN order from a correct responder, so everything is
//! measured against `psn`, the oldest PSN not yet acknowledged: a response
//! behind it is stale, one at it makes progress, one beyond it implicitly
//! acknowledges what lies between — unless a READ or atomic sits there,
//! whose own response was then lost (an implied NAK).

use softrdma_wire::ext::{NakCode, Syndrome};
use softrdma_wire::opcode::Flags;
use softrdma_wire::{Packet, PacketRepr, Psn};

use super::attr::{local_ack_timeout_ns, rnr_timer_ns};
use super::queue::{scatter, SendState};
use super::requester::SrMode;
use super::Qp;
use crate::endpoint::Ctx;
use crate::mr::Memory;
use crate::wc::{Completion, WcStatus};
use crate::wr::SendOp;
use crate::Nanos;

#[derive(Debug, Default)]
pub(crate) struct Completer {
    /// Oldest PSN not yet acknowledged.
    pub psn: Psn,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// Retransmission deadline, armed while PSNs are outstanding.
    timer: Option<Nanos>,
    /// End of an RNR back-off; the requester is paused until then.
    rnr_until: Option<Nanos>,
    rnr_psn: Psn,
    /// The PSN a NAK or implied NAK last sent the requester back to, until
    /// the next progress. More evidence of the same loss — every response
    /// behind a gap in a READ stream, a duplicated NAK, a re-sent ACK past a
    /// READ — must not go back again, nor spend the retry budget once per
    /// packet (rxe's `started_retry`). A timeout always goes back.
    retried_at: Option<Psn>,
    /// Selective repeat: the last PSN resent alone, and the requester's
    /// `hwm` when it was (see `resend_one`).
    sr_resent: Option<(Psn, Psn)>,
    /// Selective repeat: a packet sent after the last resend asked for an
    /// ACK (see the requester's `gate_ask`).
    pub resend_probed: bool,
    /// Selective repeat: a timeout resent the oldest packet alone, asking
    /// whether the responder holds anything after it.
    sr_probe: bool,
    /// Selective repeat: the round-trip estimate (RFC 6298's SRTT and
    /// RTTVAR, ns) from ACKs of packets sent once, and the packet being
    /// timed (PSN, when sent).
    srtt: Option<(Nanos, Nanos)>,
    /// (PSN, time sent, `resends` then).
    rtt_probe: Option<(Psn, Nanos, u32)>,
    /// Packets selective repeat resent alone, ever.
    resends: u32,
    /// Selective repeat: when the answer to the last resend is overdue
    /// (see `Completer::resend_rto`).
    sr_timer: Option<Nanos>,
    /// Resends that timed out since the last progress: each doubles the
    /// next resend timeout (TCP's back-off, RFC 6298 5.5).
    sr_backoff: u32,
}

impl Completer {
    pub fn reset_psn(&mut self, psn: Psn) {
        self.psn = psn;
    }

    pub fn rnr_waiting(&self) -> bool {
        self.rnr_until.is_some()
    }

    pub fn next_timeout(&self) -> Option<Nanos> {
        [self.timer, self.rnr_until, self.sr_timer]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn stop_timers(&mut self) {
        self.timer = None;
        self.rnr_until = None;
        self.sr_timer = None;
    }

    /// Selective repeat: a packet sent for the first time that asks for an
    /// ACK is timed, one at a time, until the answer it prompts: the NAK
    /// that names it as its trigger, or the ACK that covers it if nothing
    /// was resent meanwhile. A cumulative ACK after a resend, or a NAK
    /// prompted by a later packet (the timed one was lost or overtaken),
    /// would time a repair, not a round trip: no sample.
    pub fn time_packet(&mut self, psn: Psn, now: Nanos) {
        if self.rtt_probe.is_none() {
            self.rtt_probe = Some((psn, now, self.resends));
        }
    }

    /// Selective repeat: a packet was resent alone. Its answer is due one
    /// round trip later: RFC 6298's retransmission timeout, SRTT + 4 ×
    /// RTTVAR, measured, never more than the QP's own ACK timeout `ack`.
    /// Without a measurement yet, `ack` alone stands (the IBA timer).
    /// IRN's RTO_low serves the same end with a fixed 100 µs: with a gap
    /// holding the window still, nothing sent after a lost resend can
    /// reveal its loss, and the IBA timeout is a thousand round trips on a
    /// datacenter path.
    pub fn arm_resend_timer(&mut self, now: Nanos, ack: Option<Nanos>) {
        // (Karn's rule does not touch the timed packet: it was sent once,
        // and selective repeat resends only older PSNs.)
        let Some((srtt, var)) = self.srtt else {
            return;
        };
        let rto = (srtt + 4 * var).saturating_mul(1 << self.sr_backoff.min(20));
        self.sr_timer = Some(now + ack.map_or(rto, |a| rto.min(a)));
    }

    /// Selective repeat: the last resend is not yet acknowledged and its
    /// resend timer runs (so its loss, or its answer's, is repaired one
    /// measured round trip later without help from later requests).
    pub fn resend_unanswered(&self) -> bool {
        self.sr_timer.is_some() && self.sr_resent.is_some_and(|(p, _)| !self.psn.after(p))
    }

    /// A round-trip sample for the timed packet (RFC 6298, 2.2 and 2.3).
    fn rtt_sample(&mut self, r: Nanos) {
        self.srtt = Some(match self.srtt {
            None => (r, r / 2),
            Some((s, v)) => {
                let v = (3 * v + s.abs_diff(r)) / 4;
                ((7 * s + r) / 8, v)
            }
        });
    }

    /// Arm the retransmission timer if it is not running.
    pub fn arm_timer(&mut self, now: Nanos, timeout: u8) {
        if self.timer.is_none() {
            self.timer = local_ack_timeout_ns(timeout).map(|t| now + t);
        }
    }

    /// Push the retransmission deadline a full timeout out, if it is running.
    pub fn restart_timer(&mut self, now: Nanos, timeout: u8) {
        if self.timer.is_some() {
            self.timer = local_ack_timeout_ns(timeout).map(|t| now + t);
        }
    }
}

enum Flow {
    Continue,
    Stop,
}

impl Qp {
    /// A response packet (ACK, NAK, read response, atomic ACK) for this QP.
    pub(crate) fn handle_response(
        &mut self,
        now: Nanos,
        pkt: &Packet<&[u8]>,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        let psn = repr.bth.psn;
        if !psn.before(self.req.hwm) {
            ctx.stats.ghost_acks += 1;
            return;
        }
        // Any response to a PSN we sent, stale or past a gap included, shows
        // the responder alive and working through our requests: push the
        // retransmission deadline out (the retry budget still refills only
        // on progress). rxe replays each duplicate READ in full and in
        // order; on a slow rxe a replay outlasts the timeout, and resending
        // on every timeout queued replay after replay behind it until the
        // retry budget ran out (read_bw -a against rxe, docs/INTEROP.md).
        // rxe's own completer re-arms its timer whenever it runs, likewise.
        self.comp.restart_timer(now, self.attr.timeout);
        if self.req.sr == SrMode::Offer {
            // The peer's first answer settles selective repeat: a softrdma
            // responder that accepts marks every response; anyone else
            // (rxe, an RNIC) leaves the reserved bit clear.
            self.req.sr = if pkt.bth().softrdma_sr() {
                SrMode::On
            } else {
                SrMode::Gbn
            };
        }
        if psn.before(self.comp.psn) {
            return; // stale: already acknowledged
        }
        let info = pkt.info();
        let syndrome = repr.ext.aeth.map(|a| a.kind());
        match syndrome {
            Some(Syndrome::Nak(code)) => {
                if let Flow::Continue = self.ack_before(now, psn, ctx) {
                    let trigger = Psn::new(repr.ext.aeth.map_or(0, |a| a.msn));
                    self.on_nak(now, psn, code, trigger, ctx);
                }
                return;
            }
            Some(Syndrome::RnrNak { timer }) => {
                if let Flow::Continue = self.ack_before(now, psn, ctx) {
                    ctx.stats.rnr_naks_rcvd += 1;
                    self.on_rnr(now, psn, timer, ctx);
                }
                return;
            }
            Some(Syndrome::Reserved(_)) => {
                ctx.stats.malformed += 1;
                return;
            }
            _ => {}
        }
        if info.has(Flags::READ_RESPONSE) {
            if let Flow::Continue = self.ack_before(now, psn, ctx) {
                self.on_read_response(now, psn, pkt, repr, ctx, mem);
            }
        } else if info.has(Flags::ATOMIC_ACK_ETH) {
            if let Flow::Continue = self.ack_before(now, psn, ctx) {
                self.on_atomic_ack(now, psn, repr, ctx, mem);
            }
        } else {
            // A plain ACK covers its own PSN too.
            if let Flow::Continue = self.ack_before(now, psn.next(), ctx) {
                if std::mem::take(&mut self.comp.sr_probe) && self.comp.psn.before(self.req.hwm) {
                    // The answer to a timeout's probe: the responder holds
                    // nothing after what it acknowledges (it would have
                    // NAKed the gap), so all that is outstanding was lost.
                    let p = self.comp.psn;
                    self.retry_from(now, p, ctx, false);
                }
            }
        }
    }

    /// Everything before `upto` is acknowledged: complete SEND/WRITE WQEs that
    /// end before it. A READ or atomic found there lost its response: go back
    /// to it (implied NAK) and stop processing this packet.
    fn ack_before(&mut self, now: Nanos, upto: Psn, ctx: &mut Ctx<'_>) -> Flow {
        let mut progressed = false;
        while let Some(w) = self.sq.get(self.sq.tail).copied() {
            if let SendState::Done(status) = w.state {
                // A local operation between acknowledged WQEs completes in
                // its turn; one that failed stops everything after it.
                self.settle_done(ctx);
                if status != WcStatus::Success {
                    return Flow::Stop;
                }
                continue;
            }
            if w.state != SendState::Sent || !w.last_psn().before(upto) {
                // Partial progress inside a multi-packet SEND/WRITE.
                if w.state == SendState::Sent
                    && !w.op.is_read_or_atomic()
                    && upto.after(self.comp.psn)
                    && !upto.after(w.last_psn())
                {
                    self.comp.psn = upto;
                    progressed = true;
                }
                break;
            }
            if w.op.is_read_or_atomic() {
                if progressed {
                    self.progress(now);
                }
                self.retry(now, ctx, false);
                return Flow::Stop;
            }
            self.retire_tail();
            self.comp.psn = w.last_psn().next();
            progressed = true;
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
        if progressed {
            self.progress(now);
            self.settle_done(ctx);
        }
        Flow::Continue
    }

    /// Forward progress: refill the retry budgets and restart the timer.
    fn progress(&mut self, now: Nanos) {
        if let Some((p, sent, resends)) = self.comp.rtt_probe {
            if self.comp.psn.after(p) {
                self.comp.rtt_probe = None;
                if resends == self.comp.resends {
                    self.comp.rtt_sample(now.saturating_sub(sent));
                }
            }
        }
        if let Some((p, _)) = self.comp.sr_resent {
            if self.comp.psn.after(p) {
                self.comp.sr_timer = None; // the resend arrived
                self.comp.sr_backoff = 0;
            }
        }
        self.comp.retry_left = self.attr.retry_cnt;
        self.comp.rnr_left = self.attr.rnr_retry;
        self.comp.retried_at = None;
        self.comp.timer = None;
        if self.comp.psn.before(self.req.hwm) {
            self.comp.arm_timer(now, self.attr.timeout);
        }
        // Go-back-N may have put the requester behind what has now been
        // acknowledged (a late ACK or response for the first transmission
        // overtook the resend): move it up, never resend acknowledged PSNs.
        // Left behind, it would also sit outside the window, which is
        // measured from `comp.psn`, until the next timeout.
        if let Some((i, k)) = self.req.resume {
            if self.requester_psn().before(self.comp.psn) {
                // The packet selective repeat was to resend has been
                // acknowledged meanwhile: no need, on from where it was.
                self.req.resume = None;
                self.sq.send = i;
                self.req.pkt_idx = k;
            }
        }
        if self.requester_psn().before(self.comp.psn) {
            let p = self.comp.psn;
            self.rewind(p);
        }
    }

    /// The PSN of the next packet the requester will send.
    fn requester_psn(&self) -> Psn {
        match self.sq.get(self.sq.send) {
            Some(w) if w.state == SendState::Sent => w.first_psn.add(self.req.pkt_idx),
            _ => self.req.next_psn,
        }
    }

    /// Retire the acknowledged WQE at the tail. If the requester was (re)sending
    /// it, it moves on to the first packet of the next one: its packet index
    /// belonged to the retired WQE and means nothing in the next (left as it
    /// was, it skipped packets there, or ran past the end of a shorter one).
    fn retire_tail(&mut self) -> Option<super::queue::SendWqe> {
        if self.sq.send == self.sq.tail {
            self.req.pkt_idx = 0;
        }
        self.sq.pop_tail()
    }

    fn on_read_response(
        &mut self,
        now: Nanos,
        psn: Psn,
        pkt: &Packet<&[u8]>,
        _repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        let Some(w) = self.sq.get(self.sq.tail).copied() else {
            return;
        };
        let SendOp::Read { .. } = w.op else {
            ctx.stats.malformed += 1; // a read response for no READ
            return;
        };
        if w.state != SendState::Sent || psn.before(w.first_psn) || psn.after(w.last_psn()) {
            ctx.stats.malformed += 1;
            return;
        }
        if psn != self.comp.psn {
            // Responses between comp.psn and psn were lost.
            if psn.after(self.comp.psn) {
                self.retry(now, ctx, false);
            }
            return;
        }
        let mtu = self.mtu() as u64;
        let off = w.first_psn.distance_to(psn) as u64 * mtu;
        let data = pkt.payload();
        let ends = pkt.info().ends_message();
        let end = off + data.len() as u64;
        let bad = data.len() as u64 > mtu
            || end > w.length as u64
            || (!ends && data.len() as u64 != mtu)
            || (ends && end != w.length as u64);
        if bad {
            self.fail_tail(WcStatus::BadRespErr, ctx);
            return;
        }
        if scatter(&ctx.mrs, self.sq.sges(self.sq.tail), off, data, mem).is_err() {
            // The READ's destination was deregistered mid-response.
            self.fail_tail(WcStatus::LocProtErr, ctx);
            return;
        }
        self.comp.psn = psn.next();
        if ends {
            self.complete_tail(w.length, ctx);
        }
        self.progress(now);
    }

    fn on_atomic_ack(
        &mut self,
        now: Nanos,
        psn: Psn,
        repr: &PacketRepr,
        ctx: &mut Ctx<'_>,
        mem: &mut impl Memory,
    ) {
        let Some(w) = self.sq.get(self.sq.tail).copied() else {
            return;
        };
        if !w.op.is_atomic() || w.state != SendState::Sent || w.first_psn != psn {
            ctx.stats.malformed += 1;
            return;
        }
        let Some(ack) = repr.ext.atomic_ack_eth else {
            return;
        };
        let orig = ack.orig.to_ne_bytes();
        if scatter(&ctx.mrs, self.sq.sges(self.sq.tail), 0, &orig, mem).is_err() {
            self.fail_tail(WcStatus::LocProtErr, ctx);
            return;
        }
        self.comp.psn = psn.next();
        self.complete_tail(8, ctx);
        self.progress(now);
    }

    /// Complete the READ/atomic at the tail successfully.
    fn complete_tail(&mut self, byte_len: u32, ctx: &mut Ctx<'_>) {
        let w = self.retire_tail().expect("tail present");
        if w.op.is_read_or_atomic() {
            self.req.rd_atomic_inflight -= 1;
        }
        if w.signaled {
            let mut c = Completion::new(
                w.wr_id,
                WcStatus::Success,
                super::wc_opcode_of(&w.op),
                self.qpn,
            );
            c.byte_len = byte_len;
            ctx.complete(self.send_cq, c, false);
        }
        self.settle_done(ctx);
    }

    /// Complete the oldest WQEs the requester finished itself (local
    /// operations, WQEs it gave up on), now that everything before them has.
    pub(super) fn settle_done(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(w) = self.sq.get(self.sq.tail).copied() {
            let SendState::Done(status) = w.state else {
                return;
            };
            if status != WcStatus::Success {
                self.fail_tail(status, ctx);
                return;
            }
            self.retire_tail();
            if w.signaled {
                let c = Completion::new(w.wr_id, status, super::wc_opcode_of(&w.op), self.qpn);
                ctx.complete(self.send_cq, c, false);
            }
        }
    }

    /// Complete the tail WQE with an error and move the QP to ERR, flushing
    /// the rest in order.
    pub(super) fn fail_tail(&mut self, status: WcStatus, ctx: &mut Ctx<'_>) {
        if let Some(w) = self.sq.pop_tail() {
            if w.op.is_read_or_atomic() && w.state == SendState::Sent {
                self.req.rd_atomic_inflight -= 1;
            }
            let c = Completion::new(w.wr_id, status, super::wc_opcode_of(&w.op), self.qpn);
            ctx.complete(self.send_cq, c, false);
        }
        self.req.rd_atomic_inflight = 0;
        self.enter_error(ctx);
    }

    fn on_nak(&mut self, now: Nanos, psn: Psn, code: NakCode, trigger: Psn, ctx: &mut Ctx<'_>) {
        let status = match code {
            NakCode::PsnSequenceError => {
                ctx.stats.seq_naks_rcvd += 1;
                self.comp.psn = psn;
                if self.req.sr == SrMode::On {
                    self.comp.sr_probe = false;
                    if let Some((p, sent, _)) = self.comp.rtt_probe {
                        if p == trigger {
                            self.comp.rtt_probe = None;
                            self.comp.rtt_sample(now.saturating_sub(sent));
                        } else if trigger.after(p) {
                            self.comp.rtt_probe = None;
                        }
                    }
                    match self.comp.sr_resent {
                        // Prompted by a request sent before the last resend
                        // of this PSN, which may still be on its way.
                        Some((p, hwm)) if p == psn && trigger.before(hwm) => {}
                        _ => self.resend_one(psn, true, ctx),
                    }
                } else {
                    self.retry_from(now, psn, ctx, false);
                }
                return;
            }
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
            // A code IBA reserves (5–31): nothing says what the responder
            // meant, only that it refused. rxe completes it as a remote
            // operational error, and so do we.
            NakCode::RemoteOperationalError | NakCode::Reserved(_) => WcStatus::RemOpErr,
        };
        self.fail_tail(status, ctx);
    }

    fn on_rnr(&mut self, now: Nanos, psn: Psn, timer: u8, ctx: &mut Ctx<'_>) {
        if self.comp.rnr_left == 0 {
            self.fail_tail(WcStatus::RnrRetryExcErr, ctx);
            return;
        }
        if self.comp.rnr_left != 7 {
            self.comp.rnr_left -= 1;
        }
        self.comp.psn = psn;
        self.comp.timer = None;
        self.req.resume = None;
        self.comp.rnr_until = Some(now + rnr_timer_ns(timer));
        self.comp.rnr_psn = psn;
    }

    /// Selective repeat: the responder holds what came after `p` and asks
    /// for `p` alone. Resend that one packet (asking for the ACK that will
    /// say what the responder then lacks), then go on where the requester
    /// was. Each NAK costs a retry, as a go-back-N NAK does; progress
    /// refills the budget, so only the same packet lost `retry_cnt` times
    /// running fails the QP.
    fn resend_one(&mut self, p: Psn, spend: bool, ctx: &mut Ctx<'_>) {
        if spend {
            if self.comp.retry_left == 0 {
                self.fail_tail(WcStatus::RetryExcErr, ctx);
                return;
            }
            self.comp.retry_left -= 1;
        }
        self.comp.sr_resent = Some((p, self.req.hwm));
        self.comp.resend_probed = false;
        self.comp.resends = self.comp.resends.wrapping_add(1);
        if self.req.resume.is_none() {
            self.req.resume = Some((self.sq.send, self.req.pkt_idx));
        }
        self.rewind(p);
    }

    /// Go back to the oldest unacknowledged PSN (timeout, implied NAK).
    fn retry(&mut self, now: Nanos, ctx: &mut Ctx<'_>, timeout: bool) {
        let p = self.comp.psn;
        self.retry_from(now, p, ctx, timeout);
    }

    /// Spend one retry and rewind the requester to `p`, or fail the QP when
    /// the budget is gone. A NAK for a loss already being repaired (no
    /// progress since going back to `p`) changes nothing.
    fn retry_from(&mut self, _now: Nanos, p: Psn, ctx: &mut Ctx<'_>, timeout: bool) {
        if !timeout && self.comp.retried_at == Some(p) {
            return;
        }
        if self.comp.retry_left == 0 {
            self.fail_tail(WcStatus::RetryExcErr, ctx);
            return;
        }
        self.comp.retry_left -= 1;
        self.comp.retried_at = Some(p);
        self.comp.timer = None;
        // Go-back-N resends everything from `p`, the one packet selective
        // repeat was about to resend included.
        self.req.resume = None;
        self.comp.rtt_probe = None;
        self.comp.sr_timer = None;
        self.rewind(p);
    }

    /// Point the requester at PSN `p`: the WQE that holds it, at the packet
    /// that carries it.
    pub(crate) fn rewind(&mut self, p: Psn) {
        let mut idx = self.sq.tail;
        while let Some(w) = self.sq.get(idx).copied() {
            if w.state != SendState::Sent {
                break;
            }
            if !p.after(w.last_psn()) {
                let k = w.first_psn.distance_to(p).min(w.npkts - 1);
                self.sq.send = idx;
                self.req.pkt_idx = if p.before(w.first_psn) { 0 } else { k };
                return;
            }
            idx += 1;
        }
        self.sq.send = idx;
        self.req.pkt_idx = 0;
    }

    /// Timer expiry: RNR back-off over, or the retransmission timeout.
    pub(crate) fn handle_timeout(&mut self, now: Nanos, ctx: &mut Ctx<'_>) {
        if let Some(t) = self.comp.sr_timer {
            if t <= now {
                self.comp.sr_timer = None;
                if let Some((p, _)) = self.comp.sr_resent {
                    if !self.comp.psn.after(p) && self.req.sr == SrMode::On {
                        // No answer to the resend within a round trip: it
                        // or its answer was lost. Again, alone, waiting
                        // twice as long for the next answer. This timer is
                        // the requester's own estimate, not IBA's: it does
                        // not spend `retry_cnt` (a responder slower than
                        // the estimate must not fail the QP), and the ACK
                        // timeout still runs behind it and does.
                        ctx.stats.resend_timeouts += 1;
                        self.comp.sr_backoff += 1;
                        self.resend_one(p, false, ctx);
                    }
                }
            }
        }
        if let Some(t) = self.comp.rnr_until {
            if t <= now {
                self.comp.rnr_until = None;
                let p = self.comp.rnr_psn;
                self.rewind(p);
            }
        }
        if let Some(t) = self.comp.timer {
            if t <= now {
                self.comp.timer = None;
                if self.comp.psn.before(self.req.hwm) {
                    ctx.stats.timeouts += 1;
                    if self.req.sr == SrMode::On {
                        // Resend the oldest packet alone: the responder
                        // may hold everything after it. Its answer says:
                        // a NAK names the next gap; a plain ACK short of
                        // everything sent means nothing after was held,
                        // and go-back-N resends the rest (see
                        // `handle_response`).
                        let p = self.comp.psn;
                        self.comp.sr_resent = None;
                        self.resend_one(p, true, ctx);
                        self.comp.sr_probe = true;
                    } else {
                        self.retry(now, ctx, true);
                    }
                }
            }
        }
    }
}
