//! The simulator: nodes, the links between them, and the event loop that
//! steps virtual time.
//!
//! Each step first drains every node's pending output (in [`NodeId`] order)
//! onto its links, then takes the earliest event: a datagram arriving at a
//! node, or a node's own timer. Deliveries sit in a binary heap ordered by
//! (time, sequence number); timers are not queued but asked of each node
//! through [`Node::poll_timeout`] every step, because a node may move its
//! deadline on any input and a queued copy would go stale.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;

use crate::link::{Link, LinkConfig, LinkStats};
use crate::{Nanos, Node, NodeId, MAX_DATAGRAM};

/// Events handled at one instant before the simulator calls it a livelock
/// (a timer that is never cleared, or datagrams bouncing over zero-delay
/// links) and panics rather than hang the test. Far above any legitimate
/// burst.
const MAX_EVENTS_PER_INSTANT: u64 = 1 << 20;

/// Datagrams one node may emit in one drain before the simulator decides its
/// `poll_transmit` never returns `None`.
const MAX_TRANSMITS_PER_POLL: u64 = 1 << 20;

/// A datagram on its way, ordered by arrival time and then by the order it
/// was scheduled in, so that equal times replay identically.
struct Delivery {
    time: Nanos,
    seq: u64,
    from: NodeId,
    to: NodeId,
    bytes: Vec<u8>,
}

impl PartialEq for Delivery {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Delivery {}

impl PartialOrd for Delivery {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Delivery {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

/// What the next event is.
#[derive(Debug, Clone, Copy)]
enum Next {
    Delivery,
    Timeout(NodeId),
}

/// A run that did not settle within its time budget, or that went idle
/// while it was still waiting for something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalled {
    /// Virtual time when the run gave up.
    pub now: Nanos,
    /// Why it gave up.
    pub reason: StallReason,
}

/// Why a run gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallReason {
    /// Events were still pending at the time limit; the earliest was due at
    /// `next_event`.
    Deadline {
        /// When the earliest pending event would have happened.
        next_event: Nanos,
    },
    /// Nothing was pending, but the condition of
    /// [`Sim::run_while`] still held: it would have waited forever.
    Idle,
}

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            StallReason::Deadline { next_event } => write!(
                f,
                "simulation still busy at {} ns (next event at {next_event} ns)",
                self.now
            ),
            StallReason::Idle => write!(
                f,
                "simulation went idle at {} ns with its condition still holding",
                self.now
            ),
        }
    }
}

impl std::error::Error for Stalled {}

/// Called with (time, from, to, bytes) for every datagram handed to a link.
type Capture = Box<dyn FnMut(Nanos, NodeId, NodeId, &[u8])>;

/// A deterministic network of [`Node`]s on virtual time.
///
/// See the [crate docs](crate) for the model and its guarantees.
pub struct Sim<N> {
    now: Nanos,
    seed: u64,
    nodes: Vec<N>,
    default_link: LinkConfig,
    overrides: BTreeMap<(NodeId, NodeId), LinkConfig>,
    /// Created on first use, so only links that carried traffic appear.
    links: BTreeMap<(NodeId, NodeId), Link>,
    deliveries: BinaryHeap<Reverse<Delivery>>,
    next_seq: u64,
    /// The one buffer every `poll_transmit` writes into.
    tx_buf: Vec<u8>,
    capture: Option<Capture>,
    /// Events handled since virtual time last moved.
    events_at_now: u64,
}

impl<N> fmt::Debug for Sim<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("seed", &self.seed)
            .field("nodes", &self.nodes.len())
            .field("in_flight", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}

impl<N: Node> Sim<N> {
    /// An empty simulation at time 0 whose randomness all derives from
    /// `seed`. Links default to [`LinkConfig::default`].
    pub fn new(seed: u64) -> Self {
        Self {
            now: 0,
            seed,
            nodes: Vec::new(),
            default_link: LinkConfig::default(),
            overrides: BTreeMap::new(),
            links: BTreeMap::new(),
            deliveries: BinaryHeap::new(),
            next_seq: 0,
            tx_buf: vec![0; MAX_DATAGRAM],
            capture: None,
            events_at_now: 0,
        }
    }

    // ---- Getters -------------------------------------------------------

    /// The current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The seed this simulation was created with (worth printing when a
    /// randomized test fails).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A node.
    ///
    /// # Panics
    /// If `id` is not a node of this simulation.
    pub fn node(&self, id: NodeId) -> &N {
        &self.nodes[id]
    }

    /// A node, to inspect or to give commands to between steps (whatever it
    /// then wants to send goes out at the current time on the next step).
    ///
    /// # Panics
    /// If `id` is not a node of this simulation.
    pub fn node_mut(&mut self, id: NodeId) -> &mut N {
        &mut self.nodes[id]
    }

    /// All nodes, indexed by [`NodeId`].
    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    /// The config that applies from `from` to `to`: its override if one was
    /// set, else the default.
    pub fn link_config(&self, from: NodeId, to: NodeId) -> &LinkConfig {
        self.overrides
            .get(&(from, to))
            .unwrap_or(&self.default_link)
    }

    /// What has happened on the directed link `from` → `to` so far (all
    /// zero if it never carried anything).
    pub fn link_stats(&self, from: NodeId, to: NodeId) -> LinkStats {
        self.links
            .get(&(from, to))
            .map(|l| l.stats)
            .unwrap_or_default()
    }

    /// The counters of every link, added up.
    pub fn total_stats(&self) -> LinkStats {
        let mut total = LinkStats::default();
        for link in self.links.values() {
            total += link.stats;
        }
        total
    }

    /// Datagram copies scheduled and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.deliveries.len()
    }

    // ---- Configuration ---------------------------------------------------

    /// Adds a node and returns its id (ids count up from 0).
    pub fn add_node(&mut self, node: N) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Sets the directed link `from` → `to`, overriding the default. Takes
    /// effect for datagrams sent from now on; those in flight keep the
    /// arrival they were given.
    ///
    /// # Panics
    /// If either node does not exist or `cfg` fails
    /// [`LinkConfig::validate`].
    #[track_caller]
    pub fn set_link(&mut self, from: NodeId, to: NodeId, cfg: LinkConfig) {
        self.check_node(from);
        self.check_node(to);
        if let Err(e) = cfg.validate() {
            panic!("link {from} -> {to}: {e}");
        }
        self.overrides.insert((from, to), cfg);
    }

    /// Sets the config of every link without an override of its own.
    ///
    /// # Panics
    /// If `cfg` fails [`LinkConfig::validate`].
    #[track_caller]
    pub fn set_default_link(&mut self, cfg: LinkConfig) {
        if let Err(e) = cfg.validate() {
            panic!("default link: {e}");
        }
        self.default_link = cfg;
    }

    /// Calls `capture` with (time, from, to, bytes) for every datagram handed
    /// to a link from now on, before the link decides its fate: what was
    /// sent, including what is then lost or dropped, as a sender-side packet
    /// capture would see it.
    pub fn set_capture(&mut self, capture: impl FnMut(Nanos, NodeId, NodeId, &[u8]) + 'static) {
        self.capture = Some(Box::new(capture));
    }

    /// Removes the capture hook.
    pub fn clear_capture(&mut self) {
        self.capture = None;
    }

    // ---- Commands ----------------------------------------------------------

    /// Hands `bytes` to the link `from` → `to` now, as though node `from`
    /// had sent it: for tests that put forged or malformed datagrams on the
    /// wire.
    ///
    /// # Panics
    /// If either node does not exist or `bytes` is longer than
    /// [`MAX_DATAGRAM`].
    #[track_caller]
    pub fn inject(&mut self, from: NodeId, to: NodeId, bytes: &[u8]) {
        self.check_node(from);
        self.check_node(to);
        assert!(
            bytes.len() <= MAX_DATAGRAM,
            "injected datagram of {} bytes is over MAX_DATAGRAM ({MAX_DATAGRAM})",
            bytes.len()
        );
        self.tx_buf[..bytes.len()].copy_from_slice(bytes);
        self.send_from_buf(from, to, bytes.len());
    }

    /// Drains every node's output, then handles the next event (a delivery
    /// or a node timeout), advancing virtual time to it. Returns `false`,
    /// without moving time, when nothing is pending.
    ///
    /// # Panics
    /// On a node bug the simulator cannot step past: see [`Node`], and the
    /// livelock note in its `poll_timeout`.
    pub fn step(&mut self) -> bool {
        self.drain_transmits();
        match self.next_event() {
            Some((time, next)) => {
                self.handle(time, next);
                true
            }
            None => false,
        }
    }

    /// Handles every event due at or before `deadline`, then moves the clock
    /// to `deadline` (if it is not already past it).
    pub fn run_until(&mut self, deadline: Nanos) {
        loop {
            self.drain_transmits();
            match self.next_event() {
                Some((time, next)) if time <= deadline => self.handle(time, next),
                _ => break,
            }
        }
        self.advance_to(deadline);
    }

    /// Runs until no delivery or timer is pending and returns the time of
    /// the last event; fails with [`StallReason::Deadline`] (the clock left
    /// at `max_time`) if events are still due after the absolute time
    /// `max_time`. Tests use it to assert that an exchange settles, never
    /// hangs.
    pub fn run_until_idle(&mut self, max_time: Nanos) -> Result<Nanos, Stalled> {
        loop {
            self.drain_transmits();
            match self.next_event() {
                None => return Ok(self.now),
                Some((time, next)) if time <= max_time => self.handle(time, next),
                Some((time, _)) => return Err(self.stall_at(max_time, time)),
            }
        }
    }

    /// Runs while `pred` holds, checking it before every step, and returns
    /// the time at which it stopped holding. Fails if the next event is due
    /// after the absolute time `max_time` ([`StallReason::Deadline`]) or
    /// nothing is left to happen ([`StallReason::Idle`]) while `pred` still
    /// holds.
    pub fn run_while(
        &mut self,
        max_time: Nanos,
        mut pred: impl FnMut(&Self) -> bool,
    ) -> Result<Nanos, Stalled> {
        loop {
            if !pred(self) {
                return Ok(self.now);
            }
            self.drain_transmits();
            match self.next_event() {
                None => {
                    return Err(Stalled {
                        now: self.now,
                        reason: StallReason::Idle,
                    });
                }
                Some((time, next)) if time <= max_time => self.handle(time, next),
                Some((time, _)) => return Err(self.stall_at(max_time, time)),
            }
        }
    }

    // ---- Internals ---------------------------------------------------------

    #[track_caller]
    fn check_node(&self, id: NodeId) {
        assert!(
            id < self.nodes.len(),
            "node {id} does not exist (the simulation has {})",
            self.nodes.len()
        );
    }

    fn advance_to(&mut self, time: Nanos) {
        if time > self.now {
            self.now = time;
            self.events_at_now = 0;
        }
    }

    fn stall_at(&mut self, max_time: Nanos, next_event: Nanos) -> Stalled {
        self.advance_to(max_time);
        Stalled {
            now: self.now,
            reason: StallReason::Deadline { next_event },
        }
    }

    /// Asks every node, in id order, for datagrams until it has none.
    fn drain_transmits(&mut self) {
        for from in 0..self.nodes.len() {
            let mut sent = 0u64;
            while let Some((to, len)) = self.nodes[from].poll_transmit(self.now, &mut self.tx_buf) {
                assert!(
                    len <= MAX_DATAGRAM,
                    "node {from} returned a datagram of {len} bytes from poll_transmit, over MAX_DATAGRAM ({MAX_DATAGRAM})"
                );
                assert!(
                    to < self.nodes.len(),
                    "node {from} sent to node {to}, which does not exist (the simulation has {})",
                    self.nodes.len()
                );
                sent += 1;
                assert!(
                    sent <= MAX_TRANSMITS_PER_POLL,
                    "node {from} emitted {MAX_TRANSMITS_PER_POLL} datagrams at {} ns without poll_transmit returning None",
                    self.now
                );
                self.send_from_buf(from, to, len);
            }
        }
    }

    /// Hands the first `len` bytes of the transmit buffer to the link
    /// `from` → `to`.
    fn send_from_buf(&mut self, from: NodeId, to: NodeId, len: usize) {
        let bytes = &self.tx_buf[..len];
        if let Some(capture) = &mut self.capture {
            capture(self.now, from, to, bytes);
        }
        let cfg = self
            .overrides
            .get(&(from, to))
            .unwrap_or(&self.default_link);
        let seed = self.seed;
        let link = self
            .links
            .entry((from, to))
            .or_insert_with(|| Link::new(seed, from, to));
        let deliveries = &mut self.deliveries;
        let next_seq = &mut self.next_seq;
        link.transmit(cfg, self.now, len, |time, flip| {
            let mut copy = bytes.to_vec();
            if let Some((index, bit)) = flip {
                copy[index] ^= 1 << bit;
            }
            deliveries.push(Reverse(Delivery {
                time,
                seq: *next_seq,
                from,
                to,
                bytes: copy,
            }));
            *next_seq += 1;
        });
    }

    /// The earliest pending event. A delivery wins a tie with a timer; among
    /// timers the lowest node id goes first; a timer already past is due
    /// now.
    fn next_event(&self) -> Option<(Nanos, Next)> {
        let delivery = self.deliveries.peek().map(|Reverse(d)| d.time);
        let timer = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, node)| node.poll_timeout().map(|t| (t.max(self.now), id)))
            .min();
        match (delivery, timer) {
            (Some(d), Some((t, id))) if t < d => Some((t, Next::Timeout(id))),
            (Some(d), _) => Some((d, Next::Delivery)),
            (None, Some((t, id))) => Some((t, Next::Timeout(id))),
            (None, None) => None,
        }
    }

    fn handle(&mut self, time: Nanos, next: Next) {
        self.advance_to(time);
        self.events_at_now += 1;
        assert!(
            self.events_at_now <= MAX_EVENTS_PER_INSTANT,
            "livelock: {MAX_EVENTS_PER_INSTANT} events at {} ns without time advancing \
             (a timer that handle_timeout never clears, or datagrams looping over zero-delay links)",
            self.now
        );
        match next {
            Next::Delivery => {
                let Some(Reverse(d)) = self.deliveries.pop() else {
                    unreachable!("next_event chose a delivery from an empty queue");
                };
                if let Some(link) = self.links.get_mut(&(d.from, d.to)) {
                    link.stats.delivered += 1;
                }
                self.nodes[d.to].handle_packet(self.now, d.from, &d.bytes);
            }
            Next::Timeout(id) => self.nodes[id].handle_timeout(self.now),
        }
    }
}

#[cfg(test)]
mod tests;
