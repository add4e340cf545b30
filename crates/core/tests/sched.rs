//! The QP scheduler at scale and its gates: thousands of QP pairs, a
//! bottleneck whose queue is the analogue of a receiver's socket buffer, idle
//! QPs that must cost nothing, a rate pacer on virtual time, round-robin
//! fairness. Every test checks the bytes that arrived, and the scheduler's
//! invariant (no QP with work forgotten) at the points it names.

mod support;

use softrdma_core::cq::CqId;
use softrdma_core::gate::psn_cost;
use softrdma_core::mr::KeySource;
use softrdma_core::qp::attr::Mtu;
use softrdma_core::qp::QpCap;
use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::{Endpoint, EndpointConfig, QpInit};
use softrdma_netsim::{LinkConfig, Sim};
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;

/// Two hosts with `n` connected RC QP pairs sharing one PD, one MR and one
/// CQ pair per host (as a server with many connections has), each QP with
/// room for `wr` send work requests. `tune` adjusts both endpoints' config.
fn pairs(
    n: usize,
    mem: usize,
    wr: u32,
    o: &Opts,
    tune: impl Fn(&mut EndpointConfig),
) -> (Sim<Host>, Vec<(QpEnd, QpEnd)>) {
    let mut sim = Sim::new(7);
    for id in 0..2 {
        let mut h = Host::new(id, mem, 7 + id as u64);
        // As `Host::new` sets it up, then tuned.
        let mut cfg = EndpointConfig {
            key_source: KeySource::seeded(7 + id as u64),
            qpn_base: h.ep.config().qpn_base,
            ..Default::default()
        };
        tune(&mut cfg);
        h.ep = Endpoint::new(cfg);
        h.check_sched = n <= 128;
        sim.add_node(h);
    }
    let o = Opts {
        cap: QpCap {
            max_send_wr: wr,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..*o
    };
    let mut ends: [Vec<QpEnd>; 2] = [Vec::new(), Vec::new()];
    for (id, v) in ends.iter_mut().enumerate() {
        let h = sim.node_mut(id);
        let pd = h.ep.alloc_pd();
        let (lkey, rkey) =
            h.ep.reg_mr(pd, MEM_BASE, MEM_BASE, mem as u64, o.access)
                .unwrap();
        let scq = h.ep.create_cq(1 << 16).unwrap();
        let rcq = h.ep.create_cq(1 << 16).unwrap();
        for _ in 0..n {
            let qpn =
                h.ep.create_qp(QpInit {
                    qp_type: o.qp_type,
                    pd,
                    send_cq: scq,
                    recv_cq: rcq,
                    srq: None,
                    cap: o.cap,
                    sq_sig_all: false,
                })
                .unwrap();
            v.push(QpEnd {
                node: id,
                qpn,
                pd,
                scq,
                rcq,
                lkey,
                rkey,
            });
        }
    }
    let v: Vec<(QpEnd, QpEnd)> = ends[0]
        .iter()
        .copied()
        .zip(ends[1].iter().copied())
        .collect();
    for (a, b) in &v {
        connect(sim.node_mut(0), a, b, o.psn_a, o.psn_b, &o);
        connect(sim.node_mut(1), b, a, o.psn_b, o.psn_a, &o);
    }
    (sim, v)
}

/// Every QP `i` of node 0 WRITEs `len` bytes from its own source range to
/// its own range in node 1's memory (second half); returns when all have
/// completed and checks statuses and bytes.
fn write_all(sim: &mut Sim<Host>, v: &[(QpEnd, QpEnd)], len: usize, max_time: u64) {
    let half = sim.node(0).mem.bytes.len() as u64 / 2;
    let a = sim.node_mut(0);
    for (i, (qa, qb)) in v.iter().enumerate() {
        let src = MEM_BASE + (i * len) as u64;
        pattern(a, src, len, i as u8);
        let op = SendOp::Write {
            remote_addr: MEM_BASE + half + (i * len) as u64,
            rkey: qb.rkey,
        };
        a.post(qa, i as u64, op, src, len as u32, SIG).unwrap();
    }
    a.ep.check_scheduler().unwrap();
    sim.run_until_idle(max_time).expect("all WRITEs settle");
    for h in sim.nodes() {
        h.ep.check_scheduler().unwrap();
    }
    let mut done = sim.node_mut(0).poll_cq(v[0].0.scq);
    done.sort_by_key(|c| c.wr_id);
    assert_eq!(done.len(), v.len());
    for (i, c) in done.iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success));
    }
    same_ranges(
        sim,
        (0, MEM_BASE),
        (1, MEM_BASE + half),
        (len as u64, len),
        v.len() as u64,
    );
}

#[test]
fn ten_thousand_qp_pairs_each_write_checked_bytes() {
    let n = 10_000;
    let len = 1000;
    let (mut sim, v) = pairs(n, 32 << 20, 1, &Opts::default(), |_| {});
    write_all(&mut sim, &v, len, 10 * SEC);
    assert_eq!(sim.node(0).ep.stats().retransmits, 0);
    assert_eq!(sim.node(0).ep.poll_timeout(), None);
}

/// `n` QPs WRITE `len` bytes each at MTU 4096 through a 10 Gbit/s link whose
/// queue holds 1024 datagrams — the analogue of the receiver's socket
/// buffer — with the 67 ms timeout perftest uses.
fn through_bottleneck(n: usize, len: usize, budget: u64) -> (Sim<Host>, Vec<(QpEnd, QpEnd)>) {
    let o = Opts {
        mtu: Mtu::B4096,
        timeout: 14,
        ..Default::default()
    };
    let (mut sim, v) = pairs(n, 2 * n * len, 2, &o, |c| {
        c.max_inflight_per_dest = budget;
    });
    sim.set_default_link(
        LinkConfig::default()
            .delay(5 * US)
            .bandwidth_bps(Some(10_000_000_000))
            .queue_limit(1024),
    );
    (sim, v)
}

fn bottleneck_completes(n: usize, len: usize) {
    let (mut sim, v) = through_bottleneck(n, len, EndpointConfig::default().max_inflight_per_dest);
    write_all(&mut sim, &v, len, 10 * SEC);
    let st = sim.node(0).ep.stats();
    let link = sim.link_stats(0, 1);
    assert_eq!(
        link.dropped_queue, 0,
        "the budget keeps the queue from overflowing"
    );
    assert_eq!(st.retransmits, 0);
    assert_eq!(st.timeouts, 0);
}

#[test]
fn five_hundred_twelve_qps_through_a_bounded_queue() {
    bottleneck_completes(512, 64 << 10);
}

#[test]
fn four_thousand_ninety_six_qps_through_a_bounded_queue() {
    bottleneck_completes(4096, 8 << 10);
}

#[test]
fn without_the_budget_the_bounded_queue_overflows() {
    // The same 512 QPs with the per-destination budget off: a full window
    // from every QP at once is 131072 packets into a 1024-packet queue.
    // This is the failure `perf write_bw -q 512` showed; what the loss
    // back-off then saves is not the point here, only that the test above
    // would see drops without the budget.
    let (mut sim, v) = through_bottleneck(512, 64 << 10, u64::MAX);
    let a = sim.node_mut(0);
    for (i, (qa, qb)) in v.iter().enumerate() {
        let op = SendOp::Write {
            remote_addr: MEM_BASE + (1 << 25) + (i << 16) as u64,
            rkey: qb.rkey,
        };
        a.post(qa, i as u64, op, MEM_BASE + (i << 16) as u64, 64 << 10, SIG)
            .unwrap();
    }
    sim.run_until(SEC / 100);
    assert!(sim.link_stats(0, 1).dropped_queue > 1000);
}

#[test]
fn the_budget_bounds_bytes_in_flight_to_a_destination() {
    let budget = 64 * psn_cost(4096);
    let (mut sim, v) = through_bottleneck(64, 64 << 10, budget);
    let gid = gid_of(1);
    let a = sim.node_mut(0);
    for (i, (qa, qb)) in v.iter().enumerate() {
        let op = SendOp::Write {
            remote_addr: MEM_BASE + (64 << 16) + (i << 16) as u64,
            rkey: qb.rkey,
        };
        a.post(qa, i as u64, op, MEM_BASE + (i << 16) as u64, 64 << 10, SIG)
            .unwrap();
    }
    let mut most = 0;
    while sim.step() {
        let ep = &sim.node(0).ep;
        most = most.max(ep.dest_inflight(&gid));
        // One packet over at most: the one that found the last room.
        assert!(ep.dest_inflight(&gid) <= budget + psn_cost(4096));
        assert!(sim.now() < SEC);
    }
    sim.node(0).ep.check_scheduler().unwrap();
    // It was used in full, and all of it was returned.
    assert!(most >= budget);
    assert_eq!(sim.node(0).ep.dest_inflight(&gid), 0);
    assert_eq!(sim.node_mut(0).poll_cq(v[0].0.scq).len(), 64);
}

#[test]
fn idle_qps_cost_poll_transmit_nothing() {
    // One active QP among `n` idle ones: the scheduler looks at exactly the
    // same QPs whatever `n` is.
    let visits = |n: usize| {
        let (mut sim, v) = pairs(n, 1 << 20, 1, &Opts::default(), |_| {});
        let (qa, qb) = v[n / 2];
        let a = sim.node_mut(0);
        pattern(a, MEM_BASE, 64 << 10, 1);
        let op = SendOp::Write {
            remote_addr: MEM_BASE + (512 << 10),
            rkey: qb.rkey,
        };
        a.post(&qa, 1, op, MEM_BASE, 64 << 10, SIG).unwrap();
        sim.run_until_idle(SEC).unwrap();
        sim.node(0).ep.check_scheduler().unwrap();
        assert_eq!(
            sim.node(1).mem.slice(MEM_BASE + (512 << 10), 64 << 10),
            sim.node(0).mem.slice(MEM_BASE, 64 << 10)
        );
        let st = *sim.node(0).ep.stats();
        (st.sched_visits, st.tx_packets)
    };
    let (v1, p1) = visits(1);
    let (v1000, p1000) = visits(1000);
    assert_eq!(p1, 64);
    assert_eq!(p1000, 64);
    // One visit per burst of packets (the hosts take 16 per scheduling
    // decision, as the engine does): a QP leaves the list the moment it has
    // nothing it may send, so no visit finds it empty.
    assert_eq!(v1, 64 / support::BURST as u64);
    assert_eq!(v1000, 64 / support::BURST as u64);
}

#[test]
fn rate_gate_paces_a_qp_at_exact_packet_times() {
    let o = Opts::default(); // MTU 1024
    let (mut sim, qa, qb) = pair(3, 4 << 20, &o);
    let t = trace(&mut sim, &[0, 1]);
    // 1 Gbit/s: a byte every 8 ns.
    sim.node_mut(0)
        .ep
        .set_qp_rate(qa.qpn, Some(1_000_000_000))
        .unwrap();
    assert_eq!(
        sim.node(0).ep.qp_gate(qa.qpn).unwrap().rate(),
        Some(1_000_000_000)
    );
    let len = 8 * 1024 + 100;
    pattern(sim.node_mut(0), region(0), len, 3);
    let w = SendOp::Write {
        remote_addr: region(1),
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, w, region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    let tr = t.borrow();
    let sent: Vec<_> = tr.iter().filter(|p| p.from == 0).collect();
    assert_eq!(sent.len(), 9);
    let mut at = 0;
    for p in &sent {
        assert_eq!(p.t, at, "{}", p.line());
        at += p.repr.wire_len() as u64 * 8;
    }
    // The last packet is 100 bytes of payload; the first eight 1024.
    assert_eq!(sent[0].repr.wire_len(), 12 + 16 + 1024 + 4);
    drop(tr);
    assert_eq!(
        sim.node(1).mem.slice(region(1), len),
        sim.node(0).mem.slice(region(0), len)
    );
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node_mut(0).ep.set_qp_rate(qa.qpn, Some(0)),
        Err(softrdma_core::Error::InvalidArgument(
            "a QP rate of 0 bits/s never sends; None means line rate"
        ))
    );
}

#[test]
fn window_hook_limits_unacknowledged_psns() {
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(4, 4 << 20, &o);
    let t = trace(&mut sim, &[0, 1]);
    sim.node_mut(0).ep.set_qp_window(qa.qpn, 4, None).unwrap();
    let len = 10 * 1024;
    pattern(sim.node_mut(0), region(0), len, 4);
    let w = SendOp::Write {
        remote_addr: region(1),
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, w, region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    // Four packets per round trip, the fourth asking for the ACK that
    // opens the window again.
    let d = 2 * US; // support links: 1 µs each way
    let times: Vec<u64> = t
        .borrow()
        .iter()
        .filter(|p| p.from == 0)
        .map(|p| p.t)
        .collect();
    assert_eq!(times, [0, 0, 0, 0, d, d, d, d, 2 * d, 2 * d]);
    let ackreq: Vec<u32> = t
        .borrow()
        .iter()
        .filter(|p| p.from == 0 && p.repr.bth.ack_req)
        .map(|p| p.psn())
        .collect();
    assert_eq!(ackreq, [103, 107, 109]);
    assert_eq!(
        sim.node(1).mem.slice(region(1), len),
        sim.node(0).mem.slice(region(0), len)
    );
    assert!(sim.node_mut(0).ep.set_qp_window(qa.qpn, 0, None).is_err());
    assert!(sim.node_mut(0).ep.set_qp_window(qa.qpn, 257, None).is_err());
}

/// `n` QPs each WRITE 64 KiB at once. At every point of the order their
/// packets leave in, no QP still sending is more than one quantum (plus one
/// packet) ahead of another. With the budget off (`u64::MAX`) and whole
/// messages inside the window, that order is the round robin's alone; with
/// a budget, it is also the order the budget wakes waiters in.
fn fair_shares(n: usize, budget: u64) {
    let len = 64 << 10;
    let (mut sim, v) = pairs(n, 2 * n * len, 1, &Opts::default(), |c| {
        c.max_inflight_per_dest = budget;
    });
    let t = trace(&mut sim, &[0, 1]);
    write_all(&mut sim, &v, len, SEC);
    let quantum = EndpointConfig::default().sched_quantum as i64;
    let first = v[0].1.qpn;
    let mut sent = vec![0i64; n];
    let tr = t.borrow();
    let mut max_pkt = 0;
    for p in tr.iter().filter(|p| p.from == 0) {
        let i = (p.repr.bth.dest_qp - first) as usize;
        sent[i] += p.repr.wire_len() as i64;
        max_pkt = max_pkt.max(p.repr.wire_len() as i64);
        let total = (len as i64 / 1024) * (1024 + 12 + 4) + 16;
        let active = sent.iter().filter(|&&b| b < total);
        let (lo, hi) = active.fold((i64::MAX, 0), |(lo, hi), &b| (lo.min(b), hi.max(b)));
        if lo != i64::MAX {
            assert!(
                hi - lo <= quantum + max_pkt,
                "at PSN {} of QP {i}: shares from {lo} to {hi} bytes",
                p.psn()
            );
        }
    }
}

#[test]
fn round_robin_is_fair_between_two_qps() {
    fair_shares(2, u64::MAX);
}

#[test]
fn round_robin_is_fair_between_a_hundred_qps() {
    fair_shares(100, u64::MAX);
}

#[test]
fn waiters_for_the_budget_are_woken_fairly() {
    // Room for 16 packets towards the peer, 100 QPs wanting 64 each.
    fair_shares(100, 16 * psn_cost(1024));
}

#[test]
fn a_timeout_halves_the_window_and_progress_grows_it_back() {
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(5, 4 << 20, &o);
    // Lose the first transmission of every packet of the message.
    sim.node_mut(0).drop_next(8, |r| r.bth.opcode.0 <= 0x0a);
    let len = 8 * 1024;
    pattern(sim.node_mut(0), region(0), len, 5);
    let w = SendOp::Write {
        remote_addr: region(1),
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, w, region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let st = *sim.node(0).ep.stats();
    assert_eq!((st.timeouts, st.window_backoffs), (1, 1));
    let g = sim.node(0).ep.qp_gate(qa.qpn).unwrap();
    // 256 halved to 128, then one more packet per 128 acknowledged: 8 is
    // not enough to grow it.
    assert_eq!(g.psns(), 128);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.node(1).mem.slice(region(1), len),
        sim.node(0).mem.slice(region(0), len)
    );
}

/// A per-destination budget of 0 would hold every RC QP forever (no packet
/// ever fits): the configuration is refused, naming the field. One byte is
/// the smallest that works (one packet in flight at a time).
#[test]
fn a_zero_per_destination_budget_is_refused_naming_the_field() {
    let zero = || EndpointConfig {
        max_inflight_per_dest: 0,
        ..Default::default()
    };
    let made = std::panic::catch_unwind(|| Endpoint::new(zero()));
    let msg = match made {
        Ok(_) => panic!("an endpoint was made with a budget of 0"),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    };
    assert!(msg.contains("max_inflight_per_dest"), "{msg}");
    let e = Endpoint::try_new(zero()).unwrap_err();
    assert!(e.to_string().contains("max_inflight_per_dest"), "{e}");
    assert_eq!(zero().validate(), Err(e));
    let one = EndpointConfig {
        max_inflight_per_dest: 1,
        ..Default::default()
    };
    assert!(Endpoint::try_new(one).is_ok());
    // And with it, two QPs' WRITEs go through, a packet at a time.
    let (mut sim, v) = through_bottleneck(2, 64 << 10, 1);
    write_all(&mut sim, &v, 64 << 10, 10 * SEC);
    assert_eq!(sim.node(0).ep.stats().retransmits, 0);
}

/// `n` completions on CQ `cq` of node `node`, every one successful.
fn all_succeed(sim: &mut Sim<Host>, node: usize, cq: CqId, n: usize) {
    let done = sim.node_mut(node).poll_cq(cq);
    assert_eq!(done.len(), n);
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
}

/// For each of `n` QPs `i`, the `len` bytes at `a + i * stride` on node
/// `na` equal those at `b + i * stride` on node `nb`.
fn same_ranges(
    sim: &Sim<Host>,
    (na, a): (usize, u64),
    (nb, b): (usize, u64),
    (stride, len): (u64, usize),
    n: u64,
) {
    for i in 0..n {
        assert_eq!(
            sim.node(nb).mem.slice(b + i * stride, len),
            sim.node(na).mem.slice(a + i * stride, len),
            "QP pair {i}: bytes differ"
        );
    }
}

#[test]
fn a_burst_sends_exactly_what_packet_by_packet_polls_send() {
    // Sixteen QPs share one destination whose budget holds eight packets,
    // through a lossy 10 Gbit/s link: waiters woken for one new PSN,
    // round-robin turns, resends after losses; then each READs back, so
    // the other host bursts READ responses among its ACKs. Taking packets sixteen per
    // scheduling decision must send the same datagrams at the same times
    // as taking them one at a time.
    let run = |burst: usize| {
        let (mut sim, v) = through_bottleneck(16, 64 << 10, 8 * psn_cost(4096));
        let half = sim.node(0).mem.bytes.len() as u64 / 2;
        sim.set_default_link(
            LinkConfig::default()
                .delay(5 * US)
                .bandwidth_bps(Some(10_000_000_000))
                .queue_limit(1024)
                .loss(0.01),
        );
        for h in 0..2 {
            sim.node_mut(h).burst = burst;
            // A finite packet rate (40 packets per 10 µs), so that packets
            // arrive while a host's responses and requests are still queued.
            sim.node_mut(h).pace = Some((40, 10 * US));
        }
        let t = trace(&mut sim, &[0, 1]);
        write_all(&mut sim, &v, 64 << 10, 10 * SEC);
        // Then every QP READs its WRITE back into its source range's second
        // half: response streams from node 1, in bursts of their own.
        let a = sim.node_mut(0);
        for (i, (qa, qb)) in v.iter().enumerate() {
            let op = SendOp::Read {
                remote_addr: MEM_BASE + half + (i << 16) as u64,
                rkey: qb.rkey,
            };
            a.post(
                qa,
                100 + i as u64,
                op,
                MEM_BASE + (i << 16) as u64 + (32 << 10),
                32 << 10,
                SIG,
            )
            .unwrap();
            // And a one-packet WRITE behind it, whose ACK queues behind the
            // READ's response stream at node 1.
            let op = SendOp::Write {
                remote_addr: MEM_BASE + half + (i << 16) as u64 + (60 << 10),
                rkey: qb.rkey,
            };
            a.post(
                qa,
                300 + i as u64,
                op,
                MEM_BASE + (i << 16) as u64,
                64,
                SendFlags::default(),
            )
            .unwrap();
        }
        // Node 1 WRITEs at the same time, so its QPs hold requests beside
        // their responses (a request may pass a lone ACK, not a stream).
        let b = sim.node_mut(1);
        for (i, (qa, qb)) in v.iter().enumerate() {
            let src = MEM_BASE + (i << 16) as u64;
            pattern(b, src, 48 << 10, 50 + i as u8);
            let op = SendOp::Write {
                remote_addr: MEM_BASE + half + (i << 16) as u64,
                rkey: qa.rkey,
            };
            b.post(qb, 200 + i as u64, op, src, 48 << 10, SIG).unwrap();
        }
        sim.run_until_idle(10 * SEC).unwrap();
        // Node 1's WRITEs landed in node 0's second half; node 0's READs
        // brought each WRITE's first half back behind its source.
        all_succeed(&mut sim, 1, v[0].1.scq, 16);
        same_ranges(
            &sim,
            (1, MEM_BASE),
            (0, MEM_BASE + half),
            (1 << 16, 48 << 10),
            16,
        );
        all_succeed(&mut sim, 0, v[0].0.scq, 16);
        same_ranges(
            &sim,
            (0, MEM_BASE),
            (0, MEM_BASE + (32 << 10)),
            (1 << 16, 32 << 10),
            16,
        );
        let st = *sim.node(0).ep.stats();
        let pkts: Vec<_> = t
            .borrow()
            .iter()
            .map(|p| (p.t, p.from, p.dropped, p.line(), p.payload.clone()))
            .collect();
        (pkts, st.tx_packets, st.retransmits, st.sched_visits)
    };
    let (one, sent, resent, visits_one) = run(1);
    let (burst, sent_b, resent_b, visits_burst) = run(support::BURST);
    assert!(resent > 0, "the loss must exercise resends");
    assert_eq!((sent, resent), (sent_b, resent_b));
    assert_eq!(one.len(), burst.len());
    for (i, (a, b)) in one.iter().zip(&burst).enumerate() {
        assert_eq!(a, b, "datagram {i} differs");
    }
    // Fewer decisions, though here most turns are a woken waiter's single
    // new PSN (no burst) or a quarter of a 16 KiB quantum per QP.
    assert!(
        visits_burst < visits_one,
        "{visits_burst} visits against {visits_one}"
    );
}

#[test]
fn a_burst_of_responses_stops_at_a_lone_ack_a_request_may_pass() {
    // B holds a READ's response stream with an ACK queued behind it, and a
    // WRITE of its own: one at a time, the stream goes, then B's request
    // passes the lone ACK, then the ACK. A burst must send the same.
    let o = Opts {
        mtu: Mtu::B4096,
        ..Default::default()
    };
    let run = |burst: usize, acks_first: bool| {
        let (mut sim, qa, qb) = pair(3, 4 << 20, &o);
        sim.node_mut(1)
            .ep
            .set_qp_acks_first(qb.qpn, acks_first)
            .unwrap();
        let a = sim.node_mut(0);
        let read = SendOp::Read {
            remote_addr: MEM_BASE,
            rkey: qb.rkey,
        };
        a.post(&qa, 1, read, MEM_BASE + (1 << 20), 32 << 10, SIG)
            .unwrap();
        let write = SendOp::Write {
            remote_addr: MEM_BASE + (2 << 20),
            rkey: qb.rkey,
        };
        a.post(&qa, 2, write, MEM_BASE, 64, SIG).unwrap();
        let to_b = a.take(0, 2);
        assert_eq!(to_b.len(), 2);
        let b = sim.node_mut(1);
        let write = SendOp::Write {
            remote_addr: MEM_BASE + (3 << 20),
            rkey: qa.rkey,
        };
        b.post(&qb, 3, write, MEM_BASE, 64, SIG).unwrap();
        for p in &to_b {
            b.deliver(0, 0, p);
        }
        b.burst = burst;
        describe_all(1, &b.take(0, 64))
    };
    let one = run(1, false);
    assert_eq!(one.len(), 10, "{one:#?}");
    assert!(one[8].starts_with("B WRITE_ONLY"), "{one:#?}");
    assert!(one[9].starts_with("B ACKNOWLEDGE"), "{one:#?}");
    assert_eq!(run(support::BURST, false), one);
    // A QP whose ACKs go first (a ring peer's: its receiver may take a
    // reply and the ACK behind it in two drains): the request waits.
    let first = run(1, true);
    assert_eq!(first.len(), 10, "{first:#?}");
    assert_eq!(first[..8], one[..8], "the response stream is unchanged");
    assert!(first[8].starts_with("B ACKNOWLEDGE"), "{first:#?}");
    assert!(first[9].starts_with("B WRITE_ONLY"), "{first:#?}");
    assert_eq!(run(support::BURST, true), first);
}
