//! The segment a context publishes to the processes it talks to: one
//! `memfd`, holding the tables peers read (QPs, memory regions, the
//! in-flight words) and, after them, the arena that registered memory is
//! moved into so that peers can map it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const MAGIC: u64 = u64::from_le_bytes(*b"SRDMASHM");
pub const VERSION: u32 = 5;
pub const PAGE: u64 = 4096;

/// QP entries, indexed by the low 16 bits of the QPN (a context's QPNs are
/// `slot << 16 | 0x100 + index` with index < 0xff00).
pub const QP_SLOTS: usize = 1 << 16;
/// Memory-region entries: an open-addressed table by rkey, at most half
/// full, so a lookup probes a few entries.
pub const MR_SLOTS: usize = 1 << 16;
pub const MR_MAX_LIVE: usize = MR_SLOTS / 2;
pub const MR_PROBES: usize = 64;
/// Peers that may access this segment at once: [`WORDS`] in-flight words
/// each.
pub const PEERS: usize = 256;
/// In-flight words per peer: word 0 serves the peer's engine and every
/// caller without a word of its own (`Peer::user` lets one at a time use
/// it); words 1.. are claimed one per lane (`Peer::claim_word`), whose
/// posts then need no flag of the peer's.
pub const WORDS: usize = 8;

const HEADER_OFF: usize = 0;
const QP_OFF: usize = 4096;
const MR_OFF: usize = QP_OFF + QP_SLOTS * std::mem::size_of::<QpEntry>();
const ACTIVE_OFF: usize = MR_OFF + MR_SLOTS * std::mem::size_of::<MrEntry>();
const RECV_OFF: usize = ACTIVE_OFF + PEERS * std::mem::size_of::<Active>();
const TABLES_END: usize = RECV_OFF + QP_SLOTS * std::mem::size_of::<RecvArea>();
/// The packet rings, one per peer (by its in-flight word's index).
const RINGS_OFF: u64 = ((TABLES_END as u64) + (2 << 20) - 1) & !((2 << 20) - 1);
const RING_STRIDE: u64 = crate::ring::RING_BYTES + 4096;
/// Where the arena starts (after the rings, 2 MiB aligned).
pub const ARENA_OFF: u64 =
    (RINGS_OFF + PEERS as u64 * RING_STRIDE + (2 << 20) - 1) & !((2 << 20) - 1);
/// The arena's size: virtual (tmpfs allocates pages as they are written),
/// the most memory a context can register for peers to reach directly.
pub const ARENA_LEN: u64 = 64 << 30;
pub const SEG_LEN: u64 = ARENA_OFF + ARENA_LEN;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub pid: AtomicU32,
    pub uid: AtomicU32,
    /// The owner's engine sleeps and wants its bell rung (see `ring`).
    pub armed: AtomicU32,
    /// 1 if the owner withdraws regions with an expedited global memory
    /// barrier (see `barrier`), so a registered reader's in-flight word
    /// needs no fence of its own.
    pub expedited: AtomicU32,
}

/// A QP as a peer's requester needs to judge a one-sided operation: the
/// responder side of IBA's checks that do not involve memory.
#[repr(C)]
pub struct QpEntry {
    /// Seqlock: odd while the owner rewrites the entry. 64 bits, so that
    /// it never comes back to a value a reader cached (see
    /// `read_locked_seq`).
    pub seq: AtomicU64,
    pub qpn: AtomicU32,
    /// 1 if the QP's responder executes requests (RTR, RTS, SQD, SQE).
    pub ready: AtomicU32,
    pub pd: AtomicU32,
    /// `qp_access_flags` (the core's `AccessFlags` bits).
    pub access: AtomicU32,
    /// The QP it is connected to (RC/UC), which alone may use it, at this
    /// GID (as rxe checks a request's source address).
    pub dest_qpn: AtomicU32,
    pub dest_gid: [AtomicU32; 4],
    /// `max_dest_rd_atomic`: READs and atomics it executes at once (0:
    /// none, and it NAKs them).
    pub rd_atomic: AtomicU32,
    _pad: [u32; 4],
}

/// 0: never used (ends a probe chain), 1: live, 2: withdrawn.
pub const MR_EMPTY: u32 = 0;
pub const MR_LIVE: u32 = 1;
pub const MR_DEAD: u32 = 2;

/// The directly reachable part of a registration: `[iova_lo, iova_lo +
/// len)` is at `arena + off` in the segment.
#[repr(C)]
pub struct MrEntry {
    /// Seqlock, as `QpEntry::seq`.
    pub seq: AtomicU64,
    pub used: AtomicU32,
    pub rkey: AtomicU32,
    pub pd: AtomicU32,
    pub access: AtomicU32,
    pub iova_lo: AtomicU64,
    pub len: AtomicU64,
    pub off: AtomicU64,
    _pad: [u64; 3],
}

/// A region entry's fields, read together ([`MrEntry::read`]).
#[derive(Debug, Clone, Copy)]
pub struct MrView {
    pub used: u32,
    pub rkey: u32,
    pub pd: u32,
    pub access: u32,
    pub iova_lo: u64,
    pub len: u64,
    pub off: u64,
}

impl MrEntry {
    /// The entry's fields as one consistent read under its seqlock, with
    /// the sequence number they were read at (see [`read_locked_seq`]).
    #[inline(always)]
    pub fn read(&self) -> Option<(u64, MrView)> {
        read_locked_seq(&self.seq, || MrView {
            used: self.used.load(Ordering::Relaxed),
            rkey: self.rkey.load(Ordering::Relaxed),
            pd: self.pd.load(Ordering::Relaxed),
            access: self.access.load(Ordering::Relaxed),
            iova_lo: self.iova_lo.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            off: self.off.load(Ordering::Relaxed),
        })
    }
}

/// A peer's in-flight words: each the rkey (with bit 32 set) whose memory
/// its user is touching now, or 0. The owner withdraws a region, then
/// waits until no word names it.
#[repr(C)]
pub struct Active {
    pub words: [Word; WORDS],
}

impl Active {
    /// Name nothing in any word: a new peer at this index, or a dead one,
    /// is inside no region.
    pub fn clear(&self) {
        for w in &self.words {
            w.word.store(0, Ordering::SeqCst);
        }
    }
}

/// One in-flight word, alone on its cache line (its users are different
/// threads of the peer).
#[repr(C)]
pub struct Word {
    pub word: AtomicU64,
    _pad: [u64; 7],
}

pub const ACTIVE_BIT: u64 = 1 << 32;
/// An in-flight word's tag while its user fills a receive of the QP whose
/// number is in the low 24 bits (see [`RecvArea`]).
pub const RECV_BIT: u64 = 1 << 33;

/// The tag of an in-flight word whose user fills a receive of QP `qpn`.
#[inline(always)]
pub fn recv_tag(qpn: u32) -> u64 {
    RECV_BIT | (qpn & 0xff_ffff) as u64
}

/// Receives a QP publishes at once for its peer's sender to fill (see
/// [`RecvArea`]), and the SGEs each may have.
pub const RECV_SLOTS: usize = 16;
pub const RECV_SGES: usize = 4;

/// One published receive: where its bytes go (arena offset and length per
/// SGE), and, once the sender has filled it, what it delivered. Both ends
/// meet on the slot's first cache line: the owner publishes receive `i`
/// with `posted = i + 1`, the sender fills it and sets `done = i + 1`
/// (both Release, read with Acquire) — one line crosses each way per
/// message, the one the results are in.
/// A filled receive's flag: the message carried immediate data.
pub const FILLED_IMM: u32 = 1;
/// A filled receive's flag: the message was an RDMA WRITE with immediate —
/// its bytes went to a region, none to the receive, and `byte_len` is the
/// WRITE's length (the receive completes as `RECV_RDMA_WITH_IMM`).
pub const FILLED_RDMA: u32 = 2;

#[repr(C)]
pub struct RecvSlot {
    pub posted: AtomicU64,
    pub done: AtomicU64,
    pub nsge: AtomicU32,
    pub byte_len: AtomicU32,
    pub imm: AtomicU32,
    /// [`FILLED_IMM`], [`FILLED_RDMA`].
    pub flags: AtomicU32,
    /// `[arena offset, length]` per SGE.
    pub spans: [[AtomicU64; 2]; RECV_SGES],
    _pad: [u64; 4],
}

/// The receive lane of one QP (by the low 16 bits of its QPN): receives
/// its owner publishes for the one QP it is connected to, which fills them
/// straight from its own memory (a SEND carried out by the sender, as a
/// WRITE is). Receive `i` is in slot `i % RECV_SLOTS`; `taken` is the next
/// one to fill, written by the sender (and by the owner while it holds the
/// lane); a slot is published again only after the owner has taken its
/// result. The sender tags an in-flight word with [`RECV_BIT`] and the
/// QPN before it looks at `open`; the owner holds (or closes) the lane by
/// storing 2 (or 0) in `open` and then waits until no word carries the tag (both
/// sequentially consistent: Dekker's pattern, as for regions).
#[repr(C)]
pub struct RecvArea {
    /// 1 while the owner lets the sender fill receives; 2 while it holds
    /// them for a moment (a packet of the QP's is handled: see
    /// `Host::recv_hold`), to be 1 again; 0 closed.
    pub open: AtomicU32,
    pub qpn: AtomicU32,
    /// The QP and GID allowed to fill them.
    pub src_qpn: AtomicU32,
    pub src_gid: [AtomicU32; 4],
    _pad0: [u32; 9],
    /// The next receive to fill.
    pub taken: AtomicU64,
    _pad1: [u64; 7],
    pub slots: [RecvSlot; RECV_SLOTS],
}

/// A mapping of a whole segment (ours or a peer's).
pub struct Mapping {
    base: *mut u8,
}

// SAFETY: the mapping is shared memory reached only through atomics (the
// tables) or through raw copies whose callers uphold the access protocol
// (`lib.rs`); the pointer itself is plain data valid for the mapping's
// life, in any thread.
unsafe impl Send for Mapping {}
// SAFETY: as for Send: every shared access through `&Mapping` is atomic or
// a raw copy under the protocol.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn map(fd: RawFd) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of the whole file, at an address the
        // kernel picks; nothing else is affected. NORESERVE: the arena is
        // sparse.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SEG_LEN as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { base: p.cast() })
    }

    pub fn header(&self) -> &Header {
        // SAFETY: HEADER_OFF lies inside the mapping, is aligned (page), and
        // Header is atomics only, valid for any bit pattern.
        unsafe { &*(self.base.add(HEADER_OFF) as *const Header) }
    }

    pub fn qp(&self, qpn: u32) -> &QpEntry {
        let i = (qpn & 0xffff) as usize;
        // SAFETY: i < QP_SLOTS, so the entry lies inside the table inside the
        // mapping; the entries are atomics, valid for any bit pattern.
        unsafe { &*(self.base.add(QP_OFF).cast::<QpEntry>().add(i)) }
    }

    /// The entries an rkey's lookup probes, in order.
    pub fn mr_probes(&self, rkey: u32) -> impl Iterator<Item = &MrEntry> {
        Self::mr_probe_slots(rkey).map(move |i| self.mr(i))
    }

    /// The slots [`Mapping::mr_probes`] visits, in its order.
    pub fn mr_probe_slots(rkey: u32) -> impl Iterator<Item = usize> {
        let h = mr_hash(rkey);
        (0..MR_PROBES).map(move |i| (h + i) % MR_SLOTS)
    }

    pub fn mr(&self, i: usize) -> &MrEntry {
        debug_assert!(i < MR_SLOTS);
        let i = i % MR_SLOTS;
        // SAFETY: as for `qp`.
        unsafe { &*(self.base.add(MR_OFF).cast::<MrEntry>().add(i)) }
    }

    pub fn active(&self, i: usize) -> &Active {
        let i = i % PEERS;
        // SAFETY: as for `qp`.
        unsafe { &*(self.base.add(ACTIVE_OFF).cast::<Active>().add(i)) }
    }

    /// QP `qpn`'s receive lane.
    pub fn recv(&self, qpn: u32) -> &RecvArea {
        let i = (qpn & 0xffff) as usize;
        // SAFETY: as for `qp` (i < QP_SLOTS, the area table lies inside
        // the mapping, atomics only).
        unsafe { &*(self.base.add(RECV_OFF).cast::<RecvArea>().add(i)) }
    }

    /// Peer `i`'s packet ring into this segment's owner.
    pub fn ring(&self, i: usize) -> crate::ring::Ring<'_> {
        let i = i % PEERS;
        let at = RINGS_OFF + i as u64 * RING_STRIDE;
        // SAFETY: ring i's 4 KiB header page and RING_BYTES of data lie
        // inside the mapping (RINGS_OFF + PEERS * RING_STRIDE <= ARENA_OFF);
        // the header is atomics only.
        unsafe {
            crate::ring::Ring {
                hdr: &*(self.base.add(at as usize) as *const crate::ring::RingHdr),
                data: self.base.add(at as usize + 4096),
            }
        }
    }

    /// The address of arena byte `off`.
    pub fn arena(&self, off: u64) -> *mut u8 {
        debug_assert!(off < ARENA_LEN);
        // SAFETY: pointer arithmetic inside the mapping (off < ARENA_LEN,
        // checked by the callers against the published entry).
        unsafe { self.base.add((ARENA_OFF + off) as usize) }
    }

    pub fn valid(&self) -> bool {
        let h = self.header();
        h.magic.load(Ordering::Acquire) == MAGIC && h.version.load(Ordering::Relaxed) == VERSION
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` created; no reference into
        // it outlives `self` (they borrow it).
        unsafe { libc::munmap(self.base.cast(), SEG_LEN as usize) };
    }
}

/// A new segment: the memfd, sized, with its header written.
pub fn create() -> io::Result<(OwnedFd, Mapping)> {
    let name = c"softrdma-shm";
    // SAFETY: plain system call with a valid C string.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on our descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), SEG_LEN as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Its size is fixed for good: a peer that maps it can never be made
    // to fault (SIGBUS) by a shrink, and checks the seals (`check`).
    // SAFETY: plain system call on our descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS | libc::F_SEAL_SEAL) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let m = Mapping::map(fd.as_raw_fd())?;
    const _: () = assert!(std::mem::size_of::<QpEntry>() == 64);
    const _: () = assert!(std::mem::size_of::<RecvSlot>() == 128);
    const _: () = assert!(std::mem::size_of::<RecvArea>() == 128 + RECV_SLOTS * 128);
    let h = m.header();
    h.version.store(VERSION, Ordering::Relaxed);
    h.pid.store(std::process::id(), Ordering::Relaxed);
    // SAFETY: getuid cannot fail.
    h.uid.store(unsafe { libc::getuid() }, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    Ok((fd, m))
}

// membarrier(2) commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes (cmd, flags[, cpu_id]) and touches no memory
    // of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Register this process for expedited global barriers and say whether
/// they are available: then a peer's in-flight word is a plain store on
/// the peer's side and the owner's withdrawal pays the barrier, instead of
/// a full fence on every one-sided operation (which, after a large copy,
/// waits for the copy's stores to drain: 100-200 ns per 64 KiB WRITE,
/// measured).
pub fn register_barrier() -> bool {
    let q = membarrier(MEMBARRIER_CMD_QUERY);
    let want = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    q >= 0 && q & want == want && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0
}

/// A full memory barrier on every CPU that runs a registered process now
/// (`MEMBARRIER_CMD_GLOBAL_EXPEDITED`: an IPI each, microseconds): after
/// it, every plain store such a process made before is visible here.
pub fn global_barrier() -> bool {
    membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0
}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Whether a peer's descriptors are what a segment and a bell must be: a
/// sealed file of exactly `SEG_LEN` bytes (so mapping it can never fault),
/// and a descriptor whose writes cannot block (made non-blocking here: it
/// is written under the engine's lock).
pub fn check(seg: RawFd, bell: RawFd) -> io::Result<()> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a writable stat.
    if unsafe { libc::fstat(seg, &mut st) } != 0 || st.st_size as u64 != SEG_LEN {
        return Err(bad(
            "the peer's segment is not of a softrdma segment's size",
        ));
    }
    // A shmem memfd, as ours are: a hugetlb one passes the checks above
    // but faults SIGBUS on first touch when the huge-page pool is empty,
    // which would kill this process at its first access to the peer.
    // SAFETY: statfs is plain data; fstatfs fills it.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a writable statfs.
    if unsafe { libc::fstatfs(seg, &mut fs) } != 0 || fs.f_type != libc::TMPFS_MAGIC {
        return Err(bad(
            "the peer's segment is not a shared-memory (tmpfs) file",
        ));
    }
    // SAFETY: plain system call.
    let seals = unsafe { libc::fcntl(seg, libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err(bad("the peer's segment is not sealed against resizing"));
    }
    // SAFETY: plain system calls on a descriptor we own.
    let fl = unsafe { libc::fcntl(bell, libc::F_GETFL) };
    if fl < 0 || unsafe { libc::fcntl(bell, libc::F_SETFL, fl | libc::O_NONBLOCK) } != 0 {
        return Err(bad("the peer's bell is not a usable descriptor"));
    }
    Ok(())
}

/// Seqlock write of one entry.
pub fn write_locked(seq: &AtomicU64, f: impl FnOnce()) {
    let s = seq.load(Ordering::Relaxed);
    seq.store(s.wrapping_add(1), Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    f();
    seq.store(s.wrapping_add(2), Ordering::Release);
}

/// Seqlock read: `f` until it ran while no write was in progress, with
/// the (even) sequence number it ran at. While the entry's sequence still
/// reads the same, nothing in it has changed since: an owner makes it odd
/// before it writes and moves it on after. It is 64 bits so that this
/// holds for the life of the segment: a reader caches its verdict on an
/// entry by the sequence number (the lane's QP and region caches), and a
/// 32-bit count came back to a cached value after 2^31 rewrites of one
/// entry — 2^30 registrations and withdrawals in one slot, minutes of a
/// churning registration cache — when a stale verdict (another region's
/// arena offset) would have been taken as current. Gives up (None) after `SEQ_TRIES` attempts: an
/// owner that died in the middle of a write leaves the count odd for good,
/// and a reader must not spin on it forever (the caller then takes the
/// packet path).
pub fn read_locked_seq<T>(seq: &AtomicU64, mut f: impl FnMut() -> T) -> Option<(u64, T)> {
    for _ in 0..SEQ_TRIES {
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 0 {
            let v = f();
            std::sync::atomic::fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == s1 {
                return Some((s1, v));
            }
        }
        std::hint::spin_loop();
    }
    None
}

/// An owner rewrites an entry in tens of nanoseconds; this many attempts
/// is far beyond one rewrite.
const SEQ_TRIES: u32 = 1 << 16;

pub fn mr_hash(rkey: u32) -> usize {
    // Keys are random already (the OS CSPRNG); mix anyway so that a
    // caller's pattern of keys cannot cluster the table.
    (rkey.wrapping_mul(0x9e37_79b1) >> 16) as usize % MR_SLOTS
}
