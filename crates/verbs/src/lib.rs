//! The softrdma verbs API: what an application uses to do RDMA.
//!
//! The shape is libibverbs' — device, context, protection domain, memory
//! region, completion queue (with completion channel), queue pair, shared
//! receive queue, address handle — with Rust ownership on top:
//!
//! * Handles own their resource and release it on drop; a QP is flushed and
//!   drained before it goes away, so every posted work request completes.
//! * Memory a work request references is never touched after its region is
//!   gone: [`Pd::reg_mr`] takes ownership of the buffer, the core translates
//!   every access of in-flight work through the region table at the moment
//!   of the access, and a dropped region's buffer is freed as soon as its
//!   deregistration returns (work still using it fails with the IBA status).
//!   Every scatter/gather entry is checked against the registered regions
//!   when it is posted, so safe code cannot point the engine at
//!   unregistered memory. [`Pd::reg_mr_raw`] and [`Qp::post_send_unchecked`]
//!   are the `unsafe` tier for callers (such as the C ABI) that manage
//!   lifetimes themselves.
//! * Verbs misuse returns an [`Error`] that names the problem; remote faults
//!   arrive as IBA completion statuses and QP states.
//!
//! Each [`Context`] runs a progress engine (see `engine`) that serves
//! inbound one-sided operations without any call from the application.
//!
//! # Quick start
//!
//! An RDMA WRITE from one device context into another's memory. Here both
//! live in one process on 127.0.0.1; between processes the endpoints travel
//! out of band instead ([`oob::exchange`], or serde), as in the
//! `remote_memory` example.
//!
//! ```
//! use softrdma_verbs::*;
//! use std::time::Duration;
//! # fn main() -> Result<()> {
//! let dev = by_addr("127.0.0.1".parse().unwrap())?;
//! let (a, b) = (Context::open(&dev, &OpenOptions::default())?, Context::open(&dev, &OpenOptions::default())?);
//! let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
//! let (ca, cb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
//! let qa = pa.create_qp(&QpInitAttr::new(QpType::Rc, &ca))?;
//! let qb = pb.create_qp(&QpInitAttr::new(QpType::Rc, &cb))?;
//!
//! // b offers 4 KiB for remote writes; a writes from its own region.
//! let target = pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let src = pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
//! let eb = qb.endpoint().with_regions([target.remote()]);
//! qa.connect(&eb, &ConnectOptions::default())?;
//! qb.connect(&qa.endpoint(), &ConnectOptions::default())?;
//!
//! src.write(0, b"hello, remote memory");
//! qa.write(1, src.slice(0..20)?, eb.regions[0].slice(0..20)?)?;
//! ca.wait(1, Some(Duration::from_secs(10)))?; // Err if it failed
//! let mut got = [0u8; 20];
//! target.read(0, &mut got); // b's application made no call: its device did it
//! assert_eq!(&got, b"hello, remote memory");
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
pub mod aio;
mod buffer;
pub mod cm;
mod connect;
mod device;
mod engine;
pub mod gid;
mod gsi;
mod lane;
mod memory;
pub mod oob;
mod ops;
mod sys;
mod xrc;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

pub use buffer::{Buffer, MrBuf, PageBuf, Plain, RawBuffer, PAGE};
pub use connect::{
    ack_timeout_exponent, rnr_timer_code, ConnectOptions, QpEndpoint, RemoteRegion, RnrRetry,
};
pub use device::{
    by_addr, by_name, devices, for_peer, gid_to_ip, interface_of, ip_to_gid, route_source,
    DeviceInfo,
};
pub use engine::AsyncEvent;
pub use gid::{GidError, GidTable, GID_TBL_LEN};
pub use softrdma_core::cq::CqId;
pub use softrdma_core::mcast::MULTICAST_QPN;
pub use softrdma_core::mr::{MwId, MwType, PdId};
pub use softrdma_core::qp::attr::{AccessFlags, AddressVector, AttrMask, Mtu, QpAttr};
pub use softrdma_core::qp::state::{required_mask, QpState, QpType};
pub use softrdma_core::qp::QpCap;
pub use softrdma_core::stats::Stats;
pub use softrdma_core::wc::{wc_flags, Completion, WcOpcode, WcStatus};
pub use softrdma_core::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
pub use softrdma_core::Error as CoreError;
pub use softrdma_core::RecvCheck;
pub use softrdma_udp::{FaultConfig, PortStats};
pub use xrc::Xrcd;

use buffer::OwnedBuf;
use engine::Engine;
use softrdma_shm::Withdrawal;
use sys::EventFd;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// Verbs misuse or resource limits, from the transport core.
    Verbs(CoreError),
    /// A system call failed (opening a device, waiting on a channel).
    Io(io::Error),
    /// A work request completed with an error status.
    Completion(Completion),
    /// Nothing happened within the time the caller allowed.
    Timeout(&'static str),
    /// The peer turned a connection (or UD service request) down: its
    /// reason and private data ([`cm::connect`], [`cm::resolve_ud`]).
    Rejected(cm::Rejection),
    /// A GID index that names no GID, or one the device does not send
    /// from (an address vector's `sgid_index`).
    Gid(GidError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Verbs(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Completion(c) => write!(
                f,
                "work request {} ({:?}) completed with status {} ({}), vendor error {:#x}",
                c.wr_id, c.opcode, c.status, c.status as u32, c.vendor_err
            ),
            Error::Timeout(what) => write!(f, "timed out waiting for {what}"),
            Error::Rejected(r) => write!(f, "{r}"),
            Error::Gid(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Verbs(e)
    }
}

impl From<Completion> for Error {
    /// A failed completion as an error (`completion.into_result()?`).
    fn from(c: Completion) -> Self {
        Error::Completion(c)
    }
}

impl From<GidError> for Error {
    fn from(e: GidError) -> Self {
        Error::Gid(e)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// The result of a verbs call: the value, or an [`Error`] naming what went wrong.
pub type Result<T> = std::result::Result<T, Error>;

/// Options for opening a device.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Impairments injected on send, for testing recovery.
    pub fault: Option<FaultConfig>,
    /// Capture everything this context sends and receives.
    pub pcap: Option<std::path::PathBuf>,
    /// Path MTU the port reports as active (default 4096).
    pub port_mtu: Option<Mtu>,
    /// The transport (None: as `SOFTRDMA_TRANSPORT` says, see
    /// [`transport_from_env`]).
    pub transport: Option<Transport>,
    /// Congestion control of this context's RC/UC QPs (None: as
    /// `SOFTRDMA_CC` says, see [`cc_from_env`]). With one, everything sent
    /// is ECN-capable (ECT(0)), marked packets are answered with CNPs, and
    /// the QPs' rates follow the algorithm.
    pub cc: Option<softrdma_core::cc::CcConfig>,
    /// Offer and accept selective repeat on this context's RC QPs (None:
    /// as `SOFTRDMA_SR` says, see [`sr_from_env`]; on by default). It is
    /// negotiated per QP, so a peer that does not answer the offer (rxe,
    /// an RNIC) gets go-back-N either way.
    pub selective_repeat: Option<bool>,
}

/// Whether `SOFTRDMA_SR` lets this process offer selective repeat: `1`
/// (or unset) yes, `0` no — go-back-N only, as IBA and rxe do.
pub fn sr_from_env() -> Result<bool> {
    match std::env::var("SOFTRDMA_SR") {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(v) if v.is_empty() || v == "1" => Ok(true),
        Ok(v) if v == "0" => Ok(false),
        Ok(v) => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "SOFTRDMA_SR={v:?}: expected 1 (selective repeat, the default) or 0 (go-back-N)"
            ),
        ))),
        Err(e) => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SOFTRDMA_SR: {e}"),
        ))),
    }
}

/// The line rate congestion control starts at and returns to: what
/// `SOFTRDMA_CC_LINE_RATE` says (bits/s, `G`/`M` suffixes), else 100 Gb/s.
pub const DEFAULT_CC_LINE_RATE: u64 = 100_000_000_000;

/// The congestion control `SOFTRDMA_CC` names: `none` (or unset), `dcqcn`,
/// `dcqcn-nvidia`, `timely`, `timely-patched`, `swift`, `hpcc`, with
/// parameters as `perf --cc` takes them (`timely:seg=16K`).
pub fn cc_from_env() -> Result<softrdma_core::cc::CcConfig> {
    use softrdma_core::cc::CcConfig;
    match std::env::var("SOFTRDMA_CC") {
        Err(std::env::VarError::NotPresent) => Ok(CcConfig::None),
        Ok(v) if v.is_empty() => Ok(CcConfig::None),
        Ok(v) => CcConfig::parse(&v).map_err(|e| {
            Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("SOFTRDMA_CC={v:?}: {e}"),
            ))
        }),
        Err(e) => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SOFTRDMA_CC: {e}"),
        ))),
    }
}

fn cc_line_rate_from_env() -> Result<u64> {
    let Ok(v) = std::env::var("SOFTRDMA_CC_LINE_RATE") else {
        return Ok(DEFAULT_CC_LINE_RATE);
    };
    let bad = || {
        Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SOFTRDMA_CC_LINE_RATE={v:?}: bits/s, e.g. 25G, 400M or 10000000000"),
        ))
    };
    let t = v.trim();
    let (num, mult) = match t.strip_suffix(['G', 'g']) {
        Some(n) => (n, 1e9),
        None => match t.strip_suffix(['M', 'm']) {
            Some(n) => (n, 1e6),
            None => (t, 1.0),
        },
    };
    let r: f64 = num.parse().map_err(|_| bad())?;
    let bps = r * mult;
    if !(1e6..=1e13).contains(&bps) {
        return Err(bad());
    }
    Ok(bps as u64)
}

/// `struct ibv_device_attr`, the parts tools print.
#[derive(Debug, Clone)]
pub struct DeviceAttr {
    /// `fw_ver`: the firmware version; softrdma reports this crate's version.
    pub fw_ver: String,
    /// `node_guid`: the node's GUID, whose big-endian bytes are an EUI-64 built
    /// from the last four bytes of GID 0 (the address, for IPv4).
    pub node_guid: u64,
    /// `sys_image_guid`: the system image GUID; the same as `node_guid`.
    pub sys_image_guid: u64,
    /// `vendor_id`: the IEEE vendor ID; softrdma reports `0x535244` ("SRD").
    pub vendor_id: u32,
    /// `vendor_part_id`: the vendor's part ID (1).
    pub vendor_part_id: u32,
    /// `hw_ver`: the hardware version (0).
    pub hw_ver: u32,
    /// `max_mr_size`: the largest memory region, in bytes, the device
    /// advertises (2 GiB, the largest message).
    pub max_mr_size: u64,
    /// `max_qp`: how many QPs a context may create.
    pub max_qp: u32,
    /// `max_qp_wr`: the most work requests a QP's send or receive queue may
    /// hold (its largest `max_send_wr`/`max_recv_wr`).
    pub max_qp_wr: u32,
    /// `max_sge`: the most scatter/gather entries a send or receive work
    /// request may have.
    pub max_sge: u32,
    /// `max_cq`: how many CQs a context may create.
    pub max_cq: u32,
    /// `max_cqe`: the most completions a CQ may hold (its largest depth).
    pub max_cqe: u32,
    /// `max_mr`: how many memory regions a context may register.
    pub max_mr: u32,
    /// Memory windows per context.
    pub max_mw: u32,
    /// Multicast groups a context may have QPs attached to
    /// (`softrdma_core::mcast`).
    pub max_mcast_grp: u32,
    /// QPs one multicast group may have attached, per context.
    pub max_mcast_qp_attach: u32,
    /// Multicast attachments of a context over all its groups.
    pub max_total_mcast_qp_attach: u32,
    /// `max_pd`: how many protection domains the device advertises a context
    /// may allocate.
    pub max_pd: u32,
    /// `max_qp_rd_atom`: the most RDMA READ and atomic requests a QP may
    /// have outstanding as responder (its largest `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// `max_qp_init_rd_atom`: the most RDMA READ and atomic requests a QP
    /// may have outstanding as initiator (its largest `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// `max_srq`: how many SRQs the device advertises a context may create.
    pub max_srq: u32,
    /// `max_srq_wr`: the most receive work requests an SRQ may hold (its
    /// largest depth).
    pub max_srq_wr: u32,
    /// `max_srq_sge`: the most scatter/gather entries an SRQ's receive work
    /// request may have.
    pub max_srq_sge: u32,
    /// The most bytes a send may carry inline (the largest `ibv_qp_cap`
    /// `max_inline_data`; `ibv_device_attr` has no such field).
    pub max_inline_data: u32,
    /// The largest message a work request may transfer, in bytes
    /// (`ibv_port_attr`'s `max_msg_sz`: 2 GiB).
    pub max_msg_sz: u64,
    /// `atomic_cap` is `IBV_ATOMIC_HCA`: the device executes atomic
    /// operations, atomically among its own accesses.
    pub atomic_cap_hca: bool,
    /// `phys_port_cnt`: how many ports the device has (1).
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`, the parts tools print.
#[derive(Debug, Clone)]
pub struct PortAttr {
    /// `state` is `IBV_PORT_ACTIVE` (always, for an open context).
    pub state_active: bool,
    /// `max_mtu`: the largest path MTU the port supports (4096).
    pub max_mtu: Mtu,
    /// `active_mtu`: the path MTU in use ([`OpenOptions::port_mtu`], 4096 by
    /// default).
    pub active_mtu: Mtu,
    /// `gid_tbl_len`: how many slots the port's GID table has (rxe's 1024;
    /// see [`GidTable`]).
    pub gid_tbl_len: u32,
    /// `lid`: the port's LID; 0, as on every RoCE port.
    pub lid: u16,
    /// Ethernet (RoCE).
    pub link_layer_ethernet: bool,
}

/// The core's limits as every context is configured with them.
struct Limits {
    max_qp: u32,
}

const DEFAULT_LIMITS: Limits = Limits { max_qp: 16384 };

/// What a device reports (`ibv_query_device`); needs no open context.
pub fn device_attr(dev: &DeviceInfo) -> DeviceAttr {
    let g = dev.gid();
    let guid = u64::from_be_bytes([0x02, 0x50, g[12], 0xff, 0xfe, g[13], g[14], g[15]]);
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").to_string(),
        node_guid: guid,
        sys_image_guid: guid,
        vendor_id: 0x0053_5244,
        vendor_part_id: 1,
        hw_ver: 0,
        max_mr_size: softrdma_core::MAX_MSG_SIZE,
        max_qp: DEFAULT_LIMITS.max_qp,
        max_qp_wr: 1 << 14,
        max_sge: softrdma_core::MAX_SGE as u32,
        max_cq: 1024,
        max_cqe: (1 << 22) - 1,
        max_mr: softrdma_core::mr::MAX_MR as u32,
        max_mw: softrdma_core::mr::MAX_MW as u32,
        max_mcast_grp: softrdma_core::mcast::MAX_MCAST_GRP as u32,
        max_mcast_qp_attach: softrdma_core::mcast::MAX_MCAST_QP_ATTACH as u32,
        max_total_mcast_qp_attach: softrdma_core::mcast::MAX_TOTAL_MCAST_QP_ATTACH as u32,
        max_pd: 1 << 16,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_srq: 1024,
        max_srq_wr: 1 << 14,
        max_srq_sge: softrdma_core::MAX_SGE as u32,
        max_inline_data: softrdma_core::MAX_INLINE as u32,
        max_msg_sz: softrdma_core::MAX_MSG_SIZE,
        atomic_cap_hca: true,
        phys_port_cnt: 1,
    }
}

/// Memory keys straight from the operating system's CSPRNG, drawn 64 at a
/// time (one `getrandom` call per 64 keys). The core never reuses a key and
/// redraws collisions, so every bit of a key is random.
fn os_keys() -> softrdma_core::mr::KeySource {
    let mut buf = [0u32; 64];
    let mut left = 0usize;
    softrdma_core::mr::KeySource::new(move || {
        if left == 0 {
            let mut bytes = [0u8; 256];
            // getrandom(2) only fails where no entropy source exists at all;
            // a device with guessable keys must not open then.
            getrandom::fill(&mut bytes).expect("the OS CSPRNG (getrandom) is unavailable");
            for (k, c) in buf.iter_mut().zip(bytes.chunks_exact(4)) {
                *k = u32::from_ne_bytes(c.try_into().expect("4 bytes"));
            }
            left = buf.len();
        }
        left -= 1;
        buf[left]
    })
}

/// Which transport `SOFTRDMA_TRANSPORT` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The default: shared memory to QPs of processes of this user on this
    /// host where it can be used, UDP otherwise.
    Auto,
    /// UDP (RoCEv2) always.
    Udp,
    /// Shared memory required: connecting a QP to a peer it cannot reach
    /// that way fails.
    Shm,
}

/// The transport `SOFTRDMA_TRANSPORT` (`auto`, `udp`, `shm`; unset or
/// empty is `auto`) selects, or an error naming the bad value.
pub fn transport_from_env() -> Result<Transport> {
    match std::env::var("SOFTRDMA_TRANSPORT") {
        Err(std::env::VarError::NotPresent) => Ok(Transport::Auto),
        Ok(v) if v.is_empty() || v == "auto" => Ok(Transport::Auto),
        Ok(v) if v == "udp" => Ok(Transport::Udp),
        Ok(v) if v == "shm" => Ok(Transport::Shm),
        Ok(v) => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SOFTRDMA_TRANSPORT={v:?}: expected auto, udp or shm"),
        ))),
        Err(e) => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SOFTRDMA_TRANSPORT: {e}"),
        ))),
    }
}

/// See [`Context::shm_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// One-sided operations carried out at post, into a peer's memory.
    pub offloaded: u64,
    /// Of those, the ones posted through a QP's lock-free lane (WRITEs,
    /// READs and atomics: see `docs/DESIGN.md`, "The lock-free lane").
    pub lane: u64,
    /// Of those, the ones a QP held back behind requests on the wire and
    /// carried out once those completed (a SEND stream after an RNR, say:
    /// see `docs/DESIGN.md`, "Back from the rings").
    pub after_hold: u64,
    /// Packets a peer on this host refused: it had ended, or broke the
    /// ring's protocol (a full ring loses nothing: see `ring_stalls`).
    pub ring_drops: u64,
    /// Times a peer's full ring held this context's transmission back
    /// until the peer had made room (back-pressure).
    pub ring_stalls: u64,
}

/// An open device: a progress engine on one UDP port.
pub struct Context {
    dev: DeviceInfo,
    eng: Arc<Engine>,
    port_mtu: Mtu,
    /// The port's GID table, as it was when the context opened.
    gids: Arc<GidTable>,
    /// The device's connection manager, started by the first caller.
    cm: std::sync::OnceLock<cm::Cm>,
}

impl Context {
    /// `ibv_open_device`: open `dev` and start its progress engine on its RoCEv2 UDP
    /// port. Fails if `SOFTRDMA_TRANSPORT` names a transport that is not built, if the
    /// port cannot be opened on the device's address, or if the OS random number
    /// generator (which memory keys come from) is unavailable.
    pub fn open(dev: &DeviceInfo, opts: &OpenOptions) -> Result<Context> {
        let transport = opts.transport.map_or_else(transport_from_env, Ok)?;
        let cc = opts.cc.map_or_else(cc_from_env, Ok)?;
        let selective_repeat = opts.selective_repeat.map_or_else(sr_from_env, Ok)?;
        let line_rate = cc_line_rate_from_env()?;
        let port = softrdma_udp::Port::open_with(
            softrdma_udp::PortConfig {
                local: dev.addr,
                port: softrdma_wire::ROCEV2_UDP_PORT,
                batch: 32,
                shared: true,
                fault: opts.fault,
                pcap: opts.pcap.clone(),
            },
            softrdma_udp::PortOptions {
                // ECN-capable transport (ECT(0)) when congestion control can
                // answer a mark: congested queues mark instead of dropping.
                traffic_class: if cc == softrdma_core::cc::CcConfig::None {
                    0
                } else {
                    0b10
                },
                ..Default::default()
            },
        )?;
        let slot = port.slot() as u32;
        let port_mtu = opts.port_mtu.unwrap_or(Mtu::B4096);
        // Keys come from the OS CSPRNG: refuse to open without it rather
        // than hand out guessable keys (the key source then cannot fail).
        getrandom::fill(&mut [0u8; 4]).map_err(|e| {
            Error::Io(io::Error::other(format!(
                "the OS random number generator (getrandom) is unavailable, and memory keys must be unpredictable: {e}"
            )))
        })?;
        // What may be in flight towards one peer: what a receiver's socket
        // buffer holds (ours is the best guess at the peer's; both run the
        // same code on the same kind of host), so many QPs cannot overflow
        // it into go-back-N and retry exhaustion.
        let inflight = (port.rcvbuf() as u64).clamp(256 << 10, 4 << 20);
        let cfg = softrdma_core::EndpointConfig {
            key_source: os_keys(),
            max_inflight_per_dest: inflight,
            max_qp: DEFAULT_LIMITS.max_qp,
            qpn_base: (slot << 16) | 0x100,
            port_mtu,
            cc,
            line_rate,
            selective_repeat,
            ..Default::default()
        };
        let ep = softrdma_core::Endpoint::new(cfg);
        // The shared-memory side: a segment and a listener for peers of
        // this user. Without it (it cannot be set up, or UDP is forced)
        // every connection runs over UDP.
        let shm = match transport {
            Transport::Udp => None,
            t => match softrdma_shm::Host::open(softrdma_shm::Key {
                addr: dev.addr,
                slot: slot as u8,
            }) {
                Ok(h) => Some(h),
                Err(e) if t == Transport::Shm => {
                    return Err(Error::Io(io::Error::new(
                        e.kind(),
                        format!("SOFTRDMA_TRANSPORT=shm: cannot set up shared memory: {e}"),
                    )))
                }
                Err(_) => None,
            },
        };
        Ok(Context {
            dev: dev.clone(),
            eng: Engine::start(ep, port, shm, transport, dev.gid())?,
            port_mtu,
            gids: Arc::new(GidTable::for_addr(dev.addr)),
            cm: std::sync::OnceLock::new(),
        })
    }

    /// The device's connection manager ([`cm`]): started by the first call
    /// (a thread that speaks the CM protocol on QP1), the same one after.
    pub fn connection_manager(&self) -> Result<cm::Cm> {
        if let Some(c) = self.cm.get() {
            return Ok(c.clone());
        }
        let a = cm::Agent::start(
            self.eng.clone(),
            self.dev.gid(),
            self.gid_index(),
            self.dev.addr,
        )?;
        let c = cm::Cm(a);
        match self.cm.set(c.clone()) {
            Ok(()) => Ok(c),
            Err(_) => {
                c.stop();
                Ok(self.cm.get().expect("set by the other caller").clone())
            }
        }
    }

    /// The transport it was opened with ([`Transport::Auto`] unless forced).
    pub fn transport(&self) -> Transport {
        self.eng.transport
    }

    /// Whether QPs of this context can reach QPs of other contexts on this
    /// host through shared memory (not if UDP was forced or shared memory
    /// could not be set up).
    pub fn shares_memory(&self) -> bool {
        self.eng.shm.is_some()
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &DeviceInfo {
        &self.dev
    }

    /// The device's own GID: its address (see [`DeviceInfo::gid`]), at
    /// index [`Context::gid_index`] of the port's table.
    pub fn gid(&self) -> [u8; 16] {
        self.dev.gid()
    }

    /// The index of the device's own GID in the port's table: 0 on an
    /// interface without a MAC (`lo`), else where rxe has that address
    /// (an IPv4 address after the link-local default GID: 1).
    pub fn gid_index(&self) -> u8 {
        self.gids.own_index()
    }

    /// The port's GID table (`ibv_query_gid_table`), laid out as rxe's
    /// over the device's interface (see [`gid`]).
    pub fn gid_table(&self) -> &GidTable {
        &self.gids
    }

    /// `ibv_query_device`: the device's attributes (as [`device_attr`]).
    pub fn query_device(&self) -> DeviceAttr {
        device_attr(&self.dev)
    }

    /// `ibv_query_port` for port 1.
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            state_active: true,
            max_mtu: Mtu::B4096,
            active_mtu: self.port_mtu,
            gid_tbl_len: self.gids.len(),
            lid: 0,
            link_layer_ethernet: true,
        }
    }

    /// `ibv_alloc_pd`: a new protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let id = self.eng.lock().ep.alloc_pd();
        Pd {
            eng: self.eng.clone(),
            id,
            gid: self.gid(),
            gids: self.gids.clone(),
            port_mtu: self.port_mtu,
        }
    }

    /// `ibv_create_comp_channel`: a new completion channel; fails if its eventfd
    /// cannot be created.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                fd: EventFd::new(true)?,
                q: Default::default(),
                change: Default::default(),
                serving: Default::default(),
                owned: Default::default(),
                eng: Arc::downgrade(&self.eng),
            }),
        })
    }

    /// `ibv_create_cq`: a CQ holding `depth` completions (1 to `max_cqe`), its events
    /// going to `channel` if one is given. Fails for a depth out of range or when
    /// `max_cq` CQs exist already.
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let mut st = self.eng.lock();
        if channel.is_some_and(|ch| ch.inner.owned.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(Error::Verbs(CoreError::InvalidArgument(
                "this completion channel belongs to an AsyncCq, which takes every event of it: create the CQ with a channel of its own",
            )));
        }
        let id = st.ep.create_cq(depth)?;
        if let Some(ch) = channel {
            st.channels.insert(id.0, ch.inner.clone());
        }
        let lane = Arc::new(lane::CqLane::new(id));
        st.set_cq_lane(id, Some(lane.clone()));
        Ok(Cq {
            eng: self.eng.clone(),
            id,
            lane,
            channel: channel.cloned(),
            stash: Mutex::new(std::collections::VecDeque::new()),
            stashed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The descriptor that becomes readable when an async event is queued.
    pub fn async_fd(&self) -> RawFd {
        self.eng.async_fd.as_raw_fd()
    }

    /// `ibv_get_async_event` without blocking: the oldest queued event, or `None` if
    /// none is queued (wait for one on [`Context::async_fd`]). Nothing needs acking.
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        let mut st = self.eng.lock();
        let e = st.async_events.pop_front();
        if e.is_some() && st.async_events.is_empty() {
            // The descriptor's counter is non-zero exactly while events
            // are queued (each one queued adds one, under this lock), so
            // this read finds it non-zero and cannot block, whatever mode
            // the application set on the descriptor.
            let _ = self.eng.async_fd.drain();
        }
        e
    }

    /// Drive the device's progress from this thread once (what `poll_cq`
    /// does), for applications that spin on memory instead of a CQ.
    pub fn progress(&self) {
        // Never waits: if another thread owns the device, it is making
        // this progress now.
        self.eng.promise_progress();
        if let Some(mut st) = self.eng.try_lock() {
            let udp = st.any_udp();
            self.eng.app_pass_with(&mut st, true, udp);
        }
    }

    /// Transport and port counters.
    pub fn stats(&self) -> (Stats, PortStats) {
        let st = self.eng.lock();
        let mut s = *st.ep.stats();
        s.offloaded += st.lanes_carried();
        (s, st.port.stats())
    }

    /// Shared-memory counters: one-sided operations carried out at post
    /// (also `Stats::offloaded`), and packets lost to a peer's full ring.
    pub fn shm_stats(&self) -> ShmStats {
        let st = self.eng.lock();
        ShmStats {
            offloaded: st.ep.stats().offloaded + st.lanes_carried(),
            lane: st.lanes_carried(),
            after_hold: st.ep.stats().offloaded_after_hold,
            ring_drops: st.ring_drops,
            ring_stalls: st.ring_stalls,
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(c) = self.cm.get() {
            c.stop();
        }
        self.eng.shutdown();
    }
}

/// A protection domain. A handle: clones name the same domain (which the
/// device keeps for its lifetime, as a PD number is never reused).
#[derive(Clone)]
pub struct Pd {
    eng: Arc<Engine>,
    id: PdId,
    /// The device's GID and active MTU, for the QPs' endpoints.
    gid: [u8; 16],
    /// The port's GID table: which `sgid_index` a QP may name.
    gids: Arc<GidTable>,
    port_mtu: Mtu,
}

/// A registered memory region. It owns its buffer; remote peers may read and
/// write it at any time through the rkey, so the application reads and
/// writes it through copies (`read`/`write`) rather than references.
///
/// Those copies take the device's state lock, under which the engine does
/// every access of its own (placing a packet's payload, reading one onto
/// the wire, an atomic): safe code cannot race with the engine. A remote
/// WRITE is placed packet by packet, each packet under the lock, so a
/// reader sees every packet of it whole or not at all and, RC placing in
/// order, a prefix of the message's packets — as on an RNIC, only the
/// completion (or a flag the peer writes last) says the message is all
/// there.
///
/// A peer process on this host that reaches the region through shared
/// memory (see `softrdma_shm`) writes and reads it without this lock, as an
/// RNIC's DMA does: a copy may then see part of a WRITE in progress, whose
/// last 8 bytes land last. The copies are of raw bytes (no reference to
/// region memory exists while they run), and [`Mr::with_bytes`], which
/// lends references, keeps such peers out while it does.
pub struct Mr {
    eng: Arc<Engine>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    /// Where remote peers and SGEs see the first byte.
    iova: u64,
    len: usize,
    pub(crate) buf: Option<OwnedBuf>,
    /// The region's pages as peers on this host reach them (shared memory).
    share: Option<engine::ShareGuard>,
    /// False once `deregister` has succeeded (`MrBuf::into_buffer`).
    registered: bool,
    /// An implicit region ([`Pd::reg_mr_implicit`]): its bytes may not be
    /// mapped, so [`Mr::read`] and its kin copy them checked.
    checked: bool,
}

impl Pd {
    /// The port's GID table of the context this PD belongs to.
    pub fn gid_table(&self) -> &GidTable {
        &self.gids
    }

    /// The handle the device names the protection domain by.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// Whether `sge` names `[addr, addr + length)` inside a region of this
    /// protection domain, as a local access would need (`ibv_advise_mr`'s
    /// check); an error names what is wrong.
    pub fn check_local(&self, sge: &Sge) -> Result<()> {
        let st = self.eng.lock();
        let bad = |why| Err(Error::Verbs(CoreError::InvalidArgument(why)));
        let Some(m) = st.ep.mrs().get_by_lkey(sge.lkey) else {
            return bad("the SGE's lkey names no registered region");
        };
        if m.pd != self.id {
            return bad("the SGE's lkey is a region of another protection domain");
        }
        let end = sge.addr.checked_add(sge.length as u64);
        if sge.addr < m.iova || end.is_none_or(|e| e > m.iova + m.len) {
            return bad("the SGE's range is outside the region its lkey names");
        }
        Ok(())
    }

    /// Register an owned buffer. Its address is the region's iova.
    pub fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<Mr> {
        self.reg_owned(OwnedBuf::of(buf), access)
    }

    pub(crate) fn reg_owned(&self, buf: OwnedBuf, access: AccessFlags) -> Result<Mr> {
        let addr = buf.ptr() as u64;
        let len = buf.len();
        let mut st = self.eng.lock();
        let (lkey, rkey) = st.ep.reg_mr(self.id, addr, addr, len as u64, access)?;
        let share = st.share_region(lkey);
        drop(st);
        Ok(Mr {
            eng: self.eng.clone(),
            lkey,
            rkey,
            addr,
            iova: addr,
            len,
            buf: Some(buf),
            share,
            registered: true,
            checked: false,
        })
    }

    /// Register memory the caller owns.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes until the
    /// returned region is dropped *and* every work request that used it has
    /// completed.
    pub unsafe fn reg_mr_raw(
        &self,
        addr: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let mut st = self.eng.lock();
        let (lkey, rkey) = st.ep.reg_mr(self.id, iova, addr, len as u64, access)?;
        let share = st.share_region(lkey);
        drop(st);
        Ok(Mr {
            eng: self.eng.clone(),
            lkey,
            rkey,
            addr,
            iova,
            len,
            buf: None,
            share,
            registered: true,
            checked: false,
        })
    }

    /// Register an implicit on-demand region (`ibv_reg_mr(pd, NULL,
    /// SIZE_MAX, IBV_ACCESS_ON_DEMAND | …)`): the process's whole address
    /// space, addressed by SGEs and peers at host addresses ([`Mr::iova`]
    /// and [`Mr::addr`] are 0, [`Mr::len`] is `usize::MAX`). Nothing need
    /// be mapped: every access to it is checked as it happens, and one that
    /// meets memory not mapped (or not writable, for a write) ends as an
    /// access outside a region does — a local protection error for the
    /// local side, a remote access error NAK for a peer's — never as a
    /// fault in this process. It is never moved into shared memory: peers
    /// on this host reach it through packets.
    ///
    /// # Safety
    /// With remote write or atomic access, any peer holding the rkey may
    /// change any writable byte of the process, and local work requests
    /// may name any address: the caller must ensure that no Rust reference
    /// (and nothing that relies on memory not changing under it) covers
    /// memory that such work or such peers write while the region lives;
    /// and memory a peer's atomic may land on must not be unmapped while it
    /// can (an unmapped word is checked for before each atomic, but the
    /// check cannot pin the page).
    pub unsafe fn reg_mr_implicit(&self, access: AccessFlags) -> Result<Mr> {
        let mut st = self.eng.lock();
        let (lkey, rkey) = st.ep.reg_mr_implicit(self.id, access)?;
        drop(st);
        Ok(Mr {
            eng: self.eng.clone(),
            lkey,
            rkey,
            addr: 0,
            iova: 0,
            len: usize::MAX,
            buf: None,
            share: None,
            registered: true,
            checked: true,
        })
    }

    /// `ibv_create_qp`: a QP of this PD as `init` describes, in the RESET state
    /// (bring it up with [`Qp::connect`] or [`Qp::modify`]). Fails if a capacity
    /// exceeds the device's limits or `max_qp` QPs exist already.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        let mut st = self.eng.lock();
        let qpn = st.ep.create_qp(softrdma_core::QpInit {
            qp_type: init.qp_type,
            pd: self.id,
            send_cq: init.send_cq.id,
            recv_cq: init.recv_cq.id,
            srq: init.srq.map(|s| s.id),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        })?;
        st.count_udp(qpn, 1);
        let lane = Arc::new(lane::Lane::new());
        st.set_lane(qpn, Some(lane.clone()));
        Ok(Qp {
            eng: self.eng.clone(),
            qpn,
            pd: self.id,
            qp_type: init.qp_type,
            psn: random_psn(),
            gid: self.gid,
            gids: self.gids.clone(),
            port_mtu: self.port_mtu,
            tgt: None,
            lane,
            rlane: init.recv_cq.lane.clone(),
        })
    }

    /// `ibv_alloc_mw`: a memory window of this PD, bound to a region
    /// later with [`Qp::bind_mw`].
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw> {
        let (id, rkey) = self.eng.lock().ep.alloc_mw(self.id, kind)?;
        Ok(Mw {
            eng: self.eng.clone(),
            id,
            rkey: std::sync::atomic::AtomicU32::new(rkey),
            kind,
        })
    }

    /// `ibv_create_srq`: a shared receive queue of this PD holding `depth` receives of
    /// up to `max_sge` SGEs each; fails if either is 0 or above the device's
    /// `max_srq_wr` or `max_srq_sge`.
    pub fn create_srq(&self, depth: u32, max_sge: u32) -> Result<Srq> {
        let id = self.eng.lock().ep.create_srq(self.id, depth, max_sge)?;
        Ok(Srq {
            eng: self.eng.clone(),
            id,
            xrc: None,
        })
    }
}

/// A send request's SGEs as the core reads them, and room for inline bytes
/// copied out of an implicit region (see `Qp::host_sges`). Nothing is
/// built for a request without inline data (the post path's common case
/// pays no initialisation), and the inline bytes' room only for an
/// implicit region's.
#[derive(Default)]
pub(crate) struct HostSgl {
    sges: Option<[Sge; softrdma_core::MAX_SGE]>,
    bounce: Option<Box<[u8; softrdma_core::MAX_INLINE]>>,
}

impl Mr {
    /// The local key (`ibv_mr.lkey`), for this context's SGEs.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// The remote key (`ibv_mr.rkey`), for peers' RDMA operations on the
    /// region.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The address of the first byte (also its iova for owned buffers).
    ///
    /// For a region whose memory the verbs own ([`Pd::reg_mr`],
    /// [`Pd::alloc_mr`], [`Pd::reg_buf`]) this is where that memory is in
    /// this process, valid for reads and writes of [`Mr::len`] bytes for as
    /// long as the `Mr` lives (sharing with peers on this host keeps the
    /// address). Code that accesses it through raw pointers must never form
    /// references over it: the engine and peers write it at any time, as an
    /// RNIC's DMA does.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Where SGEs and remote peers address the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An SGE for `len` bytes at `offset`.
    ///
    /// # Panics
    /// If the range is not inside the region, as slice indexing does; see
    /// [`Mr::try_sge`] for the error instead.
    #[inline]
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        self.try_sge(offset, len)
            .unwrap_or_else(|e| panic!("Mr::sge({offset}, {len}): {e}"))
    }

    /// An SGE for `len` bytes at `offset`, or an error naming the problem
    /// if the range is not inside the region.
    #[inline]
    pub fn try_sge(&self, offset: usize, len: u32) -> Result<Sge> {
        self.check(offset, len as usize)?;
        Ok(Sge {
            addr: self.iova + offset as u64,
            length: len,
            lkey: self.lkey,
        })
    }

    #[inline]
    fn check(&self, offset: usize, n: usize) -> Result<()> {
        if offset.checked_add(n).is_some_and(|e| e <= self.len) {
            Ok(())
        } else {
            Err(CoreError::InvalidArgument("range outside the memory region").into())
        }
    }

    fn range(&self, offset: usize, n: usize) -> Result<u64> {
        self.check(offset, n)?;
        Ok(self.addr + offset as u64)
    }

    /// Copy out of the region (under the device's state lock: see [`Mr`]).
    ///
    /// # Panics
    /// If the range is not inside the region; see [`Mr::try_read`].
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.try_read(offset, out)
            .unwrap_or_else(|e| panic!("Mr::read({offset}, {} B): {e}", out.len()))
    }

    /// [`Mr::read`], with an error instead of a panic for a range outside
    /// the region.
    pub fn try_read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let a = self.range(offset, out.len())?;
        let st = self.eng.lock();
        if self.checked {
            return softrdma_core::mr::Memory::read_checked(&st.mem, a, out).map_err(|_| {
                CoreError::InvalidArgument("implicit region: the range is not mapped readable")
                    .into()
            });
        }
        // SAFETY: in bounds of this region, which is live while `self` is;
        // the engine touches region memory only under the lock held here,
        // or through a lane (a lane READ's or atomic's result), as a peer
        // process sharing the memory may: it may write these bytes during
        // the copy (as an RNIC's DMA may): the copy is of raw bytes through
        // pointers, no reference to them exists, and any byte value is a
        // valid u8. `out` is the caller's own buffer, not region memory it
        // can reach through `&mut` (region bytes are never handed out as
        // references while peers are let in).
        unsafe { std::ptr::copy_nonoverlapping(a as *const u8, out.as_mut_ptr(), out.len()) }
        Ok(())
    }

    /// Copy into the region (under the device's state lock).
    ///
    /// # Panics
    /// If the range is not inside the region; see [`Mr::try_write`].
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.try_write(offset, data)
            .unwrap_or_else(|e| panic!("Mr::write({offset}, {} B): {e}", data.len()))
    }

    /// [`Mr::write`], with an error instead of a panic for a range outside
    /// the region.
    pub fn try_write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let a = self.range(offset, data.len())?;
        let mut st = self.eng.lock();
        if self.checked {
            return softrdma_core::mr::Memory::write_checked(&mut st.mem, a, data).map_err(|_| {
                CoreError::InvalidArgument("implicit region: the range is not mapped writable")
                    .into()
            });
        }
        // SAFETY: in bounds of this region (checked just now), which is live
        // while `self` is; the engine's own accesses wait for the lock held
        // here; a peer process sharing the memory may touch the same bytes
        // at once (as an RNIC's DMA may), through raw copies of its own, with
        // no reference to them anywhere.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), a as *mut u8, data.len()) }
        Ok(())
    }

    /// Read one byte: for spinning on a flag a remote WRITE sets. Takes no
    /// lock (a spinning reader must not hold the engine off): an atomic
    /// load with acquire ordering, so once it sees the byte a shared-memory
    /// peer's WRITE puts last (see `softrdma_shm`), the rest of that WRITE
    /// is visible too.
    ///
    /// # Panics
    /// If `offset` is not inside the region, or the region is implicit
    /// (whose bytes may not be mapped: [`Mr::read`] and [`Mr::write`] copy
    /// them checked).
    #[inline]
    pub fn read_volatile_u8(&self, offset: usize) -> u8 {
        let a = self
            .range(offset, 1)
            .unwrap_or_else(|e| panic!("Mr::read_volatile_u8({offset}): {e}"));
        assert!(!self.checked, "Mr::read_volatile_u8 on an implicit region");
        // SAFETY: in bounds of this region (checked just now), which is live
        // while `self` is; AtomicU8 has alignment 1 and every bit pattern is
        // valid. Writers (the engine's copies, a peer process's WRITE) store
        // bytes there concurrently, as an RNIC's DMA does under a C
        // program's volatile poll: a one-byte load cannot tear.
        let b = unsafe { &*(a as *const std::sync::atomic::AtomicU8) };
        b.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Store one byte, as [`Mr::read_volatile_u8`] loads one: without the
    /// lock, an atomic store with release ordering — for the flag a
    /// ping-pong sets in its own buffer before it posts that buffer (so the
    /// spinning side of a benchmark is not held off by the engine).
    ///
    /// # Panics
    /// If `offset` is not inside the region, or the region is implicit
    /// (whose bytes may not be mapped: [`Mr::read`] and [`Mr::write`] copy
    /// them checked).
    #[inline]
    pub fn write_volatile_u8(&self, offset: usize, v: u8) {
        let a = self
            .range(offset, 1)
            .unwrap_or_else(|e| panic!("Mr::write_volatile_u8({offset}): {e}"));
        assert!(!self.checked, "Mr::write_volatile_u8 on an implicit region");
        // SAFETY: as for `read_volatile_u8`: in bounds of this live region,
        // a one-byte atomic (alignment 1, any value valid) that no
        // concurrent copy by the engine or a peer can tear.
        let b = unsafe { &*(a as *const std::sync::atomic::AtomicU8) };
        b.store(v, std::sync::atomic::Ordering::Release);
    }

    /// `ibv_rereg_mr` without a new translation: move the region to `pd`
    /// and/or change its access, keeping its lkey and rkey (a peer's rkey
    /// stays good). Work posted or begun before fails as if the region had
    /// been deregistered (see the core's `mr::rereg`). Refused, changing
    /// nothing, while memory windows are bound to it.
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<AccessFlags>) -> Result<()> {
        self.rereg_with(None, pd, access)
    }

    /// `ibv_rereg_mr` with `CHANGE_TRANSLATION` to an owned buffer (its
    /// address is the new iova), and optionally a new PD and access, keeping
    /// the keys. The old buffer, if the region owned one, is freed once the
    /// core has let go of it, which is when this returns. On error the
    /// region is unchanged and `buf` is dropped.
    pub fn rereg_buf(
        &mut self,
        buf: Vec<u8>,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        let buf = OwnedBuf::of(buf);
        let addr = buf.ptr() as u64;
        let t = (addr, buf.len(), addr);
        self.rereg_with(Some((t, Some(buf))), pd, access)
    }

    /// `ibv_rereg_mr` with `CHANGE_TRANSLATION` to memory the caller owns:
    /// `len` bytes at `addr`, seen by peers and SGEs at `iova`.
    ///
    /// # Safety
    /// As for [`Pd::reg_mr_raw`]: `addr..addr+len` stays valid for reads
    /// and writes until the region is dropped or reregistered again *and*
    /// every work request that used it has completed.
    pub unsafe fn rereg_raw(
        &mut self,
        addr: u64,
        len: usize,
        iova: u64,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        self.rereg_with(Some(((addr, len, iova), None)), pd, access)
    }

    #[allow(clippy::type_complexity)]
    fn rereg_with(
        &mut self,
        translation: Option<((u64, usize, u64), Option<OwnedBuf>)>,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        if pd.is_some_and(|p| !Arc::ptr_eq(&p.eng, &self.eng)) {
            return Err(CoreError::InvalidArgument(
                "the new protection domain belongs to another context",
            )
            .into());
        }
        let change = softrdma_core::mr::Rereg {
            pd: pd.map(|p| p.id),
            translation: translation.as_ref().map(|&((addr, len, iova), _)| {
                softrdma_core::mr::Translation {
                    iova,
                    host_addr: addr,
                    len: len as u64,
                }
            }),
            access,
        };
        let mut st = self.eng.lock();
        // Peers must not reach the old registration once the call returns
        // (every access waited for: the pages may be published again).
        st.withdraw(self.rkey, Withdrawal::Pause);
        if let Err(e) = st.ep.rereg_mr(self.lkey, &change) {
            Self::republish(&mut self.share, self.lkey, &mut st);
            return Err(e.into());
        }
        if let Some(((addr, len, iova), buf)) = translation {
            // The core translates nothing through the old registration any
            // more, and no `Transmit` outlives the pass that sent it under
            // this lock: the old buffer can go (as at deregistration),
            // after its pages were moved back.
            drop(self.share.take());
            drop(std::mem::replace(&mut self.buf, buf));
            self.addr = addr;
            self.len = len;
            self.iova = iova;
            self.checked = false;
        }
        if self.share.is_some() {
            Self::republish(&mut self.share, self.lkey, &mut st);
        } else {
            self.share = st.share_region(self.lkey);
        }
        Ok(())
    }
}

impl Mr {
    /// Deregister now; the buffer stays in `self.buf` for the caller.
    /// Refused (changing nothing) while memory windows are bound to it.
    pub(crate) fn deregister(&mut self) -> Result<()> {
        let mut st = self.eng.lock();
        st.withdraw(self.rkey, Withdrawal::Final);
        if let Err(e) = st.ep.dereg_mr(self.lkey) {
            Self::republish(&mut self.share, self.lkey, &mut st);
            return Err(e.into());
        }
        drop(self.share.take());
        self.registered = false;
        Ok(())
    }

    /// Publish the region to peers again, as the core has it now (after a
    /// withdrawal); if it no longer can be, its pages go back to private
    /// memory and peers reach it through the rings.
    /// (Takes the fields, not `self`: callers hold the engine's lock,
    /// which borrows `self.eng`.)
    fn republish(share: &mut Option<engine::ShareGuard>, lkey: u32, st: &mut engine::State) {
        if let Some(g) = share {
            if !st.republish(lkey, g) {
                *share = None;
            }
        }
    }

    /// Keep peers on this host out of the region while the returned guard
    /// lives (they then go through the engine, which waits for the lock
    /// the caller holds), and this context's lanes too, which reach any
    /// region — shared or not — without the lock (they then reopen only
    /// under it): for code that lends the region's bytes as references.
    pub(crate) fn pause_peers<'a>(&'a self, st: &'a mut engine::State) -> PausePeers<'a> {
        if self.share.is_some() {
            // The bytes are lent as references: nobody may be inside.
            st.withdraw(self.rkey, Withdrawal::Pause);
        } else {
            st.close_lanes();
        }
        PausePeers { mr: self, st }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        let mut st = self.eng.lock();
        // Peers on this host first: once this returns none is inside it
        // (but one stopped inside it, whose access lands in the arena once
        // the share below is dropped: `Withdrawal::Final`).
        st.withdraw(self.rkey, Withdrawal::Final);
        match st.ep.dereg_mr(self.lkey) {
            // Once deregistration returns the core never touches the region
            // again (every access of in-flight work translates through the
            // region table), and no `Transmit` outlives the pass that sent
            // it under this lock: the buffer can go at once, after its
            // pages were moved back to private memory.
            Ok(()) => {
                drop(self.share.take());
                drop(self.buf.take())
            }
            // Memory windows are still bound to it: it stays registered
            // (and its buffer alive) until the last of them is deallocated.
            Err(_) => {
                let share = self.share.take();
                if let Some(b) = self.buf.take() {
                    st.orphans.push((self.lkey, Box::new((share, b))));
                } else {
                    st.orphans.push((self.lkey, Box::new(share)));
                }
            }
        }
    }
}

/// See [`Mr::pause_peers`].
pub(crate) struct PausePeers<'a> {
    mr: &'a Mr,
    st: &'a mut engine::State,
}

impl Drop for PausePeers<'_> {
    fn drop(&mut self) {
        if let Some(g) = &self.mr.share {
            self.st.republish(self.mr.lkey, g);
        }
    }
}

/// A memory window (`ibv_mw`): remote access to part of a region, granted
/// and revoked by bind and invalidate operations on the QP's send queue.
///
/// The window is named by its [`MwId`], which no bind changes; deallocation
/// (on drop) goes by it. [`Mw::rkey`] is the rkey as the consumer knows it,
/// what rdma-core's `ibv_mw.rkey` holds on rxe: moved on by each type-1
/// [`Qp::bind_mw`] when the bind is posted (as `ibv_bind_mw` does), and
/// for a type-2 window only by the application ([`Mw::set_rkey`], the
/// analogue of assigning `ibv_inc_rkey`'s result), since a type-2 bind's
/// new key is the application's to choose and to remember.
pub struct Mw {
    eng: Arc<Engine>,
    id: MwId,
    rkey: std::sync::atomic::AtomicU32,
    kind: MwType,
}

/// `ibv_inc_rkey`: the next rkey of a window (its low 8 bits, the
/// consumer's key, moved on by one).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl Mw {
    /// The rkey as the consumer knows it (see [`Mw`]).
    pub fn rkey(&self) -> u32 {
        self.rkey.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Record the window's rkey after a type-2 bind (`mw->rkey =
    /// wr.bind_mw.rkey` in C): only its low 8 bits are taken, the upper 24
    /// being the window's own.
    pub fn set_rkey(&self, rkey: u32) {
        let r = (self.rkey() & !0xff) | (rkey & 0xff);
        self.rkey.store(r, std::sync::atomic::Ordering::Relaxed);
    }

    /// The handle the device names the window by.
    pub fn id(&self) -> MwId {
        self.id
    }

    /// The window's type (`ibv_mw.type`): 1 or 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let mut st = self.eng.lock();
        // By handle: it names the window whatever its binds did to the rkey.
        let _ = st.ep.dealloc_mw(self.id);
        // A region dropped while this window was bound to it can go now.
        st.retry_orphans();
    }
}

/// A bind work request (`IBV_WR_BIND_MW`, or what `ibv_bind_mw` posts) in
/// full, for [`Qp::post_bind_mw`].
#[derive(Clone, Copy)]
pub struct MwBindWr<'a> {
    /// The work request ID the bind's completion reports.
    pub wr_id: u64,
    /// `send_flags`: [`SendFlags::SIGNALED`] for a completion, and so on.
    pub flags: SendFlags,
    /// The rkey the window must have when the bind executes (the bind
    /// completes `MW_BIND_ERR` otherwise, as on rxe); one of the window's.
    pub mw_rkey: u32,
    /// Type 2: the rkey after the bind (its low 8 bits are taken). Type 1:
    /// ignored, the rkey moves on by one ([`inc_rkey`]), as `ibv_bind_mw`
    /// moves it.
    pub new_rkey: u32,
    /// The region, or `None` with `len` 0 to unbind a type-1 window.
    pub mr: Option<&'a Mr>,
    /// Where the window starts, as a byte offset in the region.
    pub offset: u64,
    /// How many bytes the window covers (0, with `mr` `None`, to unbind).
    pub len: u64,
    /// `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`, `ZERO_BASED`
    /// (`LOCAL_WRITE` is accepted and grants nothing).
    pub access: AccessFlags,
}

impl ChannelInner {
    fn queue(&self) -> std::sync::MutexGuard<'_, ChannelQueue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An event was queued for this CQ: make the descriptor readable,
    /// unless a `get_event` of this channel is serving the socket right now
    /// and so takes the event before it sleeps or returns (and signals for
    /// whatever it leaves queued). That waiter is the one the signal would
    /// have been for; skipping it saves a write and a read per event-mode
    /// message.
    ///
    /// Whether one is serving is read under the queue's lock: the waiter
    /// stops counting itself as serving before its next `take`, which
    /// takes that lock, so either that `take` finds this event or this
    /// read sees the waiter gone and signals. Read before the lock, a
    /// waiter could stop serving, find the queue empty and go to sleep on
    /// the descriptor between the read and the push, and the event stayed
    /// queued with the descriptor never readable.
    pub(crate) fn push(&self, cq: u32) {
        let mut q = self.queue();
        q.events.push_back(cq);
        if self.serving.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            self.arm(&mut q);
        }
        self.changed(&mut q);
    }

    /// Queue an event at the front (one taken for another CQ's waiter).
    pub(crate) fn push_front(&self, cq: u32) {
        let mut q = self.queue();
        q.events.push_front(cq);
        self.arm(&mut q);
        self.changed(&mut q);
    }

    /// Take the next event, leaving the descriptor readable exactly while
    /// events remain queued.
    fn take(&self) -> Option<u32> {
        let mut q = self.queue();
        let got = q.events.pop_front();
        if got.is_some() {
            self.changed(&mut q);
        }
        self.settle(&mut q);
        got
    }

    /// Take the first queued event of CQ `cq`, wherever it stands (behind
    /// another CQ's, on a shared channel), as [`ChannelInner::take`] does.
    pub(crate) fn take_for(&self, cq: u32) -> bool {
        let mut q = self.queue();
        let Some(i) = q.events.iter().position(|&c| c == cq) else {
            return false;
        };
        q.events.remove(i);
        self.changed(&mut q);
        self.settle(&mut q);
        true
    }

    /// The queue's count of changes, for [`ChannelInner::wait_change`].
    pub(crate) fn generation(&self) -> u64 {
        self.queue().generation
    }

    /// Sleep until the queue changes after generation `seen` (an event
    /// pushed, or one taken), or `timeout` passes: for a waiter that found
    /// only other CQs' events, which it leaves to their owners.
    pub(crate) fn wait_change(&self, seen: u64, timeout: Option<std::time::Duration>) {
        let q = self.queue();
        let unchanged = |q: &mut ChannelQueue| q.generation == seen;
        let _ = match timeout {
            Some(t) => self
                .change
                .wait_timeout_while(q, t, unchanged)
                .map(|_| ())
                .map_err(|_| ()),
            None => self
                .change
                .wait_while(q, unchanged)
                .map(|_| ())
                .map_err(|_| ()),
        };
    }

    /// After a change of the queue: wake whoever waits for one.
    fn changed(&self, q: &mut ChannelQueue) {
        q.generation = q.generation.wrapping_add(1);
        self.change.notify_all();
    }

    /// After a take: the descriptor readable exactly while events remain
    /// queued.
    fn settle(&self, q: &mut ChannelQueue) {
        if q.events.is_empty() {
            if q.signalled {
                // The counter holds our one write: the read cannot block,
                // whatever mode the application set on the descriptor.
                let _ = self.fd.drain();
                q.signalled = false;
            }
        } else {
            self.arm(q);
        }
    }

    /// Make the descriptor readable if it is not: one write per run of
    /// queued events, under the queue's lock, so that whether the counter
    /// is non-zero is always what `signalled` says.
    fn arm(&self, q: &mut ChannelQueue) {
        if !q.signalled {
            q.signalled = self.fd.signal();
        }
    }
}

/// A channel's queued events, and whether its eventfd counter is non-zero
/// (the descriptor readable): kept together under one lock, so the
/// descriptor is readable exactly while events are queued (but for an
/// event a serving waiter is about to take, see [`ChannelInner::push`]).
#[derive(Default)]
pub(crate) struct ChannelQueue {
    events: std::collections::VecDeque<u32>,
    signalled: bool,
    /// Changes so far (pushes and takes), for waiters of one CQ on a
    /// shared channel (`ChannelInner::wait_change`).
    generation: u64,
}

pub(crate) struct ChannelInner {
    pub fd: EventFd,
    q: Mutex<ChannelQueue>,
    /// Notified at every change of `q`.
    change: std::sync::Condvar,
    /// `get_event` calls of this channel inside `Engine::serve_socket`.
    serving: std::sync::atomic::AtomicU32,
    /// An `aio::AsyncCq` owns the channel: it takes the channel's events
    /// without looking whose they are, so its CQ must be the channel's
    /// only one. Set and read under the engine's lock, where CQs join
    /// channels (`Context::create_cq`).
    pub owned: std::sync::atomic::AtomicBool,
    /// The device whose socket a waiter watches too (weak: the engine's
    /// channel table holds this).
    pub eng: std::sync::Weak<Engine>,
}

/// A completion channel (`ibv_comp_channel`): its fd becomes readable when an
/// armed CQ gets a completion; it works with epoll.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

impl CompChannel {
    /// The channel's descriptor (`ibv_comp_channel.fd`): readable while CQ
    /// events are pending, for epoll or poll.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Wait for the next CQ event (`ibv_get_cq_event`); `None` on timeout.
    /// Works whether the descriptor is blocking or not (the C ABI leaves
    /// that to the application): it reads the eventfd only when the
    /// channel's own write is in it.
    pub fn get_event(&self, timeout: Option<std::time::Duration>) -> Result<Option<CqId>> {
        let deadline = timeout.map(|d| std::time::Instant::now() + d);
        let eng = self.inner.eng.upgrade();
        // Taken before the first sleep, held until this returns.
        let mut sleep = None;
        loop {
            if let Some(c) = self.inner.take() {
                return Ok(Some(CqId(c)));
            }
            // Sleep on the channel and on the device's socket at once, the
            // socket taken from the engine thread meanwhile
            // (`Engine::sleep_on_socket`), and serve what arrives. Waiting
            // for the engine alone costs a chain of two wake-ups — the
            // engine's, then, through the channel, this thread's (on a VM
            // each one to another core is an inter-processor interrupt,
            // 25–40 µs here) — where this costs one, as a blocking socket
            // read does. Not for a zero timeout: that is a poll, not a
            // sleep.
            if let (Some(e), None) = (&eng, &sleep) {
                if deadline.is_none_or(|d| d > std::time::Instant::now()) {
                    sleep = Some(e.sleep_on_socket());
                }
            }
            let mut p = [
                libc::pollfd {
                    fd: self.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: eng.as_ref().map_or(-1, |e| e.sock_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = deadline.map_or(-1, |d| {
                d.saturating_duration_since(std::time::Instant::now())
                    .as_micros()
                    .div_ceil(1000)
                    .min(i32::MAX as u128) as i32
            });
            // SAFETY: two valid pollfds (a negative fd is ignored by poll).
            let r = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
            if p[1].revents & libc::POLLIN != 0 {
                if let Some(e) = &eng {
                    use std::sync::atomic::Ordering::SeqCst;
                    // What the pass queues for this channel, this call
                    // takes next (see `ChannelInner::push`).
                    self.inner.serving.fetch_add(1, SeqCst);
                    e.serve_socket();
                    self.inner.serving.fetch_sub(1, SeqCst);
                }
                continue;
            }
            if r == 0 {
                return Ok(None);
            }
        }
    }
}

/// A completion queue.
pub struct Cq {
    eng: Arc<Engine>,
    id: CqId,
    /// The channel it was created with, for [`Cq::wait`].
    pub(crate) channel: Option<CompChannel>,
    /// Completions [`Cq::wait`] polled while looking for another work
    /// request's; `poll` hands them out first, in order.
    stash: Mutex<std::collections::VecDeque<Completion>>,
    /// Whether `stash` holds anything (written under its lock), so that a
    /// poll takes that lock only when there is something to hand out.
    pub(crate) stashed: std::sync::atomic::AtomicBool,
    /// Completions of lane posts, polled without the engine's lock.
    lane: Arc<lane::CqLane>,
}

impl Cq {
    /// The handle the device names the CQ by (what
    /// [`CompChannel::get_event`] returns).
    pub fn id(&self) -> CqId {
        self.id
    }
    /// How many completions the CQ holds at most (`ibv_cq.cqe`).
    pub fn depth(&self) -> u32 {
        self.eng.lock().ep.cq_depth(self.id).unwrap_or(0)
    }

    /// Change the depth (`ibv_resize_cq`), keeping queued completions; fails
    /// if `depth` is below the number queued or the CQ overflowed. The
    /// device makes progress first (as `poll` does), so work that is done
    /// by now counts as queued, as on an RNIC that completes in the
    /// background.
    pub fn resize(&self, depth: u32) -> Result<()> {
        let mut st = self.eng.lock();
        self.eng.app_pass(&mut st);
        st.close_recvs(Some(self.id));
        st.ep.resize_cq(self.id, depth)?;
        Ok(())
    }

    /// Move completions into `out`; returns how many. Polling also drives
    /// the device's progress from this thread.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut at = 0;
        let (n, quiet) = self.poll_lanes_quiet(out.len(), &mut |c| {
            out[at] = *c;
            at += 1;
        });
        if n > 0 {
            return Ok(n);
        }
        if quiet && self.eng.quiet() {
            return Ok(0);
        }
        self.poll_device(out)
    }

    /// [`Cq::poll`], handing each completion to `f` where it lies instead
    /// of copying it out first (a completion written by a post moments
    /// before, copied and read back at another width, stalls the load on
    /// the store; the C ABI converts each straight into an `ibv_wc`).
    /// `buf` serves the engine's way, which moves completions out of the
    /// core; its length is the most handed over.
    ///
    /// # Panics
    /// If `f` calls into the device (a poll, a post, anything that takes
    /// its lock): completions may be handed to `f` while held for it,
    /// which such a call would wait for forever. Collect what you need in
    /// `f` and act after the call returns.
    pub fn poll_with(
        &self,
        buf: &mut [Completion],
        f: &mut impl FnMut(&Completion),
    ) -> Result<usize> {
        let (n, quiet) = self.poll_lanes_quiet(buf.len(), f);
        if n > 0 {
            return Ok(n);
        }
        if quiet && self.eng.quiet() {
            return Ok(0);
        }
        let n = self.poll_device(buf)?;
        // The same rule for every completion, wherever it came from.
        let _in_poll = crate::buffer::PollFlag::set();
        for c in &buf[..n] {
            f(c);
        }
        Ok(n)
    }

    /// Completions taken without the engine's lock: the stash, then the
    /// lanes' queue; 0 if neither has any (the caller then polls the
    /// engine's way, which never reports an empty CQ that is not).
    ///
    /// Public for a caller with a fast path of its own (the C ABI's
    /// `ibv_poll_cq`), which polls the engine's way ([`Cq::poll_with`])
    /// when this finds nothing. `f` must not call into the device (see
    /// [`Cq::poll_with`]).
    pub fn poll_lanes(&self, max: usize, f: &mut impl FnMut(&Completion)) -> usize {
        self.poll_lanes_quiet(max, f).0
    }

    /// [`Cq::poll_lanes`], and whether it found the CQ empty without the
    /// lock (see `CqLane::poll_quiet`).
    fn poll_lanes_quiet(&self, max: usize, f: &mut impl FnMut(&Completion)) -> (usize, bool) {
        let _in_poll = crate::buffer::PollFlag::set();
        if self.stashed.load(std::sync::atomic::Ordering::Acquire) {
            let mut q = self.stash.lock().unwrap_or_else(|p| p.into_inner());
            if !q.is_empty() {
                let n = max.min(q.len());
                for c in q.drain(..n) {
                    f(&c);
                }
                self.stashed
                    .store(!q.is_empty(), std::sync::atomic::Ordering::Release);
                return (n, false);
            }
        }
        // Completions of lane posts: without the engine's lock.
        // Not while this application holds the socket with no promise to
        // poll again: taking completions hands it back to the engine
        // thread (`took_completions`), which needs the lock.
        if !self.eng.holds_socket_unpromised() {
            self.eng.note_lane_poll();
            return self.lane.poll_quiet(max, f);
        }
        (0, false)
    }

    /// Poll the device's queue, not the stash.
    pub(crate) fn poll_device(&self, out: &mut [Completion]) -> Result<usize> {
        // A poll must not report an empty CQ that is not: verbs' "arm, then
        // poll again" relies on it (an application sleeping on its channel
        // after a false empty poll would wait for an event that already
        // came). So it waits for the lock when another thread holds it —
        // only ever for one pass.
        let mut st = self.eng.lock();
        let mut n = st.ep.poll_cq(self.id, out)?;
        if n == 0 {
            // An armed CQ's poller is about to sleep on its channel: serve
            // what is there without taking the socket from the engine.
            let armed = st.ep.cq_armed(self.id)?;
            let udp = st.cq_uses_udp(self.id.0);
            self.eng.app_pass_with(&mut st, !armed, udp);
            n = st.ep.poll_cq(self.id, out)?;
        }
        if n == out.len() {
            // What the core's CQ holds beyond this poll goes back to the
            // lane queue as the stretch ends (`State::requeue_cq`).
            st.requeue = Some(self.id);
        }
        // The application may go off with its completions and not poll
        // again — unless it is mid-stream: a QP it took them from still
        // has sends in flight over UDP (it polls on for their completions,
        // which their ACKs or responses make), or has receives queued while
        // requests came in for this device since the last such poll (the
        // peer streams SENDs to it). Then the application's thread serves
        // the socket on every poll, and handing it back only wakes the
        // engine thread for the next packet — for a sender, every ACK —
        // preempting whatever runs on the other core: `perf write_bw -b`
        // 79,000 context switches for 3,000 MiB each way, 49,000 kept;
        // `perf write_bw` 64 KiB, a sender alone, alternating runs (four
        // each, /proc/stat): 2.32–2.74 GiB/s at 0.68–0.75 s/GB handing it
        // back, 2.76–3.11 GiB/s at 0.58–0.66 s/GB keeping it. (Before the
        // engine sent in bursts the sender alone did better handing it
        // back, 6 %: its thread, the bottleneck, then also took the ACKs.)
        // A QP with READs or atomics in flight has sends in flight too:
        // their responses, the data of a READ among them, are on their way
        // (`perf read_bw`'s requester: handing the socket back and taking it
        // again cost two `epoll_ctl` per poll that took completions, 10 % of
        // the thread that receives the stream). An application that waits
        // another way arms its CQ (which hands the socket back) or makes no
        // call: the watchdog's next tick takes the socket back (a millisecond
        // at most, the same for every case above).
        let requests = st.ep.stats().requests_rx;
        let streaming = n > 0
            && st.cq_uses_udp(self.id.0)
            && out[..n].iter().any(|c| {
                st.ep.qp(c.qp_num).is_ok_and(|q| {
                    q.sends_outstanding() > 0
                        || (q.recv_queued() > 0 && requests != st.requests_seen)
                })
            });
        if n > 0 {
            st.requests_seen = requests;
        }
        if n > 0 && !streaming {
            self.eng.took_completions(&mut st);
        } else if streaming {
            self.eng.keeps_polling(&mut st);
        }
        Ok(n)
    }

    /// Arm the completion channel for the next (solicited) completion.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let mut st = self.eng.lock();
        st.ep.req_notify_cq(self.id, solicited_only)?;
        // Receives filled without the engine raise no event: the CQ's
        // receive lanes close (what they filled completes into the armed
        // CQ now, and the rest comes through the core).
        st.close_recvs(Some(self.id));
        // About to sleep on the channel: the engine thread serves the socket.
        self.eng.unmask(&mut st);
        Ok(())
    }
}

impl Cq {
    /// Make this CQ's channel its own for an `aio::AsyncCq`: refused if
    /// another CQ shares the channel, and no CQ may join it until
    /// [`Cq::release_channel`]. Under the engine's lock, as `create_cq`.
    #[cfg(feature = "tokio")]
    pub(crate) fn own_channel(&self) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let ch = self
            .channel
            .as_ref()
            .ok_or(Error::Verbs(CoreError::InvalidArgument(
                "AsyncCq needs a CQ created with a completion channel",
            )))?;
        let st = self.eng.lock();
        let shared = st
            .channels
            .iter()
            .any(|(&cq, c)| cq != self.id.0 && Arc::ptr_eq(c, &ch.inner));
        if shared || ch.inner.owned.load(Relaxed) {
            return Err(Error::Verbs(CoreError::InvalidArgument(
                "AsyncCq needs a completion channel of its own: another CQ shares this CQ's channel, and AsyncCq would take that CQ's events",
            )));
        }
        ch.inner.owned.store(true, Relaxed);
        Ok(())
    }

    /// Undo [`Cq::own_channel`].
    #[cfg(feature = "tokio")]
    pub(crate) fn release_channel(&self) {
        if let Some(ch) = &self.channel {
            let _st = self.eng.lock();
            ch.inner
                .owned
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let mut st = self.eng.lock();
        if st.ep.destroy_cq(self.id).is_ok() {
            st.set_cq_lane(self.id, None);
        }
        st.channels.remove(&self.id.0);
    }
}

/// A shared receive queue.
pub struct Srq {
    eng: Arc<Engine>,
    id: u32,
    /// An XRC SRQ: its domain (kept open while the SRQ exists) and CQ.
    xrc: Option<(xrc::XrcdRef, CqId)>,
}

impl Srq {
    /// `ibv_post_srq_recv`: queue a receive for the QPs attached to this SRQ. Every
    /// SGE must lie in a local-writable memory region of the SRQ's protection domain,
    /// checked when posted (see [`Srq::post_recv_deferred`]).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut st = self.eng.lock();
        st.ep.post_srq_recv(self.id, wr)?;
        self.eng.posted_recv(&mut st);
        Ok(())
    }

    /// [`Qp::post_recv_deferred`] for a shared receive queue.
    pub fn post_recv_deferred(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut st = self.eng.lock();
        st.ep.post_srq_recv_with(self.id, wr, RecvCheck::Deferred)?;
        self.eng.posted_recv(&mut st);
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let mut st = self.eng.lock();
        if st.ep.destroy_srq(self.id).is_ok() {
            if let Some((_, cq)) = &self.xrc {
                st.count_udp_cq(cq.0, -1);
            }
        }
    }
}

/// An address handle: where UD sends go (`ibv_ah`). A device sends from its
/// own GID only, so the handle is the destination GID plus the GRH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    /// The destination GID: the peer device's address (see [`ip_to_gid`]).
    pub dgid: [u8; 16],
    /// The GRH traffic class (`ibv_global_route.traffic_class`); 0 by default.
    pub traffic_class: u8,
    /// The GRH hop limit (`ibv_global_route.hop_limit`); 64 by default.
    pub hop_limit: u8,
}

impl Ah {
    /// `ibv_create_ah`: a handle to `dgid`, with traffic class 0 and hop
    /// limit 64.
    pub fn new(dgid: [u8; 16]) -> Ah {
        Ah {
            dgid,
            traffic_class: 0,
            hop_limit: 64,
        }
    }

    /// The destination of a UD send through this handle (`wr.ud`).
    pub fn ud(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            gid: self.dgid,
            remote_qpn,
            remote_qkey,
        }
    }
}

/// `struct ibv_qp_init_attr`.
pub struct QpInitAttr<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where send work requests complete.
    pub send_cq: &'a Cq,
    /// Where receive work requests complete.
    pub recv_cq: &'a Cq,
    /// Take receives from this shared receive queue instead of the QP's own.
    pub srq: Option<&'a Srq>,
    /// Queue depths, SGEs per request, inline bytes.
    pub cap: QpCap,
    /// Every send work request completes, signalled or not.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// A QP of `qp_type` whose sends and receives both complete on `cq`,
    /// with the default capacities (128 requests each way, 4 SGEs, 64
    /// inline bytes) and no SRQ.
    pub fn new(qp_type: QpType, cq: &'a Cq) -> QpInitAttr<'a> {
        QpInitAttr {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A queue pair.
pub struct Qp {
    eng: Arc<Engine>,
    qpn: u32,
    pd: PdId,
    qp_type: QpType,
    /// The PSN [`Qp::connect`] starts sending from (random, 24 bits).
    psn: u32,
    gid: [u8; 16],
    gids: Arc<GidTable>,
    port_mtu: Mtu,
    /// An XRC target QP: the QP itself, shared by every handle
    /// [`Xrcd::open_tgt_qp`] opened on it and destroyed with the last.
    tgt: Option<Arc<xrc::TgtQp>>,
    /// WRITEs, READs and atomics to a peer on this host, without the
    /// engine's lock (see `lane`).
    lane: Arc<lane::Lane>,
    /// Its receive CQ's queue, which holds its receive lane while open
    /// (receives are posted there without the engine's lock).
    rlane: Arc<lane::CqLane>,
}

/// A random 24-bit PSN (from the OS CSPRNG, which `Context::open` checked).
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b[..3]);
    u32::from_le_bytes(b)
}

impl Qp {
    /// The QP number (`ibv_qp.qp_num`) peers address it by.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The QP's transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// `ibv_attach_mcast`: this UD QP also receives the datagrams sent to
    /// multicast group `mgid` (an IPv4-mapped `224.0.0.0/4` or an `ff00::/8`
    /// GID; on RoCEv2 the group is that IP multicast address, joined on the
    /// device's interface the first time a QP of this context attaches).
    /// Attaching twice is a no-op.
    pub fn attach_mcast(&self, mgid: [u8; 16]) -> Result<()> {
        let mut st = self.eng.lock();
        if !st.ep.attach_mcast(self.qpn, mgid)? {
            return Ok(());
        }
        let joined = st
            .port
            .join_group(mgid)
            .and_then(|fd| self.eng.watch_group(fd));
        if let Err(e) = joined {
            let _ = st.ep.detach_mcast(self.qpn, mgid);
            st.port.leave_group(mgid);
            return Err(e.into());
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: undo [`Qp::attach_mcast`]; the group is left
    /// when no QP of this context remains attached.
    pub fn detach_mcast(&self, mgid: [u8; 16]) -> Result<()> {
        let mut st = self.eng.lock();
        if st.ep.detach_mcast(self.qpn, mgid)? {
            st.port.leave_group(mgid);
        }
        Ok(())
    }

    /// The index of its device's own GID: the `sgid_index` its address
    /// vector must name (see [`Context::gid_index`]).
    pub fn gid_index(&self) -> u8 {
        self.gids.own_index()
    }

    /// `ibv_modify_qp`: apply the attributes `mask` selects from `attr`, a state
    /// transition included. Fails, changing nothing, if the transition is not allowed
    /// from the current state, `mask` lacks what it requires (see [`required_mask`]),
    /// or a value is out of range.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        if mask.contains(AttrMask::AV) {
            // The source address comes from the GID the index names, as
            // on rxe; this device sends from its own entry only.
            self.gids.source(attr.av.sgid_index.into())?;
        }
        let to = mask.contains(AttrMask::STATE).then_some(attr.qp_state);
        // Reaching RTR connects an RC/UC QP: if its peer is a context of
        // this user on this host, its one-sided operations go through
        // shared memory from now on.
        let peer = match to {
            Some(QpState::Rtr) if matches!(self.qp_type, QpType::Rc | QpType::Uc) => {
                self.shm_peer(attr, mask)?
            }
            _ => None,
        };
        let mut st = self.eng.lock();
        if to.is_some() {
            // An ACK the last pass deferred may be this QP's, owed for a
            // message the application has already taken: a transition to
            // Error or Reset (rdma_disconnect after the last completion)
            // would drop it, and the peer would retransmit into a QP that
            // no longer answers until its retry count runs out.
            self.eng.flush_deferred(&mut st);
        }
        // What the lanes hold follows from the QP's state and attributes
        // (and its peer, set below): they close first — the send queues'
        // all, and this QP's receive lane (the others depend on their own
        // QP's state alone).
        st.close_send_lanes();
        st.close_recv(self.qpn);
        st.ep.modify_qp(self.qpn, attr, mask)?;
        match to {
            Some(QpState::Rtr) | Some(QpState::Reset) => {
                let d = peer.map(|(peer, remote)| engine::Direct {
                    peer,
                    qps: softrdma_shm::Qps {
                        local: self.qpn,
                        local_gid: self.gid,
                        remote,
                    },
                });
                st.set_direct(self.qpn, d);
            }
            _ => {}
        }
        if matches!(to, Some(QpState::Rtr | QpState::Rts)) {
            // Receives posted before the connection: into its receive lane.
            st.open_recv(self.qpn);
        }
        self.eng.kick(&mut st);
        Ok(())
    }

    /// The peer context on this host that the RTR transition `attr`
    /// connects this QP to, joined through shared memory; None where the
    /// connection runs over UDP. An error only if `SOFTRDMA_TRANSPORT=shm`
    /// demands shared memory and the peer cannot have it.
    fn shm_peer(
        &self,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<Option<(Arc<softrdma_shm::Peer>, u32)>> {
        let forced = self.eng.transport == Transport::Shm;
        let (dgid, dqpn) = {
            let st = self.eng.lock();
            let q = st.ep.qp(self.qpn)?;
            (
                if mask.contains(AttrMask::AV) {
                    attr.av.dgid
                } else {
                    q.attr.av.dgid
                },
                if mask.contains(AttrMask::DEST_QPN) {
                    attr.dest_qp_num
                } else {
                    q.attr.dest_qp_num
                },
            )
        };
        let Some(host) = self.eng.shm.clone() else {
            return Ok(None);
        };
        let key = engine::peer_key(&dgid, dqpn);
        let addr = key.addr;
        match host.connect(key) {
            Ok(p) => Ok(Some((p, dqpn))),
            Err(e) if forced => Err(Error::Io(io::Error::new(
                e.kind(),
                format!(
                    "SOFTRDMA_TRANSPORT=shm: QP {dqpn:#x} at {addr} is not reachable through shared memory: {e}"
                ),
            ))),
            Err(_) => Ok(None),
        }
    }

    /// A UD send to a context on this host goes through shared memory: join
    /// its context first (once per destination, before the engine's lock:
    /// the handshake waits for the peer).
    fn join_ud(&self, wr: &SendWr<'_>) {
        if self.qp_type != QpType::Ud {
            return;
        }
        if let (Some(h), Some(ud)) = (self.eng.shm.as_ref(), wr.ud) {
            h.join_for_ud(engine::peer_key(&ud.gid, ud.remote_qpn));
        }
    }

    /// The transport a UD send from this QP to `dest` takes: `"shm"` if
    /// `dest`'s context is on this host and shares memory with us (joined
    /// now if it was not yet, as the first send would), else `"udp"`.
    pub fn transport_to(&self, dest: &UdDest) -> &'static str {
        let Some(h) = self.eng.shm.as_ref() else {
            return "udp";
        };
        let key = engine::peer_key(&dest.gid, dest.remote_qpn);
        h.join_for_ud(key);
        if h.joined(key).is_some() {
            "shm"
        } else {
            "udp"
        }
    }

    /// The transport this RC or UC QP's traffic takes: `"shm"` once it is
    /// connected to a QP of a context on this host that shares memory with
    /// us (RC's one-sided operations then go straight into the peer's
    /// memory, everything else through rings), else `"udp"`. For UD see
    /// [`Qp::transport_to`].
    pub fn transport(&self) -> &'static str {
        let st = self.eng.lock();
        match st.direct.get((self.qpn & 0xffff) as usize) {
            Some(Some(d)) if d.qps.local == self.qpn && d.peer.alive() => "shm",
            _ => "udp",
        }
    }

    /// Current state and attributes (`ibv_query_qp`).
    pub fn query(&self) -> Result<(QpState, QpAttr, QpCap)> {
        let st = self.eng.lock();
        let q = st.ep.qp(self.qpn)?;
        Ok((q.state, q.attr.clone(), q.cap))
    }

    /// Post a send work request. Every SGE must lie in a memory region of
    /// this QP's protection domain, inline ones included.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        if self.lane_post(wr) {
            return Ok(());
        }
        self.post_send_engine(wr)
    }

    /// [`Qp::post_send`]'s way through the engine, out of line: its frame
    /// (the host SGE list, the guard) cost the lane's posts a prologue
    /// and epilogue each when it was part of `post_send`.
    #[cold]
    #[inline(never)]
    fn post_send_engine(&self, wr: &SendWr<'_>) -> Result<()> {
        self.join_ud(wr);
        let mut st = self.eng.lock();
        let mut host = HostSgl::default();
        let wr = self.host_sges(&st, wr, &mut host)?;
        let done = st.post_send(self.qpn, &wr)?;
        self.eng.posted_send(&mut st, done);
        Ok(())
    }

    /// Carry `wr` out through the QP's lane, without the engine's lock, if
    /// the lane is open and serves it (see `lane`); false: post it the
    /// engine's way. ACKs the last pass deferred for the application's
    /// next call go the engine's way too, which carries them.
    ///
    /// Public for a caller with a fast path of its own (the C ABI's
    /// `ibv_post_send`): false means nothing was done, and the request
    /// goes to [`Qp::post_send`] as any other.
    #[inline]
    pub fn lane_post(&self, wr: &SendWr<'_>) -> bool {
        // Inside `Mr::with_bytes*` the lane must not run: it could write
        // into bytes lent out as a reference. It does not: `pause_peers`
        // closed every lane before the bytes were lent, and lanes open only
        // under the engine's lock, which the lender holds until the loan
        // ends — so such a post finds the lane closed and takes the
        // engine's way, which panics as it says.
        !self.eng.acks_deferred() && self.lane.try_post(wr)
    }

    /// Prefetch, for writing, the line an RDMA WRITE to `remote_addr` under
    /// `rkey` would store into first, if the QP's lane last wrote to that
    /// region of its peer's shared memory (`Lane::one_sge` does it
    /// itself). For a caller with a fast path of its own (the C ABI's
    /// `ibv_post_send`) to call as early as it can: the copy of a WRITE
    /// into a peer that spins on its buffer waits for that line, and
    /// everything before the lane's own prefetch delays it. A hint: it
    /// reads and writes nothing.
    #[inline]
    pub fn prefetch_write(&self, remote_addr: u64, rkey: u32) {
        self.lane.prefetch_target((remote_addr, rkey));
    }

    /// Post several send work requests in order, as `ibv_post_send` posts
    /// a chain: each is checked as [`Qp::post_send`] checks it, posting
    /// stops at the first refused (its index and why, `ibv_post_send`'s
    /// `bad_wr`; the ones before it stay posted), and what was posted goes
    /// out in one pass of the engine (a WRITE and the flag behind it leave
    /// in one system call).
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), (usize, Error)> {
        for wr in wrs {
            self.join_ud(wr);
        }
        let mut st = self.eng.lock();
        let mut all_done = true;
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let mut host = HostSgl::default();
            let posted = self
                .host_sges(&st, wr, &mut host)
                .and_then(|w| st.post_send(self.qpn, &w).map_err(Error::from));
            match posted {
                Ok(done) => all_done &= done,
                Err(e) => {
                    res = Err((i, e));
                    break;
                }
            }
        }
        self.eng.posted_send(&mut st, all_done);
        res
    }

    /// `wr` with its SGEs as the core reads them: inline SGEs translated to
    /// the host addresses of their region memory (the core copies inline
    /// data from the address as it stands, verbs checking no key; safe
    /// callers name region memory in its iova space, so each is checked to
    /// lie in a region of this QP's PD first).
    ///
    /// Inline bytes in an implicit region (which may not be mapped) are
    /// copied into `host`'s own buffer now, checked, and the SGE points
    /// there: a missing page is an error here, not a fault in the core's
    /// copy.
    fn host_sges<'w>(
        &self,
        st: &engine::State,
        wr: &SendWr<'w>,
        host: &'w mut HostSgl,
    ) -> Result<SendWr<'w>> {
        if !wr.flags.contains(SendFlags::INLINE) {
            return Ok(*wr);
        }
        let HostSgl { sges, bounce } = host;
        let sges = sges.insert([Sge::default(); softrdma_core::MAX_SGE]);
        if wr.sgl.len() > sges.len() {
            return Err(CoreError::TooManySge {
                got: wr.sgl.len(),
                max: sges.len() as u32,
            }
            .into());
        }
        let mut used = 0;
        for (h, s) in sges.iter_mut().zip(wr.sgl) {
            let at = st
                .ep
                .mrs()
                .check_local(self.pd, s.lkey, s.addr, s.length as u64, AccessFlags::EMPTY)
                .map_err(|_| {
                    CoreError::InvalidArgument(
                        "inline SGE is not inside a memory region of the QP's PD",
                    )
                })?;
            let mut addr = at.addr;
            if at.checked {
                let n = s.length as usize;
                let room = bounce
                    .get_or_insert_with(|| Box::new([0; softrdma_core::MAX_INLINE]))
                    .get_mut(used..used + n)
                    .ok_or(CoreError::InlineTooLong {
                        got: wr.sgl.iter().map(|s| s.length as usize).sum(),
                        max: softrdma_core::MAX_INLINE as u32,
                    })?;
                softrdma_core::mr::Memory::read_checked(&st.mem, at.addr, room).map_err(|_| {
                    CoreError::InvalidArgument(
                        "inline SGE names memory of the implicit region that is not mapped readable",
                    )
                })?;
                addr = room.as_ptr() as u64;
                used += n;
            }
            *h = Sge { addr, ..*s };
        }
        Ok(SendWr {
            sgl: &sges[..wr.sgl.len()],
            ..*wr
        })
    }

    /// Bind a memory window to `len` bytes of `mr` at `offset` with the
    /// remote `access` (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`,
    /// `ZERO_BASED`): `ibv_bind_mw` for a type-1 window, an `IBV_WR_BIND_MW`
    /// work request for a type-2 one, naming the window by [`Mw::rkey`] and
    /// giving it that rkey moved on by one ([`inc_rkey`]). The bind executes
    /// in send-queue order and completes (if signaled) with
    /// `WcOpcode::BindMw`; returns the window's new rkey, which a type-1
    /// window's [`Mw::rkey`] reports from now on (a type-2 window's once
    /// the application records it with [`Mw::set_rkey`]).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        mw: &Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: AccessFlags,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<u32> {
        let r = mw.rkey();
        self.post_bind_mw(
            mw,
            &MwBindWr {
                wr_id,
                flags,
                mw_rkey: r,
                new_rkey: inc_rkey(r),
                mr: Some(mr),
                offset: offset as u64,
                len: len as u64,
                access,
            },
        )
    }

    /// Post a bind work request in full (see [`MwBindWr`]); returns the
    /// rkey the window will have once it executes.
    pub fn post_bind_mw(&self, mw: &Mw, wr: &MwBindWr<'_>) -> Result<u32> {
        let bad = |m| Err(Error::Verbs(CoreError::InvalidArgument(m)));
        if !Arc::ptr_eq(&mw.eng, &self.eng)
            || wr.mr.is_some_and(|m| !Arc::ptr_eq(&m.eng, &self.eng))
        {
            return bad("the memory window and the region must belong to the QP's context");
        }
        if !mw.id.owns(wr.mw_rkey) {
            return bad("mw_rkey is not one of this memory window's rkeys");
        }
        let (mr_lkey, addr) = match wr.mr {
            Some(mr) => {
                if wr
                    .offset
                    .checked_add(wr.len)
                    .is_none_or(|e| e > mr.len as u64)
                {
                    return bad("memory window outside its memory region");
                }
                (mr.lkey, mr.iova + wr.offset)
            }
            None if wr.len == 0 => (0, 0),
            None => return bad("a bind with a length needs a memory region"),
        };
        let bind = softrdma_core::mr::MwBind {
            mw_rkey: wr.mw_rkey,
            new_rkey: wr.new_rkey,
            mr_lkey,
            addr,
            len: wr.len,
            access: wr.access,
        };
        let mut st = self.eng.lock();
        let mem = st.mem;
        let new = match mw.kind {
            MwType::Type1 => {
                let new = st.ep.bind_mw(self.qpn, wr.wr_id, bind, wr.flags, &mem)?;
                mw.rkey.store(new, std::sync::atomic::Ordering::Relaxed);
                new
            }
            MwType::Type2 => {
                st.ep.post_send(
                    self.qpn,
                    &SendWr {
                        wr_id: wr.wr_id,
                        op: SendOp::BindMw(bind),
                        sgl: &[],
                        flags: wr.flags,
                        ud: None,
                    },
                    &mem,
                )?;
                (wr.mw_rkey & !0xff) | (wr.new_rkey & 0xff)
            }
        };
        // The bind is in the send queue: a lane post would overtake it.
        st.close_lane_of(self.qpn);
        self.eng.kick(&mut st);
        Ok(new)
    }

    /// Post a send whose inline SGEs may point anywhere (verbs semantics).
    ///
    /// # Safety
    /// Inline SGEs must point to readable memory of their length.
    pub unsafe fn post_send_unchecked(&self, wr: &SendWr<'_>) -> Result<()> {
        // A lane post names regions by lkey only (no inline bytes).
        if self.lane_post(wr) {
            return Ok(());
        }
        self.join_ud(wr);
        let mut st = self.eng.lock();
        let done = st.post_send(self.qpn, wr)?;
        self.eng.posted_send(&mut st, done);
        Ok(())
    }

    /// `ibv_post_recv`: queue a receive. Every SGE must lie in a local-writable
    /// memory region of this QP's protection domain, checked when posted (see
    /// [`Qp::post_recv_deferred`]).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        if self.rlane.try_post_recv(self.qpn, wr.wr_id, wr.sgl) {
            return Ok(());
        }
        let mut st = self.eng.lock();
        st.post_recv(self.qpn, wr, RecvCheck::AtPost)?;
        self.eng.posted_recv(&mut st);
        Ok(())
    }

    /// Post a receive whose SGEs are checked when a message needs them, as
    /// an RNIC reads its receive WQEs ([`RecvCheck::Deferred`]): a bad one
    /// completes `LOC_PROT_ERR` then (the RC sender sees `REM_OP_ERR`)
    /// instead of failing the post. What the C ABI's `ibv_post_recv` does;
    /// every byte is still placed only in registered memory.
    pub fn post_recv_deferred(&self, wr: &RecvWr<'_>) -> Result<()> {
        // Through the receive lane only what a check at post would pass
        // (its regions were checked): the same either way.
        if self.rlane.try_post_recv(self.qpn, wr.wr_id, wr.sgl) {
            return Ok(());
        }
        let mut st = self.eng.lock();
        st.post_recv(self.qpn, wr, RecvCheck::Deferred)?;
        self.eng.posted_recv(&mut st);
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.tgt.is_some() {
            return; // the shared target QP goes with its last handle
        }
        let mut st = self.eng.lock();
        // An ACK the last pass deferred belongs to this QP, perhaps: the
        // peer must get it (it would retransmit into a destroyed QP).
        self.eng.flush_deferred(&mut st);
        st.set_lane(self.qpn, None);
        st.set_direct(self.qpn, None);
        st.count_udp(self.qpn, -1);
        let _ = st.ep.destroy_qp(self.qpn);
        // Destroying detaches it from its multicast groups (as the
        // kernel's uverbs does): leave those now without a QP here.
        let left: Vec<[u8; 16]> = {
            let st = &*st;
            st.port
                .groups()
                .filter(|g| st.ep.mcast_groups().all(|m| m != g))
                .collect()
        };
        for g in left {
            st.port.leave_group(g);
        }
        st.publish_qps();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;

    /// A context on 127.0.0.1 that carries everything over `transport`.
    fn context_on(transport: Transport) -> Context {
        let dev = DeviceInfo {
            name: "srdma-unit".into(),
            addr: "127.0.0.1".parse().unwrap(),
        };
        let opts = OpenOptions {
            transport: Some(transport),
            ..OpenOptions::default()
        };
        Context::open(&dev, &opts).unwrap()
    }

    fn udp_context() -> Context {
        context_on(Transport::Udp)
    }

    /// Posts read no socket, so they are no sign that the application
    /// thread that took the socket (with an empty poll of a CQ with a UDP
    /// QP) still serves it: only passes that read it count for the
    /// watchdog (`Engine::poller_alive`). When every call counted, a thread
    /// that went on posting after its last poll kept the socket from the
    /// engine thread, and requests to the process waited in it.
    #[test]
    fn posts_are_no_sign_that_the_socket_is_served() {
        let ctx = udp_context();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..Default::default()
        };
        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        qp.modify(&init, mask).unwrap();
        let buf = pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(cq.poll(&mut [Completion::default(); 4]).unwrap(), 0);
        let (served, held) = ctx.eng.served();
        assert!(held, "an empty poll of a CQ with a UDP QP takes the socket");
        for i in 0..8 {
            qp.post_recv(&RecvWr {
                wr_id: i,
                sgl: &[buf.sge(0, 64)],
            })
            .unwrap();
        }
        assert_eq!(
            ctx.eng.served().0,
            served,
            "posts counted as passes that serve the socket"
        );
        assert_eq!(cq.poll(&mut [Completion::default(); 4]).unwrap(), 0);
        assert_ne!(ctx.eng.served().0, served, "a poll serves it");
    }

    /// `SOFTRDMA_UNIT_CHILD`: a test re-executed as a peer process.
    const CHILD: &str = "SOFTRDMA_UNIT_CHILD";

    fn shm_context() -> Context {
        context_on(Transport::Shm)
    }

    /// An endpoint as one line: `EP ` and its [`QpEndpoint::to_bytes`] in
    /// hex; and back.
    fn endpoint_line(e: &QpEndpoint) -> String {
        let hex: String = e.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        format!("EP {hex}")
    }

    fn parse_endpoint(l: &str) -> QpEndpoint {
        let hex = l.trim().strip_prefix("EP ").expect("an endpoint line");
        let b: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        QpEndpoint::from_bytes(&b).expect("an endpoint")
    }

    /// A context of this process with an RC QP connected over shared
    /// memory to one of a second process (this test binary re-executed as
    /// the target of test `name`: a region to WRITE into, then waiting for
    /// its input to close), and a source region for lane WRITEs. A
    /// process's own QPs reach each other through its rings, not a lane.
    struct LanePair {
        child: std::process::Child,
        stdin: Option<std::process::ChildStdin>,
        /// Read until the target ends (closed early, its harness's last
        /// lines would fail it with a broken pipe).
        out: std::io::BufReader<std::process::ChildStdout>,
        ctx: Context,
        _pd: Pd,
        cq: Cq,
        qp: Qp,
        theirs: QpEndpoint,
        src: Mr,
    }

    impl LanePair {
        /// `None` in the target process (its part is done then).
        fn new(name: &str, cq_depth: u32) -> Option<LanePair> {
            use std::io::{BufRead, Write};
            if std::env::var(CHILD).is_ok_and(|v| v == name) {
                let ctx = shm_context();
                let pd = ctx.alloc_pd();
                let cq = ctx.create_cq(16, None).unwrap();
                let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
                let tgt = pd
                    .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                    .unwrap();
                let mut e = qp.endpoint();
                e.regions = vec![tgt.remote()];
                println!("{}", endpoint_line(&e));
                std::io::stdout().flush().unwrap();
                let mut input = std::io::stdin().lock();
                let mut l = String::new();
                input.read_line(&mut l).unwrap();
                qp.connect(&parse_endpoint(&l), &ConnectOptions::default())
                    .unwrap();
                println!("CONNECTED");
                std::io::stdout().flush().unwrap();
                while input.read_line(&mut l).unwrap_or(0) > 0 {}
                return None;
            }
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, name)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            // Its lines from `prefix` on (the harness's "test NAME ... " is
            // printed before them, without a newline).
            let mut line = |prefix: &str| loop {
                let mut l = String::new();
                assert!(
                    out.read_line(&mut l).unwrap() > 0,
                    "the target ended before {prefix}"
                );
                if let Some(at) = l.find(prefix) {
                    return l[at..].to_string();
                }
            };
            let theirs = parse_endpoint(&line("EP "));
            let ctx = shm_context();
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(cq_depth, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "{}", endpoint_line(&qp.endpoint())).unwrap();
            qp.connect(&theirs, &ConnectOptions::default()).unwrap();
            line("CONNECTED");
            assert_eq!(qp.transport(), "shm");
            // Allocated: every byte in the pages the shared segment maps (a
            // `Vec` region's partial pages go the engine's way).
            let src = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            Some(LanePair {
                child,
                stdin: Some(stdin),
                out,
                ctx,
                _pd: pd,
                cq,
                qp,
                theirs,
                src,
            })
        }

        /// Post a signaled 8-byte WRITE.
        fn post(&self, i: u64) {
            self.qp
                .post_send(&SendWr {
                    wr_id: i,
                    op: SendOp::Write {
                        remote_addr: self.theirs.regions[0].addr,
                        rkey: self.theirs.regions[0].rkey,
                    },
                    sgl: &[self.src.sge(0, 8)],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                })
                .unwrap();
        }

        /// Post a signaled 8-byte WRITE and poll until its completion.
        fn write(&self, i: u64) {
            self.post(i);
            let mut wc = [Completion::default(); 1];
            let t0 = std::time::Instant::now();
            while self.cq.poll(&mut wc).unwrap() == 0 {
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(10),
                    "WRITE {i}'s completion"
                );
            }
            assert_eq!((wc[0].wr_id, wc[0].status), (i, WcStatus::Success));
        }

        /// Close the target's input and wait for it to end well.
        fn finish(mut self) {
            use std::io::Read;
            drop(self.stdin.take());
            let mut rest = String::new();
            let _ = self.out.read_to_string(&mut rest);
            assert!(self.child.wait().unwrap().success(), "the target process");
        }
    }

    /// A thread that polls only the completions its lane posts put in its
    /// CQ (a WRITE ping-pong over shared memory: it spins on memory and
    /// makes no serving pass) still polls: with nothing in the rings the
    /// watchdog leaves the rings with it and takes no lock, and its CQ's
    /// queue stays biased to it. A tick used to take the state, hand the
    /// rings back and leave the queue shared for good — a full barrier per
    /// post and poll for the rest of the run. Once the thread stops
    /// polling, the watchdog hands the rings back and stops ticking.
    /// The target is a second process (a process's own QPs reach each
    /// other through its rings, not a lane).
    #[test]
    fn a_lane_poller_keeps_the_rings_and_its_cqs_bias() {
        let Some(pair) = LanePair::new("tests::a_lane_poller_keeps_the_rings_and_its_cqs_bias", 64)
        else {
            return;
        };
        let (ctx, cq) = (&pair.ctx, &pair.cq);
        let write = |i: u64| pair.write(i);
        // A pass of this thread's takes the rings (as `perf write_lat`'s
        // spin does now and then); the first posts open the lanes.
        ctx.progress();
        write(0);
        write(1);
        let (ticks, masked, _) = ctx.eng.watchdog_state();
        assert!(masked, "the pass took the rings");
        assert_eq!(
            cq.lane.bias(),
            (true, false),
            "the CQ's queue biased to this thread"
        );
        // The window: three ticks in a row with no stretch of work under
        // the engine's lock, by any thread. Before, every tick took the
        // lock and handed the rings back. A tick may still take it when
        // this thread lost its core for a whole period (no poll in it: a
        // loaded test machine), and a post that meets that stretch goes
        // the engine's way, as it should: the window, its first WRITE and
        // the lane's count before it then start over (after a pass that
        // takes the rings back, if the tick handed them over).
        let (mut lane_before, mut first) = (ctx.shm_stats().lane, 2);
        let mut i = 2;
        let (mut since, mut stretches) = (ticks, ctx.eng.stretches());
        let t0 = std::time::Instant::now();
        while ctx.eng.watchdog_state().0 < since + 3 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "three watchdog ticks in a row that took no lock and left \
                 the rings with a thread that polls"
            );
            write(i);
            i += 1;
            if ctx.eng.stretches() != stretches {
                if !ctx.eng.watchdog_state().1 {
                    ctx.progress();
                }
                // (Reading the count is a stretch of this thread's too.)
                (lane_before, first) = (ctx.shm_stats().lane, i);
                since = ctx.eng.watchdog_state().0;
                stretches = ctx.eng.stretches();
            }
        }
        assert_eq!(
            cq.lane.bias(),
            (true, false),
            "the CQ's queue after the ticks (biased to this thread, shared for good)"
        );
        let lane_after = ctx.shm_stats().lane;
        assert!(
            lane_after - lane_before >= i - first,
            "the WRITEs went through the lane: {lane_before} -> {lane_after}, {} posted",
            i - first
        );
        // Stopped polling: the rings go back, and the watchdog stops.
        let t0 = std::time::Instant::now();
        loop {
            let (_, masked, on) = ctx.eng.watchdog_state();
            if !masked && !on {
                break;
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "the watchdog hands back and stops"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pair.finish();
    }

    /// A poll the engine's way that leaves completions in the core's CQ
    /// (it took all it was asked for) hands them back to the CQ's lane
    /// queue, oldest first, so the polls after it take them without the
    /// lock — in order, and before what lane posts complete after them.
    /// Before, a CQ whose core held more than one poll takes (a stream
    /// that signals every post) reopened its queue behind older
    /// completions every time, and every completion went lane → core →
    /// poll under the lock for as long as the stream ran.
    #[test]
    fn completions_a_poll_leaves_behind_go_back_to_the_lane() {
        const N: u64 = 40;
        let Some(pair) = LanePair::new(
            "tests::completions_a_poll_leaves_behind_go_back_to_the_lane",
            64,
        ) else {
            return;
        };
        // The first posts open the lanes (no pass of this thread's takes
        // the rings: no watchdog, no stretch of the engine thread's).
        pair.write(0);
        pair.write(1);
        for i in 2..2 + N {
            pair.post(i);
        }
        // A stretch under the lock hands the lane posts' completions to
        // the core's CQ.
        let _ = pair.ctx.stats();
        assert_eq!(pair.cq.lane.queued(), 0, "settled into the core's CQ");
        let mut wc = [Completion::default(); 4];
        assert_eq!(pair.cq.poll(&mut wc).unwrap(), 4);
        assert_eq!(
            wc.map(|c| c.wr_id),
            [2, 3, 4, 5],
            "the oldest, from the core's CQ"
        );
        assert_eq!(
            pair.cq.lane.queued(),
            N as usize - 4,
            "the rest back in the lane's queue"
        );
        pair.post(2 + N);
        let mut next = 6;
        let t0 = std::time::Instant::now();
        while next <= 2 + N {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "completion {next}"
            );
            let n = pair.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!((c.wr_id, c.status), (next, WcStatus::Success));
                next += 1;
            }
        }
        assert_eq!(pair.cq.poll(&mut wc).unwrap(), 0, "nothing more");
        pair.finish();
    }

    /// Two CQs on one channel: a thread waiting for its own CQ's
    /// completion (`Cq::wait`) that finds the other CQ's event queued puts
    /// it back for its owner and sleeps until the queue changes — it took
    /// and put back the same event in a loop, a core at 100 % for as long
    /// as the other CQ's owner did not come for it — and still gets its
    /// own event when it comes, wherever it stands in the queue.
    #[test]
    fn a_wait_on_a_shared_channel_sleeps_while_only_another_cqs_event_waits() {
        let ctx = udp_context();
        let pd = ctx.alloc_pd();
        let ch = ctx.create_comp_channel().unwrap();
        let cq_a = ctx.create_cq(16, Some(&ch)).unwrap();
        let cq_b = ctx.create_cq(16, Some(&ch)).unwrap();
        let qa = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq_a)).unwrap();
        let qb = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq_b)).unwrap();
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        qa.connect(&eb, &ConnectOptions::default()).unwrap();
        qb.connect(&ea, &ConnectOptions::default()).unwrap();
        let tgt = pd
            .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let src = pd.reg_mr(vec![7u8; 64], AccessFlags::LOCAL_WRITE).unwrap();
        // B's event: a WRITE's completion on the armed CQ B, left queued.
        cq_b.req_notify(false).unwrap();
        qb.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: tgt.iova(),
                rkey: tgt.rkey(),
            },
            sgl: &[src.sge(0, 8)],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap();
        let t0 = std::time::Instant::now();
        while !ch.inner.queue().events.contains(&cq_b.id().0) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "B's event"
            );
            ctx.progress();
            std::thread::yield_now();
        }
        let before = ch.inner.generation();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| cq_a.wait(2, Some(std::time::Duration::from_secs(30))));
            // Give a busy waiter time to show itself: it would take and
            // put back B's event thousands of times meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let during = ch.inner.generation().wrapping_sub(before);
            // A's completion: a SEND from B into a receive of A.
            qa.post_recv(&RecvWr {
                wr_id: 2,
                sgl: &[tgt.sge(8, 8)],
            })
            .unwrap();
            qb.post_send(&SendWr {
                wr_id: 3,
                op: SendOp::Send,
                sgl: &[src.sge(0, 8)],
                flags: SendFlags::default(),
                ud: None,
            })
            .unwrap();
            let c = waiter.join().unwrap().expect("A's completion");
            assert_eq!(c.wr_id, 2);
            // Taking B's event and putting it back: two changes of the
            // queue; a few more if a wake-up came between.
            assert!(
                during <= 8,
                "the queue changed {during} times while only another CQ's event waited: taken and put back in a loop"
            );
        });
        // B's event is still there for its owner.
        assert!(ch.inner.queue().events.contains(&cq_b.id().0));
    }

    /// An event queued just as a `get_event` of its channel stops serving
    /// the socket is signalled, or that waiter's `take` finds it: never
    /// left queued behind a descriptor that is not readable while the
    /// waiter sleeps on it. The interleaving is forced: the pusher waits
    /// for the queue's lock while the waiter stops serving and finds the
    /// queue empty (its `take`, the lock held here).
    #[test]
    fn an_event_queued_as_a_waiter_stops_serving_is_signalled() {
        let ch = Arc::new(ChannelInner {
            fd: EventFd::new(true).unwrap(),
            q: Default::default(),
            change: Default::default(),
            serving: Default::default(),
            owned: Default::default(),
            eng: std::sync::Weak::new(),
        });
        // A waiter serves the socket (`Engine::serve_socket`).
        ch.serving.fetch_add(1, SeqCst);
        // Its `take`, about to find nothing.
        let q = ch.queue();
        let pusher = {
            let ch = ch.clone();
            std::thread::spawn(move || ch.push(7))
        };
        // Let the pusher get as far as the queue's lock.
        std::thread::sleep(std::time::Duration::from_millis(200));
        ch.serving.fetch_sub(1, SeqCst);
        assert!(q.events.is_empty(), "the waiter's take finds nothing");
        drop(q);
        pusher.join().unwrap();
        // The waiter now sleeps on the descriptor: the event must have
        // made it readable.
        assert!(
            ch.queue().signalled,
            "an event was queued with the descriptor left unreadable"
        );
        assert_eq!(ch.take(), Some(7));
    }
}
