//! XRC between two real processes over UDP on loopback, through the Rust
//! API: the child opens an XRC domain with two XRC SRQs (each its own CQ)
//! and a target QP; the parent's one initiator QP reaches both SRQs through
//! it, and WRITEs, READs and atomics memory of the SRQs' PD. An SRQ of
//! another domain is refused (invalid request NAK: the initiator's work
//! request completes `REM_INV_REQ_ERR`).
//!
//! See `support` for how the peer process is started and synchronised.

mod support;

use softrdma_verbs::*;
use support::*;

const DATA: u64 = 300;
const TGT: u64 = 301;

#[test]
fn xrc_one_initiator_two_srqs() {
    two_processes(
        "xrc_one_initiator_two_srqs",
        |mut oob| {
            let ctx = open(V4);
            let xrcd = ctx.open_xrcd();
            let pd = ctx.alloc_pd();
            let cq1 = ctx.create_cq(16, None).unwrap();
            let cq2 = ctx.create_cq(16, None).unwrap();
            let srq1 = pd.create_xrc_srq(&xrcd, &cq1, 8, 1).unwrap();
            let srq2 = pd.create_xrc_srq(&xrcd, &cq2, 8, 1).unwrap();
            assert_ne!(srq1.srq_num(), srq2.srq_num());
            // An SRQ of another domain, with a receive waiting.
            let other = ctx.open_xrcd();
            let srq3 = pd.create_xrc_srq(&other, &cq2, 8, 1).unwrap();
            let rbuf = pd
                .reg_mr(vec![0xee; 3 * 8192], AccessFlags::LOCAL_WRITE)
                .unwrap();
            srq1.post_recv(&RecvWr {
                wr_id: 11,
                sgl: &[rbuf.sge(0, 8192)],
            })
            .unwrap();
            srq2.post_recv(&RecvWr {
                wr_id: 22,
                sgl: &[rbuf.sge(8192, 8192)],
            })
            .unwrap();
            srq3.post_recv(&RecvWr {
                wr_id: 33,
                sgl: &[rbuf.sge(16384, 8192)],
            })
            .unwrap();
            let tgt = mr_with(&pd, 64 << 10, TGT, ALL_REMOTE);
            tgt.write(4096, &7u64.to_ne_bytes());
            let qp = xrcd.create_tgt_qp().unwrap();
            assert_eq!(qp.qp_type(), QpType::XrcRecv);
            qp.modify(
                &QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qp_access_flags: ALL_REMOTE,
                    ..Default::default()
                },
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            )
            .unwrap();
            oob.send_u64s(&[
                srq1.srq_num() as u64,
                srq2.srq_num() as u64,
                srq3.srq_num() as u64,
            ]);
            oob.send_region(&Region::of(&tgt));
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::XrcRecv, 5);
            oob.expect("sent");
            let c1 = wait_cq(&cq1, 1, "the SEND to SRQ 1");
            assert_wc(&c1[0], 11, WcStatus::Success, WcOpcode::Recv, 5000);
            assert_eq!(c1[0].qp_num, qp.qpn());
            assert_eq!(c1[0].imm_or_inv, 0x5151_5151);
            let c2 = wait_cq(&cq2, 1, "the SEND to SRQ 2");
            assert_wc(&c2[0], 22, WcStatus::Success, WcOpcode::Recv, 100);
            let data = pattern(DATA, 8192);
            assert_bytes(&read_mr(&rbuf, 0, 5000), &data[..5000], "SRQ 1's buffer");
            assert_bytes(
                &read_mr(&rbuf, 8192, 100),
                &data[5000..5100],
                "SRQ 2's buffer",
            );
            // The WRITE landed, the FETCH_ADD added.
            assert_bytes(&read_mr(&tgt, 0, 2048), &data[..2048], "WRITE target");
            assert_eq!(read_u64(&tgt, 4096), 7 + 35);
            oob.expect("refused");
            // Nothing reached the SRQ of the other domain.
            assert_cq_empty(&cq2, std::time::Duration::from_millis(100), "SRQ 3's CQ");
            assert_eq!(qp.query().unwrap().0, QpState::Err);
            assert!(xrcd.in_use());
            drop(qp);
            drop((srq1, srq2));
            assert!(!xrcd.in_use());
            oob.signal("done");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let mut c = cap(16, 0);
            c.max_recv_sge = 0;
            let qp = qp_init(&pd, QpType::XrcSend, &cq, &cq, None, c);
            let src = mr_with(&pd, 8192, DATA, AccessFlags::LOCAL_WRITE);
            let back = pd
                .reg_mr(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
                .unwrap();
            let srqn = oob.recv_u64s();
            let r = oob.recv_region();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::XrcSend, 6);
            let sig = SendFlags::SIGNALED;
            // Without a remote SRQ number, a send is refused.
            let e = qp
                .post_send(&wr(1, SendOp::Send, &[src.sge(0, 8)], sig))
                .unwrap_err();
            assert!(e.to_string().contains("remote SRQ number"), "{e}");
            let s1 = src.sge(0, 5000);
            let op = SendOp::SendWithImm { imm: 0x5151_5151 };
            qp.post_send_xrc(&wr(1, op, &[s1], sig), srqn[0] as u32)
                .unwrap();
            let s2 = src.sge(5000, 100);
            qp.post_send_xrc(&wr(2, SendOp::Send, &[s2], sig), srqn[1] as u32)
                .unwrap();
            let w = SendOp::Write {
                remote_addr: r.at(0),
                rkey: r.rkey,
            };
            qp.post_send_xrc(&wr(3, w, &[src.sge(0, 2048)], sig), srqn[0] as u32)
                .unwrap();
            let rd = SendOp::Read {
                remote_addr: r.at(0),
                rkey: r.rkey,
            };
            qp.post_send_xrc(&wr(4, rd, &[back.sge(0, 2048)], sig), srqn[1] as u32)
                .unwrap();
            let fa = SendOp::FetchAdd {
                remote_addr: r.at(4096),
                rkey: r.rkey,
                add: 35,
            };
            qp.post_send_xrc(&wr(5, fa, &[back.sge(2048, 8)], sig), srqn[0] as u32)
                .unwrap();
            let cs = wait_cq(&cq, 5, "five XRC requests");
            for (i, c) in cs.iter().enumerate() {
                assert_eq!((c.wr_id, c.status), (i as u64 + 1, WcStatus::Success));
            }
            let data = pattern(DATA, 8192);
            assert_bytes(&read_mr(&back, 0, 2048), &data[..2048], "READ result");
            assert_eq!(read_u64(&back, 2048), 7);
            oob.signal("sent");
            // The SRQ of the other domain: invalid request.
            qp.post_send_xrc(&wr(6, SendOp::Send, &[src.sge(0, 8)], sig), srqn[2] as u32)
                .unwrap();
            let c = wait_cq(&cq, 1, "the SEND to another domain's SRQ");
            assert_eq!((c[0].wr_id, c[0].status), (6, WcStatus::RemInvReqErr));
            assert_eq!(qp.query().unwrap().0, QpState::Err);
            oob.signal("refused");
            oob.expect("done");
        },
    );
}

/// The everyday layer: the target's endpoint (with its region) and the
/// initiator's are exchanged with `oob::exchange` and each side connects
/// with `Qp::connect` (an XRC_SEND connects to an XRC_RECV); one SEND goes
/// to the SRQ and one WRITE to the region, both checked on the target.
#[test]
fn xrc_connects_through_endpoints() {
    use std::net::{TcpListener, TcpStream};
    two_processes(
        "xrc_connects_through_endpoints",
        |mut oob| {
            let ctx = open(V4);
            let xrcd = ctx.open_xrcd();
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let srq = pd.create_xrc_srq(&xrcd, &cq, 4, 1).unwrap();
            let rbuf = pd
                .reg_mr(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
                .unwrap();
            srq.post_recv(&RecvWr {
                wr_id: 5,
                sgl: &[rbuf.sge(0, 4096)],
            })
            .unwrap();
            let tgt = mr_with(&pd, 4096, 0, ALL_REMOTE);
            let qp = xrcd.create_tgt_qp().unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            oob.send(l.local_addr().unwrap().to_string().as_bytes());
            let mut tcp = l.accept().unwrap().0;
            let me = qp.endpoint().with_regions([RemoteRegion {
                addr: tgt.addr(),
                rkey: tgt.rkey(),
                len: tgt.len() as u64,
            }]);
            oob.send_u64s(&[srq.srq_num() as u64]);
            let peer = oob::exchange(&mut tcp, &me).expect("exchange");
            assert_eq!(peer.qp_type, QpType::XrcSend);
            qp.connect(&peer, &ConnectOptions::default()).unwrap();
            let c = wait_cq(&cq, 1, "the SEND");
            assert_wc(&c[0], 5, WcStatus::Success, WcOpcode::Recv, 300);
            let data = pattern(DATA, 4096);
            assert_bytes(&read_mr(&rbuf, 0, 300), &data[..300], "the SEND's bytes");
            oob.expect("written");
            assert_bytes(&read_mr(&tgt, 0, 1000), &data[..1000], "the WRITE's bytes");
            oob.signal("done");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let mut init = QpInitAttr::new(QpType::XrcSend, &cq);
            init.cap.max_recv_wr = 0;
            let qp = pd.create_qp(&init).unwrap();
            let src = mr_with(&pd, 4096, DATA, AccessFlags::LOCAL_WRITE);
            let addr = String::from_utf8(oob.recv()).unwrap();
            let mut tcp = TcpStream::connect(addr).unwrap();
            let srqn = oob.recv_u64s()[0] as u32;
            let peer = oob::exchange(&mut tcp, &qp.endpoint()).expect("exchange");
            assert_eq!(peer.qp_type, QpType::XrcRecv);
            qp.connect(&peer, &ConnectOptions::default()).unwrap();
            let sig = SendFlags::SIGNALED;
            qp.post_send_xrc(&wr(1, SendOp::Send, &[src.sge(0, 300)], sig), srqn)
                .unwrap();
            let w = SendOp::Write {
                remote_addr: peer.regions[0].addr,
                rkey: peer.regions[0].rkey,
            };
            qp.post_send_xrc(&wr(2, w, &[src.sge(0, 1000)], sig), srqn)
                .unwrap();
            let cs = wait_cq(&cq, 2, "the SEND and the WRITE");
            assert_eq!(
                cs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
                [(1, WcStatus::Success), (2, WcStatus::Success)]
            );
            oob.signal("written");
            oob.expect("done");
        },
    );
}
