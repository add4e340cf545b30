//! Receive sockets a child made by fork(2) lets go of.
//!
//! A forked child inherits every descriptor, the port's receive socket
//! included, but none of the threads that serve it: a softrdma context is
//! not usable after fork (as verbs resources without `ibv_fork_init`).
//! Its copy of the socket still keeps the socket alive, though — listed
//! under the shared address, receiving its share of the steered datagrams
//! — after the parent closed its own: the parent's next open then finds a
//! member of the group its state file does not describe and refuses to
//! share (seen with rdma-core's pyverbs suite, whose test processes are
//! forked from one holding a context, and one of which is killed while the
//! next test opens the device). So the child, before it returns from
//! fork, points each registered descriptor at `/dev/null` (`dup2`, which
//! is async-signal-safe, as a child handler of a multithreaded parent must
//! be): the socket's reference is dropped, and the number stays a valid
//! descriptor for whatever the child's copy of the port later closes.
//!
//! The child lets go when fork returns in it, not when it returns in the
//! parent: a parent that closes and reopens the port before its child has
//! run at all can still meet the child's copy (the test waits for the
//! child to say it runs).
//!
//! The table is a fixed array of atomics (no lock a thread may have held at
//! fork time). A port registers its socket once bound and unregisters it
//! before closing it, so a number in the table is always that socket.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// Sockets guarded at once; beyond this, a socket is not (a child keeps
/// it, as before).
const SLOTS: usize = 1024;

static FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];
static HANDLER: Once = Once::new();

extern "C" fn in_child() {
    // SAFETY: open, dup2 and close are async-signal-safe; the path is a
    // NUL-terminated constant; every descriptor in the table is a socket
    // this process had open at fork (see the module documentation).
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null < 0 {
            return;
        }
        for s in &FDS {
            let fd = s.load(Ordering::Relaxed);
            if fd >= 0 {
                libc::dup3(null, fd, libc::O_CLOEXEC);
            }
        }
        libc::close(null);
    }
}

/// Guard `fd`; the slot to pass to [`unregister`] (None: the table is
/// full).
pub(crate) fn register(fd: RawFd) -> Option<usize> {
    HANDLER.call_once(|| {
        // SAFETY: registers a handler with no parent/prepare hooks; the
        // handler itself is async-signal-safe.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    FDS.iter().position(|s| {
        s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Stop guarding the slot's socket (before closing it).
pub(crate) fn unregister(slot: Option<usize>) {
    if let Some(i) = slot {
        FDS[i].store(-1, Ordering::Release);
    }
}
