//! UD multicast in the core: a datagram to QPN 0xFFFFFF addressed to a
//! group is delivered to every QP of the endpoint attached to that group
//! (each with its own copy, Q_Key checked per QP) and to no other; detach,
//! destroy and the argument checks.

mod support;

use softrdma_core::mcast::{is_multicast_gid, MULTICAST_QPN};
use softrdma_core::qp::attr::{AttrMask, QpAttr};
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::wc::{wc_flags, WcStatus};
use softrdma_core::wr::{SendFlags, SendOp, SendWr, Sge, UdDest};
use softrdma_core::{Error, RxMeta};
use support::*;

const MEM: usize = 8 << 20;
const QKEY: u32 = 0x1111_1111; // what `connect` gives every QP
const LEN: u32 = 300;

fn group() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[230, 1, 2, 3]);
    g
}

/// The datagram node 0's QP `qa` sends to the group with `qkey`.
fn multicast_datagram(h: &mut Host, qa: &QpEnd, qkey: u32) -> Vec<u8> {
    let sge = [Sge {
        addr: region(0),
        length: LEN,
        lkey: qa.lkey,
    }];
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sgl: &sge,
        flags: SendFlags::SIGNALED,
        ud: Some(UdDest {
            gid: group(),
            remote_qpn: MULTICAST_QPN,
            remote_qkey: qkey,
        }),
    };
    h.ep.post_send(qa.qpn, &wr, &h.mem).unwrap();
    let mut out = h.take(0, usize::MAX);
    assert_eq!(out.len(), 1);
    out.pop().unwrap()
}

fn deliver_to_group(h: &mut Host, bytes: &[u8]) {
    let meta = RxMeta {
        sgid: gid_of(0),
        dgid: group(),
        traffic_class: 0,
        hop_limit: 64,
    };
    h.sync();
    h.ep.handle_packet(0, &meta, bytes, &mut h.mem);
}

#[test]
fn a_group_datagram_reaches_every_attached_qp_once_each() {
    let o = Opts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let (mut sim, qa, qb) = pair(1, MEM, &o);
    pattern(sim.node_mut(0), region(0), LEN as usize, 9);
    let b = sim.node_mut(1);
    // Three more UD QPs on node 1: c attached, d attached with another
    // Q_Key, e not attached.
    let mk = |h: &mut Host| {
        let q = make_qp(h, &o);
        connect(h, &q, &qa, 0, 0, &o);
        q
    };
    let (qc, qd, qe) = (mk(b), mk(b), mk(b));
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qkey: 0x2222_2222,
        ..Default::default()
    };
    b.ep.modify_qp(qd.qpn, &attr, AttrMask::STATE | AttrMask::QKEY)
        .unwrap();
    assert_eq!(b.ep.qp(qd.qpn).unwrap().state, QpState::Rts);
    for q in [&qb, &qc, &qd] {
        assert!(b.ep.attach_mcast(q.qpn, group()).is_ok());
    }
    // Twice is a no-op.
    assert!(matches!(b.ep.attach_mcast(qb.qpn, group()), Ok(false)));
    assert_eq!(b.ep.mcast_groups().collect::<Vec<_>>(), [&group()]);
    for (i, q) in [&qb, &qc, &qd, &qe].into_iter().enumerate() {
        b.post_recv(q, 10 + i as u64, region(1 + i as u64), 40 + LEN);
    }

    let d = multicast_datagram(sim.node_mut(0), &qa, QKEY);
    let sent = sim.node(0).mem.slice(region(0), LEN as usize).to_vec();
    let b = sim.node_mut(1);
    deliver_to_group(b, &d);
    for (i, q) in [&qb, &qc].into_iter().enumerate() {
        let c = b.poll_cq(q.rcq);
        assert_eq!(statuses(&c), [(10 + i as u64, WcStatus::Success)]);
        assert_eq!((c[0].byte_len, c[0].src_qp), (40 + LEN, qa.qpn));
        assert_eq!(c[0].wc_flags & wc_flags::GRH, wc_flags::GRH);
        let at = region(1 + i as u64);
        // The IPv4 header's destination is the group.
        assert_eq!(b.mem.slice(at + 36, 4), &[230, 1, 2, 3]);
        assert_eq!(b.mem.slice(at + 40, LEN as usize), &sent[..]);
    }
    let b = sim.node_mut(1);
    assert!(b.poll_cq(qd.rcq).is_empty(), "another Q_Key");
    assert!(b.poll_cq(qe.rcq).is_empty(), "not attached");
    assert_eq!(b.ep.stats().bad_qkey, 1);

    // Detached: c no longer hears the group.
    b.ep.detach_mcast(qc.qpn, group()).unwrap();
    b.post_recv(&qb, 20, region(1), 40 + LEN);
    b.post_recv(&qc, 21, region(2), 40 + LEN);
    deliver_to_group(b, &d);
    assert_eq!(statuses(&b.poll_cq(qb.rcq)), [(20, WcStatus::Success)]);
    assert!(b.poll_cq(qc.rcq).is_empty());

    // QPN 0xFFFFFF to the node's own address (no group): dropped.
    let before = b.ep.stats().dropped_no_qp;
    let meta = RxMeta {
        sgid: gid_of(0),
        dgid: gid_of(1),
        traffic_class: 0,
        hop_limit: 64,
    };
    b.sync();
    b.ep.handle_packet(0, &meta, &d, &mut b.mem);
    assert_eq!(b.ep.stats().dropped_no_qp, before + 1);
    assert!(b.poll_cq(qb.rcq).is_empty());

    // Destroying the attached QPs forgets the group.
    b.ep.destroy_qp(qb.qpn).unwrap();
    b.ep.destroy_qp(qd.qpn).unwrap();
    assert_eq!(b.ep.mcast_groups().count(), 0);
}

#[test]
fn attach_and_detach_check_their_arguments() {
    let o = Opts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let (mut sim, _qa, qb) = pair(1, MEM, &o);
    let b = sim.node_mut(1);
    assert!(is_multicast_gid(&group()));
    let unicast = gid_of(1);
    assert!(!is_multicast_gid(&unicast));
    assert!(matches!(
        b.ep.attach_mcast(qb.qpn, unicast),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.ep.detach_mcast(qb.qpn, group()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.ep.attach_mcast(0xabcdef, group()),
        Err(Error::NoSuchQp(_))
    ));
    let rc = make_qp(
        b,
        &Opts {
            qp_type: QpType::Rc,
            ..Default::default()
        },
    );
    assert!(matches!(
        b.ep.attach_mcast(rc.qpn, group()),
        Err(Error::InvalidArgument(_))
    ));
}
