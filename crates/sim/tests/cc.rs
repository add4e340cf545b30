//! DCQCN in the fabric: the switches mark, the receivers' notification
//! points send CNPs, the senders' reaction points cut and recover, and two
//! flows sharing a bottleneck converge to fair shares (E1's first case).

use softrdma_core::cc::{dcqcn, CcConfig};
use softrdma_sim::fabric::{Config, Ecn, Report};
use softrdma_sim::{output, Fabric, Flow, Op, Topology, Traffic, PS_PER_MS, PS_PER_US};

/// A WRITE of `size` bytes from host `src` to `dst`, starting at `start`.
fn write(src: usize, dst: usize, size: u64, start: softrdma_sim::Ps) -> Flow {
    Flow {
        src,
        dst,
        size,
        start,
        op: Op::Write,
        after: Vec::new(),
    }
}

fn two_flows(cc: CcConfig, ecn: Ecn) -> Report {
    // dumbbell:n=2: hosts 0, 1 on the left, 2, 3 on the right; 0 → 2 from
    // t = 0, 1 → 3 from 2 ms, both through the one 100G bottleneck.
    let t = Topology::from_spec("dumbbell:n=2").unwrap();
    let tr = Traffic {
        name: "e1".into(),
        flows: vec![
            write(0, 2, 150_000_000, 0),
            write(1, 3, 150_000_000, 2 * PS_PER_MS),
        ],
    };
    let cfg = Config {
        cc,
        ecn,
        sample: 100 * PS_PER_US,
        ..Config::default()
    };
    Fabric::new(cfg, t, tr).unwrap().run()
}

#[test]
fn dcqcn_converges_two_flows_to_fair_shares() {
    for (cc, ecn) in [
        (
            CcConfig::Dcqcn(dcqcn::Params::paper()),
            Ecn::Red {
                kmin: 5_000,
                kmax: 200_000,
                pmax: 0.01,
            },
        ),
        (CcConfig::Dcqcn(dcqcn::Params::nvidia()), Ecn::Hpcc),
    ] {
        let r = two_flows(cc, ecn);
        let c = &r.counters;
        assert_eq!(c.flows_done, 2, "{}", cc.name());
        assert!(
            c.ecn_marks > 0 && c.cnps > 0,
            "{}: marks {} CNPs {}",
            cc.name(),
            c.ecn_marks,
            c.cnps
        );
        assert_eq!(c.drops, 0);
        // Fair over 4–8 ms (after the second flow's start and convergence).
        let j = output::jain(&r, 4 * PS_PER_MS, 8 * PS_PER_MS).expect("both flows active");
        assert!(j > 0.95, "{}: Jain's index {j:.3}", cc.name());
        // And the bottleneck stays busy: the two together get most of it.
        let rates = output::goodput_rates(&r);
        let total: f64 = rates
            .iter()
            .filter(|x| (4 * PS_PER_MS..8 * PS_PER_MS).contains(&x.0))
            .map(|x| x.3)
            .sum::<f64>()
            / 40.0; // 40 samples of 100 µs
        assert!(total > 80.0, "{}: {total:.1} Gb/s together", cc.name());
    }
}

/// Without congestion control the two flows share the queue too (they are
/// window-limited FIFO neighbours), but nobody slows down: the bottleneck
/// queue stays above Kmin and every packet through it is a mark candidate.
/// DCQCN keeps it below: a small fraction of the marks.
#[test]
fn dcqcn_drains_the_queue_that_line_rate_keeps_full() {
    let red = Ecn::Red {
        kmin: 5_000,
        kmax: 200_000,
        pmax: 0.01,
    };
    let none = two_flows(CcConfig::None, red);
    assert_eq!(none.counters.cnps, 0);
    assert_eq!(none.counters.flows_done, 2);
    let dcqcn = two_flows(CcConfig::Dcqcn(dcqcn::Params::paper()), red);
    assert!(
        dcqcn.counters.ecn_marks * 20 < none.counters.ecn_marks,
        "marks: {} with DCQCN, {} without",
        dcqcn.counters.ecn_marks,
        none.counters.ecn_marks
    );
}

/// Four flows into one bottleneck, started 1 ms apart, MTU 4096 (1 MB
/// windows, so line rate's queue reaches the RTT band), samples every
/// 100 µs. `Err` when the configuration is refused.
fn four_flows(cc: CcConfig, int: bool) -> Result<Report, softrdma_sim::Error> {
    let t = Topology::from_spec("dumbbell:n=4").unwrap();
    let flows = (0..4)
        .map(|i| Flow {
            src: i,
            dst: 4 + i,
            size: 150_000_000,
            start: i as u64 * PS_PER_MS,
            op: Op::Write,
            after: Vec::new(),
        })
        .collect();
    let cfg = Config {
        cc,
        int,
        mtu: 4096,
        sample: 100 * PS_PER_US,
        ..Config::default()
    };
    let tr = Traffic {
        name: "four flows".into(),
        flows,
    };
    Fabric::new(cfg, t, tr).map(|mut f| f.run())
}

/// The bottleneck queue in steady state (16–24 ms: all four flows on; 80
/// samples, empty queues are not recorded).
fn mean_queue(r: &Report) -> u64 {
    let window = 16 * PS_PER_MS..24 * PS_PER_MS;
    r.qlen
        .iter()
        .filter(|q| window.contains(&q.0))
        .map(|q| q.3)
        .sum::<u64>()
        / 80
}

/// TIMELY and Patched TIMELY on the four flows: both finish every flow
/// with RTT samples and no loss, and Patched TIMELY ends at fair shares
/// (its fixed point is unique).
#[test]
fn timely_and_patched_timely_run_on_rtt_samples() {
    use softrdma_core::cc::timely;
    for p in [timely::Params::timely(), timely::Params::patched()] {
        let r = four_flows(CcConfig::Timely(p), false).unwrap();
        assert_eq!(r.counters.flows_done, 4, "{}", p.preset);
        assert_eq!(r.counters.drops + r.counters.timeouts, 0, "{}", p.preset);
        if p.patched {
            let j = output::jain(&r, 16 * PS_PER_MS, 24 * PS_PER_MS).unwrap();
            assert!(j > 0.99, "Patched TIMELY: Jain's index {j:.4}");
        }
    }
}

/// E3 (Zhu et al., "ECN or Delay"): two flows into one 10G bottleneck,
/// the second 20 ms after the first, both starting at 1 Gb/s, TIMELY with
/// the update per 16 KB completed segment of the paper's simulator. TIMELY
/// keeps the split the start gave it (the first flow holds most of the
/// link 70 ms later), Patched TIMELY and DCQCN end at fair shares. Updated
/// once per round trip instead (HPCC's simulator), TIMELY is an AIMD with
/// equal update rates and drifts towards fair too: the segment is what
/// makes the update rate follow the sending rate.
#[test]
fn timely_keeps_the_split_its_start_gave_and_patched_timely_does_not() {
    let run = |spec: &str| {
        let t = Topology::from_spec("dumbbell:n=2,rate=10G").unwrap();
        let cfg = Config {
            cc: CcConfig::parse(spec).unwrap(),
            sample: PS_PER_MS,
            ..Config::default()
        };
        let tr = Traffic {
            name: "e3".into(),
            flows: vec![
                write(0, 2, 100_000_000, 0),
                write(1, 3, 100_000_000, 20 * PS_PER_MS),
            ],
        };
        let r = Fabric::new(cfg, t, tr).unwrap().run();
        assert_eq!(r.counters.flows_done, 2, "{spec}");
        assert_eq!(r.counters.drops + r.counters.timeouts, 0, "{spec}");
        // Flow 0's share of what the two moved over 90–110 ms.
        let moved = |f: u32| {
            let at = |t: u64| {
                r.goodput
                    .iter()
                    .filter(|g| g.1 == f && g.0 <= t)
                    .map(|g| g.2)
                    .next_back()
                    .unwrap_or(0)
            };
            (at(110 * PS_PER_MS) - at(90 * PS_PER_MS)) as f64
        };
        moved(0) / (moved(0) + moved(1))
    };
    let zhu = "seg=16K,init=0.1,min=0.01";
    let timely = run(&format!("timely:{zhu}"));
    let patched = run(&format!("timely-patched:{zhu}"));
    let dcqcn = run("dcqcn");
    assert!(timely > 0.8, "TIMELY: first flow's share {timely:.3}");
    assert!((patched - 0.5).abs() < 0.04, "Patched TIMELY: {patched:.3}");
    assert!((dcqcn - 0.5).abs() < 0.08, "DCQCN: {dcqcn:.3}");
}

/// Swift on the same four flows: a window towards a delay target. Every
/// flow finishes without loss, the queue stays far below line rate's, and
/// the flows end at fair shares.
#[test]
fn swift_holds_the_delay_target_with_fair_windows() {
    use softrdma_core::cc::swift;
    let none = four_flows(CcConfig::None, false).unwrap();
    let r = four_flows(CcConfig::Swift(swift::Params::default()), false).unwrap();
    assert_eq!(r.counters.flows_done, 4);
    assert_eq!(r.counters.drops + r.counters.timeouts, 0);
    let (q, q_none) = (mean_queue(&r), mean_queue(&none));
    assert!(
        q * 4 < q_none,
        "mean queue {q} B with Swift, {q_none} B without"
    );
    let j = output::jain(&r, 16 * PS_PER_MS, 24 * PS_PER_MS).unwrap();
    assert!(j > 0.95, "Swift: Jain's index {j:.4}");
}

/// HPCC on the same four flows, with INT: the switches stamp every data
/// packet, the receivers echo the records in their ACKs, the senders size
/// their windows to keep the bottleneck just under full — the link busy, a
/// near-empty queue, fair shares (W bounds what is in flight as well as
/// the pace: as a pace alone, a new flow kept most of the link for tens of
/// milliseconds), and refused without `int` (there is nothing to read).
#[test]
fn hpcc_keeps_the_queue_near_empty_from_int() {
    use softrdma_core::cc::hpcc;
    let cc = CcConfig::Hpcc(hpcc::Params::default());
    assert!(
        four_flows(cc, false).is_err(),
        "HPCC without INT is refused"
    );
    let none = four_flows(CcConfig::None, true).unwrap();
    let r = four_flows(cc, true).unwrap();
    assert_eq!(r.counters.flows_done, 4);
    assert_eq!(r.counters.drops + r.counters.timeouts, 0);
    let (q, q_none) = (mean_queue(&r), mean_queue(&none));
    assert!(
        q * 10 < q_none,
        "mean queue {q} B with HPCC, {q_none} B without"
    );
    let busy: f64 = output::goodput_rates(&r)
        .iter()
        .filter(|x| (16 * PS_PER_MS..24 * PS_PER_MS).contains(&x.0))
        .map(|x| x.3)
        .sum::<f64>()
        / 80.0;
    assert!(busy > 85.0, "HPCC: {busy:.1} Gb/s together");
    let j = output::jain(&r, 16 * PS_PER_MS, 24 * PS_PER_MS).unwrap();
    assert!(j > 0.95, "HPCC: Jain's index {j:.4}");
}

/// IRN's point, at 1 % path loss (0.5 % per link, both directions): one
/// 4 MB WRITE between two hosts through a switch. Selective repeat resends
/// about what was lost and keeps most of the line rate; go-back-N resends
/// windows and finishes several times later. (docs/CONGESTION.md,
/// "Selective repeat"; scripts/irn-goodput sweeps the loss.)
#[test]
fn selective_repeat_resends_what_random_loss_took_and_go_back_n_does_not() {
    let run = |sr: bool| {
        let t = Topology::from_spec("star:n=2").unwrap();
        let tr = Traffic {
            name: "irn".into(),
            flows: vec![Flow {
                src: 0,
                dst: 1,
                size: 4_000_000,
                start: 0,
                op: Op::Write,
                after: Vec::new(),
            }],
        };
        let cfg = Config {
            pfc: false,
            link_loss: 0.005,
            selective_repeat: sr,
            qp_timeout: 6,
            ..Config::default()
        };
        Fabric::new(cfg, t, tr).unwrap().run()
    };
    let (sr, gbn) = (run(true), run(false));
    for r in [&sr, &gbn] {
        assert_eq!(r.flows.len(), 1);
        assert_eq!(
            r.flows[0].status,
            Some(softrdma_core::wc::WcStatus::Success)
        );
        assert!(r.counters.drops_random > 10, "{:?}", r.counters);
    }
    let c = &sr.counters;
    assert!(
        c.retransmits <= c.drops_random + c.drops_random / 5,
        "selective repeat resent {} for {} lost",
        c.retransmits,
        c.drops_random
    );
    assert!(gbn.counters.retransmits > 5 * gbn.counters.drops_random);
    let fct = |r: &Report| r.flows[0].end.unwrap() - r.flows[0].start;
    assert!(fct(&gbn) > 2 * fct(&sr), "{} vs {}", fct(&gbn), fct(&sr));
}
