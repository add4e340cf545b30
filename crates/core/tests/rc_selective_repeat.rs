//! Selective repeat between two softrdma endpoints, packet by packet: the
//! negotiation in the first packets (and the fallback to go-back-N against
//! a responder that does not answer it), a lost packet resent alone while
//! what followed it is held and then executed in order, a lost resend, a
//! lost tail probed by the timer, and the pool's accounting.
//!
//! Links are perfect with a 1 µs delay; losses are drop rules on the sending
//! host, so every exchange is one exact sequence of packets. " sr" in a
//! line is the capability bit (BTH byte 4, bit 0).

mod support;

use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_wire::Psn;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;

fn sr() -> Opts {
    Opts {
        selective_repeat: true,
        ..Default::default()
    }
}

fn write(remote: u64, q: &QpEnd) -> SendOp {
    SendOp::Write {
        remote_addr: remote,
        rkey: q.rkey,
    }
}

/// An 8-packet WRITE (MTU 1024) from A to B, with `drops` applied to A's
/// packets; returns the trace once idle, after checking the completion and
/// every byte. `warmup` one-packet WRITEs go first (PSNs 100, 101, ...): the
/// first settles the negotiation, the second is timed for the round-trip
/// estimate; the 8 packets follow them. Without, they are 100..=107 and
/// the first answer comes back during recovery.
fn eight_packet_write(
    o: &Opts,
    warmup: usize,
    drops: &[(usize, u32)],
) -> (Vec<String>, softrdma_netsim::Sim<Host>) {
    let (mut sim, qa, qb) = pair(1, 8 << 20, o);
    let t = trace(&mut sim, &[0, 1]);
    let len = 8 * 1024;
    pattern(sim.node_mut(0), region(0), len, 3);
    for w in 0..warmup {
        let a = sim.node_mut(0);
        a.post(
            &qa,
            50 + w as u64,
            write(region(2), &qb),
            region(0),
            1024,
            SIG,
        )
        .unwrap();
        sim.run_until_idle(SEC).unwrap();
        assert_eq!(
            lines(&t),
            [
                format!("A WRITE_ONLY {} ackreq sr", 100 + w),
                format!("B ACKNOWLEDGE {} [ACK msn={}] sr", 100 + w, 1 + w)
            ]
        );
        t.borrow_mut().clear();
        assert_eq!(
            statuses(&sim.node_mut(0).poll_cq(qa.scq)),
            [(50 + w as u64, WcStatus::Success)]
        );
    }
    let a = sim.node_mut(0);
    for &(times, psn) in drops {
        a.drop_next(times, move |r| r.bth.psn == Psn::new(psn));
    }
    a.post(&qa, 1, write(region(1), &qb), region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(0).mem.slice(region(0), len),
        sim.node(1).mem.slice(region(1), len)
    );
    assert_eq!(sim.node(1).ep.held_packets(), 0, "every held buffer back");
    (lines(&t), sim)
}

#[test]
fn a_lost_packet_is_resent_alone_and_what_followed_it_is_held() {
    let (l, sim) = eight_packet_write(&sr(), 0, &[(1, 102)]);
    assert_eq!(
        l,
        [
            "A WRITE_FIRST 100 sr",
            "A WRITE_MIDDLE 101 sr",
            "A WRITE_MIDDLE 102 sr DROPPED",
            "A WRITE_MIDDLE 103 sr",
            "A WRITE_MIDDLE 104 sr",
            "A WRITE_MIDDLE 105 sr",
            "A WRITE_MIDDLE 106 sr",
            "A WRITE_LAST 107 ackreq sr",
            // Three requests wait behind the gap: NAK it, naming the one
            // that prompted the NAK (in the MSN field, between peers that
            // negotiated selective repeat) — and again for 107, which asked
            // for an ACK.
            "B ACKNOWLEDGE 102 [NAK-SEQ msn=105] sr",
            "B ACKNOWLEDGE 102 [NAK-SEQ msn=107] sr",
            // 102 alone, asking for the ACK that says what B lacks next;
            // the second NAK was prompted by a request sent before the
            // resend and costs nothing.
            "A WRITE_MIDDLE 102 ackreq sr",
            // 103..107 were held and now run in order: one ACK for all.
            "B ACKNOWLEDGE 107 [ACK msn=1] sr",
        ]
    );
    let (a, b) = (sim.node(0).ep.stats(), sim.node(1).ep.stats());
    assert_eq!((a.retransmits, a.timeouts), (1, 0));
    assert_eq!((b.held_out_of_order, b.hold_dropped), (5, 0));
}

#[test]
fn a_responder_that_does_not_accept_gets_go_back_n() {
    // A offers; B (as rxe would) answers without the bit: A withdraws the
    // offer from its next packet on and recovers by go-back-N.
    let (mut sim, qa, qb) = pair_with(1, 8 << 20, &sr(), |n, ep| {
        if n == 1 {
            ep.set_selective_repeat(false);
        }
    });
    let t = trace(&mut sim, &[0, 1]);
    let len = 4 * 1024;
    pattern(sim.node_mut(0), region(0), len, 5);
    let a = sim.node_mut(0);
    a.post(&qa, 1, write(region(1), &qb), region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(105));
    a.post(&qa, 2, write(region(1), &qb), region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_FIRST 100 sr",
            "A WRITE_MIDDLE 101 sr",
            "A WRITE_MIDDLE 102 sr",
            "A WRITE_LAST 103 ackreq sr",
            "B ACKNOWLEDGE 103 [ACK msn=1]",
            // The offer is gone, and so is selective repeat.
            "A WRITE_FIRST 104",
            "A WRITE_MIDDLE 105 DROPPED",
            "A WRITE_MIDDLE 106",
            "A WRITE_LAST 107 ackreq",
            "B ACKNOWLEDGE 105 [NAK-SEQ msn=1]",
            "A WRITE_MIDDLE 105",
            "A WRITE_MIDDLE 106",
            "A WRITE_LAST 107 ackreq",
            "B ACKNOWLEDGE 107 [ACK msn=2]",
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(sim.node(1).ep.stats().held_out_of_order, 0);
}

#[test]
fn a_lost_resend_is_found_by_the_timer_which_resends_it_alone() {
    // 102 is lost twice. The NAKs prompted by requests sent before the
    // resend cost nothing; nothing is sent after it, so the retransmission
    // timer finds the loss, and resends 102 alone again.
    let (l, sim) = eight_packet_write(&sr(), 1, &[(2, 103)]);
    assert_eq!(
        l[8..],
        [
            "B ACKNOWLEDGE 103 [NAK-SEQ msn=106] sr",
            "B ACKNOWLEDGE 103 [NAK-SEQ msn=108] sr",
            "A WRITE_MIDDLE 103 ackreq sr DROPPED",
            "A WRITE_MIDDLE 103 ackreq sr",
            "B ACKNOWLEDGE 108 [ACK msn=2] sr",
        ]
    );
    let a = sim.node(0).ep.stats();
    // One timeout, and the window was not halved for it.
    assert_eq!((a.retransmits, a.timeouts, a.window_backoffs), (2, 1, 0));
}

#[test]
fn a_lost_tail_is_probed_then_resent_by_go_back_n() {
    // The last two packets are lost: B holds nothing, so nothing is NAKed.
    // The timer resends the oldest unacknowledged packet (101: only 108
    // asked for an ACK) alone; B's plain ACK says what it has and that it
    // holds nothing after (else it would NAK the gap), so the rest goes
    // again from there.
    let (l, sim) = eight_packet_write(&sr(), 1, &[(1, 107), (1, 108)]);
    assert_eq!(
        l[6..],
        [
            "A WRITE_MIDDLE 107 sr DROPPED",
            "A WRITE_LAST 108 ackreq sr DROPPED",
            "A WRITE_FIRST 101 ackreq sr",
            "B ACKNOWLEDGE 106 [ACK msn=1] sr",
            "A WRITE_MIDDLE 107 sr",
            "A WRITE_LAST 108 ackreq sr",
            "B ACKNOWLEDGE 108 [ACK msn=2] sr",
        ]
    );
    assert_eq!(sim.node(0).ep.stats().timeouts, 1);
}

#[test]
fn held_packets_go_back_to_the_pool_when_the_qp_goes() {
    let (mut sim, qa, qb) = pair(1, 8 << 20, &sr());
    let a = sim.node_mut(0);
    a.drop_next(usize::MAX, |r| r.bth.psn == Psn::new(100));
    a.post(&qa, 1, write(region(1), &qb), region(0), 8 * 1024, SIG)
        .unwrap();
    sim.run_while(SEC, |s| s.node(1).ep.held_packets() < 7)
        .unwrap();
    assert_eq!(sim.node(1).ep.held_packets(), 7);
    sim.node_mut(1).ep.destroy_qp(qb.qpn).unwrap();
    assert_eq!(sim.node(1).ep.held_packets(), 0);
}

#[test]
fn a_lost_resend_is_found_one_measured_round_trip_later() {
    // The second warm-up WRITE is timed: a 2 µs round trip. 104 is lost
    // twice; the resend's answer is overdue after SRTT + 4 RTTVAR (6 µs),
    // long before the 4.2 ms ACK timeout, and 104 goes again, alone.
    let (l, sim) = eight_packet_write(&sr(), 2, &[(2, 104)]);
    assert_eq!(
        l[8..],
        [
            "B ACKNOWLEDGE 104 [NAK-SEQ msn=107] sr",
            "B ACKNOWLEDGE 104 [NAK-SEQ msn=109] sr",
            "A WRITE_MIDDLE 104 ackreq sr DROPPED",
            "A WRITE_MIDDLE 104 ackreq sr",
            "B ACKNOWLEDGE 109 [ACK msn=3] sr",
        ]
    );
    let a = sim.node(0).ep.stats();
    assert_eq!((a.retransmits, a.resend_timeouts, a.timeouts), (2, 1, 0));
}

/// A request held ahead of the expected PSN inside the PSN range a READ
/// then takes (nothing a requester sends belongs there: a forged or broken
/// peer) is given back when the READ moves the expected PSN past it. It is
/// never executed WINDOW (256) PSNs later in place of the request that
/// shares its slot, which would write old bytes and move the expected PSN
/// back, wedging the connection.
#[test]
fn a_request_held_inside_a_reads_psn_range_is_dropped_not_run_later() {
    use softrdma_wire::bth::SOFTRDMA_SR;
    use softrdma_wire::ext::RethRepr;
    use softrdma_wire::packet::ExtRepr;
    use softrdma_wire::{Opcode, PacketRepr};

    fn req(qb: &QpEnd, op: Opcode, psn: u32, ack: bool, reth: RethRepr, len: usize) -> PacketRepr {
        let ext = ExtRepr {
            reth: Some(reth),
            ..Default::default()
        };
        request(qb, op, psn, ack, ext, len)
    }
    fn send(b: &mut Host, repr: &PacketRepr, payload: &[u8]) -> Vec<String> {
        let mut bytes = forge(0, 1, repr, payload);
        bytes[4] |= SOFTRDMA_SR; // the capability bit, masked by the ICRC
        b.deliver(0, 0, &bytes);
        describe_all(1, &b.take(0, usize::MAX))
    }

    let (mut sim, _qa, qb) = pair(1, 8 << 20, &sr());
    let b = sim.node_mut(1);
    let w = |va: u64| RethRepr {
        va,
        rkey: qb.rkey,
        dma_len: 8,
    };
    // B expects PSN 100. A 4 KiB READ at 101 (its response: 101..=104) is
    // held, and so is a WRITE at 102, inside the READ's range.
    let rd = RethRepr {
        va: region(1),
        rkey: qb.rkey,
        dma_len: 4096,
    };
    send(
        b,
        &req(&qb, Opcode::RC_RDMA_READ_REQUEST, 101, false, rd, 0),
        &[],
    );
    send(
        b,
        &req(&qb, Opcode::RC_RDMA_WRITE_ONLY, 102, true, w(region(2)), 8),
        b"STALE!!!",
    );
    // 100 fills the gap: it and the READ run; the expected PSN is 105 and
    // nothing is held any more (no gap to NAK).
    let r = send(
        b,
        &req(&qb, Opcode::RC_RDMA_WRITE_ONLY, 100, true, w(region(3)), 8),
        b"firstpkt",
    );
    assert!(
        r.iter().all(|l| !l.contains("NAK")),
        "no gap remains after the READ: {r:?}"
    );
    assert_eq!(b.mem.slice(region(2), 8), [0u8; 8]);
    // In-order WRITEs 105..=357, then 358, whose slot the stale 102 had.
    for psn in 105..=358 {
        let va = if psn == 358 { region(5) } else { region(4) };
        let r = send(
            b,
            &req(&qb, Opcode::RC_RDMA_WRITE_ONLY, psn, psn >= 357, w(va), 8),
            if psn == 358 { b"real-358" } else { b"legit..." },
        );
        if psn >= 357 {
            assert_eq!(
                r,
                [format!("B ACKNOWLEDGE {psn} [ACK msn={}] sr", psn - 102)]
            );
        }
    }
    assert_eq!(
        b.mem.slice(region(2), 8),
        [0u8; 8],
        "the stale WRITE never ran"
    );
    assert_eq!(b.mem.slice(region(5), 8), *b"real-358");
}

/// A QP whose peer is reached through shared-memory rings goes back N
/// (`Endpoint::set_qp_selective_repeat(false)`, set by the engine before
/// RTR): with selective repeat on in both endpoints, neither side offers or
/// accepts it, and a lost packet is recovered by resending everything from
/// it, nothing held.
#[test]
fn a_qp_with_selective_repeat_turned_off_goes_back_n() {
    let (mut sim, qa, qb) = pair_with_qps(
        1,
        8 << 20,
        &sr(),
        |_, _| {},
        |ep, q| ep.set_qp_selective_repeat(q.qpn, false).unwrap(),
    );
    let t = trace(&mut sim, &[0, 1]);
    let len = 4 * 1024;
    pattern(sim.node_mut(0), region(0), len, 7);
    let h = sim.node_mut(0);
    h.drop_next(1, |r| r.bth.psn == Psn::new(101));
    h.post(&qa, 1, write(region(1), &qb), region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_FIRST 100",
            "A WRITE_MIDDLE 101 DROPPED",
            "A WRITE_MIDDLE 102",
            "A WRITE_LAST 103 ackreq",
            "B ACKNOWLEDGE 101 [NAK-SEQ msn=0]",
            "A WRITE_MIDDLE 101",
            "A WRITE_MIDDLE 102",
            "A WRITE_LAST 103 ackreq",
            "B ACKNOWLEDGE 103 [ACK msn=1]",
        ]
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(sim.node(1).ep.stats().held_out_of_order, 0);
    assert_eq!(
        sim.node_mut(1).mem.slice_mut(region(1), len).to_vec(),
        sim.node_mut(0).mem.slice_mut(region(0), len).to_vec(),
        "the WRITE's bytes"
    );
}
