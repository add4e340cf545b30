//! XRC: an initiator QP on one host, and on the other an XRC domain with
//! SRQs and a target QP. Every request carries the XRCETH naming the SRQ
//! it is for; the target delivers SENDs there (its receive completions on
//! the SRQ's CQ), checks WRITE/READ/atomics under the SRQ's PD, and
//! refuses an SRQ that does not exist or belongs to another domain with an
//! invalid request NAK.

mod support;

use softrdma_core::cq::CqId;
use softrdma_core::mr::PdId;
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::{WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Error, QpInit};
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const MEM: usize = 4 << 20;

fn xrc_opts(t: QpType) -> Opts {
    Opts {
        qp_type: t,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 0,
            max_send_sge: 4,
            max_recv_sge: 0,
            max_inline_data: 0,
        },
        ..Default::default()
    }
}

/// B's side: one XRC domain, a PD with a full-memory MR, a CQ and an XRC
/// SRQ of that PD and CQ.
struct Target {
    xrcd: u32,
    pd: PdId,
    lkey: u32,
    rkey: u32,
    cq: CqId,
    srq: u32,
    tgt: QpEnd,
}

/// A (node 0) has an XRC_SEND QP; B (node 1) an XRC domain, SRQ and
/// XRC_RECV QP; the two QPs are connected.
fn setup() -> (Sim<Host>, QpEnd, Target, Trace) {
    let mut sim = Sim::new(7);
    let a = sim.add_node(Host::new(0, MEM, 0xa));
    let b = sim.add_node(Host::new(1, MEM, 0xb));
    let ini = make_qp(sim.node_mut(a), &xrc_opts(QpType::XrcSend));
    let h = sim.node_mut(b);
    let xrcd = h.ep.alloc_xrcd();
    let pd = h.ep.alloc_pd();
    let all = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);
    let (lkey, rkey) =
        h.ep.reg_mr(pd, MEM_BASE, MEM_BASE, MEM as u64, all)
            .unwrap();
    let cq = h.ep.create_cq(256).unwrap();
    let srq = h.ep.create_xrc_srq(pd, xrcd, cq, 64, 1).unwrap();
    let qpn = h.ep.create_xrc_tgt_qp(xrcd).unwrap();
    let tgt = QpEnd {
        node: b,
        qpn,
        pd,
        scq: cq,
        rcq: cq,
        lkey,
        rkey,
    };
    let o = xrc_opts(QpType::XrcSend);
    connect(sim.node_mut(a), &ini, &tgt, o.psn_a, o.psn_b, &o);
    let o = xrc_opts(QpType::XrcRecv);
    connect(sim.node_mut(b), &tgt, &ini, o.psn_b, o.psn_a, &o);
    let t = trace(&mut sim, &[a, b]);
    let target = Target {
        xrcd,
        pd,
        lkey,
        rkey,
        cq,
        srq,
        tgt,
    };
    (sim, ini, target, t)
}

fn post_xrc(h: &mut Host, q: &QpEnd, wr_id: u64, op: SendOp, addr: u64, len: u32, srqn: u32) {
    try_post_xrc(h, q, wr_id, op, addr, len, srqn).unwrap();
}

fn try_post_xrc(
    h: &mut Host,
    q: &QpEnd,
    wr_id: u64,
    op: SendOp,
    addr: u64,
    len: u32,
    srqn: u32,
) -> Result<(), Error> {
    let sge = [Sge {
        addr,
        length: len,
        lkey: q.lkey,
    }];
    let wr = SendWr {
        wr_id,
        op,
        sgl: &sge,
        flags: SIG,
        ud: None,
    };
    h.sync();
    h.ep.post_send_xrc(q.qpn, &wr, srqn, &h.mem)
}

fn srq_recv(h: &mut Host, t: &Target, srq: u32, wr_id: u64, addr: u64, len: u32) {
    let sge = [Sge {
        addr,
        length: len,
        lkey: t.lkey,
    }];
    h.ep.post_srq_recv(srq, &RecvWr { wr_id, sgl: &sge })
        .unwrap();
}

#[test]
fn send_goes_to_the_named_srq_with_xrceth_on_every_packet() {
    let (mut sim, ini, t, tr) = setup();
    let b = sim.node_mut(1);
    srq_recv(b, &t, t.srq, 70, region(1), 4096);
    pattern(sim.node_mut(0), region(0), 3000, 5);
    let a = sim.node_mut(0);
    a.record = true;
    post_xrc(
        a,
        &ini,
        1,
        SendOp::SendWithImm { imm: 0x0102_0304 },
        region(0),
        3000,
        t.srq,
    );
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&tr),
        [
            "A XRC_SEND_FIRST 100",
            "A XRC_SEND_MIDDLE 101",
            "A XRC_SEND_LAST_IMMEDIATE 102 ackreq",
            "B XRC_ACKNOWLEDGE 102 [ACK msn=1]",
        ]
    );
    for p in tr.borrow().iter().take(3) {
        assert_eq!(p.repr.ext.xrceth.map(|x| x.srqn), Some(t.srq));
    }
    // The first packet as it left A: BTH (opcode 0xa0, P_Key 0xffff, the
    // target's QPN, PSN 100), then the XRCETH: a reserved byte and the
    // 24-bit SRQ number; the payload follows at byte 16.
    let first = &sim.node(0).sent[0];
    let q = t.tgt.qpn;
    let s = t.srq;
    assert_eq!(
        &first[..16],
        &[
            0xa0,
            0x00,
            0xff,
            0xff,
            0x00,
            (q >> 16) as u8,
            (q >> 8) as u8,
            q as u8,
            0x00,
            0x00,
            0x00,
            100,
            0x00,
            (s >> 16) as u8,
            (s >> 8) as u8,
            s as u8,
        ]
    );
    let want = sim.node(0).mem.slice(region(0), 3000).to_vec();
    assert_eq!(&first[16..16 + 1024], &want[..1024]);
    assert_eq!(sim.node(1).mem.slice(region(1), 3000), &want[..]);
    let rc = sim.node_mut(1).poll_cq(t.cq);
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (
            rc[0].wr_id,
            rc[0].status,
            rc[0].opcode,
            rc[0].byte_len,
            rc[0].qp_num
        ),
        (70, WcStatus::Success, WcOpcode::Recv, 3000, t.tgt.qpn)
    );
    assert_eq!(rc[0].imm_or_inv, 0x0102_0304);
    let sc = sim.node_mut(0).poll_cq(ini.scq);
    assert_eq!(statuses(&sc), [(1, WcStatus::Success)]);
}

#[test]
fn write_read_and_atomics_reach_memory_of_the_srqs_pd() {
    let (mut sim, ini, t, tr) = setup();
    pattern(sim.node_mut(0), region(0), 2048, 9);
    let a = sim.node_mut(0);
    let w = SendOp::Write {
        remote_addr: region(2),
        rkey: t.rkey,
    };
    post_xrc(a, &ini, 1, w, region(0), 2048, t.srq);
    let r = SendOp::Read {
        remote_addr: region(2),
        rkey: t.rkey,
    };
    post_xrc(a, &ini, 2, r, region(1), 2048, t.srq);
    sim.node_mut(1)
        .mem
        .slice_mut(region(3), 8)
        .copy_from_slice(&5u64.to_ne_bytes());
    let fa = SendOp::FetchAdd {
        remote_addr: region(3),
        rkey: t.rkey,
        add: 3,
    };
    post_xrc(sim.node_mut(0), &ini, 3, fa, region(1) + 4096, 8, t.srq);
    let cs = SendOp::CompareSwap {
        remote_addr: region(3),
        rkey: t.rkey,
        compare: 8,
        swap: 42,
    };
    post_xrc(sim.node_mut(0), &ini, 4, cs, region(1) + 4104, 8, t.srq);
    sim.run_until_idle(SEC).unwrap();
    let want = sim.node(0).mem.slice(region(0), 2048).to_vec();
    assert_eq!(sim.node(1).mem.slice(region(2), 2048), &want[..]);
    assert_eq!(sim.node(0).mem.slice(region(1), 2048), &want[..]);
    assert_eq!(
        sim.node(0).mem.slice(region(1) + 4096, 8),
        &5u64.to_ne_bytes()
    );
    assert_eq!(
        sim.node(0).mem.slice(region(1) + 4104, 8),
        &8u64.to_ne_bytes()
    );
    assert_eq!(sim.node(1).mem.slice(region(3), 8), &42u64.to_ne_bytes());
    let sc = sim.node_mut(0).poll_cq(ini.scq);
    assert_eq!(
        statuses(&sc),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    let names: Vec<String> = lines(&tr);
    assert_eq!(
        names,
        [
            "A XRC_WRITE_FIRST 100",
            "A XRC_WRITE_LAST 101 ackreq",
            "A XRC_READ_REQUEST 102 ackreq",
            "A XRC_FETCH_ADD 104 ackreq",
            "A XRC_COMPARE_SWAP 105 ackreq",
            "B XRC_ACKNOWLEDGE 101 [ACK msn=1]",
            "B XRC_READ_RESPONSE_FIRST 102 [ACK msn=2]",
            "B XRC_READ_RESPONSE_LAST 103 [ACK msn=2]",
            "B XRC_ATOMIC_ACKNOWLEDGE 104 [ACK msn=3]",
            "B XRC_ATOMIC_ACKNOWLEDGE 105 [ACK msn=4]",
        ]
    );
    // Nothing went to the SRQ's CQ: no receive was consumed.
    assert!(sim.node_mut(1).poll_cq(t.cq).is_empty());
}

/// The MR's PD is not the SRQ's: the target answers a remote access NAK.
#[test]
fn write_to_a_region_of_another_pd_is_an_access_error() {
    let (mut sim, ini, t, tr) = setup();
    let h = sim.node_mut(1);
    let other = h.ep.alloc_pd();
    let (_, rkey2) =
        h.ep.reg_mr(
            other,
            MEM_BASE,
            MEM_BASE,
            MEM as u64,
            AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
        )
        .unwrap();
    let w = SendOp::Write {
        remote_addr: region(2),
        rkey: rkey2,
    };
    post_xrc(sim.node_mut(0), &ini, 1, w, region(0), 64, t.srq);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&tr),
        [
            "A XRC_WRITE_ONLY 100 ackreq",
            "B XRC_ACKNOWLEDGE 100 [NAK-ACCESS msn=0]"
        ]
    );
    let sc = sim.node_mut(0).poll_cq(ini.scq);
    assert_eq!(statuses(&sc), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(sim.node(1).ep.qp(t.tgt.qpn).unwrap().state, QpState::Err);
    assert_ne!(t.pd, other);
}

fn refused(srqn: impl Fn(&mut Host, &Target) -> u32) {
    let (mut sim, ini, t, tr) = setup();
    let n = srqn(sim.node_mut(1), &t);
    post_xrc(sim.node_mut(0), &ini, 1, SendOp::Send, region(0), 64, n);
    sim.run_until_idle(SEC).unwrap();
    assert_eq!(
        lines(&tr),
        [
            "A XRC_SEND_ONLY 100 ackreq",
            "B XRC_ACKNOWLEDGE 100 [NAK-INV-REQ msn=0]"
        ]
    );
    let sc = sim.node_mut(0).poll_cq(ini.scq);
    assert_eq!(statuses(&sc), [(1, WcStatus::RemInvReqErr)]);
    assert_eq!(sim.node(1).ep.qp(t.tgt.qpn).unwrap().state, QpState::Err);
    assert_eq!(sim.node(0).ep.qp(ini.qpn).unwrap().state, QpState::Err);
}

#[test]
fn an_srq_of_another_xrc_domain_is_an_invalid_request() {
    refused(|h, t| {
        let x2 = h.ep.alloc_xrcd();
        assert_ne!(x2, t.xrcd);
        let s = h.ep.create_xrc_srq(t.pd, x2, t.cq, 8, 1).unwrap();
        srq_recv(h, t, s, 9, region(1), 4096);
        s
    });
}

#[test]
fn an_unknown_srq_number_is_an_invalid_request() {
    refused(|_, t| t.srq + 100);
}

#[test]
fn an_ordinary_srq_is_not_an_xrc_srq() {
    refused(|h, t| {
        let s = h.ep.create_srq(t.pd, 8, 1).unwrap();
        srq_recv(h, t, s, 9, region(1), 4096);
        s
    });
}

#[test]
fn misuse_is_refused_with_errors_that_name_it() {
    let (mut sim, ini, t, _) = setup();
    let a = sim.node_mut(0);
    // An XRC_SEND work request needs the remote SRQ number.
    let sge = [Sge {
        addr: region(0),
        length: 8,
        lkey: ini.lkey,
    }];
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sgl: &sge,
        flags: SIG,
        ud: None,
    };
    a.sync();
    let e = a.ep.post_send(ini.qpn, &wr, &a.mem).unwrap_err();
    assert!(e.to_string().contains("remote SRQ number"), "{e}");
    // No receive queue on either half.
    let rwr = RecvWr {
        wr_id: 2,
        sgl: &sge,
    };
    let e = a.ep.post_recv(ini.qpn, &rwr).unwrap_err();
    assert!(
        e.to_string().contains("XRC QPs have no receive queue"),
        "{e}"
    );
    // XRC has no ATOMIC WRITE.
    let aw = SendOp::AtomicWrite {
        remote_addr: region(2),
        rkey: t.rkey,
    };
    let e = try_post_xrc(a, &ini, 3, aw, region(0), 8, t.srq).unwrap_err();
    assert!(matches!(e, Error::UnsupportedOp { .. }), "{e}");
    // An initiator cannot be created with a receive queue.
    let cq = a.ep.create_cq(8).unwrap();
    let e =
        a.ep.create_qp(QpInit {
            qp_type: QpType::XrcSend,
            pd: ini.pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap_err();
    assert!(e.to_string().contains("no receive queue"), "{e}");
    // A target only in an XRC domain.
    let e =
        a.ep.create_qp(QpInit {
            qp_type: QpType::XrcRecv,
            pd: ini.pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap_err();
    assert!(e.to_string().contains("create_xrc_tgt_qp"), "{e}");
    assert!(a.ep.create_xrc_tgt_qp(77).is_err());
    let b = sim.node_mut(1);
    // The target has no send queue.
    b.sync();
    let e = b.ep.post_send(t.tgt.qpn, &wr, &b.mem).unwrap_err();
    assert!(e.to_string().contains("no send queue"), "{e}");
    // A domain is busy while its SRQ and target QP exist.
    assert!(matches!(b.ep.dealloc_xrcd(t.xrcd), Err(Error::Busy(_))));
    b.ep.destroy_qp(t.tgt.qpn).unwrap();
    assert!(matches!(b.ep.dealloc_xrcd(t.xrcd), Err(Error::Busy(_))));
    // The SRQ's CQ is held by the SRQ.
    assert!(matches!(b.ep.destroy_cq(t.cq), Err(Error::Busy(_))));
    b.ep.destroy_srq(t.srq).unwrap();
    b.ep.dealloc_xrcd(t.xrcd).unwrap();
    b.ep.destroy_cq(t.cq).unwrap();
}

#[test]
fn posting_before_rts_is_refused() {
    let mut sim: Sim<Host> = Sim::new(1);
    let a = sim.add_node(Host::new(0, MEM, 1));
    let ini = make_qp(sim.node_mut(a), &xrc_opts(QpType::XrcSend));
    let e = try_post_xrc(sim.node_mut(a), &ini, 1, SendOp::Send, region(0), 8, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidState {
                state: QpState::Reset,
                ..
            }
        ),
        "{e}"
    );
}

// ---- wire input ----------------------------------------------------------

/// Real XRC traffic of every operation, as (from, bytes), carried by hand.
fn xrc_corpus() -> Vec<(usize, Vec<u8>)> {
    let (mut sim, ini, t, _) = setup();
    srq_recv(sim.node_mut(1), &t, t.srq, 1, region(1), 8192);
    let ops = [
        SendOp::Send,
        SendOp::SendWithImm { imm: 5 },
        SendOp::Write {
            remote_addr: region(2),
            rkey: t.rkey,
        },
        SendOp::Read {
            remote_addr: region(2),
            rkey: t.rkey,
        },
        SendOp::FetchAdd {
            remote_addr: region(3),
            rkey: t.rkey,
            add: 1,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 3000 };
        post_xrc(sim.node_mut(0), &ini, i as u64, op, region(0), len, t.srq);
    }
    let mut out = Vec::new();
    for round in 0..200u64 {
        let now = round * 1000;
        let from_a = sim.node_mut(0).take(now, usize::MAX);
        for p in &from_a {
            sim.node_mut(1).deliver(now, 0, p);
        }
        let from_b = sim.node_mut(1).take(now, usize::MAX);
        for p in &from_b {
            sim.node_mut(0).deliver(now, 1, p);
        }
        if from_a.is_empty() && from_b.is_empty() {
            break;
        }
        out.extend(from_a.into_iter().map(|p| (0, p)));
        out.extend(from_b.into_iter().map(|p| (1, p)));
    }
    assert!(out.len() > 10, "traffic of every kind was captured");
    out
}

mod wire_input {
    use super::*;
    use proptest::prelude::*;
    use softrdma_core::RxMeta;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Mutated XRC packets (any byte, the XRCETH's SRQ number
        /// included) reach the initiator and the target: nothing panics,
        /// both QPs end in RTS or ERR, and the endpoints still answer.
        #[test]
        fn mutated_xrc_packets_never_panic(
            picks in proptest::collection::vec(
                (any::<prop::sample::Index>(), 0usize..64, any::<u8>()), 1..24),
        ) {
            let corpus = xrc_corpus();
            let (mut sim, ini, t, _) = setup();
            srq_recv(sim.node_mut(1), &t, t.srq, 1, region(1), 8192);
            let mut now = 1_000_000u64;
            for (idx, at, v) in &picks {
                let (from, pkt) = &corpus[idx.index(corpus.len())];
                let mut p = pkt.clone();
                // Keep the destination QP (bytes 5..8) so it reaches a live QP.
                let i = at % p.len();
                if !(5..8).contains(&i) {
                    p[i] = *v;
                }
                let to = 1 - from;
                let meta = RxMeta { sgid: gid_of(*from), dgid: gid_of(to), traffic_class: 0, hop_limit: 64 };
                let h = sim.node_mut(to);
                h.sync();
                h.ep.handle_packet(now, &meta, &p, &mut h.mem);
                now += 10_000;
                let _ = sim.node_mut(to).take(now, 64);
                sim.node_mut(to).handle_timeout_at(now);
            }
            for (n, q) in [(0usize, ini.qpn), (1, t.tgt.qpn)] {
                let st = sim.node(n).ep.qp(q).unwrap().state;
                prop_assert!(matches!(st, QpState::Rts | QpState::Err), "{st:?}");
            }
            let mut out = [Default::default(); 8];
            sim.node_mut(0).ep.poll_cq(ini.scq, &mut out).unwrap();
            sim.node_mut(1).ep.poll_cq(t.cq, &mut out).unwrap();
        }
    }
}

/// Lost ACKs: the initiator resends, the target answers the duplicates
/// (each under the SRQ it names; a READ re-read under that SRQ's PD)
/// without delivering anything twice, and a message to the second SRQ in
/// flight meanwhile is not disturbed.
#[test]
fn duplicates_are_answered_under_their_own_srq() {
    let (mut sim, ini, t, tr) = setup();
    let h = sim.node_mut(1);
    let srq2 = h.ep.create_xrc_srq(t.pd, t.xrcd, t.cq, 8, 1).unwrap();
    srq_recv(h, &t, t.srq, 10, region(1), 4096);
    srq_recv(h, &t, srq2, 20, region(1) + 4096, 4096);
    // Every response B sends for the first round is lost.
    sim.node_mut(1).drop_next(2, |_| true);
    pattern(sim.node_mut(0), region(0), 3000, 3);
    let a = sim.node_mut(0);
    post_xrc(a, &ini, 1, SendOp::Send, region(0), 100, t.srq);
    let r = SendOp::Read {
        remote_addr: region(0) + 8192,
        rkey: t.rkey,
    };
    post_xrc(a, &ini, 2, r, region(2), 64, t.srq);
    post_xrc(a, &ini, 3, SendOp::Send, region(0), 3000, srq2);
    sim.run_until_idle(SEC).unwrap();
    let sc = sim.node_mut(0).poll_cq(ini.scq);
    assert_eq!(
        statuses(&sc),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    let rc = sim.node_mut(1).poll_cq(t.cq);
    assert_eq!(
        rc.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        [(10, 100), (20, 3000)]
    );
    let want = sim.node(0).mem.slice(region(0), 3000).to_vec();
    assert_eq!(sim.node(1).mem.slice(region(1) + 4096, 3000), &want[..]);
    let read = sim.node(1).mem.slice(region(0) + 8192, 64).to_vec();
    assert_eq!(sim.node(0).mem.slice(region(2), 64), &read[..]);
    assert!(
        lines(&tr).iter().filter(|l| l.ends_with("DROPPED")).count() == 2,
        "{:#?}",
        lines(&tr)
    );
    assert!(sim.node(1).ep.stats().duplicates > 0);
    assert_eq!(sim.node(1).ep.qp(t.tgt.qpn).unwrap().state, QpState::Rts);
}
