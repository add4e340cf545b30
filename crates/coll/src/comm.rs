//! The communicator: N ranks, one pair of RC QPs between every two, and the
//! chunk protocol every collective is built from.
//!
//! # The protocol
//!
//! Every rank owns a FIFO of `slots` chunk buffers of `chunk` bytes *per
//! peer*, registered once when the communicator is made; the peer learns
//! its address and rkey from the card swapped at start-up. To move a chunk
//! to peer p a rank needs a *credit* (a free slot of p's FIFO for it):
//!
//! 1. it RDMA WRITEs the chunk into the next slot and p's receive
//!    completes with the chunk's length as immediate data — over UDP one
//!    RDMA WRITE with immediate carries both; over shared memory the data
//!    goes as a plain RDMA WRITE on a *data QP* (carried out at once, by a
//!    memory copy into p's pages) and a zero-length WRITE with immediate on
//!    the *control QP* says it is there, once the first has completed;
//! 2. p consumes the slot (reduces or copies it out) and SENDs the credit
//!    back (a zero-length SEND on the control QP), as NCCL's IB transport
//!    moves data with WRITE-with-immediate and control with Send/Recv.
//!
//! Chunks of one peer arrive, and are consumed, in order: a slot index is
//! never sent, both ends count. Every receive a peer can cause is posted in
//! advance (at most `slots` chunks and `slots` credits are in flight from
//! one peer, and every receive is re-posted as it completes), so a peer is
//! never RNR-NAKed. Sends, their completions and the memory they read are
//! tracked per peer: a buffer that will be overwritten waits for the sends
//! reading it ([`Comm::wait_sent`]).
//!
//! Waiting is busy polling of the completion queue, as NCCL's proxy does:
//! a collective is latency-bound work with a peer that answers in
//! microseconds. When the job has more ranks on this host than the host has
//! CPUs, a waiting rank yields the CPU after each empty poll (a spinning
//! rank would otherwise hold off the very rank it waits for).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    AccessFlags, Completion, ConnectOptions, Context, Cq, Mr, OpenOptions, Pd, Qp, QpCap,
    QpEndpoint, QpInitAttr, QpType, RecvWr, RemoteRegion, SendFlags, SendOp, SendWr, Sge, WcOpcode,
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
        if c.chunk < 4096 || c.chunk > (1 << 30) || c.chunk % 64 != 0 {
            return Err(Error::Invalid(format!(
                "chunk of {} bytes: 4 KiB to 1 GiB, a multiple of 64",
                c.chunk
            )));
        }
        if !(2..=64).contains(&c.slots) {
            return Err(Error::Invalid(format!(
                "{} slots per peer: 2 to 64",
                c.slots
            )));
        }
        Ok(c)
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
}

impl Src {
    pub fn of(b: &Buffer, offset: usize) -> Src {
        Src {
            addr: b.mr.addr() + offset as u64,
            lkey: b.mr.lkey(),
        }
    }
    pub fn ptr(self) -> *mut u8 {
        self.addr as *mut u8
    }
    pub fn add(self, bytes: usize) -> Src {
        Src {
            addr: self.addr + bytes as u64,
            lkey: self.lkey,
        }
    }
}

/// One peer: its two QPs and both ends' FIFO bookkeeping.
struct Link {
    ctl: Qp,
    data: Qp,
    /// Our slots in the peer's FIFO.
    remote: RemoteRegion,
    /// Through shared memory: data by the data QP, signal on the control QP.
    shm: bool,
    /// Free slots of the peer's FIFO we may write.
    credits: usize,
    /// The next of them.
    next_slot: usize,
    /// Lengths of the chunks that arrived from the peer, oldest first.
    arrived: VecDeque<u32>,
    /// The slot the oldest arrived chunk is in.
    read_slot: usize,
    /// Signalled sends posted on the control QP, and completed.
    posted: u64,
    completed: u64,
}

const WR_CHUNK: u64 = 1;
const WR_CREDIT: u64 = 2;

/// A communicator of `size` ranks.
pub struct Comm {
    rank: usize,
    size: usize,
    boot: Bootstrap,
    config: Config,
    // Field order is drop order: QPs and regions before the CQs, PD and
    // context they belong to.
    links: Vec<Option<Link>>,
    fifo: Mr,
    pub(crate) scratch: Buffer,
    cq: Cq,
    dcq: Cq,
    pd: Pd,
    ctx: Context,
    by_qpn: HashMap<u32, usize>,
    wc: Vec<Completion>,
    /// Yield the CPU after an empty poll (more local ranks than CPUs).
    yield_when_idle: bool,
    timeout: Duration,
    data_wr: u64,
    /// Scratch sends: per slot of the scratch ring, the (peer, ticket) of
    /// the last send that read it.
    pub(crate) scratch_use: Vec<Option<(usize, u64)>>,
    /// The AllReduce algorithm forced (`SOFTRDMA_COLL_ALGO`,
    /// [`Comm::set_all_reduce_algo`]), else chosen per call.
    pub(crate) algo: Option<crate::Algo>,
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

impl Comm {
    /// Join the job the environment describes ([`Launch::from_env`]) with
    /// the default [`Config`] (or the environment's).
    pub fn from_env() -> Result<Comm> {
        Comm::init(Launch::from_env()?, Config::from_env()?)
    }

    /// Join the ranks of `launch`: meet them, open the device on the
    /// address the rendezvous uses, connect a QP pair to every other rank,
    /// and return once all are connected.
    pub fn init(launch: Launch, config: Config) -> Result<Comm> {
        let mut boot = Bootstrap::join(launch)?;
        let (rank, size) = (boot.rank(), boot.size());
        let timeout = boot.timeout();
        let dev = softrdma_verbs::by_addr(boot.local_ip())?;
        let ctx = Context::open(&dev, &OpenOptions::default())?;
        let pd = ctx.alloc_pd();
        let Config { chunk, slots } = config;
        let peers = size.saturating_sub(1);
        // Per peer: `slots` chunk signals and `slots` credits received at
        // most, as many sends of each kind outstanding.
        let qdepth = (2 * slots + 2) as u32;
        let cq = ctx.create_cq(((peers.max(1)) as u32 * 2 * qdepth).max(64), None)?;
        let dcq = ctx.create_cq((peers.max(1) as u32 * 4).max(16), None)?;
        let fifo = pd.alloc_mr((size * slots * chunk).max(4096), ACCESS)?;
        let scratch = Buffer {
            mr: pd.alloc_mr(slots * chunk, ACCESS)?,
        };
        let cap = QpCap {
            max_send_wr: qdepth,
            max_recv_wr: qdepth,
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
                card_entry(&mut card, &[]);
                continue;
            }
            let mut init = QpInitAttr::new(QpType::Rc, &cq);
            init.cap = cap;
            let ctl = pd.create_qp(&init)?;
            let mut init = QpInitAttr::new(QpType::Rc, &dcq);
            init.cap = QpCap {
                max_send_wr: 4,
                max_recv_wr: 1,
                ..cap
            };
            let data = pd.create_qp(&init)?;
            let slots_for_p = RemoteRegion {
                addr: fifo.iova() + (p * slots * chunk) as u64,
                rkey: fifo.rkey(),
                len: (slots * chunk) as u64,
            };
            card_entry(
                &mut card,
                &ctl.endpoint().with_regions([slots_for_p]).to_bytes(),
            );
            card_entry(&mut card, &data.endpoint().to_bytes());
            qps.push(Some((ctl, data)));
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
            let Some((ctl, data)) = q else {
                links.push(None);
                continue;
            };
            let bad = || Error::Bootstrap(format!("rank {p} sent a malformed card"));
            let entries = card_entries(&cards[p]).ok_or_else(bad)?;
            if entries.len() != 2 * size {
                return Err(bad());
            }
            let pctl = QpEndpoint::from_bytes(entries[2 * rank])?;
            let pdata = QpEndpoint::from_bytes(entries[2 * rank + 1])?;
            let remote = *pctl.regions.first().ok_or_else(bad)?;
            if remote.len < (slots * chunk) as u64 {
                return Err(Error::Bootstrap(format!(
                    "rank {p} offers {} bytes of FIFO, this rank needs {} (SOFTRDMA_COLL_CHUNK/SLOTS differ between ranks?)",
                    remote.len,
                    slots * chunk
                )));
            }
            ctl.connect(&pctl, &opts)?;
            data.connect(&pdata, &opts)?;
            for _ in 0..qdepth {
                ctl.post_recv(&RecvWr { wr_id: 0, sgl: &[] })?;
            }
            by_qpn.insert(ctl.qpn(), p);
            links.push(Some(Link {
                ctl,
                data,
                remote,
                shm: false,
                credits: slots,
                next_slot: 0,
                arrived: VecDeque::new(),
                read_slot: 0,
                posted: 0,
                completed: 0,
            }));
        }
        // Every QP is connected (and its receives posted) before anyone
        // sends.
        boot.barrier()?;
        for l in links.iter_mut().flatten() {
            l.shm = l.ctl.transport() == "shm" && l.data.transport() == "shm";
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local_ranks = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
            .or_else(|_| std::env::var("SLURM_NTASKS_PER_NODE"))
            .or_else(|_| std::env::var("LOCAL_WORLD_SIZE"))
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(size);
        Ok(Comm {
            rank,
            size,
            boot,
            config,
            links,
            fifo,
            scratch,
            cq,
            dcq,
            pd,
            ctx,
            by_qpn,
            wc: vec![Completion::default(); 32],
            yield_when_idle: local_ranks > cpus,
            timeout,
            data_wr: 0,
            scratch_use: vec![None; slots],
            algo: match std::env::var("SOFTRDMA_COLL_ALGO").as_deref() {
                Ok("ring") => Some(crate::Algo::Ring),
                Ok("rd") => Some(crate::Algo::RecursiveDoubling),
                Ok("auto") | Err(_) => None,
                Ok(v) => {
                    return Err(Error::Invalid(format!(
                        "SOFTRDMA_COLL_ALGO={v:?}: ring, rd or auto"
                    )))
                }
            },
        })
    }

    /// Force an AllReduce algorithm (`None`: choose by size, the default).
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

    /// Allocate `len` bytes of registered memory for collectives.
    pub fn alloc(&self, len: usize) -> Result<Buffer> {
        Ok(Buffer {
            mr: self.pd.alloc_mr(len.max(1), ACCESS)?,
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

    fn link(&mut self, p: usize) -> Result<&mut Link> {
        match self.links.get_mut(p) {
            Some(Some(l)) => Ok(l),
            _ => Err(Error::Invalid(format!(
                "rank {} has no peer {p} (ranks 0..{}, not itself)",
                self.rank, self.size
            ))),
        }
    }

    /// Poll the completion queue once; `Ok(false)` if it was empty.
    fn progress(&mut self) -> Result<bool> {
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
            match c.opcode {
                WcOpcode::RecvRdmaWithImm => {
                    l.arrived.push_back(c.imm_or_inv);
                    l.ctl.post_recv(&RecvWr { wr_id: 0, sgl: &[] })?;
                }
                WcOpcode::Recv => {
                    l.credits += 1;
                    l.ctl.post_recv(&RecvWr { wr_id: 0, sgl: &[] })?;
                }
                _ => l.completed += 1,
            }
        }
        Ok(n > 0)
    }

    /// Poll until `done` holds, or fail after the timeout with `what`.
    fn wait_for(&mut self, what: &dyn Fn(&Comm) -> bool, why: &str) -> Result<()> {
        let mut since: Option<Instant> = None;
        while !what(self) {
            if self.progress()? {
                since = None;
                continue;
            }
            let now = Instant::now();
            match since {
                None => since = Some(now),
                Some(s) if now - s > self.timeout => {
                    return Err(Error::Stalled(format!(
                        "rank {}: nothing happened for {:?} while waiting for {why}",
                        self.rank, self.timeout
                    )))
                }
                _ => {}
            }
            if self.yield_when_idle {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// The largest chunk, in bytes.
    pub(crate) fn chunk(&self) -> usize {
        self.config.chunk
    }

    /// Send `len` ≤ chunk bytes at `src` to peer `p`'s FIFO (waiting for a
    /// credit); returns the ticket [`Comm::wait_sent`] waits for.
    pub(crate) fn send_chunk(&mut self, p: usize, src: Src, len: usize) -> Result<u64> {
        debug_assert!(len <= self.config.chunk);
        let (chunk, slots) = (self.config.chunk, self.config.slots);
        self.link(p)?;
        let qdepth = (2 * slots + 2) as u64;
        self.wait_for(
            &|c: &Comm| {
                let l = c.links[p].as_ref().expect("checked");
                l.credits > 0 && l.posted - l.completed < qdepth - 1
            },
            "a free slot at a peer",
        )?;
        let l = self.links[p].as_mut().expect("checked");
        let dst = l.remote.addr + (l.next_slot * chunk) as u64;
        let sge = [Sge {
            addr: src.addr,
            length: len as u32,
            lkey: src.lkey,
        }];
        let sgl: &[Sge] = if len == 0 { &[] } else { &sge };
        if l.shm && len > 0 {
            // The data by the data QP (carried out at once as a copy into
            // the peer's memory), and its completion awaited, so the signal
            // below can never overtake it (two QPs are not ordered).
            self.data_wr += 1;
            let id = self.data_wr;
            l.data.post_send(&SendWr {
                wr_id: id,
                op: SendOp::Write {
                    remote_addr: dst,
                    rkey: l.remote.rkey,
                },
                sgl,
                flags: SendFlags::SIGNALED,
                ud: None,
            })?;
            self.wait_data(id)?;
        }
        let l = self.links[p].as_mut().expect("checked");
        l.ctl.post_send(&SendWr {
            wr_id: WR_CHUNK,
            op: SendOp::WriteWithImm {
                remote_addr: dst,
                rkey: l.remote.rkey,
                imm: len as u32,
            },
            sgl: if l.shm { &[] } else { sgl },
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        l.credits -= 1;
        l.next_slot = (l.next_slot + 1) % slots;
        l.posted += 1;
        Ok(l.posted)
    }

    fn wait_data(&mut self, id: u64) -> Result<()> {
        let start = Instant::now();
        let mut wc = [Completion::default(); 4];
        loop {
            let n = self.dcq.poll(&mut wc)?;
            for c in &wc[..n] {
                if !c.is_success() {
                    let peer = self
                        .links
                        .iter()
                        .position(|l| l.as_ref().is_some_and(|l| l.data.qpn() == c.qp_num))
                        .unwrap_or(usize::MAX);
                    return Err(Error::Transfer {
                        rank: self.rank,
                        peer,
                        completion: *c,
                    });
                }
                if c.wr_id == id {
                    return Ok(());
                }
            }
            if n == 0 {
                // Not carried out at once (the peer's memory was not
                // reachable): it goes the wire's way; keep the control
                // completions moving meanwhile.
                self.progress()?;
                if start.elapsed() > self.timeout {
                    return Err(Error::Stalled(format!(
                        "rank {}: an RDMA WRITE did not complete within {:?}",
                        self.rank, self.timeout
                    )));
                }
            }
        }
    }

    /// Wait for the next chunk from peer `p`: its address in the FIFO and
    /// length. The slot stays ours until [`Comm::release`].
    pub(crate) fn recv_chunk(&mut self, p: usize) -> Result<(*const u8, usize)> {
        self.link(p)?;
        self.wait_for(
            &|c: &Comm| !c.links[p].as_ref().expect("checked").arrived.is_empty(),
            "a chunk from a peer",
        )?;
        let (chunk, slots) = (self.config.chunk, self.config.slots);
        let l = self.links[p].as_ref().expect("checked");
        let len = *l.arrived.front().expect("waited for") as usize;
        if len > chunk {
            return Err(Error::Protocol(format!(
                "rank {p} announced a chunk of {len} bytes (slots hold {chunk})"
            )));
        }
        let off = (p * slots + l.read_slot) * chunk;
        Ok(((self.fifo.addr() as usize + off) as *const u8, len))
    }

    /// Give the oldest chunk's slot back to peer `p` (a credit).
    pub(crate) fn release(&mut self, p: usize) -> Result<()> {
        let slots = self.config.slots;
        let qdepth = (2 * slots + 2) as u64;
        self.wait_for(
            &|c: &Comm| {
                let l = c.links[p].as_ref().expect("a link");
                l.posted - l.completed < qdepth - 1
            },
            "room in a send queue",
        )?;
        let l = self.link(p)?;
        l.arrived.pop_front();
        l.read_slot = (l.read_slot + 1) % slots;
        l.ctl.post_send(&SendWr {
            wr_id: WR_CREDIT,
            op: SendOp::Send,
            sgl: &[],
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        l.posted += 1;
        Ok(())
    }

    /// Wait until the send `ticket` to peer `p` (and every one before it)
    /// has completed: its source memory may then be overwritten.
    pub(crate) fn wait_sent(&mut self, p: usize, ticket: u64) -> Result<()> {
        self.link(p)?;
        self.wait_for(
            &|c: &Comm| c.links[p].as_ref().expect("checked").completed >= ticket,
            "a send's completion",
        )
    }

    /// Wait until the scratch slot `i` is no longer read by a send.
    pub(crate) fn scratch_slot(&mut self, i: usize) -> Result<Src> {
        if let Some((p, t)) = self.scratch_use[i].take() {
            self.wait_sent(p, t)?;
        }
        Ok(Src::of(&self.scratch, i * self.config.chunk))
    }

    /// Wait for every send this rank posted to complete.
    pub(crate) fn quiesce(&mut self) -> Result<()> {
        for p in 0..self.size {
            if let Some(l) = &self.links[p] {
                let t = l.posted;
                self.wait_sent(p, t)?;
            }
        }
        Ok(())
    }
}
