//! The per-QP transmit gate: how much a QP may have unacknowledged, and how
//! fast it may send, on top of what its protocol state allows.
//!
//! The gate decides *when* request packets leave, never what they contain:
//! PSNs, opcodes, payload and the IBA retry semantics (`retry_cnt`,
//! `rnr_retry`, `timeout`) are the requester's and completer's alone.
//! Responses (ACKs, NAKs, READ responses, atomic ACKs) are not gated: they
//! are what opens the peer's gates, and holding them back could only stall
//! both sides.
//!
//! Three limits, each a hook for congestion control (which will drive them
//! through [`crate::Endpoint::set_qp_window`] and
//! [`crate::Endpoint::set_qp_rate`]):
//!
//! * a **window** of unacknowledged PSNs (at most [`MAX_UNACKED_PSNS`]) and,
//!   optionally, of bytes. On a retransmission timeout the PSN window halves
//!   (down to one packet) and it grows back by one packet per window's worth
//!   of acknowledged PSNs: loss back-off, so a go-back-N resend after a
//!   timeout does not refill the queue that overflowed. Congestion control
//!   will replace this.
//! * a **rate**, as a pacer on the core's `now`: after a packet of `L` bytes
//!   (its [`crate::Transmit::wire_len`]) the next may leave `L * 8 / rate`
//!   later. No burst allowance: packet times are exact, and a rate gate
//!   exists to spread packets, not to bunch them. `None` is line rate. A
//!   new rate applies to the wait already running as well: the part of the
//!   last packet's bit time not yet waited out is waited at the new rate.
//! * the **per-destination budget** is not here but in the scheduler
//!   ([`crate::sched`]), since it is shared by every QP towards one GID; the
//!   gate only supplies the unit it is counted in ([`psn_cost`]).
//!
//! Unacknowledged bytes are counted per PSN at a full path MTU plus
//! [`PACKET_OVERHEAD`]: `(hwm - una) * psn_cost(mtu)`. That is exact for
//! MTU-sized packets and an upper bound otherwise (a 64-byte SEND counts as
//! a full MTU), and a READ counts the responses it has asked for. The bound
//! costs no per-PSN bookkeeping and cannot drift: it is recomputed from the
//! completer's and requester's PSNs, never accumulated.

use crate::qp::MAX_UNACKED_PSNS;
use crate::Nanos;

/// Bytes a packet costs beyond its payload in the accounting above: IPv4,
/// UDP, BTH, RETH and ICRC (20 + 8 + 12 + 16 + 4), rounded up.
pub const PACKET_OVERHEAD: u64 = 64;

/// What one unacknowledged PSN counts for at a path MTU.
pub fn psn_cost(mtu: u32) -> u64 {
    mtu as u64 + PACKET_OVERHEAD
}

/// One QP's window and rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxGate {
    /// The PSN window's ceiling (`set_qp_window`).
    max_psns: u32,
    /// The byte window, if any (`set_qp_window`).
    max_bytes: Option<u64>,
    /// The PSN window now: `1..=max_psns`, halved by timeouts.
    psns: u32,
    /// PSNs acknowledged since the window last grew.
    acked: u32,
    /// Bits per second; `None`: line rate.
    rate: Option<u64>,
    /// The earliest time the next request packet may leave.
    next_at: Nanos,
    /// Remainder of the last pacing division, in units of 1/rate ns, so a
    /// rate that does not divide a packet's bit time evenly does not drift.
    carry: u64,
}

impl Default for TxGate {
    fn default() -> Self {
        TxGate {
            max_psns: MAX_UNACKED_PSNS,
            max_bytes: None,
            psns: MAX_UNACKED_PSNS,
            acked: 0,
            rate: None,
            next_at: 0,
            carry: 0,
        }
    }
}

impl TxGate {
    /// The PSN window's ceiling.
    pub fn max_psns(&self) -> u32 {
        self.max_psns
    }

    /// The byte window, if one is set.
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }

    /// The PSN window in force now (after loss back-off), before the byte
    /// window is applied.
    pub fn psns(&self) -> u32 {
        self.psns
    }

    /// The rate in bits per second (`None`: line rate).
    pub fn rate(&self) -> Option<u64> {
        self.rate
    }

    /// The earliest time the next request packet may leave.
    pub fn next_send_at(&self) -> Nanos {
        self.next_at
    }

    /// Unacknowledged PSNs allowed at path MTU `mtu`: the PSN window, cut
    /// by the byte window, never below one packet (a window of zero would
    /// never be opened by an ACK).
    pub fn window(&self, mtu: u32) -> u32 {
        let by_bytes = self
            .max_bytes
            .map_or(u64::MAX, |b| b / psn_cost(mtu))
            .min(u32::MAX as u64) as u32;
        self.psns.min(by_bytes).max(1)
    }

    /// Set the window: `psns` in `1..=MAX_UNACKED_PSNS`, checked by the
    /// caller. It takes effect at once and resets the loss back-off.
    pub(crate) fn set_window(&mut self, psns: u32, bytes: Option<u64>) {
        self.max_psns = psns;
        self.psns = psns;
        self.max_bytes = bytes;
        self.acked = 0;
    }

    /// Set the byte window alone, keeping the PSN window and its loss
    /// back-off: for a window that moves with every ACK (HPCC's `W`), which
    /// would otherwise undo the back-off at each one.
    pub(crate) fn set_byte_window(&mut self, bytes: Option<u64>) {
        self.max_bytes = bytes;
    }

    /// Set the rate at `now` (`Some(0)` is refused by the caller). It takes
    /// effect at once, on the wait already running too: that wait is the
    /// last packet's bits, and what of them `now` has not yet paid for is
    /// paid at the new rate — a raised rate shortens the wait, a cut
    /// lengthens it, as a NIC's rate limiter refills at the rate in force.
    /// Leaving line rate starts with no wait.
    pub(crate) fn set_rate(&mut self, now: Nanos, rate: Option<u64>) {
        match (self.rate, rate) {
            (Some(old), Some(new)) if self.next_at >= now => {
                // Bit-nanoseconds still owed (`carry` is the fraction of a
                // nanosecond left over from the last division, in the same
                // unit), paid from `now` at the new rate.
                let owed = (self.next_at - now) as u128 * old as u128 + self.carry as u128;
                let new = new as u128;
                self.next_at = now.saturating_add((owed / new).min(u64::MAX as u128) as u64);
                self.carry = (owed % new) as u64;
            }
            (None, Some(_)) => {
                self.next_at = self.next_at.min(now);
                self.carry = 0;
            }
            _ => self.carry = 0,
        }
        self.rate = rate;
    }

    /// Whether the rate lets a request packet leave at `now`.
    pub fn rate_open(&self, now: Nanos) -> bool {
        self.rate.is_none() || now >= self.next_at
    }

    /// A request packet of `wire_len` bytes left at `now`.
    pub(crate) fn on_sent(&mut self, now: Nanos, wire_len: usize) {
        let Some(rate) = self.rate else { return };
        if now > self.next_at {
            // Idle time earns no credit: no bursts.
            self.next_at = now;
            self.carry = 0;
        }
        let bits_ns = (wire_len as u128) * 8 * 1_000_000_000 + self.carry as u128;
        let rate = rate as u128;
        self.next_at = self
            .next_at
            .saturating_add((bits_ns / rate).min(u64::MAX as u128) as u64);
        self.carry = (bits_ns % rate) as u64;
    }

    /// A retransmission timeout: halve the PSN window.
    pub(crate) fn on_timeout(&mut self) {
        self.psns = (self.psns / 2).max(1);
        self.acked = 0;
    }

    /// `n` more PSNs were acknowledged: grow the window by one packet per
    /// window's worth (additive increase).
    pub(crate) fn on_acked(&mut self, n: u32) {
        if self.psns >= self.max_psns {
            return;
        }
        self.acked = self.acked.saturating_add(n);
        while self.acked >= self.psns && self.psns < self.max_psns {
            self.acked -= self.psns;
            self.psns += 1;
        }
    }

    /// RESET: forget the loss back-off and the pacing state, keep what
    /// congestion control configured.
    pub(crate) fn reset(&mut self) {
        self.psns = self.max_psns;
        self.acked = 0;
        self.next_at = 0;
        self.carry = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_spaces_packets_by_their_bit_time() {
        let mut g = TxGate::default();
        g.set_rate(0, Some(1_000_000_000)); // 8 ns per byte
        assert!(g.rate_open(0));
        g.on_sent(0, 1000);
        assert_eq!(g.next_send_at(), 8000);
        assert!(!g.rate_open(7999));
        g.on_sent(8000, 500);
        assert_eq!(g.next_send_at(), 12_000);
        // Idle time earns no burst.
        g.on_sent(50_000, 1000);
        assert_eq!(g.next_send_at(), 58_000);
    }

    #[test]
    fn pacer_carries_remainders() {
        let mut g = TxGate::default();
        g.set_rate(0, Some(3_000_000_000)); // 8/3 ns per byte
        let mut t = 0;
        for _ in 0..3 {
            g.on_sent(t, 1);
            t = g.next_send_at();
        }
        assert_eq!(t, 8); // 3 bytes, 24 bits at 3 Gbit/s, no rounding loss
    }

    #[test]
    fn a_new_rate_applies_to_the_wait_already_running() {
        let mut g = TxGate::default();
        g.set_rate(0, Some(1_000_000_000)); // 8 ns per byte
        g.on_sent(0, 1000);
        assert_eq!(g.next_send_at(), 8000);
        // At 2000 a quarter of the packet's 8000 bits are waited out; the
        // other 6000 take 1500 ns at 4 Gb/s.
        g.set_rate(2000, Some(4_000_000_000));
        assert_eq!(g.next_send_at(), 3500);
        assert!(g.rate_open(3500));
        // A cut at 3000: 2000 bits left, 2000 ns at 1 Gb/s.
        g.set_rate(3000, Some(1_000_000_000));
        assert_eq!(g.next_send_at(), 5000);
        // Fractions carry: at 4000 the 1000 bits left take 333⅓ ns at
        // 3 Gb/s, and back at 1 Gb/s at once exactly 1000 ns again.
        g.set_rate(4000, Some(3_000_000_000));
        assert_eq!(g.next_send_at(), 4333);
        g.set_rate(4000, Some(1_000_000_000));
        assert_eq!(g.next_send_at(), 5000);
        // Through line rate: no wait is left to carry over.
        g.set_rate(4500, None);
        g.set_rate(4600, Some(1_000_000_000));
        assert!(g.rate_open(4600));
    }

    #[test]
    fn window_halves_on_timeout_and_grows_additively() {
        let mut g = TxGate::default();
        g.on_timeout();
        assert_eq!(g.psns(), 128);
        for _ in 0..10 {
            g.on_timeout();
        }
        assert_eq!(g.psns(), 1);
        g.on_acked(1);
        assert_eq!(g.psns(), 2);
        g.on_acked(1);
        assert_eq!(g.psns(), 2);
        g.on_acked(1);
        assert_eq!(g.psns(), 3);
        g.on_acked(1 << 20);
        assert_eq!(g.psns(), MAX_UNACKED_PSNS);
    }

    #[test]
    fn byte_window_cuts_the_psn_window_but_never_to_zero() {
        let mut g = TxGate::default();
        g.set_window(200, Some(10 * psn_cost(1024)));
        assert_eq!(g.window(1024), 10);
        assert_eq!(g.window(4096), 2);
        g.set_window(200, Some(1));
        assert_eq!(g.window(4096), 1);
    }
}
