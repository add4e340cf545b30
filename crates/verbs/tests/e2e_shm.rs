//! The shared-memory transport between two processes of this host:
//!
//! * chosen on its own (`Transport::Auto`): every opcode moves exact bytes
//!   and not one datagram reaches the UDP socket; one-sided operations are
//!   carried out at post, into the very pages the target registered;
//! * `Transport::Udp` keeps everything on the wire, and `Transport::Shm`
//!   refuses a peer that cannot share memory instead of falling back;
//! * a target that dies mid-transfer (SIGKILL) leaves the initiator's QP in
//!   ERR with IBA's statuses, never a hang, and leaves nothing behind in
//!   `/dev/shm`;
//! * a region deregistered under a peer's traffic is never touched again:
//!   the peer's next WRITE fails with `REM_ACCESS_ERR`.
//!
//! Every other end-to-end test of this crate runs on both transports too:
//! `scripts/test` runs them again with `SOFTRDMA_TRANSPORT=udp`.

mod support;

use std::time::{Duration, Instant};

use softrdma_verbs::*;
use support::*;

const LEN: usize = 1 << 20;

/// The entries of `/dev/shm` (the transport must never add one).
fn dev_shm() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every opcode over shared memory, each byte checked, nothing on the wire.
#[test]
fn every_opcode_through_shared_memory() {
    const TGT: u64 = 31;
    const SRC: u64 = 32;
    two_processes(
        "every_opcode_through_shared_memory",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            assert!(ctx.shares_memory(), "no shared-memory transport");
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            // Page-aligned, so every byte of it is in pages the peer maps
            // (a region's partial first and last pages go through the
            // rings instead, as the other tests' `Vec` regions do).
            let tgt = pd.alloc_mr(LEN, ALL_REMOTE).unwrap();
            tgt.write(0, &pattern(TGT, LEN));
            let rbuf = pd.reg_mr(vec![0; 4096], AccessFlags::LOCAL_WRITE).unwrap();
            post_recv(&qp, 1, rbuf.sge(0, 4096));
            post_recv(&qp, 2, rbuf.sge(0, 4096));
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 40);
            assert_eq!(qp.transport(), "shm");
            oob.send_region(&Region::of(&tgt));
            // A SEND with immediate, then a WRITE with immediate.
            let c = wait_cq(&cq, 2, "the two receives");
            assert_wc(&c[0], 1, WcStatus::Success, WcOpcode::Recv, 100);
            assert_eq!(c[0].imm_or_inv, 0x1234_5678);
            assert_bytes(&read_mr(&rbuf, 0, 100), &pattern(SRC, 100), "SEND payload");
            assert_wc(&c[1], 2, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 64);
            assert_eq!(c[1].imm_or_inv, 0x9abc_def0);
            oob.expect("done");
            // What the peer wrote and what its atomics left, byte for byte.
            let mut want = pattern(TGT, LEN);
            let src = pattern(SRC, 64 << 10);
            want[4096..4096 + (64 << 10)].copy_from_slice(&src);
            want[200_000..200_064].copy_from_slice(&src[..64]);
            let w8 = u64::from_ne_bytes(want[8..16].try_into().unwrap()) + 5;
            want[8..16].copy_from_slice(&w8.to_ne_bytes());
            want[16..24].copy_from_slice(&0xfeed_u64.to_ne_bytes());
            want[24..32].copy_from_slice(&0x0102_0304_0506_0708u64.to_ne_bytes());
            assert_bytes(&read_mr(&tgt, 0, LEN), &want, "target region");
            let (_, port) = ctx.stats();
            assert_eq!(port.tx_packets, 0, "a datagram went on the wire: {port:?}");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 64 << 10, SRC, AccessFlags::LOCAL_WRITE);
            let local = pd.reg_mr(vec![0; LEN], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 40);
            assert_eq!(qp.transport(), "shm");
            let tgt = oob.recv_region();
            let s = SendFlags::SIGNALED;
            let old8 = u64::from_ne_bytes(pattern(TGT, 16)[8..16].try_into().unwrap());
            let old16 = u64::from_ne_bytes(pattern(TGT, 24)[16..24].try_into().unwrap());
            let ops: Vec<(SendOp, Sge)> = vec![
                (
                    SendOp::Write {
                        remote_addr: tgt.at(4096),
                        rkey: tgt.rkey,
                    },
                    src.sge(0, 64 << 10),
                ),
                (
                    SendOp::Read {
                        remote_addr: tgt.at(4096),
                        rkey: tgt.rkey,
                    },
                    local.sge(0, 64 << 10),
                ),
                (
                    SendOp::FetchAdd {
                        remote_addr: tgt.at(8),
                        rkey: tgt.rkey,
                        add: 5,
                    },
                    local.sge(100_000, 8),
                ),
                (
                    SendOp::CompareSwap {
                        remote_addr: tgt.at(16),
                        rkey: tgt.rkey,
                        compare: old16,
                        swap: 0xfeed,
                    },
                    local.sge(100_008, 8),
                ),
            ];
            for (i, (op, sge)) in ops.into_iter().enumerate() {
                qp.post_send(&wr(i as u64, op, &[sge], s)).unwrap();
                let c = wait_cq(&cq, 1, "a one-sided operation");
                assert_eq!((c[0].wr_id, c[0].status), (i as u64, WcStatus::Success));
            }
            assert_bytes(
                &read_mr(&local, 0, 64 << 10),
                &pattern(SRC, 64 << 10),
                "READ back",
            );
            assert_eq!(
                read_u64(&local, 100_000),
                old8,
                "FETCH_ADD's original value"
            );
            assert_eq!(
                read_u64(&local, 100_008),
                old16,
                "CMP_SWAP's original value"
            );
            // An inline WRITE and an ATOMIC WRITE.
            src.write(0, &pattern(SRC, 64));
            let isge = [src.sge(0, 64)];
            let w = wr(
                10,
                SendOp::Write {
                    remote_addr: tgt.at(200_000),
                    rkey: tgt.rkey,
                },
                &isge,
                s | SendFlags::INLINE,
            );
            qp.post_send(&w).unwrap();
            local.write(200_000, &0x0102_0304_0506_0708u64.to_ne_bytes());
            let aw = SendOp::AtomicWrite {
                remote_addr: tgt.at(24),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(11, aw, &[local.sge(200_000, 8)], s))
                .unwrap();
            let c = wait_cq(&cq, 2, "inline WRITE and ATOMIC WRITE");
            assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
            // Two-sided: through the rings.
            let send = SendOp::SendWithImm { imm: 0x1234_5678 };
            qp.post_send(&wr(20, send, &[src.sge(0, 100)], s)).unwrap();
            let wi = SendOp::WriteWithImm {
                remote_addr: tgt.at(300_000),
                rkey: tgt.rkey,
                imm: 0x9abc_def0,
            };
            // Writes what the target already holds there: the check above
            // stays simple.
            let here = pattern(TGT, LEN)[300_000..300_064].to_vec();
            local.write(300_000, &here);
            qp.post_send(&wr(21, wi, &[local.sge(300_000, 64)], s))
                .unwrap();
            let c = wait_cq(&cq, 2, "SEND and WRITE with immediate");
            assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
            let (st, port) = ctx.stats();
            assert_eq!(st.offloaded, 6, "one-sided operations carried out at post");
            assert_eq!(port.tx_packets, 0, "a datagram went on the wire: {port:?}");
            oob.signal("done");
            oob.expect("ok");
        },
    );
}

/// `Transport::Udp` keeps a same-host connection on the wire.
#[test]
fn udp_when_asked() {
    two_processes(
        "udp_when_asked",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            assert!(!ctx.shares_memory());
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let tgt = mr_with(&pd, 4096, 1, ALL_REMOTE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 50);
            assert_eq!(qp.transport(), "udp");
            oob.send_region(&Region::of(&tgt));
            oob.expect("done");
        },
        |mut oob| {
            // This side could share memory; the peer cannot.
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let local = pd.reg_mr(vec![0; 4096], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 50);
            assert_eq!(qp.transport(), "udp", "fell back to UDP");
            let tgt = oob.recv_region();
            let op = SendOp::Read {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(1, op, &[local.sge(0, 4096)], SendFlags::SIGNALED))
                .unwrap();
            let c = wait_cq(&cq, 1, "a READ over UDP");
            assert_eq!(c[0].status, WcStatus::Success);
            assert_bytes(
                &read_mr(&local, 0, 4096),
                &pattern(1, 4096),
                "READ over UDP",
            );
            let (st, port) = ctx.stats();
            assert_eq!(st.offloaded, 0);
            assert!(port.tx_packets > 0, "nothing went on the wire: {port:?}");
            oob.signal("done");
        },
    );
}

/// `Transport::Shm` demands shared memory: connecting to a peer that
/// cannot have it fails by name instead of falling back.
#[test]
fn shm_when_demanded() {
    two_processes(
        "shm_when_demanded",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            oob.send_addr(&addr_of(&ctx, &qp, psn(60)));
            oob.expect("done");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Shm));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let remote = oob.recv_addr();
            let mut a = QpAttr {
                qp_state: QpState::Rtr,
                path_mtu: Mtu::B4096,
                dest_qp_num: remote.qpn,
                rq_psn: remote.psn,
                max_dest_rd_atomic: 1,
                ..Default::default()
            };
            a.av.dgid = remote.gid;
            let mask = required_mask(QpState::Init, QpState::Rtr, QpType::Rc).unwrap();
            let e = qp
                .modify(&a, mask)
                .expect_err("RTR to a peer without shared memory");
            let msg = e.to_string();
            assert!(
                msg.contains("SOFTRDMA_TRANSPORT=shm") && msg.contains("not reachable"),
                "{msg}"
            );
            let (state, _, _) = qp.query().unwrap();
            assert_eq!(state, QpState::Init, "a refused transition changes nothing");
            oob.signal("done");
        },
    );
}

/// The target dies by SIGKILL while the initiator streams WRITEs and SENDs
/// to it: the initiator's work ends in error completions and its QP in ERR
/// within the retry budget (no hang), and nothing is left in `/dev/shm`.
#[test]
fn a_dead_peer_ends_the_connection() {
    two_processes_child_killed(
        "a_dead_peer_ends_the_connection",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(1024, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 512));
            let tgt = mr_with(&pd, LEN, 7, ALL_REMOTE);
            let rbuf = pd
                .reg_mr(vec![0; 512 * 64], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..512 {
                post_recv(&qp, i, rbuf.sge(i as usize * 64, 64));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 70);
            oob.send_region(&Region::of(&tgt));
            oob.expect("streaming");
            // Die with everything mapped and the peer mid-transfer.
            // SAFETY: kill(2) on our own pid.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            std::thread::sleep(Duration::from_secs(10));
        },
        |mut oob| {
            let before = dev_shm();
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(1024, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 4));
            let src = mr_with(&pd, 64 << 10, 8, AccessFlags::LOCAL_WRITE);
            // A short ACK timeout (4 ms, 7 retries) bounds the wait.
            let mine = addr_of(&ctx, &qp, psn(71));
            oob.send_addr(&mine);
            let remote = oob.recv_addr();
            connect_with(&qp, QpType::Rc, mine.psn, &remote, 10);
            assert_eq!(qp.transport(), "shm");
            let tgt = oob.recv_region();
            oob.signal("streaming");
            let start = Instant::now();
            let mut i = 0u64;
            let mut outstanding = 0usize;
            let end = loop {
                assert!(
                    start.elapsed() < WAIT,
                    "no error within {WAIT:?} of the peer's death"
                );
                if outstanding < 8 {
                    let op = if i.is_multiple_of(2) {
                        SendOp::Write {
                            remote_addr: tgt.at((i as usize * 4096) % (LEN - 4096)),
                            rkey: tgt.rkey,
                        }
                    } else {
                        SendOp::Send
                    };
                    if qp
                        .post_send(&wr(i, op, &[src.sge(0, 64)], SendFlags::SIGNALED))
                        .is_ok()
                    {
                        outstanding += 1;
                        i += 1;
                    }
                }
                let mut c = [blank(); 16];
                let n = cq.poll(&mut c).unwrap();
                outstanding -= n;
                if let Some(bad) = c[..n].iter().find(|c| c.status != WcStatus::Success) {
                    break *bad;
                }
            };
            assert!(
                matches!(end.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr),
                "the first failure: {end:?}"
            );
            wait_state(&qp, QpState::Err, "the initiator's QP after its peer died");
            // The rest flushes.
            let rest = wait_cq(&cq, outstanding, "the flushed rest");
            assert!(
                rest.iter().all(|c| c.status == WcStatus::WrFlushErr),
                "{rest:?}"
            );
            drop(qp);
            drop(ctx);
            assert_eq!(dev_shm(), before, "/dev/shm changed");
        },
    );
}

/// A region deregistered while a peer's WRITEs stream into it: the peer is
/// never let in again — its next WRITE completes `REM_ACCESS_ERR`.
#[test]
fn deregistration_under_peer_traffic() {
    two_processes(
        "deregistration_under_peer_traffic",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let tgt = mr_with(&pd, LEN, 9, ALL_REMOTE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 80);
            oob.send_region(&Region::of(&tgt));
            // The peer has written into it (and goes on writing).
            oob.expect("streaming");
            drop(tgt);
            oob.signal("gone");
            oob.expect("done");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let src = mr_with(&pd, 64 << 10, 10, AccessFlags::LOCAL_WRITE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 80);
            let tgt = oob.recv_region();
            let op = SendOp::Write {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            let sge = [src.sge(0, 64 << 10)];
            let mut ok = 0u64;
            let start = Instant::now();
            let end = loop {
                assert!(start.elapsed() < WAIT, "WRITEs kept succeeding");
                qp.post_send(&wr(ok, op, &sge, SendFlags::SIGNALED))
                    .unwrap();
                let c = wait_cq(&cq, 1, "a WRITE")[0];
                if c.status != WcStatus::Success {
                    break c;
                }
                ok += 1;
                if ok == 1 {
                    oob.signal("streaming");
                }
            };
            oob.expect("gone");
            assert_eq!(end.status, WcStatus::RemAccessErr, "{end:?}");
            assert!(ok > 0, "no WRITE succeeded before the deregistration");
            wait_state(&qp, QpState::Err, "the QP after a remote access error");
            oob.signal("done");
        },
    );
}

/// A full ring holds the sender back and loses nothing. The initiator
/// READs 16 MiB, twice the ring, from a region of the target's that is not
/// in shared memory (an implicit one), so the responses come as packets
/// through the initiator's ring; right after posting, the initiator stops
/// (SIGSTOP) and drains nothing. The target's ring into it fills and its
/// transmission waits (its `ring_stalls` says so, without being told);
/// then the initiator goes on (SIGCONT), drains, and the target resumes on
/// the bell: the READ completes with every byte, and not one packet was
/// dropped or resent.
#[test]
fn a_full_ring_holds_the_sender_back_and_loses_nothing() {
    const BIG: usize = 16 << 20;
    two_processes(
        "a_full_ring_holds_the_sender_back_and_loses_nothing",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Shm));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let dst = pd.reg_mr(vec![0; BIG], AccessFlags::LOCAL_WRITE).unwrap();
            let me = addr_of(&ctx, &qp, psn(70));
            oob.send_addr(&me);
            // A timeout of 4 s: the stop must not look like a lost packet.
            connect_with(&qp, QpType::Rc, me.psn, &oob.recv_addr(), 20);
            oob.send_u64s(&[std::process::id() as u64]);
            let v = oob.recv_u64s();
            let read = SendOp::Read {
                remote_addr: v[0],
                rkey: v[1] as u32,
            };
            qp.post_send(&wr(1, read, &[dst.sge(0, BIG as u32)], SendFlags::SIGNALED))
                .unwrap();
            // SAFETY: stops this process; the parent continues it.
            unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
            let c = wait_cq(&cq, 1, "the READ after the stop");
            assert_wc(&c[0], 1, WcStatus::Success, WcOpcode::RdmaRead, BIG as u32);
            assert_bytes(&read_mr(&dst, 0, BIG), &pattern(71, BIG), "the 16 MiB READ");
            let (t, _) = ctx.stats();
            assert_eq!((t.retransmits, t.timeouts), (0, 0), "{t:?}");
            oob.signal("read");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Shm));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            // SAFETY: `src` is only read by peers; nothing is unmapped
            // while they may read.
            let mr = unsafe { pd.reg_mr_implicit(ALL_REMOTE) }.unwrap();
            let src = pattern(71, BIG);
            let me = addr_of(&ctx, &qp, psn(71));
            oob.send_addr(&me);
            connect_with(&qp, QpType::Rc, me.psn, &oob.recv_addr(), 20);
            oob.send_u64s(&[src.as_ptr() as u64, mr.rkey() as u64]);
            let pid = oob.recv_u64s()[0] as libc::pid_t;
            // Served by our engine thread: we only watch.
            let t0 = Instant::now();
            while ctx.shm_stats().ring_stalls == 0 {
                assert!(t0.elapsed() < WAIT, "the ring never filled");
                std::thread::sleep(Duration::from_millis(1));
            }
            // SAFETY: a signal to our own child process, by its pid.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
            oob.expect("read");
            let s = ctx.shm_stats();
            assert_eq!(s.ring_drops, 0, "{s:?}");
            drop(src);
        },
    );
}

/// The same with requests in the stream: SENDs go through the rings as
/// packets, taken from the core a burst at a time
/// (`Endpoint::poll_transmit_burst`); a packet refused by a full ring keeps
/// everything built after it waiting behind it, in order. The receiver
/// READs 16 MiB over one QP (responses that, unlike requests, no window
/// holds back: they fill the ring) and posts four 1 MiB receives on
/// another, then stops; the sender posts four SENDs while the responses
/// stream. Continued, the READ and every SEND land byte for byte, in
/// order, with nothing dropped or resent. (Which packet finds the ring
/// full is up to timing; a version of the engine that dropped what was
/// built behind a refused packet did not fail this test in three runs,
/// so the burst's own case rests on the code, not on this test.)
#[test]
fn requests_and_responses_behind_a_full_ring_go_in_order() {
    const BIG: usize = 16 << 20;
    const MSG: usize = 1 << 20;
    const N: usize = 4;
    two_processes(
        "requests_and_responses_behind_a_full_ring_go_in_order",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Shm));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let reader = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let rx = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(N as u32, N as u32));
            let dst = pd.reg_mr(vec![0; BIG], AccessFlags::LOCAL_WRITE).unwrap();
            let got = pd
                .reg_mr(vec![0; N * MSG], AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..N {
                post_recv(&rx, 10 + i as u64, got.sge(i * MSG, MSG as u32));
            }
            for (qp, p) in [(&reader, 90), (&rx, 92)] {
                let me = addr_of(&ctx, qp, psn(p));
                oob.send_addr(&me);
                connect_with(qp, QpType::Rc, me.psn, &oob.recv_addr(), 20);
            }
            oob.send_u64s(&[std::process::id() as u64]);
            let v = oob.recv_u64s();
            let read = SendOp::Read {
                remote_addr: v[0],
                rkey: v[1] as u32,
            };
            reader
                .post_send(&wr(1, read, &[dst.sge(0, BIG as u32)], SendFlags::SIGNALED))
                .unwrap();
            // SAFETY: stops this process; the parent continues it.
            unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
            let mut c = wait_cq(&cq, N + 1, "the READ and the SENDs after the stop");
            let r = c
                .iter()
                .position(|c| c.wr_id == 1)
                .expect("the READ's completion");
            assert_wc(
                &c.remove(r),
                1,
                WcStatus::Success,
                WcOpcode::RdmaRead,
                BIG as u32,
            );
            for (i, c) in c.iter().enumerate() {
                assert_wc(
                    c,
                    10 + i as u64,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    MSG as u32,
                );
            }
            assert_bytes(&read_mr(&dst, 0, BIG), &pattern(91, BIG), "the 16 MiB READ");
            assert_bytes(
                &read_mr(&got, 0, N * MSG),
                &pattern(93, N * MSG),
                "the SENDs",
            );
            let (t, _) = ctx.stats();
            assert_eq!((t.retransmits, t.timeouts), (0, 0), "{t:?}");
            oob.signal("received");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Shm));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let responder = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let tx = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(N as u32, N as u32));
            // SAFETY: `big` is only read by peers; nothing is unmapped
            // while they may read.
            let mr = unsafe { pd.reg_mr_implicit(ALL_REMOTE) }.unwrap();
            let big = pattern(91, BIG);
            let src = mr_with(&pd, N * MSG, 93, AccessFlags::LOCAL_WRITE);
            for (qp, p) in [(&responder, 91), (&tx, 93)] {
                let me = addr_of(&ctx, qp, psn(p));
                oob.send_addr(&me);
                connect_with(qp, QpType::Rc, me.psn, &oob.recv_addr(), 20);
            }
            let pid = oob.recv_u64s()[0] as libc::pid_t;
            oob.send_u64s(&[big.as_ptr() as u64, mr.rkey() as u64]);
            // The READ arrives as the peer stops; the SENDs are posted at
            // once (no sleep), while its responses still stream, so that
            // the two QPs take turns at the ring until it fills.
            let t0 = Instant::now();
            while ctx.stats().0.requests_rx == 0 {
                assert!(t0.elapsed() < WAIT, "the READ never came");
                std::hint::spin_loop();
            }
            for i in 0..N {
                let sge = src.sge(i * MSG, MSG as u32);
                tx.post_send(&wr(
                    20 + i as u64,
                    SendOp::Send,
                    &[sge],
                    SendFlags::SIGNALED,
                ))
                .unwrap();
            }
            while ctx.shm_stats().ring_stalls == 0 {
                assert!(t0.elapsed() < WAIT, "the ring never filled");
                std::thread::sleep(Duration::from_millis(1));
            }
            // SAFETY: a signal to our own child process, by its pid.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
            let c = wait_cq(&cq, N, "the SENDs");
            for (i, c) in c.iter().enumerate() {
                assert_wc(
                    c,
                    20 + i as u64,
                    WcStatus::Success,
                    WcOpcode::Send,
                    MSG as u32,
                );
            }
            oob.expect("received");
            let s = ctx.shm_stats();
            assert_eq!(s.ring_drops, 0, "{s:?}");
            drop(big);
        },
    );
}

/// The lock-free lane (`docs/DESIGN.md`, "The lock-free lane"): once a
/// post was carried out at once, unsignaled WRITEs and READs go straight
/// into the peer's memory from the posting thread, every byte exact — from
/// several threads at once too — and every change closes the lane before
/// it takes effect: a deregistered source is refused (never read after it
/// is freed), and a QP moved to ERR moves nothing.
#[test]
fn unsignaled_one_sided_posts_take_the_lane_and_stop_at_every_change() {
    const TGT: u64 = 61;
    const SRC: u64 = 62;
    const PAGE: usize = 4096;
    // Where the ERR-state WRITE would land: it must not.
    const UNTOUCHED: usize = LEN - PAGE;
    two_processes(
        "unsignaled_one_sided_posts_take_the_lane_and_stop_at_every_change",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..3)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            // Page-aligned: all of it in pages the peer maps.
            let tgt = pd.alloc_mr(LEN, ALL_REMOTE).unwrap();
            tgt.write(0, &pattern(TGT, LEN));
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 90);
            oob.send_region(&Region::of(&tgt));
            oob.expect("written");
            // 16 pages from the lane (and the opening WRITE), then the
            // two threads' halves of the next 128 pages.
            let mut want = pattern(TGT, LEN);
            let src = pattern(SRC, 64 << 10);
            want[..64 << 10].copy_from_slice(&src);
            for t in 0..2u64 {
                let part = pattern(100 + t, 64 * PAGE);
                let at = (64 << 10) + t as usize * 64 * PAGE;
                want[at..at + 64 * PAGE].copy_from_slice(&part);
            }
            assert_bytes(&read_mr(&tgt, 0, LEN), &want, "target region");
            oob.signal("checked");
            oob.expect("err");
            assert_bytes(
                &read_mr(&tgt, UNTOUCHED, PAGE),
                &want[UNTOUCHED..],
                "the page a QP in ERR posted a WRITE to",
            );
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qps: Vec<Qp> = (0..3)
                .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16)))
                .collect();
            let src = mr_with(&pd, 64 << 10, SRC, AccessFlags::LOCAL_WRITE);
            let local = pd.reg_mr(vec![0; LEN], AccessFlags::LOCAL_WRITE).unwrap();
            let refs: Vec<&Qp> = qps.iter().collect();
            exchange_and_connect(&ctx, &mut oob, &refs, QpType::Rc, 90);
            let tgt = oob.recv_region();
            let qp = &qps[0];
            assert_eq!(qp.transport(), "shm");
            let write_at = |off: usize| SendOp::Write {
                remote_addr: tgt.at(off),
                rkey: tgt.rkey,
            };
            let none = SendFlags::default();
            // A signaled WRITE to offset 0, waited for: the first of a
            // region goes the engine's way and opens the lane with it.
            let write_done = |id: u64, sge: Sge, what: &str| {
                qp.post_send(&wr(id, write_at(0), &[sge], SendFlags::SIGNALED))
                    .unwrap();
                assert_eq!(wait_cq(&cq, 1, what)[0].status, WcStatus::Success);
            };
            write_done(1, src.sge(0, PAGE as u32), "the opening WRITE");
            let lane0 = ctx.shm_stats().lane;
            // Fifteen unsignaled WRITEs: through the lane, no completion.
            for k in 1..16 {
                let sge = [src.sge(k * PAGE, PAGE as u32)];
                qp.post_send(&wr(2, write_at(k * PAGE), &sge, none))
                    .unwrap();
            }
            assert_eq!(ctx.shm_stats().lane - lane0, 15, "WRITEs through the lane");
            assert_cq_empty(&cq, Duration::from_millis(50), "after unsignaled WRITEs");
            // Unsignaled READs of what they wrote, carried out before the
            // post returns: the first names a region the lane has not
            // seen (it goes the engine's way, and the lane learns it), the
            // second goes through the lane.
            for (k, half) in [(3, 0), (4, 32 << 10)] {
                let sge = [local.sge(half, 32 << 10)];
                let op = SendOp::Read {
                    remote_addr: tgt.at(half),
                    rkey: tgt.rkey,
                };
                qp.post_send(&wr(k, op, &sge, none)).unwrap();
            }
            assert_eq!(
                ctx.shm_stats().lane - lane0,
                16,
                "the second READ through the lane"
            );
            assert_bytes(
                &read_mr(&local, 0, 64 << 10),
                &pattern(SRC, 64 << 10),
                "READ back",
            );
            // Bytes lent out as a reference are not written under it: a
            // READ into `local` (a region the lane knows, shared with no
            // peer) posted from another thread while this one holds its
            // bytes waits for them to be given back.
            std::thread::scope(|sc| {
                let (tx, rx) = std::sync::mpsc::channel();
                let (q, l) = (&qps[0], &local);
                let reader = sc.spawn(move || {
                    rx.recv().unwrap();
                    let op = SendOp::Read {
                        remote_addr: tgt.at(0),
                        rkey: tgt.rkey,
                    };
                    q.post_send(&wr(5, op, &[l.sge(0, PAGE as u32)], none))
                        .unwrap();
                });
                local
                    .with_bytes_mut(0..PAGE, |b| {
                        b.fill(0xab);
                        tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(50));
                        assert!(
                            b.iter().all(|&x| x == 0xab),
                            "a READ wrote into bytes lent out as &mut"
                        );
                    })
                    .unwrap();
                reader.join().unwrap();
            });
            assert_bytes(
                &read_mr(&local, 0, PAGE),
                &pattern(SRC, PAGE),
                "the READ, after the bytes came back",
            );
            // Two threads, two more QPs to the same peer, at once: each
            // WRITE exact, whichever way it went (a thread that finds the
            // peer busy with the other's copy goes the engine's way).
            let parts: Vec<Mr> = (0..2u64)
                .map(|t| mr_with(&pd, 64 * PAGE, 100 + t, AccessFlags::LOCAL_WRITE))
                .collect();
            std::thread::scope(|s| {
                for t in 0..2 {
                    let (q, part, tgt) = (&qps[1 + t], &parts[t], &tgt);
                    s.spawn(move || {
                        let base = (64 << 10) + t * 64 * PAGE;
                        let op = |k: usize| SendOp::Write {
                            remote_addr: tgt.at(base + k * PAGE),
                            rkey: tgt.rkey,
                        };
                        // The first signaled (it opens this QP's lane).
                        q.post_send(&wr(
                            9,
                            op(0),
                            &[part.sge(0, PAGE as u32)],
                            SendFlags::SIGNALED,
                        ))
                        .unwrap();
                        for round in 0..20 {
                            for k in 1..64 {
                                let sge = [part.sge(k * PAGE, PAGE as u32)];
                                // Posts beyond the queue's depth may be
                                // refused while WRITEs that went the
                                // engine's way wait: try again.
                                let start = Instant::now();
                                while q
                                    .post_send(&wr(10 + round as u64, op(k), &sge, none))
                                    .is_err()
                                {
                                    assert!(start.elapsed() < WAIT, "post refused for good");
                                    std::thread::yield_now();
                                }
                            }
                        }
                    });
                }
            });
            let _ = wait_cq(&cq, 2, "the two threads' opening WRITEs");
            // A signaled WRITE on each QP completes after everything the
            // thread posted before it (RC order).
            for (i, q) in qps[1..].iter().enumerate() {
                let sge = [parts[i].sge(0, PAGE as u32)];
                let base = (64 << 10) + i * 64 * PAGE;
                q.post_send(&wr(50, write_at(base), &sge, SendFlags::SIGNALED))
                    .unwrap();
            }
            let c = wait_cq(&cq, 2, "the threads' last WRITEs");
            assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
            oob.signal("written");
            oob.expect("checked");
            // A source region deregistered: the lane that remembered it
            // closed, and the stale SGE is refused by name.
            let gone = pd
                .reg_mr(pattern(7, PAGE), AccessFlags::LOCAL_WRITE)
                .unwrap();
            let stale = [gone.sge(0, PAGE as u32)];
            write_done(60, stale[0], "WRITE from a new region");
            let before = ctx.shm_stats().lane;
            qp.post_send(&wr(61, write_at(0), &stale, none)).unwrap();
            assert_eq!(
                ctx.shm_stats().lane - before,
                1,
                "the new region through the lane"
            );
            drop(gone);
            let e = qp
                .post_send(&wr(62, write_at(0), &stale, none))
                .expect_err("a WRITE from a deregistered region was accepted");
            assert!(e.to_string().contains("lkey"), "{e}");
            // The lane open again (the target checked offset 0 already), so
            // that the ERR check below has a lane to stay out of.
            write_done(63, src.sge(0, PAGE as u32), "reopening WRITE");
            let before = ctx.shm_stats().lane;
            qp.post_send(&wr(64, write_at(0), &[src.sge(0, PAGE as u32)], none))
                .unwrap();
            assert_eq!(ctx.shm_stats().lane - before, 1, "the lane reopened");
            // A QP in ERR moves nothing, lane or not.
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            qp.modify(&attr, AttrMask::STATE).unwrap();
            let lane1 = ctx.shm_stats().lane;
            let _ = qp.post_send(&wr(
                65,
                write_at(UNTOUCHED),
                &[src.sge(0, PAGE as u32)],
                none,
            ));
            assert_eq!(
                ctx.shm_stats().lane,
                lane1,
                "a QP in ERR posted through its lane"
            );
            let (_, port) = ctx.stats();
            assert_eq!(port.tx_packets, 0, "a datagram went on the wire: {port:?}");
            oob.signal("err");
            oob.expect("ok");
        },
    );
}

/// Signaled lane posts complete into their CQ's lane queue, polled without
/// the engine's lock, in order with everything else the QP completes: a
/// request that goes the engine's way between lane posts (an ATOMIC WRITE)
/// comes out between them; a fetch-and-add through the lane returns the
/// old value; a CQ armed for an event gets its event from a lane WRITE's
/// completion (the queue closes while the CQ is armed).
#[test]
fn signaled_lane_posts_complete_in_order_and_wake_an_armed_cq() {
    const TGT: u64 = 71;
    const SRC: u64 = 72;
    two_processes(
        "signaled_lane_posts_complete_in_order_and_wake_an_armed_cq",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let tgt = pd.alloc_mr(LEN, ALL_REMOTE).unwrap();
            tgt.write(0, &pattern(TGT, LEN));
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 95);
            oob.send_region(&Region::of(&tgt));
            oob.expect("done");
            let mut want = pattern(TGT, LEN);
            let src = pattern(SRC, 64 << 10);
            for k in 0..8 {
                want[k * 8192..k * 8192 + 4096].copy_from_slice(&src[k * 4096..(k + 1) * 4096]);
            }
            let a = u64::from_ne_bytes(want[LEN - 8..].try_into().unwrap()) + 3;
            want[LEN - 8..].copy_from_slice(&a.to_ne_bytes());
            want[LEN - 16..LEN - 8].copy_from_slice(&0x5151_5151_5151_5151u64.to_ne_bytes());
            assert_bytes(&read_mr(&tgt, 0, LEN), &want, "target region");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let ch = ctx.create_comp_channel().unwrap();
            let cq = ctx.create_cq(64, Some(&ch)).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 64 << 10, SRC, AccessFlags::LOCAL_WRITE);
            let local = pd.reg_mr(vec![0; 4096], AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 95);
            let tgt = oob.recv_region();
            let s = SendFlags::SIGNALED;
            let write = |id: u64, k: usize| {
                let sge = [src.sge(k * 4096, 4096)];
                let op = SendOp::Write {
                    remote_addr: tgt.at(k * 8192),
                    rkey: tgt.rkey,
                };
                qp.post_send(&wr(id, op, &sge, s)).unwrap();
            };
            // The first goes the engine's way and opens the lane; once the
            // CQ is empty again (polled), its queue opens too.
            write(0, 0);
            assert_eq!(wait_cq(&cq, 1, "the opening WRITE")[0].wr_id, 0);
            let lane0 = ctx.shm_stats().lane;
            write(1, 1);
            write(2, 2);
            assert_eq!(
                ctx.shm_stats().lane - lane0,
                2,
                "signaled WRITEs through the lane"
            );
            // An ATOMIC WRITE goes the engine's way: its completion comes
            // after the two, and the WRITEs after it after it (they take
            // the lane again).
            local.write(8, &0x5151_5151_5151_5151u64.to_ne_bytes());
            let aw = SendOp::AtomicWrite {
                remote_addr: tgt.at(LEN - 16),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(3, aw, &[local.sge(8, 8)], s)).unwrap();
            write(4, 3);
            write(5, 4);
            assert_eq!(ctx.shm_stats().lane - lane0, 4, "WRITEs through the lane");
            let c = wait_cq(&cq, 5, "WRITEs around an ATOMIC WRITE");
            let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
            assert_eq!(ids, [1, 2, 3, 4, 5], "completion order: {c:?}");
            for c in &c {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                let (op, len) = if c.wr_id == 3 {
                    (WcOpcode::AtomicWrite, 8)
                } else {
                    (WcOpcode::RdmaWrite, 4096)
                };
                assert_eq!(
                    (c.opcode, c.byte_len, c.qp_num),
                    (op, len, qp.qpn()),
                    "{c:?}"
                );
            }
            // A fetch-and-add through the lane: the old value comes back.
            let old = u64::from_ne_bytes(pattern(TGT, LEN)[LEN - 8..].try_into().unwrap());
            let fa = SendOp::FetchAdd {
                remote_addr: tgt.at(LEN - 8),
                rkey: tgt.rkey,
                add: 3,
            };
            let before = ctx.shm_stats().lane;
            qp.post_send(&wr(9, fa, &[local.sge(0, 8)], s)).unwrap();
            let c = wait_cq(&cq, 1, "a fetch-and-add")[0];
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.byte_len),
                (9, WcStatus::Success, WcOpcode::FetchAdd, 8),
                "{c:?}"
            );
            assert_eq!(read_u64(&local, 0), old, "FETCH_ADD's original value");
            assert_eq!(
                ctx.shm_stats().lane - before,
                1,
                "the fetch-and-add through the lane"
            );
            // Lane again (the CQ is empty), then armed: the next WRITE's
            // completion is the event's.
            write(6, 5);
            assert_eq!(wait_cq(&cq, 1, "a lane WRITE")[0].wr_id, 6);
            cq.req_notify(false).unwrap();
            assert_cq_empty(&cq, Duration::from_millis(20), "armed, before the WRITE");
            write(7, 6);
            assert_eq!(ch.get_event(Some(WAIT)).unwrap(), Some(cq.id()), "no event");
            assert_eq!(wait_cq(&cq, 1, "the armed CQ's WRITE")[0].wr_id, 7);
            write(8, 7);
            assert_eq!(wait_cq(&cq, 1, "after the event")[0].wr_id, 8);
            oob.signal("done");
            oob.expect("ok");
        },
    );
}

/// Message `i` of `sends_fill_posted_receives_in_order_and_fall_back_exactly`:
/// a WRITE with immediate every tenth (it comes as packets through the
/// ring and takes a receive at the responder), otherwise a SEND of one of
/// several lengths (0 and the whole receive among them), every other one
/// with immediate data.
fn lane_msg(i: usize) -> (bool, usize, Option<u32>) {
    let len = [0, 1, 100, 101, 4100, 57, 3000][i % 7];
    let imm = (i % 2 == 1).then_some(0xabc0_0000 + i as u32);
    (i % 10 == 5, len, imm)
}

/// SENDs carried out by the sender straight into the receiver's posted
/// receives (the receive lane, `docs/DESIGN.md`): exact bytes scattered
/// over two SGEs, immediates, lengths from 0 to the whole receive, more
/// receives than the lane publishes at once, completions in posting
/// order — with WRITEs with immediate among them, which take the lane's
/// next receive too (their bytes into the region). Then what the
/// lane does not carry ends as IBA says: a receive too short gives
/// `LOC_LEN_ERR` here and `REM_INV_REQ_ERR` at the sender, and the
/// receives still posted are flushed, each exactly once.
#[test]
fn sends_fill_posted_receives_in_order_and_fall_back_exactly() {
    const N: usize = 40;
    const SRC: u64 = 81;
    two_processes(
        "sends_fill_posted_receives_in_order_and_fall_back_exactly",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(256, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(16, 64));
            // Page-aligned: every receive lies in pages the sender maps.
            let rbuf = pd.alloc_mr(N * 8192, ALL_REMOTE).unwrap();
            for i in 0..N {
                let sgl = [rbuf.sge(i * 8192, 100), rbuf.sge(i * 8192 + 4096, 4000)];
                qp.post_recv(&RecvWr {
                    wr_id: 1000 + i as u64,
                    sgl: &sgl,
                })
                .unwrap();
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 41);
            assert_eq!(qp.transport(), "shm");
            oob.send_region(&Region::of(&rbuf));
            let c = wait_cq(&rcq, N, "every message");
            for (i, c) in c.iter().enumerate() {
                let (write, len, imm) = lane_msg(i);
                let op = if write {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                let want = if write { 64 } else { len as u32 };
                assert_wc(c, 1000 + i as u64, WcStatus::Success, op, want);
                let imm = if write { Some(i as u32) } else { imm };
                assert_eq!(
                    (c.wc_flags & wc_flags::WITH_IMM != 0, c.imm_or_inv),
                    (imm.is_some(), imm.unwrap_or(0)),
                    "message {i}: {c:?}"
                );
                let base = i * 8192;
                if write {
                    let at = base + 200;
                    assert_bytes(
                        &read_mr(&rbuf, at, 64),
                        &pattern(SRC + i as u64, 64),
                        "WRITE",
                    );
                    assert_bytes(&read_mr(&rbuf, base, 100), &[0; 100], "untouched receive");
                } else {
                    let p = pattern(SRC + i as u64, len);
                    let a = len.min(100);
                    assert_bytes(&read_mr(&rbuf, base, a), &p[..a], "first SGE");
                    assert_bytes(&read_mr(&rbuf, base + 4096, len - a), &p[a..], "second SGE");
                }
            }
            assert_cq_empty(&rcq, Duration::from_millis(20), "after the messages");
            // A receive too short, then five more.
            post_recv(&qp, 2000, rbuf.sge(0, 16));
            for k in 1..6 {
                post_recv(&qp, 2000 + k, rbuf.sge(k as usize * 8192, 4096));
            }
            oob.signal("short");
            let c = wait_cq(&rcq, 6, "the short receive and the flushed ones");
            assert_eq!(
                (c[0].wr_id, c[0].status),
                (2000, WcStatus::LocLenErr),
                "{c:?}"
            );
            for (k, c) in c[1..].iter().enumerate() {
                assert_eq!(
                    (c.wr_id, c.status),
                    (2001 + k as u64, WcStatus::WrFlushErr),
                    "{c:?}"
                );
            }
            assert_cq_empty(&rcq, Duration::from_millis(50), "a receive completed twice");
            let (_, port) = ctx.stats();
            assert_eq!(port.tx_packets, 0, "a datagram went on the wire: {port:?}");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = pd.alloc_mr(N * 8192, AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 41);
            let tgt = oob.recv_region();
            let before = ctx.shm_stats().offloaded;
            let s = SendFlags::SIGNALED;
            let mut sends = 0;
            for i in 0..N {
                let (write, len, imm) = lane_msg(i);
                let at = i * 8192;
                let (op, sge) = if write {
                    src.write(at, &pattern(SRC + i as u64, 64));
                    let op = SendOp::WriteWithImm {
                        remote_addr: tgt.at(at + 200),
                        rkey: tgt.rkey,
                        imm: i as u32,
                    };
                    (op, src.sge(at, 64))
                } else {
                    sends += 1;
                    src.write(at, &pattern(SRC + i as u64, len));
                    let op = match imm {
                        Some(imm) => SendOp::SendWithImm { imm },
                        None => SendOp::Send,
                    };
                    (op, src.sge(at, len as u32))
                };
                qp.post_send(&wr(i as u64, op, &[sge], s)).unwrap();
                let c = wait_cq(&cq, 1, "a message")[0];
                assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success), "{c:?}");
            }
            // The receiver's first sixteen receives are published before
            // the first message (the lane opens as its QP connects): the
            // first sixteen messages fill them at post at least, whatever
            // the receiver's polls publish later. None would with the lane
            // gone.
            let lane = ctx.shm_stats().offloaded - before;
            assert!(
                (16..=N as u64).contains(&lane),
                "{lane} of {N} messages ({sends} SENDs) carried out at post"
            );
            // An inline WRITE through the lane; one beyond max_inline_data
            // (256) is refused at post, lane open or not.
            let w = SendOp::Write {
                remote_addr: tgt.at(100),
                rkey: tgt.rkey,
            };
            let l0 = ctx.shm_stats().lane;
            qp.post_send(&wr(55, w, &[src.sge(0, 64)], s | SendFlags::INLINE))
                .unwrap();
            assert_eq!(
                wait_cq(&cq, 1, "an inline WRITE")[0].status,
                WcStatus::Success
            );
            assert_eq!(
                ctx.shm_stats().lane - l0,
                1,
                "the inline WRITE took the lane"
            );
            for op in [w, SendOp::Send] {
                let r = qp.post_send(&wr(56, op, &[src.sge(0, 300)], s | SendFlags::INLINE));
                assert!(r.is_err(), "an inline post of 300 bytes: {r:?}");
            }
            oob.expect("short");
            qp.post_send(&wr(50, SendOp::Send, &[src.sge(0, 64)], s))
                .unwrap();
            let c = wait_cq(&cq, 1, "the SEND into a short receive")[0];
            assert_eq!((c.wr_id, c.status), (50, WcStatus::RemInvReqErr), "{c:?}");
            oob.expect("ok");
        },
    );
}

/// The length and target offset of WRITE with immediate `i` of the test
/// below (zero-length ones among them: notifications).
fn write_imm_msg(i: usize) -> (usize, usize) {
    let len = [8, 0, 4096, 1, 3333, 64, 0, 2048][i % 8];
    (len, i * 8192 + i % 3)
}

/// RDMA WRITEs with immediate carried out by the sender at post: the bytes
/// straight into the target's region, the immediate and the WRITE's length
/// into the next receive it published (`RECV_RDMA_WITH_IMM`, the receive's
/// own memory untouched), zero-length ones included, nothing through the
/// rings or on the wire. One posted while no receive is there waits for
/// one (RNR, then the receive) and lands exactly once; one under a key the
/// target never gave fails with `REM_ACCESS_ERR`, its receive untouched.
#[test]
fn writes_with_immediate_fill_receives_at_post() {
    const N: usize = 8;
    const SRC: u64 = 907;
    const SPARE: usize = 120 * 1024;
    two_processes(
        "writes_with_immediate_fill_receives_at_post",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(16, 64));
            let rbuf = pd.alloc_mr(128 * 1024, ALL_REMOTE).unwrap();
            for i in 0..N {
                post_recv(&qp, 100 + i as u64, rbuf.sge(SPARE, 16));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            assert_eq!(qp.transport(), "shm");
            oob.send_region(&Region::of(&rbuf));
            let c = wait_cq(&rcq, N, "every WRITE with immediate");
            for (i, c) in c.iter().enumerate() {
                let (len, at) = write_imm_msg(i);
                assert_wc(
                    c,
                    100 + i as u64,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    len as u32,
                );
                assert_eq!(
                    (c.wc_flags & wc_flags::WITH_IMM != 0, c.imm_or_inv),
                    (true, 0x5eed_0000 + i as u32),
                    "message {i}: {c:?}"
                );
                assert_bytes(
                    &read_mr(&rbuf, at, len),
                    &pattern(SRC + i as u64, len),
                    "the WRITE's bytes",
                );
            }
            assert_bytes(&read_mr(&rbuf, SPARE, 16), &[0; 16], "the receives' memory");
            assert_cq_empty(&rcq, Duration::from_millis(20), "after the messages");
            // No receive posted: the next one waits for one.
            oob.expect("sent");
            post_recv(&qp, 200, rbuf.sge(SPARE, 16));
            let c = wait_cq(&rcq, 1, "the WRITE with immediate that waited")[0];
            assert_wc(&c, 200, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 100);
            assert_eq!(c.imm_or_inv, 0x5eed_0200, "{c:?}");
            assert_bytes(
                &read_mr(&rbuf, 100_000, 100),
                &pattern(SRC + 200, 100),
                "the bytes of the one that waited",
            );
            assert_cq_empty(&rcq, Duration::from_millis(50), "a receive completed twice");
            // A key never given: the receive is not consumed by it.
            post_recv(&qp, 300, rbuf.sge(SPARE, 16));
            oob.signal("bad key");
            oob.expect("refused");
            assert_bytes(&read_mr(&rbuf, SPARE, 16), &[0; 16], "the receives' memory");
            let (_, port) = ctx.stats();
            assert_eq!(port.tx_packets, 0, "a datagram went on the wire: {port:?}");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            let tgt = oob.recv_region();
            let before = ctx.shm_stats().offloaded;
            let s = SendFlags::SIGNALED;
            for i in 0..N {
                let (len, at) = write_imm_msg(i);
                src.write(i * 4096, &pattern(SRC + i as u64, len));
                let op = SendOp::WriteWithImm {
                    remote_addr: tgt.at(at),
                    rkey: tgt.rkey,
                    imm: 0x5eed_0000 + i as u32,
                };
                qp.post_send(&wr(i as u64, op, &[src.sge(i * 4096, len as u32)], s))
                    .unwrap();
                let c = wait_cq(&cq, 1, "a WRITE with immediate")[0];
                assert_eq!(
                    (c.wr_id, c.status, c.opcode),
                    (i as u64, WcStatus::Success, WcOpcode::RdmaWrite),
                    "{c:?}"
                );
            }
            // The receiver published its receives before the first one
            // (its lane opens as the QP connects): every one carried out at
            // post (the first by the engine's offload, which opens the
            // send lane; the rest by the lane). Without either, none would
            // be.
            assert_eq!(
                ctx.shm_stats().offloaded - before,
                N as u64,
                "carried out at post"
            );
            src.write(0, &pattern(SRC + 200, 100));
            let op = SendOp::WriteWithImm {
                remote_addr: tgt.at(100_000),
                rkey: tgt.rkey,
                imm: 0x5eed_0200,
            };
            qp.post_send(&wr(200, op, &[src.sge(0, 100)], s)).unwrap();
            oob.signal("sent");
            let c = wait_cq(&cq, 1, "the WRITE with immediate that waited")[0];
            assert_eq!((c.wr_id, c.status), (200, WcStatus::Success), "{c:?}");
            oob.expect("bad key");
            let op = SendOp::WriteWithImm {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey ^ 0x5a5a_0000,
                imm: 1,
            };
            qp.post_send(&wr(300, op, &[src.sge(0, 8)], s)).unwrap();
            let c = wait_cq(&cq, 1, "the WRITE with immediate under a bad key")[0];
            assert_eq!((c.wr_id, c.status), (300, WcStatus::RemAccessErr), "{c:?}");
            oob.signal("refused");
            oob.expect("ok");
        },
    );
}

/// Two threads post SENDs on one QP at once while the receiver keeps its
/// receive lane open: each message lands in a receive of its own, whole,
/// and the receives complete in posting order (whichever path each SEND
/// took: the lane, the engine's offload at post, or the ring).
#[test]
fn concurrent_senders_fill_each_receive_once() {
    const PER: usize = 300;
    const LEN: usize = 64;
    two_processes(
        "concurrent_senders_fill_each_receive_once",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(4 * PER as u32, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 2 * PER as u32));
            let rbuf = pd
                .alloc_mr(2 * PER * 4096, AccessFlags::LOCAL_WRITE)
                .unwrap();
            for i in 0..2 * PER {
                post_recv(&qp, i as u64, rbuf.sge(i * 4096, 4096));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            oob.signal("ready");
            let c = wait_cq(&cq, 2 * PER, "every message");
            let mut seen = std::collections::HashSet::new();
            for (i, c) in c.iter().enumerate() {
                assert_wc(c, i as u64, WcStatus::Success, WcOpcode::Recv, LEN as u32);
                // Byte 0 says which thread, bytes 1..3 which message; the
                // rest is that message's pattern.
                let got = read_mr(&rbuf, i * 4096, LEN);
                let (t, k) = (got[0], u16::from_le_bytes([got[1], got[2]]));
                let mut want = pattern(1000 * t as u64 + k as u64, LEN);
                want[0] = t;
                want[1..3].copy_from_slice(&k.to_le_bytes());
                assert_bytes(&got, &want, "a message");
                assert!(seen.insert((t, k)), "message {t}/{k} twice");
            }
            assert_cq_empty(&cq, Duration::from_millis(20), "after the messages");
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(4 * PER as u32, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(2 * PER as u32, 16));
            let src = pd
                .alloc_mr(2 * PER * LEN, AccessFlags::LOCAL_WRITE)
                .unwrap();
            for t in 0..2u8 {
                for k in 0..PER as u16 {
                    let at = (t as usize * PER + k as usize) * LEN;
                    let mut m = pattern(1000 * t as u64 + k as u64, LEN);
                    m[0] = t;
                    m[1..3].copy_from_slice(&k.to_le_bytes());
                    src.write(at, &m);
                }
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            oob.expect("ready");
            std::thread::scope(|s| {
                for t in 0..2usize {
                    let (qp, src) = (&qp, &src);
                    s.spawn(move || {
                        for k in 0..PER {
                            let sge = [src.sge((t * PER + k) * LEN, LEN as u32)];
                            qp.post_send(&wr(k as u64, SendOp::Send, &sge, SendFlags::SIGNALED))
                                .unwrap();
                        }
                    });
                }
            });
            let c = wait_cq(&cq, 2 * PER, "every SEND");
            assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
            oob.expect("ok");
        },
    );
}

/// A verbs call inside `Cq::poll_with`'s callback is refused with a panic
/// that says why, wherever the completion came from. Handed a lane post's
/// completion (held for it by the CQ lane's flag), such a call used to
/// wait forever for the flag its own thread held, and every thread of the
/// device with it; handed one the engine's way, it went through — one
/// rule now, so a program cannot work by the luck of the path. The device
/// goes on working after the panic.
#[test]
fn a_verbs_call_inside_a_poll_callback_is_refused_not_a_hang() {
    two_processes(
        "a_verbs_call_inside_a_poll_callback_is_refused_not_a_hang",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 4096, 5, AccessFlags::LOCAL_WRITE);
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 96);
            let tgt = oob.recv_region();
            let write = |id: u64| {
                let sge = [src.sge(0, 8)];
                let op = SendOp::Write {
                    remote_addr: tgt.at(0),
                    rkey: tgt.rkey,
                };
                qp.post_send(&wr(id, op, &sge, SendFlags::SIGNALED))
                    .unwrap();
            };
            // The first opens the lane; the second completes through it,
            // into the CQ lane's queue (open, and the CQ's oldest, after
            // an empty poll).
            write(0);
            wait_cq(&cq, 1, "the opening WRITE");
            let mut empty = [Completion::default(); 1];
            assert_eq!(cq.poll(&mut empty).unwrap(), 0);
            let lane0 = ctx.shm_stats().lane;
            write(1);
            assert_eq!(ctx.shm_stats().lane - lane0, 1, "a lane post");
            let mut buf = [Completion::default(); 4];
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cq.poll_with(&mut buf, &mut |_| {
                    let mut again = [Completion::default(); 1];
                    let _ = cq.poll(&mut again);
                })
            }));
            let msg = panic_message(r.expect_err("the nested poll is refused"));
            assert!(msg.contains("would deadlock"), "{msg}");
            // Still a working device: a post the engine's way and its
            // completion, then one through the lane.
            write(2);
            let got = wait_cq(&cq, 1, "after the refused call");
            assert_eq!(got[0].wr_id, 2);
            assert_eq!(got[0].status, WcStatus::Success);
            oob.signal("done");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let tgt = pd.alloc_mr(4096, ALL_REMOTE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 96);
            oob.send_region(&Region::of(&tgt));
            oob.expect("done");
        },
    );
}

/// Pin every thread of this process to the CPU the caller runs on, and
/// put its engine thread (`softrdma-engine`) at `SCHED_IDLE` there: behind
/// a thread that spins on that CPU it runs only at the scheduler's ticks,
/// so whatever wakes it meanwhile (a datagram, the watchdog's ticks) is
/// reported by one `epoll_wait` together. Returns the CPU. Only for a
/// child process, which runs one test.
fn starve_engine_thread() -> usize {
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    assert!(cpu >= 0, "sched_getcpu");
    let mut engines = 0;
    for e in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let e = e.unwrap();
        let tid: libc::pid_t = e.file_name().to_str().unwrap().parse().unwrap();
        pin(tid, cpu as usize);
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == "softrdma-engine" {
            let p = libc::sched_param { sched_priority: 0 };
            // SAFETY: `p` is a valid sched_param; any user may lower a
            // thread to SCHED_IDLE.
            let r = unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &p) };
            assert_eq!(r, 0, "SCHED_IDLE for the engine thread");
            engines += 1;
        }
    }
    assert_eq!(engines, 1, "one engine thread");
    cpu as usize
}

/// Pin every thread of this process to `cpu`. Only for a child process,
/// which runs one test.
fn pin_process(cpu: usize) {
    for e in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let tid: libc::pid_t = e.unwrap().file_name().to_str().unwrap().parse().unwrap();
        pin(tid, cpu);
    }
}

/// Pin thread `tid` (0: the caller) to `cpu`.
fn pin(tid: libc::pid_t, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes into it;
    // sched_setaffinity reads the set of the size passed.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(r, 0, "sched_setaffinity({tid}, {cpu})");
}

/// A datagram the engine thread is woken for in the same `epoll_wait` as
/// a watchdog tick is served. An application thread spins on a CQ whose
/// QPs all reach their peers through shared memory (its polls serve the
/// rings only and leave the socket with the engine thread), and a WRITE
/// comes over UDP for another QP, whose CQ nobody polls. The engine thread
/// runs rarely (`SCHED_IDLE` behind the spinner), so when it does, the
/// socket's edge and the watchdog's ticks are reported together: the
/// engine took that for "only the watchdog, and the poller is alive" and
/// went back to sleep, the socket's edge consumed and the datagram left in
/// it — every resend too, until the requester gave up (RETRY_EXC_ERR).
#[test]
fn a_datagram_reported_with_a_watchdog_tick_is_served() {
    const SRC: u64 = 97;
    two_processes(
        "a_datagram_reported_with_a_watchdog_tick_is_served",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq_shm = ctx.create_cq(8, None).unwrap();
            let cq_udp = ctx.create_cq(8, None).unwrap();
            let qp_shm = qp_init(&pd, QpType::Rc, &cq_shm, &cq_shm, None, cap(4, 4));
            let qp_udp = qp_init(&pd, QpType::Rc, &cq_udp, &cq_udp, None, cap(4, 4));
            let tgt = pd.alloc_mr(4096, ALL_REMOTE).unwrap();
            // A receive in memory peers cannot reach (part of a page): the
            // QP's receive lane stays shut, so nothing lets a poll of its
            // CQ say "empty" without the engine's lock — each poll is a
            // pass of the engine (serving the rings only).
            let rbuf = pd.reg_mr(vec![0; 64], AccessFlags::LOCAL_WRITE).unwrap();
            post_recv(&qp_shm, 1, rbuf.sge(0, 64));
            let mine = [
                addr_of(&ctx, &qp_shm, psn(97)),
                addr_of(&ctx, &qp_udp, psn(98)),
            ];
            for a in &mine {
                oob.send_addr(a);
            }
            let (r_shm, r_udp) = (oob.recv_addr(), oob.recv_addr());
            connect(&qp_shm, QpType::Rc, mine[0].psn, &r_shm);
            connect(&qp_udp, QpType::Rc, mine[1].psn, &r_udp);
            assert_eq!(qp_shm.transport(), "shm");
            assert_eq!(qp_udp.transport(), "udp");
            oob.send_region(&Region::of(&tgt));
            let cpu = starve_engine_thread();
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let stop = std::sync::atomic::AtomicBool::new(false);
            let polls = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                // One spinner on the engine thread's CPU (which it starves),
                // one on another if there is one: the application calls
                // into the device at every watchdog tick, however the other
                // processes of the host take turns on the CPUs.
                for other in [None, (cpus > 1).then_some((cpu + 1) % cpus)] {
                    let (cq, stop, polls) = (&cq_shm, &stop, &polls);
                    s.spawn(move || {
                        if let Some(c) = other {
                            pin(0, c);
                        }
                        let mut b = [blank(); 4];
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            assert_eq!(cq.poll(&mut b).unwrap(), 0);
                            polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                }
                // Polling in earnest (the socket's hand-over settled) before
                // the WRITE comes.
                while polls.load(std::sync::atomic::Ordering::Relaxed) < 100_000 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                oob.signal("polling");
                let m = oob.recv_within(Duration::from_secs(60));
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                assert_eq!(String::from_utf8_lossy(&m), "done");
            });
            assert_bytes(
                &read_mr(&tgt, 0, 4096),
                &pattern(SRC, 4096),
                "the WRITE over UDP",
            );
        },
        |mut oob| {
            // The peer of the shared-memory QP, and a context that cannot
            // share memory for the other one.
            let c1 = open_with(V4, Some(Transport::Auto));
            let c2 = open_with(V4, Some(Transport::Udp));
            let (pd1, pd2) = (c1.alloc_pd(), c2.alloc_pd());
            let (cq1, cq2) = (
                c1.create_cq(8, None).unwrap(),
                c2.create_cq(8, None).unwrap(),
            );
            let qp1 = qp_init(&pd1, QpType::Rc, &cq1, &cq1, None, cap(4, 4));
            let qp2 = qp_init(&pd2, QpType::Rc, &cq2, &cq2, None, cap(4, 4));
            let src = mr_with(&pd2, 4096, SRC, AccessFlags::LOCAL_WRITE);
            let mine = [addr_of(&c1, &qp1, psn(99)), addr_of(&c2, &qp2, psn(100))];
            for a in &mine {
                oob.send_addr(a);
            }
            let (r_shm, r_udp) = (oob.recv_addr(), oob.recv_addr());
            connect(&qp1, QpType::Rc, mine[0].psn, &r_shm);
            // A resend after 17 s: a loaded machine may leave the starved
            // engine thread off its CPU for a while, never for that long;
            // the completion a resend brings still comes inside `wait_cq`'s
            // 30 s, so the assertion below, not a timeout, names the bug.
            connect_with(&qp2, QpType::Rc, mine[1].psn, &r_udp, 22);
            assert_eq!(qp1.transport(), "shm");
            assert_eq!(qp2.transport(), "udp");
            let tgt = oob.recv_region();
            oob.expect("polling");
            let op = SendOp::Write {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            qp2.post_send(&wr(1, op, &[src.sge(0, 4096)], SendFlags::SIGNALED))
                .unwrap();
            let c = wait_cq(
                &cq2,
                1,
                "the WRITE to a target whose application polls another CQ",
            );
            oob.signal("done");
            assert_wc(&c[0], 1, WcStatus::Success, WcOpcode::RdmaWrite, 4096);
            // Served as it came: the target's engine thread runs at every
            // scheduler tick, far inside the 17 s before a resend.
            assert_eq!(c2.stats().0.timeouts, 0, "the WRITE waited for a resend");
        },
    );
}

/// An application that polled a CQ with a UDP QP once (the socket is
/// then its own to serve) and from then on only posts — unsignaled UD
/// sends over UDP, each a call into the device that reads no socket — has
/// stopped serving the socket, and the watchdog gives it back to the
/// engine thread: a WRITE that comes meanwhile for another QP is served.
/// When every call counted as the poller's sign of life, the posts kept the
/// socket from everyone, and the WRITE and its resends waited in it until
/// the posting stopped — or, on a VM that takes the posting thread's CPU
/// away for a millisecond now and then, until such a gap: this VM's runs
/// of the old rule passed after 0.5–2 s, so the exact check is the unit
/// test `posts_are_no_sign_that_the_socket_is_served`; this one is the
/// scenario end to end.
#[test]
fn posts_after_the_last_poll_do_not_keep_the_socket() {
    const SRC: u64 = 98;
    two_processes(
        "posts_after_the_last_poll_do_not_keep_the_socket",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(8, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            let ud = qp_init(&pd, QpType::Ud, &cq, &cq, None, cap(16, 4));
            connect(&ud, QpType::Ud, 0, &addr_of(&ctx, &ud, 0));
            let tgt = pd.alloc_mr(4096, ALL_REMOTE).unwrap();
            let src = mr_with(&pd, 64, 1, AccessFlags::LOCAL_WRITE);
            let mine = addr_of(&ctx, &qp, psn(101));
            oob.send_addr(&mine);
            let (remote, remote_ud) = (oob.recv_addr(), oob.recv_addr());
            connect(&qp, QpType::Rc, mine.psn, &remote);
            oob.send_region(&Region::of(&tgt));
            // The posting thread alone on one CPU, everything else of both
            // processes on the other: nothing keeps it from calling many
            // times in every watchdog period (a gap of a whole period
            // handed the socket back even when every call counted).
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if cpus > 1 {
                pin_process(0);
                pin(0, 1);
            }
            // One poll of the UDP CQ: the socket is this thread's now.
            assert_eq!(cq.poll(&mut [blank(); 4]).unwrap(), 0);
            oob.signal("polling");
            let dest = UdDest {
                gid: remote_ud.gid,
                remote_qpn: remote_ud.qpn,
                remote_qkey: QKEY,
            };
            // Then only posts, many per watchdog period, until the peer's
            // WRITE has completed (or 60 s, the peer's failure).
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut sent = 0u64;
            while Instant::now() < deadline {
                // Through the engine (a post list takes its lock, as any
                // post the QP's lane does not take), so each is a call.
                ud.post_send_list(&[SendWr {
                    wr_id: sent,
                    op: SendOp::Send,
                    sgl: &[src.sge(0, 64)],
                    flags: SendFlags::default(),
                    ud: Some(dest),
                }])
                .unwrap();
                sent += 1;
                if oob.arrived() {
                    oob.expect("done");
                    break;
                }
                // Twenty posts a millisecond (a sleep may outlast the
                // watchdog's period on a busy machine).
                let next = Instant::now() + Duration::from_micros(50);
                while Instant::now() < next {
                    std::hint::spin_loop();
                }
            }
            assert_bytes(
                &read_mr(&tgt, 0, 4096),
                &pattern(SRC, 4096),
                "the WRITE over UDP",
            );
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Udp));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
            // Where the posting process's UD sends go (and are dropped:
            // nothing is posted to receive them).
            let ud = qp_init(&pd, QpType::Ud, &cq, &cq, None, cap(4, 4));
            connect(&ud, QpType::Ud, 0, &addr_of(&ctx, &ud, 0));
            let src = mr_with(&pd, 4096, SRC, AccessFlags::LOCAL_WRITE);
            if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
                pin_process(0);
            }
            let mine = addr_of(&ctx, &qp, psn(102));
            oob.send_addr(&mine);
            oob.send_addr(&addr_of(&ctx, &ud, 0));
            let remote = oob.recv_addr();
            // A resend after 17 s, inside `wait_cq`'s 30 s: without the
            // fix the resends too wait in the target's socket.
            connect_with(&qp, QpType::Rc, mine.psn, &remote, 22);
            let tgt = oob.recv_region();
            oob.expect("polling");
            let op = SendOp::Write {
                remote_addr: tgt.at(0),
                rkey: tgt.rkey,
            };
            qp.post_send(&wr(1, op, &[src.sge(0, 4096)], SendFlags::SIGNALED))
                .unwrap();
            let c = wait_cq(&cq, 1, "the WRITE to a target that only posts");
            oob.signal("done");
            assert_wc(&c[0], 1, WcStatus::Success, WcOpcode::RdmaWrite, 4096);
            assert_eq!(ctx.stats().0.timeouts, 0, "the WRITE waited for a resend");
        },
    );
}

/// A QP whose request the peer refuses (a SEND into a receive too short:
/// the NAK comes back through the ring, to this process's engine) goes to
/// ERR, and the receives its receive lane held are flushed as the lane
/// closes — after that pass delivered its events. An application asleep
/// on the receive CQ's channel (armed before; the send CQ is another,
/// never polled here) is woken by those flushes: nothing else will happen
/// on this device to deliver the event later.
#[test]
fn receives_flushed_as_the_lane_closes_wake_an_armed_cq() {
    two_processes(
        "receives_flushed_as_the_lane_closes_wake_an_armed_cq",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            post_recv(&qp, 7, buf.sge(0, 16));
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 77);
            // In RTS before the SEND comes: in RTR its error would leave
            // the QP in ERR before this side's move to RTS.
            oob.signal("connected");
            let c = wait_cq(&cq, 1, "the short receive")[0];
            assert_eq!((c.wr_id, c.status), (7, WcStatus::LocLenErr), "{c:?}");
            oob.expect("done");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let ch = ctx.create_comp_channel().unwrap();
            let scq = ctx.create_cq(16, None).unwrap();
            let rcq = ctx.create_cq(16, Some(&ch)).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(16, 16));
            let buf = pd.alloc_mr(4 * 4096, AccessFlags::LOCAL_WRITE).unwrap();
            for k in 0..4 {
                post_recv(&qp, 100 + k, buf.sge(k as usize * 4096, 4096));
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 77);
            assert_eq!(qp.transport(), "shm");
            rcq.req_notify(false).unwrap();
            oob.expect("connected");
            qp.post_send(&wr(1, SendOp::Send, &[buf.sge(0, 64)], SendFlags::SIGNALED))
                .unwrap();
            assert_eq!(
                ch.get_event(Some(Duration::from_secs(5))).unwrap(),
                Some(rcq.id()),
                "no event for the flushed receives"
            );
            let c = wait_cq(&rcq, 4, "the flushed receives");
            for (k, c) in c.iter().enumerate() {
                assert_eq!(
                    (c.wr_id, c.status),
                    (100 + k as u64, WcStatus::WrFlushErr),
                    "{c:?}"
                );
            }
            let c = wait_cq(&scq, 1, "the SEND")[0];
            assert_eq!((c.wr_id, c.status), (1, WcStatus::RemInvReqErr), "{c:?}");
            oob.signal("done");
        },
    );
}

/// A SEND held behind an invalidate for the lane (the invalidate ahead of
/// it in the send queue, the peer's receive lane open) goes out once the
/// invalidate has run, with no further call from its poster: the
/// requester carries out an invalidate (or a bind) in its transmit turn,
/// where no packet completes anything, so the engine drains the requests
/// held for the lane there too. The poster here makes no verbs call after
/// its post until the receiver has the message (it waits on the
/// out-of-band channel), as an application that waits for a reply does.
#[test]
fn a_send_held_behind_an_invalidate_goes_without_another_call() {
    two_processes(
        "a_send_held_behind_an_invalidate_goes_without_another_call",
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let rbuf = pd.alloc_mr(4 * 4096, ALL_REMOTE).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            assert_eq!(qp.transport(), "shm");
            // After the connection, so that they open the receive lane.
            for i in 0..4 {
                post_recv(&qp, 10 + i as u64, rbuf.sge(i * 4096, 4096));
            }
            oob.send(b"posted");
            let c = wait_cq(&cq, 1, "the SEND behind the invalidate");
            assert_wc(&c[0], 10, WcStatus::Success, WcOpcode::Recv, 64);
            assert_bytes(&read_mr(&rbuf, 0, 64), &pattern(44, 64), "the SEND");
            oob.send(b"got it");
        },
        |mut oob| {
            let ctx = open_with(V4, Some(Transport::Auto));
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(16, 16));
            let src = mr_with(&pd, 4096, 44, AccessFlags::LOCAL_WRITE);
            let inv = mr_with(
                &pd,
                4096,
                45,
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            );
            let mw = pd.alloc_mw(MwType::Type2).unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 43);
            let rkey = qp
                .bind_mw(
                    &mw,
                    &inv,
                    0,
                    4096,
                    AccessFlags::REMOTE_WRITE,
                    1,
                    SendFlags::SIGNALED,
                )
                .unwrap();
            wait_cq(&cq, 1, "the bind");
            assert_eq!(oob.recv(), b"posted");
            let sge = [src.sge(0, 64)];
            qp.post_send_list(&[
                SendWr {
                    wr_id: 2,
                    op: SendOp::LocalInv { rkey },
                    sgl: &[],
                    flags: SendFlags::default(),
                    ud: None,
                },
                SendWr {
                    wr_id: 3,
                    op: SendOp::Send,
                    sgl: &sge,
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            ])
            .map_err(|(i, e)| format!("request {i}: {e}"))
            .unwrap();
            // No call into the device until the receiver has it.
            assert_eq!(oob.recv(), b"got it");
            let c = wait_cq(&cq, 1, "the SEND's completion");
            assert_wc(&c[0], 3, WcStatus::Success, WcOpcode::Send, 64);
            assert!(
                ctx.stats().0.offloaded_after_hold >= 1,
                "the SEND went through the lane after a hold: {:?}",
                ctx.stats().0
            );
        },
    );
}
