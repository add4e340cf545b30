//! A whole InfiniBand transport packet as RoCEv2 carries it in a UDP
//! datagram: BTH, extension headers, payload, pad, ICRC.
//!
//! [`Packet`] is the checked view; its constructor validates everything the
//! accessors rely on (known opcode, lengths, pad), so a packet that passes
//! can be read without further checks. [`PacketRepr`] is the value form. It
//! emits only the headers: the payload is written once by the caller, straight
//! from registered memory into the frame, and the ICRC is computed last over
//! the finished bytes.

use crate::bth::{Bth, BthRepr};
use crate::ext::*;
use crate::opcode::{len, Flags, Opcode, OpcodeInfo};
use crate::{check_len, Error, Result};

/// A checked view of a RoCEv2 UDP payload.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Check that `buf` is a complete packet of a known opcode.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        check_len("BTH", b, len::BTH)?;
        let op = Opcode(b[0]);
        let info = op.info().ok_or(Error::UnknownOpcode(op.0))?;
        let tver = b[1] & 0x0f;
        if tver != 0 {
            return Err(Error::BadTver(tver));
        }
        let hdr = info.header_len as usize;
        check_len("transport headers and ICRC", b, hdr + len::ICRC)?;
        let pad = ((b[1] >> 4) & 3) as usize;
        let body = b.len() - hdr - len::ICRC;
        if pad > body {
            return Err(Error::BadPad {
                pad: pad as u8,
                payload: body,
            });
        }
        // An opcode without payload (ACK, READ request, atomics, CNP) ends at
        // its ICRC: trailing bytes would parse into a repr that fails
        // `PacketRepr::validate` and cannot be emitted again.
        if body > 0 && !info.has(Flags::PAYLOAD) {
            return Err(Error::BadField {
                what: "payload length for an opcode without payload",
                value: body as u64,
            });
        }
        Ok(Packet { buf, info })
    }

    /// The opcode's table entry.
    #[inline]
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    #[inline]
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_checked(&self.buf.as_ref()[..len::BTH]).expect("checked")
    }

    #[inline]
    fn ext(&self, flag: Flags, off: u8, n: usize) -> Option<&[u8]> {
        if self.info.has(flag) {
            let off = off as usize;
            Some(&self.buf.as_ref()[off..off + n])
        } else {
            None
        }
    }

    pub fn reth(&self) -> Option<RethRepr> {
        self.ext(Flags::RETH, self.info.offsets.reth, len::RETH)
            .and_then(|b| RethRepr::parse_bytes(b).ok())
    }
    pub fn aeth(&self) -> Option<AethRepr> {
        self.ext(Flags::AETH, self.info.offsets.aeth, len::AETH)
            .and_then(|b| AethRepr::parse_bytes(b).ok())
    }
    pub fn atomic_eth(&self) -> Option<AtomicEthRepr> {
        self.ext(
            Flags::ATOMIC_ETH,
            self.info.offsets.atomic_eth,
            len::ATOMIC_ETH,
        )
        .and_then(|b| AtomicEthRepr::parse_bytes(b).ok())
    }
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEthRepr> {
        self.ext(
            Flags::ATOMIC_ACK_ETH,
            self.info.offsets.atomic_ack_eth,
            len::ATOMIC_ACK_ETH,
        )
        .and_then(|b| AtomicAckEthRepr::parse_bytes(b).ok())
    }
    pub fn immdt(&self) -> Option<ImmDtRepr> {
        self.ext(Flags::IMMDT, self.info.offsets.immdt, len::IMMDT)
            .and_then(|b| ImmDtRepr::parse_bytes(b).ok())
    }
    pub fn ieth(&self) -> Option<IethRepr> {
        self.ext(Flags::IETH, self.info.offsets.ieth, len::IETH)
            .and_then(|b| IethRepr::parse_bytes(b).ok())
    }
    pub fn deth(&self) -> Option<DethRepr> {
        self.ext(Flags::DETH, self.info.offsets.deth, len::DETH)
            .and_then(|b| DethRepr::parse_bytes(b).ok())
    }
    pub fn xrceth(&self) -> Option<XrcEthRepr> {
        self.ext(Flags::XRCETH, self.info.offsets.xrceth, len::XRCETH)
            .and_then(|b| XrcEthRepr::parse_bytes(b).ok())
    }

    /// The payload, without pad and ICRC.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let pad = ((b[1] >> 4) & 3) as usize;
        &b[self.info.header_len as usize..b.len() - len::ICRC - pad]
    }

    /// The pad bytes (normally zero).
    #[inline]
    pub fn pad_bytes(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let pad = ((b[1] >> 4) & 3) as usize;
        &b[b.len() - len::ICRC - pad..b.len() - len::ICRC]
    }

    /// The ICRC carried at the end (little-endian on the wire).
    #[inline]
    pub fn icrc(&self) -> u32 {
        let b = self.buf.as_ref();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }

    /// Everything the ICRC covers after the BTH: headers, payload, pad.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn into_inner(self) -> T {
        self.buf
    }
}

/// The extension headers of one packet; which are present follows from the
/// opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ExtRepr {
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
    pub xrceth: Option<XrcEthRepr>,
}

/// A packet as a value: headers plus the payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    pub bth: BthRepr,
    pub ext: ExtRepr,
    /// Payload bytes, excluding pad and ICRC.
    pub payload_len: usize,
}

impl PacketRepr {
    /// Read every header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<PacketRepr> {
        let bth = BthRepr::parse(&p.bth())?;
        Ok(PacketRepr {
            bth,
            ext: ExtRepr {
                deth: p.deth(),
                reth: p.reth(),
                atomic_eth: p.atomic_eth(),
                aeth: p.aeth(),
                atomic_ack_eth: p.atomic_ack_eth(),
                immdt: p.immdt(),
                ieth: p.ieth(),
                xrceth: p.xrceth(),
            },
            payload_len: p.payload().len(),
        })
    }

    /// The opcode's table entry (`None` for an opcode we do not speak).
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        self.bth.opcode.info()
    }

    /// Check that the headers present are exactly those the opcode carries.
    pub fn validate(&self) -> Result<&'static OpcodeInfo> {
        let info = self.info().ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        let e = &self.ext;
        let pairs = [
            (Flags::DETH, e.deth.is_some(), "DETH"),
            (Flags::RETH, e.reth.is_some(), "RETH"),
            (Flags::ATOMIC_ETH, e.atomic_eth.is_some(), "AtomicETH"),
            (Flags::AETH, e.aeth.is_some(), "AETH"),
            (
                Flags::ATOMIC_ACK_ETH,
                e.atomic_ack_eth.is_some(),
                "AtomicAckETH",
            ),
            (Flags::IMMDT, e.immdt.is_some(), "ImmDt"),
            (Flags::IETH, e.ieth.is_some(), "IETH"),
            (Flags::XRCETH, e.xrceth.is_some(), "XRCETH"),
        ];
        for (flag, present, what) in pairs {
            if info.has(flag) != present {
                return Err(Error::BadField {
                    what,
                    value: present as u64,
                });
            }
        }
        if self.payload_len > 0 && !info.has(Flags::PAYLOAD) {
            return Err(Error::BadField {
                what: "payload length for an opcode without payload",
                value: self.payload_len as u64,
            });
        }
        Ok(info)
    }

    /// BTH plus extension headers, in bytes.
    pub fn header_len(&self) -> usize {
        self.info().map_or(len::BTH, |i| i.header_len as usize)
    }

    /// Pad bytes needed after the payload.
    pub fn pad_len(&self) -> usize {
        (4 - (self.payload_len & 3)) & 3
    }

    /// Whole UDP payload length: headers, payload, pad and ICRC.
    pub fn wire_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_len() + len::ICRC
    }

    /// Write BTH and extension headers into the start of `buf` and zero the
    /// pad. The BTH pad count is derived from `payload_len`. The payload goes
    /// at `buf[header_len()..]`, the ICRC in the last 4 bytes
    /// (see [`crate::icrc`]). Panics if `buf` is shorter than [`Self::wire_len`]
    /// or the headers do not match the opcode: both are caller bugs.
    pub fn emit_headers(&self, buf: &mut [u8]) {
        let info = self
            .validate()
            .expect("PacketRepr does not match its opcode");
        let wire = self.wire_len();
        let buf = &mut buf[..wire];
        let mut bth = self.bth;
        bth.pad = self.pad_len() as u8;
        bth.emit(buf);
        let o = info.offsets;
        let e = &self.ext;
        if let Some(h) = e.deth {
            h.emit(&mut buf[o.deth as usize..]);
        }
        if let Some(h) = e.xrceth {
            h.emit(&mut buf[o.xrceth as usize..]);
        }
        if let Some(h) = e.reth {
            h.emit(&mut buf[o.reth as usize..]);
        }
        if let Some(h) = e.atomic_eth {
            h.emit(&mut buf[o.atomic_eth as usize..]);
        }
        if let Some(h) = e.aeth {
            h.emit(&mut buf[o.aeth as usize..]);
        }
        if let Some(h) = e.atomic_ack_eth {
            h.emit(&mut buf[o.atomic_ack_eth as usize..]);
        }
        if let Some(h) = e.immdt {
            h.emit(&mut buf[o.immdt as usize..]);
        }
        if let Some(h) = e.ieth {
            h.emit(&mut buf[o.ieth as usize..]);
        }
        if info.has(Flags::CNP_RSVD) {
            buf[len::BTH..len::BTH + len::CNP_RSVD].fill(0);
        }
        let pad_at = info.header_len as usize + self.payload_len;
        buf[pad_at..wire - len::ICRC].fill(0);
    }

    /// Emit headers, copy `payload` after them, and leave the ICRC bytes
    /// zero. Convenience for tests and tools; the data path writes the
    /// payload itself.
    pub fn emit_with_payload(&self, buf: &mut [u8], payload: &[u8]) {
        assert_eq!(payload.len(), self.payload_len);
        self.emit_headers(buf);
        let h = self.header_len();
        buf[h..h + payload.len()].copy_from_slice(payload);
        let w = self.wire_len();
        buf[w - len::ICRC..w].fill(0);
    }
}
