//! The extension transport headers that follow the BTH.
//!
//! Each header is declared once, as a field list, and the [`header!`] macro
//! turns it into a zero-copy view (`Reth<T>`: checked constructor, then
//! panic-free getters) and a plain value
//! (`RethRepr`) that parses from and emits into a buffer.

use crate::field::*;
use crate::opcode::len;
use crate::{check_len, Result};

macro_rules! header {
    (
        $(#[$doc:meta])*
        $view:ident / $repr:ident, $len:expr, $what:expr;
        $( $(#[$fdoc:meta])* $field:ident : $ty:ident @ $off:expr => $get:ident / $put:ident ),* $(,)?
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $view<T: AsRef<[u8]>> {
            buf: T,
        }

        impl<T: AsRef<[u8]>> $view<T> {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Wrap `buf`, checking that it holds the whole header.
            pub fn new_checked(buf: T) -> Result<Self> {
                check_len($what, buf.as_ref(), Self::LEN)?;
                Ok($view { buf })
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buf
            }

            $(
                $(#[$fdoc])*
                #[inline]
                pub fn $field(&self) -> $ty {
                    $get(self.buf.as_ref(), $off) as $ty
                }
            )*
        }

        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
        pub struct $repr {
            $( $(#[$fdoc])* pub $field: $ty, )*
        }

        impl $repr {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Read the header from a checked view.
            pub fn parse<T: AsRef<[u8]>>(v: &$view<T>) -> Self {
                $repr { $( $field: v.$field(), )* }
            }

            /// Read the header from the start of `buf`.
            pub fn parse_bytes(buf: &[u8]) -> Result<Self> {
                Ok(Self::parse(&$view::new_checked(buf)?))
            }

            /// Write the header into the start of `buf`, which must hold
            /// [`Self::LEN`] bytes (a programming error otherwise: panics).
            pub fn emit(&self, buf: &mut [u8]) {
                let b = &mut buf[..$len];
                b.fill(0); // reserved bits go out as zero
                $( $put(b, $off, self.$field as _); )*
            }
        }
    };
}

fn get_u8(b: &[u8], at: usize) -> u8 {
    b[at]
}
fn put_u8(b: &mut [u8], at: usize, v: u8) {
    b[at] = v;
}

header! {
    /// RDMA Extended Transport Header: the remote buffer of a WRITE or READ.
    Reth / RethRepr, len::RETH, "RETH";
    /// Remote virtual address.
    va: u64 @ 0 => u64_at / put_u64,
    /// Remote key.
    rkey: u32 @ 8 => u32_at / put_u32,
    /// Length of the whole message (not of this packet).
    dma_len: u32 @ 12 => u32_at / put_u32,
}

header! {
    /// ACK Extended Transport Header: syndrome and message sequence number.
    Aeth / AethRepr, len::AETH, "AETH";
    /// Raw syndrome byte; see [`Syndrome`].
    syndrome: u8 @ 0 => get_u8 / put_u8,
    /// 24-bit message sequence number.
    msn: u32 @ 1 => u24_at / put_u24,
}

header! {
    /// Atomic Extended Transport Header: target and operands.
    AtomicEth / AtomicEthRepr, len::ATOMIC_ETH, "AtomicETH";
    va: u64 @ 0 => u64_at / put_u64,
    rkey: u32 @ 8 => u32_at / put_u32,
    /// Swap value (compare-swap) or addend (fetch-add).
    swap_add: u64 @ 12 => u64_at / put_u64,
    /// Compare value (compare-swap only).
    compare: u64 @ 20 => u64_at / put_u64,
}

header! {
    /// Atomic Acknowledge Extended Transport Header: the value before the op.
    AtomicAckEth / AtomicAckEthRepr, len::ATOMIC_ACK_ETH, "AtomicAckETH";
    orig: u64 @ 0 => u64_at / put_u64,
}

header! {
    /// Immediate data, carried opaque (verbs hands it over in network order).
    ImmDt / ImmDtRepr, len::IMMDT, "ImmDt";
    imm: u32 @ 0 => u32_at / put_u32,
}

header! {
    /// Invalidate Extended Transport Header: the rkey to invalidate.
    Ieth / IethRepr, len::IETH, "IETH";
    rkey: u32 @ 0 => u32_at / put_u32,
}

header! {
    /// XRC Extended Transport Header: the XRC SRQ at the responder that a
    /// request is for (IBA Annex A14). 8 reserved bits, then 24 bits.
    XrcEth / XrcEthRepr, len::XRCETH, "XRCETH";
    /// 24-bit XRC SRQ number (the reserved byte before it is emitted as 0).
    srqn: u32 @ 1 => u24_at / put_u24,
}

header! {
    /// Datagram Extended Transport Header (UD).
    Deth / DethRepr, len::DETH, "DETH";
    qkey: u32 @ 0 => u32_at / put_u32,
    /// 24-bit source QP number (the reserved byte before it is emitted as 0).
    src_qp: u32 @ 5 => u24_at / put_u24,
}

/// NAK codes carried in an AETH syndrome (IBA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// A reserved code, kept so parsing stays lossless.
    Reserved(u8),
}

impl NakCode {
    pub const fn from_bits(v: u8) -> NakCode {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            x => NakCode::Reserved(x & 0x1f),
        }
    }

    pub const fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(x) => x & 0x1f,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved NAK code",
        }
    }
}

/// The meaning of an AETH syndrome byte (IBA §9.7.5.1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count (0x1f: no
    /// flow control).
    Ack { credits: u8 },
    /// Receiver not ready; `timer` is the RNR NAK timer code (0..31).
    RnrNak { timer: u8 },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// The reserved syndrome type (0b10) or the reserved top bit set.
    Reserved(u8),
}

impl Syndrome {
    /// The "unlimited credits" ACK rxe and most RNICs send.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credits: 0x1f };

    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        let v = b & 0x1f;
        match (b >> 5) & 0x3 {
            0 => Syndrome::Ack { credits: v },
            1 => Syndrome::RnrNak { timer: v },
            3 => Syndrome::Nak(NakCode::from_bits(v)),
            _ => Syndrome::Reserved(b),
        }
    }

    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.bits(),
            Syndrome::Reserved(b) => b,
        }
    }
}

impl core::fmt::Display for Syndrome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Syndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            Syndrome::RnrNak { timer } => write!(f, "RNR-NAK timer={timer}"),
            Syndrome::Nak(c) => write!(f, "NAK {}", c.name()),
            Syndrome::Reserved(b) => write!(f, "reserved syndrome 0x{b:02x}"),
        }
    }
}

impl AethRepr {
    /// The decoded syndrome.
    pub fn kind(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome)
    }

    /// An AETH from a decoded syndrome and an MSN.
    pub fn new(s: Syndrome, msn: u32) -> AethRepr {
        AethRepr {
            syndrome: s.to_byte(),
            msn: msn & 0x00ff_ffff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::ACK_UNLIMITED);
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
    }

    #[test]
    fn views_and_reprs_agree() {
        let mut b = [0u8; 28];
        let r = AtomicEthRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0xdead_beef,
            swap_add: 7,
            compare: u64::MAX,
        };
        r.emit(&mut b);
        let v = AtomicEth::new_checked(&b[..]).unwrap();
        assert_eq!(v.va(), r.va);
        assert_eq!(AtomicEthRepr::parse(&v), r);
        assert!(AtomicEth::new_checked(&b[..27]).is_err());
        let d = DethRepr {
            qkey: 0x1111_1111,
            src_qp: 0xab_cdef,
        };
        let mut db = [0xffu8; 8];
        d.emit(&mut db);
        assert_eq!(db, [0x11, 0x11, 0x11, 0x11, 0x00, 0xab, 0xcd, 0xef]);
    }
}
