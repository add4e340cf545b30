//! The BTH opcode table.
//!
//! One 256-entry table, indexed by the BTH opcode byte, says for every opcode
//! which extension headers follow the BTH, where each one starts, whether the
//! opcode is a request or a response, where it sits in a message, and what it
//! asks of the responder. The receive path does a single lookup and then
//! tests bits; nothing downstream matches on opcodes by hand.
//!
//! Opcodes are those of IBA vol. 1 §9.2 for RC, UC and UD, the XRC group
//! (0xa0..: RC's opcodes with the XRCETH after the BTH on every request,
//! IBA vol. 1 §9.2 / Annex A14), plus RoCEv2's Congestion Notification Packet
//! (0x81, Annex A17). Reliable Datagram and FLUSH are not supported and read
//! as unknown.

use core::fmt;

/// Extension-header and property bits of an opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(u32);

impl Flags {
    pub const RETH: Flags = Flags(1 << 0);
    pub const AETH: Flags = Flags(1 << 1);
    pub const ATOMIC_ETH: Flags = Flags(1 << 2);
    pub const ATOMIC_ACK_ETH: Flags = Flags(1 << 3);
    pub const IMMDT: Flags = Flags(1 << 4);
    pub const IETH: Flags = Flags(1 << 5);
    pub const DETH: Flags = Flags(1 << 6);
    /// 16 reserved bytes after the BTH (CNP).
    pub const CNP_RSVD: Flags = Flags(1 << 7);
    /// The packet may carry payload.
    pub const PAYLOAD: Flags = Flags(1 << 8);
    /// Sent by a requester (vs. a response sent by a responder).
    pub const REQUEST: Flags = Flags(1 << 9);
    /// Sent by a responder: ACK/NAK, read response, atomic ACK.
    pub const RESPONSE: Flags = Flags(1 << 10);
    /// First packet of a multi-packet message.
    pub const FIRST: Flags = Flags(1 << 11);
    /// Middle packet of a multi-packet message.
    pub const MIDDLE: Flags = Flags(1 << 12);
    /// Last packet of a multi-packet message.
    pub const LAST: Flags = Flags(1 << 13);
    /// The only packet of a single-packet message.
    pub const ONLY: Flags = Flags(1 << 14);
    /// The message this packet belongs to consumes a receive WQE at the
    /// responder (every SEND packet; RDMA WRITE with immediate at its end).
    pub const RECV_WQE: Flags = Flags(1 << 15);
    /// This packet ends a message that generates a receive completion.
    pub const RECV_COMPLETION: Flags = Flags(1 << 16);
    /// SEND family.
    pub const SEND: Flags = Flags(1 << 17);
    /// RDMA WRITE family.
    pub const WRITE: Flags = Flags(1 << 18);
    /// RDMA READ request.
    pub const READ: Flags = Flags(1 << 19);
    /// COMPARE SWAP or FETCH ADD request.
    pub const ATOMIC: Flags = Flags(1 << 20);
    /// RDMA READ response packet.
    pub const READ_RESPONSE: Flags = Flags(1 << 21);
    /// ACKNOWLEDGE or ATOMIC ACKNOWLEDGE.
    pub const ACK: Flags = Flags(1 << 22);
    /// RDMA ATOMIC WRITE (IBA 1.5): an RDMA WRITE of exactly 8 bytes that
    /// the responder stores as one aligned 64-bit word.
    pub const ATOMIC_WRITE: Flags = Flags(1 << 23);
    /// XRC Extended Transport Header (the XRC SRQ number), right after the
    /// BTH on every XRC request.
    pub const XRCETH: Flags = Flags(1 << 24);

    /// No bits.
    pub const EMPTY: Flags = Flags(0);

    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    #[inline]
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set.
    #[inline]
    pub const fn intersects(self, other: Flags) -> bool {
        self.0 & other.0 != 0
    }

    /// Union, usable in constants.
    pub const fn or(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

impl core::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        self.or(rhs)
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 25] = [
            "RETH",
            "AETH",
            "ATOMIC_ETH",
            "ATOMIC_ACK_ETH",
            "IMMDT",
            "IETH",
            "DETH",
            "CNP_RSVD",
            "PAYLOAD",
            "REQUEST",
            "RESPONSE",
            "FIRST",
            "MIDDLE",
            "LAST",
            "ONLY",
            "RECV_WQE",
            "RECV_COMPLETION",
            "SEND",
            "WRITE",
            "READ",
            "ATOMIC",
            "READ_RESPONSE",
            "ACK",
            "ATOMIC_WRITE",
            "XRCETH",
        ];
        let mut first = true;
        for (i, n) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(n)?;
                first = false;
            }
        }
        if first {
            f.write_str("EMPTY")?;
        }
        Ok(())
    }
}

/// The transport service an opcode belongs to (its top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
    /// Extended reliable connected (IBA Annex A14): RC with an XRC SRQ number.
    Xrc,
    /// RoCEv2 congestion notification.
    Cnp,
}

/// Header sizes in bytes.
pub mod len {
    pub const BTH: usize = 12;
    pub const RETH: usize = 16;
    pub const AETH: usize = 4;
    pub const ATOMIC_ETH: usize = 28;
    pub const ATOMIC_ACK_ETH: usize = 8;
    pub const IMMDT: usize = 4;
    pub const IETH: usize = 4;
    pub const DETH: usize = 8;
    pub const CNP_RSVD: usize = 16;
    pub const XRCETH: usize = 4;
    pub const ICRC: usize = 4;
}

/// Everything the table knows about one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The IBA name, as tshark prints it (e.g. `RDMA WRITE First`).
    pub name: &'static str,
    pub transport: Transport,
    pub flags: Flags,
    /// Total length of BTH plus extension headers.
    pub header_len: u8,
    /// Offsets from the start of the BTH; meaningful only where the matching
    /// flag is set.
    pub offsets: Offsets,
}

/// Where each extension header starts, counted from the start of the BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Offsets {
    pub deth: u8,
    pub reth: u8,
    pub atomic_eth: u8,
    pub aeth: u8,
    pub atomic_ack_eth: u8,
    pub immdt: u8,
    pub ieth: u8,
    pub xrceth: u8,
}

impl OpcodeInfo {
    /// Lay the headers out in IBA order: BTH, DETH or XRCETH, RETH,
    /// AtomicETH, AETH, AtomicAckETH, ImmDt/IETH.
    const fn new(name: &'static str, transport: Transport, flags: Flags) -> OpcodeInfo {
        let mut at = len::BTH;
        let mut o = Offsets {
            deth: 0,
            reth: 0,
            atomic_eth: 0,
            aeth: 0,
            atomic_ack_eth: 0,
            immdt: 0,
            ieth: 0,
            xrceth: 0,
        };
        if flags.contains(Flags::CNP_RSVD) {
            at += len::CNP_RSVD;
        }
        if flags.contains(Flags::XRCETH) {
            o.xrceth = at as u8;
            at += len::XRCETH;
        }
        if flags.contains(Flags::DETH) {
            o.deth = at as u8;
            at += len::DETH;
        }
        if flags.contains(Flags::RETH) {
            o.reth = at as u8;
            at += len::RETH;
        }
        if flags.contains(Flags::ATOMIC_ETH) {
            o.atomic_eth = at as u8;
            at += len::ATOMIC_ETH;
        }
        if flags.contains(Flags::AETH) {
            o.aeth = at as u8;
            at += len::AETH;
        }
        if flags.contains(Flags::ATOMIC_ACK_ETH) {
            o.atomic_ack_eth = at as u8;
            at += len::ATOMIC_ACK_ETH;
        }
        if flags.contains(Flags::IMMDT) {
            o.immdt = at as u8;
            at += len::IMMDT;
        }
        if flags.contains(Flags::IETH) {
            o.ieth = at as u8;
            at += len::IETH;
        }
        OpcodeInfo {
            name,
            transport,
            flags,
            header_len: at as u8,
            offsets: o,
        }
    }

    /// Whether the opcode carries the given header or property.
    #[inline]
    pub const fn has(&self, f: Flags) -> bool {
        self.flags.contains(f)
    }

    /// Whether this packet starts a message (FIRST or ONLY).
    #[inline]
    pub const fn starts_message(&self) -> bool {
        self.flags.intersects(Flags::FIRST.or(Flags::ONLY))
    }

    /// Whether this packet ends a message (LAST or ONLY).
    #[inline]
    pub const fn ends_message(&self) -> bool {
        self.flags.intersects(Flags::LAST.or(Flags::ONLY))
    }
}

/// A BTH opcode byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($( $konst:ident = $val:expr, $name:expr, $tr:ident, [$($flag:ident)|*]; )*) => {
        impl Opcode {
            $( pub const $konst: Opcode = Opcode($val); )*
        }

        const fn build_table() -> [Option<OpcodeInfo>; 256] {
            let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
            $(
                t[$val as usize] = Some(OpcodeInfo::new(
                    $name,
                    Transport::$tr,
                    Flags::EMPTY $( .or(Flags::$flag) )*,
                ));
            )*
            t
        }
    };
}

opcodes! {
    // Reliable Connection.
    RC_SEND_FIRST = 0x00, "RC Send First", Rc, [REQUEST | SEND | FIRST | PAYLOAD | RECV_WQE];
    RC_SEND_MIDDLE = 0x01, "RC Send Middle", Rc, [REQUEST | SEND | MIDDLE | PAYLOAD | RECV_WQE];
    RC_SEND_LAST = 0x02, "RC Send Last", Rc, [REQUEST | SEND | LAST | PAYLOAD | RECV_WQE | RECV_COMPLETION];
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, "RC Send Last Immediate", Rc, [REQUEST | SEND | LAST | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    RC_SEND_ONLY = 0x04, "RC Send Only", Rc, [REQUEST | SEND | ONLY | PAYLOAD | RECV_WQE | RECV_COMPLETION];
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, "RC Send Only Immediate", Rc, [REQUEST | SEND | ONLY | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    RC_RDMA_WRITE_FIRST = 0x06, "RC RDMA Write First", Rc, [REQUEST | WRITE | FIRST | PAYLOAD | RETH];
    RC_RDMA_WRITE_MIDDLE = 0x07, "RC RDMA Write Middle", Rc, [REQUEST | WRITE | MIDDLE | PAYLOAD];
    RC_RDMA_WRITE_LAST = 0x08, "RC RDMA Write Last", Rc, [REQUEST | WRITE | LAST | PAYLOAD];
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, "RC RDMA Write Last Immediate", Rc, [REQUEST | WRITE | LAST | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    RC_RDMA_WRITE_ONLY = 0x0a, "RC RDMA Write Only", Rc, [REQUEST | WRITE | ONLY | PAYLOAD | RETH];
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, "RC RDMA Write Only Immediate", Rc, [REQUEST | WRITE | ONLY | PAYLOAD | RETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    RC_RDMA_READ_REQUEST = 0x0c, "RC RDMA Read Request", Rc, [REQUEST | READ | ONLY | RETH];
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, "RC RDMA Read Response First", Rc, [RESPONSE | READ_RESPONSE | FIRST | PAYLOAD | AETH];
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, "RC RDMA Read Response Middle", Rc, [RESPONSE | READ_RESPONSE | MIDDLE | PAYLOAD];
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, "RC RDMA Read Response Last", Rc, [RESPONSE | READ_RESPONSE | LAST | PAYLOAD | AETH];
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, "RC RDMA Read Response Only", Rc, [RESPONSE | READ_RESPONSE | ONLY | PAYLOAD | AETH];
    RC_ACKNOWLEDGE = 0x11, "RC Acknowledge", Rc, [RESPONSE | ACK | ONLY | AETH];
    RC_ATOMIC_ACKNOWLEDGE = 0x12, "RC Atomic Acknowledge", Rc, [RESPONSE | ACK | ONLY | AETH | ATOMIC_ACK_ETH];
    RC_COMPARE_SWAP = 0x13, "RC Compare Swap", Rc, [REQUEST | ATOMIC | ONLY | ATOMIC_ETH];
    RC_FETCH_ADD = 0x14, "RC Fetch Add", Rc, [REQUEST | ATOMIC | ONLY | ATOMIC_ETH];
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, "RC Send Last Invalidate", Rc, [REQUEST | SEND | LAST | PAYLOAD | IETH | RECV_WQE | RECV_COMPLETION];
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, "RC Send Only Invalidate", Rc, [REQUEST | SEND | ONLY | PAYLOAD | IETH | RECV_WQE | RECV_COMPLETION];
    RC_ATOMIC_WRITE = 0x1d, "RC Atomic Write", Rc, [REQUEST | WRITE | ONLY | PAYLOAD | RETH | ATOMIC_WRITE];
    // Unreliable Connection.
    UC_SEND_FIRST = 0x20, "UC Send First", Uc, [REQUEST | SEND | FIRST | PAYLOAD | RECV_WQE];
    UC_SEND_MIDDLE = 0x21, "UC Send Middle", Uc, [REQUEST | SEND | MIDDLE | PAYLOAD | RECV_WQE];
    UC_SEND_LAST = 0x22, "UC Send Last", Uc, [REQUEST | SEND | LAST | PAYLOAD | RECV_WQE | RECV_COMPLETION];
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, "UC Send Last Immediate", Uc, [REQUEST | SEND | LAST | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    UC_SEND_ONLY = 0x24, "UC Send Only", Uc, [REQUEST | SEND | ONLY | PAYLOAD | RECV_WQE | RECV_COMPLETION];
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, "UC Send Only Immediate", Uc, [REQUEST | SEND | ONLY | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    UC_RDMA_WRITE_FIRST = 0x26, "UC RDMA Write First", Uc, [REQUEST | WRITE | FIRST | PAYLOAD | RETH];
    UC_RDMA_WRITE_MIDDLE = 0x27, "UC RDMA Write Middle", Uc, [REQUEST | WRITE | MIDDLE | PAYLOAD];
    UC_RDMA_WRITE_LAST = 0x28, "UC RDMA Write Last", Uc, [REQUEST | WRITE | LAST | PAYLOAD];
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, "UC RDMA Write Last Immediate", Uc, [REQUEST | WRITE | LAST | PAYLOAD | IMMDT | RECV_WQE | RECV_COMPLETION];
    UC_RDMA_WRITE_ONLY = 0x2a, "UC RDMA Write Only", Uc, [REQUEST | WRITE | ONLY | PAYLOAD | RETH];
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, "UC RDMA Write Only Immediate", Uc, [REQUEST | WRITE | ONLY | PAYLOAD | RETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    // Unreliable Datagram.
    UD_SEND_ONLY = 0x64, "UD Send Only", Ud, [REQUEST | SEND | ONLY | PAYLOAD | DETH | RECV_WQE | RECV_COMPLETION];
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, "UD Send Only Immediate", Ud, [REQUEST | SEND | ONLY | PAYLOAD | DETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    // Extended Reliable Connection: RC's opcodes plus 0xa0, every request
    // with an XRCETH; responses as RC's.
    XRC_SEND_FIRST = 0xa0, "XRC Send First", Xrc, [REQUEST | SEND | FIRST | PAYLOAD | XRCETH | RECV_WQE];
    XRC_SEND_MIDDLE = 0xa1, "XRC Send Middle", Xrc, [REQUEST | SEND | MIDDLE | PAYLOAD | XRCETH | RECV_WQE];
    XRC_SEND_LAST = 0xa2, "XRC Send Last", Xrc, [REQUEST | SEND | LAST | PAYLOAD | XRCETH | RECV_WQE | RECV_COMPLETION];
    XRC_SEND_LAST_WITH_IMMEDIATE = 0xa3, "XRC Send Last Immediate", Xrc, [REQUEST | SEND | LAST | PAYLOAD | XRCETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    XRC_SEND_ONLY = 0xa4, "XRC Send Only", Xrc, [REQUEST | SEND | ONLY | PAYLOAD | XRCETH | RECV_WQE | RECV_COMPLETION];
    XRC_SEND_ONLY_WITH_IMMEDIATE = 0xa5, "XRC Send Only Immediate", Xrc, [REQUEST | SEND | ONLY | PAYLOAD | XRCETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    XRC_RDMA_WRITE_FIRST = 0xa6, "XRC RDMA Write First", Xrc, [REQUEST | WRITE | FIRST | PAYLOAD | XRCETH | RETH];
    XRC_RDMA_WRITE_MIDDLE = 0xa7, "XRC RDMA Write Middle", Xrc, [REQUEST | WRITE | MIDDLE | PAYLOAD | XRCETH];
    XRC_RDMA_WRITE_LAST = 0xa8, "XRC RDMA Write Last", Xrc, [REQUEST | WRITE | LAST | PAYLOAD | XRCETH];
    XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xa9, "XRC RDMA Write Last Immediate", Xrc, [REQUEST | WRITE | LAST | PAYLOAD | XRCETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    XRC_RDMA_WRITE_ONLY = 0xaa, "XRC RDMA Write Only", Xrc, [REQUEST | WRITE | ONLY | PAYLOAD | XRCETH | RETH];
    XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xab, "XRC RDMA Write Only Immediate", Xrc, [REQUEST | WRITE | ONLY | PAYLOAD | XRCETH | RETH | IMMDT | RECV_WQE | RECV_COMPLETION];
    XRC_RDMA_READ_REQUEST = 0xac, "XRC RDMA Read Request", Xrc, [REQUEST | READ | ONLY | XRCETH | RETH];
    XRC_RDMA_READ_RESPONSE_FIRST = 0xad, "XRC RDMA Read Response First", Xrc, [RESPONSE | READ_RESPONSE | FIRST | PAYLOAD | AETH];
    XRC_RDMA_READ_RESPONSE_MIDDLE = 0xae, "XRC RDMA Read Response Middle", Xrc, [RESPONSE | READ_RESPONSE | MIDDLE | PAYLOAD];
    XRC_RDMA_READ_RESPONSE_LAST = 0xaf, "XRC RDMA Read Response Last", Xrc, [RESPONSE | READ_RESPONSE | LAST | PAYLOAD | AETH];
    XRC_RDMA_READ_RESPONSE_ONLY = 0xb0, "XRC RDMA Read Response Only", Xrc, [RESPONSE | READ_RESPONSE | ONLY | PAYLOAD | AETH];
    XRC_ACKNOWLEDGE = 0xb1, "XRC Acknowledge", Xrc, [RESPONSE | ACK | ONLY | AETH];
    XRC_ATOMIC_ACKNOWLEDGE = 0xb2, "XRC Atomic Acknowledge", Xrc, [RESPONSE | ACK | ONLY | AETH | ATOMIC_ACK_ETH];
    XRC_COMPARE_SWAP = 0xb3, "XRC Compare Swap", Xrc, [REQUEST | ATOMIC | ONLY | XRCETH | ATOMIC_ETH];
    XRC_FETCH_ADD = 0xb4, "XRC Fetch Add", Xrc, [REQUEST | ATOMIC | ONLY | XRCETH | ATOMIC_ETH];
    XRC_SEND_LAST_WITH_INVALIDATE = 0xb6, "XRC Send Last Invalidate", Xrc, [REQUEST | SEND | LAST | PAYLOAD | XRCETH | IETH | RECV_WQE | RECV_COMPLETION];
    XRC_SEND_ONLY_WITH_INVALIDATE = 0xb7, "XRC Send Only Invalidate", Xrc, [REQUEST | SEND | ONLY | PAYLOAD | XRCETH | IETH | RECV_WQE | RECV_COMPLETION];
    // RoCEv2 Congestion Notification Packet.
    CNP = 0x81, "CNP", Cnp, [ONLY | CNP_RSVD];
}

/// The table, indexed by opcode byte. `None` marks opcodes we do not speak.
pub static TABLE: [Option<OpcodeInfo>; 256] = build_table();

impl Opcode {
    /// What the table knows about this opcode, if anything.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The IBA name, or `"Unknown"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("Unknown", |i| i.name)
    }

    /// Every opcode in the table, in numeric order.
    pub fn all() -> impl Iterator<Item = (Opcode, &'static OpcodeInfo)> {
        TABLE
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|info| (Opcode(i as u8), info)))
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sweep the whole table: structural invariants every entry must satisfy.
    #[test]
    fn table_invariants() {
        let mut n = 0;
        for (op, info) in Opcode::all() {
            n += 1;
            let f = info.flags;
            // Exactly one of request/response (CNP is neither).
            if info.transport != Transport::Cnp {
                assert!(
                    f.contains(Flags::REQUEST) ^ f.contains(Flags::RESPONSE),
                    "{op:?}"
                );
            }
            // Exactly one position.
            let pos = [Flags::FIRST, Flags::MIDDLE, Flags::LAST, Flags::ONLY]
                .iter()
                .filter(|p| f.contains(**p))
                .count();
            assert_eq!(pos, 1, "{op:?}");
            // Transport matches the top bits.
            let tr = match op.0 >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                5 => Transport::Xrc,
                _ => unreachable!("{op:?}"),
            };
            assert_eq!(tr, info.transport, "{op:?}");
            // RETH exactly on WRITE FIRST/ONLY and READ requests.
            let want_reth =
                (f.contains(Flags::WRITE) && info.starts_message()) || f.contains(Flags::READ);
            assert_eq!(f.contains(Flags::RETH), want_reth, "{op:?}");
            // Immediate exactly when the name says so; same for invalidate.
            assert_eq!(
                f.contains(Flags::IMMDT),
                info.name.contains("Immediate"),
                "{op:?}"
            );
            assert_eq!(
                f.contains(Flags::IETH),
                info.name.contains("Invalidate"),
                "{op:?}"
            );
            // A receive completion only at the end of a message that uses a WQE.
            if f.contains(Flags::RECV_COMPLETION) {
                assert!(f.contains(Flags::RECV_WQE) && info.ends_message(), "{op:?}");
            }
            // Only UD carries DETH; only RC responses carry AETH.
            assert_eq!(
                f.contains(Flags::DETH),
                info.transport == Transport::Ud,
                "{op:?}"
            );
            if f.contains(Flags::AETH) {
                assert!(
                    matches!(info.transport, Transport::Rc | Transport::Xrc)
                        && f.contains(Flags::RESPONSE)
                );
            }
            // Every XRC request, and nothing else, carries an XRCETH.
            assert_eq!(
                f.contains(Flags::XRCETH),
                info.transport == Transport::Xrc && f.contains(Flags::REQUEST),
                "{op:?}"
            );
            // XRC is RC's group moved to 0xa0: same flags but the XRCETH.
            if info.transport == Transport::Xrc {
                let rc = Opcode(op.0 & 0x1f).info().expect("RC twin");
                assert_eq!(rc.transport, Transport::Rc, "{op:?}");
                assert_eq!(rc.flags.bits(), f.bits() & !Flags::XRCETH.bits(), "{op:?}");
                assert_eq!(&info.name[..3], "XRC");
                assert_eq!(&info.name[4..], &rc.name[3..], "{op:?}");
            }
            // The layout adds up.
            let sum = len::BTH
                + [
                    (Flags::RETH, len::RETH),
                    (Flags::AETH, len::AETH),
                    (Flags::ATOMIC_ETH, len::ATOMIC_ETH),
                    (Flags::ATOMIC_ACK_ETH, len::ATOMIC_ACK_ETH),
                    (Flags::IMMDT, len::IMMDT),
                    (Flags::IETH, len::IETH),
                    (Flags::DETH, len::DETH),
                    (Flags::CNP_RSVD, len::CNP_RSVD),
                    (Flags::XRCETH, len::XRCETH),
                ]
                .iter()
                .filter(|(fl, _)| f.contains(*fl))
                .map(|(_, l)| l)
                .sum::<usize>();
            assert_eq!(info.header_len as usize, sum, "{op:?}");
        }
        // RC 23 + ATOMIC WRITE, UC 12, UD 2, XRC 23, CNP.
        assert_eq!(n, 24 + 12 + 2 + 23 + 1);
    }

    #[test]
    fn layouts_match_iba() {
        let o = |op: Opcode| op.info().unwrap();
        assert_eq!(
            o(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).offsets.immdt,
            28
        );
        assert_eq!(o(Opcode::RC_ATOMIC_ACKNOWLEDGE).offsets.atomic_ack_eth, 16);
        assert_eq!(o(Opcode::RC_ATOMIC_ACKNOWLEDGE).header_len, 24);
        assert_eq!(o(Opcode::RC_COMPARE_SWAP).header_len, 40);
        assert_eq!(o(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE).offsets.immdt, 20);
        assert_eq!(o(Opcode::RC_SEND_ONLY_WITH_INVALIDATE).offsets.ieth, 12);
        assert_eq!(o(Opcode::CNP).header_len, 28);
        // BTH + RETH, then the 8-byte word.
        assert_eq!(o(Opcode::RC_ATOMIC_WRITE).header_len, 28);
        // XRC: the XRCETH right after the BTH, the rest moved down by 4.
        assert_eq!(o(Opcode::XRC_SEND_ONLY).offsets.xrceth, 12);
        assert_eq!(o(Opcode::XRC_SEND_ONLY).header_len, 16);
        assert_eq!(
            o(Opcode::XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).offsets.reth,
            16
        );
        assert_eq!(
            o(Opcode::XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).offsets.immdt,
            32
        );
        assert_eq!(o(Opcode::XRC_COMPARE_SWAP).offsets.atomic_eth, 16);
        assert_eq!(o(Opcode::XRC_COMPARE_SWAP).header_len, 44);
        assert_eq!(o(Opcode::XRC_ATOMIC_ACKNOWLEDGE).header_len, 24);
        assert!(Opcode(0xb5).info().is_none());
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x40).info().is_none());
        assert_eq!(format!("{:?}", Opcode(0x99)), "Unknown(0x99)");
    }
}
