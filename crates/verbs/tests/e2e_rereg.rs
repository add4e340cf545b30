//! Reregistration and memory windows through the safe API, between two RC
//! QPs of one context over UDP on loopback: a region gains remote access
//! and moves to new memory under the rkey the peer already has, a bound
//! window keeps it from changing, and a receive whose SGE is checked at use
//! fails as an RNIC's would.

mod support;

use softrdma_verbs::*;
use support::*;

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

struct Pair {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    a: Qp,
    b: Qp,
}

/// Two RC QPs of one context, each connected to the other.
fn pair() -> Pair {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    let a = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
    let b = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
    let (aa, ba) = (addr_of(&ctx, &a, psn(1)), addr_of(&ctx, &b, psn(2)));
    connect(&a, QpType::Rc, aa.psn, &ba);
    connect(&b, QpType::Rc, ba.psn, &aa);
    Pair { ctx, pd, cq, a, b }
}

/// A signaled WRITE from `src` to `remote` under `rkey`; its status.
fn write(p: &Pair, src: &Mr, len: u32, remote: u64, rkey: u32) -> WcStatus {
    let sge = [src.sge(0, len)];
    let op = SendOp::Write {
        remote_addr: remote,
        rkey,
    };
    p.a.post_send(&wr(1, op, &sge, SendFlags::SIGNALED))
        .unwrap();
    wait_cq(&p.cq, 1, "the WRITE")[0].status
}

#[test]
fn a_region_changes_access_and_memory_under_the_peers_rkey() {
    let p = pair();
    let src = mr_with(&p.pd, 4096, 1, LOCAL);
    let mut tgt = p.pd.reg_mr(vec![0; 4096], LOCAL).unwrap();
    let (lkey, rkey) = (tgt.lkey(), tgt.rkey());
    assert_eq!(
        write(&p, &src, 64, tgt.iova(), rkey),
        WcStatus::RemAccessErr,
        "no REMOTE_WRITE yet"
    );
    // That error ended both QPs; start again with the same region.
    let p = pair_from(p);
    tgt.rereg(None, Some(LOCAL.union(AccessFlags::REMOTE_WRITE)))
        .unwrap();
    assert_eq!((tgt.lkey(), tgt.rkey()), (lkey, rkey));
    assert_eq!(write(&p, &src, 64, tgt.iova() + 8, rkey), WcStatus::Success);
    assert_bytes(&read_mr(&tgt, 8, 64), &read_mr(&src, 0, 64), "WRITE target");

    // New memory, same keys: the next WRITE lands there.
    let old_iova = tgt.iova();
    tgt.rereg_buf(vec![0xaa; 8192], None, None).unwrap();
    assert_eq!((tgt.lkey(), tgt.rkey(), tgt.len()), (lkey, rkey, 8192));
    assert_ne!(tgt.iova(), old_iova);
    assert_eq!(
        write(&p, &src, 128, tgt.iova() + 4096, rkey),
        WcStatus::Success
    );
    assert_bytes(&read_mr(&tgt, 4096, 128), &read_mr(&src, 0, 128), "moved");
    assert_bytes(
        &read_mr(&tgt, 0, 64),
        &[0xaa; 64],
        "the rest of the new buffer",
    );
}

/// Fresh QPs in the same context and PD (the old ones are in ERR).
fn pair_from(p: Pair) -> Pair {
    let Pair { ctx, pd, cq, a, b } = p;
    drop((a, b));
    let a = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
    let b = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
    let (aa, ba) = (addr_of(&ctx, &a, psn(3)), addr_of(&ctx, &b, psn(4)));
    connect(&a, QpType::Rc, aa.psn, &ba);
    connect(&b, QpType::Rc, ba.psn, &aa);
    // The old QPs' flushes.
    let mut out = [blank(); 16];
    while cq.poll(&mut out).unwrap() > 0 {}
    Pair { ctx, pd, cq, a, b }
}

#[test]
fn a_bound_window_pins_its_region_and_rkeys_follow_rxe() {
    let p = pair();
    let src = mr_with(&p.pd, 4096, 2, LOCAL);
    let mut tgt =
        p.pd.reg_mr(vec![0; 4096], LOCAL.union(AccessFlags::MW_BIND))
            .unwrap();
    let mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let first = mw.rkey();
    let rkey =
        p.b.bind_mw(
            &mw,
            &tgt,
            1024,
            256,
            AccessFlags::REMOTE_WRITE,
            5,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(
        (rkey, mw.rkey()),
        (inc_rkey(first), inc_rkey(first)),
        "type 1 moves at post"
    );
    assert_wc(
        &wait_cq(&p.cq, 1, "the bind")[0],
        5,
        WcStatus::Success,
        WcOpcode::BindMw,
        0,
    );
    assert_eq!(
        write(&p, &src, 64, tgt.iova() + 1024, rkey),
        WcStatus::Success
    );
    assert_bytes(
        &read_mr(&tgt, 1024, 64),
        &read_mr(&src, 0, 64),
        "through the window",
    );
    match tgt.rereg(None, Some(LOCAL)) {
        Err(Error::Verbs(CoreError::Busy(_))) => {}
        r => panic!("rereg with a bound window: {r:?}"),
    }
    // Dropping the window (by its handle) frees the region.
    drop(mw);
    tgt.rereg(None, Some(LOCAL)).unwrap();

    // A type-2 window's key is the application's to record.
    let mw2 = p.pd.alloc_mw(MwType::Type2).unwrap();
    let k0 = mw2.rkey();
    tgt.rereg(None, Some(LOCAL.union(AccessFlags::MW_BIND)))
        .unwrap();
    let k1 =
        p.b.bind_mw(
            &mw2,
            &tgt,
            0,
            64,
            AccessFlags::REMOTE_WRITE,
            6,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!((k1, mw2.rkey()), (inc_rkey(k0), k0));
    mw2.set_rkey(k1);
    assert_eq!(mw2.rkey(), k1);
    assert_eq!(mw2.id(), MwId::of_rkey(k0));
    assert_wc(
        &wait_cq(&p.cq, 1, "the bind")[0],
        6,
        WcStatus::Success,
        WcOpcode::BindMw,
        0,
    );

    // A PD of another context is refused.
    let other = open(V4);
    match tgt.rereg(Some(&other.alloc_pd()), None) {
        Err(Error::Verbs(CoreError::InvalidArgument(m))) => assert!(m.contains("another context")),
        r => panic!("{r:?}"),
    }
    drop(p.ctx);
}

#[test]
fn a_receive_checked_at_use_fails_as_an_rnics_would() {
    let p = pair();
    let src = mr_with(&p.pd, 4096, 3, LOCAL);
    let dst = p.pd.reg_mr(vec![0; 4096], LOCAL).unwrap();
    let bad = Sge {
        lkey: dst.lkey() ^ 0x00ff_0000,
        ..dst.sge(0, 64)
    };
    assert!(
        p.b.post_recv(&RecvWr {
            wr_id: 7,
            sgl: &[bad]
        })
        .is_err(),
        "checked at post"
    );
    p.b.post_recv_deferred(&RecvWr {
        wr_id: 8,
        sgl: &[bad],
    })
    .unwrap();
    let sge = [src.sge(0, 64)];
    p.a.post_send(&wr(9, SendOp::Send, &sge, SendFlags::SIGNALED))
        .unwrap();
    let mut w = wait_cq(&p.cq, 2, "the receive and the send");
    w.sort_by_key(|c| c.wr_id);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[1].wr_id, w[1].status),
        (8, WcStatus::LocProtErr, 9, WcStatus::RemOpErr)
    );
    assert_bytes(&read_mr(&dst, 0, 64), &[0; 64], "nothing placed");
}
