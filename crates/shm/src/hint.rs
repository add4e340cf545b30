//! A prefetch for writing: ask the CPU for a cache line in the state a
//! store needs before the store is reached.
//!
//! A one-sided WRITE into a peer that spins on its buffer (every latency
//! test, most ping-pongs) stores into a line the peer's core holds: the
//! store cannot complete until this core has taken the line from it (a
//! read-for-ownership, a cross-core transfer), and the checks before the
//! copy — the responder's, which keep deregistration safe — run first. A
//! write prefetch of the target line as the post begins starts that
//! transfer while the checks run. It is only a hint: if the checks refuse
//! the request, nothing was read or written.

/// Ask for the cache line holding `p` in this core's cache, owned for
/// writing (x86's `PREFETCHW`), where the CPU has the instruction; nothing
/// elsewhere. It reads and writes no memory and never faults, whatever
/// `p` is: the caller need not own, map or have checked it.
#[inline(always)]
pub fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    if has_prefetchw() {
        // SAFETY: PREFETCHW has no architectural effect on memory and
        // raises no exception for any address (a prefetch is a hint: an
        // unmapped or forbidden address is ignored); it changes only the
        // line's cache state. It touches no register but its address
        // operand, and no flags.
        unsafe {
            std::arch::asm!(
                "prefetchw [{}]",
                // An address, not a pointer the block reads through.
                in(reg) p as usize,
                options(nostack, nomem, preserves_flags)
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// CPUID 8000_0001h ECX bit 8 (PRFCHW, Linux's `3dnowprefetch`), read
/// once: 0 not yet, 1 absent, 2 present. Before Broadwell, Intel's cores
/// lacked it (and ran the encoding as a no-op); every x86-64 CPU has the
/// extended leaf.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        0 => {
            let yes = (std::arch::x86_64::__cpuid(0x8000_0001).ecx >> 8) & 1 == 1;
            HAS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        v => v == 2,
    }
}

#[cfg(test)]
mod tests {
    use super::prefetch_for_write;

    /// The hint is issued for addresses nobody checked: none may fault —
    /// null, the top of the address space, a page just unmapped, a
    /// non-canonical address.
    #[test]
    fn a_prefetch_faults_on_no_address() {
        let page = 4096usize;
        // SAFETY: a fresh anonymous mapping of one page, unmapped at once;
        // only its (now unmapped) address is used below.
        let gone = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::munmap(p, page), 0);
            p as usize
        };
        for a in [
            0usize,
            usize::MAX - 63,
            gone,
            gone + 64,
            0x0000_8000_0000_0000,
        ] {
            prefetch_for_write(a as *const u8);
        }
        // And a line this test owns, which it then reads unchanged.
        let v = [7u8; 128];
        prefetch_for_write(v.as_ptr());
        assert!(v.iter().all(|&b| b == 7));
    }
}
