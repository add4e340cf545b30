//! The UDP IO backend of softrdma: RoCEv2 datagrams through the kernel's
//! UDP stack, port 4791.
//!
//! The transport core ([`softrdma-core`]) decides what to send; this crate
//! gets it onto the wire and back, and is one of the few places in the
//! project with `unsafe` code: `sys` for the socket calls, `cbpf` for the
//! BPF programs, and the iovec reads of the zero-copy send queue (`tx`), each
//! block with a `// SAFETY:` line.
//!
//! * **Zero copy out.** A packet is the head the core wrote (headers and
//!   inline data, copied into a small arena), slices of registered memory,
//!   the pad and the ICRC — one iovec list, one datagram. The payload is
//!   never copied by us: a [`Tx`] batch borrows it until it is flushed, or,
//!   for an engine that manages registered memory itself, the `unsafe`
//!   [`Port::push`] takes it on the promise that it stays put until
//!   [`Port::flush`].
//! * **Batches.** `sendmmsg` and `recvmmsg` over arrays allocated once per
//!   port (a flush of one message is a `sendmsg`, and a receive after one
//!   that found nothing a `recvmsg`: a poller back at an idle socket mostly
//!   finds one datagram). Runs of equal datagrams to one QP go out as one UDP GSO send
//!   (`UDP_SEGMENT`); GRO coalesces them on receive. Both are detected at run
//!   time and fall back silently.
//! * **ICRC.** Computed on send over the IPv4 (ID 0, DF; segment index in a
//!   GSO train) or IPv6 header the kernel will write — `tests/wire_ids.rs`
//!   checks that on a real veth link; checked on receive, with the IPv4
//!   ID/DF the socket hides recovered only for senders that need it
//!   ([`policy`]).
//! * **Several processes, one port.** A classic-BPF reuseport program,
//!   which needs no privilege, steers each datagram to the process owning
//!   its destination QPN's slot ([`steer`]).
//! * **Per-QP source ports.** A bounded pool of send sockets gives each QP
//!   a source port derived from its QPN, as rxe and RNICs do, for ECMP
//!   entropy and per-QP GSO/GRO flows (`txsock`).
//! * **Testing aids.** Seeded fault injection ([`FaultConfig`]) and a pcap of
//!   everything sent and received whose ICRCs verify.
//!
//! `examples/throughput.rs` measures loopback datagram rates with and
//! without GSO/GRO.
//!
//! [`softrdma-core`]: https://docs.rs/softrdma-core

mod capture;
mod cbpf;
mod check;
mod fault;
mod forkguard;
mod icrc;
mod listing;
mod mcast;
pub mod policy;
mod port;
pub mod rundir;
mod rx;
mod socket;
pub mod steer;
mod sys;
mod tx;
mod txsock;

pub use fault::{FaultConfig, FaultParseError};
pub use port::{Port, Tx};
pub use steer::Steering;
pub use tx::{MAX_DATAGRAM, MAX_HEAD, MAX_PAYLOAD_SEGS};
pub use txsock::rxe_source_port;

use std::net::IpAddr;
use std::path::PathBuf;

/// The RoCEv2 UDP port.
pub const ROCEV2_PORT: u16 = softrdma_wire::ROCEV2_UDP_PORT;

/// How to open a [`Port`]: what every user decides.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// The local address: its GID is this port's. Must be a specific unicast
    /// address (the ICRC covers the source address).
    pub local: IpAddr,
    /// UDP port to bind, send from and send to; 4791.
    pub port: u16,
    /// Datagrams per `sendmmsg`/`recvmmsg` (1..=512).
    pub batch: usize,
    /// Share `local:port` with this user's other processes by steering on
    /// the QPN slot; falls back to exclusive use where the state directory
    /// is unusable.
    pub shared: bool,
    /// Inject faults on send.
    pub fault: Option<FaultConfig>,
    /// Write a pcap of everything sent and received here.
    pub pcap: Option<PathBuf>,
}

impl PortConfig {
    /// `local`, port 4791, batch 32, shared, no faults, no pcap.
    pub fn new(local: IpAddr) -> PortConfig {
        PortConfig {
            local,
            port: ROCEV2_PORT,
            batch: 32,
            shared: true,
            fault: None,
            pcap: None,
        }
    }
}

/// Knobs most users leave alone ([`Port::open_with`]).
#[derive(Debug, Clone)]
pub struct PortOptions {
    /// UDP port datagrams are sent to, if not [`PortConfig::port`] (tests
    /// that run several exclusive ports on one address).
    pub remote_port: Option<u16>,
    /// Use UDP GSO for runs of equal datagrams, where the kernel supports it.
    pub gso: bool,
    /// Use UDP GRO on receive, where supported. In a shared group it stays
    /// on while every UDP flow carries one destination QP, and turns itself
    /// off the first time a coalesced entry mixes QPN slots.
    pub gro: bool,
    /// IPv4 TOS / IPv6 traffic class of everything sent (DSCP and ECN).
    pub traffic_class: u8,
    /// Where the steering lock and state files live: by default the user's
    /// runtime directory ([`rundir`]); checked to be this user's alone.
    pub state_dir: PathBuf,
    /// Source ports: QPs send from `2^bits` ports chosen by QPN
    /// (0..=14; see [`rxe_source_port`]); `None` sends everything from
    /// [`PortConfig::port`].
    pub source_port_bits: Option<u8>,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            remote_port: None,
            gso: true,
            gro: true,
            traffic_class: 0,
            state_dir: steer::default_state_dir(),
            source_port_bits: Some(6),
        }
    }
}

/// Where a received datagram came from and how it travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// Source GID (IPv6, or IPv4-mapped).
    pub sgid: [u8; 16],
    /// Destination GID as the IP header had it.
    pub dgid: [u8; 16],
    pub src_port: u16,
    /// IPv4 TOS or IPv6 traffic class, ECN bits included.
    pub traffic_class: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
}

/// Counters of one port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Datagrams handed to the kernel (each GSO segment counts).
    pub tx_packets: u64,
    /// UDP payload bytes of those, ICRC included.
    pub tx_bytes: u64,
    /// Datagrams delivered to the caller.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Received datagrams dropped for a wrong ICRC.
    pub icrc_bad: u64,
    /// Received IPv4 datagrams accepted after recovering their ID/DF.
    pub icrc_recovered: u64,
    /// Received datagrams too short to be RoCEv2, or from an unknown family.
    pub rx_malformed: u64,
    /// Received datagrams larger than the receive buffer.
    pub rx_truncated: u64,
    /// Received datagrams for another process's QPN slot (shared mode).
    pub rx_wrong_slot: u64,
    /// Datagrams the kernel dropped on the receive socket since this port
    /// joined its group (a full buffer; also the steering probes of later
    /// group changes and repairs, one per change at most), as `SO_RXQ_OVFL`
    /// last reported. The join's own probe is not counted.
    pub rx_kernel_drops: u64,
    /// Steering tables this port repaired after a member died, and repairs
    /// that failed.
    pub steer_repairs: u64,
    pub steer_repair_errors: u64,
    /// Times GRO was turned off because it merged datagrams for different
    /// QPN slots.
    pub gro_mixed: u64,
    /// Send sockets bound (source-port buckets in use), and buckets that
    /// found no free port and send from the receive socket.
    pub tx_source_ports: u64,
    pub tx_source_port_failures: u64,
    /// Senders learned to be softrdma peers, and peers forgotten again.
    pub peers_learned: u64,
    pub peers_demoted: u64,
    pub fault_drops: u64,
    pub fault_dups: u64,
    pub fault_corrupts: u64,
    pub fault_reorders: u64,
    /// Datagrams the kernel refused (counted, not retried).
    pub send_errors: u64,
    /// Datagrams dropped after the socket buffer stayed full too long, or
    /// left queued in a leaked [`Tx`].
    pub tx_dropped: u64,
    /// Waits for a full socket buffer (`EAGAIN`/`ENOBUFS`).
    pub tx_retries: u64,
    /// GSO sends and the datagrams they carried.
    pub gso_batches: u64,
    pub gso_segments: u64,
    /// Received GRO entries holding more than one datagram, and those
    /// datagrams.
    pub gro_batches: u64,
    pub gro_segments: u64,
    /// Send system calls (`sendmmsg`, or `sendmsg` for one message).
    pub sendmmsg_calls: u64,
    /// Receive system calls that took datagrams (`recvmmsg`, or `recvmsg`
    /// after a receive that found nothing).
    pub recvmmsg_calls: u64,
    /// pcap records that could not be written.
    pub pcap_errors: u64,
    /// errno of the last refused send.
    pub last_send_error: Option<i32>,
    /// GSO trains the kernel refused for their size (a segment over the
    /// path MTU: `EMSGSIZE`, or `EINVAL` on older kernels), sent again one
    /// datagram at a time with GSO left on.
    pub gso_split: u64,
    /// errno that turned GSO off, if it was.
    pub gso_disabled: Option<i32>,
}
