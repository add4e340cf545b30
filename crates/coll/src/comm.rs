//! The communicator: N ranks, an RC QP between every two, and the chunk
//! protocol every collective is built from.
//!
//! # The protocol
//!
//! Every rank owns, *per peer*, a FIFO of `slots` chunk buffers of `chunk`
//! bytes, a flag word per slot and a credit word, all registered once when
//! the communicator is made; the peer learns where they are from the card
//! swapped at start-up. To move a chunk to peer p a rank needs a free slot
//! of p's FIFO for it (fewer than `slots` of its chunks unconsumed there):
//!
//! 1. it RDMA WRITEs the chunk into the slot, then RDMA ATOMIC WRITEs the
//!    slot's flag — one 64-bit word, the chunk's sequence number, its
//!    call number and its length
//!    — on the same QP, so the flag lands after the data (RC executes a
//!    QP's requests in order; the ATOMIC WRITE is one 8-byte store);
//! 2. p sees the flag (an acquire load of its own memory), consumes the
//!    slot (reduces or copies it out) and ATOMIC WRITEs the count of chunks
//!    it has consumed into the sender's credit word.
//!
//! This is NCCL's IB transport in its shape — the receiver's clear-to-send
//! travels as an RDMA WRITE into the sender's memory, which the sender
//! polls — with the data's arrival also said by a WRITE instead of a WRITE
//! with immediate: a WRITE lands in the peer's memory on both of softrdma's
//! transports without the peer's engine (over shared memory it is a copy
//! into the peer's pages when the post returns), where a WRITE with
//! immediate or a SEND goes through the peer's engine and its receive
//! queue (over shared memory through a ring, ~1 µs and a pass of the core
//! each; measured: 13.6 µs per 8-byte AllReduce of two ranks that way,
//! against the figures in `docs/PERFORMANCE.md` this way).
//!
//! Chunks of one peer arrive, and are consumed, in order; sequence numbers
//! tell a new flag from the one the slot held before. The call number
//! counts, per direction of a link, the collective calls that sent chunks
//! along it: a chunk of another call than the receiver's — ranks that
//! called with different counts, so that one sends more chunks than the
//! other consumes — is refused rather than taken for the next call's data. Nothing a rank sends
//! consumes a receive request, so no peer is ever RNR-NAKed, and nothing
//! waits for a peer's engine thread. Sends and the memory they read are
//! tracked per peer: a buffer that will be overwritten waits for the sends
//! reading it ([`Comm::wait_sent`]).
//!
//! Waiting is busy polling of memory (with the device's progress driven
//! from the waiting thread over UDP, `Context::progress`), as NCCL's proxy
//! polls: a collective is latency-bound work with a peer that answers in
//! microseconds. When the job has more ranks on this host than the host has
//! CPUs, a waiting rank yields the CPU after each empty look (a spinning
//! rank would otherwise hold off the very rank it waits for).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use softrdma_verbs::{
    AccessFlags, Completion, ConnectOptions, Context, Cq, Mr, OpenOptions, Pd, Qp, QpCap,
    QpEndpoint, QpInitAttr, QpType, RemoteRegion, SendFlags, SendOp, SendWr, Sge,
};

use crate::boot::{Bootstrap, Launch};
use crate::{Error, Result};

/// Sizes of the chunk protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Bytes per chunk (per FIFO slot). Larger chunks amortise the
    /// per-chunk signal and credit (one round trip each, ~1–8 µs); smaller
    /// ones start the pipeline sooner and keep the slots in cache. 128 KiB:
    /// at the UDP engine's ~2 GB/s a chunk is ~60 µs of wire time against
    /// a few µs of signalling, and 2 × 4 slots × 128 KiB per peer stay in a
    /// 2 MiB L2 on the shared-memory path.
    pub chunk: usize,
    /// FIFO slots per peer: how many chunks may be in flight to one peer.
    /// Four covers a credit's round trip at both transports' rates (a
    /// credit returns within one chunk's time) with one slot to spare.
    pub slots: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk: 128 << 10,
            slots: 4,
        }
    }
}

impl Config {
    /// The defaults, overridden by `SOFTRDMA_COLL_CHUNK` (bytes) and
    /// `SOFTRDMA_COLL_SLOTS`.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        let get = |k: &str| -> Result<Option<usize>> {
            match std::env::var(k) {
                Err(_) => Ok(None),
                Ok(v) => crate::parse_size(&v)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| Error::Invalid(format!("{k}={v:?} is not a size"))),
            }
        };
        if let Some(n) = get("SOFTRDMA_COLL_CHUNK")? {
            c.chunk = n;
        }
        if let Some(n) = get("SOFTRDMA_COLL_SLOTS")? {
            c.slots = n;
        }
        c.validate()?;
        Ok(c)
    }

    /// Whether the sizes work: chunks of whole pages (so every slot is
    /// shared with peers on this host, and a chunk holds whole elements of
    /// every type) from 4 KiB to 1 GiB, and 2 to 64 slots (two at least,
    /// so that no schedule waits for a credit only its waiter could give).
    pub fn validate(&self) -> Result<()> {
        if self.chunk < 4096
            || self.chunk > (1 << 30)
            || !self.chunk.is_multiple_of(softrdma_verbs::PAGE)
        {
            return Err(Error::Invalid(format!(
                "chunk of {} bytes: 4 KiB to 1 GiB, whole 4 KiB pages",
                self.chunk
            )));
        }
        if !(2..=64).contains(&self.slots) {
            return Err(Error::Invalid(format!(
                "{} slots per peer: 2 to 64",
                self.slots
            )));
        }
        Ok(())
    }
}

/// Registered memory of a communicator that collectives read and write
/// (`ncclMemAlloc` with the registration done once): page-aligned, zeroed.
///
/// Its bytes are reached through [`Buffer::write_bytes`],
/// [`Buffer::read_bytes`] and the typed helpers, never as references:
/// peers write into registered memory at any time.
pub struct Buffer {
    mr: Mr,
    /// Not `Sync`: collectives write a buffer through a shared reference
    /// (a [`crate::View`]), so no other thread may hold one meanwhile (two
    /// threads' raw copies of the same bytes would race). It may move to
    /// another thread.
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl Buffer {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.mr.len() == 0
    }

    /// The first byte's address (for raw accesses: see [`Mr::addr`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mr.addr() as *mut u8
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(e) if e <= self.len() => Ok(()),
            _ => Err(Error::Invalid(format!(
                "bytes {offset}..{} of a buffer of {}",
                offset as u128 + len as u128,
                self.len()
            ))),
        }
    }

    /// Copy `data` in at `offset`.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: in bounds (checked); the region is live while `self` is
        // and its address is valid for its length (`Mr::addr`); a raw copy
        // forms no reference to region memory.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copy out `out.len()` bytes from `offset`.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as for `write_bytes`; `out` is the caller's own memory.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }
}

/// A source of a send: registered memory (`lkey`) at `addr`.
#[derive(Clone, Copy)]
pub(crate) struct Src {
    pub addr: u64,
    pub lkey: u32,
    /// The region's rkey (its iova is its address: `Comm::alloc`).
    pub rkey: u32,
}

impl Src {
    pub fn of(b: &Buffer, offset: usize) -> Src {
        Src {
            addr: b.mr.addr() + offset as u64,
            lkey: b.mr.lkey(),
            rkey: b.mr.rkey(),
        }
    }
    pub fn ptr(self) -> *mut u8 {
        self.addr as *mut u8
    }
    pub fn add(self, bytes: usize) -> Src {
        Src {
            addr: self.addr + bytes as u64,
            ..self
        }
    }
}

/// A signalled ATOMIC WRITE of the word `sgl` names to `remote_addr`.
fn atomic_write<'a>(id: u64, remote_addr: u64, rkey: u32, sgl: &'a [Sge; 1]) -> SendWr<'a> {
    SendWr {
        wr_id: id,
        op: SendOp::AtomicWrite { remote_addr, rkey },
        sgl,
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// A slot of the scratch ring ([`Comm::next_scratch`]).
#[derive(Clone, Copy)]
pub(crate) struct Scratch {
    slot: usize,
    src: Src,
}

impl Scratch {
    pub fn ptr(self) -> *mut u8 {
        self.src.ptr()
    }
}

/// The flag's length bit saying the chunk was written straight to its
/// place in the receiver's buffer (not into the slot).
const PLACED: u64 = 1 << 31;

/// A flag word: the chunk's sequence number (16 bits: enough to tell it
/// from the slot's previous flag, `slots` ≤ 64 chunks before), the call
/// number of the collective that sent it on this link (16 bits), the
/// [`PLACED`] bit and the length (below; a chunk is at most 1 GiB).
fn flag_word(seq: u64, call: u16, placed: bool, len: usize) -> u64 {
    ((seq as u16 as u64) << 48)
        | (u64::from(call) << 32)
        | if placed { PLACED } else { 0 }
        | len as u64
}

impl Link {
    /// Where our credit word is in the peer's memory (after our `slots`
    /// flag words).
    fn credit_word(&self, slots: usize) -> u64 {
        self.remote_flags.addr + (slots * 8) as u64
    }
}

/// One peer: its QP and both ends' FIFO bookkeeping.
struct Link {
    qp: Qp,
    /// Our slots in the peer's FIFO, and our flag and credit words there.
    remote_fifo: RemoteRegion,
    remote_flags: RemoteRegion,
    /// Through shared memory (no engine to drive for it).
    shm: bool,
    /// Chunks sent to the peer, and how many of them it has consumed (as
    /// last read from our credit word).
    sent: u64,
    /// Chunks received from the peer and consumed, and the count last
    /// written to its credit word.
    consumed: u64,
    credited: u64,
    /// Work requests posted on the QP, and retired (a signalled completion
    /// retires it and every unsignalled request before it).
    posted: u64,
    retired: u64,
    /// The ticket of the last send that read the caller's memory (not our
    /// scratch): [`Comm::end`] waits for it.
    user_sent: u64,
    /// Per direction, the link's call number (see the module's notes) and
    /// the [`Comm::calls`] value it was last advanced for.
    send_call: (u16, u64),
    recv_call: (u16, u64),
}

/// A communicator of `size` ranks.
pub struct Comm {
    rank: usize,
    size: usize,
    boot: Bootstrap,
    config: Config,
    // Field order is drop order: QPs and regions before the CQ, PD and
    // context they belong to.
    links: Vec<Option<Link>>,
    fifo: Mr,
    flags: Mr,
    /// The source words of ATOMIC WRITEs (see `put_word`).
    word: Mr,
    pub(crate) scratch: Buffer,
    cq: Cq,
    pd: Pd,
    ctx: Context,
    by_qpn: HashMap<u32, usize>,
    wc: Vec<Completion>,
    /// Yield the CPU after an empty look (more local ranks than CPUs).
    yield_when_idle: bool,
    /// Some peer is reached over UDP: waits drive the device's progress.
    any_udp: bool,
    /// Every rank reaches every peer through shared memory.
    all_shm: bool,
    timeout: Duration,
    /// Scratch sends: per slot of the scratch ring, the (peer, ticket) of
    /// the last send that read it, and the slot to hand out next.
    scratch_use: Vec<Option<(usize, u64)>>,
    scratch_next: usize,
    /// A copy of an in-place AlltoAll's or SendRecv's send data
    /// ([`Comm::stage_if_overlapping`]), kept for the next call that needs
    /// one: registering memory per call costs milliseconds.
    pub(crate) stage: Option<Buffer>,
    /// The AllReduce algorithm forced (`SOFTRDMA_COLL_ALGO`,
    /// [`Comm::set_all_reduce_algo`]), else chosen per call.
    pub(crate) algo: Option<crate::Algo>,
    /// Collective calls begun ([`Comm::begin`]).
    calls: u64,
}

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

fn card_entry(v: &mut Vec<u8>, b: &[u8]) {
    v.extend_from_slice(&(b.len() as u32).to_le_bytes());
    v.extend_from_slice(b);
}

fn card_entries(b: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let len = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
        out.push(b.get(at + 4..at + 4 + len)?);
        at += 4 + len;
    }
    Some(out)
}

/// `len` rounded up to whole pages (at least one).
fn pages(len: usize) -> usize {
    len.max(1).div_ceil(softrdma_verbs::PAGE) * softrdma_verbs::PAGE
}

/// The 64-bit word at `p`, loaded with acquire ordering.
///
/// # Safety
/// `p` is 8-byte aligned, inside a region that lives for the call.
unsafe fn load(p: *const u8) -> u64 {
    // SAFETY: aligned and live (the caller's contract); AtomicU64 has the
    // layout of u64 and every bit pattern is valid. Peers store to the word
    // (ATOMIC WRITE: one 8-byte store, by the engine or a peer process's
    // atomic on shared pages) as hardware DMA would under a C program's
    // volatile poll; no non-atomic reference to it exists.
    unsafe {
        (*(p as *const std::sync::atomic::AtomicU64)).load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Comm {
    /// Join the job the environment describes ([`Launch::from_env`]) with
    /// the default [`Config`] (or the environment's).
    pub fn from_env() -> Result<Comm> {
        Comm::init(Launch::from_env()?, Config::from_env()?)
    }

    /// Join the ranks of `launch`: meet them, open the device on the
    /// address the rendezvous uses, connect a QP to every other rank, and
    /// return once all are connected.
    pub fn init(launch: Launch, config: Config) -> Result<Comm> {
        config.validate()?;
        let op_timeout = launch.op_timeout;
        let mut boot = Bootstrap::join(launch)?;
        let (rank, size) = (boot.rank(), boot.size());
        let timeout = op_timeout;
        let dev = softrdma_verbs::by_addr(boot.local_ip())?;
        let ctx = Context::open(&dev, &OpenOptions::default())?;
        let pd = ctx.alloc_pd();
        let Config { chunk, slots } = config;
        let peers = size.saturating_sub(1).max(1) as u32;
        // Per chunk a data WRITE and a flag, per consumed chunk a credit.
        let sq = (3 * slots + 4) as u32;
        let cq = ctx.create_cq((peers * sq).max(64), None)?;
        let fifo = pd.alloc_mr((size * slots * chunk).max(4096), ACCESS)?;
        // Whole pages, so that peers on this host reach them directly
        // (shared memory shares whole pages only).
        let flags = pd.alloc_mr(pages(size * (slots + 1) * 8), ACCESS)?;
        let word = pd.alloc_mr(pages(size * sq as usize * 8), ACCESS)?;
        let scratch = Buffer {
            mr: pd.alloc_mr(slots * chunk, ACCESS)?,
            _not_sync: std::marker::PhantomData,
        };
        let cap = QpCap {
            max_send_wr: sq,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qps = Vec::new();
        let mut card = Vec::new();
        for p in 0..size {
            if p == rank {
                qps.push(None);
                card_entry(&mut card, &[]);
                continue;
            }
            let mut init = QpInitAttr::new(QpType::Rc, &cq);
            init.cap = cap;
            let qp = pd.create_qp(&init)?;
            let fifo_for_p = RemoteRegion {
                addr: fifo.iova() + (p * slots * chunk) as u64,
                rkey: fifo.rkey(),
                len: (slots * chunk) as u64,
            };
            let flags_for_p = RemoteRegion {
                addr: flags.iova() + (p * (slots + 1) * 8) as u64,
                rkey: flags.rkey(),
                len: ((slots + 1) * 8) as u64,
            };
            card_entry(
                &mut card,
                &qp.endpoint()
                    .with_regions([fifo_for_p, flags_for_p])
                    .to_bytes(),
            );
            qps.push(Some(qp));
        }
        let cards = boot.allgather(&card)?;
        let opts = ConnectOptions {
            access: AccessFlags::REMOTE_WRITE,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            ..ConnectOptions::default()
        };
        let mut links = Vec::new();
        let mut by_qpn = HashMap::new();
        for (p, q) in qps.into_iter().enumerate() {
            let Some(qp) = q else {
                links.push(None);
                continue;
            };
            let bad = || Error::Bootstrap(format!("rank {p} sent a malformed card"));
            let entries = card_entries(&cards[p]).ok_or_else(bad)?;
            if entries.len() != size {
                return Err(bad());
            }
            let peer = QpEndpoint::from_bytes(entries[rank])?;
            let [remote_fifo, remote_flags] = peer.regions[..] else {
                return Err(bad());
            };
            if remote_fifo.len < (slots * chunk) as u64
                || remote_flags.len < ((slots + 1) * 8) as u64
            {
                return Err(Error::Bootstrap(format!(
                    "rank {p} offers {} bytes of FIFO, this rank needs {} (SOFTRDMA_COLL_CHUNK/SLOTS differ between ranks?)",
                    remote_fifo.len,
                    slots * chunk
                )));
            }
            qp.connect(&peer, &opts)?;
            by_qpn.insert(qp.qpn(), p);
            links.push(Some(Link {
                qp,
                remote_fifo,
                remote_flags,
                shm: false,
                sent: 0,
                consumed: 0,
                credited: 0,
                posted: 0,
                retired: 0,
                user_sent: 0,
                send_call: (0, 0),
                recv_call: (0, 0),
            }));
        }
        // Every QP is connected before anyone writes.
        boot.barrier()?;
        for l in links.iter_mut().flatten() {
            l.shm = l.qp.transport() == "shm";
        }
        let any_udp = links.iter().flatten().any(|l| !l.shm);
        // Whether every rank reaches every peer through shared memory: what
        // schedules that write into the peers' own buffers need all ranks
        // to agree on.
        let algo = match std::env::var("SOFTRDMA_COLL_ALGO").as_deref() {
            Ok("ring") => Some(crate::Algo::Ring),
            Ok("rd") => Some(crate::Algo::RecursiveDoubling),
            Ok("auto") | Err(_) => None,
            Ok(v) => {
                return Err(Error::Invalid(format!(
                    "SOFTRDMA_COLL_ALGO={v:?}: ring, rd or auto"
                )))
            }
        };
        let code = match algo {
            None => 0,
            Some(crate::Algo::Ring) => 1,
            Some(crate::Algo::RecursiveDoubling) => 2,
        };
        let mut card = vec![u8::from(!any_udp), code];
        card.extend_from_slice(&crate::cpus::Placement::of_this_process().to_bytes());
        let all = boot.allgather(&card)?;
        let all_shm = size > 1 && all.iter().all(|v| v.first() == Some(&1));
        if let Some(p) = all.iter().position(|v| v.get(1) != Some(&code)) {
            return Err(Error::Invalid(format!(
                "rank {p} chose another AllReduce algorithm (SOFTRDMA_COLL_ALGO) than rank {rank}: every rank must set the same"
            )));
        }
        let placements = all
            .iter()
            .map(|v| crate::cpus::Placement::from_bytes(v.get(2..).unwrap_or_default()))
            .collect::<Vec<_>>();
        // Without a boot ID (no /proc) a rank cannot tell which ranks share
        // its host: the launcher's count of local ranks, against the CPUs
        // this process may use, decides.
        let yield_when_idle = if placements.get(rank).is_some_and(|p| p.host_known()) {
            crate::cpus::oversubscribed(&placements, rank)
        } else {
            let local_ranks = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
                .or_else(|_| std::env::var("SLURM_NTASKS_PER_NODE"))
                .or_else(|_| std::env::var("LOCAL_WORLD_SIZE"))
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(size);
            local_ranks > std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        Ok(Comm {
            rank,
            size,
            boot,
            config,
            links,
            fifo,
            flags,
            word,
            scratch,
            cq,
            pd,
            ctx,
            by_qpn,
            wc: vec![Completion::default(); 32],
            yield_when_idle,
            any_udp,
            all_shm,
            timeout,
            scratch_use: vec![None; slots],
            scratch_next: 0,
            stage: None,
            algo,
            calls: 0,
        })
    }

    /// Force an AllReduce algorithm (`None`: choose by size, the default).
    /// Every rank must force the same before its next AllReduce (the
    /// ranks of one call must run one schedule).
    pub fn set_all_reduce_algo(&mut self, a: Option<crate::Algo>) {
        self.algo = a;
    }

    /// This rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The chunk protocol's sizes.
    pub fn config(&self) -> Config {
        self.config
    }

    /// The device context (for its name, counters and transport).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Whether every peer is reached through shared memory (`"shm"`),
    /// none (`"udp"`), or some (`"mixed"`; a single rank says `"none"`).
    pub fn transport(&self) -> &'static str {
        let (mut shm, mut udp) = (0, 0);
        for l in self.links.iter().flatten() {
            if l.shm {
                shm += 1
            } else {
                udp += 1
            }
        }
        match (shm, udp) {
            (0, 0) => "none",
            (_, 0) => "shm",
            (0, _) => "udp",
            _ => "mixed",
        }
    }

    /// Allocate `len` bytes of registered memory for collectives, rounded
    /// up to whole pages (which peers on this host reach directly).
    pub fn alloc(&self, len: usize) -> Result<Buffer> {
        Ok(Buffer {
            mr: self.pd.alloc_mr(pages(len), ACCESS)?,
            _not_sync: std::marker::PhantomData,
        })
    }

    /// Return once every rank has called it (through the bootstrap
    /// connections).
    pub fn barrier(&mut self) -> Result<()> {
        self.boot.barrier()
    }

    /// Every rank's `mine` (through the bootstrap connections): for
    /// exchanging small metadata, such as results to report.
    pub fn allgather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.boot.allgather(mine)
    }

    fn link(&self, p: usize) -> Result<&Link> {
        match self.links.get(p) {
            Some(Some(l)) => Ok(l),
            _ => Err(Error::Invalid(format!(
                "rank {} has no peer {p} (ranks 0..{}, not itself)",
                self.rank, self.size
            ))),
        }
    }

    /// Address of peer `p`'s flag word for `slot` in our memory (`slot ==
    /// slots`: the credit word).
    fn flag_ptr(&self, p: usize, slot: usize) -> *const u8 {
        let i = p * (self.config.slots + 1) + slot;
        (self.flags.addr() as usize + i * 8) as *const u8
    }

    /// Reap completions; an error status fails the collective.
    fn poll(&mut self) -> Result<()> {
        loop {
            let n = self.cq.poll(&mut self.wc)?;
            for i in 0..n {
                let c = self.wc[i];
                let Some(&p) = self.by_qpn.get(&c.qp_num) else {
                    continue;
                };
                if !c.is_success() {
                    return Err(Error::Transfer {
                        rank: self.rank,
                        peer: p,
                        completion: c,
                    });
                }
                let l = self.links[p].as_mut().expect("a link per known QPN");
                l.retired = l.retired.max(c.wr_id);
            }
            if n < self.wc.len() {
                return Ok(());
            }
        }
    }

    /// Until `done` holds: reap completions, drive the device over UDP,
    /// and fail after the timeout, naming `why`.
    fn wait_for(&mut self, done: &dyn Fn(&Comm) -> bool, why: &str) -> Result<()> {
        if done(self) {
            return Ok(());
        }
        // The clock is read every 256th look, first at the 256th (the
        // timeout counts from there, microseconds late): a look over shared
        // memory is a few loads, and a clock read (a vDSO call, ~25 ns on a
        // VM) would be most of it; most waits end before their 256th look.
        let mut start = None;
        let mut looks = 0u32;
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            if self.any_udp {
                self.ctx.progress();
            }
            if done(self) {
                return Ok(());
            }
            looks = looks.wrapping_add(1);
            if looks.is_multiple_of(256)
                && start.get_or_insert_with(Instant::now).elapsed() > self.timeout
            {
                return Err(Error::Stalled(format!(
                    "rank {}: waited {:?} for {why}",
                    self.rank, self.timeout
                )));
            }
            if self.yield_when_idle {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The largest chunk, in bytes.
    pub(crate) fn chunk(&self) -> usize {
        self.config.chunk
    }

    fn sq_depth(&self) -> u64 {
        (3 * self.config.slots + 4) as u64
    }

    /// Wait for room for `n` requests in `p`'s send queue; the next
    /// request's id.
    fn room(&mut self, p: usize, n: u64) -> Result<u64> {
        let sq = self.sq_depth();
        self.wait_for(
            &|c: &Comm| {
                let l = c.links[p].as_ref().expect("checked");
                l.posted - l.retired + n < sq
            },
            "room in a send queue",
        )?;
        Ok(self.links[p].as_ref().expect("checked").posted + 1)
    }

    /// Post `wrs` (ids following on from `posted`, from [`Comm::room`]) on
    /// `p`'s QP in one call: what they put on the wire leaves together.
    fn post_list(&mut self, p: usize, wrs: &[SendWr<'_>]) -> Result<u64> {
        let l = self.links[p].as_mut().expect("checked");
        debug_assert!(wrs
            .iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == l.posted + 1 + i as u64));
        if let Err((i, e)) = l.qp.post_send_list(wrs) {
            // The ones before the refused one are posted.
            l.posted += i as u64;
            return Err(e.into());
        }
        l.posted += wrs.len() as u64;
        Ok(l.posted)
    }

    /// The staging word of request `id` to `p`, holding `v`: the source of
    /// an ATOMIC WRITE (per peer one word per send-queue entry, so a word
    /// is rewritten only after the request that read it retired, as
    /// [`Comm::room`] ensures).
    fn stage_word(&mut self, p: usize, id: u64, v: u64) -> Sge {
        let sq = self.sq_depth();
        let at = self.word.addr() + (p as u64 * sq + id % sq) * 8;
        // SAFETY: `at` is an aligned word of the staging region (size × sq
        // words), live while `self` is; no request still in flight reads
        // it (see above), only this thread writes it.
        unsafe { (at as *mut u64).write(v) };
        Sge {
            addr: at,
            length: 8,
            lkey: self.word.lkey(),
        }
    }

    /// ATOMIC WRITE `v` to the word at `remote_addr` of `p` (signalled).
    fn put_word(&mut self, p: usize, remote_addr: u64, v: u64) -> Result<u64> {
        let id = self.room(p, 1)?;
        let rkey = self.link(p)?.remote_flags.rkey;
        let sge = [self.stage_word(p, id, v)];
        self.post_list(p, &[atomic_write(id, remote_addr, rkey, &sge)])
    }

    /// Send `len` ≤ chunk bytes at `src` to peer `p`'s FIFO (waiting for a
    /// free slot); returns the ticket [`Comm::wait_sent`] waits for.
    pub(crate) fn send_chunk(&mut self, p: usize, src: Src, len: usize) -> Result<u64> {
        self.send_chunk_to(p, src, len, None)
    }

    /// [`Comm::send_chunk`], the data going to `to` in the peer's memory
    /// (a place it told us of) instead of its slot; the flag says so.
    pub(crate) fn send_chunk_to(
        &mut self,
        p: usize,
        src: Src,
        len: usize,
        to: Option<RemoteRegion>,
    ) -> Result<u64> {
        debug_assert!(len <= self.config.chunk);
        debug_assert!(to.is_none_or(|t| t.len >= len as u64));
        let (chunk, slots) = (self.config.chunk, self.config.slots);
        self.link(p)?;
        let credit = self.flag_ptr(p, slots);
        let free = |c: &Comm| {
            let l = c.links[p].as_ref().expect("checked");
            // SAFETY: our credit word for `p`, aligned, in `flags`.
            let consumed = unsafe { load(credit) };
            // The peer writes this word: a count beyond what we sent is its
            // own mistake (it frees slots it still holds), not a reason to
            // panic or to wrap into "no slot free for ever".
            l.sent.saturating_sub(consumed) < slots as u64
        };
        if !free(self) {
            self.flush_credits()?;
            self.wait_for(&free, "a free slot at a peer")?;
        }
        let l = self.links[p].as_ref().expect("checked");
        let slot = (l.sent % slots as u64) as usize;
        let (dst, rkey) = match to {
            Some(t) => (t.addr, t.rkey),
            None => (
                l.remote_fifo.addr + (slot * chunk) as u64,
                l.remote_fifo.rkey,
            ),
        };
        let flag_at = l.remote_flags.addr + (slot * 8) as u64;
        let seq = l.sent + 1;
        // This call's number on the link: the next one for its first chunk.
        let call = match l.send_call {
            (c, at) if at == self.calls => c,
            (c, _) => c.wrapping_add(1),
        };
        let flag = flag_word(seq, call, to.is_some(), len);
        let t = if len > 0 {
            let scratch = self.scratch.mr.addr();
            // Over shared memory the copy is normally done at post (then
            // the wait in `end` is one poll), but the verbs may send it the
            // wire's way instead.
            let user = src.addr < scratch || src.addr >= scratch + self.scratch.len() as u64;
            // The data and its flag in one post, and the credits owed to
            // the same peer with them: over UDP they leave in one pass of
            // the engine.
            let (owed, consumed) = {
                let l = self.link(p)?;
                (l.consumed > l.credited, l.consumed)
            };
            let id = self.room(p, 2 + u64::from(owed))?;
            let data = [Sge {
                addr: src.addr,
                length: len as u32,
                lkey: src.lkey,
            }];
            let word = [self.stage_word(p, id + 1, flag)];
            let credit_word = [self.stage_word(p, id + 2, consumed)];
            let l = self.link(p)?;
            let flag_rkey = l.remote_flags.rkey;
            let credit_at = l.credit_word(slots);
            let wrs = [
                SendWr {
                    wr_id: id,
                    op: SendOp::Write {
                        remote_addr: dst,
                        rkey,
                    },
                    sgl: &data,
                    flags: SendFlags::default(),
                    ud: None,
                },
                atomic_write(id + 1, flag_at, flag_rkey, &word),
                atomic_write(id + 2, credit_at, flag_rkey, &credit_word),
            ];
            self.post_list(p, &wrs[..2 + usize::from(owed)])?;
            let l = self.links[p].as_mut().expect("checked");
            if owed {
                l.credited = consumed;
            }
            if user {
                l.user_sent = id + 1;
            }
            // The chunk's ticket is its flag's request (the credit after it
            // reads only its staging word).
            id + 1
        } else {
            self.put_word(p, flag_at, flag)?
        };
        let l = self.links[p].as_mut().expect("checked");
        l.sent = seq;
        l.send_call = (call, self.calls);
        Ok(t)
    }

    /// Wait for the next chunk from peer `p`: its address in the FIFO and
    /// length. The slot stays ours until [`Comm::release`].
    pub(crate) fn recv_chunk(&mut self, p: usize) -> Result<(*const u8, usize)> {
        match self.recv_chunk_any(p)? {
            (ptr, len, false) => Ok((ptr, len)),
            (_, _, true) => Err(Error::Protocol(format!(
                "rank {p} wrote a chunk straight into this rank's buffer where it was due in a slot (do the ranks call the same collective?)"
            ))),
        }
    }

    /// [`Comm::recv_chunk`], also for chunks written straight to their
    /// place (the third value; the pointer is then the slot's, unused).
    pub(crate) fn recv_chunk_any(&mut self, p: usize) -> Result<(*const u8, usize, bool)> {
        let (chunk, slots) = (self.config.chunk, self.config.slots);
        let l = self.link(p)?;
        let slot = (l.consumed % slots as u64) as usize;
        let want = (l.consumed + 1) as u16;
        // This call's number on the link: the next one for its first chunk.
        let call = match l.recv_call {
            (c, at) if at == self.calls => c,
            (c, _) => c.wrapping_add(1),
        };
        let flag = self.flag_ptr(p, slot);
        // SAFETY: the flag word of `p`'s slot, aligned, in `flags`.
        let seen = |_: &Comm| (unsafe { load(flag) } >> 48) as u16 == want;
        if !seen(self) {
            self.flush_credits()?;
            self.wait_for(&seen, "a chunk from a peer")?;
        }
        // SAFETY: as above.
        let word = unsafe { load(flag) };
        let theirs = (word >> 32) as u16;
        if theirs != call {
            let (ahead, by) = if theirs.wrapping_sub(call) < 1 << 15 {
                ("a later", theirs.wrapping_sub(call))
            } else {
                ("an earlier", call.wrapping_sub(theirs))
            };
            return Err(Error::Protocol(format!(
                "rank {p} sent a chunk of {ahead} collective call ({by} call(s) apart) where this rank waits for one of its current call: the ranks called different collectives, or the same with different counts"
            )));
        }
        self.links[p].as_mut().expect("checked").recv_call = (call, self.calls);
        let placed = word & PLACED != 0;
        let len = (word & (PLACED - 1)) as usize;
        if len > chunk {
            return Err(Error::Protocol(format!(
                "rank {p} announced a chunk of {len} bytes (slots hold {chunk})"
            )));
        }
        let off = (p * slots + slot) * chunk;
        Ok(((self.fifo.addr() as usize + off) as *const u8, len, placed))
    }

    /// Give the oldest chunk's slot back to peer `p` (a credit).
    ///
    /// Credits go back in batches of half the slots, and all that are owed
    /// whenever this rank is about to wait ([`Comm::flush_credits`]): a
    /// rank that waits holds back no slot, so the batching can delay a peer
    /// but never block it, and the credit's write leaves while this rank
    /// would idle anyway rather than on the path of every call.
    pub(crate) fn release(&mut self, p: usize) -> Result<()> {
        let batch = (self.config.slots / 2).max(1) as u64;
        self.link(p)?;
        let l = self.links[p].as_mut().expect("checked");
        l.consumed += 1;
        if l.consumed - l.credited >= batch {
            self.credit(p)?;
        }
        Ok(())
    }

    /// Write peer `p`'s credit word with what we have consumed.
    fn credit(&mut self, p: usize) -> Result<()> {
        let slots = self.config.slots;
        let l = self.link(p)?;
        let (consumed, at) = (l.consumed, l.credit_word(slots));
        self.put_word(p, at, consumed)?;
        self.links[p].as_mut().expect("checked").credited = consumed;
        Ok(())
    }

    /// Return every credit owed (before a wait that may last).
    fn flush_credits(&mut self) -> Result<()> {
        for p in 0..self.size {
            if self.links[p]
                .as_ref()
                .is_some_and(|l| l.consumed > l.credited)
            {
                self.credit(p)?;
            }
        }
        Ok(())
    }

    /// Wait until the send `ticket` to peer `p` (and every one before it)
    /// has completed: its source memory may then be overwritten.
    pub(crate) fn wait_sent(&mut self, p: usize, ticket: u64) -> Result<()> {
        self.link(p)?;
        self.wait_for(
            &|c: &Comm| c.links[p].as_ref().expect("checked").retired >= ticket,
            "a send's completion",
        )
    }

    /// Whether every rank reaches every peer through shared memory (the
    /// same answer on every rank).
    pub(crate) fn all_shm(&self) -> bool {
        self.all_shm
    }

    /// Tell `to` where `mine` is (a place of ours it may write), and learn
    /// `from`'s: a 20-byte chunk each way, sent from a scratch slot.
    pub(crate) fn swap_places(
        &mut self,
        to: usize,
        mine: Src,
        len: usize,
        from: usize,
    ) -> Result<RemoteRegion> {
        let tmp = self.next_scratch()?;
        let mut rec = [0u8; 20];
        rec[..8].copy_from_slice(&mine.addr.to_le_bytes());
        rec[8..12].copy_from_slice(&mine.rkey.to_le_bytes());
        rec[12..].copy_from_slice(&(len as u64).to_le_bytes());
        // SAFETY: a scratch slot is a chunk (≥ 4 KiB) of our scratch
        // buffer, no longer read by any send (`next_scratch` waited).
        unsafe { std::ptr::copy_nonoverlapping(rec.as_ptr(), tmp.ptr(), rec.len()) };
        self.send_scratch(to, tmp, rec.len())?;
        let (slot, got) = self.recv_chunk(from)?;
        if got != rec.len() {
            return Err(Error::Protocol(format!(
                "rank {from} sent {got} bytes where its buffer's place was due"
            )));
        }
        // SAFETY: the slot holds the 20 bytes the peer wrote (checked).
        unsafe { std::ptr::copy_nonoverlapping(slot, rec.as_mut_ptr(), rec.len()) };
        self.release(from)?;
        Ok(RemoteRegion {
            addr: u64::from_le_bytes(rec[..8].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(rec[8..12].try_into().expect("4 bytes")),
            len: u64::from_le_bytes(rec[12..].try_into().expect("8 bytes")),
        })
    }

    /// The next slot of the scratch ring (one chunk), once no send reads
    /// it any more: for data a send must not read from where it will be
    /// overwritten. Send it with [`Comm::send_scratch`].
    pub(crate) fn next_scratch(&mut self) -> Result<Scratch> {
        let i = self.scratch_next;
        self.scratch_next = (i + 1) % self.scratch_use.len();
        if let Some((p, t)) = self.scratch_use[i].take() {
            self.wait_sent(p, t)?;
        }
        Ok(Scratch {
            slot: i,
            src: Src::of(&self.scratch, i * self.config.chunk),
        })
    }

    /// Send `len` bytes of scratch slot `s` to `p`; the slot is not handed
    /// out again before this send has completed.
    pub(crate) fn send_scratch(&mut self, p: usize, s: Scratch, len: usize) -> Result<u64> {
        let t = self.send_chunk(p, s.src, len)?;
        self.scratch_use[s.slot] = Some((p, t));
        Ok(t)
    }

    /// The engine reads a send's memory when it transmits (and again if it
    /// retransmits): before a collective returns, wait for the sends that
    /// read the caller's memory, so the caller may reuse it. (Over shared
    /// memory a WRITE's copy is normally done when its post returns, and
    /// this is one poll; sends from our scratch are waited for when the
    /// slot is reused.)
    pub(crate) fn end(&mut self) -> Result<()> {
        for p in 0..self.size {
            if let Some(l) = &self.links[p] {
                let t = l.user_sent;
                self.wait_sent(p, t)?;
            }
        }
        Ok(())
    }

    /// Start a collective call: its chunks carry the next call number on
    /// each link they use (every rank must make the same calls, with the
    /// same counts, in the same order).
    pub(crate) fn begin(&mut self) {
        self.calls += 1;
    }
}
