//! One directed link: its configuration, its counters, and the model that
//! turns one datagram handed to it into zero, one or two scheduled arrivals.
//!
//! The model, in the order a datagram meets it:
//!
//! 1. **Drop-tail queue.** Datagrams wait for the transmitter in FIFO order;
//!    a datagram that finds [`LinkConfig::queue_limit`] others still waiting
//!    or being serialized is dropped (`dropped_queue`).
//! 2. **Serialization.** With [`LinkConfig::bandwidth_bps`] set, a datagram
//!    leaves the transmitter `len * 8 / bandwidth` after the previous one
//!    left (or now, if the link is idle). Without it, it leaves at once.
//! 3. **Loss.** The datagram vanishes on the wire (`dropped_loss`); it has
//!    still used its serialization time.
//! 4. **Duplication.** A second copy is made (`duplicated`). Each copy then
//!    goes through the remaining steps on its own.
//! 5. **Propagation.** Arrival is departure + `delay` + a uniform draw from
//!    `0..=jitter`. Jitter alone never reorders: an arrival is held back to
//!    no earlier than the previous in-order arrival on the link, like a
//!    queue in the path would.
//! 6. **Reordering.** With probability `reorder` the copy instead gets
//!    `reorder_delay` on top and leaves the in-order stream, so later
//!    datagrams can overtake it (`reordered`).
//! 7. **Corruption.** With probability `corrupt` one uniformly chosen bit of
//!    the copy is flipped (`corrupted`).

use std::collections::VecDeque;
use std::fmt;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use crate::{Nanos, NodeId, MICROSECOND};

/// How a directed link between two nodes behaves.
///
/// [`Default`] is a perfect link: 1 µs of delay, no impairment, no rate
/// limit, no queue bound. Setters consume and return the config, so a link
/// reads as one expression:
///
/// ```
/// use softrdma_netsim::{LinkConfig, MICROSECOND};
/// let lossy = LinkConfig::default()
///     .delay(5 * MICROSECOND)
///     .loss(0.01)
///     .bandwidth_bps(Some(10_000_000_000))
///     .queue_limit(64);
/// assert_eq!(lossy.delay, 5 * MICROSECOND);
/// ```
///
/// Probabilities must lie in `0.0..=1.0`; the setters panic otherwise, and
/// [`Sim::set_link`](crate::Sim::set_link) checks a config built by hand with
/// [`validate`](LinkConfig::validate).
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay: Nanos,
    /// Extra delay drawn uniformly from `0..=jitter` per datagram. Does not
    /// reorder by itself (see [`reorder`](LinkConfig::reorder)).
    pub jitter: Nanos,
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a delivered datagram arrives twice.
    pub duplicate: f64,
    /// Probability a datagram gets `reorder_delay` extra delay so later ones
    /// overtake it.
    pub reorder: f64,
    /// The extra delay given to a reordered datagram.
    pub reorder_delay: Nanos,
    /// Probability one random bit of a datagram is flipped.
    pub corrupt: f64,
    /// Serialization rate in bits per second, FIFO per link; `None` sends
    /// every datagram at once.
    pub bandwidth_bps: Option<u64>,
    /// Most datagrams waiting for or in serialization; more are dropped at
    /// the tail. Only a rate-limited link ever has a queue.
    pub queue_limit: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay: MICROSECOND,
            jitter: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: 0,
            corrupt: 0.0,
            bandwidth_bps: None,
            queue_limit: usize::MAX,
        }
    }
}

/// Why a [`LinkConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkConfigError {
    /// A probability outside `0.0..=1.0` (or NaN).
    Probability {
        /// The field's name.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// `bandwidth_bps` of `Some(0)`: nothing could ever be sent.
    ZeroBandwidth,
    /// `queue_limit` of 0: nothing could ever be queued.
    ZeroQueueLimit,
}

impl fmt::Display for LinkConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Probability { field, value } => {
                write!(f, "link {field} probability {value} is outside 0.0..=1.0")
            }
            Self::ZeroBandwidth => f.write_str("link bandwidth of 0 bit/s would never send"),
            Self::ZeroQueueLimit => f.write_str("link queue limit of 0 would drop everything"),
        }
    }
}

impl std::error::Error for LinkConfigError {}

fn check_probability(field: &'static str, value: f64) -> Result<(), LinkConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(LinkConfigError::Probability { field, value })
    }
}

#[track_caller]
fn probability(field: &'static str, value: f64) -> f64 {
    if let Err(e) = check_probability(field, value) {
        panic!("{e}");
    }
    value
}

impl LinkConfig {
    /// Sets the one-way propagation delay.
    pub fn delay(mut self, delay: Nanos) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the jitter bound.
    pub fn jitter(mut self, jitter: Nanos) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the loss probability.
    ///
    /// # Panics
    /// If `p` is outside `0.0..=1.0`.
    #[track_caller]
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = probability("loss", p);
        self
    }

    /// Sets the duplication probability.
    ///
    /// # Panics
    /// If `p` is outside `0.0..=1.0`.
    #[track_caller]
    pub fn duplicate(mut self, p: f64) -> Self {
        self.duplicate = probability("duplicate", p);
        self
    }

    /// Sets the reordering probability.
    ///
    /// # Panics
    /// If `p` is outside `0.0..=1.0`.
    #[track_caller]
    pub fn reorder(mut self, p: f64) -> Self {
        self.reorder = probability("reorder", p);
        self
    }

    /// Sets the extra delay of a reordered datagram.
    pub fn reorder_delay(mut self, extra: Nanos) -> Self {
        self.reorder_delay = extra;
        self
    }

    /// Sets the single-bit corruption probability.
    ///
    /// # Panics
    /// If `p` is outside `0.0..=1.0`.
    #[track_caller]
    pub fn corrupt(mut self, p: f64) -> Self {
        self.corrupt = probability("corrupt", p);
        self
    }

    /// Sets the serialization rate (`None`: unlimited).
    ///
    /// # Panics
    /// On `Some(0)`.
    #[track_caller]
    pub fn bandwidth_bps(mut self, bps: Option<u64>) -> Self {
        assert!(bps != Some(0), "{}", LinkConfigError::ZeroBandwidth);
        self.bandwidth_bps = bps;
        self
    }

    /// Sets the drop-tail queue bound.
    ///
    /// # Panics
    /// On 0.
    #[track_caller]
    pub fn queue_limit(mut self, limit: usize) -> Self {
        assert!(limit != 0, "{}", LinkConfigError::ZeroQueueLimit);
        self.queue_limit = limit;
        self
    }

    /// Checks a config whose fields were set directly.
    pub fn validate(&self) -> Result<(), LinkConfigError> {
        check_probability("loss", self.loss)?;
        check_probability("duplicate", self.duplicate)?;
        check_probability("reorder", self.reorder)?;
        check_probability("corrupt", self.corrupt)?;
        if self.bandwidth_bps == Some(0) {
            return Err(LinkConfigError::ZeroBandwidth);
        }
        if self.queue_limit == 0 {
            return Err(LinkConfigError::ZeroQueueLimit);
        }
        Ok(())
    }

    /// Time to clock `len` bytes onto the wire, rounded up to whole
    /// nanoseconds so a busy link never sends faster than its rate.
    fn serialization_time(&self, len: usize) -> Nanos {
        match self.bandwidth_bps {
            None => 0,
            Some(bps) => {
                let bits = len as u128 * 8;
                let nanos = (bits * 1_000_000_000).div_ceil(u128::from(bps));
                Nanos::try_from(nanos).unwrap_or(Nanos::MAX)
            }
        }
    }
}

/// What happened on one directed link, for tests to assert on.
///
/// `sent` counts datagrams handed to the link; each ends up in exactly one
/// of `dropped_queue`, `dropped_loss`, or delivered (plus one more delivery
/// when `duplicated`). `reordered` and `corrupted` count copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LinkStats {
    /// Datagrams handed to the link.
    pub sent: u64,
    /// Copies handed to the receiving node.
    pub delivered: u64,
    /// Datagrams lost on the wire.
    pub dropped_loss: u64,
    /// Datagrams dropped at the tail of a full queue.
    pub dropped_queue: u64,
    /// Datagrams that got a second copy.
    pub duplicated: u64,
    /// Copies given the reorder delay.
    pub reordered: u64,
    /// Copies with one bit flipped.
    pub corrupted: u64,
}

impl LinkStats {
    /// Copies scheduled but not yet delivered.
    pub fn in_flight(&self) -> u64 {
        self.sent + self.duplicated - self.dropped_loss - self.dropped_queue - self.delivered
    }
}

impl std::ops::AddAssign for LinkStats {
    fn add_assign(&mut self, o: Self) {
        self.sent += o.sent;
        self.delivered += o.delivered;
        self.dropped_loss += o.dropped_loss;
        self.dropped_queue += o.dropped_queue;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.corrupted += o.corrupted;
    }
}

/// The running state of one directed link.
#[derive(Debug)]
pub(crate) struct Link {
    /// This link's own random stream (see `Link::new`).
    rng: ChaCha8Rng,
    /// When the transmitter finishes the last datagram accepted.
    busy_until: Nanos,
    /// Departure times of datagrams accepted and not yet fully serialized,
    /// oldest first: the queue's occupancy.
    queue: VecDeque<Nanos>,
    /// The latest arrival scheduled in order, which jitter may not undercut.
    last_in_order: Nanos,
    pub(crate) stats: LinkStats,
}

/// A bit must be flipped at `index` bytes in, bit `bit` (0 = least
/// significant).
type BitFlip = (usize, u8);

impl Link {
    /// A link's random stream is ChaCha8 keyed by (seed, from, to): streams
    /// of different links are independent, and each is the same on every
    /// platform.
    pub(crate) fn new(seed: u64, from: NodeId, to: NodeId) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&(from as u64).to_le_bytes());
        key[16..24].copy_from_slice(&(to as u64).to_le_bytes());
        Self {
            rng: ChaCha8Rng::from_seed(key),
            busy_until: 0,
            queue: VecDeque::new(),
            last_in_order: 0,
            stats: LinkStats::default(),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        // No draw for a disabled impairment: a perfect link uses no
        // randomness at all.
        p > 0.0 && self.rng.random_bool(p)
    }

    /// Hands one datagram of `len` bytes to the link at `now`; `schedule`
    /// is called once per copy that will arrive, with its arrival time and
    /// the bit to flip in it, if any. Copies come in the order they should
    /// be queued.
    pub(crate) fn transmit(
        &mut self,
        cfg: &LinkConfig,
        now: Nanos,
        len: usize,
        mut schedule: impl FnMut(Nanos, Option<BitFlip>),
    ) {
        self.stats.sent += 1;

        while self.queue.front().is_some_and(|&done| done <= now) {
            self.queue.pop_front();
        }
        if self.queue.len() >= cfg.queue_limit {
            self.stats.dropped_queue += 1;
            return;
        }
        let departure = self.busy_until.max(now) + cfg.serialization_time(len);
        if cfg.bandwidth_bps.is_some() {
            self.busy_until = departure;
            self.queue.push_back(departure);
        }

        if self.chance(cfg.loss) {
            self.stats.dropped_loss += 1;
            return;
        }
        let copies = if self.chance(cfg.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };

        for _ in 0..copies {
            let jitter = if cfg.jitter > 0 {
                self.rng.random_range(0..=cfg.jitter)
            } else {
                0
            };
            let mut arrival = departure.saturating_add(cfg.delay).saturating_add(jitter);
            if self.chance(cfg.reorder) {
                self.stats.reordered += 1;
                arrival = arrival.saturating_add(cfg.reorder_delay);
            } else {
                arrival = arrival.max(self.last_in_order);
                self.last_in_order = arrival;
            }
            let flip = if len > 0 && self.chance(cfg.corrupt) {
                self.stats.corrupted += 1;
                // Drawn as u64/u32, never usize, so the stream is the same on
                // 32- and 64-bit targets.
                let index = self.rng.random_range(0..len as u64) as usize;
                let bit = self.rng.random_range(0..8u32) as u8;
                Some((index, bit))
            } else {
                None
            };
            schedule(arrival, flip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_a_perfect_link() {
        let cfg = LinkConfig::default();
        assert_eq!(cfg.delay, MICROSECOND);
        assert_eq!(cfg.validate(), Ok(()));
        let mut link = Link::new(0, 0, 1);
        let mut arrivals = Vec::new();
        for _ in 0..100 {
            link.transmit(&cfg, 5, 1500, |t, flip| arrivals.push((t, flip)));
        }
        assert!(arrivals.iter().all(|&a| a == (5 + MICROSECOND, None)));
        assert_eq!(link.stats.sent, 100);
        assert_eq!(link.stats.in_flight(), 100);
    }

    #[test]
    fn setters_set_their_field() {
        let cfg = LinkConfig::default()
            .delay(7)
            .jitter(3)
            .loss(0.1)
            .duplicate(0.2)
            .reorder(0.3)
            .reorder_delay(11)
            .corrupt(0.4)
            .bandwidth_bps(Some(1_000))
            .queue_limit(9);
        let expected = LinkConfig {
            delay: 7,
            jitter: 3,
            loss: 0.1,
            duplicate: 0.2,
            reorder: 0.3,
            reorder_delay: 11,
            corrupt: 0.4,
            bandwidth_bps: Some(1_000),
            queue_limit: 9,
        };
        assert_eq!(cfg, expected);
    }

    #[test]
    #[should_panic(expected = "loss probability 1.5")]
    fn setter_rejects_probability_above_one() {
        let _ = LinkConfig::default().loss(1.5);
    }

    #[test]
    fn validate_names_what_is_wrong() {
        let cfg = LinkConfig {
            corrupt: -0.1,
            ..LinkConfig::default()
        };
        assert_eq!(
            cfg.validate(),
            Err(LinkConfigError::Probability {
                field: "corrupt",
                value: -0.1
            })
        );
        let cfg = LinkConfig {
            loss: f64::NAN,
            ..LinkConfig::default()
        };
        assert!(cfg.validate().is_err());
        let cfg = LinkConfig {
            bandwidth_bps: Some(0),
            ..LinkConfig::default()
        };
        assert_eq!(cfg.validate(), Err(LinkConfigError::ZeroBandwidth));
        let cfg = LinkConfig {
            queue_limit: 0,
            ..LinkConfig::default()
        };
        assert_eq!(cfg.validate(), Err(LinkConfigError::ZeroQueueLimit));
    }

    #[test]
    fn serialization_time_rounds_up() {
        let gig = LinkConfig::default().bandwidth_bps(Some(1_000_000_000));
        assert_eq!(gig.serialization_time(1000), 8_000);
        let odd = LinkConfig::default().bandwidth_bps(Some(3_000_000_000));
        // 8 bits at 3 bit/ns is 2.67 ns.
        assert_eq!(odd.serialization_time(1), 3);
        assert_eq!(LinkConfig::default().serialization_time(9000), 0);
    }

    #[test]
    fn streams_differ_by_seed_and_direction() {
        let draw = |seed, a, b| {
            let mut link = Link::new(seed, a, b);
            (0..4).map(|_| link.rng.random::<u64>()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 0, 1), draw(1, 0, 1));
        assert_ne!(draw(1, 0, 1), draw(2, 0, 1));
        assert_ne!(draw(1, 0, 1), draw(1, 1, 0));
    }
}
