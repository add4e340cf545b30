//! What the application's pointers point at, and how a pointer is turned
//! back into an object without trusting it.
//!
//! Every object this library hands out is two things: the C structure the
//! application sees (`struct ibv_qp`, …), in a *slot*, and the Rust object
//! that owns the softrdma resource and points at its slot. The application's
//! pointer is the slot's address (for a context, the `ibv_context` inside
//! the slot's `verbs_context`).
//!
//! * **A registry of live objects** maps those addresses to the objects
//!   (`Arc`s). Every entry point looks its pointers up there before using
//!   them, so a pointer that was never handed out, one already destroyed,
//!   or one of the wrong type is refused with EINVAL without being read. A
//!   lookup lends the caller the object for the duration of its call: a
//!   concurrent destroy unregisters the object at once (so new calls fail)
//!   but frees it only when the last call using it returns (a reference
//!   count, or for the data path a grace period: see [`lend`]).
//! * **Slots are type-stable**: a slot's memory is never returned to the
//!   allocator, only reused for a new object of the same type. libibverbs'
//!   static inline functions (`ibv_post_send`, `ibv_poll_cq`,
//!   `ibv_req_notify_cq`, `ibv_query_port`, …) are compiled into the
//!   application and read `qp->context->ops` from its pointer *before* we
//!   get control; with a stale pointer those reads still hit a slot of the
//!   right type, whose `context` names a context slot whose operations
//!   table holds this library's functions (it is never cleared), and those
//!   functions refuse the stale pointer through the registry. What cannot
//!   be protected: the application's own reads of a stale structure's
//!   fields, and a stale pointer whose slot has since been reused — it then
//!   names the new object, as a reused handle number does for the kernel
//!   (freed slots wait in a FIFO of [`QUARANTINE`] before reuse to push that
//!   as far back as memory allows).
//!
//! Devices are never freed (rdma-core keeps its device list too); a device
//! pointer is checked against the list of devices handed out.

use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use softrdma_shm::barrier;
use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{Fail, Res};

// ---- slots ----

/// Freed slots a type keeps before reusing the oldest: a stale pointer
/// stays refused (rather than naming a newer object) until this many more
/// objects of its type have been destroyed. It trades at most this many
/// idle slots per type (≤ 64 × 664 bytes) for that distance.
pub const QUARANTINE: usize = 64;

/// C structures kept in type-stable slots.
pub trait Slab: Zeroed + 'static {
    /// This type's freed slots, oldest first.
    fn free_list() -> &'static Mutex<VecDeque<usize>>;
}

macro_rules! slab {
    ($($t:ty),*) => { $(
        impl Slab for $t {
            fn free_list() -> &'static Mutex<VecDeque<usize>> {
                static FREE: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
                &FREE
            }
        }
    )* };
}
slab!(
    verbs_context,
    ibv_pd,
    ibv_mr,
    ibv_mw,
    ibv_comp_channel,
    ibv_cq_ex,
    ibv_srq,
    ibv_qp_ex,
    ibv_td,
    ibv_ah,
    verbs_xrcd
);

/// One slot holding a C structure the application reads and writes. The
/// slot's memory outlives this value (it is never freed, see the module
/// documentation); dropping the value makes the slot reusable.
pub struct CSlot<C: Slab>(NonNull<C>);

// SAFETY: the slot is plain C data shared with the application, which
// accesses it from any thread under verbs' rules; this library touches it
// only through raw pointers at the points verbs defines (creation, the
// fields providers update such as `qp->state` and `cq->cqe`).
unsafe impl<C: Slab> Send for CSlot<C> {}
// SAFETY: as above.
unsafe impl<C: Slab> Sync for CSlot<C> {}

impl<C: Slab> CSlot<C> {
    pub fn new(value: C) -> CSlot<C> {
        let reuse = {
            let mut free = C::free_list().lock().unwrap_or_else(|e| e.into_inner());
            if free.len() > QUARANTINE {
                free.pop_front()
            } else {
                None
            }
        };
        let p = match reuse {
            Some(a) => a as *mut C,
            None => Box::into_raw(Box::new(C::zeroed())),
        };
        // SAFETY: `p` is a slot of this type (from the free list or just
        // allocated) that nothing else owns now; C structures have no drop
        // glue, so overwriting the old value leaks nothing.
        unsafe { p.write(value) };
        CSlot(NonNull::new(p).expect("Box::into_raw is not null"))
    }

    pub fn get(&self) -> *mut C {
        self.0.as_ptr()
    }
}

impl<C: Slab> Drop for CSlot<C> {
    fn drop(&mut self) {
        C::free_list()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(self.0.as_ptr() as usize);
    }
}

// ---- the registry ----

type Live = Arc<dyn Any + Send + Sync>;

/// Hashes a handle's address: our own slot allocations, distinct and at
/// least 8-byte aligned, so one multiply (Fibonacci hashing) spreads them;
/// SipHash, the default, cost more than the rest of a `poll_cq` lookup
/// (measured with `perf record` on `ib_read_lat`: 14 % of the client's
/// time in the registry, SipHash most of it). A caller that passes
/// addresses chosen to collide slows only its own lookups.
#[derive(Default)]
struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type Registry = HashMap<usize, Live, std::hash::BuildHasherDefault<AddrHasher>>;

/// Application pointer → the live object it names.
static LIVE: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

/// Bumped by every unregistration, so a thread's cached lookup (below)
/// can tell that its entry may be gone.
static GENERATION: AtomicU64 = AtomicU64::new(0);

// ---- lending without a reference count ----
//
// A data-path call (`ibv_post_send`, `ibv_poll_cq`, …) looks its handle up
// in this thread's cache of recent lookups and uses the object through a
// plain pointer: no reference count taken and dropped per call (the
// lookups — a `Weak` upgrade's compare-and-swap loop, a dynamic type check,
// a reference dropped — were a fifth of the samples of a READ's post and
// poll through this library, `perf record` of an `ib_read_lat`-like loop;
// lending took that loop from 75 to 69 ns). What keeps the object alive
// meanwhile is a grace period, as in RCU:
//
// * a call marks its thread busy (`Reader::calls` odd) *before* it reads
//   `GENERATION`, and idle again when it is done with the pointer;
// * an unregistration bumps `GENERATION` (so no later call trusts a cache
//   entry made before it), then waits, before it hands the object back to
//   be freed, until every thread that was busy when it bumped has been
//   idle since (`grace`).
//
// The two sides are a store followed by a load each (Dekker): either the
// call's busy mark is visible to the unregistration, which then waits for
// it, or the call reads the new generation and takes the registry's way,
// where the object is gone. The store-load order costs a full fence per
// call, unless the process registered for `membarrier(2)`'s private
// expedited command: then the unregistration runs that barrier on every
// CPU running one of our threads between its bump and its look at the
// marks, and the call needs only to keep the compiler from reordering
// (liburcu's "membarrier" flavour: `softrdma_shm::barrier`).

/// One thread's calls (see above); kept for the process's life, reused by
/// later threads (a thread's record goes back to `SPARE` when it exits).
/// Its own cache lines: written twice per call, it must not share a line
/// with what another thread writes (a heap neighbour could; on the host of
/// `docs/PERFORMANCE.md` aligning it changed nothing measurable, so this
/// is a precaution, not a measured gain).
#[repr(align(128))]
struct Reader {
    /// Odd while a call of this thread uses a lent pointer; only this
    /// thread writes it.
    calls: AtomicU64,
    /// The process the thread ran in when it took the record: after a
    /// `fork` the child has none of its parent's other threads, and a
    /// parent's thread caught in a call at the fork would keep its count
    /// odd in the child's copy forever, so `grace` looks only at records
    /// of its own process.
    pid: AtomicU32,
}

/// Every record handed to a thread, for `grace` to look at.
static READERS: Mutex<Vec<&'static Reader>> = Mutex::new(Vec::new());
/// Records of exited threads, for new threads.
static SPARE: Mutex<Vec<&'static Reader>> = Mutex::new(Vec::new());

/// `after_fork` registered with `pthread_atfork`, once, before the first
/// thread takes a record.
static ATFORK: std::sync::Once = std::sync::Once::new();

/// In a child after `fork`: the forking thread, the only one the child has,
/// goes on with its record, which now belongs to this process; the
/// parent's other threads' records keep the parent's pid and are ignored
/// (`Reader::pid`). Touches no lock (another thread may have held one at
/// the fork).
extern "C" fn after_fork() {
    // `RECORD`, not `CALLS`: reading that would register a thread that has
    // no record yet, under locks.
    // Slots of the parent's other threads: a thread of the child may get
    // one of their thread pointers.
    let me = softrdma_shm::thread_token();
    for s in &BY_TOKEN {
        if s.token.load(Ordering::Relaxed) != me {
            s.token.store(0, Ordering::Relaxed);
        }
    }
    let r = RECORD.with(|r| r.get());
    if !r.is_null() {
        // SAFETY: records are leaked, never freed.
        unsafe { (*r).pid.store(std::process::id(), Ordering::Relaxed) };
    }
}

/// A thread's call state: its record, how deep it is in lent calls (a
/// call may lend a second handle), and its last few lookups.
struct ThreadCalls {
    reader: &'static Reader,
    /// `barrier::expedited()`, kept here: read from its static between
    /// the busy mark's store and the fence it decides, it cost ~8 ns a
    /// call on the lanes' equivalent path (see `softrdma_shm::barrier`).
    expedited: bool,
    depth: std::cell::Cell<u32>,
    /// The token of the slot this thread holds in `BY_TOKEN`, 0 for none.
    slot: std::cell::Cell<usize>,
    cache: [std::cell::Cell<Cached>; CACHED],
    /// Where the next cache entry goes.
    next: std::cell::Cell<usize>,
}

/// A thread's recent lookups: the address, the generation each was made
/// in, the object's type, and the object. The object is kept alive by the
/// registry, not by the entry (a cache must not keep a destroyed object
/// alive, which would delay what its destruction does — a QP's flush, its
/// number's release); an entry of an older generation is never used.
#[derive(Clone, Copy)]
struct Cached {
    addr: usize,
    generation: u64,
    ty: TypeId,
    object: *const (),
}

const CACHED: usize = 4;

impl Drop for ThreadCalls {
    fn drop(&mut self) {
        // No call of this thread is in progress (it is exiting): the
        // record is idle and can serve another thread.
        let _ = RECORD.try_with(|r| r.set(std::ptr::null()));
        let me = self.slot.get();
        if me != 0 {
            let _ = slot_of(me)
                .token
                .compare_exchange(me, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        SPARE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.reader);
    }
}

thread_local! {
    /// This thread's record once it has one (for `after_fork`, which must
    /// not initialise `CALLS`).
    static RECORD: std::cell::Cell<*const Reader> = const { std::cell::Cell::new(std::ptr::null()) };
    static CALLS: ThreadCalls = {
        // SAFETY: `after_fork` is an `extern "C" fn()` that stays loaded
        // (this library is not unloaded while the process runs).
        ATFORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(after_fork));
        });
        let spare = SPARE.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let reader = spare.unwrap_or_else(|| {
            let r: &'static Reader = Box::leak(Box::new(Reader {
                calls: AtomicU64::new(0),
                pid: AtomicU32::new(0),
            }));
            READERS.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            r
        });
        // An exited thread's record is idle: its count is even.
        reader.pid.store(std::process::id(), Ordering::Relaxed);
        RECORD.with(|r| r.set(reader));
        ThreadCalls {
            reader,
            expedited: barrier::expedited(),
            depth: std::cell::Cell::new(0),
            slot: std::cell::Cell::new(0),
            cache: std::array::from_fn(|_| {
                std::cell::Cell::new(Cached {
                    addr: 0,
                    generation: u64::MAX,
                    ty: TypeId::of::<()>(),
                    object: std::ptr::null(),
                })
            }),
            next: std::cell::Cell::new(0),
        }
    };
}

/// Threads' records by thread pointer: in `libibverbs.so.1` a
/// `thread_local!` is a call to `__tls_get_addr` (the dynamic TLS model of
/// a shared library) and a look at the key's state, twice per READ's post
/// and poll; a thread's pointer is one load (`softrdma_shm::thread_token`).
/// A slot holds one thread's token and its `CALLS`; only that thread ever
/// uses the record through it (another thread's token differs), so the
/// record it finds is its own. Claimed by compare-and-swap from 0 when the
/// thread first finds it free, given back when the thread's `CALLS` drops
/// (before its thread pointer can be another thread's), and cleared in a
/// child after `fork` but for the forking thread's (`after_fork`). Two
/// threads hashed to one slot: the second uses `CALLS` directly.
const SLOTS: usize = 64;
const _: () = assert!(SLOTS.is_power_of_two());

#[repr(align(64))]
struct Slot {
    token: AtomicUsize,
    calls: AtomicPtr<ThreadCalls>,
}

static BY_TOKEN: [Slot; SLOTS] = [const {
    Slot {
        token: AtomicUsize::new(0),
        calls: AtomicPtr::new(std::ptr::null_mut()),
    }
}; SLOTS];

fn slot_of(token: usize) -> &'static Slot {
    // Thread pointers are 8 MiB apart or so: the high bits of a
    // multiplicative hash mix the whole word.
    let h = (token as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize;
    &BY_TOKEN[h >> (usize::BITS - SLOTS.trailing_zeros())]
}

/// This thread's call state, through its slot when it has one.
#[inline(always)]
fn this_thread() -> Option<&'static ThreadCalls> {
    let me = softrdma_shm::thread_token();
    let s = slot_of(me);
    if s.token.load(Ordering::Relaxed) == me {
        // SAFETY: the token is this thread's, so this thread claimed the
        // slot (`this_thread_slow`: its compare-and-swap, then its store of
        // its own `CALLS`, both before this load in its program order; no
        // other thread writes a claimed slot but to clear it in a forked
        // child, where only the forking thread's is kept), and gives it
        // back before its `CALLS` drops: the record is live.
        return Some(unsafe { &*s.calls.load(Ordering::Relaxed) });
    }
    this_thread_slow(me)
}

#[cold]
#[inline(never)]
fn this_thread_slow(me: usize) -> Option<&'static ThreadCalls> {
    CALLS
        .try_with(|t| {
            // SAFETY (the lifetime): the thread-local outlives every call
            // made on this thread; it is not handed to another thread.
            let t: &'static ThreadCalls = unsafe { &*(t as *const ThreadCalls) };
            let s = slot_of(me);
            if s.token.load(Ordering::Relaxed) == 0
                && s.token
                    .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                // Read only by this thread, after this store.
                s.calls.store(
                    t as *const ThreadCalls as *mut ThreadCalls,
                    Ordering::Relaxed,
                );
                t.slot.set(me);
            }
            t
        })
        .ok()
}

impl ThreadCalls {
    /// Mark this thread busy (outermost call only), ordered before the
    /// caller's read of `GENERATION` (see above).
    fn enter(&self) {
        let d = self.depth.get();
        self.depth.set(d + 1);
        if d == 0 {
            let c = self.reader.calls.load(Ordering::Relaxed);
            self.reader.calls.store(c + 1, Ordering::Relaxed);
            if self.expedited {
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
            } else {
                std::sync::atomic::fence(Ordering::SeqCst);
            }
        }
    }

    /// The outermost call is done with its lent pointers.
    fn leave(&self) {
        let d = self.depth.get() - 1;
        self.depth.set(d);
        if d == 0 {
            let c = self.reader.calls.load(Ordering::Relaxed);
            self.reader.calls.store(c + 1, Ordering::Release);
        }
    }
}

/// Wait until every thread busy now has been idle since (see above).
/// Called after an unregistration bumped `GENERATION`, with no lock held
/// that a call could be waiting for (a busy call may be in the registry's
/// slow path, or polling the engine).
fn grace() {
    barrier::heavy();
    // This thread's own record is skipped: a destroy made from inside a
    // lent call of the same thread would otherwise wait for itself (none
    // does; the data path destroys nothing).
    // `RECORD`, not `CALLS`: a destroying thread that never made a lent
    // call needs no record of its own.
    let own = RECORD.try_with(|r| r.get()).unwrap_or(std::ptr::null());
    let readers: Vec<&'static Reader> = READERS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let pid = std::process::id();
    for r in readers {
        if std::ptr::eq(r, own) || r.pid.load(Ordering::Relaxed) != pid {
            continue;
        }
        let seen = r.calls.load(Ordering::Acquire);
        if seen % 2 == 1 {
            // A call is in progress: it ends within the call (the data
            // path never blocks), after which the count moves on.
            while r.calls.load(Ordering::Acquire) == seen {
                std::thread::yield_now();
            }
        }
    }
}

/// An object lent to one library call: through a plain pointer while the
/// calling thread is marked busy (a cache hit), or through a reference
/// count (a miss, which went to the registry).
pub struct Lent<T: 'static> {
    object: NonNull<T>,
    /// `Some`: a cache hit; dropping it ends the call's busy mark.
    calls: Option<&'static ThreadCalls>,
    _owned: Option<Arc<T>>,
}

impl<T> std::ops::Deref for Lent<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: for a hit, the object was registered in the generation
        // the entry names, which was still current after this thread was
        // marked busy: an unregistration since then waits in `grace` for
        // the mark to go, which is not before this `Lent` drops (it
        // borrows nothing longer than itself). For a miss, `_owned` holds
        // a reference.
        unsafe { self.object.as_ref() }
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        if let Some(t) = self.calls {
            t.leave();
        }
    }
}

impl<T: Send + Sync> Lent<T> {
    /// A counted reference, for a caller that keeps the object.
    pub fn to_arc(&self) -> Arc<T> {
        let p = self.object.as_ptr() as *const T;
        // SAFETY: `p` came from `Arc::as_ptr` of the registry's `Arc<T>`
        // (or is `_owned`'s), alive while this `Lent` is (see `deref`),
        // so its count may be raised and a new `Arc` made of it.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }
}

/// The live object behind `p`, lent for one call. The cache hit is
/// inlined into the caller: returned from a call, the `Lent` (inside a
/// `Result`) went through memory at another width than it came back, a
/// store-forwarding stall per data-path call (`perf annotate`).
#[inline(always)]
fn lend<T: Any + Send + Sync>(p: usize, what: &'static str) -> Res<Lent<T>> {
    // A `Lent` does not leave the call it was made for (it is not `Send`).
    let hit = this_thread().and_then(|t| {
        t.enter();
        let g = GENERATION.load(Ordering::Acquire);
        let ty = TypeId::of::<T>();
        for c in &t.cache {
            let e = c.get();
            if e.addr == p && e.generation == g && e.ty == ty && p != 0 {
                return Some((t, e.object));
            }
        }
        t.leave();
        None
    });
    if let Some((t, object)) = hit {
        return Ok(Lent {
            // SAFETY: cache entries hold `Arc::as_ptr` of live objects,
            // never null.
            object: unsafe { NonNull::new_unchecked(object as *mut T) },
            calls: Some(t),
            _owned: None,
        });
    }
    lend_slow(p, what)
}

/// [`lend`] through the registry: a cache miss, or an error.
#[inline(never)]
#[cold]
fn lend_slow<T: Any + Send + Sync>(p: usize, what: &'static str) -> Res<Lent<T>> {
    if p == 0 {
        return Err(Fail::inval(format!("{what} pointer is NULL")));
    }
    let g = GENERATION.load(Ordering::Acquire);
    let o = LIVE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&p)
        .cloned()
        .ok_or_else(|| not_live(what, p))?;
    let o = o
        .downcast::<T>()
        .map_err(|_| Fail::inval(format!("{p:#x} is not a {what}")))?;
    // Made in generation `g` or later: an unregistration since `g` was
    // read makes the entry stale at once.
    let _ = CALLS.try_with(|t| {
        let at = t
            .cache
            .iter()
            .position(|c| c.get().addr == p)
            .unwrap_or(t.next.get());
        t.cache[at].set(Cached {
            addr: p,
            generation: g,
            ty: TypeId::of::<T>(),
            object: Arc::as_ptr(&o) as *const (),
        });
        t.next.set((at + 1) % CACHED);
    });
    Ok(Lent {
        object: NonNull::from(&*o),
        calls: None,
        _owned: Some(o),
    })
}

/// The refusal of a pointer the registry does not hold.
fn not_live(what: &str, p: usize) -> Fail {
    Fail::inval(format!(
        "{what} {p:#x} is not a live object of softrdma's libibverbs \
         (never created here, or already destroyed)"
    ))
}

fn lookup<T: Any + Send + Sync>(p: usize, what: &'static str) -> Res<Arc<T>> {
    Ok(lend::<T>(p, what)?.to_arc())
}

fn register<T: Any + Send + Sync>(p: usize, o: T) {
    LIVE.write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p, Arc::new(o));
}

/// Unregister the object `p` names: only one caller can succeed, so two
/// racing destroys cannot both free it.
fn unregister<T: Any + Send + Sync>(p: usize, what: &'static str) -> Res<Arc<T>> {
    unregister_if::<T>(p, what, |_| Ok(()))
}

/// [`unregister`] if `check` allows it, asked under the registry's lock
/// (so nothing is registered or unregistered between the check and the
/// removal).
fn unregister_if<T: Any + Send + Sync>(
    p: usize,
    what: &str,
    check: impl FnOnce(&T) -> Res<()>,
) -> Res<Arc<T>> {
    let o = {
        let mut live = LIVE.write().unwrap_or_else(|e| e.into_inner());
        match live.get(&p).map(|o| o.downcast_ref::<T>()) {
            Some(Some(o)) => {
                check(o)?;
                // Before the entry goes: a cached lookup that still sees
                // the old generation ran before this destroy, as a call
                // that took its reference from the registry would have.
                GENERATION.fetch_add(1, Ordering::SeqCst);
                let o = live.remove(&p).expect("present");
                o.downcast::<T>().expect("checked type")
            }
            Some(None) => return Err(Fail::inval(format!("{p:#x} is not a {what}"))),
            None if p == 0 => return Err(Fail::inval(format!("{what} pointer is NULL"))),
            None => return Err(not_live(what, p)),
        }
    };
    // Calls that were lent the object through a cache finish before the
    // caller may free it (the registry's lock is not held: such a call may
    // be waiting for it).
    grace();
    Ok(o)
}

/// Implements the pointer conversions for one handle type whose C
/// structure is the slot in field `c`.
macro_rules! handle {
    ($t:ident, $c:ty) => {
        impl $t {
            const WHAT: &'static str = concat!("struct ", stringify!($c));

            /// The live object behind an application's pointer (any pointer
            /// value is fine: it is looked up, not read).
            #[allow(dead_code)] // not every type is looked up yet
            pub fn from_c(p: *mut $c) -> Res<Arc<$t>> {
                lookup(p as usize, Self::WHAT)
            }

            /// The live object behind an application's pointer, lent for
            /// the current call (a data-path call: no reference counted).
            // Always inlined: a `Lent` returned from a call comes back
            // through memory at another width than it was written, a
            // store-forwarding stall per data-path call (`lend`).
            #[inline(always)]
            #[allow(dead_code)] // not every type is on the data path
            pub fn lend(p: *mut $c) -> Res<Lent<$t>> {
                lend(p as usize, Self::WHAT)
            }

            /// The application's pointer to this object.
            pub fn c_ptr(&self) -> *mut $c {
                self.c.get()
            }

            /// Move a new object into the application's hands.
            pub fn into_c(o: $t) -> *mut $c {
                let p = o.c_ptr();
                register(p as usize, o);
                p
            }

            /// Take an object back from the application to destroy it: it
            /// is unregistered now and freed when the last reference (this
            /// one, or a concurrent call's) is dropped.
            #[allow(dead_code)] // a type that counts its users: `take_unused`
            pub fn take(p: *mut $c) -> Res<Arc<$t>> {
                unregister(p as usize, Self::WHAT)
            }
        }
    };
}

/// [`handle!`] for a handle whose slot is an extended structure (`$ex`)
/// that begins with the plain one (`$c`): both pointers are the slot's
/// address, so one registry entry answers both.
macro_rules! handle_ex {
    ($t:ident, $c:ty, $ex:ty) => {
        impl $t {
            const WHAT: &'static str = concat!("struct ", stringify!($c));

            /// The live object behind an application's plain pointer
            /// (looked up, not read).
            pub fn from_c(p: *mut $c) -> Res<Arc<$t>> {
                lookup(p as usize, Self::WHAT)
            }

            /// [`Self::from_c`], lent for the current call (see `lend`;
            /// always inlined, as `handle!`'s).
            #[inline(always)]
            pub fn lend(p: *mut $c) -> Res<Lent<$t>> {
                lend(p as usize, Self::WHAT)
            }

            /// The live object behind its extended pointer (the same
            /// address), lent for the current call (always inlined, as
            /// `handle!`'s `lend`).
            #[inline(always)]
            pub fn lend_ex(p: *mut $ex) -> Res<Lent<$t>> {
                lend(p as usize, Self::WHAT)
            }

            pub fn c_ptr(&self) -> *mut $c {
                self.c.get().cast()
            }

            pub fn ex_ptr(&self) -> *mut $ex {
                self.c.get()
            }

            pub fn into_c(o: $t) -> *mut $c {
                let p = o.c_ptr();
                register(p as usize, o);
                p
            }

            #[allow(dead_code)] // a type that counts its users: `take_unused`
            pub fn take(p: *mut $c) -> Res<Arc<$t>> {
                unregister(p as usize, Self::WHAT)
            }
        }
    };
}

// ---- devices ----

/// A device from `ibv_get_device_list`. Devices live for the whole process;
/// the list array is what is freed.
#[repr(C)]
pub struct Device {
    pub c: std::cell::UnsafeCell<ibv_device>,
    /// Zeroed room in the shape of the tail of rdma-core's private
    /// `struct verbs_device` (ops, refcount, list entry, sysfs, flags), for
    /// code that looks past `struct ibv_device`.
    _verbs_device_tail: [usize; 6],
    pub info: sv::DeviceInfo,
    pub index: i32,
}

// SAFETY: a device is written only while it is built; afterwards neither the
// library nor (by verbs' contract) the application modifies it.
unsafe impl Sync for Device {}

impl Device {
    pub fn new(info: sv::DeviceInfo, index: i32) -> Device {
        let mut c = ibv_device::zeroed();
        c.node_type = IBV_NODE_CA;
        c.transport_type = IBV_TRANSPORT_IB;
        crate::ffi::put_cstr(&mut c.name, &info.name);
        crate::ffi::put_cstr(&mut c.dev_name, &format!("uverbs{index}"));
        crate::ffi::put_cstr(
            &mut c.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        crate::ffi::put_cstr(
            &mut c.ibdev_path,
            &format!("/sys/class/infiniband/{}", info.name),
        );
        Device {
            c: std::cell::UnsafeCell::new(c),
            _verbs_device_tail: [0; 6],
            info,
            index,
        }
    }

    /// The device behind an application's pointer: one of those handed out
    /// (compared by address, never read otherwise).
    pub fn from_c(p: *mut ibv_device) -> Res<&'static Device> {
        if p.is_null() {
            return Err(Fail::inval("struct ibv_device pointer is NULL"));
        }
        crate::device::listed(p).ok_or_else(|| {
            Fail::inval("struct ibv_device was not listed by softrdma's ibv_get_device_list")
        })
    }

    pub fn c_ptr(&self) -> *mut ibv_device {
        self.c.get()
    }
}

// ---- contexts ----

/// An open device: the verbs context (with the operations table the
/// static-inline verbs dispatch through) and the softrdma context whose
/// engine thread drives this process's traffic.
pub struct Context {
    /// `struct verbs_context`; the application's `ibv_context*` points at
    /// its last field. Its operations table is never cleared, so a stale
    /// context pointer still dispatches into this library (which refuses
    /// it).
    vc: CSlot<verbs_context>,
    /// The softrdma context, shared with every context imported from this
    /// one's `cmd_fd` (`ibv_import_device`): the engine stops when the last
    /// of them is closed.
    pub sv: Arc<sv::Context>,
    /// The PDs and MRs of that family of contexts, by handle, for
    /// `ibv_import_pd` / `ibv_import_mr`.
    pub shared: Arc<Shared>,
    pub dev: &'static Device,
    pub port_mtu: sv::Mtu,
    /// CQ id → the application's `ibv_cq*`, to turn completion and async
    /// events back into pointers.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `ibv_qp*`, for async events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// XRC domains opened on a file, by its device and inode: another
    /// `ibv_open_xrcd` of the same file on this context shares the domain.
    pub xrcds: Mutex<HashMap<(u64, u64), std::sync::Weak<sv::Xrcd>>>,
    /// PDs, CQs and completion channels of this context (everything else
    /// hangs off a PD).
    pub users: Users,
    /// `cmd_fd`: a memfd that names the context's family (see
    /// `crate::import`); closed with the context, as rdma-core closes it.
    pub _cmd_fd: OwnedFd,
}

/// What a context shares with the contexts imported from it: where its
/// PDs and MRs are, by the `handle` the application sees. The values are
/// slot addresses, looked up in the registry (and their handles checked)
/// before use, so an entry outliving its object is harmless.
#[derive(Default)]
pub struct Shared {
    pub pds: Mutex<HashMap<u32, usize>>,
    pub mrs: Mutex<HashMap<u32, usize>>,
}

impl Context {
    const WHAT: &'static str = "struct ibv_context";

    pub fn from_c(p: *mut ibv_context) -> Res<Arc<Context>> {
        lookup(p as usize, Self::WHAT)
    }

    pub fn c_ptr(&self) -> *mut ibv_context {
        // SAFETY: projecting to a field of our own slot, without reading.
        unsafe { std::ptr::addr_of_mut!((*self.vc.get()).context) }
    }

    pub fn into_c(o: Context) -> *mut ibv_context {
        let p = o.c_ptr();
        register(p as usize, o);
        p
    }

    pub fn new(
        dev: &'static Device,
        sv: Arc<sv::Context>,
        shared: Arc<Shared>,
        port_mtu: sv::Mtu,
        cmd_fd: OwnedFd,
        vc: verbs_context,
    ) -> Context {
        Context {
            vc: CSlot::new(vc),
            sv,
            shared,
            dev,
            port_mtu,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            xrcds: Mutex::new(HashMap::new()),
            users: Users::default(),
            _cmd_fd: cmd_fd,
        }
    }
}

/// Counts the objects that depend on a resource, so destroying one still
/// in use fails with EBUSY as it does on a kernel provider.
///
/// A destroy *retires* the count (`take_unused`: under the registry's
/// lock, together with the unregistration) only if it is 0, and a retired
/// count refuses new users ([`Users::hold`]) — one atomic step each. So a
/// create racing a destroy either is counted first, and the destroy fails
/// with EBUSY, or finds the count retired and fails itself (EINVAL, as for
/// any destroyed object): never do both succeed. (Checking the count and
/// unregistering as two steps let a QP be created on a CQ between them,
/// and outlive it.)
#[derive(Default)]
pub struct Users(AtomicU32);

/// The bit of [`Users`] a destroy sets; the rest is the count.
const RETIRED: u32 = 1 << 31;

impl Users {
    /// Count a new user for as long as the returned [`Hold`] is kept (see
    /// [`Hold::keep`]); refused once a destroy has retired the count.
    pub fn hold(&self) -> Res<Hold<'_>> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & RETIRED == 0).then_some(n + 1)
            })
            .map_err(|_| Fail::inval("the object it needs is being destroyed"))?;
        Ok(Hold(self))
    }
    pub fn sub(&self) {
        // Saturating: a count is never taken below zero (it would read as
        // four billion users and keep the object forever).
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & !RETIRED > 0).then(|| n - 1)
            });
    }
    /// Retire a count of 0 (then nothing can hold it any more); false if
    /// there are users.
    fn retire(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & !RETIRED == 0).then_some(n | RETIRED)
            })
            .is_ok()
    }
}

/// A user counted by [`Users::hold`]: dropped, it is uncounted again (a
/// create that fails after taking it); [`Hold::keep`] keeps it counted,
/// for the object made, whose destroy calls [`Users::sub`].
#[must_use = "a Hold dropped at once counts nothing"]
pub struct Hold<'a>(&'a Users);

impl Hold<'_> {
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.sub();
    }
}

/// The objects that count their users.
trait Used: Any + Send + Sync {
    fn users(&self) -> &Users;
}

/// For each type that counts its users: [`Used`], and `take_unused`, the
/// `take` of its destroy (see [`take_unused`]).
macro_rules! used {
    ($($t:ident: $c:ty),*) => { $(
        impl Used for $t {
            fn users(&self) -> &Users {
                &self.users
            }
        }

        impl $t {
            /// Take the object back to destroy it, if nothing uses it
            /// (EBUSY with `busy` otherwise).
            pub fn take_unused(p: *mut $c, busy: &'static str) -> Res<Arc<$t>> {
                take_unused(p as usize, Self::WHAT, busy)
            }
        }
    )* };
}
used!(Context: ibv_context, Pd: ibv_pd, Td: ibv_td, CompChannel: ibv_comp_channel,
    Cq: ibv_cq, Srq: ibv_srq, Xrcd: verbs_xrcd);

/// Take an object back from the application to destroy it, if nothing
/// uses it: its count is retired and it is unregistered in one step under
/// the registry's lock (see [`Users`]); EBUSY with `busy` otherwise. As
/// `take`, of two racing destroys only one gets it.
fn take_unused<T: Used>(p: usize, what: &'static str, busy: &'static str) -> Res<Arc<T>> {
    unregister_if::<T>(p, what, |o| {
        if o.users().retire() {
            Ok(())
        } else {
            Err(Fail::new(libc::EBUSY, busy))
        }
    })
}

// ---- resources ----

pub struct Pd {
    c: CSlot<ibv_pd>,
    pub sv: sv::Pd,
    /// MRs, MWs, QPs, SRQs and AHs of this PD.
    pub users: Users,
    /// A parent domain (`ibv_alloc_parent_domain`): the PD it stands for,
    /// whose resources everything created on it are, and its thread
    /// domain. Both count it as a user until it is deallocated.
    pub parent: Option<(Arc<Pd>, Option<Arc<Td>>)>,
    /// Made by `ibv_import_pd`: only such a PD is `ibv_unimport_pd`'s.
    pub imported: bool,
}
handle!(Pd, ibv_pd);

impl Pd {
    pub fn new(c: ibv_pd, sv: sv::Pd) -> Pd {
        Pd {
            c: CSlot::new(c),
            sv,
            users: Users::default(),
            parent: None,
            imported: false,
        }
    }
}

/// A thread domain (`ibv_alloc_td`): a promise that one thread uses the
/// resources of its parent domains. softrdma needs no such promise (its
/// locks are uncontended then anyway), so it holds nothing.
pub struct Td {
    c: CSlot<ibv_td>,
    /// Parent domains using it.
    pub users: Users,
}
handle!(Td, ibv_td);

impl Td {
    pub fn new(c: ibv_td) -> Td {
        Td {
            c: CSlot::new(c),
            users: Users::default(),
        }
    }
}

pub struct Mr {
    c: CSlot<ibv_mr>,
    /// The region and its access bits, changed together by `ibv_rereg_mr`.
    pub state: Mutex<MrState>,
}
handle!(Mr, ibv_mr);

pub struct MrState {
    /// The region (dropping it deregisters).
    pub sv: sv::Mr,
    /// `IBV_ACCESS_*` as registered or last reregistered (memory window
    /// binds check MW_BIND and LOCAL_WRITE).
    pub access: u32,
}

impl Mr {
    pub fn new(c: ibv_mr, sv: sv::Mr, access: u32) -> Mr {
        Mr {
            c: CSlot::new(c),
            state: Mutex::new(MrState { sv, access }),
        }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, MrState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A region imported from another context of its family
/// (`ibv_import_mr`): its own `struct ibv_mr` naming the same keys. The
/// region itself stays the original's: `ibv_unimport_mr` drops only this,
/// and `ibv_dereg_mr` refuses it (the original deregisters).
pub struct ImportedMr {
    c: CSlot<ibv_mr>,
}
handle!(ImportedMr, ibv_mr);

impl ImportedMr {
    pub fn new(c: ibv_mr) -> ImportedMr {
        ImportedMr { c: CSlot::new(c) }
    }
}

/// A memory window: its C structure (whose `rkey` is the application's
/// record, as on rxe) and the window, named by its stable handle.
pub struct Mw {
    c: CSlot<ibv_mw>,
    /// The window (dropping it deallocates).
    pub sv: sv::Mw,
    /// `IBV_MW_TYPE_1` or `IBV_MW_TYPE_2`.
    pub mw_type: u32,
}
handle!(Mw, ibv_mw);

impl Mw {
    pub fn new(c: ibv_mw, sv: sv::Mw, mw_type: u32) -> Mw {
        Mw {
            c: CSlot::new(c),
            sv,
            mw_type,
        }
    }
}

pub struct CompChannel {
    c: CSlot<ibv_comp_channel>,
    pub sv: sv::CompChannel,
    /// CQs using this channel: destroying it before them is EBUSY.
    pub users: Users,
}
handle!(CompChannel, ibv_comp_channel);

impl CompChannel {
    pub fn new(c: ibv_comp_channel, sv: sv::CompChannel) -> CompChannel {
        CompChannel {
            c: CSlot::new(c),
            sv,
            users: Users::default(),
        }
    }
}

/// A CQ. Every CQ's slot is a `struct ibv_cq_ex`, whose head is the
/// `struct ibv_cq` that `ibv_create_cq` returns (`ibv_cq_ex_to_cq` is a
/// cast), so one registry entry serves both pointers.
pub struct Cq {
    c: CSlot<ibv_cq_ex>,
    pub sv: sv::Cq,
    /// QPs using this CQ.
    pub users: Users,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current, which
    /// the `ibv_wc_read_*` functions read (None outside a poll).
    pub current: Mutex<Option<sv::Completion>>,
}

handle_ex!(Cq, ibv_cq, ibv_cq_ex);

impl Cq {
    pub fn new(c: ibv_cq_ex, sv: sv::Cq) -> Cq {
        Cq {
            c: CSlot::new(c),
            sv,
            users: Users::default(),
            current: Mutex::new(None),
        }
    }
}

pub struct Srq {
    c: CSlot<ibv_srq>,
    pub sv: sv::Srq,
    pub attr: Mutex<ibv_srq_attr>,
    /// QPs attached to this SRQ.
    pub users: Users,
    /// An XRC SRQ: the application's `ibv_xrcd*` and `ibv_cq*` (numbers,
    /// looked up at destroy), each of which counts it as a user.
    pub xrc: Option<(usize, usize)>,
}
handle!(Srq, ibv_srq);

impl Srq {
    pub fn new(c: ibv_srq, sv: sv::Srq, attr: ibv_srq_attr) -> Srq {
        Srq {
            c: CSlot::new(c),
            sv,
            attr: Mutex::new(attr),
            users: Users::default(),
            xrc: None,
        }
    }
}

/// An XRC domain handle (`ibv_open_xrcd`). Handles opened on the same file
/// on one context share their domain (`sv`).
pub struct Xrcd {
    c: CSlot<verbs_xrcd>,
    pub sv: Arc<sv::Xrcd>,
    /// XRC SRQs and target QPs created through this handle.
    pub users: Users,
}
handle!(Xrcd, verbs_xrcd);

impl Xrcd {
    pub fn new(c: verbs_xrcd, sv: Arc<sv::Xrcd>) -> Xrcd {
        Xrcd {
            c: CSlot::new(c),
            sv,
            users: Users::default(),
        }
    }
}

/// A QP. Every QP's slot is a `struct ibv_qp_ex`, whose head is the
/// `struct ibv_qp` the application holds; `ibv_qp_to_qp_ex` hands out the
/// same address for a QP created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub struct Qp {
    c: CSlot<ibv_qp_ex>,
    pub sv: sv::Qp,
    pub qp_type: sv::QpType,
    pub sq_sig_all: bool,
    /// Created with send-ops flags: the `ibv_wr_*` interface is on.
    pub extended: bool,
    /// The granted `max_inline_data` (fixed at creation), for
    /// `ibv_wr_set_inline_data`'s check without a query per call.
    pub max_inline_data: u32,
    /// The granted `max_send_wr` (fixed at creation): the most requests
    /// one `ibv_post_send` chain or `ibv_wr_*` batch may carry, as a
    /// provider's send queue holds no more (a chain that loops back on
    /// itself ends there with ENOMEM instead of posting forever).
    pub max_send_wr: u32,
    /// The work requests built since `ibv_wr_start`.
    pub batch: Mutex<crate::qpex::Batch>,
    /// An XRC target QP: the application's `ibv_xrcd*` it was created
    /// with (a number, looked up at destroy), which counts it as a user.
    pub xrcd: usize,
}

handle_ex!(Qp, ibv_qp, ibv_qp_ex);

impl Qp {
    pub fn new(c: ibv_qp_ex, sv: sv::Qp, qp_type: sv::QpType, sq_sig_all: bool) -> Qp {
        Qp {
            c: CSlot::new(c),
            sv,
            qp_type,
            sq_sig_all,
            extended: false,
            max_inline_data: 0,
            max_send_wr: 0,
            batch: Mutex::new(Default::default()),
            xrcd: 0,
        }
    }
}

pub struct Ah {
    c: CSlot<ibv_ah>,
    pub sv: sv::Ah,
}
handle!(Ah, ibv_ah);

impl Ah {
    pub fn new(c: ibv_ah, sv: sv::Ah) -> Ah {
        Ah {
            c: CSlot::new(c),
            sv,
        }
    }
}

#[cfg(test)]
mod lending {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// An object whose drop is seen.
    struct Watched(Arc<AtomicBool>);

    impl Drop for Watched {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A `Watched` registered under a unique address (never dereferenced),
    /// already in this thread's cache: the address and its drop flag.
    fn registered_and_cached() -> (usize, Arc<AtomicBool>) {
        let p = Box::leak(Box::new(0u64)) as *mut u64 as usize;
        let dropped = Arc::new(AtomicBool::new(false));
        register(p, Watched(dropped.clone()));
        // The first lookup fills the cache.
        drop(lend::<Watched>(p, "watched").expect("registered"));
        (p, dropped)
    }

    #[test]
    fn a_cached_lookup_ends_with_the_unregistration() {
        let (p, dropped) = registered_and_cached();
        // The second lookup hits the cache.
        assert!(lend::<Watched>(p, "watched")
            .expect("cached")
            .calls
            .is_some());
        // The wrong type is refused even with the address cached.
        assert!(lend::<u32>(p, "u32").is_err());
        drop(unregister::<Watched>(p, "watched").expect("registered"));
        assert!(dropped.load(Ordering::SeqCst));
        assert!(
            lend::<Watched>(p, "watched").is_err(),
            "a stale cache entry answered"
        );
    }

    #[test]
    fn an_unregistration_waits_for_the_calls_lent_the_object() {
        let (p, dropped) = registered_and_cached();
        let lent = lend::<Watched>(p, "watched").expect("cached");
        assert!(lent.calls.is_some(), "lent through the cache");
        let started = Arc::new(AtomicBool::new(false));
        let destroyer = {
            let started = started.clone();
            std::thread::spawn(move || {
                started.store(true, Ordering::SeqCst);
                // Returns the object, dropped here: not before the lent
                // call below is over.
                drop(unregister::<Watched>(p, "watched").expect("registered"));
            })
        };
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // Give the destroyer every chance to get through if it did not
        // wait (it cannot get through if it does).
        for _ in 0..1000 {
            std::thread::yield_now();
        }
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the object was freed while a call was using it"
        );
        drop(lent);
        destroyer.join().expect("the destroyer");
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// Many threads at once — more than there are slots, so some share
    /// one — each find their own record (a lent call marks its own
    /// thread busy, no other), and each gives its slot back as it exits.
    #[test]
    fn threads_find_their_own_records_and_give_their_slots_back() {
        let (p, _dropped) = registered_and_cached();
        let threads = 2 * SLOTS;
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = barrier.clone();
                // Small stacks: the libc caches an exited thread's stack
                // (and its thread pointer) for the next thread that fits,
                // and a test running beside this one, on a default-sized
                // stack, must not get one of these tokens and claim its
                // slot before the check below.
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let mine = softrdma_shm::thread_token();
                        for _ in 0..3 {
                            drop(lend::<Watched>(p, "watched").expect("registered"));
                            let t = this_thread().expect("a live thread has a record");
                            let own = CALLS.with(|c| c as *const ThreadCalls);
                            assert!(std::ptr::eq(t, own), "another thread's record");
                            let lent = lend::<Watched>(p, "watched").expect("cached");
                            assert_eq!(t.reader.calls.load(Ordering::Relaxed) % 2, 1, "busy");
                            drop(lent);
                            assert_eq!(t.reader.calls.load(Ordering::Relaxed) % 2, 0, "idle");
                        }
                        // All the threads are alive here at once.
                        barrier.wait();
                        let claimed = CALLS.with(|c| c.slot.get());
                        assert!(claimed == 0 || claimed == mine);
                        claimed
                    })
                    .expect("a thread")
            })
            .collect();
        let claimed: Vec<usize> = handles
            .into_iter()
            .map(|h| h.join().expect("a lending thread"))
            .filter(|&t| t != 0)
            .collect();
        assert!(!claimed.is_empty(), "no thread took a slot");
        for t in claimed {
            assert_ne!(
                slot_of(t).token.load(Ordering::Relaxed),
                t,
                "an exited thread kept its slot"
            );
        }
    }
}
