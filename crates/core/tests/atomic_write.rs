//! RDMA ATOMIC WRITE (IBA 1.5), RC: the 8 bytes land as one word, the wire
//! carries opcode 0x1d with a RETH of length 8, and everything else is
//! refused as rxe refuses it — at post for what the requester can see, by
//! an Invalid Request or Remote Access NAK for what only the responder can.

mod support;

use softrdma_core::qp::attr::{AccessFlags, AttrMask, QpAttr};
use softrdma_core::qp::state::QpState;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::Error;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const SEC: u64 = 1_000_000_000;

fn aw(remote_addr: u64, rkey: u32) -> SendOp {
    SendOp::AtomicWrite { remote_addr, rkey }
}

#[test]
fn the_word_lands_whole_and_completes_as_atomic_write() {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    let src = region(0);
    let dst = region(0) + 4096;
    let word = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
    sim.node_mut(0).mem.slice_mut(src, 8).copy_from_slice(&word);
    sim.node_mut(1).mem.slice_mut(dst - 8, 24).fill(0xee);
    sim.node_mut(0)
        .post(&qa, 7, aw(dst, qb.rkey), src, 8, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        ["A ATOMIC_WRITE 100 ackreq", "B ACKNOWLEDGE 100 [ACK msn=1]"]
    );
    // Exactly the word, in memory order; its neighbours untouched.
    let b = sim.node(1).mem.slice(dst - 8, 24).to_vec();
    assert_eq!(&b[..8], &[0xee; 8]);
    assert_eq!(&b[8..16], &word);
    assert_eq!(&b[16..], &[0xee; 8]);
    let c = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (7, WcStatus::Success, WcOpcode::AtomicWrite)
    );
}

#[test]
fn the_requester_refuses_what_is_not_one_aligned_word() {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    let a = sim.node_mut(0);
    let dst = region(0) + 4096;
    for (len, remote, why) in [
        (4, dst, "an ATOMIC WRITE carries exactly 8 bytes"),
        (16, dst, "an ATOMIC WRITE carries exactly 8 bytes"),
        (
            8,
            dst + 4,
            "ATOMIC WRITE target address is not 8-byte aligned",
        ),
    ] {
        let r = a.post(&qa, 1, aw(remote, qb.rkey), region(0), len, SIG);
        assert!(
            matches!(r, Err(Error::InvalidArgument(w)) if w == why),
            "{len} bytes at {remote:#x}: {r:?}"
        );
    }
}

#[test]
fn an_atomic_write_on_a_uc_qp_is_refused() {
    let o = Opts {
        qp_type: softrdma_core::qp::state::QpType::Uc,
        ..Opts::default()
    };
    let (mut sim, qa, qb) = pair(1, 1 << 20, &o);
    let r = sim
        .node_mut(0)
        .post(&qa, 1, aw(region(0), qb.rkey), region(0), 8, SIG);
    assert!(matches!(r, Err(Error::UnsupportedOp { .. })), "{r:?}");
}

#[test]
fn without_remote_write_it_is_an_access_error() {
    let (mut sim, qa, qb) = pair(1, 1 << 20, &Opts::default());
    let t = trace(&mut sim, &[0, 1]);
    let attr = QpAttr {
        qp_access_flags: AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_READ)
            .union(AccessFlags::REMOTE_ATOMIC),
        ..Default::default()
    };
    sim.node_mut(1)
        .ep
        .modify_qp(qb.qpn, &attr, AttrMask::ACCESS_FLAGS)
        .unwrap();
    let dst = region(0) + 4096;
    sim.node_mut(1).mem.slice_mut(dst, 8).fill(0xee);
    sim.node_mut(0)
        .post(&qa, 1, aw(dst, qb.rkey), region(0), 8, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A ATOMIC_WRITE 100 ackreq",
            "B ACKNOWLEDGE 100 [NAK-ACCESS msn=0]"
        ]
    );
    let c = sim.node_mut(0).poll_cq(qa.scq);
    assert_eq!(statuses(&c), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(sim.node(0).ep.qp(qa.qpn).unwrap().state, QpState::Err);
    assert_eq!(sim.node(1).mem.slice(dst, 8), &[0xee; 8]);
}
