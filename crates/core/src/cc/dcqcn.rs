//! DCQCN's reaction point (Zhu et al., SIGCOMM'15): the sender's rate
//! control on CNPs, with the paper's parameters and NVIDIA's firmware
//! parameters (ConnectX-4 and later) as presets.
//!
//! State: the current rate `rc`, the target rate `rt`, the congestion
//! estimate `alpha`, and two increase counters — a timer (every `T`) and a
//! byte counter (every `B` bytes sent) — whose expiries count stages.
//!
//! * **CNP** → (at most once per `decrease_period`; CNPs in between are
//!   folded into the next decrease) `rt ← rc` (always in the paper; in the
//!   firmware only after a timer increase since the last cut),
//!   `rc ← rc·(1 − α/2)` (never below `min_rate`), both counters and their
//!   stages reset, the increase timer restarted.
//! * **α**: `α ← (1 − g)·α + g` for a period with a CNP, `α ← (1 − g)·α` for
//!   one without. The paper's period is `K` since the last update, restarted
//!   by each CNP, and a CNP's update comes after its cut, in the paper's
//!   order (`RT ← RC; RC ← RC·(1 − α/2); α ← (1 − g)·α + g`): the cut uses
//!   α as it stood before that CNP. The firmware's period is a fixed clock
//!   (`dce_tcp_rtt`, 1 µs), whose CNP update lands at the period's end.
//!   Either way α only matters at the next cut, so it is settled lazily
//!   there — decays owed for `n` quiet periods are one `(1 − g)^n` — and no
//!   timer runs for it.
//! * **Increase** on each counter expiry: fast recovery `rc ← (rt + rc)/2`
//!   while both stages are below `F`; additive `rt += R_AI` once either is;
//!   hyper `rt += i·R_HAI` once both are (i = min stage − F + 1); then
//!   `rc ← (rt + rc)/2`, both capped at line rate. Back at line rate the
//!   timer stops: an uncongested QP costs no events.

use crate::Nanos;

const US: Nanos = 1_000;

/// How α is updated (see the module text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlphaUpdate {
    /// The paper: at each CNP, and after `K` without one.
    OnCnp { k: Nanos },
    /// NVIDIA firmware: every `period`, with or without a CNP in it.
    Periodic { period: Nanos },
}

/// When a cut also resets the target rate to the current rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clamp {
    /// Every cut (the paper).
    Always,
    /// Only if a timer increase happened since the last cut (firmware
    /// `clamp_tgt_rate = 0`, `clamp_tgt_rate_after_time_inc = 1`).
    AfterTimeIncrease,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// `"dcqcn"` (paper) or `"dcqcn-nvidia"`.
    pub preset: &'static str,
    /// EWMA gain of α.
    pub g: f64,
    pub alpha: AlphaUpdate,
    /// α when the first CNP arrives.
    pub initial_alpha: f64,
    /// At most one cut per this period (0: every CNP cuts).
    pub decrease_period: Nanos,
    pub clamp: Clamp,
    /// `T`: the increase timer.
    pub increase_period: Nanos,
    /// `B`: bytes sent per byte-counter expiry.
    pub byte_counter: u64,
    /// `F`: stages of fast recovery.
    pub stage_threshold: u32,
    /// `R_AI`, `R_HAI`, bits/s.
    pub ai_rate: u64,
    pub hai_rate: u64,
    /// Floor of the rate, bits/s.
    pub min_rate: u64,
    /// Notification point: at most one CNP per QP per this interval.
    pub cnp_interval: Nanos,
}

impl Params {
    /// The paper's parameters (§5 and the fluid model; htsim's and HPCC's
    /// `dcqcn_paper` agree): g = 1/256, K = 55 µs, T = 55 µs, B = 10 MB,
    /// F = 5, R_AI = 40 Mb/s, N = 50 µs. The paper gives no R_HAI; 10 × R_AI
    /// here. Every CNP cuts.
    pub fn paper() -> Params {
        Params {
            preset: "dcqcn",
            g: 1.0 / 256.0,
            alpha: AlphaUpdate::OnCnp { k: 55 * US },
            initial_alpha: 1.0,
            decrease_period: 0,
            clamp: Clamp::Always,
            increase_period: 55 * US,
            byte_counter: 10_000_000,
            stage_threshold: 5,
            ai_rate: 40_000_000,
            hai_rate: 400_000_000,
            min_rate: 10_000_000,
            cnp_interval: 50 * US,
        }
    }

    /// NVIDIA's firmware defaults (the DOCA "DCQCN CC Parameters" page):
    /// `dce_tcp_g` 1019/1024 (g = 5/1024) every `dce_tcp_rtt` 1 µs,
    /// `initial_alpha_value` 1023, `rate_reduce_monitor_period` 4 µs,
    /// `clamp_tgt_rate_after_time_inc`, `rpg_time_reset` 300 µs,
    /// `rpg_byte_reset` 32767 × 64 B, `rpg_threshold` 1, `rpg_ai_rate` 5 Mb/s,
    /// `rpg_hai_rate` 50 Mb/s, `rpg_min_rate` 1 Mb/s. The notification
    /// point's `min_time_between_cnps` default was not found in a source;
    /// 4 µs, the value usually quoted, is used.
    pub fn nvidia() -> Params {
        Params {
            preset: "dcqcn-nvidia",
            g: 5.0 / 1024.0,
            alpha: AlphaUpdate::Periodic { period: US },
            initial_alpha: 1023.0 / 1024.0,
            decrease_period: 4 * US,
            clamp: Clamp::AfterTimeIncrease,
            increase_period: 300 * US,
            byte_counter: 32767 * 64,
            stage_threshold: 1,
            ai_rate: 5_000_000,
            hai_rate: 50_000_000,
            min_rate: 1_000_000,
            cnp_interval: 4 * US,
        }
    }
}

/// One QP's reaction point.
#[derive(Debug, Clone, PartialEq)]
pub struct Dcqcn {
    p: Params,
    line: u64,
    /// Current and target rate, bits/s.
    rc: f64,
    rt: f64,
    alpha: f64,
    /// α is settled up to this time (None before the first CNP).
    alpha_at: Option<Nanos>,
    /// A CNP arrived in the current α period (periodic mode).
    cnp_in_period: bool,
    /// Time of the last cut, and whether a CNP since waits for the next one.
    last_cut: Option<Nanos>,
    cut_pending: bool,
    t_stage: u32,
    bc_stage: u32,
    bytes: u64,
    /// The increase timer (None at line rate).
    next_increase: Option<Nanos>,
    time_increased: bool,
    /// Counters, for tests and statistics.
    pub cnps: u64,
    pub cuts: u64,
}

impl Dcqcn {
    pub fn new(p: Params, line_rate: u64) -> Dcqcn {
        Dcqcn {
            p,
            line: line_rate.max(1),
            rc: line_rate as f64,
            rt: line_rate as f64,
            alpha: p.initial_alpha,
            alpha_at: None,
            cnp_in_period: false,
            last_cut: None,
            cut_pending: false,
            t_stage: 0,
            bc_stage: 0,
            bytes: 0,
            next_increase: None,
            time_increased: false,
            cnps: 0,
            cuts: 0,
        }
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    pub fn current_rate(&self) -> u64 {
        self.rc as u64
    }

    pub fn target_rate(&self) -> u64 {
        self.rt as u64
    }

    /// Bring α up to `now` (decays for quiet periods; the pending period's
    /// CNP update in periodic mode).
    fn settle_alpha(&mut self, now: Nanos) {
        let Some(at) = self.alpha_at else {
            self.alpha_at = Some(now);
            return;
        };
        let g = self.p.g;
        match self.p.alpha {
            AlphaUpdate::OnCnp { k } => {
                let n = (now.saturating_sub(at) / k.max(1)).min(1 << 20);
                if n > 0 {
                    self.alpha *= (1.0 - g).powi(n as i32);
                    self.alpha_at = Some(at + n * k);
                }
            }
            AlphaUpdate::Periodic { period } => {
                let n = (now.saturating_sub(at) / period.max(1)).min(1 << 20);
                if n > 0 {
                    // The period that just ended, with its CNP if it had one,
                    // then n − 1 quiet ones.
                    self.alpha = (1.0 - g) * self.alpha + if self.cnp_in_period { g } else { 0.0 };
                    self.alpha *= (1.0 - g).powi((n - 1) as i32);
                    self.cnp_in_period = false;
                    self.alpha_at = Some(at + n * period);
                }
            }
        }
    }

    pub fn on_cnp(&mut self, now: Nanos) {
        self.cnps += 1;
        let first = self.alpha_at.is_none();
        self.settle_alpha(now);
        if first {
            self.alpha = self.p.initial_alpha;
        }
        if let AlphaUpdate::Periodic { .. } = self.p.alpha {
            self.cnp_in_period = true;
        }
        match self.last_cut {
            Some(t) if self.p.decrease_period > 0 && now < t + self.p.decrease_period => {
                self.cut_pending = true;
            }
            _ => self.cut(now),
        }
        if let AlphaUpdate::OnCnp { .. } = self.p.alpha {
            // The paper's order: the cut above used α as it stood, and only
            // then does this CNP raise it. The K timer restarts at each CNP.
            self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
            self.alpha_at = Some(now);
        }
    }

    fn cut(&mut self, now: Nanos) {
        self.cuts += 1;
        self.settle_alpha(now);
        if self.p.clamp == Clamp::Always || self.time_increased || self.last_cut.is_none() {
            self.rt = self.rc;
        }
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.p.min_rate as f64);
        self.last_cut = Some(now);
        self.cut_pending = false;
        self.time_increased = false;
        self.t_stage = 0;
        self.bc_stage = 0;
        self.bytes = 0;
        self.next_increase = Some(now + self.p.increase_period);
    }

    fn increase(&mut self) {
        let f = self.p.stage_threshold;
        let (hi, lo) = (
            self.t_stage.max(self.bc_stage),
            self.t_stage.min(self.bc_stage),
        );
        let line = self.line as f64;
        if hi < f {
            // Fast recovery: halfway back to the target.
        } else if lo >= f {
            let i = (lo - f + 1) as f64;
            self.rt = (self.rt + i * self.p.hai_rate as f64).min(line);
        } else {
            self.rt = (self.rt + self.p.ai_rate as f64).min(line);
        }
        self.rc = ((self.rt + self.rc) / 2.0).min(line);
        if self.rc >= line - 1.0 && self.rt >= line - 1.0 {
            // Back at line rate: nothing left to recover.
            self.rc = line;
            self.rt = line;
            self.next_increase = None;
        }
    }

    pub fn on_send(&mut self, _now: Nanos, bytes: u32) {
        if self.next_increase.is_none() {
            return; // at line rate
        }
        self.bytes += bytes as u64;
        if self.bytes >= self.p.byte_counter {
            self.bytes -= self.p.byte_counter;
            self.bc_stage += 1;
            self.increase();
        }
    }

    pub fn next_timer(&self) -> Option<Nanos> {
        let cut = match (self.cut_pending, self.last_cut) {
            (true, Some(t)) => Some(t + self.p.decrease_period),
            _ => None,
        };
        match (cut, self.next_increase) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn on_timer(&mut self, now: Nanos) {
        if self.cut_pending
            && self
                .last_cut
                .is_some_and(|t| t + self.p.decrease_period <= now)
        {
            self.cut(now);
        }
        while let Some(t) = self.next_increase {
            if t > now {
                break;
            }
            self.t_stage += 1;
            self.time_increased = true;
            self.next_increase = Some(t + self.p.increase_period);
            self.increase();
        }
    }

    /// `None` at line rate.
    pub fn rate(&self) -> Option<u64> {
        if self.rc >= self.line as f64 {
            None
        } else {
            Some((self.rc as u64).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000_000_000;

    #[test]
    fn a_cnp_cuts_by_half_alpha_then_fast_recovery_halves_the_gap() {
        let mut c = Dcqcn::new(Params::paper(), G100);
        assert_eq!(c.rate(), None);
        c.on_cnp(1_000);
        // α = 1 at the first CNP: rc = rc·(1 − 1/2).
        assert_eq!(c.rate(), Some(50_000_000_000));
        assert_eq!(c.target_rate(), G100);
        assert_eq!(c.next_timer(), Some(1_000 + 55_000));
        c.on_timer(56_000);
        assert_eq!(c.rate(), Some(75_000_000_000));
        // Second CNP 65 µs after the first: one quiet K (α·(1 − g)), the
        // cut with that α, then the CNP's update (the paper's order; this
        // test expected the cut to use the updated α until the order was
        // fixed); the target becomes the rate before the cut.
        c.on_cnp(66_000);
        let g = 1.0 / 256.0;
        let cut_alpha = 1.0 - g;
        let alpha = (1.0 - g) * cut_alpha + g;
        assert!((c.alpha() - alpha).abs() < 1e-12);
        assert_eq!(c.rate(), Some((75e9 * (1.0 - cut_alpha / 2.0)) as u64));
        assert_eq!(c.target_rate(), 75_000_000_000);
    }

    #[test]
    fn a_cnp_cuts_with_alpha_from_before_its_own_update() {
        let g = 1.0 / 256.0;
        let mut c = Dcqcn::new(Params::paper(), G100);
        c.on_cnp(0);
        // α = 1 cut the rate in half, and the CNP's update keeps it at 1.
        assert_eq!(c.rate(), Some(50_000_000_000));
        assert!((c.alpha() - 1.0).abs() < 1e-12);
        // Ten quiet K (no timer run, so no increase): α = (1 − g)^10 when
        // the next CNP comes. RC ← RC·(1 − α/2) with that α, then
        // α ← (1 − g)·α + g.
        c.on_cnp(10 * 55_000);
        let before = (1.0_f64 - g).powi(10);
        assert_eq!(c.rate(), Some((50e9 * (1.0 - before / 2.0)) as u64));
        assert!((c.alpha() - ((1.0 - g) * before + g)).abs() < 1e-12);
    }

    #[test]
    fn alpha_decays_per_quiet_period_and_rises_per_cnp() {
        let mut c = Dcqcn::new(Params::paper(), G100);
        c.on_cnp(0);
        let g = 1.0 / 256.0;
        // 10 × K later: ten decays, then the CNP's update.
        c.on_cnp(550_000);
        let want = (1.0 - g) * (1.0_f64 - g).powi(10) + g;
        assert!((c.alpha() - want).abs() < 1e-12, "{} vs {want}", c.alpha());
    }

    #[test]
    fn stages_go_fast_recovery_then_additive_then_hyper() {
        let p = Params::paper();
        let mut c = Dcqcn::new(p, G100);
        c.on_cnp(0);
        let rt = c.target_rate() as f64;
        // Five timer expiries: fast recovery only, the target stays.
        c.on_timer(5 * 55_000);
        assert_eq!(c.target_rate() as f64, rt);
        // The sixth: t_stage 6 ≥ F but bc_stage 0 < F: additive increase —
        // capped at line rate, where the target already is.
        c.on_timer(6 * 55_000);
        assert_eq!(c.target_rate(), G100);
        // Byte counter expiries push bc_stage; the timer runs until line rate.
        while c.next_timer().is_some() {
            let t = c.next_timer().unwrap();
            c.on_send(t, 1_000_000_000);
            c.on_timer(t);
        }
        assert_eq!(c.rate(), None, "back at line rate, the timer stops");
    }

    #[test]
    fn firmware_folds_cnps_within_the_decrease_period() {
        let mut c = Dcqcn::new(Params::nvidia(), G100);
        c.on_cnp(0);
        let after_first = c.rate().unwrap();
        c.on_cnp(1_000);
        c.on_cnp(2_000);
        assert_eq!(c.rate().unwrap(), after_first, "no second cut inside 4 µs");
        assert_eq!(c.next_timer(), Some(4_000));
        c.on_timer(4_000);
        assert!(c.rate().unwrap() < after_first);
        assert_eq!(c.cuts, 2);
        assert_eq!(c.cnps, 3);
        // Target is not clamped without a timer increase in between.
        assert_eq!(c.target_rate(), G100);
    }

    #[test]
    fn the_rate_never_drops_below_the_floor() {
        let mut c = Dcqcn::new(Params::paper(), G100);
        for i in 0..200 {
            c.on_cnp(i * 1_000);
        }
        assert_eq!(c.rate(), Some(Params::paper().min_rate));
    }
}
