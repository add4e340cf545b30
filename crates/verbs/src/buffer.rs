//! Memory a region owns: the caller's own buffers, registered without
//! `unsafe` and given back ([`Pd::reg_buf`], [`MrBuf::into_buffer`]); page-
//! aligned allocations ([`Pd::alloc_mr`]); zero-copy access that cannot race
//! with the engine ([`Mr::with_bytes`], [`Mr::with_bytes_mut`]) and 8-byte
//! atomic words ([`Mr::load_u64`], [`Mr::store_u64`]).
//!
//! A region's bytes change under remote WRITEs at any time, so Rust code
//! never holds a reference to them outside the device's state lock (under
//! which the engine does all its own accesses; see [`Mr`]). A registered
//! buffer is therefore taken apart into a raw pointer and length for as
//! long as it is registered — a live `Box` or `&mut` would assert unique
//! access that the engine's writes contradict — and put back together only
//! once deregistration has returned and the core can no longer reach it.

use std::alloc::Layout;
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, RangeBounds};

use crate::connect::bounds;
use crate::{AccessFlags, CoreError, Error, Mr, Pd, Result};

/// Element types for which every bit pattern is a valid value: what a
/// remote peer may write into registered memory.
///
/// # Safety
/// Implementors must be plain data: no padding, no invalid bit patterns,
/// no pointers, no drop glue.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer or float: every bit pattern is valid,
        // no padding, no drop glue.
        unsafe impl Plain for $t {}
    )*};
}
plain!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, f32, f64);

/// A buffer taken apart for registration: its bytes and what is needed to
/// rebuild its owner.
#[derive(Debug)]
pub struct RawBuffer {
    /// The first byte.
    pub ptr: *mut u8,
    /// How many bytes the region covers.
    pub len: usize,
    /// Whatever else the owner needs back (a `Vec`'s capacity).
    pub extra: usize,
}

/// A buffer a memory region can take ownership of and give back: `Vec<T>`
/// and `Box<[T]>` of [`Plain`] elements, and [`PageBuf`].
///
/// # Safety
/// `into_raw` must return `len` bytes at `ptr` that are valid for reads and
/// writes of any bit pattern and stay allocated, untouched by anything else,
/// until `from_raw` is called with that same `RawBuffer` (or forever).
/// `from_raw` must rebuild the owner from it.
pub unsafe trait Buffer: Send + 'static {
    /// Give up the bytes.
    fn into_raw(self) -> RawBuffer;
    /// Rebuild the owner.
    ///
    /// # Safety
    /// `raw` came from `Self::into_raw` and is used once.
    unsafe fn from_raw(raw: RawBuffer) -> Self;
}

// SAFETY: a `Vec`'s heap allocation does not move while it is taken apart
// (nothing holds the `Vec`); `T: Plain` makes any bytes valid elements;
// `from_raw_parts` gets back the pointer, length and capacity it gave.
unsafe impl<T: Plain> Buffer for Vec<T> {
    fn into_raw(self) -> RawBuffer {
        let mut v = ManuallyDrop::new(self);
        RawBuffer {
            ptr: v.as_mut_ptr().cast::<u8>(),
            len: std::mem::size_of_val(&v[..]),
            extra: v.capacity(),
        }
    }
    unsafe fn from_raw(raw: RawBuffer) -> Self {
        let n = raw.len / std::mem::size_of::<T>().max(1);
        // SAFETY: the parts `into_raw` took from a `Vec<T>` (see the
        // impl's safety argument).
        unsafe { Vec::from_raw_parts(raw.ptr.cast::<T>(), n, raw.extra) }
    }
}

// SAFETY: as for `Vec<T>`: `Box::into_raw` gives up the allocation until
// `Box::from_raw` takes it back.
unsafe impl<T: Plain> Buffer for Box<[T]> {
    fn into_raw(self) -> RawBuffer {
        let len = std::mem::size_of_val(&self[..]);
        let n = self.len();
        RawBuffer {
            ptr: Box::into_raw(self).cast::<u8>(),
            len,
            extra: n,
        }
    }
    unsafe fn from_raw(raw: RawBuffer) -> Self {
        // SAFETY: the pointer and element count `into_raw` took.
        unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                raw.ptr.cast::<T>(),
                raw.extra,
            ))
        }
    }
}

/// Page-aligned (4096-byte) zeroed memory: what [`Pd::alloc_mr`] registers.
/// Every 8-byte word of it is aligned for atomics.
pub struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

/// The alignment of [`PageBuf`].
pub const PAGE: usize = 4096;

impl PageBuf {
    /// `len` zero bytes at a page boundary.
    pub fn zeroed(len: usize) -> PageBuf {
        if len == 0 {
            return PageBuf {
                ptr: std::ptr::without_provenance_mut(PAGE),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, PAGE).expect("a length below isize::MAX");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        PageBuf { ptr, len }
    }
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes at `ptr`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            unsafe {
                std::alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, PAGE))
            }
        }
    }
}

// SAFETY: `PageBuf` owns its allocation exclusively, like a `Box<[u8]>`.
unsafe impl Send for PageBuf {}
// SAFETY: shared access only reads, through `Deref`.
unsafe impl Sync for PageBuf {}

// SAFETY: as for `Box<[T]>`: the allocation is given up by forgetting the
// owner and rebuilt from the same pointer and length.
unsafe impl Buffer for PageBuf {
    fn into_raw(self) -> RawBuffer {
        let b = ManuallyDrop::new(self);
        RawBuffer {
            ptr: b.ptr,
            len: b.len,
            extra: 0,
        }
    }
    unsafe fn from_raw(raw: RawBuffer) -> Self {
        PageBuf {
            ptr: raw.ptr,
            len: raw.len,
        }
    }
}

/// A registered buffer, owned by its region while registered: a type-erased
/// [`Buffer`] and the function that rebuilds and drops it.
pub(crate) struct OwnedBuf {
    raw: Option<RawBuffer>,
    free: unsafe fn(RawBuffer),
}

impl OwnedBuf {
    pub(crate) fn of<B: Buffer>(b: B) -> OwnedBuf {
        unsafe fn free<B: Buffer>(raw: RawBuffer) {
            // SAFETY: `raw` came from `B::into_raw` in `OwnedBuf::of::<B>`,
            // and `OwnedBuf` calls this at most once.
            drop(unsafe { B::from_raw(raw) });
        }
        OwnedBuf {
            raw: Some(b.into_raw()),
            free: free::<B>,
        }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.raw.as_ref().map_or(std::ptr::null_mut(), |r| r.ptr)
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.as_ref().map_or(0, |r| r.len)
    }

    /// Give the buffer back as a `B`.
    ///
    /// # Safety
    /// `self` was made by `OwnedBuf::of::<B>` and the core can no longer
    /// reach its bytes.
    unsafe fn take<B: Buffer>(mut self) -> B {
        let raw = self.raw.take().expect("taken once");
        // SAFETY: guaranteed by the caller.
        unsafe { B::from_raw(raw) }
    }
}

// SAFETY: `OwnedBuf` only frees or returns the allocation; every access to
// the bytes while it is registered goes through the engine's state lock
// (see `Mr`), and `Buffer: Send` lets the owner move between threads.
unsafe impl Send for OwnedBuf {}
// SAFETY: as for `Send`: no method touches the bytes through `&self`.
unsafe impl Sync for OwnedBuf {}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            // SAFETY: `free` matches the type `raw` came from, called once.
            unsafe { (self.free)(raw) }
        }
    }
}

/// A memory region over the caller's buffer of type `B`: a [`Mr`] (through
/// `Deref`) that gives the buffer back with [`MrBuf::into_buffer`].
pub struct MrBuf<B: Buffer> {
    mr: Mr,
    _buf: PhantomData<fn() -> B>,
}

impl<B: Buffer> Deref for MrBuf<B> {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl<B: Buffer> MrBuf<B> {
    /// Deregister and give the buffer back, with whatever the peers and
    /// the device wrote into it. Work still using the region completes
    /// with an error (as after `ibv_dereg_mr`); nothing reaches the buffer
    /// once this returns. Refused while memory windows are bound to the
    /// region: the region comes back with the error.
    pub fn into_buffer(mut self) -> std::result::Result<B, Box<(MrBuf<B>, Error)>> {
        if let Err(e) = self.mr.deregister() {
            return Err(Box::new((self, e)));
        }
        let buf = self.mr.buf.take().expect("an MrBuf owns its buffer");
        // SAFETY: made by `OwnedBuf::of::<B>` in `Pd::reg_buf`, and the
        // core no longer reaches it: `deregister` has returned.
        Ok(unsafe { buf.take::<B>() })
    }

    /// The region, as a plain [`Mr`] (the buffer is then freed with it).
    pub fn into_mr(self) -> Mr {
        self.mr
    }
}

impl Pd {
    /// Register the caller's buffer (`Vec<T>`, `Box<[T]>` of plain
    /// elements, a [`PageBuf`]); the region owns it until
    /// [`MrBuf::into_buffer`] gives it back. Its address is its iova.
    pub fn reg_buf<B: Buffer>(&self, buf: B, access: AccessFlags) -> Result<MrBuf<B>> {
        Ok(MrBuf {
            mr: self.reg_owned(OwnedBuf::of(buf), access)?,
            _buf: PhantomData,
        })
    }

    /// Allocate `len` zeroed, page-aligned bytes and register them: every
    /// 8-byte word is aligned for atomics, remote and local.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        self.reg_owned(OwnedBuf::of(PageBuf::zeroed(len)), access)
    }
}

thread_local! {
    /// Set while this thread runs a closure that borrows region bytes
    /// under the device's state lock (`Mr::with_bytes*`).
    static IN_VIEW: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread takes completions without the engine's lock
    /// (`Cq::poll_with`'s and `Cq::poll_lanes`'s callbacks run then): the
    /// completions handed to the callback are held for it, by the CQ
    /// lane's flag or the stash's mutex, which the engine's lock would
    /// wait for.
    static IN_POLL: Cell<bool> = const { Cell::new(false) };
}

/// Panic if this thread is inside a poll's callback (see `IN_POLL`):
/// taking the engine's lock, or polling again, would wait forever for what
/// this very thread holds.
#[inline]
pub(crate) fn assert_not_in_poll() {
    if IN_POLL.with(Cell::get) {
        panic!(
            "softrdma: a verbs call inside the callback of Cq::poll_with/poll_lanes would \
             deadlock; collect what you need and act on it after the poll returns"
        );
    }
}

/// Marks this thread as inside a poll's callback until dropped (however
/// the callback ends).
pub(crate) struct PollFlag;

impl PollFlag {
    #[inline]
    pub(crate) fn set() -> PollFlag {
        assert_not_in_poll();
        IN_POLL.with(|f| f.set(true));
        PollFlag
    }
}

impl Drop for PollFlag {
    #[inline]
    fn drop(&mut self) {
        IN_POLL.with(|f| f.set(false));
    }
}

/// Panic if this thread is inside `Mr::with_bytes*`: taking the state lock
/// again would deadlock (it is not re-entrant, and must not be: the call
/// could make the engine write into the bytes being borrowed).
pub(crate) fn assert_not_in_view() {
    assert_not_in_poll();
    if IN_VIEW.with(Cell::get) {
        panic!(
            "softrdma: a verbs call inside Mr::with_bytes/with_bytes_mut would deadlock; \
             copy what you need out of the closure first"
        );
    }
}

struct ViewFlag;

impl ViewFlag {
    fn set() -> ViewFlag {
        IN_VIEW.with(|f| f.set(true));
        ViewFlag
    }
}

impl Drop for ViewFlag {
    fn drop(&mut self) {
        IN_VIEW.with(|f| f.set(false));
    }
}

impl Mr {
    /// Borrow the bytes `range` of the region, without copying, for the
    /// duration of `f`. The device's state lock is held meanwhile, so no
    /// remote WRITE or atomic changes them under `f` (the engine waits,
    /// and so does every other thread using this device: keep `f` short).
    ///
    /// # Panics
    /// If `f` calls into the same device (any verb): that would deadlock,
    /// as re-borrowing a `RefCell` would alias; the panic says so. A verb
    /// of another device called from `f` may panic the same way (whenever
    /// it needs that device's engine) or complete (a post its lock-free
    /// lane carries out, which touches none of these bytes): do not rely
    /// on either.
    pub fn with_bytes<R>(
        &self,
        range: impl RangeBounds<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let (s, e) = bounds(range, self.len())?;
        let mut st = self.eng.lock();
        // Peers on this host reach the memory without our lock: keep them
        // out while the slice lives.
        let _peers = self.pause_peers(&mut st);
        let _flag = ViewFlag::set();
        // SAFETY: in bounds of this live region; the engine touches region
        // memory only under the lock held until `f` returns (peer processes
        // sharing memory and this context's lock-free lanes are held off by
        // `pause_peers`, the lanes reopening only under the lock), and `f`
        // cannot take it again (the flag makes that a panic), so nothing
        // writes these bytes while the slice exists. The slice does not
        // outlive `f`.
        let bytes = unsafe { std::slice::from_raw_parts((self.addr() as *const u8).add(s), e - s) };
        Ok(f(bytes))
    }

    /// [`Mr::with_bytes`], mutably: `f` may change the bytes in place.
    ///
    /// # Panics
    /// As [`Mr::with_bytes`].
    pub fn with_bytes_mut<R>(
        &self,
        range: impl RangeBounds<usize>,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let (s, e) = bounds(range, self.len())?;
        let mut st = self.eng.lock();
        let _peers = self.pause_peers(&mut st);
        let _flag = ViewFlag::set();
        // SAFETY: as for `with_bytes`; and no other `&`/`&mut` to region
        // bytes exists anywhere (they are only lent under this lock, which
        // this thread holds).
        let bytes =
            unsafe { std::slice::from_raw_parts_mut((self.addr() as *mut u8).add(s), e - s) };
        Ok(f(bytes))
    }

    fn word(&self, offset: usize) -> Result<*const std::sync::atomic::AtomicU64> {
        bounds(offset..offset.saturating_add(8), self.len())?;
        let a = self.addr() + offset as u64;
        if !a.is_multiple_of(8) {
            return Err(Error::Verbs(CoreError::InvalidArgument(
                "8-byte word is not 8-byte aligned in memory (alloc_mr's regions are)",
            )));
        }
        Ok(a as *const std::sync::atomic::AtomicU64)
    }

    /// Load the aligned 8-byte word at `offset` (native byte order, as
    /// remote atomics store it), atomically with respect to the engine.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        let w = self.word(offset)?;
        let _st = self.eng.lock();
        // SAFETY: an aligned word inside this live region (checked in
        // `word`); every other access to it, the engine's included, is
        // under the lock held here or is itself atomic — but for what a
        // peer process sharing the memory, or one of this context's lanes,
        // writes there as a READ's or atomic's result: through raw
        // pointers, as an RNIC's DMA would, with no reference to the word.
        Ok(unsafe { &*w }.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Store the aligned 8-byte word at `offset` (native byte order).
    pub fn store_u64(&self, offset: usize, v: u64) -> Result<()> {
        let w = self.word(offset)?;
        let _st = self.eng.lock();
        // SAFETY: as for `load_u64`.
        unsafe { &*w }.store(v, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}
