//! A captured frame turned into what an RDMA engineer reads: addresses,
//! opcode, QP, PSN and every extension header, plus whether the ICRC holds.
//! This is the engine of `softrdma decode`; it never panics, whatever the
//! bytes, and says in one line why a packet could not be read.

use core::fmt::{self, Write as _};
use std::net::SocketAddr;

use crate::frame::{parse_ethernet_udp, UdpFrame};
use crate::opcode::len;
use crate::packet::{Packet, PacketRepr};
use crate::{icrc, Error};

/// The ICRC verdict for one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcCheck {
    pub carried: u32,
    pub computed: u32,
}

impl IcrcCheck {
    pub fn ok(&self) -> bool {
        self.carried == self.computed
    }
}

/// What one frame turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dissection {
    /// Not a UDP datagram to port 4791.
    NotRoce,
    /// A RoCEv2 datagram whose layers could not all be read.
    Malformed {
        /// Addresses, when the IP and UDP headers were readable.
        addrs: Option<(SocketAddr, SocketAddr)>,
        error: Error,
    },
    /// A RoCEv2 packet.
    Roce {
        src: SocketAddr,
        dst: SocketAddr,
        repr: PacketRepr,
        icrc: IcrcCheck,
    },
}

fn addrs(f: &UdpFrame<'_>) -> (SocketAddr, SocketAddr) {
    (
        SocketAddr::new(f.ip.src(), f.udp.src_port),
        SocketAddr::new(f.ip.dst(), f.udp.dst_port),
    )
}

/// Dissect one Ethernet frame.
pub fn dissect(frame: &[u8]) -> Dissection {
    let f = match parse_ethernet_udp(frame) {
        Ok(Some(f)) if f.is_rocev2() => f,
        Ok(_) => return Dissection::NotRoce,
        // Below UDP we cannot tell whether it was meant to be RoCE; a frame
        // cut short before its UDP header is reported, not silently skipped.
        Err(error) => {
            return Dissection::Malformed { addrs: None, error };
        }
    };
    let (src, dst) = addrs(&f);
    let malformed = |error| Dissection::Malformed {
        addrs: Some((src, dst)),
        error,
    };
    let pkt = match Packet::new_checked(f.payload) {
        Ok(p) => p,
        Err(e) => return malformed(e),
    };
    let repr = match PacketRepr::parse(&pkt) {
        Ok(r) => r,
        Err(e) => return malformed(e),
    };
    let n = f.payload.len();
    let computed = icrc::compute(f.ip_header, f.udp_header, &f.payload[..n - len::ICRC]);
    Dissection::Roce {
        src,
        dst,
        repr,
        icrc: IcrcCheck {
            carried: pkt.icrc(),
            computed,
        },
    }
}

/// One text line for a dissected frame (without the frame number).
pub struct Line<'a>(pub &'a Dissection);

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Dissection::NotRoce => f.write_str("not RoCEv2"),
            Dissection::Malformed { addrs, error } => {
                if let Some((s, d)) = addrs {
                    write!(f, "{s} > {d} ")?;
                }
                write!(f, "MALFORMED: {error}")
            }
            Dissection::Roce {
                src,
                dst,
                repr,
                icrc,
            } => {
                let b = &repr.bth;
                write!(
                    f,
                    "{src} > {dst} {} qp=0x{:06x} psn={}",
                    b.opcode.name(),
                    b.dest_qp,
                    b.psn.value()
                )?;
                if b.ack_req {
                    f.write_str(" ackreq")?;
                }
                if b.solicited {
                    f.write_str(" se")?;
                }
                if b.fecn {
                    f.write_str(" fecn")?;
                }
                if b.becn {
                    f.write_str(" becn")?;
                }
                if b.pkey != crate::bth::DEFAULT_PKEY {
                    write!(f, " pkey=0x{:04x}", b.pkey)?;
                }
                let e = &repr.ext;
                if let Some(h) = e.deth {
                    write!(f, " DETH qkey=0x{:08x} srcqp=0x{:06x}", h.qkey, h.src_qp)?;
                }
                if let Some(h) = e.reth {
                    write!(
                        f,
                        " RETH va=0x{:x} rkey=0x{:08x} len={}",
                        h.va, h.rkey, h.dma_len
                    )?;
                }
                if let Some(h) = e.atomic_eth {
                    write!(
                        f,
                        " AtomicETH va=0x{:x} rkey=0x{:08x} swap_add=0x{:x} compare=0x{:x}",
                        h.va, h.rkey, h.swap_add, h.compare
                    )?;
                }
                if let Some(h) = e.aeth {
                    write!(f, " AETH {} msn={}", h.kind(), h.msn)?;
                }
                if let Some(h) = e.atomic_ack_eth {
                    write!(f, " AtomicAckETH orig=0x{:x}", h.orig)?;
                }
                if let Some(h) = e.immdt {
                    write!(f, " imm=0x{:08x}", h.imm)?;
                }
                if let Some(h) = e.ieth {
                    write!(f, " IETH rkey=0x{:08x}", h.rkey)?;
                }
                write!(f, " payload={}", repr.payload_len)?;
                if icrc.ok() {
                    f.write_str(" ICRC ok")
                } else {
                    write!(
                        f,
                        " ICRC BAD (carried 0x{:08x}, computed 0x{:08x})",
                        icrc.carried, icrc.computed
                    )
                }
            }
        }
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One JSON object (a JSON-lines record) for a dissected frame.
pub fn to_json(number: usize, d: &Dissection) -> String {
    let mut o = String::with_capacity(256);
    let _ = write!(o, "{{\"frame\":{number}");
    let push_addrs = |o: &mut String, s: &SocketAddr, d: &SocketAddr| {
        o.push_str(",\"src\":");
        json_str(o, &s.ip().to_string());
        let _ = write!(o, ",\"sport\":{},\"dst\":", s.port());
        json_str(o, &d.ip().to_string());
        let _ = write!(o, ",\"dport\":{}", d.port());
    };
    match d {
        Dissection::NotRoce => o.push_str(",\"roce\":false"),
        Dissection::Malformed { addrs, error } => {
            if let Some((s, d)) = addrs {
                push_addrs(&mut o, s, d);
            }
            o.push_str(",\"malformed\":");
            json_str(&mut o, &error.to_string());
        }
        Dissection::Roce {
            src,
            dst,
            repr,
            icrc,
        } => {
            push_addrs(&mut o, src, dst);
            let b = &repr.bth;
            o.push_str(",\"opcode\":");
            json_str(&mut o, b.opcode.name());
            let _ = write!(
                o,
                ",\"opcode_num\":{},\"dest_qp\":{},\"psn\":{},\"ack_req\":{},\"se\":{},\"migreq\":{},\"pad\":{},\"pkey\":{},\"fecn\":{},\"becn\":{}",
                b.opcode.0,
                b.dest_qp,
                b.psn.value(),
                b.ack_req,
                b.solicited,
                b.migreq,
                b.pad,
                b.pkey,
                b.fecn,
                b.becn
            );
            let e = &repr.ext;
            if let Some(h) = e.deth {
                let _ = write!(
                    o,
                    ",\"deth\":{{\"qkey\":{},\"src_qp\":{}}}",
                    h.qkey, h.src_qp
                );
            }
            if let Some(h) = e.reth {
                let _ = write!(
                    o,
                    ",\"reth\":{{\"va\":{},\"rkey\":{},\"dma_len\":{}}}",
                    h.va, h.rkey, h.dma_len
                );
            }
            if let Some(h) = e.atomic_eth {
                let _ = write!(
                    o,
                    ",\"atomic_eth\":{{\"va\":{},\"rkey\":{},\"swap_add\":{},\"compare\":{}}}",
                    h.va, h.rkey, h.swap_add, h.compare
                );
            }
            if let Some(h) = e.aeth {
                let _ = write!(o, ",\"aeth\":{{\"syndrome\":{},\"kind\":", h.syndrome);
                json_str(&mut o, &h.kind().to_string());
                let _ = write!(o, ",\"msn\":{}}}", h.msn);
            }
            if let Some(h) = e.atomic_ack_eth {
                let _ = write!(o, ",\"atomic_ack_eth\":{{\"orig\":{}}}", h.orig);
            }
            if let Some(h) = e.immdt {
                let _ = write!(o, ",\"imm\":{}", h.imm);
            }
            if let Some(h) = e.ieth {
                let _ = write!(o, ",\"ieth\":{{\"rkey\":{}}}", h.rkey);
            }
            let _ = write!(
                o,
                ",\"payload_len\":{},\"icrc_ok\":{},\"icrc_carried\":{},\"icrc_computed\":{}",
                repr.payload_len,
                icrc.ok(),
                icrc.carried,
                icrc.computed
            );
        }
    }
    o.push('}');
    o
}
