//! The scheduler's cost per packet as the number of QPs grows: two
//! endpoints in one process with N connected RC QP pairs, no IO. Each
//! iteration is rounds of: every active QP posts one 64-byte RDMA WRITE,
//! then every packet is carried from one side to the other (requests one
//! way, ACKs back) until both are idle — so each request has its own ACK and
//! the packet mix is the same whatever N is.
//!
//! * `all_active/N`: all N QPs post each round, `max(1024, N)` WRITEs in all
//!   (N = 10000 also runs into the per-destination budget, so its QPs wait
//!   and are woken).
//! * `one_active/N`: one QP posts 1024 WRITEs, one a round, while N - 1 sit
//!   idle.
//!
//! Throughput is in packets (requests and responses, both sides'
//! `poll_transmit` output), so time per element is ns per packet. With a
//! scheduler whose work is per packet, `one_active` is flat in N; a scan of
//! every QP per `poll_transmit` (as before) grows linearly. `all_active`
//! also touches N QPs' state per round, which stops fitting in cache.
//!
//! `cargo bench -p softrdma-core --bench sched -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma_core::mr::{Memory, VecMemory};
use softrdma_core::qp::attr::{AccessFlags, AttrMask, Mtu, QpAttr};
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wr::{SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Endpoint, EndpointConfig, QpInit, RxMeta};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 1 << 20;
/// Requests per iteration, at least (all QPs post at least one).
const BATCH: usize = 1024;
const LEN: u32 = 64;

fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, n]);
    g
}

struct Side {
    ep: Endpoint,
    mem: VecMemory,
    n: u8,
    qpns: Vec<u32>,
    lkey: u32,
    rkey: u32,
}

impl Side {
    /// `n` QPs; the ones in `deep` get a send queue for a whole batch.
    fn new(id: u8, n: usize, deep: impl Fn(usize) -> bool) -> Side {
        let mut ep = Endpoint::new(EndpointConfig {
            qpn_base: 0x100 * id as u32,
            ..Default::default()
        });
        let pd = ep.alloc_pd();
        let all = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
        let (lkey, rkey) = ep.reg_mr(pd, BASE, BASE, MEM as u64, all).unwrap();
        let scq = ep.create_cq(1 << 16).unwrap();
        let rcq = ep.create_cq(1 << 16).unwrap();
        let qpns = (0..n)
            .map(|i| {
                let depth = if deep(i) { BATCH as u32 } else { 4 };
                ep.create_qp(QpInit {
                    qp_type: QpType::Rc,
                    pd,
                    send_cq: scq,
                    recv_cq: rcq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: depth,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                })
                .unwrap()
            })
            .collect();
        Side {
            ep,
            mem: VecMemory::new(BASE, MEM),
            n: id,
            qpns,
            lkey,
            rkey,
        }
    }

    fn connect(&mut self, i: usize, peer_qpn: u32, peer: u8) {
        let qpn = self.qpns[i];
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
            ..Default::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        self.ep.modify_qp(qpn, &a, m).unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = Mtu::B4096;
        a.dest_qp_num = peer_qpn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        a.av.dgid = gid(peer);
        let m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        self.ep.modify_qp(qpn, &a, m).unwrap();
        a.qp_state = QpState::Rts;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        let m = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        self.ep.modify_qp(qpn, &a, m).unwrap();
    }
}

struct Pair {
    a: Side,
    b: Side,
    head: Vec<u8>,
    dgram: Vec<u8>,
    /// QPs that post each round, and how many rounds an iteration has.
    active: Vec<usize>,
    rounds: usize,
}

impl Pair {
    fn new(n: usize, one_active: bool) -> Pair {
        let deep = |i: usize| i == 0 || !one_active;
        let mut a = Side::new(1, n, deep);
        let mut b = Side::new(2, n, |_| false);
        for i in 0..n {
            let (qa, qb) = (a.qpns[i], b.qpns[i]);
            a.connect(i, qb, 2);
            b.connect(i, qa, 1);
        }
        let (active, rounds) = if one_active {
            (vec![0], BATCH)
        } else {
            ((0..n).collect(), BATCH.div_ceil(n))
        };
        Pair {
            a,
            b,
            head: vec![0; 4096 + 128],
            dgram: vec![0; 4096 + 256],
            active,
            rounds,
        }
    }

    /// Move everything `from` has to send into `to`; returns how many.
    fn pump(head: &mut [u8], dgram: &mut [u8], from: &mut Side, to: &mut Side) -> usize {
        let mut n = 0;
        while let Some(t) = from.ep.poll_transmit(0, head, &from.mem) {
            let mut len = t.head_len;
            dgram[..len].copy_from_slice(&head[..len]);
            for s in t.segs.as_slice() {
                from.mem.read(s.addr, &mut dgram[len..len + s.len as usize]);
                len += s.len as usize;
            }
            dgram[len..len + t.pad as usize].fill(0);
            len += t.pad as usize + 4; // ICRC bytes, not computed here
            let meta = RxMeta {
                sgid: gid(from.n),
                dgid: gid(to.n),
                traffic_class: 0,
                hop_limit: 64,
            };
            to.ep.handle_packet(0, &meta, &dgram[..len], &mut to.mem);
            n += 1;
        }
        n
    }

    /// The iteration's rounds; returns how many packets moved.
    fn iteration(&mut self) -> usize {
        let mut moved = 0;
        for w in 0..self.rounds {
            moved += self.round(w);
        }
        moved
    }

    /// Post a WRITE on every active QP and carry packets until both sides
    /// are idle.
    fn round(&mut self, w: usize) -> usize {
        let remote = BASE + MEM as u64 / 2;
        for &i in &self.active {
            let sge = [Sge {
                addr: BASE + (w as u64 % 64) * LEN as u64,
                length: LEN,
                lkey: self.a.lkey,
            }];
            let wr = SendWr {
                wr_id: w as u64,
                op: SendOp::Write {
                    remote_addr: remote + (i as u64 % 1024) * LEN as u64,
                    rkey: self.b.rkey,
                },
                sgl: &sge,
                flags: SendFlags(0),
                ud: None,
            };
            self.a
                .ep
                .post_send(self.a.qpns[i], &wr, &self.a.mem)
                .unwrap();
        }
        let mut moved = 0;
        loop {
            let fwd = Self::pump(&mut self.head, &mut self.dgram, &mut self.a, &mut self.b);
            let back = Self::pump(&mut self.head, &mut self.dgram, &mut self.b, &mut self.a);
            if fwd + back == 0 {
                break;
            }
            moved += fwd + back;
        }
        moved
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched");
    for (mode, one) in [("all_active", false), ("one_active", true)] {
        for n in [1usize, 16, 256, 1024, 10_000] {
            let mut p = Pair::new(n, one);
            // The same packets move every iteration; count them once.
            let per_iter = p.iteration();
            g.throughput(Throughput::Elements(per_iter as u64));
            g.bench_function(BenchmarkId::new(mode, n), |b| b.iter(|| p.iteration()));
            let (st_a, st_b) = (p.a.ep.stats(), p.b.ep.stats());
            eprintln!(
                "{mode}/{n}: {per_iter} packets per iteration; scheduler visits per packet {:.3}",
                (st_a.sched_visits + st_b.sched_visits) as f64
                    / (st_a.tx_packets + st_b.tx_packets) as f64
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
