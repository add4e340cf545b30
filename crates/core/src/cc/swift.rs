//! Swift (Kumar et al., SIGCOMM'20): AIMD on a congestion window towards
//! an end-to-end delay target.
//!
//! On each RTT sample (one per round trip, see the scheduler):
//!
//! ```text
//! target = base_target + hops·h + fs(cwnd)
//! delay < target:  cwnd ← cwnd + ai               (ai per RTT, as ai/cwnd per ACK)
//! otherwise, at most once per RTT:
//!                  cwnd ← cwnd·max(1 − β·(delay − target)/delay, 1 − max_mdf)
//! ```
//!
//! `fs(cwnd) = clamp(α/√cwnd + β′, 0, fs_range)` is the flow-based scaling
//! that raises the target for flows with small windows (many flows
//! sharing a bottleneck), with α, β′ chosen so that fs is `fs_range` at
//! `fs_min_cwnd` and 0 at `fs_max_cwnd`. A retransmission timeout cuts the
//! window by `max_mdf` (at most once per RTT), and the
//! `retx_reset_threshold`-th timeout in a row drops it to `min_cwnd`; an
//! ACK that acknowledges progress starts the count again (the paper's
//! `retransmit_cnt`). Windows below one packet are paced: the QP sends
//! one packet per `rtt/cwnd`.
//!
//! The endpoint does not know the hop count here (Swift reads it from the
//! IP TTL), so `hops` is a parameter (0: the target is base + fs).
//! Constants are htsim's (`swift.cpp`, which calls them guesses): ai 1,
//! β 0.8, max_mdf 0.5, base target 20 µs, h = base/6.55, fs_range 5·base,
//! fs cwnd range 0.1–100 packets, 5 timeouts before the reset to
//! `min_cwnd` (the paper gives no value).

use crate::Nanos;

const US: Nanos = 1_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub ai: f64,
    pub beta: f64,
    pub max_mdf: f64,
    pub base_target: Nanos,
    pub per_hop: Nanos,
    pub hops: u32,
    pub fs_range: Nanos,
    pub fs_min_cwnd: f64,
    pub fs_max_cwnd: f64,
    /// The window's floor, packets (below one, a pace).
    pub min_cwnd: f64,
    /// Consecutive retransmission timeouts after which the window drops to
    /// `min_cwnd` (the paper's `RETX_RESET_THRESHOLD`); before, each cuts it
    /// by `max_mdf`.
    pub retx_reset_threshold: u32,
    /// The window's ceiling, packets (the transmit gate's limit).
    pub max_cwnd: f64,
}

impl Default for Params {
    fn default() -> Self {
        let base = 20 * US;
        Params {
            ai: 1.0,
            beta: 0.8,
            max_mdf: 0.5,
            base_target: base,
            per_hop: (base as f64 / 6.55) as Nanos,
            hops: 0,
            fs_range: 5 * base,
            fs_min_cwnd: 0.1,
            fs_max_cwnd: 100.0,
            min_cwnd: 0.01,
            retx_reset_threshold: 5,
            max_cwnd: crate::qp::MAX_UNACKED_PSNS as f64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Swift {
    p: Params,
    line: f64,
    cwnd: f64,
    last_decrease: Option<Nanos>,
    last_rtt: Nanos,
    /// Retransmission timeouts since the last ACK of progress.
    retransmits: u32,
    /// Bytes per packet the pacing assumes (the QP's path MTU, told with
    /// each sample).
    mtu: u32,
    pub samples: u64,
}

impl Swift {
    pub fn new(p: Params, line_rate: u64) -> Swift {
        Swift {
            p,
            line: line_rate.max(1) as f64,
            cwnd: p.max_cwnd,
            last_decrease: None,
            last_rtt: p.base_target,
            retransmits: 0,
            mtu: 4096,
            samples: 0,
        }
    }

    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The delay target at the current window.
    pub fn target(&self) -> Nanos {
        let p = &self.p;
        let (lo, hi) = (
            p.fs_min_cwnd.max(1e-6),
            p.fs_max_cwnd.max(p.fs_min_cwnd + 1e-6),
        );
        let alpha = p.fs_range as f64 / (1.0 / lo.sqrt() - 1.0 / hi.sqrt());
        let beta = -alpha / hi.sqrt();
        let fs = (alpha / self.cwnd.max(1e-6).sqrt() + beta).clamp(0.0, p.fs_range as f64);
        p.base_target + p.hops as Nanos * p.per_hop + fs.round() as Nanos
    }

    pub fn on_rtt(&mut self, now: Nanos, rtt: Nanos, mtu: u32) {
        self.samples += 1;
        self.mtu = mtu.max(1);
        self.last_rtt = rtt.max(1);
        let target = self.target();
        if rtt < target {
            self.cwnd += self.p.ai;
        } else if self
            .last_decrease
            .is_none_or(|t| now.saturating_sub(t) >= rtt)
        {
            let d = rtt as f64;
            let f = (1.0 - self.p.beta * (d - target as f64) / d).max(1.0 - self.p.max_mdf);
            self.cwnd *= f;
            self.last_decrease = Some(now);
        }
        self.cwnd = self.cwnd.clamp(self.p.min_cwnd, self.p.max_cwnd);
    }

    /// A retransmission timeout (Swift's Algorithm 1): the
    /// `retx_reset_threshold`-th in a row drops the window to `min_cwnd`;
    /// one before cuts it by `max_mdf`, if no decrease came within the
    /// last RTT.
    pub fn on_timeout(&mut self, now: Nanos) {
        self.retransmits = self.retransmits.saturating_add(1);
        if self.retransmits >= self.p.retx_reset_threshold {
            self.cwnd = self.p.min_cwnd;
            self.last_decrease = Some(now);
        } else if self
            .last_decrease
            .is_none_or(|t| now.saturating_sub(t) >= self.last_rtt)
        {
            self.cwnd *= 1.0 - self.p.max_mdf;
            self.last_decrease = Some(now);
        }
        self.cwnd = self.cwnd.clamp(self.p.min_cwnd, self.p.max_cwnd);
    }

    /// An ACK acknowledged progress: the timeouts in a row start again.
    pub fn on_acked(&mut self) {
        self.retransmits = 0;
    }

    /// The PSN window: ⌊cwnd⌋, at least one packet.
    pub fn window(&self) -> u32 {
        (self.cwnd.floor() as u32).max(1)
    }

    /// Below one packet, the window is a pace: one packet per rtt/cwnd.
    pub fn rate(&self) -> Option<u64> {
        if self.cwnd >= 1.0 {
            return None;
        }
        let bps = self.cwnd * self.mtu as f64 * 8.0 * 1e9 / self.last_rtt as f64;
        Some((bps.min(self.line) as u64).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additive_below_target_multiplicative_above_once_per_rtt() {
        let mut s = Swift::new(Params::default(), 100_000_000_000);
        s.cwnd = 10.0;
        s.on_rtt(0, 10 * US, 1024);
        assert_eq!(s.cwnd(), 11.0);
        // Far above target: capped at max_mdf.
        s.on_rtt(100 * US, 10_000 * US, 1024);
        assert_eq!(s.cwnd(), 5.5);
        // Within the same RTT: no second decrease.
        s.on_rtt(200 * US, 10_000 * US, 1024);
        assert_eq!(s.cwnd(), 5.5);
    }

    #[test]
    fn timeouts_cut_by_max_mdf_until_the_threshold_drops_to_min_cwnd() {
        let p = Params::default();
        let mut s = Swift::new(p, 100_000_000_000);
        s.cwnd = 64.0;
        s.last_rtt = 20 * US;
        s.on_timeout(0);
        assert_eq!(s.cwnd(), 32.0, "cut by max_mdf, not to one packet");
        // Another within the RTT: no second decrease.
        s.on_timeout(10 * US);
        assert_eq!(s.cwnd(), 32.0);
        s.on_timeout(40 * US);
        s.on_timeout(80 * US);
        assert_eq!(s.cwnd(), 8.0);
        // The fifth in a row: the window's floor.
        s.on_timeout(120 * US);
        assert_eq!(s.cwnd(), p.min_cwnd);
        assert!(s.rate().is_some(), "below one packet, paced");
        // Progress starts the count again.
        s.on_acked();
        s.cwnd = 64.0;
        s.on_timeout(200 * US);
        assert_eq!(s.cwnd(), 32.0);
    }

    #[test]
    fn flow_scaling_raises_the_target_for_small_windows() {
        let mut s = Swift::new(Params::default(), 100_000_000_000);
        s.cwnd = 100.0;
        assert_eq!(s.target(), 20 * US);
        s.cwnd = 0.1;
        assert_eq!(s.target(), 20 * US + 100 * US);
        s.cwnd = 2.0;
        assert!(s.target() > 20 * US && s.target() < 120 * US);
    }

    #[test]
    fn below_one_packet_the_window_paces() {
        let mut s = Swift::new(Params::default(), 100_000_000_000);
        s.cwnd = 0.5;
        s.last_rtt = 100 * US;
        s.mtu = 1000;
        assert_eq!(s.window(), 1);
        // Half a 1000-byte packet per 100 µs: 40 Mb/s.
        assert_eq!(s.rate(), Some(40_000_000));
    }
}
