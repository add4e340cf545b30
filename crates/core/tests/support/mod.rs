//! Test support: a simulated host (one `Endpoint` plus its memory) that the
//! deterministic network simulator drives, and helpers to connect QPs.
//!
//! The host does what the real UDP backend does with a `Transmit`: headers
//! from the core, payload copied from memory segments, pad, then the ICRC
//! over IPv4 pseudo-headers (ID 0, DF — what our sockets send). On receive
//! it checks the ICRC exactly and drops corrupted datagrams, as the real
//! receive path does for softrdma peers.
#![allow(dead_code)]

use softrdma_core::cq::CqId;
use softrdma_core::mr::{Memory, PdId, VecMemory};
use softrdma_core::qp::attr::{AccessFlags, AttrMask, Mtu, QpAttr};
use softrdma_core::qp::state::{QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::Completion;
use softrdma_core::{Endpoint, EndpointConfig, QpInit, RxMeta};
use softrdma_netsim::{Node, NodeId, Sim};
use softrdma_wire::icrc;

pub const MEM_BASE: u64 = 0x1000_0000;

pub fn gid_of(node: NodeId) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, node as u8 + 1]);
    g
}

fn v4(g: &[u8; 16]) -> [u8; 4] {
    g[12..].try_into().unwrap()
}

/// Every datagram a host sent or received, decoded, for tests that assert
/// exact packets.
#[derive(Debug, Clone)]
pub struct Wire {
    pub from: NodeId,
    pub bytes: Vec<u8>,
}

pub struct Host {
    pub id: NodeId,
    pub ep: Endpoint,
    pub mem: VecMemory,
    pub icrc_drops: u64,
    /// Datagrams this host sent, if recording.
    pub sent: Vec<Vec<u8>>,
    pub record: bool,
    head: Vec<u8>,
}

impl Host {
    pub fn new(id: NodeId, mem_len: usize, seed: u64) -> Host {
        let cfg = EndpointConfig {
            seed,
            qpn_base: 0x100 * (id as u32 + 1),
            ..Default::default()
        };
        Host {
            id,
            ep: Endpoint::new(cfg),
            mem: VecMemory::new(MEM_BASE, mem_len),
            icrc_drops: 0,
            sent: Vec::new(),
            record: false,
            head: vec![0; 4096 + 128],
        }
    }

    pub fn poll_cq(&mut self, cq: CqId) -> Vec<Completion> {
        let mut out = [Completion {
            wr_id: 0,
            status: softrdma_core::wc::WcStatus::Success,
            opcode: softrdma_core::wc::WcOpcode::Send,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: 0,
            vendor_err: 0,
        }; 64];
        let mut v = Vec::new();
        loop {
            let n = self.ep.poll_cq(cq, &mut out).unwrap();
            v.extend_from_slice(&out[..n]);
            if n < out.len() {
                return v;
            }
        }
    }
}

impl Node for Host {
    fn handle_packet(&mut self, now: u64, from: NodeId, bytes: &[u8]) {
        let src = gid_of(from);
        let dst = gid_of(self.id);
        let check = icrc::verify_ipv4_hidden((v4(&src), 4791), (v4(&dst), 4791), bytes, false);
        if check != icrc::HiddenCheck::Exact {
            self.icrc_drops += 1;
            return;
        }
        let meta = RxMeta {
            sgid: src,
            dgid: dst,
            traffic_class: 0,
            hop_limit: 64,
        };
        self.ep.handle_packet(now, &meta, bytes, &mut self.mem);
    }

    fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<(NodeId, usize)> {
        let t = self.ep.poll_transmit(now, &mut self.head)?;
        let mut n = t.head_len;
        buf[..n].copy_from_slice(&self.head[..n]);
        for s in t.segs.as_slice() {
            self.mem.read(s.addr, &mut buf[n..n + s.len as usize]);
            n += s.len as usize;
        }
        buf[n..n + t.pad as usize].fill(0);
        n += t.pad as usize + 4;
        let dst_node = (t.dgid[15] - 1) as NodeId;
        let src = v4(&gid_of(self.id));
        let udp_len = (n + 8) as u16;
        let ip = icrc::ipv4_header(src, v4(&t.dgid), 0, true, udp_len);
        let udp = icrc::udp_header(4791, 4791, udp_len);
        icrc::fill(&ip, &udp, &mut buf[..n]);
        if self.record {
            self.sent.push(buf[..n].to_vec());
        }
        Some((dst_node, n))
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.ep.poll_timeout()
    }

    fn handle_timeout(&mut self, now: u64) {
        self.ep.handle_timeout(now);
    }
}

/// One QP on a host with its CQs and a registered region covering all memory.
#[derive(Debug, Clone, Copy)]
pub struct QpEnd {
    pub node: NodeId,
    pub qpn: u32,
    pub pd: PdId,
    pub scq: CqId,
    pub rcq: CqId,
    pub lkey: u32,
    pub rkey: u32,
}

pub struct Opts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub access: AccessFlags,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub cap: QpCap,
    pub psn_a: u32,
    pub psn_b: u32,
    pub rd_atomic: u8,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            qp_type: QpType::Rc,
            mtu: Mtu::B1024,
            access: AccessFlags::LOCAL_WRITE
                .union(AccessFlags::REMOTE_WRITE)
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            psn_a: 100,
            psn_b: 0xfffff0,
            rd_atomic: 16,
        }
    }
}

/// Create a QP with its own CQs and a full-memory MR on a host.
pub fn make_qp(h: &mut Host, o: &Opts) -> QpEnd {
    let pd = h.ep.alloc_pd();
    let scq = h.ep.create_cq(4096).unwrap();
    let rcq = h.ep.create_cq(4096).unwrap();
    let len = h.mem.bytes.len() as u64;
    let (lkey, rkey) = h.ep.reg_mr(pd, MEM_BASE, MEM_BASE, len, o.access).unwrap();
    let qpn =
        h.ep.create_qp(QpInit {
            qp_type: o.qp_type,
            pd,
            send_cq: scq,
            recv_cq: rcq,
            srq: None,
            cap: o.cap,
            sq_sig_all: false,
        })
        .unwrap();
    QpEnd {
        node: h.id,
        qpn,
        pd,
        scq,
        rcq,
        lkey,
        rkey,
    }
}

/// Bring a QP through INIT, RTR, RTS towards `remote`.
pub fn connect(h: &mut Host, me: &QpEnd, remote: &QpEnd, sq_psn: u32, rq_psn: u32, o: &Opts) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        ..Default::default()
    };
    let init_mask = match o.qp_type {
        QpType::Ud => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        _ => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    };
    h.ep.modify_qp(me.qpn, &a, init_mask).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = o.rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.av.dgid = gid_of(remote.node);
    let rtr_mask = match o.qp_type {
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
        }
        QpType::Ud => AttrMask::STATE,
    };
    h.ep.modify_qp(me.qpn, &a, rtr_mask).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.rd_atomic;
    let rts_mask = match o.qp_type {
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::SQ_PSN
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        _ => AttrMask::STATE | AttrMask::SQ_PSN,
    };
    h.ep.modify_qp(me.qpn, &a, rts_mask).unwrap();
}

/// Two hosts with one connected QP pair.
pub fn pair(seed: u64, mem: usize, o: &Opts) -> (Sim<Host>, QpEnd, QpEnd) {
    let mut sim = Sim::new(seed);
    let a = sim.add_node(Host::new(0, mem, seed ^ 0xa));
    let b = sim.add_node(Host::new(1, mem, seed ^ 0xb));
    let qa = make_qp(sim.node_mut(a), o);
    let qb = make_qp(sim.node_mut(b), o);
    connect(sim.node_mut(a), &qa, &qb, o.psn_a, o.psn_b, o);
    connect(sim.node_mut(b), &qb, &qa, o.psn_b, o.psn_a, o);
    (sim, qa, qb)
}

/// Fill memory with a pattern that differs per address and seed.
pub fn pattern(h: &mut Host, addr: u64, len: usize, seed: u8) {
    let s = h.mem.slice_mut(addr, len);
    for (i, b) in s.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8);
    }
}
