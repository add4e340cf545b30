//! The receive path: one `recvmmsg` into preallocated buffers, then per
//! datagram the ICRC check ([`crate::check`]) under the sender policy
//! ([`crate::policy`]), capture, and delivery.
//!
//! With `UDP_GRO` on, one entry can hold several datagrams of one sender
//! coalesced by the kernel; the control message gives their size and they
//! are cut apart again here.

use crate::capture::{Capture, IpFields};
use crate::check::Checker;
use crate::policy::{Decision, SenderTable};
use crate::sys::{self, RawAddr, RxCmsg, RxCmsgs};
use crate::tx::gid_of;
use crate::{PortStats, RxMeta};
use softrdma_wire::opcode::len;
use std::io;
use std::mem;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;

/// Buffer per entry with GRO: the largest coalesced datagram.
pub(crate) const GRO_BUF: usize = 65536;

struct RxRing {
    size: usize,
    bufs: Box<[u8]>,
    iovs: Vec<libc::iovec>,
    names: Vec<RawAddr>,
    cmsgs: Vec<RxCmsg>,
    msgs: Vec<libc::mmsghdr>,
    /// Entries the last `recv` filled.
    filled: usize,
}

/// One received entry.
struct Received<'a> {
    pub(crate) src: Option<SocketAddr>,
    pub(crate) cmsgs: RxCmsgs,
    pub(crate) data: &'a [u8],
    pub(crate) truncated: bool,
}

impl RxRing {
    pub(crate) fn new(n: usize, size: usize) -> RxRing {
        RxRing {
            size,
            bufs: vec![0u8; n * size].into_boxed_slice(),
            iovs: vec![sys::empty_iovec(); n],
            names: vec![RawAddr::zeroed(); n],
            cmsgs: vec![RxCmsg::new(); n],
            msgs: vec![sys::empty_mmsghdr(); n],
            filled: 0,
        }
    }

    /// Receive what is waiting, without blocking; returns the entry count.
    pub(crate) fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let n = self.msgs.len();
        let bufs = self.bufs.as_mut_ptr();
        for (i, v) in self.iovs.iter_mut().enumerate() {
            *v = libc::iovec {
                iov_base: bufs.wrapping_add(i * self.size).cast(),
                iov_len: self.size,
            };
        }
        let (iovs, names, cmsgs) = (
            self.iovs.as_mut_ptr(),
            self.names.as_mut_ptr(),
            self.cmsgs.as_mut_ptr(),
        );
        for (i, m) in self.msgs.iter_mut().enumerate() {
            m.msg_hdr = libc::msghdr {
                msg_name: names.wrapping_add(i).cast(),
                msg_namelen: mem::size_of::<RawAddr>() as libc::socklen_t,
                msg_iov: iovs.wrapping_add(i),
                msg_iovlen: 1,
                msg_control: cmsgs.wrapping_add(i).cast(),
                msg_controllen: mem::size_of::<RxCmsg>(),
                msg_flags: 0,
            };
            m.msg_len = 0;
        }
        self.filled = 0;
        // SAFETY: each header points at its own name, iovec, control buffer
        // and `size`-byte slice of `bufs`, all owned by `self`, with the
        // lengths of those buffers; nothing else touches them during the call.
        let got = unsafe { sys::recvmmsg(fd, &mut self.msgs[..n]) }?;
        self.filled = got;
        Ok(got)
    }

    /// Entry `i` of the last `recv`.
    pub(crate) fn get(&self, i: usize) -> Received<'_> {
        let m = &self.msgs[i];
        let len = (m.msg_len as usize).min(self.size);
        let src = if m.msg_hdr.msg_namelen > 0 {
            self.names[i].socket_addr()
        } else {
            None
        };
        assert!(i < self.filled, "entry {i} was not received");
        // SAFETY: the last `recv` filled more than `i` entries, so the kernel
        // wrote this header and its control buffer (length in
        // `msg_controllen`), which nothing has touched since.
        let cmsgs = unsafe { sys::parse_rx_cmsgs(&m.msg_hdr) };
        Received {
            src,
            cmsgs,
            data: &self.bufs[i * self.size..i * self.size + len],
            truncated: m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        }
    }
}

/// The receive side of a port.
pub(crate) struct Receiver {
    ring: RxRing,
    checker: Checker,
    pub(crate) policy: SenderTable,
}

/// What one receive saw that the port acts on.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RxEvents {
    /// The first datagram for another QPN slot (shared mode), by its slot.
    pub(crate) wrong_slot: Option<u8>,
    /// A GRO entry held datagrams for more than one slot: GRO merged across
    /// destination QPs, so it cannot stay on in a shared group.
    pub(crate) mixed_gro: bool,
}

/// Why a received datagram was dropped.
enum Bad {
    Short,
    Icrc,
}

impl Receiver {
    /// Room for `batch` entries of `size` bytes each.
    pub(crate) fn new(batch: usize, size: usize) -> Receiver {
        Receiver {
            ring: RxRing::new(batch, size),
            checker: Checker::new(),
            policy: SenderTable::new(),
        }
    }

    /// One `recvmmsg` on `fd` (bound to `local`), then check and deliver.
    /// With `slot`, datagrams for other QPN slots are dropped (a shared
    /// port should never get any).
    pub(crate) fn recv(
        &mut self,
        fd: RawFd,
        local: SocketAddr,
        slot: Option<u8>,
        (stats, events): (&mut PortStats, &mut RxEvents),
        capture: &mut Option<Capture>,
        mut f: impl FnMut(&RxMeta, &[u8]),
    ) -> io::Result<usize> {
        let n = match self.ring.recv(fd) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(0)
            }
            Err(e) => return Err(e),
        };
        stats.recvmmsg_calls += 1;
        let local_gid = gid_of(local.ip());
        let mut good = 0;
        for i in 0..n {
            let d = self.ring.get(i);
            if let Some(n) = d.cmsgs.drops {
                stats.rx_kernel_drops = stats.rx_kernel_drops.max(n as u64);
            }
            if d.truncated {
                stats.rx_truncated += 1;
                continue;
            }
            let Some(src) = d.src else {
                stats.rx_malformed += 1;
                continue;
            };
            let dgid = d.cmsgs.dst.unwrap_or(local_gid);
            let dst = SocketAddr::new(ip_of(dgid, src.is_ipv4()), local.port());
            let seg = d.cmsgs.gro_segment.map_or(d.data.len(), usize::from).max(1);
            if d.data.len() > seg {
                stats.gro_batches += 1;
                stats.gro_segments += d.data.len().div_ceil(seg) as u64;
            }
            let meta = RxMeta {
                sgid: gid_of(src.ip()),
                dgid,
                src_port: src.port(),
                traffic_class: d.cmsgs.tclass.unwrap_or(0),
                hop_limit: d.cmsgs.hop_limit.unwrap_or(0),
            };
            let first_slot = d.data.get(5).copied();
            for chunk in d.data.chunks(seg) {
                if chunk.len() > 5 && Some(chunk[5]) != first_slot {
                    events.mixed_gro = true;
                }
                let verdict = check(chunk, src, dst, &mut self.checker, &mut self.policy);
                if let Some(c) = capture {
                    let (ident, df) = match verdict {
                        Ok((ident, df, _)) => (ident, df),
                        Err(_) => (0, true),
                    };
                    let ip = IpFields {
                        ident,
                        df,
                        tclass: meta.traffic_class,
                        hop_limit: meta.hop_limit,
                    };
                    c.received(src, dst, ip, chunk);
                }
                match verdict {
                    Err(Bad::Short) => stats.rx_malformed += 1,
                    Err(Bad::Icrc) => stats.icrc_bad += 1,
                    Ok(_) if slot.is_some_and(|s| steered_slot(chunk).is_some_and(|t| t != s)) => {
                        stats.rx_wrong_slot += 1;
                        events
                            .wrong_slot
                            .get_or_insert(steered_slot(chunk).unwrap_or(0));
                    }
                    Ok((_, _, recovered)) => {
                        stats.icrc_recovered += recovered as u64;
                        stats.rx_packets += 1;
                        stats.rx_bytes += chunk.len() as u64;
                        good += 1;
                        f(&meta, chunk);
                    }
                }
            }
        }
        Ok(good)
    }
}

/// The QPN slot the group program steers a datagram (UDP payload, BTH
/// first) by, as `crate::cbpf`'s program reads it: the top byte of its
/// destination QP; for QP1 (the GSI), a CM reply's — the top byte of the
/// ID it names, the requester's request ID of a SIDR_REP, the receiver's
/// communication ID of any other (softrdma puts its slot there). `None`
/// for what goes by listener or by hash: REQs and SIDR_REQs, other MADs,
/// an ID naming slot 0. A shared member that gets a datagram steered by
/// another slot has a stale table (a member died without leaving): such
/// a datagram is counted, dropped and taken as the evidence that repairs
/// the table — a CM reply as much as a data packet (a REP that a stale
/// table sent to the wrong member was otherwise taken in silently, and
/// the connection hung: the REQ resent every 4.3 s, each REP answering it
/// lost the same way).
pub(crate) fn steered_slot(d: &[u8]) -> Option<u8> {
    use crate::cbpf::gsi;
    if d.len() < 8 {
        return None;
    }
    if d[5..8] != [0, 0, 1] {
        return Some(d[5]);
    }
    if d.len() < gsi::MIN_LEN as usize
        || u32::from(d[gsi::MGMT_CLASS_AT as usize]) != gsi::MGMT_CLASS_CM
    {
        return None;
    }
    let at = gsi::ATTR_AT as usize;
    let id_at = match u32::from(u16::from_be_bytes([d[at], d[at + 1]])) {
        gsi::ATTR_REQ | gsi::ATTR_SIDR_REQ => return None,
        gsi::ATTR_SIDR_REP => gsi::REQUEST_ID_AT,
        _ => gsi::REMOTE_COMM_ID_AT,
    };
    Some(d[id_at as usize]).filter(|&s| s != 0)
}

/// The IP address of a GID, in the family of the socket.
fn ip_of(gid: [u8; 16], v4: bool) -> IpAddr {
    let ip = Ipv6Addr::from(gid);
    match (v4, ip.to_ipv4_mapped()) {
        (true, Some(a)) => a.into(),
        _ => ip.into(),
    }
}

/// Check one received datagram's ICRC; on success, the IPv4 ID and DF it
/// was sent with and whether they had to be recovered.
fn check(
    d: &[u8],
    src: SocketAddr,
    dst: SocketAddr,
    checker: &mut Checker,
    policy: &mut SenderTable,
) -> Result<(u16, bool, bool), Bad> {
    if d.len() < len::BTH + len::ICRC {
        return Err(Bad::Short);
    }
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(t)) => {
            match policy.decide((gid_of(src.ip()), src.port()), checker.ipv4(s, t, d)) {
                Decision::Accept {
                    ident,
                    df,
                    recovered,
                } => Ok((ident, df, recovered)),
                Decision::Reject => Err(Bad::Icrc),
            }
        }
        (SocketAddr::V6(s), SocketAddr::V6(t)) if checker.ipv6(s, t, d) => Ok((0, true, false)),
        _ => Err(Bad::Icrc),
    }
}

#[cfg(test)]
mod tests {
    use super::steered_slot;

    /// A QP1 datagram (BTH, DETH, then a MAD) of management class `class`
    /// and attribute `attr`, with `id` at both the local (44) and the
    /// remote (48) communication ID offsets' first byte.
    fn mad(class: u8, attr: u16, local: u8, remote: u8) -> Vec<u8> {
        let mut d = vec![0u8; 20 + 256];
        d[0] = 0x64; // UD SEND ONLY
        d[5..8].copy_from_slice(&[0, 0, 1]);
        d[20] = 1; // base version
        d[21] = class;
        d[36..38].copy_from_slice(&attr.to_be_bytes());
        d[44] = local;
        d[48] = remote;
        d
    }

    #[test]
    fn datagrams_name_the_slot_they_are_steered_by() {
        // Data: the destination QP's top byte, slot 0 included.
        let mut data = vec![0u8; 40];
        data[5..8].copy_from_slice(&[3, 1, 0]);
        assert_eq!(steered_slot(&data), Some(3));
        data[5..8].copy_from_slice(&[0, 0, 0x11]);
        assert_eq!(steered_slot(&data), Some(0));
        assert_eq!(steered_slot(&data[..7]), None);
        // CM replies: the receiver's communication ID (REP, RTU, REJ, MRA,
        // DREQ, DREP), a SIDR_REP's request ID.
        for attr in [0x0013u16, 0x0014, 0x0012, 0x0011, 0x0015, 0x0016] {
            assert_eq!(steered_slot(&mad(7, attr, 9, 4)), Some(4), "{attr:#x}");
        }
        assert_eq!(steered_slot(&mad(7, 0x0018, 5, 9)), Some(5));
        // By listener or hash: REQ, SIDR_REQ, another class, slot 0, a runt.
        assert_eq!(steered_slot(&mad(7, 0x0010, 9, 4)), None);
        assert_eq!(steered_slot(&mad(7, 0x0017, 9, 4)), None);
        assert_eq!(steered_slot(&mad(1, 0x0013, 9, 4)), None);
        assert_eq!(steered_slot(&mad(7, 0x0013, 9, 0)), None);
        assert_eq!(steered_slot(&mad(7, 0x0013, 9, 4)[..59]), None);
    }
}
