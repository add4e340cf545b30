//! Congestion control: one controller per QP, driving its transmit gate.
//!
//! A controller hears what its algorithm reads — request packets sent,
//! acknowledged progress, CNPs, retransmission timeouts, its own timers —
//! and answers with the QP's rate (and, for window-based algorithms, its
//! window), which the scheduler puts into the QP's [`TxGate`]. Controllers
//! are sans-IO like the rest of the core: time comes in as an argument, a
//! timer is a deadline the scheduler keeps in its heap with the QP's other
//! deadlines, and nothing knows whether it runs on the wire or in the
//! fabric simulator.
//!
//! The notification point (the receiver's half of DCQCN) lives in the
//! scheduler too: a data packet that arrives with ECN-CE makes its QP owe
//! the sender one CNP, at most one per [`CcConfig::cnp_interval`].
//!
//! [`TxGate`]: crate::gate::TxGate

pub mod dcqcn;
pub mod hpcc;
pub mod swift;
pub mod timely;

use crate::Nanos;

/// One hop's in-band telemetry, as a switch stamps it on a data packet and
/// the receiver echoes it in the ACK (HPCC's INT header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntHop {
    /// Egress queue length, bytes.
    pub qlen: u32,
    /// Bytes the egress port has sent so far.
    pub tx_bytes: u64,
    /// When the packet left, nanoseconds.
    pub ts: Nanos,
    /// The port's rate, bits/s.
    pub rate_bps: u64,
}

/// Which algorithm a QP runs, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CcConfig {
    /// Line rate; the gate's window and loss back-off only.
    #[default]
    None,
    Dcqcn(dcqcn::Params),
    Timely(timely::Params),
    Swift(swift::Params),
    Hpcc(hpcc::Params),
}

impl CcConfig {
    /// By the name `--cc` takes: `none`, `dcqcn`, `dcqcn-nvidia`, `timely`,
    /// `timely-patched`, `swift`, `hpcc`.
    pub fn from_name(name: &str) -> Option<CcConfig> {
        Some(match name {
            "none" => CcConfig::None,
            "dcqcn" => CcConfig::Dcqcn(dcqcn::Params::paper()),
            "dcqcn-nvidia" => CcConfig::Dcqcn(dcqcn::Params::nvidia()),
            "timely" => CcConfig::Timely(timely::Params::timely()),
            "timely-patched" => CcConfig::Timely(timely::Params::patched()),
            "swift" => CcConfig::Swift(swift::Params::default()),
            "hpcc" => CcConfig::Hpcc(hpcc::Params::default()),
            _ => return None,
        })
    }

    /// A name with parameters: `NAME[:KEY=VALUE,...]`, e.g.
    /// `timely:seg=16K,init=0.1` (K and M multiply by 1024 and 1024²).
    /// Only TIMELY's parameters can be set so far.
    pub fn parse(spec: &str) -> Result<CcConfig, String> {
        let (name, args) = match spec.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (spec, None),
        };
        let mut cfg = CcConfig::from_name(name).ok_or_else(|| {
            format!(
                "unknown congestion control `{name}` (none, dcqcn, dcqcn-nvidia, timely, \
                 timely-patched, swift, hpcc)"
            )
        })?;
        let Some(args) = args else {
            return Ok(cfg);
        };
        let CcConfig::Timely(p) = &mut cfg else {
            return Err(format!("`{name}` takes no parameters"));
        };
        for kv in args.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("`{kv}` is not KEY=VALUE"))?;
            let (num, mult) = match v.strip_suffix(['K', 'k']) {
                Some(n) => (n, 1024.0),
                None => match v.strip_suffix('M') {
                    Some(n) => (n, 1024.0 * 1024.0),
                    None => (v, 1.0),
                },
            };
            let x: f64 = num
                .parse()
                .map_err(|_| format!("`{v}` is not a number (in `{kv}`)"))?;
            p.set(k, x * mult)?;
        }
        Ok(cfg)
    }

    /// Whether the controller wants RTT samples.
    pub fn wants_rtt(&self) -> bool {
        matches!(self, CcConfig::Timely(_) | CcConfig::Swift(_))
    }

    /// How often this QP, as a receiver, may send a CNP (`None`: never).
    pub fn cnp_interval(&self) -> Option<Nanos> {
        match self {
            CcConfig::Dcqcn(p) => Some(p.cnp_interval),
            CcConfig::None | CcConfig::Timely(_) | CcConfig::Swift(_) | CcConfig::Hpcc(_) => None,
        }
    }

    /// The controller a new QP sending at `line_rate` bits/s starts with.
    pub fn build(&self, line_rate: u64) -> Option<Controller> {
        match self {
            CcConfig::None => None,
            CcConfig::Dcqcn(p) => Some(Controller::Dcqcn(dcqcn::Dcqcn::new(*p, line_rate))),
            CcConfig::Timely(p) => Some(Controller::Timely(timely::Timely::new(*p, line_rate))),
            CcConfig::Swift(p) => Some(Controller::Swift(swift::Swift::new(*p, line_rate))),
            CcConfig::Hpcc(p) => Some(Controller::Hpcc(hpcc::Hpcc::new(*p, line_rate))),
        }
    }

    /// The name `perf --cc` and `sim --cc` use.
    pub fn name(&self) -> &'static str {
        match self {
            CcConfig::None => "none",
            CcConfig::Dcqcn(p) => p.preset,
            CcConfig::Timely(p) => p.preset,
            CcConfig::Swift(_) => "swift",
            CcConfig::Hpcc(_) => "hpcc",
        }
    }
}

/// A QP's controller (an enum, not a trait object: no allocation per QP,
/// and the scheduler's slot stays `Clone`).
#[derive(Debug, Clone, PartialEq)]
pub enum Controller {
    Dcqcn(dcqcn::Dcqcn),
    Timely(timely::Timely),
    Swift(swift::Swift),
    Hpcc(hpcc::Hpcc),
}

impl Controller {
    /// A request packet of `bytes` (UDP payload) left at `now`.
    pub fn on_send(&mut self, now: Nanos, bytes: u32) {
        match self {
            Controller::Dcqcn(c) => c.on_send(now, bytes),
            Controller::Timely(_) | Controller::Swift(_) | Controller::Hpcc(_) => {}
        }
    }

    /// A CNP for this QP arrived.
    pub fn on_cnp(&mut self, now: Nanos) {
        match self {
            Controller::Dcqcn(c) => c.on_cnp(now),
            Controller::Timely(_) | Controller::Swift(_) | Controller::Hpcc(_) => {}
        }
    }

    /// The earliest time [`Controller::on_timer`] wants to run.
    pub fn next_timer(&self) -> Option<Nanos> {
        match self {
            Controller::Dcqcn(c) => c.next_timer(),
            Controller::Timely(_) | Controller::Swift(_) | Controller::Hpcc(_) => None,
        }
    }

    pub fn on_timer(&mut self, now: Nanos) {
        match self {
            Controller::Dcqcn(c) => c.on_timer(now),
            Controller::Timely(_) | Controller::Swift(_) | Controller::Hpcc(_) => {}
        }
    }

    /// The rate the QP may send at (`None`: line rate).
    pub fn rate(&self) -> Option<u64> {
        match self {
            Controller::Dcqcn(c) => c.rate(),
            Controller::Timely(c) => c.rate(),
            Controller::Swift(c) => c.rate(),
            Controller::Hpcc(c) => c.rate(),
        }
    }

    /// INT records echoed in an ACK for this QP.
    pub fn on_int(&mut self, now: Nanos, hops: &[IntHop]) {
        if let Controller::Hpcc(c) = self {
            c.on_int(now, hops);
        }
    }

    /// The PSN window the QP may have unacknowledged (`None`: the gate's).
    pub fn window(&self) -> Option<u32> {
        match self {
            Controller::Swift(c) => Some(c.window()),
            Controller::Dcqcn(_) | Controller::Timely(_) | Controller::Hpcc(_) => None,
        }
    }

    /// The bytes the QP may have unacknowledged (`None`: no byte window):
    /// HPCC's W limits what is in flight as well as setting the pace.
    pub fn window_bytes(&self) -> Option<u64> {
        match self {
            Controller::Hpcc(c) => Some(c.window_bytes() as u64),
            Controller::Dcqcn(_) | Controller::Timely(_) | Controller::Swift(_) => None,
        }
    }

    /// Whether every request packet should ask for its ACK (per-packet
    /// feedback: Swift's window, HPCC's echoed INT).
    pub fn acks_every_packet(&self) -> bool {
        matches!(self, Controller::Swift(_) | Controller::Hpcc(_))
    }

    /// A retransmission timeout on the QP.
    pub fn on_timeout(&mut self, now: Nanos) {
        if let Controller::Swift(c) = self {
            c.on_timeout(now);
        }
    }

    /// An ACK acknowledged progress (the cumulative ACK moved).
    pub fn on_acked(&mut self) {
        if let Controller::Swift(c) = self {
            c.on_acked();
        }
    }

    /// Request bytes per RTT sample, for a controller that updates per
    /// completed segment (`None`: one sample per round trip).
    pub fn sample_bytes(&self) -> Option<u32> {
        match self {
            Controller::Timely(c) => c.sample_bytes(),
            Controller::Dcqcn(_) | Controller::Swift(_) | Controller::Hpcc(_) => None,
        }
    }

    /// Whether it wants RTT samples ([`Controller::on_rtt`]).
    pub fn wants_rtt(&self) -> bool {
        matches!(self, Controller::Timely(_) | Controller::Swift(_))
    }

    /// An RTT sample: a new request PSN's send to the cumulative ACK that
    /// covered it (never a retransmitted one), on a QP of path MTU `mtu`.
    pub fn on_rtt(&mut self, now: Nanos, rtt: Nanos, mtu: u32) {
        match self {
            Controller::Dcqcn(_) | Controller::Hpcc(_) => {}
            Controller::Timely(c) => c.on_rtt(now, rtt),
            Controller::Swift(c) => c.on_rtt(now, rtt, mtu),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            CcConfig::parse("dcqcn"),
            Ok(CcConfig::from_name("dcqcn").unwrap())
        );
        let CcConfig::Timely(p) = CcConfig::parse("timely-patched:seg=16K,min=0.01").unwrap()
        else {
            panic!("not TIMELY");
        };
        assert!(p.patched);
        assert_eq!((p.seg, p.min_frac), (16384, 0.01));
        for (bad, says) in [
            ("cubic", "unknown congestion control `cubic`"),
            ("dcqcn:g=1", "`dcqcn` takes no parameters"),
            ("timely:seg", "`seg` is not KEY=VALUE"),
            ("timely:seg=lots", "`lots` is not a number"),
            ("timely:alpha=3", "alpha=3 is out of range"),
        ] {
            let e = CcConfig::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
