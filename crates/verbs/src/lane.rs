//! The lock-free lane: RDMA WRITEs and READs of an RC QP whose peer shares
//! memory with us, carried out in the posting thread without the engine's
//! lock — a NIC's doorbell with nothing between it and the DMA engine —
//! and their completions, queued per CQ ([`CqLane`]) and polled without
//! the lock too.
//!
//! Through shared memory a one-sided operation is already carried out at
//! post (`Endpoint::post_send_offload`): the poster copies straight into
//! the peer's registered memory. What remained per post was the engine:
//! its lock, the core's validation of the work request, the region table's
//! hash lookup, the pass's bookkeeping — four fifths of a 100 ns post,
//! measured (`docs/PERFORMANCE.md`, "The lock-free lane"). The lane keeps
//! what a post needs while nothing about the QP changes:
//!
//! * it is **opened** by the engine, under its lock, after a post that the
//!   core carried out at once, if the QP is RC, in RTS, signals only what
//!   it is asked to, has an empty send queue (so nothing of it waits in a
//!   ring: an RC request leaves the queue when acknowledged, that is
//!   executed) and reaches its peer through shared memory; it then holds
//!   the peer, the QP's limits and the translations of the regions that
//!   post named (lkey, iova, length, host address, local write), read from
//!   the region table;
//! * a post that is a WRITE, a READ or an atomic (compare-and-swap,
//!   fetch-and-add) with no flag but `SIGNALED` (not inline, not fenced),
//!   or a SEND (which may be inline or solicited too) into a receive the
//!   peer published for it ([`RecvQ`]), whose SGEs all lie in a
//!   remembered region, is
//!   carried out by [`Lane::try_post`]: nothing queued, and if signaled
//!   its completion goes into the send CQ's [`CqLane`] while that is open.
//!   Anything else — a SEND, an ATOMIC WRITE, an SGE in another region, a
//!   CQ whose queue is closed, a peer that refuses — goes the engine's way,
//!   which checks, errs and completes exactly as before;
//! * it is **closed** by the engine, under its lock, before anything that
//!   could make what it holds untrue or let it write where it must not: a
//!   region withdrawn (deregistration, reregistration), any region's bytes
//!   lent out as references (`Mr::with_bytes*`), a registration that moves
//!   pages into shared memory, any QP's state changing (a modify, an error
//!   the transport ran into, a destroy), a post that queued work.
//!   Closing waits for a post in progress (it holds the lane), so when a region's
//!   deregistration goes on, no lane reads or writes its memory, and none
//!   will: the next post finds the lane closed and takes the engine's way,
//!   where the lkey no longer resolves.
//!
//! Holding a lane (or a CQ lane) is a flag, not a lock anybody waits on
//! while holding another ([`Biased`]: biased to the thread that posts or
//! polls through it): a poster only tries it (and takes the engine's way
//! if it is held), and the engine takes it, under its own lock, only to
//! close or refill — several at once when it closes them all, which waits
//! only for posts in progress, never for anything a poster holds. A poster
//! never takes the engine's lock while it holds one.

use std::cell::UnsafeCell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use softrdma_core::cq::CqId;
use softrdma_core::mr::Span;
use softrdma_core::wc::Completion;
use softrdma_core::wr::{SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{OffloadLocal, MAX_MSG_SIZE, MAX_SGE};
use softrdma_shm::{barrier, RECV_SGES, RECV_SLOTS};

/// Regions a lane remembers (perftest and most programs post from one).
const KEYS: usize = 2;

/// A value one thread at a time holds, behind a flag that is biased to one
/// thread: posters and pollers only try it (and take the engine's way if
/// it is held), the engine, under its lock, waits for it. Both the lane's
/// state and a CQ lane's queue are one. A lane's posts, and a CQ's posts
/// and polls, nearly always come from one thread (perftest's, an MPI
/// rank's, a UCX worker's), and for that thread holding it costs no
/// atomic read-modify-write. A compare-and-swap is a full barrier: it
/// waits for the poster's earlier stores (the last post's copy into the
/// peer's memory) to drain, and was a third of an 8-byte WRITE's post
/// (`perf write_bw -s 8` over shared memory: 43 → 53 Mmsg/s without it).
///
/// * The *owner* (`owner`, a thread's [`me`]) holds it by setting
///   `owner_in` with a plain store, a compiler fence (see [`barrier`];
///   a full fence where `membarrier(2)` is refused), then finding `held`
///   clear and itself still the owner.
/// * Anyone else takes `held` by compare-and-swap, then, if the value is
///   biased to another thread, runs a [`barrier::heavy`] (a
///   `membarrier(2)`), waits for `owner_in` to clear and revokes the bias
///   (`owner` = 0). Store-then-load on each side with the asymmetric fence
///   between (Dekker's): either the owner's `owner_in` is visible to the
///   revoker, which waits, or the owner's loads see `held` taken (or, once
///   the revoker has let go, the revocation its release carries) and it
///   backs off.
///
/// The bias is given ([`BiasedHolding::bias`], as the engine opens the
/// lane in a poster's thread) to the first thread that asks, and taken
/// away by any other holder — for good (`shared`) if that is a poster or
/// an opener too: a value used by two posting threads stays unbiased, so
/// they pay the compare-and-swap, never a `membarrier` per hand-over. The
/// engine's other holds (closing, from whichever thread holds its lock)
/// revoke it until the next opening: rare, and a `membarrier` each. A
/// CQ lane's queue is biased to the first thread that posts a signaled
/// request or polls through it (`CqLane::reserve`, `CqLane::poll_quiet`),
/// and any other thread's hold — the engine thread's included
/// (`hold_sharing`) — leaves it shared for good: a CQ the engine thread
/// serves pays the compare-and-swap as before, and one `membarrier` once.
/// The exception is the engine's closing and reopening of the queue while
/// an application thread polls the device: that only revokes the bias
/// until the poller's next hold (see `CqLane::bookkeeping_hold`).
/// A thread's `me` is its thread pointer (or a thread-local's address),
/// unique among live threads: a later thread that reuses an exited owner's
/// is the only one that can claim it, which is all the bias needs.
struct Biased<T> {
    /// The thread the value is biased to (its `me`), 0 for none. Written
    /// only by a holder of `held` (or by the owner, holding, to itself).
    owner: AtomicUsize,
    /// True while the owner holds the value without `held`; written only
    /// by the owner.
    owner_in: AtomicBool,
    /// Taken by compare-and-swap by every holder but the owner.
    held: AtomicBool,
    /// The first thread the value was biased to. Written by holders only.
    first: AtomicUsize,
    /// A second thread posted through it or asked for the bias: it is not
    /// given again. Written by holders only.
    shared: AtomicBool,
    /// `barrier::expedited()`, read when the value was made: the owner's
    /// fence is then a compiler fence alone (see `barrier::expedited`). Kept
    /// here because a load of the barrier's own static between the owner's
    /// store and its loads cost ~8 ns a post (`perf write_bw -s 8` over
    /// shared memory: 42-43 against 50-52 Mmsg/s with this field,
    /// alternated by hand; the reason was not found).
    expedited: bool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is reached only through a `Holding`, and two holdings of
// one `Biased` never exist at once: a flag holder has taken `held` by
// compare-and-swap (only one can) and, if the value was biased to another
// thread, waited after a heavy barrier until that owner was not in (and
// revoked the bias while holding `held`, so it cannot come back in); an
// owner holds with `owner_in` set and only after seeing `held` clear and
// itself the owner after its fence (see the type's docs). Each
// holder sees the previous one's writes: `held` is taken with Acquire and
// let go with Release, `owner_in` cleared with Release and read with
// Acquire by whoever waits for it, and an owner's Acquire load of `held`
// reads the last flag holder's Release. `T: Send` makes handing it from
// thread to thread sound; `T: Sync` because a holding is itself `Sync` (it
// is a reference to this), so a `&BiasedHolding` shared between threads
// would hand each a `&T` at once.
unsafe impl<T: Send + Sync> Sync for Biased<T> {}

/// This thread's token for [`Biased::owner`] (`softrdma_shm::thread_token`).
#[inline(always)]
fn me() -> usize {
    softrdma_shm::thread_token()
}

/// `Biased`'s value, held; let go on drop (also if the holder unwinds).
struct BiasedHolding<'a, T> {
    of: &'a Biased<T>,
    /// Held as the owner (`owner_in`), not by the flag.
    owner: bool,
}

impl<T> Drop for BiasedHolding<'_, T> {
    fn drop(&mut self) {
        if self.owner {
            self.of.owner_in.store(false, Ordering::Release);
        } else {
            self.of.held.store(false, Ordering::Release);
        }
    }
}

impl<T> std::ops::Deref for BiasedHolding<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this holding holds the value (see the `Sync` impl), and
        // the borrow of `self` keeps the reference from outliving it.
        unsafe { &*self.of.value.get() }
    }
}

impl<T> std::ops::DerefMut for BiasedHolding<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`.
        unsafe { &mut *self.of.value.get() }
    }
}

impl<T> Biased<T> {
    fn new(value: T) -> Biased<T> {
        Biased {
            owner: AtomicUsize::new(0),
            owner_in: AtomicBool::new(false),
            held: AtomicBool::new(false),
            first: AtomicUsize::new(0),
            shared: AtomicBool::new(false),
            expedited: barrier::expedited(),
            value: UnsafeCell::new(value),
        }
    }

    /// Hold the value if nobody does (a post: it takes the engine's way
    /// otherwise). `share`: if the value was another thread's, it stays
    /// unbiased for good (see [`BiasedHolding::bias`]) — a second poster
    /// through a send lane, any holder of a CQ lane's queue.
    #[inline(always)]
    fn try_hold(&self, share: bool) -> Option<BiasedHolding<'_, T>> {
        let me = me();
        if self.owner.load(Ordering::Relaxed) == me {
            return self.take_as_owner(me);
        }
        self.try_hold_by_flag(me, share)
    }

    /// [`Biased::try_hold`] by a thread the value is not biased to: out of
    /// the owner's way (its code is not in the owner's loop).
    #[cold]
    #[inline(never)]
    fn try_hold_by_flag(&self, me: usize, share: bool) -> Option<BiasedHolding<'_, T>> {
        let h = self.take_flag()?;
        if self.revoke(me) && share {
            self.shared.store(true, Ordering::Relaxed);
        }
        Some(h)
    }

    /// The first step of a hold by thread `me`: as the owner (`owner_in`,
    /// then the look at `held` and `owner`), or by taking `held` — then,
    /// if the value is biased to another thread, that owner may still be
    /// in until the caller revokes the bias (`revoke`, or `hold_all`'s
    /// shared barrier) before it touches the value.
    fn take(&self, me: usize) -> Option<BiasedHolding<'_, T>> {
        if self.owner.load(Ordering::Relaxed) == me {
            return self.take_as_owner(me);
        }
        self.take_flag()
    }

    /// [`Biased::take`] by taking `held` (a thread the value is not
    /// biased to).
    fn take_flag(&self) -> Option<BiasedHolding<'_, T>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| BiasedHolding {
                of: self,
                owner: false,
            })
    }

    /// [`Biased::take`] by the owner `me`.
    #[inline(always)]
    fn take_as_owner(&self, me: usize) -> Option<BiasedHolding<'_, T>> {
        self.owner_in.store(true, Ordering::Relaxed);
        if self.expedited {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        if !self.held.load(Ordering::Acquire) && self.owner.load(Ordering::Relaxed) == me {
            return Some(BiasedHolding {
                of: self,
                owner: true,
            });
        }
        self.owner_in.store(false, Ordering::Release);
        None
    }

    /// Hold the value, waiting for its holder (the engine: a poster's one
    /// copy is all it can wait for).
    fn hold(&self) -> BiasedHolding<'_, T> {
        self.hold_as(false)
    }

    /// Hold the value, waiting for its holder; if it was another thread's,
    /// it stays unbiased for good (see [`BiasedHolding::bias`]).
    fn hold_sharing(&self) -> BiasedHolding<'_, T> {
        self.hold_as(true)
    }

    /// Wait for [`Biased::try_hold`]`(share)` to succeed.
    fn hold_as(&self, share: bool) -> BiasedHolding<'_, T> {
        loop {
            if let Some(h) = self.try_hold(share) {
                return h;
            }
            std::thread::yield_now();
        }
    }

    /// With `held` taken by thread `me`: if the value is biased to another
    /// thread, wait until it is not in and take the bias away (true).
    fn revoke(&self, me: usize) -> bool {
        if !self.biased_elsewhere(me) {
            return false;
        }
        barrier::heavy();
        self.wait_and_unbias();
        true
    }

    fn biased_elsewhere(&self, me: usize) -> bool {
        let o = self.owner.load(Ordering::Relaxed);
        o != 0 && o != me
    }

    /// After a heavy barrier that followed taking `held`: wait for the
    /// owner to be out, and take the bias away.
    fn wait_and_unbias(&self) {
        while self.owner_in.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        self.owner.store(0, Ordering::Relaxed);
    }

    /// [`Biased::hold`] for many values at once, with one heavy barrier for
    /// all those biased to other threads instead of one each: the engine
    /// closing every lane (a QP's state changed) from a thread that owns
    /// few or none of them. Each flag is taken first (the owners it does
    /// not belong to may still be in), then one barrier, then each owner is
    /// waited for — the handshake of `revoke`, with the barrier shared.
    /// Only the engine, under its lock, holds several values at once, and
    /// an owner in never waits for anything: taking them in turn cannot
    /// deadlock.
    fn hold_all<'a>(values: impl Iterator<Item = &'a Biased<T>>) -> Vec<BiasedHolding<'a, T>>
    where
        T: 'a,
    {
        let me = me();
        let mut held = Vec::new();
        let mut revoke = Vec::new();
        for b in values {
            let h = loop {
                if let Some(h) = b.take(me) {
                    break h;
                }
                std::thread::yield_now();
            };
            revoke.push(!h.owner && b.biased_elsewhere(me));
            held.push(h);
        }
        if revoke.iter().any(|&r| r) {
            barrier::heavy();
            for (h, _) in held.iter().zip(&revoke).filter(|(_, &r)| r) {
                h.of.wait_and_unbias();
            }
        }
        held
    }
}

impl<T> BiasedHolding<'_, T> {
    /// Bias the value to this thread (the lane's opener, whose posts come
    /// next) if it is the first thread that ever asked and no other thread
    /// has posted through it since (`shared`: it stays unbiased for good).
    #[inline(always)]
    fn bias(&mut self) {
        if !self.owner {
            self.bias_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn bias_slow(&mut self) {
        let me = me();
        let b = self.of;
        if b.shared.load(Ordering::Relaxed) {
            return;
        }
        let first = b.first.load(Ordering::Relaxed);
        if first == 0 {
            b.first.store(me, Ordering::Relaxed);
        } else if first != me {
            // Another thread's value: `revoke` ran as `held` was taken.
            b.shared.store(true, Ordering::Relaxed);
            return;
        }
        // Held by the flag, the owner `me` or nobody (`revoke` ran), or as
        // the owner already: no other thread reads `owner == me`.
        b.owner.store(me, Ordering::Relaxed);
    }
}

/// One remembered region, as the region table had it when the lane opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub lkey: u32,
    pub iova: u64,
    pub len: u64,
    pub host: u64,
    /// The region grants `LOCAL_WRITE` (a READ's or atomic's result).
    pub local_write: bool,
}

impl Region {
    /// The host address of `[addr, addr + len)` if it lies inside.
    fn host_of(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.iova)?;
        (off.checked_add(len)? <= self.len).then_some(self.host + off)
    }
}

/// What an open lane holds; read and written only by its holder.
struct Inner {
    peer: Option<Arc<softrdma_shm::Peer>>,
    qps: softrdma_shm::Qps,
    max_sge: usize,
    /// `max_inline_data`: an inline post above it is the engine's to refuse.
    max_inline: u64,
    /// The QP may issue READs (`max_rd_atomic` ≥ 1).
    reads: bool,
    keys: [Option<Region>; KEYS],
    /// Where the next remembered region goes.
    next: usize,
    /// The QP's send CQ's queue, for signaled posts.
    cq: Option<Arc<CqLane>>,
    /// The peer's QP and region entries the last posts checked against
    /// (`Peer::one_sided_checked`); cleared with the peer.
    checked: softrdma_shm::Checked,
    /// An in-flight word in the peer's segment for this lane alone, so a
    /// post takes no flag of the peer's (`None`: all taken, the lane shares
    /// the peer's word 0 with the engine and other lanes). Let go with the
    /// peer.
    claim: Option<softrdma_shm::Claim>,
}

/// What a post through the lane uses of what it holds, borrowed apart.
struct Posting<'a> {
    peer: &'a Arc<softrdma_shm::Peer>,
    qps: &'a softrdma_shm::Qps,
    cq: &'a Option<Arc<CqLane>>,
    checked: &'a mut softrdma_shm::Checked,
    claim: &'a mut Option<softrdma_shm::Claim>,
    /// For a signaled post, its CQ's queue, held from before the copy
    /// until the completion is in (the engine cannot hand the queue back
    /// to the CQ, and arm it, say, between the two).
    queue: Option<BiasedHolding<'a, CqInner>>,
}

impl Inner {
    /// The view of the lane of a post of `len` bytes, `inline` or not,
    /// `signaled` or not; `None` — the post takes the engine's way, which
    /// says what is wrong — if the message is longer than any may be or
    /// than the QP's inline limit, there is no peer, or a signaled post
    /// finds its CQ's queue closed, full or held.
    #[inline(always)]
    fn posting(&mut self, len: u64, inline: bool, signaled: bool) -> Option<Posting<'_>> {
        if len > MAX_MSG_SIZE || (inline && len > self.max_inline) {
            return None;
        }
        let Inner {
            peer,
            qps,
            cq,
            checked,
            claim,
            ..
        } = self;
        let peer = peer.as_ref()?;
        let queue = if signaled {
            Some(cq.as_ref()?.reserve()?)
        } else {
            None
        };
        Some(Posting {
            peer,
            qps,
            cq,
            checked,
            claim,
            queue,
        })
    }
}

/// One QP's lane (see the module docs).
pub(crate) struct Lane {
    open: AtomicBool,
    /// Held by a post in progress, or by the engine closing or filling it;
    /// biased to the thread that opens it (see [`Biased`]).
    inner: Biased<Inner>,
    /// Operations carried out through the lane (`Stats::offloaded`),
    /// written by the holder of `inner` only.
    carried: AtomicU64,
    /// Where it is in the engine's list of open lanes (`usize::MAX`: not
    /// there). Read and written under the engine's lock only.
    pos: AtomicUsize,
    /// Where the last WRITE's region lies in the peer's segment, for the
    /// next one's prefetch: a hint, read without holding the lane (by a
    /// caller with a fast path of its own too, `Qp::prefetch_write`),
    /// written by the lane's holder; cleared with the peer.
    target: softrdma_shm::SharedRegionHint,
}

/// What the engine fills a lane with when it opens it.
pub(crate) struct Opening<'a> {
    pub peer: Arc<softrdma_shm::Peer>,
    pub qps: softrdma_shm::Qps,
    pub max_sge: usize,
    pub max_inline: u64,
    pub reads: bool,
    /// The regions of the post that opened it.
    pub regions: &'a [Region],
    /// The queue of the QP's send CQ (signaled posts complete there).
    pub cq: Arc<CqLane>,
}

impl Lane {
    pub(crate) fn new() -> Lane {
        Lane {
            open: AtomicBool::new(false),
            inner: Biased::new(Inner {
                peer: None,
                qps: softrdma_shm::Qps {
                    local: 0,
                    local_gid: [0; 16],
                    remote: 0,
                },
                max_sge: 0,
                max_inline: 0,
                reads: false,
                keys: [None; KEYS],
                next: 0,
                cq: None,
                checked: softrdma_shm::Checked::default(),
                claim: None,
            }),
            target: softrdma_shm::SharedRegionHint::default(),
            carried: AtomicU64::new(0),
            pos: AtomicUsize::new(usize::MAX),
        }
    }

    pub(crate) fn pos(&self) -> Option<usize> {
        let p = self.pos.load(Ordering::Relaxed);
        (p != usize::MAX).then_some(p)
    }

    pub(crate) fn set_pos(&self, p: Option<usize>) {
        self.pos.store(p.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Operations carried out since the lane last closed.
    pub(crate) fn carried(&self) -> u64 {
        self.carried.load(Ordering::Relaxed)
    }

    /// Close the lane: from the return on, no post uses what it held, and
    /// none is in progress. The engine calls it under its lock. Returns
    /// the operations carried out since it last closed (taken while
    /// holding the lane, so no post writes the count meanwhile).
    pub(crate) fn close(&self) -> u64 {
        self.open.store(false, Ordering::SeqCst);
        let mut i = self.inner.hold();
        self.empty(&mut i)
    }

    /// [`Lane::close`] every lane of `lanes`, with one `membarrier` for all
    /// those biased to other threads (see [`Biased::hold_all`]): a QP's
    /// state change closes every open lane, and one barrier each would
    /// cost a multi-threaded process microseconds per lane. Returns the
    /// operations they carried out since they last closed.
    pub(crate) fn close_all(lanes: &[Arc<Lane>]) -> u64 {
        for l in lanes {
            l.open.store(false, Ordering::SeqCst);
        }
        let mut held = Biased::hold_all(lanes.iter().map(|l| &l.inner));
        lanes
            .iter()
            .zip(held.iter_mut())
            .map(|(l, i)| l.empty(i))
            .sum()
    }

    /// Forget what the lane held (its holder, closing it); the operations
    /// carried out since it last closed.
    fn empty(&self, i: &mut Inner) -> u64 {
        i.peer = None;
        i.keys = [None; KEYS];
        i.cq = None;
        i.checked = softrdma_shm::Checked::default();
        i.claim = None;
        self.target.set(None);
        let n = self.carried.load(Ordering::Relaxed);
        self.carried.store(0, Ordering::Relaxed);
        n
    }

    /// Open the lane, or remember more regions in an open one. The engine
    /// calls it under its lock, with what it checked there (see the module
    /// docs); a different peer or QP replaces what was held.
    pub(crate) fn open(&self, o: Opening<'_>) {
        let mut h = self.inner.hold();
        let i = &mut *h;
        let same = i
            .peer
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &o.peer) && i.qps == o.qps);
        if !same {
            i.keys = [None; KEYS];
            i.next = 0;
            i.checked = softrdma_shm::Checked::default();
            i.claim = None;
            self.target.set(None);
        }
        if i.claim.is_none() {
            i.claim = o.peer.claim_word();
        }
        i.peer = Some(o.peer);
        i.qps = o.qps;
        i.max_sge = o.max_sge;
        i.max_inline = o.max_inline;
        i.reads = o.reads;
        i.cq = Some(o.cq);
        for &r in o.regions {
            match i.keys.iter_mut().flatten().find(|k| k.lkey == r.lkey) {
                Some(k) => *k = r,
                None => {
                    let at = i.next;
                    i.keys[at] = Some(r);
                    i.next = (at + 1) % KEYS;
                }
            }
        }
        // The engine opens a lane in the thread that posted through it:
        // its next posts are that thread's.
        h.bias();
        self.open.store(true, Ordering::Release);
    }

    /// Carry `wr` out through the lane if it is open and `wr` is what it
    /// serves; false (nothing done) sends it the engine's way.
    #[inline]
    pub(crate) fn try_post(&self, wr: &SendWr<'_>) -> bool {
        if let [s] = wr.sgl {
            // A WRITE may be inline (its bytes are copied at post either
            // way); a READ with any flag but SIGNALED goes the engine's way.
            let f = wr.flags.0 & !SendFlags::SIGNALED.0;
            match wr.op {
                SendOp::Write { remote_addr, rkey } if f & !SendFlags::INLINE.0 == 0 => {
                    return self.one_sge(wr, s, (remote_addr, rkey), false);
                }
                SendOp::Read { remote_addr, rkey } if f == 0 => {
                    return self.one_sge(wr, s, (remote_addr, rkey), true);
                }
                _ => {}
            }
        }
        self.try_post_any(wr)
    }

    /// [`Lane::try_post`] of a WRITE (`read` false: signaled or not,
    /// inline or not) or a READ (signaled or not) of one SGE — a latency
    /// test's post, a message-rate test's: the same checks as the general
    /// way below, in as few instructions as they take (see
    /// `Peer::one_sge_remembered`; on a ping-pong every instruction before
    /// the copy is on the round trip).
    #[inline(always)]
    fn one_sge(&self, wr: &SendWr<'_>, s: &Sge, remote: (u64, u32), read: bool) -> bool {
        if !self.open.load(Ordering::Relaxed) {
            return false;
        }
        // First of all, a WRITE's target line for writing: the copy into
        // it waits for that transfer, which now runs beside the checks
        // (`softrdma_shm::hint`). 8-byte `perf write_lat` over shared
        // memory, the VM in its fast mode, alternated: one-way p50
        // 0.055-0.060 -> 0.035-0.045 us, average 0.059-0.065 -> 0.042-0.048.
        if !read {
            self.prefetch_target(remote);
        }
        let Some(mut i) = self.inner.try_hold(true) else {
            return false;
        };
        // After taking the lane, as in `try_post_any`; a READ needs the
        // QP's READ credits and a locally writable region.
        if !self.open.load(Ordering::Acquire) || i.max_sge == 0 || (read && !i.reads) {
            return false;
        }
        let len = s.length as u64;
        let Some(host) = i
            .keys
            .iter()
            .flatten()
            .find(|k| k.lkey == s.lkey && (k.local_write || !read))
            .and_then(|r| r.host_of(s.addr, len))
        else {
            return false;
        };
        // A zero-length request moves nothing: the engine's way carries it.
        if len == 0 {
            return false;
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        let Some(p) = i.posting(len, inline, wr.flags.contains(SendFlags::SIGNALED)) else {
            return false;
        };
        let (peer, qps) = (p.peer, p.qps);
        // SAFETY: `host..host + len` lies inside a region that was
        // registered (for a READ: locally writable) when the engine opened
        // the lane and still is (as in `try_post_any`: a withdrawal closes
        // the lane first, and closing waits for us, holding it until we
        // return).
        let remembered = unsafe {
            p.claim.as_mut().is_some_and(|c| {
                peer.one_sge_remembered(qps, host, len, remote, read, p.checked, c)
            })
        };
        // SAFETY: as above.
        let done = remembered
            || unsafe {
                peer.one_sided_checked(
                    qps,
                    &wr.op,
                    &OffloadLocal::Host(&[(host, s.length)]),
                    len,
                    Some(p.checked),
                    p.claim.as_mut(),
                )
            };
        if done {
            self.carried_out(p.queue, p.cq, wr, qps.local, len);
            // The region remembered changes only on the general way: a
            // stream through one region sets the hint once.
            if !read && !remembered {
                self.target.set(peer.remembered_region(p.checked));
            }
        }
        done
    }

    /// Prefetch for writing the line a WRITE to `(va, rkey)` would store
    /// into, if it lies in the region the lane's last WRITE went to (a
    /// hint: it reads and writes nothing, whatever the lane's state).
    #[inline(always)]
    pub(crate) fn prefetch_target(&self, (va, rkey): (u64, u32)) {
        self.target.prefetch(va, rkey);
    }

    /// [`Lane::try_post`] of anything else.
    #[inline(never)]
    fn try_post_any(&self, wr: &SendWr<'_>) -> bool {
        // A SEND may also be inline (its bytes are copied at post anyway,
        // from the remembered region its SGE names) or solicited (a lane
        // fills a receive only while the peer's CQ is not armed).
        // A WRITE may be inline too (its bytes are copied at post either
        // way, from the region its SGE names).
        let flags = match wr.op {
            // (As a SEND, a WRITE with immediate fills a receive.)
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::WriteWithImm { .. } => {
                SendFlags(wr.flags.0 & !(SendFlags::INLINE.0 | SendFlags::SOLICITED.0))
            }
            SendOp::Write { .. } => SendFlags(wr.flags.0 & !SendFlags::INLINE.0),
            _ => wr.flags,
        };
        let signaled = flags == SendFlags::SIGNALED;
        if !self.open.load(Ordering::Relaxed)
            || (flags != SendFlags::default() && !signaled)
            || !matches!(
                wr.op,
                SendOp::Write { .. }
                    | SendOp::WriteWithImm { .. }
                    | SendOp::Read { .. }
                    | SendOp::CompareSwap { .. }
                    | SendOp::FetchAdd { .. }
                    | SendOp::Send
                    | SendOp::SendWithImm { .. }
            )
        {
            return false;
        }
        let Some(mut i) = self.inner.try_hold(true) else {
            return false;
        };
        // A message into a receive the peer published: first of all, the
        // line of that receive's slot for writing — the peer's poll spins
        // on it, and the fill waits for its transfer, which now runs beside
        // the checks (as `one_sge`'s prefetch of a WRITE's target).
        if let (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::WriteWithImm { .. }, Some(p)) =
            (wr.op, &i.peer)
        {
            p.prefetch_receive(&i.qps);
        }
        // Read after taking the lane: a close that began before we took
        // it has stored false already (it then waits for us), and one
        // after finds us holding it.
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        // A READ or an atomic writes its result locally and needs the
        // QP's READ/atomic credits (`max_rd_atomic`); an atomic is one
        // 8-byte SGE on an 8-byte aligned target, as the core checks —
        // anything else takes the engine's way, which says what is wrong.
        let read = !matches!(
            wr.op,
            SendOp::Write { .. }
                | SendOp::WriteWithImm { .. }
                | SendOp::Send
                | SendOp::SendWithImm { .. }
        );
        if wr.sgl.len() > i.max_sge || (read && !i.reads) {
            return false;
        }
        if let SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } =
            wr.op
        {
            if wr.sgl.len() != 1 || wr.sgl[0].length != 8 || !remote_addr.is_multiple_of(8) {
                return false;
            }
        }
        let mut spans = arrayvec::ArrayVec::<(u64, u32), MAX_SGE>::new();
        let mut total = 0u64;
        for s in wr.sgl {
            // Every SGE's key is checked, as the core checks a zero-length
            // one's; only those with bytes are translated and handed on.
            let Some(r) = i
                .keys
                .iter()
                .flatten()
                .find(|k| k.lkey == s.lkey && (k.local_write || !read))
            else {
                return false;
            };
            total += s.length as u64;
            if s.length == 0 {
                continue;
            }
            let Some(host) = r.host_of(s.addr, s.length as u64) else {
                return false;
            };
            spans.push((host, s.length));
        }
        // A zero-length WRITE with immediate is a notification: it fills
        // a receive and moves nothing.
        let notice = matches!(wr.op, SendOp::WriteWithImm { .. });
        if spans.is_empty() && !notice {
            return false;
        }
        let Some(p) = i.posting(total, wr.flags.contains(SendFlags::INLINE), signaled) else {
            return false;
        };
        let (peer, qps, checked, claim) = (p.peer, p.qps, p.checked, p.claim);
        // SAFETY: each span lies inside a region that was registered, of
        // this QP's PD and (for a READ) locally writable when the engine
        // opened the lane, and still is: anything that would change that
        // (a withdrawal, a deregistration) closes the lane first under the
        // engine's lock, and closing waits for the lane, which we hold
        // until this call returns. So the memory stays valid for the access.
        // `total` is the sum of the spans' lengths (the SGEs left out have
        // none), as `one_sided_checked` requires.
        let done = unsafe {
            match wr.op {
                // A SEND fills the next receive the peer published for this
                // QP (`Peer::send_recv`); the same contract on the spans.
                SendOp::Send => peer.send_recv(qps, &spans, None, claim.as_mut()).is_some(),
                SendOp::SendWithImm { imm } => peer
                    .send_recv(qps, &spans, Some(imm), claim.as_mut())
                    .is_some(),
                // The WRITE as above, then the next published receive.
                SendOp::WriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => peer
                    .write_imm(
                        qps,
                        &OffloadLocal::Host(&spans),
                        total,
                        (remote_addr, rkey),
                        imm,
                        Some(checked),
                        claim.as_mut(),
                    )
                    .is_some(),
                _ => peer.one_sided_checked(
                    qps,
                    &wr.op,
                    &OffloadLocal::Host(&spans),
                    total,
                    Some(checked),
                    claim.as_mut(),
                ),
            }
        };
        if done {
            self.carried_out(p.queue, p.cq, wr, qps.local, total);
        }
        done
    }

    /// A post carried out: its completion into the queue held for it (a
    /// signaled post's), and the count.
    #[inline(always)]
    fn carried_out(
        &self,
        queue: Option<BiasedHolding<'_, CqInner>>,
        cq: &Option<Arc<CqLane>>,
        wr: &SendWr<'_>,
        qp: u32,
        len: u64,
    ) {
        if let (Some(mut q), Some(cq)) = (queue, cq.as_ref()) {
            cq.push(&mut q, wr.wr_id, &wr.op, qp, len as u32);
        }
        // One writer at a time (the caller holds the lane): no locked
        // increment.
        let n = self.carried.load(Ordering::Relaxed);
        self.carried.store(n + 1, Ordering::Relaxed);
    }
}

/// Completions of a CQ's lane posts, queued outside the core's CQ.
///
/// It takes completions only while it is *open*: the engine opens it at
/// the end of every stretch of work under its lock for a core CQ that is
/// neither armed nor in the error state, with the room that CQ has left,
/// and closes it at the start of every such stretch
/// (`State::settle_cq_lanes`), handing what it holds to the core's CQ
/// behind what is there (`Endpoint::complete_external`). So nothing
/// completes into the core's CQ while this queue may hold older
/// completions: the CQ's order is kept, an armed CQ's notification comes
/// from the core (which sees every completion after the arm), and an
/// overflow is the core's, with IBA's error (a lane post that finds no
/// room goes the engine's way). `Cq::poll` takes from here without the
/// engine's lock when the core's CQ was empty at the opening (these are
/// then the oldest); otherwise, or if nothing is here, it polls the
/// engine's way, so a poll never reports an empty CQ that is not.
pub(crate) struct CqLane {
    pub(crate) id: CqId,
    open: AtomicBool,
    /// Entries in `q`, for a look without holding it.
    len: AtomicUsize,
    inner: Biased<CqInner>,
    /// Receive lanes open on this CQ (a poll looks at their results).
    recvs: AtomicUsize,
    /// Some QP of the CQ may complete from UDP traffic (kept by the
    /// engine, under its lock): then only a pass of the engine can say the
    /// CQ is empty.
    udp: AtomicBool,
}

struct CqInner {
    /// A ring of `ring.len()` entries: `len` of them from `head` on.
    /// Written in place (a completion built on the stack and copied in
    /// was a store-forwarding stall per post, measured on `ib_read_lat`'s
    /// loop), sized when the queue opens.
    ring: Box<[Completion]>,
    head: usize,
    len: usize,
    /// What the core's CQ can take (when the queue opened: nothing else
    /// completes into it while the queue is open); at most `ring.len()`.
    room: usize,
    /// The core's CQ was empty when the queue opened (and so still is: it
    /// changes only under the engine's lock, which closes the queue
    /// first). Only then are the queued completions the CQ's oldest, and
    /// a poll may take them without the lock.
    core_empty: bool,
    /// The receive lanes of QPs whose receive CQ this is (see [`RecvQ`]).
    recvs: Vec<RecvQ>,
    /// What the core's CQ could take when the queue last opened (or a
    /// receive lane last published): `room` is that, capped by the ring.
    core_room: usize,
    /// Receives published and not yet handed out, over all of `recvs`:
    /// each may become a completion without the engine, so together with
    /// `len` they stay within `room` (no CQ overflow the core did not see).
    reserved: usize,
    host: Option<Arc<softrdma_shm::Host>>,
}

/// A receive as a receive lane keeps it: its `wr_id`, its SGEs as the
/// core's receive queue keeps them (to hand it back), and where they lie in
/// the arena (what the sender is told).
#[derive(Clone)]
pub(crate) struct Kept {
    pub wr_id: u64,
    pub core: arrayvec::ArrayVec<Span, RECV_SGES>,
    pub arena: arrayvec::ArrayVec<(u64, u32), RECV_SGES>,
    /// Published, then handed to the core for a message that came as
    /// packets (see [`CqLane::recv_give`]): it completes there, not here.
    pub core_took: bool,
}

/// A region a receive lane has seen a receive in (checked by the core:
/// the QP's PD, `LOCAL_WRITE`), for posts without the engine's lock: its
/// key, iova range and host address, the core's reference to it, and the
/// part of it in moved pages (`[sh_lo, sh_hi)` of the host address space,
/// at arena offset `sh_off`). Forgotten when the lane closes — which any
/// withdrawal, deregistration or reregistration of a region does first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvRegion {
    pub lkey: u32,
    pub mem: softrdma_core::mr::MemRef,
    pub iova: u64,
    pub len: u64,
    pub host: u64,
    pub sh_lo: u64,
    pub sh_hi: u64,
    pub sh_off: u64,
}

impl Kept {
    /// Receive `wr_id` with no SGE yet.
    pub(crate) fn new(wr_id: u64) -> Kept {
        Kept {
            wr_id,
            core: arrayvec::ArrayVec::new(),
            arena: arrayvec::ArrayVec::new(),
            core_took: false,
        }
    }

    /// Add `len` bytes at offset `off` of region `g` (from its iova): false
    /// if they do not lie in its moved part. A zero-length SGE names the
    /// region and moves nothing.
    pub(crate) fn push(&mut self, g: &RecvRegion, off: u64, len: u32) -> bool {
        if len == 0 {
            self.core.push(Span {
                mem: g.mem,
                off: 0,
                len: 0,
            });
            self.arena.push((0, 0));
            return true;
        }
        if off.checked_add(len as u64).is_none_or(|end| end > g.len) {
            return false;
        }
        let at = g.host + off;
        if at < g.sh_lo || at + len as u64 > g.sh_hi {
            return false;
        }
        self.core.push(Span {
            mem: g.mem,
            off,
            len,
        });
        self.arena.push((g.sh_off + (at - g.sh_lo), len));
        true
    }
}

/// Where the receive a lane handed to the core for one packet came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Given {
    None,
    /// Published receive number `.0`.
    Slot(u64),
    Backlog,
}

/// One QP's receive lane, the receiving side of a SEND carried out by its
/// sender (`Peer::send_recv`): while it is open the QP's receives are
/// here, not in the core's receive queue — the first [`RECV_SLOTS`]
/// published in the QP's `RecvArea` of our segment, the rest kept in
/// order behind them — and a filled one becomes a completion of this CQ
/// without the engine. Opened by the engine at a post of a receive, only
/// with the core's queue taken whole (`Endpoint::take_recvs`: nothing in
/// use); closed by the engine before anything the core does with the QP's
/// receives (a packet for the QP, any QP state change, a withdrawn region,
/// an armed CQ), handing the filled ones to the core's CQ and the rest back
/// to its receive queue in order (see `State::close_recv`).
pub(crate) struct RecvQ {
    qpn: u32,
    /// Receives published (the next one's index).
    posted: u64,
    /// Results handed out (to a poller, or to the core's CQ).
    polled: u64,
    /// The published receives, by index modulo [`RECV_SLOTS`].
    slots: Vec<Kept>,
    /// Kept, not yet published, oldest first.
    backlog: std::collections::VecDeque<Kept>,
    /// The QP's receive queue depth (`max_recv_wr`).
    depth: usize,
    /// The receive handed to the core for the packet being handled.
    given: Given,
    /// The QP's `max_recv_sge`.
    max_sge: usize,
    /// Regions its receives lay in, the last two (see [`RecvRegion`]).
    regions: [Option<RecvRegion>; 2],
    /// The index in our segment of the peer whose sends fill the lane
    /// (`Host::index_of`), if known: whose in-flight words a packet's
    /// receive waits for.
    sender: Option<u32>,
}

impl RecvQ {
    /// A slot is free, and the CQ has room for one more completion beyond
    /// the `taken` (queued, plus published and not yet polled) of `room`.
    fn can_publish(&self, taken: usize, room: usize) -> bool {
        self.posted - self.polled < RECV_SLOTS as u64 && taken < room
    }

    /// Publish `w` as receive number `posted` in its slot (the caller
    /// checked `can_publish`).
    fn publish_one(&mut self, host: &softrdma_shm::Host, w: Kept) {
        host.recv_publish(self.qpn, self.posted, &w.arena);
        self.slots[(self.posted % RECV_SLOTS as u64) as usize] = w;
        self.posted += 1;
    }
}

/// A receive lane refused a receive: the QP's receive queue is full.
pub(crate) struct RecvFull;

impl CqInner {
    /// Where QP `qpn`'s receive lane is in `recvs`.
    fn find(&self, qpn: u32) -> Option<usize> {
        self.recvs.iter().position(|r| r.qpn == qpn)
    }

    /// Publish kept receives of lane `k` while it has free slots and the
    /// CQ room for their completions.
    fn publish(&mut self, k: usize) {
        // Borrowed, not cloned: an `Arc`'s clone and drop are two locked
        // read-modify-writes, full barriers, a third of a receive's post
        // (`perf record` of `perf send_lat` over shared memory).
        let CqInner {
            host,
            recvs,
            core_room,
            len,
            reserved,
            ..
        } = self;
        let Some(host) = host.as_ref() else {
            return;
        };
        let r = &mut recvs[k];
        while r.can_publish(*len + *reserved, *core_room) {
            let Some(w) = r.backlog.pop_front() else {
                break;
            };
            r.publish_one(host, w);
            *reserved += 1;
        }
    }

    /// Keep receive `w` for lane `k` and publish what can be: `w` itself
    /// straight into its slot when nothing waits before it (a receive is
    /// ~200 bytes, and going through the backlog moved it twice more; so
    /// did an `Option` around it, measured: +10 ns a SEND's one-way).
    fn post_kept(&mut self, k: usize, w: Kept) {
        let CqInner {
            host,
            recvs,
            core_room,
            len,
            reserved,
            ..
        } = self;
        let r = &mut recvs[k];
        if let Some(host) = host.as_ref() {
            if r.backlog.is_empty() && r.can_publish(*len + *reserved, *core_room) {
                r.publish_one(host, w);
                *reserved += 1;
                return;
            }
        }
        r.backlog.push_back(w);
        self.publish(k);
    }

    /// Hand lane `k`'s filled receives, up to `max`, to `f` as completions.
    fn take_filled(&mut self, k: usize, max: usize, f: &mut impl FnMut(&Completion)) -> usize {
        let Some(host) = self.host.as_ref() else {
            return 0;
        };
        let r = &mut self.recvs[k];
        let mut n = 0;
        let mut gone = 0;
        // Filled in order: the first one not filled ends the look.
        while r.polled < r.posted && n < max {
            let w = &r.slots[(r.polled % RECV_SLOTS as u64) as usize];
            if !w.core_took {
                let Some(filled) = host.recv_filled(r.qpn, r.polled) else {
                    break;
                };
                f(&match filled.imm {
                    Some(imm) if filled.rdma => {
                        Completion::received_write_imm(w.wr_id, r.qpn, filled.len, imm)
                    }
                    imm => Completion::received(w.wr_id, r.qpn, filled.len, imm),
                });
                n += 1;
            }
            r.polled += 1;
            gone += 1;
        }
        self.reserved -= gone;
        n
    }
}

impl CqInner {
    /// The slot after the last entry (`len < ring.len()`).
    fn tail(&mut self) -> &mut Completion {
        // Both below `ring.len()`: a compare instead of a division (a
        // `div` was a quarter of this function's time).
        let mut at = self.head + self.len;
        if at >= self.ring.len() {
            at -= self.ring.len();
        }
        &mut self.ring[at]
    }

    /// Hand the oldest entry to `f`, in place, and drop it (`len > 0`).
    fn pop_with(&mut self, f: &mut impl FnMut(&Completion)) {
        f(&self.ring[self.head]);
        self.head += 1;
        if self.head == self.ring.len() {
            self.head = 0;
        }
        self.len -= 1;
    }
}

/// Entries a CQ lane's ring holds at most: a lane post that finds it full
/// goes the engine's way. It bounds the ring's memory per CQ (4096 × 48
/// bytes) where a CQ may be millions deep; the engine hands the ring to
/// the core's CQ at the start of each of its passes anyway.
const RING_MAX: usize = 4096;

impl CqLane {
    pub(crate) fn new(id: CqId) -> CqLane {
        CqLane {
            id,
            open: AtomicBool::new(false),
            len: AtomicUsize::new(0),
            inner: Biased::new(CqInner {
                ring: Box::new([]),
                head: 0,
                len: 0,
                room: 0,
                core_empty: false,
                core_room: 0,
                recvs: Vec::new(),
                reserved: 0,
                host: None,
            }),
            recvs: AtomicUsize::new(0),
            udp: AtomicBool::new(true),
        }
    }

    /// Whether some QP of the CQ may complete from UDP traffic (the
    /// engine, under its lock, whenever that changes).
    pub(crate) fn set_udp(&self, udp: bool) {
        self.udp.store(udp, Ordering::Relaxed);
    }

    /// Open a receive lane for QP `qpn` (the engine, under its lock, with
    /// this queue closed), holding `kept` — the QP's receives, taken whole
    /// from the core — in order; `room` is what the core's CQ can take now.
    pub(crate) fn recv_open(
        &self,
        host: &Arc<softrdma_shm::Host>,
        qpn: u32,
        (src, sender): ((u32, [u8; 16]), Option<u32>),
        (depth, max_sge): (usize, usize),
        kept: Vec<Kept>,
        room: usize,
    ) {
        let mut h = self.inner.hold_sharing();
        let first = host.recv_open(qpn, src.0, src.1);
        h.host = Some(host.clone());
        let mut backlog = std::collections::VecDeque::with_capacity(depth.max(kept.len()));
        backlog.extend(kept);
        let empty = Kept::new(0);
        h.recvs.push(RecvQ {
            qpn,
            posted: first,
            polled: first,
            slots: vec![empty; RECV_SLOTS],
            backlog,
            depth,
            given: Given::None,
            max_sge,
            regions: [None; 2],
            sender,
        });
        self.recvs.store(h.recvs.len(), Ordering::Relaxed);
        h.core_room = room;
        let k = h.recvs.len() - 1;
        h.publish(k);
    }

    /// Keep a receive posted on QP `qpn`, whose lane is open (the engine,
    /// under its lock, with this queue closed; `room` as for
    /// [`CqLane::recv_open`]).
    pub(crate) fn recv_post(
        &self,
        qpn: u32,
        w: Kept,
        room: usize,
        learn: &[RecvRegion],
    ) -> Result<(), RecvFull> {
        let mut h = self.inner.hold_sharing();
        let Some(k) = h.find(qpn) else {
            return Err(RecvFull);
        };
        // Borrowed apart, not cloned: an `Arc` clone is a locked increment.
        let CqInner { host, recvs, .. } = &mut *h;
        let host = host.as_deref().expect("a receive lane has its host");
        let r = &mut recvs[k];
        for g in learn {
            if !r.regions.iter().flatten().any(|x| x.lkey == g.lkey) {
                r.regions.rotate_right(1);
                r.regions[0] = Some(*g);
            }
        }
        // Receives in the queue: the published ones not yet filled, and
        // the kept ones (a filled one is a completion, out of the queue).
        let filled = host.recv_taken(qpn).min(r.posted);
        if (r.posted - filled) as usize + r.backlog.len() >= r.depth {
            return Err(RecvFull);
        }
        r.backlog.push_back(w);
        h.core_room = room;
        h.publish(k);
        Ok(())
    }

    /// Post a receive on QP `qpn` without the engine's lock, if its
    /// receive lane is open and every SGE lies in a region the lane has
    /// seen (in its moved pages); false (nothing done) sends it the
    /// engine's way, which checks it and says what is wrong.
    pub(crate) fn try_post_recv(
        &self,
        qpn: u32,
        wr_id: u64,
        sgl: &[softrdma_core::wr::Sge],
    ) -> bool {
        if self.recvs.load(Ordering::Relaxed) == 0 || !self.open.load(Ordering::Relaxed) {
            return false;
        }
        let Some(mut h) = self.inner.try_hold(true) else {
            return false;
        };
        h.bias();
        // Read after taking the queue: the engine closes it under the flag.
        if !self.open.load(Ordering::Relaxed) {
            return false;
        }
        let Some(k) = h.find(qpn) else {
            return false;
        };
        let r = &h.recvs[k];
        if sgl.len() > RECV_SGES.min(r.max_sge) {
            return false;
        }
        let mut w = Kept::new(wr_id);
        for s in sgl {
            let Some(g) = r.regions.iter().flatten().find(|g| g.lkey == s.lkey) else {
                return false;
            };
            // A zero-length SGE's address is not checked (as the core's).
            let off = if s.length == 0 {
                Some(0)
            } else {
                s.addr.checked_sub(g.iova)
            };
            if !off.is_some_and(|off| w.push(g, off, s.length)) {
                return false;
            }
        }
        // Room in the queue, counting filled receives not yet polled as
        // still in it (else the engine's way counts exactly, and says if
        // it is full).
        if (r.posted - r.polled) as usize + r.backlog.len() >= r.depth {
            return false;
        }
        h.post_kept(k, w);
        true
    }

    /// A packet that may take a receive came for QP `qpn` by the ring of
    /// the peer at index `from` (the engine, under its lock, with this
    /// queue closed, before the core handles it): hold the lane (no sender
    /// fills a receive meanwhile), put what was filled so far in `done`
    /// (it completes before what the packet completes), and hand the next
    /// receive — published or kept — to the caller for the core's queue.
    /// [`CqLane::recv_ungive`] takes it back if the packet did not use it,
    /// and lets the sender in again.
    pub(crate) fn recv_give(
        &self,
        qpn: u32,
        from: Option<u32>,
        done: &mut Vec<Completion>,
    ) -> Option<Kept> {
        let mut h = self.inner.hold_sharing();
        let k = h.find(qpn)?;
        // Only the lane's sender fills it: a packet from that peer needs
        // only its words checked (its ring and words share the index); one
        // from anyone else (a stale retransmission of an earlier
        // connection, say) says nothing of where the sender is, so every
        // peer's words are waited for.
        let wait = from.filter(|f| h.recvs[k].sender == Some(*f));
        h.host
            .as_deref()
            .expect("a receive lane has its host")
            .recv_hold(qpn, wait);
        h.take_filled(k, usize::MAX, &mut |c| done.push(*c));
        // Borrowed apart, not cloned: an `Arc` clone is a locked increment.
        let CqInner { host, recvs, .. } = &mut *h;
        let host = host.as_deref().expect("a receive lane has its host");
        let r = &mut recvs[k];
        // All filled ones were taken: the next is number `polled`.
        let t = r.polled;
        if t < r.posted {
            let w = &mut r.slots[(t % RECV_SLOTS as u64) as usize];
            w.core_took = true;
            host.recv_set_taken(qpn, t + 1);
            r.given = Given::Slot(t);
            let mut w = w.clone();
            w.core_took = false;
            return Some(w);
        }
        let w = r.backlog.pop_front();
        r.given = if w.is_some() {
            Given::Backlog
        } else {
            Given::None
        };
        w
    }

    /// After the packet [`CqLane::recv_give`] prepared for: `unused` is the
    /// receive the core did not take (it is the lane's again, in its
    /// place); the sender may fill receives again if `release` (not if the
    /// packet ended the QP's run: the lane stays held until it closes).
    pub(crate) fn recv_ungive(&self, qpn: u32, unused: Option<Kept>, release: bool) {
        let mut h = self.inner.hold_sharing();
        let Some(k) = h.find(qpn) else {
            return;
        };
        let CqInner { host, recvs, .. } = &mut *h;
        let host = host.as_deref().expect("a receive lane has its host");
        let r = &mut recvs[k];
        match (r.given, unused) {
            (Given::Slot(t), Some(_)) => {
                r.slots[(t % RECV_SLOTS as u64) as usize].core_took = false;
                host.recv_set_taken(qpn, t);
            }
            (Given::Backlog, Some(w)) => r.backlog.push_front(w),
            _ => {}
        }
        r.given = Given::None;
        if release {
            host.recv_release(qpn);
        }
    }

    /// Close QP `qpn`'s receive lane (the engine, under its lock, with this
    /// queue closed): its filled receives go to `done` as completions, in
    /// order, and the rest, in order, to `back` for the core's receive
    /// queue. False if it has none open.
    pub(crate) fn recv_close(
        &self,
        qpn: u32,
        done: &mut Vec<Completion>,
        back: &mut Vec<Kept>,
    ) -> bool {
        let mut h = self.inner.hold_sharing();
        let Some(k) = h.find(qpn) else {
            return false;
        };
        h.host
            .as_deref()
            .expect("a receive lane has its host")
            .recv_close(qpn);
        h.take_filled(k, usize::MAX, &mut |c| done.push(*c));
        let mut r = h.recvs.swap_remove(k);
        self.recvs.store(h.recvs.len(), Ordering::Relaxed);
        h.reserved -= (r.posted - r.polled) as usize;
        for i in r.polled..r.posted {
            back.push(r.slots[(i % RECV_SLOTS as u64) as usize].clone());
        }
        back.extend(r.backlog.drain(..));
        true
    }

    /// Hold the queue if it is open and has room for one more completion
    /// (a signaled lane post, from before its copy to [`CqLane::push`]).
    #[inline(always)]
    fn reserve(&self) -> Option<BiasedHolding<'_, CqInner>> {
        let mut h = self.inner.try_hold(true)?;
        h.bias();
        (self.open.load(Ordering::Relaxed) && h.len < h.room && h.len + h.reserved < h.core_room)
            .then_some(h)
    }

    /// Append the completion of a lane post, written in place.
    #[inline]
    fn push(&self, h: &mut BiasedHolding<'_, CqInner>, wr_id: u64, op: &SendOp, qp: u32, len: u32) {
        *h.tail() = Completion::offloaded(wr_id, op, qp, len);
        h.len += 1;
        self.len.store(h.len, Ordering::Release);
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Completions queued, for the crate's tests.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether the queue is biased to the calling thread, and whether it
    /// was left shared for good, for the crate's tests.
    #[cfg(test)]
    pub(crate) fn bias(&self) -> (bool, bool) {
        (
            self.inner.owner.load(Ordering::Relaxed) == me(),
            self.inner.shared.load(Ordering::Relaxed),
        )
    }

    /// Whether anything is queued (a look, without the lock).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Close (the engine, under its lock), moving what is queued to `out`
    /// in order: from the return on, no lane completes into it. `share`:
    /// whether the hold leaves the queue shared for good if it was another
    /// thread's (see [`CqLane::bookkeeping_hold`]).
    pub(crate) fn close_into(&self, out: &mut Vec<Completion>, share: bool) {
        self.open.store(false, Ordering::Relaxed);
        let mut h = self.bookkeeping_hold(share);
        out.reserve(h.len);
        while h.len > 0 {
            h.pop_with(&mut |c| out.push(*c));
        }
        self.len.store(0, Ordering::Release);
        // Filled receives too: what the core completes from here on comes
        // after them.
        for k in 0..h.recvs.len() {
            h.take_filled(k, usize::MAX, &mut |c| out.push(*c));
        }
    }

    /// Open with room for `room` completions, `core_empty` if the core's
    /// CQ holds none (the engine, under its lock, for a CQ neither armed
    /// nor in error).
    pub(crate) fn open(&self, room: usize, core_empty: bool, share: bool) {
        let mut i = self.bookkeeping_hold(share);
        let cap = room.min(RING_MAX);
        if i.ring.len() < cap && i.len == 0 {
            // Grown to what the CQ can take, once (the engine opens the
            // queue after every pass): no allocation per post or per pass.
            i.ring = vec![Completion::default(); cap].into_boxed_slice();
            i.head = 0;
        }
        i.room = cap.min(i.ring.len());
        i.core_empty = core_empty;
        i.core_room = room;
        for k in 0..i.recvs.len() {
            i.publish(k);
        }
        self.open.store(true, Ordering::Relaxed);
    }

    /// Put back, oldest first, completions the core's CQ still holds after
    /// a poll the engine's way (the engine, under its lock, with the queue
    /// closed and emptied by this stretch's settling): `take` fills a
    /// buffer from the core's CQ and says how many, and is asked for no
    /// more than the ring has room for. Queued here, they are the CQ's
    /// oldest, and the stretch reopens the queue with the core's CQ empty.
    /// `share` as for [`CqLane::close_into`].
    pub(crate) fn requeue(&self, share: bool, mut take: impl FnMut(&mut [Completion]) -> usize) {
        let mut h = self.bookkeeping_hold(share);
        debug_assert!(!self.open.load(Ordering::Relaxed) && h.len == 0);
        let mut buf = [Completion::default(); 16];
        loop {
            let want = (h.ring.len() - h.len).min(buf.len());
            let k = if want == 0 { 0 } else { take(&mut buf[..want]) };
            for c in &buf[..k] {
                *h.tail() = *c;
                h.len += 1;
            }
            if k < buf.len() {
                break;
            }
        }
        self.len.store(h.len, Ordering::Release);
    }

    /// The engine's hold to close or reopen the queue around a stretch of
    /// work under its lock. With `share`, a queue biased to another thread
    /// stays unbiased for good ([`Biased::hold_sharing`]): the engine thread
    /// serving a CQ whose application sleeps (event mode) would otherwise
    /// revoke the bias, a `membarrier`, at every wake-up, and the
    /// application's next poll take it back. Without, the bias is revoked
    /// only until its owner's next post or poll takes it back
    /// ([`BiasedHolding::bias`]): the engine passes that while an
    /// application thread polls the device (`Engine::mask`), when that
    /// thread is still the queue's one consumer and the stretch is
    /// bookkeeping — a watchdog tick that found the poller stalled for a
    /// period (a VM that was descheduled), another thread reading counters.
    /// Shared for good by such a tick, a polling loop paid a
    /// compare-and-swap per post and per poll for the rest of its run, each
    /// a full barrier behind the last post's copy into the peer's memory
    /// (`perf write_lat` over shared memory: from ~0.7 s into a run, a
    /// third of the poller's time).
    fn bookkeeping_hold(&self, share: bool) -> BiasedHolding<'_, CqInner> {
        if share {
            self.inner.hold_sharing()
        } else {
            self.inner.hold()
        }
    }

    /// Hand up to `max` queued completions to `f`, oldest first, where
    /// they lie, without the engine's lock — the lane posts' and then what
    /// the CQ's receive lanes' senders filled; 0 if there are none, if
    /// older ones wait in the core's CQ, or if another thread holds the
    /// queue (the caller then polls the engine's way, which hands these to
    /// the core's CQ behind the older ones). Also says whether this found
    /// the whole CQ empty:
    /// the queue open with the core's CQ empty at its opening (so still:
    /// it changes only under the engine's lock, which closes the queue
    /// first), nothing queued, nothing filled in its receive lanes, and no
    /// QP of it on UDP. Then, with nothing in the rings either
    /// (`Engine::quiet`), a poll may say so without the engine's lock.
    pub(crate) fn poll_quiet(&self, max: usize, f: &mut impl FnMut(&Completion)) -> (usize, bool) {
        if self.is_empty()
            && self.recvs.load(Ordering::Relaxed) == 0
            && !self.open.load(Ordering::Relaxed)
        {
            return (0, false);
        }
        let Some(mut i) = self.inner.try_hold(true) else {
            return (0, false);
        };
        i.bias();
        if !i.core_empty || !self.open.load(Ordering::Relaxed) {
            return (0, false);
        }
        let mut n = max.min(i.len);
        for _ in 0..n {
            i.pop_with(f);
        }
        self.len.store(i.len, Ordering::Release);
        for k in 0..i.recvs.len() {
            if n == max {
                break;
            }
            let got = i.take_filled(k, max - n, f);
            if got > 0 {
                n += got;
                i.publish(k);
            }
        }
        (n, n == 0 && !self.udp.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed try leaves the holder's flag alone: the next try fails
    /// too, and a waiter gets the value only once the holder lets go.
    #[test]
    fn a_failed_try_does_not_let_go_of_the_holders_flag() {
        let f = Biased::new(0u32);
        let h = f.try_hold(false).expect("free");
        assert!(!h.owner, "nobody's: held by the flag");
        assert!(f.try_hold(false).is_none(), "held: the try fails");
        assert!(
            f.try_hold(false).is_none(),
            "a failed try let go of the holder's flag"
        );
        drop(h);
        assert!(f.try_hold(false).is_some(), "free again");
    }

    /// The owner holds a biased value without the flag; another thread's
    /// try then takes the flag and the bias away, the owner's try fails
    /// while that one holds it, and a second poster shares it for good.
    #[test]
    fn another_thread_takes_the_bias_away_from_the_owner() {
        use std::sync::mpsc::channel;
        let b = Biased::new(0u32);
        let mut h = b.try_hold(true).expect("free");
        assert!(!h.owner, "nobody's yet: held by the flag");
        h.bias();
        drop(h);
        let h = b.try_hold(true).expect("free");
        assert!(h.owner, "biased to this thread: held as the owner");
        drop(h);
        let (held_tx, held_rx) = channel();
        let (done_tx, done_rx) = channel::<()>();
        std::thread::scope(|s| {
            let b = &b;
            s.spawn(move || {
                let h = b.try_hold(true).expect("the owner is not in");
                assert!(!h.owner, "another thread holds by the flag");
                held_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                drop(h);
            });
            held_rx.recv().unwrap();
            assert!(
                b.try_hold(true).is_none(),
                "the flag is taken: the owner's try fails"
            );
            assert_eq!(b.owner.load(Ordering::Relaxed), 0, "revoked");
            done_tx.send(()).unwrap();
        });
        assert!(
            b.shared.load(Ordering::Relaxed),
            "a second poster shares it"
        );
        let mut h = b.try_hold(true).expect("free");
        assert!(!h.owner);
        h.bias();
        drop(h);
        assert_eq!(
            b.owner.load(Ordering::Relaxed),
            0,
            "shared: never biased again"
        );
    }

    /// Mutual exclusion under the bias's hand-overs: the owner re-biases
    /// the value to itself after every hold (as the engine's openings do)
    /// while another thread holds it the engine's way (`hold`, which
    /// revokes without sharing); the two go in lock step (neither more
    /// than one hold ahead), so the other's holds meet a biased value. A
    /// read-modify-write of the value that two holders overlapped in would
    /// lose increments.
    #[test]
    fn owner_and_another_holder_never_overlap() {
        const N: u64 = 5_000;
        let b = Biased::new(0u64);
        let done = [AtomicU64::new(0), AtomicU64::new(0)];
        let revoked = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..2 {
                let (b, done, revoked) = (&b, &done, &revoked);
                s.spawn(move || {
                    for i in 0..N {
                        while done[1 - t].load(Ordering::Acquire) + 1 < i {
                            std::hint::spin_loop();
                        }
                        let biased = b.owner.load(Ordering::Relaxed) != 0;
                        let mut h = b.hold();
                        if t == 1 && biased {
                            revoked.fetch_add(1, Ordering::Relaxed);
                        }
                        let v = *h;
                        // Long enough for the other to try meanwhile.
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        *h = v + 1;
                        if t == 0 {
                            h.bias();
                        }
                        drop(h);
                        done[t].store(i + 1, Ordering::Release);
                    }
                });
            }
        });
        let h = b.hold();
        assert_eq!(*h, 2 * N, "increments lost: two holders overlapped");
        assert!(
            revoked.load(Ordering::Relaxed) > 0,
            "the other holder never met the bias"
        );
        assert!(
            !b.shared.load(Ordering::Relaxed),
            "the engine's holds share nothing"
        );
    }

    /// `hold_all` (the engine closing every lane at once, one barrier for
    /// all) against an owner that holds and re-biases each value in turn:
    /// no increment of either is lost, and the bias was met and taken.
    #[test]
    fn holding_many_at_once_excludes_each_owner() {
        const N: u64 = 1_000;
        let v = [Biased::new(0u64), Biased::new(0u64)];
        let done = [AtomicU64::new(0), AtomicU64::new(0)];
        let revoked = AtomicU64::new(0);
        std::thread::scope(|s| {
            let (v, done, revoked) = (&v, &done, &revoked);
            s.spawn(move || {
                for i in 0..N {
                    while done[1].load(Ordering::Acquire) + 1 < i {
                        std::hint::spin_loop();
                    }
                    for b in v {
                        let mut h = b.hold();
                        let x = *h;
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        *h = x + 1;
                        h.bias();
                    }
                    done[0].store(i + 1, Ordering::Release);
                }
            });
            s.spawn(move || {
                for i in 0..N {
                    while done[0].load(Ordering::Acquire) + 1 < i {
                        std::hint::spin_loop();
                    }
                    let biased = v.iter().any(|b| b.owner.load(Ordering::Relaxed) != 0);
                    let mut all = Biased::hold_all(v.iter());
                    if biased {
                        revoked.fetch_add(1, Ordering::Relaxed);
                    }
                    for h in all.iter_mut() {
                        let x = **h;
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        **h = x + 1;
                    }
                    drop(all);
                    done[1].store(i + 1, Ordering::Release);
                }
            });
        });
        for b in &v {
            assert_eq!(*b.hold(), 2 * N, "increments lost: two holders overlapped");
        }
        assert!(
            revoked.load(Ordering::Relaxed) > 0,
            "the bias was never met"
        );
        assert!(v.iter().all(|b| !b.shared.load(Ordering::Relaxed)));
    }
}
