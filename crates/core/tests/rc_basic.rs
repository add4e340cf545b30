//! RC end to end on the simulator: every operation moves exact bytes.

mod support;

use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use support::*;

const SEC: u64 = 1_000_000_000;

#[test]
fn write_send_read_atomics_move_exact_bytes() {
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(1, 8 << 20, &o);
    let src = MEM_BASE;
    let dst = MEM_BASE + (4 << 20);
    let len = 1_000_003usize;
    pattern(sim.node_mut(0), src, len, 7);
    // Receiver posts a buffer for the SEND.
    let rbuf = MEM_BASE + (2 << 20);
    sim.node_mut(1)
        .ep
        .post_recv(
            qb.qpn,
            &RecvWr {
                wr_id: 9,
                sgl: &[Sge {
                    addr: rbuf,
                    length: 5000,
                    lkey: qb.lkey,
                }],
            },
        )
        .unwrap();
    let h = sim.node_mut(0);
    let sge = [Sge {
        addr: src,
        length: len as u32,
        lkey: qa.lkey,
    }];
    h.ep.post_send(
        qa.qpn,
        &SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: dst,
                rkey: qb.rkey,
            },
            sgl: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        &h.mem,
    )
    .unwrap();
    let sge2 = [Sge {
        addr: src,
        length: 4321,
        lkey: qa.lkey,
    }];
    h.ep.post_send(
        qa.qpn,
        &SendWr {
            wr_id: 2,
            op: SendOp::SendWithImm { imm: 0xabcd },
            sgl: &sge2,
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        &h.mem,
    )
    .unwrap();
    // Read back what was written into a third place.
    let back = MEM_BASE + (6 << 20);
    let sge3 = [Sge {
        addr: back,
        length: len as u32,
        lkey: qa.lkey,
    }];
    h.ep.post_send(
        qa.qpn,
        &SendWr {
            wr_id: 3,
            op: SendOp::Read {
                remote_addr: dst,
                rkey: qb.rkey,
            },
            sgl: &sge3,
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        &h.mem,
    )
    .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let a = sim.node_mut(0);
    let done = a.poll_cq(qa.scq);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(done[2].opcode, WcOpcode::RdmaRead);
    let want = sim.node(0).mem.slice(src, len).to_vec();
    assert_eq!(sim.node(1).mem.slice(dst, len), &want[..]);
    assert_eq!(sim.node(0).mem.slice(back, len), &want[..]);
    assert_eq!(sim.node(1).mem.slice(rbuf, 4321), &want[..4321]);
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].byte_len, rc[0].imm_or_inv),
        (9, 4321, 0xabcd)
    );

    // Atomics: fetch-add then compare-swap on an 8-byte word.
    let word = MEM_BASE + (7 << 20);
    sim.node_mut(1)
        .mem
        .slice_mut(word, 8)
        .copy_from_slice(&40u64.to_ne_bytes());
    let res = MEM_BASE + 64;
    let h = sim.node_mut(0);
    let s = [Sge {
        addr: res,
        length: 8,
        lkey: qa.lkey,
    }];
    h.ep.post_send(
        qa.qpn,
        &SendWr {
            wr_id: 4,
            op: SendOp::FetchAdd {
                remote_addr: word,
                rkey: qb.rkey,
                add: 2,
            },
            sgl: &s,
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        &h.mem,
    )
    .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(sim.node(0).mem.slice(res, 8), &40u64.to_ne_bytes());
    let h = sim.node_mut(0);
    h.ep.post_send(
        qa.qpn,
        &SendWr {
            wr_id: 5,
            op: SendOp::CompareSwap {
                remote_addr: word,
                rkey: qb.rkey,
                compare: 42,
                swap: 7,
            },
            sgl: &s,
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        &h.mem,
    )
    .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(sim.node(0).mem.slice(res, 8), &42u64.to_ne_bytes());
    assert_eq!(sim.node(1).mem.slice(word, 8), &7u64.to_ne_bytes());
    let done = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(
        done.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (4, WcStatus::Success, WcOpcode::FetchAdd),
            (5, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
}
