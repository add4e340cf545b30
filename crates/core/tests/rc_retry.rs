//! RC retransmission, packet by packet: the local ACK timeout, RNR NAKs and
//! PSN sequence NAKs, their retry budgets, go-back-N inside multi-packet
//! messages, PSN wraparound and ACKs for PSNs never sent.
//!
//! Links are perfect and instant; losses are drop rules on the sending host,
//! so every exchange here is one exact sequence of packets at exact virtual
//! times.

mod support;

use softrdma_core::qp::attr::{local_ack_timeout_ns, rnr_timer_ns};
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_wire::bth::{BthRepr, DEFAULT_PKEY};
use softrdma_wire::ext::{AethRepr, Syndrome};
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::{Opcode, PacketRepr, Psn};
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;

/// One-way link delay (the simulator's default).
const D: u64 = US;

/// Two connected hosts whose every datagram is traced.
fn setup(o: &Opts) -> (softrdma_netsim::Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, 8 << 20, o);
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

fn write(remote: u64, q: &QpEnd) -> SendOp {
    SendOp::Write {
        remote_addr: remote,
        rkey: q.rkey,
    }
}

fn read(remote: u64, q: &QpEnd) -> SendOp {
    SendOp::Read {
        remote_addr: remote,
        rkey: q.rkey,
    }
}

fn times(t: &Trace) -> Vec<u64> {
    t.borrow().iter().map(|p| p.t).collect()
}

#[test]
fn ack_timeout_retry_not_exceeded() {
    let o = Opts {
        retry_cnt: 3,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    assert_eq!(period, 4096 << 10);
    let a = sim.node_mut(0);
    a.drop_next(3, |r| r.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY);
    a.post(&qa, 1, write(region(1), &qb), region(0), 100, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq DROPPED",
            "A WRITE_ONLY 100 ackreq DROPPED",
            "A WRITE_ONLY 100 ackreq DROPPED",
            "A WRITE_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    // Each retransmission leaves exactly one timeout after the one before.
    assert_eq!(
        times(&t),
        [0, period, 2 * period, 3 * period, 3 * period + D]
    );
    let done = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(statuses(&done), [(1, WcStatus::Success)]);
    let st = sim.node(0).ep.stats();
    assert_eq!((st.timeouts, st.retransmits), (3, 3));
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn ack_timeout_retry_exceeded_fails_the_wr_and_flushes_the_rest() {
    let o = Opts {
        retry_cnt: 2,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    a.drop_next(usize::MAX, |_| true);
    a.post(&qa, 1, write(region(1), &qb), region(0), 100, SIG)
        .unwrap();
    a.post(&qa, 2, write(region(1), &qb), region(0), 100, SIG)
        .unwrap();
    a.post(&qa, 3, SendOp::Send, region(0), 10, SendFlags::default())
        .unwrap();
    let end = sim.run_until_idle(10 * SEC).unwrap();
    // One first transmission and retry_cnt retransmissions of the window;
    // the next timeout ends it.
    let round = [
        "A WRITE_ONLY 100 ackreq DROPPED",
        "A WRITE_ONLY 101 ackreq DROPPED",
        "A SEND_ONLY 102 ackreq DROPPED",
    ];
    assert_eq!(lines(&t), round.repeat(3));
    assert_eq!(
        times(&t),
        [
            0,
            0,
            0,
            period,
            period,
            period,
            2 * period,
            2 * period,
            2 * period
        ]
    );
    assert_eq!(end, 3 * period);
    let done = sim.node_mut(0).poll_cq(qa.scq);
    // Unsignaled WRs are flushed too: an error completion is always reported.
    assert_eq!(
        statuses(&done),
        [
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
    // The responder saw nothing and is still fine.
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Rts);
    assert_eq!(sim.node(0).ep.stats().timeouts, 3);
}

#[test]
fn retry_budget_is_refilled_by_progress() {
    // retry_cnt 1: each loss below uses the whole budget, so the second
    // one succeeds only if the ACK in between refilled it.
    let o = Opts {
        retry_cnt: 1,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(100));
    a.post(&qa, 1, write(region(1), &qb), region(0), 100, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(101));
    a.post(&qa, 2, write(region(1), &qb), region(0), 100, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq DROPPED",
            "A WRITE_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "A WRITE_ONLY 101 ackreq DROPPED",
            "A WRITE_ONLY 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
    // The second WRITE is posted when the first ACK arrives, at P + 2D.
    assert_eq!(
        times(&t),
        [
            0,
            period,
            period + D,
            period + 2 * D,
            2 * period + 2 * D,
            2 * period + 3 * D
        ]
    );
    let done = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(
        statuses(&done),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn rnr_retry_not_exceeded() {
    let o = Opts {
        rnr_retry: 3,
        min_rnr_timer: 4, // 40 µs
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let rnr = rnr_timer_ns(4);
    assert_eq!(rnr, 40 * US);
    pattern(sim.node_mut(0), region(0), 300, 3);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, region(0), 300, SIG)
        .unwrap();
    // Two RNR NAKs, then a receive appears before the third try.
    sim.run_until(rnr + rnr / 2);
    sim.node_mut(1).post_recv(&qb, 7, region(2), 4096);
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A SEND_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [RNR-NAK timer=4 msn=0]",
            "A SEND_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [RNR-NAK timer=4 msn=0]",
            "A SEND_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    // The back-off runs from the NAK's arrival, one round trip after the send.
    let rtt = 2 * D;
    assert_eq!(
        times(&t),
        [
            0,
            D,
            rtt + rnr,
            rtt + rnr + D,
            2 * (rtt + rnr),
            2 * (rtt + rnr) + D
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!((rc[0].wr_id, rc[0].byte_len), (7, 300));
    assert_eq!(
        sim.node(1).mem.slice(region(2), 300),
        sim.node(0).mem.slice(region(0), 300)
    );
    assert_eq!(sim.node(1).ep.stats().rnr_naks_sent, 2);
    assert_eq!(sim.node(0).ep.stats().rnr_naks_rcvd, 2);
}

#[test]
fn rnr_retry_exceeded() {
    let o = Opts {
        rnr_retry: 2,
        min_rnr_timer: 4,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let rnr = rnr_timer_ns(4);
    let a = sim.node_mut(0);
    a.post(&qa, 1, SendOp::Send, region(0), 300, SIG).unwrap();
    a.post(&qa, 2, write(region(1), &qb), region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    // The WRITE behind the SEND goes out, is ignored while the responder
    // waits for a receive, and goes out again after each back-off.
    let round = [
        "A SEND_ONLY 100 ackreq",
        "A WRITE_ONLY 101 ackreq",
        "B ACKNOWLEDGE 100 [RNR-NAK timer=4 msn=0]",
    ];
    assert_eq!(lines(&t), round.repeat(3));
    let r = 2 * D + rnr;
    assert_eq!(times(&t), [0, 0, D, r, r, r + D, 2 * r, 2 * r, 2 * r + D]);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn rnr_retry_7_retries_forever() {
    let o = Opts {
        rnr_retry: 7,
        min_rnr_timer: 1, // 10 µs
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    sim.node_mut(0)
        .post(&qa, 1, SendOp::Send, region(0), 1, SIG)
        .unwrap();
    // Far more RNR NAKs than any finite budget allows.
    sim.run_while(SEC, |s| s.node(1).ep.stats().rnr_naks_sent < 100)
        .unwrap();
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Rts);
    sim.node_mut(1).post_recv(&qb, 7, region(2), 64);
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(lines(&t).last().unwrap(), "B ACKNOWLEDGE 100 [ACK msn=1]");
}

#[test]
fn sequence_nak_and_go_back_n_inside_a_multi_packet_write() {
    let o = Opts::default(); // MTU 1024
    let (mut sim, qa, qb, t) = setup(&o);
    let len = 4 * 1024 + 77;
    pattern(sim.node_mut(0), region(0), len as usize, 9);
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(102));
    a.post(&qa, 1, write(region(1), &qb), region(0), len, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_FIRST 100",
            "A WRITE_MIDDLE 101",
            "A WRITE_MIDDLE 102 DROPPED",
            "A WRITE_MIDDLE 103",
            "A WRITE_LAST 104 ackreq",
            // The NAK names the PSN the responder expects.
            "B ACKNOWLEDGE 102 [NAK-SEQ msn=0]",
            // Go back to it: the same opcodes, PSNs and bytes as the first time.
            "A WRITE_MIDDLE 102",
            "A WRITE_MIDDLE 103",
            "A WRITE_LAST 104 ackreq",
            "B ACKNOWLEDGE 104 [ACK msn=1]",
        ]
    );
    let tr = t.borrow();
    assert_eq!(tr[0].repr.ext.reth.unwrap().dma_len, len);
    for (orig, again) in [(2, 6), (3, 7), (4, 8)] {
        assert_eq!(tr[orig].payload, tr[again].payload);
        assert!(tr[again].repr.ext.reth.is_none());
    }
    assert_eq!(tr[8].payload.len(), 77);
    drop(tr);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(1).mem.slice(region(1), len as usize),
        sim.node(0).mem.slice(region(0), len as usize)
    );
    let (sa, sb) = (sim.node(0).ep.stats(), sim.node(1).ep.stats());
    assert_eq!((sb.seq_naks_sent, sa.seq_naks_rcvd), (1, 1));
    assert_eq!(sa.retransmits, 3);
    assert_eq!(sa.timeouts, 0);
}

#[test]
fn go_back_n_inside_a_read_response_stream() {
    let o = Opts::default(); // MTU 1024
    let (mut sim, qa, qb, t) = setup(&o);
    let len: u32 = 20 * 1024 - 5; // 20 responses
    pattern(sim.node_mut(1), region(1), len as usize, 4);
    sim.node_mut(1).drop_next(1, |r| r.bth.psn == Psn::new(102));
    sim.node_mut(0)
        .post(&qa, 1, read(region(1), &qb), region(0), len, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let l = lines(&t);
    let mut want = vec![
        "A READ_REQUEST 100 ackreq".to_string(),
        "B READ_RESPONSE_FIRST 100 [ACK msn=1]".into(),
        "B READ_RESPONSE_MIDDLE 101".into(),
        "B READ_RESPONSE_MIDDLE 102 DROPPED".into(),
    ];
    want.extend((103..119).map(|p| format!("B READ_RESPONSE_MIDDLE {p}")));
    want.push("B READ_RESPONSE_LAST 119 [ACK msn=1]".into());
    // The first response past the gap asks again, once, for exactly what
    // is missing: a new READ at the missing PSN for the remaining bytes.
    want.push("A READ_REQUEST 102 ackreq".into());
    want.push("B READ_RESPONSE_FIRST 102 [ACK msn=1]".into());
    want.extend((103..119).map(|p| format!("B READ_RESPONSE_MIDDLE {p}")));
    want.push("B READ_RESPONSE_LAST 119 [ACK msn=1]".into());
    assert_eq!(l, want);
    let tr = t.borrow();
    let again = tr.iter().filter(|p| p.from == 0).nth(1).unwrap();
    let reth = again.repr.ext.reth.unwrap();
    assert_eq!(reth.va, region(1) + 2048);
    assert_eq!(reth.dma_len, len - 2048);
    drop(tr);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(0).mem.slice(region(0), len as usize),
        sim.node(1).mem.slice(region(1), len as usize)
    );
    // One lost response costs one retry, however many follow it.
    assert_eq!(sim.node(0).ep.stats().retransmits, 1);
}

#[test]
fn implied_nak_resends_a_read_whose_response_was_lost() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    pattern(sim.node_mut(1), region(1), 64, 1);
    sim.node_mut(1)
        .drop_next(1, |r| r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    let a = sim.node_mut(0);
    a.post(&qa, 1, read(region(1), &qb), region(0), 64, SIG)
        .unwrap();
    a.post(&qa, 2, write(region(2), &qb), region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A READ_REQUEST 100 ackreq",
            "A WRITE_ONLY 101 ackreq",
            "B READ_RESPONSE_ONLY 100 [ACK msn=1] DROPPED",
            // This ACK says the READ was answered: its response was lost.
            "B ACKNOWLEDGE 101 [ACK msn=2]",
            "A READ_REQUEST 100 ackreq",
            "A WRITE_ONLY 101 ackreq",
            "B READ_RESPONSE_ONLY 100 [ACK msn=2]",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
    // No timer was needed.
    assert_eq!(sim.node(0).ep.stats().timeouts, 0);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(0).mem.slice(region(0), 64),
        sim.node(1).mem.slice(region(1), 64)
    );
}

#[test]
fn psn_wraparound_across_2_pow_24() {
    let o = Opts {
        psn_a: Psn::MASK - 1,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let len = 5 * 1024;
    pattern(sim.node_mut(0), region(0), len as usize, 5);
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(0));
    a.post(&qa, 1, write(region(1), &qb), region(0), len, SIG)
        .unwrap();
    a.post(&qa, 2, read(region(1), &qb), region(2), len, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_FIRST 16777214",
            "A WRITE_MIDDLE 16777215",
            "A WRITE_MIDDLE 0 DROPPED",
            "A WRITE_MIDDLE 1",
            "A WRITE_LAST 2 ackreq",
            "A READ_REQUEST 3 ackreq",
            "B ACKNOWLEDGE 0 [NAK-SEQ msn=0]",
            "A WRITE_MIDDLE 0",
            "A WRITE_MIDDLE 1",
            "A WRITE_LAST 2 ackreq",
            "A READ_REQUEST 3 ackreq",
            "B ACKNOWLEDGE 2 [ACK msn=1]",
            "B READ_RESPONSE_FIRST 3 [ACK msn=2]",
            "B READ_RESPONSE_MIDDLE 4",
            "B READ_RESPONSE_MIDDLE 5",
            "B READ_RESPONSE_MIDDLE 6",
            "B READ_RESPONSE_LAST 7 [ACK msn=2]",
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let want = sim.node(0).mem.slice(region(0), len as usize).to_vec();
    assert_eq!(sim.node(1).mem.slice(region(1), len as usize), &want[..]);
    assert_eq!(sim.node(0).mem.slice(region(2), len as usize), &want[..]);
}

/// An ACK as the responder would send it, for PSN `psn`.
fn ack(qa: &QpEnd, psn: u32, msn: u32) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            opcode: Opcode::RC_ACKNOWLEDGE,
            solicited: false,
            migreq: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: qa.qpn,
            ack_req: false,
            psn: Psn::new(psn),
        },
        ext: ExtRepr {
            aeth: Some(AethRepr::new(Syndrome::ACK_UNLIMITED, msn)),
            ..Default::default()
        },
        payload_len: 0,
    }
}

#[test]
fn ghost_ack_for_a_psn_never_sent_is_ignored() {
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    a.drop_next(1, |_| true);
    a.post(&qa, 1, write(region(1), &qb), region(0), 8, SIG)
        .unwrap();
    sim.run_until(10 * US);
    // PSN 100 is outstanding. ACKs for 101 (the next PSN, not sent yet) and
    // far beyond it acknowledge nothing.
    for psn in [101, 5000, 101 + (1 << 22)] {
        sim.inject(1, 0, &forge(1, 0, &ack(&qa, psn, 1), &[]));
    }
    sim.run_until(20 * US);
    assert_eq!(sim.node(0).ep.stats().ghost_acks, 3);
    assert!(sim.node_mut(0).poll_cq(qa.scq).is_empty());
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Rts);
    // The timer still runs and the WRITE completes the ordinary way.
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq DROPPED",
            "A WRITE_ONLY 100 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
        ]
    );
    assert_eq!(times(&t), [0, period, period + D]);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn ack_timer_runs_from_the_last_send_after_progress() {
    // The timer restarts when an ACK makes progress: a packet lost after
    // that is resent one full timeout after the ACK, not after the first send.
    let o = Opts::default();
    let (mut sim, qa, qb, t) = setup(&o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    sim.set_default_link(softrdma_netsim::LinkConfig::default().delay(10 * US));
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(101));
    a.post(&qa, 1, write(region(1), &qb), region(0), 8, SIG)
        .unwrap();
    a.post(&qa, 2, write(region(1), &qb), region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq",
            "A WRITE_ONLY 101 ackreq DROPPED",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "A WRITE_ONLY 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
    let rtt = 20 * US;
    assert_eq!(
        times(&t),
        [0, 0, 10 * US, rtt + period, rtt + period + 10 * US]
    );
}

// ---- Go-back-N meeting late acknowledgements --------------------------------
//
// An IO layer interleaves sending and receiving, so an ACK for the first
// transmission can arrive while go-back-N is part way through resending.
// These carry packets by hand to make exactly that happen.

#[test]
fn late_ack_retiring_the_wqe_being_resent_moves_the_requester_to_the_next() {
    let o = Opts::default(); // MTU 1024
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(region(0) + 8192, &qb), region(0), 3000, SIG)
        .unwrap();
    a.post(&qa, 2, write(region(0) + 8192, &qb), region(0), 8, SIG)
        .unwrap();
    let first = a.take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &first),
        [
            "A WRITE_FIRST 100",
            "A WRITE_MIDDLE 101",
            "A WRITE_LAST 102 ackreq",
            "A WRITE_ONLY 103 ackreq"
        ]
    );
    // Nothing acknowledged in time: go back to 100, and send one packet.
    a.handle_timeout_at(period);
    let resent = a.take(period, 1);
    assert_eq!(describe_all(0, &resent), ["A WRITE_FIRST 100"]);
    // Now the first WRITE's original packets reach the responder, and its
    // ACK reaches the requester while it is inside that WRITE.
    let b = sim.node_mut(1);
    for p in &first[..3] {
        b.deliver(period, 0, p);
    }
    let acks = b.take(period, usize::MAX);
    assert_eq!(describe_all(1, &acks), ["B ACKNOWLEDGE 102 [ACK msn=1]"]);
    let a = sim.node_mut(0);
    a.deliver(period, 1, &acks[0]);
    // The requester goes on with the go-back-N from the second WRITE's
    // first (only) packet — not from the packet index it had reached
    // inside the first.
    let next = a.take(period, usize::MAX);
    assert_eq!(describe_all(0, &next), ["A WRITE_ONLY 103 ackreq"]);
    let b = sim.node_mut(1);
    b.deliver(period, 0, &next[0]);
    let acks = b.take(period, usize::MAX);
    assert_eq!(describe_all(1, &acks), ["B ACKNOWLEDGE 103 [ACK msn=2]"]);
    let a = sim.node_mut(0);
    a.deliver(period, 1, &acks[0]);
    assert_eq!(
        statuses(&a.poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(a.take(period, usize::MAX).is_empty());
}

#[test]
fn late_ack_inside_a_message_moves_the_requester_past_acknowledged_psns() {
    let o = Opts::default(); // MTU 1024
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let period = local_ack_timeout_ns(o.timeout).unwrap();
    let a = sim.node_mut(0);
    a.post(
        &qa,
        1,
        write(region(0) + 8192, &qb),
        region(0),
        6 * 1024,
        SIG,
    )
    .unwrap();
    let first = a.take(0, usize::MAX);
    assert_eq!(first.len(), 6);
    a.handle_timeout_at(period);
    assert_eq!(describe_all(0, &a.take(period, 1)), ["A WRITE_FIRST 100"]);
    // The responder gets 100..=103 and then a duplicate of 101, which it
    // answers by acknowledging all it has: PSN 103, in mid-message.
    let b = sim.node_mut(1);
    for p in [&first[0], &first[1], &first[2], &first[3], &first[1]] {
        b.deliver(period, 0, p);
    }
    let acks = b.take(period, usize::MAX);
    assert_eq!(describe_all(1, &acks), ["B ACKNOWLEDGE 103 [ACK msn=0]"]);
    let a = sim.node_mut(0);
    a.deliver(period, 1, &acks[0]);
    // Resending goes on at once from 104, not from 101 (which would also be
    // outside the window, stalling until the next timeout).
    let next = a.take(period, usize::MAX);
    assert_eq!(
        describe_all(0, &next),
        ["A WRITE_MIDDLE 104", "A WRITE_LAST 105 ackreq"]
    );
    let b = sim.node_mut(1);
    for p in &next {
        b.deliver(period, 0, p);
    }
    let acks = b.take(period, usize::MAX);
    let a = sim.node_mut(0);
    a.deliver(period, 1, &acks[0]);
    assert_eq!(statuses(&a.poll_cq(qa.scq)), [(1, WcStatus::Success)]);
    assert_eq!(a.ep.stats().timeouts, 1);
}
