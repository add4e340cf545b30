//! Requests held back for an offload (the shared-memory transport's way
//! of carrying work out at post): a request posted behind one on the wire
//! may not overtake it, and sent behind it would keep the QP on the wire
//! for good (a streaming poster's send queue never empties again). So it
//! waits, unsent, until what is ahead has completed, and is then carried
//! out by the offload, in order — or, if the offload refuses it then, sent
//! with the next PSN as any request, alone if the offload could carry what
//! follows (which waits for its answer), else with the rest. One the
//! offload says it could not carry is sent at once.
//!
//! The offload here is a test double of the transport beneath the core
//! (not the thing under test): it accepts a given number of requests and
//! records each one it carries out; the packets are the core's own, on a
//! perfect 1 µs link, so each exchange is one exact sequence.

mod support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use softrdma_core::qp::attr::{AttrMask, QpAttr};
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::{Offload, OffloadLocal};
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;

/// The transport beneath: accepts the next `accept` requests, says
/// `ready` when asked whether it could carry one, and records the byte
/// count of each it carries out.
#[derive(Clone)]
struct Fake {
    accept: Rc<Cell<usize>>,
    ready: bool,
    carried: Rc<RefCell<Vec<u64>>>,
}

impl Fake {
    fn new(accept: usize, ready: bool) -> Fake {
        Fake {
            accept: Rc::new(Cell::new(accept)),
            ready,
            carried: Rc::default(),
        }
    }

    fn carried(&self) -> Vec<u64> {
        self.carried.borrow().clone()
    }
}

impl Offload for Fake {
    fn one_sided(&mut self, _op: &SendOp, local: OffloadLocal<'_>) -> bool {
        if self.accept.get() == 0 {
            return false;
        }
        self.accept.set(self.accept.get() - 1);
        self.carried.borrow_mut().push(local.bytes());
        true
    }

    fn would_carry(&mut self, _op: &SendOp, _len: u64) -> bool {
        self.ready
    }
}

/// Post a signaled SEND of `len` bytes at `addr` through `off`; whether it
/// was carried out at once.
fn send(h: &mut Host, q: &QpEnd, wr_id: u64, addr: u64, len: u32, off: &mut Fake) -> bool {
    h.post_via(q, wr_id, SendOp::Send, addr, len, SIG, Some(off))
        .unwrap()
}

fn done(sim: &mut softrdma_netsim::Sim<Host>, q: &QpEnd) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    sim.node_mut(0)
        .poll_cq(q.scq)
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
        .collect()
}

/// SEND 1, 64 bytes, which the transport cannot take at post (`ready`:
/// whether it could carry what follows), is on the wire and unanswered.
fn first_on_the_wire(sim: &mut softrdma_netsim::Sim<Host>, qa: &QpEnd, ready: bool) {
    assert!(!send(
        sim.node_mut(0),
        qa,
        1,
        region(0),
        64,
        &mut Fake::new(0, ready)
    ));
    sim.run_until(sim.now() + 100);
}

/// What the engine does after handling packets: A's requests held for
/// QP `qa` go through `off`; whether any went to the requester.
fn drain(sim: &mut softrdma_netsim::Sim<Host>, qa: &QpEnd, off: &Fake) -> bool {
    let qpn = qa.qpn;
    sim.node_mut(0)
        .ep
        .offload_held(|n| (n == qpn).then(|| off.clone()))
}

/// B's receive completions: (wr_id, byte_len).
fn received(sim: &mut softrdma_netsim::Sim<Host>, qb: &QpEnd) -> Vec<(u64, u32)> {
    let b = sim.node_mut(1).poll_cq(qb.rcq);
    b.iter().map(|c| (c.wr_id, c.byte_len)).collect()
}

const OK: WcStatus = WcStatus::Success;
const S: WcOpcode = WcOpcode::Send;

#[test]
fn a_request_behind_one_on_the_wire_waits_for_it_then_goes_through_the_offload() {
    let (mut sim, qa, qb) = pair(1, 8 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    sim.node_mut(1).post_recv(&qb, 7, region(1), 4096);
    pattern(sim.node_mut(0), region(0), 4096, 5);
    // The transport cannot take the first (say, the peer had no receive
    // it could reach): it goes on the wire.
    first_on_the_wire(&mut sim, &qa, true);
    assert_eq!(lines(&t), ["A SEND_ONLY 100 ackreq"]);
    // The next ones could go through the transport, but the first is
    // still unanswered: they wait, unsent.
    let take = Fake::new(usize::MAX, true);
    assert!(!send(
        sim.node_mut(0),
        &qa,
        2,
        region(0) + 64,
        32,
        &mut take.clone()
    ));
    assert!(!send(
        sim.node_mut(0),
        &qa,
        3,
        region(0) + 96,
        0,
        &mut take.clone()
    ));
    assert!(sim.node(0).ep.holds_for_offload());
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        ["A SEND_ONLY 100 ackreq", "B ACKNOWLEDGE 100 [ACK msn=1]"],
        "nothing but the first on the wire"
    );
    assert_eq!(done(&mut sim, &qa), [(1, OK, S, 64)]);
    assert!(take.carried().is_empty());
    // What the engine does after handling packets: the first completed,
    // so the held ones go through the transport, in order.
    drain(&mut sim, &qa, &take);
    assert_eq!(take.carried(), [32, 0]);
    assert_eq!(done(&mut sim, &qa), [(2, OK, S, 32), (3, OK, S, 0)]);
    assert!(!sim.node(0).ep.holds_for_offload());
    assert_eq!(sim.node(0).ep.stats().offloaded_after_hold, 2);
    assert_eq!(
        sim.node_mut(1).mem.slice_mut(region(1), 64).to_vec(),
        sim.node_mut(0).mem.slice_mut(region(0), 64).to_vec(),
        "the first SEND's bytes"
    );
    // With the queue empty again the next post is carried out at once.
    assert!(send(
        sim.node_mut(0),
        &qa,
        4,
        region(0),
        16,
        &mut take.clone()
    ));
    assert_eq!(take.carried(), [32, 0, 16]);
    assert_eq!(done(&mut sim, &qa), [(4, OK, S, 16)]);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(lines(&t).len(), 2, "and nothing more went on the wire");
}

/// A's SEND 1 on the wire, then SENDs 2, 3, 4 held behind it (8, 128
/// and 16 bytes), and SEND 1 answered; B has receives 7, 8 and 9.
fn three_held() -> (softrdma_netsim::Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, 8 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    for k in 0..3 {
        sim.node_mut(1)
            .post_recv(&qb, 7 + k, region(1) + 4096 * k, 4096);
    }
    pattern(sim.node_mut(0), region(0), 4096, 9);
    first_on_the_wire(&mut sim, &qa, true);
    let ready = Fake::new(0, true);
    for (wr_id, at, len) in [(2, 64, 8), (3, 128, 128), (4, 256, 16)] {
        assert!(!send(
            sim.node_mut(0),
            &qa,
            wr_id,
            region(0) + at,
            len,
            &mut ready.clone()
        ));
    }
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(done(&mut sim, &qa), [(1, OK, S, 64)]);
    (sim, qa, qb, t)
}

#[test]
fn a_held_request_the_offload_refuses_goes_on_the_wire_alone_while_the_rest_wait() {
    let (mut sim, qa, qb, t) = three_held();
    // The transport takes SEND 2 and refuses SEND 3, but could carry what
    // follows (the peer's receives are behind, say): SEND 3 goes on the
    // wire with the next PSN, SEND 4 waits for its answer.
    let once = Fake::new(1, true);
    drain(&mut sim, &qa, &once);
    assert_eq!(once.carried(), [8]);
    assert!(sim.node(0).ep.holds_for_offload());
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A SEND_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "A SEND_ONLY 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
    assert_eq!(done(&mut sim, &qa), [(2, OK, S, 8), (3, OK, S, 128)]);
    // Answered: SEND 4 goes through the transport.
    let take = Fake::new(usize::MAX, true);
    drain(&mut sim, &qa, &take);
    assert_eq!(take.carried(), [16]);
    assert_eq!(done(&mut sim, &qa), [(4, OK, S, 16)], "in posting order");
    assert!(!sim.node(0).ep.holds_for_offload());
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(lines(&t).len(), 4, "SEND 4 never on the wire");
    assert_eq!(received(&mut sim, &qb), [(7, 64), (8, 128)]);
    assert_eq!(
        sim.node_mut(1)
            .mem
            .slice_mut(region(1) + 4096, 128)
            .to_vec(),
        sim.node_mut(0).mem.slice_mut(region(0) + 128, 128).to_vec(),
        "SEND 3's bytes"
    );
}

#[test]
fn held_requests_the_offload_can_no_longer_carry_all_go_on_the_wire() {
    let (mut sim, qa, qb, t) = three_held();
    // SEND 2 carried, SEND 3 refused, and the transport could not carry
    // what follows either (the peer's receive lane closed, say): SENDs 3
    // and 4 go on the wire, with the next PSNs.
    let gone = Fake::new(1, false);
    drain(&mut sim, &qa, &gone);
    assert_eq!(gone.carried(), [8]);
    assert!(!sim.node(0).ep.holds_for_offload());
    sim.run_until_idle(SEC).unwrap();
    let l = lines(&t);
    assert_eq!(
        l[2..4],
        ["A SEND_ONLY 101 ackreq", "A SEND_ONLY 102 ackreq"],
        "{l:?}"
    );
    assert_eq!(
        done(&mut sim, &qa),
        [(2, OK, S, 8), (3, OK, S, 128), (4, OK, S, 16)],
        "in posting order"
    );
    assert_eq!(received(&mut sim, &qb), [(7, 64), (8, 128), (9, 16)]);
}

#[test]
fn a_request_the_offload_could_not_carry_is_sent_at_once() {
    let (mut sim, qa, qb) = pair(1, 8 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    sim.node_mut(1).post_recv(&qb, 7, region(1), 4096);
    sim.node_mut(1).post_recv(&qb, 8, region(1) + 4096, 4096);
    first_on_the_wire(&mut sim, &qa, false);
    // Not ready (the peer has no receive the transport could fill, say):
    // holding it would only wait for the first's answer to send it then.
    let not_ready = Fake::new(usize::MAX, false);
    assert!(!send(
        sim.node_mut(0),
        &qa,
        2,
        region(0),
        64,
        &mut not_ready.clone()
    ));
    assert!(!sim.node(0).ep.holds_for_offload());
    sim.run_until(sim.now() + 100);
    assert_eq!(
        lines(&t),
        ["A SEND_ONLY 100 ackreq", "A SEND_ONLY 101 ackreq"],
        "the second leaves before the first is answered"
    );
    sim.run_until_idle(SEC).unwrap();
    assert!(not_ready.carried().is_empty());
    assert_eq!(done(&mut sim, &qa), [(1, OK, S, 64), (2, OK, S, 64)]);
}

#[test]
fn held_requests_are_flushed_in_order_when_the_qp_fails() {
    // No receive at B, and no RNR retries: the first SEND fails the QP.
    let o = Opts {
        rnr_retry: 0,
        ..Default::default()
    };
    let (mut sim, qa, _qb) = pair(1, 8 << 20, &o);
    first_on_the_wire(&mut sim, &qa, true);
    let take = Fake::new(usize::MAX, true);
    assert!(!send(
        sim.node_mut(0),
        &qa,
        2,
        region(0),
        8,
        &mut take.clone()
    ));
    sim.run_until_idle(SEC).unwrap();
    drain(&mut sim, &qa, &take);
    assert!(
        take.carried().is_empty(),
        "nothing carried out after a failure"
    );
    let v = done(&mut sim, &qa);
    assert_eq!(
        v.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(!sim.node(0).ep.holds_for_offload());
}

#[test]
fn a_state_change_gives_held_requests_back_to_the_requester() {
    let (mut sim, qa, qb) = pair(1, 8 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    sim.node_mut(1).post_recv(&qb, 7, region(1), 4096);
    sim.node_mut(1).post_recv(&qb, 8, region(1) + 4096, 4096);
    first_on_the_wire(&mut sim, &qa, true);
    assert!(!send(
        sim.node_mut(0),
        &qa,
        2,
        region(0),
        32,
        &mut Fake::new(0, true)
    ));
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(done(&mut sim, &qa), [(1, OK, S, 64)]);
    // RTS -> SQD -> RTS, with nobody calling offload_held: the held SEND
    // is the requester's again, and goes on the wire.
    for state in [QpState::Sqd, QpState::Rts] {
        let a = QpAttr {
            qp_state: state,
            ..Default::default()
        };
        sim.node_mut(0)
            .ep
            .modify_qp(qa.qpn, &a, AttrMask::STATE)
            .unwrap();
    }
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A SEND_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "A SEND_ONLY 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
    assert_eq!(done(&mut sim, &qa), [(2, OK, S, 32)]);
}
