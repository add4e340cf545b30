//! Packets per second through the transport core alone: two endpoints in
//! one process, one thread, no IO. Each packet a requester emits is turned
//! into a datagram (headers, payload copied out of registered memory, pad,
//! ICRC bytes) and handed straight to the responder, and its ACKs back the
//! same way — the work an IO backend does per packet, minus the syscalls.
//!
//! Two streams: 64-byte SEND ONLY (per-packet overhead) and 4 KiB RDMA WRITE
//! ONLY at MTU 4096 (payload movement). Each runs without the ICRC (the core
//! alone) and with it computed on send and checked on receive, as the UDP
//! path does. Throughput counts request packets; every one is also
//! acknowledged (each SEND/WRITE ONLY asks for an ACK).
//!
//! `cargo bench -p softrdma-core --bench core_pps -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma_core::cq::CqId;
use softrdma_core::mr::{Memory, VecMemory};
use softrdma_core::qp::attr::{AccessFlags, AttrMask, Mtu, QpAttr};
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::{Completion, WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Endpoint, EndpointConfig, QpInit, RxMeta};
use softrdma_wire::icrc;

const BASE: u64 = 0x1000_0000;
const MEM: usize = 1 << 20;
/// Work requests per measured batch (the send queue holds them all).
const BATCH: usize = 1024;

fn ip(n: u8) -> [u8; 4] {
    [10, 0, 0, n]
}

fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip(n));
    g
}

/// One side: an endpoint, its memory, one connected RC QP.
struct Side {
    ep: Endpoint,
    mem: VecMemory,
    n: u8,
    qpn: u32,
    scq: CqId,
    rcq: CqId,
    lkey: u32,
    rkey: u32,
}

impl Side {
    fn new(n: u8) -> Side {
        let mut ep = Endpoint::new(EndpointConfig {
            qpn_base: 0x100 * n as u32,
            ..Default::default()
        });
        let pd = ep.alloc_pd();
        let all = AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_WRITE)
            .union(AccessFlags::REMOTE_READ);
        let (lkey, rkey) = ep.reg_mr(pd, BASE, BASE, MEM as u64, all).unwrap();
        let scq = ep.create_cq(4 * BATCH as u32).unwrap();
        let rcq = ep.create_cq(4 * BATCH as u32).unwrap();
        let cap = QpCap {
            max_send_wr: BATCH as u32,
            max_recv_wr: BATCH as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qpn = ep
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: scq,
                recv_cq: rcq,
                srq: None,
                cap,
                sq_sig_all: true,
            })
            .unwrap();
        Side {
            ep,
            mem: VecMemory::new(BASE, MEM),
            n,
            qpn,
            scq,
            rcq,
            lkey,
            rkey,
        }
    }

    fn connect(&mut self, peer_qpn: u32, peer: u8) {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE
                .union(AccessFlags::REMOTE_WRITE)
                .union(AccessFlags::REMOTE_READ),
            ..Default::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        self.ep.modify_qp(self.qpn, &a, m).unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = Mtu::B4096;
        a.dest_qp_num = peer_qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 1;
        a.av.dgid = gid(peer);
        let m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        self.ep.modify_qp(self.qpn, &a, m).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = 0;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        let m = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        self.ep.modify_qp(self.qpn, &a, m).unwrap();
    }
}

/// Carries datagrams between the two sides.
struct Wire {
    icrc: bool,
    head: Vec<u8>,
    dgram: Vec<u8>,
}

impl Wire {
    /// Move everything `from` has to send into `to`; returns how many.
    fn pump(&mut self, from: &mut Side, to: &mut Side) -> usize {
        let mut n = 0;
        while let Some(t) = from.ep.poll_transmit(0, &mut self.head, &from.mem) {
            let mut len = t.head_len;
            self.dgram[..len].copy_from_slice(&self.head[..len]);
            for s in t.segs.as_slice() {
                from.mem
                    .read(s.addr, &mut self.dgram[len..len + s.len as usize]);
                len += s.len as usize;
            }
            self.dgram[len..len + t.pad as usize].fill(0);
            len += t.pad as usize + 4;
            let udp_len = (len + 8) as u16;
            if self.icrc {
                let iph = icrc::ipv4_header(ip(from.n), ip(to.n), 0, true, udp_len);
                let udp = icrc::udp_header(4791, 4791, udp_len);
                icrc::fill(&iph, &udp, &mut self.dgram[..len]);
                let ok = icrc::verify_ipv4_hidden(
                    (ip(from.n), 4791),
                    (ip(to.n), 4791),
                    &self.dgram[..len],
                    false,
                );
                assert_eq!(ok, icrc::HiddenCheck::Exact);
            }
            let meta = RxMeta {
                sgid: gid(from.n),
                dgid: gid(to.n),
                traffic_class: 0,
                hop_limit: 64,
            };
            to.ep
                .handle_packet(0, &meta, &self.dgram[..len], &mut to.mem);
            n += 1;
        }
        n
    }
}

struct Pair {
    a: Side,
    b: Side,
    wire: Wire,
    wcs: Vec<Completion>,
}

impl Pair {
    fn new(icrc: bool) -> Pair {
        let mut a = Side::new(1);
        let mut b = Side::new(2);
        let (qa, qb) = (a.qpn, b.qpn);
        a.connect(qb, 2);
        b.connect(qa, 1);
        let blank = Completion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: 0,
            vendor_err: 0,
            sl: 0,
        };
        Pair {
            a,
            b,
            wire: Wire {
                icrc,
                head: vec![0; 4096 + 128],
                dgram: vec![0; 4096 + 256],
            },
            wcs: vec![blank; BATCH],
        }
    }

    /// Post `BATCH` work requests of `len` bytes on A (and receives on B for
    /// SENDs), run both sides until idle, reap every completion.
    fn batch(&mut self, op: SendOp, len: u32) {
        let recv = matches!(op, SendOp::Send);
        for i in 0..BATCH {
            if recv {
                let sge = [Sge {
                    addr: BASE + (i as u64 % 64) * 64,
                    length: len,
                    lkey: self.b.lkey,
                }];
                self.b
                    .ep
                    .post_recv(
                        self.b.qpn,
                        &RecvWr {
                            wr_id: i as u64,
                            sgl: &sge,
                        },
                    )
                    .unwrap();
            }
            let sge = [Sge {
                addr: BASE + (i as u64 % 128) * 4096,
                length: len,
                lkey: self.a.lkey,
            }];
            let wr = SendWr {
                wr_id: i as u64,
                op,
                sgl: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            self.a.ep.post_send(self.a.qpn, &wr, &self.a.mem).unwrap();
        }
        loop {
            let fwd = self.wire.pump(&mut self.a, &mut self.b);
            let back = self.wire.pump(&mut self.b, &mut self.a);
            if fwd + back == 0 {
                break;
            }
        }
        let done = self.a.ep.poll_cq(self.a.scq, &mut self.wcs).unwrap();
        assert_eq!(done, BATCH);
        assert!(self.wcs.iter().all(|c| c.status == WcStatus::Success));
        if recv {
            assert_eq!(self.b.ep.poll_cq(self.b.rcq, &mut self.wcs).unwrap(), BATCH);
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("core_pps");
    g.throughput(Throughput::Elements(BATCH as u64));
    for icrc in [false, true] {
        let variant = if icrc { "icrc" } else { "no_icrc" };
        let write = |p: &Pair| SendOp::Write {
            remote_addr: BASE + (MEM as u64 / 2),
            rkey: p.b.rkey,
        };
        for (name, len) in [("send_64B", 64), ("write_4KiB", 4096)] {
            let mut p = Pair::new(icrc);
            let op = if len == 64 { SendOp::Send } else { write(&p) };
            g.bench_function(BenchmarkId::new(name, variant), |bch| {
                bch.iter(|| p.batch(op, len))
            });
            // Responses coalesce: the responder is drained after each burst
            // the requester sends, so one ACK answers many requests.
            let (req, resp) = (p.a.ep.stats().tx_packets, p.b.ep.stats().tx_packets);
            eprintln!(
                "{name}/{variant}: {req} requests, {resp} responses ({:.4} per request)",
                resp as f64 / req as f64
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
