//! The softrdma transport core: a sans-IO implementation of the InfiniBand
//! transport (RC, UC, UD and XRC) as RoCEv2 carries it.
//!
//! It owns no sockets, threads or clocks. An IO layer (or the simulator)
//! drives one [`Endpoint`] — the transport half of a soft RNIC — through four
//! kinds of call, after quinn-proto's shape:
//!
//! * **commands** from the verbs layer: `create_*`, `modify_qp`, `post_send`,
//!   `post_recv`, `poll_cq`;
//! * **`handle_packet`**: a received RoCEv2 datagram whose ICRC the IO layer
//!   has verified (it is the layer that sees the IP header the ICRC covers);
//! * **`poll_transmit`**: the next packet to send, headers written into the
//!   caller's buffer and payload described as memory segments;
//! * **`poll_timeout` / `handle_timeout`**: time is a `u64` of nanoseconds
//!   passed in by the caller, never read from a clock.
//!
//! Memory is reached only through the [`mr::Memory`] trait at addresses the
//! core has just translated through its region table (nothing keeps a host
//! address across calls; see [`mr`]), so this crate contains no `unsafe`.
//!
//! Inside, each queue pair is one owner ([`qp::Qp`]) of three pieces that
//! hand work to each other by return values: the requester turns send work
//! requests into packets, the completer turns ACKs, NAKs, read responses and
//! timeouts into completions and retransmissions, and the responder executes
//! inbound requests and queues its responses in PSN order.
//!
//! Which QP sends next is the [`sched`]uler's: a ready list of the QPs that
//! have something they may send, each behind its transmit [`gate`] (window
//! and rate) and its destination's budget, with every timer in one heap.

#![forbid(unsafe_code)]

pub mod cc;
pub mod cq;
pub mod endpoint;
pub mod error;
pub mod gate;
pub mod mcast;
pub mod mr;
pub mod qp;
pub mod sched;
pub mod stats;
mod timer;
pub mod transmit;
pub mod wc;
pub mod wr;

pub use endpoint::{
    Endpoint, EndpointConfig, Event, Offload, OffloadLocal, QpInit, RecvCheck, RxMeta,
};
pub use error::Error;
pub use transmit::{Transmit, HEAD_ROOM};

/// Virtual or real time, in nanoseconds from an origin the caller picks.
pub type Nanos = u64;

/// Most scatter/gather entries per work request.
pub const MAX_SGE: usize = 32;
/// Most bytes of inline data per send work request.
pub const MAX_INLINE: usize = 256;
/// Largest message (IBA allows 2^31).
pub const MAX_MSG_SIZE: u64 = 1 << 31;
/// A message takes fewer packets than this (half the 24-bit PSN space):
/// PSNs compare in half-ring arithmetic, so a message of 2^23 packets —
/// `MAX_MSG_SIZE` at a 256-byte path MTU — would end at a PSN that is not
/// "after" its first. Refused at post, and NAKed as an invalid request.
pub const MAX_MSG_PSNS: u64 = 1 << 23;
