//! HPCC (Li et al., SIGCOMM'19): a window computed from in-band telemetry.
//!
//! Each ACK carries the INT records the switches stamped on the data packet
//! it acknowledges: per hop the egress queue length, bytes sent so far, a
//! timestamp and the link rate. From two successive records of a hop the
//! sender gets the hop's transmit rate, and its utilisation
//!
//! ```text
//! u_j = qlen_j / (B_j·T) + txRate_j / B_j,    u = max_j u_j
//! U ← U·(T − τ)/T + u·τ/T                      (τ: time between the records, ≤ T)
//! U ≥ η or incStage ≥ maxStage:  W = Wc / (U/η) + W_AI
//! otherwise:                     W = Wc + W_AI
//! ```
//!
//! with the reference window `Wc ← W` (and `incStage` advanced or reset)
//! once per base RTT `T`; between, each ACK recomputes `W` from `Wc` ("fast
//! react"). A hop's queue is the smaller of its two records' (a queue seen
//! once may be a passing burst). `W` is the QP's byte window — no more than
//! `W` unacknowledged — and its pace, `W / T`. Parameters as HPCC's `run.py`: η
//! 0.95, maxStage 5, `W_AI` from 10·bw/25 Mb/s (40 Mb/s at 100G) over T.
//!
//! On the wire no switch stamps INT, so a QP running HPCC there never hears
//! anything: it keeps its first window (one BDP at the line rate) and is
//! never paced. The simulator is where it runs.

use super::IntHop;
use crate::Nanos;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Target utilisation η.
    pub eta: f64,
    pub max_stage: u32,
    /// Base RTT T of the fabric (HPCC uses the largest base RTT).
    pub base_rtt: Nanos,
    /// Additive increase, bits/s (W_AI = ai·T/8 bytes).
    pub ai: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            eta: 0.95,
            max_stage: 5,
            base_rtt: 13_000,
            ai: 40_000_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hpcc {
    p: Params,
    line: f64,
    /// Window and reference window, bytes.
    w: f64,
    wc: f64,
    u: f64,
    inc_stage: u32,
    last_ref: Option<Nanos>,
    /// The previous record of each hop.
    prev: [Option<IntHop>; 5],
    pub acks: u64,
}

impl Hpcc {
    pub fn new(p: Params, line_rate: u64) -> Hpcc {
        let line = line_rate.max(1) as f64;
        let bdp = line * p.base_rtt.max(1) as f64 / 8e9;
        Hpcc {
            p,
            line,
            w: bdp,
            wc: bdp,
            u: 0.0,
            inc_stage: 0,
            last_ref: None,
            prev: [None; 5],
            acks: 0,
        }
    }

    pub fn window_bytes(&self) -> f64 {
        self.w
    }

    pub fn utilisation(&self) -> f64 {
        self.u
    }

    pub fn on_int(&mut self, now: Nanos, hops: &[IntHop]) {
        self.acks += 1;
        let t = self.p.base_rtt.max(1) as f64;
        let mut u_max: Option<(f64, f64)> = None;
        for (j, h) in hops.iter().take(5).enumerate() {
            let Some(prev) = self.prev[j].replace(*h) else {
                continue;
            };
            if h.ts <= prev.ts || h.rate_bps == 0 {
                continue;
            }
            let dt = (h.ts - prev.ts) as f64; // ns
            let b = h.rate_bps as f64 / 8e9; // bytes per ns
            let tx_rate = h.tx_bytes.saturating_sub(prev.tx_bytes) as f64 / dt;
            // The smaller of the two queue lengths, as HPCC's
            // MeasureInflight: a queue seen once may be a passing burst.
            let u = h.qlen.min(prev.qlen) as f64 / (b * t) + tx_rate / b;
            if u_max.is_none_or(|(m, _)| u > m) {
                u_max = Some((u, dt.min(t)));
            }
        }
        let Some((u, tau)) = u_max else { return };
        self.u = self.u * (t - tau) / t + u * tau / t;
        let w_ai = self.p.ai as f64 * t / 8e9;
        let new_ref = self
            .last_ref
            .is_none_or(|r| now.saturating_sub(r) as f64 >= t);
        if self.u >= self.p.eta || self.inc_stage >= self.p.max_stage {
            self.w = self.wc / (self.u / self.p.eta) + w_ai;
            if new_ref {
                self.inc_stage = 0;
            }
        } else {
            self.w = self.wc + w_ai;
            if new_ref {
                self.inc_stage += 1;
            }
        }
        let bdp = self.line * t / 8e9;
        self.w = self.w.clamp(64.0, bdp);
        if new_ref {
            self.wc = self.w;
            self.last_ref = Some(now);
        }
    }

    /// Paced at W / T (`None` at a full BDP: line rate).
    pub fn rate(&self) -> Option<u64> {
        let bps = self.w * 8e9 / self.p.base_rtt.max(1) as f64;
        if bps >= self.line {
            None
        } else {
            Some((bps as u64).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000_000_000;

    fn hop(qlen: u32, tx_bytes: u64, ts: Nanos) -> IntHop {
        IntHop {
            qlen,
            tx_bytes,
            ts,
            rate_bps: G100,
        }
    }

    #[test]
    fn a_full_link_with_a_queue_shrinks_the_window_an_idle_one_grows_it() {
        let p = Params::default();
        let mut h = Hpcc::new(p, G100);
        let bdp = 100e9 * 13_000.0 / 8e9; // 162.5 KB
        assert_eq!(h.rate(), None);
        // Line rate through the hop (12.5 bytes/ns) and 100 KB queued in
        // both records.
        h.on_int(0, &[hop(100_000, 0, 0)]);
        h.on_int(13_000, &[hop(100_000, 162_500, 13_000)]);
        let u = 100_000.0 / (12.5 * 13_000.0) + 1.0;
        assert!((h.utilisation() - u).abs() < 1e-9);
        assert!((h.window_bytes() - (bdp / (u / 0.95) + 40e6 * 13_000.0 / 8e9)).abs() < 1e-6);
        assert!(h.rate().unwrap() < G100 * 3 / 5);
        // Then an empty, quiet link: U decays, the window grows back.
        let mut t = 13_000;
        let mut tx = 162_500;
        for _ in 0..200 {
            t += 13_000;
            tx += 1_000;
            h.on_int(t, &[hop(0, tx, t)]);
        }
        assert!(h.utilisation() < 0.1);
        assert_eq!(h.rate(), None, "back to a full BDP");
    }

    #[test]
    fn the_most_loaded_hop_decides() {
        let mut h = Hpcc::new(Params::default(), G100);
        h.on_int(0, &[hop(0, 0, 0), hop(50_000, 0, 0)]);
        // Hop 0 half loaded, hop 1 full with a queue.
        h.on_int(
            13_000,
            &[hop(0, 81_250, 13_000), hop(50_000, 162_500, 13_000)],
        );
        let u1 = 50_000.0 / (12.5 * 13_000.0) + 1.0;
        assert!((h.utilisation() - u1).abs() < 1e-9);
    }

    #[test]
    fn a_queue_seen_in_one_record_only_is_a_passing_burst() {
        let mut h = Hpcc::new(Params::default(), G100);
        h.on_int(0, &[hop(0, 0, 0)]);
        h.on_int(13_000, &[hop(100_000, 162_500, 13_000)]);
        assert!((h.utilisation() - 1.0).abs() < 1e-9, "line rate, no queue");
    }
}
