//! An asymmetric fence within one process (liburcu's "membarrier"
//! flavour): the frequent side of a store-then-load handshake (Dekker's)
//! pays a compiler fence (where [`expedited`]), the rare side a
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` ([`heavy`]), which runs a
//! full memory barrier on every CPU that runs one of this process's
//! threads at that moment (an IPI each: microseconds). Between that
//! compiler fence and a `heavy`, as between two `fence(SeqCst)`, one
//! side's store before its fence is visible to the other side's load
//! after its fence.
//!
//! Where the kernel refuses the registration (before Linux 4.14, or a
//! seccomp filter), both are `fence(SeqCst)`: correct, and as costly on
//! the frequent side as the handshake without this module.

use std::sync::atomic::{fence, AtomicU8, Ordering};

// membarrier(2) commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether the process registered for private expedited membarriers:
/// 0 not yet asked, [`YES`] or [`NO`]. Decided once, before the first
/// [`expedited`] or [`heavy`] returns.
static STATE: AtomicU8 = AtomicU8::new(0);
const YES: u8 = 1;
const NO: u8 = 2;

#[cold]
#[inline(never)]
fn register() -> u8 {
    // SAFETY: membarrier takes (cmd, flags, cpu_id) and touches no memory
    // of ours.
    let ok = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    };
    // Two threads may register at once: both get the same answer (the
    // registration is idempotent).
    let s = if ok { YES } else { NO };
    STATE.store(s, Ordering::SeqCst);
    s
}

fn state() -> u8 {
    match STATE.load(Ordering::Relaxed) {
        0 => register(),
        s => s,
    }
}

/// Whether the frequent side's fence may be a compiler fence alone (the
/// registration held): `compiler_fence(SeqCst)` if so, `fence(SeqCst)` if
/// not. Once true it stays true, so a caller reads it once and keeps the
/// answer beside the word it stores before the fence: a load of this
/// module's static between that store and the loads after it cost ~8 ns a
/// post on the lane's fast path (`perf write_bw -s 8` over shared memory,
/// 42-43 against 50-52 Mmsg/s with the answer kept in the lane, alternated
/// by hand; why, with the static in L1, was not found).
pub fn expedited() -> bool {
    state() == YES
}

/// The rare side's fence: after it returns, every store another thread of
/// this process made before its last frequent-side fence is visible to
/// this thread's loads, or that thread's loads after that fence see this
/// thread's stores before this call.
pub fn heavy() {
    if state() == YES {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) and touches no
        // memory of ours; the process registered for this command.
        let r = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        };
        // A registered process's private expedited barrier cannot fail
        // (membarrier(2) lists no error for it); if it ever did, this
        // fence alone would not order the other side's compiler-fenced
        // store, so say so loudly instead of going on unordered.
        assert_eq!(
            r, 0,
            "membarrier(PRIVATE_EXPEDITED) failed after registering"
        );
    } else {
        fence(Ordering::SeqCst);
    }
}
