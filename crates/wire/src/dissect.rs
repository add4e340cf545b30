//! A captured frame turned into what an RDMA engineer reads: addresses,
//! opcode, QP, PSN and every extension header, plus whether the ICRC holds;
//! for a datagram to QP 1 (the GSI), the management datagram it carries: a
//! CM message field by field, with the addresses of the rdma_cm header in
//! its private data, or any other class's header.
//! This is the engine of `softrdma decode`; it never panics, whatever the
//! bytes, and says in one line why a packet could not be read.

use core::fmt::{self, Write as _};
use std::net::SocketAddr;

use crate::cm::{self, CmMsg, CmaHdr, MadHeader};
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
    /// Not a UDP datagram to port 4791, or softrdma's own port-sharing
    /// probe ([`is_steering_probe`]).
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
        /// The management datagram of a UD packet to QP 1; None for any
        /// other packet.
        mad: Option<Mad>,
    },
}

/// The queue pair management datagrams (CM, SA, …) are sent to: the GSI.
pub const GSI_QP: u32 = 1;

/// What a UD packet to QP 1 carries: a management datagram (MAD), read as
/// far as its bytes allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mad {
    /// The payload is shorter than a MAD's 256 bytes.
    Truncated { have: usize },
    /// A whole MAD.
    Whole {
        header: MadHeader,
        /// The CM message, for a CM `Send` of CM class version 2 (base
        /// version 1); None for any other class, version or method.
        cm: Option<CmMsg>,
        /// Payload bytes after the 256 of the MAD (a GSI datagram has
        /// none).
        trailing: usize,
    },
}

impl Mad {
    /// Read the payload of a packet to QP 1.
    pub fn parse(payload: &[u8]) -> Mad {
        let Some(m) = payload.first_chunk::<{ cm::MAD_LEN }>() else {
            return Mad::Truncated {
                have: payload.len(),
            };
        };
        Mad::Whole {
            header: MadHeader::parse(m),
            cm: cm::parse(m).ok().map(|(_, msg)| msg),
            trailing: payload.len() - cm::MAD_LEN,
        }
    }
}

fn addrs(f: &UdpFrame<'_>) -> (SocketAddr, SocketAddr) {
    (
        SocketAddr::new(f.ip.src(), f.udp.src_port),
        SocketAddr::new(f.ip.dst(), f.udp.dst_port),
    )
}

/// First byte of a softrdma port-sharing probe: a BTH opcode in the
/// manufacturer-specific range, which no RoCE peer sends.
pub const STEERING_PROBE_OPCODE: u8 = 0xff;
/// UDP payload length of a softrdma port-sharing probe: the opcode, three
/// zero bytes, the group's 8-byte secret, the target socket index (2
/// bytes), 6 zero bytes.
pub const STEERING_PROBE_LEN: usize = 20;

/// Whether a UDP payload to port 4791 is one of softrdma's own probes: the
/// datagrams by which processes sharing an address's port 4791 learn which
/// socket of their reuseport group the kernel picks for an index. They are
/// not RoCEv2 packets; a capture on a loopback device sees them.
pub fn is_steering_probe(payload: &[u8]) -> bool {
    payload.len() == STEERING_PROBE_LEN
        && payload[0] == STEERING_PROBE_OPCODE
        && payload[1..4] == [0, 0, 0]
}

/// Dissect one Ethernet frame as one packet. A frame that holds several
/// (a UDP GSO train captured before segmentation): [`dissect_all`].
pub fn dissect(frame: &[u8]) -> Dissection {
    let f = match parse_ethernet_udp(frame) {
        Ok(Some(f)) if f.is_rocev2() && !is_steering_probe(f.payload) => f,
        Ok(_) => return Dissection::NotRoce,
        // Below UDP we cannot tell whether it was meant to be RoCE; a frame
        // cut short before its UDP header is reported, not silently skipped.
        Err(error) => {
            return Dissection::Malformed { addrs: None, error };
        }
    };
    let (src, dst) = addrs(&f);
    packet(src, dst, f.ip_header, f.udp_header, f.payload)
}

/// One RoCEv2 packet: `payload` is its UDP payload, the headers those its
/// ICRC is computed over.
fn packet(
    src: SocketAddr,
    dst: SocketAddr,
    ip_header: &[u8],
    udp_header: &[u8],
    payload: &[u8],
) -> Dissection {
    let malformed = |error| Dissection::Malformed {
        addrs: Some((src, dst)),
        error,
    };
    let pkt = match Packet::new_checked(payload) {
        Ok(p) => p,
        Err(e) => return malformed(e),
    };
    let repr = match PacketRepr::parse(&pkt) {
        Ok(r) => r,
        Err(e) => return malformed(e),
    };
    let n = payload.len();
    let computed = icrc::compute(ip_header, udp_header, &payload[..n - len::ICRC]);
    let mad =
        (repr.bth.dest_qp == GSI_QP && repr.ext.deth.is_some()).then(|| Mad::parse(pkt.payload()));
    Dissection::Roce {
        src,
        dst,
        repr,
        icrc: IcrcCheck {
            carried: pkt.icrc(),
            computed,
        },
        mad,
    }
}

/// Every RoCEv2 packet of one Ethernet frame, in order.
///
/// A sender using UDP segmentation offload hands the kernel one datagram
/// for a train of equal-sized packets (the last may be shorter); on a
/// loopback device nothing segments it, and a capture there (or before a
/// NIC's offload) holds the whole train as one frame, whose ICRC fails read
/// as one packet. Such a frame is cut where its second packet begins: the
/// first segment length at which the bytes that follow start with a BTH
/// for the same QP at the next PSN and the first segment's ICRC holds,
/// computed as segmentation leaves the headers (the IP and UDP lengths of
/// each segment, and the IPv4 identification counting up by one per
/// segment). Each packet then gets its own ICRC verdict. Any other frame
/// is the one packet [`dissect`] reads.
pub fn dissect_all(frame: &[u8]) -> Vec<Dissection> {
    let whole = dissect(frame);
    match &whole {
        Dissection::Roce { icrc, .. } if !icrc.ok() => split_train(frame).unwrap_or(vec![whole]),
        _ => vec![whole],
    }
}

/// The packets of a GSO train (see [`dissect_all`]), if `frame` is one.
fn split_train(frame: &[u8]) -> Option<Vec<Dissection>> {
    let f = parse_ethernet_udp(frame).ok()??;
    let p = f.payload;
    let first = PacketRepr::parse(&Packet::new_checked(p).ok()?).ok()?;
    let (qp, next) = (first.bth.dest_qp, first.bth.psn.add(1));
    let shortest = len::BTH + len::ICRC;
    let (src, dst) = addrs(&f);
    let mut ip = f.ip_header.to_vec();
    let mut udp = [0u8; 8];
    udp.copy_from_slice(f.udp_header);
    let v4 = ip.first().is_some_and(|b| b >> 4 == 4);
    let id0 = if v4 {
        u16::from_be_bytes([ip[4], ip[5]])
    } else {
        0
    };
    // The headers segment `k` of length `n` leaves with.
    let mut headers = |k: usize, n: usize| -> (Vec<u8>, [u8; 8]) {
        let ulen = (8 + n) as u16;
        if v4 {
            let total = (ip.len() + 8 + n) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[4..6].copy_from_slice(&id0.wrapping_add(k as u16).to_be_bytes());
        } else if ip.len() >= 6 {
            ip[4..6].copy_from_slice(&ulen.to_be_bytes());
        }
        udp[4..6].copy_from_slice(&ulen.to_be_bytes());
        (ip.clone(), udp)
    };
    // Packets are whole 4-byte words (the pad rounds the payload up).
    // Each candidate that looks like the next packet costs an ICRC over
    // the first one: a real train's first candidate is nearly always the
    // right one, and a frame crafted so that every word looks like it
    // would cost a CRC of the frame per word; a few dozen tries decide.
    const TRIES: u32 = 64;
    let mut tries = 0;
    let mut seg = shortest;
    while seg + shortest <= p.len() && tries < TRIES {
        let b = &p[seg..];
        let qp_at = u32::from_be_bytes([0, b[5], b[6], b[7]]);
        let psn_at = u32::from_be_bytes([0, b[9], b[10], b[11]]);
        if qp_at == qp && psn_at == next.value() {
            tries += 1;
            let (ih, uh) = headers(0, seg);
            let c = icrc::compute(&ih, &uh, &p[..seg - len::ICRC]);
            if icrc::carried(&p[..seg]) == Some(c) {
                let out = p
                    .chunks(seg)
                    .enumerate()
                    .map(|(k, part)| {
                        let (ih, uh) = headers(k, part.len());
                        packet(src, dst, &ih, &uh, part)
                    })
                    .collect();
                return Some(out);
            }
        }
        seg += 4;
    }
    None
}

/// The name of a management class (IBA table 134 and the kernel's
/// `IB_MGMT_CLASS_*`), for the classes a decoder may meet on QP 1.
fn mgmt_class_name(c: u8) -> Option<&'static str> {
    Some(match c {
        0x01 => "SM",
        0x81 => "SM directed route",
        0x03 => "SA",
        0x04 => "PerfMgt",
        0x05 => "BM",
        0x06 => "DevMgt",
        cm::MGMT_CLASS_CM => "CM",
        0x08 => "SNMP",
        0x10 => "DevAdm",
        0x11 => "BootMgt",
        0x12 => "BIS",
        0x21 => "CC",
        0x09..=0x0f | 0x30..=0x4f => "vendor",
        _ => return None,
    })
}

/// The rdma_cm addresses of a REQ or SIDR_REQ whose service ID is in one
/// of rdma_cm's port spaces: the active side's address and port, and the
/// passive side's address with the service ID's port. None when the
/// service is not rdma_cm's, or is `RDMA_PS_IB` without the header (an
/// `AF_IB` connection carries none).
fn cma_addrs(service_id: u64, private: &[u8]) -> Option<Result<(SocketAddr, SocketAddr), Error>> {
    let (ps, port) = cm::service::split(service_id)?;
    cm::service::ps_name(ps)?;
    match CmaHdr::parse(private) {
        Ok(h) => Some(Ok((h.src, SocketAddr::new(h.dst, port)))),
        Err(_) if ps == cm::service::PS_IB => None,
        Err(e) => Some(Err(e)),
    }
}

/// Why an rdma_cm header could not be read, in a few words.
fn cma_problem(e: &Error) -> String {
    match *e {
        Error::BadField { value, .. } => {
            format!("version {value}, expected {}", CmaHdr::VERSION)
        }
        Error::BadIpVersion(v) => format!("IP version {v}, expected 4 or 6"),
        e => e.to_string(),
    }
}

fn write_service(f: &mut fmt::Formatter<'_>, id: u64) -> fmt::Result {
    write!(f, " service=0x{id:016x}")?;
    if let Some((ps, port)) = cm::service::rdma_cm(id) {
        write!(f, " ({ps} port {port})")?;
    }
    Ok(())
}

fn write_cma(f: &mut fmt::Formatter<'_>, service_id: u64, private: &[u8]) -> fmt::Result {
    match cma_addrs(service_id, private) {
        None => Ok(()),
        Some(Ok((s, d))) => write!(f, " rdma_cm {s} > {d}"),
        Some(Err(e)) => write!(f, " rdma_cm header unreadable: {}", cma_problem(&e)),
    }
}

fn write_ids(f: &mut fmt::Formatter<'_>, local: u32, remote: u32) -> fmt::Result {
    write!(f, " local_id=0x{local:08x} remote_id=0x{remote:08x}")
}

fn write_kind(f: &mut fmt::Formatter<'_>, key: &str, k: u8) -> fmt::Result {
    match cm::msg_kind::name(k) {
        Some(n) => write!(f, " {key}={n}"),
        None => write!(f, " {key}={k}"),
    }
}

fn write_pkey(f: &mut fmt::Formatter<'_>, pkey: u16) -> fmt::Result {
    if pkey != crate::bth::DEFAULT_PKEY {
        write!(f, " pkey=0x{pkey:04x}")?;
    }
    Ok(())
}

/// One CM message: its name, the transaction ID, the communication IDs
/// and what else it says that an RDMA engineer reads.
fn write_cm(f: &mut fmt::Formatter<'_>, h: &MadHeader, msg: &CmMsg) -> fmt::Result {
    let tid = h.tid;
    match msg {
        CmMsg::Req(r) => {
            write!(
                f,
                "CM REQ tid=0x{tid:016x} local_id=0x{:08x}",
                r.local_comm_id
            )?;
            write_service(f, r.service_id)?;
            write!(
                f,
                " qpn=0x{:06x} start_psn={} resp_res={} init_depth={}",
                r.local_qpn, r.starting_psn, r.responder_resources, r.initiator_depth
            )?;
            match cm::path_mtu_bytes(r.path_mtu) {
                Some(b) => write!(f, " mtu={b}")?,
                None => write!(f, " mtu=reserved({})", r.path_mtu)?,
            }
            match cm::service_type::name(r.transport_service_type) {
                Some(t) => write!(f, " transport={t}")?,
                None => write!(f, " transport=reserved({})", r.transport_service_type)?,
            }
            write!(
                f,
                " retry={} rnr_retry={}",
                r.retry_count, r.rnr_retry_count
            )?;
            if r.srq {
                f.write_str(" srq")?;
            }
            write_pkey(f, r.pkey)?;
            write_cma(f, r.service_id, &r.private)
        }
        CmMsg::Rep(r) => {
            write!(f, "CM REP tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)?;
            write!(
                f,
                " qpn=0x{:06x} start_psn={} resp_res={} init_depth={} rnr_retry={}",
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count
            )?;
            if r.srq {
                f.write_str(" srq")?;
            }
            Ok(())
        }
        CmMsg::Rtu(r) => {
            write!(f, "CM RTU tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)
        }
        CmMsg::Rej(r) => {
            write!(f, "CM REJ reason {}", r.reason)?;
            if let Some(n) = cm::rej_reason::name(r.reason) {
                write!(f, " ({n})")?;
            }
            write!(f, " tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)?;
            write_kind(f, "rejected", r.msg_rejected)
        }
        CmMsg::Mra(r) => {
            write!(f, "CM MRA tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)?;
            write_kind(f, "mraed", r.msg_mraed)?;
            write!(f, " service_timeout={}", r.service_timeout)
        }
        CmMsg::Dreq(r) => {
            write!(f, "CM DREQ tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)?;
            write!(f, " remote_qpn=0x{:06x}", r.remote_qpn)
        }
        CmMsg::Drep(r) => {
            write!(f, "CM DREP tid=0x{tid:016x}")?;
            write_ids(f, r.local_comm_id, r.remote_comm_id)
        }
        CmMsg::SidrReq(r) => {
            write!(
                f,
                "CM SIDR_REQ tid=0x{tid:016x} req_id=0x{:08x}",
                r.request_id
            )?;
            write_service(f, r.service_id)?;
            write_pkey(f, r.pkey)?;
            write_cma(f, r.service_id, &r.private)
        }
        CmMsg::SidrRep(r) => {
            write!(f, "CM SIDR_REP status {}", r.status)?;
            if let Some(n) = cm::sidr_status::name(r.status) {
                write!(f, " ({n})")?;
            }
            write!(
                f,
                " tid=0x{tid:016x} req_id=0x{:08x} qpn=0x{:06x} qkey=0x{:08x}",
                r.request_id, r.qpn, r.qkey
            )?;
            write_service(f, r.service_id)
        }
        CmMsg::Other(a) => match cm::known_attr_name(*a) {
            Some(n) => write!(f, "CM {n} tid=0x{tid:016x}"),
            None => write!(f, "CM attr 0x{a:04x} tid=0x{tid:016x}"),
        },
    }
}

/// A MAD that is not a CM `Send`: its class, version, method, attribute
/// and transaction ID.
fn write_mad_header(f: &mut fmt::Formatter<'_>, h: &MadHeader) -> fmt::Result {
    write!(f, "MAD class 0x{:02x}", h.mgmt_class)?;
    if let Some(n) = mgmt_class_name(h.mgmt_class) {
        write!(f, " ({n})")?;
    }
    write!(
        f,
        " version {} method 0x{:02x} attr 0x{:04x}",
        h.class_version, h.method, h.attr_id
    )?;
    if h.mgmt_class == cm::MGMT_CLASS_CM {
        if let Some(n) = cm::known_attr_name(h.attr_id) {
            write!(f, " ({n})")?;
        }
    }
    write!(f, " tid=0x{:016x}", h.tid)?;
    if h.base_version != cm::BASE_VERSION {
        write!(
            f,
            " base_version={} (expected {})",
            h.base_version,
            cm::BASE_VERSION
        )?;
    }
    Ok(())
}

impl fmt::Display for Mad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mad::Truncated { have } => {
                write!(f, "MAD truncated: {have} of {} bytes", cm::MAD_LEN)
            }
            Mad::Whole {
                header,
                cm,
                trailing,
            } => {
                match cm {
                    Some(msg) => write_cm(f, header, msg)?,
                    None => write_mad_header(f, header)?,
                }
                if header.status != 0 {
                    write!(f, " mad_status=0x{:04x}", header.status)?;
                }
                if *trailing > 0 {
                    write!(f, " ({trailing} bytes after the MAD)")?;
                }
                Ok(())
            }
        }
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
                mad,
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
                if let Some(h) = e.xrceth {
                    write!(f, " XRCETH srqn=0x{:06x}", h.srqn)?;
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
                if let Some(m) = mad {
                    write!(f, " {m}")?;
                }
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

/// `,"key":"value"`.
fn json_kv(o: &mut String, key: &str, value: &str) {
    let _ = write!(o, ",\"{key}\":");
    json_str(o, value);
}

/// `,"key":"name"` for a value with a name, `,"key":N` for one without.
fn json_named(o: &mut String, key: &str, name: Option<&str>, value: u64) {
    match name {
        Some(n) => json_kv(o, key, n),
        None => {
            let _ = write!(o, ",\"{key}\":{value}");
        }
    }
}

fn json_service(o: &mut String, id: u64) {
    let _ = write!(o, ",\"service_id\":{id}");
    if let Some((ps, port)) = cm::service::rdma_cm(id) {
        json_kv(o, "port_space", ps);
        let _ = write!(o, ",\"port\":{port}");
    }
}

fn json_cma(o: &mut String, service_id: u64, private: &[u8]) {
    match cma_addrs(service_id, private) {
        None => {}
        Some(Ok((s, d))) => {
            o.push_str(",\"rdma_cm\":{\"src\":");
            json_str(o, &s.ip().to_string());
            let _ = write!(o, ",\"sport\":{},\"dst\":", s.port());
            json_str(o, &d.ip().to_string());
            let _ = write!(o, ",\"dport\":{}}}", d.port());
        }
        Some(Err(e)) => {
            o.push_str(",\"rdma_cm\":{\"malformed\":");
            json_str(o, &cma_problem(&e));
            o.push('}');
        }
    }
}

fn json_ids(o: &mut String, local: u32, remote: u32) {
    let _ = write!(o, ",\"local_comm_id\":{local},\"remote_comm_id\":{remote}");
}

/// The MAD of a packet to QP 1 as a JSON object: every common header
/// field, and for a CM message its fields under `"cm"`.
fn json_mad(o: &mut String, m: &Mad) {
    let (h, msg, trailing) = match m {
        Mad::Truncated { .. } => {
            o.push_str("{\"malformed\":");
            json_str(o, &m.to_string());
            o.push('}');
            return;
        }
        Mad::Whole {
            header,
            cm,
            trailing,
        } => (header, cm, trailing),
    };
    let _ = write!(
        o,
        "{{\"base_version\":{},\"class\":{},\"class_version\":{},\"method\":{},\"status\":{},\"class_specific\":{},\"tid\":{},\"attr_id\":{},\"attr_mod\":{},\"trailing\":{}",
        h.base_version,
        h.mgmt_class,
        h.class_version,
        h.method,
        h.status,
        h.class_specific,
        h.tid,
        h.attr_id,
        h.attr_mod,
        trailing
    );
    if let Some(n) = mgmt_class_name(h.mgmt_class) {
        json_kv(o, "class_name", n);
    }
    if let Some(msg) = msg {
        o.push_str(",\"cm\":{\"msg\":");
        match msg {
            CmMsg::Other(a) => json_str(o, cm::known_attr_name(*a).unwrap_or("unknown")),
            _ => json_str(o, msg.name()),
        }
        json_cm(o, msg);
        o.push('}');
    }
    o.push('}');
}

fn json_cm(o: &mut String, msg: &CmMsg) {
    match msg {
        CmMsg::Req(r) => {
            let _ = write!(o, ",\"local_comm_id\":{}", r.local_comm_id);
            json_service(o, r.service_id);
            let _ = write!(
                o,
                ",\"local_qpn\":{},\"starting_psn\":{},\"responder_resources\":{},\"initiator_depth\":{},\"path_mtu\":{}",
                r.local_qpn, r.starting_psn, r.responder_resources, r.initiator_depth, r.path_mtu
            );
            if let Some(b) = cm::path_mtu_bytes(r.path_mtu) {
                let _ = write!(o, ",\"path_mtu_bytes\":{b}");
            }
            json_named(
                o,
                "transport",
                cm::service_type::name(r.transport_service_type),
                r.transport_service_type.into(),
            );
            let _ = write!(
                o,
                ",\"retry_count\":{},\"rnr_retry_count\":{},\"srq\":{},\"pkey\":{}",
                r.retry_count, r.rnr_retry_count, r.srq, r.pkey
            );
            json_cma(o, r.service_id, &r.private);
        }
        CmMsg::Rep(r) => {
            json_ids(o, r.local_comm_id, r.remote_comm_id);
            let _ = write!(
                o,
                ",\"local_qpn\":{},\"starting_psn\":{},\"responder_resources\":{},\"initiator_depth\":{},\"rnr_retry_count\":{},\"srq\":{}",
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count,
                r.srq
            );
        }
        CmMsg::Rtu(r) => json_ids(o, r.local_comm_id, r.remote_comm_id),
        CmMsg::Drep(r) => json_ids(o, r.local_comm_id, r.remote_comm_id),
        CmMsg::Rej(r) => {
            json_ids(o, r.local_comm_id, r.remote_comm_id);
            let _ = write!(o, ",\"reason\":{}", r.reason);
            if let Some(n) = cm::rej_reason::name(r.reason) {
                json_kv(o, "reason_name", n);
            }
            json_named(
                o,
                "rejected",
                cm::msg_kind::name(r.msg_rejected),
                r.msg_rejected.into(),
            );
        }
        CmMsg::Mra(r) => {
            json_ids(o, r.local_comm_id, r.remote_comm_id);
            json_named(
                o,
                "mraed",
                cm::msg_kind::name(r.msg_mraed),
                r.msg_mraed.into(),
            );
            let _ = write!(o, ",\"service_timeout\":{}", r.service_timeout);
        }
        CmMsg::Dreq(r) => {
            json_ids(o, r.local_comm_id, r.remote_comm_id);
            let _ = write!(o, ",\"remote_qpn\":{}", r.remote_qpn);
        }
        CmMsg::SidrReq(r) => {
            let _ = write!(o, ",\"request_id\":{}", r.request_id);
            json_service(o, r.service_id);
            let _ = write!(o, ",\"pkey\":{}", r.pkey);
            json_cma(o, r.service_id, &r.private);
        }
        CmMsg::SidrRep(r) => {
            let _ = write!(
                o,
                ",\"request_id\":{},\"status\":{}",
                r.request_id, r.status
            );
            if let Some(n) = cm::sidr_status::name(r.status) {
                json_kv(o, "status_name", n);
            }
            let _ = write!(o, ",\"qpn\":{},\"qkey\":{}", r.qpn, r.qkey);
            json_service(o, r.service_id);
        }
        // The attribute ID is the MAD header's.
        CmMsg::Other(_) => {}
    }
}

/// One JSON object (a JSON-lines record) for a dissected frame.
pub fn to_json(number: usize, d: &Dissection) -> String {
    to_json_at(number, None, d)
}

/// [`to_json`] for packet `k` (from 1) of the `n` a frame holds
/// ([`dissect_all`]): the record also carries `"segment":k,"segments":n`.
pub fn to_json_at(number: usize, segment: Option<(usize, usize)>, d: &Dissection) -> String {
    let mut o = String::with_capacity(256);
    let _ = write!(o, "{{\"frame\":{number}");
    if let Some((k, n)) = segment {
        let _ = write!(o, ",\"segment\":{k},\"segments\":{n}");
    }
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
            mad,
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
            if let Some(h) = e.xrceth {
                let _ = write!(o, ",\"xrceth\":{{\"srqn\":{}}}", h.srqn);
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
            let _ = write!(o, ",\"payload_len\":{}", repr.payload_len);
            if let Some(m) = mad {
                o.push_str(",\"mad\":");
                json_mad(&mut o, m);
            }
            let _ = write!(
                o,
                ",\"icrc_ok\":{},\"icrc_carried\":{},\"icrc_computed\":{}",
                icrc.ok(),
                icrc.carried,
                icrc.computed
            );
        }
    }
    o.push('}');
    o
}
