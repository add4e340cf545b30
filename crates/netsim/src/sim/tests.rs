//! Tests of the simulator and of each link impairment, driven through
//! `Sim` with a small scripted node.
//!
//! Every run is deterministic, so where an impairment is random the tests
//! assert two things: the exact counts repeat between two runs with the same
//! seed, and they fall in a generous band (about five standard deviations)
//! around the configured probability.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use super::*;
use crate::{MICROSECOND, MILLISECOND, SECOND};

/// What a `TestNode` saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Packet {
        at: Nanos,
        from: NodeId,
        bytes: Vec<u8>,
    },
    Timeout {
        at: Nanos,
    },
}

/// A scripted node: sends what is in its outbox, optionally echoes what it
/// receives, and keeps a timer that can re-arm itself.
#[derive(Debug, Default)]
struct TestNode {
    outbox: VecDeque<(NodeId, Vec<u8>)>,
    echo: bool,
    timer: Option<Nanos>,
    /// After firing, re-arm this far ahead (forever).
    rearm_every: Option<Nanos>,
    /// Never clear the timer when it fires (a buggy node).
    sticky_timer: bool,
    seen: Vec<Seen>,
}

impl TestNode {
    /// Queues `count` datagrams of `size` bytes to `to`, each starting with
    /// its sequence number (u32, little endian) and filled with a pattern.
    fn sender(to: NodeId, count: u32, size: usize) -> Self {
        assert!(size >= 4);
        let mut node = Self::default();
        for seq in 0..count {
            node.outbox.push_back((to, datagram(seq, size)));
        }
        node
    }

    fn echo() -> Self {
        Self {
            echo: true,
            ..Self::default()
        }
    }

    fn with_timer(at: Nanos) -> Self {
        Self {
            timer: Some(at),
            ..Self::default()
        }
    }

    fn packets(&self) -> impl Iterator<Item = (Nanos, NodeId, &[u8])> + '_ {
        self.seen.iter().filter_map(|s| match s {
            Seen::Packet { at, from, bytes } => Some((*at, *from, bytes.as_slice())),
            Seen::Timeout { .. } => None,
        })
    }

    fn received_seqs(&self) -> Vec<u32> {
        self.packets().map(|(_, _, b)| seq_of(b)).collect()
    }

    fn fired(&self) -> Vec<Nanos> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Timeout { at } => Some(*at),
                Seen::Packet { .. } => None,
            })
            .collect()
    }
}

impl Node for TestNode {
    fn handle_packet(&mut self, now: Nanos, from: NodeId, bytes: &[u8]) {
        self.seen.push(Seen::Packet {
            at: now,
            from,
            bytes: bytes.to_vec(),
        });
        if self.echo {
            self.outbox.push_back((from, bytes.to_vec()));
        }
    }

    fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<(NodeId, usize)> {
        let (to, bytes) = self.outbox.pop_front()?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        Some((to, bytes.len()))
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        self.timer
    }

    fn handle_timeout(&mut self, now: Nanos) {
        self.seen.push(Seen::Timeout { at: now });
        if !self.sticky_timer {
            self.timer = self.rearm_every.map(|period| now + period);
        }
    }
}

fn datagram(seq: u32, size: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..size)
        .map(|i| (i as u8).wrapping_mul(31) ^ 0x5a)
        .collect();
    bytes[..4].copy_from_slice(&seq.to_le_bytes());
    bytes
}

fn seq_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

/// Node 0 sends `count` datagrams of `size` bytes at time 0 to node 1 over
/// `cfg`; the simulation runs until idle.
fn blast(seed: u64, cfg: LinkConfig, count: u32, size: usize) -> Sim<TestNode> {
    let mut sim = Sim::new(seed);
    let a = sim.add_node(TestNode::sender(1, count, size));
    let b = sim.add_node(TestNode::default());
    sim.set_link(a, b, cfg);
    sim.run_until_idle(10 * SECOND).expect("a blast settles");
    sim
}

/// `lo..=hi` is about five standard deviations of a binomial(n, p) count.
fn band(n: u64, p: f64) -> std::ops::RangeInclusive<u64> {
    let mean = n as f64 * p;
    let spread = 5.0 * (mean * (1.0 - p)).sqrt();
    ((mean - spread).max(0.0) as u64)..=((mean + spread) as u64)
}

// ---- The event loop ------------------------------------------------------

#[test]
fn empty_sim_has_nothing_to_do() {
    let mut sim: Sim<TestNode> = Sim::new(0);
    assert!(!sim.step());
    assert_eq!(sim.run_until_idle(SECOND), Ok(0));
    assert_eq!(sim.now(), 0);
}

#[test]
fn perfect_link_delivers_everything_in_order_after_the_delay() {
    let sim = blast(1, LinkConfig::default(), 100, 64);
    let b = sim.node(1);
    assert_eq!(b.received_seqs(), (0..100).collect::<Vec<_>>());
    assert!(b.packets().all(|(at, from, bytes)| at == MICROSECOND
        && from == 0
        && bytes == datagram(seq_of(bytes), 64)));
    assert_eq!(
        sim.link_stats(0, 1),
        LinkStats {
            sent: 100,
            delivered: 100,
            ..LinkStats::default()
        }
    );
    assert_eq!(sim.link_stats(1, 0), LinkStats::default());
    assert_eq!(sim.now(), MICROSECOND);
}

#[test]
fn step_handles_one_event_at_a_time() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::sender(1, 2, 8));
    sim.add_node(TestNode::with_timer(5 * MICROSECOND));
    assert!(sim.step());
    assert_eq!(sim.node(1).seen.len(), 1);
    assert_eq!(sim.in_flight(), 1);
    assert!(sim.step());
    assert_eq!(sim.node(1).seen.len(), 2);
    assert!(sim.step());
    assert_eq!(sim.node(1).fired(), vec![5 * MICROSECOND]);
    assert!(!sim.step());
    assert_eq!(sim.now(), 5 * MICROSECOND);
}

#[test]
fn echo_round_trip_takes_two_delays() {
    let mut sim = Sim::new(0);
    sim.set_default_link(LinkConfig::default().delay(10 * MICROSECOND));
    sim.add_node(TestNode::sender(1, 1, 16));
    sim.add_node(TestNode::echo());
    assert_eq!(sim.run_until_idle(SECOND), Ok(20 * MICROSECOND));
    assert_eq!(
        sim.node(0).packets().next(),
        Some((20 * MICROSECOND, 1, &datagram(0, 16)[..]))
    );
}

#[test]
fn per_pair_override_beats_the_default() {
    let mut sim = Sim::new(0);
    sim.set_default_link(LinkConfig::default().loss(1.0));
    sim.add_node(TestNode::sender(1, 10, 8));
    sim.add_node(TestNode::echo());
    sim.set_link(0, 1, LinkConfig::default());
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(sim.link_stats(0, 1).delivered, 10);
    assert_eq!(sim.link_stats(1, 0).dropped_loss, 10);
    assert_eq!(sim.node(0).packets().count(), 0);
    assert_eq!(sim.link_config(1, 0).loss, 1.0);

    // A new default applies to links without an override, even ones that
    // have carried traffic already.
    sim.set_default_link(LinkConfig::default());
    sim.node_mut(0).outbox.push_back((1, datagram(99, 8)));
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(sim.node(0).received_seqs(), vec![99]);
}

#[test]
fn inject_puts_a_datagram_on_the_link() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::default());
    sim.add_node(TestNode::default());
    sim.inject(0, 1, b"forged");
    assert_eq!(sim.run_until_idle(SECOND), Ok(MICROSECOND));
    assert_eq!(
        sim.node(1).seen,
        vec![Seen::Packet {
            at: MICROSECOND,
            from: 0,
            bytes: b"forged".to_vec()
        }]
    );
    assert_eq!(sim.link_stats(0, 1).delivered, 1);
}

#[test]
fn capture_sees_every_datagram_handed_to_a_link() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut sim = Sim::new(0);
    let sink = Rc::clone(&log);
    sim.set_capture(move |at, from, to, bytes: &[u8]| {
        sink.borrow_mut().push((at, from, to, seq_of(bytes)))
    });
    sim.add_node(TestNode::sender(1, 5, 8));
    sim.add_node(TestNode::default());
    sim.set_link(0, 1, LinkConfig::default().loss(1.0));
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(
        *log.borrow(),
        (0..5).map(|s| (0, 0, 1, s)).collect::<Vec<_>>()
    );
    assert_eq!(sim.link_stats(0, 1).dropped_loss, 5);

    sim.clear_capture();
    sim.inject(0, 1, &datagram(7, 8));
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(log.borrow().len(), 5);
}

#[test]
fn boxed_nodes_can_share_a_simulation() {
    let mut sim: Sim<Box<dyn Node>> = Sim::new(0);
    sim.add_node(Box::new(TestNode::sender(1, 3, 8)));
    sim.add_node(Box::new(TestNode::echo()));
    assert_eq!(sim.run_until_idle(SECOND), Ok(2 * MICROSECOND));
    assert_eq!(sim.link_stats(1, 0).delivered, 3);
}

#[test]
#[should_panic(expected = "node 0 sent to node 5, which does not exist")]
fn sending_to_a_missing_node_panics() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::sender(5, 1, 8));
    sim.step();
}

#[test]
#[should_panic(expected = "link 0 -> 1: link reorder probability 2 is outside")]
fn set_link_rejects_an_invalid_config() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::default());
    sim.add_node(TestNode::default());
    sim.set_link(
        0,
        1,
        LinkConfig {
            reorder: 2.0,
            ..LinkConfig::default()
        },
    );
}

// ---- Determinism ---------------------------------------------------------

/// Everything observable about a run: every datagram sent and every event
/// each node saw.
type Trace = (
    Vec<(Nanos, NodeId, NodeId, Vec<u8>)>,
    Vec<Vec<Seen>>,
    LinkStats,
);

fn impaired_echo_run(seed: u64) -> Trace {
    let cfg = LinkConfig::default()
        .delay(5 * MICROSECOND)
        .jitter(3 * MICROSECOND)
        .loss(0.05)
        .duplicate(0.05)
        .reorder(0.1)
        .reorder_delay(20 * MICROSECOND)
        .corrupt(0.05)
        .bandwidth_bps(Some(10_000_000_000))
        .queue_limit(256);
    let captured = Rc::new(RefCell::new(Vec::new()));
    let mut sim = Sim::new(seed);
    sim.set_default_link(cfg);
    let sink = Rc::clone(&captured);
    sim.set_capture(move |at, from, to, bytes: &[u8]| {
        sink.borrow_mut().push((at, from, to, bytes.to_vec()))
    });
    let mut a = TestNode::sender(1, 2000, 200);
    a.timer = Some(50 * MICROSECOND);
    a.rearm_every = Some(50 * MICROSECOND);
    let mut b = TestNode::echo();
    b.timer = Some(0);
    b.rearm_every = Some(30 * MICROSECOND);
    sim.add_node(a);
    sim.add_node(b);
    sim.run_until(2 * MILLISECOND);
    let seen = sim.nodes().iter().map(|n| n.seen.clone()).collect();
    let stats = sim.total_stats();
    drop(sim);
    let captured = Rc::try_unwrap(captured).unwrap().into_inner();
    (captured, seen, stats)
}

#[test]
fn same_seed_gives_an_identical_trace() {
    let first = impaired_echo_run(7);
    let second = impaired_echo_run(7);
    // The run must have exercised every impairment to prove anything.
    let stats = first.2;
    assert!(stats.dropped_loss > 0 && stats.dropped_queue > 0 && stats.duplicated > 0);
    assert!(stats.reordered > 0 && stats.corrupted > 0);
    assert!(first.0 == second.0, "captures differ");
    assert!(first.1 == second.1, "node observations differ");
    assert_eq!(first.2, second.2);
}

#[test]
fn another_seed_gives_another_trace() {
    assert!(impaired_echo_run(7) != impaired_echo_run(8));
}

#[test]
fn traffic_on_one_link_does_not_shift_another_links_randomness() {
    let lossy = LinkConfig::default().loss(0.3);
    let run = |with_neighbour: bool| {
        let mut sim = Sim::new(3);
        sim.set_default_link(lossy.clone());
        sim.add_node(TestNode::sender(1, 1000, 8));
        sim.add_node(TestNode::default());
        if with_neighbour {
            sim.add_node(TestNode::sender(1, 1000, 8));
        }
        sim.run_until_idle(SECOND).unwrap();
        sim.node(1)
            .packets()
            .filter(|p| p.1 == 0)
            .map(|p| seq_of(p.2))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(false), run(true));
}

// ---- Impairments ---------------------------------------------------------

#[test]
fn loss_rate_matches_the_probability() {
    let cfg = LinkConfig::default().loss(0.1);
    let stats = blast(11, cfg.clone(), 10_000, 16).link_stats(0, 1);
    assert_eq!(stats, blast(11, cfg, 10_000, 16).link_stats(0, 1));
    assert!(band(10_000, 0.1).contains(&stats.dropped_loss), "{stats:?}");
    assert_eq!(stats.delivered + stats.dropped_loss, 10_000);
    assert_eq!(stats.in_flight(), 0);
}

#[test]
fn total_loss_delivers_nothing() {
    let sim = blast(0, LinkConfig::default().loss(1.0), 100, 8);
    assert_eq!(sim.node(1).seen, vec![]);
    assert_eq!(sim.link_stats(0, 1).dropped_loss, 100);
}

#[test]
fn duplicate_delivers_some_datagrams_twice() {
    let cfg = LinkConfig::default().duplicate(0.1);
    let sim = blast(12, cfg.clone(), 10_000, 16);
    let stats = sim.link_stats(0, 1);
    assert_eq!(stats, blast(12, cfg, 10_000, 16).link_stats(0, 1));
    assert!(band(10_000, 0.1).contains(&stats.duplicated), "{stats:?}");
    assert_eq!(stats.delivered, 10_000 + stats.duplicated);

    let mut copies = vec![0u32; 10_000];
    for seq in sim.node(1).received_seqs() {
        copies[seq as usize] += 1;
    }
    assert!(copies.iter().all(|&c| c == 1 || c == 2));
    assert_eq!(
        copies.iter().filter(|&&c| c == 2).count() as u64,
        stats.duplicated
    );
}

#[test]
fn reorder_lets_later_datagrams_overtake() {
    // 100-byte datagrams at 1 Gbit/s leave every 800 ns, so a datagram held
    // back 5 µs is overtaken by the next six.
    let cfg = LinkConfig::default()
        .bandwidth_bps(Some(1_000_000_000))
        .reorder(0.1)
        .reorder_delay(5 * MICROSECOND);
    let sim = blast(13, cfg.clone(), 10_000, 100);
    let stats = sim.link_stats(0, 1);
    assert_eq!(stats, blast(13, cfg, 10_000, 100).link_stats(0, 1));
    assert!(band(10_000, 0.1).contains(&stats.reordered), "{stats:?}");

    let seqs = sim.node(1).received_seqs();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..10_000).collect::<Vec<_>>(),
        "each datagram exactly once"
    );
    // A datagram arrived late if a higher sequence number arrived before it.
    let mut highest = 0;
    let mut late = 0;
    for &seq in &seqs {
        if seq < highest {
            late += 1;
        }
        highest = highest.max(seq);
    }
    assert!(
        late > 0 && late <= stats.reordered,
        "late {late}, {stats:?}"
    );
    // Only reordered datagrams at the very end have nobody behind them to
    // overtake them.
    assert!(late + 3 >= stats.reordered, "late {late}, {stats:?}");
}

#[test]
fn jitter_alone_never_reorders() {
    let cfg = LinkConfig::default()
        .bandwidth_bps(Some(1_000_000_000))
        .jitter(50 * MICROSECOND);
    let sim = blast(14, cfg, 1000, 100);
    let b = sim.node(1);
    assert_eq!(b.received_seqs(), (0..1000).collect::<Vec<_>>());
    let times: Vec<Nanos> = b.packets().map(|p| p.0).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    // The jitter did spread arrivals beyond pure serialization spacing.
    assert!(times.windows(2).any(|w| w[1] - w[0] > 800));
    assert!(times[0] >= 800 + MICROSECOND && times[0] <= 800 + 51 * MICROSECOND);
}

#[test]
fn corrupt_flips_exactly_one_bit() {
    let size = 64;
    let cfg = LinkConfig::default().corrupt(0.25);
    let sim = blast(15, cfg.clone(), 10_000, size);
    let stats = sim.link_stats(0, 1);
    assert_eq!(stats, blast(15, cfg, 10_000, size).link_stats(0, 1));
    assert!(band(10_000, 0.25).contains(&stats.corrupted), "{stats:?}");

    // Deliveries are in order on this link, so the i-th arrival came from
    // datagram i whatever happened to its sequence number.
    let mut corrupted = 0;
    let mut bytes_hit = std::collections::BTreeSet::new();
    for (i, (_, _, got)) in sim.node(1).packets().enumerate() {
        let sent = datagram(i as u32, size);
        let diff: Vec<u8> = got.iter().zip(&sent).map(|(g, s)| g ^ s).collect();
        match diff.iter().map(|d| d.count_ones()).sum::<u32>() {
            0 => {}
            1 => {
                corrupted += 1;
                bytes_hit.insert(diff.iter().position(|&d| d != 0).unwrap());
            }
            n => panic!("datagram {i} has {n} flipped bits"),
        }
    }
    assert_eq!(corrupted, stats.corrupted);
    assert_eq!(
        bytes_hit.len(),
        size,
        "every byte position gets hit over 2500 flips"
    );
}

#[test]
fn bandwidth_serializes_back_to_back() {
    // 1000 bytes at 1 Gbit/s is 8 µs on the wire.
    let cfg = LinkConfig::default().bandwidth_bps(Some(1_000_000_000));
    let sim = blast(0, cfg, 10, 1000);
    let times: Vec<Nanos> = sim.node(1).packets().map(|p| p.0).collect();
    let expected: Vec<Nanos> = (1..=10)
        .map(|k| k * 8 * MICROSECOND + MICROSECOND)
        .collect();
    assert_eq!(times, expected);
}

#[test]
fn queue_limit_drops_the_tail() {
    let cfg = LinkConfig::default()
        .bandwidth_bps(Some(1_000_000_000))
        .queue_limit(4);
    let mut sim = blast(0, cfg, 10, 1000);
    assert_eq!(sim.node(1).received_seqs(), vec![0, 1, 2, 3]);
    let stats = sim.link_stats(0, 1);
    assert_eq!(
        (stats.sent, stats.delivered, stats.dropped_queue),
        (10, 4, 6)
    );

    // Once the queue has drained the link takes a full burst again.
    for seq in 10..20 {
        sim.node_mut(0).outbox.push_back((1, datagram(seq, 1000)));
    }
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(
        sim.node(1).received_seqs(),
        vec![0, 1, 2, 3, 10, 11, 12, 13]
    );
}

#[test]
fn queue_frees_a_slot_per_serialization_time() {
    // Queue of 1: a datagram offered while the previous one is still on the
    // wire is dropped; one offered after it left is accepted.
    let cfg = LinkConfig::default()
        .bandwidth_bps(Some(1_000_000_000))
        .queue_limit(1);
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::default());
    sim.add_node(TestNode::default());
    sim.set_link(0, 1, cfg);
    sim.inject(0, 1, &datagram(0, 1000));
    sim.run_until(7 * MICROSECOND);
    sim.inject(0, 1, &datagram(1, 1000));
    sim.run_until(8 * MICROSECOND);
    sim.inject(0, 1, &datagram(2, 1000));
    sim.run_until_idle(SECOND).unwrap();
    assert_eq!(sim.node(1).received_seqs(), vec![0, 2]);
    assert_eq!(sim.link_stats(0, 1).dropped_queue, 1);
}

// ---- Timers and run loops ------------------------------------------------

#[test]
fn timeout_fires_at_the_requested_virtual_time() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::with_timer(5 * MILLISECOND));
    assert_eq!(sim.run_until_idle(SECOND), Ok(5 * MILLISECOND));
    assert_eq!(sim.node(0).fired(), vec![5 * MILLISECOND]);
}

#[test]
fn a_past_deadline_fires_now() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::default());
    sim.run_until(3 * MILLISECOND);
    sim.node_mut(0).timer = Some(MILLISECOND);
    assert!(sim.step());
    assert_eq!(sim.node(0).fired(), vec![3 * MILLISECOND]);
    assert_eq!(sim.now(), 3 * MILLISECOND);
}

#[test]
fn run_until_stops_at_the_deadline_and_moves_the_clock_there() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::with_timer(5 * MILLISECOND));
    sim.run_until(3 * MILLISECOND);
    assert_eq!(sim.now(), 3 * MILLISECOND);
    assert_eq!(sim.node(0).fired(), vec![]);
    sim.run_until(5 * MILLISECOND);
    assert_eq!(sim.node(0).fired(), vec![5 * MILLISECOND]);
}

#[test]
fn deliveries_go_before_timers_at_the_same_instant_and_timers_by_node_id() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::with_timer(MICROSECOND));
    sim.add_node(TestNode::with_timer(MICROSECOND));
    sim.inject(1, 0, b"pkt!");
    sim.inject(0, 1, b"pkt!");
    sim.run_until_idle(SECOND).unwrap();
    let packet = |from| Seen::Packet {
        at: MICROSECOND,
        from,
        bytes: b"pkt!".to_vec(),
    };
    assert_eq!(
        sim.node(0).seen,
        vec![packet(1), Seen::Timeout { at: MICROSECOND }]
    );
    assert_eq!(
        sim.node(1).seen,
        vec![packet(0), Seen::Timeout { at: MICROSECOND }]
    );
}

#[test]
fn run_until_idle_reports_a_timer_that_rearms_forever() {
    let mut sim = Sim::new(0);
    let mut forever = TestNode::with_timer(MILLISECOND);
    forever.rearm_every = Some(MILLISECOND);
    sim.add_node(forever);
    let err = sim.run_until_idle(10 * MILLISECOND).unwrap_err();
    assert_eq!(
        err,
        Stalled {
            now: 10 * MILLISECOND,
            reason: StallReason::Deadline {
                next_event: 11 * MILLISECOND
            }
        }
    );
    assert_eq!(
        sim.node(0).fired(),
        (1..=10).map(|k| k * MILLISECOND).collect::<Vec<_>>()
    );
    assert!(err.to_string().contains("still busy at 10000000 ns"));
}

#[test]
#[should_panic(expected = "livelock")]
fn a_timer_never_cleared_panics_instead_of_hanging() {
    let mut sim = Sim::new(0);
    let mut stuck = TestNode::with_timer(0);
    stuck.sticky_timer = true;
    sim.add_node(stuck);
    let _ = sim.run_until_idle(SECOND);
}

#[test]
fn run_while_stops_when_the_condition_fails() {
    let cfg = LinkConfig::default().bandwidth_bps(Some(1_000_000_000));
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::sender(1, 10, 1000));
    sim.add_node(TestNode::default());
    sim.set_link(0, 1, cfg);
    let stopped = sim.run_while(SECOND, |s| s.node(1).seen.len() < 5);
    assert_eq!(stopped, Ok(5 * 8 * MICROSECOND + MICROSECOND));
    assert_eq!(sim.in_flight(), 5);
}

#[test]
fn run_while_reports_going_idle_and_running_out_of_time() {
    let mut sim = Sim::new(0);
    sim.add_node(TestNode::sender(1, 1, 8));
    sim.add_node(TestNode::default());
    assert_eq!(
        sim.run_while(SECOND, |_| true),
        Err(Stalled {
            now: MICROSECOND,
            reason: StallReason::Idle
        })
    );

    sim.node_mut(1).timer = Some(2 * SECOND);
    assert_eq!(
        sim.run_while(SECOND, |_| true),
        Err(Stalled {
            now: SECOND,
            reason: StallReason::Deadline {
                next_event: 2 * SECOND
            }
        })
    );
}
