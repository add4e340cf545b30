//! Errors, the two kinds verbs users meet:
//!
//! * misuse of the API is refused when the call is made, with an error that
//!   names what was wrong (and no work request is queued);
//! * a remote violation (a bad rkey, an access outside the region) reaches
//!   the requester as a REM_ACCESS_ERR completion, moves its QP to ERR and
//!   flushes what was queued behind it — while the peer process keeps
//!   serving its other QPs.

mod support;

use softrdma_verbs::*;
use support::*;

fn misuse(e: Error) -> CoreError {
    match e {
        Error::Verbs(c) => c,
        other => panic!("expected a verbs error, got {other}"),
    }
}

/// Each misuse gets its own named error, and the queue is untouched by it.
#[test]
fn verbs_misuse_is_refused_and_named() {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    let caps = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, caps);
    let mr = mr_with(&pd, 4096, 1, AccessFlags::LOCAL_WRITE);
    let s = SendFlags::SIGNALED;

    // Invalid access flag combination: a peer may not modify memory the
    // owner cannot write.
    for bad in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ,
    ] {
        let Err(e) = pd.reg_mr(vec![0; 64], bad) else {
            panic!("reg_mr({bad}) succeeded");
        };
        let e = misuse(e);
        assert!(
            matches!(e, CoreError::InvalidAccess(_)),
            "reg_mr({bad}): {e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("requires LOCAL_WRITE"), "{text}");
    }

    // Posting before RTS: in INIT, then in RTR.
    let one = [mr.sge(0, 8)];
    let send = wr(1, SendOp::Send, &one, s);
    let e = misuse(qp.post_send(&send).unwrap_err());
    assert_eq!(
        e,
        CoreError::InvalidState {
            what: "post a send work request",
            state: QpState::Init
        }
    );
    assert_eq!(
        e.to_string(),
        "cannot post a send work request in state INIT"
    );

    // A black hole to connect to: a QP of ours that stays in INIT and drops
    // whatever arrives, so nothing posted below can complete.
    let hole = qp_init(&pd, QpType::Rc, &cq, &cq, None, caps);
    let me = addr_of(&ctx, &hole, 0x10);
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::B1024,
        dest_qp_num: me.qpn,
        rq_psn: 0x10,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..Default::default()
    };
    a.av.dgid = me.gid;
    a.av.hop_limit = 64;
    qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    let e = misuse(qp.post_send(&send).unwrap_err());
    assert!(
        matches!(
            e,
            CoreError::InvalidState {
                state: QpState::Rtr,
                ..
            }
        ),
        "{e:?}"
    );
    // RTS with a long local ACK timeout (4.096 µs × 2^20, about 4.3 s):
    // nothing completes while this test runs.
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x20;
    a.timeout = 20;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();

    // An lkey that does not cover the SGE: past the end, and unknown.
    let past = Sge {
        addr: mr.addr() + 4000,
        length: 200,
        lkey: mr.lkey(),
    };
    let e = misuse(qp.post_send(&wr(2, SendOp::Send, &[past], s)).unwrap_err());
    assert_eq!(
        e,
        CoreError::InvalidArgument("SGE is not inside its memory region")
    );
    let unknown = Sge {
        lkey: mr.lkey() ^ 0x00ff_f000,
        ..mr.sge(0, 8)
    };
    let e = misuse(
        qp.post_send(&wr(3, SendOp::Send, &[unknown], s))
            .unwrap_err(),
    );
    assert_eq!(
        e,
        CoreError::InvalidArgument("SGE lkey matches no memory region")
    );
    let e = misuse(
        qp.post_recv(&RecvWr {
            wr_id: 4,
            sgl: &[past],
        })
        .unwrap_err(),
    );
    assert!(
        matches!(e, CoreError::InvalidArgument(m) if m.contains("not covered")),
        "{e:?}"
    );
    // A READ's result needs locally writable memory.
    let ro = mr_with(&pd, 64, 2, AccessFlags::EMPTY);
    let read = SendOp::Read {
        remote_addr: 0x1000,
        rkey: 1,
    };
    let e = misuse(qp.post_send(&wr(5, read, &[ro.sge(0, 8)], s)).unwrap_err());
    assert!(
        matches!(e, CoreError::InvalidArgument(m) if m.contains("LOCAL_WRITE")),
        "{e:?}"
    );

    // Too many SGEs: send (max 2) and receive (max 1).
    let three = [mr.sge(0, 8), mr.sge(8, 8), mr.sge(16, 8)];
    let e = misuse(qp.post_send(&wr(6, SendOp::Send, &three, s)).unwrap_err());
    assert_eq!(e, CoreError::TooManySge { got: 3, max: 2 });
    assert_eq!(
        e.to_string(),
        "3 scatter/gather entries, the queue allows 2"
    );
    let e = misuse(
        qp.post_recv(&RecvWr {
            wr_id: 7,
            sgl: &three[..2],
        })
        .unwrap_err(),
    );
    assert_eq!(e, CoreError::TooManySge { got: 2, max: 1 });

    // Atomics: one 8-byte SGE, an aligned target.
    let faa = |addr| SendOp::FetchAdd {
        remote_addr: addr,
        rkey: 1,
        add: 1,
    };
    let e = misuse(
        qp.post_send(&wr(8, faa(0x1000), &[mr.sge(0, 4)], s))
            .unwrap_err(),
    );
    assert!(
        matches!(e, CoreError::InvalidArgument(m) if m.contains("8-byte SGE")),
        "{e:?}"
    );
    let e = misuse(
        qp.post_send(&wr(9, faa(0x1004), &[mr.sge(0, 8)], s))
            .unwrap_err(),
    );
    assert!(
        matches!(e, CoreError::InvalidArgument(m) if m.contains("aligned")),
        "{e:?}"
    );

    // Too many work requests: the fifth send and the fifth receive.
    for k in 0..4 {
        qp.post_send(&wr(10 + k, SendOp::Send, &[mr.sge(0, 8)], s))
            .unwrap();
        post_recv(&qp, 20 + k, mr.sge(64 * k as usize, 64));
    }
    let e = misuse(qp.post_send(&send).unwrap_err());
    assert_eq!(
        e,
        CoreError::QueueFull {
            queue: "send queue",
            depth: 4
        }
    );
    assert_eq!(
        e.to_string(),
        "send queue is full (4 outstanding work requests)"
    );
    let e = misuse(
        qp.post_recv(&RecvWr {
            wr_id: 30,
            sgl: &[mr.sge(0, 8)],
        })
        .unwrap_err(),
    );
    assert_eq!(
        e,
        CoreError::QueueFull {
            queue: "receive queue",
            depth: 4
        }
    );

    // None of the refused requests was queued: moving to ERR flushes
    // exactly the four sends and four receives that were accepted.
    qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        AttrMask::STATE,
    )
    .unwrap();
    let mut w = wait_cq(&cq, 8, "flushed work requests");
    w.sort_by_key(|c| c.wr_id);
    let ids: Vec<u64> = w.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [10, 11, 12, 13, 20, 21, 22, 23]);
    assert!(w.iter().all(|c| c.status == WcStatus::WrFlushErr), "{w:?}");
    assert_cq_empty(&cq, std::time::Duration::from_millis(50), "after the flush");
}

/// A bad rkey, an access outside the region and the key of a region in
/// another protection domain of the responder, each on its own QP: the
/// requester gets REM_ACCESS_ERR for the violating WRITE, its QP goes to
/// ERR and the work queued behind it is flushed in order (and so is work
/// posted afterwards); the responder's QP goes to ERR with an access-error
/// event. Meanwhile a fourth QP between the same processes carries on.
#[test]
fn remote_violation_fails_one_qp_only() {
    const TGT: u64 = 1100;
    const SRC: u64 = 1101;
    const OTHER: u64 = 1102;
    two_processes(
        "remote_violation_fails_one_qp_only",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..4)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            let tgt = mr_with(&pd, 8192, TGT, ALL_REMOTE);
            // Granting everything, but to the QPs of another PD; in pages
            // of its own, so that over shared memory the peer maps it and
            // the check is the peer's, at post.
            let pd2 = ctx.alloc_pd();
            let other = pd2.alloc_mr(8192, ALL_REMOTE).unwrap();
            other.write(0, &pattern(OTHER, 8192));
            let rbuf = pd
                .reg_mr(vec![0; 4 * 1024], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for (i, qp) in qps.iter().enumerate() {
                post_recv(qp, i as u64, rbuf.sge(i * 1024, 1024));
            }
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 50);
            oob.send_region(&Region::of(&tgt));
            oob.send_region(&Region::of(&other));
            oob.expect("violated");
            for qp in &qps[..3] {
                let n = qp.qpn();
                wait_async(&ctx, "responder's access error", |e| {
                    *e == AsyncEvent::QpAccessErr(n)
                });
                wait_state(qp, QpState::Err, "responder QP after the violation");
            }
            // The violating QPs' receives were flushed; the good QP got its
            // SEND.
            let mut w = wait_cq(&cq, 4, "flushed receives and the good SEND");
            w.sort_by_key(|c| c.wr_id);
            for (i, c) in w[..3].iter().enumerate() {
                assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::WrFlushErr));
            }
            assert_wc(&w[3], 3, WcStatus::Success, WcOpcode::Recv, 300);
            let src = pattern(SRC, 8192);
            assert_bytes(
                &read_mr(&rbuf, 3072, 300),
                &src[..300],
                "SEND on the good QP",
            );
            let mut want = pattern(TGT, 8192);
            want[4096..6096].copy_from_slice(&src[1000..3000]);
            assert_bytes(
                &read_mr(&tgt, 0, 8192),
                &want,
                "target: only the good WRITE landed",
            );
            assert_bytes(
                &read_mr(&other, 0, 8192),
                &pattern(OTHER, 8192),
                "the other PD's region: untouched",
            );
            assert_eq!(qps[3].query().unwrap().0, QpState::Rts);
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..4)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            let src = mr_with(&pd, 8192, SRC, AccessFlags::LOCAL_WRITE);
            let dst = pd.reg_mr(vec![0; 8192], AccessFlags::LOCAL_WRITE).unwrap();
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 51);
            let tgt = oob.recv_region();
            let other = oob.recv_region();
            let s = SendFlags::SIGNALED;
            let bad = [
                // A key the target never issued.
                SendOp::Write {
                    remote_addr: tgt.at(0),
                    rkey: tgt.rkey ^ 0x0055_5000,
                },
                // A valid key, a range that runs past the region.
                SendOp::Write {
                    remote_addr: tgt.at(8000),
                    rkey: tgt.rkey,
                },
                // A live region's key and range, of another PD than the
                // responder QP's.
                SendOp::Write {
                    remote_addr: other.at(0),
                    rkey: other.rkey,
                },
            ];
            for (q, op) in bad.iter().enumerate() {
                let qp = &qps[q];
                let base = 100 * q as u64;
                qp.post_send(&wr(base, *op, &[src.sge(0, 1000)], s))
                    .unwrap();
                // Queued behind it: a good WRITE, a SEND, a READ.
                let good = SendOp::Write {
                    remote_addr: tgt.at(0),
                    rkey: tgt.rkey,
                };
                let read = SendOp::Read {
                    remote_addr: tgt.at(0),
                    rkey: tgt.rkey,
                };
                qp.post_send(&wr(base + 1, good, &[src.sge(0, 64)], s))
                    .unwrap();
                qp.post_send(&wr(base + 2, SendOp::Send, &[src.sge(0, 64)], s))
                    .unwrap();
                qp.post_send(&wr(base + 3, read, &[dst.sge(0, 64)], s))
                    .unwrap();
                let w = wait_cq(&cq, 4, "the violation and what was queued behind it");
                assert_eq!(
                    (w[0].wr_id, w[0].status),
                    (base, WcStatus::RemAccessErr),
                    "{w:?}"
                );
                assert_eq!(w[0].status.as_str(), "remote access error");
                for (k, c) in w[1..].iter().enumerate() {
                    assert_eq!(
                        (c.wr_id, c.status),
                        (base + 1 + k as u64, WcStatus::WrFlushErr)
                    );
                    assert_eq!(c.qp_num, qp.qpn());
                }
                assert_eq!(qp.query().unwrap().0, QpState::Err);
                // Posting to a QP in ERR is allowed; the request is flushed.
                qp.post_send(&wr(base + 9, SendOp::Send, &[src.sge(0, 8)], s))
                    .unwrap();
                let w = wait_cq(&cq, 1, "a send posted in ERR");
                assert_eq!((w[0].wr_id, w[0].status), (base + 9, WcStatus::WrFlushErr));
            }
            oob.signal("violated");
            // The fourth QP works, in both directions of data.
            let good = &qps[3];
            let write = SendOp::Write {
                remote_addr: tgt.at(4096),
                rkey: tgt.rkey,
            };
            let read = SendOp::Read {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            good.post_send(&wr(200, write, &[src.sge(1000, 2000)], s))
                .unwrap();
            good.post_send(&wr(201, read, &[dst.sge(0, 4096)], s))
                .unwrap();
            good.post_send(&wr(202, SendOp::Send, &[src.sge(0, 300)], s))
                .unwrap();
            let w = wait_cq(&cq, 3, "the good QP");
            assert_wc(&w[0], 200, WcStatus::Success, WcOpcode::RdmaWrite, 2000);
            assert_wc(&w[1], 201, WcStatus::Success, WcOpcode::RdmaRead, 4096);
            assert_wc(&w[2], 202, WcStatus::Success, WcOpcode::Send, 300);
            assert_bytes(
                &read_mr(&dst, 0, 4096),
                &pattern(TGT, 4096),
                "READ on the good QP",
            );
            oob.expect("ok");
        },
    );
}

/// A UD destination the IO layer cannot reach (an IPv6 GID from an IPv4
/// device) loses that one datagram, as UD may; it must not stop the device.
/// The first engine stopped on the send error, and every QP of the context
/// then went unserved: here the same context must still serve an RDMA READ
/// from the peer with no call from this process.
#[test]
fn one_bad_ud_destination_does_not_stop_the_device() {
    const TGT: u64 = 1200;
    two_processes(
        "one_bad_ud_destination_does_not_stop_the_device",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let ud = qp_init(&pd, QpType::Ud, &cq, &cq, None, cap(16, 16));
            connect(&ud, QpType::Ud, psn(1), &addr_of(&ctx, &ud, 0));
            let rc = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let tgt = mr_with(&pd, 8192, TGT, ALL_REMOTE);
            let src = mr_with(&pd, 64, TGT + 1, AccessFlags::LOCAL_WRITE);
            let v6: std::net::IpAddr = "2001:db8::1".parse().unwrap();
            for i in 0..4 {
                ud.post_send(&SendWr {
                    wr_id: i,
                    op: SendOp::Send,
                    sgl: &[src.sge(0, 64)],
                    flags: SendFlags::SIGNALED,
                    ud: Some(UdDest {
                        gid: ip_to_gid(v6),
                        remote_qpn: 0x123,
                        remote_qkey: 0x1111,
                    }),
                })
                .unwrap();
            }
            // UD completes a send once it has left (or been lost), as an
            // RNIC does.
            let w = wait_cq(&cq, 4, "UD sends to an unreachable destination");
            assert!(w.iter().all(|c| c.status == WcStatus::Success), "{w:?}");
            exchange_and_connect(&ctx, &mut oob, &[&rc], QpType::Rc, 60);
            oob.send_region(&Region::of(&tgt));
            // From here on this process makes no call: the engine thread
            // alone serves the peer's READ.
            oob.expect("read");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let rc = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let dst = pd.reg_mr(vec![0; 8192], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&rc], QpType::Rc, 60);
            let tgt = oob.recv_region();
            rc.post_send(&wr(
                1,
                SendOp::Read {
                    remote_addr: tgt.at(0),
                    rkey: tgt.rkey,
                },
                &[dst.sge(0, 8192)],
                SendFlags::SIGNALED,
            ))
            .unwrap();
            let w = wait_cq(&cq, 1, "READ from the device that met a bad destination");
            assert_wc(&w[0], 1, WcStatus::Success, WcOpcode::RdmaRead, 8192);
            assert_bytes(&read_mr(&dst, 0, 8192), &pattern(TGT, 8192), "READ data");
            oob.signal("read");
        },
    );
}

/// Ranges outside a region are refused with an error by the `try_` forms
/// of `Mr::sge`, `read` and `write` — also where `offset + len` overflows —
/// and nothing is read or written.
#[test]
fn region_ranges_outside_the_region_are_errors() {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let mr = mr_with(&pd, 4096, 3, AccessFlags::LOCAL_WRITE);
    let mut before = vec![0u8; 4096];
    mr.read(0, &mut before);
    for (off, len) in [
        (4096usize, 1u32),
        (4000, 97),
        (usize::MAX, 2),
        (usize::MAX - 1, 4),
    ] {
        let e = misuse(mr.try_sge(off, len).unwrap_err());
        assert!(
            e.to_string().contains("outside the memory region"),
            "try_sge({off}, {len}): {e}"
        );
        let mut buf = vec![0u8; len as usize];
        assert!(
            mr.try_read(off, &mut buf).is_err(),
            "try_read({off}, {len})"
        );
        assert!(
            mr.try_write(off, &vec![0xee; len as usize]).is_err(),
            "try_write({off}, {len})"
        );
    }
    // The edges are fine.
    assert_eq!(mr.try_sge(4095, 1).unwrap().length, 1);
    assert_eq!(mr.try_sge(4096, 0).unwrap().length, 0);
    let mut after = vec![0u8; 4096];
    mr.read(0, &mut after);
    assert_eq!(before, after, "a refused write changed the region");
}
