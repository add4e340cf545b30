//! A responder that answers slowly, the way Linux rxe does under load:
//! regression tests for what the live interop suite against rxe found
//! (docs/INTEROP.md).
//!
//! rxe serves its request queue in order and answers each duplicate READ by
//! replaying its responses in full. While it replays an old READ, the
//! requester sees only responses it has already accepted (stale) or that
//! lie beyond a gap; those show the responder alive. Re-requesting on every
//! timeout meanwhile only queued another replay behind the current one, and
//! the retry budget ran out on a READ that rxe was about to answer
//! (`read_bw -a` against rxe failed with "transport retry counter
//! exceeded"). Packets are carried by hand, so each test is one exact
//! interleaving.

mod support;

use softrdma_core::qp::attr::local_ack_timeout_ns;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{SendFlags, SendOp};
use support::*;

#[test]
fn responses_from_a_replaying_responder_hold_off_the_retransmission_timer() {
    // Two retries: one for the lost response, one for the final timeout.
    // Timed out while the responder replays, they were gone in two periods.
    let o = Opts {
        retry_cnt: 2,
        ..Default::default()
    }; // MTU 1024
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    pattern(sim.node_mut(1), region(0) + 65536, 4096, 9);
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: region(0) + 65536,
        rkey: qb.rkey,
    };
    a.post(&qa, 1, read, region(0), 4096, SendFlags::SIGNALED)
        .unwrap();
    let req = a.take(0, usize::MAX);
    assert_eq!(describe_all(0, &req), ["A READ_REQUEST 100 ackreq"]);
    let b = sim.node_mut(1);
    b.deliver(0, 0, &req[0]);
    let resp = b.take(0, usize::MAX);
    assert_eq!(
        describe_all(1, &resp),
        [
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B READ_RESPONSE_MIDDLE 102",
            "B READ_RESPONSE_LAST 103 [ACK msn=1]",
        ]
    );
    // 102 is lost; 103 shows the gap and the requester asks again, once.
    let a = sim.node_mut(0);
    for p in [&resp[0], &resp[1], &resp[3]] {
        a.deliver(0, 1, p);
    }
    let again = a.take(0, usize::MAX);
    assert_eq!(describe_all(0, &again), ["A READ_REQUEST 102 ackreq"]);
    // The responder is busy replaying an older duplicate of the READ: for
    // two timeouts the requester sees only responses it already has.
    let mut now = 0;
    while now < 2 * period {
        now += period / 4;
        a.handle_timeout_at(now);
        a.deliver(now, 1, &resp[(now / (period / 4)) as usize % 2]);
    }
    assert_eq!(
        a.ep.stats().timeouts,
        0,
        "a live responder is not timed out"
    );
    assert!(
        a.take(now, usize::MAX).is_empty(),
        "nothing is re-requested"
    );
    assert_eq!(a.ep.qp(qa.qpn).unwrap().state, QpState::Rts);
    // The replays end and nothing more comes: one timeout later the READ
    // is asked for again (the budget is intact), and this time answered.
    now += period;
    a.handle_timeout_at(now);
    assert_eq!(a.ep.stats().timeouts, 1);
    let retry = a.take(now, usize::MAX);
    assert_eq!(describe_all(0, &retry), ["A READ_REQUEST 102 ackreq"]);
    let b = sim.node_mut(1);
    b.deliver(now, 0, &retry[0]);
    let rest = b.take(now, usize::MAX);
    assert_eq!(
        describe_all(1, &rest),
        [
            "B READ_RESPONSE_FIRST 102 [ACK msn=1]",
            "B READ_RESPONSE_LAST 103 [ACK msn=1]",
        ]
    );
    let a = sim.node_mut(0);
    for p in &rest {
        a.deliver(now, 1, p);
    }
    assert_eq!(statuses(&a.poll_cq(qa.scq)), [(1, WcStatus::Success)]);
    assert_eq!(
        sim.node(0).mem.slice(region(0), 4096),
        sim.node(1).mem.slice(region(0) + 65536, 4096)
    );
}

#[test]
fn a_silent_responder_is_still_timed_out() {
    // The other side of the same rule: without any response the timer runs
    // out as before, and the budget with it.
    let o = Opts {
        retry_cnt: 1,
        ..Default::default()
    };
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: region(0) + 65536,
        rkey: qb.rkey,
    };
    a.post(&qa, 1, read, region(0), 4096, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(a.take(0, usize::MAX).len(), 1);
    a.handle_timeout_at(period);
    assert_eq!(
        describe_all(0, &a.take(period, usize::MAX)),
        ["A READ_REQUEST 100 ackreq"]
    );
    a.handle_timeout_at(2 * period);
    assert_eq!(statuses(&a.poll_cq(qa.scq)), [(1, WcStatus::RetryExcErr)]);
}
