//! Memory windows, type 1 and type 2, as IBA and rxe (rxe_mw.c) define
//! them: bound to part of a region that has MW_BIND, remote access checked
//! like a region's but bounded to the window, type 2 bound by a BIND_MW
//! work request to one QP and revoked by LOCAL_INV or a peer's
//! SEND_WITH_INV, type 1 bound by `bind_mw` and not invalidatable.

mod support;

use softrdma_core::mr::{MwBind, MwId, MwType};
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{wc_flags, WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp, SendWr};
use softrdma_core::Error;
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 1 << 20;

fn at(k: u64) -> u64 {
    MEM_BASE + (k << 16)
}

fn setup() -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, MEM, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

fn bindable() -> AccessFlags {
    Opts::default().access.union(AccessFlags::MW_BIND)
}

/// B registers 64 KiB at `at(1)` with MW_BIND and allocates a window.
fn window(sim: &mut Sim<Host>, qb: &QpEnd, kind: MwType, access: AccessFlags) -> (u32, u32) {
    let b = sim.node_mut(1);
    let (lkey, _) = b.ep.reg_mr(qb.pd, at(1), at(1), 64 << 10, access).unwrap();
    let (id, rkey) = b.ep.alloc_mw(qb.pd, kind).unwrap();
    assert!(id.owns(rkey));
    (lkey, rkey)
}

/// Post a type-2 bind on B's QP and let it run; returns the new rkey.
fn bind2(sim: &mut Sim<Host>, qb: &QpEnd, b: MwBind, wr_id: u64) -> u32 {
    let h = sim.node_mut(1);
    let wr = SendWr {
        wr_id,
        op: SendOp::BindMw(b),
        sgl: &[],
        flags: SIG,
        ud: None,
    };
    h.ep.post_send(qb.qpn, &wr, &h.mem).unwrap();
    assert!(h.take(0, usize::MAX).is_empty(), "a bind sends nothing");
    (b.mw_rkey & !0xff) | (b.new_rkey & 0xff)
}

fn write(remote: u64, rkey: u32) -> SendOp {
    SendOp::Write {
        remote_addr: remote,
        rkey,
    }
}

const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);

#[test]
fn type2_window_grants_its_range_only() {
    let (mut sim, qa, qb, t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0x11,
        mr_lkey: lkey,
        addr: at(1) + 4096,
        len: 4096,
        access: RW,
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    assert_eq!(rkey >> 8, mw >> 8, "the window keeps its upper 24 bits");
    let bc = sim.node_mut(1).poll_cq(qb.scq);
    assert_eq!(
        (bc[0].wr_id, bc[0].status, bc[0].opcode),
        (5, WcStatus::Success, WcOpcode::BindMw)
    );
    // The window, found by its handle, has the new rkey; the old one is gone.
    let w = *sim.node(1).ep.mrs().get_mw(MwId::of_rkey(mw)).unwrap();
    assert_eq!(w.rkey, rkey);
    pattern(sim.node_mut(0), at(0), 4096, 8);
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(at(1) + 4096, rkey), at(0), 4096, SIG)
        .unwrap();
    a.post(&qa, 2, write(at(1) + 4097, rkey), at(0), 4096, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
    assert_eq!(
        sim.node(1).mem.slice(at(1) + 4096, 4096),
        sim.node(0).mem.slice(at(0), 4096)
    );
    assert!(lines(&t).iter().any(|l| l.contains("NAK-ACCESS")));
}

#[test]
fn zero_based_window_is_addressed_from_zero() {
    let (mut sim, qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 1,
        mr_lkey: lkey,
        addr: at(1) + 8192,
        len: 100,
        access: RW.union(AccessFlags::ZERO_BASED),
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    pattern(sim.node_mut(1), at(1) + 8192, 100, 3);
    let op = SendOp::Read {
        remote_addr: 10,
        rkey,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 90, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(0).mem.slice(at(0), 90),
        sim.node(1).mem.slice(at(1) + 8202, 90)
    );
}

#[test]
fn send_with_invalidate_revokes_a_type2_window() {
    let (mut sim, qa, qb, t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 2,
        mr_lkey: lkey,
        addr: at(1),
        len: 4096,
        access: RW,
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    sim.node_mut(1).post_recv(&qb, 70, at(2), 64);
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(at(1), rkey), at(0), 8, SIG).unwrap();
    a.post(&qa, 2, SendOp::SendWithInv { rkey }, at(0), 8, SIG)
        .unwrap();
    a.post(&qa, 3, write(at(1), rkey), at(0), 8, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t)[3..],
        [
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
            "B ACKNOWLEDGE 102 [NAK-ACCESS msn=2]",
        ]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!((rc[0].status, rc[0].imm_or_inv), (WcStatus::Success, rkey));
    assert_eq!(rc[0].wc_flags & wc_flags::WITH_INV, wc_flags::WITH_INV);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    // The region is free of the window again.
    let b = sim.node(1);
    assert_eq!(b.ep.mrs().get_by_lkey(lkey).unwrap().windows, 0);
}

#[test]
fn local_invalidate_frees_a_type2_window_for_rebinding() {
    let (mut sim, qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 3,
        mr_lkey: lkey,
        addr: at(1),
        len: 4096,
        access: RW,
    };
    let r1 = bind2(&mut sim, &qb, b, 5);
    // A bound type-2 window must be invalidated before it binds again
    // (o10-37.2.30).
    let h = sim.node_mut(1);
    let inv = SendWr {
        wr_id: 6,
        op: SendOp::LocalInv { rkey: r1 },
        sgl: &[],
        flags: SIG,
        ud: None,
    };
    h.ep.post_send(qb.qpn, &inv, &h.mem).unwrap();
    let r2 = bind2(
        &mut sim,
        &qb,
        MwBind {
            mw_rkey: r1,
            new_rkey: 4,
            ..b
        },
        7,
    );
    assert_ne!(r1, r2);
    let c = sim.node_mut(1).poll_cq(qb.scq);
    assert_eq!(
        c.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        [
            (5, WcStatus::Success, WcOpcode::BindMw),
            (6, WcStatus::Success, WcOpcode::LocalInv),
            (7, WcStatus::Success, WcOpcode::BindMw)
        ]
    );
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(at(1), r2), at(0), 8, SIG).unwrap();
    a.post(&qa, 2, write(at(1), r1), at(0), 8, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
}

#[test]
fn binding_needs_mw_bind_on_the_region() {
    let (mut sim, _qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, Opts::default().access);
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 64,
        access: RW,
    };
    bind2(&mut sim, &qb, b, 5);
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.scq)),
        [(5, WcStatus::MwBindErr)]
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
    let w = *sim.node(1).ep.mrs().get_mw(MwId::of_rkey(mw)).unwrap();
    assert_eq!((w.pd, w.rkey), (qb.pd, mw), "a failed bind leaves the rkey");
}

#[test]
fn type1_window_binds_through_bind_mw_and_cannot_be_invalidated() {
    let (mut sim, qa, qb, t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type1, bindable());
    let h = sim.node_mut(1);
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 256,
        access: AccessFlags::REMOTE_READ,
    };
    let rkey = h.ep.bind_mw(qb.qpn, 9, b, SIG, &h.mem).unwrap();
    assert_eq!(rkey, (mw & !0xff) | ((mw + 1) & 0xff), "ibv_inc_rkey");
    assert!(h.take(0, usize::MAX).is_empty());
    assert_eq!(
        h.poll_cq(qb.scq)
            .iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        [(9, WcStatus::Success, WcOpcode::BindMw)]
    );
    assert_eq!(
        h.ep.bind_mw(
            qb.qpn,
            10,
            MwBind {
                mw_rkey: 12345,
                ..b
            },
            SIG,
            &h.mem
        ),
        Err(Error::InvalidArgument("no memory window has this rkey"))
    );
    pattern(sim.node_mut(1), at(1), 256, 1);
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: at(1),
        rkey,
    };
    a.post(&qa, 1, read, at(0), 256, SIG).unwrap();
    a.post(&qa, 2, SendOp::SendWithInv { rkey }, at(0), 8, SIG)
        .unwrap();
    sim.node_mut(1).post_recv(&qb, 70, at(3), 64);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        sim.node(0).mem.slice(at(0), 256),
        sim.node(1).mem.slice(at(1), 256)
    );
    // Type 1 cannot be invalidated remotely (o10-37.2.26).
    assert!(lines(&t).iter().any(|l| l.contains("NAK-INV-REQ")));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::RemInvReqErr)]
    );
}

#[test]
fn zero_based_type1_bind_fails() {
    let (mut sim, _qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type1, bindable());
    let h = sim.node_mut(1);
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 256,
        access: AccessFlags::REMOTE_READ.union(AccessFlags::ZERO_BASED),
    };
    h.ep.bind_mw(qb.qpn, 9, b, SIG, &h.mem).unwrap();
    assert!(h.take(0, usize::MAX).is_empty());
    assert_eq!(statuses(&h.poll_cq(qb.scq)), [(9, WcStatus::MwBindErr)]);
}

#[test]
fn a_region_with_bound_windows_cannot_be_deregistered() {
    let (mut sim, _qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 64,
        access: RW,
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    let h = sim.node_mut(1);
    assert_eq!(
        h.ep.dereg_mr(lkey),
        Err(Error::Busy(
            "memory region (memory windows are bound to it)"
        ))
    );
    h.ep.dealloc_mw(MwId::of_rkey(rkey)).unwrap();
    assert!(h.ep.mrs().get_mw(MwId::of_rkey(rkey)).is_none());
    h.ep.dereg_mr(lkey).unwrap();
}

#[test]
fn window_invalidated_mid_write_takes_no_more_of_it() {
    let (mut sim, qa, qb, t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type2, bindable());
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 16 << 10,
        access: RW,
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    pattern(sim.node_mut(0), at(0), 16 << 10, 2);
    sim.node_mut(0)
        .post(&qa, 1, write(at(1), rkey), at(0), 16 << 10, SIG)
        .unwrap();
    let first = sim.node_mut(0).take(0, 1);
    sim.node_mut(1).deliver(0, 0, &first[0]);
    let h = sim.node_mut(1);
    let inv = SendWr {
        wr_id: 6,
        op: SendOp::LocalInv { rkey },
        sgl: &[],
        flags: SIG,
        ud: None,
    };
    h.ep.post_send(qb.qpn, &inv, &h.mem).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert!(lines(&t).contains(&"B ACKNOWLEDGE 101 [NAK-ACCESS msn=0]".to_string()));
    let b = sim.node(1);
    assert_eq!(b.mem.slice(at(1), 1024), sim.node(0).mem.slice(at(0), 1024));
    assert!(b.mem.slice(at(1) + 1024, 15 << 10).iter().all(|&x| x == 0));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
}

#[test]
fn a_window_is_named_by_its_handle_whatever_binds_do_to_its_rkey() {
    let (mut sim, qa, qb, _t) = setup();
    let h = sim.node_mut(1);
    let (lkey, _) =
        h.ep.reg_mr(qb.pd, at(1), at(1), 64 << 10, bindable())
            .unwrap();
    let (id, first) = h.ep.alloc_mw(qb.pd, MwType::Type2).unwrap();
    // LOCAL_WRITE among a window's access bits grants nothing and is
    // accepted (rdma-core's tests pass it; rxe and mlx5 take it).
    let b = MwBind {
        mw_rkey: first,
        new_rkey: 0x77,
        mr_lkey: lkey,
        addr: at(1),
        len: 4096,
        access: AccessFlags::REMOTE_WRITE.union(AccessFlags::LOCAL_WRITE),
    };
    let rkey = bind2(&mut sim, &qb, b, 5);
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.scq)),
        [(5, WcStatus::Success)]
    );
    assert_eq!(sim.node(1).ep.mrs().get_mw(id).unwrap().rkey, rkey);
    sim.node_mut(0)
        .post(&qa, 1, write(at(1), rkey), at(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    // A bound window keeps its region from being reregistered, as from
    // being deregistered.
    let h = sim.node_mut(1);
    let change = softrdma_core::mr::Rereg {
        access: Some(AccessFlags::LOCAL_WRITE),
        ..Default::default()
    };
    assert_eq!(
        h.ep.rereg_mr(lkey, &change),
        Err(Error::Busy(
            "memory region (memory windows are bound to it)"
        ))
    );
    // Deallocated by its handle, though the rkey it was allocated with is
    // long gone; the region is free again.
    h.ep.dealloc_mw(id).unwrap();
    assert!(h.ep.mrs().get_mw(id).is_none());
    assert_eq!(
        h.ep.dealloc_mw(id),
        Err(Error::InvalidArgument("no memory window has this handle"))
    );
    h.ep.rereg_mr(lkey, &change).unwrap();
    h.ep.dereg_mr(lkey).unwrap();
}

#[test]
fn a_bind_naming_the_window_by_an_old_rkey_fails() {
    // rxe: `mw->rkey != mw_rkey` is MW_BIND_ERR.
    let (mut sim, _qa, qb, _t) = setup();
    let (lkey, mw) = window(&mut sim, &qb, MwType::Type1, bindable());
    let h = sim.node_mut(1);
    let b = MwBind {
        mw_rkey: mw,
        new_rkey: 0,
        mr_lkey: lkey,
        addr: at(1),
        len: 256,
        access: AccessFlags::REMOTE_READ,
    };
    let rkey = h.ep.bind_mw(qb.qpn, 9, b, SIG, &h.mem).unwrap();
    // Posted with the allocation's rkey, which the first bind replaced.
    h.ep.bind_mw(qb.qpn, 10, b, SIG, &h.mem).unwrap();
    assert!(h.take(0, usize::MAX).is_empty());
    assert_eq!(
        statuses(&h.poll_cq(qb.scq)),
        [(9, WcStatus::Success), (10, WcStatus::MwBindErr)]
    );
    assert_eq!(
        h.ep.mrs().get_mw(MwId::of_rkey(mw)).unwrap().rkey,
        rkey,
        "the failed bind changed nothing"
    );
}

/// IBV_SEND_FENCE on a BIND_MW (or LOCAL_INV) posted after an RDMA READ:
/// the bind must wait for the READ to complete (IBA 10.8.3.3; rxe checks
/// rxe_wqe_is_fenced before rxe_do_local_ops), and so must every WQE
/// behind it. (The bind ran at once and the SEND behind it left while the
/// READ was still outstanding; found in review.)
#[test]
fn a_fenced_bind_waits_for_an_earlier_read_and_so_does_what_follows() {
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let t = trace(&mut sim, &[0, 1]);
    // A window on A, over a region with MW_BIND.
    let a = sim.node_mut(0);
    let acc = o.access.union(AccessFlags::MW_BIND);
    let (lkey, _) =
        a.ep.reg_mr(qa.pd, region(0) + 65536, region(0) + 65536, 65536, acc)
            .unwrap();
    let (_, mw) = a.ep.alloc_mw(qa.pd, MwType::Type2).unwrap();
    // The READ's response is lost once: the READ stays outstanding a timeout.
    sim.node_mut(1).drop_next(1, |r| {
        r.bth.opcode == softrdma_wire::Opcode::RC_RDMA_READ_RESPONSE_ONLY
    });
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: region(0),
        rkey: qb.rkey,
    };
    a.post(&qa, 1, read, region(0) + 4096, 64, SIG).unwrap();
    let bind = SendWr {
        wr_id: 2,
        op: SendOp::BindMw(MwBind {
            mw_rkey: mw,
            new_rkey: 7,
            mr_lkey: lkey,
            addr: region(0) + 65536,
            len: 4096,
            access: AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ),
        }),
        sgl: &[],
        flags: SIG | SendFlags::FENCE,
        ud: None,
    };
    a.sync();
    a.ep.post_send(qa.qpn, &bind, &a.mem).unwrap();
    sim.node_mut(1).post_recv(&qb, 70, region(0) + 8192, 64);
    sim.node_mut(0)
        .post(&qa, 3, SendOp::Send, region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let l = lines(&t);
    let read_done = l
        .iter()
        .rposition(|s| s.starts_with("B READ_RESPONSE_ONLY"))
        .unwrap();
    let send = l.iter().position(|s| s.starts_with("A SEND_ONLY")).unwrap();
    assert!(
        send > read_done,
        "the SEND behind a fenced bind left before the READ completed:\n{l:#?}"
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
}
