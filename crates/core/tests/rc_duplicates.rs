//! Duplicate requests at the responder: each is answered again and none is
//! executed twice. A SEND or WRITE is re-acknowledged, a READ is read again
//! and replayed, an atomic is answered from the responder's cache of
//! results — never performed a second time.

mod support;

use softrdma_core::qp::attr::local_ack_timeout_ns;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_netsim::Sim;
use softrdma_wire::{Opcode, Packet, PacketRepr};
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const D: u64 = US;

fn setup(o: &Opts) -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, 1 << 20, o);
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

fn times(t: &Trace) -> Vec<u64> {
    t.borrow().iter().map(|p| p.t).collect()
}

fn set_word(h: &mut Host, addr: u64, v: u64) {
    h.mem.slice_mut(addr, 8).copy_from_slice(&v.to_ne_bytes());
}

fn word(h: &Host, addr: u64) -> u64 {
    u64::from_ne_bytes(h.mem.slice(addr, 8).try_into().unwrap())
}

#[test]
fn duplicate_read_is_replayed_from_memory() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let src = region(0) + 4096;
    pattern(sim.node_mut(1), src, 3000, 1);
    sim.node_mut(1).drop_next(3, |r| {
        r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_FIRST
            || r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
            || r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST
    });
    let op = SendOp::Read {
        remote_addr: src,
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, op, region(0), 3000, SIG)
        .unwrap();
    // Before the requester asks again, the responder's memory changes: the
    // replay reads it again (IBA: a duplicate READ is re-executed).
    sim.run_until(period / 2);
    pattern(sim.node_mut(1), src, 3000, 2);
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A READ_REQUEST 100 ackreq",
            "B READ_RESPONSE_FIRST 100 [ACK msn=1] DROPPED",
            "B READ_RESPONSE_MIDDLE 101 DROPPED",
            "B READ_RESPONSE_LAST 102 [ACK msn=1] DROPPED",
            "A READ_REQUEST 100 ackreq",
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B READ_RESPONSE_LAST 102 [ACK msn=1]",
        ]
    );
    assert_eq!(
        times(&t),
        [0, D, D, D, period, period + D, period + D, period + D]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(0).mem.slice(region(0), 3000),
        sim.node(1).mem.slice(src, 3000)
    );
    let sb = sim.node(1).ep.stats();
    assert_eq!(sb.duplicates, 1);
}

#[test]
fn duplicate_compare_swap_is_answered_from_the_cache() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let target = region(0) + 64;
    set_word(sim.node_mut(1), target, 5);
    sim.node_mut(1)
        .drop_next(1, |r| r.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE);
    let op = SendOp::CompareSwap {
        remote_addr: target,
        rkey: qb.rkey,
        compare: 5,
        swap: 9,
    };
    sim.node_mut(0).post(&qa, 1, op, region(0), 8, SIG).unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A COMPARE_SWAP 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1] DROPPED",
            "A COMPARE_SWAP 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    assert_eq!(times(&t), [0, D, period, period + D]);
    // Executed again, the compare would fail and answer 9. The cache
    // answers what the one execution saw.
    for p in t.borrow().iter().filter(|p| p.from == 1) {
        assert_eq!(p.repr.ext.atomic_ack_eth.unwrap().orig, 5);
    }
    let done = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(statuses(&done), [(1, WcStatus::Success)]);
    assert_eq!((done[0].opcode, done[0].byte_len), (WcOpcode::CompSwap, 8));
    assert_eq!(word(sim.node(0), region(0)), 5);
    assert_eq!(word(sim.node(1), target), 9);
    assert_eq!(sim.node(1).ep.stats().duplicates, 1);
}

#[test]
fn duplicate_fetch_add_adds_once() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let target = region(0) + 64;
    set_word(sim.node_mut(1), target, 40);
    // Lose the answer twice: two duplicates, one addition.
    sim.node_mut(1)
        .drop_next(2, |r| r.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE);
    let op = SendOp::FetchAdd {
        remote_addr: target,
        rkey: qb.rkey,
        add: 2,
    };
    sim.node_mut(0).post(&qa, 1, op, region(0), 8, SIG).unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A FETCH_ADD 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1] DROPPED",
            "A FETCH_ADD 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1] DROPPED",
            "A FETCH_ADD 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    assert_eq!(word(sim.node(0), region(0)), 40);
    assert_eq!(word(sim.node(1), target), 42);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn duplicate_send_is_acknowledged_again_and_delivered_once() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let b = sim.node_mut(1);
    b.post_recv(&qb, 70, region(0), 4096);
    b.post_recv(&qb, 71, region(0) + 4096, 4096);
    b.drop_next(1, |r| r.bth.opcode == Opcode::RC_ACKNOWLEDGE);
    pattern(sim.node_mut(0), region(0), 2000, 3);
    sim.node_mut(0)
        .post(
            &qa,
            1,
            SendOp::SendWithImm { imm: 0x1234 },
            region(0),
            2000,
            SIG,
        )
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A SEND_FIRST 100",
            "A SEND_LAST_IMMEDIATE 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=1] DROPPED",
            "A SEND_FIRST 100",
            "A SEND_LAST_IMMEDIATE 101 ackreq",
            // Each duplicate is answered with an ACK for all received so
            // far, AckReq or not (C9-105, as rxe does).
            "B ACKNOWLEDGE 101 [ACK msn=1]",
            "B ACKNOWLEDGE 101 [ACK msn=1]",
        ]
    );
    assert_eq!(times(&t), [0, 0, D, period, period, period + D, period + D]);
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!((rc[0].byte_len, rc[0].imm_or_inv), (2000, 0x1234));
    assert_eq!(sim.node(1).ep.stats().duplicates, 2);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn duplicated_write_on_the_wire_is_acknowledged_and_not_rewritten() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    sim.node_mut(0).record = true;
    let dst = region(0) + 8192;
    pattern(sim.node_mut(0), region(0), 100, 4);
    let op = SendOp::WriteWithImm {
        remote_addr: dst,
        rkey: qb.rkey,
        imm: 7,
    };
    sim.node_mut(1).post_recv(&qb, 70, region(0), 0);
    sim.node_mut(1).post_recv(&qb, 71, region(0), 0);
    sim.node_mut(0)
        .post(&qa, 1, op, region(0), 100, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    // The network delivers the WRITE again, after the responder has moved
    // on and the target memory has changed.
    sim.node_mut(1).mem.slice_mut(dst, 100).fill(0xee);
    let copy = sim.node(0).sent[0].clone();
    let r = PacketRepr::parse(&Packet::new_checked(&copy[..]).unwrap()).unwrap();
    assert_eq!(r.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
    sim.inject(0, 1, &copy);
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY_IMMEDIATE 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    assert!(sim.node(1).mem.slice(dst, 100).iter().all(|&b| b == 0xee));
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!(rc[0].opcode, WcOpcode::RecvRdmaWithImm);
    // The late ACK is stale to the requester and changes nothing.
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn replays_do_not_count_against_max_dest_rd_atomic() {
    // A requester that times out while its READ's responses are still
    // queued at the responder asks for them again. The replay is not a new
    // READ: the responder must still take the atomic that follows, with
    // max_dest_rd_atomic 2 (one READ and one atomic outstanding).
    let o = Opts {
        rd_atomic: 2,
        ..Default::default()
    };
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let target = region(0) + 64;
    set_word(sim.node_mut(1), target, 40);
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: region(0) + 4096,
        rkey: qb.rkey,
    };
    a.post(&qa, 1, read, region(0) + 8192, 4000, SIG).unwrap();
    let fa = SendOp::FetchAdd {
        remote_addr: target,
        rkey: qb.rkey,
        add: 2,
    };
    a.post(&qa, 2, fa, region(0), 8, SIG).unwrap();
    let first = a.take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &first),
        ["A READ_REQUEST 100 ackreq", "A FETCH_ADD 104 ackreq"]
    );
    a.handle_timeout_at(period);
    let again = a.take(period, usize::MAX);
    assert_eq!(
        describe_all(0, &again),
        ["A READ_REQUEST 100 ackreq", "A FETCH_ADD 104 ackreq"]
    );
    // The responder gets the READ, its duplicate, then the atomic, before
    // it has sent anything.
    let b = sim.node_mut(1);
    b.deliver(period, 0, &first[0]);
    b.deliver(period, 0, &again[0]);
    b.deliver(period, 0, &first[1]);
    b.deliver(period, 0, &again[1]);
    let out = b.take(period, usize::MAX);
    assert_eq!(
        describe_all(1, &out),
        [
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B READ_RESPONSE_MIDDLE 102",
            "B READ_RESPONSE_LAST 103 [ACK msn=1]",
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B READ_RESPONSE_MIDDLE 102",
            "B READ_RESPONSE_LAST 103 [ACK msn=1]",
            "B ATOMIC_ACKNOWLEDGE 104 [ACK msn=2]",
            "B ATOMIC_ACKNOWLEDGE 104 [ACK msn=2]",
        ]
    );
    assert_eq!(word(sim.node(1), target), 42);
    let a = sim.node_mut(0);
    for p in &out {
        a.deliver(period, 1, p);
    }
    assert_eq!(
        statuses(&a.poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(word(sim.node(0), region(0)), 40);
}

/// A duplicate READ is answered only within the PSNs its original's
/// response took: one whose length would run past them (into the PSNs of
/// later requests, or around the PSN space: up to 2^24 packets for one
/// forged request) is not answered. A retry from the middle of the
/// original, for what is left of it, is.
#[test]
fn a_duplicate_read_longer_than_its_original_is_not_answered() {
    let o = Opts::default();
    let (mut sim, qa, qb, _t) = setup(&o);
    let src = region(0) + 4096;
    pattern(sim.node_mut(1), src, 3000, 1);
    let op = SendOp::Read {
        remote_addr: src,
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, op, region(0), 3000, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    // The READ took PSNs 100..=102 (1024-byte MTU). Duplicates of it:
    let dup = |psn: u32, va: u64, len: u32| read_request(&qb, psn, va, qb.rkey, len);
    let b = sim.node_mut(1);
    let mut ask = |r: &PacketRepr| {
        b.deliver(0, 0, &forge(0, 1, r, &[]));
        describe_all(1, &b.take(0, usize::MAX))
    };
    // From PSN 101, for the original's last 1976 bytes: replayed.
    assert_eq!(
        ask(&dup(101, src + 1024, 1976)),
        [
            "B READ_RESPONSE_FIRST 101 [ACK msn=1]",
            "B READ_RESPONSE_LAST 102 [ACK msn=1]"
        ]
    );
    // From PSN 101 for 64 KiB (64 packets, PSNs 101..=164, inside the
    // region): not answered.
    assert_eq!(ask(&dup(101, src, 64 << 10)), Vec::<String>::new());
    // From PSN 100 for 3 packets: replayed.
    assert_eq!(ask(&dup(100, src, 3000)).len(), 3);
}
