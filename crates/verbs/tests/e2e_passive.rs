//! The soft NIC working for a target that is not there, and several
//! processes on one address:
//!
//! * a passive target serves thousands of WRITEs, READs and atomics while
//!   its application makes no verbs call at all (it is blocked in a TCP
//!   read), as an RNIC does;
//! * three processes share one address and port 4791 (the test's own
//!   loopback address, see `support::open`) — two initiators drive traffic
//!   to a third at once — and each one's data arrives intact.

mod support;

use std::collections::VecDeque;
use std::time::Duration;

use softrdma_verbs::*;
use support::*;

const TGT_LEN: usize = 1 << 20;
/// Eight 64-bit counters at the start of the target, then data.
const COUNTERS: usize = 8;
const DATA: usize = 4096;

/// A deterministic generator both sides could run; here only the initiator
/// needs it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// CPU time of this process so far, all threads.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes one rusage into the zeroed value we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0);
        ru
    };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// What the initiator expects back from an operation in flight.
enum Expect {
    Write,
    Read {
        local: usize,
        at: usize,
        want: Vec<u8>,
    },
    Atomic {
        local: usize,
        want: u64,
    },
}

/// The target posts nothing and polls nothing while 6000 one-sided
/// operations run against it; the initiator keeps a shadow of the target's
/// memory and checks every READ and every atomic result against it, then
/// ships the shadow so the target can compare its memory byte for byte.
#[test]
fn passive_target_makes_no_verbs_calls() {
    const TGT: u64 = 900;
    const SRC: u64 = 901;
    const OPS: usize = 6000;
    const IN_FLIGHT: usize = 32;
    const SLOT: usize = 4096;
    two_processes(
        "passive_target_makes_no_verbs_calls",
        |mut oob| {
            // The idle poller for passive processes (opt-in), so that the
            // idle check below covers it too. The child runs this one test
            // on one thread (`--test-threads=1`): nothing reads the
            // environment while it changes.
            std::env::set_var("SOFTRDMA_IDLE_POLL", "passive");
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(4, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 1));
            let tgt = mr_with(&pd, TGT_LEN, TGT, ALL_REMOTE);
            for i in 0..COUNTERS {
                tgt.write(i * 8, &(i as u64 * 1000).to_ne_bytes());
            }
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 21);
            oob.send_region(&Region::of(&tgt));
            // From here until the initiator is done: no verbs call, only a
            // blocking read on the socket.
            let shadow = oob.recv_within(Duration::from_secs(120));
            assert_eq!(shadow.len(), TGT_LEN);
            assert_bytes(
                &read_mr(&tgt, 0, TGT_LEN),
                &shadow,
                "target memory vs the initiator's shadow",
            );
            // The traffic is over, and the target has still made no call:
            // the device goes quiet. Over UDP the engine handed this
            // passive target's requests to the idle poller; it must stop
            // once they stop, and nothing else may tick (an idle device
            // uses no CPU). A thread left spinning would take most of the
            // second measured here.
            let before = cpu_time();
            std::thread::sleep(Duration::from_secs(1));
            let used = cpu_time() - before;
            assert!(
                used < Duration::from_millis(50),
                "the idle target used {used:?} of CPU in one second"
            );
            let mut none = [blank(); 1];
            assert_eq!(
                cq.poll(&mut none).unwrap(),
                0,
                "the target saw a completion"
            );
            oob.signal("ok");
        },
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64, None).unwrap();
            let qp = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(IN_FLIGHT as u32, 1));
            let src = mr_with(&pd, 256 << 10, SRC, AccessFlags::LOCAL_WRITE);
            let local = pd
                .reg_mr(vec![0; IN_FLIGHT * SLOT], AccessFlags::LOCAL_WRITE)
                .unwrap();
            exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 22);
            let tgt = oob.recv_region();
            let mut shadow = pattern(TGT, TGT_LEN);
            for i in 0..COUNTERS {
                shadow[i * 8..i * 8 + 8].copy_from_slice(&(i as u64 * 1000).to_ne_bytes());
            }
            let srcb = pattern(SRC, 256 << 10);
            let mut rng = Rng(0x1234_5678_9abc_def1);
            let mut flight: VecDeque<(u64, Expect)> = VecDeque::new();
            let mut free: Vec<usize> = (0..IN_FLIGHT).collect();
            let (mut posted, mut counts, mut fenced) = (0usize, [0usize; 3], 0usize);
            let s = SendFlags::SIGNALED;
            while posted < OPS || !flight.is_empty() {
                while posted < OPS && flight.len() < IN_FLIGHT {
                    let slot = free.pop().expect("a free local slot");
                    let l = slot * SLOT;
                    let len = 1 + rng.below(SLOT);
                    let at = DATA + rng.below(TGT_LEN - DATA - len);
                    let kind = rng.below(3);
                    counts[kind] += 1;
                    let id = posted as u64;
                    let mut flags = s;
                    let (op, sge, exp) = match kind {
                        0 => {
                            let so = rng.below((256 << 10) - len);
                            shadow[at..at + len].copy_from_slice(&srcb[so..so + len]);
                            free.push(slot);
                            // IBA lets a WRITE overtake an earlier READ's
                            // data at the responder; a fence stops that
                            // where the ranges overlap.
                            if flight.iter().any(|(_, e)| {
                                matches!(e, Expect::Read { at: a, want, .. }
                                    if *a < at + len && at < a + want.len())
                            }) {
                                fenced += 1;
                                flags = s | SendFlags::FENCE;
                            }
                            let op = SendOp::Write {
                                remote_addr: tgt.at(at),
                                rkey: tgt.rkey,
                            };
                            (op, src.sge(so, len as u32), Expect::Write)
                        }
                        1 => {
                            let op = SendOp::Read {
                                remote_addr: tgt.at(at),
                                rkey: tgt.rkey,
                            };
                            let want = shadow[at..at + len].to_vec();
                            let e = Expect::Read { local: l, at, want };
                            (op, local.sge(l, len as u32), e)
                        }
                        _ => {
                            let c = rng.below(COUNTERS) * 8;
                            let old = u64::from_ne_bytes(shadow[c..c + 8].try_into().unwrap());
                            let (op, new) = if rng.below(2) == 0 {
                                let add = rng.next() % 1000;
                                let op = SendOp::FetchAdd {
                                    remote_addr: tgt.at(c),
                                    rkey: tgt.rkey,
                                    add,
                                };
                                (op, old.wrapping_add(add))
                            } else {
                                // Half the compares match.
                                let compare = if rng.below(2) == 0 { old } else { old ^ 1 };
                                let swap = rng.next();
                                let op = SendOp::CompareSwap {
                                    remote_addr: tgt.at(c),
                                    rkey: tgt.rkey,
                                    compare,
                                    swap,
                                };
                                (op, if compare == old { swap } else { old })
                            };
                            shadow[c..c + 8].copy_from_slice(&new.to_ne_bytes());
                            (
                                op,
                                local.sge(l, 8),
                                Expect::Atomic {
                                    local: l,
                                    want: old,
                                },
                            )
                        }
                    };
                    qp.post_send(&wr(id, op, &[sge], flags)).unwrap();
                    flight.push_back((id, exp));
                    posted += 1;
                }
                for c in wait_cq(&cq, 1, "one-sided operations on a passive target") {
                    let (id, exp) = flight.pop_front().expect("a completion for work in flight");
                    assert_eq!((c.wr_id, c.status), (id, WcStatus::Success), "{c:?}");
                    match exp {
                        Expect::Write => assert_eq!(c.opcode, WcOpcode::RdmaWrite),
                        Expect::Read { local: l, want, .. } => {
                            assert_eq!(c.opcode, WcOpcode::RdmaRead);
                            assert_bytes(&read_mr(&local, l, want.len()), &want, "READ data");
                            free.push(l / SLOT);
                        }
                        Expect::Atomic { local: l, want } => {
                            assert_eq!(read_u64(&local, l), want, "atomic's original value");
                            free.push(l / SLOT);
                        }
                    }
                }
            }
            assert!(
                counts.iter().all(|&c| c > 1000),
                "mix of operations {counts:?}"
            );
            assert!(
                fenced > 0,
                "no WRITE needed a fence: the test lost its edge"
            );
            oob.send(&shadow);
            oob.expect("ok");
        },
    );
}

/// Three processes on one address and port 4791 at once: two initiators, each with its
/// own QPN slot, WRITE, READ and SEND to a third process (and receive its
/// SENDs) simultaneously; every message reaches the right process intact.
#[test]
fn two_initiators_share_one_address() {
    const TEST: &str = "two_initiators_share_one_address";
    const ROUNDS: usize = 300;
    const MSG: usize = 1500;
    const REGION: usize = ROUNDS * MSG;
    let src_seed = |i: usize| 1000 + i as u64;
    if let Some((i, mut oob)) = as_child(TEST) {
        // An initiator.
        let ctx = open(V4);
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256, None).unwrap();
        // Receives complete on their own CQ: the target's replies may arrive before
        // the ACK of this initiator's last SEND (the responder may coalesce its ACKs;
        // IBA orders nothing between a QP's two directions).
        let rcq = ctx.create_cq(16, None).unwrap();
        let qp = qp_init(&pd, QpType::Rc, &cq, &rcq, None, cap(64, 16));
        let src = mr_with(&pd, REGION, src_seed(i), AccessFlags::LOCAL_WRITE);
        let back = pd
            .reg_mr(vec![0; REGION], AccessFlags::LOCAL_WRITE)
            .unwrap();
        let rbuf = pd
            .reg_mr(vec![0; 4 * MSG], AccessFlags::LOCAL_WRITE)
            .unwrap();
        for k in 0..4 {
            post_recv(&qp, 1000 + k, rbuf.sge(k as usize * MSG, MSG as u32));
        }
        exchange_and_connect(&ctx, &mut oob, &[&qp], QpType::Rc, 30 + i as u32);
        let tgt = oob.recv_region();
        oob.expect("go");
        let s = SendFlags::SIGNALED;
        // WRITE each chunk, READ it back, and SEND it too, in waves of 16.
        for wave in (0..ROUNDS).step_by(16) {
            let n = 16.min(ROUNDS - wave);
            for k in wave..wave + n {
                let o = k * MSG;
                let w = SendOp::Write {
                    remote_addr: tgt.at(o),
                    rkey: tgt.rkey,
                };
                let r = SendOp::Read {
                    remote_addr: tgt.at(o),
                    rkey: tgt.rkey,
                };
                qp.post_send(&wr(3 * k as u64, w, &[src.sge(o, MSG as u32)], s))
                    .unwrap();
                qp.post_send(&wr(3 * k as u64 + 1, r, &[back.sge(o, MSG as u32)], s))
                    .unwrap();
                qp.post_send(&wr(
                    3 * k as u64 + 2,
                    SendOp::Send,
                    &[src.sge(o, MSG as u32)],
                    s,
                ))
                .unwrap();
            }
            let w = wait_cq(&cq, 3 * n, "initiator's completions");
            for (j, c) in w.iter().enumerate() {
                assert_eq!(
                    (c.wr_id, c.status),
                    ((3 * wave + j) as u64, WcStatus::Success)
                );
            }
        }
        assert_bytes(
            &read_mr(&back, 0, REGION),
            &pattern(src_seed(i), REGION),
            "READ back",
        );
        // The target's replies.
        let want = pattern(7000 + i as u64, 4 * MSG);
        let w = wait_cq(&rcq, 4, "the target's SENDs");
        for (k, c) in w.iter().enumerate() {
            assert_wc(
                c,
                1000 + k as u64,
                WcStatus::Success,
                WcOpcode::Recv,
                MSG as u32,
            );
        }
        assert_bytes(&read_mr(&rbuf, 0, 4 * MSG), &want, "SENDs from the target");
        oob.signal("done");
        oob.expect("bye");
        return;
    }

    // The target, and the process that started both initiators.
    let mut peers = Peers::spawn(TEST, 2);
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let scq = ctx.create_cq(16, None).unwrap();
    let rcq = ctx.create_cq(2 * ROUNDS as u32, None).unwrap();
    let qps: Vec<Qp> = (0..2)
        .map(|_| qp_init(&pd, QpType::Rc, &scq, &rcq, None, cap(8, ROUNDS as u32)))
        .collect();
    let tgt: Vec<Mr> = (0..2)
        .map(|_| mr_with(&pd, REGION, 5, ALL_REMOTE))
        .collect();
    let rbuf = pd
        .reg_mr(vec![0; 2 * REGION], AccessFlags::LOCAL_WRITE)
        .unwrap();
    for (i, qp) in qps.iter().enumerate() {
        for k in 0..ROUNDS {
            post_recv(
                qp,
                (i * ROUNDS + k) as u64,
                rbuf.sge((i * ROUNDS + k) * MSG, MSG as u32),
            );
        }
    }
    for (i, qp) in qps.iter().enumerate() {
        let oob = &mut peers.oob[i];
        exchange_and_connect(&ctx, oob, &[qp], QpType::Rc, 40 + i as u32);
        oob.send_region(&Region::of(&tgt[i]));
    }
    for qp in &qps {
        let (_, a, _) = qp.query().unwrap();
        assert_eq!(
            a.av.dgid,
            ctx.gid(),
            "the initiators use this process's address"
        );
    }
    let peer_qpns: Vec<u32> = qps
        .iter()
        .map(|q| q.query().unwrap().1.dest_qp_num)
        .collect();
    let my_slot = qps[0].qpn() >> 16;
    assert!(
        my_slot != peer_qpns[0] >> 16
            && my_slot != peer_qpns[1] >> 16
            && peer_qpns[0] >> 16 != peer_qpns[1] >> 16,
        "three processes, three QPN slots: {:#x} {:#x} {:#x}",
        qps[0].qpn(),
        peer_qpns[0],
        peer_qpns[1]
    );
    for o in peers.oob.iter_mut() {
        o.signal("go");
    }
    let w = wait_cq(&rcq, 2 * ROUNDS, "SENDs from both initiators");
    let mut next = [0usize; 2];
    for c in &w {
        let i = qps
            .iter()
            .position(|q| q.qpn() == c.qp_num)
            .expect("our QP");
        assert_wc(
            c,
            (i * ROUNDS + next[i]) as u64,
            WcStatus::Success,
            WcOpcode::Recv,
            MSG as u32,
        );
        next[i] += 1;
    }
    for (i, t) in tgt.iter().enumerate() {
        let want = pattern(src_seed(i), REGION);
        assert_bytes(
            &read_mr(t, 0, REGION),
            &want,
            &format!("initiator {i}'s WRITEs"),
        );
        assert_bytes(
            &read_mr(&rbuf, i * REGION, REGION),
            &want,
            &format!("initiator {i}'s SENDs"),
        );
    }
    // Replies, one QP each, checked by the initiators.
    let out: Vec<Mr> = (0..2)
        .map(|i| mr_with(&pd, 4 * MSG, 7000 + i as u64, AccessFlags::LOCAL_WRITE))
        .collect();
    for (i, qp) in qps.iter().enumerate() {
        for k in 0..4 {
            let sge = out[i].sge(k * MSG, MSG as u32);
            qp.post_send(&wr(k as u64, SendOp::Send, &[sge], SendFlags::SIGNALED))
                .unwrap();
        }
    }
    let w = wait_cq(&scq, 8, "replies");
    assert!(w.iter().all(|c| c.status == WcStatus::Success), "{w:?}");
    for o in peers.oob.iter_mut() {
        o.expect("done");
        o.signal("bye");
    }
    peers.finish();
}
