//! What the core hands to an IO backend for one outgoing packet.
//!
//! The core writes the transport headers (and inline payload) into a buffer
//! the caller provides, and describes the rest of the payload as segments of
//! registered memory. A UDP backend turns that into one `sendmsg` iovec list
//! (headers, memory segments, pad, ICRC), so payload goes from registered
//! memory into the kernel with no copy of ours; a simulator copies the
//! segments into a datagram. Either way the ICRC is computed by the layer
//! that knows the IP and UDP headers it covers.

/// Most memory segments one packet's payload can span. A packet carries at
/// most one path MTU (4096 bytes) of payload gathered from a work request's
/// scatter/gather list, which has at most [`crate::MAX_SGE`] entries.
pub const MAX_SEGS: usize = crate::MAX_SGE;

/// Room each packet's head needs in the buffer `poll_transmit` writes it
/// into: the headers, and up to one MTU of payload the core may copy there
/// (inline data, an implicit region's bytes).
pub const HEAD_ROOM: usize = 4096 + 128;

/// A run of payload bytes in local memory, translated through its memory
/// region when it was handed out (see [`Transmit`] for how long it holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seg {
    pub addr: u64,
    pub len: u32,
}

/// Payload segments of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segs {
    segs: [Seg; MAX_SEGS],
    n: u8,
    /// Total bytes of `segs[..n]` (a packet's are at most one MTU):
    /// [`Transmit::wire_len`] is read several times per packet.
    bytes: u32,
}

impl Default for Segs {
    fn default() -> Self {
        Segs {
            segs: [Seg::default(); MAX_SEGS],
            n: 0,
            bytes: 0,
        }
    }
}

impl Segs {
    pub fn as_slice(&self) -> &[Seg] {
        &self.segs[..self.n as usize]
    }

    pub(crate) fn push(&mut self, s: Seg) {
        if s.len == 0 {
            return;
        }
        self.bytes += s.len;
        if let Some(last) = self.segs[..self.n as usize].last_mut() {
            if last.addr + last.len as u64 == s.addr {
                last.len += s.len;
                return;
            }
        }
        self.segs[self.n as usize] = s;
        self.n += 1;
    }

    pub(crate) fn clear(&mut self) {
        self.n = 0;
        self.bytes = 0;
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.bytes as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// One packet ready to send.
///
/// # Lifetime of the payload segments
///
/// `segs` are host addresses inside registered memory, translated through
/// the region table when `poll_transmit` built this packet. They are valid
/// only until the caller's next call into the [`crate::Endpoint`] — any
/// call: `dereg_mr` among them, after which the memory may be freed. The IO
/// layer must have copied or sent the bytes (e.g. `sendmsg` returned)
/// before it calls into the endpoint again, and must not hold a `Transmit`
/// across such a call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transmit {
    /// Destination GID (IPv6, or IPv4-mapped).
    pub dgid: [u8; 16],
    /// Source QP number (for flow entropy, e.g. the UDP source port).
    pub src_qpn: u32,
    /// Bytes written into the caller's buffer: headers, then inline payload.
    pub head_len: usize,
    /// Payload from registered memory, after the head.
    pub segs: Segs,
    /// Zero bytes to add after the payload so it ends on 4 bytes.
    pub pad: u8,
}

impl Transmit {
    /// Length of the UDP payload this packet becomes, ICRC included.
    pub fn wire_len(&self) -> usize {
        self.head_len + self.segs.len() + self.pad as usize + softrdma_wire::opcode::len::ICRC
    }
}
