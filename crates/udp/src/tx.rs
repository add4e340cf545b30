//! The send queue: datagrams as iovec lists, sent with one `sendmmsg`, runs
//! of equal datagrams as UDP GSO trains.
//!
//! A queued datagram is `[head, payload segments.., trailer]`: the head (the
//! transport headers the core wrote) is copied into a fixed arena, the
//! payload segments point at the caller's memory (borrowed by the live
//! [`crate::Tx`]), and the trailer — pad bytes and the ICRC — sits in a
//! second fixed arena. Nothing is allocated per datagram.
//!
//! At flush, consecutive datagrams to the same destination and QP (other
//! than QP1, whose MADs a shared group steers one by one by their content)
//! with one size (the last may be shorter) become one message with a `UDP_SEGMENT`
//! control message: the kernel cuts the iovec list back into datagrams,
//! still without a copy of ours. Each datagram's ICRC is computed then,
//! because over IPv4 it depends on the ID the kernel will give it: 0 for a
//! datagram sent alone (DF, unconnected socket), `k` for the `k`th segment of
//! a GSO train (`inet_gso_segment` numbers segments up from the first's ID).
//!
//! Each datagram leaves from its QP's send socket (`txsock`), so the source
//! port the ICRC covers is that socket's. At flush the queue is ordered by
//! socket (each socket's entries, hence each QP's, keep their order) and
//! every socket gets one `sendmmsg` for its run; a train never spans two
//! sockets.
//!
//! GSO is detected at run time. A train the kernel refuses for its size
//! (a segment over the path MTU: `EMSGSIZE`, or `EINVAL` on older
//! kernels) is rebuilt (ICRCs recomputed with ID 0) and sent one datagram at a
//! time, and GSO stays on (`PortStats::gso_split`). A train refused
//! because the path cannot do GSO at all (`EIO`: no checksum offload,
//! IPsec; `ENOPROTOOPT`, `EOPNOTSUPP`) turns GSO off for the port, and its
//! datagrams are sent the same way.

use crate::capture::Capture;
use crate::icrc::{self, Addrs};
use crate::sys::{self, RawAddr, TxCmsg};
use crate::txsock::SendPool;
use crate::PortStats;
use softrdma_wire::opcode::len;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Largest head (transport headers plus inline payload) one datagram may
/// have: the core's headers are at most 60 bytes, its inline data 256.
pub const MAX_HEAD: usize = 512;
/// Most payload segments one datagram may have (the core's `MAX_SGE`).
pub const MAX_PAYLOAD_SEGS: usize = 32;
/// Largest UDP payload we send (IPv4: 65535 - 20 - 8).
pub const MAX_DATAGRAM: usize = softrdma_wire::frame::MAX_UDP_PAYLOAD_V4;
/// Pad (at most 3) and ICRC (4), rounded up.
const TRAILER: usize = 8;
/// Most segments in one GSO message (the kernel's limit is 64 or 128).
pub const GSO_MAX_SEGMENTS: usize = crate::policy::GSO_MAX_SEGMENTS as usize;
/// Most UDP payload bytes in one GSO message, below the 64 KiB IP limit.
const GSO_MAX_BYTES: usize = 65000;
/// The kernel's limit on iovecs per message.
const UIO_MAXIOV: usize = 1024;
/// Longest a flush waits for a full socket buffer before dropping.
const BACKOFF_BUDGET: Duration = Duration::from_millis(200);

/// One queued datagram.
#[derive(Debug, Clone, Copy)]
struct Entry {
    dst: SocketAddr,
    /// Destination QP, for grouping (a train must stay in one QPN slot so
    /// the receiver's steering sees every segment right).
    qpn: u32,
    /// Send socket (pool index, [`crate::txsock::MAIN`] for the receive socket)
    /// and the source port it is bound to, which the ICRC covers.
    sock: u16,
    sport: u16,
    /// Where its head, trailer and address live in the arenas (its push
    /// position; entries are reordered by socket before sending).
    arena: usize,
    iov_start: usize,
    iov_len: usize,
    head_len: usize,
    /// UDP payload bytes, ICRC included.
    len: usize,
    pad: u8,
    /// Index into `owned`: a private copy, complete with its ICRC (made by
    /// the fault injector).
    owned: Option<usize>,
}

/// A message of the next `sendmmsg`: entries `start..end`.
#[derive(Debug, Clone, Copy)]
struct Group {
    start: usize,
    end: usize,
}

/// The source of our datagrams, as the ICRC needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local {
    pub(crate) addr: SocketAddr,
}

pub(crate) struct TxQueue {
    cap: usize,
    entries: Vec<Entry>,
    iovs: Vec<libc::iovec>,
    addrs: Vec<(RawAddr, libc::socklen_t)>,
    heads: Box<[u8]>,
    trailers: Box<[u8]>,
    msgs: Vec<libc::mmsghdr>,
    cmsgs: Vec<TxCmsg>,
    groups: Vec<Group>,
    /// Private datagram copies referenced by queued entries.
    owned: Vec<Vec<u8>>,
    /// Empty buffers to reuse for copies.
    spare: Vec<Vec<u8>>,
    pub(crate) gso: bool,
}

/// Why a datagram could not be queued.
fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl TxQueue {
    /// A queue for up to `cap` datagrams.
    pub(crate) fn new(cap: usize, gso: bool) -> TxQueue {
        TxQueue {
            cap,
            entries: Vec::with_capacity(cap),
            iovs: Vec::with_capacity(cap * (2 + MAX_PAYLOAD_SEGS)),
            addrs: vec![(RawAddr::zeroed(), 0); cap],
            heads: vec![0u8; cap * MAX_HEAD].into_boxed_slice(),
            trailers: vec![0u8; cap * TRAILER].into_boxed_slice(),
            msgs: vec![sys::empty_mmsghdr(); cap],
            cmsgs: vec![TxCmsg::new(); cap],
            groups: Vec::with_capacity(cap),
            owned: Vec::new(),
            spare: Vec::new(),
            gso,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn room(&self) -> usize {
        self.cap - self.entries.len()
    }

    /// Check a datagram's pieces; returns its UDP payload length.
    pub(crate) fn validate(head: &[u8], payload: &[&[u8]], pad: u8) -> io::Result<usize> {
        if head.len() < len::BTH || head.len() > MAX_HEAD {
            return Err(invalid(format!(
                "head of {} bytes: must hold a BTH ({} bytes) and at most {MAX_HEAD}",
                head.len(),
                len::BTH
            )));
        }
        if payload.len() > MAX_PAYLOAD_SEGS {
            return Err(invalid(format!(
                "{} payload segments, at most {MAX_PAYLOAD_SEGS}",
                payload.len()
            )));
        }
        if pad > 3 {
            return Err(invalid(format!("pad {pad}, must be 0..=3")));
        }
        let n =
            head.len() + payload.iter().map(|p| p.len()).sum::<usize>() + pad as usize + len::ICRC;
        if n > MAX_DATAGRAM {
            return Err(invalid(format!(
                "datagram of {n} bytes, at most {MAX_DATAGRAM}"
            )));
        }
        Ok(n)
    }

    /// Queue a datagram whose payload the caller keeps alive and unchanged
    /// until the next flush (the `Tx` borrow guarantees it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &mut self,
        dst: SocketAddr,
        (sock, sport): (u16, u16),
        head: &[u8],
        payload: &[&[u8]],
        pad: u8,
        n: usize,
    ) {
        assert!(self.room() > 0, "TxQueue full");
        let i = self.entries.len();
        let h = &mut self.heads[i * MAX_HEAD..i * MAX_HEAD + head.len()];
        h.copy_from_slice(head);
        let iov_start = self.iovs.len();
        // Head and trailer iovecs are pointed at the arenas in `build`, after
        // the last write to them.
        self.iovs.push(sys::empty_iovec());
        for p in payload.iter().filter(|p| !p.is_empty()) {
            self.iovs.push(sys::iovec_for(p));
        }
        self.trailers[i * TRAILER..i * TRAILER + pad as usize].fill(0);
        self.iovs.push(sys::empty_iovec());
        self.addrs[i] = RawAddr::from_socket_addr(dst);
        self.entries.push(Entry {
            dst,
            qpn: qpn_of(head),
            sock,
            sport,
            arena: i,
            iov_start,
            iov_len: self.iovs.len() - iov_start,
            head_len: head.len(),
            len: n,
            pad,
            owned: None,
        });
    }

    /// A buffer for a private copy of a datagram.
    pub(crate) fn spare_buffer(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Queue a complete private copy (ICRC included).
    pub(crate) fn push_owned(&mut self, dst: SocketAddr, (sock, sport): (u16, u16), buf: Vec<u8>) {
        assert!(self.room() > 0, "TxQueue full");
        let i = self.entries.len();
        let iov_start = self.iovs.len();
        self.iovs.push(sys::iovec_for(&buf));
        self.addrs[i] = RawAddr::from_socket_addr(dst);
        self.entries.push(Entry {
            dst,
            qpn: qpn_of(&buf),
            sock,
            sport,
            arena: i,
            iov_start,
            iov_len: 1,
            head_len: 0,
            len: buf.len(),
            pad: 0,
            owned: Some(self.owned.len()),
        });
        // Moving the Vec moves its handle, not its heap buffer, so the iovec
        // above stays valid.
        self.owned.push(buf);
    }

    /// Forget everything queued; returns how many datagrams that was.
    pub(crate) fn discard(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        self.iovs.clear();
        self.spare.append(&mut self.owned);
        n
    }

    /// The payload segments of entry `e` (not owned), from the caller's
    /// memory.
    fn payload(&self, e: &Entry) -> impl Iterator<Item = &[u8]> + Clone {
        let segs = &self.iovs[e.iov_start + 1..e.iov_start + e.iov_len - 1];
        segs.iter().map(|v| {
            // SAFETY: these iovecs were made in `push` from `&[u8]` slices
            // the flushing `Tx` still borrows (a leaked `Tx`'s entries are
            // discarded before anything else can flush), so the memory is
            // alive and, being shared-borrowed, unchanged.
            unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }
        })
    }

    /// Append the bytes of entry `i` (as sent) to `out`.
    fn gather(&self, i: usize, out: &mut Vec<u8>) {
        let e = &self.entries[i];
        if let Some(k) = e.owned {
            out.extend_from_slice(&self.owned[k]);
            return;
        }
        let a = e.arena;
        out.extend_from_slice(&self.heads[a * MAX_HEAD..a * MAX_HEAD + e.head_len]);
        for p in self.payload(e) {
            out.extend_from_slice(p);
        }
        out.extend_from_slice(
            &self.trailers[a * TRAILER..a * TRAILER + e.pad as usize + len::ICRC],
        );
    }

    /// Compute the ICRC of entry `i`, as a datagram with IPv4 ID `ident`,
    /// into its trailer.
    fn fill_icrc(&mut self, i: usize, local: &Local, ident: u16) {
        let e = self.entries[i];
        if e.owned.is_some() {
            return;
        }
        let a = e.arena;
        let head = &self.heads[a * MAX_HEAD..a * MAX_HEAD + e.head_len];
        let parts = self.payload(&e);
        let c = icrc::compute(
            addrs_of(local.addr, e.dst),
            (e.sport, e.dst.port()),
            ident,
            head,
            parts,
            e.pad,
        );
        let p = a * TRAILER + e.pad as usize;
        self.trailers[p..p + len::ICRC].copy_from_slice(&c.to_le_bytes());
    }

    /// Group entries `from..` into messages and fill their ICRCs and
    /// headers; returns the number of messages. Entries before `alone`
    /// (a train the kernel refused for its size) go one per message.
    fn build(&mut self, from: usize, local: &Local, alone: usize) -> usize {
        self.groups.clear();
        let n = self.entries.len();
        // One `sendmmsg` per send socket: order the entries by socket,
        // keeping each socket's (so each QP's) entries in push order. The
        // key (socket, push position) is unique, so an unstable in-place
        // sort is stable here and allocates nothing.
        if self.entries[from..]
            .windows(2)
            .any(|w| w[0].sock > w[1].sock)
        {
            self.entries[from..].sort_unstable_by_key(|e| (e.sock, e.arena));
        }
        let mut i = from;
        while i < n {
            let start = i;
            let first = self.entries[start];
            i += 1;
            // QP1 (the GSI) is in no QPN slot: the group steers each CM MAD
            // by its content (service or communication ID), which differs
            // from MAD to MAD, and it would steer a train whole by its first
            // (on loopback a train arrives as one entry). So a MAD is never
            // put in a train.
            if self.gso && start >= alone && first.owned.is_none() && first.qpn != GSI_QPN {
                let (seg, mut total, mut iovn) = (first.len, first.len, first.iov_len);
                while i < n && i - start < GSO_MAX_SEGMENTS {
                    let e = &self.entries[i];
                    let prev = &self.entries[i - 1];
                    if e.owned.is_some()
                        || e.sock != first.sock
                        || e.iov_start != prev.iov_start + prev.iov_len
                        || e.dst != first.dst
                        || e.qpn != first.qpn
                        || e.len > seg
                        || total + e.len > GSO_MAX_BYTES
                        || iovn + e.iov_len > UIO_MAXIOV
                    {
                        break;
                    }
                    total += e.len;
                    iovn += e.iov_len;
                    i += 1;
                    if e.len < seg {
                        break; // only the last segment may be shorter
                    }
                }
            }
            self.groups.push(Group { start, end: i });
        }
        for g in 0..self.groups.len() {
            let Group { start, end } = self.groups[g];
            let train = end - start > 1;
            for k in start..end {
                let ident = if train && local.addr.is_ipv4() {
                    (k - start) as u16
                } else {
                    0
                };
                self.fill_icrc(k, local, ident);
            }
        }
        // The arenas are final now: point the head and trailer iovecs at them.
        let (heads, trailers) = (self.heads.as_ptr(), self.trailers.as_ptr());
        for k in from..n {
            let e = self.entries[k];
            if e.owned.is_some() {
                continue;
            }
            self.iovs[e.iov_start] = libc::iovec {
                iov_base: heads.wrapping_add(e.arena * MAX_HEAD) as *mut libc::c_void,
                iov_len: e.head_len,
            };
            self.iovs[e.iov_start + e.iov_len - 1] = libc::iovec {
                iov_base: trailers.wrapping_add(e.arena * TRAILER) as *mut libc::c_void,
                iov_len: e.pad as usize + len::ICRC,
            };
        }
        let mut cmsg_len = 0;
        for g in 0..self.groups.len() {
            let Group { start, end } = self.groups[g];
            if end - start > 1 {
                cmsg_len = sys::write_gso_cmsg(&mut self.cmsgs[g], self.entries[start].len as u16);
            }
        }
        // Pointers are taken after the last write to what they point at.
        let (iovs, cmsgs) = (self.iovs.as_mut_ptr(), self.cmsgs.as_mut_ptr());
        for g in 0..self.groups.len() {
            let Group { start, end } = self.groups[g];
            let (first, last) = (self.entries[start], self.entries[end - 1]);
            debug_assert_eq!(
                last.iov_start + last.iov_len - first.iov_start,
                self.entries[start..end]
                    .iter()
                    .map(|e| e.iov_len)
                    .sum::<usize>()
            );
            let (name, namelen) = &self.addrs[first.arena];
            let h = &mut self.msgs[g].msg_hdr;
            h.msg_name = name.as_ptr() as *mut libc::c_void;
            h.msg_namelen = *namelen;
            h.msg_iov = iovs.wrapping_add(first.iov_start);
            h.msg_iovlen = last.iov_start + last.iov_len - first.iov_start;
            h.msg_flags = 0;
            if end - start > 1 {
                h.msg_control = cmsgs.wrapping_add(g).cast();
                h.msg_controllen = cmsg_len;
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
        }
        self.groups.len()
    }

    /// Record a sent message.
    fn account(
        &self,
        g: Group,
        local: &Local,
        stats: &mut PortStats,
        capture: &mut Option<Capture>,
    ) {
        let n = g.end - g.start;
        stats.tx_packets += n as u64;
        stats.tx_bytes += self.entries[g.start..g.end]
            .iter()
            .map(|e| e.len as u64)
            .sum::<u64>();
        if n > 1 {
            stats.gso_batches += 1;
            stats.gso_segments += n as u64;
        }
        if let Some(c) = capture {
            for k in g.start..g.end {
                let ident = if n > 1 && local.addr.is_ipv4() {
                    (k - g.start) as u16
                } else {
                    0
                };
                let e = self.entries[k];
                let src = SocketAddr::new(local.addr.ip(), e.sport);
                c.sent(src, e.dst, ident, |out| self.gather(k, out));
            }
        }
    }

    /// Send everything queued. Per-datagram failures are counted, not
    /// returned; the queue is empty afterwards in every case.
    pub(crate) fn flush(
        &mut self,
        (main, pool): (RawFd, &SendPool),
        local: &Local,
        stats: &mut PortStats,
        capture: &mut Option<Capture>,
    ) -> io::Result<()> {
        let r = self.flush_inner((main, pool), local, stats, capture);
        self.discard();
        r
    }

    fn flush_inner(
        &mut self,
        (main, pool): (RawFd, &SendPool),
        local: &Local,
        stats: &mut PortStats,
        capture: &mut Option<Capture>,
    ) -> io::Result<()> {
        let mut next = 0;
        let mut waited = Duration::ZERO;
        let mut backoff = Duration::from_micros(20);
        // Entries before this go one by one (see `EMSGSIZE` below).
        let mut alone = 0;
        'build: while next < self.entries.len() {
            let m = self.build(next, local, alone);
            let mut sent = 0;
            while sent < m {
                // The messages of one socket are consecutive (see `build`).
                let sock = self.entries[self.groups[sent].start].sock;
                let run = (sent..m)
                    .find(|&g| self.entries[self.groups[g].start].sock != sock)
                    .unwrap_or(m);
                let fd = pool.fd(sock, main);
                stats.sendmmsg_calls += 1;
                let train = self.groups[sent].end - self.groups[sent].start > 1;
                let r = match refusal::injected(train) {
                    Some(e) => Err(e),
                    // SAFETY: `build` pointed every header at `self.addrs`,
                    // `self.iovs` and `self.cmsgs`, and every head and
                    // trailer iovec at the arenas, none of which changes
                    // before the next `build`; owned iovecs point at
                    // `self.owned` buffers kept until the queue is cleared;
                    // payload iovecs point at memory the flushing `Tx`
                    // borrows (see `payload`).
                    None => unsafe { sys::sendmmsg(fd, &mut self.msgs[sent..run]) },
                };
                match r {
                    Ok(0) => {
                        // Nothing taken and no error: wait as for EAGAIN.
                        sys::poll_writable(fd, 1);
                        waited += Duration::from_millis(1);
                        if waited >= BACKOFF_BUDGET {
                            stats.tx_dropped +=
                                (self.entries.len() - self.groups[sent].start) as u64;
                            return Ok(());
                        }
                    }
                    Ok(k) => {
                        for g in sent..sent + k {
                            self.account(self.groups[g], local, stats, capture);
                        }
                        sent += k;
                        next = self.groups[sent - 1].end;
                    }
                    Err(e) => {
                        let g = self.groups[sent];
                        let code = e.raw_os_error().unwrap_or(0);
                        match code {
                            libc::EINTR => {}
                            libc::EAGAIN | libc::ENOBUFS => {
                                if waited >= BACKOFF_BUDGET {
                                    let rest = self.entries.len() - g.start;
                                    stats.tx_dropped += rest as u64;
                                    stats.last_send_error = Some(code);
                                    return Ok(());
                                }
                                stats.tx_retries += 1;
                                let t = Instant::now();
                                if code == libc::EAGAIN {
                                    sys::poll_writable(fd, 1);
                                } else {
                                    std::thread::sleep(backoff);
                                    backoff = (backoff * 2).min(Duration::from_millis(1));
                                }
                                waited += t.elapsed().max(Duration::from_micros(1));
                            }
                            libc::EMSGSIZE | libc::EINVAL if g.end - g.start > 1 => {
                                // This train refused for its size: a
                                // segment over the path MTU (`EMSGSIZE`;
                                // `EINVAL` on kernels without 2025's "udp:
                                // gso: do not drop small packets when PMTU
                                // reduces"), more segments or bytes than
                                // the kernel takes in one send. (`EINVAL`
                                // for GSO itself needs UDP checksums off,
                                // `SO_NO_CHECK` or `UDP_NO_CHECK6_TX`,
                                // which these sockets never set.) Resend
                                // these one by one — each then fits or
                                // fails on its own — and keep GSO for the
                                // next trains: smaller ones, or to another
                                // path.
                                stats.gso_split += 1;
                                alone = g.end;
                                next = g.start;
                                continue 'build;
                            }
                            libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP
                                if g.end - g.start > 1 =>
                            {
                                // No UDP GSO on this path (no checksum
                                // offload on its device, IPsec): resend
                                // these one by one, and everything after.
                                self.gso = false;
                                stats.gso_disabled = Some(code);
                                next = g.start;
                                continue 'build;
                            }
                            libc::EBADF | libc::ENOTSOCK | libc::EFAULT => return Err(e),
                            _ => {
                                stats.send_errors += (g.end - g.start) as u64;
                                stats.last_send_error = Some(code);
                                sent += 1;
                                next = g.end;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// A send refusal a test makes the kernel's: the next run of messages
/// that starts with a GSO train fails with the errno set for the thread.
#[cfg(test)]
mod refusal {
    use std::cell::Cell;
    use std::io;

    thread_local! {
        static NEXT_TRAIN: Cell<Option<i32>> = const { Cell::new(None) };
    }

    pub(super) fn refuse_next_train(errno: i32) {
        NEXT_TRAIN.with(|n| n.set(Some(errno)));
    }

    pub(super) fn injected(train: bool) -> Option<io::Error> {
        if !train {
            return None;
        }
        NEXT_TRAIN
            .with(|n| n.take())
            .map(io::Error::from_raw_os_error)
    }
}

#[cfg(not(test))]
mod refusal {
    #[inline(always)]
    pub(super) fn injected(_train: bool) -> Option<std::io::Error> {
        None
    }
}

/// QP1, the GSI: its datagrams (CM MADs) are steered by their content,
/// not by a QPN slot.
const GSI_QPN: u32 = 1;

/// The destination QP in a head or datagram (BTH bytes 5..8).
fn qpn_of(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[5], b[6], b[7]])
}

/// ICRC addresses of a datagram from `src` to `dst` (same family).
pub(crate) fn addrs_of(src: SocketAddr, dst: SocketAddr) -> Addrs {
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => Addrs::V4 {
            src: s.ip().octets(),
            dst: d.ip().octets(),
        },
        _ => Addrs::V6 {
            src: gid_of(src.ip()),
            dst: gid_of(dst.ip()),
        },
    }
}

/// The GID of an IP address: IPv6 as is, IPv4 mapped.
pub(crate) fn gid_of(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v) => v.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txsock::MAIN;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// A sender and a receiver on one loopback address.
    struct Rig {
        tx: UdpSocket,
        rx: UdpSocket,
        pool: SendPool,
        local: Local,
        q: TxQueue,
        stats: PortStats,
    }

    impl Rig {
        fn new(ip: &str) -> Option<Rig> {
            let tx = UdpSocket::bind((ip, 0)).ok()?;
            let rx = UdpSocket::bind((ip, 0)).unwrap();
            tx.set_nonblocking(true).unwrap();
            rx.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let local = Local {
                addr: tx.local_addr().unwrap(),
            };
            let pool = SendPool::new(local.addr.ip(), 0, None, local.addr.port());
            Some(Rig {
                tx,
                rx,
                pool,
                local,
                q: TxQueue::new(64, true),
                stats: PortStats::default(),
            })
        }

        /// Queue `n` datagrams of `len` payload bytes for one QP (a train)
        /// and flush them (here, while the payload they point at lives).
        fn send(&mut self, n: usize, len: usize) {
            let mut head = [0u8; len::BTH];
            head[0] = 0x04; // RC SEND ONLY
            head[5..8].copy_from_slice(&[0x01, 0x00, 0x05]);
            let payload = vec![0x5au8; len];
            let dst = self.rx.local_addr().unwrap();
            for _ in 0..n {
                let size = TxQueue::validate(&head, &[&payload], 0).unwrap();
                self.q.push(
                    dst,
                    (MAIN, self.local.addr.port()),
                    &head,
                    &[&payload],
                    0,
                    size,
                );
            }
            let Rig {
                tx,
                pool,
                local,
                q,
                stats,
                ..
            } = self;
            q.flush((tx.as_raw_fd(), pool), local, stats, &mut None)
                .unwrap();
        }

        /// The datagrams that arrived (until 200 ms pass without one).
        fn received(&self) -> usize {
            let mut buf = [0u8; 65536];
            let mut n = 0;
            while self.rx.recv(&mut buf).is_ok() {
                n += 1;
            }
            n
        }
    }

    /// A train the kernel refuses for its size (`EMSGSIZE`; `EINVAL` on
    /// older kernels for a segment over the path MTU) is sent again
    /// one datagram at a time, and GSO stays on for the next trains. It
    /// used to cost the port GSO for good (`EINVAL`), or to drop the
    /// whole train (`EMSGSIZE`).
    #[test]
    fn a_train_refused_for_its_size_is_split_and_gso_stays_on() {
        for errno in [libc::EINVAL, libc::EMSGSIZE] {
            let mut r = Rig::new("127.0.0.1").unwrap();
            refusal::refuse_next_train(errno);
            r.send(4, 200);
            assert!(r.q.gso, "errno {errno}: GSO stays on");
            assert_eq!(r.stats.gso_disabled, None, "errno {errno}");
            assert_eq!(
                (r.stats.tx_packets, r.stats.send_errors, r.stats.gso_batches),
                (4, 0, 0),
                "errno {errno}: the train's datagrams sent one by one"
            );
            assert_eq!(r.stats.gso_split, 1, "errno {errno}");
            assert_eq!(r.received(), 4, "errno {errno}");
            r.send(4, 200);
            assert_eq!(
                (r.stats.gso_batches, r.stats.gso_segments),
                (1, 4),
                "errno {errno}: the next run is a train again"
            );
            assert_eq!(r.received(), 4, "errno {errno}");
        }
    }

    /// A train the kernel refuses because it cannot do GSO on the path
    /// (`EIO`: no checksum offload, IPsec) turns GSO off; the train's
    /// datagrams go one by one.
    #[test]
    fn a_path_without_gso_turns_it_off() {
        let mut r = Rig::new("127.0.0.1").unwrap();
        refusal::refuse_next_train(libc::EIO);
        r.send(4, 200);
        assert!(!r.q.gso);
        assert_eq!(r.stats.gso_disabled, Some(libc::EIO));
        assert_eq!((r.stats.tx_packets, r.stats.send_errors), (4, 0));
        assert_eq!(r.received(), 4);
        r.send(4, 200);
        assert_eq!(r.stats.gso_batches, 0);
        assert_eq!(r.received(), 4);
    }

    /// The real thing: over IPv6 with a socket MTU (`IPV6_MTU`) of 1280,
    /// the kernel refuses a train of 2000-byte datagrams (each also too
    /// big alone: the socket sets DF), and a later train of small ones
    /// still goes as a train.
    #[test]
    fn a_train_over_the_path_mtu_leaves_gso_on() {
        let Some(mut r) = Rig::new("::1") else {
            eprintln!("no IPv6 loopback: skipped");
            return;
        };
        let fd = r.tx.as_raw_fd();
        sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU, 1280).unwrap();
        sys::setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
        .unwrap();
        r.send(4, 2000);
        assert!(r.q.gso, "GSO stays on ({:?})", r.stats.last_send_error);
        assert_eq!(r.stats.gso_disabled, None);
        assert_eq!(r.stats.send_errors, 4, "each datagram too big alone");
        assert_eq!(r.stats.last_send_error, Some(libc::EMSGSIZE));
        assert_eq!(r.received(), 0);
        r.send(4, 500);
        assert_eq!((r.stats.gso_batches, r.stats.gso_segments), (1, 4));
        assert_eq!(r.received(), 4);
    }
}
