//! A region's memory is never touched after its deregistration returns,
//! whatever was in flight: a peer's multi-packet WRITE, a queued READ
//! response stream, a receive a multi-packet SEND is filling, our own
//! WRITE's source, our own READ's destination. Each test arranges memory so
//! that the region under test is the only one covering its bytes, then
//! deregisters it part way through a message; the hosts' `GuardedMemory`
//! fails the test on any access outside a live region, and the work fails
//! the way IBA and rxe say.
//!
//! Also here: atomics whose translated host address is misaligned, READs
//! longer than IBA's largest message, and an RNR on a single-packet WRITE
//! with immediate.

mod support;

use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::Event;
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 1 << 20;
/// 16 packets at the tests' 1024-byte MTU.
const LEN: u32 = 16 << 10;

/// Byte `k * 64 KiB` of a host's memory.
fn at(k: u64) -> u64 {
    MEM_BASE + (k << 16)
}

fn all() -> AccessFlags {
    Opts::default().access
}

fn setup() -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, MEM, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

/// Replace the full-memory region of `q`'s host by one over `[addr, addr +
/// len)` alone; returns `q` with that region's keys.
fn only_region(sim: &mut Sim<Host>, q: &QpEnd, addr: u64, len: u64) -> QpEnd {
    let h = sim.node_mut(q.node);
    h.ep.dereg_mr(q.lkey).unwrap();
    let (lkey, rkey) = h.ep.reg_mr(q.pd, addr, addr, len, all()).unwrap();
    QpEnd { lkey, rkey, ..*q }
}

/// Carry the next `n` datagrams of `from` to the other host by hand.
fn carry(sim: &mut Sim<Host>, from: usize, n: usize) -> Vec<String> {
    let pkts = sim.node_mut(from).take(0, n);
    for p in &pkts {
        sim.node_mut(1 - from).deliver(0, from, p);
    }
    describe_all(from, &pkts)
}

#[test]
fn region_deregistered_after_a_writes_first_packet_takes_no_more_of_it() {
    let (mut sim, qa, qb, t) = setup();
    let target = only_region(&mut sim, &qb, at(0), 64 << 10);
    pattern(sim.node_mut(0), at(0), LEN as usize, 3);
    let op = SendOp::Write {
        remote_addr: at(0),
        rkey: target.rkey,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), LEN, SIG).unwrap();
    assert_eq!(carry(&mut sim, 0, 1), ["A WRITE_FIRST 100"]);
    sim.node_mut(1).ep.dereg_mr(target.lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    // The first packet landed before the deregistration; the next finds no
    // region and is NAKed; nothing after it was written (GuardedMemory
    // would have failed the test on the first such write).
    let l = lines(&t);
    assert_eq!(l[1], "A WRITE_MIDDLE 101");
    assert!(
        l.contains(&"B ACKNOWLEDGE 101 [NAK-ACCESS msn=0]".to_string()),
        "{l:#?}"
    );
    let b = sim.node(1);
    assert_eq!(b.mem.slice(at(0), 1024), sim.node(0).mem.slice(at(0), 1024));
    assert!(b
        .mem
        .slice(at(0) + 1024, LEN as usize - 1024)
        .iter()
        .all(|&x| x == 0));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
    assert_eq!(
        sim.node_mut(1).ep.poll_event(),
        Some(Event::QpAccessErr(qb.qpn))
    );
}

#[test]
fn region_deregistered_during_a_read_response_stream_sends_no_more_of_it() {
    let (mut sim, qa, qb, t) = setup();
    let source = only_region(&mut sim, &qb, at(0), 64 << 10);
    pattern(sim.node_mut(1), at(0), LEN as usize, 5);
    let op = SendOp::Read {
        remote_addr: at(0),
        rkey: source.rkey,
    };
    sim.node_mut(0).post(&qa, 1, op, at(4), LEN, SIG).unwrap();
    assert_eq!(carry(&mut sim, 0, 1), ["A READ_REQUEST 100 ackreq"]);
    assert_eq!(
        carry(&mut sim, 1, 1),
        ["B READ_RESPONSE_FIRST 100 [ACK msn=1]"]
    );
    sim.node_mut(1).ep.dereg_mr(source.lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    // Not one more byte of the region goes onto the wire: the stream ends
    // in a NAK for the next PSN (rxe's read_reply when rxe_recheck_mr fails).
    let from_b: Vec<String> = lines(&t)
        .into_iter()
        .filter(|l| l.starts_with('B'))
        .collect();
    assert_eq!(
        from_b,
        [
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B ACKNOWLEDGE 101 [NAK-ACCESS msn=1]"
        ]
    );
    assert!(t
        .borrow()
        .iter()
        .filter(|p| p.from == 1)
        .all(|p| p.payload.len() <= 1024));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
    assert_eq!(
        sim.node_mut(1).ep.poll_event(),
        Some(Event::QpAccessErr(qb.qpn))
    );
}

#[test]
fn receive_buffer_deregistered_while_a_send_fills_it_fails_the_receive() {
    let (mut sim, qa, qb, t) = setup();
    let rbuf = only_region(&mut sim, &qb, at(0), 64 << 10);
    sim.node_mut(1).post_recv(&rbuf, 70, at(0), LEN);
    pattern(sim.node_mut(0), at(0), LEN as usize, 9);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, at(0), LEN, SIG)
        .unwrap();
    assert_eq!(carry(&mut sim, 0, 1), ["A SEND_FIRST 100"]);
    sim.node_mut(1).ep.dereg_mr(rbuf.lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    // rxe's malformed-WQE answer: Remote Operational Error NAK, ERR; the
    // receive completes with a local protection error.
    assert!(
        lines(&t).contains(&"B ACKNOWLEDGE 101 [NAK-OP msn=0]".to_string()),
        "{:#?}",
        lines(&t)
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::LocProtErr)]);
    assert_eq!(rc[0].opcode, WcOpcode::Recv);
    assert!(sim
        .node(1)
        .mem
        .slice(at(0) + 1024, 1024)
        .iter()
        .all(|&x| x == 0));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemOpErr)]
    );
    assert_eq!(
        sim.node_mut(1).ep.poll_event(),
        Some(Event::QpFatal(qb.qpn))
    );
}

#[test]
fn source_deregistered_during_our_write_stops_it_with_a_protection_error() {
    let (mut sim, qa, qb, t) = setup();
    let src = only_region(&mut sim, &qa, at(0), 64 << 10);
    pattern(sim.node_mut(0), at(0), LEN as usize, 1);
    let op = SendOp::Write {
        remote_addr: at(12),
        rkey: qb.rkey,
    };
    sim.node_mut(0).post(&src, 1, op, at(0), LEN, SIG).unwrap();
    sim.node_mut(0).post(&src, 2, op, at(0), 8, SIG).unwrap();
    assert_eq!(
        carry(&mut sim, 0, 2),
        ["A WRITE_FIRST 100", "A WRITE_MIDDLE 101"]
    );
    sim.node_mut(0).ep.dereg_mr(src.lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    // No packet built after the deregistration reads the region.
    assert_eq!(lines(&t)[2..], Vec::<String>::new()[..], "{:#?}", lines(&t));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
}

#[test]
fn source_deregistered_behind_unacknowledged_work_fails_in_order() {
    // The failing WRITE is not the oldest: the one before it completes
    // first, as completions are in order, then it fails.
    let (mut sim, qa, qb, _t) = setup();
    let a = sim.node_mut(0);
    let (lkey, _) = a.ep.reg_mr(qa.pd, at(8), at(8), 4096, all()).unwrap();
    let gone = QpEnd { lkey, ..qa };
    let op = SendOp::Write {
        remote_addr: at(12),
        rkey: qb.rkey,
    };
    a.post(&qa, 1, op, at(0), 3000, SIG).unwrap();
    a.post(&gone, 2, op, at(8), 100, SIG).unwrap();
    a.post(&qa, 3, op, at(0), 8, SIG).unwrap();
    assert_eq!(carry(&mut sim, 0, 1), ["A WRITE_FIRST 100"]);
    sim.node_mut(0).ep.dereg_mr(lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn read_destination_deregistered_mid_response_takes_no_more_of_it() {
    let (mut sim, qa, qb, _t) = setup();
    let dst = only_region(&mut sim, &qa, at(0), 64 << 10);
    pattern(sim.node_mut(1), at(0), LEN as usize, 4);
    let op = SendOp::Read {
        remote_addr: at(0),
        rkey: qb.rkey,
    };
    sim.node_mut(0).post(&dst, 1, op, at(0), LEN, SIG).unwrap();
    carry(&mut sim, 0, 1);
    assert_eq!(
        carry(&mut sim, 1, 2),
        [
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101"
        ]
    );
    sim.node_mut(0).ep.dereg_mr(dst.lkey).unwrap();
    sim.run_until_idle(SEC).unwrap();
    let a = sim.node(0);
    assert_eq!(a.mem.slice(at(0), 2048), sim.node(1).mem.slice(at(0), 2048));
    assert!(a.mem.slice(at(0) + 2048, 1024).iter().all(|&x| x == 0));
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::LocProtErr)]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
}

#[test]
fn atomic_whose_host_address_is_misaligned_is_an_invalid_request() {
    // An aligned iova over a host buffer at +4 (ibv_reg_mr_iova(buf + 4,
    // aligned iova)): the VA passes the alignment check, the translated
    // address would not. GuardedMemory asserts the alignment of every
    // atomic it is handed.
    let (mut sim, qa, qb, t) = setup();
    let b = sim.node_mut(1);
    b.ep.dereg_mr(qb.lkey).unwrap();
    let iova = 0x7000_0000;
    let (_, rkey) = b.ep.reg_mr(qb.pd, iova, at(0) + 4, 64, all()).unwrap();
    let op = SendOp::FetchAdd {
        remote_addr: iova + 8,
        rkey,
        add: 1,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 8, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A FETCH_ADD 100 ackreq",
            "B ACKNOWLEDGE 100 [NAK-INV-REQ msn=0]"
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemInvReqErr)]
    );
    assert!(sim.node(1).mem.slice(at(0), 32).iter().all(|&x| x == 0));
    assert_eq!(
        sim.node_mut(1).ep.poll_event(),
        Some(Event::QpReqErr(qb.qpn))
    );
}

#[test]
fn read_longer_than_the_largest_message_is_an_invalid_request() {
    // IBA's largest message is 2^31 bytes; rxe's check_length NAKs a READ
    // asking for more with Invalid Request before looking at the rkey.
    let (mut sim, _qa, qb, _t) = setup();
    let b = sim.node_mut(1);
    let req = read_request(&qb, 100, at(0), qb.rkey, (1 << 31) + 1);
    b.deliver(0, 0, &forge(0, 1, &req, &[]));
    let out = b.take(0, usize::MAX);
    assert_eq!(
        describe_all(1, &out),
        ["B ACKNOWLEDGE 100 [NAK-INV-REQ msn=0]"]
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
}

#[test]
fn read_of_exactly_the_largest_message_is_judged_by_its_rkey() {
    // 2^31 is allowed; this one is refused only because no region is that
    // large.
    let (mut sim, _qa, qb, _t) = setup();
    let b = sim.node_mut(1);
    let req = read_request(&qb, 100, at(0), qb.rkey, 1 << 31);
    b.deliver(0, 0, &forge(0, 1, &req, &[]));
    let out = b.take(0, usize::MAX);
    assert_eq!(
        describe_all(1, &out),
        ["B ACKNOWLEDGE 100 [NAK-ACCESS msn=0]"]
    );
}

#[test]
fn rnr_on_a_single_packet_write_with_immediate_is_retried_not_fatal() {
    let (mut sim, qa, qb, t) = setup();
    pattern(sim.node_mut(0), at(0), 100, 2);
    let op = SendOp::WriteWithImm {
        remote_addr: at(4),
        rkey: qb.rkey,
        imm: 0x55,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 100, SIG).unwrap();
    assert_eq!(carry(&mut sim, 0, 1), ["A WRITE_ONLY_IMMEDIATE 100 ackreq"]);
    assert_eq!(
        carry(&mut sim, 1, 1),
        ["B ACKNOWLEDGE 100 [RNR-NAK timer=1 msn=0]"]
    );
    sim.node_mut(1).post_recv(&qb, 70, at(8), 0);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t)[2..],
        [
            "A WRITE_ONLY_IMMEDIATE 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]"
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!(
        (rc[0].opcode, rc[0].imm_or_inv, rc[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, 0x55, 100)
    );
    assert_eq!(
        sim.node(1).mem.slice(at(4), 100),
        sim.node(0).mem.slice(at(0), 100)
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn rnr_on_the_last_packet_of_a_write_with_immediate_keeps_the_message() {
    let (mut sim, qa, qb, _t) = setup();
    pattern(sim.node_mut(0), at(0), 3000, 6);
    let op = SendOp::WriteWithImm {
        remote_addr: at(4),
        rkey: qb.rkey,
        imm: 7,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 3000, SIG).unwrap();
    carry(&mut sim, 0, 3);
    assert_eq!(
        carry(&mut sim, 1, 1),
        ["B ACKNOWLEDGE 102 [RNR-NAK timer=1 msn=0]"]
    );
    sim.node_mut(1).post_recv(&qb, 70, at(8), 0);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!((rc[0].status, rc[0].byte_len), (WcStatus::Success, 3000));
    assert_eq!(
        sim.node(1).mem.slice(at(4), 3000),
        sim.node(0).mem.slice(at(0), 3000)
    );
}
