//! Implicit on-demand regions between two processes, on real process
//! memory: the target registers its whole address space
//! ([`Pd::reg_mr_implicit`]) and maps three pages of its own choosing — one
//! readable and writable, one `PROT_NONE`, one read-only. The requester's
//! WRITE, READ and atomics on the first move exact bytes; on the others
//! each ends in a remote access error on its own QP, and the target process
//! lives on, its good QP still serving. The requester's own implicit region
//! gives a local protection error for a SEND from memory it never mapped.

mod support;

use softrdma_verbs::*;
use support::*;

const PAGE: usize = 4096;
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// `len` bytes of a fresh anonymous read-write mapping, ours alone.
fn anon_map(len: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p.cast()
}

/// Three fresh pages: read-write (holding `page0()`), no access, read-only.
fn three_pages() -> u64 {
    let b = anon_map(3 * PAGE);
    // SAFETY: `b` is our own 3-page mapping, read-write until the mprotects.
    unsafe {
        std::ptr::copy_nonoverlapping(page0().as_ptr(), b, PAGE);
        std::ptr::write_bytes(b.add(2 * PAGE), 0xee, PAGE);
        assert_eq!(libc::mprotect(b.add(PAGE).cast(), PAGE, libc::PROT_NONE), 0);
        assert_eq!(
            libc::mprotect(b.add(2 * PAGE).cast(), PAGE, libc::PROT_READ),
            0
        );
    }
    b as u64
}

fn page0() -> Vec<u8> {
    (0..PAGE).map(|i| (i * 7 % 251) as u8).collect()
}

/// On the wire, and through the shared-memory rings (an implicit region
/// is never moved into shared memory: its peers' operations arrive as
/// packets there too).
#[test]
fn implicit_region_moves_mapped_bytes_and_refuses_the_rest_udp() {
    implicit_region(
        "implicit_region_moves_mapped_bytes_and_refuses_the_rest_udp",
        Transport::Udp,
    );
}

#[test]
fn implicit_region_moves_mapped_bytes_and_refuses_the_rest_shm() {
    implicit_region(
        "implicit_region_moves_mapped_bytes_and_refuses_the_rest_shm",
        Transport::Auto,
    );
}

fn implicit_region(test: &str, transport: Transport) {
    two_processes(
        test,
        |mut oob| {
            let ctx = open_with(V4, Some(transport));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..4)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            // SAFETY: this process holds no Rust reference into memory the
            // peer writes (only the pages mapped here, reached by pointer
            // after the peer is done), and unmaps nothing while it works.
            let mr = unsafe { pd.reg_mr_implicit(ALL) }.unwrap();
            assert_eq!((mr.addr(), mr.iova(), mr.len()), (0, 0, usize::MAX));
            let base = three_pages();
            exchange_and_connect(
                &ctx,
                &mut oob,
                &[&qps[0], &qps[1], &qps[2], &qps[3]],
                QpType::Rc,
                60,
            );
            oob.send_region(&Region {
                addr: base,
                rkey: mr.rkey(),
                len: 3 * PAGE,
            });
            oob.expect("done");
            // The good QP serves on; the three violated ones are in ERR,
            // each with its access error event — in the order the
            // responder met the violations, which is not the order of the
            // posts (a READ's fault shows when its response is built).
            let mut want: Vec<u32> = qps[1..].iter().map(|q| q.qpn()).collect();
            let mut got: Vec<u32> = (0..3)
                .map(|_| {
                    match wait_async(&ctx, "responder's access error", |e| {
                        matches!(e, AsyncEvent::QpAccessErr(_))
                    }) {
                        AsyncEvent::QpAccessErr(n) => n,
                        e => unreachable!("{e:?}"),
                    }
                })
                .collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "one access error per violated QP");
            for qp in &qps[1..] {
                wait_state(qp, QpState::Err, "responder QP after the violation");
            }
            assert_eq!(qps[0].query().unwrap().0, QpState::Rts);
            // Page 0: the WRITE's bytes, then the fetch-and-add on word 0.
            let mut got = vec![0u8; PAGE];
            mr.read(base as usize, &mut got);
            let mut want = pattern(9, PAGE);
            let w0 = u64::from_ne_bytes(want[..8].try_into().unwrap());
            want[..8].copy_from_slice(&w0.wrapping_add(3).to_ne_bytes());
            assert_bytes(&got, &want, "page 0 after WRITE and fetch-and-add");
            // Page 2 is read-only and stayed as it was; page 1 reads as an
            // error, not a fault.
            mr.read(base as usize + 2 * PAGE, &mut got);
            assert_bytes(&got, &[0xee; PAGE], "read-only page 2");
            let e = mr.try_read(base as usize + PAGE, &mut got).unwrap_err();
            assert!(e.to_string().contains("not mapped readable"), "{e}");
            let e = mr.try_write(base as usize + 2 * PAGE, &[1]).unwrap_err();
            assert!(e.to_string().contains("not mapped writable"), "{e}");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(transport));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..4)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            let src = mr_with(&pd, PAGE, 9, AccessFlags::LOCAL_WRITE);
            let dst = pd
                .reg_mr(vec![0; 2 * PAGE], AccessFlags::LOCAL_WRITE)
                .unwrap();
            exchange_and_connect(
                &ctx,
                &mut oob,
                &[&qps[0], &qps[1], &qps[2], &qps[3]],
                QpType::Rc,
                61,
            );
            let t = oob.recv_region();
            let s = SendFlags::SIGNALED;

            // Page 0 (mapped, read-write): READ what is there, WRITE over
            // it, fetch-and-add on its first word.
            let read = SendOp::Read {
                remote_addr: t.at(0),
                rkey: t.rkey,
            };
            qps[0]
                .post_send(&wr(1, read, &[dst.sge(0, PAGE as u32)], s))
                .unwrap();
            let c = wait_cq(&cq, 1, "READ of page 0");
            assert_wc(&c[0], 1, WcStatus::Success, WcOpcode::RdmaRead, PAGE as u32);
            assert_bytes(&read_mr(&dst, 0, PAGE), &page0(), "READ of page 0");
            let write = SendOp::Write {
                remote_addr: t.at(0),
                rkey: t.rkey,
            };
            qps[0]
                .post_send(&wr(2, write, &[src.sge(0, PAGE as u32)], s))
                .unwrap();
            let add = SendOp::FetchAdd {
                remote_addr: t.at(0),
                rkey: t.rkey,
                add: 3,
            };
            qps[0]
                .post_send(&wr(3, add, &[dst.sge(PAGE, 8)], s))
                .unwrap();
            let c = wait_cq(&cq, 2, "WRITE and fetch-and-add on page 0");
            assert_wc(
                &c[0],
                2,
                WcStatus::Success,
                WcOpcode::RdmaWrite,
                PAGE as u32,
            );
            assert_wc(&c[1], 3, WcStatus::Success, WcOpcode::FetchAdd, 8);
            let old = pattern(9, 8);
            assert_bytes(&read_mr(&dst, PAGE, 8), &old, "fetch-and-add's old value");

            // Page 1 (PROT_NONE): WRITE and READ; page 2 (read-only): an
            // atomic. Each a remote access error on its own QP.
            let write = SendOp::Write {
                remote_addr: t.at(PAGE),
                rkey: t.rkey,
            };
            qps[1]
                .post_send(&wr(4, write, &[src.sge(0, 64)], s))
                .unwrap();
            let read = SendOp::Read {
                remote_addr: t.at(PAGE),
                rkey: t.rkey,
            };
            qps[2]
                .post_send(&wr(5, read, &[dst.sge(0, 64)], s))
                .unwrap();
            let cas = SendOp::CompareSwap {
                remote_addr: t.at(2 * PAGE),
                rkey: t.rkey,
                compare: 0,
                swap: 1,
            };
            qps[3]
                .post_send(&wr(6, cas, &[dst.sge(PAGE, 8)], s))
                .unwrap();
            let mut c = wait_cq(&cq, 3, "the three violations");
            c.sort_by_key(|c| c.wr_id);
            for (c, id) in c.iter().zip(4..) {
                assert_eq!((c.wr_id, c.status), (id, WcStatus::RemAccessErr), "{c:?}");
            }

            // Our own implicit region: a SEND from a page we mapped and
            // took away again is a local protection error, nothing sent.
            // SAFETY: as in the target; nothing here is written by peers.
            let own = unsafe { pd.reg_mr_implicit(AccessFlags::LOCAL_WRITE) }.unwrap();
            // A fresh page, unmapped at once: its address is (for this
            // test's purpose) memory this process does not have.
            let gone = {
                let p = anon_map(PAGE);
                // SAFETY: our own fresh page, unmapped at once.
                assert_eq!(unsafe { libc::munmap(p.cast(), PAGE) }, 0);
                p as u64
            };
            let sge = Sge {
                addr: gone,
                length: 64,
                lkey: own.lkey(),
            };
            qps[0].post_send(&wr(7, SendOp::Send, &[sge], s)).unwrap();
            let c = wait_cq(&cq, 1, "SEND from unmapped memory");
            assert_eq!((c[0].wr_id, c[0].status), (7, WcStatus::LocProtErr));
            // Inline from it is refused at the post, naming why.
            let e = qps[1]
                .post_send(&wr(8, SendOp::Send, &[sge], s | SendFlags::INLINE))
                .unwrap_err();
            assert!(e.to_string().contains("not mapped readable"), "{e}");
            oob.signal("done");
            oob.expect("ok");
        },
    );
}
