//! `ibv_resize_cq` and CQ overflow through the C ABI: the depth the
//! application reads in `cq->cqe`, completions kept across a resize, and
//! an overflow reported as IBA's CQ error (`IBV_EVENT_CQ_ERR`, then
//! `IBV_EVENT_QP_FATAL` for the QP) rather than lost silently.

use std::os::raw::c_int;
use std::ptr::null_mut;

use super::*;

/// Post `n` signalled UD sends of 3 bytes from `a` to `b` (nobody needs to
/// receive them: UD completes a send once it is on the wire).
unsafe fn ud_sends(ctx: *mut ibv_context, a: &Side, b: &Side, ah: *mut ibv_ah, n: u64) {
    for i in 0..n {
        let mut sge = ibv_sge {
            addr: a.buf.as_ptr() as u64,
            length: 3,
            lkey: (*a.mr).lkey,
        };
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = i;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = 2;
        wr.wr.ud = ibv_ud_wr {
            ah,
            remote_qpn: (*b.qp).qp_num,
            remote_qkey: 0x1111_1111,
        };
        let mut bad = null_mut();
        // SAFETY: through the operations table, as verbs.h's inline does.
        assert_eq!(
            unsafe { ((*ctx).ops.post_send.unwrap())(a.qp, &mut wr, &mut bad) },
            0
        );
    }
}

unsafe fn ud_pair(ctx: *mut ibv_context) -> (Side, Side, *mut ibv_ah) {
    let mut gid = ibv_gid::default();
    // SAFETY: as a C program would call them.
    unsafe {
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let a = side(ctx, 4);
        let b = side(ctx, 4);
        to_rts(&a, gid, 0, 4);
        to_rts(&b, gid, 0, 4);
        let mut attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        attr.grh.dgid = gid;
        let ah = ibv_create_ah(a.pd, &mut attr);
        assert!(!ah.is_null());
        (a, b, ah)
    }
}

unsafe fn poll(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> c_int {
    // SAFETY: through the operations table; `wc` has room for its length.
    unsafe { ((*(*cq).context).ops.poll_cq.unwrap())(cq, wc.len() as c_int, wc.as_mut_ptr()) }
}

/// The next async event, waiting at most 10 s for it.
unsafe fn next_event(ctx: *mut ibv_context) -> ibv_async_event {
    let mut p = libc::pollfd {
        // SAFETY: a live context.
        fd: unsafe { (*ctx).async_fd },
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    assert_eq!(
        unsafe { libc::poll(&mut p, 1, 10_000) },
        1,
        "no async event"
    );
    let mut e = ibv_async_event {
        element: null_mut(),
        event_type: 99,
    };
    // SAFETY: a live context, a writable event.
    unsafe {
        assert_eq!(ibv_get_async_event(ctx, &mut e), 0);
        ibv_ack_async_event(&mut e);
    }
    e
}

#[test]
fn resize_cq_updates_cqe_and_keeps_completions() {
    // SAFETY: as a C program would call them; buffers outlive their MRs.
    unsafe {
        let ctx = open_first();
        let (a, b, ah) = ud_pair(ctx);
        assert_eq!((*a.cq).cqe, 64);
        assert_eq!(ibv_resize_cq(a.cq, 1), 0);
        assert_eq!((*a.cq).cqe, 1);
        assert_eq!(ibv_resize_cq(a.cq, 4), 0);
        assert_eq!((*a.cq).cqe, 4);
        assert_eq!(ibv_resize_cq(a.cq, 0), libc::EINVAL);
        assert_eq!(ibv_resize_cq(a.cq, -1), libc::EINVAL);
        assert_eq!(ibv_resize_cq(a.cq, 1 << 22), libc::EINVAL);
        assert_eq!((*a.cq).cqe, 4);

        // Three sends complete (resize makes the device progress first, so
        // they are on the wire and queued by the time it counts).
        ud_sends(ctx, &a, &b, ah, 3);
        assert_eq!(ibv_resize_cq(a.cq, 2), libc::EINVAL, "3 are queued");
        assert_eq!((*a.cq).cqe, 4);
        assert_eq!(ibv_resize_cq(a.cq, 3), 0);
        assert_eq!((*a.cq).cqe, 3);
        let mut wc = [ibv_wc::default(); 8];
        assert_eq!(poll(a.cq, &mut wc), 3);
        assert_eq!(
            wc[..3]
                .iter()
                .map(|w| (w.wr_id, w.status))
                .collect::<Vec<_>>(),
            [(0, 0), (1, 0), (2, 0)]
        );
        assert_eq!(poll(a.cq, &mut wc), 0);

        assert_eq!(ibv_destroy_ah(ah), 0);
        teardown(a);
        teardown(b);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn cq_overflow_raises_cq_err_and_qp_fatal() {
    // SAFETY: as a C program would call them; buffers outlive their MRs.
    unsafe {
        let ctx = open_first();
        let (a, b, ah) = ud_pair(ctx);
        assert_eq!(ibv_resize_cq(a.cq, 1), 0);
        ud_sends(ctx, &a, &b, ah, 2);

        let e = next_event(ctx);
        assert_eq!((e.event_type, e.element), (IBV_EVENT_CQ_ERR, a.cq.cast()));
        let e = next_event(ctx);
        assert_eq!((e.event_type, e.element), (IBV_EVENT_QP_FATAL, a.qp.cast()));
        let mut qa = ibv_qp_attr::default();
        let mut qi: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(a.qp, &mut qa, 0, &mut qi), 0);
        assert_eq!(qa.qp_state, 6, "IBV_QPS_ERR");

        // The completion queued before the overflow is still there; then the
        // CQ reports its error instead of looking empty.
        let mut wc = [ibv_wc::default(); 4];
        assert_eq!(poll(a.cq, &mut wc), 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (0, 0));
        assert_eq!(poll(a.cq, &mut wc), -libc::EIO);
        assert_eq!(ibv_resize_cq(a.cq, 8), libc::EIO);
        // b's CQ is another CQ: untouched.
        assert_eq!(poll(b.cq, &mut wc), 0);

        assert_eq!(ibv_destroy_ah(ah), 0);
        teardown(a);
        teardown(b);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor the context owns.
    unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
}

fn readable(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd; zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// `ibv_get_async_event` in another thread, bounded: `Some(result, errno)`
/// if it returned within 10 s, `None` if it was still waiting.
fn get_async_event_bounded(ctx: *mut ibv_context) -> Option<(c_int, c_int)> {
    let ctx = ctx as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut e = ibv_async_event {
            element: null_mut(),
            event_type: 99,
        };
        // SAFETY: a live context (the test closes it only after this
        // returned, or leaks it if it never does), a writable event.
        let r = unsafe { ibv_get_async_event(ctx as *mut ibv_context, &mut e) };
        let _ = tx.send((r, errno()));
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
}

/// The async descriptor starts out blocking, as rdma-core's does, and once
/// the application makes it non-blocking (UCX does), `ibv_get_async_event`
/// with nothing to report returns EAGAIN instead of waiting — also when
/// what woke the application was an event for a QP destroyed since, which
/// is dropped. UCX's async thread, which its teardown joins, hung in that
/// wait.
#[test]
fn non_blocking_async_fd_gives_eagain() {
    // SAFETY: as a C program would call them; buffers outlive their MRs.
    unsafe {
        let ctx = open_first();
        let fd = (*ctx).async_fd;
        assert!(!nonblocking(fd), "rdma-core's async_fd starts blocking");
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
        assert_eq!(get_async_event_bounded(ctx), Some((-1, libc::EAGAIN)));

        // Two events (CQ error, QP fatal), taken one at a time; the
        // descriptor stays readable until the last is taken.
        let (a, b, ah) = ud_pair(ctx);
        assert_eq!(ibv_resize_cq(a.cq, 1), 0);
        ud_sends(ctx, &a, &b, ah, 2);
        let e = next_event(ctx);
        assert_eq!((e.event_type, e.element), (IBV_EVENT_CQ_ERR, a.cq.cast()));
        assert!(readable(fd), "one event is still queued");
        let e = next_event(ctx);
        assert_eq!((e.event_type, e.element), (IBV_EVENT_QP_FATAL, a.qp.cast()));
        assert!(!readable(fd), "nothing is queued");
        assert_eq!(get_async_event_bounded(ctx), Some((-1, libc::EAGAIN)));

        // Events for objects destroyed before the application reads them:
        // readable, but nothing to report.
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let c = side(ctx, 4);
        to_rts(&c, gid, 0, 4);
        assert_eq!(ibv_resize_cq(c.cq, 1), 0);
        ud_sends(ctx, &c, &b, ah, 2);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut p, 1, 10_000), 1, "no async event");
        assert_eq!(ibv_destroy_qp(c.qp), 0);
        assert_eq!(ibv_dereg_mr(c.mr), 0);
        assert_eq!(ibv_destroy_cq(c.cq), 0);
        assert_eq!(ibv_dealloc_pd(c.pd), 0);
        drop(c.buf);
        assert_eq!(
            get_async_event_bounded(ctx),
            Some((-1, libc::EAGAIN)),
            "(None: it waited)"
        );
        assert!(!readable(fd));

        assert_eq!(ibv_destroy_ah(ah), 0);
        teardown(a);
        teardown(b);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
