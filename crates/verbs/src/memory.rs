//! Process memory as the transport core sees it.
//!
//! The core translates every access through its memory-region table at the
//! moment of the access (as an RNIC looks up its translation table per DMA);
//! this is the one place where those translated addresses are turned back
//! into pointers. Every call here runs under the engine's state lock, and a
//! region's buffer is freed only after `Endpoint::dereg_mr` has returned
//! under that lock — after which the core never produces an address in it.
//! That is what makes these accesses sound.

use std::sync::atomic::{AtomicU64, Ordering};

use softrdma_core::mr::Memory;

/// Registered memory in this process's address space.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMemory;

impl Memory for HostMemory {
    fn read(&self, addr: u64, out: &mut [u8]) {
        // SAFETY: the core only passes ranges it translated through the
        // region table during this call, so they lie in a registered region
        // whose buffer cannot be freed while the engine's lock is held (see
        // the module docs). `out` is an engine-owned buffer, never
        // registered, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        // SAFETY: as for `read`; the region was validated as writable and
        // `data` (a receive buffer of the engine) never aliases it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
    }

    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64 {
        // SAFETY: translated during this call (live, see `read`), and 8-byte
        // aligned: the core checks the translated host address, not only
        // the VA, and NAKs a misaligned atomic, so this is a valid
        // AtomicU64 location for the duration of the call.
        let a = unsafe { &*(addr as *const AtomicU64) };
        match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    }

    fn fetch_add(&mut self, addr: u64, add: u64) -> u64 {
        // SAFETY: as for `compare_swap`.
        let a = unsafe { &*(addr as *const AtomicU64) };
        a.fetch_add(add, Ordering::SeqCst)
    }

    fn store_u64(&mut self, addr: u64, bytes: [u8; 8]) {
        // SAFETY: as for `compare_swap`: the core checks the translated
        // host address of an ATOMIC WRITE for 8-byte alignment too.
        let a = unsafe { &*(addr as *const AtomicU64) };
        // The bytes land as they came, in memory order (no byte swap), as
        // rxe's atomic_write_reply stores them.
        a.store(u64::from_ne_bytes(bytes), Ordering::SeqCst)
    }
}

/// A payload segment as a byte slice, for the IO backend.
///
/// # Safety
/// `addr..addr+len` must lie in live registered memory, which holds for the
/// segments of a `Transmit` until the pass that got it lets the state lock
/// go (a region cannot be deregistered without that lock).
pub(crate) unsafe fn segment<'a>(addr: u64, len: u32) -> &'a [u8] {
    // SAFETY: guaranteed by the caller (see above).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }
}
