//! Completion queues: resizing keeps what is queued, and overflow puts the
//! CQ in IBA's error state (CQ error, then a fatal error for every QP that
//! tries to complete into it) instead of dropping completions silently.

mod support;

use softrdma_core::cq::CqId;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{Completion, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::{Error, Event};
use softrdma_netsim::Sim;
use support::*;

const MEM: usize = 1 << 20;

/// Two connected pairs (`qa` → `qb`, `qa2` → `qb2`) whose B sides share
/// one receive CQ, `rcq`, of a chosen depth.
struct Two {
    sim: Sim<Host>,
    qa: QpEnd,
    qb: QpEnd,
    qa2: QpEnd,
    qb2: QpEnd,
    rcq: CqId,
}

fn setup(depth: u32) -> Two {
    let o = Opts::default();
    let mut sim = Sim::new(1);
    sim.add_node(Host::new(0, MEM, 1));
    sim.add_node(Host::new(1, MEM, 2));
    let qa = make_qp(sim.node_mut(0), &o);
    let qa2 = make_qp(sim.node_mut(0), &o);
    let b = sim.node_mut(1);
    let pd = b.ep.alloc_pd();
    let keys =
        b.ep.reg_mr(pd, MEM_BASE, MEM_BASE, MEM as u64, o.access)
            .unwrap();
    let rcq = b.ep.create_cq(depth).unwrap();
    let mut ends = Vec::new();
    for _ in 0..2 {
        let mut q = make_qp_in(b, &o, pd, keys, None);
        q.qpn =
            b.ep.create_qp(softrdma_core::QpInit {
                qp_type: o.qp_type,
                pd,
                send_cq: q.scq,
                recv_cq: rcq,
                srq: None,
                cap: o.cap,
                sq_sig_all: false,
            })
            .unwrap();
        q.rcq = rcq;
        ends.push(q);
    }
    let (qb, qb2) = (ends[0], ends[1]);
    for (a, b) in [(&qa, &qb), (&qa2, &qb2)] {
        connect(sim.node_mut(0), a, b, o.psn_a, o.psn_b, &o);
        connect(sim.node_mut(1), b, a, o.psn_b, o.psn_a, &o);
    }
    Two {
        sim,
        qa,
        qb,
        qa2,
        qb2,
        rcq,
    }
}

fn send(t: &mut Two, from: QpEnd, wr_id: u64) {
    t.sim
        .node_mut(0)
        .post(
            &from,
            wr_id,
            SendOp::Send,
            region(0),
            8,
            SendFlags::SIGNALED,
        )
        .unwrap();
    t.sim.run_until_idle(SEC).unwrap();
}

/// Everything a CQ gives, and how polling it ends.
fn poll_all(h: &mut Host, cq: CqId) -> (Vec<Completion>, Result<usize, Error>) {
    let mut out = [Completion::default(); 8];
    let mut v = Vec::new();
    loop {
        match h.ep.poll_cq(cq, &mut out) {
            Ok(0) => return (v, Ok(0)),
            Ok(n) => v.extend_from_slice(&out[..n]),
            Err(e) => return (v, Err(e)),
        }
    }
}

fn events(h: &mut Host) -> Vec<Event> {
    std::iter::from_fn(|| h.ep.poll_event()).collect()
}

#[test]
fn resize_keeps_queued_completions_and_refuses_to_drop_any() {
    let mut t = setup(4);
    let (qb, rcq) = (t.qb, t.rcq);
    for i in 0..3 {
        t.sim
            .node_mut(1)
            .post_recv(&qb, 70 + i, region(0) + 0x1000 + 64 * i, 64);
    }
    for i in 0..3 {
        let qa = t.qa;
        send(&mut t, qa, i);
    }
    let b = t.sim.node_mut(1);
    assert_eq!(
        b.ep.resize_cq(rcq, 2),
        Err(Error::CqTooSmall {
            depth: 2,
            queued: 3
        })
    );
    assert_eq!(
        b.ep.resize_cq(rcq, 0),
        Err(Error::InvalidArgument("CQ depth must be 1..=max_cqe"))
    );
    assert_eq!(
        b.ep.resize_cq(rcq, 1 << 22),
        Err(Error::InvalidArgument("CQ depth must be 1..=max_cqe"))
    );
    // Shrink to exactly what it holds, then grow: nothing is lost or
    // reordered.
    b.ep.resize_cq(rcq, 3).unwrap();
    assert_eq!(b.ep.cq_depth(rcq), Ok(3));
    b.ep.resize_cq(rcq, 6).unwrap();
    assert_eq!(b.ep.cq_depth(rcq), Ok(6));
    for i in 3..6 {
        t.sim
            .node_mut(1)
            .post_recv(&qb, 70 + i, region(0) + 0x1000 + 64 * i, 64);
    }
    for i in 3..6 {
        let qa = t.qa;
        send(&mut t, qa, i);
    }
    let b = t.sim.node_mut(1);
    let got = b.poll_cq(rcq);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (70..76).map(|w| (w, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(b.ep.stats().cq_overflows, 0);
    assert_eq!(events(b), []);
    assert_eq!(b.ep.qp(qb.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn overflow_puts_the_cq_in_error_and_its_qps_in_err() {
    let mut t = setup(1);
    let (qb, qb2, rcq) = (t.qb, t.qb2, t.rcq);
    for i in 0..2 {
        t.sim
            .node_mut(1)
            .post_recv(&qb, 70 + i, region(0) + 0x1000 + 64 * i, 64);
    }
    t.sim
        .node_mut(1)
        .post_recv(&qb2, 90, region(0) + 0x2000, 64);
    let (qa, qa2) = (t.qa, t.qa2);
    send(&mut t, qa, 1);
    send(&mut t, qa, 2);

    // The second receive completion found the CQ full: CQ error, and the QP
    // that tried to complete into it is fatal (ERR, its queues flushed into
    // nowhere: the CQ takes nothing more).
    let b = t.sim.node_mut(1);
    assert_eq!(events(b), [Event::CqErr(rcq), Event::QpFatal(qb.qpn)]);
    assert_eq!(b.ep.qp(qb.qpn).unwrap().state, QpState::Err);
    assert_eq!(b.ep.stats().cq_overflows, 1);
    // The other QP on that CQ has not completed anything yet: untouched.
    assert_eq!(b.ep.qp(qb2.qpn).unwrap().state, QpState::Rts);
    // What was queued before the overflow can still be polled, then the CQ
    // says it is dead instead of looking empty forever.
    let got = poll_all(b, rcq);
    assert_eq!(got.0.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [70]);
    assert_eq!(got.1, Err(Error::CqOverflowed(rcq.0)));
    assert_eq!(b.ep.resize_cq(rcq, 8), Err(Error::CqOverflowed(rcq.0)));

    // The sender never got its ACK (the responder failed before it, as
    // rxe's class G error): it retries into a QP in ERR and gives up.
    let a = t.sim.node_mut(0);
    let sent = a.poll_cq(qa.scq);
    assert_eq!(
        statuses(&sent),
        [(1, WcStatus::Success), (2, WcStatus::RetryExcErr)]
    );

    // The second QP on the dead CQ fails when it first completes into it.
    send(&mut t, qa2, 3);
    let b = t.sim.node_mut(1);
    assert_eq!(events(b), [Event::QpFatal(qb2.qpn)]);
    assert_eq!(b.ep.qp(qb2.qpn).unwrap().state, QpState::Err);
    assert_eq!(b.ep.stats().cq_overflows, 2);

    // Destroying the QPs and the CQ works, and a new CQ of the same slot is
    // healthy.
    b.ep.destroy_qp(qb.qpn).unwrap();
    b.ep.destroy_qp(qb2.qpn).unwrap();
    b.ep.destroy_cq(rcq).unwrap();
    let fresh = b.ep.create_cq(1).unwrap();
    assert_eq!(fresh, rcq);
    assert_eq!(poll_all(b, fresh), (vec![], Ok(0)));
    assert_eq!(events(b), []);
}
