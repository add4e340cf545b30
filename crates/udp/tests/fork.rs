//! A child made by fork(2) does not keep the port's receive socket: the
//! parent, having closed its port while the child lives, can open the
//! shared address again. (The child's inherited copy used to keep the
//! socket listed under the address while the state file no longer
//! described it, and the reopen was refused as "shared by sockets ... that
//! the state does not describe" — rdma-core's pyverbs suite, whose test
//! processes are forked from one that held a context, hit it.)

mod common;

use common::*;
use softrdma_udp::{Port, PortConfig};

#[test]
fn a_forked_child_does_not_keep_the_shared_socket() {
    let cfg = || PortConfig {
        shared: true,
        ..PortConfig::new(v4(71))
    };
    let p = Port::open(cfg()).unwrap();
    assert!(
        steered(&p),
        "port sharing is unavailable here ({:?}): this test needs it",
        p.steering()
    );
    // `go`: parent to child (end now); `up`: child to parent (running:
    // fork has returned in the child, so its fork handler has run).
    let (mut go, mut up) = ([0; 2], [0; 2]);
    // SAFETY: pipe writes two descriptors into each array.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    assert_eq!(unsafe { libc::pipe(up.as_mut_ptr()) }, 0);
    // SAFETY: the child only calls write(2), read(2) and _exit(2), which
    // are async-signal-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut b = [0u8; 1];
        // SAFETY: as above, on our pipes and a local byte.
        unsafe {
            libc::write(up[1], b.as_ptr().cast(), 1);
            libc::read(go[0], b.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    let mut b = [0u8; 1];
    // SAFETY: reads one byte from our pipe into a local.
    assert_eq!(unsafe { libc::read(up[0], b.as_mut_ptr().cast(), 1) }, 1);
    drop(p);
    // The child is alive (blocked on the pipe) while the port reopens.
    let again = Port::open(cfg());
    // SAFETY: one byte from a local to our pipe; waitpid on our child.
    unsafe {
        libc::write(go[1], [1u8].as_ptr().cast(), 1);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        for fd in go.into_iter().chain(up) {
            libc::close(fd);
        }
    }
    let again = again.expect("reopening while a forked child lives");
    assert!(steered(&again));
}
