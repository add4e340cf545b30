//! The QP scheduler: which queue pair sends next, and when a waiting one
//! may send again — the arbiter of a NIC's send engine.
//!
//! # Ready list
//!
//! Only QPs with something they may send are visited. A QP is put on the
//! ready list when something may have given it work — a command or an event
//! addressed to it: `post_send`, `modify_qp`, a packet for it (the responder
//! queued an ACK, NAK, READ or atomic response; an ACK moved its window),
//! one of its timers (retransmission, RNR back-off, pacing), or its
//! destination's budget opening. Each time, [`Sched::sync`] asks the QP what
//! it wants ([`Want`]), with the same pure test the requester itself uses to
//! build a packet, and files it accordingly: on the ready list, behind a
//! pacing timer, on its destination's wait list, or nowhere (it waits for an
//! event of its own: an ACK, a timer, a command). A QP therefore leaves the
//! list as soon as it has nothing it may send, and work per packet does not
//! depend on how many QPs exist or sit idle.
//!
//! The ready list and the wait lists are intrusive doubly linked lists
//! threaded through the per-slot state (no allocation, O(1) insert and
//! removal anywhere). Among ready QPs the order is deficit round robin in
//! bytes: a QP at the head of the list sends until it has spent its quantum
//! ([`crate::EndpointConfig::sched_quantum`], counted in
//! [`Transmit::wire_len`] bytes, responses included), then goes to the back.
//! Bytes rather than packets, so a QP of small packets and one of MTU
//! packets share the wire by bytes; a deficit may go negative by less than
//! one packet and is repaid the next turn, so no QP gets more than its share
//! by more than one packet. A QP that leaves the list forfeits its deficit.
//!
//! # Destinations
//!
//! Every RC QP is counted against its destination GID: the unacknowledged
//! bytes of all QPs towards one GID ([`crate::gate`] says how they are
//! counted) may not pass [`crate::EndpointConfig::max_inflight_per_dest`]
//! by more than one packet. A QP that cannot start a new PSN for that reason
//! waits in the destination's FIFO wait list; when ACKs free budget, as many
//! waiters are woken as the free budget has room for full packets (at least
//! one), in order. While any wait, the budget is first come, first served:
//! a QP not woken from the list (its own ACK came in, it was posted to)
//! queues at the back, and a woken one sends one new packet and, if it has
//! more, queues at the back again — so under pressure the budget is shared
//! packet by packet. Retransmissions are never held by it: their PSNs are
//! counted already.
//!
//! # Timers
//!
//! All of them are in one [`TimerHeap`]; each slot has at most one live
//! entry, at or before the earliest of its deadlines (completer timers and
//! its pacing time). [`Sched::settle_timers`] keeps the heap's top exact.

use std::collections::BTreeMap;

use softrdma_wire::Psn;

use crate::cc::{CcConfig, Controller};
use crate::endpoint::Shared;
use crate::gate::{psn_cost, TxGate};
use crate::qp::state::QpState;
use crate::qp::{Qp, Stop};
use crate::stats::Stats;
use crate::timer::TimerHeap;
use crate::transmit::{Transmit, HEAD_ROOM};
use crate::Nanos;

const NIL: u32 = u32::MAX;

/// The largest cost of one PSN (at MTU 4096): how much free budget one
/// woken waiter is assumed to use.
const MAX_PSN_COST: u64 = 4096 + crate::gate::PACKET_OVERHEAD;

/// Put a controller's rate and window into its QP's gate, where changed
/// (a new PSN window resets the gate's loss back-off, so only when it
/// moved). A byte window (HPCC's `W`) moves with nearly every ACK, so it
/// leaves the PSN window and its back-off alone: a timeout's halving is
/// undone by acknowledged progress, as without a controller.
fn apply_cc(gate: &mut TxGate, cc: &Controller, now: Nanos) {
    let rate = cc.rate();
    if gate.rate() != rate {
        gate.set_rate(now, rate);
    }
    if let Some(w) = cc.window() {
        let w = w.clamp(1, crate::qp::MAX_UNACKED_PSNS);
        if gate.max_psns() != w {
            gate.set_window(w, None);
        }
    }
    if let Some(b) = cc.window_bytes() {
        if gate.max_psns() != crate::qp::MAX_UNACKED_PSNS {
            // The first time: the window is W's bytes alone.
            gate.set_window(crate::qp::MAX_UNACKED_PSNS, Some(b));
        } else if gate.max_bytes() != Some(b) {
            gate.set_byte_window(Some(b));
        }
    }
}

/// Where a slot is filed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// On no list: no work, or waiting for an event of its own.
    Idle,
    Ready,
    /// On its destination's wait list.
    Parked,
}

/// What a QP wants from the scheduler now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// It has a packet it may send.
    Send,
    /// Its next request waits for its rate until this time.
    Pace(Nanos),
    /// Its next request is a new PSN its destination's budget has no room for.
    Dest,
    /// Nothing, until an event of its own (ACK, timer, command).
    Nothing,
}

/// The scheduler's state for one QP slot.
#[derive(Debug)]
struct Slot {
    prev: u32,
    next: u32,
    place: Place,
    /// Woken from its destination's wait list and not yet visited.
    woken: bool,
    /// Deficit round robin: bytes it may still send this turn.
    deficit: i64,
    /// Index into `Sched::dests`, or `NIL`.
    dest: u32,
    /// Bytes it counts for in its destination's `inflight`.
    charged: u64,
    /// Generation and deadline of its live timer entry.
    gen: u32,
    armed: Option<Nanos>,
    /// Its rate holds its next request until then.
    pace_at: Option<Nanos>,
    gate: TxGate,
    /// Its last packet was a request sent ahead of a queued ACK: the ACK
    /// goes next.
    passed_ack: bool,
    /// No request passes a queued ACK (see [`Sched::set_acks_first`]).
    acks_first: bool,
    /// Congestion control's reaction point, if the QP runs one.
    cc: Option<Controller>,
    /// Notification point: at most one CNP per this interval, the last one
    /// sent, and whether one is owed.
    cnp_interval: Option<Nanos>,
    cnp_last: Option<Nanos>,
    cnp_owed: bool,
    /// The PSNs being timed for RTT samples, and when they left.
    probes: Probes,
}

/// The request PSNs a QP is timing for RTT samples, oldest first: one per
/// round trip, or, for a controller that updates per completed segment
/// (TIMELY's completion events, [`Controller::sample_bytes`]), one per
/// segment, several in flight. Bounded: a full ring times nothing more
/// until a sample comes back.
#[derive(Debug, Clone, Copy, Default)]
struct Probes {
    at: [(Psn, Nanos); PROBES],
    head: u8,
    len: u8,
    /// Request bytes still to send before the next probe (segment mode:
    /// a segment's worth after each probe; 0 at first and after a
    /// timeout).
    until: u32,
}

/// Probes in flight per QP in segment mode: at 16 KB segments, eight
/// cover 128 KB, more than a 10G round trip of 50 µs carries (62 KB).
const PROBES: usize = 8;

impl Probes {
    fn clear(&mut self) {
        self.len = 0;
        self.until = 0;
    }

    fn push(&mut self, psn: Psn, now: Nanos, seg: Option<u32>) {
        if (self.len as usize) < PROBES {
            let i = (self.head as usize + self.len as usize) % PROBES;
            self.at[i] = (psn, now);
            self.len += 1;
            self.until = seg.unwrap_or(0);
        }
    }

    /// The oldest probe if the cumulative ACK `psn` has passed it.
    fn pop_acked(&mut self, psn: Psn) -> Option<(Psn, Nanos)> {
        if self.len == 0 {
            return None;
        }
        let p = self.at[self.head as usize];
        if !psn.after(p.0) {
            return None;
        }
        self.head = ((self.head as usize + 1) % PROBES) as u8;
        self.len -= 1;
        Some(p)
    }

    /// Whether the next request should be timed.
    fn wanted(&self, cc: Option<&Controller>) -> bool {
        let Some(cc) = cc.filter(|c| c.wants_rtt()) else {
            return false;
        };
        match cc.sample_bytes() {
            None => self.len == 0,
            // Not sooner when the last one is back: a segment's worth of
            // bytes between samples is what makes the update rate follow
            // the sending rate.
            Some(_) => (self.len as usize) < PROBES && self.until == 0,
        }
    }
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            prev: NIL,
            next: NIL,
            place: Place::Idle,
            woken: false,
            deficit: 0,
            dest: NIL,
            charged: 0,
            gen: 0,
            armed: None,
            pace_at: None,
            passed_ack: false,
            acks_first: false,
            gate: TxGate::default(),
            cc: None,
            cnp_interval: None,
            cnp_last: None,
            cnp_owed: false,
            probes: Probes::default(),
        }
    }
}

/// An intrusive list of slots (through `Slot::prev` / `Slot::next`).
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    fn push_back(&mut self, slots: &mut [Slot], s: u32) {
        slots[s as usize].prev = self.tail;
        slots[s as usize].next = NIL;
        match self.tail {
            NIL => self.head = s,
            t => slots[t as usize].next = s,
        }
        self.tail = s;
        self.len += 1;
    }

    fn unlink(&mut self, slots: &mut [Slot], s: u32) {
        let (p, n) = (slots[s as usize].prev, slots[s as usize].next);
        match p {
            NIL => self.head = n,
            p => slots[p as usize].next = n,
        }
        match n {
            NIL => self.tail = p,
            n => slots[n as usize].prev = p,
        }
        slots[s as usize].prev = NIL;
        slots[s as usize].next = NIL;
        self.len -= 1;
    }

    fn iter<'a>(&self, slots: &'a [Slot]) -> impl Iterator<Item = u32> + 'a {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            let s = cur;
            if s == NIL {
                return None;
            }
            cur = slots[s as usize].next;
            Some(s)
        })
    }
}

/// The QPs of an endpoint towards one GID.
#[derive(Debug)]
struct Dest {
    gid: [u8; 16],
    refs: u32,
    /// Unacknowledged bytes of its QPs (the sum of their `charged`).
    inflight: u64,
    waiters: List,
    /// Waiters woken and not yet visited.
    woken: u32,
}

/// What feedback a call produced for the loss back-off, taken before it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Before {
    una: Psn,
    timeouts: u64,
}

impl Before {
    pub fn of(qp: &Qp, stats: &Stats) -> Before {
        Before {
            una: qp.comp.psn,
            timeouts: stats.timeouts,
        }
    }
}

/// Unacknowledged bytes of a QP, as [`crate::gate`] counts them.
fn inflight_bytes(qp: &Qp) -> u64 {
    if !qp.qp_type.is_reliable() || !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
    {
        return 0;
    }
    qp.comp.psn.distance_to(qp.req.hwm) as u64 * psn_cost(qp.mtu())
}

/// What a burst goes on with after its first packet (see
/// [`Sched::poll_transmit`]).
#[derive(Debug, Clone, Copy)]
enum Run {
    /// The QP's requests, under the PSN limit the first was built under.
    Requests(Psn),
    /// Its queued responses (a READ's response stream, ACKs, NAKs).
    Responses,
}

/// The scheduler of one endpoint.
#[derive(Debug)]
pub(crate) struct Sched {
    slots: Vec<Slot>,
    ready: List,
    dests: Vec<Dest>,
    by_gid: BTreeMap<[u8; 16], u32>,
    free_dests: Vec<u32>,
    timers: TimerHeap,
    /// Slots with a live timer entry.
    armed: usize,
    quantum: i64,
    budget: u64,
    /// The latest time any call brought; commands that carry no time
    /// (`post_send`, `modify_qp`) are filed against it.
    pub now: Nanos,
}

impl Sched {
    pub fn new(quantum: u32, budget: u64) -> Sched {
        Sched {
            slots: Vec::new(),
            ready: List::EMPTY,
            dests: Vec::new(),
            by_gid: BTreeMap::new(),
            free_dests: Vec::new(),
            timers: TimerHeap::default(),
            armed: 0,
            quantum: quantum.max(1) as i64,
            budget,
            now: 0,
        }
    }

    /// A QP was created in slot `s`.
    pub fn on_create(&mut self, s: usize) {
        while self.slots.len() <= s {
            self.slots.push(Slot::default());
        }
        let gen = self.slots[s].gen;
        self.slots[s] = Slot {
            gen: gen.wrapping_add(1),
            ..Slot::default()
        };
    }

    /// The QP in slot `s` is gone: take it off every list, return its
    /// budget, disarm its timer (its heap entry goes stale).
    pub fn on_destroy(&mut self, s: usize) {
        self.file(s, Want::Nothing);
        self.detach(s);
        let slot = &mut self.slots[s];
        if slot.armed.take().is_some() {
            self.armed -= 1;
        }
        slot.gen = slot.gen.wrapping_add(1);
    }

    /// The QP in slot `s` went to RESET: forget its gate's loss back-off
    /// and pacing, the PSNs it was timing and the CNP it owed — all of the
    /// old connection, whose PSNs the next one may reuse (a probe left
    /// behind would be "acknowledged" by the new connection's ACKs, its
    /// send time from before the reset). What congestion control was
    /// configured stays.
    pub fn on_reset(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        slot.gate.reset();
        slot.probes.clear();
        slot.cnp_owed = false;
        slot.cnp_last = None;
        slot.passed_ack = false;
    }

    pub fn gate(&self, s: usize) -> &TxGate {
        &self.slots[s].gate
    }

    /// Whether slot `s`'s requests may pass a lone queued ACK (the
    /// default) or leave behind it. The reply-first rule pays on a path
    /// that carries each packet as its own datagram; on one whose receiver
    /// may take the reply in one pass and the ACK in the next (a ring of a
    /// peer on this host), the reply's completion can then reach the
    /// application before the completion of the send it answers.
    pub fn set_acks_first(&mut self, s: usize, on: bool) {
        self.slots[s].acks_first = on;
    }

    pub fn gate_mut(&mut self, s: usize) -> &mut TxGate {
        &mut self.slots[s].gate
    }

    /// Run `cfg` on slot `s` (sending at `line_rate` bits/s): its reaction
    /// point starts at line rate, and its notification point answers ECN-CE.
    pub fn set_cc(&mut self, s: usize, cfg: &CcConfig, line_rate: u64) {
        let slot = &mut self.slots[s];
        slot.cc = cfg.build(line_rate);
        slot.cnp_interval = cfg.cnp_interval();
        slot.cnp_owed = false;
        let rate = slot.cc.as_ref().and_then(|c| c.rate());
        slot.gate.set_rate(self.now, rate);
    }

    pub fn cc(&self, s: usize) -> Option<&Controller> {
        self.slots[s].cc.as_ref()
    }

    /// A data packet for slot `s` arrived marked ECN-CE at `now`: owe its
    /// sender a CNP unless one went within the interval. Returns whether
    /// one is now owed.
    pub fn on_ce(&mut self, s: usize, now: Nanos) -> bool {
        let slot = &mut self.slots[s];
        let Some(iv) = slot.cnp_interval else {
            return false;
        };
        if slot.cnp_owed || slot.cnp_last.is_some_and(|t| now < t.saturating_add(iv)) {
            return false;
        }
        slot.cnp_owed = true;
        true
    }

    /// INT records for slot `s` arrived in an ACK.
    pub fn on_int(&mut self, s: usize, now: Nanos, hops: &[crate::cc::IntHop]) {
        let slot = &mut self.slots[s];
        if let Some(cc) = slot.cc.as_mut() {
            cc.on_int(now, hops);
            apply_cc(&mut slot.gate, cc, now);
        }
    }

    /// A CNP for slot `s` arrived: its reaction point cuts the rate.
    pub fn on_cnp(&mut self, s: usize, now: Nanos) {
        let slot = &mut self.slots[s];
        if let Some(cc) = slot.cc.as_mut() {
            cc.on_cnp(now);
            apply_cc(&mut slot.gate, cc, now);
        }
    }

    /// Unacknowledged bytes towards `gid` across its QPs.
    pub fn dest_inflight(&self, gid: &[u8; 16]) -> u64 {
        self.by_gid
            .get(gid)
            .map_or(0, |&d| self.dests[d as usize].inflight)
    }

    /// After anything that may have changed what the QP in slot `s` can
    /// send: update its destination and budget, feed the loss back-off,
    /// file it where it belongs and arm its timer.
    pub fn sync(&mut self, s: usize, qp: &Qp, now: Nanos, fb: Option<(Before, &mut Stats)>) {
        self.now = self.now.max(now);
        let want_gid = (qp.qp_type.is_reliable()
            && matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ))
        .then_some(qp.attr.av.dgid);
        let d = self.slots[s].dest;
        let same = match want_gid {
            Some(g) => d != NIL && self.dests[d as usize].gid == g,
            None => d == NIL,
        };
        if !same {
            self.detach(s);
            if let Some(g) = want_gid {
                self.attach(s, g);
            }
        }
        if let Some((before, stats)) = fb {
            let slot = &mut self.slots[s];
            if stats.timeouts > before.timeouts {
                // The loss back-off keeps a go-back-N resend from refilling
                // the queue that overflowed. Selective repeat resends one
                // packet on a timeout, so it refills nothing; and halving
                // on random loss only starves it of the packets behind a
                // gap that reveal the gap (docs/CONGESTION.md). Congestion
                // control, when on, still hears of the timeout.
                if !qp.selective_repeat() {
                    slot.gate.on_timeout();
                    stats.window_backoffs += 1;
                }
                slot.probes.clear(); // Karn: nothing resent is timed
                if let Some(cc) = slot.cc.as_mut() {
                    cc.on_timeout(now);
                    apply_cc(&mut slot.gate, cc, now);
                }
            } else if qp.comp.psn.after(before.una) {
                slot.gate.on_acked(before.una.distance_to(qp.comp.psn));
                if let Some(cc) = slot.cc.as_mut() {
                    cc.on_acked();
                    let mut heard = false;
                    while let Some((_, sent)) = slot.probes.pop_acked(qp.comp.psn) {
                        cc.on_rtt(now, now.saturating_sub(sent), qp.mtu());
                        heard = true;
                    }
                    if heard {
                        apply_cc(&mut slot.gate, cc, now);
                    }
                }
            }
        }
        let charge = inflight_bytes(qp);
        let slot = &mut self.slots[s];
        let d = slot.dest;
        if d != NIL {
            let dest = &mut self.dests[d as usize];
            dest.inflight = dest.inflight - slot.charged + charge;
        }
        slot.charged = charge;
        let want = self.want(s, qp, now);
        self.file(s, want);
        self.arm(s, qp);
        if d != NIL {
            self.refill(d);
        }
    }

    /// Where the QP in slot `s` stands. The requester's own test decides
    /// whether a request may go, so this can never disagree with it.
    fn want(&self, s: usize, qp: &Qp, now: Nanos) -> Want {
        if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Err) {
            return Want::Nothing;
        }
        if qp.resp.has_output() || self.slots[s].cnp_owed {
            return Want::Send;
        }
        match qp.request_ready(self.limit(s, qp)) {
            Err(Stop::Idle) => Want::Nothing,
            Err(Stop::Gate(psn)) if psn.before(self.own_limit(s, qp)) => {
                // Held by its destination's budget — unless its rate gate
                // is closed too. That one holds it first: its timer, unlike
                // the budget, does not move when other QPs send, so a QP
                // filed as paced stays correctly filed until it fires.
                let g = &self.slots[s].gate;
                if g.rate_open(now) {
                    Want::Dest
                } else {
                    Want::Pace(g.next_send_at())
                }
            }
            Err(Stop::Gate(_)) => Want::Nothing,
            // Local work (a bind, an invalidation, a finished WQE to
            // complete) is done by the requester's turn, which a closed
            // rate gate skips: it waits for the gate like a packet, or the
            // QP would sit on the ready list with nothing its visit may do.
            Err(Stop::Local) | Ok(()) => {
                let g = &self.slots[s].gate;
                if g.rate_open(now) {
                    Want::Send
                } else {
                    Want::Pace(g.next_send_at())
                }
            }
        }
    }

    /// One past the last PSN the QP's own window allows.
    fn own_limit(&self, s: usize, qp: &Qp) -> Psn {
        qp.comp.psn.add(self.slots[s].gate.window(qp.mtu()))
    }

    /// One past the last PSN the QP may send: its own window, and for new
    /// PSNs (from `hwm` on) the room left in its destination's budget —
    /// none while others wait for it, unless this QP is one they woke: the
    /// budget is served first come, first served.
    fn limit(&self, s: usize, qp: &Qp) -> Psn {
        let own = self.own_limit(s, qp);
        let d = self.slots[s].dest;
        if d == NIL {
            return own;
        }
        let dest = &self.dests[d as usize];
        let room = if dest.waiters.len > 0 && !self.slots[s].woken {
            0
        } else {
            let free = self.budget.saturating_sub(dest.inflight);
            free.div_ceil(psn_cost(qp.mtu())).min(1 << 22) as u32
        };
        let by_dest = qp.req.hwm.add(room);
        if by_dest.before(own) {
            by_dest
        } else {
            own
        }
    }

    /// File slot `s` as `want` says. A QP already on the ready list keeps
    /// its place in the round.
    fn file(&mut self, s: usize, want: Want) {
        let si = s as u32;
        if want != Want::Send {
            self.unready(s);
        }
        if want != Want::Dest && self.slots[s].place == Place::Parked {
            let d = self.slots[s].dest as usize;
            self.dests[d].waiters.unlink(&mut self.slots, si);
            self.slots[s].place = Place::Idle;
        }
        self.slots[s].pace_at = match want {
            Want::Pace(t) => Some(t),
            _ => None,
        };
        match (want, self.slots[s].place) {
            (Want::Send, Place::Idle) => {
                self.ready.push_back(&mut self.slots, si);
                self.slots[s].place = Place::Ready;
            }
            (Want::Dest, Place::Idle) => {
                let d = self.slots[s].dest as usize;
                self.dests[d].waiters.push_back(&mut self.slots, si);
                self.slots[s].place = Place::Parked;
            }
            _ => {}
        }
    }

    /// Take slot `s` off the ready list, if it is there.
    fn unready(&mut self, s: usize) {
        self.clear_woken(s);
        if self.slots[s].place == Place::Ready {
            self.ready.unlink(&mut self.slots, s as u32);
            self.slots[s].place = Place::Idle;
            self.slots[s].deficit = 0;
        }
    }

    fn clear_woken(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        if slot.woken {
            slot.woken = false;
            self.dests[slot.dest as usize].woken -= 1;
        }
    }

    /// Wake waiters of destination `d` while its free budget has room for
    /// more full packets than are already woken.
    fn refill(&mut self, d: u32) {
        let dest = &self.dests[d as usize];
        let room = self
            .budget
            .saturating_sub(dest.inflight)
            .div_ceil(MAX_PSN_COST);
        while (self.dests[d as usize].woken as u64) < room {
            let s = self.dests[d as usize].waiters.head;
            if s == NIL {
                break;
            }
            self.dests[d as usize].waiters.unlink(&mut self.slots, s);
            self.ready.push_back(&mut self.slots, s);
            let slot = &mut self.slots[s as usize];
            slot.place = Place::Ready;
            slot.woken = true;
            self.dests[d as usize].woken += 1;
        }
    }

    fn attach(&mut self, s: usize, gid: [u8; 16]) {
        let d = match self.by_gid.get(&gid) {
            Some(&d) => d,
            None => {
                let dest = Dest {
                    gid,
                    refs: 0,
                    inflight: 0,
                    waiters: List::EMPTY,
                    woken: 0,
                };
                let d = match self.free_dests.pop() {
                    Some(d) => {
                        self.dests[d as usize] = dest;
                        d
                    }
                    None => {
                        self.dests.push(dest);
                        (self.dests.len() - 1) as u32
                    }
                };
                self.by_gid.insert(gid, d);
                d
            }
        };
        self.dests[d as usize].refs += 1;
        self.slots[s].dest = d;
    }

    fn detach(&mut self, s: usize) {
        let d = self.slots[s].dest;
        if d == NIL {
            return;
        }
        if self.slots[s].place == Place::Parked {
            self.dests[d as usize]
                .waiters
                .unlink(&mut self.slots, s as u32);
            self.slots[s].place = Place::Idle;
        }
        self.clear_woken(s);
        let slot = &mut self.slots[s];
        let dest = &mut self.dests[d as usize];
        dest.inflight -= slot.charged;
        slot.charged = 0;
        slot.dest = NIL;
        dest.refs -= 1;
        if dest.refs == 0 {
            self.by_gid.remove(&dest.gid);
            self.free_dests.push(d);
        } else {
            self.refill(d);
        }
    }

    /// The earliest deadline of slot `s`'s QP: its completer's timers and
    /// its pacing time.
    fn deadline(&self, s: usize, qp: &Qp) -> Option<Nanos> {
        let slot = &self.slots[s];
        [
            qp.next_timeout(),
            slot.pace_at,
            slot.cc.as_ref().and_then(|c| c.next_timer()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Give slot `s` a heap entry at or before its deadline. A deadline that
    /// moved later keeps the earlier entry (see `settle_timers`).
    fn arm(&mut self, s: usize, qp: &Qp) {
        let Some(t) = self.deadline(s, qp) else {
            return;
        };
        let slot = &mut self.slots[s];
        if slot.armed.is_some_and(|a| a <= t) {
            return;
        }
        if slot.armed.is_none() {
            self.armed += 1;
        }
        slot.gen = slot.gen.wrapping_add(1);
        slot.armed = Some(t);
        self.timers.push(t, s as u32, slot.gen);
    }

    fn is_live(&self, (t, s, gen): (Nanos, u32, u32)) -> bool {
        let slot = &self.slots[s as usize];
        slot.gen == gen && slot.armed == Some(t)
    }

    /// Make the heap's top exact: drop stale entries and move an early one
    /// (a deadline pushed out since it was armed) to where it belongs. After
    /// this the top is the endpoint's earliest deadline.
    pub fn settle_timers(&mut self, qps: &[Option<Qp>]) {
        while let Some(e @ (t, s, _)) = self.timers.peek() {
            if !self.is_live(e) {
                self.timers.pop();
                continue;
            }
            let s = s as usize;
            let qp = qps[s].as_ref().expect("a live timer belongs to a QP");
            let truth = self.deadline(s, qp);
            if truth == Some(t) {
                break;
            }
            self.timers.pop();
            self.slots[s].armed = None;
            self.armed -= 1;
            self.arm(s, qp);
        }
        let slots = &self.slots;
        self.timers.compact(self.armed, |&(t, s, g)| {
            let slot = &slots[s as usize];
            slot.gen == g && slot.armed == Some(t)
        });
    }

    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.peek().map(|(t, _, _)| t)
    }

    /// Fire the timers due at `now`, visiting only their QPs.
    pub fn handle_timeout(&mut self, qps: &mut [Option<Qp>], shared: &mut Shared, now: Nanos) {
        self.now = self.now.max(now);
        while let Some(e @ (t, s, _)) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if !self.is_live(e) {
                continue;
            }
            let s = s as usize;
            self.slots[s].armed = None;
            self.armed -= 1;
            let qp = qps[s].as_mut().expect("a live timer belongs to a QP");
            let before = Before::of(qp, &shared.stats);
            if qp.next_timeout().is_some_and(|d| d <= now) {
                qp.handle_timeout(now, shared);
            }
            if self.slots[s].pace_at.is_some_and(|p| p <= now) {
                self.slots[s].pace_at = None;
            }
            let slot = &mut self.slots[s];
            if let Some(cc) = slot.cc.as_mut() {
                if cc.next_timer().is_some_and(|t| t <= now) {
                    cc.on_timer(now);
                    apply_cc(&mut slot.gate, cc, now);
                }
            }
            self.sync(s, qp, now, Some((before, &mut shared.stats)));
        }
        self.settle_timers(qps);
    }

    /// The next packet of the QP at the head of the ready list.
    /// Whether some QP is ready and everything the ready QPs have to send
    /// is a lone positive ACK each: no request, no READ or atomic
    /// response, no NAK. Only then may a pass leave its output for the
    /// application's next call (see the verbs engine's deferred ACKs): a
    /// READ response held back reads memory later than it arrived and
    /// keeps the requester waiting, a request held back costs bandwidth.
    /// False when nothing is ready: a pass with nothing to send holds
    /// nothing back, and must not count as one that did (the engine lets
    /// only every other pass defer, so a pass that "deferred" nothing kept
    /// the next one, with a WRITE's ACK to hold, from holding it). Visits
    /// the ready list only, and stops at the first QP with anything else.
    pub fn only_acks_ready(&self, qps: &[Option<Qp>]) -> bool {
        let mut s = self.ready.head;
        if s == NIL {
            return false;
        }
        while s != NIL {
            let i = s as usize;
            let Some(qp) = qps[i].as_ref() else {
                return false;
            };
            if !qp.only_ack_queued()
                || matches!(
                    qp.request_ready(self.limit(i, qp)),
                    Ok(()) | Err(Stop::Local)
                )
            {
                return false;
            }
            s = self.slots[i].next;
        }
        true
    }

    /// The next packets to send, one QP's: up to `out.len()` of them, the
    /// `k`th written into `bufs[k * HEAD_ROOM..]` (see
    /// [`crate::Endpoint::poll_transmit_burst`]). Returns how many.
    ///
    /// The first packet is chosen as a lone one would be. A burst goes on
    /// only with what a run of single polls would send next, the QP's
    /// turn not spent (or no other QP ready): after a response, more of its
    /// responses, up to a lone ACK (which a request may pass); after a
    /// request, more requests, with no congestion controller (it times and
    /// reacts per packet), no ACK passed, not a waiter woken for one new
    /// PSN, the rate gate open. Between the packets of a burst nothing
    /// reaches the endpoint, so a request run's response queue (empty: a
    /// response would have gone first) stays empty, and the QP's limit
    /// cannot change: its window ends where the last ACK put it, and its
    /// destination's room shrinks by one PSN's cost for each new PSN sent
    /// while the high-water mark grows by one, so the PSN bound computed
    /// for the first packet is the bound each later packet would have been
    /// given. Its filing, charge and timers are brought up to date once,
    /// after the last packet.
    pub fn poll_transmit(
        &mut self,
        qps: &mut [Option<Qp>],
        shared: &mut Shared,
        now: Nanos,
        bufs: &mut [u8],
        out: &mut [Transmit],
        mem: &impl crate::mr::Memory,
    ) -> usize {
        self.now = self.now.max(now);
        let max = out.len().min(bufs.len() / HEAD_ROOM);
        if max == 0 {
            return 0;
        }
        let buf = &mut bufs[..HEAD_ROOM];
        let mut empty = 0usize;
        loop {
            let s = self.ready.head;
            if s == NIL {
                self.settle_timers(qps);
                return 0;
            }
            let s = s as usize;
            shared.stats.sched_visits += 1;
            if self.slots[s].deficit <= 0 {
                self.slots[s].deficit += self.quantum;
            }
            let qp = qps[s].as_mut().expect("a ready slot holds a QP");
            let mut t = None;
            // What more of this QP's may follow in the burst: requests
            // under the limit the first was built under, or responses.
            let mut burst = None;
            if self.slots[s].cnp_owed {
                // The notification point's CNP goes ahead of everything: it
                // is what slows the sender filling the marked queue.
                self.slots[s].cnp_owed = false;
                if !matches!(qp.state, QpState::Reset | QpState::Init | QpState::Err) {
                    self.slots[s].cnp_last = Some(now);
                    shared.stats.cnps_sent += 1;
                    t = Some(qp.emit_cnp(buf));
                }
            }
            if t.is_none() && !matches!(qp.state, QpState::Reset | QpState::Init | QpState::Err) {
                // Responses go first (they open the peer's window), except
                // that one request may pass a lone queued ACK: in a
                // ping-pong the responder's ACK and its reply leave
                // together, and on a loopback or a software receiver each
                // datagram is processed in full before the next, so the
                // reply sent first reaches the peer one datagram's
                // processing sooner, while the ACK, which the peer's
                // application is not waiting for, follows at once. One
                // request at most: a long message never holds an ACK back.
                let pass =
                    !self.slots[s].acks_first && !self.slots[s].passed_ack && qp.only_ack_queued();
                self.slots[s].passed_ack = false;
                if !pass {
                    t = qp.poll_response(buf, shared, mem);
                    burst = t.is_some().then_some(Run::Responses);
                }
                if t.is_none() && self.slots[s].gate.rate_open(now) {
                    let limit = self.limit(s, qp);
                    let hwm = qp.req.hwm;
                    // An RTT sample is wanted: the next packet asks for its
                    // ACK, so the sample is one round trip, not the time to
                    // send the rest of the window.
                    let probe = self.slots[s].probes.wanted(self.slots[s].cc.as_ref());
                    // Swift may shrink its window below what is in flight, and
                    // HPCC reads the INT that ACKs echo: with either, every
                    // packet asks for its ACK (else a shrunk window waits for
                    // the retransmission timer, and HPCC hears once per 64
                    // packets).
                    let every = self.slots[s]
                        .cc
                        .as_ref()
                        .is_some_and(|c| c.acks_every_packet());
                    qp.req.ask_ack = probe || every;
                    t = qp.poll_request(now, buf, shared, limit, mem);
                    qp.req.ask_ack = false;
                    // A woken waiter may start one new PSN, then waits at
                    // the back again; a congestion controller times and
                    // reacts per packet: no burst for either.
                    let slot = &self.slots[s];
                    let more = !pass && !slot.woken && slot.cc.is_none();
                    burst = (t.is_some() && more).then_some(Run::Requests(limit));
                    if t.is_some() {
                        let psn = Psn::new(u32::from_be_bytes([0, buf[9], buf[10], buf[11]]));
                        if psn.before(hwm) {
                            // A resend (after a NAK, an RNR back-off, a
                            // selective-repeat repair, not only a timeout):
                            // the ACKs that time the probes now answer it,
                            // and would measure the wait for the repair.
                            // Karn: drop them, time only new PSNs.
                            self.slots[s].probes.clear();
                        } else if probe {
                            let seg = self.slots[s].cc.as_ref().and_then(|c| c.sample_bytes());
                            self.slots[s].probes.push(psn, now, seg);
                        }
                    }
                    if let Some(t) = &t {
                        let slot = &mut self.slots[s];
                        slot.probes.until = slot.probes.until.saturating_sub(t.wire_len() as u32);
                        slot.gate.on_sent(now, t.wire_len());
                        slot.passed_ack = pass;
                        if let Some(cc) = slot.cc.as_mut() {
                            cc.on_send(now, t.wire_len() as u32);
                            apply_cc(&mut slot.gate, cc, now);
                        }
                    }
                }
                if t.is_none() && pass {
                    t = qp.poll_response(buf, shared, mem);
                }
            }
            // A woken waiter has had its turn at the budget (if it sends
            // more, it waits at the back again).
            self.clear_woken(s);
            let Some(t) = t else {
                self.sync(s, qp, now, None);
                // `want` and the requester agree, so a QP filed as ready
                // has a packet, or work that sends none (a bind, a local
                // invalidate, a finished WQE to complete), which the visit
                // just did. A QP still ready after an empty visit goes to
                // the back; one that keeps coming back empty would be a
                // broken invariant, and must not spin here.
                empty += 1;
                if self.slots[s].place == Place::Ready {
                    if empty > 2 * self.ready.len as usize + 2 {
                        debug_assert!(false, "QP {:#x} filed ready sends nothing", qp.qpn);
                        self.unready(s);
                    } else {
                        self.ready.unlink(&mut self.slots, s as u32);
                        self.ready.push_back(&mut self.slots, s as u32);
                    }
                }
                continue;
            };
            out[0] = t;
            let mut n = 1;
            let mut bytes = t.wire_len() as u64;
            if let Some(run) = burst.filter(|_| max > 1) {
                let alone = self.ready.len == 1;
                let slot = &mut self.slots[s];
                while n < max {
                    if slot.deficit <= bytes as i64 {
                        if !alone {
                            break;
                        }
                        // The only QP ready: its next turn comes at once.
                        slot.deficit += self.quantum;
                    }
                    let buf = &mut bufs[n * HEAD_ROOM..(n + 1) * HEAD_ROOM];
                    match run {
                        Run::Requests(limit) => {
                            // Built in its slot of `out`.
                            if !slot.gate.rate_open(now)
                                || qp
                                    .poll_request_into(now, buf, shared, limit, mem, &mut out[n])
                                    .is_none()
                            {
                                break;
                            }
                            slot.gate.on_sent(now, out[n].wire_len());
                        }
                        Run::Responses => {
                            // A lone ACK left: the next call may let a
                            // request pass it, so the burst ends here.
                            if qp.only_ack_queued() {
                                break;
                            }
                            let Some(t) = qp.poll_response(buf, shared, mem) else {
                                break;
                            };
                            out[n] = t;
                        }
                    }
                    bytes += out[n].wire_len() as u64;
                    n += 1;
                }
            }
            self.slots[s].deficit -= bytes as i64;
            self.sync(s, qp, now, None);
            let slot = &self.slots[s];
            if slot.place == Place::Parked
                && self.dests[slot.dest as usize].waiters.len == 1
                && self.ready.len > 0
            {
                // It filled the budget and is the first to wait for it; the
                // ready QPs behind it have not had their turn yet and will
                // wait too. Let them queue first: end its turn at the back of
                // the ready list, and it parks behind them when it comes up.
                let d = slot.dest as usize;
                self.dests[d].waiters.unlink(&mut self.slots, s as u32);
                self.ready.push_back(&mut self.slots, s as u32);
                self.slots[s].place = Place::Ready;
            } else if slot.place == Place::Ready && slot.deficit <= 0 && self.ready.len > 1 {
                self.ready.unlink(&mut self.slots, s as u32);
                self.ready.push_back(&mut self.slots, s as u32);
            }
            self.settle_timers(qps);
            shared.stats.tx_packets += n as u64;
            shared.stats.tx_bytes += bytes;
            return n;
        }
    }

    /// Check that no QP is forgotten: every QP that may send is on the ready
    /// list, one held by its rate has a timer, one held by its destination
    /// is parked where a release will wake it; the lists, budgets and timer
    /// heap are consistent. O(QPs + timers): for tests.
    pub fn check(&self, qps: &[Option<Qp>]) -> Result<(), String> {
        let mut on_ready = vec![false; self.slots.len()];
        let mut n = 0u32;
        let mut prev = NIL;
        for s in self.ready.iter(&self.slots) {
            let slot = &self.slots[s as usize];
            if slot.place != Place::Ready || slot.prev != prev || on_ready[s as usize] {
                return Err(format!("ready list broken at slot {s}"));
            }
            on_ready[s as usize] = true;
            prev = s;
            n += 1;
        }
        if n != self.ready.len || self.ready.tail != prev {
            return Err(format!("ready list holds {n}, says {}", self.ready.len));
        }
        let mut live = vec![false; self.slots.len()];
        let mut nlive = 0;
        for e in self.timers.iter() {
            if self.is_live(e) {
                if live[e.1 as usize] {
                    return Err(format!("slot {} has two live timers", e.1));
                }
                live[e.1 as usize] = true;
                nlive += 1;
            }
        }
        if nlive != self.armed {
            return Err(format!("{nlive} live timers, {} armed", self.armed));
        }
        let mut inflight = vec![0u64; self.dests.len()];
        let mut woken = vec![0u32; self.dests.len()];
        let mut earliest: Option<Nanos> = None;
        for (s, slot) in self.slots.iter().enumerate() {
            let Some(qp) = qps.get(s).and_then(|q| q.as_ref()) else {
                if slot.place != Place::Idle || slot.dest != NIL || slot.armed.is_some() {
                    return Err(format!("slot {s} has no QP but is still scheduled"));
                }
                continue;
            };
            let q = qp.qpn;
            if on_ready[s] != (slot.place == Place::Ready) {
                return Err(format!("QP {q:#x} is marked ready but not on the list"));
            }
            if slot.dest != NIL {
                if inflight_bytes(qp) != slot.charged {
                    return Err(format!(
                        "QP {q:#x} charges {} bytes to its destination, has {} in flight",
                        slot.charged,
                        inflight_bytes(qp)
                    ));
                }
                inflight[slot.dest as usize] += slot.charged;
                woken[slot.dest as usize] += slot.woken as u32;
            } else if slot.charged != 0 || slot.woken {
                return Err(format!("QP {q:#x} has no destination but charges one"));
            }
            let want = self.want(s, qp, self.now);
            let ok = match want {
                Want::Send => slot.place == Place::Ready,
                Want::Pace(t) => slot.place == Place::Ready || slot.pace_at == Some(t),
                Want::Dest => matches!(slot.place, Place::Ready | Place::Parked),
                Want::Nothing => true,
            };
            if !ok {
                return Err(format!(
                    "QP {q:#x} is forgotten: it wants {want:?} but is filed {:?} (pace_at {:?})",
                    slot.place, slot.pace_at
                ));
            }
            if let Some(d) = self.deadline(s, qp) {
                match slot.armed {
                    Some(a) if a <= d && live[s] => {}
                    a => {
                        return Err(format!(
                            "QP {q:#x} has a deadline at {d} but its timer is {a:?}"
                        ))
                    }
                }
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
            }
        }
        if let Some(e) = earliest {
            if self.poll_timeout() != Some(e) {
                return Err(format!(
                    "poll_timeout says {:?}, the earliest deadline is {e}",
                    self.poll_timeout()
                ));
            }
        }
        for (d, dest) in self.dests.iter().enumerate() {
            if dest.refs == 0 {
                continue;
            }
            if dest.inflight != inflight[d] || dest.woken != woken[d] {
                return Err(format!(
                    "destination {d}: {} bytes and {} woken recorded, {} and {} counted",
                    dest.inflight, dest.woken, inflight[d], woken[d]
                ));
            }
            for s in dest.waiters.iter(&self.slots) {
                let slot = &self.slots[s as usize];
                if slot.place != Place::Parked || slot.dest != d as u32 {
                    return Err(format!("wait list of destination {d} broken at slot {s}"));
                }
            }
            let room = self
                .budget
                .saturating_sub(dest.inflight)
                .div_ceil(MAX_PSN_COST);
            if dest.waiters.len > 0 && (dest.woken as u64) < room {
                return Err(format!(
                    "destination {d} has room for {room} packets, {} QPs waiting and only {} woken",
                    dest.waiters.len, dest.woken
                ));
            }
        }
        Ok(())
    }
}
