//! A deterministic network on virtual time, for driving sans-IO protocol
//! endpoints.
//!
//! # What it is for
//!
//! softrdma's transport core owns no sockets and no clock: time comes in as
//! an argument, datagrams come in through `handle_packet`, go out through
//! `poll_transmit`, and timers are asked for through `poll_timeout`. That
//! shape is captured here by the [`Node`] trait, and [`Sim`] is the thing
//! that drives such nodes: it carries every datagram a node emits over a
//! [`LinkConfig`]ured link (delay, jitter, loss, duplication, reordering,
//! single-bit corruption, a serialization rate and a drop-tail queue), and it
//! fires node timers, all on a virtual clock that jumps from one event to
//! the next.
//!
//! The same protocol code therefore runs in three places, and is modelled in
//! none of them:
//!
//! - in the real stack, where an IO backend feeds it datagrams from UDP or
//!   shared memory and wall-clock time;
//! - in the core's own tests, which put two or more endpoints into a [`Sim`]
//!   and check what survives loss, reordering and corruption;
//! - in the fabric simulator, which builds bigger topologies from the same
//!   [`Sim`] and links.
//!
//! This crate knows nothing about RDMA (it does not depend on
//! `softrdma-core`; the core dev-depends on it): a datagram is a byte slice,
//! a node is an index.
//!
//! # Determinism
//!
//! A run is a function of the seed given to [`Sim::new`] and of what the
//! nodes do, nothing else: the same seed and the same node behaviour give the
//! same sequence of events, bit for bit, on every platform.
//!
//! - Randomness comes from ChaCha8, whose output for a seed is fixed and
//!   portable. Each directed link draws from its own stream, keyed by the
//!   seed and the two node ids, so traffic on one link never shifts the
//!   impairments another link sees.
//! - Events that fall on the same nanosecond are ordered by when they were
//!   scheduled (a sequence number breaks ties), never by hash or address.
//! - At equal times, deliveries go before timer expiries, and timers of
//!   several nodes fire in [`NodeId`] order.
//! - Nodes' pending output is drained in [`NodeId`] order before every event.
//!
//! # Costs
//!
//! This is a test harness and favours clarity over speed: every datagram in
//! flight is a `Vec<u8>` owned by the event queue, and transmission goes
//! through one reusable buffer of [`MAX_DATAGRAM`] bytes.
//!
//! # Example
//!
//! ```
//! use softrdma_netsim::{LinkConfig, Nanos, Node, NodeId, Sim, MICROSECOND};
//!
//! /// Sends "ping" to a peer once, counts what comes back.
//! struct Pinger { peer: NodeId, sent: bool, heard: usize }
//! /// Echoes everything.
//! struct Echo { reply: Option<(NodeId, Vec<u8>)> }
//!
//! enum Host { Pinger(Pinger), Echo(Echo) }
//!
//! impl Node for Host {
//!     fn handle_packet(&mut self, _now: Nanos, from: NodeId, bytes: &[u8]) {
//!         match self {
//!             Host::Pinger(p) => p.heard += 1,
//!             Host::Echo(e) => e.reply = Some((from, bytes.to_vec())),
//!         }
//!     }
//!     fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<(NodeId, usize)> {
//!         match self {
//!             Host::Pinger(p) if !p.sent => {
//!                 p.sent = true;
//!                 buf[..4].copy_from_slice(b"ping");
//!                 Some((p.peer, 4))
//!             }
//!             Host::Echo(e) => e.reply.take().map(|(to, b)| {
//!                 buf[..b.len()].copy_from_slice(&b);
//!                 (to, b.len())
//!             }),
//!             _ => None,
//!         }
//!     }
//!     fn poll_timeout(&self) -> Option<Nanos> { None }
//!     fn handle_timeout(&mut self, _now: Nanos) {}
//! }
//!
//! let mut sim = Sim::new(42);
//! sim.set_default_link(LinkConfig::default().delay(10 * MICROSECOND));
//! let a = sim.add_node(Host::Pinger(Pinger { peer: 1, sent: false, heard: 0 }));
//! let b = sim.add_node(Host::Echo(Echo { reply: None }));
//! let idle_at = sim.run_until_idle(MICROSECOND * 1_000).expect("no hang");
//! assert_eq!(idle_at, 20 * MICROSECOND);
//! assert!(matches!(sim.node(a), Host::Pinger(p) if p.heard == 1));
//! assert_eq!(sim.link_stats(b, a).delivered, 1);
//! ```

mod link;
mod sim;

pub use link::{LinkConfig, LinkConfigError, LinkStats};
pub use sim::{Sim, StallReason, Stalled};

/// Virtual time in nanoseconds since the start of the simulation.
pub type Nanos = u64;

/// A node's index in its [`Sim`], as returned by [`Sim::add_node`].
pub type NodeId = usize;

/// One microsecond of virtual time.
pub const MICROSECOND: Nanos = 1_000;
/// One millisecond of virtual time.
pub const MILLISECOND: Nanos = 1_000_000;
/// One second of virtual time.
pub const SECOND: Nanos = 1_000_000_000;

/// The size of the transmit buffer handed to [`Node::poll_transmit`]: a
/// jumbo frame, comfortably above any RoCEv2 datagram at a 4096-byte MTU.
pub const MAX_DATAGRAM: usize = 9216;

/// A sans-IO protocol endpoint the simulator drives.
///
/// The simulator is the only caller and always passes the current virtual
/// time; a node must not read a clock of its own.
pub trait Node {
    /// A packet arrives (bytes of one datagram) from `from`.
    fn handle_packet(&mut self, now: Nanos, from: NodeId, bytes: &[u8]);

    /// The node's next outgoing datagram, if any: destination and bytes
    /// written into `buf` (return length). Called repeatedly until `None`.
    ///
    /// `buf` is [`MAX_DATAGRAM`] bytes long; returning a longer length, or a
    /// destination that is not a node of the simulation, is a bug in the
    /// node and panics.
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(NodeId, usize)>;

    /// Earliest time the node wants `handle_timeout` called, if any.
    ///
    /// A time already past fires at the current time. The simulator asks
    /// again after every event, so a node may move or drop its deadline at
    /// any point; in `handle_timeout` it must clear or move the deadline it
    /// was woken for, or it would be woken again at the same instant forever
    /// (the simulator panics on such a livelock instead of hanging).
    fn poll_timeout(&self) -> Option<Nanos>;

    /// The deadline from [`poll_timeout`](Node::poll_timeout) has been
    /// reached.
    fn handle_timeout(&mut self, now: Nanos);
}

/// Boxed nodes are nodes, so one simulation can mix kinds of endpoint as
/// `Sim<Box<dyn Node>>`.
impl<T: Node + ?Sized> Node for Box<T> {
    fn handle_packet(&mut self, now: Nanos, from: NodeId, bytes: &[u8]) {
        (**self).handle_packet(now, from, bytes)
    }

    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(NodeId, usize)> {
        (**self).poll_transmit(now, buf)
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        (**self).poll_timeout()
    }

    fn handle_timeout(&mut self, now: Nanos) {
        (**self).handle_timeout(now)
    }
}
