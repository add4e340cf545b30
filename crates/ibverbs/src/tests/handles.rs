//! Stale, foreign and mistyped pointers: every entry point refuses them
//! with EINVAL without reading freed memory, including the operations a C
//! program reaches through verbs.h's static inline functions (which read
//! `obj->context->ops` from the stale object themselves).

use std::ptr::null_mut;

use super::*;
use crate::handles::QUARANTINE;

#[test]
fn destroyed_handles_are_refused_everywhere() {
    // SAFETY: the point of the test: after each destroy the pointer is
    // stale, and every call with it (as a C program with a use-after-free
    // bug makes them, inline dispatch included) must be refused.
    unsafe {
        let ctx = open_first();
        let s = side(ctx, 2);
        let (pd, cq, qp, mr) = (s.pd, s.cq, s.qp, s.mr);
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        teardown(s);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);

        // Exported functions.
        assert_eq!(ibv_destroy_qp(qp), libc::EINVAL);
        assert_eq!(ibv_destroy_cq(cq), libc::EINVAL);
        assert_eq!(ibv_dereg_mr(mr), libc::EINVAL);
        assert_eq!(ibv_dealloc_pd(pd), libc::EINVAL);
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EINVAL);
        let mut attr = ibv_qp_attr::default();
        assert_eq!(ibv_modify_qp(qp, &mut attr, 1), libc::EINVAL);
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(qp, &mut attr, 0, &mut init), libc::EINVAL);
        assert_eq!(ibv_resize_cq(cq, 8), libc::EINVAL);
        ibv_ack_cq_events(cq, 1);
        assert!(ibv_reg_mr(pd, null_mut(), 0, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);

        // The inline path: the application reads the stale object's
        // `context` and that context's ops itself. The slots are still
        // mapped (type-stable) and lead back here, where the registry
        // refuses the pointer.
        let mut wc = ibv_wc::default();
        assert_eq!(
            ((*(*cq).context).ops.poll_cq.unwrap())(cq, 1, &mut wc),
            -libc::EINVAL
        );
        assert_eq!(
            ((*(*cq).context).ops.req_notify_cq.unwrap())(cq, 0),
            libc::EINVAL
        );
        let mut swr = ibv_send_wr::zeroed();
        let mut bad = null_mut();
        assert_eq!(
            ((*(*qp).context).ops.post_send.unwrap())(qp, &mut swr, &mut bad),
            libc::EINVAL
        );
        assert_eq!(bad, &mut swr as *mut _);
        let mut rwr: ibv_recv_wr = std::mem::zeroed();
        let mut bad_r = null_mut();
        assert_eq!(
            ((*(*qp).context).ops.post_recv.unwrap())(qp, &mut rwr, &mut bad_r),
            libc::EINVAL
        );

        // A closed context: its exported calls and its inline operations.
        assert_eq!(ibv_close_device(ctx), 0);
        assert_eq!(ibv_close_device(ctx), libc::EINVAL);
        assert!(ibv_alloc_pd(ctx).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut dev_attr: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(ctx, &mut dev_attr), libc::EINVAL);
        assert_eq!(((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc), -libc::EINVAL);
    }
}

#[test]
fn pointers_of_the_wrong_type_are_refused() {
    // SAFETY: each call gets a live object of another type.
    unsafe {
        let ctx = open_first();
        let s = side(ctx, 2);
        assert_eq!(ibv_destroy_qp(s.cq.cast()), libc::EINVAL);
        assert_eq!(ibv_destroy_cq(s.qp.cast()), libc::EINVAL);
        assert_eq!(ibv_dealloc_pd(s.mr.cast()), libc::EINVAL);
        assert_eq!(ibv_dereg_mr(s.pd.cast()), libc::EINVAL);
        assert!(ibv_alloc_pd(s.pd.cast()).is_null());
        let mut wc = ibv_wc::default();
        assert_eq!(datapath::poll_cq(s.qp.cast(), 1, &mut wc), -libc::EINVAL);
        // All of them are still alive and intact.
        teardown(s);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn racing_destroys_free_an_object_once() {
    // SAFETY: both threads destroy the same live CQ; exactly one may.
    unsafe {
        let ctx = open_first();
        for _ in 0..50 {
            let cq = ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0) as usize;
            assert_ne!(cq, 0);
            let go = std::sync::Arc::new(std::sync::Barrier::new(2));
            let t: Vec<_> = (0..2)
                .map(|_| {
                    let go = go.clone();
                    std::thread::spawn(move || {
                        go.wait();
                        ibv_destroy_cq(cq as *mut ibv_cq)
                    })
                })
                .collect();
            let mut r: Vec<i32> = t.into_iter().map(|t| t.join().unwrap()).collect();
            r.sort();
            assert_eq!(r, [0, libc::EINVAL]);
        }
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn a_freed_slot_is_not_reused_at_once() {
    // SAFETY: as a C program would call them.
    unsafe {
        let ctx = open_first();
        let ah_attr = |gid| {
            let mut a = ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            a.grh.dgid = gid;
            a
        };
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let pd = ibv_alloc_pd(ctx);
        let stale = ibv_create_ah(pd, &mut ah_attr(gid));
        assert_eq!(ibv_destroy_ah(stale), 0);
        // Fewer than QUARANTINE further objects never take its slot (the other
        // tests make only a few).
        let mut made: Vec<*mut ibv_ah> = Vec::new();
        for _ in 0..QUARANTINE / 2 {
            let ah = ibv_create_ah(pd, &mut ah_attr(gid));
            assert!(!ah.is_null());
            assert_ne!(ah, stale);
            made.push(ah);
        }
        assert_eq!(ibv_destroy_ah(stale), libc::EINVAL);
        for ah in made {
            assert_eq!(ibv_destroy_ah(ah), 0);
        }
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// The data path lends a handle's object to a call through the thread's
/// cache, without a reference count (`handles::lend`): a warm cache entry
/// must stop answering once the object is destroyed, in the thread that
/// destroyed it and in every other, and a destroy must not return while
/// another thread is still in a call with the object.
#[test]
fn a_handle_destroyed_while_other_threads_poll_it_is_refused_after() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    // SAFETY: as a C program would call them; the pollers keep calling
    // with the CQ pointer across its destroy (the race this covers).
    unsafe {
        let ctx = open_first();
        let cq = ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        let poll = (*ctx).ops.poll_cq.unwrap();
        // This thread's cache holds the CQ now.
        let mut wc = ibv_wc::default();
        assert_eq!(poll(cq, 1, &mut wc), 0);

        let destroyed = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let addr = cq as usize;
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let (destroyed, polls) = (destroyed.clone(), polls.clone());
                std::thread::spawn(move || {
                    let cq = addr as *mut ibv_cq;
                    let mut wc = ibv_wc::default();
                    // Until the destroy shows: every call succeeds (an
                    // empty CQ) or, once the destroy began, is refused.
                    let mut refused = 0u64;
                    loop {
                        let after = destroyed.load(Ordering::Acquire);
                        // (Inside the test's `unsafe`: the pointer stays a
                        // mapped slot, slots being type-stable; what it
                        // names is the test.)
                        let r = poll(cq, 1, &mut wc);
                        if after {
                            // The destroy returned before this call began.
                            assert_eq!(r, -libc::EINVAL, "a call after the destroy");
                            return refused;
                        }
                        match r {
                            0 => {
                                polls.fetch_add(1, Ordering::Relaxed);
                            }
                            r if r == -libc::EINVAL => refused += 1,
                            r => panic!("poll_cq returned {r}"),
                        }
                    }
                })
            })
            .collect();
        // Both pollers are in their loops with warm caches.
        while polls.load(Ordering::Relaxed) < 2000 {
            std::thread::yield_now();
        }
        assert_eq!(ibv_destroy_cq(cq), 0);
        destroyed.store(true, Ordering::Release);
        // And in this thread, whose cache named the CQ too.
        assert_eq!(poll(cq, 1, &mut wc), -libc::EINVAL);
        for p in pollers {
            p.join().expect("a poller failed");
        }
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// Races `destroy(obj)` against `create(obj, aux)` (made in another thread)
/// `rounds` times, each on a fresh `make()`, the destroy started after a
/// varying number of spins so that it falls at every point of the create.
/// Either the destroy sees the new user and fails with EBUSY, or the create
/// fails with EINVAL (its object destroyed) — never both succeed, which
/// would leave a live object depending on a destroyed one.
unsafe fn race_destroy_and_create(
    what: &str,
    rounds: usize,
    make: &dyn Fn() -> usize,
    destroy: &dyn Fn(usize) -> c_int,
    create: fn(usize, usize) -> (usize, c_int),
    aux: usize,
    undo: &dyn Fn(usize) -> c_int,
) {
    use std::sync::{Arc, Barrier};
    let (mut busy, mut refused) = (0, 0);
    for round in 0..rounds {
        let obj = make();
        assert_ne!(obj, 0, "{what}: making the object");
        let go = Arc::new(Barrier::new(2));
        let creator = {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                create(obj, aux)
            })
        };
        go.wait();
        for _ in 0..(round % 64) * 16 {
            std::hint::spin_loop();
        }
        let d = destroy(obj);
        let (made, e) = creator.join().expect("the creator");
        match (d, made) {
            (0, 0) => {
                assert_eq!(e, libc::EINVAL, "{what}: the refused create's errno");
                refused += 1;
            }
            (libc::EBUSY, m) if m != 0 => {
                assert_eq!(undo(m), 0, "{what}: destroying what was made");
                assert_eq!(destroy(obj), 0, "{what}: the destroy once unused");
                busy += 1;
            }
            (0, _) => panic!(
                "{what}, round {round}: the destroy and the create both succeeded \
                 (a live object on a destroyed one)"
            ),
            (d, m) => panic!("{what}, round {round}: destroy {d}, create {m:#x} (errno {e})"),
        }
    }
    // Not an assertion on the interleaving (any mix is correct), but
    // worth seeing when the test is run with --nocapture.
    println!("{what}: {busy} EBUSY, {refused} refused creates");
}

#[test]
fn a_destroy_racing_a_create_on_the_object_never_both_succeed() {
    // SAFETY: as a C program would call them, from two threads; every
    // pointer is live or destroyed exactly once by the helper.
    unsafe {
        let ctx = open_first();
        let c = ctx as usize;
        let pd = ibv_alloc_pd(ctx) as usize;
        assert_ne!(pd, 0);
        fn qp_on(cq: usize, pd: usize) -> (usize, c_int) {
            let mut init = qp_init_attr(cq as *mut ibv_cq, cq as *mut ibv_cq, 2, 4, 1);
            // SAFETY: a readable and writable init; the CQ may be
            // destroyed meanwhile (the race).
            let qp = unsafe { ibv_create_qp(pd as *mut ibv_pd, &mut init) };
            (qp as usize, errno())
        }
        // The CQ a QP is being created on (the race found first).
        race_destroy_and_create(
            "CQ vs QP",
            300,
            &|| ibv_create_cq(c as *mut _, 4, null_mut(), null_mut(), 0) as usize,
            &|cq| ibv_destroy_cq(cq as *mut _),
            qp_on,
            pd,
            &|qp| ibv_destroy_qp(qp as *mut _),
        );
        // The PD an SRQ is being created on.
        fn srq_on(pd: usize, _: usize) -> (usize, c_int) {
            let mut init = ibv_srq_init_attr {
                srq_context: null_mut(),
                attr: ibv_srq_attr {
                    max_wr: 4,
                    max_sge: 1,
                    srq_limit: 0,
                },
            };
            // SAFETY: as above.
            let srq = unsafe { ibv_create_srq(pd as *mut ibv_pd, &mut init) };
            (srq as usize, errno())
        }
        race_destroy_and_create(
            "PD vs SRQ",
            300,
            &|| ibv_alloc_pd(c as *mut _) as usize,
            &|pd| ibv_dealloc_pd(pd as *mut _),
            srq_on,
            0,
            &|srq| ibv_destroy_srq(srq as *mut _),
        );
        // The completion channel a CQ is being created with.
        fn cq_with(ch: usize, ctx: usize) -> (usize, c_int) {
            // SAFETY: as above.
            let cq = unsafe {
                ibv_create_cq(
                    ctx as *mut ibv_context,
                    4,
                    null_mut(),
                    ch as *mut ibv_comp_channel,
                    0,
                )
            };
            (cq as usize, errno())
        }
        race_destroy_and_create(
            "channel vs CQ",
            300,
            &|| ibv_create_comp_channel(c as *mut _) as usize,
            &|ch| ibv_destroy_comp_channel(ch as *mut _),
            cq_with,
            c,
            &|cq| ibv_destroy_cq(cq as *mut _),
        );
        assert_eq!(ibv_dealloc_pd(pd as *mut _), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// A completion channel's `refcnt` counts the CQs on it, as rdma-core's
/// does, however many threads create and destroy CQs on it at once: each
/// change is one atomic step (a plain `+= 1` from two threads loses
/// counts).
#[test]
fn a_channels_cq_count_survives_cqs_made_and_destroyed_from_many_threads() {
    // SAFETY: as a C program would call them; the channel and context
    // outlive the threads, which are joined before they are destroyed.
    unsafe {
        let ctx = open_first();
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let (c, chp) = (ctx as usize, ch as usize);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..5000 {
                        let cq = ibv_create_cq(c as *mut _, 4, null_mut(), chp as *mut _, 0);
                        assert!(!cq.is_null(), "create_cq: errno {}", errno());
                        assert_eq!(ibv_destroy_cq(cq), 0);
                    }
                })
            })
            .collect();
        let kept = ibv_create_cq(ctx, 4, null_mut(), ch, 0);
        for t in threads {
            t.join().expect("a CQ thread");
        }
        assert_eq!((*ch).refcnt, 1, "the one CQ left on the channel");
        assert_eq!(ibv_destroy_cq(kept), 0);
        assert_eq!((*ch).refcnt, 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
