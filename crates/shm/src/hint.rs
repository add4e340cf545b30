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
