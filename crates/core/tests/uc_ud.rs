//! UC and UD: no acknowledgements and no retransmission. UC drops the rest
//! of a message after a PSN gap and reuses its receive for the next
//! message; UD checks the Q_Key, carries one packet per message, and
//! delivers the 40-byte GRH at the start of the receive buffer.

mod support;

use softrdma_core::qp::attr::{AttrMask, QpAttr};
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::wc::{wc_flags, WcOpcode, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp, SendWr, Sge, UdDest};
use softrdma_core::Error;
use softrdma_netsim::Sim;
use softrdma_wire::Psn;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 1 << 20;
const QKEY: u32 = 0x1111_1111; // what `connect` gives every QP

fn setup(t: QpType) -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let o = Opts {
        qp_type: t,
        ..Default::default()
    };
    let (mut sim, qa, qb) = pair(1, MEM, &o);
    let tr = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, tr)
}

// ---- UC ----------------------------------------------------------------------

#[test]
fn uc_psn_gap_drops_the_rest_of_the_message_and_reuses_its_receive() {
    let (mut sim, qa, qb, t) = setup(QpType::Uc);
    let b = sim.node_mut(1);
    b.post_recv(&qb, 70, region(0), 4096);
    b.post_recv(&qb, 71, region(0) + 4096, 4096);
    pattern(sim.node_mut(0), region(0), 4000, 1);
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(101));
    a.post(&qa, 1, SendOp::Send, region(0), 3000, SIG).unwrap();
    a.post(
        &qa,
        2,
        SendOp::SendWithImm { imm: 9 },
        region(0) + 3000,
        500,
        SIG,
    )
    .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A UC_SEND_FIRST 100",
            "A UC_SEND_MIDDLE 101 DROPPED",
            "A UC_SEND_LAST 102",
            "A UC_SEND_ONLY_IMMEDIATE 103",
        ]
    );
    // The sender completes each message once it is on the wire.
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // The first message is lost; the receive it had taken gets the second.
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!((rc[0].byte_len, rc[0].imm_or_inv), (500, 9));
    assert_eq!(
        sim.node(1).mem.slice(region(0), 500),
        sim.node(0).mem.slice(region(0) + 3000, 500)
    );
    assert_eq!(sim.node(1).ep.stats().dropped_messages, 1);
    // Receive 71 is still there for the next message.
    sim.node_mut(0)
        .post(&qa, 3, SendOp::Send, region(0), 10, SIG)
        .unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(71, WcStatus::Success)]
    );
}

#[test]
fn uc_out_of_sequence_packets_never_join_a_message() {
    // rxe's UC rule (check_psn): a packet whose PSN is not the next one
    // drops the message in progress, and only a FIRST or ONLY starts one
    // again, at whatever PSN it carries. Reordered, the message's packets
    // arrive 100, 102, 101, 103: nothing of it may be delivered.
    let (mut sim, qa, qb, _t) = setup(QpType::Uc);
    sim.node_mut(1).post_recv(&qb, 70, region(0), 8192);
    pattern(sim.node_mut(0), region(0), 4096, 3);
    let a = sim.node_mut(0);
    a.post(&qa, 1, SendOp::Send, region(0), 4096, SIG).unwrap();
    a.post(&qa, 2, SendOp::Send, region(0) + 100, 10, SIG)
        .unwrap();
    let p = a.take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &p),
        [
            "A UC_SEND_FIRST 100",
            "A UC_SEND_MIDDLE 101",
            "A UC_SEND_MIDDLE 102",
            "A UC_SEND_LAST 103",
            "A UC_SEND_ONLY 104"
        ]
    );
    let b = sim.node_mut(1);
    for i in [0, 2, 1, 3, 4] {
        b.deliver(0, 0, &p[i]);
    }
    let rc = b.poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!(rc[0].byte_len, 10, "only the second message arrived");
    assert_eq!(
        sim.node(1).mem.slice(region(0), 10),
        sim.node(0).mem.slice(region(0) + 100, 10)
    );
    // The FIRST's bytes landed before the message was dropped (and were
    // then overwritten in part); the MIDDLE and LAST packets wrote nothing.
    assert!(sim
        .node(1)
        .mem
        .slice(region(0) + 1024, 3072)
        .iter()
        .all(|&x| x == 0));
}

#[test]
fn uc_write_after_a_gap_is_dropped_up_to_the_next_first_packet() {
    let (mut sim, qa, qb, t) = setup(QpType::Uc);
    sim.node_mut(1).post_recv(&qb, 70, region(0), 0);
    pattern(sim.node_mut(0), region(0), 3072, 2);
    let dst = region(0) + 8192;
    let a = sim.node_mut(0);
    a.drop_next(1, |r| r.bth.psn == Psn::new(101));
    let w = SendOp::Write {
        remote_addr: dst,
        rkey: qb.rkey,
    };
    a.post(&qa, 1, w, region(0), 3072, SIG).unwrap();
    let wi = SendOp::WriteWithImm {
        remote_addr: dst + 4096,
        rkey: qb.rkey,
        imm: 3,
    };
    a.post(&qa, 2, wi, region(0), 100, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A UC_WRITE_FIRST 100",
            "A UC_WRITE_MIDDLE 101 DROPPED",
            "A UC_WRITE_LAST 102",
            "A UC_WRITE_ONLY_IMMEDIATE 103",
        ]
    );
    let (a, b) = (sim.node(0), sim.node(1));
    // The first packet landed before the gap; the last was dropped.
    assert_eq!(b.mem.slice(dst, 1024), a.mem.slice(region(0), 1024));
    assert!(b.mem.slice(dst + 2048, 1024).iter().all(|&x| x == 0));
    assert_eq!(b.mem.slice(dst + 4096, 100), a.mem.slice(region(0), 100));
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(
        (rc.len(), rc[0].opcode, rc[0].imm_or_inv),
        (1, WcOpcode::RecvRdmaWithImm, 3)
    );
}

#[test]
fn uc_send_without_a_receive_is_dropped_not_nakked() {
    let (mut sim, qa, qb, t) = setup(QpType::Uc);
    let a = sim.node_mut(0);
    a.post(&qa, 1, SendOp::Send, region(0), 10, SIG).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(lines(&t), ["A UC_SEND_ONLY 100"]);
    assert_eq!(sim.node(1).ep.stats().dropped_messages, 1);
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Rts);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success)]
    );
    // UC has no READ or atomics.
    let r = sim.node_mut(0).post(
        &qa,
        2,
        SendOp::Read {
            remote_addr: region(0),
            rkey: qb.rkey,
        },
        region(0),
        8,
        SIG,
    );
    assert!(matches!(r, Err(Error::UnsupportedOp { .. })));
}

// ---- UD ----------------------------------------------------------------------

/// Post a UD send of `len` bytes from `region(0)` to QP `to` with `qkey`.
fn ud_send(
    h: &mut Host,
    q: &QpEnd,
    wr_id: u64,
    op: SendOp,
    len: u32,
    to: &QpEnd,
    qkey: u32,
) -> Result<(), Error> {
    let sge = [Sge {
        addr: region(0),
        length: len,
        lkey: q.lkey,
    }];
    let wr = SendWr {
        wr_id,
        op,
        sgl: &sge,
        flags: SIG,
        ud: Some(UdDest {
            gid: gid_of(to.node),
            remote_qpn: to.qpn,
            remote_qkey: qkey,
        }),
    };
    h.ep.post_send(q.qpn, &wr, &h.mem)
}

#[test]
fn ud_delivers_grh_then_payload_with_the_source_qp() {
    let (mut sim, qa, qb, t) = setup(QpType::Ud);
    sim.node_mut(1).post_recv(&qb, 70, region(0), 40 + 4096);
    pattern(sim.node_mut(0), region(0), 4096, 3);
    // One message is one packet, up to the path MTU (the port's: 4096).
    let a = sim.node_mut(0);
    let too_big = ud_send(a, &qa, 1, SendOp::Send, 4097, &qb, QKEY);
    assert!(matches!(too_big, Err(Error::InvalidArgument(_))));
    ud_send(a, &qa, 1, SendOp::Send, 4096, &qb, QKEY).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(lines(&t), ["A UD_SEND_ONLY 100"]);
    let deth = t.borrow()[0].repr.ext.deth.unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (QKEY, qa.qpn));
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!(
        (rc[0].byte_len, rc[0].src_qp, rc[0].wc_flags & wc_flags::GRH),
        (40 + 4096, qa.qpn, wc_flags::GRH)
    );
    // RoCEv2 over IPv4: 20 unused bytes, then the IPv4 header.
    let b = sim.node(1);
    let grh = b.mem.slice(region(0), 40);
    assert!(grh[..20].iter().all(|&x| x == 0));
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45);
    let roce_len = 12 + 8 + 4096 + 4; // BTH, DETH, payload, ICRC
    assert_eq!(
        u16::from_be_bytes([ip[2], ip[3]]) as usize,
        20 + 8 + roce_len
    );
    assert_eq!(ip[9], 17); // UDP
    assert_eq!(&ip[12..16], &[10, 0, 0, 1]);
    assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
    assert_eq!(
        b.mem.slice(region(0) + 40, 4096),
        sim.node(0).mem.slice(region(0), 4096)
    );
}

#[test]
fn ud_q_key_mismatch_is_dropped() {
    let (mut sim, qa, qb, _t) = setup(QpType::Ud);
    sim.node_mut(1).post_recv(&qb, 70, region(0), 256);
    let a = sim.node_mut(0);
    ud_send(a, &qa, 1, SendOp::Send, 8, &qb, 0x2222).unwrap();
    // The high bit means "use my own Q_Key", which matches.
    let imm = SendOp::SendWithImm { imm: 4 };
    ud_send(a, &qa, 2, imm, 8, &qb, 0x8000_0000).unwrap();
    sim.run_until_idle(SEC).unwrap();
    // Both sends complete at the sender: UD does not know what arrived.
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rc = sim.node_mut(1).poll_cq(qb.rcq);
    assert_eq!(statuses(&rc), [(70, WcStatus::Success)]);
    assert_eq!(
        (rc[0].byte_len, rc[0].imm_or_inv, rc[0].wc_flags),
        (48, 4, wc_flags::GRH | wc_flags::WITH_IMM)
    );
    assert_eq!(sim.node(1).ep.stats().bad_qkey, 1);
}

#[test]
fn ud_receive_without_room_for_the_grh_is_a_length_error() {
    let (mut sim, qa, qb, _t) = setup(QpType::Ud);
    let b = sim.node_mut(1);
    b.post_recv(&qb, 70, region(0), 40 + 99);
    b.post_recv(&qb, 71, region(0), 40 + 100);
    let a = sim.node_mut(0);
    ud_send(a, &qa, 1, SendOp::Send, 100, &qb, QKEY).unwrap();
    ud_send(a, &qa, 2, SendOp::Send, 100, &qb, QKEY).unwrap();
    // No receive left: the third is dropped.
    ud_send(a, &qa, 3, SendOp::Send, 100, &qb, QKEY).unwrap();
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(1).poll_cq(qb.rcq)),
        [(70, WcStatus::LocLenErr), (71, WcStatus::Success)]
    );
    assert_eq!(sim.node(1).ep.stats().dropped_messages, 1);
    // A UD QP stays usable after a receive error.
    assert_eq!(sim.node(1).ep.qp(qb.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn ud_keeps_the_port_mtu_across_a_reset() {
    let o = Opts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let (mut sim, qa, qb, _t) = setup(QpType::Ud);
    let a = sim.node_mut(0);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    a.ep.modify_qp(qa.qpn, &reset, AttrMask::STATE).unwrap();
    connect(a, &qa, &qb, 7, 0, &o);
    assert_eq!(a.ep.qp(qa.qpn).unwrap().mtu(), 4096);
    ud_send(a, &qa, 1, SendOp::Send, 4096, &qb, QKEY).unwrap();
}
