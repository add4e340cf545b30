//! Connection management: rdma_cm's model over the IB CM protocol, so that
//! applications connect by IP address and port instead of exchanging QP
//! numbers themselves — with softrdma peers and with the Linux kernel's
//! rdma_cm (rxe, RNICs), which speaks the same MADs.
//!
//! The objects are rdma_cm's: an [`EventChannel`] delivers [`CmEvent`]s,
//! a [`CmId`] is bound, resolved, listened on, connected, accepted and
//! disconnected; each device that takes part has a connection manager
//! ([`Cm`], from [`crate::Context::connection_manager`]) that speaks the
//! protocol on QP1 (`agent`). As in librdmacm, the QP is the caller's: the
//! ID says what attributes each transition needs ([`CmId::init_qp_attr`])
//! and the caller moves its QP before the REP or RTU goes out
//! ([`CmId::accept`], [`CmId::establish`]); the C library
//! (`rdma_create_qp`, `rdma_get_cm_event`) does that for its callers.
//!
//! What goes on the wire is what the kernel's rdma_cm sends: the service
//! ID `0x0000_0000_01PP_PPPP` (port space, port), the 36-byte rdma_cm
//! header (IP version, the active side's port and address, the address it
//! connects to) before the caller's private data in a REQ or SIDR_REQ, a
//! random starting PSN, CM response timeout 20 and 15 CM retries, and UD
//! services answered with Q_Key `0x01234567` (`RDMA_UDP_QKEY`).

mod agent;
mod blocking;

pub use blocking::{
    connect, ready_ud, resolve_ud, CmOptions, Connection, Listener, Rejection, Request, UdListener,
    UdPeer, UdRequest,
};

pub(crate) use agent::Agent;
use agent::State;

use crate::{AccessFlags, AddressVector, AttrMask, Error, Mtu, QpAttr, QpState, QpType, Result};
use softrdma_core::Error as CoreError;
use softrdma_wire::cm::{self as w, CmMsg, CmaHdr};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Whether `SOFTRDMA_CM_LOG` asks for the CM's trace on stderr (read once).
pub fn logging() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_CM_LOG").is_some_and(|v| v != "0"))
}

/// A line of the CM's trace (`softrdma-cm: <seconds>.<µs> <msg>` on stderr)
/// if [`logging`].
pub fn log(msg: &str) {
    if logging() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!(
            "softrdma-cm: {}.{:06} {msg}",
            t.as_secs() % 1000,
            t.subsec_micros()
        );
    }
}

/// `RDMA_UDP_QKEY`: the Q_Key of UD services in the UDP port space.
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The most private data each message takes from the caller: a REQ's 92
/// bytes less the rdma_cm header, a SIDR_REQ's 216 less the header, a
/// REP's 196, a REJ's 148, a SIDR_REP's 136 (rdma_connect(3),
/// rdma_accept(3)).
pub const MAX_CONNECT_PRIVATE: usize = w::private_len::REQ - CmaHdr::LEN;
/// A SIDR_REQ's (UD connect).
pub const MAX_UD_CONNECT_PRIVATE: usize = w::private_len::SIDR_REQ - CmaHdr::LEN;
/// A REP's (accept).
pub const MAX_ACCEPT_PRIVATE: usize = w::private_len::REP;
/// A SIDR_REP's (UD accept).
pub const MAX_UD_ACCEPT_PRIVATE: usize = w::private_len::SIDR_REP;
/// A REJ's.
pub const MAX_REJECT_PRIVATE: usize = w::private_len::REJ;
/// The most reads and atomics in flight a connection offers or takes
/// (the device's `max_qp_rd_atom`).
pub const MAX_RD_ATOMIC: u8 = 16;

/// The reply to a REQ or SIDR_REQ that nobody in this process takes (no
/// listener for its service): a REJ "invalid service ID", or a SIDR_REP
/// "service ID not supported", as the kernel's CM answers.
pub(crate) fn unclaimed(mad: &[u8; w::MAD_LEN]) -> Option<[u8; w::MAD_LEN]> {
    let (h, msg) = w::parse(mad).ok()?;
    Some(match msg {
        CmMsg::Req(req) => CmMsg::Rej(Box::new(w::RejRepr {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            msg_rejected: w::msg_kind::REQ,
            reject_info_length: 0,
            reason: w::rej_reason::INVALID_SERVICE_ID,
            ari: [0; 72],
            private: [0; w::private_len::REJ],
        }))
        .emit(h.tid),
        CmMsg::SidrReq(req) => CmMsg::SidrRep(Box::new(w::SidrRepRepr {
            request_id: req.request_id,
            status: w::sidr_status::UNSUPPORTED,
            add_info_length: 0,
            qpn: 0,
            service_id: req.service_id,
            qkey: 0,
            class_port_info: [0; 72],
            private: [0; w::private_len::SIDR_REP],
        }))
        .emit(h.tid),
        _ => return None,
    })
}

/// rdma_cm's port spaces (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC).
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD), services by SIDR.
    Udp,
    /// `RDMA_PS_IB`: any QP type.
    Ib,
    /// `RDMA_PS_IPOIB`.
    Ipoib,
}

impl PortSpace {
    /// The C value (`RDMA_PS_*`).
    pub fn to_c(self) -> i32 {
        self.code() as i32
    }

    /// The port space of a C value (`RDMA_PS_*`).
    pub fn from_c(v: i32) -> Option<PortSpace> {
        Some(match v as u16 {
            w::service::PS_TCP => PortSpace::Tcp,
            w::service::PS_UDP => PortSpace::Udp,
            w::service::PS_IB => PortSpace::Ib,
            w::service::PS_IPOIB => PortSpace::Ipoib,
            _ => return None,
        })
    }

    fn code(self) -> u16 {
        match self {
            PortSpace::Tcp => w::service::PS_TCP,
            PortSpace::Udp => w::service::PS_UDP,
            PortSpace::Ib => w::service::PS_IB,
            PortSpace::Ipoib => w::service::PS_IPOIB,
        }
    }

    /// The QP type an ID of this space has until a QP says otherwise.
    fn default_qp_type(self) -> QpType {
        match self {
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
        }
    }
}

/// rdma_cm's events (`enum rdma_cm_event_type`, same numbering; see
/// rdma_get_cm_event(3) for each).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum EventKind {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

impl EventKind {
    /// `rdma_event_str`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }

    /// The event of a C value.
    pub fn from_c(v: i32) -> Option<EventKind> {
        use EventKind::*;
        [
            AddrResolved,
            AddrError,
            RouteResolved,
            RouteError,
            ConnectRequest,
            ConnectResponse,
            ConnectError,
            Unreachable,
            Rejected,
            Established,
            Disconnected,
            DeviceRemoval,
            MulticastJoin,
            MulticastError,
            AddrChange,
            TimewaitExit,
        ]
        .into_iter()
        .find(|k| *k as i32 == v)
    }
}

/// A connection's parameters (`struct rdma_conn_param`): what a caller
/// offers in `connect`/`accept`, and what an event reports of the peer's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data: what the caller sends, or what the peer sent.
    pub private_data: Vec<u8>,
    /// Reads and atomics in flight this side serves (`max_dest_rd_atomic`).
    /// In a CONNECT_REQUEST or CONNECT_RESPONSE event: what the peer asks
    /// this side to serve (the peer's initiator depth).
    pub responder_resources: u8,
    /// Reads and atomics in flight this side issues (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// End-to-end flow control (credits) is on.
    pub flow_control: bool,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = for ever).
    pub rnr_retry_count: u8,
    /// The QP uses a shared receive queue.
    pub srq: bool,
    /// The QP number (of the peer, in an event).
    pub qp_num: u32,
}

/// The peer of a UD service (`struct rdma_ud_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdParam {
    /// Private data the peer sent.
    pub private_data: Vec<u8>,
    /// The address to send to: the peer's GID.
    pub dgid: [u8; 16],
    /// IP hop limit of the path.
    pub hop_limit: u8,
    /// IP traffic class of the path.
    pub traffic_class: u8,
    /// The peer's QP number.
    pub qp_num: u32,
    /// The Q_Key to send to it with.
    pub qkey: u32,
}

/// An event (`struct rdma_cm_event`).
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// The ID it is about; for a CONNECT_REQUEST, the new ID of the
    /// connection (whose channel is the listener's).
    pub id: CmId,
    /// For a CONNECT_REQUEST: the listening ID.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub kind: EventKind,
    /// 0, or: the REJ reason (REJECTED), `-ETIMEDOUT` (UNREACHABLE after
    /// the retries), the SIDR_REP status.
    pub status: i32,
    /// The connection's parameters (the peer's, in a request or response).
    pub conn: ConnParam,
    /// UD services: the peer (ESTABLISHED) or its request (CONNECT_REQUEST).
    pub ud: Option<UdParam>,
}

struct ChanInner {
    q: Mutex<VecDeque<CmEvent>>,
    /// Readable while events are queued.
    bell: crate::sys::EventFd,
}

/// Where a set of IDs report their events (`struct rdma_event_channel`):
/// a queue with a descriptor that is readable while it holds events, so
/// it can sit in any poll or epoll set. A handle: clones name one channel.
#[derive(Clone)]
pub struct EventChannel(Arc<ChanInner>);

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .field("pending", &self.pending())
            .finish()
    }
}

impl EventChannel {
    /// A new channel (`rdma_create_event_channel`).
    pub fn new() -> Result<EventChannel> {
        Ok(EventChannel(Arc::new(ChanInner {
            q: Mutex::new(VecDeque::new()),
            // Blocking, as librdmacm's descriptor is: an application may
            // read it or make it non-blocking itself (and then
            // `rdma_get_cm_event` returns EAGAIN when nothing waits).
            bell: crate::sys::EventFd::new(false)?,
        })))
    }

    /// The descriptor: readable while an event is waiting (never read it:
    /// [`EventChannel::try_get`] does).
    pub fn fd(&self) -> RawFd {
        self.0.bell.as_raw_fd()
    }

    pub(crate) fn push(&self, ev: CmEvent) {
        log(&format!("event {} status {}", ev.kind.name(), ev.status));
        let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(ev);
        if q.len() == 1 {
            self.0.bell.signal();
        }
    }

    /// The next event, if one is waiting.
    pub fn try_get(&self) -> Option<CmEvent> {
        let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
        let ev = q.pop_front()?;
        if q.is_empty() {
            // Signalled when the queue went from empty to one, under this
            // lock: the counter holds that signal, so the read returns.
            let _ = self.0.bell.drain();
        }
        Some(ev)
    }

    /// Wait for the next event (at most `timeout`, `None`: for ever).
    pub fn get(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.try_get() {
                return Some(ev);
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as i32
                }
            };
            let mut p = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the call.
            unsafe { libc::poll(&mut p, 1, ms) };
        }
    }

    /// Events queued and not yet taken.
    pub fn pending(&self) -> usize {
        self.0.q.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn same(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A device's connection manager (see `agent`). A handle.
#[derive(Clone)]
pub struct Cm(pub(crate) Arc<Agent>);

impl Cm {
    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.0.addr
    }

    /// The device's own GID.
    pub fn gid(&self) -> [u8; 16] {
        self.0.gid
    }

    /// Its index in the port's GID table.
    pub fn gid_index(&self) -> u8 {
        self.0.gid_index
    }

    fn same(&self, o: &Cm) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }

    pub(crate) fn stop(&self) {
        self.0.stop();
    }
}

/// What a connection agreed, from this side's point of view.
#[derive(Debug, Clone, Copy, Default)]
struct Agreed {
    peer_gid: [u8; 16],
    peer_qpn: u32,
    /// The Starting PSN of the peer's REQ or REP: the PSN our sends start
    /// from (our SQ PSN; see [`IdState::psn`]).
    peer_psn: u32,
    /// max_dest_rd_atomic and max_rd_atomic.
    responder_resources: u8,
    initiator_depth: u8,
    path_mtu: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    /// The local ACK timeout exponent for our requester.
    ack_timeout: u8,
    traffic_class: u8,
    hop_limit: u8,
    qkey: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    /// Has a communication ID in its device's agent.
    Connecting,
    Connected,
    Disconnected,
}

struct IdState {
    channel: EventChannel,
    ps: PortSpace,
    qp_type: QpType,
    dev: Option<Cm>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    /// Where packets for `dst` go when it is a loopback address no device
    /// has (the device's own address).
    dst_via: Option<IpAddr>,
    phase: Phase,
    /// (device, service) pairs a listening ID takes REQs for.
    listening: Vec<(Cm, u64)>,
    comm: Option<u32>,
    /// The Starting PSN of our REQ or REP, chosen at creation: the PSN the
    /// peer's sends start from, so our QP's RQ PSN. This is how the
    /// kernel's IB CM reads the field: the active side's RQ PSN is its
    /// REQ's Starting PSN and its SQ PSN the REP's, the passive side's the
    /// other way round (`cm_init_qp_rtr_attr`/`cm_init_qp_rts_attr`;
    /// crates/wire/tests/golden/cm/README.md, section 4).
    psn: u32,
    agreed: Agreed,
    tos: Option<u8>,
    ack_timeout: Option<u8>,
    reuseaddr: bool,
    afonly: bool,
    destroyed: bool,
    /// An accept's numbers are in `agreed` (see [`CmId::offer`]).
    offered: bool,
}

struct IdInner {
    st: Mutex<IdState>,
    /// The C library's `rdma_cm_id` for this ID (0: none yet).
    user: AtomicUsize,
}

/// An rdma_cm ID (`struct rdma_cm_id`). A handle: clones name one ID.
/// [`CmId::destroy`] ends it (a drop of the last handle does not: an ID
/// the connection manager still knows lives until destroyed).
#[derive(Clone)]
pub struct CmId(Arc<IdInner>);

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}
impl Eq for CmId {}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.st();
        f.debug_struct("CmId")
            .field("ps", &s.ps)
            .field("phase", &s.phase)
            .field("src", &s.src)
            .field("dst", &s.dst)
            .finish()
    }
}

fn inval(msg: &'static str) -> Error {
    CoreError::InvalidArgument(msg).into()
}

fn io_err(kind: io::ErrorKind, msg: String) -> Error {
    Error::Io(io::Error::new(kind, msg))
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

/// An ephemeral port for an ID bound to port 0 (the kernel's range).
fn ephemeral_port() -> u16 {
    32768 + (random_u32() % 28232) as u16
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let norm = |x: IpAddr| match x {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(x, IpAddr::V4),
        v4 => v4,
    };
    norm(a) == norm(b)
}

/// The IB MTU code of the port's active MTU.
fn mtu_code(m: Mtu) -> u8 {
    m as u8
}

fn mtu_of(code: u8) -> Mtu {
    Mtu::ALL
        .into_iter()
        .find(|m| *m as u8 == code)
        .unwrap_or(Mtu::B1024)
}

/// Max reads/atomics: 0xff asks for the most there is (librdmacm's
/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`).
fn clamp_rd(v: u8) -> u8 {
    v.min(MAX_RD_ATOMIC)
}

impl CmId {
    /// `rdma_create_id`: a new ID reporting on `channel`.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> CmId {
        CmId(Arc::new(IdInner {
            st: Mutex::new(IdState {
                channel: channel.clone(),
                ps,
                qp_type: ps.default_qp_type(),
                dev: None,
                src: None,
                dst: None,
                dst_via: None,
                phase: Phase::Idle,
                listening: Vec::new(),
                comm: None,
                psn: random_u32() & 0xff_ffff,
                agreed: Agreed::default(),
                tos: None,
                ack_timeout: None,
                reuseaddr: false,
                afonly: false,
                destroyed: false,
                offered: false,
            }),
            user: AtomicUsize::new(0),
        }))
    }

    fn st(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.0.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The C library's object for this ID.
    pub fn user(&self) -> usize {
        self.0.user.load(Ordering::Acquire)
    }

    /// Record the C library's object for this ID.
    pub fn set_user(&self, p: usize) {
        self.0.user.store(p, Ordering::Release);
    }

    /// The channel the ID reports to.
    pub fn channel(&self) -> EventChannel {
        self.st().channel.clone()
    }

    /// The ID's port space.
    pub fn port_space(&self) -> PortSpace {
        self.st().ps
    }

    /// The QP type of the ID (its port space's, or its QP's).
    pub fn qp_type(&self) -> QpType {
        self.st().qp_type
    }

    /// The QP type of the QP the caller attaches (RC or UC in the IB port
    /// space, UD in the UDP one).
    pub fn set_qp_type(&self, t: QpType) -> Result<()> {
        let mut s = self.st();
        match (s.ps, t) {
            (PortSpace::Tcp, QpType::Rc) | (PortSpace::Udp | PortSpace::Ipoib, QpType::Ud) => {}
            (PortSpace::Ib, _) => {}
            _ => return Err(inval("the QP type does not belong to the ID's port space")),
        }
        s.qp_type = t;
        Ok(())
    }

    /// The device the ID is bound or resolved to.
    pub fn device(&self) -> Option<Cm> {
        self.st().dev.clone()
    }

    /// The local address and port (bound or resolved).
    pub fn src_addr(&self) -> Option<SocketAddr> {
        self.st().src
    }

    /// The peer's address and port (resolved, or the requester's).
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        self.st().dst
    }

    /// The peer's GID and QP number once connected or requested.
    pub fn peer(&self) -> ([u8; 16], u32) {
        let s = self.st();
        (s.agreed.peer_gid, s.agreed.peer_qpn)
    }

    /// `rdma_migrate_id`: report on `channel` from now on (events queued
    /// on the old channel stay there).
    pub fn migrate(&self, channel: &EventChannel) {
        self.st().channel = channel.clone();
    }

    /// `RDMA_OPTION_ID_TOS`: the IP type of service of the connection.
    pub fn set_tos(&self, tos: u8) {
        self.st().tos = Some(tos);
    }

    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the local ACK timeout exponent.
    pub fn set_ack_timeout(&self, t: u8) -> Result<()> {
        if t > 31 {
            return Err(inval("an ACK timeout exponent is at most 31"));
        }
        self.st().ack_timeout = Some(t);
        Ok(())
    }

    /// `RDMA_OPTION_ID_REUSEADDR`: kept and reported; a
    /// listener's port is taken whatever they say (one process per service
    /// and address, as one ID per port in the kernel).
    pub fn set_reuseaddr(&self, on: bool) {
        self.st().reuseaddr = on;
    }

    /// `RDMA_OPTION_ID_AFONLY`: kept and reported.
    pub fn set_afonly(&self, on: bool) {
        self.st().afonly = on;
    }

    /// `rdma_bind_addr`: take a local address (and port; 0 picks one). An
    /// address of one of `devices` binds the ID to that device; the
    /// wildcard address binds none (a listener then listens on all).
    pub fn bind(&self, addr: SocketAddr, devices: &[Cm]) -> Result<()> {
        let mut s = self.st();
        if s.phase != Phase::Idle {
            return Err(inval("the ID is already bound"));
        }
        let dev = if addr.ip().is_unspecified() {
            None
        } else {
            Some(
                devices
                    .iter()
                    .find(|d| same_ip(d.addr(), addr.ip()))
                    // A loopback address no device has: the first device,
                    // as the kernel's rdma_cm binds loopback
                    // (`cma_bind_loopback`).
                    .or_else(|| devices.first().filter(|_| is_loopback(addr.ip())))
                    .cloned()
                    .ok_or_else(|| {
                        io_err(
                            io::ErrorKind::AddrNotAvailable,
                            format!("no softrdma device has the address {}", addr.ip()),
                        )
                    })?,
            )
        };
        let port = if addr.port() == 0 {
            ephemeral_port()
        } else {
            addr.port()
        };
        s.src = Some(SocketAddr::new(addr.ip(), port));
        s.dev = dev;
        s.phase = Phase::Bound;
        Ok(())
    }

    /// `rdma_resolve_addr`: find the device that reaches `dst` (the one on
    /// the local address the kernel routes to it from, or `src`'s), then
    /// report ADDR_RESOLVED (or ADDR_ERROR).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        devices: &[Cm],
    ) -> Result<()> {
        let bound = self.st().src;
        let local = match src.or(bound) {
            Some(s) if !s.ip().is_unspecified() => Ok(s.ip()),
            // With the destination's scope: a link-local peer's route is
            // its interface's.
            _ => crate::device::route_source_to(dst),
        };
        let dev = local.ok().and_then(|ip| {
            devices
                .iter()
                .find(|d| same_ip(d.addr(), ip))
                .or_else(|| devices.first().filter(|_| is_loopback(dst.ip())))
                .cloned()
                .map(|d| (d, ip))
        });
        // A loopback destination no device has is this host: the chosen
        // device itself (the kernel's `cma_resolve_loopback`); the REQ
        // still names the address the caller connects to.
        let via = match &dev {
            Some((d, _))
                if is_loopback(dst.ip())
                    && !devices.iter().any(|x| same_ip(x.addr(), dst.ip())) =>
            {
                Some(d.addr())
            }
            _ => None,
        };
        let (kind, status) = {
            let mut s = self.st();
            if !matches!(s.phase, Phase::Idle | Phase::Bound | Phase::AddrResolved) {
                return Err(inval(
                    "the ID is in use (resolve the address before connecting)",
                ));
            }
            match dev {
                Some((d, ip)) => {
                    let port = src
                        .or(s.src)
                        .map(|a| a.port())
                        .filter(|&p| p != 0)
                        .unwrap_or_else(ephemeral_port);
                    s.src = Some(SocketAddr::new(d.addr(), port));
                    let _ = ip;
                    s.dst = Some(dst);
                    s.dst_via = via;
                    s.dev = Some(d);
                    s.phase = Phase::AddrResolved;
                    (EventKind::AddrResolved, 0)
                }
                None => (EventKind::AddrError, -libc::ENODEV),
            }
        };
        self.post(kind, status);
        Ok(())
    }

    /// `rdma_resolve_route`: RoCE needs no path query; reports
    /// ROUTE_RESOLVED at once.
    pub fn resolve_route(&self) -> Result<()> {
        {
            let mut s = self.st();
            if s.phase != Phase::AddrResolved {
                return Err(inval("resolve the address first"));
            }
            s.phase = Phase::RouteResolved;
        }
        self.post(EventKind::RouteResolved, 0);
        Ok(())
    }

    /// `rdma_join_multicast` on RoCE (the kernel's `cma_iboe_join_multicast`):
    /// no SA query; the MGID is the group's IP address as a GID (IPv4
    /// mapped, or the IPv6 address), and MULTICAST_JOIN is reported at once
    /// with that GID, QP number 0xFFFFFF, hop limit 64 (RoCEv2's
    /// `IPV6_DEFAULT_HOPLIMIT`) and, in the UDP port space, Q_Key
    /// [`UDP_QKEY`] (the IPoIB space's groups carry none: 0). The ID must
    /// have a device (bound to an address, or resolved) and a UD port
    /// space. Attaching a QP is the caller's (librdmacm attaches the ID's
    /// QP when it hands out the event; [`crate::Qp::attach_mcast`]).
    /// Returns the MGID.
    pub fn join_multicast(&self, group: IpAddr) -> Result<[u8; 16]> {
        let (mgid, ud) = {
            let s = self.st();
            if s.qp_type != QpType::Ud {
                return Err(inval(
                    "multicast needs a UD port space (RDMA_PS_UDP or RDMA_PS_IPOIB)",
                ));
            }
            let Some(dev) = s.dev.as_ref() else {
                return Err(inval(
                    "the ID has no device: bind it to a local address or resolve one first",
                ));
            };
            if !matches!(
                s.phase,
                Phase::Bound | Phase::AddrResolved | Phase::RouteResolved
            ) {
                return Err(inval(
                    "the ID is in use (listening or connected); join groups on a bound or resolved ID",
                ));
            }
            let group = match group {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(group, IpAddr::V4),
                v4 => v4,
            };
            if !group.is_multicast() {
                return Err(inval("the address is not an IP multicast address"));
            }
            if group.is_ipv4() != dev.addr().is_ipv4() {
                return Err(inval(
                    "the group's address family is not the device's (IPv4 with IPv4, IPv6 with IPv6)",
                ));
            }
            let mgid = match group {
                IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                IpAddr::V6(v6) => v6.octets(),
            };
            let ud = UdParam {
                private_data: Vec::new(),
                dgid: mgid,
                hop_limit: 64,
                traffic_class: s.tos.unwrap_or(0),
                qp_num: crate::MULTICAST_QPN,
                qkey: if s.ps == PortSpace::Udp { UDP_QKEY } else { 0 },
            };
            (mgid, ud)
        };
        self.channel().push(CmEvent {
            id: self.clone(),
            listen_id: None,
            kind: EventKind::MulticastJoin,
            status: 0,
            conn: ConnParam::default(),
            ud: Some(ud),
        });
        Ok(mgid)
    }

    fn post(&self, kind: EventKind, status: i32) {
        let ch = self.channel();
        ch.push(CmEvent {
            id: self.clone(),
            listen_id: None,
            kind,
            status,
            conn: ConnParam::default(),
            ud: None,
        });
    }

    /// `rdma_listen`: take the connection requests for the bound port, on
    /// the bound device or, bound to the wildcard address, on every one
    /// of `devices`.
    pub fn listen(&self, devices: &[Cm]) -> Result<()> {
        let (devs, service) = {
            let s = self.st();
            if s.phase == Phase::Listening {
                return Ok(());
            }
            if s.phase != Phase::Bound {
                return Err(inval("bind the ID before listening"));
            }
            let port = s.src.map_or(0, |a| a.port());
            let devs: Vec<Cm> = match &s.dev {
                Some(d) => vec![d.clone()],
                None => devices.to_vec(),
            };
            (devs, w::service::id(s.ps.code(), port))
        };
        if devs.is_empty() {
            return Err(io_err(
                io::ErrorKind::NotFound,
                "no softrdma device to listen on".into(),
            ));
        }
        let mut done: Vec<(Cm, u64)> = Vec::new();
        for d in devs {
            if let Err(e) = d.0.listen(service, self) {
                for (d, s) in &done {
                    d.0.listen_failed(*s, self);
                }
                return Err(Error::Io(e));
            }
            done.push((d, service));
        }
        {
            let mut s = self.st();
            s.listening = done.clone();
            s.phase = Phase::Listening;
        }
        // Only now, with the ID listening: a request served before this
        // would find no listener in the ID and be refused. Requests that
        // came meanwhile (while the steering took the service, or while
        // the ID registered on its other devices) were held.
        for (d, s) in done {
            let held = d.0.listen_done(s);
            d.0.serve_held(held);
        }
        Ok(())
    }

    /// `rdma_connect`: send the REQ (RC/UC) or SIDR_REQ (UD) for the QP
    /// `qpn`. `param` is what this side offers (for UD only the private
    /// data counts).
    pub fn connect(&self, param: &ConnParam, qpn: u32) -> Result<()> {
        let (dev, src, dst, via, ps, qp_type, psn, tos, ack) = {
            let s = self.st();
            if s.phase != Phase::RouteResolved {
                return Err(inval("resolve the route before connecting"));
            }
            (
                s.dev.clone().expect("resolved"),
                s.src.expect("resolved"),
                s.dst.expect("resolved"),
                s.dst_via,
                s.ps,
                s.qp_type,
                s.psn,
                s.tos.unwrap_or(0),
                s.ack_timeout,
            )
        };
        let ud = qp_type == QpType::Ud;
        let max = if ud {
            MAX_UD_CONNECT_PRIVATE
        } else {
            MAX_CONNECT_PRIVATE
        };
        if param.private_data.len() > max {
            return Err(inval("too much private data for a connect"));
        }
        if !same_ip_family(src.ip(), dst.ip()) {
            return Err(inval(
                "source and destination are of different address families",
            ));
        }
        let peer_gid = crate::device::ip_to_gid(via.unwrap_or(dst.ip()));
        let service = w::service::id(ps.code(), dst.port());
        let hdr = CmaHdr { src, dst: dst.ip() };
        let a = dev.0.clone();
        let mtu = mtu_code(a.path_mtu());
        let resp = clamp_rd(param.responder_resources);
        let init = clamp_rd(param.initiator_depth);
        let ack_timeout = ack.unwrap_or(DEFAULT_ACK_TIMEOUT);
        {
            let mut s = self.st();
            s.agreed = Agreed {
                peer_gid,
                responder_resources: resp,
                initiator_depth: init,
                path_mtu: mtu,
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                ack_timeout,
                traffic_class: tos,
                hop_limit: HOP_LIMIT,
                qkey: if ud { UDP_QKEY } else { 0 },
                ..Default::default()
            };
            s.phase = Phase::Connecting;
        }
        let comm = if ud {
            let mut private = [0u8; w::private_len::SIDR_REQ];
            hdr.emit(&mut private);
            private[CmaHdr::LEN..CmaHdr::LEN + param.private_data.len()]
                .copy_from_slice(&param.private_data);
            a.start_connect(self, peer_gid, true, |comm| {
                CmMsg::SidrReq(Box::new(w::SidrReqRepr {
                    request_id: comm,
                    pkey: 0xffff,
                    service_id: service,
                    private,
                }))
            })
        } else {
            let mut private = [0u8; w::private_len::REQ];
            hdr.emit(&mut private);
            private[CmaHdr::LEN..CmaHdr::LEN + param.private_data.len()]
                .copy_from_slice(&param.private_data);
            let local_gid = a.gid;
            let guid = a.guid;
            a.start_connect(self, peer_gid, false, |comm| {
                CmMsg::Req(Box::new(w::ReqRepr {
                    local_comm_id: comm,
                    service_id: service,
                    local_ca_guid: guid,
                    local_qkey: 0,
                    local_qpn: qpn,
                    responder_resources: resp,
                    initiator_depth: init,
                    remote_cm_response_timeout: agent::CM_RESPONSE_TIMEOUT,
                    local_cm_response_timeout: agent::CM_RESPONSE_TIMEOUT,
                    transport_service_type: if qp_type == QpType::Uc {
                        w::service_type::UC
                    } else {
                        w::service_type::RC
                    },
                    flow_control: param.flow_control,
                    starting_psn: psn,
                    retry_count: param.retry_count.min(7),
                    rnr_retry_count: param.rnr_retry_count.min(7),
                    pkey: 0xffff,
                    path_mtu: mtu,
                    max_cm_retries: agent::MAX_CM_RETRIES,
                    srq: param.srq,
                    primary: w::PathRepr {
                        local_lid: 0xffff,
                        remote_lid: 0xffff,
                        local_gid,
                        remote_gid: peer_gid,
                        // rdma_cm's flow label for RoCEv2 paths, from the
                        // ports (what the kernel sends, golden/cm).
                        flow_label: (src.port() as u32 * 31 + dst.port() as u32) & 0xf_ffff,
                        packet_rate: PACKET_RATE,
                        traffic_class: tos,
                        hop_limit: HOP_LIMIT,
                        sl: 0,
                        subnet_local: false,
                        local_ack_timeout: ack_timeout,
                    },
                    alternate: w::PathRepr::default(),
                    private,
                }))
            })
        };
        self.st().comm = Some(comm);
        Ok(())
    }

    /// `rdma_accept` (after the caller moved its QP to RTS with
    /// [`CmId::init_qp_attr`]'s attributes): send the REP (or SIDR_REP)
    /// for the QP `qpn`; ESTABLISHED follows the peer's RTU (UD: at once).
    pub fn accept(&self, param: &ConnParam, qpn: u32) -> Result<()> {
        let (dev, comm, qp_type, psn, qkey) = {
            let s = self.st();
            let (Some(d), Some(c)) = (s.dev.clone(), s.comm) else {
                return Err(inval("no connection request to accept on this ID"));
            };
            (d, c, s.qp_type, s.psn, s.agreed.qkey)
        };
        let ud = qp_type == QpType::Ud;
        let max = if ud {
            MAX_UD_ACCEPT_PRIVATE
        } else {
            MAX_ACCEPT_PRIVATE
        };
        if param.private_data.len() > max {
            return Err(inval("too much private data for an accept"));
        }
        let a = dev.0.clone();
        if ud {
            let mut private = [0u8; w::private_len::SIDR_REP];
            private[..param.private_data.len()].copy_from_slice(&param.private_data);
            a.accept(comm, |_, remote| {
                CmMsg::SidrRep(Box::new(w::SidrRepRepr {
                    request_id: remote,
                    status: w::sidr_status::SUCCESS,
                    add_info_length: 0,
                    qpn,
                    service_id: 0,
                    qkey,
                    class_port_info: [0; 72],
                    private,
                }))
            })?;
            self.st().phase = Phase::Connected;
            self.post(EventKind::Established, 0);
            return Ok(());
        }
        let (resp, init) = self.offer(param);
        let mut private = [0u8; w::private_len::REP];
        private[..param.private_data.len()].copy_from_slice(&param.private_data);
        let guid = a.guid;
        let rnr = param.rnr_retry_count.min(7);
        a.accept(comm, |local, remote| {
            CmMsg::Rep(Box::new(w::RepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                local_qkey: 0,
                local_qpn: qpn,
                starting_psn: psn,
                responder_resources: resp,
                initiator_depth: init,
                // What rxe's kernel CM sends (golden/cm).
                target_ack_delay: 15,
                failover_accepted: 0,
                flow_control: param.flow_control,
                rnr_retry_count: rnr,
                srq: param.srq,
                local_ca_guid: guid,
                private,
            }))
        })?;
        Ok(())
    }

    /// What an accept with `param` will agree (responder resources,
    /// initiator depth), set now so that [`CmId::init_qp_attr`] gives the
    /// QP the numbers the REP will carry. [`CmId::accept`] does it too.
    pub fn offer(&self, param: &ConnParam) -> (u8, u8) {
        let mut s = self.st();
        if s.offered {
            return (s.agreed.responder_resources, s.agreed.initiator_depth);
        }
        // The caller's numbers (0xff: what the peer asked for, up to the
        // device's most).
        let r = if param.responder_resources == 0xff {
            s.agreed.responder_resources
        } else {
            clamp_rd(param.responder_resources)
        };
        let i = if param.initiator_depth == 0xff {
            s.agreed.initiator_depth
        } else {
            clamp_rd(param.initiator_depth)
        };
        s.agreed.responder_resources = r;
        s.agreed.initiator_depth = i;
        s.offered = true;
        (r, i)
    }

    /// `rdma_reject`: turn the connection request down (REJ "consumer
    /// reject", or a SIDR_REP "rejected"), with private data.
    pub fn reject(&self, private: &[u8]) -> Result<()> {
        let (dev, comm, ud) = {
            let s = self.st();
            let (Some(d), Some(c)) = (s.dev.clone(), s.comm) else {
                return Err(inval("no connection request to reject on this ID"));
            };
            (d, c, s.qp_type == QpType::Ud)
        };
        let max = if ud {
            MAX_UD_ACCEPT_PRIVATE
        } else {
            MAX_REJECT_PRIVATE
        };
        if private.len() > max {
            return Err(inval("too much private data for a reject"));
        }
        dev.0
            .reject(comm, w::rej_reason::CONSUMER_REJECT, private)
            .map_err(Error::Io)?;
        let mut s = self.st();
        s.comm = None;
        s.phase = Phase::Disconnected;
        Ok(())
    }

    /// `rdma_establish`, and the second half of a connect: after the REP
    /// (CONNECT_RESPONSE) and the caller's move of its QP to RTS, send the
    /// RTU; reports nothing (the caller turns CONNECT_RESPONSE into
    /// ESTABLISHED) unless the peer disconnected before it: then
    /// DISCONNECTED follows.
    pub fn establish(&self) -> Result<()> {
        let (dev, comm) = {
            let s = self.st();
            let (Some(d), Some(c)) = (s.dev.clone(), s.comm) else {
                return Err(inval("no connection to establish on this ID"));
            };
            (d, c)
        };
        let left = dev.0.establish(comm).map_err(Error::Io)?;
        self.st().phase = Phase::Connected;
        if left {
            // The peer's DREQ came before the RTU (answered then):
            // reported now, after the connection it ends.
            self.disconnected();
        }
        Ok(())
    }

    /// `rdma_disconnect` (after the caller moved its QP to the error
    /// state): send a DREQ; DISCONNECTED follows the DREP. Nothing is sent
    /// if the peer disconnected first.
    pub fn disconnect(&self) -> Result<()> {
        let (dev, comm, ud) = {
            let s = self.st();
            (s.dev.clone(), s.comm, s.qp_type == QpType::Ud)
        };
        if ud {
            return Ok(());
        }
        let (Some(dev), Some(comm)) = (dev, comm) else {
            return Err(io_err(io::ErrorKind::NotConnected, "not connected".into()));
        };
        dev.0.disconnect(comm).map_err(Error::Io)?;
        Ok(())
    }

    /// `rdma_destroy_id`: stop listening, answer for an open connection as
    /// the kernel's CM does (REJ a pending request, DREQ an established
    /// connection), and forget the ID.
    pub fn destroy(&self) {
        let (listening, dev, comm) = {
            let mut s = self.st();
            if s.destroyed {
                return;
            }
            s.destroyed = true;
            (
                std::mem::take(&mut s.listening),
                s.dev.clone(),
                s.comm.take(),
            )
        };
        for (d, svc) in listening {
            d.0.unlisten(svc, self);
        }
        if let (Some(d), Some(c)) = (dev, comm) {
            d.0.forget(c);
        }
    }

    /// `rdma_init_qp_attr`: the attributes (and mask) that move the ID's
    /// QP to `state` — INIT (port, P_Key index, access or Q_Key), RTR
    /// (path, peer QP, the RQ PSN we offered, responder resources) or RTS
    /// (the SQ PSN the peer offered, timeouts and retries, initiator
    /// depth).
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, AttrMask)> {
        let s = self.st();
        let ud = s.qp_type == QpType::Ud;
        let rc = s.qp_type == QpType::Rc;
        let a = s.agreed;
        let mut attr = QpAttr {
            qp_state: state,
            ..Default::default()
        };
        let mask = match state {
            QpState::Init => {
                attr.port_num = 1;
                attr.pkey_index = 0;
                if ud {
                    attr.qkey = UDP_QKEY;
                    AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
                } else {
                    attr.qp_access_flags = AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC;
                    AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
                }
            }
            QpState::Rtr if ud => AttrMask::STATE,
            QpState::Rts if ud => {
                attr.sq_psn = s.psn;
                AttrMask::STATE | AttrMask::SQ_PSN
            }
            QpState::Rtr => {
                if !matches!(s.phase, Phase::Connecting | Phase::Connected) || a.peer_qpn == 0 {
                    return Err(inval("the ID has no peer yet (no REQ or REP)"));
                }
                attr.path_mtu = mtu_of(a.path_mtu);
                attr.dest_qp_num = a.peer_qpn;
                attr.rq_psn = s.psn;
                attr.av = AddressVector {
                    dgid: a.peer_gid,
                    sgid_index: s.dev.as_ref().map_or(0, Cm::gid_index),
                    hop_limit: a.hop_limit,
                    traffic_class: a.traffic_class,
                    flow_label: 0,
                    sl: 0,
                };
                let m = AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN;
                if rc {
                    attr.max_dest_rd_atomic = a.responder_resources;
                    attr.min_rnr_timer = MIN_RNR_TIMER;
                    m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
                } else {
                    m
                }
            }
            QpState::Rts => {
                if !matches!(s.phase, Phase::Connecting | Phase::Connected) || a.peer_qpn == 0 {
                    return Err(inval("the ID has no peer yet (no REQ or REP)"));
                }
                attr.sq_psn = a.peer_psn;
                if rc {
                    attr.timeout = a.ack_timeout;
                    attr.retry_cnt = a.retry_count;
                    attr.rnr_retry = a.rnr_retry_count;
                    attr.max_rd_atomic = a.initiator_depth;
                    AttrMask::STATE
                        | AttrMask::SQ_PSN
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC
                } else {
                    AttrMask::STATE | AttrMask::SQ_PSN
                }
            }
            QpState::Err | QpState::Reset => AttrMask::STATE,
            _ => return Err(inval("rdma_init_qp_attr: INIT, RTR, RTS or ERR")),
        };
        Ok((attr, mask))
    }

    // ---- called by the agent (its table locked, no ID lock held) ----

    /// A REQ for this listener: the new ID for it, or None if the REQ is
    /// not for us (the address it connects to is not the one we listen on,
    /// or a QP type this port space does not carry).
    fn child_for_req(
        &self,
        a: &Agent,
        sgid: &[u8; 16],
        comm: u32,
        req: &w::ReqRepr,
    ) -> Option<CmId> {
        let hdr = CmaHdr::parse(&req.private).ok()?;
        let s = self.st();
        if s.destroyed || s.phase != Phase::Listening {
            log("REQ refused: the listener is gone");
            return None;
        }
        if let Some(bound) = s.src {
            if !bound.ip().is_unspecified() && !same_ip(bound.ip(), hdr.dst) {
                log(&format!(
                    "REQ refused: for {}, the listener is bound to {}",
                    hdr.dst,
                    bound.ip()
                ));
                return None;
            }
        }
        let qp_type = match req.transport_service_type {
            w::service_type::RC => QpType::Rc,
            w::service_type::UC if s.ps == PortSpace::Ib => QpType::Uc,
            _ => return None,
        };
        if s.ps == PortSpace::Udp {
            return None;
        }
        let dev = s
            .listening
            .iter()
            .find(|(d, _)| d.0.gid == a.gid)?
            .0
            .clone();
        let port = s.src.map_or(0, |p| p.port());
        let child = CmId::new(&s.channel, s.ps);
        {
            let mut c = child.st();
            c.qp_type = qp_type;
            c.dev = Some(dev);
            c.src = Some(SocketAddr::new(a.addr, port));
            c.dst = Some(hdr.src);
            c.phase = Phase::Connecting;
            c.comm = Some(comm);
            c.tos = s.tos;
            c.agreed = Agreed {
                peer_gid: *sgid,
                peer_qpn: req.local_qpn,
                peer_psn: req.starting_psn,
                // The peer's initiator depth is what it asks us to serve.
                responder_resources: clamp_rd(req.initiator_depth),
                initiator_depth: clamp_rd(req.responder_resources),
                path_mtu: req.path_mtu.min(mtu_code(a.path_mtu())),
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                ack_timeout: req.primary.local_ack_timeout,
                traffic_class: req.primary.traffic_class,
                hop_limit: req.primary.hop_limit.max(1),
                qkey: 0,
            };
        }
        Some(child)
    }

    fn connect_request(&self, child: CmId, req: &w::ReqRepr) {
        let (ch, init, resp) = {
            let c = child.st();
            (
                c.channel.clone(),
                c.agreed.initiator_depth,
                c.agreed.responder_resources,
            )
        };
        ch.push(CmEvent {
            id: child,
            listen_id: Some(self.clone()),
            kind: EventKind::ConnectRequest,
            status: 0,
            conn: ConnParam {
                private_data: req.private[CmaHdr::LEN..].to_vec(),
                responder_resources: resp,
                initiator_depth: init,
                flow_control: req.flow_control,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
            },
            ud: None,
        });
    }

    fn child_for_sidr(
        &self,
        a: &Agent,
        sgid: &[u8; 16],
        comm: u32,
        req: &w::SidrReqRepr,
    ) -> Option<CmId> {
        let hdr = CmaHdr::parse(&req.private).ok()?;
        let s = self.st();
        if s.destroyed || s.phase != Phase::Listening || s.qp_type != QpType::Ud {
            return None;
        }
        if let Some(bound) = s.src {
            if !bound.ip().is_unspecified() && !same_ip(bound.ip(), hdr.dst) {
                return None;
            }
        }
        let dev = s
            .listening
            .iter()
            .find(|(d, _)| d.0.gid == a.gid)?
            .0
            .clone();
        let port = s.src.map_or(0, |p| p.port());
        let child = CmId::new(&s.channel, s.ps);
        {
            let mut c = child.st();
            c.qp_type = QpType::Ud;
            c.dev = Some(dev);
            c.src = Some(SocketAddr::new(a.addr, port));
            c.dst = Some(hdr.src);
            c.phase = Phase::Connecting;
            c.comm = Some(comm);
            c.agreed = Agreed {
                peer_gid: *sgid,
                qkey: UDP_QKEY,
                hop_limit: HOP_LIMIT,
                ..Default::default()
            };
        }
        Some(child)
    }

    fn sidr_request(&self, child: CmId, req: &w::SidrReqRepr) {
        let (ch, gid) = {
            let c = child.st();
            (c.channel.clone(), c.agreed.peer_gid)
        };
        let private = req.private[CmaHdr::LEN..].to_vec();
        ch.push(CmEvent {
            id: child,
            listen_id: Some(self.clone()),
            kind: EventKind::ConnectRequest,
            status: 0,
            conn: ConnParam {
                private_data: private.clone(),
                ..Default::default()
            },
            ud: Some(UdParam {
                private_data: private,
                dgid: gid,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
                qp_num: 0,
                qkey: UDP_QKEY,
            }),
        });
    }

    fn connect_response(&self, rep: &w::RepRepr) {
        let (ch, conn) = {
            let mut s = self.st();
            s.agreed.peer_qpn = rep.local_qpn;
            s.agreed.peer_psn = rep.starting_psn;
            // The peer serves what it says (our initiator depth) and asks
            // us to serve its initiator depth.
            s.agreed.initiator_depth = clamp_rd(rep.responder_resources);
            s.agreed.responder_resources = clamp_rd(rep.initiator_depth);
            s.agreed.rnr_retry_count = rep.rnr_retry_count;
            (
                s.channel.clone(),
                ConnParam {
                    private_data: rep.private.to_vec(),
                    responder_resources: rep.initiator_depth,
                    initiator_depth: rep.responder_resources,
                    flow_control: rep.flow_control,
                    retry_count: s.agreed.retry_count,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                },
            )
        };
        ch.push(CmEvent {
            id: self.clone(),
            listen_id: None,
            kind: EventKind::ConnectResponse,
            status: 0,
            conn,
            ud: None,
        });
    }

    fn established(&self) {
        self.st().phase = Phase::Connected;
        self.post(EventKind::Established, 0);
    }

    fn rejected(&self, reason: u16, private: &[u8]) {
        let ch = {
            let mut s = self.st();
            s.comm = None;
            s.phase = Phase::Disconnected;
            s.channel.clone()
        };
        ch.push(CmEvent {
            id: self.clone(),
            listen_id: None,
            kind: EventKind::Rejected,
            status: reason as i32,
            conn: ConnParam {
                private_data: private.to_vec(),
                ..Default::default()
            },
            ud: None,
        });
    }

    fn disconnected(&self) {
        self.st().phase = Phase::Disconnected;
        self.post(EventKind::Disconnected, 0);
    }

    fn timed_out(&self, kind: EventKind, status: i32) {
        {
            let mut s = self.st();
            s.phase = Phase::Disconnected;
            if kind == EventKind::Unreachable {
                s.comm = None;
            }
        }
        self.post(kind, status);
    }

    fn sidr_answered(&self, sgid: &[u8; 16], rep: &w::SidrRepRepr) {
        let (ch, hop, tc) = {
            let mut s = self.st();
            s.comm = None;
            if rep.status == w::sidr_status::SUCCESS {
                s.phase = Phase::Connected;
                s.agreed.peer_qpn = rep.qpn;
                s.agreed.qkey = rep.qkey;
            } else {
                s.phase = Phase::Disconnected;
            }
            (
                s.channel.clone(),
                s.agreed.hop_limit,
                s.agreed.traffic_class,
            )
        };
        let ok = rep.status == w::sidr_status::SUCCESS;
        let ud = UdParam {
            private_data: rep.private.to_vec(),
            dgid: *sgid,
            hop_limit: hop,
            traffic_class: tc,
            qp_num: rep.qpn,
            qkey: rep.qkey,
        };
        ch.push(CmEvent {
            id: self.clone(),
            listen_id: None,
            kind: if ok {
                EventKind::Established
            } else {
                EventKind::Unreachable
            },
            status: rep.status as i32,
            conn: ConnParam {
                private_data: rep.private.to_vec(),
                qp_num: rep.qpn,
                ..Default::default()
            },
            ud: Some(ud),
        });
    }

    /// Whether the ID's connection is established (the agent's view).
    pub fn is_connected(&self) -> bool {
        let (dev, comm) = {
            let s = self.st();
            (s.dev.clone(), s.comm)
        };
        match (dev, comm) {
            (Some(d), Some(c)) => d.0.state(c) == Some(State::Established),
            _ => false,
        }
    }

    /// Same object as `other` on the same channel.
    pub fn reports_to(&self, ch: &EventChannel) -> bool {
        self.st().channel.same(ch)
    }

    /// Same device as `d`.
    pub fn on_device(&self, d: &Cm) -> bool {
        self.st().dev.as_ref().is_some_and(|x| x.same(d))
    }
}

fn is_loopback(a: IpAddr) -> bool {
    match a {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        IpAddr::V4(v4) => v4.is_loopback(),
    }
}

fn same_ip_family(a: IpAddr, b: IpAddr) -> bool {
    let v4 = |x: IpAddr| match x {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    };
    v4(a) == v4(b)
}

/// The hop limit of a RoCEv2 path (`IPV6_DEFAULT_HOPLIMIT`).
const HOP_LIMIT: u8 = 64;
/// The local ACK timeout an active side asks for unless told
/// (`RDMA_OPTION_ID_ACK_TIMEOUT`): 4.096 µs × 2^14 ≈ 67 ms, rxe's default
/// and what the kernel's rdma_cm derives on RoCE.
const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// The RNR NAK timer an RC responder advertises: IBA code 0, 655.36 ms,
/// what the kernel's `cm_init_qp_rtr_attr` gives every rdma_cm QP. A sender
/// that finds no receive posted waits that long per RNR retry, so a peer
/// that posts its receive a moment late (rdma-core's
/// `test_rdmacm_async_traffic_external_qp` posts it after its own SEND
/// completes) is waited for as the kernel's stack waits, rather than
/// exhausting pyverbs' five retries in 3.2 ms as code 12 (0.64 ms) did.
const MIN_RNR_TIMER: u8 = 0;
/// The packet rate the primary path reports (0, as rxe's kernel sends).
const PACKET_RATE: u8 = 0;

impl Agent {
    /// The path MTU this device offers: its port's active MTU, at most
    /// the largest that fits the MTU of the interface its address is on,
    /// as the kernel's rdma_cm sets a RoCE path's (`iboe_get_mtu` of the
    /// netdev's MTU). A REQ for 4096 from a device on a 1500-byte link
    /// would have a kernel peer send 4096-byte payloads it cannot carry.
    fn path_mtu(&self) -> Mtu {
        let port = self.eng.lock().ep.config().port_mtu;
        match crate::device::interface_mtu(self.addr).and_then(crate::device::roce_mtu) {
            Some(link) => port.min(link),
            None => port,
        }
    }
}
