//! Ethernet, IPv4, IPv6 and UDP: the layers under RoCEv2.
//!
//! The stack itself sends and receives UDP datagrams through the kernel and
//! never builds these headers for the network; they exist so that captures
//! can be read (`softrdma decode`), so that our own traffic can be written
//! into pcap files with the same bytes a real link would carry, and so that
//! the ICRC, which covers the IP and UDP headers, can be computed.

use crate::field::*;
use crate::{check_len, Error, Result, ROCEV2_UDP_PORT};

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const IPPROTO_UDP: u8 = 17;
/// The most UDP payload one IPv4 datagram carries (65,535 - 20 - 8).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;

/// An Ethernet II header, optionally with one 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// The 802.1Q tag control information, if the frame is tagged.
    pub vlan_tci: Option<u16>,
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parse the header; returns it and its length.
    pub fn parse(b: &[u8]) -> Result<(EthernetRepr, usize)> {
        check_len("Ethernet header", b, 14)?;
        let mut dst = [0; 6];
        let mut src = [0; 6];
        dst.copy_from_slice(&b[0..6]);
        src.copy_from_slice(&b[6..12]);
        let t = u16_at(b, 12);
        if t == ETHERTYPE_VLAN {
            check_len("802.1Q tagged Ethernet header", b, 18)?;
            Ok((
                EthernetRepr {
                    dst,
                    src,
                    vlan_tci: Some(u16_at(b, 14)),
                    ethertype: u16_at(b, 16),
                },
                18,
            ))
        } else {
            Ok((
                EthernetRepr {
                    dst,
                    src,
                    vlan_tci: None,
                    ethertype: t,
                },
                14,
            ))
        }
    }

    pub fn header_len(&self) -> usize {
        if self.vlan_tci.is_some() {
            18
        } else {
            14
        }
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0..6].copy_from_slice(&self.dst);
        b[6..12].copy_from_slice(&self.src);
        match self.vlan_tci {
            Some(tci) => {
                put_u16(b, 12, ETHERTYPE_VLAN);
                put_u16(b, 14, tci);
                put_u16(b, 16, self.ethertype);
            }
            None => put_u16(b, 12, self.ethertype),
        }
    }
}

/// An IPv4 header without options (RoCEv2 senders do not use them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// DSCP and ECN.
    pub tos: u8,
    pub total_len: u16,
    pub ident: u16,
    /// Flags (DF = 0x4000, MF = 0x2000) and fragment offset.
    pub flags_frag: u16,
    pub ttl: u8,
    pub protocol: u8,
    pub checksum: u16,
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

impl Ipv4Repr {
    pub const LEN: usize = 20;
    pub const DF: u16 = 0x4000;

    /// Parse a header; options are skipped (their length is returned).
    pub fn parse(b: &[u8]) -> Result<(Ipv4Repr, usize)> {
        check_len("IPv4 header", b, 20)?;
        let v = b[0] >> 4;
        if v != 4 {
            return Err(Error::BadIpVersion(v));
        }
        let ihl = ((b[0] & 0x0f) as usize) * 4;
        if ihl < 20 {
            return Err(Error::BadField {
                what: "IPv4 IHL",
                value: (b[0] & 0x0f) as u64,
            });
        }
        check_len("IPv4 header with options", b, ihl)?;
        let mut src = [0; 4];
        let mut dst = [0; 4];
        src.copy_from_slice(&b[12..16]);
        dst.copy_from_slice(&b[16..20]);
        Ok((
            Ipv4Repr {
                tos: b[1],
                total_len: u16_at(b, 2),
                ident: u16_at(b, 4),
                flags_frag: u16_at(b, 6),
                ttl: b[8],
                protocol: b[9],
                checksum: u16_at(b, 10),
                src,
                dst,
            },
            ihl,
        ))
    }

    /// Emit the 20-byte header with `self.checksum` as is.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = 0x45;
        b[1] = self.tos;
        put_u16(b, 2, self.total_len);
        put_u16(b, 4, self.ident);
        put_u16(b, 6, self.flags_frag);
        b[8] = self.ttl;
        b[9] = self.protocol;
        put_u16(b, 10, self.checksum);
        b[12..16].copy_from_slice(&self.src);
        b[16..20].copy_from_slice(&self.dst);
    }

    /// The header checksum these fields call for.
    pub fn compute_checksum(&self) -> u16 {
        let mut h = [0u8; 20];
        let mut me = *self;
        me.checksum = 0;
        me.emit(&mut h);
        !fold(sum16(&h, 0))
    }
}

/// An IPv6 fixed header (no extension headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    pub traffic_class: u8,
    pub flow_label: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

impl Ipv6Repr {
    pub const LEN: usize = 40;

    pub fn parse(b: &[u8]) -> Result<Ipv6Repr> {
        check_len("IPv6 header", b, 40)?;
        let v = b[0] >> 4;
        if v != 6 {
            return Err(Error::BadIpVersion(v));
        }
        let w = u32_at(b, 0);
        let mut src = [0; 16];
        let mut dst = [0; 16];
        src.copy_from_slice(&b[8..24]);
        dst.copy_from_slice(&b[24..40]);
        Ok(Ipv6Repr {
            traffic_class: ((w >> 20) & 0xff) as u8,
            flow_label: w & 0x000f_ffff,
            payload_len: u16_at(b, 4),
            next_header: b[6],
            hop_limit: b[7],
            src,
            dst,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        let w =
            (6u32 << 28) | ((self.traffic_class as u32) << 20) | (self.flow_label & 0x000f_ffff);
        put_u32(b, 0, w);
        put_u16(b, 4, self.payload_len);
        b[6] = self.next_header;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src);
        b[24..40].copy_from_slice(&self.dst);
    }
}

/// Either IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    pub fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => Ipv4Repr::LEN,
            IpRepr::V6(_) => Ipv6Repr::LEN,
        }
    }

    pub fn emit(&self, b: &mut [u8]) {
        match self {
            IpRepr::V4(r) => r.emit(b),
            IpRepr::V6(r) => r.emit(b),
        }
    }

    pub fn src(&self) -> std::net::IpAddr {
        match self {
            IpRepr::V4(r) => std::net::Ipv4Addr::from(r.src).into(),
            IpRepr::V6(r) => std::net::Ipv6Addr::from(r.src).into(),
        }
    }

    pub fn dst(&self) -> std::net::IpAddr {
        match self {
            IpRepr::V4(r) => std::net::Ipv4Addr::from(r.dst).into(),
            IpRepr::V6(r) => std::net::Ipv6Addr::from(r.dst).into(),
        }
    }
}

/// A UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    /// Header plus payload.
    pub len: u16,
    /// 0 means "not computed" (what rxe sends).
    pub checksum: u16,
}

impl UdpRepr {
    pub const LEN: usize = 8;

    pub fn parse(b: &[u8]) -> Result<UdpRepr> {
        check_len("UDP header", b, 8)?;
        Ok(UdpRepr {
            src_port: u16_at(b, 0),
            dst_port: u16_at(b, 2),
            len: u16_at(b, 4),
            checksum: u16_at(b, 6),
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        put_u16(b, 0, self.src_port);
        put_u16(b, 2, self.dst_port);
        put_u16(b, 4, self.len);
        put_u16(b, 6, self.checksum);
    }

    /// The UDP checksum over the IP pseudo-header, this header and
    /// `payload` (0 is sent as 0xffff, as RFC 768 requires).
    pub fn compute_checksum(&self, ip: &IpRepr, payload: &[u8]) -> u16 {
        let mut acc = 0u32;
        match ip {
            IpRepr::V4(r) => {
                acc = sum16(&r.src, acc);
                acc = sum16(&r.dst, acc);
                acc += IPPROTO_UDP as u32;
                acc += self.len as u32;
            }
            IpRepr::V6(r) => {
                acc = sum16(&r.src, acc);
                acc = sum16(&r.dst, acc);
                acc += self.len as u32;
                acc += IPPROTO_UDP as u32;
            }
        }
        let mut h = [0u8; 8];
        let mut me = *self;
        me.checksum = 0;
        me.emit(&mut h);
        acc = sum16(&h, acc);
        acc = sum16(payload, acc);
        match !fold(acc) {
            0 => 0xffff,
            c => c,
        }
    }
}

fn sum16(b: &[u8], mut acc: u32) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
        acc = (acc & 0xffff) + (acc >> 16);
    }
    if let [last] = chunks.remainder() {
        acc += (*last as u32) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// A UDP datagram found in an Ethernet frame, with the raw header bytes the
/// ICRC needs.
#[derive(Debug, Clone, Copy)]
pub struct UdpFrame<'a> {
    pub eth: EthernetRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    /// The IP header bytes as captured (with options, if any).
    pub ip_header: &'a [u8],
    pub udp_header: &'a [u8],
    /// The UDP payload, delimited by the UDP length field.
    pub payload: &'a [u8],
    /// Bytes after the UDP datagram (Ethernet padding).
    pub trailer: &'a [u8],
}

impl UdpFrame<'_> {
    /// Whether the datagram is addressed to the RoCEv2 port.
    pub fn is_rocev2(&self) -> bool {
        self.udp.dst_port == ROCEV2_UDP_PORT
    }
}

/// Find the UDP datagram in an Ethernet frame.
///
/// `Ok(None)`: a well-formed frame that is not UDP over IP. `Err`: the frame
/// is cut short or a length field is inconsistent.
pub fn parse_ethernet_udp(frame: &[u8]) -> Result<Option<UdpFrame<'_>>> {
    let (eth, l3) = EthernetRepr::parse(frame)?;
    let rest = &frame[l3..];
    let (ip, ihl, l4_total) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let (r, ihl) = Ipv4Repr::parse(rest)?;
            if r.protocol != IPPROTO_UDP {
                return Ok(None);
            }
            if r.flags_frag & 0x3fff != 0 {
                // A fragment: not a datagram we can read on its own.
                return Ok(None);
            }
            let total = r.total_len as usize;
            if total < ihl || total > rest.len() {
                return Err(Error::BadLength {
                    what: "IPv4 total",
                    field: total,
                    have: rest.len(),
                });
            }
            (IpRepr::V4(r), ihl, total - ihl)
        }
        ETHERTYPE_IPV6 => {
            let r = Ipv6Repr::parse(rest)?;
            if r.next_header != IPPROTO_UDP {
                return Ok(None);
            }
            let pl = r.payload_len as usize;
            if pl + Ipv6Repr::LEN > rest.len() {
                return Err(Error::BadLength {
                    what: "IPv6 payload",
                    field: pl,
                    have: rest.len() - Ipv6Repr::LEN,
                });
            }
            (IpRepr::V6(r), Ipv6Repr::LEN, pl)
        }
        _ => return Ok(None),
    };
    let ip_header = &rest[..ihl];
    let l4 = &rest[ihl..ihl + l4_total];
    let udp = UdpRepr::parse(l4)?;
    let ulen = udp.len as usize;
    if ulen < UdpRepr::LEN || ulen > l4.len() {
        return Err(Error::BadLength {
            what: "UDP",
            field: ulen,
            have: l4.len(),
        });
    }
    Ok(Some(UdpFrame {
        eth,
        ip,
        udp,
        ip_header,
        udp_header: &l4[..UdpRepr::LEN],
        payload: &l4[UdpRepr::LEN..ulen],
        trailer: &frame[l3 + ihl + ulen..],
    }))
}

/// Wrap a UDP payload into a complete Ethernet frame, as a capture of our own
/// traffic records it: IPv4 with DF and ID 0 (what our sockets send), or
/// IPv6; TTL/hop limit 64; the UDP checksum computed. `payload` must be a
/// whole RoCEv2 packet including its ICRC, which must have been computed over
/// these same headers (see [`crate::icrc::ipv4_header`]).
pub fn build_frame(
    src: std::net::SocketAddr,
    dst: std::net::SocketAddr,
    ipv4_ident: u16,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    use std::net::SocketAddr::*;
    let ulen = (UdpRepr::LEN + payload.len()) as u16;
    let (ip, ethertype) = match (src, dst) {
        (V4(s), V4(d)) => {
            let mut r = Ipv4Repr {
                tos: 0,
                total_len: ulen.saturating_add(Ipv4Repr::LEN as u16),
                ident: ipv4_ident,
                flags_frag: Ipv4Repr::DF,
                ttl: 64,
                protocol: IPPROTO_UDP,
                checksum: 0,
                src: s.ip().octets(),
                dst: d.ip().octets(),
            };
            r.checksum = r.compute_checksum();
            (IpRepr::V4(r), ETHERTYPE_IPV4)
        }
        _ => {
            let to6 = |a: std::net::SocketAddr| match a.ip() {
                std::net::IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(v) => v.octets(),
            };
            (
                IpRepr::V6(Ipv6Repr {
                    traffic_class: 0,
                    flow_label: 0,
                    payload_len: ulen,
                    next_header: IPPROTO_UDP,
                    hop_limit: 64,
                    src: to6(src),
                    dst: to6(dst),
                }),
                ETHERTYPE_IPV6,
            )
        }
    };
    let mut udp = UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        len: ulen,
        checksum: 0,
    };
    udp.checksum = udp.compute_checksum(&ip, payload);
    let eth = EthernetRepr {
        dst: [0x02, 0, 0, 0, 0, 2],
        src: [0x02, 0, 0, 0, 0, 1],
        vlan_tci: None,
        ethertype,
    };
    let start = out.len();
    let hl = eth.header_len() + ip.header_len() + UdpRepr::LEN;
    out.resize(start + hl, 0);
    let b = &mut out[start..];
    eth.emit(b);
    let b = &mut b[eth.header_len()..];
    ip.emit(b);
    udp.emit(&mut b[ip.header_len()..]);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_known_values() {
        // From the golden capture host_rc_send.pcap: host -> vm1, frame 1.
        let ip = Ipv4Repr {
            tos: 0,
            total_len: 0x0060,
            ident: 0,
            flags_frag: 0x4000,
            ttl: 64,
            protocol: 17,
            checksum: 0,
            src: [10, 91, 47, 1],
            dst: [10, 91, 47, 11],
        };
        let c = ip.compute_checksum();
        let mut me = ip;
        me.checksum = c;
        let mut h = [0u8; 20];
        me.emit(&mut h);
        assert_eq!(fold(sum16(&h, 0)), 0xffff);
    }
}
