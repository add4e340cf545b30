//! RC under loss, reordering, duplication and corruption: every message
//! arrives exactly once, in order, byte for byte, and every work request
//! completes in order.

mod support;

use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_netsim::LinkConfig;
use support::*;

const SEC: u64 = 1_000_000_000;

fn lossy(seed: u64, loss: f64) {
    let o = Opts {
        timeout: 8,
        ..Default::default()
    };
    let (mut sim, qa, qb) = pair(seed, 8 << 20, &o);
    let link = LinkConfig::default()
        .delay(5_000)
        .jitter(2_000)
        .loss(loss)
        .reorder(0.05)
        .reorder_delay(20_000)
        .duplicate(0.02)
        .corrupt(0.01);
    sim.set_default_link(link);
    let src = MEM_BASE;
    pattern(sim.node_mut(0), src, 1 << 20, seed as u8);
    let sizes = [1usize, 7, 1024, 1025, 4096, 65_537, 300_001];
    let mut want = Vec::new();
    // Receives for the sends.
    for i in 0..sizes.len() {
        let rb = MEM_BASE + (2 << 20) + i as u64 * 300_032;
        sim.node_mut(1)
            .ep
            .post_recv(
                qb.qpn,
                &RecvWr {
                    wr_id: 100 + i as u64,
                    sgl: &[Sge {
                        addr: rb,
                        length: 300_032,
                        lkey: qb.lkey,
                    }],
                },
            )
            .unwrap();
    }
    for (i, &n) in sizes.iter().enumerate() {
        let h = sim.node_mut(0);
        let sge = [Sge {
            addr: src + i as u64 * 13,
            length: n as u32,
            lkey: qa.lkey,
        }];
        let op = if i % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::Write {
                remote_addr: MEM_BASE + (1 << 20) + i as u64 * 64,
                rkey: qb.rkey,
            }
        };
        h.ep.post_send(
            qa.qpn,
            &SendWr {
                wr_id: i as u64,
                op,
                sgl: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
            },
            &h.mem,
        )
        .unwrap();
        want.push(i as u64);
        // Writes overlap each other; check sends only, plus the last write.
    }
    sim.run_until_idle(60 * SEC).expect("no hang");
    let done = sim.node_mut(0).poll_cq(qa.scq);
    let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        want.iter()
            .map(|&w| (w, WcStatus::Success))
            .collect::<Vec<_>>(),
        "seed {seed}"
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    let sends: Vec<usize> = (0..sizes.len()).filter(|i| i % 2 == 0).collect();
    assert_eq!(rc.len(), sends.len());
    for (k, &i) in sends.iter().enumerate() {
        assert_eq!(rc[k].wr_id, 100 + k as u64);
        assert_eq!(rc[k].byte_len as usize, sizes[i]);
        let rb = MEM_BASE + (2 << 20) + k as u64 * 300_032;
        let exp = sim
            .node(0)
            .mem
            .slice(src + i as u64 * 13, sizes[i])
            .to_vec();
        assert_eq!(
            sim.node(1).mem.slice(rb, sizes[i]),
            &exp[..],
            "send {i} seed {seed}"
        );
    }
    let s = sim.node(0).ep.stats();
    eprintln!(
        "seed {seed}: {s:?} icrc drops {}/{}",
        sim.node(0).icrc_drops,
        sim.node(1).icrc_drops
    );
}

#[test]
fn lossy_links_deliver_everything() {
    for seed in 1..=12 {
        lossy(seed, 0.10);
    }
}

/// Go-back-N's known cost, measured: how many packets a 4 MiB WRITE
/// (1024 packets at MTU 4096, a 256-packet window) takes at a given loss
/// rate. Printed for docs/PERFORMANCE.md (`-- --nocapture`); what is
/// asserted is only that everything arrives.
#[test]
fn go_back_n_cost() {
    const PKTS: u64 = 1024;
    for loss in [0.001, 0.01, 0.05, 0.10] {
        let mut sent = 0;
        let seeds = 1..=3u64;
        for seed in seeds.clone() {
            let o = Opts {
                mtu: softrdma_core::qp::attr::Mtu::B4096,
                timeout: 8,
                ..Default::default()
            };
            let (mut sim, qa, qb) = pair(seed, 9 << 20, &o);
            sim.set_default_link(LinkConfig::default().delay(5_000).loss(loss));
            let len = (PKTS * 4096) as u32;
            pattern(sim.node_mut(0), MEM_BASE, len as usize, seed as u8);
            let op = SendOp::Write {
                remote_addr: MEM_BASE + (4 << 20),
                rkey: qb.rkey,
            };
            sim.node_mut(0)
                .post(&qa, 1, op, MEM_BASE, len, SendFlags::SIGNALED)
                .unwrap();
            sim.run_until_idle(60 * SEC).expect("no hang");
            let done = sim.node_mut(0).poll_cq(qa.scq);
            assert_eq!(statuses(&done), [(1, WcStatus::Success)]);
            assert_eq!(
                sim.node(1).mem.slice(MEM_BASE + (4 << 20), len as usize),
                sim.node(0).mem.slice(MEM_BASE, len as usize)
            );
            sent += sim.node(0).ep.stats().tx_packets;
        }
        let per_run = sent as f64 / 3.0;
        eprintln!(
            "loss {:>5.1}%: {per_run:>7.0} packets for {PKTS} ({:.1}x)",
            loss * 100.0,
            per_run / PKTS as f64
        );
    }
}
