//! The simulator against closed forms and the properties its users rely
//! on: one flow's FCT to the picosecond, an incast's drops from the buffer
//! model, PFC's zero loss and pause propagation, ECMP's spread, a PFC
//! deadlock found, and byte-identical output per seed.

use softrdma_core::wc::WcStatus;
use softrdma_sim::fabric::{Config, Ecn, Report};
use softrdma_sim::{output, Fabric, Flow, Op, Topology, Traffic, PS_PER_US};

fn run(cfg: Config, topo: &str, flows: Vec<Flow>) -> Report {
    let t = Topology::from_spec(topo).unwrap();
    let tr = Traffic {
        name: "test".into(),
        flows,
    };
    Fabric::new(cfg, t, tr).unwrap().run()
}

fn flow(src: usize, dst: usize, size: u64, op: Op) -> Flow {
    Flow {
        src,
        dst,
        size,
        start: 0,
        op,
        after: Vec::new(),
    }
}

/// Wire time of `bytes` of UDP payload at 100 Gb/s: frame (+46) and
/// preamble/IFG (+20), 80 ps per byte.
fn wire(udp: u64) -> u64 {
    (udp + 46 + 20) * 80
}

/// Store-and-forward over h equal-rate links, all packets ready at the
/// first: the last packet arrives at Σ s_k + (h − 1)·max s_k + Σ delays
/// (the tandem-queue result); the ACK then comes back over h links.
#[test]
fn one_flow_fct_is_the_closed_form() {
    for (size, mtu) in [
        (1_000_000u64, 1024u32),
        (4096, 4096),
        (100, 1024),
        (65_537, 2048),
    ] {
        let cfg = Config {
            mtu,
            ecn: Ecn::Off,
            ..Config::default()
        };
        // dumbbell:n=1: host 0 - switch - switch - host 1, three 100G links of 1 µs.
        let r = run(cfg, "dumbbell:n=1", vec![flow(0, 1, size, Op::Write)]);
        let m = mtu as u64;
        let n = size.div_ceil(m);
        let mut s = Vec::new();
        for k in 0..n {
            let payload = if k + 1 == n { size - k * m } else { m };
            let pad = (4 - payload % 4) % 4;
            let reth = if k == 0 { 16 } else { 0 };
            s.push(wire(12 + reth + payload + pad + 4));
        }
        let h = 3;
        let d = PS_PER_US;
        let ack = wire(12 + 4 + 4);
        let expect =
            s.iter().sum::<u64>() + (h - 1) * s.iter().max().unwrap() + 2 * h * d + h * ack;
        let f = &r.flows[0];
        assert_eq!(f.status, Some(WcStatus::Success));
        assert_eq!(f.end.unwrap() - f.start, expect, "size {size} mtu {mtu}");
        // fct.txt's standalone FCT is the same sum (to the pad bytes).
        let sd = output::slowdown(expect, f.standalone);
        assert!(
            f.standalone <= expect + 1000 && sd < 1.0001,
            "standalone {} vs {expect}",
            f.standalone
        );
        assert_eq!(
            r.counters.drops + r.counters.retransmits + r.counters.timeouts,
            0
        );
    }
}

/// N senders burst n packets each at line rate into one 100G port, PFC
/// off: the egress queue may hold α(B − Q), so it stops at Q* = αB/(1+α);
/// while the burst lasts one packet leaves per packet time, so the switch
/// admits what leaves during the burst plus Q* and drops the rest.
#[test]
fn lossy_incast_drops_what_the_buffer_model_predicts() {
    for (senders, alpha) in [(4usize, 1.0f64), (8, 0.5), (16, 2.0)] {
        let buffer = 2_000_000u64;
        let cfg = Config {
            pfc: false,
            buffer,
            alpha,
            ecn: Ecn::Off,
            mtu: 1024,
            ..Config::default()
        };
        let pkts = 400u64;
        let size = pkts * 1024;
        let flows = (1..=senders)
            .map(|s| flow(s, 0, size, Op::UcWrite))
            .collect();
        let r = run(cfg, &format!("star:n={}", senders + 1), flows);
        let frame = 12 + 1024 + 4 + 46; // middle packets
        let qmax = (alpha * buffer as f64 / (1.0 + alpha)) as u64 / frame;
        let offered = senders as u64 * pkts;
        let predicted = offered - pkts - qmax;
        let drops = r.counters.drops;
        let slack = 2 * senders as u64 + 2;
        assert!(
            drops.abs_diff(predicted) <= slack,
            "{senders} senders α {alpha}: {drops} drops, model {predicted} ± {slack}"
        );
        // The queue's peak is Q* (to a packet).
        let peak = r.ports.iter().map(|p| p.peak_bytes).max().unwrap();
        assert!(
            peak.abs_diff(qmax * frame) <= frame,
            "peak {peak} vs {}",
            qmax * frame
        );
    }
}

/// With PFC, an incast across a two-tier fabric loses nothing, every byte
/// is delivered, and the pause climbs from the receiver's leaf to the spine
/// and on to the senders' leaves and their hosts' links.
#[test]
fn pfc_is_lossless_and_the_pause_propagates_to_the_senders() {
    let cfg = Config {
        buffer: 600_000,
        ecn: Ecn::Off,
        ..Config::default()
    };
    // 3 leaves × 4 hosts, 1 spine, 400G fabric: hosts 4..12 (leaves 1 and
    // 2) send to host 0, whose 100G link is the bottleneck.
    let flows: Vec<Flow> = (4..12).map(|s| flow(s, 0, 2_000_000, Op::Write)).collect();
    let r = run(
        cfg,
        "leafspine:leaves=3,spines=1,hosts=4,fabric=400G",
        flows,
    );
    assert_eq!(r.counters.drops, 0);
    assert_eq!(r.counters.retransmits, 0);
    assert!(r.flows.iter().all(|f| f.status == Some(WcStatus::Success)));
    let leaf = |l: u32| 12 + l;
    let spine = 15;
    let sent = |node: u32, peer: u32| {
        r.ports
            .iter()
            .filter(|p| p.node == node && p.peer == peer)
            .map(|p| p.pauses_sent)
            .sum::<u64>()
    };
    // Receiver's leaf pauses the spine; the spine pauses both senders'
    // leaves; those pause their hosts.
    assert!(sent(leaf(0), spine) > 0, "leaf 0 → spine");
    assert!(
        sent(spine, leaf(1)) > 0 && sent(spine, leaf(2)) > 0,
        "spine → leaves 1, 2"
    );
    for h in 4..12u32 {
        let host_port = r.ports.iter().find(|p| p.node == h).unwrap();
        assert!(
            host_port.pauses_rcvd > 0 && host_port.paused_ps > 0,
            "host {h} was paused"
        );
    }
    // Nobody paused the receiver's side of the fabric or the idle hosts.
    for h in 1..4u32 {
        assert_eq!(r.ports.iter().find(|p| p.node == h).unwrap().pauses_rcvd, 0);
    }
    // pfc.txt lists every frame.
    let pfc = output::pfc_txt(&r);
    assert_eq!(
        pfc.lines().count() as u64,
        r.counters.pauses + r.counters.resumes
    );
}

/// ECMP over a k=8 fat tree: single-packet flows between random hosts of
/// different pods spread evenly over the 16 core switches (χ² with 15
/// degrees of freedom below its 0.1 % critical value), and over the four
/// uplinks of every edge switch.
#[test]
fn ecmp_spreads_flows_evenly_over_the_core() {
    use rand::rngs::ChaCha8Rng;
    use rand::{RngExt, SeedableRng};
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let mut flows = Vec::new();
    for i in 0..4000u64 {
        let src = rng.random_range(0..128usize);
        let mut dst = rng.random_range(0..128usize);
        while dst / 16 == src / 16 {
            dst = rng.random_range(0..128usize);
        }
        flows.push(Flow {
            start: i * 200 * 1000, // 200 ns apart: no queueing
            ..flow(src, dst, 512, Op::Write)
        });
    }
    let cfg = Config {
        ecn: Ecn::Off,
        ..Config::default()
    };
    let r = run(cfg, "fattree:k=8", flows);
    assert_eq!(r.counters.flows_done, 4000);
    // Cores are nodes 128 + 32 + 32 .. + 16. Each flow crosses one core
    // with its data packet and one with its ACK: 8000 packets.
    let core0 = 192u32;
    let counts: Vec<u64> = (core0..core0 + 16)
        .map(|c| {
            r.ports
                .iter()
                .filter(|p| p.node == c)
                .map(|p| p.tx_pkts)
                .sum()
        })
        .collect();
    let total: u64 = counts.iter().sum();
    assert_eq!(total, 8000);
    let e = total as f64 / 16.0;
    let chi2: f64 = counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum();
    assert!(chi2 < 37.7, "χ² {chi2:.1} over cores {counts:?}");
    // Not trivially even either: a hash that ignored the flow would put
    // everything on one core per pod pair.
    assert!(counts.iter().all(|&c| c > 0));
}

/// Four switches in a ring, routed clockwise, each host sending two hops
/// on: every ring link carries two flows into a one-flow link, each
/// switch's ring ingress fills with packets waiting for the next ring link,
/// and with PFC all four links end up paused by each other. The simulator
/// finds the cycle and stops; with PFC off the same traffic completes —
/// the dependency needs PFC to deadlock.
#[test]
fn pfc_deadlock_on_a_cyclic_buffer_dependency_is_detected() {
    let flows = |_| {
        (0..4)
            .map(|i| flow(i, (i + 2) % 4, 20_000_000, Op::Write))
            .collect::<Vec<_>>()
    };
    let cfg = Config {
        buffer: 1_000_000,
        ecn: Ecn::Off,
        ..Config::default()
    };
    let r = run(cfg, "ring:n=4", flows(()));
    let d = r.deadlock.as_ref().expect("a deadlock is reported");
    let mut nodes: Vec<u32> = d.ports.iter().map(|p| p.0).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        vec![4, 5, 6, 7],
        "the cycle is the ring: {:?}",
        d.ports
    );
    assert!(r.flows.iter().all(|f| f.end.is_none()));

    let cfg = Config {
        pfc: false,
        buffer: 1_000_000,
        ecn: Ecn::Off,
        ..Config::default()
    };
    let r = run(cfg, "ring:n=4", flows(()));
    assert!(r.deadlock.is_none());
    assert_eq!(r.counters.flows_done, 4);
}

/// The same seed gives byte-identical files; another seed does not.
#[test]
fn outputs_are_deterministic_per_seed() {
    let go = |seed: u64, dir: &std::path::Path| {
        let t = Topology::from_spec("fattree:k=4").unwrap();
        let tr = Traffic::from_spec(
            "fbhadoop:load=0.5,duration=200us",
            &t,
            100_000_000_000,
            seed,
        )
        .unwrap();
        let cfg = Config {
            seed,
            buffer: 1_000_000,
            ..Config::default()
        };
        let r = Fabric::new(cfg, t, tr).unwrap().run();
        output::write_all(dir, &r, serde_json::json!({"seed": seed}), false).unwrap();
    };
    let tmp = tempfile::Builder::new()
        .prefix("softrdma-sim-det-")
        .tempdir()
        .expect("a scratch directory");
    let base = tmp.path();
    let (a, b, c) = (base.join("a"), base.join("b"), base.join("c"));
    go(7, &a);
    go(7, &b);
    go(8, &c);
    let files = [
        "fct.txt",
        "pfc.txt",
        "slowdown.txt",
        "links.csv",
        "qlen.csv",
        "summary.json",
        "fct_slowdown.svg",
        "qlen.svg",
        "pfc.svg",
    ];
    for f in files {
        let x = std::fs::read(a.join(f)).unwrap();
        let y = std::fs::read(b.join(f)).unwrap();
        assert!(x == y, "{f} differs between two runs of seed 7");
    }
    let fa = std::fs::read(a.join("fct.txt")).unwrap();
    assert!(fa.len() > 1000, "the run finished flows");
    assert_ne!(
        fa,
        std::fs::read(c.join("fct.txt")).unwrap(),
        "seed 8 is another run"
    );
}

/// Ring AllReduce as training runs it: 2(n − 1) dependent steps. On a
/// star every step's n flows use disjoint links, so each step takes one
/// chunk's FCT and the whole collective exactly 2(n − 1) of them.
#[test]
fn ring_allreduce_takes_its_steps() {
    let n = 8;
    let t = Topology::from_spec(&format!("star:n={n}")).unwrap();
    let tr = Traffic::from_spec("allreduce:size=8M", &t, 100_000_000_000, 1).unwrap();
    let cfg = Config {
        ecn: Ecn::Off,
        ..Config::default()
    };
    let r = Fabric::new(cfg, t, tr).unwrap().run();
    assert_eq!(r.counters.flows_done as usize, 2 * (n - 1) * n);
    let step = r.flows[0].end.unwrap() - r.flows[0].start;
    let last = r.flows.iter().map(|f| f.end.unwrap()).max().unwrap();
    assert_eq!(last, 2 * (n as u64 - 1) * step);
    // Every flow started when its step began.
    for (i, f) in r.flows.iter().enumerate() {
        assert_eq!(f.start, (i / n) as u64 * step, "flow {i}");
    }
}

/// PFC frames as a port sends them: an XOFF is refreshed only after half
/// its pause time without an XON in between (one live refresh chain per
/// port), so pauses and resumes pair up.
#[test]
fn pfc_refreshes_one_chain_per_xoff() {
    let cfg = Config {
        buffer: 1_000_000,
        ecn: Ecn::Off,
        ..Config::default()
    };
    let flows = (1..=16).map(|s| flow(s, 0, 1_000_000, Op::Write)).collect();
    let r = run(cfg, "star:n=17", flows);
    assert_eq!(r.counters.flows_done, 16);
    assert!(r.counters.pauses > 0);
    // 65535 quanta of 512 bit times at 100 Gb/s, halved.
    let half = 65535 * 512 * 10 / 2;
    let mut last: std::collections::BTreeMap<(u32, u16), (u64, bool)> = Default::default();
    for e in &r.pfc {
        if let Some(&(t, was_pause)) = last.get(&(e.node, e.port)) {
            if e.pause && was_pause {
                assert!(
                    e.t - t >= half,
                    "refresh {} ps after the last XOFF",
                    e.t - t
                );
            }
        }
        last.insert((e.node, e.port), (e.t, e.pause));
    }
    let refreshes = r.counters.pauses - r.counters.resumes;
    assert!(
        refreshes <= r.counters.pauses / 4,
        "{} pauses, {} resumes",
        r.counters.pauses,
        r.counters.resumes
    );
}

/// A UC WRITE ends at its sender when its last packet leaves; the run goes
/// on until that data has arrived.
#[test]
fn a_uc_flow_completes_and_its_data_arrives() {
    let r = run(
        Config {
            ecn: Ecn::Off,
            ..Config::default()
        },
        "dumbbell:n=1",
        vec![flow(0, 1, 1_000_000, Op::UcWrite)],
    );
    assert_eq!(r.counters.flows_done, 1);
    let f = &r.flows[0];
    // The sender finishes after serialising the message at 100 Gb/s ...
    assert!(f.end.unwrap() - f.start >= 1_000_000 * 80);
    // ... and the run ends once the last packet crossed the three links.
    assert!(r.now >= f.end.unwrap() + 3 * PS_PER_US);
    assert_eq!(r.counters.drops, 0);
}

/// Every flow kind moves its bytes from src to dst: WRITE and SEND from the
/// source's requester, READ from the destination's (the source answers).
#[test]
fn write_send_and_read_flows_deliver_their_bytes() {
    for op in [Op::Write, Op::Send, Op::Read, Op::UcWrite] {
        let r = run(
            Config {
                ecn: Ecn::Off,
                sample: PS_PER_US,
                ..Config::default()
            },
            "dumbbell:n=1",
            vec![flow(0, 1, 999_999, op)],
        );
        assert_eq!(r.counters.flows_done, 1, "{op:?}");
        // The last goodput sample (taken after the data arrived) counts
        // every payload byte delivered to the flow's receiving QP.
        let delivered = r.goodput.iter().map(|g| g.2).max().unwrap();
        assert_eq!(delivered, 999_999, "{op:?}");
        // READ's data flows back to the requester at host 1: its FCT adds
        // the request's trip to the WRITE's.
        let f = &r.flows[0];
        assert!(f.end.unwrap() - f.start > 999_999 * 80, "{op:?}");
    }
}

/// Goodput is payload delivered, each byte once: under random loss,
/// go-back-N resends whole windows and the receiver discards everything
/// past a gap, yet the flow's delivered bytes end at its size, never above
/// (before, every data packet that reached the receiver counted, and a
/// 2 MB go-back-N flow "delivered" 3.7 MB). The same for selective repeat.
#[test]
fn goodput_counts_each_payload_byte_once_under_loss() {
    for sr in [false, true] {
        let cfg = Config {
            pfc: false,
            ecn: Ecn::Off,
            link_loss: 0.005,
            selective_repeat: sr,
            qp_timeout: 6,
            sample: 10 * PS_PER_US,
            ..Config::default()
        };
        let r = run(cfg, "star:n=2", vec![flow(0, 1, 2_000_000, Op::Write)]);
        assert_eq!(r.flows[0].status, Some(WcStatus::Success));
        assert!(r.counters.retransmits > 0 && r.counters.drops_random > 0);
        // Never more than the flow carries, at any sample ...
        let most = r.goodput.iter().map(|g| g.2).max().unwrap();
        assert_eq!(most, 2_000_000, "selective repeat {sr}");
        // ... and never decreasing.
        assert!(r.goodput.windows(2).all(|w| w[1].2 >= w[0].2));
    }
}

/// Jain's index is over the flows active in the window, a starved one
/// included: two flows at 1 MB each and one, active throughout, at nothing
/// is 4/6, not the 1.0 of the two that moved (the starved flow used to
/// leave the set). Flows done before the window, or started after it, are
/// not in it.
#[test]
fn jain_counts_a_starved_active_flow() {
    use softrdma_sim::fabric::{Counters, FlowResult};
    use softrdma_sim::PS_PER_MS;
    let ms = PS_PER_MS;
    let f = |start: u64, end: Option<u64>| FlowResult {
        src: 0,
        dst: 1,
        sport: 0,
        size: 10_000_000,
        start,
        end,
        status: end.map(|_| WcStatus::Success),
        standalone: 1,
    };
    // Flows 0 and 1 share the link, 2 is starved (paused, or waiting out a
    // timeout), 3 finished at 0.5 ms, 4 starts at 3 ms.
    let flows = vec![
        f(0, None),
        f(0, None),
        f(0, None),
        f(0, Some(ms / 2)),
        f(3 * ms, None),
    ];
    let mut goodput = Vec::new();
    for t in 0..=4u64 {
        goodput.push((t * ms, 0, t * 1_000_000));
        goodput.push((t * ms, 1, t * 1_000_000));
        goodput.push((t * ms, 2, 5_000));
        goodput.push((t * ms, 3, 700_000));
        if t >= 3 {
            goodput.push((t * ms, 4, (t - 3) * 2_000_000));
        }
    }
    let r = Report {
        topology: "t".into(),
        traffic: "t".into(),
        hosts: 2,
        switches: 1,
        now: 4 * ms,
        wall_s: 0.0,
        counters: Counters::default(),
        flows,
        pfc: Vec::new(),
        qlen: Vec::new(),
        ports: Vec::new(),
        deadlock: None,
        peak_packets: 0,
        goodput,
        sample: ms,
    };
    let j = output::jain(&r, ms, 2 * ms).unwrap();
    assert!((j - 4.0 / 6.0).abs() < 1e-9, "Jain {j}");
    // Without the starved flow in the window (it finished at 0.5 ms in
    // this variant), the two that shared are perfectly fair.
    let mut r2 = r.clone();
    r2.flows[2].end = Some(ms / 2);
    assert_eq!(output::jain(&r2, ms, 2 * ms), Some(1.0));
}
