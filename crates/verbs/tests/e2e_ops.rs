//! Every operation between two real processes over UDP on loopback: each
//! RC opcode, SEND on UC and UD, message sizes from 1 byte to 16 MiB,
//! immediate data and inline sends. Data is checked byte for byte on the
//! side that received it, completions field by field on both.
//!
//! See `support` for how the peer process is started and synchronised.

mod support;

use softrdma_verbs::*;
use support::*;

const CAS_OFF: usize = 32 << 10;
const FAA_OFF: usize = CAS_OFF + 8;

/// All eight RC opcodes, in one connection, and what each leaves behind: the
/// receive completions (with immediate data and the invalidated rkey), the
/// target memory, the READ data and atomic results; then the type-2 memory
/// window that SEND_WITH_INV revoked no longer admits a WRITE (an ordinary
/// region cannot be invalidated remotely: IBA, and rxe).
#[test]
fn rc_every_opcode() {
    const SRC: u64 = 200;
    const TGT: u64 = 100;
    const INV: u64 = 101;
    two_processes(
        "rc_every_opcode",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let tgt = mr_with(&pd, 64 << 10, TGT, ALL_REMOTE);
            tgt.write(CAS_OFF, &0x1111u64.to_ne_bytes());
            tgt.write(FAA_OFF, &1000u64.to_ne_bytes());
            let inv = mr_with(
                &pd,
                4096,
                INV,
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            );
            let mw = pd.alloc_mw(MwType::Type2).unwrap();
            let rbuf = pd
                .reg_mr(vec![0xee; 4 * 2048], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..4 {
                post_recv(&qp, 100 + i as u64, rbuf.sge(i * 2048, 2048));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 1);
            // The window the peer will invalidate: all of `inv`, writable.
            let rkey = qp
                .bind_mw(
                    &mw,
                    &inv,
                    0,
                    4096,
                    AccessFlags::REMOTE_WRITE,
                    99,
                    SendFlags::SIGNALED,
                )
                .unwrap();
            // A type-2 window's new key is the application's to record
            // (rxe's ibv_mw.rkey moves only when it does).
            assert_eq!(rkey, inc_rkey(mw.rkey()));
            mw.set_rkey(rkey);
            assert_eq!(rkey, mw.rkey());
            let b = wait_cq(&cq, 1, "the bind");
            assert_wc(&b[0], 99, WcStatus::Success, WcOpcode::BindMw, 0);
            oob.send_region(&Region::of(&tgt));
            oob.send_region(&Region {
                addr: inv.iova(),
                rkey,
                len: 4096,
            });

            let src = pattern(SRC, 64 << 10);
            let w = wait_cq(&cq, 4, "receives");
            let n = qp.qpn();
            assert_wc(&w[0], 100, WcStatus::Success, WcOpcode::Recv, 1000);
            assert_eq!((w[0].wc_flags, w[0].qp_num), (0, n));
            assert_bytes(&read_mr(&rbuf, 0, 1000), &src[..1000], "SEND data");

            assert_wc(&w[1], 101, WcStatus::Success, WcOpcode::Recv, 77);
            assert_eq!(w[1].wc_flags, wc_flags::WITH_IMM);
            assert_eq!(w[1].imm_or_inv, 0xdead_beef);
            assert_bytes(
                &read_mr(&rbuf, 2048, 77),
                &src[1000..1077],
                "SEND_WITH_IMM data",
            );

            assert_wc(
                &w[2],
                102,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                333,
            );
            assert_eq!(w[2].wc_flags, wc_flags::WITH_IMM);
            assert_eq!(w[2].imm_or_inv, 0x1234_5678);
            assert_bytes(
                &read_mr(&rbuf, 4096, 2048),
                &[0xee; 2048],
                "WRITE_WITH_IMM leaves its receive buffer alone",
            );

            assert_wc(&w[3], 103, WcStatus::Success, WcOpcode::Recv, 10);
            assert_eq!(w[3].wc_flags, wc_flags::WITH_INV);
            assert_eq!(w[3].imm_or_inv, mw.rkey(), "the invalidated rkey");
            assert_bytes(
                &read_mr(&rbuf, 6144, 10),
                &src[20000..20010],
                "SEND_WITH_INV data",
            );

            let want = pattern(TGT, 64 << 10);
            assert_bytes(&read_mr(&tgt, 0, 4096), &src[4096..8192], "WRITE target");
            assert_bytes(
                &read_mr(&tgt, 4096, 4096),
                &want[4096..8192],
                "bytes after the WRITE",
            );
            assert_bytes(
                &read_mr(&tgt, 8192, 333),
                &src[10000..10333],
                "WRITE_WITH_IMM target",
            );
            assert_bytes(
                &read_mr(&tgt, 8192 + 333, 1000),
                &want[8192 + 333..9192 + 333],
                "bytes after the WRITE_WITH_IMM",
            );
            assert_eq!(read_u64(&tgt, CAS_OFF), 0x2222, "CMP_AND_SWP target");
            assert_eq!(read_u64(&tgt, FAA_OFF), 1005, "FETCH_AND_ADD target");
            oob.signal("checked");

            oob.expect("violated");
            wait_async(&ctx, "access error on the target", |e| {
                *e == AsyncEvent::QpAccessErr(n)
            });
            wait_state(&qp, QpState::Err, "target QP after the access error");
            assert_bytes(
                &read_mr(&inv, 0, 4096),
                &pattern(INV, 4096),
                "invalidated region",
            );
            oob.signal("bye");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 64 << 10, SRC, AccessFlags::LOCAL_WRITE);
            let dst = pd.reg_mr(vec![0; 8192], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 2);
            let tgt = oob.recv_region();
            let inv = oob.recv_region();

            let s = SendFlags::SIGNALED;
            let ops: [(SendOp, Sge); 9] = [
                (SendOp::Send, src.sge(0, 1000)),
                (SendOp::SendWithImm { imm: 0xdead_beef }, src.sge(1000, 77)),
                (
                    SendOp::Write {
                        remote_addr: tgt.at(0),
                        rkey: tgt.rkey,
                    },
                    src.sge(4096, 4096),
                ),
                (
                    SendOp::WriteWithImm {
                        remote_addr: tgt.at(8192),
                        rkey: tgt.rkey,
                        imm: 0x1234_5678,
                    },
                    src.sge(10000, 333),
                ),
                (
                    SendOp::Read {
                        remote_addr: tgt.at(16384),
                        rkey: tgt.rkey,
                    },
                    dst.sge(0, 5000),
                ),
                (
                    SendOp::CompareSwap {
                        remote_addr: tgt.at(CAS_OFF),
                        rkey: tgt.rkey,
                        compare: 0x1111,
                        swap: 0x2222,
                    },
                    dst.sge(6000, 8),
                ),
                (
                    SendOp::CompareSwap {
                        remote_addr: tgt.at(CAS_OFF),
                        rkey: tgt.rkey,
                        compare: 0x1111,
                        swap: 0x3333,
                    },
                    dst.sge(6008, 8),
                ),
                (
                    SendOp::FetchAdd {
                        remote_addr: tgt.at(FAA_OFF),
                        rkey: tgt.rkey,
                        add: 5,
                    },
                    dst.sge(6016, 8),
                ),
                (SendOp::SendWithInv { rkey: inv.rkey }, src.sge(20000, 10)),
            ];
            for (i, (op, sge)) in ops.iter().enumerate() {
                qp.post_send(&wr(i as u64, *op, &[*sge], s))
                    .unwrap_or_else(|e| panic!("post {}: {e}", op.name()));
            }
            let w = wait_cq(&cq, 9, "send completions");
            let want = [
                (WcOpcode::Send, 1000),
                (WcOpcode::Send, 77),
                (WcOpcode::RdmaWrite, 4096),
                (WcOpcode::RdmaWrite, 333),
                (WcOpcode::RdmaRead, 5000),
                (WcOpcode::CompSwap, 8),
                (WcOpcode::CompSwap, 8),
                (WcOpcode::FetchAdd, 8),
                (WcOpcode::Send, 10),
            ];
            for (i, (c, (op, len))) in w.iter().zip(want).enumerate() {
                assert_wc(c, i as u64, WcStatus::Success, op, len);
                assert_eq!(c.qp_num, qp.qpn());
            }
            assert_bytes(
                &read_mr(&dst, 0, 5000),
                &pattern(TGT, 64 << 10)[16384..16384 + 5000],
                "READ data",
            );
            assert_eq!(read_u64(&dst, 6000), 0x1111, "CMP_AND_SWP that matched");
            assert_eq!(read_u64(&dst, 6008), 0x2222, "CMP_AND_SWP that did not");
            assert_eq!(read_u64(&dst, 6016), 1000, "FETCH_AND_ADD");
            oob.expect("checked");

            // The rkey SEND_WITH_INV revoked admits nothing any more.
            qp.post_send(&wr(
                50,
                SendOp::Write {
                    remote_addr: inv.at(0),
                    rkey: inv.rkey,
                },
                &[src.sge(0, 16)],
                s,
            ))
            .unwrap();
            let w = wait_cq(&cq, 1, "WRITE with the invalidated rkey");
            assert_eq!((w[0].wr_id, w[0].status), (50, WcStatus::RemAccessErr));
            wait_state(&qp, QpState::Err, "requester after REM_ACCESS_ERR");
            oob.signal("violated");
            oob.expect("bye");
        },
    );
}

/// UC: SEND (one packet and several), SEND_WITH_IMM, WRITE and
/// WRITE_WITH_IMM arrive intact; the requester completes each once sent.
#[test]
fn uc_send_and_write() {
    const SRC: u64 = 300;
    const TGT: u64 = 301;
    let sends: [(u64, usize, usize, Option<u32>); 3] = [
        (0, 0, 1, None),
        (1, 100, 10_000, None),
        (2, 20_000, 4096, Some(77)),
    ];
    two_processes(
        "uc_send_and_write",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Uc, &cq, &cq, None, cap(16, 16));
            let tgt = mr_with(&pd, 64 << 10, TGT, ALL_REMOTE);
            let rbuf = pd
                .reg_mr(vec![0xee; 4 * 16384], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..4 {
                post_recv(&qp, i as u64, rbuf.sge(i * 16384, 16384));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Uc, 3);
            oob.send_region(&Region::of(&tgt));
            let src = pattern(SRC, 64 << 10);
            let w = wait_cq(&cq, 4, "UC receives");
            for (c, &(id, off, len, imm)) in w.iter().zip(&sends) {
                assert_wc(c, id, WcStatus::Success, WcOpcode::Recv, len as u32);
                assert_eq!(c.qp_num, qp.qpn());
                match imm {
                    Some(i) => assert_eq!((c.wc_flags, c.imm_or_inv), (wc_flags::WITH_IMM, i)),
                    None => assert_eq!(c.wc_flags, 0),
                }
                assert_bytes(
                    &read_mr(&rbuf, id as usize * 16384, len),
                    &src[off..off + len],
                    "UC SEND data",
                );
            }
            assert_wc(&w[3], 3, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 5000);
            assert_eq!(w[3].imm_or_inv, 0xabcd);
            assert_bytes(&read_mr(&tgt, 0, 9000), &src[30000..39000], "UC WRITE");
            assert_bytes(
                &read_mr(&tgt, 9000, 5000),
                &src[40000..45000],
                "UC WRITE_WITH_IMM",
            );
            assert_bytes(
                &read_mr(&tgt, 14000, 1000),
                &pattern(TGT, 15000)[14000..],
                "bytes after the writes",
            );
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Uc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 64 << 10, SRC, AccessFlags::LOCAL_WRITE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Uc, 4);
            let tgt = oob.recv_region();
            let s = SendFlags::SIGNALED;
            for &(id, off, len, imm) in &sends {
                let op = imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm });
                qp.post_send(&wr(id, op, &[src.sge(off, len as u32)], s))
                    .unwrap();
            }
            let write = SendOp::Write {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(10, write, &[src.sge(30000, 9000)], s))
                .unwrap();
            let write_imm = SendOp::WriteWithImm {
                remote_addr: tgt.at(9000),
                rkey: tgt.rkey,
                imm: 0xabcd,
            };
            qp.post_send(&wr(11, write_imm, &[src.sge(40000, 5000)], s))
                .unwrap();
            let w = wait_cq(&cq, 5, "UC send completions");
            let want = [
                (0, WcOpcode::Send, 1),
                (1, WcOpcode::Send, 10_000),
                (2, WcOpcode::Send, 4096),
                (10, WcOpcode::RdmaWrite, 9000),
                (11, WcOpcode::RdmaWrite, 5000),
            ];
            for (c, (id, op, len)) in w.iter().zip(want) {
                assert_wc(c, id, WcStatus::Success, op, len);
            }
            // UC has no READ or atomics.
            let e = qp
                .post_send(&wr(
                    12,
                    SendOp::Read {
                        remote_addr: tgt.at(0),
                        rkey: tgt.rkey,
                    },
                    &[src.sge(0, 8)],
                    s,
                ))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Verbs(CoreError::UnsupportedOp {
                        op: "RDMA_READ",
                        qp_type: _
                    })
                ),
                "{e:?}"
            );
            assert_eq!(e.to_string(), "RDMA_READ is not supported on UC QPs");
            oob.expect("ok");
        },
    );
}

/// UD SEND over IPv4: the receive buffer starts with the 40-byte GRH (20
/// zero bytes, then the IPv4 header), `byte_len` is 40 + the message,
/// `src_qp` names the sender; a wrong Q_Key is dropped; a message longer
/// than the MTU is refused at post time.
#[test]
fn ud_send_ipv4() {
    ud_send("ud_send_ipv4", V4);
}

/// UD SEND over IPv6: the GRH is the IPv6 header.
#[test]
fn ud_send_ipv6() {
    ud_send("ud_send_ipv6", V6);
}

fn ud_send(test: &str, ip: std::net::IpAddr) {
    const SRC: u64 = 400;
    // (wr_id, offset, length, immediate)
    let msgs: [(u64, usize, usize, Option<u32>); 4] = [
        (0, 0, 1, None),
        (1, 10, 100, Some(0x55aa)),
        (2, 200, 4096, None),
        (3, 5000, 1023, None),
    ];
    two_processes(
        test,
        |mut oob| {
            let ctx = open(ip);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Ud, &cq, &cq, None, cap(16, 16));
            let slot = 40 + 4096;
            let rbuf = pd
                .reg_mr(vec![0xee; 4 * slot], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..4 {
                post_recv(&qp, i as u64, rbuf.sge(i * slot, slot as u32));
            }
            connect(&qp, QpType::Ud, psn(5), &addr_of(&ctx, &qp, 0));
            oob.send_addr(&addr_of(&ctx, &qp, psn(5)));
            let peer = oob.recv_addr();
            let src = pattern(SRC, 16 << 10);
            let w = wait_cq(&cq, 4, "UD receives");
            for (i, (c, &(_, off, len, imm))) in w.iter().zip(&msgs).enumerate() {
                assert_wc(
                    c,
                    i as u64,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    40 + len as u32,
                );
                assert_eq!((c.src_qp, c.qp_num), (peer.qpn, qp.qpn()));
                let flags = wc_flags::GRH | imm.map_or(0, |_| wc_flags::WITH_IMM);
                assert_eq!(c.wc_flags, flags, "wc_flags of {c:?}");
                if let Some(imm) = imm {
                    assert_eq!(c.imm_or_inv, imm);
                }
                let got = read_mr(&rbuf, i * slot, 40 + len);
                check_grh(&got[..40], own_loopback(ip), len, imm.is_some());
                assert_bytes(&got[40..], &src[off..off + len], "UD payload");
            }
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(ip);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Ud, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 16 << 10, SRC, AccessFlags::LOCAL_WRITE);
            connect(&qp, QpType::Ud, psn(6), &addr_of(&ctx, &qp, 0));
            oob.send_addr(&addr_of(&ctx, &qp, psn(6)));
            let peer = oob.recv_addr();
            let mut dest = UdDest {
                gid: peer.gid,
                remote_qpn: peer.qpn,
                remote_qkey: QKEY ^ 1,
            };
            let s = SendFlags::SIGNALED;
            let send = |id: u64, op: SendOp, sge: Sge, dest: UdDest| {
                qp.post_send(&SendWr {
                    wr_id: id,
                    op,
                    sgl: &[sge],
                    flags: s,
                    ud: Some(dest),
                })
            };
            // The wrong Q_Key first: the responder must drop it.
            send(99, SendOp::Send, src.sge(8000, 64), dest).unwrap();
            assert_wc(
                &wait_cq(&cq, 1, "wrong-qkey send")[0],
                99,
                WcStatus::Success,
                WcOpcode::Send,
                64,
            );
            dest.remote_qkey = QKEY;
            for &(id, off, len, imm) in &msgs {
                let op = imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm });
                send(id, op, src.sge(off, len as u32), dest).unwrap();
            }
            for (c, &(id, _, len, _)) in wait_cq(&cq, 4, "UD sends").iter().zip(&msgs) {
                assert_wc(c, id, WcStatus::Success, WcOpcode::Send, len as u32);
            }
            let e = send(9, SendOp::Send, src.sge(0, 4097), dest).unwrap_err();
            assert!(
                matches!(e, Error::Verbs(CoreError::InvalidArgument(m)) if m.contains("MTU")),
                "{e:?}"
            );
            oob.expect("ok");
        },
    );
}

/// The GRH a UD receive starts with, for a `len`-byte SEND between two
/// processes on `ip`.
fn check_grh(g: &[u8], ip: std::net::IpAddr, len: usize, imm: bool) {
    let pad = (4 - len % 4) % 4;
    // BTH + DETH (+ ImmDt) + payload + pad + ICRC
    let roce = 12 + 8 + if imm { 4 } else { 0 } + len + pad + 4;
    match ip {
        std::net::IpAddr::V4(a) => {
            assert_eq!(&g[..20], &[0u8; 20], "GRH: 20 undefined bytes before IPv4");
            assert_eq!(g[20], 0x45, "IPv4 version and header length");
            let total = u16::from_be_bytes([g[22], g[23]]) as usize;
            assert_eq!(total, 20 + 8 + roce, "IPv4 total length");
            assert_eq!(g[29], 17, "protocol UDP");
            assert_eq!(&g[32..36], &a.octets(), "source");
            assert_eq!(&g[36..40], &a.octets(), "destination");
        }
        std::net::IpAddr::V6(a) => {
            assert_eq!(g[0] >> 4, 6, "IPv6 version");
            let payload = u16::from_be_bytes([g[4], g[5]]) as usize;
            assert_eq!(payload, 8 + roce, "IPv6 payload length");
            assert_eq!(g[6], 17, "next header UDP");
            assert_eq!(&g[8..24], &a.octets(), "source");
            assert_eq!(&g[24..40], &a.octets(), "destination");
        }
    }
}

/// Message sizes 1 B to 16 MiB, odd ones and odd addresses included.
const SIZES: [usize; 8] = [1, 3, 4095, 4097, 65537, (1 << 20) + 3, 5 << 20, 16 << 20];

/// Where message `i` of [`SIZES`] sits in a buffer: unaligned starts, with
/// guard bytes between messages.
fn layout() -> (Vec<usize>, usize) {
    let mut offs = Vec::new();
    let mut at = 5;
    for s in SIZES {
        offs.push(at);
        at += s + 61;
    }
    (offs, at)
}

/// WRITE, READ and SEND of every size in [`SIZES`]: the target memory holds
/// each written message with the bytes around it untouched, READ returns
/// what the WRITE before it left (and the untouched bytes elsewhere), each
/// SEND fills exactly its receive buffer.
#[test]
fn sizes_1b_to_16mib_write_read_send() {
    const SRC: u64 = 500;
    const TGT: u64 = 501;
    let (offs, total) = layout();
    // One more READ, of a region nobody wrote.
    let spare = (1usize << 20) + 3;
    two_processes(
        "sizes_1b_to_16mib_write_read_send",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(32, 16));
            let tgt = mr_with(&pd, total + spare, TGT, ALL_REMOTE);
            let rbuf = pd
                .reg_mr(vec![0xee; total], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for (i, (&o, &s)) in offs.iter().zip(&SIZES).enumerate() {
                post_recv(&qp, i as u64, rbuf.sge(o, s as u32));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 7);
            oob.send_region(&Region::of(&tgt));
            let src = pattern(SRC, total);
            let w = wait_cq(&cq, SIZES.len(), "SEND receives");
            let got = read_mr(&rbuf, 0, total);
            for (i, c) in w.iter().enumerate() {
                let (o, s) = (offs[i], SIZES[i]);
                assert_wc(c, i as u64, WcStatus::Success, WcOpcode::Recv, s as u32);
                assert_bytes(&got[o..o + s], &src[o..o + s], &format!("SEND of {s} B"));
                assert_bytes(
                    &got[o + s..o + s + 61],
                    &[0xee; 61],
                    &format!("bytes after the {s} B receive"),
                );
            }
            oob.expect("writes done");
            let mut want = pattern(TGT, total + spare);
            for (&o, &s) in offs.iter().zip(&SIZES) {
                want[o..o + s].copy_from_slice(&src[o..o + s]);
            }
            assert_bytes(
                &read_mr(&tgt, 0, total + spare),
                &want,
                "target memory after the WRITEs",
            );
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(32, 16));
            let src = mr_with(&pd, total, SRC, AccessFlags::LOCAL_WRITE);
            let dst = pd
                .reg_mr(vec![0; total + spare], AccessFlags::LOCAL_WRITE)
                .unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 8);
            let tgt = oob.recv_region();
            let s = SendFlags::SIGNALED;
            let mut want = Vec::new();
            for (i, (&o, &n)) in offs.iter().zip(&SIZES).enumerate() {
                let (remote_addr, rkey) = (tgt.at(o), tgt.rkey);
                let sge = src.sge(o, n as u32);
                qp.post_send(&wr(
                    i as u64,
                    SendOp::Write { remote_addr, rkey },
                    &[sge],
                    s,
                ))
                .unwrap();
                let sge = dst.sge(o, n as u32);
                qp.post_send(&wr(
                    100 + i as u64,
                    SendOp::Read { remote_addr, rkey },
                    &[sge],
                    s,
                ))
                .unwrap();
                want.push((i as u64, WcOpcode::RdmaWrite, n));
                want.push((100 + i as u64, WcOpcode::RdmaRead, n));
            }
            let read_spare = SendOp::Read {
                remote_addr: tgt.at(total),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(200, read_spare, &[dst.sge(total, spare as u32)], s))
                .unwrap();
            want.push((200, WcOpcode::RdmaRead, spare));
            let w = wait_cq(&cq, want.len(), "WRITE and READ completions");
            for (c, (id, op, n)) in w.iter().zip(want) {
                assert_wc(c, id, WcStatus::Success, op, n as u32);
            }
            let srcb = pattern(SRC, total);
            let got = read_mr(&dst, 0, total + spare);
            for (&o, &n) in offs.iter().zip(&SIZES) {
                assert_bytes(&got[o..o + n], &srcb[o..o + n], &format!("READ of {n} B"));
            }
            assert_bytes(
                &got[total..],
                &pattern(TGT, total + spare)[total..],
                "READ of untouched memory",
            );
            oob.signal("writes done");

            for (i, (&o, &n)) in offs.iter().zip(&SIZES).enumerate() {
                qp.post_send(&wr(
                    300 + i as u64,
                    SendOp::Send,
                    &[src.sge(o, n as u32)],
                    s,
                ))
                .unwrap();
            }
            let w = wait_cq(&cq, SIZES.len(), "SEND completions");
            for (i, c) in w.iter().enumerate() {
                assert_wc(
                    c,
                    300 + i as u64,
                    WcStatus::Success,
                    WcOpcode::Send,
                    SIZES[i] as u32,
                );
            }
            oob.expect("ok");
        },
    );
}

/// Four RC QPs between the same two processes (over IPv6), SEND, WRITE and
/// READ interleaved across them: every completion lands on the right QP in
/// that QP's posting order, and every byte where it belongs.
#[test]
fn four_qps_interleaved_ipv6() {
    const SRC: u64 = 600;
    const TGT: u64 = 601;
    const QPS: usize = 4;
    const ROUNDS: usize = 150;
    const SLOT: usize = 512;
    // Round r on QP q: 0 = SEND, 1 = WRITE, 2 = READ.
    let kind = |q: usize, r: usize| (q + r) % 3;
    let send_len = |q: usize, r: usize| 1 + (q * 131 + r * 7) % SLOT;
    let slot = |q: usize, r: usize| (q * ROUNDS + r) * SLOT;
    let len = QPS * ROUNDS * SLOT;
    two_processes(
        "four_qps_interleaved_ipv6",
        |mut oob| {
            let ctx = open(V6);
            let pd = ctx.alloc_pd();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(1024, None).unwrap();
            let qps: Vec<Qp> = (0..QPS)
                .map(|_| qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(16, ROUNDS as u32)))
                .collect();
            let tgt = mr_with(&pd, len, TGT, ALL_REMOTE);
            let rbuf = pd.reg_mr(vec![0; len], AccessFlags::LOCAL_WRITE).unwrap();
            let mut sends = 0;
            for (q, qp) in qps.iter().enumerate() {
                for r in (0..ROUNDS).filter(|&r| kind(q, r) == 0) {
                    post_recv(
                        qp,
                        (q * ROUNDS + r) as u64,
                        rbuf.sge(slot(q, r), SLOT as u32),
                    );
                    sends += 1;
                }
            }
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 9);
            oob.send_region(&Region::of(&tgt));
            let src = pattern(SRC, len);
            let mut next = [0usize; QPS];
            for c in wait_cq(&rcq, sends, "receives on four QPs") {
                let q = qps
                    .iter()
                    .position(|x| x.qpn() == c.qp_num)
                    .expect("our QP");
                let r = (next[q]..ROUNDS).find(|&r| kind(q, r) == 0).unwrap();
                next[q] = r + 1;
                let n = send_len(q, r);
                assert_wc(
                    &c,
                    (q * ROUNDS + r) as u64,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    n as u32,
                );
                let o = slot(q, r);
                assert_bytes(&read_mr(&rbuf, o, n), &src[o..o + n], "SEND data");
            }
            oob.expect("done");
            let mut want = pattern(TGT, len);
            for q in 0..QPS {
                for r in (0..ROUNDS).filter(|&r| kind(q, r) == 1) {
                    let o = slot(q, r);
                    want[o..o + 256].copy_from_slice(&src[o..o + 256]);
                }
            }
            assert_bytes(&read_mr(&tgt, 0, len), &want, "target after the WRITEs");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V6);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(1024, None).unwrap();
            let qps: Vec<Qp> = (0..QPS)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(ROUNDS as u32, 1)))
                .collect();
            let src = mr_with(&pd, len, SRC, AccessFlags::LOCAL_WRITE);
            let dst = pd.reg_mr(vec![0; len], AccessFlags::LOCAL_WRITE).unwrap();
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 10);
            let tgt = oob.recv_region();
            let s = SendFlags::SIGNALED;
            for r in 0..ROUNDS {
                for (q, qp) in qps.iter().enumerate() {
                    let o = slot(q, r);
                    let id = (q * ROUNDS + r) as u64;
                    let (op, sge) = match kind(q, r) {
                        0 => (SendOp::Send, src.sge(o, send_len(q, r) as u32)),
                        1 => (
                            SendOp::Write {
                                remote_addr: tgt.at(o),
                                rkey: tgt.rkey,
                            },
                            src.sge(o, 256),
                        ),
                        _ => (
                            SendOp::Read {
                                remote_addr: tgt.at(o + 256),
                                rkey: tgt.rkey,
                            },
                            dst.sge(o + 256, 128),
                        ),
                    };
                    qp.post_send(&wr(id, op, &[sge], s)).unwrap();
                }
            }
            let mut next = [0usize; QPS];
            for c in wait_cq(&cq, QPS * ROUNDS, "completions on four QPs") {
                let q = qps
                    .iter()
                    .position(|x| x.qpn() == c.qp_num)
                    .expect("our QP");
                let r = next[q];
                next[q] += 1;
                let (op, n) = match kind(q, r) {
                    0 => (WcOpcode::Send, send_len(q, r)),
                    1 => (WcOpcode::RdmaWrite, 256),
                    _ => (WcOpcode::RdmaRead, 128),
                };
                assert_wc(&c, (q * ROUNDS + r) as u64, WcStatus::Success, op, n as u32);
            }
            let t = pattern(TGT, len);
            let got = read_mr(&dst, 0, len);
            for q in 0..QPS {
                for r in (0..ROUNDS).filter(|&r| kind(q, r) == 2) {
                    let o = slot(q, r) + 256;
                    assert_bytes(&got[o..o + 128], &t[o..o + 128], "READ data");
                }
            }
            oob.signal("done");
            oob.expect("ok");
        },
    );
}

/// One shared receive queue behind two RC QPs: messages on both QPs take
/// buffers from it in arrival order, each completion names its QP, and a
/// sender that outruns the reposting is held off by RNR NAKs, not failed.
#[test]
fn srq_shared_by_two_qps() {
    const MSGS: usize = 200; // per QP
    const DEPTH: usize = 16;
    const BUF: usize = 512;
    let msg = |q: usize, k: usize| -> Vec<u8> {
        let mut m = vec![q as u8];
        m.extend_from_slice(&(k as u32).to_le_bytes());
        m.extend(pattern((q * 100_000 + k) as u64, 27 + (k * 13) % 400));
        m
    };
    two_processes(
        "srq_shared_by_two_qps",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(2 * MSGS as u32, None).unwrap();
            let srq = pd.create_srq(DEPTH as u32, 1).unwrap();
            let qps: Vec<Qp> = (0..2)
                .map(|_| qp_init(&pd, QpType::Rc, &scq, &rcq, Some(&srq), cap(4, 0)))
                .collect();
            let rbuf = pd
                .reg_mr(vec![0; DEPTH * BUF], AccessFlags::LOCAL_WRITE)
                .unwrap();
            let post = |b: usize| {
                srq.post_recv(&RecvWr {
                    wr_id: b as u64,
                    sgl: &[rbuf.sge(b * BUF, BUF as u32)],
                })
                .unwrap()
            };
            (0..DEPTH).for_each(post);
            let e = qps[0]
                .post_recv(&RecvWr {
                    wr_id: 0,
                    sgl: &[rbuf.sge(0, 8)],
                })
                .unwrap_err();
            assert!(e.to_string().contains("post to the SRQ"), "{e}");
            let e = srq
                .post_recv(&RecvWr {
                    wr_id: 0,
                    sgl: &[rbuf.sge(0, 8)],
                })
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Verbs(CoreError::QueueFull {
                        queue: "shared receive queue",
                        depth: 16
                    })
                ),
                "{e:?}"
            );
            exchange_and_connect(&ctx, &mut oob, &[&qps[0], &qps[1]], QpType::Rc, 11);
            let mut next = [0usize; 2];
            let mut buf = [blank(); 8];
            let mut got = 0;
            let start = std::time::Instant::now();
            while got < 2 * MSGS {
                let n = rcq.poll(&mut buf).unwrap();
                for c in &buf[..n] {
                    let q = qps
                        .iter()
                        .position(|x| x.qpn() == c.qp_num)
                        .expect("our QP");
                    let want = msg(q, next[q]);
                    next[q] += 1;
                    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
                    assert_eq!(c.byte_len as usize, want.len(), "{c:?}");
                    let b = c.wr_id as usize;
                    assert_bytes(&read_mr(&rbuf, b * BUF, want.len()), &want, "SRQ message");
                    post(b);
                    got += 1;
                }
                assert!(
                    start.elapsed() < WAIT,
                    "{got} of {} messages within {WAIT:?}",
                    2 * MSGS
                );
            }
            assert_eq!(next, [MSGS, MSGS], "messages per QP");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(2 * MSGS as u32, None).unwrap();
            let qps: Vec<Qp> = (0..2)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(MSGS as u32, 1)))
                .collect();
            let mut all = Vec::new();
            let mut at = Vec::new();
            for k in 0..MSGS {
                for q in 0..2 {
                    at.push((q, k, all.len()));
                    all.extend(msg(q, k));
                }
            }
            let src = pd.reg_mr(all, AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qps[0], &qps[1]], QpType::Rc, 12);
            for &(q, k, o) in &at {
                let sge = src.sge(o, msg(q, k).len() as u32);
                qps[q]
                    .post_send(&wr(k as u64, SendOp::Send, &[sge], SendFlags::SIGNALED))
                    .unwrap();
            }
            let w = wait_cq(&cq, 2 * MSGS, "sends into the SRQ");
            assert!(w.iter().all(|c| c.status == WcStatus::Success), "{w:?}");
            let (st, _) = ctx.stats();
            eprintln!("RNR NAKs received: {}", st.rnr_naks_rcvd);
            oob.expect("ok");
        },
    );
}

/// Immediate data (0, all ones, and on a zero-length WRITE) and inline
/// sends: inline data is taken when posted, so overwriting the source right
/// after the post changes nothing the peer sees; inline data beyond the QP's
/// `max_inline_data` is refused.
#[test]
fn immediate_data_and_inline_sends() {
    const SRC: u64 = 700;
    const TGT: u64 = 701;
    // (wr_id, offset, length, immediate) of the inline SENDs
    let sends: [(u64, usize, usize, Option<u32>); 4] = [
        (0, 0, 1, None),
        (1, 100, 64, Some(0)),
        (2, 300, 256, Some(u32::MAX)),
        (3, 1000, 255, None),
    ];
    two_processes(
        "immediate_data_and_inline_sends",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let tgt = mr_with(&pd, 4096, TGT, ALL_REMOTE);
            let rbuf = pd
                .reg_mr(vec![0xee; 6 * 512], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..6 {
                post_recv(&qp, i as u64, rbuf.sge(i * 512, 512));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 13);
            oob.send_region(&Region::of(&tgt));
            let src = pattern(SRC, 4096);
            let w = wait_cq(&cq, 6, "receives");
            for (c, &(id, off, len, imm)) in w.iter().zip(&sends) {
                assert_wc(c, id, WcStatus::Success, WcOpcode::Recv, len as u32);
                match imm {
                    Some(i) => assert_eq!((c.wc_flags, c.imm_or_inv), (wc_flags::WITH_IMM, i)),
                    None => assert_eq!(c.wc_flags, 0),
                }
                assert_bytes(
                    &read_mr(&rbuf, id as usize * 512, len),
                    &src[off..off + len],
                    "inline SEND data as it was when posted",
                );
            }
            assert_wc(&w[4], 4, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 200);
            assert_eq!(w[4].imm_or_inv, 0xfeed_f00d);
            assert_wc(&w[5], 5, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0);
            assert_eq!((w[5].wc_flags, w[5].imm_or_inv), (wc_flags::WITH_IMM, 7));
            let mut want = pattern(TGT, 4096);
            want[1000..1200].copy_from_slice(&src[2000..2200]);
            assert_bytes(
                &read_mr(&tgt, 0, 4096),
                &want,
                "inline WRITE_WITH_IMM target",
            );
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 4096, SRC, AccessFlags::LOCAL_WRITE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 14);
            let tgt = oob.recv_region();
            let f = SendFlags::SIGNALED | SendFlags::INLINE;
            let scribble = |off: usize, len: usize| src.write(off, &vec![0x5a; len]);
            for &(id, off, len, imm) in &sends {
                let op = imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm });
                qp.post_send(&wr(id, op, &[src.sge(off, len as u32)], f))
                    .unwrap();
                scribble(off, len);
            }
            let op = SendOp::WriteWithImm {
                remote_addr: tgt.at(1000),
                rkey: tgt.rkey,
                imm: 0xfeed_f00d,
            };
            // Two SGEs, 200 bytes inline.
            let sgl = [src.sge(2000, 150), src.sge(2150, 50)];
            qp.post_send(&wr(4, op, &sgl, f)).unwrap();
            scribble(2000, 200);
            // Zero bytes: only the immediate moves (no SGE, no rkey).
            let op = SendOp::WriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 7,
            };
            qp.post_send(&wr(5, op, &[], SendFlags::SIGNALED)).unwrap();
            let w = wait_cq(&cq, 6, "send completions");
            for (i, c) in w.iter().enumerate() {
                assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success), "{c:?}");
            }
            let e = qp
                .post_send(&wr(9, SendOp::Send, &[src.sge(0, 257)], f))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Verbs(CoreError::InlineTooLong { got: 257, max: 256 })
                ),
                "{e:?}"
            );
            assert_eq!(e.to_string(), "257 bytes of inline data, the QP allows 256");
            oob.expect("ok");
        },
    );
}

/// Event mode: a CQ tied to a completion channel and armed with
/// `req_notify` makes the channel's fd readable — seen by poll(2) and by
/// epoll — once a completion arrives and not before; `get_event` names the
/// CQ and consumes the event; a solicited-only arm ignores unsolicited
/// completions and fires on a solicited one. The sender waits for its own
/// send completions by events too.
#[test]
fn completion_channel_event_mode() {
    const ROUNDS: u64 = 6;
    two_processes(
        "completion_channel_event_mode",
        |mut oob| {
            // The sender: one SEND per request, each completion awaited
            // through the channel.
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let ch = ctx.create_comp_channel().unwrap();
            let cq = ctx.create_cq(16, Some(&ch)).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 1));
            let src = mr_with(&pd, 4096, 800, AccessFlags::LOCAL_WRITE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 15);
            loop {
                let m = oob.recv();
                let (k, solicited) = match m.as_slice() {
                    [b'u', k] => (*k as u64, false),
                    [b's', k] => (*k as u64, true),
                    b"bye" => break,
                    _ => panic!("unknown request {m:?}"),
                };
                cq.req_notify(false).unwrap();
                let mut f = SendFlags::SIGNALED;
                if solicited {
                    f = f | SendFlags::SOLICITED;
                }
                qp.post_send(&wr(k, SendOp::Send, &[src.sge(k as usize * 100, 100)], f))
                    .unwrap();
                assert_eq!(
                    ch.get_event(Some(WAIT)).unwrap(),
                    Some(cq.id()),
                    "send event"
                );
                assert_wc(
                    &wait_cq(&cq, 1, "send")[0],
                    k,
                    WcStatus::Success,
                    WcOpcode::Send,
                    100,
                );
                oob.signal("sent");
            }
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let ch = ctx.create_comp_channel().unwrap();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(16, Some(&ch)).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(4, 16));
            let rbuf = pd
                .reg_mr(vec![0; 16 * 128], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..=ROUNDS {
                post_recv(&qp, i, rbuf.sge(i as usize * 128, 128));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 16);
            let src = pattern(800, 4096);
            let epfd = Epoll::new(ch.fd());
            let check = |c: &Completion, k: u64| {
                assert_wc(c, k, WcStatus::Success, WcOpcode::Recv, 100);
                let o = k as usize * 100;
                assert_bytes(
                    &read_mr(&rbuf, k as usize * 128, 100),
                    &src[o..o + 100],
                    "data",
                );
            };
            for k in 0..ROUNDS - 1 {
                rcq.req_notify(false).unwrap();
                assert!(
                    !readable(ch.fd(), 0),
                    "channel readable before any completion"
                );
                oob.send(&[b'u', k as u8]);
                if k % 2 == 0 {
                    assert!(
                        readable(ch.fd(), WAIT.as_millis() as i32),
                        "poll(2) on the channel fd"
                    );
                } else {
                    assert!(
                        epfd.wait(WAIT.as_millis() as i32),
                        "epoll on the channel fd"
                    );
                }
                assert_eq!(
                    ch.get_event(Some(WAIT)).unwrap(),
                    Some(rcq.id()),
                    "the event names the CQ"
                );
                check(&wait_cq(&rcq, 1, "receive after its event")[0], k);
                oob.expect("sent");
            }
            // Solicited only: an unsolicited completion raises nothing ...
            rcq.req_notify(true).unwrap();
            let k = ROUNDS - 1;
            oob.send(&[b'u', k as u8]);
            check(&wait_cq(&rcq, 1, "unsolicited receive")[0], k);
            oob.expect("sent");
            assert!(
                !readable(ch.fd(), 100),
                "event for an unsolicited completion"
            );
            // ... a solicited one does.
            oob.send(&[b's', ROUNDS as u8]);
            assert!(
                readable(ch.fd(), WAIT.as_millis() as i32),
                "event for the solicited completion"
            );
            assert_eq!(ch.get_event(Some(WAIT)).unwrap(), Some(rcq.id()));
            check(&wait_cq(&rcq, 1, "solicited receive")[0], ROUNDS);
            oob.expect("sent");
            assert!(!readable(ch.fd(), 0), "the event was consumed");
            oob.send(b"bye");
        },
    );
}

/// Whether `fd` becomes readable within `ms` (poll(2)).
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0, "poll: {}", std::io::Error::last_os_error());
    r == 1 && p.revents & libc::POLLIN != 0
}

/// An epoll instance watching one fd for input.
struct Epoll(i32);

impl Epoll {
    fn new(fd: i32) -> Epoll {
        // SAFETY: plain syscall, no pointers.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1");
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the call.
        let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(r, 0, "epoll_ctl");
        Epoll(ep)
    }

    fn wait(&self, ms: i32) -> bool {
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 1];
        // SAFETY: `ev` has room for the one event we ask for.
        let n = unsafe { libc::epoll_wait(self.0, ev.as_mut_ptr(), 1, ms) };
        assert!(n >= 0, "epoll_wait");
        n == 1 && ev[0].events & libc::EPOLLIN as u32 != 0
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor.
        unsafe { libc::close(self.0) };
    }
}

/// Inline data is named in the region's iova space, as every SGE is, and
/// read from there: a region registered at an iova other than its address
/// sends its own bytes. (The core used to read inline SGEs at the raw
/// address after the safe API had checked them as iovas: a read of
/// unregistered memory from safe code.)
#[test]
fn inline_sges_are_read_in_iova_space() {
    const DATA: u64 = 700;
    const IOVA: u64 = 0x7000_0000_0000;
    two_processes(
        "inline_sges_are_read_in_iova_space",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let rbuf = pd.reg_mr(vec![0; 64], AccessFlags::LOCAL_WRITE).unwrap();
            post_recv(&qp, 1, rbuf.sge(0, 64));
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 7);
            let w = wait_cq(&cq, 1, "the inline SEND");
            assert_wc(&w[0], 1, WcStatus::Success, WcOpcode::Recv, 48);
            assert_bytes(
                &read_mr(&rbuf, 0, 48),
                &pattern(DATA, 64)[8..56],
                "inline SEND data",
            );
            oob.signal("got");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let mut cap = cap(4, 4);
            cap.max_inline_data = 64;
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap);
            let buf: &'static mut [u8] = Box::leak(pattern(DATA, 64).into_boxed_slice());
            // SAFETY: `buf` is leaked, so it stays valid for the rest of the
            // process, beyond the region's life.
            let mr = unsafe {
                pd.reg_mr_raw(buf.as_mut_ptr() as u64, 64, IOVA, AccessFlags::LOCAL_WRITE)
            }
            .unwrap();
            assert_eq!(mr.sge(8, 48).addr, IOVA + 8, "SGEs are in iova space");
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 7);
            qp.post_send(&wr(
                5,
                SendOp::Send,
                &[mr.sge(8, 48)],
                SendFlags::SIGNALED | SendFlags::INLINE,
            ))
            .unwrap();
            let w = wait_cq(&cq, 1, "inline SEND completion");
            assert_wc(&w[0], 5, WcStatus::Success, WcOpcode::Send, 48);
            // An inline SGE outside every region is refused by name.
            let bad = Sge {
                addr: IOVA + 4096,
                length: 8,
                lkey: mr.lkey(),
            };
            let e = qp
                .post_send(&wr(6, SendOp::Send, &[bad], SendFlags::INLINE))
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains("inline SGE is not inside a memory region"),
                "{e}"
            );
            oob.expect("got");
        },
    );
}

/// The receiver of a message moves its QP to Error the moment the message's
/// completion is in its hands (rdma_disconnect after the last receive, as
/// fi_pingpong's connected endpoints do): the sender still gets its ACK
/// and a successful completion, not a retry-exceeded one from
/// retransmitting into a QP that no longer answers. The ACK may have been
/// held for the receiver's next post (see the engine's deferred ACKs).
#[test]
fn a_message_taken_before_error_is_acknowledged() {
    two_processes(
        "a_message_taken_before_error_is_acknowledged",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let rbuf = pd.reg_mr(vec![0; 64], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 5);
            // A SEND that finds this QP still in INIT is dropped.
            oob.signal("connected");
            for round in 0..20u64 {
                post_recv(&qp, round, rbuf.sge(0, 64));
                let w = wait_cq(&cq, 1, "the message");
                assert_wc(&w[0], round, WcStatus::Success, WcOpcode::Recv, 64);
                if round == 19 {
                    qp.modify(
                        &QpAttr {
                            qp_state: QpState::Err,
                            ..Default::default()
                        },
                        AttrMask::STATE,
                    )
                    .unwrap();
                }
            }
            // Keep the QP (in Error) until the sender has its completion.
            oob.expect("done");
            drop(qp);
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let sbuf = mr_with(&pd, 64, 7, AccessFlags::LOCAL_WRITE);
            // A lost ACK still ends in RETRY_EXC_ERR, within 8 × 67 ms. (A
            // 4 ms timeout, 30 ms in all, failed the test whenever the
            // receiving process went unscheduled that long.)
            let mine = addr_of(&ctx, &qp, psn(77));
            oob.send_addr(&mine);
            let r = oob.recv_addr();
            connect_with(&qp, QpType::Rc, mine.psn, &r, 14);
            oob.expect("connected");
            let one = [sbuf.sge(0, 64)];
            for round in 0..20u64 {
                qp.post_send(&wr(round, SendOp::Send, &one, SendFlags::SIGNALED))
                    .unwrap();
                let w = wait_cq(&cq, 1, "the send's completion");
                assert_wc(&w[0], round, WcStatus::Success, WcOpcode::Send, 64);
            }
            oob.signal("done");
        },
    );
}
