//! TIMELY (Mittal et al., SIGCOMM'15): rate control on the RTT and its
//! gradient, and Patched TIMELY (Zhu et al., "ECN or Delay", CoNEXT'16),
//! which adds the absolute RTT so that the fixed point is unique.
//!
//! One update per RTT sample (the scheduler takes one per round trip: the
//! first new PSN sent while none is timed, sampled when the cumulative ACK
//! passes it, never a retransmission — Karn's rule; or, with `seg`, one
//! per `seg` bytes sent, several in flight, TIMELY's completion events):
//!
//! ```text
//! rtt_diff ← (1 − α)·rtt_diff + α·(rtt − prev_rtt);   g = rtt_diff / min_rtt
//! rtt < T_low:   R ← R + δ
//! rtt > T_high:  R ← R·(1 − β·(1 − T_high/rtt))
//! g ≤ 0:         R ← R + N·δ   (N = 5 after 5 such updates in a row, else 1)
//! otherwise:     R ← R·(1 − β·g)
//! ```
//!
//! Patched TIMELY replaces the last two rules (the gradient band, whose
//! fixed points are every rate vector that fills the link) with
//! `R ← δ·(1 − w) + R·(1 − β·w·(1 − RTT_ref/rtt))`, `w(g)` = 0 for
//! g ≤ −¼, 2g + ½ between, 1 for g ≥ ¼.
//!
//! Parameters are HPCC's simulator's (its `UpdateRateTimely` and `run.py`),
//! which the issue's experiments reproduce: α 0.875, β 0.8, T_low 50 µs,
//! T_high 500 µs, min RTT 20 µs, δ = line rate / 1000 (100 Mb/s at 100G).
//! Mittal's public pseudocode recommends α = 0.02 and T_high = 1 ms instead;
//! both are parameters.

use crate::Nanos;

const US: Nanos = 1_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// `"timely"` or `"timely-patched"`.
    pub preset: &'static str,
    pub patched: bool,
    pub alpha: f64,
    pub beta: f64,
    pub t_low: Nanos,
    pub t_high: Nanos,
    pub min_rtt: Nanos,
    /// δ as a fraction of line rate.
    pub delta_frac: f64,
    /// Updates with g ≤ 0 in a row before hyper-active increase.
    pub hai_after: u32,
    /// Patched TIMELY's reference RTT.
    pub rtt_ref: Nanos,
    /// Floor of the rate as a fraction of line rate.
    pub min_frac: f64,
    /// Bytes per completion event: 0 updates once per round trip (HPCC's
    /// simulator); otherwise one RTT sample and one update per `seg` bytes
    /// sent, several in flight, as TIMELY's NIC does per completed segment
    /// (16–64 KB) and as Zhu et al.'s simulator does per 16 KB burst. It is
    /// what makes the update rate proportional to the flow's rate.
    pub seg: u32,
    /// The rate a new QP starts at, as a fraction of line rate.
    pub init_frac: f64,
}

impl Params {
    pub fn timely() -> Params {
        Params {
            preset: "timely",
            patched: false,
            alpha: 0.875,
            beta: 0.8,
            t_low: 50 * US,
            t_high: 500 * US,
            min_rtt: 20 * US,
            delta_frac: 1e-3,
            hai_after: 5,
            rtt_ref: 50 * US,
            min_frac: 1e-4,
            seg: 0,
            init_frac: 1.0,
        }
    }

    pub fn patched() -> Params {
        Params {
            preset: "timely-patched",
            patched: true,
            ..Params::timely()
        }
    }

    /// Set a parameter by the name `--cc timely:KEY=VALUE` uses.
    pub fn set(&mut self, key: &str, v: f64) -> Result<(), String> {
        let us = |v: f64| (v * 1e3).round() as Nanos;
        match key {
            "alpha" if (0.0..=1.0).contains(&v) => self.alpha = v,
            "beta" if (0.0..=1.0).contains(&v) => self.beta = v,
            "t_low" if v >= 0.0 => self.t_low = us(v),
            "t_high" if v > 0.0 => self.t_high = us(v),
            "min_rtt" if v > 0.0 => self.min_rtt = us(v),
            "rtt_ref" if v > 0.0 => self.rtt_ref = us(v),
            "delta" if v > 0.0 && v <= 1.0 => self.delta_frac = v,
            "min" if v > 0.0 && v <= 1.0 => self.min_frac = v,
            "init" if v > 0.0 && v <= 1.0 => self.init_frac = v,
            "seg" if (0.0..=(1u64 << 30) as f64).contains(&v) => self.seg = v as u32,
            "alpha" | "beta" | "t_low" | "t_high" | "min_rtt" | "rtt_ref" | "delta" | "min"
            | "init" | "seg" => return Err(format!("{key}={v} is out of range")),
            _ => {
                return Err(format!(
                    "TIMELY has no parameter `{key}` (alpha, beta, t_low, t_high, min_rtt, \
                     rtt_ref in µs; delta, min, init as fractions of line rate; seg in bytes)"
                ))
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timely {
    p: Params,
    line: f64,
    rate: f64,
    prev_rtt: Option<f64>,
    rtt_diff: f64,
    negative_run: u32,
    pub samples: u64,
}

impl Timely {
    pub fn new(p: Params, line_rate: u64) -> Timely {
        let line = line_rate.max(1) as f64;
        Timely {
            p,
            line,
            rate: (p.init_frac * line).clamp(p.min_frac * line, line),
            prev_rtt: None,
            rtt_diff: 0.0,
            negative_run: 0,
            samples: 0,
        }
    }

    /// Bytes per RTT sample (`None`: one per round trip).
    pub fn sample_bytes(&self) -> Option<u32> {
        (self.p.seg > 0).then_some(self.p.seg)
    }

    pub fn current_rate(&self) -> u64 {
        self.rate as u64
    }

    /// One RTT sample, in nanoseconds.
    pub fn on_rtt(&mut self, _now: Nanos, rtt: Nanos) {
        self.samples += 1;
        let p = &self.p;
        let rtt = rtt.max(1) as f64;
        let Some(prev) = self.prev_rtt.replace(rtt) else {
            return; // the first sample only sets the reference
        };
        self.rtt_diff = (1.0 - p.alpha) * self.rtt_diff + p.alpha * (rtt - prev);
        let g = self.rtt_diff / p.min_rtt.max(1) as f64;
        let delta = p.delta_frac * self.line;
        let (t_low, t_high) = (p.t_low as f64, p.t_high as f64);
        if rtt < t_low {
            self.rate += delta;
            self.negative_run = 0;
        } else if rtt > t_high {
            self.rate *= 1.0 - p.beta * (1.0 - t_high / rtt);
            self.negative_run = 0;
        } else if p.patched {
            let w = if g <= -0.25 {
                0.0
            } else if g >= 0.25 {
                1.0
            } else {
                2.0 * g + 0.5
            };
            self.rate =
                delta * (1.0 - w) + self.rate * (1.0 - p.beta * w * (1.0 - p.rtt_ref as f64 / rtt));
        } else if g <= 0.0 {
            self.negative_run += 1;
            let n = if self.negative_run >= p.hai_after {
                5.0
            } else {
                1.0
            };
            self.rate += n * delta;
        } else {
            self.negative_run = 0;
            self.rate *= 1.0 - p.beta * g;
        }
        self.rate = self.rate.clamp(p.min_frac * self.line, self.line);
    }

    pub fn rate(&self) -> Option<u64> {
        if self.rate >= self.line {
            None
        } else {
            Some((self.rate as u64).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000_000_000;

    #[test]
    fn the_rules() {
        let mut t = Timely::new(Params::timely(), G100);
        t.on_rtt(0, 100 * US);
        assert_eq!(t.rate(), None, "the first sample sets the reference");
        // Above T_high: multiplicative decrease by β(1 − T_high/rtt).
        t.on_rtt(1, 1000 * US);
        let want = 100e9 * (1.0 - 0.8 * (1.0 - 0.5));
        assert_eq!(t.current_rate(), want as u64);
        // Rising RTT in the band: decrease by β·g.
        let before = t.current_rate() as f64;
        t.on_rtt(2, 400 * US);
        // rtt_diff = 0.125·(0.875·900 µs) + 0.875·(−600 µs) < 0: increase by δ.
        assert_eq!(t.current_rate(), (before + 1e8) as u64);
        // Below T_low: additive increase.
        let before = t.current_rate() as f64;
        t.on_rtt(3, 10 * US);
        assert_eq!(t.current_rate(), (before + 1e8) as u64);
    }

    #[test]
    fn five_negative_gradients_make_hyper_increase() {
        let mut t = Timely::new(Params::timely(), G100);
        t.on_rtt(0, 600 * US);
        t.on_rtt(0, 600 * US * 4); // cut far down
        let mut rtt = 400 * US;
        let mut last = t.current_rate();
        for i in 0..7 {
            rtt -= 10 * US;
            t.on_rtt(0, rtt);
            let step = t.current_rate() - last;
            last = t.current_rate();
            if i >= 4 {
                assert_eq!(step, 500_000_000, "HAI at update {i}");
            }
        }
    }

    #[test]
    fn segment_mode_and_initial_rate() {
        let mut p = Params::timely();
        assert_eq!(Timely::new(p, G100).sample_bytes(), None);
        p.set("seg", 16384.0).unwrap();
        p.set("init", 0.1).unwrap();
        p.set("t_high", 1000.0).unwrap();
        let t = Timely::new(p, G100);
        assert_eq!(t.sample_bytes(), Some(16384));
        assert_eq!(t.current_rate(), 10_000_000_000);
        assert_eq!(p.t_high, 1000 * US);
        assert!(p.set("init", 0.0).is_err());
        assert!(p.set("beta", 2.0).is_err());
        let e = p.set("gamma", 1.0).unwrap_err();
        assert!(e.contains("no parameter `gamma`"), "{e}");
    }

    #[test]
    fn patched_timely_pulls_towards_the_reference_rtt() {
        // With a steady gradient of 0 (w = ½) and rtt above the reference,
        // the rate shrinks towards δ; below the reference it grows.
        let mut t = Timely::new(Params::patched(), G100);
        t.on_rtt(0, 200 * US);
        for _ in 0..50 {
            t.on_rtt(0, 200 * US);
        }
        let high = t.current_rate();
        let mut u = Timely::new(Params::patched(), G100);
        u.on_rtt(0, 200 * US);
        u.on_rtt(0, 400 * US); // cut
        for _ in 0..50 {
            u.on_rtt(0, 60 * US);
        }
        assert!(high < 20_000_000_000, "{high}");
        assert!(u.current_rate() > high);
    }
}
