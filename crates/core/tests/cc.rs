//! Congestion control in the core: the notification point answers ECN-CE
//! with a CNP exactly as RNICs send it, at most one per interval, and the
//! reaction point cuts the sender's rate when it arrives.

mod support;

use softrdma_core::cc::{dcqcn, CcConfig, Controller};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::RxMeta;
use softrdma_netsim::Sim;
use softrdma_wire::Packet;
use support::*;

/// Node 1 (B) gets `pkts` from node 0 (A) at `at` and answers at once;
/// its ACKs reach A 1 µs later.
fn answer(sim: &mut Sim<Host>, pkts: &[Vec<u8>], at: u64) {
    let b = sim.node_mut(1);
    for p in pkts {
        b.deliver(at, 0, p);
    }
    let acks = b.take(at, 64);
    let a = sim.node_mut(0);
    for k in &acks {
        a.deliver(at + US, 1, k);
    }
}

const G100: u64 = 100_000_000_000;

fn meta(from: u32, to: u32, tc: u8) -> RxMeta {
    RxMeta {
        sgid: gid_of(from as usize),
        dgid: gid_of(to as usize),
        traffic_class: tc,
        hop_limit: 64,
    }
}

#[test]
fn ce_marked_requests_get_one_cnp_per_interval_and_the_sender_slows_down() {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    let cc = CcConfig::Dcqcn(dcqcn::Params::paper());
    for (n, q) in [(0, &qa), (1, &qb)] {
        sim.node_mut(n).ep.set_qp_cc(q.qpn, &cc, G100).unwrap();
    }
    assert_eq!(
        sim.node(0).ep.qp_gate(qa.qpn).unwrap().rate(),
        None,
        "starts at line rate"
    );
    // A 16-packet WRITE from A; B receives the first 8 marked CE, 1 µs apart.
    sim.node_mut(0)
        .post(
            &qa,
            1,
            SendOp::Write {
                remote_addr: MEM_BASE,
                rkey: qb.rkey,
            },
            MEM_BASE,
            16 * 1024,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let pkts = sim.node_mut(0).take(0, 64);
    assert_eq!(pkts.len(), 16);
    let mut cnps = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        let now = 1_000 * i as u64;
        let b = sim.node_mut(1);
        b.sync();
        let tc = if i < 8 { 0b11 } else { 0b10 };
        b.ep.handle_packet(now, &meta(0, 1, tc), p, &mut b.mem);
        for out in b.take(now, 8) {
            if out[0] == 0x81 {
                cnps.push((now, out));
            }
        }
    }
    // One CNP for the first marked packet; the next 7 fall inside the 50 µs
    // interval.
    assert_eq!(cnps.len(), 1, "{cnps:?}");
    let (_, cnp) = &cnps[0];
    // RoCEv2 A17.9.3 as RNICs send it: BTH 81 00 ff ff, BECN set, A's QPN,
    // PSN 0; 16 reserved zero bytes; ICRC.
    let q = qa.qpn.to_be_bytes();
    assert_eq!(
        &cnp[..12],
        &[0x81, 0, 0xff, 0xff, 0x40, q[1], q[2], q[3], 0, 0, 0, 0]
    );
    assert_eq!(&cnp[12..28], &[0u8; 16]);
    assert_eq!(cnp.len(), 32);
    Packet::new_checked(&cnp[..]).expect("a well-formed CNP");
    let st = sim.node(1).ep.stats();
    assert_eq!((st.ce_received, st.cnps_sent), (8, 1));

    // Marked again after the interval: a second CNP.
    let late = 60_000;
    sim.node_mut(0)
        .post(
            &qa,
            2,
            SendOp::Write {
                remote_addr: MEM_BASE,
                rkey: qb.rkey,
            },
            MEM_BASE,
            64,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let p = sim.node_mut(0).take(late, 4);
    let b = sim.node_mut(1);
    b.sync();
    b.ep.handle_packet(late, &meta(0, 1, 0b11), &p[0], &mut b.mem);
    assert!(b.take(late, 8).iter().any(|o| o[0] == 0x81));
    assert_eq!(b.ep.stats().cnps_sent, 2);

    // The CNP reaches A: its reaction point halves the rate (α = 1 at the
    // first CNP) and its gate paces at it.
    let a = sim.node_mut(0);
    a.sync();
    a.ep.handle_packet(2_000, &meta(1, 0, 0), cnp, &mut a.mem);
    assert_eq!(a.ep.stats().cnps_received, 1);
    assert_eq!(a.ep.qp_gate(qa.qpn).unwrap().rate(), Some(G100 / 2));
    let Some(Controller::Dcqcn(c)) = a.ep.qp_cc(qa.qpn).unwrap() else {
        panic!("DCQCN runs on the QP");
    };
    assert_eq!((c.cnps, c.cuts), (1, 1));
    // Its increase timer is armed with the QP's other deadlines: after 55 µs
    // fast recovery takes it halfway back.
    assert!(a.ep.poll_timeout().is_some_and(|t| t <= 2_000 + 55_000));
    a.ep.handle_timeout(2_000 + 55_000);
    assert_eq!(a.ep.qp_gate(qa.qpn).unwrap().rate(), Some(G100 / 4 * 3));
    a.ep.check_scheduler().unwrap();
}

#[test]
fn a_cnp_from_a_stranger_or_for_a_qp_without_cc_changes_nothing() {
    let (mut sim, qa, _qb) = pair(2, 1 << 16, &Opts::default());
    let mut cnp = vec![0x81, 0, 0xff, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0];
    cnp[5..8].copy_from_slice(&qa.qpn.to_be_bytes()[1..]);
    cnp.extend([0u8; 20]);
    let a = sim.node_mut(0);
    a.sync();
    // No controller on the QP: counted, ignored.
    a.ep.handle_packet(0, &meta(1, 0, 0), &cnp, &mut a.mem);
    assert_eq!(a.ep.qp_gate(qa.qpn).unwrap().rate(), None);
    a.ep.set_qp_cc(qa.qpn, &CcConfig::Dcqcn(dcqcn::Params::nvidia()), G100)
        .unwrap();
    // From a host that is not the QP's peer: ignored.
    a.ep.handle_packet(0, &meta(7, 0, 0), &cnp, &mut a.mem);
    assert_eq!(a.ep.qp_gate(qa.qpn).unwrap().rate(), None);
    assert_eq!(a.ep.stats().cnps_received, 2);
    // From the peer: cut.
    a.ep.handle_packet(0, &meta(1, 0, 0), &cnp, &mut a.mem);
    assert!(a.ep.qp_gate(qa.qpn).unwrap().rate().is_some());
    assert!(a.ep.set_qp_cc(qa.qpn, &CcConfig::None, 0).is_err());
}

#[test]
fn timely_times_one_new_psn_per_round_trip_and_asks_its_ack() {
    let (mut sim, qa, qb) = pair(3, 1 << 20, &Opts::default());
    let cc = CcConfig::Timely(softrdma_core::cc::timely::Params::timely());
    sim.node_mut(0).ep.set_qp_cc(qa.qpn, &cc, G100).unwrap();
    sim.node_mut(0)
        .post(
            &qa,
            1,
            SendOp::Write {
                remote_addr: MEM_BASE,
                rkey: qb.rkey,
            },
            MEM_BASE,
            8 * 1024,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let pkts = sim.node_mut(0).take(0, 64);
    assert_eq!(pkts.len(), 8);
    // The first packet is the probe: it asks for an ACK (AckReq, BTH byte 8).
    assert_ne!(pkts[0][8] & 0x80, 0, "the timed packet requests its ACK");
    assert_eq!(pkts[1][8] & 0x80, 0, "one probe at a time");
    let b = sim.node_mut(1);
    b.sync();
    b.ep.handle_packet(1_000, &meta(0, 1, 0), &pkts[0], &mut b.mem);
    let acks = b.take(1_000, 4);
    assert_eq!(acks.len(), 1);
    let a = sim.node_mut(0);
    a.sync();
    a.ep.handle_packet(30_000, &meta(1, 0, 0), &acks[0], &mut a.mem);
    let Some(Controller::Timely(t)) = a.ep.qp_cc(qa.qpn).unwrap() else {
        panic!("TIMELY runs on the QP");
    };
    assert_eq!(
        t.samples, 1,
        "the ACK covering the probe gave one RTT sample"
    );
    a.ep.check_scheduler().unwrap();
}

fn swift_cwnd(h: &Host, q: &QpEnd) -> (f64, u64) {
    let Some(Controller::Swift(s)) = h.ep.qp_cc(q.qpn).unwrap() else {
        panic!("Swift runs on the QP");
    };
    (s.cwnd(), s.samples)
}

fn write(h: &mut Host, qa: &QpEnd, qb: &QpEnd, wr_id: u64, len: u32) {
    h.post(
        qa,
        wr_id,
        SendOp::Write {
            remote_addr: MEM_BASE,
            rkey: qb.rkey,
        },
        MEM_BASE,
        len,
        SendFlags::SIGNALED,
    )
    .unwrap();
}

/// Karn's rule: a timed PSN that is resent after a NAK (not a timeout)
/// gives no RTT sample — the ACK that covers it answers the resend, and
/// the time since the first send holds the NAK's round trip and the wait
/// before it, not the path's delay.
#[test]
fn a_probe_resent_after_a_nak_gives_no_rtt_sample() {
    let (mut sim, qa, qb) = pair(4, 1 << 20, &Opts::default());
    let cc = CcConfig::Swift(softrdma_core::cc::swift::Params::default());
    sim.node_mut(0).ep.set_qp_cc(qa.qpn, &cc, G100).unwrap();
    let (cwnd0, _) = swift_cwnd(sim.node(0), &qa);
    write(sim.node_mut(0), &qa, &qb, 1, 4 * 1024);
    let pkts = sim.node_mut(0).take(0, 64);
    assert_eq!(pkts.len(), 4);
    // The first packet (the timed one) is lost; the rest make B NAK.
    let b = sim.node_mut(1);
    for p in &pkts[1..] {
        b.deliver(1_000, 0, p);
    }
    let naks = b.take(1_000, 8);
    assert!(!naks.is_empty());
    // The NAK reaches A late; A goes back and resends from the lost PSN.
    let late = 300 * US;
    let a = sim.node_mut(0);
    for n in &naks {
        a.deliver(late, 1, n);
    }
    let resent = a.take(late, 64);
    assert_eq!(resent.len(), 4, "go-back-N resends all four");
    // B answers the resend at once; its ACKs reach A 2 µs later.
    answer(&mut sim, &resent, late + US);
    let a = sim.node_mut(0);
    assert_eq!(
        a.poll_cq(qa.scq).len(),
        1,
        "the WRITE completed after the resend"
    );
    let (cwnd, samples) = swift_cwnd(a, &qa);
    assert_eq!(samples, 0, "no sample from a resent PSN");
    assert_eq!(cwnd, cwnd0, "no decrease from a 300 µs non-RTT");
    a.ep.check_scheduler().unwrap();
}

/// A PSN timed before the QP went through RESET belongs to the old
/// connection: the new connection's ACKs must not sample it.
#[test]
fn a_probe_from_before_a_reset_gives_no_rtt_sample() {
    use softrdma_core::qp::attr::{AttrMask, QpAttr};
    use softrdma_core::qp::state::QpState;
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(5, 1 << 20, &o);
    let cc = CcConfig::Swift(softrdma_core::cc::swift::Params::default());
    sim.node_mut(0).ep.set_qp_cc(qa.qpn, &cc, G100).unwrap();
    let (cwnd0, _) = swift_cwnd(sim.node(0), &qa);
    write(sim.node_mut(0), &qa, &qb, 1, 1024);
    assert_eq!(sim.node_mut(0).take(0, 8).len(), 1, "sent, never answered");
    // The application tears the connection down and builds it again with
    // the same PSNs (the peer never saw the packet).
    let a = sim.node_mut(0);
    for st in [QpState::Err, QpState::Reset] {
        let attr = QpAttr {
            qp_state: st,
            ..Default::default()
        };
        a.ep.modify_qp(qa.qpn, &attr, AttrMask::STATE).unwrap();
    }
    a.poll_cq(qa.scq);
    connect(a, &qa, &qb, o.psn_a, o.psn_b, &o);
    // A second later, a write whose ACK comes back in 2 µs.
    let t = SEC;
    write(sim.node_mut(0), &qa, &qb, 2, 1024);
    let pkts = sim.node_mut(0).take(t, 8);
    assert_eq!(pkts.len(), 1);
    answer(&mut sim, &pkts, t + US);
    let a = sim.node_mut(0);
    let (cwnd, samples) = swift_cwnd(a, &qa);
    assert_eq!(samples, 1);
    assert!(
        cwnd >= cwnd0,
        "a 2 µs round trip is below target: no decrease (cwnd {cwnd0} -> {cwnd})"
    );
    a.ep.check_scheduler().unwrap();
}

/// A rate raised while a QP waits out the gap its last packet left at the
/// old rate applies to that wait: what is left of it is waited at the new
/// rate, and the scheduler's timer moves with it.
#[test]
fn a_rate_raised_mid_wait_applies_to_that_wait() {
    let (mut sim, qa, qb) = pair(6, 1 << 20, &Opts::default());
    let a = sim.node_mut(0);
    a.sync();
    a.ep.set_qp_rate(qa.qpn, Some(10_000_000)).unwrap(); // 10 Mb/s
    write(a, &qa, &qb, 1, 2 * 1024);
    assert_eq!(a.take(0, 8).len(), 1, "the rate holds the second packet");
    let slow = a.ep.qp_gate(qa.qpn).unwrap().next_send_at();
    assert!(slow > 800 * US, "a 1 KB packet at 10 Mb/s: {slow} ns");
    // 100 µs into the wait the rate goes up 100-fold: the rest of the wait
    // shrinks 100-fold.
    assert!(a.take(100 * US, 8).is_empty());
    a.ep.set_qp_rate(qa.qpn, Some(1_000_000_000)).unwrap();
    let fast = a.ep.qp_gate(qa.qpn).unwrap().next_send_at();
    assert_eq!(fast, 100 * US + (slow - 100 * US) / 100);
    assert_eq!(a.ep.poll_timeout(), Some(fast));
    a.ep.check_scheduler().unwrap();
    a.handle_timeout_at(fast);
    assert_eq!(a.take(fast, 8).len(), 1, "the second packet leaves then");
    a.ep.check_scheduler().unwrap();
}

/// HPCC's window `W` moves with every ACK that echoes INT; a moving byte
/// window must not undo the gate's loss back-off, which only acknowledged
/// progress undoes (go-back-N: halved on a timeout, one packet back per
/// window's worth acknowledged).
#[test]
fn hpcc_window_updates_keep_the_loss_back_off() {
    use softrdma_core::cc::{hpcc, IntHop};
    let (mut sim, qa, qb) = pair(7, 1 << 20, &Opts::default());
    let cc = CcConfig::Hpcc(hpcc::Params::default());
    sim.node_mut(0).ep.set_qp_cc(qa.qpn, &cc, G100).unwrap();
    let a = sim.node_mut(0);
    a.sync();
    write(a, &qa, &qb, 1, 1024);
    assert_eq!(a.take(0, 8).len(), 1, "sent, never answered");
    let t = a.ep.poll_timeout().expect("the retransmission timer");
    a.handle_timeout_at(t);
    assert_eq!(a.ep.stats().window_backoffs, 1);
    let backed_off = a.ep.qp_gate(qa.qpn).unwrap().psns();
    assert_eq!(backed_off, 128);
    let w0 = a.ep.qp_gate(qa.qpn).unwrap().max_bytes();
    // ACKs echo INT: a full link with a queue, twice, moves W.
    let hop = |qlen, tx_bytes, ts| IntHop {
        qlen,
        tx_bytes,
        ts,
        rate_bps: G100,
    };
    a.ep.on_int(qa.qpn, t + US, &[hop(100_000, 0, t)]).unwrap();
    a.ep.on_int(qa.qpn, t + 14 * US, &[hop(100_000, 162_500, t + 13 * US)])
        .unwrap();
    let g = a.ep.qp_gate(qa.qpn).unwrap();
    assert_ne!(g.max_bytes(), w0, "W moved");
    assert_eq!(g.psns(), backed_off, "no progress: the back-off stays");
    a.ep.check_scheduler().unwrap();
}

/// Swift on retransmission timeouts: each cuts the window by max_mdf, the
/// fifth in a row drops it to min_cwnd — and an ACK of progress in between
/// starts the count again.
#[test]
fn swift_timeouts_cut_by_max_mdf_and_progress_restarts_the_count() {
    let (mut sim, qa, qb) = pair(8, 1 << 20, &Opts::default());
    let p = softrdma_core::cc::swift::Params::default();
    let cc = CcConfig::Swift(p);
    sim.node_mut(0).ep.set_qp_cc(qa.qpn, &cc, G100).unwrap();
    let (cwnd0, _) = swift_cwnd(sim.node(0), &qa);
    let a = sim.node_mut(0);
    a.sync();
    write(a, &qa, &qb, 1, 1024);
    let mut last = a.take(0, 8);
    assert_eq!(last.len(), 1, "sent and lost");
    let mut t = 0;
    for _ in 0..4 {
        t = a.ep.poll_timeout().expect("the retransmission timer");
        a.handle_timeout_at(t);
        last = a.take(t, 8);
        assert_eq!(last.len(), 1, "resent and lost");
    }
    assert_eq!(swift_cwnd(a, &qa).0, cwnd0 / 16.0, "four cuts by half");
    // The fourth resend arrives: its ACK is progress.
    answer(&mut sim, &last, t + US);
    let a = sim.node_mut(0);
    assert_eq!(a.poll_cq(qa.scq).len(), 1);
    // A fifth timeout, but the first since that progress: a cut, not the
    // floor.
    write(a, &qa, &qb, 2, 1024);
    assert_eq!(a.take(t + 3 * US, 8).len(), 1, "sent and lost");
    let t = a.ep.poll_timeout().expect("the retransmission timer");
    a.handle_timeout_at(t);
    assert_eq!(swift_cwnd(a, &qa).0, cwnd0 / 32.0);
    a.ep.check_scheduler().unwrap();
}
