//! A hostile RoCEv2 peer against the real stack, as two processes over UDP
//! on loopback.
//!
//! * **The target** (this process) runs `softrdma-verbs`: a context on
//!   [`TGT`] with RC QPs connected to the adversary, regions with known
//!   contents — the one granted to the adversary sits between two guard
//!   areas of the same allocation — and, at the same time, an honest RC QP
//!   pair (the target's context and a second context on [`HON`]) moving
//!   checked data in a thread of its own.
//! * **The adversary** (a re-executed copy of this test) is no verbs user:
//!   it writes every packet itself with `softrdma-wire` (see
//!   `softrdma_adversary::forge`) and sends it from its own UDP socket on
//!   [`ADV`], the way rxe would. It is told what a peer is told (QP
//!   numbers, its PSNs, the rkey and range it was granted, and the keys of
//!   regions it was *not* granted, to try them) and nothing else.
//!
//! The adversary runs the attacks of issue 10 item 6 phase by phase and
//! asserts every answer it gets; the target records its counters around
//! each phase. At the end the target compares every region and every guard
//! byte for byte with what the granted operations alone explain (the
//! adversary's shadow of the granted region, the patterns of the rest),
//! checks that the honest pair kept moving verified data throughout, and
//! that each counter moved by exactly what the adversary says it sent of
//! that kind.
//!
//! Every flood is bounded in count and time. A remote access or invalid
//! request error is fatal to an RC QP (IBA 9.7.5.2.x; rxe the same), so
//! attacks that should fail go one per QP and the target re-arms its QPs
//! (RESET, then connect again) between batches.

#[path = "../../verbs/tests/support/mod.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softrdma_adversary::forge::{self, Forger, Response};
use softrdma_adversary::Rng;
use softrdma_verbs::*;
use softrdma_wire::ext::{NakCode, Syndrome};
use softrdma_wire::{Opcode, PacketRepr};
use support::*;

/// The target's device, the adversary's address, the honest peer's device:
/// loopback addresses of their own, away from other tests on 127.0.0.1.
const TGT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
const ADV: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 10);
const HON: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 11);
const PORT: u16 = 4791;

/// Attack QPs on the target; the QP numbers the adversary claims for its
/// end are `ADV_QPN + i`.
const NQP: usize = 8;
const ADV_QPN: u32 = 0x00_0400;
/// The granted region, and the guard areas before and after it.
const GRANT: usize = 64 * 1024;
const GUARD: usize = 8192;
/// Where the adversary addresses the granted region's first byte (not its
/// host address: translation is part of what is tested).
const IOVA: u64 = 0x0000_7a00_0000_0000;
const MTU: usize = 4096;
/// Honest traffic: bytes per WRITE/READ and per SEND.
const HONEST: usize = 32 * 1024;
const HONEST_SEND: usize = 1024;

const SEED_WHOLE: u64 = 0xa11;
const SEED_RO: u64 = 0xa12;
const SEED_OTHER: u64 = 0xa13;

#[test]
fn hostile_peer_touches_nothing_it_was_not_granted() {
    two_processes(
        "hostile_peer_touches_nothing_it_was_not_granted",
        adversary,
        target,
    );
}

// ---------------------------------------------------------------------------
// The target

fn dev(name: &str, a: Ipv4Addr) -> DeviceInfo {
    DeviceInfo {
        name: name.into(),
        addr: IpAddr::V4(a),
    }
}

/// RESET → INIT → RTR → RTS towards the adversary's QP `i`, expecting
/// `epsn` next.
fn arm(qp: &Qp, i: usize, epsn: u32) {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        },
        AttrMask::STATE,
    )
    .expect("modify to RESET");
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            .union(AccessFlags::REMOTE_READ)
            .union(AccessFlags::REMOTE_ATOMIC),
        ..Default::default()
    };
    qp.modify(
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .expect("modify RESET->INIT");
    let remote = QpAddr {
        qpn: ADV_QPN + i as u32,
        psn: epsn,
        gid: ip_to_gid(IpAddr::V4(ADV)),
    };
    connect(qp, QpType::Rc, psn(1000 + i as u32), &remote);
}

/// One phase as the target saw it.
struct Record {
    name: String,
    /// Counters when the phase began and when the adversary said it ended.
    before: (Stats, PortStats),
    after: (Stats, PortStats),
    /// Verified honest rounds then.
    honest: (u64, u64),
    /// What the adversary says it sent, by counter (see [`Sent`]).
    sent: Vec<u64>,
}

fn target(mut oob: Oob) {
    let ctx = Context::open(&dev("srdma-tgt", TGT), &OpenOptions::default())
        .expect("open the target device");
    let hctx = Context::open(&dev("srdma-hon", HON), &OpenOptions::default())
        .expect("open the honest peer's device");
    let pd1 = ctx.alloc_pd();
    let pd2 = ctx.alloc_pd();
    let pdg = ctx.alloc_pd();
    // One allocation: guard, granted, guard. Only the middle is
    // registered for the adversary's PD; the whole is registered,
    // local-only, in a PD of its own, so it can be read under the device
    // lock (and its key is one more the adversary may try).
    let whole = mr_with(
        &pdg,
        GUARD + GRANT + GUARD,
        SEED_WHOLE,
        AccessFlags::LOCAL_WRITE,
    );
    // SAFETY: the range lies inside `whole`'s buffer, which `whole` owns
    // and keeps until it is dropped; `granted` is dropped first (declared
    // later, and dropped explicitly before the end), and deregistration
    // cancels all remote access to it before it returns.
    let granted = unsafe { pd1.reg_mr_raw(whole.addr() + GUARD as u64, GRANT, IOVA, ALL_REMOTE) }
        .expect("register the granted region");
    let ro = mr_with(
        &pd1,
        4096,
        SEED_RO,
        AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_READ),
    );
    let other = mr_with(&pd2, 4096, SEED_OTHER, ALL_REMOTE);

    let cq = ctx.create_cq(64, None).unwrap();
    let qps: Vec<Qp> = (0..NQP)
        .map(|_| qp_init(&pd1, QpType::Rc, &cq, &cq, None, cap(4, 4)))
        .collect();
    let mut epsn: Vec<u32> = (0..NQP).map(|i| psn(i as u32 + 1)).collect();
    for (i, q) in qps.iter().enumerate() {
        connect(
            q,
            QpType::Rc,
            psn(1000 + i as u32),
            &QpAddr {
                qpn: ADV_QPN + i as u32,
                psn: epsn[i],
                gid: ip_to_gid(IpAddr::V4(ADV)),
            },
        );
    }

    // The honest pair: target side in its own PD on the target's context.
    let pd3 = ctx.alloc_pd();
    let hcq_t = ctx.create_cq(16, None).unwrap();
    let hq_t = qp_init(&pd3, QpType::Rc, &hcq_t, &hcq_t, None, cap(4, 4));
    let h_tgt = mr_with(&pd3, HONEST, 0, ALL_REMOTE);
    let h_rcv = mr_with(&pd3, HONEST_SEND, 0, AccessFlags::LOCAL_WRITE);

    let tell = |oob: &mut Oob, r: Region| oob.send_region(&r);
    oob.send_u64s(&qps.iter().map(|q| q.qpn() as u64).collect::<Vec<_>>());
    oob.send_u64s(&epsn.iter().map(|&p| p as u64).collect::<Vec<_>>());
    tell(
        &mut oob,
        Region {
            addr: IOVA,
            rkey: granted.rkey(),
            len: GRANT,
        },
    );
    tell(&mut oob, Region::of(&ro));
    tell(&mut oob, Region::of(&other));
    tell(&mut oob, Region::of(&whole));
    oob.send_u64s(&[hq_t.qpn() as u64]);

    let stop = AtomicBool::new(false);
    let honest_rounds = AtomicU64::new(0);
    let mut phases: Vec<Record> = Vec::new();
    let shadow = std::thread::scope(|s| {
        let honest =
            s.spawn(|| honest_traffic(&hctx, &hq_t, &hcq_t, &h_tgt, &h_rcv, &stop, &honest_rounds));
        // However this thread leaves the scope (a failed assertion too),
        // the honest thread stops, or the scope would wait for it forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut current = None;
        let shadow = loop {
            let m = oob.recv_within(Duration::from_secs(120));
            let m = String::from_utf8(m).expect("a text command");
            if m == "rearm" {
                while ctx.get_async_event().is_some() {}
                for (i, q) in qps.iter().enumerate() {
                    epsn[i] = psn(epsn[i].wrapping_add(0x31 + i as u32));
                    arm(q, i, epsn[i]);
                }
                oob.send_u64s(&epsn.iter().map(|&p| p as u64).collect::<Vec<_>>());
            } else if let Some(name) = m.strip_prefix("phase ") {
                let (st, ps) = ctx.stats();
                current = Some((
                    name.to_string(),
                    st,
                    ps,
                    honest_rounds.load(Ordering::Relaxed),
                ));
                oob.signal("go");
            } else if m == "end" {
                let counts: Vec<u64> = oob
                    .recv()
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                let (st2, ps2) = ctx.stats();
                let h2 = honest_rounds.load(Ordering::Relaxed);
                let (name, st, ps, h) = current.take().expect("a phase ends that began");
                phases.push(Record {
                    name,
                    before: (st, ps),
                    after: (st2, ps2),
                    honest: (h, h2),
                    sent: counts,
                });
                oob.signal("noted");
            } else if m == "done" {
                break oob.recv();
            } else {
                panic!("unknown command from the adversary: {m}");
            }
        };
        stop.store(true, Ordering::Relaxed);
        honest.join().expect("the honest pair's thread");
        shadow
    });

    // Memory: nothing outside the grant changed, the grant holds exactly
    // what the granted operations explain.
    let all = read_mr(&whole, 0, GUARD + GRANT + GUARD);
    let init = pattern(SEED_WHOLE, GUARD + GRANT + GUARD);
    assert_bytes(
        &all[..GUARD],
        &init[..GUARD],
        "guard before the granted region",
    );
    assert_bytes(
        &all[GUARD + GRANT..],
        &init[GUARD + GRANT..],
        "guard after the granted region",
    );
    assert_bytes(&all[GUARD..GUARD + GRANT], &shadow, "the granted region");
    assert_bytes(
        &read_mr(&ro, 0, 4096),
        &pattern(SEED_RO, 4096),
        "the read-only region",
    );
    assert_bytes(
        &read_mr(&other, 0, 4096),
        &pattern(SEED_OTHER, 4096),
        "the other PD's region",
    );
    drop(granted);

    // Counters: each phase moved each counter by what the adversary sent.
    println!("phase\thonest rounds\tcounter deltas");
    let mut total_honest = 0;
    for p in &phases {
        let (name, c) = (&p.name, &p.sent);
        let ((st, ps), (st2, ps2), (h, h2)) = (&p.before, &p.after, p.honest);
        let d = |f: fn(&Stats) -> u64| f(st2) - f(st);
        let dp = |f: fn(&PortStats) -> u64| f(ps2) - f(ps);
        total_honest += h2 - h;
        println!(
            "{name}\t{}\taccess NAKs {} invalid NAKs {} ICRC bad {} malformed {}+{} (port) wrong source {} no QP {} out of sequence {} duplicates {} busy {} ghost ACKs {} RNR NAKs {}",
            h2 - h,
            d(|s| s.access_naks_sent),
            d(|s| s.invalid_naks_sent),
            dp(|s| s.icrc_bad),
            d(|s| s.malformed),
            dp(|s| s.rx_malformed),
            d(|s| s.wrong_source),
            d(|s| s.dropped_no_qp),
            d(|s| s.out_of_sequence),
            d(|s| s.duplicates),
            d(|s| s.responder_busy),
            d(|s| s.ghost_acks),
            d(|s| s.rnr_naks_sent),
        );
        // What the adversary reports: [access NAKs, invalid NAKs, ICRC
        // tampered, malformed (core), malformed (port), wrong source,
        // no such QP, ahead of the PSN, RNR NAKs, ghost responses]. The honest pair (no
        // loss, correct packets) produces none of these but the PSN ones.
        let want = |i: usize| c.get(i).copied().unwrap_or(0);
        assert_eq!(d(|s| s.access_naks_sent), want(0), "{name}: access NAKs");
        assert_eq!(
            d(|s| s.invalid_naks_sent),
            want(1),
            "{name}: invalid request NAKs"
        );
        assert_eq!(dp(|s| s.icrc_bad), want(2), "{name}: ICRC drops");
        assert_eq!(d(|s| s.malformed), want(3), "{name}: malformed packets");
        assert_eq!(dp(|s| s.rx_malformed), want(4), "{name}: short datagrams");
        assert_eq!(d(|s| s.wrong_source), want(5), "{name}: wrong-source drops");
        assert!(d(|s| s.dropped_no_qp) >= want(6), "{name}: no-QP drops");
        assert!(
            d(|s| s.out_of_sequence) >= want(7),
            "{name}: out of sequence"
        );
        assert_eq!(d(|s| s.rnr_naks_sent), want(8), "{name}: RNR NAKs");
        assert!(d(|s| s.ghost_acks) >= want(9), "{name}: ghost responses");
    }
    assert!(
        total_honest > 0,
        "the honest pair completed no verified round during the attack"
    );
    let (st, ps) = ctx.stats();
    println!("target totals: {st:?}\n{ps:?}");
}

/// The honest pair: the peer context WRITEs a fresh pattern into the
/// target's region, READs it back and SENDs a message, every byte checked,
/// until told to stop.
fn honest_traffic(
    hctx: &Context,
    hq_t: &Qp,
    hcq_t: &Cq,
    h_tgt: &Mr,
    h_rcv: &Mr,
    stop: &AtomicBool,
    rounds: &AtomicU64,
) {
    let pd = hctx.alloc_pd();
    let cq = hctx.create_cq(16, None).unwrap();
    let hq_h = qp_init(&pd, QpType::Rc, &cq, &cq, None, cap(4, 4));
    let a_t = QpAddr {
        qpn: hq_t.qpn(),
        psn: psn(77),
        gid: ip_to_gid(IpAddr::V4(TGT)),
    };
    let a_h = addr_of(hctx, &hq_h, psn(78));
    connect(hq_t, QpType::Rc, a_t.psn, &a_h);
    connect(&hq_h, QpType::Rc, a_h.psn, &a_t);
    let src = pd
        .reg_mr(
            vec![0u8; 2 * HONEST + HONEST_SEND],
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    let remote = Region::of(h_tgt);
    let mut r = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let data = pattern(0x4000 + r, HONEST);
        let msg = pattern(0x8000 + r, HONEST_SEND);
        src.write(0, &data);
        src.write(2 * HONEST, &msg);
        post_recv(hq_t, r, h_rcv.sge(0, HONEST_SEND as u32));
        let f = SendFlags::SIGNALED;
        for w in [
            wr(
                1,
                SendOp::Write {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                &[src.sge(0, HONEST as u32)],
                f,
            ),
            wr(
                2,
                SendOp::Read {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                &[src.sge(HONEST, HONEST as u32)],
                f,
            ),
            wr(
                3,
                SendOp::Send,
                &[src.sge(2 * HONEST, HONEST_SEND as u32)],
                f,
            ),
        ] {
            hq_h.post_send(&w).expect("honest post_send");
        }
        for c in wait_cq(&cq, 3, "the honest pair's operations") {
            assert_eq!(c.status, WcStatus::Success, "honest pair, round {r}: {c:?}");
        }
        let c = wait_cq(hcq_t, 1, "the honest pair's receive");
        assert_wc(
            &c[0],
            r,
            WcStatus::Success,
            WcOpcode::Recv,
            HONEST_SEND as u32,
        );
        assert_bytes(&read_mr(&src, HONEST, HONEST), &data, "honest READ");
        assert_bytes(
            &read_mr(h_tgt, 0, HONEST),
            &data,
            "honest WRITE at the target",
        );
        assert_bytes(&read_mr(h_rcv, 0, HONEST_SEND), &msg, "honest SEND");
        r += 1;
        rounds.store(r, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// The adversary

/// What one phase sent, by the counter it must move (see the target).
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    access: u64,
    invalid: u64,
    icrc: u64,
    malformed: u64,
    short: u64,
    wrong_source: u64,
    no_qp: u64,
    ahead: u64,
    rnr: u64,
    ghost: u64,
}

impl Sent {
    fn words(&self) -> Vec<u8> {
        [
            self.access,
            self.invalid,
            self.icrc,
            self.malformed,
            self.short,
            self.wrong_source,
            self.no_qp,
            self.ahead,
            self.rnr,
            self.ghost,
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
    }
}

/// How long the adversary waits for an answer that must come.
const ANSWER: Duration = Duration::from_secs(10);
/// How long it listens for answers that must not come.
const QUIET: Duration = Duration::from_millis(150);

struct Adv {
    f: Forger,
    oob: Oob,
    dst: SocketAddrV4,
    qpn: Vec<u32>,
    epsn: Vec<u32>,
    granted: Region,
    ro: Region,
    other: Region,
    whole: Region,
    honest_qpn: u32,
    /// What the granted region must hold: its first contents plus every
    /// granted operation acknowledged.
    shadow: Vec<u8>,
    /// Answers received but not yet asked for.
    backlog: Vec<Response>,
    rng: Rng,
    sent: Sent,
}

fn adversary(mut oob: Oob) {
    let qpn: Vec<u32> = oob.recv_u64s().iter().map(|&x| x as u32).collect();
    let epsn: Vec<u32> = oob.recv_u64s().iter().map(|&x| x as u32).collect();
    let granted = oob.recv_region();
    let ro = oob.recv_region();
    let other = oob.recv_region();
    let whole = oob.recv_region();
    let honest_qpn = oob.recv_u64s()[0] as u32;
    let init = pattern(SEED_WHOLE, GUARD + GRANT + GUARD);
    let mut a = Adv {
        f: Forger::bind(SocketAddrV4::new(ADV, PORT)).expect("bind the adversary's socket"),
        oob,
        dst: SocketAddrV4::new(TGT, PORT),
        qpn,
        epsn,
        granted,
        ro,
        other,
        whole,
        honest_qpn,
        shadow: init[GUARD..GUARD + GRANT].to_vec(),
        backlog: Vec::new(),
        rng: Rng::new(0xbad),
        sent: Sent::default(),
    };
    a.phase("legit", Adv::legit);
    a.phase("rkey guesses", Adv::rkey_guesses);
    a.phase("out of bounds", Adv::out_of_bounds);
    a.phase("other PD and access rights", Adv::other_pd);
    a.phase("forged PSNs", Adv::forged_psns);
    a.phase("ICRC tampering", Adv::icrc);
    a.phase("malformed", Adv::malformed);
    a.phase("floods", Adv::floods);
    a.phase("spoofed sources", Adv::spoof);
    a.oob.signal("done");
    let shadow = a.shadow.clone();
    a.oob.send(&shadow);
}

impl Adv {
    fn phase(&mut self, name: &str, f: fn(&mut Adv)) {
        self.oob.signal(&format!("phase {name}"));
        self.oob.expect("go");
        self.sent = Sent::default();
        f(self);
        self.fence();
        // Nothing more may come back for what this phase sent.
        self.settle();
        let w = self.sent.words();
        self.oob.signal("end");
        self.oob.send(&w);
        self.oob.expect("noted");
        println!("adversary: {name}: {:?}", self.sent);
    }

    /// Read and check whatever is still on its way, then forget it.
    fn settle(&mut self) {
        for r in self.f.drain(QUIET, 100_000).expect("receive") {
            self.check_disclosure(&r);
        }
        self.backlog.clear();
    }

    /// A granted READ on QP 0, answered: the target has judged every
    /// packet sent before it (one socket, one engine, in order), so its
    /// counters are final for the phase.
    fn fence(&mut self) {
        let g = self.granted;
        let p = self.take_psn(0, 1);
        self.send(&forge::read_request(self.qpn[0], p, g.addr, g.rkey, 8), &[]);
        let r = self.answer(0, p);
        assert_eq!(r.payload, self.shadow[..8], "the fence READ: {r:?}");
    }

    fn rearm(&mut self) {
        self.settle();
        self.oob.signal("rearm");
        self.epsn = self.oob.recv_u64s().iter().map(|&x| x as u32).collect();
    }

    /// The next answer to QP `i` at `psn`, waiting at most [`ANSWER`].
    fn answer(&mut self, i: usize, psn: u32) -> Response {
        let me = ADV_QPN + i as u32;
        if let Some(k) = self
            .backlog
            .iter()
            .position(|r| r.dest_qp == me && r.psn == psn)
        {
            return self.backlog.remove(k);
        }
        let end = Instant::now() + ANSWER;
        while Instant::now() < end {
            if let Some(r) = self.f.recv(ANSWER).expect("receive") {
                if r.dest_qp == me && r.psn == psn {
                    return r;
                }
                self.backlog.push(r);
            }
        }
        panic!(
            "no answer to QP {i} at PSN {psn:#x} within {ANSWER:?}; got {:?}",
            self.backlog
        )
    }

    /// A READ response payload may carry granted bytes only: anything the
    /// adversary reads must equal its shadow of the region it asked for.
    /// (Responses are matched to requests by the PSN ranges in `reads`.)
    fn check_disclosure(&self, r: &Response) {
        assert!(
            !r.is_read_response() || r.payload.is_empty() || self.known_read(r),
            "a READ response nobody asked for, or with bytes outside the grant: {:?} ({} bytes)",
            r.opcode,
            r.payload.len()
        );
    }

    fn known_read(&self, r: &Response) -> bool {
        // Every READ this adversary issues that is answered covers the
        // granted region (or the read-only one) from offset 0: packet k of
        // it is bytes k*MTU.. of that region.
        let ro = pattern(SEED_RO, 4096);
        let g = &self.shadow;
        (0..GRANT / MTU).any(|k| g[k * MTU..].starts_with(&r.payload)) || ro.starts_with(&r.payload)
    }

    fn send(&mut self, repr: &PacketRepr, payload: &[u8]) {
        self.f.send(self.dst, repr, payload).expect("send");
    }

    fn take_psn(&mut self, i: usize, n: u32) -> u32 {
        let p = self.epsn[i];
        self.epsn[i] = (p + n) & 0x00ff_ffff;
        p
    }

    fn expect_ack(&mut self, i: usize, psn: u32, what: &str) -> Response {
        let r = self.answer(i, psn);
        assert!(
            matches!(r.syndrome, Some(Syndrome::Ack { .. })),
            "{what}: want an ACK, got {r:?}"
        );
        r
    }

    /// Requests that must each be refused with a NAK: one per QP, the QPs
    /// re-armed after every batch. Counts the NAKs by their code.
    fn refused(&mut self, what: &str, reqs: Vec<(PacketRepr, Vec<u8>)>, codes: &[NakCode]) {
        for batch in reqs.chunks(NQP) {
            let mut psns = Vec::new();
            for (i, (r, p)) in batch.iter().enumerate() {
                let mut r = *r;
                r.bth.dest_qp = self.qpn[i];
                let npkts = if r.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
                    (r.ext.reth.expect("READ has RETH").dma_len as usize)
                        .div_ceil(MTU)
                        .max(1)
                } else {
                    1
                };
                let psn = self.take_psn(i, npkts as u32);
                r.bth.psn = softrdma_wire::Psn::new(psn);
                self.send(&r, p);
                psns.push(psn);
            }
            for (i, psn) in psns.into_iter().enumerate() {
                let r = self.answer(i, psn);
                match r.syndrome {
                    Some(Syndrome::Nak(c)) if codes.contains(&c) => match c {
                        NakCode::RemoteAccessError => self.sent.access += 1,
                        NakCode::InvalidRequest => self.sent.invalid += 1,
                        _ => unreachable!("only these are expected"),
                    },
                    _ => panic!(
                        "{what} #{i}: want a NAK ({codes:?}), got {r:?} for {:?}",
                        batch[i].0
                    ),
                }
                assert!(
                    r.payload.is_empty(),
                    "{what}: a refused request disclosed bytes"
                );
            }
            self.rearm();
        }
    }

    // --- the phases -------------------------------------------------------

    /// The forger works: granted WRITE, READ, FETCH_ADD and a two-packet
    /// WRITE are accepted and do exactly what they say, also from another
    /// source port of the connected address (RoCEv2's source port is ECMP
    /// entropy, not identity; rxe does not check it either).
    fn legit(&mut self) {
        let g = self.granted;
        let data: Vec<u8> = (0..64u8).collect();
        let p = self.take_psn(0, 1);
        self.send(
            &forge::write_only(self.qpn[0], p, g.addr + 100, g.rkey, 64),
            &data,
        );
        self.expect_ack(0, p, "granted WRITE");
        self.shadow[100..164].copy_from_slice(&data);

        let p = self.take_psn(0, 1);
        self.send(
            &forge::read_request(self.qpn[0], p, g.addr, g.rkey, 200),
            &[],
        );
        let r = self.answer(0, p);
        assert_eq!(r.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY, "{r:?}");
        assert_eq!(r.payload, self.shadow[..200], "granted READ");

        let p = self.take_psn(0, 1);
        self.send(
            &forge::fetch_add(self.qpn[0], p, g.addr + 8, g.rkey, 5),
            &[],
        );
        let r = self.answer(0, p);
        let old = u64::from_ne_bytes(self.shadow[8..16].try_into().unwrap());
        assert_eq!(r.orig, Some(old), "granted FETCH_ADD: {r:?}");
        self.shadow[8..16].copy_from_slice(&old.wrapping_add(5).to_ne_bytes());

        let two: Vec<u8> = (0..MTU + 100).map(|i| (i * 7) as u8).collect();
        let p = self.take_psn(0, 2);
        let mut first = forge::write_only(self.qpn[0], p, g.addr + 4096, g.rkey, MTU);
        first.bth.opcode = Opcode::RC_RDMA_WRITE_FIRST;
        first.bth.ack_req = false;
        first.ext.reth.as_mut().unwrap().dma_len = two.len() as u32;
        self.send(&first, &two[..MTU]);
        let last = forge::plain(Opcode::RC_RDMA_WRITE_LAST, self.qpn[0], p + 1, 100);
        self.send(&last, &two[MTU..]);
        self.expect_ack(0, p + 1, "granted two-packet WRITE");
        self.shadow[4096..4096 + two.len()].copy_from_slice(&two);

        let other_port = Forger::bind(SocketAddrV4::new(ADV, 0)).expect("bind a second port");
        let p = self.take_psn(0, 1);
        let r = forge::write_only(self.qpn[0], p, g.addr + 300, g.rkey, 8);
        other_port.send(self.dst, &r, b"aportno2").unwrap();
        self.expect_ack(0, p, "granted WRITE from another source port");
        self.shadow[300..308].copy_from_slice(b"aportno2");

        // A READ of the read-only region is granted too.
        let ro = self.ro;
        let p = self.take_psn(0, 1);
        self.send(
            &forge::read_request(self.qpn[0], p, ro.addr, ro.rkey, 4096),
            &[],
        );
        let r = self.answer(0, p);
        assert_eq!(
            r.payload,
            pattern(SEED_RO, 4096),
            "READ of the read-only region"
        );
    }

    /// Keys near the granted one and at random; WRITEs and READs.
    fn rkey_guesses(&mut self) {
        let g = self.granted;
        let known = [g.rkey, self.ro.rkey, self.other.rkey, self.whole.rkey];
        let mut keys: Vec<u32> = Vec::new();
        for d in 1..=8u32 {
            keys.push(g.rkey.wrapping_add(d));
            keys.push(g.rkey.wrapping_sub(d));
        }
        keys.extend((0..32).map(|b| g.rkey ^ (1 << b)));
        // A memory window's key variants: the same upper 24 bits.
        keys.extend((1..=8u32).map(|d| (g.rkey & !0xff) | (g.rkey.wrapping_add(d) & 0xff)));
        keys.extend([0, u32::MAX, g.rkey.swap_bytes(), !g.rkey]);
        while keys.len() < 120 {
            keys.push(self.rng.next_u32());
        }
        keys.retain(|k| !known.contains(k));
        let mut reqs = Vec::new();
        for (n, &k) in keys.iter().enumerate() {
            if n % 3 == 2 {
                reqs.push((forge::read_request(0, 0, g.addr, k, 64), vec![]));
            } else {
                reqs.push((forge::write_only(0, 0, g.addr, k, 16), vec![0xa5; 16]));
            }
        }
        self.refused("guessed rkey", reqs, &[NakCode::RemoteAccessError]);
    }

    /// The granted key, outside the granted range.
    fn out_of_bounds(&mut self) {
        let g = self.granted;
        let (b, l) = (g.addr, g.len as u64);
        let mut reqs: Vec<(PacketRepr, Vec<u8>)> = Vec::new();
        let w = |va: u64, n: usize| (forge::write_only(0, 0, va, g.rkey, n), vec![0x5a; n]);
        for (va, n) in [
            (b - 1, 2),
            (b - 4096, 64),
            (b - GUARD as u64, 16),
            (b + l - 1, 2),
            (b + l, 1),
            (b + l + 100, 16),
            (u64::MAX - 7, 16),
            (0, 16),
        ] {
            reqs.push(w(va, n));
        }
        // A first packet whose RETH claims more than the region holds, up
        // to 2^31 + 1 and 2^32 - 1 bytes.
        for (va, total) in [
            (b, l + 1),
            (b + l - MTU as u64, MTU as u64 + 1),
            (b, (1 << 31) + 1),
            (b, u32::MAX as u64),
            (b - 1, 1 << 31),
        ] {
            let mut r = forge::write_only(0, 0, va, g.rkey, MTU);
            r.bth.opcode = Opcode::RC_RDMA_WRITE_FIRST;
            r.ext.reth.as_mut().unwrap().dma_len = total as u32;
            reqs.push((r, vec![0x5a; MTU]));
        }
        // A WRITE Only whose payload is longer than its RETH says.
        let mut r = forge::write_only(0, 0, b + l - 16, g.rkey, 32);
        r.ext.reth.as_mut().unwrap().dma_len = 16;
        reqs.push((r, vec![0x5a; 32]));
        for (va, n) in [
            (b - 1, 2u32),
            (b - 4096, 4096),
            (b + l - 1, 2),
            (b + l, 1),
            (b, l as u32 + 1),
            (b, (1 << 31) + 1),
            (b, u32::MAX),
            (u64::MAX - 7, 16),
        ] {
            reqs.push((forge::read_request(0, 0, va, g.rkey, n), vec![]));
        }
        for va in [b - 8, b + l, b + l - 4, b + 4, u64::MAX - 7] {
            reqs.push((forge::fetch_add(0, 0, va, g.rkey, 1), vec![]));
        }
        self.refused(
            "out of bounds",
            reqs,
            &[NakCode::RemoteAccessError, NakCode::InvalidRequest],
        );
        // A message that overruns its own RETH: FIRST for MTU + 100
        // bytes (in bounds), then a MIDDLE instead of the LAST.
        let p = self.take_psn(0, 2);
        let mut first = forge::write_only(self.qpn[0], p, b + 8192, g.rkey, MTU);
        first.bth.opcode = Opcode::RC_RDMA_WRITE_FIRST;
        first.ext.reth.as_mut().unwrap().dma_len = MTU as u32 + 100;
        self.send(&first, &[0x77; MTU]);
        // The first packet is accepted and placed: it is inside the grant.
        self.shadow[8192..8192 + MTU].fill(0x77);
        let mid = forge::plain(Opcode::RC_RDMA_WRITE_MIDDLE, self.qpn[0], p + 1, MTU);
        self.send(&mid, &[0x78; MTU]);
        let r = self.answer(0, p + 1);
        assert_eq!(
            r.syndrome,
            Some(Syndrome::Nak(NakCode::InvalidRequest)),
            "{r:?}"
        );
        self.sent.invalid += 1;
        self.rearm();
    }

    /// Keys of regions in another PD, without remote access, and accesses
    /// a region does not grant.
    fn other_pd(&mut self) {
        let (o, wh, ro) = (self.other, self.whole, self.ro);
        let reqs = vec![
            (forge::write_only(0, 0, o.addr, o.rkey, 16), vec![1; 16]),
            (forge::read_request(0, 0, o.addr, o.rkey, 16), vec![]),
            (forge::fetch_add(0, 0, o.addr, o.rkey, 1), vec![]),
            (forge::write_only(0, 0, wh.addr, wh.rkey, 16), vec![1; 16]),
            (
                forge::read_request(0, 0, wh.addr + GUARD as u64, wh.rkey, 16),
                vec![],
            ),
            (forge::write_only(0, 0, ro.addr, ro.rkey, 16), vec![1; 16]),
            (forge::fetch_add(0, 0, ro.addr, ro.rkey, 1), vec![]),
            (
                forge::atomic(Opcode::RC_COMPARE_SWAP, 0, 0, ro.addr + 8, ro.rkey, 1, 0),
                vec![],
            ),
        ];
        self.refused(
            "another PD's or a non-granting key",
            reqs,
            &[NakCode::RemoteAccessError],
        );
    }

    /// WRITEs with the right key at the wrong PSN: ahead of the window
    /// (out of sequence: one PSN sequence NAK) and behind it (duplicates:
    /// acknowledged, not executed). Then the right PSN still works.
    fn forged_psns(&mut self) {
        let g = self.granted;
        let e = self.epsn[1];
        let qp = self.qpn[1];
        for d in [1u32, 2, 100, (1 << 23) - 1] {
            let r = forge::write_only(qp, (e + d) & 0xff_ffff, g.addr + 1000, g.rkey, 8);
            self.send(&r, b"AHEADPSN");
            self.sent.ahead += 1;
        }
        let nak = self.answer(1, e);
        assert_eq!(
            nak.syndrome,
            Some(Syndrome::Nak(NakCode::PsnSequenceError)),
            "{nak:?}"
        );
        for d in [1u32, 100, (1 << 23) - 1] {
            let p = e.wrapping_sub(d) & 0xff_ffff;
            let r = forge::write_only(qp, p, g.addr + 1000, g.rkey, 8);
            self.send(&r, b"BEHINDPS");
        }
        // Duplicates are answered with an ACK of the last PSN received
        // (queued ACKs coalesce: at least one).
        let prev = e.wrapping_sub(1) & 0xff_ffff;
        self.expect_ack(1, prev, "a duplicate");
        let p = self.take_psn(1, 1);
        self.send(
            &forge::write_only(qp, p, g.addr + 1008, g.rkey, 8),
            b"RIGHTPSN",
        );
        self.expect_ack(1, p, "the right PSN after forged ones");
        self.shadow[1008..1016].copy_from_slice(b"RIGHTPSN");
    }

    /// Granted WRITEs with a wrong ICRC: dropped before the transport sees
    /// them (the socket has sent ID-0 datagrams before, so it gets the full
    /// 32-bit check). Then an intact one works at the same PSN.
    fn icrc(&mut self) {
        let g = self.granted;
        let p = self.epsn[2];
        let r = forge::write_only(self.qpn[2], p, g.addr + 2000, g.rkey, 32);
        let good = self.f.build(self.dst, &r, &[0xcc; 32]);
        let n = good.len();
        let mut bad = Vec::new();
        for bit in [0, 7, 13, 31] {
            let mut d = good.clone();
            d[n - 4 + bit / 8] ^= 1 << (bit % 8);
            bad.push(d);
        }
        for at in [0, 3, 8, 11, 12, 20, 27, 28, 40, n - 5] {
            let mut d = good.clone();
            d[at] ^= 0x10;
            bad.push(d);
        }
        let mut d = good.clone();
        d[n - 4..].fill(0);
        bad.push(d);
        for d in &bad {
            self.f.send_raw(self.dst, d).unwrap();
            self.sent.icrc += 1;
        }
        let quiet = self.f.drain(QUIET, 16).unwrap();
        assert!(
            quiet.is_empty(),
            "tampered packets were answered: {quiet:?}"
        );
        let p = self.take_psn(2, 1);
        self.f.send_raw(self.dst, &good).unwrap();
        self.expect_ack(2, p, "the intact packet after tampered ones");
        self.shadow[2000..2032].fill(0xcc);
    }

    /// Truncated, oversized and wrong-opcode packets, each with a correct
    /// ICRC so that the transport has to judge it.
    fn malformed(&mut self) {
        let g = self.granted;
        let (qp, e) = (self.qpn[3], self.epsn[3]);
        let write = forge::write_only(qp, e, g.addr, g.rkey, 16);
        let good = self.f.build(self.dst, &write, &[0xee; 16]);
        // Too short to be RoCEv2 at all (the port drops them). An empty
        // datagram is dropped too, but no counter sees it (the port's
        // receive loop has no segment to look at): sent, not counted.
        self.f.send_raw(self.dst, &[]).unwrap();
        for n in [1usize, 11, 15] {
            self.f.send_raw(self.dst, &good[..n]).unwrap();
            self.sent.short += 1;
        }
        // Parseable lengths, wrong contents, correct ICRC: the core's
        // parser or opcode checks refuse them.
        let mut forged: Vec<Vec<u8>> = Vec::new();
        let cut = |n: usize| {
            let mut d = good[..n].to_vec();
            d.extend([0; 4]);
            d
        };
        forged.push(cut(12)); // BTH, no RETH
        forged.push(cut(12 + 12)); // RETH cut short
        for op in [0x15u8, 0x18, 0x1f, 0x30, 0x63, 0x80, 0xff] {
            let mut d = good.clone();
            d[0] = op;
            forged.push(d);
        }
        for op in [Opcode::UC_RDMA_WRITE_ONLY, Opcode::UD_SEND_ONLY] {
            let mut d = good.clone();
            d[0] = op.0;
            // UD: the RETH's 16 bytes read as a DETH and payload, a well
            // formed UD packet, on an RC QP.
            forged.push(d);
        }
        let mut d = good.clone();
        d[1] |= 0x03; // transport version 3
        forged.push(d);
        let mut d = good.clone();
        d[2] = 0x12; // P_Key 0x1234
        d[3] = 0x34;
        forged.push(d);
        for d in &mut forged {
            forge::fill_icrc(self.f.local(), self.dst, d);
            self.f.send_raw(self.dst, d).unwrap();
            self.sent.malformed += 1;
        }
        // A ghost response: a READ response to a requester with no READ.
        let rr = forge::read_response_only(qp, 0x123, 0, 16);
        self.send(&rr, &[0xee; 16]);
        self.sent.ghost += 1;
        let quiet = self.f.drain(QUIET, 16).unwrap();
        assert!(
            quiet.is_empty(),
            "malformed packets were answered: {quiet:?}"
        );
        // The QP is untouched by all of that: the intact packet works.
        let p = self.take_psn(3, 1);
        self.f.send_raw(self.dst, &good).unwrap();
        self.expect_ack(3, p, "a WRITE after malformed packets");
        self.shadow[..16].fill(0xee);
        // A SEND with no receive posted: RNR NAK, not an error.
        let p = self.epsn[3];
        self.send(&forge::plain(Opcode::RC_SEND_ONLY, qp, p, 8), b"no recv!");
        let r = self.answer(3, p);
        assert!(matches!(r.syndrome, Some(Syndrome::RnrNak { .. })), "{r:?}");
        self.sent.rnr += 1;
        // Oversized: payloads beyond the path MTU, up to a 64 KiB datagram;
        // a MIDDLE with no FIRST; an ACK sent as a request.
        let mut reqs = Vec::new();
        for n in [MTU + 1, 9000, 65000] {
            reqs.push((forge::write_only(0, 0, g.addr, g.rkey, n), vec![0x99; n]));
        }
        reqs.push((
            forge::plain(Opcode::RC_RDMA_WRITE_MIDDLE, 0, 0, MTU),
            vec![0x99; MTU],
        ));
        reqs.push((
            forge::plain(Opcode::RC_SEND_MIDDLE, 0, 0, MTU),
            vec![0x99; MTU],
        ));
        self.refused(
            "oversized or out-of-sequence opcode",
            reqs,
            &[NakCode::InvalidRequest],
        );
    }

    /// Bounded floods: READ requests beyond the responder's resources,
    /// thousands of duplicate READs (each asking for 64 KiB again) and
    /// duplicate atomics (which must not execute twice).
    fn floods(&mut self) {
        const FLOOD: usize = 2000;
        let deadline = Instant::now() + Duration::from_secs(5);
        let g = self.granted;
        // New READs back to back, 256 of them: the 17th outstanding one is
        // refused (max_dest_rd_atomic 16) unless the answers kept up. Small
        // ones, so that no answer is lost in this socket's buffer and the
        // NAKs counted here are all the target sent.
        let qp = self.qpn[4];
        let mut refused = false;
        for _ in 0..256 {
            let p = self.take_psn(4, 1);
            self.send(&forge::read_request(qp, p, g.addr, g.rkey, 64), &[]);
        }
        for r in self.f.drain(QUIET, 100_000).unwrap() {
            self.check_disclosure(&r);
            if r.syndrome == Some(Syndrome::Nak(NakCode::InvalidRequest)) {
                refused = true;
                self.sent.invalid += 1;
            }
        }
        println!("adversary: READ flood refused as too many outstanding: {refused}");
        self.rearm();
        // Duplicate READs: one accepted, then replayed FLOOD times.
        let qp = self.qpn[5];
        let p = self.take_psn(5, (GRANT / MTU) as u32);
        let read = forge::read_request(qp, p, g.addr, g.rkey, GRANT as u32);
        self.send(&read, &[]);
        let mut replies = 0usize;
        for _ in 0..FLOOD {
            if Instant::now() > deadline {
                break;
            }
            self.send(&read, &[]);
            while let Some(r) = self.f.recv(Duration::ZERO).unwrap() {
                self.check_disclosure(&r);
                replies += 1;
            }
        }
        for r in self.f.drain(QUIET, 1_000_000).unwrap() {
            self.check_disclosure(&r);
            replies += 1;
        }
        println!("adversary: {FLOOD} duplicate READs of 64 KiB: {replies} response packets, all granted bytes");
        // Duplicate atomics: one FETCH_ADD, then FLOOD copies of it. The
        // word moves once; every replay returns the same original value.
        let qp = self.qpn[6];
        let p = self.take_psn(6, 1);
        let fa = forge::fetch_add(qp, p, g.addr + 16, g.rkey, 1);
        self.send(&fa, &[]);
        let first = self.answer(6, p);
        let old = u64::from_ne_bytes(self.shadow[16..24].try_into().unwrap());
        assert_eq!(first.orig, Some(old), "{first:?}");
        self.shadow[16..24].copy_from_slice(&old.wrapping_add(1).to_ne_bytes());
        let mut replays = 0;
        for _ in 0..FLOOD {
            self.send(&fa, &[]);
        }
        for r in self.f.drain(QUIET, 1_000_000).unwrap() {
            if r.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE {
                assert_eq!(r.orig, Some(old), "a replayed atomic: {r:?}");
                replays += 1;
            }
        }
        println!(
            "adversary: {FLOOD} duplicate FETCH_ADDs: {replays} replays, all of the original value"
        );
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "floods overran their bound"
        );
    }

    /// Packets from the wrong source: the adversary's address to the
    /// honest QP, the honest peer's address (another port) to the honest
    /// QP and to an attack QP, and a QP that does not exist.
    fn spoof(&mut self) {
        let g = self.granted;
        let hq = self.honest_qpn;
        let mut rng = Rng::new(0x5f00f);
        let requests = |rng: &mut Rng| -> Vec<(PacketRepr, Vec<u8>)> {
            let p = rng.next_u32() & 0xff_ffff;
            vec![
                (
                    forge::write_only(hq, p, rng.next_u64(), rng.next_u32(), 16),
                    vec![0x66; 16],
                ),
                (
                    forge::read_request(hq, p, rng.next_u64(), rng.next_u32(), 16),
                    vec![],
                ),
            ]
        };
        let responses = |rng: &mut Rng| -> Vec<(PacketRepr, Vec<u8>)> {
            let p = rng.next_u32() & 0xff_ffff;
            vec![
                (forge::ack(hq, p, Syndrome::ACK_UNLIMITED, 1), vec![]),
                (forge::read_response_only(hq, p, 1, 16), vec![0x66; 16]),
            ]
        };
        // From our own address to the honest QP: not its peer, whatever
        // the packet.
        for _ in 0..16 {
            let mut v = requests(&mut rng);
            v.extend(responses(&mut rng));
            for (r, d) in v {
                self.send(&r, &d);
                self.sent.wrong_source += 1;
            }
        }
        // From the honest peer's address (another UDP port) to an attack
        // QP, with everything else right.
        let spoofer =
            Forger::bind(SocketAddrV4::new(HON, 0)).expect("bind the honest peer's address");
        let (qp, e) = (self.qpn[7], self.epsn[7]);
        for k in 0..16u64 {
            let r = forge::write_only(qp, e, g.addr + 3000 + k, g.rkey, 1);
            spoofer.send(self.dst, &r, &[0x44]).unwrap();
            self.sent.wrong_source += 1;
        }
        // From the honest peer's address to the honest QP: what RoCE cannot
        // tell from the peer. Random PSNs and keys: at most out of sequence
        // (a sequence NAK to the honest peer) or duplicate, and a key that
        // must still be guessed. (A guessed PSN, one chance in 2^24 per
        // packet, could at worst break the honest connection; the keys
        // keep memory safe regardless.) Requests only: a forged response
        // lands in the honest requester's counters, which the honest
        // traffic moves too.
        for _ in 0..16 {
            for (r, d) in requests(&mut rng) {
                spoofer.send(self.dst, &r, &d).unwrap();
            }
        }
        // A QP that does not exist.
        for k in 0..8u32 {
            let r = forge::write_only(self.qpn[0] + 0x800 + k, 0, g.addr, g.rkey, 4);
            self.send(&r, &[0; 4]);
            self.sent.no_qp += 1;
        }
        let quiet = self.f.drain(QUIET, 64).unwrap();
        assert!(
            quiet.iter().all(|r| r.dest_qp != ADV_QPN + 7),
            "an attack QP answered a spoofed source: {quiet:?}"
        );
        // The spoofed-at QP is intact.
        let p = self.take_psn(7, 1);
        self.send(&forge::write_only(qp, p, g.addr + 3000, g.rkey, 4), b"real");
        self.expect_ack(7, p, "the attack QP after spoofed packets");
        self.shadow[3000..3004].copy_from_slice(b"real");
    }
}
