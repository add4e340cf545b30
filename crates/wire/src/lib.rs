//! RoCEv2 on the wire.
//!
//! This crate is the bottom layer of softrdma: it knows the bytes and nothing
//! else. It has no IO, no clock and no state beyond what a packet carries.
//!
//! * [`opcode`] — the 256-entry BTH opcode table: which extension headers each
//!   opcode carries and what it means to the transport. The receive path is
//!   table lookups and mask tests, never a hand-written `match` per opcode.
//! * [`psn`] — 24-bit packet sequence numbers, correct across wraparound.
//! * [`bth`], [`ext`] — the Base Transport Header and the extension headers
//!   (RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH), each as a typed
//!   view over a byte buffer plus a `Repr` value that parses and emits.
//! * [`packet`] — a whole InfiniBand transport packet (BTH .. ICRC) as carried
//!   in a RoCEv2 UDP datagram; its `Repr` emits the headers so the payload can
//!   be written once, straight from registered memory, after them.
//! * [`cm`] — communication management MADs (REQ, REP, RTU, REJ, MRA, DREQ,
//!   DREP, SIDR) for QP1, and the rdma_cm header in their private data.
//! * [`icrc`] — the invariant CRC exactly as Linux rxe computes it, over IPv4
//!   and IPv6, and the recovery of the IPv4 fields a UDP socket hides.
//! * [`frame`] — Ethernet, IPv4, IPv6 and UDP, enough to read captures and to
//!   write our own traffic into them.
//! * [`pcap`] — classic pcap files, read and written.
//! * [`dissect`] — one frame turned into the fields an RDMA engineer reads;
//!   what `softrdma decode` prints.
//!
//! Every view has a checked constructor (`new_checked`) after which its
//! accessors cannot panic, and every parser returns an [`Error`] on any input
//! instead of panicking: bytes from the wire never crash the stack.

#![forbid(unsafe_code)]

pub mod bth;
pub mod cm;
pub mod dissect;
pub mod ext;
pub mod frame;
pub mod icrc;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;

mod field;

pub use bth::{Bth, BthRepr};
pub use opcode::{Opcode, OpcodeInfo};
pub use packet::{Packet, PacketRepr};
pub use psn::Psn;

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Why a buffer could not be read as the thing asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the named structure does.
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// The BTH opcode is not one this stack knows (reserved, RD, or vendor).
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0.
    BadTver(u8),
    /// The BTH pad count exceeds the payload it would pad.
    BadPad { pad: u8, payload: usize },
    /// A length field disagrees with the buffer around it.
    BadLength {
        what: &'static str,
        field: usize,
        have: usize,
    },
    /// An IP version nibble other than the one the header claims.
    BadIpVersion(u8),
    /// A field holds a value the format does not allow.
    BadField { what: &'static str, value: u64 },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::Truncated { what, need, have } => {
                write!(f, "truncated {what}: need {need} bytes, have {have}")
            }
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode 0x{op:02x}"),
            Error::BadTver(v) => write!(f, "BTH transport version {v}, expected 0"),
            Error::BadPad { pad, payload } => {
                write!(f, "BTH pad count {pad} exceeds payload of {payload} bytes")
            }
            Error::BadLength { what, field, have } => {
                write!(
                    f,
                    "{what} length field says {field} bytes, buffer has {have}"
                )
            }
            Error::BadIpVersion(v) => write!(f, "IP version {v} where another was expected"),
            Error::BadField { what, value } => write!(f, "invalid {what} value {value:#x}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of parsing wire bytes.
pub type Result<T> = core::result::Result<T, Error>;

pub(crate) fn check_len(what: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
