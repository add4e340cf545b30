//! Implicit on-demand regions: one registration covering the whole address
//! space, mapped or not (`ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND)`).
//!
//! Each host's memory here is a `GuardedMemory` at `MEM_BASE`; an address
//! outside it is "not mapped", and the checked calls answer `Fault` there.
//! The implicit region is the only region of the hosts under test, and the
//! guard counts it as live for no unchecked access: an access to it that
//! bypassed the checked calls (a payload handed on as a segment, an atomic
//! unchecked) would fail the test. What is mapped moves exactly; what is
//! not ends the way IBA ends an access outside a region.

mod support;

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
/// The first byte past a host's memory: not mapped.
const END: u64 = MEM_BASE + MEM as u64;

/// Byte `k * 64 KiB` of a host's memory.
fn at(k: u64) -> u64 {
    MEM_BASE + (k << 16)
}

/// Replace the full-memory region of `q`'s host by an implicit one; returns
/// `q` with its keys.
fn implicit(sim: &mut Sim<Host>, q: &QpEnd) -> QpEnd {
    let h = sim.node_mut(q.node);
    h.ep.dereg_mr(q.lkey).unwrap();
    let (lkey, rkey) = h.ep.reg_mr_implicit(q.pd, Opts::default().access).unwrap();
    assert!(h.ep.mrs().get_by_lkey(lkey).unwrap().checked);
    QpEnd { lkey, rkey, ..*q }
}

fn setup() -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, MEM, &Opts::default());
    let qa = implicit(&mut sim, &qa);
    let qb = implicit(&mut sim, &qb);
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

#[test]
fn every_operation_moves_exact_bytes_through_an_implicit_region() {
    let (mut sim, qa, qb, _t) = setup();
    pattern(sim.node_mut(0), at(0), LEN as usize, 1);
    pattern(sim.node_mut(1), at(2), LEN as usize, 2);
    pattern(sim.node_mut(0), at(4), LEN as usize, 3);
    sim.node_mut(1).post_recv(&qb, 50, at(5), LEN);
    sim.node_mut(1)
        .mem
        .slice_mut(at(6), 8)
        .copy_from_slice(&7u64.to_ne_bytes());
    let a = sim.node_mut(0);
    let write = SendOp::Write {
        remote_addr: at(1),
        rkey: qb.rkey,
    };
    a.post(&qa, 1, write, at(0), LEN, SIG).unwrap();
    let read = SendOp::Read {
        remote_addr: at(2),
        rkey: qb.rkey,
    };
    a.post(&qa, 2, read, at(3), LEN, SIG).unwrap();
    a.post(&qa, 3, SendOp::Send, at(4), LEN, SIG).unwrap();
    let add = SendOp::FetchAdd {
        remote_addr: at(6),
        rkey: qb.rkey,
        add: 5,
    };
    a.post(&qa, 4, add, at(7), 8, SIG).unwrap();
    let cas = SendOp::CompareSwap {
        remote_addr: at(6),
        rkey: qb.rkey,
        compare: 12,
        swap: 99,
    };
    a.post(&qa, 5, cas, at(7) + 8, 8, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();

    let ok = |n| (n, WcStatus::Success);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [ok(1), ok(2), ok(3), ok(4), ok(5)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [ok(50)]);
    assert_eq!((rc[0].opcode, rc[0].byte_len), (WcOpcode::Recv, LEN));
    let (a, b) = (sim.node(0), sim.node(1));
    let n = LEN as usize;
    assert_eq!(b.mem.slice(at(1), n), a.mem.slice(at(0), n), "WRITE");
    assert_eq!(a.mem.slice(at(3), n), b.mem.slice(at(2), n), "READ");
    assert_eq!(b.mem.slice(at(5), n), a.mem.slice(at(4), n), "SEND");
    assert_eq!(
        a.mem.slice(at(7), 8),
        7u64.to_ne_bytes(),
        "fetch-add's old value"
    );
    assert_eq!(
        a.mem.slice(at(7) + 8, 8),
        12u64.to_ne_bytes(),
        "compare-swap's old value"
    );
    assert_eq!(
        b.mem.slice(at(6), 8),
        99u64.to_ne_bytes(),
        "7 + 5, then swapped"
    );
}

#[test]
fn a_write_running_into_unmapped_memory_is_nakked_where_it_leaves_the_mapping() {
    let (mut sim, qa, qb, t) = setup();
    pattern(sim.node_mut(0), at(0), 4096, 4);
    let op = SendOp::Write {
        remote_addr: END - 1024,
        rkey: qb.rkey,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 4096, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    let l = lines(&t);
    assert_eq!(l[..2], ["A WRITE_FIRST 100", "A WRITE_MIDDLE 101"]);
    assert!(
        l.contains(&"B ACKNOWLEDGE 101 [NAK-ACCESS msn=0]".to_string()),
        "{l:#?}"
    );
    // The mapped kilobyte landed, as a DMA that faults midway leaves it.
    assert_eq!(
        sim.node(1).mem.slice(END - 1024, 1024),
        sim.node(0).mem.slice(at(0), 1024)
    );
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
fn a_read_running_into_unmapped_memory_sends_what_is_mapped_then_a_nak() {
    let (mut sim, qa, qb, t) = setup();
    pattern(sim.node_mut(1), END - 2048, 2048, 5);
    let op = SendOp::Read {
        remote_addr: END - 2048,
        rkey: qb.rkey,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 4096, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    let from_b: Vec<String> = lines(&t)
        .into_iter()
        .filter(|l| l.starts_with('B'))
        .collect();
    assert_eq!(
        from_b,
        [
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B ACKNOWLEDGE 102 [NAK-ACCESS msn=1]"
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
}

#[test]
fn an_atomic_on_an_unmapped_word_is_a_remote_access_error() {
    let (mut sim, qa, qb, t) = setup();
    let op = SendOp::FetchAdd {
        remote_addr: END + 4096,
        rkey: qb.rkey,
        add: 1,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 8, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert!(
        lines(&t).contains(&"B ACKNOWLEDGE 100 [NAK-ACCESS msn=0]".to_string()),
        "{:#?}",
        lines(&t)
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RemAccessErr)]
    );
    assert!(sim.node(0).mem.slice(at(0), 8).iter().all(|&x| x == 0));
}

#[test]
fn a_send_from_unmapped_memory_is_a_local_protection_error_and_sends_nothing() {
    let (mut sim, qa, _qb, t) = setup();
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, END - 512, 2048, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    // The first packet would have held 512 mapped bytes and 512 unmapped
    // ones: not even it leaves.
    assert_eq!(lines(&t), Vec::<String>::new());
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::LocProtErr)]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
}

#[test]
fn a_receive_into_unmapped_memory_fails_the_receive_and_the_sender() {
    let (mut sim, qa, qb, t) = setup();
    sim.node_mut(1).post_recv(&qb, 70, END + 8192, 4096);
    pattern(sim.node_mut(0), at(0), 4096, 6);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, at(0), 4096, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert!(
        lines(&t).contains(&"B ACKNOWLEDGE 100 [NAK-OP msn=0]".to_string()),
        "{:#?}",
        lines(&t)
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::LocProtErr)]);
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
fn a_translation_makes_an_implicit_region_an_ordinary_one() {
    let (mut sim, qa, _qb, _t) = setup();
    let h = sim.node_mut(0);
    let change = softrdma_core::mr::Rereg {
        translation: Some(softrdma_core::mr::Translation {
            iova: at(0),
            host_addr: at(0),
            len: 4096,
        }),
        ..Default::default()
    };
    h.ep.rereg_mr(qa.lkey, &change).unwrap();
    let m = h.ep.mrs().get_by_lkey(qa.lkey).unwrap();
    assert!(!m.checked);
    assert_eq!((m.iova, m.len), (at(0), 4096));
}

/// A WRITE with immediate into a hole of an implicit region takes a
/// receive for its immediate before the placement fails: the receive is
/// not lost. The responder's QP goes to ERR and flushes it first.
#[test]
fn a_write_with_immediate_into_a_hole_does_not_lose_its_receive() {
    let (mut sim, qa, qb, _t) = setup();
    sim.node_mut(1).post_recv(&qb, 60, at(5), 4096);
    sim.node_mut(1).post_recv(&qb, 61, at(5), 4096);
    let op = SendOp::WriteWithImm {
        remote_addr: END,
        rkey: qb.rkey,
        imm: 7,
    };
    sim.node_mut(0).post(&qa, 1, op, at(0), 64, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Err);
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(60, WcStatus::WrFlushErr), (61, WcStatus::WrFlushErr)]
    );
}
