//! The everyday layer over the connection manager: blocking calls with
//! timeouts that connect a caller's QP by IP address and port, carry
//! private data both ways, and move the QP through INIT, RTR and RTS at
//! the moments rdma_cm does — so an application neither drives the event
//! model ([`CmId`], [`EventChannel`]) nor hand-rolls a TCP exchange
//! ([`crate::oob`]).
//!
//! * RC: [`Listener::bind`] → [`Listener::accept`] (or
//!   [`Listener::next_request`], to look at the peer's private data before
//!   [`Request::accept`] or [`Request::reject`]); [`connect`] on the other
//!   side. Both give back a [`Connection`], which holds the CM state
//!   (dropping it disconnects) and the peer's private data; the QP stays
//!   the caller's, connected and in RTS.
//! * UD (SIDR): [`UdListener::bind`] → [`UdListener::next_request`] →
//!   [`UdRequest::accept`] answers with a UD QP's number and Q_Key;
//!   [`resolve_ud`] asks for a service and gives the [`UdPeer`] to send to.
//!
//! Errors name the problem: [`Error::Rejected`] (the peer said no: its
//! reason and private data), `Error::Io` with
//! [`std::io::ErrorKind::HostUnreachable`] (nobody answered the CM's
//! retries), [`Error::Timeout`] (the caller's timeout passed first).
//!
//! The wire is what the kernel's rdma_cm speaks, so the peer may be a
//! librdmacm program (ours, or the kernel's over rxe).

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{
    CmEvent, CmId, ConnParam, EventChannel, EventKind, PortSpace, UdParam, MAX_RD_ATOMIC, UDP_QKEY,
};
use crate::{Ah, Context, Error, Qp, QpState, QpType, Result, UdDest};
use softrdma_wire::cm as w;

/// How the blocking calls connect: how long they wait, and the read and
/// atomic depth and retries offered (`struct rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmOptions {
    /// How long a call waits for the peer (default 10 s). The CM's own
    /// retries (15 × ~4 s) outlast it; a call that times out abandons the
    /// attempt (the peer gets a REJ if it answers later).
    pub timeout: Duration,
    /// Reads and atomics this side serves at once (`responder_resources`,
    /// the QP's `max_dest_rd_atomic`; default 16, the device's most). An
    /// accept offers at most what the requester asked for.
    pub responder_resources: u8,
    /// Reads and atomics this side issues at once (`initiator_depth`,
    /// `max_rd_atomic`; default 16).
    pub initiator_depth: u8,
    /// Transport retries (0..=7, default 7).
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = for ever, the default).
    pub rnr_retry_count: u8,
}

impl Default for CmOptions {
    fn default() -> Self {
        CmOptions {
            timeout: Duration::from_secs(10),
            responder_resources: MAX_RD_ATOMIC,
            initiator_depth: MAX_RD_ATOMIC,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl CmOptions {
    /// These options with another timeout.
    pub fn with_timeout(mut self, t: Duration) -> CmOptions {
        self.timeout = t;
        self
    }

    fn param(&self, private: &[u8]) -> ConnParam {
        ConnParam {
            private_data: private.to_vec(),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            ..Default::default()
        }
    }
}

/// Why a peer turned a connection down ([`Error::Rejected`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The REJ reason (IBA table 112: 28 "consumer defined" when the peer's
    /// application rejected, 8 "invalid service ID" when nobody listens),
    /// or for a UD service the SIDR_REP status (2 "rejected", 1 "service
    /// ID not supported").
    pub reason: u16,
    /// Whether this answered a SIDR request (UD) rather than a REQ.
    pub sidr: bool,
    /// What the peer said with it (the application's reason, if any).
    pub private_data: Vec<u8>,
}

impl Rejection {
    /// The reason's name, in the kernel's words.
    pub fn reason_name(&self) -> &'static str {
        let n = if self.sidr {
            u8::try_from(self.reason)
                .ok()
                .and_then(w::sidr_status::name)
        } else {
            w::rej_reason::name(self.reason)
        };
        n.unwrap_or("unknown reason")
    }

    /// The peer's application said no (REJ "consumer reject", SIDR
    /// "rejected").
    pub fn by_application(&self) -> bool {
        if self.sidr {
            self.reason == w::sidr_status::REJECT as u16
        } else {
            self.reason == w::rej_reason::CONSUMER_REJECT
        }
    }

    /// Nobody listens on the service (REJ "invalid service ID", SIDR
    /// "service ID not supported").
    pub fn no_listener(&self) -> bool {
        if self.sidr {
            self.reason == w::sidr_status::UNSUPPORTED as u16
        } else {
            self.reason == w::rej_reason::INVALID_SERVICE_ID
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the peer rejected the connection: {} ({})",
            self.reason_name(),
            self.reason
        )?;
        let p = trim_zeros(&self.private_data);
        if !p.is_empty() {
            match std::str::from_utf8(p) {
                Ok(s) if s.chars().all(|c| !c.is_control()) => write!(f, ", saying {s:?}")?,
                _ => write!(f, ", with {} bytes of private data", p.len())?,
            }
        }
        Ok(())
    }
}

/// `b` without the zeros the wire pads private data with.
fn trim_zeros(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    &b[..end]
}

fn io_err(kind: io::ErrorKind, msg: String) -> Error {
    Error::Io(io::Error::new(kind, msg))
}

/// Wait on `ch` for one of `want` about `id`, turning the failures into
/// errors that name them.
fn wait_for(
    ch: &EventChannel,
    id: &CmId,
    want: &[EventKind],
    deadline: Instant,
    what: &'static str,
) -> Result<CmEvent> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(what));
        }
        let Some(ev) = ch.get(Some(left)) else {
            return Err(Error::Timeout(what));
        };
        if ev.id != *id {
            continue;
        }
        if want.contains(&ev.kind) {
            return Ok(ev);
        }
        let peer = id
            .dst_addr()
            .map_or_else(|| "the peer".to_string(), |a| a.to_string());
        return Err(match ev.kind {
            EventKind::Rejected => Error::Rejected(Rejection {
                reason: ev.status as u16,
                sidr: false,
                private_data: ev.conn.private_data,
            }),
            EventKind::Unreachable if ev.ud.is_some() && ev.status > 0 => {
                Error::Rejected(Rejection {
                    reason: ev.status as u16,
                    sidr: true,
                    private_data: ev.conn.private_data,
                })
            }
            EventKind::Unreachable => io_err(
                io::ErrorKind::HostUnreachable,
                format!("{peer} is unreachable: no answer to the connection manager's retries"),
            ),
            EventKind::AddrError | EventKind::RouteError => io_err(
                io::ErrorKind::AddrNotAvailable,
                format!("no softrdma device reaches {peer}"),
            ),
            EventKind::ConnectError => io_err(
                io::ErrorKind::ConnectionAborted,
                format!("the connection to {peer} failed (its RTU never came)"),
            ),
            EventKind::Disconnected => io_err(
                io::ErrorKind::ConnectionReset,
                format!("{peer} disconnected"),
            ),
            k => io_err(
                io::ErrorKind::Other,
                format!("unexpected connection manager event {}", k.name()),
            ),
        });
    }
}

/// Move `qp` with the attributes `id` gives for `state`.
fn move_qp(id: &CmId, qp: &Qp, state: QpState) -> Result<()> {
    let (attr, mask) = id.init_qp_attr(state)?;
    qp.modify(&attr, mask)
}

/// Check that `qp` is of `t` and in RESET, or (RC and UC) in INIT with
/// receives posted; the blocking calls move it from there.
fn fresh(qp: &Qp, t: &[QpType]) -> Result<QpState> {
    if !t.contains(&qp.qp_type()) {
        return Err(crate::CoreError::InvalidArgument(
            "the QP's type does not fit the connection (RC or UC for connect/accept, UD for a UD service)",
        )
        .into());
    }
    let (state, _, _) = qp.query()?;
    let ok = state == QpState::Reset || (state == QpState::Init && qp.qp_type() != QpType::Ud);
    if !ok {
        return Err(crate::CoreError::InvalidState {
            what: "connect a QP through the connection manager (it must be in RESET, or INIT)",
            state,
        }
        .into());
    }
    Ok(state)
}

/// Move `qp` (checked by [`fresh`]) to INIT with what `id` says, unless
/// it is there already (the caller posted receives first).
fn to_init(id: &CmId, qp: &Qp, from: QpState) -> Result<()> {
    if from == QpState::Reset {
        move_qp(id, qp, QpState::Init)?;
    }
    Ok(())
}

/// An established connection: the CM's side of a connected QP (the QP
/// itself stays the caller's). Dropping it disconnects (a DREQ, as the
/// kernel sends when an rdma_cm ID is destroyed).
#[derive(Debug)]
pub struct Connection {
    id: CmId,
    ch: EventChannel,
    private_data: Vec<u8>,
    peer_qpn: u32,
}

impl Connection {
    /// The private data the peer sent (its REQ's or REP's, zero-padded
    /// by the wire to the message's size).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.dst_addr()
    }

    /// This side's address and port.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.src_addr()
    }

    /// The peer's QP number.
    pub fn peer_qpn(&self) -> u32 {
        self.peer_qpn
    }

    /// The underlying ID, for what this layer does not cover.
    pub fn cm_id(&self) -> &CmId {
        &self.id
    }

    /// Its event channel, for the crate's tests.
    #[cfg(test)]
    pub(crate) fn channel(&self) -> &EventChannel {
        &self.ch
    }

    /// Wait until the peer disconnects (or `timeout` passes: `Ok(false)`).
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(ev) = self.ch.get(Some(left)) else {
                return Ok(false);
            };
            if ev.id == self.id && ev.kind == EventKind::Disconnected {
                return Ok(true);
            }
        }
    }

    /// Disconnect: send a DREQ and wait (at most `timeout`) for the peer's
    /// DREP. Move the QP to the error state first if its outstanding work
    /// should complete flushed (librdmacm's `rdma_disconnect` does).
    pub fn disconnect(self, timeout: Duration) -> Result<()> {
        self.id.disconnect()?;
        let r = wait_for(
            &self.ch,
            &self.id,
            &[EventKind::Disconnected],
            Instant::now() + timeout,
            "the peer's DREP",
        );
        r.map(|_| ())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.id.destroy();
    }
}

/// Connect the RC (or UC) QP `qp`, in RESET (or INIT, receives posted), to the service at `addr`
/// (another process's [`Listener`], or any rdma_cm listener in the TCP
/// port space): address resolution, a REQ with `private_data` (at most
/// [`super::MAX_CONNECT_PRIVATE`] bytes), and the QP moved to INIT, RTR
/// and RTS with what the REP agreed. On return the QP is connected and
/// the [`Connection`] carries the peer's REP private data.
pub fn connect(
    ctx: &Context,
    addr: SocketAddr,
    qp: &Qp,
    private_data: &[u8],
    opts: &CmOptions,
) -> Result<Connection> {
    let from = fresh(qp, &[QpType::Rc, QpType::Uc])?;
    let deadline = Instant::now() + opts.timeout;
    let cm = ctx.connection_manager()?;
    let ch = EventChannel::new()?;
    let ps = if qp.qp_type() == QpType::Uc {
        PortSpace::Ib
    } else {
        PortSpace::Tcp
    };
    let id = CmId::new(&ch, ps);
    let run = || -> Result<Connection> {
        id.set_qp_type(qp.qp_type())?;
        id.resolve_addr(None, addr, std::slice::from_ref(&cm))?;
        wait_for(
            &ch,
            &id,
            &[EventKind::AddrResolved],
            deadline,
            "address resolution",
        )?;
        id.resolve_route()?;
        wait_for(
            &ch,
            &id,
            &[EventKind::RouteResolved],
            deadline,
            "route resolution",
        )?;
        to_init(&id, qp, from)?;
        id.connect(&opts.param(private_data), qp.qpn())?;
        let ev = wait_for(
            &ch,
            &id,
            &[EventKind::ConnectResponse],
            deadline,
            "the peer's REP (connect)",
        )?;
        move_qp(&id, qp, QpState::Rtr)?;
        move_qp(&id, qp, QpState::Rts)?;
        id.establish()?;
        Ok(Connection {
            id: id.clone(),
            ch: ch.clone(),
            private_data: ev.conn.private_data,
            peer_qpn: ev.conn.qp_num,
        })
    };
    run().inspect_err(|_| id.destroy())
}

/// A service in the TCP port space (RC) taking connection requests: what
/// a TCP listener is to sockets. Dropping it stops listening.
#[derive(Debug)]
pub struct Listener {
    id: CmId,
    ch: EventChannel,
}

impl Listener {
    /// Listen at `addr` (port 0 picks one; the wildcard address or a
    /// loopback one listens on the context's device).
    pub fn bind(ctx: &Context, addr: SocketAddr) -> Result<Listener> {
        bind(ctx, addr, PortSpace::Tcp).map(|(id, ch)| Listener { id, ch })
    }

    /// [`Listener::bind`] in the IB port space (`RDMA_PS_IB`), whose
    /// requests connect RC or UC QPs: where [`connect`] sends a UC QP's.
    pub fn bind_ib(ctx: &Context, addr: SocketAddr) -> Result<Listener> {
        bind(ctx, addr, PortSpace::Ib).map(|(id, ch)| Listener { id, ch })
    }

    /// The address and port listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.id.src_addr().expect("bound")
    }

    /// The next connection request (waiting at most `timeout`), to accept
    /// or reject after looking at its private data.
    pub fn next_request(&self, timeout: Duration) -> Result<Request> {
        next_request(&self.ch, timeout).map(|(id, ch, ev)| Request {
            id,
            ch,
            conn: ev.conn,
            answered: false,
        })
    }

    /// Take the next connection request and accept it on `qp` (in RESET or INIT)
    /// with `private_data` in the REP: [`Listener::next_request`], then
    /// [`Request::accept`].
    pub fn accept(&self, qp: &Qp, private_data: &[u8], opts: &CmOptions) -> Result<Connection> {
        let deadline = Instant::now() + opts.timeout;
        let req = self.next_request(opts.timeout)?;
        let left = deadline.saturating_duration_since(Instant::now());
        req.accept(qp, private_data, &opts.clone().with_timeout(left))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.id.destroy();
    }
}

fn bind(ctx: &Context, addr: SocketAddr, ps: PortSpace) -> Result<(CmId, EventChannel)> {
    let cm = ctx.connection_manager()?;
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, ps);
    let devs = [cm];
    // The wildcard listens on this context's device only.
    let at = if addr.ip().is_unspecified() {
        SocketAddr::new(devs[0].addr(), addr.port())
    } else {
        addr
    };
    id.bind(at, &devs)?;
    if let Err(e) = id.listen(&devs) {
        id.destroy();
        return Err(e);
    }
    Ok((id, ch))
}

/// The next CONNECT_REQUEST on a listener's channel: the new ID, moved to
/// a channel of its own.
fn next_request(ch: &EventChannel, timeout: Duration) -> Result<(CmId, EventChannel, CmEvent)> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(ev) = ch.get(Some(left)).filter(|_| !left.is_zero()) else {
            return Err(Error::Timeout("a connection request"));
        };
        if ev.kind != EventKind::ConnectRequest {
            continue;
        }
        let own = EventChannel::new()?;
        ev.id.migrate(&own);
        return Ok((ev.id.clone(), own, ev));
    }
}

/// A connection request waiting for an answer. Dropping it unanswered
/// rejects it.
#[derive(Debug)]
pub struct Request {
    id: CmId,
    ch: EventChannel,
    conn: ConnParam,
    /// Accepted: the ID belongs to the [`Connection`] now.
    answered: bool,
}

impl Request {
    /// The private data of the REQ (the requester's, zero-padded to
    /// [`super::MAX_CONNECT_PRIVATE`] bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.conn.private_data
    }

    /// The requester's address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.dst_addr()
    }

    /// The requester's QP number.
    pub fn peer_qpn(&self) -> u32 {
        self.conn.qp_num
    }

    /// The QP type the requester connects (RC, or UC in the IB space).
    pub fn qp_type(&self) -> QpType {
        self.id.qp_type()
    }

    /// Accept on `qp` (in RESET, or in INIT with receives already posted
    /// — moved there with [`crate::Qp::modify_to`]): the QP moves to INIT, RTR and RTS with
    /// what the REQ asked, then the REP goes out with `private_data` (at
    /// most [`super::MAX_ACCEPT_PRIVATE`] bytes); returns once the
    /// requester's RTU has come (or `opts.timeout` passed).
    pub fn accept(self, qp: &Qp, private_data: &[u8], opts: &CmOptions) -> Result<Connection> {
        let deadline = Instant::now() + opts.timeout;
        let mut param = opts.param(private_data);
        param.responder_resources = param.responder_resources.min(self.conn.responder_resources);
        param.initiator_depth = param.initiator_depth.min(self.conn.initiator_depth);
        let id = self.id.clone();
        let run = || -> Result<()> {
            if qp.qp_type() != id.qp_type() {
                return Err(crate::CoreError::InvalidArgument(
                    "the QP's type is not the one the requester connects",
                )
                .into());
            }
            let from = fresh(qp, &[QpType::Rc, QpType::Uc])?;
            id.offer(&param);
            to_init(&id, qp, from)?;
            move_qp(&id, qp, QpState::Rtr)?;
            move_qp(&id, qp, QpState::Rts)
        };
        if let Err(e) = run() {
            let _ = id.reject(&[]);
            return Err(e);
        }
        id.accept(&param, qp.qpn())?;
        wait_for(
            &self.ch,
            &id,
            &[EventKind::Established],
            deadline,
            "the requester's RTU (accept)",
        )?;
        let mut this = self;
        this.answered = true;
        Ok(Connection {
            id,
            ch: this.ch.clone(),
            private_data: std::mem::take(&mut this.conn.private_data),
            peer_qpn: this.conn.qp_num,
        })
    }

    /// Turn the request down with `private_data` (at most
    /// [`super::MAX_REJECT_PRIVATE`] bytes: the reason, as the application
    /// says it): the requester's [`connect`] fails with
    /// [`Error::Rejected`] carrying it.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // Unanswered: destroying the ID rejects it (as the kernel does).
        if !self.answered {
            self.id.destroy();
        }
    }
}

/// A UD service in the UDP port space, answering SIDR requests with a UD
/// QP's number and Q_Key ([`UDP_QKEY`]). Dropping it stops listening.
#[derive(Debug)]
pub struct UdListener {
    id: CmId,
    ch: EventChannel,
}

impl UdListener {
    /// Serve at `addr` (port 0 picks one).
    pub fn bind(ctx: &Context, addr: SocketAddr) -> Result<UdListener> {
        bind(ctx, addr, PortSpace::Udp).map(|(id, ch)| UdListener { id, ch })
    }

    /// The address and port served.
    pub fn local_addr(&self) -> SocketAddr {
        self.id.src_addr().expect("bound")
    }

    /// The next SIDR request (waiting at most `timeout`).
    pub fn next_request(&self, timeout: Duration) -> Result<UdRequest> {
        next_request(&self.ch, timeout).map(|(id, _ch, ev)| UdRequest {
            id,
            ud: ev.ud.unwrap_or_default(),
        })
    }
}

impl Drop for UdListener {
    fn drop(&mut self) {
        self.id.destroy();
    }
}

/// A SIDR request: someone asks for the service's QP. Dropping it
/// unanswered rejects it.
#[derive(Debug)]
pub struct UdRequest {
    id: CmId,
    ud: UdParam,
}

impl UdRequest {
    /// The private data of the SIDR_REQ (zero-padded to
    /// [`super::MAX_UD_CONNECT_PRIVATE`] bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.ud.private_data
    }

    /// The requester's address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.dst_addr()
    }

    /// The requester's GID (where its datagrams come from).
    pub fn peer_gid(&self) -> [u8; 16] {
        self.ud.dgid
    }

    /// Answer with the UD QP `qp` and `private_data` (at most
    /// [`super::MAX_UD_ACCEPT_PRIVATE`] bytes). A QP in RESET is first
    /// moved to RTS with Q_Key [`UDP_QKEY`]; one already ready must have
    /// that Q_Key to receive what the requester sends.
    pub fn accept(self, qp: &Qp, private_data: &[u8]) -> Result<()> {
        if qp.qp_type() != QpType::Ud {
            return Err(
                crate::CoreError::InvalidArgument("a UD service answers with a UD QP").into(),
            );
        }
        if qp.query()?.0 == QpState::Reset {
            ready_ud(qp)?;
        }
        let param = ConnParam {
            private_data: private_data.to_vec(),
            ..Default::default()
        };
        self.id.accept(&param, qp.qpn())?;
        // Nothing more to say: a UD service keeps no connection.
        Ok(())
    }

    /// Turn the request down (SIDR_REP "rejected") with `private_data`:
    /// the requester's [`resolve_ud`] fails with [`Error::Rejected`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }
}

impl Drop for UdRequest {
    fn drop(&mut self) {
        self.id.destroy();
    }
}

/// Move a UD QP in RESET to RTS with Q_Key [`UDP_QKEY`], the Q_Key of UD
/// services ([`UdRequest::accept`] does it; a requester's own QP needs it
/// to receive the service's answers).
pub fn ready_ud(qp: &Qp) -> Result<()> {
    fresh(qp, &[QpType::Ud])?;
    let a = crate::QpAttr {
        port_num: 1,
        qkey: UDP_QKEY,
        sq_psn: 0,
        ..Default::default()
    };
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        qp.modify_to(s, &a)?;
    }
    Ok(())
}

/// A resolved UD service: where to send its datagrams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdPeer {
    /// The service's QP number.
    pub qpn: u32,
    /// The Q_Key to send with.
    pub qkey: u32,
    /// The service's GID.
    pub gid: [u8; 16],
    /// The private data of its SIDR_REP (zero-padded).
    pub private_data: Vec<u8>,
}

impl UdPeer {
    /// An address handle for the service.
    pub fn ah(&self) -> Ah {
        Ah::new(self.gid)
    }

    /// The destination of a UD send to the service (`wr.ud`).
    pub fn dest(&self) -> UdDest {
        self.ah().ud(self.qpn, self.qkey)
    }
}

/// Resolve the UD service at `addr` by SIDR: a SIDR_REQ with
/// `private_data` (at most [`super::MAX_UD_CONNECT_PRIVATE`] bytes), and
/// the service's QP number, Q_Key and GID from its SIDR_REP. Fails with
/// [`Error::Rejected`] if the service says no or nobody serves the port
/// ([`Rejection::no_listener`]), [`Error::Timeout`] after `timeout`.
pub fn resolve_ud(
    ctx: &Context,
    addr: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<UdPeer> {
    let deadline = Instant::now() + timeout;
    let cm = ctx.connection_manager()?;
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, PortSpace::Udp);
    let run = || -> Result<UdPeer> {
        id.resolve_addr(None, addr, std::slice::from_ref(&cm))?;
        wait_for(
            &ch,
            &id,
            &[EventKind::AddrResolved],
            deadline,
            "address resolution",
        )?;
        id.resolve_route()?;
        wait_for(
            &ch,
            &id,
            &[EventKind::RouteResolved],
            deadline,
            "route resolution",
        )?;
        id.connect(
            &ConnParam {
                private_data: private_data.to_vec(),
                ..Default::default()
            },
            0,
        )?;
        let ev = wait_for(
            &ch,
            &id,
            &[EventKind::Established],
            deadline,
            "the service's SIDR_REP",
        )?;
        let ud = ev.ud.unwrap_or_default();
        Ok(UdPeer {
            qpn: ud.qp_num,
            qkey: ud.qkey,
            gid: ud.dgid,
            private_data: ud.private_data,
        })
    };
    let r = run();
    id.destroy();
    r
}
