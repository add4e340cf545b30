//! The simulator proper: hosts, switches, links and the event loop.
//!
//! # Events
//!
//! One queue of `(time, sequence)`-ordered events ([`crate::queue`]). A packet costs at
//! most two events per link: its arrival at the far end (scheduled when its
//! serialisation starts, at start + serialisation + propagation) and, only
//! if more packets wait behind it at that port, the port's becoming free.
//! Hosts add one event per packet they send (the NIC asks the endpoint for
//! the next packet when its wire frees) and one per core timer.
//!
//! # Hosts
//!
//! A host is a `softrdma_core::Endpoint` with a memory that stores nothing
//! ([`NullMemory`]: the payload's bytes are not the fabric's business, their
//! lengths are), one CQ, one region covering its address space, and a NIC:
//! whenever the NIC's wire is free and its data class not paused, it calls
//! `poll_transmit` and starts serialising what comes out. ACK, NAK and CNP
//! packets travel in the control class (strict priority, never paused, no
//! buffer accounting — as in HPCC's simulator); everything else in the
//! lossless data class. A received packet is handed to `handle_packet` at
//! once (the receive pipeline is infinitely fast), completions are polled,
//! and the endpoint's `poll_timeout` is kept as one pending timer event.
//!
//! # Switches
//!
//! Output-queued, two classes per port, strict priority. Buffer accounting
//! follows HPCC's `SwitchMmu`: each ingress port has a 4 KB reserve and
//! `3 × rate × delay` of headroom, the rest of the buffer is shared with a
//! dynamic threshold `(buffer − Σheadroom − Σreserve − shared_used) >> shift`
//! (shift 3 at host rate, one less per halving it takes to bring the port's
//! rate down to the host rate, as HPCC's `third.cc` sets it). With PFC on,
//! an ingress sends XOFF when it uses headroom or its shared use reaches the
//! threshold, and XON when headroom is empty and shared use is 3 KB under
//! the threshold; packets are dropped only when headroom overflows. With
//! PFC off, an egress queue may hold `alpha × (buffer − used)` (dynamic
//! threshold, Choudhury–Hahne) and drops beyond it.
//!
//! PFC frames carry quanta: XOFF pauses the upstream class for 65535 quanta
//! (512 bit times each) and is refreshed at half that while the condition
//! holds; XON (quanta 0) releases at once. They take effect after the link's
//! propagation delay plus a 64-byte frame's serialisation (they are sent
//! ahead of queued data, without waiting for the frame on the wire).
//!
//! ECN: RED on the egress data queue at dequeue (`Kmin`, `Kmax`, `Pmax`),
//! marking CE on ECT packets. INT: at dequeue each switch stamps its queue
//! length, bytes sent, time and port rate (up to 5 hops), and the packet
//! grows by HPCC's 42-byte INT header.
//!
//! ECMP: the next hop among the shortest-path ports is chosen by a hash of
//! the 5-tuple (source and destination IP, UDP source port — derived from
//! the QP number as RNICs and rxe do — destination port 4791, UDP) mixed
//! with a per-switch salt.

use std::collections::VecDeque;
use std::time::Instant;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use softrdma_core::cc::CcConfig;
use softrdma_core::cq::CqId;
use softrdma_core::mr::{Fault, KeySource, Memory, PdId};
use softrdma_core::qp::attr::{AccessFlags, Mtu, QpAttr};
use softrdma_core::qp::state::{required_mask, QpState, QpType};
use softrdma_core::qp::QpCap;
use softrdma_core::wc::{Completion, WcOpcode, WcStatus};
use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use softrdma_core::{Endpoint, EndpointConfig, Nanos, QpInit, RxMeta};

use crate::queue::Queue;
use crate::topo::{ports, Kind, PortEnd, Routes, Topology};
use crate::traffic::{Op, Traffic};
use crate::{Error, Ps, PS_PER_MS, PS_PER_NS, PS_PER_S, PS_PER_US};

/// ECN marking at switch egress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ecn {
    Off,
    /// HPCC's `KMIN_MAP`/`KMAX_MAP`/`PMAX_MAP`: Kmin 4 KB and Kmax 16 KB per
    /// Gb/s of port rate (400 KB / 1600 KB at 100G), Pmax 0.2.
    Hpcc,
    /// Fixed thresholds in bytes.
    Red {
        kmin: u64,
        kmax: u64,
        pmax: f64,
    },
}

/// A link that goes down at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub at: Ps,
    pub a: usize,
    pub b: usize,
}

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Path MTU of every QP (256..4096; HPCC's 1000-byte payload is closest
    /// to 1024).
    pub mtu: u32,
    pub pfc: bool,
    /// Shared buffer per switch, bytes (HPCC: 32 MB at 100G).
    pub buffer: u64,
    /// Lossy egress dynamic threshold factor.
    pub alpha: f64,
    pub ecn: Ecn,
    pub int: bool,
    /// The QPs' local ACK timeout exponent (4.096 µs × 2^t).
    pub qp_timeout: u8,
    /// Stop at this simulated time even if flows remain.
    pub until: Ps,
    /// Queue-length sampling period (0: off).
    pub sample: Ps,
    /// Period of the PFC deadlock check (0: off).
    pub deadlock_check: Ps,
    pub failures: Vec<Failure>,
    /// Print a progress line to stderr every wall-clock second.
    pub progress: bool,
    /// Congestion control on every QP (its reaction point starts at the
    /// host's link rate).
    pub cc: CcConfig,
    /// Every packet crossing a link is lost with this probability (random
    /// loss, as a bad cable or an optics fault gives; seeded): IRN's
    /// goodput-against-loss experiment.
    pub link_loss: f64,
    /// The hosts offer and accept selective repeat (the endpoint default);
    /// off, every QP recovers by go-back-N.
    pub selective_repeat: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 1,
            mtu: 1024,
            pfc: true,
            buffer: 32_000_000,
            alpha: 1.0,
            ecn: Ecn::Hpcc,
            int: false,
            qp_timeout: 14,
            until: 10 * PS_PER_S,
            sample: 10 * PS_PER_US,
            deadlock_check: 100 * PS_PER_US,
            failures: Vec::new(),
            progress: false,
            cc: CcConfig::None,
            link_loss: 0.0,
            selective_repeat: true,
        }
    }
}

/// Frames a host NIC holds while its data class is paused (its transmit
/// buffer): enough that the control packets behind them get out during a
/// pause, few enough that a paused host does not drain its QPs' windows
/// into the NIC (64 frames, 256 KB at MTU 4096).
const STAGED_MAX: usize = 64;

/// QPs per simulated host: a QP pair per flow, so this many flows may be
/// active on one host at once (QPNs are 24 bits; the core allocates QP
/// slots as they are used).
pub const MAX_QP: u32 = 1 << 20;

/// Runs with at most this many flows sample every flow's delivered bytes.
pub const GOODPUT_FLOWS: usize = 64;

/// Bytes a RoCEv2 packet adds below its UDP payload: UDP 8, IPv4 20,
/// Ethernet 14 and FCS 4.
pub const FRAME_OVERHEAD: u32 = 46;
/// Preamble, start delimiter and inter-frame gap: wire time, not buffer.
pub const WIRE_GAP: u32 = 20;
/// HPCC's INT header: 5 hops × 8 bytes + 2.
pub const INT_BYTES: u32 = 42;
/// Most transport header bytes a packet carries (BTH + RETH/AtomicETH +
/// ImmDt; inline payload is off in simulated QPs).
const HEAD_MAX: usize = 64;
const MEM_BASE: u64 = 0x1_0000;
const MEM_LEN: u64 = 1 << 40;
const PFC_QUANTA: u64 = 65535;
const RESERVE: u64 = 4_000;
const RESUME_OFFSET: u64 = 3_000;
const CTRL: usize = 0;
const DATA: usize = 1;

/// Memory that stores nothing: the simulator moves lengths, not bytes.
#[derive(Debug, Default)]
pub struct NullMemory;

impl Memory for NullMemory {
    fn read(&self, _addr: u64, out: &mut [u8]) {
        out.fill(0);
    }
    fn write(&mut self, _addr: u64, _data: &[u8]) {}
    fn compare_swap(&mut self, _addr: u64, _compare: u64, _swap: u64) -> u64 {
        0
    }
    fn fetch_add(&mut self, _addr: u64, _add: u64) -> u64 {
        0
    }
    fn store_u64(&mut self, _addr: u64, _bytes: [u8; 8]) {}
    fn read_checked(&self, _addr: u64, out: &mut [u8]) -> Result<(), Fault> {
        out.fill(0);
        Ok(())
    }
    fn write_checked(&mut self, _addr: u64, _data: &[u8]) -> Result<(), Fault> {
        Ok(())
    }
    fn compare_swap_checked(
        &mut self,
        _addr: u64,
        _compare: u64,
        _swap: u64,
    ) -> Result<u64, Fault> {
        Ok(0)
    }
    fn fetch_add_checked(&mut self, _addr: u64, _add: u64) -> Result<u64, Fault> {
        Ok(0)
    }
    fn store_u64_checked(&mut self, _addr: u64, _bytes: [u8; 8]) -> Result<(), Fault> {
        Ok(())
    }
}

/// One INT hop record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntHop {
    pub qlen: u32,
    pub tx_bytes: u64,
    pub ts: Ps,
    pub rate_gbps: u32,
}

/// What the fabric reads of a packet at every hop (kept small so the
/// packets in flight stay in cache; the transport headers, read only at
/// the receiving host, live apart in `Fabric::heads`).
#[derive(Clone, Copy)]
struct Pkt {
    head_len: u8,
    class: u8,
    ecn: u8,
    int_hops: u8,
    /// UDP payload bytes (RoCE headers, payload, pad, ICRC).
    udp_len: u16,
    /// Buffer bytes (Ethernet frame).
    frame: u16,
    src: u32,
    dst: u32,
    hash: u32,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrive { pkt: u32, node: u32, port: u16 },
    PortFree { node: u32, port: u16 },
    HostTimer { host: u32 },
    FlowStart { flow: u32 },
    Pfc { node: u32, port: u16, quanta: u16 },
    PauseEnd { node: u32, port: u16, gen: u32 },
    PauseRefresh { node: u32, port: u16, gen: u32 },
    Sample,
    DeadlockCheck,
    LinkDown { link: u32 },
}

/// A packet waiting at an egress port.
#[derive(Debug, Clone, Copy)]
struct Queued {
    pkt: u32,
    frame: u16,
    in_port: u16,
}

/// One end of a link. Laid out hot-first (`repr(C)`): what every packet
/// through the port reads and writes fills the first two cache lines, the
/// statistics come after.
#[repr(C)]
struct Port {
    /// Queued packets: (packet, frame bytes, ingress port), so that the
    /// dequeue's accounting need not touch the packet itself.
    q: [VecDeque<Queued>; 2],
    qbytes: [u64; 2],
    busy_until: Ps,
    /// Data class paused until (egress side, set by the peer's PFC frames).
    paused_until: Ps,
    /// Picoseconds per byte when that is a whole number (80 at 100 Gb/s,
    /// 20 at 400 Gb/s), else 0: serialisation without a 128-bit division.
    ps_per_byte: Ps,
    delay: Ps,
    /// When the one live PortFree event of this port fires (events at
    /// other times are stale and ignored).
    free_at: Option<Ps>,
    tx_bytes: u64,
    tx_pkts: u64,
    peer: u32,
    peer_port: u16,
    up: bool,
    xoff: bool,
    // Ingress side (the packets that arrived through this port), switches only.
    ing_bytes: u64,
    hdrm_bytes: u64,
    headroom: u64,
    shift: u32,
    pause_gen: u32,
    /// The live XOFF refresh chain (bumped by each new XOFF and each XON).
    refresh_gen: u32,
    /// Ingress bytes released (dequeued) so far: a deadlock's cycle must
    /// not drain between two checks.
    released: u64,
    /// RED thresholds at this port's rate.
    kmin: u64,
    kmax: u64,
    rate: u64,
    tx_data: u64,
    peak_bytes: u64,
    // Statistics.
    pauses_sent: u64,
    pauses_rcvd: u64,
    /// Total time the data class was paused.
    paused_ps: Ps,
    paused_since: Option<Ps>,
    drops: u64,
    ecn_marks: u64,
}

impl Port {
    fn ser(&self, bytes: u32) -> Ps {
        if self.ps_per_byte != 0 {
            return (bytes as Ps + WIRE_GAP as Ps) * self.ps_per_byte;
        }
        let bits = (bytes as u128 + WIRE_GAP as u128) * 8 * PS_PER_S as u128;
        bits.div_ceil(self.rate as u128) as Ps
    }
    fn paused(&self, now: Ps) -> bool {
        self.paused_until > now
    }
    fn queued(&self) -> u64 {
        self.qbytes[CTRL] + self.qbytes[DATA]
    }
}

struct FlowState {
    req_host: u32,
    resp_host: u32,
    req_qpn: u32,
    resp_qpn: u32,
    started: Option<Ps>,
    done: Option<Ps>,
    status: Option<WcStatus>,
    deps_left: u32,
    sport: u16,
    /// Payload bytes delivered so far (tracked for runs of few flows):
    /// each PSN's payload once, when it is in order at the receiver.
    rx_bytes: u64,
    /// The PSN of the flow's first data packet (the requester's first:
    /// a WRITE's or SEND's first packet, a READ's first response).
    psn0: u32,
    /// Data packets delivered in order so far (PSN offset expected next).
    rx_next: u32,
    /// Selective repeat: packets received ahead of `rx_next` (PSN offset,
    /// payload bytes), held by the responder until the gap fills.
    rx_ahead: std::collections::BTreeMap<u32, u64>,
}

struct Host {
    node: u32,
    ep: Endpoint,
    cq: CqId,
    pd: PdId,
    lkey: u32,
    rkey: u32,
    gid: [u8; 16],
    timer_at: Option<Ps>,
    /// Data packets taken from the endpoint while the port was paused.
    staged: VecDeque<u32>,
    /// The INT records of the last data packet each QP (by slot) received,
    /// echoed in its next ACK (with `--int`).
    int_rx: Vec<(u8, [IntHop; 5])>,
    qp_flow: Vec<u32>,
    qpn_base: u32,
    ce_rx: u64,
    nic_busy: bool,
}

struct Switch {
    shared_used: u64,
    total_hdrm: u64,
    total_rsrv: u64,
    used: u64,
    rng: ChaCha8Rng,
    salt: u32,
}

/// Where a node's state lives.
#[derive(Clone, Copy)]
enum Role {
    Host(u32),
    Switch(u32),
}

/// Counters of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub events: u64,
    /// Packets that entered a link (one per link crossed).
    pub packet_hops: u64,
    pub drops: u64,
    pub drops_no_route: u64,
    pub drops_link_down: u64,
    /// Packets lost at random on a link (`Config::link_loss`).
    pub drops_random: u64,
    pub pauses: u64,
    pub resumes: u64,
    pub ecn_marks: u64,
    pub ce_received: u64,
    pub cnps: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub seq_naks: u64,
    pub host_tx_packets: u64,
    pub flows_done: u64,
    pub flows_failed: u64,
    /// Flows that failed to start: a host had no QP left.
    pub flows_no_qp: u64,
}

/// A PFC frame as `pfc.txt` logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcEvent {
    pub t: Ps,
    /// The node that sent it, and its port.
    pub node: u32,
    pub port: u16,
    pub pause: bool,
}

/// The outcome of one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowResult {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub size: u64,
    pub start: Ps,
    pub end: Option<Ps>,
    pub status: Option<WcStatus>,
    /// What the flow would take alone: HPCC's base RTT + size with headers
    /// at the host rate.
    pub standalone: Ps,
}

/// A detected PFC deadlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deadlock {
    pub at: Ps,
    /// The cycle, as (switch node, egress port) pairs.
    pub ports: Vec<(u32, u16)>,
}

/// Per-port figures at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct PortReport {
    pub node: u32,
    pub port: u16,
    pub peer: u32,
    pub tier: Option<u8>,
    pub rate: u64,
    pub tx_bytes: u64,
    pub tx_pkts: u64,
    pub peak_bytes: u64,
    pub pauses_sent: u64,
    pub pauses_rcvd: u64,
    pub paused_ps: Ps,
    pub drops: u64,
    pub ecn_marks: u64,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    pub topology: String,
    pub traffic: String,
    pub hosts: usize,
    pub switches: usize,
    pub now: Ps,
    pub wall_s: f64,
    pub counters: Counters,
    pub flows: Vec<FlowResult>,
    pub pfc: Vec<PfcEvent>,
    /// (time, node, port, bytes) of every non-empty switch egress queue at
    /// each sample.
    pub qlen: Vec<(Ps, u32, u16, u64)>,
    pub ports: Vec<PortReport>,
    pub deadlock: Option<Deadlock>,
    pub peak_packets: usize,
    /// (time, flow, payload bytes delivered so far) at each sample, for runs
    /// of at most [`GOODPUT_FLOWS`] flows.
    pub goodput: Vec<(Ps, u32, u64)>,
    /// The sampling period.
    pub sample: Ps,
}

/// The simulator.
pub struct Fabric {
    cfg: Config,
    topo: Topology,
    ends: Vec<Vec<PortEnd>>,
    routes: Routes,
    link_up: Vec<bool>,
    roles: Vec<Role>,
    port_base: Vec<u32>,
    ports: Vec<Port>,
    hosts: Vec<Host>,
    switches: Vec<Switch>,
    traffic: Traffic,
    flows: Vec<FlowState>,
    dependents: Vec<Vec<u32>>,
    queue: Queue<Ev>,
    now: Ps,
    pkts: Vec<Pkt>,
    heads: Vec<[u8; HEAD_MAX]>,
    ints: Vec<[IntHop; 5]>,
    free: Vec<u32>,
    live_pkts: usize,
    peak_pkts: usize,
    counters: Counters,
    pfc_log: Vec<PfcEvent>,
    qlen: Vec<(Ps, u32, u16, u64)>,
    deadlock: Option<Deadlock>,
    /// A cycle seen at the last check, and its ports' packets sent then.
    suspect: Option<(Vec<(u32, u16)>, u64)>,
    flows_left: usize,
    txbuf: Vec<u8>,
    rxbuf: Vec<u8>,
    wc: Vec<Completion>,
    host_rate: u64,
    pub evstats: [u64; 10],
    /// Per-flow delivered bytes are sampled (runs of at most
    /// [`GOODPUT_FLOWS`] flows: the convergence and fairness experiments).
    track_goodput: bool,
    goodput: Vec<(Ps, u32, u64)>,
    /// Draws for `Config::link_loss`.
    loss_rng: ChaCha8Rng,
}

fn gid_of(host: u32) -> [u8; 16] {
    // HPCC's node-to-IP mapping: 11.(id / 256).(id % 256).1.
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12] = 11;
    g[13] = (host >> 8) as u8;
    g[14] = host as u8;
    g[15] = 1;
    g
}

fn host_of(g: &[u8; 16]) -> u32 {
    ((g[13] as u32) << 8) | g[14] as u32
}

/// The IPv4 address of a host as HPCC's `fct.txt` prints it.
pub fn ip_of(host: u32) -> u32 {
    u32::from_be_bytes(gid_of(host)[12..].try_into().expect("4 bytes"))
}

#[inline]
fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: a fixed, portable avalanche.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The UDP source port of a QP's packets: flow entropy from the QP (and
/// host, since every simulated host numbers its QPs alike) in 0xc000..,
/// as RNICs and rxe derive it from the QPN.
fn udp_sport(node: u32, qpn: u32) -> u16 {
    0xc000 | (mix(qpn as u64 ^ ((node as u64) << 24)) & 0x3fff) as u16
}

fn is_control(opcode: u8) -> bool {
    // RC ACKNOWLEDGE, RC ATOMIC ACKNOWLEDGE, CNP.
    matches!(opcode, 0x11 | 0x12 | 0x81)
}

impl Fabric {
    /// Build a run. Fails on an inconsistent topology, traffic or configuration.
    pub fn new(cfg: Config, topo: Topology, traffic: Traffic) -> Result<Fabric, Error> {
        topo.validate()?;
        traffic.validate(&topo)?;
        let mtu = Mtu::from_bytes(cfg.mtu).ok_or_else(|| {
            Error::new(format!(
                "mtu {}: one of 256, 512, 1024, 2048, 4096",
                cfg.mtu
            ))
        })?;
        let _ = mtu;
        if cfg.buffer < 64 * 1024 {
            return Err(Error::new("buffer: at least 64 KB per switch"));
        }
        if !(cfg.alpha > 0.0 && cfg.alpha <= 64.0) {
            return Err(Error::new("alpha: in (0, 64]"));
        }
        if cfg.qp_timeout == 0 || cfg.qp_timeout > 31 {
            return Err(Error::new("qp timeout exponent: 1..=31"));
        }
        if let Ecn::Red { kmin, kmax, pmax } = cfg.ecn {
            if kmin > kmax || !(0.0..=1.0).contains(&pmax) {
                return Err(Error::new("ecn: need kmin ≤ kmax and 0 ≤ pmax ≤ 1"));
            }
        }
        let hosts_n = topo.hosts().count();
        if let Some(h) = topo.hosts().find(|&h| h > 0xffff) {
            return Err(Error::new(format!(
                "host node id {h}: host ids must be below 65536 (their addresses are 11.(id/256).(id%256).1)"
            )));
        }
        if hosts_n > 65536 {
            return Err(Error::new(
                "at most 65536 hosts (their addresses are 11.x.y.1)",
            ));
        }
        if cfg.sample > 0 && cfg.sample < 100 * PS_PER_NS {
            return Err(Error::new("sample: 0 (off) or at least 100ns"));
        }
        let n = topo.kinds.len();
        let switches_n = n - hosts_n;
        if (switches_n as u64) * (hosts_n as u64) > 1 << 28 {
            return Err(Error::new(format!(
                "{switches_n} switches × {hosts_n} hosts: the route table would pass 2^28 entries"
            )));
        }
        let ends = ports(&topo);
        if let Some(node) = ends.iter().position(|e| e.len() > u16::MAX as usize) {
            return Err(Error::new(format!("node {node} has more than 65535 ports")));
        }
        let link_up = vec![true; topo.links.len()];
        let routes = Routes::compute(&topo, &ends, &link_up);
        let mut cfg = cfg;
        if let CcConfig::Hpcc(p) = &mut cfg.cc {
            if !cfg.int {
                return Err(Error::new(
                    "--cc hpcc reads INT: turn on --int so the switches stamp it",
                ));
            }
            // HPCC's T: the largest base RTT in the fabric (from the first
            // host, which in the built-in shapes sees the farthest others).
            p.base_rtt = max_base_rtt(&topo, &ends, &routes, cfg.mtu).max(1);
        }
        let host_rate = topo
            .hosts()
            .map(|h| topo.links[ends[h][0].link].rate_bps)
            .min()
            .unwrap_or(100_000_000_000);
        let mut port_base = Vec::with_capacity(n + 1);
        let mut all_ports = Vec::new();
        for node_ends in &ends {
            port_base.push(all_ports.len() as u32);
            for pe in node_ends {
                let l = &topo.links[pe.link];
                let shift = pfc_shift(l.rate_bps, host_rate);
                let headroom =
                    (3 * l.rate_bps as u128 * l.delay as u128 / 8 / PS_PER_S as u128) as u64;
                all_ports.push(Port {
                    peer: pe.peer as u32,
                    peer_port: pe.peer_port as u16,
                    rate: l.rate_bps,
                    ps_per_byte: if (8 * PS_PER_S).is_multiple_of(l.rate_bps) {
                        8 * PS_PER_S / l.rate_bps
                    } else {
                        0
                    },
                    kmin: match cfg.ecn {
                        Ecn::Off => u64::MAX,
                        Ecn::Hpcc => 4_000 * (l.rate_bps / 1_000_000_000),
                        Ecn::Red { kmin, .. } => kmin,
                    },
                    kmax: match cfg.ecn {
                        Ecn::Off => u64::MAX,
                        Ecn::Hpcc => 16_000 * (l.rate_bps / 1_000_000_000),
                        Ecn::Red { kmax, .. } => kmax,
                    },
                    delay: l.delay,
                    up: true,
                    q: [VecDeque::new(), VecDeque::new()],
                    qbytes: [0; 2],
                    busy_until: 0,
                    free_at: None,
                    paused_until: 0,
                    pause_gen: 0,
                    refresh_gen: 0,
                    released: 0,
                    ing_bytes: 0,
                    hdrm_bytes: 0,
                    headroom: headroom.max(3 * 9000),
                    shift,
                    xoff: false,
                    tx_bytes: 0,
                    tx_pkts: 0,
                    tx_data: 0,
                    peak_bytes: 0,
                    pauses_sent: 0,
                    pauses_rcvd: 0,
                    paused_ps: 0,
                    paused_since: None,
                    drops: 0,
                    ecn_marks: 0,
                });
            }
        }
        port_base.push(all_ports.len() as u32);
        let mut roles = Vec::with_capacity(n);
        let mut hosts = Vec::new();
        let mut switches = Vec::new();
        for (node, k) in topo.kinds.iter().enumerate() {
            match k {
                Kind::Host => {
                    roles.push(Role::Host(hosts.len() as u32));
                    let rate = topo.links[ends[node][0].link].rate_bps;
                    hosts.push(Self::make_host(&cfg, node as u32, rate)?);
                }
                Kind::Switch { .. } => {
                    roles.push(Role::Switch(switches.len() as u32));
                    let (b, e) = (port_base[node] as usize, port_base[node + 1] as usize);
                    let total_hdrm = all_ports[b..e].iter().map(|p| p.headroom).sum();
                    let total_rsrv = RESERVE * (e - b) as u64;
                    if cfg.pfc && total_hdrm + total_rsrv >= cfg.buffer {
                        return Err(Error::new(format!(
                            "switch {node}: its {} ports' headroom and reserve ({} B) exceed the {} B buffer",
                            e - b,
                            total_hdrm + total_rsrv,
                            cfg.buffer
                        )));
                    }
                    let mut key = [0u8; 32];
                    key[..8].copy_from_slice(&cfg.seed.to_le_bytes());
                    key[8..16].copy_from_slice(&(node as u64).to_le_bytes());
                    key[16..20].copy_from_slice(b"swch");
                    switches.push(Switch {
                        shared_used: 0,
                        total_hdrm,
                        total_rsrv,
                        used: 0,
                        rng: ChaCha8Rng::from_seed(key),
                        salt: mix(cfg.seed ^ ((node as u64) << 32)) as u32,
                    });
                }
            }
        }
        let mut dependents = vec![Vec::new(); traffic.flows.len()];
        let mut flows = Vec::with_capacity(traffic.flows.len());
        for (i, f) in traffic.flows.iter().enumerate() {
            for &d in &f.after {
                dependents[d as usize].push(i as u32);
            }
            let (req, resp) = match f.op {
                Op::Read => (f.dst, f.src),
                _ => (f.src, f.dst),
            };
            let role = |n: usize| match roles[n] {
                Role::Host(h) => h,
                Role::Switch(_) => unreachable!("validated: flows are between hosts"),
            };
            flows.push(FlowState {
                req_host: role(req),
                resp_host: role(resp),
                req_qpn: 0,
                resp_qpn: 0,
                started: None,
                done: None,
                status: None,
                deps_left: f.after.len() as u32,
                sport: 0,
                rx_bytes: 0,
                psn0: 0,
                rx_next: 0,
                rx_ahead: Default::default(),
            });
        }
        let flows_left = flows.len();
        let track_goodput = cfg.sample > 0 && flows.len() <= GOODPUT_FLOWS;
        let mut fab = Fabric {
            topo,
            ends,
            routes,
            link_up,
            roles,
            port_base,
            ports: all_ports,
            hosts,
            switches,
            flows,
            dependents,
            queue: Queue::new(),
            now: 0,
            pkts: Vec::new(),
            heads: Vec::new(),
            ints: Vec::new(),
            free: Vec::new(),
            live_pkts: 0,
            peak_pkts: 0,
            counters: Counters::default(),
            pfc_log: Vec::new(),
            qlen: Vec::new(),
            deadlock: None,
            suspect: None,
            flows_left,
            txbuf: vec![0; 4096 + 128],
            rxbuf: vec![0; 4096 + 256],
            loss_rng: {
                let mut key = [0u8; 32];
                key[..8].copy_from_slice(&cfg.seed.to_le_bytes());
                key[16..20].copy_from_slice(b"loss");
                ChaCha8Rng::from_seed(key)
            },
            wc: vec![
                Completion {
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
                64
            ],
            host_rate,
            evstats: [0; 10],
            track_goodput: false,
            goodput: Vec::new(),
            traffic,
            cfg,
        };
        fab.track_goodput = track_goodput;
        let roots: Vec<(usize, Ps)> = fab
            .traffic
            .flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.after.is_empty())
            .map(|(i, f)| (i, f.start))
            .collect();
        for (i, t) in roots {
            fab.push_at(t, Ev::FlowStart { flow: i as u32 });
        }
        let failures = fab.cfg.failures.clone();
        for fl in failures {
            let link = fab
                .topo
                .links
                .iter()
                .position(|l| (l.a, l.b) == (fl.a, fl.b) || (l.a, l.b) == (fl.b, fl.a))
                .ok_or_else(|| Error::new(format!("--fail {}-{}: no such link", fl.a, fl.b)))?;
            fab.push_at(fl.at, Ev::LinkDown { link: link as u32 });
        }
        if fab.cfg.sample > 0 {
            fab.push_at(0, Ev::Sample);
        }
        if fab.cfg.pfc && fab.cfg.deadlock_check > 0 {
            let t = fab.cfg.deadlock_check;
            fab.push_at(t, Ev::DeadlockCheck);
        }
        Ok(fab)
    }

    fn make_host(cfg: &Config, node: u32, line_rate: u64) -> Result<Host, Error> {
        let qpn_base = 0x100;
        let mut ep = Endpoint::new(EndpointConfig {
            max_qp: MAX_QP,
            key_source: KeySource::seeded(cfg.seed ^ mix(node as u64 + 1)),
            qpn_base,
            // The per-destination budget protects a UDP socket buffer; a
            // simulated NIC has none.
            max_inflight_per_dest: u64::MAX,
            port_mtu: Mtu::B4096,
            cc: cfg.cc,
            line_rate,
            selective_repeat: cfg.selective_repeat,
            ..Default::default()
        });
        let pd = ep.alloc_pd();
        // Completions are polled after every event that touches the host,
        // and one event completes at most a work request or two, so the CQ
        // holds a handful at a time; the core allocates a CQ's ring whole
        // (40 bytes a slot), so its depth is much of what a host costs.
        let cq = ep
            .create_cq(64)
            .map_err(|e| Error::new(format!("host {node}: create_cq: {e:?}")))?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let (lkey, rkey) = ep
            .reg_mr(pd, MEM_BASE, MEM_BASE, MEM_LEN, access)
            .map_err(|e| Error::new(format!("host {node}: reg_mr: {e:?}")))?;
        Ok(Host {
            node,
            ep,
            cq,
            pd,
            lkey,
            rkey,
            gid: gid_of(node),
            timer_at: None,
            staged: VecDeque::new(),
            int_rx: Vec::new(),
            qp_flow: Vec::new(),
            qpn_base,
            ce_rx: 0,
            nic_busy: false,
        })
    }

    fn push_at(&mut self, t: Ps, ev: Ev) {
        self.queue.push(t, ev);
    }

    fn alloc_pkt(&mut self, p: Pkt) -> u32 {
        self.live_pkts += 1;
        self.peak_pkts = self.peak_pkts.max(self.live_pkts);
        if let Some(i) = self.free.pop() {
            self.pkts[i as usize] = p;
            if self.cfg.int {
                self.ints[i as usize] = [IntHop::default(); 5];
            }
            i
        } else {
            self.pkts.push(p);
            self.heads.push([0; HEAD_MAX]);
            if self.cfg.int {
                self.ints.push([IntHop::default(); 5]);
            }
            (self.pkts.len() - 1) as u32
        }
    }

    fn free_pkt(&mut self, i: u32) {
        self.live_pkts -= 1;
        self.free.push(i);
    }

    #[inline]
    fn port_id(&self, node: u32, port: u16) -> usize {
        self.port_base[node as usize] as usize + port as usize
    }

    /// Run until every flow is done, the configured end time, or a deadlock.
    pub fn run(&mut self) -> Report {
        let wall = Instant::now();
        let mut last_print = Instant::now();
        let until = self.cfg.until;
        let count_kinds = std::env::var_os("SIM_EVSTATS").is_some();
        while let Some(e) = self.queue.pop() {
            if e.t > until {
                self.now = until;
                break;
            }
            self.now = e.t;
            self.counters.events += 1;
            if cfg!(debug_assertions) || count_kinds {
                let k = match e.ev {
                    Ev::Arrive { .. } => 0,
                    Ev::PortFree { .. } => 1,
                    Ev::HostTimer { .. } => 2,
                    Ev::FlowStart { .. } => 3,
                    Ev::Pfc { .. } => 4,
                    Ev::PauseEnd { .. } => 5,
                    Ev::PauseRefresh { .. } => 6,
                    Ev::Sample => 7,
                    Ev::DeadlockCheck => 8,
                    Ev::LinkDown { .. } => 9,
                };
                self.evstats[k] += 1;
            }
            self.dispatch(e.ev);
            if self.deadlock.is_some() || (self.flows_left == 0 && self.traffic_idle()) {
                break;
            }
            if self.cfg.progress
                && self.counters.events.is_multiple_of(65536)
                && last_print.elapsed().as_secs_f64() >= 1.0
            {
                last_print = Instant::now();
                let w = wall.elapsed().as_secs_f64();
                eprintln!(
                    "sim t={:.3} ms wall={:.1} s events={} ({:.2} M/s) packet-hops={} flows {}/{}",
                    self.now as f64 / PS_PER_MS as f64,
                    w,
                    self.counters.events,
                    self.counters.events as f64 / w / 1e6,
                    self.counters.packet_hops,
                    self.flows.len() - self.flows_left,
                    self.flows.len()
                );
            }
        }
        self.report(wall.elapsed().as_secs_f64())
    }

    /// No packet is in flight or queued anywhere: what the flows sent has
    /// all arrived or been dropped (a UC flow ends at its sender before its
    /// data arrives; the run goes on until it has).
    fn traffic_idle(&self) -> bool {
        self.live_pkts == 0
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive { pkt, node, port } => self.arrive(pkt, node, port),
            Ev::PortFree { node, port } => {
                let pid = self.port_id(node, port);
                if self.ports[pid].free_at != Some(self.now) {
                    return; // stale: the port was restarted by an arrival at the same time
                }
                self.ports[pid].free_at = None;
                match self.roles[node as usize] {
                    Role::Host(h) => {
                        self.hosts[h as usize].nic_busy = false;
                        self.host_after(h);
                    }
                    Role::Switch(_) => self.switch_kick(node, port),
                }
            }
            Ev::HostTimer { host } => {
                let now = self.now;
                let h = &mut self.hosts[host as usize];
                if h.timer_at == Some(now) {
                    h.timer_at = None;
                }
                if h.ep
                    .poll_timeout()
                    .is_some_and(|t| t.saturating_mul(PS_PER_NS) <= now)
                {
                    h.ep.handle_timeout(now / PS_PER_NS);
                }
                self.host_after(host);
            }
            Ev::FlowStart { flow } => self.start_flow(flow),
            Ev::Pfc { node, port, quanta } => self.pfc_arrive(node, port, quanta),
            Ev::PauseEnd { node, port, gen } => {
                let pid = self.port_id(node, port);
                if self.ports[pid].pause_gen == gen && !self.ports[pid].paused(self.now) {
                    self.unpaused(pid);
                    self.kick(node, port);
                }
            }
            Ev::PauseRefresh { node, port, gen } => {
                let pid = self.port_id(node, port);
                // Only the chain of the XOFF now in force refreshes.
                if self.ports[pid].xoff && self.ports[pid].refresh_gen == gen {
                    self.send_pfc(node, port, true);
                }
            }
            Ev::Sample => self.sample(),
            Ev::DeadlockCheck => self.check_deadlock(),
            Ev::LinkDown { link } => self.link_down(link as usize),
        }
    }

    fn kick(&mut self, node: u32, port: u16) {
        match self.roles[node as usize] {
            Role::Host(h) => self.host_kick(h),
            Role::Switch(_) => self.switch_kick(node, port),
        }
    }

    fn start_flow(&mut self, flow: u32) {
        let f = &self.traffic.flows[flow as usize];
        let (op, size) = (f.op, f.size);
        let st = &self.flows[flow as usize];
        let (rq, rs) = (st.req_host, st.resp_host);
        let qp_type = if op == Op::UcWrite {
            QpType::Uc
        } else {
            QpType::Rc
        };
        let mut psn_rng = mix(self.cfg.seed ^ ((flow as u64) << 20) ^ 0x5eed);
        let mut psn = || {
            psn_rng = mix(psn_rng);
            (psn_rng & 0xff_ffff) as u32
        };
        let (p_req, p_resp) = (psn(), psn());
        let mtu = Mtu::from_bytes(self.cfg.mtu).expect("checked in new");
        let timeout = self.cfg.qp_timeout;
        let make = |h: &mut Host| {
            let init = QpInit {
                qp_type,
                pd: h.pd,
                send_cq: h.cq,
                recv_cq: h.cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            };
            h.ep.create_qp(init)
        };
        // A host out of QPs (more than `MAX_QP` flows at once) fails the
        // flow, as an RNIC out of QPs would fail its connection.
        let Ok(qa) = make(&mut self.hosts[rq as usize]) else {
            self.counters.flows_no_qp += 1;
            self.fail_unstarted(flow);
            return;
        };
        let Ok(qb) = make(&mut self.hosts[rs as usize]) else {
            let _ = self.hosts[rq as usize].ep.destroy_qp(qa);
            self.counters.flows_no_qp += 1;
            self.fail_unstarted(flow);
            return;
        };
        let node_a = self.hosts[rq as usize].node;
        let node_b = self.hosts[rs as usize].node;
        for (h, me, me_psn, peer_psn, peer, peer_node) in [
            (rq, qa, p_req, p_resp, qb, node_b),
            (rs, qb, p_resp, p_req, qa, node_a),
        ] {
            let host = &mut self.hosts[h as usize];
            let mut a = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                ..Default::default()
            };
            let init_mask =
                required_mask(QpState::Reset, QpState::Init, qp_type).expect("RESET->INIT");
            host.ep.modify_qp(me, &a, init_mask).expect("RESET->INIT");
            a.qp_state = QpState::Rtr;
            a.path_mtu = mtu;
            a.dest_qp_num = peer;
            a.rq_psn = peer_psn;
            a.max_dest_rd_atomic = 16;
            a.min_rnr_timer = 1;
            a.av.dgid = gid_of(peer_node);
            let m = required_mask(QpState::Init, QpState::Rtr, qp_type).expect("INIT->RTR");
            host.ep.modify_qp(me, &a, m).expect("INIT->RTR");
            a.qp_state = QpState::Rts;
            a.sq_psn = me_psn;
            a.timeout = timeout;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = 16;
            let m = required_mask(QpState::Rtr, QpState::Rts, qp_type).expect("RTR->RTS");
            host.ep.modify_qp(me, &a, m).expect("RTR->RTS");
            let slot = (me - host.qpn_base) as usize;
            if host.qp_flow.len() <= slot {
                host.qp_flow.resize(slot + 1, u32::MAX);
            }
            host.qp_flow[slot] = flow;
        }
        let st = &mut self.flows[flow as usize];
        st.req_qpn = qa;
        st.resp_qpn = qb;
        st.started = Some(self.now);
        st.psn0 = p_req;
        // The UDP source port of the flow's data packets.
        st.sport = if op == Op::Read {
            udp_sport(node_b, qb)
        } else {
            udp_sport(node_a, qa)
        };
        // Post the message.
        let len = size as u32;
        if op == Op::Send {
            let h = &mut self.hosts[rs as usize];
            let sge = [Sge {
                addr: MEM_BASE,
                length: len,
                lkey: h.lkey,
            }];
            h.ep.post_recv(
                qb,
                &RecvWr {
                    wr_id: flow as u64,
                    sgl: &sge,
                },
            )
            .expect("post_recv");
        }
        let rkey = self.hosts[rs as usize].rkey;
        let h = &mut self.hosts[rq as usize];
        let sge = [Sge {
            addr: MEM_BASE,
            length: len,
            lkey: h.lkey,
        }];
        let sop = match op {
            Op::Write | Op::UcWrite => SendOp::Write {
                remote_addr: MEM_BASE,
                rkey,
            },
            Op::Send => SendOp::Send,
            Op::Read => SendOp::Read {
                remote_addr: MEM_BASE,
                rkey,
            },
        };
        let wr = SendWr {
            wr_id: flow as u64,
            op: sop,
            sgl: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        h.ep.post_send(qa, &wr, &NullMemory)
            .expect("post_send of a simulated flow");
        self.host_after(rq);
        self.host_after(rs);
    }

    /// After anything touched a host's endpoint: completions, NIC, timer.
    fn host_after(&mut self, h: u32) {
        // Kick first: `poll_transmit` may complete work (a UC send ends when
        // its last packet leaves) and arm timers, which the next two pick up.
        self.host_kick(h);
        self.poll_completions(h);
        let host = &mut self.hosts[h as usize];
        if let Some(t) = host.ep.poll_timeout() {
            let t = t.saturating_mul(PS_PER_NS).max(self.now);
            if host.timer_at.is_none_or(|at| t < at) {
                host.timer_at = Some(t);
                self.push_at(t, Ev::HostTimer { host: h });
            }
        }
    }

    fn poll_completions(&mut self, h: u32) {
        loop {
            let host = &mut self.hosts[h as usize];
            let n = host
                .ep
                .poll_cq(host.cq, &mut self.wc)
                .expect("the host's CQ exists");
            if n == 0 {
                return;
            }
            for i in 0..n {
                let c = self.wc[i];
                let flow = c.wr_id as u32;
                let Some(st) = self.flows.get(flow as usize) else {
                    continue;
                };
                // Only the requester's completion ends a flow (a SEND's
                // receive completion comes from the responder).
                if st.req_host != h || c.qp_num != st.req_qpn || st.done.is_some() {
                    continue;
                }
                self.finish_flow(flow, c.status);
            }
        }
    }

    /// A flow that could not start: failed now, its dependents released.
    fn fail_unstarted(&mut self, flow: u32) {
        let st = &mut self.flows[flow as usize];
        st.started = Some(self.now);
        st.done = Some(self.now);
        st.status = Some(WcStatus::LocQpOpErr);
        self.flows_left -= 1;
        self.counters.flows_failed += 1;
        self.release_dependents(flow);
    }

    fn release_dependents(&mut self, flow: u32) {
        let now = self.now;
        let deps = std::mem::take(&mut self.dependents[flow as usize]);
        for d in &deps {
            let ds = &mut self.flows[*d as usize];
            ds.deps_left -= 1;
            if ds.deps_left == 0 {
                let t = self.traffic.flows[*d as usize].start.max(now);
                self.push_at(t, Ev::FlowStart { flow: *d });
            }
        }
        self.dependents[flow as usize] = deps;
    }

    fn finish_flow(&mut self, flow: u32, status: WcStatus) {
        let now = self.now;
        let st = &mut self.flows[flow as usize];
        st.done = Some(now);
        st.status = Some(status);
        let (rq, rs, qa, qb) = (st.req_host, st.resp_host, st.req_qpn, st.resp_qpn);
        self.flows_left -= 1;
        if status == WcStatus::Success {
            self.counters.flows_done += 1;
        } else {
            self.counters.flows_failed += 1;
        }
        // A UC flow ends at its requester when the last packet leaves; its
        // data is still in flight, so its QPs stay (and with them the
        // delivered-bytes count) rather than drop what is still arriving.
        if self.traffic.flows[flow as usize].op != Op::UcWrite {
            for (h, q) in [(rq, qa), (rs, qb)] {
                let host = &mut self.hosts[h as usize];
                let slot = (q - host.qpn_base) as usize;
                host.qp_flow[slot] = u32::MAX;
                let _ = host.ep.destroy_qp(q);
            }
        }
        self.release_dependents(flow);
    }

    /// Start the host's NIC on its next packet, if its wire is free.
    fn host_kick(&mut self, h: u32) {
        let node = self.hosts[h as usize].node;
        let pid = self.port_id(node, 0);
        if self.hosts[h as usize].nic_busy || !self.ports[pid].up {
            return;
        }
        let now = self.now;
        let paused = self.ports[pid].paused(now);
        let pkt = loop {
            // Data held by a pause goes first, in order, once it ends.
            if !paused {
                if let Some(p) = self.hosts[h as usize].staged.pop_front() {
                    break p;
                }
            }
            // While paused, the NIC keeps taking packets from the endpoint
            // into its transmit buffer so that ACKs, NAKs and CNPs (which
            // PFC does not pause) get past the held data — up to
            // STAGED_MAX frames, then it waits for the pause to end.
            if self.hosts[h as usize].staged.len() >= STAGED_MAX {
                return;
            }
            let host = &mut self.hosts[h as usize];
            let Some(tx) = host
                .ep
                .poll_transmit(now / PS_PER_NS, &mut self.txbuf, &NullMemory)
            else {
                return;
            };
            let head_len = tx.head_len;
            debug_assert!(
                head_len <= HEAD_MAX,
                "simulated QPs carry no inline payload"
            );
            let hl = head_len.min(HEAD_MAX);
            let udp_len = tx.wire_len();
            let dst = host_of(&tx.dgid);
            let class = if is_control(self.txbuf[0]) {
                CTRL
            } else {
                DATA
            };
            let sport = udp_sport(node, tx.src_qpn);
            let hash =
                mix(((ip_of(node) as u64) << 32 | ip_of(dst) as u64)
                    ^ ((sport as u64) << 17 | 4791)) as u32;
            // An ACK echoes the INT of the last data packet its QP received.
            let echo = if self.cfg.int && class == CTRL {
                let host = &self.hosts[h as usize];
                let slot = tx.src_qpn.wrapping_sub(host.qpn_base) as usize;
                host.int_rx.get(slot).copied().filter(|e| e.0 > 0)
            } else {
                None
            };
            let int_extra = if self.cfg.int && (class == DATA || echo.is_some()) {
                INT_BYTES
            } else {
                0
            };
            self.counters.host_tx_packets += 1;
            let p = self.alloc_pkt(Pkt {
                head_len: hl as u8,
                class: class as u8,
                ecn: if class == DATA { 0b10 } else { 0 },
                int_hops: 0,
                udp_len: udp_len as u16,
                frame: (udp_len as u32 + FRAME_OVERHEAD + int_extra) as u16,
                src: node,
                dst,
                hash,
            });
            self.heads[p as usize][..hl].copy_from_slice(&self.txbuf[..hl]);
            if let Some((n, hops)) = echo {
                self.ints[p as usize] = hops;
                self.pkts[p as usize].int_hops = n;
            }
            if class == DATA && (paused || !self.hosts[h as usize].staged.is_empty()) {
                self.hosts[h as usize].staged.push_back(p);
                continue;
            }
            break p;
        };
        self.hosts[h as usize].nic_busy = true;
        let (frame, data) = {
            let p = &self.pkts[pkt as usize];
            (p.frame as u32, p.class as usize == DATA)
        };
        let end = self.transmit(pid, pkt, frame, data);
        self.ports[pid].free_at = Some(end);
        self.push_at(end, Ev::PortFree { node, port: 0 });
    }

    /// Put `pkt` on the wire of port `pid` now; returns when the wire frees.
    fn transmit(&mut self, pid: usize, pkt: u32, frame: u32, data: bool) -> Ps {
        let now = self.now;
        let p = &mut self.ports[pid];
        p.tx_data += data as u64;
        let ser = p.ser(frame);
        let end = now + ser;
        p.busy_until = end;
        p.tx_bytes += frame as u64;
        p.tx_pkts += 1;
        let (peer, peer_port, delay) = (p.peer, p.peer_port, p.delay);
        self.counters.packet_hops += 1;
        self.push_at(
            end + delay,
            Ev::Arrive {
                pkt,
                node: peer,
                port: peer_port,
            },
        );
        end
    }

    fn arrive(&mut self, pkt: u32, node: u32, port: u16) {
        let pid = self.port_id(node, port);
        if !self.ports[pid].up {
            self.counters.drops_link_down += 1;
            self.free_pkt(pkt);
            return;
        }
        if self.cfg.link_loss > 0.0 && self.loss_rng.random::<f64>() < self.cfg.link_loss {
            self.counters.drops_random += 1;
            self.free_pkt(pkt);
            return;
        }
        match self.roles[node as usize] {
            Role::Host(h) => self.host_receive(h, pkt),
            Role::Switch(s) => self.switch_receive(s, node, port, pkt),
        }
    }

    fn host_receive(&mut self, h: u32, pkt: u32) {
        let p = &self.pkts[pkt as usize];
        let host = &mut self.hosts[h as usize];
        if p.dst != host.node {
            // Misrouted (cannot happen with computed routes): count as a drop.
            self.counters.drops += 1;
            self.free_pkt(pkt);
            return;
        }
        let hl = p.head_len as usize;
        self.rxbuf[..hl].copy_from_slice(&self.heads[pkt as usize][..hl]);
        let len = p.udp_len as usize;
        if self.track_goodput && p.class as usize == DATA && hl >= 12 {
            // Payload delivered to the flow the BTH's QP belongs to, at the
            // host its data goes to. Goodput counts each PSN's payload once,
            // when it is in order: a duplicate (a go-back-N resend of what
            // arrived) adds nothing, nor does a packet past a gap that the
            // receiver discards (go-back-N, UC, READ responses); selective
            // repeat's responder holds such a packet, and it counts when
            // the gap before it fills.
            let qpn = u32::from_be_bytes([0, self.rxbuf[5], self.rxbuf[6], self.rxbuf[7]]);
            let slot = qpn.wrapping_sub(host.qpn_base) as usize;
            if let Some(&f) = host.qp_flow.get(slot) {
                let op = self.traffic.flows.get(f as usize).map(|fl| fl.op);
                if let (Some(st), Some(op)) = (self.flows.get_mut(f as usize), op) {
                    let receiver = if op == Op::Read {
                        st.req_host
                    } else {
                        st.resp_host
                    };
                    if receiver == h {
                        // Minus the ICRC and the BTH's pad count.
                        let pad = ((self.rxbuf[1] >> 4) & 3) as usize;
                        let bytes = (len - hl).saturating_sub(4 + pad) as u64;
                        let psn =
                            u32::from_be_bytes([0, self.rxbuf[9], self.rxbuf[10], self.rxbuf[11]]);
                        let off = psn.wrapping_sub(st.psn0) & 0xff_ffff;
                        let held = self.cfg.selective_repeat && matches!(op, Op::Write | Op::Send);
                        if off == st.rx_next {
                            st.rx_bytes += bytes;
                            st.rx_next += 1;
                            while let Some(b) = st.rx_ahead.remove(&st.rx_next) {
                                st.rx_bytes += b;
                                st.rx_next += 1;
                            }
                        } else if off > st.rx_next && held {
                            st.rx_ahead.entry(off).or_insert(bytes);
                        }
                    }
                }
            }
        }
        if p.ecn == 0b11 {
            host.ce_rx += 1;
            self.counters.ce_received += 1;
        }
        if self.cfg.int && p.int_hops > 0 && hl >= 12 {
            let qpn = u32::from_be_bytes([0, self.rxbuf[5], self.rxbuf[6], self.rxbuf[7]]);
            let n = p.int_hops.min(5);
            let hops = self.ints[pkt as usize];
            if p.class as usize == DATA {
                let slot = qpn.wrapping_sub(host.qpn_base) as usize;
                if slot < MAX_QP as usize {
                    if host.int_rx.len() <= slot {
                        host.int_rx.resize(slot + 1, (0, [IntHop::default(); 5]));
                    }
                    host.int_rx[slot] = (n, hops);
                }
            } else {
                let records: Vec<softrdma_core::cc::IntHop> = hops[..n as usize]
                    .iter()
                    .map(|x| softrdma_core::cc::IntHop {
                        qlen: x.qlen,
                        tx_bytes: x.tx_bytes,
                        ts: x.ts / PS_PER_NS,
                        rate_bps: x.rate_gbps as u64 * 1_000_000_000,
                    })
                    .collect();
                let _ = host.ep.on_int(qpn, self.now / PS_PER_NS, &records);
            }
        }
        let meta = RxMeta {
            sgid: gid_of(p.src),
            dgid: host.gid,
            traffic_class: p.ecn,
            hop_limit: 64,
        };
        host.ep.handle_packet(
            self.now / PS_PER_NS,
            &meta,
            &self.rxbuf[..len],
            &mut NullMemory,
        );
        self.free_pkt(pkt);
        self.host_after(h);
    }

    fn switch_receive(&mut self, s: u32, node: u32, in_port: u16, pkt: u32) {
        let (dst, class, frame, hash) = {
            let p = &self.pkts[pkt as usize];
            (p.dst, p.class as usize, p.frame as u64, p.hash)
        };
        let hops = self.routes.next_hops(node as usize, dst as usize);
        let out = match hops.len() {
            0 => {
                self.counters.drops_no_route += 1;
                self.free_pkt(pkt);
                return;
            }
            1 => hops[0],
            n => {
                let salt = self.switches[s as usize].salt;
                hops[(mix(hash as u64 ^ ((salt as u64) << 32)) % n as u64) as usize]
            }
        };
        let in_pid = self.port_id(node, in_port);
        let out_pid = self.port_id(node, out);
        let buffer = self.cfg.buffer;
        if class == DATA {
            let sw = &self.switches[s as usize];
            if self.cfg.pfc {
                // HPCC's CheckIngressAdmission / UpdateIngressAdmission.
                let ip = &self.ports[in_pid];
                let thr = Self::pfc_threshold(buffer, sw, ip.shift);
                let shared = ip.ing_bytes.saturating_sub(RESERVE);
                if frame + ip.hdrm_bytes > ip.headroom && frame + shared > thr {
                    self.drop(out_pid, pkt);
                    return;
                }
                let new_bytes = ip.ing_bytes + frame;
                let sw = &mut self.switches[s as usize];
                let ip = &mut self.ports[in_pid];
                if new_bytes <= RESERVE {
                    ip.ing_bytes += frame;
                } else if new_bytes - RESERVE > thr {
                    ip.hdrm_bytes += frame;
                } else {
                    ip.ing_bytes += frame;
                    sw.shared_used += frame.min(new_bytes - RESERVE);
                }
                sw.used += frame;
            } else {
                let op = &self.ports[out_pid];
                let limit = (self.cfg.alpha * buffer.saturating_sub(sw.used) as f64) as u64;
                if op.qbytes[DATA] + frame > limit || sw.used + frame > buffer {
                    self.drop(out_pid, pkt);
                    return;
                }
                self.switches[s as usize].used += frame;
            }
        }
        let op = &mut self.ports[out_pid];
        op.q[class].push_back(Queued {
            pkt,
            frame: frame as u16,
            in_port,
        });
        op.qbytes[class] += frame;
        op.peak_bytes = op.peak_bytes.max(op.qbytes[DATA]);
        if class == DATA && self.cfg.pfc {
            self.check_xoff(s, node, in_port);
        }
        self.switch_kick(node, out);
    }

    fn pfc_threshold(buffer: u64, sw: &Switch, shift: u32) -> u64 {
        buffer.saturating_sub(sw.total_hdrm + sw.total_rsrv + sw.shared_used) >> shift
    }

    fn drop(&mut self, out_pid: usize, pkt: u32) {
        self.ports[out_pid].drops += 1;
        self.counters.drops += 1;
        self.free_pkt(pkt);
    }

    fn check_xoff(&mut self, s: u32, node: u32, in_port: u16) {
        let pid = self.port_id(node, in_port);
        let sw = &self.switches[s as usize];
        let p = &self.ports[pid];
        if p.xoff {
            return;
        }
        let thr = Self::pfc_threshold(self.cfg.buffer, sw, p.shift);
        if p.hdrm_bytes > 0 || p.ing_bytes.saturating_sub(RESERVE) >= thr {
            let p = &mut self.ports[pid];
            p.xoff = true;
            p.refresh_gen = p.refresh_gen.wrapping_add(1);
            self.send_pfc(node, in_port, true);
        }
    }

    fn check_xon(&mut self, s: u32, node: u32, in_port: u16) {
        let pid = self.port_id(node, in_port);
        let sw = &self.switches[s as usize];
        let p = &self.ports[pid];
        if !p.xoff || p.hdrm_bytes > 0 {
            return;
        }
        let thr = Self::pfc_threshold(self.cfg.buffer, sw, p.shift);
        let shared = p.ing_bytes.saturating_sub(RESERVE);
        if shared == 0 || shared + RESUME_OFFSET <= thr {
            let p = &mut self.ports[pid];
            p.xoff = false;
            p.refresh_gen = p.refresh_gen.wrapping_add(1);
            self.send_pfc(node, in_port, false);
        }
    }

    /// Send a PFC frame for the data class out of `port` of `node`.
    fn send_pfc(&mut self, node: u32, port: u16, pause: bool) {
        let pid = self.port_id(node, port);
        let p = &mut self.ports[pid];
        if !p.up {
            return;
        }
        let quanta = if pause { PFC_QUANTA as u16 } else { 0 };
        // A 64-byte frame (plus preamble and gap), sent ahead of queued data.
        let at = self.now + p.delay + p.ser(64);
        let (peer, peer_port, gen) = (p.peer, p.peer_port, p.refresh_gen);
        let pause_ps = PFC_QUANTA as u128 * 512 * PS_PER_S as u128 / p.rate as u128;
        if pause {
            p.pauses_sent += 1;
            self.counters.pauses += 1;
        } else {
            self.counters.resumes += 1;
        }
        self.pfc_log.push(PfcEvent {
            t: self.now,
            node,
            port,
            pause,
        });
        self.push_at(
            at,
            Ev::Pfc {
                node: peer,
                port: peer_port,
                quanta,
            },
        );
        if pause {
            self.push_at(
                self.now + (pause_ps / 2) as Ps,
                Ev::PauseRefresh { node, port, gen },
            );
        }
    }

    /// A PFC frame reached the upstream end of a link.
    fn pfc_arrive(&mut self, node: u32, port: u16, quanta: u16) {
        let pid = self.port_id(node, port);
        let now = self.now;
        let p = &mut self.ports[pid];
        if quanta == 0 {
            // `paused_since`, not `paused(now)`: an XON at the very
            // picosecond the pause expires still ends it (its PauseEnd
            // goes stale below).
            let was = p.paused_since.is_some();
            p.paused_until = now;
            p.pause_gen += 1;
            if was {
                self.unpaused(pid);
                self.kick(node, port);
            }
            return;
        }
        p.pauses_rcvd += 1;
        let dur = (quanta as u128 * 512 * PS_PER_S as u128 / p.rate as u128) as Ps;
        p.paused_until = now + dur;
        p.pause_gen += 1;
        if p.paused_since.is_none() {
            p.paused_since = Some(now);
        }
        let gen = p.pause_gen;
        self.push_at(now + dur, Ev::PauseEnd { node, port, gen });
    }

    fn unpaused(&mut self, pid: usize) {
        let now = self.now;
        let p = &mut self.ports[pid];
        if let Some(since) = p.paused_since.take() {
            p.paused_ps += now - since;
        }
    }

    /// Start the next packet of a switch port, if its wire is free.
    fn switch_kick(&mut self, node: u32, port: u16) {
        let pid = self.port_id(node, port);
        let now = self.now;
        let p = &mut self.ports[pid];
        if !p.up {
            return;
        }
        if p.busy_until > now {
            if p.free_at != Some(p.busy_until) && (!p.q[CTRL].is_empty() || !p.q[DATA].is_empty()) {
                let t = p.busy_until;
                p.free_at = Some(t);
                self.push_at(t, Ev::PortFree { node, port });
            }
            return;
        }
        let class = if !p.q[CTRL].is_empty() {
            CTRL
        } else if !p.q[DATA].is_empty() && !p.paused(now) {
            DATA
        } else {
            return;
        };
        let Queued {
            pkt,
            frame,
            in_port,
        } = p.q[class].pop_front().expect("checked non-empty");
        let frame = frame as u64;
        p.qbytes[class] -= frame;
        let qlen = p.qbytes[DATA];
        let rate = p.rate;
        let tx_bytes = p.tx_bytes;
        let Role::Switch(s) = self.roles[node as usize] else {
            unreachable!("switch_kick on a switch")
        };
        if class == DATA {
            self.release(s, node, in_port, frame);
            // RED/ECN at dequeue on the queue the packet leaves behind.
            let (kmin, kmax) = (self.ports[pid].kmin, self.ports[pid].kmax);
            let pmax = match self.cfg.ecn {
                Ecn::Off => 0.0,
                Ecn::Hpcc => 0.2,
                Ecn::Red { pmax, .. } => pmax,
            };
            let pk = &mut self.pkts[pkt as usize];
            if pk.ecn & 1 == 0 && pk.ecn != 0 && qlen > kmin {
                let mark = if qlen >= kmax {
                    true
                } else {
                    let prob = pmax * (qlen - kmin) as f64 / (kmax - kmin).max(1) as f64;
                    self.switches[s as usize].rng.random::<f64>() < prob
                };
                if mark {
                    pk.ecn = 0b11;
                    self.ports[pid].ecn_marks += 1;
                    self.counters.ecn_marks += 1;
                }
            }
            if self.cfg.int {
                let hop = pk.int_hops as usize;
                if hop < 5 {
                    self.ints[pkt as usize][hop] = IntHop {
                        qlen: qlen.min(u32::MAX as u64) as u32,
                        tx_bytes,
                        ts: now,
                        rate_gbps: (rate / 1_000_000_000) as u32,
                    };
                    pk.int_hops += 1;
                }
            }
        }
        let end = self.transmit(pid, pkt, frame as u32, class == DATA);
        let p = &mut self.ports[pid];
        if !p.q[CTRL].is_empty() || !p.q[DATA].is_empty() {
            p.free_at = Some(end);
            self.push_at(end, Ev::PortFree { node, port });
        }
    }

    /// HPCC's RemoveFromIngressAdmission, then the XON check.
    fn release(&mut self, s: u32, node: u32, in_port: u16, frame: u64) {
        let pid = self.port_id(node, in_port);
        let sw = &mut self.switches[s as usize];
        sw.used -= frame;
        if self.cfg.pfc {
            let p = &mut self.ports[pid];
            let from_hdrm = p.hdrm_bytes.min(frame);
            let from_shared = (frame - from_hdrm).min(p.ing_bytes.saturating_sub(RESERVE));
            p.hdrm_bytes -= from_hdrm;
            p.ing_bytes -= frame - from_hdrm;
            p.released += frame;
            sw.shared_used -= from_shared;
            self.check_xon(s, node, in_port);
        }
    }

    fn sample(&mut self) {
        let now = self.now;
        for (node, role) in self.roles.iter().enumerate() {
            if let Role::Switch(_) = role {
                let (b, e) = (
                    self.port_base[node] as usize,
                    self.port_base[node + 1] as usize,
                );
                for (i, p) in self.ports[b..e].iter().enumerate() {
                    let q = p.queued();
                    if q > 0 {
                        self.qlen.push((now, node as u32, i as u16, q));
                    }
                }
            }
        }
        if self.track_goodput {
            for (i, st) in self.flows.iter().enumerate() {
                if st.started.is_some() {
                    self.goodput.push((now, i as u32, st.rx_bytes));
                }
            }
        }
        if self.flows_left > 0 {
            let t = now + self.cfg.sample;
            self.push_at(t, Ev::Sample);
        }
    }

    /// Look for a cycle of paused, non-empty switch egress ports in which
    /// each port's pauser (the next switch) holds packets from it that wait
    /// on the next paused port of the cycle. A cycle seen at two checks in a
    /// row with no packet sent by any of its ports in between is a deadlock.
    fn check_deadlock(&mut self) {
        let now = self.now;
        // Graph over switch egress ports: p -> q when p is paused and
        // non-empty, and q (a port of p's peer switch) is paused, non-empty
        // and holds packets that came in through p's link.
        let n = self.ports.len();
        let mut next: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut any = false;
        for node in 0..self.roles.len() {
            if !matches!(self.roles[node], Role::Switch(_)) {
                continue;
            }
            let (b, e) = (
                self.port_base[node] as usize,
                self.port_base[node + 1] as usize,
            );
            for (pid, p) in self.ports.iter().enumerate().take(e).skip(b) {
                if !p.paused(now) || p.q[DATA].is_empty() {
                    continue;
                }
                let peer = p.peer as usize;
                if !matches!(self.roles[peer], Role::Switch(_)) {
                    continue;
                }
                let (pb, pe) = (
                    self.port_base[peer] as usize,
                    self.port_base[peer + 1] as usize,
                );
                for qid in pb..pe {
                    let q = &self.ports[qid];
                    if q.paused(now) && q.q[DATA].iter().any(|k| k.in_port == p.peer_port) {
                        next[pid].push(qid as u32);
                        any = true;
                    }
                }
            }
        }
        let cycle = if any { find_cycle(&next) } else { None };
        if let Some(c) = cycle {
            let named: Vec<(u32, u16)> = c.iter().map(|&pid| self.name_port(pid)).collect();
            // Progress of the cycle: data its ports sent, and bytes its
            // pausers' ingress ports released (to ports off the cycle too:
            // a cycle that drains that way is slow, not dead).
            let sent: u64 = c
                .iter()
                .map(|&pid| {
                    let p = &self.ports[pid as usize];
                    let ingress = self.port_id(p.peer, p.peer_port);
                    p.tx_data + self.ports[ingress].released
                })
                .sum();
            if let Some((prev, prev_sent)) = self.suspect.take() {
                if prev == named && prev_sent == sent {
                    self.deadlock = Some(Deadlock {
                        at: now,
                        ports: named,
                    });
                    return;
                }
            }
            self.suspect = Some((named, sent));
        } else {
            self.suspect = None;
        }
        if self.flows_left > 0 {
            let t = now + self.cfg.deadlock_check;
            self.push_at(t, Ev::DeadlockCheck);
        }
    }

    fn name_port(&self, pid: u32) -> (u32, u16) {
        let node = self.port_base.partition_point(|&b| b <= pid) - 1;
        (node as u32, (pid - self.port_base[node]) as u16)
    }

    fn link_down(&mut self, link: usize) {
        self.link_up[link] = false;
        let l = self.topo.links[link].clone();
        for (node, other) in [(l.a, l.b), (l.b, l.a)] {
            let port = self.ends[node]
                .iter()
                .position(|pe| pe.link == link && pe.peer == other)
                .expect("the link's ends");
            let pid = self.port_id(node as u32, port as u16);
            let p = &mut self.ports[pid];
            p.up = false;
            let mut queued: Vec<(usize, Queued)> = p.q[CTRL].drain(..).map(|q| (CTRL, q)).collect();
            queued.extend(p.q[DATA].drain(..).map(|q| (DATA, q)));
            p.qbytes = [0; 2];
            for (
                class,
                Queued {
                    pkt: k,
                    frame,
                    in_port,
                },
            ) in queued
            {
                let frame = frame as u64;
                if class == DATA {
                    if let Role::Switch(s) = self.roles[node] {
                        self.release(s, node as u32, in_port, frame);
                    }
                }
                self.counters.drops_link_down += 1;
                self.free_pkt(k);
            }
        }
        self.routes = Routes::compute(&self.topo, &self.ends, &self.link_up);
    }

    fn report(&mut self, wall_s: f64) -> Report {
        if self.track_goodput && self.goodput.last().is_none_or(|g| g.0 < self.now) {
            // A last sample at the end, so the series ends with every
            // delivered byte.
            let now = self.now;
            for (i, st) in self.flows.iter().enumerate() {
                if st.started.is_some() {
                    self.goodput.push((now, i as u32, st.rx_bytes));
                }
            }
        }
        let mut c = self.counters.clone();
        for h in &self.hosts {
            let st = h.ep.stats();
            c.retransmits += st.retransmits;
            c.timeouts += st.timeouts;
            c.seq_naks += st.seq_naks_sent;
            c.cnps += st.cnps_sent;
        }
        let now = self.now;
        for p in &mut self.ports {
            if let Some(since) = p.paused_since.take() {
                p.paused_ps += now.min(p.paused_until) - since.min(now);
            }
        }
        let flows = self
            .traffic
            .flows
            .iter()
            .zip(&self.flows)
            .map(|(f, st)| FlowResult {
                src: f.src as u32,
                dst: f.dst as u32,
                sport: st.sport,
                size: f.size,
                start: st.started.unwrap_or(f.start),
                end: st.done,
                status: st.status,
                standalone: self.standalone(f.src, f.dst, f.size),
            })
            .collect();
        let mut ports = Vec::new();
        for node in 0..self.roles.len() {
            let (b, e) = (
                self.port_base[node] as usize,
                self.port_base[node + 1] as usize,
            );
            for (i, p) in self.ports[b..e].iter().enumerate() {
                ports.push(PortReport {
                    node: node as u32,
                    port: i as u16,
                    peer: p.peer,
                    tier: match self.topo.kinds[node] {
                        Kind::Host => None,
                        Kind::Switch { tier } => Some(tier),
                    },
                    rate: p.rate,
                    tx_bytes: p.tx_bytes,
                    tx_pkts: p.tx_pkts,
                    peak_bytes: p.peak_bytes,
                    pauses_sent: p.pauses_sent,
                    pauses_rcvd: p.pauses_rcvd,
                    paused_ps: p.paused_ps,
                    drops: p.drops,
                    ecn_marks: p.ecn_marks,
                });
            }
        }
        Report {
            topology: self.topo.name.clone(),
            traffic: self.traffic.name.clone(),
            hosts: self.hosts.len(),
            switches: self.switches.len(),
            now,
            wall_s,
            counters: c,
            flows,
            pfc: std::mem::take(&mut self.pfc_log),
            qlen: std::mem::take(&mut self.qlen),
            ports,
            deadlock: self.deadlock.clone(),
            peak_packets: self.peak_pkts,
            goodput: std::mem::take(&mut self.goodput),
            sample: self.cfg.sample,
        }
    }

    /// HPCC's standalone FCT: what the flow takes alone. The base RTT —
    /// propagation both ways and, at each hop's rate, one full data packet
    /// and one ACK — plus the rest of the message at the path's bottleneck
    /// rate, with per-packet headers. Exact on paths of equal rates (the
    /// closed-form test checks the simulator against the same sum).
    fn standalone(&self, src: usize, dst: usize, size: u64) -> Ps {
        let (rates, prop) = self.path(src, dst);
        let mtu = self.cfg.mtu as u64;
        let pkts = size.div_ceil(mtu).max(1);
        // BTH + ICRC + frame overhead and gap per packet, RETH on the first.
        let per = (12 + 4 + FRAME_OVERHEAD + WIRE_GAP) as u64;
        let bytes = size + pkts * per + 16;
        let first = mtu.min(size) + per + 16;
        let ack = (12 + 4 + 4 + FRAME_OVERHEAD + WIRE_GAP) as u64;
        let ser =
            |b: u64, rate: u64| ((b as u128 * 8 * PS_PER_S as u128).div_ceil(rate as u128)) as Ps;
        let bottleneck = rates.iter().copied().min().unwrap_or(self.host_rate);
        let per_hop: Ps = rates.iter().map(|&r| ser(first, r) + ser(ack, r)).sum();
        2 * prop + per_hop + ser(bytes, bottleneck).saturating_sub(ser(first, bottleneck))
    }

    /// Link rates and one-way propagation delay of the first shortest path.
    fn path(&self, src: usize, dst: usize) -> (Vec<u64>, Ps) {
        let pe = self.ends[src][0];
        let mut prop = self.topo.links[pe.link].delay;
        let mut rates = vec![self.topo.links[pe.link].rate_bps];
        if pe.peer == dst {
            return (rates, prop);
        }
        let mut node = pe.peer;
        for _ in 0..64 {
            let nh = self.routes.next_hops(node, dst);
            let Some(&p) = nh.first() else { break };
            let pe = self.ends[node][p as usize];
            prop += self.topo.links[pe.link].delay;
            rates.push(self.topo.links[pe.link].rate_bps);
            if pe.peer == dst {
                break;
            }
            node = pe.peer;
        }
        (rates, prop)
    }
}

/// The largest base RTT from the first host to any other, in ns: two ways
/// of propagation and, per hop at its rate, one full data packet out and one
/// ACK back (HPCC's `T`).
fn max_base_rtt(topo: &Topology, ends: &[Vec<PortEnd>], routes: &Routes, mtu: u32) -> Nanos {
    let Some(src) = topo.hosts().next() else {
        return 0;
    };
    let ser =
        |bytes: u64, rate: u64| (bytes as u128 * 8 * 1_000_000_000).div_ceil(rate as u128) as u64;
    let data = (mtu + 12 + 16 + 4 + FRAME_OVERHEAD + WIRE_GAP + INT_BYTES) as u64;
    let ack = (12 + 4 + 4 + FRAME_OVERHEAD + WIRE_GAP + INT_BYTES) as u64;
    let mut worst = 0;
    for dst in topo.hosts().filter(|&d| d != src) {
        let pe = ends[src][0];
        let l = &topo.links[pe.link];
        let mut rtt = 2 * l.delay / PS_PER_NS + ser(data, l.rate_bps) + ser(ack, l.rate_bps);
        let mut node = pe.peer;
        for _ in 0..64 {
            if node == dst {
                break;
            }
            let Some(&p) = routes.next_hops(node, dst).first() else {
                break;
            };
            let pe = ends[node][p as usize];
            let l = &topo.links[pe.link];
            rtt += 2 * l.delay / PS_PER_NS + ser(data, l.rate_bps) + ser(ack, l.rate_bps);
            node = pe.peer;
        }
        worst = worst.max(rtt);
    }
    worst
}

/// The PFC threshold's shift of a port (α = 2^−shift): 3 at the host
/// rate, one less for each halving it takes to bring the port's rate down
/// to the host rate or below (HPCC's `third.cc`: `while (rate > nic_rate
/// && shift > 0) { shift--; rate /= 2; }`), so a 100G port over 40G hosts
/// gets 1, as a 400G port over 100G hosts does.
fn pfc_shift(rate: u64, host_rate: u64) -> u32 {
    let mut shift = 3;
    let mut rate = rate;
    while rate > host_rate && shift > 0 {
        shift -= 1;
        rate /= 2;
    }
    shift
}

/// A cycle in a directed graph given as adjacency lists, as its vertices
/// (smallest vertex first, so the same cycle is always named the same).
fn find_cycle(next: &[Vec<u32>]) -> Option<Vec<u32>> {
    // Iterative DFS with colours: 0 white, 1 on stack, 2 done.
    let n = next.len();
    let mut colour = vec![0u8; n];
    let mut stack: Vec<(u32, usize)> = Vec::new();
    for start in 0..n {
        if colour[start] != 0 || next[start].is_empty() {
            continue;
        }
        stack.push((start as u32, 0));
        colour[start] = 1;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&w) = next[v as usize].get(*i) {
                *i += 1;
                match colour[w as usize] {
                    0 => {
                        colour[w as usize] = 1;
                        stack.push((w, 0));
                    }
                    1 => {
                        let pos = stack
                            .iter()
                            .position(|&(x, _)| x == w)
                            .expect("on the stack");
                        let mut cyc: Vec<u32> = stack[pos..].iter().map(|&(x, _)| x).collect();
                        let m = cyc
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, &x)| x)
                            .map(|(k, _)| k)
                            .unwrap_or(0);
                        cyc.rotate_left(m);
                        return Some(cyc);
                    }
                    _ => {}
                }
            } else {
                colour[v as usize] = 2;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HPCC's shift per port rate over the host rate: one less per
    /// halving while the rate is still above the host's, so a rate between
    /// two powers of two of the host rate takes the larger step (100G over
    /// 40G hosts: 2.5×, shift 1, not the 2 of a whole doubling).
    #[test]
    fn pfc_shift_follows_hpcc_per_port_rate() {
        let g = 1_000_000_000u64;
        let topo = Topology::from_spec("leafspine:leaves=2,spines=1,hosts=1,rate=40G,fabric=100G")
            .unwrap();
        let traffic = Traffic {
            name: "none".into(),
            flows: Vec::new(),
        };
        let fab = Fabric::new(Config::default(), topo, traffic).unwrap();
        for p in &fab.ports {
            let want = if p.rate == 100 * g { 1 } else { 3 };
            assert_eq!(p.shift, want, "port of {} Gb/s", p.rate / g);
        }
        for (rate, host, shift) in [
            (100, 100, 3),
            (400, 100, 1),
            (200, 100, 2),
            (100, 40, 1),
            (40, 25, 2),
            (25, 10, 1),
            (10, 100, 3),
            (1600, 100, 0),
        ] {
            assert_eq!(pfc_shift(rate * g, host * g), shift, "{rate}G over {host}G");
        }
    }

    #[test]
    fn cycles() {
        let g = vec![vec![1], vec![2], vec![0], vec![]];
        assert_eq!(find_cycle(&g), Some(vec![0, 1, 2]));
        let g = vec![vec![1], vec![2], vec![], vec![1]];
        assert_eq!(find_cycle(&g), None);
    }
}
