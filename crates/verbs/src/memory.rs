//! Process memory as the transport core sees it.
//!
//! The core translates every access through its memory-region table at the
//! moment of the access (as an RNIC looks up its translation table per DMA);
//! this is the one place where those translated addresses are turned back
//! into pointers. Every call here runs under the engine's state lock, and a
//! region's buffer is freed only after `Endpoint::dereg_mr` has returned
//! under that lock — after which the core never produces an address in it.
//! That is what makes these accesses sound. (The other way in without the
//! lock, a QP's lane in `crate::lane`, is closed and drained under the lock
//! before any region is withdrawn, so the same holds for it.)
//!
//! An implicit on-demand region (the whole address space, `ibv_reg_mr(pd,
//! NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND)`) carries no such promise: a peer
//! may name an address the process never mapped. The core reaches it only
//! through the `_checked` calls, and those never dereference an address:
//! the kernel copies (`process_vm_readv`/`process_vm_writev` on our own
//! pid), answering EFAULT for a page that is not there or not writable —
//! what an RNIC's failed page fault is — where a copy of ours would take
//! SIGSEGV.

use std::sync::atomic::{AtomicU64, Ordering};

use softrdma_core::mr::{Fault, Memory};

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

    fn read_checked(&self, addr: u64, out: &mut [u8]) -> Result<(), Fault> {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: out.len(),
        };
        // SAFETY: `local` is `out`, writable for its length. `remote` is
        // only an address for the kernel, which reads it through this
        // process's page tables and fails with EFAULT (or copies less)
        // where nothing readable is mapped; no pointer to it is formed here.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        whole(n, out.len())
    }

    fn write_checked(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: `local` is `data`, which the kernel only reads. `remote`
        // is written by the kernel through this process's page tables, only
        // where a writable mapping is (no FOLL_FORCE: read-only pages give
        // EFAULT, unlike /proc/self/mem). Bytes of an implicit region belong
        // to whoever registered it for any peer to write (verbs' contract
        // for such a region), so landing there is the access it granted.
        let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
        whole(n, data.len())
    }

    fn compare_swap_checked(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, Fault> {
        // SAFETY: see `mapped_word`.
        let a = unsafe { mapped_word(addr)? };
        Ok(
            match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add_checked(&mut self, addr: u64, add: u64) -> Result<u64, Fault> {
        // SAFETY: see `mapped_word`.
        let a = unsafe { mapped_word(addr)? };
        Ok(a.fetch_add(add, Ordering::SeqCst))
    }

    fn store_u64_checked(&mut self, addr: u64, bytes: [u8; 8]) -> Result<(), Fault> {
        // SAFETY: see `mapped_word`.
        let a = unsafe { mapped_word(addr)? };
        a.store(u64::from_ne_bytes(bytes), Ordering::SeqCst);
        Ok(())
    }
}

/// The 8-byte aligned word at `addr` of an implicit region, once the
/// kernel has said it is mapped readable and writable.
///
/// The kernel faults the page in for writing, as the atomic's store would,
/// without touching its bytes (`MADV_POPULATE_WRITE`); an unmapped page is
/// ENOMEM, a read-only or PROT_NONE one EINVAL or EFAULT. (A kernel before
/// 5.14 knows no MADV_POPULATE_WRITE and says EINVAL: every atomic on an
/// implicit region then fails, safely.)
///
/// # Safety
/// `addr` is 8-byte aligned (the core NAKs a misaligned atomic before it
/// asks), and the application does not unmap the word while the atomic
/// runs, under the engine's lock. The second is the one thing a check can
/// not give without pinning: an application that unmaps, in another
/// thread, memory it registered for peers' atomics at the moment one
/// lands loses its process, as it would touching that memory itself.
unsafe fn mapped_word<'a>(addr: u64) -> Result<&'a AtomicU64, Fault> {
    let page = page_size();
    let start = addr & !(page - 1);
    // SAFETY: madvise reads no memory of ours; POPULATE_WRITE changes
    // no byte (it only faults pages in), on a page-aligned range.
    let r = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            page as usize,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if r != 0 {
        return Err(Fault);
    }
    // SAFETY: aligned (caller) and mapped readable and writable just now,
    // and not unmapped meanwhile (caller): a valid AtomicU64 location for
    // the atomic, whose bytes anyone may change concurrently only through
    // atomics or raw copies.
    Ok(unsafe { &*(addr as *const AtomicU64) })
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// A checked copy succeeded only if it moved every byte.
fn whole(n: isize, want: usize) -> Result<(), Fault> {
    if n >= 0 && n as usize == want {
        Ok(())
    } else {
        Err(Fault)
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
