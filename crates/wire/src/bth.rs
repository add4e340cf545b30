//! The Base Transport Header (IBA §9.2), 12 bytes, first in every packet.
//!
//! ```text
//!  0      opcode
//!  1      SE | MigReq | PadCnt(2) | TVer(4)
//!  2..4   P_Key
//!  4      FECN | BECN | reserved(6)     (masked to 0xff for the ICRC)
//!  5..8   DestQP (24)
//!  8      AckReq | reserved(7)
//!  9..12  PSN (24)
//! ```

use crate::field::*;
use crate::opcode::{len, Opcode};
use crate::psn::Psn;
use crate::{check_len, Error, Result};

/// Byte offsets of the BTH fields.
pub mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const FECN_BECN: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK_REQ: usize = 8;
    pub const PSN: usize = 9;
}

/// softrdma's selective-repeat capability, bit 0 of BTH byte 4 (one of the
/// six reserved bits after FECN and BECN). IBA has a sender transmit the
/// reserved bits as 0 and a receiver ignore them, and the ICRC masks the
/// whole byte, so a peer that knows nothing of it (rxe, an RNIC) accepts
/// the packet unchanged. A requester sets it while it offers selective
/// repeat; a softrdma responder that accepts sets it on its responses
/// (docs/CONGESTION.md, "Selective repeat").
pub const SOFTRDMA_SR: u8 = 0x01;

/// The default partition key, full membership.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A read-only view of a BTH.
#[derive(Debug, Clone, Copy)]
pub struct Bth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    pub const LEN: usize = len::BTH;

    /// Wrap `buf`, checking that it holds a whole BTH.
    pub fn new_checked(buf: T) -> Result<Self> {
        check_len("BTH", buf.as_ref(), Self::LEN)?;
        Ok(Bth { buf })
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    #[inline]
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    #[inline]
    pub fn migreq(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    #[inline]
    pub fn pad(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    #[inline]
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    #[inline]
    pub fn pkey(&self) -> u16 {
        u16_at(self.b(), field::PKEY)
    }
    #[inline]
    pub fn fecn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x80 != 0
    }
    #[inline]
    pub fn becn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x40 != 0
    }
    /// The [`SOFTRDMA_SR`] capability bit.
    #[inline]
    pub fn softrdma_sr(&self) -> bool {
        self.b()[field::FECN_BECN] & SOFTRDMA_SR != 0
    }
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        u24_at(self.b(), field::DEST_QP)
    }
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.b(), field::PSN))
    }
}

/// A BTH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    pub migreq: bool,
    /// Pad count, 0..=3: bytes after the payload that round it to 4.
    pub pad: u8,
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl Default for BthRepr {
    fn default() -> Self {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            migreq: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0,
            ack_req: false,
            psn: Psn::new(0),
        }
    }
}

impl BthRepr {
    pub const LEN: usize = len::BTH;

    /// Read a BTH; rejects a transport version other than 0.
    pub fn parse<T: AsRef<[u8]>>(v: &Bth<T>) -> Result<BthRepr> {
        if v.tver() != 0 {
            return Err(Error::BadTver(v.tver()));
        }
        Ok(BthRepr {
            opcode: v.opcode(),
            solicited: v.solicited(),
            migreq: v.migreq(),
            pad: v.pad(),
            pkey: v.pkey(),
            fecn: v.fecn(),
            becn: v.becn(),
            dest_qp: v.dest_qp(),
            ack_req: v.ack_req(),
            psn: v.psn(),
        })
    }

    /// Write into the first 12 bytes of `buf` (panics if shorter: a caller
    /// bug, never a wire input). Reserved bits go out as zero.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..len::BTH];
        b[field::OPCODE] = self.opcode.0;
        b[field::FLAGS] =
            (u8::from(self.solicited) << 7) | (u8::from(self.migreq) << 6) | ((self.pad & 3) << 4);
        put_u16(b, field::PKEY, self.pkey);
        b[field::FECN_BECN] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        put_u24(b, field::DEST_QP, self.dest_qp);
        b[field::ACK_REQ] = u8::from(self.ack_req) << 7;
        put_u24(b, field::PSN, self.psn.value());
    }
}
