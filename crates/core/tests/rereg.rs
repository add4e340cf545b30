//! Reregistration (`ibv_rereg_mr`): a region changes access, PD or
//! translation in place under the same keys, and work that referenced the
//! old registration — a receive posted before, a peer's WRITE in progress —
//! fails as if the region had been deregistered, never touching the old
//! memory again (the hosts' `GuardedMemory` knows only the new
//! translation). Also: receives whose SGEs are checked when a message needs
//! them (`RecvCheck::Deferred`, the C ABI's `ibv_post_recv`), which is how
//! rdma-core's `test_mr_rereg_pd` sees a remote operational error.

mod support;

use softrdma_core::mr::{PdId, Rereg, Translation};
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, Sge};
use softrdma_core::{Error, RecvCheck};
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 1 << 20;
/// 16 packets at the tests' 1024-byte MTU.
const LEN: u32 = 16 << 10;
const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

fn at(k: u64) -> u64 {
    MEM_BASE + (k << 16)
}

fn setup() -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, MEM, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

/// Replace B's full-memory region by one over 64 KiB at `at(k)` with
/// `access`; returns B's QP end with that region's keys.
fn only_region(sim: &mut Sim<Host>, q: &QpEnd, k: u64, access: AccessFlags) -> QpEnd {
    let h = sim.node_mut(q.node);
    h.ep.dereg_mr(q.lkey).unwrap();
    let (lkey, rkey) = h.ep.reg_mr(q.pd, at(k), at(k), 64 << 10, access).unwrap();
    h.sync();
    QpEnd { lkey, rkey, ..*q }
}

fn rereg(sim: &mut Sim<Host>, q: &QpEnd, change: Rereg) {
    let h = sim.node_mut(q.node);
    h.ep.rereg_mr(q.lkey, &change).unwrap();
    h.sync();
}

fn moved_to(k: u64) -> Rereg {
    Rereg {
        translation: Some(Translation {
            iova: at(k),
            host_addr: at(k),
            len: 64 << 10,
        }),
        ..Rereg::default()
    }
}

fn write(remote: u64, rkey: u32) -> SendOp {
    SendOp::Write {
        remote_addr: remote,
        rkey,
    }
}

fn recv(
    sim: &mut Sim<Host>,
    q: &QpEnd,
    wr_id: u64,
    addr: u64,
    check: RecvCheck,
) -> Result<(), Error> {
    let sge = [Sge {
        addr,
        length: 64,
        lkey: q.lkey,
    }];
    let wr = RecvWr { wr_id, sgl: &sge };
    sim.node_mut(q.node).ep.post_recv_with(q.qpn, &wr, check)
}

#[test]
fn access_changes_under_the_same_rkey() {
    let (mut sim, qa, qb, _t) = setup();
    let b = only_region(&mut sim, &qb, 1, LOCAL);
    let rw = LOCAL.union(AccessFlags::REMOTE_WRITE);
    rereg(
        &mut sim,
        &b,
        Rereg {
            access: Some(rw),
            ..Rereg::default()
        },
    );
    pattern(sim.node_mut(0), at(0), 128, 1);
    sim.node_mut(0)
        .post(&qa, 1, write(at(1), b.rkey), at(0), 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(1).mem.slice(at(1), 64),
        sim.node(0).mem.slice(at(0), 64)
    );

    rereg(
        &mut sim,
        &b,
        Rereg {
            access: Some(LOCAL),
            ..Rereg::default()
        },
    );
    sim.node_mut(0)
        .post(&qa, 2, write(at(1), b.rkey), at(0) + 64, 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(2, WcStatus::RemAccessErr)]
    );
    // The refused WRITE left the first one's bytes.
    assert_eq!(
        sim.node(1).mem.slice(at(1), 64),
        sim.node(0).mem.slice(at(0), 64)
    );
    let m = *sim.node(1).ep.mrs().get_by_lkey(b.lkey).unwrap();
    assert_eq!((m.rkey, m.access), (b.rkey, LOCAL), "the keys stay");
}

#[test]
fn a_new_translation_takes_the_keys_and_the_old_memory_is_left_alone() {
    let (mut sim, qa, qb, _t) = setup();
    let b = only_region(&mut sim, &qb, 1, Opts::default().access);
    rereg(&mut sim, &b, moved_to(4));
    pattern(sim.node_mut(0), at(0), 128, 2);
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(at(4) + 64, b.rkey), at(0), 64, SIG)
        .unwrap();
    // The old iova is outside the region now.
    a.post(&qa, 2, write(at(1), b.rkey), at(0) + 64, 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
    let h = sim.node(1);
    assert_eq!(
        h.mem.slice(at(4) + 64, 64),
        sim.node(0).mem.slice(at(0), 64)
    );
    assert!(h.mem.slice(at(1), 64 << 10).iter().all(|&x| x == 0));
}

#[test]
fn a_receive_posted_before_a_new_translation_is_a_remote_operational_error() {
    // rdma-core's test_mr_rereg_addr: the receive names the old buffer.
    let (mut sim, qa, qb, _t) = setup();
    let b = only_region(&mut sim, &qb, 1, Opts::default().access);
    recv(&mut sim, &b, 70, at(1), RecvCheck::AtPost).unwrap();
    rereg(&mut sim, &b, moved_to(4));
    pattern(sim.node_mut(0), at(0), 64, 3);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, at(0), 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(70, WcStatus::LocProtErr)]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemOpErr)]
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
    // Nothing reached either buffer.
    let h = sim.node(1);
    assert!(h.mem.slice(at(1), 64).iter().all(|&x| x == 0));
    assert!(h.mem.slice(at(4), 64).iter().all(|&x| x == 0));
}

#[test]
fn a_region_moved_to_another_pd_fails_receives_checked_at_use() {
    // rdma-core's test_mr_rereg_pd: ibv_post_recv takes the WQE, and the
    // message that needs it finds the region in another PD.
    let (mut sim, qa, qb, _t) = setup();
    let b = only_region(&mut sim, &qb, 1, Opts::default().access);
    let other = sim.node_mut(1).ep.alloc_pd();
    rereg(
        &mut sim,
        &b,
        Rereg {
            pd: Some(other),
            ..Rereg::default()
        },
    );
    assert_eq!(
        recv(&mut sim, &b, 70, at(1), RecvCheck::AtPost),
        Err(Error::InvalidArgument(
            "receive SGE not covered by a local-writable MR of the QP's PD"
        ))
    );
    recv(&mut sim, &b, 71, at(1), RecvCheck::Deferred).unwrap();
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, at(0), 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(71, WcStatus::LocProtErr)]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemOpErr)]
    );
    assert!(sim.node(1).mem.slice(at(1), 64).iter().all(|&x| x == 0));
    // Moved back, the same keys serve the QP's PD again.
    rereg(
        &mut sim,
        &b,
        Rereg {
            pd: Some(qb.pd),
            ..Rereg::default()
        },
    );
    assert_eq!(sim.node(1).ep.mrs().get_by_lkey(b.lkey).unwrap().pd, qb.pd);
    assert_ne!(other, PdId(0));
}

#[test]
fn a_deferred_receive_that_no_message_reaches_is_harmless() {
    // A bad SGE beyond what the message fills is never looked at (rxe's
    // copy_data stops at the message's end too).
    let (mut sim, qa, qb, _t) = setup();
    let sge = [
        Sge {
            addr: at(2),
            length: 64,
            lkey: qb.lkey,
        },
        Sge {
            addr: at(2),
            length: 64,
            lkey: qb.lkey ^ 0x5555,
        },
    ];
    let h = sim.node_mut(1);
    h.ep.post_recv_with(
        qb.qpn,
        &RecvWr {
            wr_id: 9,
            sgl: &sge,
        },
        RecvCheck::Deferred,
    )
    .unwrap();
    pattern(sim.node_mut(0), at(0), 64, 4);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, at(0), 64, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(9, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(1).mem.slice(at(2), 64),
        sim.node(0).mem.slice(at(0), 64)
    );
}

#[test]
fn a_write_in_progress_takes_no_more_of_a_reregistered_region() {
    let (mut sim, qa, qb, t) = setup();
    let b = only_region(&mut sim, &qb, 1, Opts::default().access);
    pattern(sim.node_mut(0), at(0), LEN as usize, 5);
    sim.node_mut(0)
        .post(&qa, 1, write(at(1), b.rkey), at(0), LEN, SIG)
        .unwrap();
    let first = sim.node_mut(0).take(0, 1);
    sim.node_mut(1).deliver(0, 0, &first[0]);
    // Same iova, new memory: the rest of the message must land nowhere.
    let change = Rereg {
        translation: Some(Translation {
            iova: at(1),
            host_addr: at(4),
            len: 64 << 10,
        }),
        ..Rereg::default()
    };
    rereg(&mut sim, &b, change);
    sim.run_until_idle(SEC).unwrap();
    assert!(
        lines(&t).contains(&"B ACKNOWLEDGE 101 [NAK-ACCESS msn=0]".to_string()),
        "{:#?}",
        lines(&t)
    );
    let h = sim.node(1);
    assert_eq!(h.mem.slice(at(1), 1024), sim.node(0).mem.slice(at(0), 1024));
    assert!(h
        .mem
        .slice(at(1) + 1024, LEN as usize - 1024)
        .iter()
        .all(|&x| x == 0));
    assert!(h.mem.slice(at(4), LEN as usize).iter().all(|&x| x == 0));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
}

#[test]
fn bad_reregistrations_are_refused_and_change_nothing() {
    let (mut sim, _qa, qb, _t) = setup();
    let h = sim.node_mut(1);
    let before = *h.ep.mrs().get_by_lkey(qb.lkey).unwrap();
    assert_eq!(
        h.ep.rereg_mr(qb.lkey ^ 1, &moved_to(2)),
        Err(Error::InvalidArgument("no memory region has this lkey"))
    );
    assert!(matches!(
        h.ep.rereg_mr(
            qb.lkey,
            &Rereg {
                access: Some(AccessFlags::REMOTE_ATOMIC),
                ..moved_to(2)
            }
        ),
        Err(Error::InvalidAccess(_))
    ));
    assert_eq!(*h.ep.mrs().get_by_lkey(qb.lkey).unwrap(), before);
}
