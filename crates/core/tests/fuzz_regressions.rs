//! Bugs the stateful fuzz target (fuzz/fuzz_targets/endpoint.rs) found,
//! each reduced to the few calls that show it. See docs/RELIABILITY.md.

mod support;

use softrdma_core::mr::KeySource;
use softrdma_core::mr::{MwBind, MwType};
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp, SendWr};
use softrdma_core::{Endpoint, EndpointConfig};
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;

fn post_local(sim: &mut Sim<Host>, q: &QpEnd, wr_id: u64, op: SendOp) {
    let h = sim.node_mut(q.node);
    let wr = SendWr {
        wr_id,
        op,
        sgl: &[],
        flags: SIG,
        ud: None,
    };
    h.ep.post_send(q.qpn, &wr, &h.mem).unwrap();
}

/// A SEND on the wire, then a LOCAL_INV that fails, then `next`: only the
/// SEND may go out; once it is acknowledged the LOCAL_INV fails, the QP
/// enters ERR, and `next` is flushed.
fn failed_local_op_then(next: impl FnOnce(&mut Sim<Host>, &QpEnd, &QpEnd)) {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    sim.node_mut(1).post_recv(&qb, 1, region(0), 64);
    let a = sim.node_mut(0);
    a.post(&qa, 10, SendOp::Send, region(0), 64, SIG).unwrap();
    // No window has this rkey: the invalidation fails when it executes.
    post_local(&mut sim, &qa, 11, SendOp::LocalInv { rkey: 0xdead_beef });
    next(&mut sim, &qa, &qb);

    let out = sim.node_mut(0).take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &out),
        ["A SEND_ONLY 100 ackreq"],
        "nothing after the failed LOCAL_INV starts"
    );
    let b = sim.node_mut(1);
    b.deliver(0, 0, &out[0]);
    let ack = b.take(0, usize::MAX);
    assert_eq!(describe_all(1, &ack), ["B ACKNOWLEDGE 100 [ACK msn=1]"]);
    let a = sim.node_mut(0);
    a.deliver(0, 1, &ack[0]);
    assert!(a.take(0, usize::MAX).is_empty());
    let c = a.poll_cq(qa.scq);
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        got[..2],
        [
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::LocQpOpErr, WcOpcode::LocalInv),
        ]
    );
    assert_eq!(got.len(), 3);
    assert_eq!((got[2].0, got[2].1), (12, WcStatus::WrFlushErr));
    assert_eq!(a.ep.qp(qa.qpn).unwrap().state, QpState::Err);
}

/// Found by the fuzzer as a panic ("validated at post") in the packet
/// builder: after a local operation failed behind unacknowledged work, the
/// requester moved on to the next WQE, and when that was a BIND_MW — which
/// has no packet — tried to build one.
#[test]
fn a_bind_after_a_failed_local_invalidate_is_flushed_not_sent() {
    failed_local_op_then(|sim, qa, _| {
        let a = sim.node_mut(0);
        let access = Opts::default().access.union(AccessFlags::MW_BIND);
        let (lkey, _) =
            a.ep.reg_mr(qa.pd, region(1), region(1), 4096, access)
                .unwrap();
        let (_, mw) = a.ep.alloc_mw(qa.pd, MwType::Type2).unwrap();
        let bind = MwBind {
            mw_rkey: mw,
            new_rkey: 1,
            mr_lkey: lkey,
            addr: region(1),
            len: 4096,
            access: AccessFlags::REMOTE_READ,
        };
        post_local(sim, qa, 12, SendOp::BindMw(bind));
    });
}

/// The same bug seen from the wire: an ordinary WRITE after the failed
/// LOCAL_INV went out, though nothing after a failed WQE may start.
#[test]
fn a_write_after_a_failed_local_invalidate_does_not_start() {
    failed_local_op_then(|sim, qa, qb| {
        let op = SendOp::Write {
            remote_addr: region(2),
            rkey: qb.rkey,
        };
        sim.node_mut(0)
            .post(qa, 12, op, region(0), 64, SIG)
            .unwrap();
    });
}

/// Found by the fuzzer as the scheduler's "filed ready sends nothing": a
/// QP whose rate gate was closed (its SEND had just gone out at a low
/// rate) and whose next WQE was local work — a bind — was filed ready, but
/// its turn runs the requester only when the gate is open, so the turn did
/// nothing; in a release build the QP was then dropped from the ready list
/// with no timer, and the bind never ran. Local work now waits for the
/// rate gate like a packet.
#[test]
fn a_bind_behind_a_paced_send_runs_when_the_gate_opens() {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    sim.node_mut(1).post_recv(&qb, 1, region(0), 64);
    let a = sim.node_mut(0);
    // 100 kbit/s: the 64-byte SEND closes the gate for about 8 ms.
    a.ep.set_qp_rate(qa.qpn, Some(100_000)).unwrap();
    let access = Opts::default().access.union(AccessFlags::MW_BIND);
    let (lkey, _) =
        a.ep.reg_mr(qa.pd, region(1), region(1), 4096, access)
            .unwrap();
    let (_, mw) = a.ep.alloc_mw(qa.pd, MwType::Type2).unwrap();
    a.post(&qa, 10, SendOp::Send, region(0), 64, SIG).unwrap();
    let bind = MwBind {
        mw_rkey: mw,
        new_rkey: 1,
        mr_lkey: lkey,
        addr: region(1),
        len: 4096,
        access: AccessFlags::REMOTE_READ,
    };
    post_local(&mut sim, &qa, 11, SendOp::BindMw(bind));
    sim.run_until_idle(SEC).unwrap();
    let a = sim.node_mut(0);
    let got: Vec<_> = a
        .poll_cq(qa.scq)
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect();
    assert_eq!(
        got,
        [
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::BindMw),
        ]
    );
    a.ep.check_scheduler().unwrap();
}

/// Found by the fuzzer as "QP is forgotten: it wants Dest but is filed
/// Idle": a QP held by its rate gate was filed with its pacing timer; then
/// another QP filled the destination's budget, and the paced QP's state by
/// the scheduler's own rules became "waiting for the budget", which it was
/// not filed as. (Its pacing timer would have brought it back; but the
/// filing no longer said why it waited, and the scheduler's check — the one
/// guarantee that no QP is forgotten — failed.) A closed rate gate now
/// holds a QP ahead of the budget.
#[test]
fn a_paced_qp_stays_paced_when_another_fills_the_destination_budget() {
    let o = Opts::default();
    let mut sim = Sim::new(1);
    for id in 0..2 {
        let mut h = Host::new(id, 1 << 20, 1 + id as u64);
        h.ep = Endpoint::new(EndpointConfig {
            key_source: KeySource::seeded(1 + id as u64),
            qpn_base: h.ep.config().qpn_base,
            max_inflight_per_dest: 8 << 10,
            // The trace below is of go-back-N's packets (no offer bit).
            selective_repeat: false,
            ..Default::default()
        });
        sim.add_node(h);
    }
    let (a1, b1) = (make_qp(sim.node_mut(0), &o), make_qp(sim.node_mut(1), &o));
    let (a2, b2) = (make_qp(sim.node_mut(0), &o), make_qp(sim.node_mut(1), &o));
    for (qa, qb) in [(&a1, &b1), (&a2, &b2)] {
        connect(sim.node_mut(0), qa, qb, o.psn_a, o.psn_b, &o);
        connect(sim.node_mut(1), qb, qa, o.psn_b, o.psn_a, &o);
    }
    let b = sim.node_mut(1);
    b.post_recv(&b1, 1, region(0), 32 << 10);
    b.post_recv(&b2, 2, region(0) + (64 << 10), 64);
    b.post_recv(&b2, 3, region(0) + (64 << 10), 64);
    let a = sim.node_mut(0);
    a.ep.set_qp_rate(a2.qpn, Some(86_000)).unwrap();
    a.post(&a2, 10, SendOp::Send, region(0), 0, SIG).unwrap();
    a.post(&a1, 11, SendOp::Send, region(0), 22 << 10, SIG)
        .unwrap();
    a.post(&a2, 12, SendOp::Send, region(0), 0, SIG).unwrap();
    // Everything A may send before any ACK. The host checks the scheduler
    // once it has sent all it can.
    let out = a.take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &out),
        [
            "A SEND_ONLY 100 ackreq", // a2: its rate gate closes
            "A SEND_FIRST 100",       // a1, until the budget is full
            "A SEND_MIDDLE 101",
            "A SEND_MIDDLE 102",
            "A SEND_MIDDLE 103",
            "A SEND_MIDDLE 104",
            "A SEND_MIDDLE 105",
            "A SEND_MIDDLE 106 ackreq",
        ]
    );
    a.check();
    for d in &out {
        sim.node_mut(1).deliver(0, 0, d);
    }
    sim.run_until_idle(SEC).unwrap();
    let a = sim.node_mut(0);
    let done = |q: &QpEnd, a: &mut Host| statuses(&a.poll_cq(q.scq));
    assert_eq!(done(&a1, a), [(11, WcStatus::Success)]);
    assert_eq!(
        done(&a2, a),
        [(10, WcStatus::Success), (12, WcStatus::Success)]
    );
}
