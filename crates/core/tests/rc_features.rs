//! RC verbs features end to end: shared receive queues, immediate data,
//! send with invalidate, inline sends, unsignaled work requests and
//! completion notifications.

mod support;

use softrdma_core::cq::CqId;
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{wc_flags, WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Error, Event};
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 1 << 20;

fn setup(o: &Opts) -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, MEM, o);
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

fn write(remote: u64, rkey: u32) -> SendOp {
    SendOp::Write {
        remote_addr: remote,
        rkey,
    }
}

// ---- Shared receive queues ---------------------------------------------------

/// Two QPs on A, connected to two QPs on B that share one SRQ.
fn srq_setup() -> (Sim<Host>, [QpEnd; 2], [QpEnd; 2], u32) {
    let o = Opts::default();
    let mut sim = Sim::new(1);
    sim.add_node(Host::new(0, MEM, 1));
    sim.add_node(Host::new(1, MEM, 2));
    let a0 = make_qp(sim.node_mut(0), &o);
    let a1 = make_qp(sim.node_mut(0), &o);
    let b = sim.node_mut(1);
    let pd = b.ep.alloc_pd();
    let keys =
        b.ep.reg_mr(pd, MEM_BASE, MEM_BASE, MEM as u64, o.access)
            .unwrap();
    let srq = b.ep.create_srq(pd, 16, 2).unwrap();
    let b0 = make_qp_in(b, &o, pd, keys, Some(srq));
    let b1 = make_qp_in(b, &o, pd, keys, Some(srq));
    for (a, b) in [(&a0, &b0), (&a1, &b1)] {
        connect(sim.node_mut(0), a, b, o.psn_a, o.psn_b, &o);
        connect(sim.node_mut(1), b, a, o.psn_b, o.psn_a, &o);
    }
    (sim, [a0, a1], [b0, b1], srq)
}

fn post_srq(h: &mut Host, srq: u32, lkey: u32, wr_id: u64, addr: u64, len: u32) {
    let sge = [Sge {
        addr,
        length: len,
        lkey,
    }];
    h.ep.post_srq_recv(srq, &RecvWr { wr_id, sgl: &sge })
        .unwrap();
}

#[test]
fn srq_feeds_receives_to_every_qp_in_arrival_order() {
    let (mut sim, a, b, srq) = srq_setup();
    for i in 0..3 {
        post_srq(
            sim.node_mut(1),
            srq,
            b[0].lkey,
            70 + i,
            region(0) + 4096 * i,
            4096,
        );
    }
    // A QP on an SRQ takes no receives of its own.
    let own = sim
        .node_mut(1)
        .ep
        .post_recv(b[0].qpn, &RecvWr { wr_id: 1, sgl: &[] });
    assert!(matches!(own, Err(Error::InvalidArgument(_))));
    pattern(sim.node_mut(0), region(0), 3000, 1);
    sim.node_mut(0)
        .post(&a[1], 1, SendOp::Send, region(0), 100, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    sim.node_mut(0)
        .post(&a[0], 2, SendOp::Send, region(0) + 100, 2000, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    let b1 = sim.node_mut(1).poll_cq(b[1].rcq);
    let b0 = sim.node_mut(1).poll_cq(b[0].rcq);
    assert_eq!(
        (b1[0].wr_id, b1[0].qp_num, b1[0].byte_len),
        (70, b[1].qpn, 100)
    );
    assert_eq!(
        (b0[0].wr_id, b0[0].qp_num, b0[0].byte_len),
        (71, b[0].qpn, 2000)
    );
    assert_eq!(
        sim.node(1).mem.slice(region(0) + 4096, 2000),
        sim.node(0).mem.slice(region(0) + 100, 2000)
    );
    // An empty SRQ is "receiver not ready" for every QP on it.
    sim.node_mut(0)
        .post(&a[0], 3, SendOp::Send, region(0), 10, SIG)
        .unwrap();
    sim.node_mut(0)
        .post(&a[1], 4, SendOp::Send, region(0), 10, SIG)
        .unwrap();
    sim.run_until(sim.now() + 5 * US);
    assert_eq!(sim.node(1).ep.stats().rnr_naks_sent, 1);
    post_srq(
        sim.node_mut(1),
        srq,
        b[0].lkey,
        73,
        region(0) + 3 * 4096,
        64,
    );
    sim.run_until_idle(SEC).unwrap();
    let got: Vec<u64> = [b[0].rcq, b[1].rcq]
        .iter()
        .flat_map(|&cq| sim.node_mut(1).poll_cq(cq))
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(got.len(), 2);
    assert!(got.contains(&72) && got.contains(&73));
}

#[test]
fn srq_qp_entering_err_raises_last_wqe_reached_and_keeps_the_srq() {
    let (mut sim, _a, b, srq) = srq_setup();
    post_srq(sim.node_mut(1), srq, b[0].lkey, 70, region(0), 64);
    let h = sim.node_mut(1);
    let attr = softrdma_core::qp::attr::QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    h.ep.modify_qp(b[0].qpn, &attr, softrdma_core::qp::attr::AttrMask::STATE)
        .unwrap();
    assert_eq!(h.ep.poll_event(), Some(Event::QpLastWqeReached(b[0].qpn)));
    // The SRQ's receive is not flushed: the other QP may still use it.
    assert!(h.poll_cq(b[0].rcq).is_empty());
    assert!(matches!(
        h.ep.destroy_srq(srq),
        Err(Error::Busy("shared receive queue"))
    ));
}

// ---- Immediate data ----------------------------------------------------------

#[test]
fn write_with_immediate_consumes_a_receive_at_its_last_packet() {
    let o = Opts {
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    pattern(sim.node_mut(0), region(0), 3000, 2);
    let op = SendOp::WriteWithImm {
        remote_addr: region(0) + 8192,
        rkey: qb.rkey,
        imm: 0xdead_beef,
    };
    sim.node_mut(0)
        .post(&qa, 1, op, region(0), 3000, SIG)
        .unwrap();
    // No receive yet: the data lands, the last packet is not ready.
    sim.run_until(5 * US);
    sim.node_mut(1).post_recv(&qb, 70, region(0), 0);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_FIRST 100",
            "A WRITE_MIDDLE 101",
            "A WRITE_LAST_IMMEDIATE 102 ackreq",
            "B ACKNOWLEDGE 102 [RNR-NAK timer=1 msn=0]",
            // Only the last packet is sent again.
            "A WRITE_LAST_IMMEDIATE 102 ackreq",
            "B ACKNOWLEDGE 102 [ACK msn=1]",
        ]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].opcode, rc[0].byte_len, rc[0].imm_or_inv),
        (70, WcOpcode::RecvRdmaWithImm, 3000, 0xdead_beef)
    );
    assert_eq!(rc[0].wc_flags & wc_flags::WITH_IMM, wc_flags::WITH_IMM);
    assert_eq!(
        sim.node(1).mem.slice(region(0) + 8192, 3000),
        sim.node(0).mem.slice(region(0), 3000)
    );
}

#[test]
fn zero_length_write_and_read_need_no_rkey() {
    // IBA C9-88: the R_Key and VA of a zero-length access are not checked.
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    sim.node_mut(1).post_recv(&qb, 70, region(0), 0);
    let op = SendOp::WriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: 5,
    };
    sim.node_mut(0).post(&qa, 1, op, 0, 0, SIG).unwrap();
    let op = SendOp::Read {
        remote_addr: 0,
        rkey: 0,
    };
    sim.node_mut(0).post(&qa, 2, op, 0, 0, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY_IMMEDIATE 100 ackreq",
            "A READ_REQUEST 101 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "B READ_RESPONSE_ONLY 101 [ACK msn=2]",
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(
        (rc[0].status, rc[0].byte_len, rc[0].imm_or_inv),
        (WcStatus::Success, 0, 5)
    );
}

// ---- Send with invalidate ----------------------------------------------------

#[test]
fn send_with_invalidate_cannot_revoke_an_ordinary_region() {
    // Only memory windows of type 2 (and fast-registered regions) can be
    // invalidated remotely (IBA 10.6.7; rxe's rxe_invalidate_mr refuses a
    // user MR). Naming an ordinary region's rkey is an invalid request: the
    // receive completes in error, the requester gets the NAK, both QPs go
    // to ERR, and the region keeps its rkey.
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    let b = sim.node_mut(1);
    let rw = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
    let (lkey2, rkey2) = b.ep.reg_mr(qb.pd, region(0), region(0), 4096, rw).unwrap();
    b.post_recv(&qb, 70, region(0) + 8192, 64);
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(region(0), rkey2), region(0), 8, SIG)
        .unwrap();
    a.post(
        &qa,
        2,
        SendOp::SendWithInv { rkey: rkey2 },
        region(0),
        8,
        SIG,
    )
    .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq",
            "A SEND_ONLY_INVALIDATE 101 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "B ACKNOWLEDGE 101 [NAK-INV-REQ msn=1]",
        ]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::RemInvReqErr)]);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::RemInvReqErr)]
    );
    assert_eq!(
        sim.node_mut(1).ep.poll_event(),
        Some(Event::QpReqErr(qb.qpn))
    );
    let b = sim.node_mut(1);
    let mr = b.ep.mrs().get_by_lkey(lkey2).expect("still registered");
    assert_eq!(mr.rkey, rkey2, "the region keeps its rkey");
}

// ---- Inline sends ------------------------------------------------------------

#[test]
fn inline_data_is_copied_when_posted() {
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    sim.node_mut(1).post_recv(&qb, 70, region(0) + 8192, 128);
    let a = sim.node_mut(0);
    a.sync();
    pattern(a, region(0), 100, 7);
    let posted = a.mem.slice(region(0), 100).to_vec();
    // No key is checked for inline data.
    let sge = [Sge {
        addr: region(0),
        length: 100,
        lkey: 0,
    }];
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sgl: &sge,
        flags: SIG | SendFlags::INLINE,
        ud: None,
    };
    a.ep.post_send(qa.qpn, &wr, &a.mem).unwrap();
    // The buffer may be reused as soon as the post returns.
    a.mem.slice_mut(region(0), 100).fill(0);
    let long = [Sge {
        addr: region(0),
        length: 129,
        lkey: 0,
    }];
    let too_long = SendWr { sgl: &long, ..wr };
    assert_eq!(
        a.ep.post_send(qa.qpn, &too_long, &a.mem),
        Err(Error::InlineTooLong { got: 129, max: 128 })
    );
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(t.borrow()[0].payload, posted);
    assert_eq!(sim.node(1).mem.slice(region(0) + 8192, 100), &posted[..]);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
}

// ---- Unsignaled work requests ------------------------------------------------

#[test]
fn only_signaled_work_requests_complete_on_success() {
    let (mut sim, qa, qb, _t) = setup(&Opts::default());
    let a = sim.node_mut(0);
    let none = SendFlags::default();
    a.post(&qa, 1, write(region(0), qb.rkey), region(0), 8, none)
        .unwrap();
    a.post(&qa, 2, write(region(0), qb.rkey), region(0), 8, none)
        .unwrap();
    a.post(&qa, 3, write(region(0), qb.rkey), region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(3, WcStatus::Success)]
    );
    // Their slots are free again: a full queue's worth posts.
    let a = sim.node_mut(0);
    for wr in 0..256 {
        a.post(&qa, 10 + wr, write(region(0), qb.rkey), region(0), 8, none)
            .unwrap();
    }
    sim.run_until_idle(SEC).unwrap();
    assert!(sim.node_mut(0).poll_cq(qa.scq).is_empty());
}

#[test]
fn sq_sig_all_signals_every_work_request() {
    let o = Opts {
        sq_sig_all: true,
        ..Default::default()
    };
    let (mut sim, qa, qb, _t) = setup(&o);
    let a = sim.node_mut(0);
    for wr in 1..=2 {
        a.post(
            &qa,
            wr,
            write(region(0), qb.rkey),
            region(0),
            8,
            SendFlags::default(),
        )
        .unwrap();
    }
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

// ---- Completion notification -------------------------------------------------

fn events(h: &mut Host) -> Vec<Event> {
    std::iter::from_fn(|| h.ep.poll_event()).collect()
}

fn send(sim: &mut Sim<Host>, qa: &QpEnd, wr: u64, flags: SendFlags) {
    sim.node_mut(0)
        .post(qa, wr, SendOp::Send, region(0), 8, flags)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
}

#[test]
fn armed_cq_notifies_once_per_arming() {
    let (mut sim, qa, qb, _t) = setup(&Opts::default());
    for i in 0..4 {
        sim.node_mut(1)
            .post_recv(&qb, 70 + i, region(0) + 64 * i, 64);
    }
    // Not armed: completions, no events.
    send(&mut sim, &qa, 1, SIG);
    assert_eq!(events(sim.node_mut(1)), []);
    assert_eq!(events(sim.node_mut(0)), []);
    // Armed: the next completion notifies, on each side's own CQ.
    sim.node_mut(1).ep.req_notify_cq(qb.rcq, false).unwrap();
    sim.node_mut(0).ep.req_notify_cq(qa.scq, false).unwrap();
    send(&mut sim, &qa, 2, SIG);
    assert_eq!(events(sim.node_mut(1)), [Event::CompNotify(qb.rcq)]);
    assert_eq!(events(sim.node_mut(0)), [Event::CompNotify(qa.scq)]);
    // The arming was used up.
    send(&mut sim, &qa, 3, SIG);
    assert_eq!(events(sim.node_mut(1)), []);
    assert_eq!(sim.node_mut(1).poll_cq(qb.rcq).len(), 3);
}

#[test]
fn solicited_only_arming_waits_for_a_solicited_completion() {
    let (mut sim, qa, qb, _t) = setup(&Opts::default());
    for i in 0..2 {
        sim.node_mut(1)
            .post_recv(&qb, 70 + i, region(0) + 64 * i, 64);
    }
    sim.node_mut(1).ep.req_notify_cq(qb.rcq, true).unwrap();
    send(&mut sim, &qa, 1, SIG);
    assert_eq!(events(sim.node_mut(1)), []);
    send(&mut sim, &qa, 2, SIG | SendFlags::SOLICITED);
    assert_eq!(events(sim.node_mut(1)), [Event::CompNotify(qb.rcq)]);
}

#[test]
fn solicited_only_arming_fires_on_an_error_completion() {
    let (mut sim, qa, qb, _t) = setup(&Opts::default());
    sim.node_mut(0).ep.req_notify_cq(qa.scq, true).unwrap();
    let bad = write(region(0), qb.rkey ^ 0x0100_0000);
    sim.node_mut(0)
        .post(&qa, 1, bad, region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(events(sim.node_mut(0)), [Event::CompNotify(qa.scq)]);
}

#[test]
fn arming_does_not_fire_for_completions_already_waiting() {
    // As ibv_req_notify_cq: arm, then poll again to catch what came before.
    let (mut sim, qa, qb, _t) = setup(&Opts::default());
    sim.node_mut(1).post_recv(&qb, 70, region(0), 64);
    send(&mut sim, &qa, 1, SIG);
    sim.node_mut(1).ep.req_notify_cq(qb.rcq, false).unwrap();
    assert_eq!(events(sim.node_mut(1)), []);
    assert_eq!(sim.node_mut(1).poll_cq(qb.rcq).len(), 1);
}

#[test]
fn cq_overflow_raises_cq_err() {
    let o = Opts::default();
    let mut sim = Sim::new(1);
    sim.add_node(Host::new(0, MEM, 1));
    sim.add_node(Host::new(1, MEM, 2));
    let qa = make_qp(sim.node_mut(0), &o);
    // B's receive CQ holds one completion.
    let b = sim.node_mut(1);
    let pd = b.ep.alloc_pd();
    let keys =
        b.ep.reg_mr(pd, MEM_BASE, MEM_BASE, MEM as u64, o.access)
            .unwrap();
    let mut qb = make_qp_in(b, &o, pd, keys, None);
    let tiny: CqId = b.ep.create_cq(1).unwrap();
    let qpn =
        b.ep.create_qp(softrdma_core::QpInit {
            qp_type: o.qp_type,
            pd,
            send_cq: qb.scq,
            recv_cq: tiny,
            srq: None,
            cap: o.cap,
            sq_sig_all: false,
        })
        .unwrap();
    qb.qpn = qpn;
    qb.rcq = tiny;
    connect(sim.node_mut(0), &qa, &qb, o.psn_a, o.psn_b, &o);
    connect(sim.node_mut(1), &qb, &qa, o.psn_b, o.psn_a, &o);
    for i in 0..2 {
        sim.node_mut(1).post_recv(&qb, 70 + i, region(0), 64);
    }
    send(&mut sim, &qa, 1, SIG);
    send(&mut sim, &qa, 2, SIG);
    // The QP that overflowed the CQ is fatal (tests/cq.rs has the rest).
    assert_eq!(
        events(sim.node_mut(1)),
        [Event::CqErr(tiny), Event::QpFatal(qb.qpn)]
    );
    assert_eq!(sim.node(1).ep.stats().cq_overflows, 1);
}
