//! [`Port`]: one UDP socket bound to `(local, 4791)`, and [`Tx`], a batch of
//! datagrams being sent through it.

use crate::capture::Capture;
use crate::fault::Injector;
use crate::rx::{Receiver, RxEvents, GRO_BUF};
use crate::socket::{bind_addr, new_socket};
use crate::steer::{self, JoinError, Joined, Steering};
use crate::sys;
use crate::tx::{self, gid_of, Local, TxQueue};
use crate::txsock::SendPool;
use crate::{icrc, PortConfig, PortOptions, PortStats, RxMeta};
use socket2::Socket;
use std::collections::VecDeque;
use std::io;
use std::mem::ManuallyDrop;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// Most datagrams the fault injector holds back at once.
const MAX_HELD: usize = 4;
/// Largest batch.
const MAX_BATCH: usize = 512;
/// The slot of a port that owns its address alone.
const EXCLUSIVE_SLOT: u8 = 1;

/// A datagram held back by the fault injector, to be sent out of order.
struct Held {
    dst: SocketAddr,
    /// Send socket and source port.
    via: (u16, u16),
    buf: Vec<u8>,
}

/// One UDP socket bound to `(local, port)`: sends RoCEv2 packets with their
/// ICRC, receives and checks them.
///
/// Sending goes through a [`Tx`] batch ([`Port::tx`]), which borrows the
/// payload memory until it is flushed, or through the `unsafe`
/// [`Port::push`] and [`Port::flush`] for payload whose lifetime the caller
/// manages (registered memory). Receiving is [`Port::recv`], which never
/// blocks (poll [`Port::as_raw_fd`] for readability).
pub struct Port {
    /// The receive socket; taken out only by `Drop`, to leave the group.
    sock: ManuallyDrop<Socket>,
    /// The send sockets, one per source-port bucket.
    pool: SendPool,
    local: Local,
    remote_port: u16,
    slot: u8,
    steering: Steering,
    joined: Option<Joined>,
    /// The socket's drop count when the join was done: the join's own
    /// steering probe (one per index of the group) is dropped by this
    /// socket's filter and counted by the kernel as a receive drop.
    drops_at_join: u64,
    batch: usize,
    txq: TxQueue,
    rx: Receiver,
    /// The socket's last receive found nothing (see `rx::Receiver::recv`).
    rx_idle: bool,
    /// Datagram entries the last [`Port::recv`] took off the socket.
    rx_taken: usize,
    gro: bool,
    fault: Option<Injector>,
    held: VecDeque<Held>,
    /// A `Tx` was handed out and has not been dropped.
    tx_live: bool,
    capture: Option<Capture>,
    stats: PortStats,
    /// Multicast groups joined, each with its own receive socket
    /// (`crate::mcast`).
    groups: Vec<crate::mcast::Group>,
    /// The receive socket's slot in `crate::forkguard`.
    fork_slot: Option<usize>,
}

// SAFETY: the raw pointers inside (iovecs, message headers) point only into
// buffers the port owns, or into memory a `Tx` borrows as `&[u8]` (which is
// `Sync`) while it mutably borrows the port; nothing is tied to a thread.
unsafe impl Send for Port {}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

impl Port {
    /// Open the socket, join (or own) `local:port`, and allocate the batch
    /// arrays.
    pub fn open(cfg: PortConfig) -> io::Result<Port> {
        Port::open_with(cfg, PortOptions::default())
    }

    /// [`Port::open`] with non-default options.
    pub fn open_with(cfg: PortConfig, opts: PortOptions) -> io::Result<Port> {
        use io::ErrorKind::*;
        let unicast = match cfg.local {
            IpAddr::V4(a) => !a.is_unspecified() && !a.is_multicast() && !a.is_broadcast(),
            IpAddr::V6(a) => {
                !a.is_unspecified() && !a.is_multicast() && a.to_ipv4_mapped().is_none()
            }
        };
        if !unicast {
            return Err(err(
                InvalidInput,
                format!(
                    "local address {} must be one specific unicast address (it is the GID)",
                    cfg.local
                ),
            ));
        }
        if cfg.batch == 0 || cfg.batch > MAX_BATCH {
            return Err(err(
                InvalidInput,
                format!("batch {} must be 1..={MAX_BATCH}", cfg.batch),
            ));
        }
        let addr = bind_addr(cfg.local, cfg.port)?;
        let sock = new_socket(cfg.local, opts.traffic_class)?;
        let bind_alone = |sock: &Socket, why: &dyn Fn(io::Error) -> io::Error| {
            sock.bind(&addr.into()).map_err(|e| {
                if e.kind() == AddrInUse {
                    why(e)
                } else {
                    err(e.kind(), format!("binding {addr}: {e}"))
                }
            })
        };
        if opts.source_port_bits.is_some_and(|b| b > 14) {
            return Err(err(
                InvalidInput,
                format!(
                    "source_port_bits {:?} must be at most 14 (the ports 0xc000..=0xffff)",
                    opts.source_port_bits
                ),
            ));
        }
        let (slot, steering, joined) = if cfg.shared {
            match steer::join(&sock, addr, &opts.state_dir) {
                Ok(j) => {
                    let state = j.state_path.clone();
                    (j.slot, Steering::Shared { state }, Some(j))
                }
                Err(JoinError::Unavailable(bpf)) => {
                    bind_alone(&sock, &|e| {
                        err(
                            AddrInUse,
                            format!("another process owns {addr} and sharing is unavailable: {bpf} ({e})"),
                        )
                    })?;
                    let why = Some(bpf.to_string());
                    (EXCLUSIVE_SLOT, Steering::Exclusive { why }, None)
                }
                Err(JoinError::Failed(e)) => return Err(e),
            }
        } else {
            bind_alone(&sock, &|e| {
                err(
                    AddrInUse,
                    format!("another process owns {addr} (this port was opened with shared = false): {e}"),
                )
            })?;
            (EXCLUSIVE_SLOT, Steering::Exclusive { why: None }, None)
        };
        let fd = sock.as_raw_fd();
        let drops_at_join = match joined {
            Some(_) => {
                let inode = crate::listing::inode_of(fd)?;
                let mut table = crate::listing::Table::new(addr);
                table
                    .read()?
                    .iter()
                    .find(|r| r.inode == inode)
                    .map_or(0, |r| r.drops)
            }
            None => 0,
        };
        let gso = opts.gso && sys::getsockopt_int(fd, libc::SOL_UDP, sys::UDP_SEGMENT).is_ok();
        // In a shared group GRO is safe while every UDP flow carries one
        // destination QP (see `recv`, which turns it off if not).
        let gro = opts.gro && sys::setsockopt_int(fd, libc::SOL_UDP, sys::UDP_GRO, 1).is_ok();
        sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_RXQ_OVFL, 1)
            .map_err(|e| err(e.kind(), format!("SO_RXQ_OVFL: {e}")))?;
        let pool = SendPool::new(
            cfg.local,
            opts.traffic_class,
            opts.source_port_bits.map(u32::from),
            cfg.port,
        );
        let capture = match &cfg.pcap {
            Some(p) => {
                let mut c = Capture::create(p)?;
                c.tx_tclass = opts.traffic_class;
                Some(c)
            }
            None => None,
        };
        Ok(Port {
            local: Local { addr },
            pool,
            remote_port: opts.remote_port.unwrap_or(cfg.port),
            slot,
            steering,
            joined,
            drops_at_join,
            batch: cfg.batch,
            txq: TxQueue::new(cfg.batch + 2 + MAX_HELD, gso),
            // Room for GRO entries even with GRO off, so that turning it on
            // or off never reallocates.
            rx: Receiver::new(cfg.batch, GRO_BUF),
            rx_idle: true,
            rx_taken: 0,
            gro,
            fault: cfg.fault.map(Injector::new),
            held: VecDeque::with_capacity(MAX_HELD),
            tx_live: false,
            capture,
            stats: PortStats::default(),
            groups: Vec::new(),
            fork_slot: crate::forkguard::register(sock.as_raw_fd()),
            sock: ManuallyDrop::new(sock),
        })
    }

    /// The receive buffer the kernel grants this port, in payload bytes: a
    /// sender should keep at most this much in flight toward it (the kernel
    /// charges each datagram's buffer overhead against twice this, the
    /// `SO_RCVBUF` it reports).
    pub fn rcvbuf(&self) -> usize {
        sys::getsockopt_int(self.sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF)
            .map_or(0, |v| v.max(0) as usize / 2)
    }

    /// The UDP source port QP `qpn` sends from (binding its send socket if
    /// this is the first QP of its bucket).
    pub fn source_port(&mut self, qpn: u32) -> u16 {
        self.pool.for_qp(qpn).1
    }

    /// The QPN slot this port owns: its QPNs are `slot << 16 ..= slot << 16 | 0xffff`.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// Whether the address is shared by QPN steering or owned alone.
    pub fn steering(&self) -> &Steering {
        &self.steering
    }

    /// Start (`on`) or stop receiving the connection requests (CM REQ and
    /// SIDR_REQ MADs for QP1) for the CM service whose ID ends in
    /// `service` (port space and port, `0x0106_4e20` for TCP port 20000).
    /// Replies to this port's own CM messages arrive anyway, steered by
    /// the slot in their communication IDs. A port that owns its address
    /// alone receives everything already. Another process of this address
    /// listening on it: `AddrInUse`.
    pub fn listen_service(&mut self, service: u32, on: bool) -> io::Result<()> {
        match &mut self.joined {
            Some(j) => j.listen(&self.sock, service, on),
            None => Ok(()),
        }
    }

    /// The slot of the live process of this address listening on the CM
    /// service whose ID ends in `service`, if any (this port's own slot
    /// included; `None` for a port that owns its address alone). Waits
    /// for a listener's registration in progress (see `listen_service`).
    pub fn listener_of(&mut self, service: u32) -> Option<u8> {
        match &mut self.joined {
            Some(j) => j.listener_of(service).unwrap_or_else(|_| {
                self.stats.steer_repair_errors += 1;
                None
            }),
            None => None,
        }
    }

    /// A CM MAD for `slot` (not this port's; the slot is in the MAD's
    /// content, which the receive path does not read) reached this port:
    /// whether another live member owns the slot. Then it was misdelivered
    /// and the group is re-steered; otherwise nobody owns it (its process
    /// is gone) and the MAD is this port's to answer.
    pub fn misdelivered_cm(&mut self, slot: u8) -> bool {
        let Some(j) = &mut self.joined else {
            return false;
        };
        match j.misdelivered_cm(&self.sock, slot) {
            Ok(owned) => {
                if owned {
                    self.stats.rx_wrong_slot += 1;
                }
                owned
            }
            Err(_) => {
                self.stats.steer_repair_errors += 1;
                false
            }
        }
    }

    /// This port's GID: the IPv6 address, or the IPv4-mapped one.
    pub fn local_gid(&self) -> [u8; 16] {
        gid_of(self.local.addr.ip())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local.addr
    }

    /// The socket, for epoll (readable: call [`Port::recv`]).
    pub fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Whether UDP GSO is in use (it turns itself off when the kernel
    /// refuses a train because the path cannot do GSO; a train refused
    /// for its size is only split, see `PortStats::gso_split`).
    pub fn gso_enabled(&self) -> bool {
        self.txq.gso
    }

    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    pub fn stats(&self) -> PortStats {
        let mut s = self.stats;
        s.peers_learned = self.rx.policy.learned;
        s.peers_demoted = self.rx.policy.demoted;
        s.pcap_errors = self.capture.as_ref().map_or(0, |c| c.errors);
        s.steer_repairs = self.joined.as_ref().map_or(0, |j| j.repairs);
        s.rx_kernel_drops = s.rx_kernel_drops.saturating_sub(self.drops_at_join);
        s.tx_source_ports = self.pool.bound as u64;
        s.tx_source_port_failures = self.pool.bind_failures;
        s
    }

    /// Whether the ICRC policy has learned that this IPv4 sender is a
    /// softrdma peer (sends ID 0), so that it no longer gets ID recovery.
    pub fn is_softrdma_peer(&self, sgid: [u8; 16], src_port: u16) -> bool {
        self.rx.policy.is_peer(&(sgid, src_port))
    }

    /// Start a batch of datagrams (the safe way to send; see [`Tx`]).
    pub fn tx(&mut self) -> Tx<'_> {
        self.reclaim_leaked();
        self.tx_live = true;
        Tx { port: self }
    }

    /// If a `Tx` was leaked (`mem::forget`), its queued datagrams may point
    /// at memory that is gone: drop them unsent, counted in `tx_dropped`.
    /// (While a `Tx` is alive it borrows the port, so no other method can
    /// run; finding `tx_live` set here means it was leaked.)
    fn reclaim_leaked(&mut self) {
        if self.tx_live {
            self.tx_live = false;
            let n = self.txq.discard();
            self.stats.tx_dropped += n as u64;
        }
    }

    /// Queue one packet, like [`Tx::push`], without tying the payload's
    /// lifetime to a batch: the form for an engine whose payload is
    /// registered memory it manages itself. Sent by [`Port::flush`] (or
    /// earlier, when the batch fills).
    ///
    /// # Safety
    ///
    /// The memory behind every slice of `payload` must stay valid and
    /// unmodified until the next [`Port::flush`] (or the flush of a [`Tx`]
    /// started later) returns. Datagrams still queued when the port is
    /// dropped are discarded without being read.
    pub unsafe fn push(
        &mut self,
        dst_gid: [u8; 16],
        src_qpn: u32,
        head: &[u8],
        payload: &[&[u8]],
        pad: u8,
    ) -> io::Result<()> {
        self.reclaim_leaked();
        self.queue(dst_gid, src_qpn, head, payload, pad)
    }

    /// Send everything queued with [`Port::push`]: one `sendmmsg`, GSO
    /// trains where possible. A full socket buffer is waited out briefly
    /// (at most 200 ms, then the rest is dropped and counted); datagrams the
    /// kernel refuses are counted in [`PortStats::send_errors`]. Errors
    /// returned are those that make the socket unusable.
    pub fn flush(&mut self) -> io::Result<()> {
        self.reclaim_leaked();
        self.flush_queue()
    }

    /// Send one datagram now (a batch of one); see [`Tx::push`].
    pub fn send(
        &mut self,
        dst_gid: [u8; 16],
        src_qpn: u32,
        head: &[u8],
        payload: &[&[u8]],
        pad: u8,
    ) -> io::Result<()> {
        let mut tx = self.tx();
        tx.push(dst_gid, src_qpn, head, payload, pad)?;
        tx.finish()
    }

    /// Write buffered pcap records to the file.
    pub fn flush_pcap(&mut self) -> io::Result<()> {
        self.capture.as_mut().map_or(Ok(()), |c| c.flush())
    }

    fn dst_addr(&self, gid: [u8; 16]) -> io::Result<SocketAddr> {
        let ip = Ipv6Addr::from(gid);
        let dst: IpAddr = match ip.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => ip.into(),
        };
        if dst.is_ipv4() != self.local.addr.is_ipv4() {
            return Err(err(
                io::ErrorKind::InvalidInput,
                format!(
                    "destination GID {ip} is {} but this port ({}) is not",
                    if dst.is_ipv4() { "IPv4" } else { "IPv6" },
                    self.local.addr
                ),
            ));
        }
        Ok(SocketAddr::new(dst, self.remote_port))
    }

    /// Queue one datagram. The caller guarantees `payload` stays alive and
    /// unchanged until the queue is flushed or discarded (`Tx` does).
    fn queue(
        &mut self,
        dst_gid: [u8; 16],
        src_qpn: u32,
        head: &[u8],
        payload: &[&[u8]],
        pad: u8,
    ) -> io::Result<()> {
        let n = TxQueue::validate(head, payload, pad)?;
        let dst = self.dst_addr(dst_gid)?;
        let via = self.pool.for_qp(src_qpn);
        if self.txq.room() < 2 + MAX_HELD {
            self.flush_queue()?;
        }
        match &mut self.fault {
            None => self.txq.push(dst, via, head, payload, pad, n),
            Some(inj) => {
                let v = inj.decide(n);
                if v.drop {
                    self.stats.fault_drops += 1;
                    return Ok(());
                }
                let hold = v.reorder && self.held.len() < MAX_HELD;
                if v.corrupt_bit.is_some() || hold {
                    let mut buf = self.txq.spare_buffer();
                    buf.extend_from_slice(head);
                    for p in payload {
                        buf.extend_from_slice(p);
                    }
                    buf.extend_from_slice(&[0u8; 3][..pad as usize]);
                    let addrs = tx::addrs_of(self.local.addr, dst);
                    let c = icrc::compute(
                        addrs,
                        (via.1, dst.port()),
                        0,
                        head,
                        payload.iter().copied(),
                        pad,
                    );
                    buf.extend_from_slice(&c.to_le_bytes());
                    if let Some(bit) = v.corrupt_bit {
                        buf[bit / 8] ^= 1 << (bit % 8);
                        self.stats.fault_corrupts += 1;
                    }
                    if v.dup {
                        let mut copy = self.txq.spare_buffer();
                        copy.extend_from_slice(&buf);
                        self.txq.push_owned(dst, via, copy);
                        self.stats.fault_dups += 1;
                    }
                    if hold {
                        self.held.push_back(Held { dst, via, buf });
                        self.stats.fault_reorders += 1;
                        return Ok(());
                    }
                    self.txq.push_owned(dst, via, buf);
                } else {
                    self.txq.push(dst, via, head, payload, pad, n);
                    if v.dup {
                        self.txq.push(dst, via, head, payload, pad, n);
                        self.stats.fault_dups += 1;
                    }
                }
                // Held datagrams go out after this one.
                while let Some(h) = self.held.pop_front() {
                    self.txq.push_owned(h.dst, h.via, h.buf);
                }
            }
        }
        if self.txq.len() >= self.batch {
            self.flush_queue()?;
        }
        Ok(())
    }

    /// Send what is queued, then the datagrams the fault injector held
    /// back. A held datagram goes out after those queued behind it in its
    /// batch, never later: reordering moves a packet behind others sent
    /// with it, as a network's parallel paths do, and never holds it
    /// across an idle time. (Held until the next send, a lone packet — a
    /// resend, a NAK — was delayed until whatever the peer next sent,
    /// often a retransmission timeout later: a loss in all but name.)
    fn flush_queue(&mut self) -> io::Result<()> {
        while self.txq.room() > 0 {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            self.txq.push_owned(h.dst, h.via, h.buf);
        }
        if self.txq.len() == 0 {
            return Ok(());
        }
        self.txq.flush(
            (self.sock.as_raw_fd(), &self.pool),
            &self.local,
            &mut self.stats,
            &mut self.capture,
        )
    }

    /// Receive what is waiting (one datagram after a receive that found
    /// nothing, else up to a batch of `recvmmsg` entries; more datagrams
    /// with GRO) without blocking. Each datagram's ICRC is checked (see
    /// [`crate::policy`]); bad ones are counted and dropped. Calls `f` with
    /// each good datagram (the UDP payload, ICRC included) and returns how
    /// many there were; [`Port::taken`] says whether anything was taken
    /// off the socket, good or not.
    pub fn recv(&mut self, f: impl FnMut(&RxMeta, &[u8])) -> io::Result<usize> {
        let slot = matches!(self.steering, Steering::Shared { .. }).then_some(self.slot);
        let fd = self.sock.as_raw_fd();
        let mut ev = RxEvents::default();
        self.rx_taken = 0;
        let (n, taken) = self.rx.recv(
            (fd, &mut self.rx_idle),
            self.local.addr,
            slot,
            (&mut self.stats, &mut ev),
            &mut self.capture,
            f,
        )?;
        self.rx_taken = taken;
        if ev.mixed_gro && self.gro && slot.is_some() {
            // GRO merged datagrams of one UDP flow for different
            // destination QPs (a peer that does not keep one source port
            // per QP): the group steered them all by the first, so GRO
            // cannot stay on here.
            if sys::setsockopt_int(fd, libc::SOL_UDP, sys::UDP_GRO, 0).is_ok() {
                self.gro = false;
                self.stats.gro_mixed += 1;
            }
        }
        if let (Some(j), Some(wrong)) = (&mut self.joined, ev.wrong_slot) {
            // Evidence that the steering table may be stale; a failure to
            // repair leaves it as it was (counted, retried on the next).
            if j.misdelivered(&self.sock, wrong).is_err() {
                self.stats.steer_repair_errors += 1;
            }
        }
        Ok(n)
    }
}

impl Port {
    /// Join the multicast group of `gid` (an IPv4-mapped `224.0.0.0/4` or
    /// an `ff00::/8` GID) on the interface of this port's address, to
    /// receive its datagrams through [`Port::recv_groups`]. Returns the
    /// group's socket, for the caller's poll set; joining a group again
    /// returns the same one.
    pub fn join_group(&mut self, gid: [u8; 16]) -> io::Result<RawFd> {
        let addr = crate::mcast::group_addr(self.local.addr.ip(), gid)?;
        if let Some(g) = self.groups.iter().find(|g| g.addr == addr) {
            return Ok(g.sock.as_raw_fd());
        }
        let g = crate::mcast::open(self.local.addr.ip(), addr, self.local.addr.port())?;
        let fd = g.sock.as_raw_fd();
        self.groups.push(g);
        Ok(fd)
    }

    /// Leave the group of `gid` (closing its socket, which also takes it
    /// out of any epoll set). False if it was not joined.
    pub fn leave_group(&mut self, gid: [u8; 16]) -> bool {
        let Ok(addr) = crate::mcast::group_addr(self.local.addr.ip(), gid) else {
            return false;
        };
        let before = self.groups.len();
        self.groups.retain(|g| g.addr != addr);
        self.groups.len() != before
    }

    /// The GIDs of the groups joined.
    pub fn groups(&self) -> impl Iterator<Item = [u8; 16]> + '_ {
        self.groups.iter().map(|g| gid_of(g.addr))
    }

    /// [`Port::recv`] for the groups' sockets: up to a batch from each,
    /// without blocking; `meta.dgid` is the group's GID.
    pub fn recv_groups(&mut self, mut f: impl FnMut(&RxMeta, &[u8])) -> io::Result<usize> {
        let mut n = 0;
        let port = self.local.addr.port();
        for g in &mut self.groups {
            let mut ev = RxEvents::default();
            n += self
                .rx
                .recv(
                    (g.sock.as_raw_fd(), &mut g.idle),
                    SocketAddr::new(g.addr, port),
                    None,
                    (&mut self.stats, &mut ev),
                    &mut self.capture,
                    &mut f,
                )?
                .0;
        }
        Ok(n)
    }

    /// Datagram entries the last [`Port::recv`] took off the socket, good
    /// or not: a caller that drains the socket (an edge-triggered waiter)
    /// goes on while this is non-zero, even when a bad datagram left
    /// nothing to deliver.
    pub fn taken(&self) -> usize {
        self.rx_taken
    }

    /// The caller slept until the kernel woke it for these sockets: make
    /// the next receive of each a batch. A single `recvmsg` after an empty
    /// receive suits a poller that spins and sees each datagram the moment
    /// it lands (a ping-pong's lone one); a thread woken from `epoll_wait`
    /// has let a wake-up's time (microseconds) pass, in which a stream's
    /// datagrams gather behind the one that woke it. Taken one at a time,
    /// the first one's answer would leave before the rest are seen — for
    /// selective repeat a NAK that the next ones would have merged with.
    pub fn rx_woken(&mut self) {
        self.rx_idle = false;
        for g in &mut self.groups {
            g.idle = false;
        }
    }
}

impl AsRawFd for Port {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for Port {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Unflushed entries may point at memory that is gone (a leaked `Tx`,
        // or `push` without `flush`): drop them unsent. Held (owned)
        // datagrams still go out.
        self.txq.discard();
        while let Some(h) = self.held.pop_front() {
            if self.txq.room() == 0 {
                break;
            }
            self.txq.push_owned(h.dst, h.via, h.buf);
        }
        let _ = self.flush_queue();
        crate::forkguard::unregister(self.fork_slot.take());
        // SAFETY: `sock` is not used after this; `Drop` runs once.
        let sock = unsafe { ManuallyDrop::take(&mut self.sock) };
        match self.joined.take() {
            Some(j) => j.leave(sock),
            None => drop(sock),
        }
    }
}

/// A batch of datagrams being sent through a [`Port`].
///
/// It borrows the payload memory of every datagram pushed (`'a`) until the
/// batch is flushed, which is what lets the payload go to the kernel without
/// a copy. It is flushed when full, by [`Tx::flush`], [`Tx::finish`], and
/// when dropped (errors then only show in [`Port::stats`]).
pub struct Tx<'a> {
    port: &'a mut Port,
}

impl<'a> Tx<'a> {
    /// Queue one packet to `dst_gid` (UDP port 4791 of that address): `head` is
    /// what the core wrote (BTH, extension headers, inline payload; copied),
    /// `payload` the slices of registered memory that follow it (not
    /// copied), `pad` 0..=3 zero bytes after them. The ICRC is computed and
    /// appended here. `src_qpn`, the sending (or responding) QP, picks the
    /// UDP source port ([`Port::source_port`]).
    pub fn push(
        &mut self,
        dst_gid: [u8; 16],
        src_qpn: u32,
        head: &[u8],
        payload: &[&'a [u8]],
        pad: u8,
    ) -> io::Result<()> {
        self.port.queue(dst_gid, src_qpn, head, payload, pad)
    }

    /// Send everything queued (one `sendmmsg`, GSO trains where possible).
    /// A full socket buffer is waited out briefly; datagrams the kernel
    /// refuses are counted in [`PortStats::send_errors`]. Errors returned are
    /// those that make the socket unusable.
    pub fn flush(&mut self) -> io::Result<()> {
        self.port.flush_queue()
    }

    /// Flush and end the batch.
    pub fn finish(mut self) -> io::Result<()> {
        self.flush()
    }

    /// Datagrams queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.port.txq.len()
    }

    /// The port, for its statistics.
    pub fn port(&self) -> &Port {
        self.port
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.port.txq.len() > 0 {
            let _ = self.port.flush_queue();
        }
        self.port.tx_live = false;
    }
}
