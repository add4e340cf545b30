//! The receive path: one `recvmsg` (after a receive that found nothing) or
//! `recvmmsg` (after one that found datagrams) into preallocated buffers,
//! then per datagram the ICRC check ([`crate::check`]) under the sender policy
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
use std::net::SocketAddr;
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
    /// Leading headers the kernel may have written into since they were
    /// last set (see `reset_headers`).
    dirty: usize,
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
        let mut ring = RxRing {
            size,
            bufs: vec![0u8; n * size].into_boxed_slice(),
            iovs: vec![sys::empty_iovec(); n],
            names: vec![RawAddr::zeroed(); n],
            cmsgs: vec![RxCmsg::new(); n],
            msgs: vec![sys::empty_mmsghdr(); n],
            filled: 0,
            dirty: 0,
        };
        let bufs = ring.bufs.as_mut_ptr();
        for (i, v) in ring.iovs.iter_mut().enumerate() {
            *v = libc::iovec {
                iov_base: bufs.wrapping_add(i * size).cast(),
                iov_len: size,
            };
        }
        ring.dirty = n;
        ring.reset_headers();
        ring
    }

    /// Point the first `dirty` headers at their own name, iovec and control
    /// buffer again, with those buffers' full lengths. The kernel writes
    /// back (lengths, flags) only into the headers of entries it filled,
    /// and never into the iovecs or the pointers, so after a receive only
    /// those need it: an empty poll — most polls of a busy-polling
    /// application — then costs the system call alone, not 32 headers.
    fn reset_headers(&mut self) {
        let (iovs, names, cmsgs) = (
            self.iovs.as_mut_ptr(),
            self.names.as_mut_ptr(),
            self.cmsgs.as_mut_ptr(),
        );
        for (i, m) in self.msgs[..self.dirty].iter_mut().enumerate() {
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
        self.dirty = 0;
    }

    /// Receive what is waiting, without blocking; returns the entry count:
    /// with `single`, one `recvmsg` into the first entry, else one
    /// `recvmmsg` of the whole ring.
    pub(crate) fn recv(&mut self, fd: RawFd, single: bool) -> io::Result<usize> {
        let n = if single { 1 } else { self.msgs.len() };
        self.reset_headers();
        self.filled = 0;
        // Until the call returns, assume it wrote into every header it was
        // given (a failure other than "nothing waiting" may have written
        // into some).
        self.dirty = n;
        // SAFETY: `reset_headers` left every header pointing at its own
        // name, iovec (which points at its own `size`-byte slice of `bufs`)
        // and control buffer, all owned by `self` and never reallocated,
        // with the lengths of those buffers; nothing else touches them
        // during the call.
        let res = unsafe {
            if n == 1 {
                sys::recvmsg(fd, &mut self.msgs[0])
            } else {
                sys::recvmmsg(fd, &mut self.msgs[..n])
            }
        };
        match res {
            Ok(got) => {
                self.filled = got;
                self.dirty = got;
            }
            Err(ref e) if e.kind() == io::ErrorKind::WouldBlock => self.dirty = 0,
            Err(_) => {}
        }
        res
    }

    /// Entry `i` of the last `recv`.
    pub(crate) fn get(&self, i: usize) -> Received<'_> {
        assert!(i < self.filled, "entry {i} was not received");
        let m = &self.msgs[i];
        let len = (m.msg_len as usize).min(self.size);
        let src = if m.msg_hdr.msg_namelen > 0 {
            self.names[i].socket_addr()
        } else {
            None
        };
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

    /// One receive on `fd` (bound to `local`), then check and deliver.
    /// With `slot`, datagrams for other QPN slots are dropped (a shared
    /// port should never get any). Returns the good datagrams delivered
    /// and the entries taken off the socket, good or not.
    ///
    /// `idle` is the socket's own: whether its last receive found nothing.
    /// Then this one is a `recvmsg` of one entry — a poller back at an idle
    /// socket mostly finds one datagram (a ping-pong's reply), and a
    /// `recvmmsg` would go on to look for a second: a header copied in and
    /// an empty queue checked, ~0.25 µs a one-way trip of a UDP ping-pong
    /// on the VM this was measured on (`scripts/floor/udp_pingpong.c`,
    /// alternating runs). After a receive that found datagrams, a
    /// `recvmmsg` of the whole ring: more may be queued behind them, and a
    /// stream is received in batches.
    pub(crate) fn recv(
        &mut self,
        (fd, idle): (RawFd, &mut bool),
        local: SocketAddr,
        slot: Option<u8>,
        (stats, events): (&mut PortStats, &mut RxEvents),
        capture: &mut Option<Capture>,
        mut f: impl FnMut(&RxMeta, &[u8]),
    ) -> io::Result<(usize, usize)> {
        let n = match self.ring.recv(fd, *idle) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                *idle = true;
                return Ok((0, 0));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        *idle = n == 0;
        stats.recvmmsg_calls += 1;
        // Every datagram's destination is the socket's own address: it
        // receives nothing addressed elsewhere (see `crate::socket`).
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
            let seg = d.cmsgs.gro_segment.map_or(d.data.len(), usize::from).max(1);
            if d.data.len() > seg {
                stats.gro_batches += 1;
                stats.gro_segments += d.data.len().div_ceil(seg) as u64;
            }
            let meta = RxMeta {
                sgid: gid_of(src.ip()),
                dgid: local_gid,
                src_port: src.port(),
                traffic_class: d.cmsgs.tclass.unwrap_or(0),
                hop_limit: d.cmsgs.hop_limit.unwrap_or(0),
            };
            let first_key = steer_key(d.data);
            for chunk in d.data.chunks(seg) {
                if steer_key(chunk) != first_key {
                    events.mixed_gro = true;
                }
                let verdict = check(chunk, src, local, &mut self.checker, &mut self.policy);
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
                    c.received(src, local, ip, chunk);
                }
                match verdict {
                    Err(Bad::Short) => stats.rx_malformed += 1,
                    Err(Bad::Icrc) => stats.icrc_bad += 1,
                    // QP1 (the GSI) is in no slot: its MADs are steered by
                    // their content and taken by every member.
                    Ok(_) if slot.is_some_and(|s| chunk[5] != s) && chunk[5..8] != [0, 0, 1] => {
                        stats.rx_wrong_slot += 1;
                        events.wrong_slot.get_or_insert(chunk[5]);
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
        Ok((good, n))
    }
}

/// What the group program (`crate::cbpf::group_program`) steers a datagram
/// by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SteerKey {
    /// A QPN slot: the top byte of the destination QP, or for a CM MAD
    /// (QP1) the top byte of the ID it names.
    Slot(u8),
    /// A CM REQ or SIDR_REQ: the listener of this service.
    Service(u32),
    /// Nothing: the kernel's hash of the flow, one member for a whole GRO
    /// entry.
    Hashed,
}

/// The key the group program steers datagram `d` (a UDP payload) by. Two
/// datagrams of one GRO entry with different keys may belong to different
/// members, though the group handed the entry whole to the first's. QP1's
/// MADs all carry slot 0, yet are steered by their content: one peer's MADs
/// (all of one size, from its QP1's one source port) are what GRO merges.
fn steer_key(d: &[u8]) -> SteerKey {
    use crate::cbpf::gsi;
    if d.len() < len::BTH {
        return SteerKey::Hashed;
    }
    if d[5] != 0 {
        return SteerKey::Slot(d[5]);
    }
    if d[6..8] != [0, 1]
        || d.len() < gsi::MIN_LEN as usize
        || u32::from(d[gsi::MGMT_CLASS_AT as usize]) != gsi::MGMT_CLASS_CM
    {
        return SteerKey::Hashed;
    }
    let a = gsi::ATTR_AT as usize;
    match u32::from(u16::from_be_bytes([d[a], d[a + 1]])) {
        gsi::ATTR_REQ | gsi::ATTR_SIDR_REQ => {
            let s = gsi::SERVICE_LOW_AT as usize;
            SteerKey::Service(u32::from_be_bytes([d[s], d[s + 1], d[s + 2], d[s + 3]]))
        }
        gsi::ATTR_SIDR_REP => SteerKey::Slot(d[gsi::REQUEST_ID_AT as usize]),
        _ => SteerKey::Slot(d[gsi::REMOTE_COMM_ID_AT as usize]),
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
