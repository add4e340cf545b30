//! The connection manager of one device: what the kernel's IB CM is to an
//! RNIC. It owns the device's QP1 inbox, speaks the CM protocol (REQ, REP,
//! RTU, REJ, MRA, DREQ, DREP, SIDR_REQ, SIDR_REP) with peers, retransmits
//! what is unanswered, answers duplicates, and turns what it learns into
//! events on the CM IDs of this process (see `super`).
//!
//! One thread per device that has a connection manager: it sleeps in
//! `poll` on the inbox's eventfd and a wake-up eventfd, with the earliest
//! retransmission deadline as its timeout; with nothing outstanding it has
//! no timeout and uses no CPU.
//!
//! Communication IDs: the top byte is the QPN slot of this process's port
//! (the steering of QP1 replies depends on it, see `softrdma_udp`'s
//! `cbpf`), the low 24 bits a counter from a random start.
//!
//! Locks: the table's lock is taken before an ID's (an event names an ID);
//! the ID layer (`super`) never holds an ID's lock while it calls in here.

use super::{CmId, EventKind};
use crate::engine::Engine;
use crate::gsi::{Inbox, MAD_LEN};
use crate::sys::EventFd;
use softrdma_wire::cm::{self as w, CmMsg};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// rdma_cm's CM response timeout, sent in every REQ (4.096 µs × 2^20 ≈
/// 4.3 s, `CMA_CM_RESPONSE_TIMEOUT`): how long a REQ, REP or DREQ waits
/// for its answer before it is sent again.
pub(crate) const CM_RESPONSE_TIMEOUT: u8 = 20;
/// How often it is sent again before the connection fails
/// (`CMA_MAX_CM_RETRIES`).
pub(crate) const MAX_CM_RETRIES: u8 = 15;

/// 4.096 µs × 2^t.
pub(crate) fn iba_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << t.min(31))
}

/// Where a connection of this device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Active: REQ sent, no REP yet.
    ReqSent,
    /// Active: REP received, RTU not sent yet (the application's QP is
    /// being moved to RTS, or it calls `rdma_establish` itself).
    RepRcvd,
    /// Passive: REQ received, the application has not answered.
    ReqRcvd,
    /// Passive: REP sent, no RTU yet.
    RepSent,
    Established,
    /// DREQ sent, no DREP yet.
    DreqSent,
    /// Disconnected (DREP sent or received, or the DREQ timed out).
    Closed,
    /// Active UD: SIDR_REQ sent.
    SidrReqSent,
    /// Passive UD: SIDR_REQ received, not answered yet.
    SidrReqRcvd,
    /// Passive UD: SIDR_REP sent.
    SidrDone,
}

/// A message waiting for its answer.
struct Resend {
    mad: Box<[u8; MAD_LEN]>,
    left: u8,
    every: Duration,
    at: Instant,
}

pub(crate) struct Conn {
    pub id: CmId,
    pub state: State,
    pub peer_gid: [u8; 16],
    /// The peer's communication ID (0 until known).
    pub remote_comm_id: u32,
    /// The peer's QP number (from its REQ or REP).
    pub peer_qpn: u32,
    /// Our QP number as our REQ or REP gave it (0 until sent): a DREQ
    /// must name it.
    local_qpn: u32,
    tid: u64,
    resend: Option<Resend>,
    /// The last answer sent, re-sent when the message it answered comes
    /// again (a REP for a repeated REQ, an RTU for a repeated REP, a DREP
    /// for a repeated DREQ, a SIDR_REP for a repeated SIDR_REQ).
    answer: Option<Box<[u8; MAD_LEN]>>,
    /// Active: the peer's DREQ came between its REP and our RTU (the
    /// application is still moving its QP): answered at once, reported
    /// as DISCONNECTED once the connection is established.
    peer_left: bool,
}

impl Conn {
    /// Whether a message from `sgid` that gives its sender's
    /// communication ID as `theirs` is from this connection's peer: the
    /// pair of IDs the kernel's CM looks a message up by (`cm_acquire_id`
    /// of its remote and local IDs), and the peer's GID. Before the peer's
    /// ID is known (a REQ sent, no REP yet) only the GID can be checked.
    fn is_from(&self, sgid: &[u8; 16], theirs: u32) -> bool {
        self.peer_gid == *sgid && (self.remote_comm_id == 0 || self.remote_comm_id == theirs)
    }
}

/// The CM message a MAD carries, for the trace.
fn mad_name(mad: &[u8; MAD_LEN]) -> &'static str {
    match w::parse(mad) {
        Ok((_, CmMsg::Req(_))) => "REQ",
        Ok((_, CmMsg::Rep(_))) => "REP",
        Ok((_, CmMsg::Rtu(_))) => "RTU",
        Ok((_, CmMsg::Rej(_))) => "REJ",
        Ok((_, CmMsg::Mra(_))) => "MRA",
        Ok((_, CmMsg::Dreq(_))) => "DREQ",
        Ok((_, CmMsg::Drep(_))) => "DREP",
        Ok((_, CmMsg::SidrReq(_))) => "SIDR_REQ",
        Ok((_, CmMsg::SidrRep(_))) => "SIDR_REP",
        Ok((_, CmMsg::Other(_))) => "another MAD",
        Err(_) => "a malformed MAD",
    }
}

/// A held request: its sender, the sender's ID, the MAD.
pub type Held = ([u8; 16], u32, Box<[u8; MAD_LEN]>);

#[derive(Default)]
struct Table {
    conns: HashMap<u32, Conn>,
    /// (peer GID, peer communication ID) → ours: duplicate REQs.
    remote: HashMap<([u8; 16], u32), u32>,
    /// Service ID → the listening ID.
    listeners: HashMap<u64, CmId>,
    /// Services whose REQs the port's steering sends here (see `listen`).
    steered: std::collections::HashSet<u64>,
    /// Services being registered with the port's steering right now (see
    /// `listen`): their REQs are held, not refused.
    registering: std::collections::HashSet<u64>,
    /// REQs and SIDR_REQs that arrived for a steered service while it had
    /// no listener (see `hold`), by service: (sender, its ID, the MAD).
    held: HashMap<u64, Vec<Held>>,
    next: u32,
}

pub(crate) struct Agent {
    pub eng: Arc<Engine>,
    pub gid: [u8; 16],
    /// Where `gid` is in the port's GID table: the `sgid_index` of the
    /// address vectors this manager hands out.
    pub gid_index: u8,
    pub addr: IpAddr,
    slot: u8,
    /// Our node GUID as the CM messages carry it (from the GID).
    pub guid: u64,
    inbox: Arc<Inbox>,
    t: Mutex<Table>,
    wake: EventFd,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The node GUID softrdma reports for a device (EUI-64 style, from the
/// address), as `ibv_query_device`'s `node_guid` does.
fn guid_of(gid: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&gid[8..16]);
    u64::from_be_bytes(b) | 0x0200_0000_0000_0000
}

/// Every running agent, for [`exit_hook`].
static RUNNING: Mutex<Vec<std::sync::Weak<Agent>>> = Mutex::new(Vec::new());

/// At process exit, end every connection as the kernel's CM does when a
/// process's rdma_cm file closes with IDs still open: an established
/// connection gets a DREQ, a pending REQ or REP a REJ. Without this, a peer
/// of a process that returns from `main` without destroying its IDs
/// (perftest's `ib_atomic_lat` server does) waits out its DREQ retries —
/// minutes — for a DREP nobody will send. One try each, no retransmission:
/// the process is ending. A process killed by a signal cannot do this; its
/// peers then learn it when their own DREQs go unanswered, as from a
/// crashed host.
extern "C" fn exit_hook() {
    let agents: Vec<Arc<Agent>> = match RUNNING.try_lock() {
        Ok(v) => v.iter().filter_map(|w| w.upgrade()).collect(),
        Err(_) => return,
    };
    for a in agents {
        if a.stop.load(Ordering::Acquire) {
            continue;
        }
        let comms: Vec<u32> = a.table().conns.keys().copied().collect();
        for c in comms {
            a.forget(c);
        }
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

impl Agent {
    pub fn start(
        eng: Arc<Engine>,
        gid: [u8; 16],
        gid_index: u8,
        addr: IpAddr,
    ) -> io::Result<Arc<Agent>> {
        let (inbox, slot) = {
            let st = eng.lock();
            (st.gsi.clone(), st.port.slot())
        };
        if !inbox.open() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "this device already has a connection manager",
            ));
        }
        let a = Arc::new(Agent {
            eng,
            gid,
            gid_index,
            addr,
            slot,
            guid: guid_of(&gid),
            inbox,
            t: Mutex::new(Table {
                next: random_u32(),
                ..Default::default()
            }),
            wake: EventFd::new(true)?,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let me = a.clone();
        let h = std::thread::Builder::new()
            .name("softrdma-cm".into())
            .spawn(move || me.run())?;
        *a.thread.lock().unwrap() = Some(h);
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            // SAFETY: exit_hook is an extern "C" fn with no arguments, what
            // atexit takes. glibc's atexit is libc_nonshared's wrapper of
            // __cxa_atexit with this object's __dso_handle, so if a
            // program unloads this library before exiting, the hook runs
            // at the dlclose, never after the code is gone.
            unsafe { libc::atexit(exit_hook) };
        });
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|w| w.strong_count() > 0);
        running.push(Arc::downgrade(&a));
        drop(running);
        Ok(a)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        self.inbox.close();
        let mut t = self.table();
        let services: Vec<u64> = t.steered.drain().collect();
        t.listeners.clear();
        t.held.clear();
        t.conns.clear();
        t.remote.clear();
        drop(t);
        let mut st = self.eng.lock();
        for s in services {
            let _ = st.port.listen_service(s as u32, false);
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, dgid: [u8; 16], mad: &[u8; MAD_LEN]) {
        if crate::cm::logging() {
            crate::cm::log(&format!("send {} on slot {}", mad_name(mad), self.slot));
        }
        let mut st = self.eng.lock();
        if let Err(e) = st.send_mad(dgid, mad) {
            crate::cm::log(&format!("sending a CM MAD failed: {e}"));
        }
    }

    /// A fresh communication ID: our slot on top, never 0 below it.
    fn alloc(&self, t: &mut Table) -> u32 {
        loop {
            t.next = t.next.wrapping_add(1);
            let low = t.next & 0xff_ffff;
            if low == 0 {
                continue;
            }
            let id = (self.slot as u32) << 24 | low;
            if !t.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn tid(&self, comm: u32) -> u64 {
        // Our transactions: the communication ID in the low half, as the
        // kernel's CM forms them (2 above it; the ID's bytes in its
        // little-endian order, crates/wire/tests/golden/cm); answers reuse
        // the TID they answer.
        2 << 32 | comm.swap_bytes() as u64
    }

    // ---- called by the ID layer (no ID lock held) ----

    /// Take the REQs and SIDR_REQs for `service` into `id`.
    ///
    /// Registering a service with the port's steering takes a file
    /// replacement under the group's lock (a millisecond here), so a
    /// service stays steered to this device after its listener goes — its
    /// REQs are then rejected here, as anywhere else ("invalid service
    /// ID") — until the device closes: a server that closes its listener
    /// and listens again on the same port (perftest -R, between its
    /// control and its data connections) is listening again at once, and
    /// a client's REQ sent right after is not lost to the registration.
    /// The cost: another process cannot listen on that port at this
    /// address before this device closes (EADDRINUSE).
    ///
    /// From here until [`Agent::listen_done`] the service is registering:
    /// its requests that reach this port (hashed here before the steering
    /// takes the service, queued while the registration held the engine,
    /// or steered here while `id` still registers on its other devices)
    /// are held, then served by `listen_done`'s caller once `id` listens
    /// on every device. An error ends the registration
    /// ([`Agent::listen_failed`]).
    pub fn listen(&self, service: u64, id: &CmId) -> io::Result<()> {
        crate::cm::log(&format!("listen {service:#x} on slot {}", self.slot));
        let steered = {
            let mut t = self.table();
            if t.listeners.contains_key(&service) || t.registering.contains(&service) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "the address and port are in use",
                ));
            }
            t.registering.insert(service);
            t.steered.contains(&service)
        };
        if !steered {
            if let Err(e) = self.eng.lock().port.listen_service(service as u32, true) {
                self.listen_failed(service, id);
                return Err(e);
            }
            crate::cm::log(&format!("steered {service:#x} on slot {}", self.slot));
        }
        let mut t = self.table();
        t.steered.insert(service);
        t.listeners.insert(service, id.clone());
        Ok(())
    }

    /// `id` listens on every device now: the requests held for `service`
    /// meanwhile (see `hold`), for the caller to hand to
    /// [`Agent::serve_held`].
    pub fn listen_done(&self, service: u64) -> Vec<Held> {
        let mut t = self.table();
        t.registering.remove(&service);
        t.held.remove(&service).unwrap_or_default()
    }

    /// `id`'s registration of `service` ended in an error (here or on
    /// another device): no listener, and the held requests are refused.
    pub fn listen_failed(&self, service: u64, id: &CmId) {
        let held = {
            let mut t = self.table();
            t.registering.remove(&service);
            if t.listeners.get(&service).is_some_and(|l| l == id) {
                t.listeners.remove(&service);
            }
            t.held.remove(&service).unwrap_or_default()
        };
        for (sgid, _, mad) in held {
            self.refuse(&sgid, &mad);
        }
    }

    /// Serve requests that came in the gap between a service's listeners
    /// (what [`Agent::listen_done`] returned), now that it is listened on.
    pub fn serve_held(&self, held: Vec<Held>) {
        for (sgid, _, mad) in held {
            self.on_mad(&sgid, &mad);
        }
    }

    /// A REQ (or SIDR_REQ) from `sgid` with ID `peer_id` for `service`,
    /// which nobody here listens on (or whose listener is still
    /// registering, see `listen`): whether to hold it instead of
    /// rejecting it. A registering service's requests are held until
    /// `listen_done`. A service that stays steered here after its listener
    /// went (see `listen`) is one this process listens on now and then:
    /// perftest closes its control listener and listens on the same port
    /// for its data connections, and its client's REQ can arrive in the
    /// gap. Such a REQ is held, unanswered, until the service is listened
    /// on again (it is then served at once) or the requester sends it again
    /// after its CM response timeout: then it is rejected, as it would have
    /// been at once without a listener (the cost: a client of a port that
    /// stopped listening here learns it one REQ timeout later). Bounded:
    /// a few held per service, the rest rejected.
    fn hold(
        &self,
        t: &mut Table,
        sgid: &[u8; 16],
        peer_id: u32,
        service: u64,
        mad: &[u8; MAD_LEN],
    ) -> bool {
        if !t.steered.contains(&service) && !t.registering.contains(&service) {
            return false;
        }
        let q = t.held.entry(service).or_default();
        if let Some(i) = q.iter().position(|(g, id, _)| g == sgid && *id == peer_id) {
            q.swap_remove(i);
            return false; // sent again: answered now
        }
        if q.len() >= 16 {
            return false;
        }
        q.push((*sgid, peer_id, Box::new(*mad)));
        crate::cm::log(&format!("holding a request for {service:#x}"));
        true
    }

    pub fn unlisten(&self, service: u64, id: &CmId) {
        crate::cm::log(&format!("unlisten {service:#x} on slot {}", self.slot));
        let mut t = self.table();
        if t.listeners.get(&service).is_some_and(|l| l == id) {
            t.listeners.remove(&service);
        }
    }

    /// Send a REQ (or SIDR_REQ) built by `build` for the new communication
    /// ID it is given, and wait for the answer. Returns the ID.
    pub fn start_connect(
        &self,
        id: &CmId,
        peer_gid: [u8; 16],
        sidr: bool,
        build: impl FnOnce(u32) -> CmMsg,
    ) -> u32 {
        let mut t = self.table();
        let comm = self.alloc(&mut t);
        let tid = self.tid(comm);
        let msg = build(comm);
        let local_qpn = match &msg {
            CmMsg::Req(r) => r.local_qpn,
            _ => 0,
        };
        let mad = Box::new(msg.emit(tid));
        let every = iba_time(CM_RESPONSE_TIMEOUT);
        t.conns.insert(
            comm,
            Conn {
                id: id.clone(),
                state: if sidr {
                    State::SidrReqSent
                } else {
                    State::ReqSent
                },
                peer_gid,
                remote_comm_id: 0,
                peer_qpn: 0,
                local_qpn,
                tid,
                resend: Some(Resend {
                    mad: mad.clone(),
                    left: MAX_CM_RETRIES,
                    every,
                    at: Instant::now() + every,
                }),
                answer: None,
                peer_left: false,
            },
        );
        drop(t);
        self.send(peer_gid, &mad);
        self.wake.signal();
        comm
    }

    /// Answer the REQ of `comm` with the REP `build` makes (given our
    /// communication ID and the peer's), then wait for the RTU.
    pub fn accept(&self, comm: u32, build: impl FnOnce(u32, u32) -> CmMsg) -> io::Result<()> {
        let mut t = self.table();
        let c = t
            .conns
            .get_mut(&comm)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no such connection"))?;
        let sidr = match c.state {
            State::ReqRcvd => false,
            State::SidrReqRcvd => true,
            s => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the connection is not waiting for an answer (it is {s:?})"),
                ))
            }
        };
        let msg = build(comm, c.remote_comm_id);
        if let CmMsg::Rep(r) = &msg {
            c.local_qpn = r.local_qpn;
        }
        let mad = Box::new(msg.emit(c.tid));
        let peer = c.peer_gid;
        if sidr {
            c.state = State::SidrDone;
        } else {
            c.state = State::RepSent;
            let every = iba_time(CM_RESPONSE_TIMEOUT);
            c.resend = Some(Resend {
                mad: mad.clone(),
                left: MAX_CM_RETRIES,
                every,
                at: Instant::now() + every,
            });
        }
        c.answer = Some(mad.clone());
        drop(t);
        self.send(peer, &mad);
        self.wake.signal();
        Ok(())
    }

    /// Active side, after the REP: send the RTU; the connection is
    /// established. Returns whether the peer has disconnected meanwhile
    /// (its DREQ came before this: the connection is closed already).
    pub fn establish(&self, comm: u32) -> io::Result<bool> {
        let mut t = self.table();
        let c = t
            .conns
            .get_mut(&comm)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no such connection"))?;
        if c.state != State::RepRcvd {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no REP to answer (the connection is {:?})", c.state),
            ));
        }
        let mad = Box::new(
            CmMsg::Rtu(Box::new(w::RtuRepr {
                local_comm_id: comm,
                remote_comm_id: c.remote_comm_id,
                private: [0; w::private_len::RTU],
            }))
            .emit(c.tid),
        );
        c.state = if c.peer_left {
            State::Closed
        } else {
            State::Established
        };
        c.answer = Some(mad.clone());
        let peer = c.peer_gid;
        let left = c.peer_left;
        drop(t);
        self.send(peer, &mad);
        Ok(left)
    }

    /// Reject the REQ (or REP, or SIDR_REQ) of `comm` and forget it.
    pub fn reject(&self, comm: u32, reason: u16, private: &[u8]) -> io::Result<()> {
        let mut t = self.table();
        let c = t
            .conns
            .get(&comm)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no such connection"))?;
        let mad = match c.state {
            State::ReqRcvd | State::RepRcvd => {
                let mut p = [0u8; w::private_len::REJ];
                let n = private.len().min(w::private_len::REJ);
                p[..n].copy_from_slice(&private[..n]);
                CmMsg::Rej(Box::new(w::RejRepr {
                    local_comm_id: comm,
                    remote_comm_id: c.remote_comm_id,
                    msg_rejected: if c.state == State::ReqRcvd {
                        w::msg_kind::REQ
                    } else {
                        w::msg_kind::REP
                    },
                    reject_info_length: 0,
                    reason,
                    ari: [0; 72],
                    private: p,
                }))
                .emit(c.tid)
            }
            State::SidrReqRcvd => {
                let mut p = [0u8; w::private_len::SIDR_REP];
                let n = private.len().min(w::private_len::SIDR_REP);
                p[..n].copy_from_slice(&private[..n]);
                CmMsg::SidrRep(Box::new(w::SidrRepRepr {
                    request_id: c.remote_comm_id,
                    status: w::sidr_status::REJECT,
                    add_info_length: 0,
                    qpn: 0,
                    service_id: 0,
                    qkey: 0,
                    class_port_info: [0; 72],
                    private: p,
                }))
                .emit(c.tid)
            }
            s => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("nothing to reject (the connection is {s:?})"),
                ))
            }
        };
        let peer = c.peer_gid;
        let key = (peer, c.remote_comm_id);
        t.conns.remove(&comm);
        t.remote.remove(&key);
        drop(t);
        self.send(peer, &mad);
        Ok(())
    }

    /// Disconnect `comm`: a DREQ if it is established (answered by a DREP,
    /// or given up after its retries: then DISCONNECTED); nothing if the
    /// peer disconnected first. Returns whether a DREQ went out.
    pub fn disconnect(&self, comm: u32) -> io::Result<bool> {
        let mut t = self.table();
        let Some(c) = t.conns.get_mut(&comm) else {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "not connected"));
        };
        match c.state {
            State::Established | State::RepSent => {}
            State::Closed | State::DreqSent => return Ok(false),
            s => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not connected (the connection is {s:?})"),
                ))
            }
        }
        let tid = self.tid(comm);
        let mad = Box::new(
            CmMsg::Dreq(Box::new(w::DreqRepr {
                local_comm_id: comm,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.peer_qpn,
                private: [0; w::private_len::DREQ],
            }))
            .emit(tid),
        );
        c.state = State::DreqSent;
        let every = iba_time(CM_RESPONSE_TIMEOUT);
        c.resend = Some(Resend {
            mad: mad.clone(),
            left: MAX_CM_RETRIES,
            every,
            at: Instant::now() + every,
        });
        let peer = c.peer_gid;
        drop(t);
        self.send(peer, &mad);
        self.wake.signal();
        Ok(true)
    }

    /// The ID is going away: answer for it as the kernel's CM does when an
    /// ID is destroyed (reject a pending REQ or REP, disconnect an
    /// established connection) and forget it.
    pub fn forget(&self, comm: u32) {
        let state = self.table().conns.get(&comm).map(|c| c.state);
        match state {
            Some(State::ReqRcvd) | Some(State::RepRcvd) | Some(State::SidrReqRcvd) => {
                let _ = self.reject(comm, w::rej_reason::CONSUMER_REJECT, &[]);
            }
            Some(State::ReqSent) => self.abandon(comm),
            Some(State::Established) | Some(State::RepSent) => {
                let _ = self.disconnect(comm);
            }
            _ => {}
        }
        let mut t = self.table();
        if let Some(c) = t.conns.remove(&comm) {
            t.remote.remove(&(c.peer_gid, c.remote_comm_id));
        }
    }

    /// A REJ "timeout" from `local` to `remote` (0: not known), its ARI our
    /// CA GUID as the kernel's CM sends it, rejecting message kind `msg`.
    fn timeout_rej(&self, local: u32, remote: u32, msg: u8, tid: u64) -> [u8; MAD_LEN] {
        let mut ari = [0u8; 72];
        ari[..8].copy_from_slice(&self.guid.to_be_bytes());
        CmMsg::Rej(Box::new(w::RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            msg_rejected: msg,
            reject_info_length: 8,
            reason: w::rej_reason::TIMEOUT,
            ari,
            private: [0; w::private_len::REJ],
        }))
        .emit(tid)
    }

    /// Give up on the REQ of `comm` (its ID is going away before the REP):
    /// tell the peer, which may hold the request or have answered it, as
    /// the kernel's CM does (`cm_destroy_id` in REQ_SENT): a REJ "timeout"
    /// whose ARI is our CA GUID, naming no remote ID (we learnt none), so
    /// the peer finds its connection by ours (see the REJ in `on_mad`).
    fn abandon(&self, comm: u32) {
        let mut t = self.table();
        let Some(c) = t.conns.get(&comm).filter(|c| c.state == State::ReqSent) else {
            return;
        };
        let mad = self.timeout_rej(comm, 0, w::msg_kind::OTHER, c.tid);
        let peer = c.peer_gid;
        t.conns.remove(&comm);
        drop(t);
        self.send(peer, &mad);
    }

    /// The peer's QP number and communication state of `comm`.
    pub fn state(&self, comm: u32) -> Option<State> {
        self.table().conns.get(&comm).map(|c| c.state)
    }

    // ---- the thread ----

    fn run(self: Arc<Self>) {
        let mut fds = [
            libc::pollfd {
                fd: self.inbox.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.next_deadline().map_or(-1, |d| {
                let left = d.saturating_duration_since(Instant::now());
                // Round up: waking before the deadline only sleeps again.
                (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
            });
            // SAFETY: `fds` is a valid array of two pollfds for the call.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            let _ = self.wake.drain();
            while let Some(m) = self.inbox.pop() {
                self.on_mad(&m.sgid, &m.bytes);
            }
            self.on_timers();
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.table()
            .conns
            .values()
            .filter_map(|c| c.resend.as_ref().map(|r| r.at))
            .min()
    }

    fn on_timers(&self) {
        let now = Instant::now();
        let mut sends = Vec::new();
        let mut failed = Vec::new();
        {
            let mut t = self.table();
            for (&comm, c) in t.conns.iter_mut() {
                let Some(r) = c.resend.as_mut() else {
                    continue;
                };
                if r.at > now {
                    continue;
                }
                if r.left == 0 {
                    c.resend = None;
                    failed.push((comm, c.state, c.id.clone()));
                    continue;
                }
                r.left -= 1;
                r.at = now + r.every;
                sends.push((c.peer_gid, r.mad.clone()));
            }
            for (comm, state, _) in &failed {
                if *state == State::DreqSent {
                    if let Some(c) = t.conns.get_mut(comm) {
                        c.state = State::Closed;
                    }
                } else if let Some(c) = t.conns.remove(comm) {
                    t.remote.remove(&(c.peer_gid, c.remote_comm_id));
                }
            }
        }
        for (gid, mad) in sends {
            self.send(gid, &mad);
        }
        for (_, state, id) in failed {
            let kind = match state {
                State::DreqSent => EventKind::Disconnected,
                _ => EventKind::Unreachable,
            };
            // Both with -ETIMEDOUT, as the kernel's rdma_cm reports a REQ's
            // or REP's retries run out (UNREACHABLE) and a DREQ's
            // (`IB_CM_DREQ_ERROR`: DISCONNECTED).
            id.timed_out(kind, -libc::ETIMEDOUT);
        }
    }

    /// The reply to a REQ or SIDR_REQ nobody takes.
    pub fn refuse(&self, sgid: &[u8; 16], mad: &[u8; MAD_LEN]) {
        if let Some(r) = super::unclaimed(mad) {
            self.send(*sgid, &r);
        }
    }

    fn on_mad(&self, sgid: &[u8; 16], mad: &[u8; MAD_LEN]) {
        if crate::cm::logging() {
            crate::cm::log(&format!("got {} on slot {}", mad_name(mad), self.slot));
        }
        let Ok((h, msg)) = w::parse(mad) else {
            return;
        };
        match msg {
            CmMsg::Req(req) => self.on_req(sgid, h.tid, mad, &req),
            CmMsg::SidrReq(req) => self.on_sidr_req(sgid, h.tid, mad, &req),
            CmMsg::Rep(rep) => self.on_rep(sgid, h.tid, &rep),
            CmMsg::Rtu(rtu) => {
                let id = {
                    let mut t = self.table();
                    match t.conns.get_mut(&rtu.remote_comm_id) {
                        Some(c)
                            if c.state == State::RepSent && c.is_from(sgid, rtu.local_comm_id) =>
                        {
                            c.state = State::Established;
                            c.resend = None;
                            Some(c.id.clone())
                        }
                        _ => None,
                    }
                };
                if let Some(id) = id {
                    id.established();
                }
            }
            CmMsg::Rej(rej) => {
                let id = {
                    let mut t = self.table();
                    // A REJ from a requester that gave up names no ID of
                    // ours (it learnt none): its own finds the request.
                    let ours = if rej.remote_comm_id == 0 {
                        t.remote.get(&(*sgid, rej.local_comm_id)).copied()
                    } else {
                        Some(rej.remote_comm_id)
                    };
                    match ours.and_then(|o| t.conns.get(&o).map(|c| (o, c))) {
                        Some((o, c))
                            if c.peer_gid == *sgid
                                && matches!(
                                    c.state,
                                    State::ReqSent
                                        | State::ReqRcvd
                                        | State::RepSent
                                        | State::RepRcvd
                                ) =>
                        {
                            let c = t.conns.remove(&o).expect("present");
                            t.remote.remove(&(c.peer_gid, c.remote_comm_id));
                            Some(c.id)
                        }
                        _ => None,
                    }
                };
                if let Some(id) = id {
                    id.rejected(rej.reason, &rej.private);
                }
            }
            CmMsg::Mra(mra) => {
                let mut t = self.table();
                let c = t.conns.get_mut(&mra.remote_comm_id);
                if let Some(c) = c.filter(|c| c.is_from(sgid, mra.local_comm_id)) {
                    if let Some(r) = c.resend.as_mut() {
                        // The peer needs longer: wait its service timeout
                        // on top of ours before sending again.
                        r.at = Instant::now() + r.every + iba_time(mra.service_timeout);
                    }
                }
            }
            CmMsg::Dreq(dreq) => self.on_dreq(sgid, h.tid, &dreq),
            CmMsg::Drep(drep) => {
                let id = {
                    let mut t = self.table();
                    match t.conns.get_mut(&drep.remote_comm_id) {
                        Some(c)
                            if c.state == State::DreqSent
                                && c.is_from(sgid, drep.local_comm_id) =>
                        {
                            c.state = State::Closed;
                            c.resend = None;
                            Some(c.id.clone())
                        }
                        _ => None,
                    }
                };
                if let Some(id) = id {
                    id.disconnected();
                }
            }
            CmMsg::SidrRep(rep) => {
                let id = {
                    let mut t = self.table();
                    match t.conns.get(&rep.request_id) {
                        Some(c) if c.state == State::SidrReqSent => {
                            let c = t.conns.remove(&rep.request_id).expect("present");
                            Some(c.id)
                        }
                        _ => None,
                    }
                };
                if let Some(id) = id {
                    id.sidr_answered(sgid, &rep);
                }
            }
            CmMsg::Other(_) => {}
        }
    }

    fn on_req(&self, sgid: &[u8; 16], tid: u64, mad: &[u8; MAD_LEN], req: &w::ReqRepr) {
        crate::cm::log(&format!("REQ for {:#x}", req.service_id));
        let mut t = self.table();
        if let Some(&ours) = t.remote.get(&(*sgid, req.local_comm_id)) {
            // A repeated REQ: send the REP again if we sent one; if the
            // application is still deciding, say so (MRA) so the peer
            // waits longer.
            let again = t.conns.get(&ours).and_then(|c| match c.state {
                State::RepSent => c.answer.clone(),
                State::ReqRcvd => Some(Box::new(
                    CmMsg::Mra(Box::new(w::MraRepr {
                        local_comm_id: ours,
                        remote_comm_id: req.local_comm_id,
                        msg_mraed: w::msg_kind::REQ,
                        service_timeout: CM_RESPONSE_TIMEOUT,
                        private: [0; w::private_len::MRA],
                    }))
                    .emit(c.tid),
                )),
                _ => None,
            });
            drop(t);
            if let Some(m) = again {
                self.send(*sgid, &m);
            }
            return;
        }
        let listener = match t.listeners.get(&req.service_id) {
            Some(_) if t.registering.contains(&req.service_id) => None,
            l => l.cloned(),
        };
        let Some(listener) = listener else {
            if self.hold(&mut t, sgid, req.local_comm_id, req.service_id, mad) {
                return;
            }
            drop(t);
            self.eng.lock().unlistened_request(*sgid, mad);
            return;
        };
        let comm = self.alloc(&mut t);
        let Some(child) = listener.child_for_req(self, sgid, comm, req) else {
            drop(t);
            self.refuse(sgid, mad);
            return;
        };
        t.conns.insert(
            comm,
            Conn {
                id: child.clone(),
                state: State::ReqRcvd,
                peer_gid: *sgid,
                remote_comm_id: req.local_comm_id,
                peer_qpn: req.local_qpn,
                local_qpn: 0,
                tid,
                resend: None,
                answer: None,
                peer_left: false,
            },
        );
        t.remote.insert((*sgid, req.local_comm_id), comm);
        drop(t);
        listener.connect_request(child, req);
    }

    fn on_sidr_req(&self, sgid: &[u8; 16], tid: u64, mad: &[u8; MAD_LEN], req: &w::SidrReqRepr) {
        let mut t = self.table();
        if let Some(&ours) = t.remote.get(&(*sgid, req.request_id)) {
            let again = t.conns.get(&ours).and_then(|c| c.answer.clone());
            drop(t);
            if let Some(m) = again {
                self.send(*sgid, &m);
            }
            return;
        }
        let listener = match t.listeners.get(&req.service_id) {
            Some(_) if t.registering.contains(&req.service_id) => None,
            l => l.cloned(),
        };
        let Some(listener) = listener else {
            if self.hold(&mut t, sgid, req.request_id, req.service_id, mad) {
                return;
            }
            drop(t);
            self.eng.lock().unlistened_request(*sgid, mad);
            return;
        };
        let comm = self.alloc(&mut t);
        let Some(child) = listener.child_for_sidr(self, sgid, comm, req) else {
            drop(t);
            self.refuse(sgid, mad);
            return;
        };
        t.conns.insert(
            comm,
            Conn {
                id: child.clone(),
                state: State::SidrReqRcvd,
                peer_gid: *sgid,
                remote_comm_id: req.request_id,
                peer_qpn: 0,
                local_qpn: 0,
                tid,
                resend: None,
                answer: None,
                peer_left: false,
            },
        );
        t.remote.insert((*sgid, req.request_id), comm);
        drop(t);
        listener.sidr_request(child, req);
    }

    fn on_rep(&self, sgid: &[u8; 16], tid: u64, rep: &w::RepRepr) {
        let mut t = self.table();
        let Some(c) = t.conns.get_mut(&rep.remote_comm_id) else {
            // An answer to a REQ we gave up on (its ID destroyed: see
            // `abandon`, whose REJ names no ID of the peer's, so that the
            // port's steering may have taken it to another process of the
            // address). Say so again, now to the peer's ID, so that the
            // accepting side learns it at once instead of after its REP's
            // retries.
            drop(t);
            let rej =
                self.timeout_rej(rep.remote_comm_id, rep.local_comm_id, w::msg_kind::REP, tid);
            self.send(*sgid, &rej);
            return;
        };
        if c.peer_gid != *sgid {
            return;
        }
        match c.state {
            State::ReqSent => {
                c.state = State::RepRcvd;
                c.resend = None;
                c.remote_comm_id = rep.local_comm_id;
                c.peer_qpn = rep.local_qpn;
                let id = c.id.clone();
                let key = (*sgid, rep.local_comm_id);
                t.remote.insert(key, rep.remote_comm_id);
                drop(t);
                id.connect_response(rep);
            }
            State::Established | State::Closed | State::DreqSent => {
                // Our RTU was lost: send it again.
                let again = c.answer.clone();
                drop(t);
                if let Some(m) = again {
                    self.send(*sgid, &m);
                }
            }
            _ => {}
        }
    }

    fn on_dreq(&self, sgid: &[u8; 16], tid: u64, dreq: &w::DreqRepr) {
        let mut t = self.table();
        let c = t.conns.get_mut(&dreq.remote_comm_id);
        let Some(c) = c.filter(|c| c.is_from(sgid, dreq.local_comm_id)) else {
            // Nothing of ours: answer anyway, so the peer stops asking
            // (as the kernel's CM answers a DREQ for a forgotten ID). A
            // DREQ that names one of our IDs with another sender's GID or
            // ID (a stale connection's, a stranger's) is no one's either,
            // as in the kernel's `cm_dreq_handler`: it gets its DREP and
            // leaves our connection alone.
            drop(t);
            let m = CmMsg::Drep(Box::new(w::DrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private: [0; w::private_len::DREP],
            }))
            .emit(tid);
            self.send(*sgid, &m);
            return;
        };
        if c.local_qpn != 0 && dreq.remote_qpn != c.local_qpn {
            // Our peer, but not our QP: dropped, as the kernel's CM drops
            // it (no DREP, the connection stays).
            return;
        }
        let drep = Box::new(
            CmMsg::Drep(Box::new(w::DrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private: [0; w::private_len::DREP],
            }))
            .emit(tid),
        );
        if c.state == State::RepRcvd {
            // The peer disconnects before our RTU, while the application
            // moves its QP with the REP's numbers: answer now, and leave
            // the connection to be established (CONNECT_RESPONSE, then
            // ESTABLISHED, is already the application's), reporting
            // DISCONNECTED after it (`establish`). Closing it here failed
            // the establishment (CONNECT_ERROR) and reported DISCONNECTED
            // for a connection never established.
            c.peer_left = true;
            drop(t);
            self.send(*sgid, &drep);
            return;
        }
        let notify = match c.state {
            State::Established | State::RepSent | State::DreqSent => Some(c.id.clone()),
            _ => None,
        };
        c.state = State::Closed;
        c.resend = None;
        c.answer = Some(drep.clone());
        drop(t);
        self.send(*sgid, &drep);
        if let Some(id) = notify {
            id.disconnected();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::{self as cm, CmOptions};
    use crate::{Context, Cq, DeviceInfo, OpenOptions, Pd, Qp, QpInitAttr, QpType, Transport};
    use std::net::SocketAddr;

    fn context(addr: &str) -> Context {
        let dev = DeviceInfo {
            name: "srdma-unit".into(),
            addr: addr.parse().unwrap(),
        };
        let opts = OpenOptions {
            transport: Some(Transport::Udp),
            ..OpenOptions::default()
        };
        Context::open(&dev, &opts).unwrap()
    }

    /// Two contexts on `addr`, B's QP connected to A's listener (declared
    /// in drop order: the connections go first).
    struct Pair {
        conn_a: cm::Connection,
        _conn_b: cm::Connection,
        qp_a: Qp,
        _qp_b: Qp,
        _cqs: (Cq, Cq),
        _pds: (Pd, Pd),
        a: Context,
        b: Context,
    }

    fn connected(addr: &str) -> Pair {
        let (a, b) = (context(addr), context(addr));
        let opts = CmOptions::default().with_timeout(Duration::from_secs(20));
        let l = cm::Listener::bind(&a, SocketAddr::new(a.device().addr, 0)).unwrap();
        let to = l.local_addr();
        let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
        let (cq_a, cq_b) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
        let qp_a = pd_a.create_qp(&QpInitAttr::new(QpType::Rc, &cq_a)).unwrap();
        let qp_b = pd_b.create_qp(&QpInitAttr::new(QpType::Rc, &cq_b)).unwrap();
        let (conn_a, conn_b) = std::thread::scope(|s| {
            let server = s.spawn(|| l.accept(&qp_a, b"", &opts).expect("accept"));
            let client = cm::connect(&b, to, &qp_b, b"", &opts).expect("connect");
            (server.join().unwrap(), client)
        });
        Pair {
            conn_a,
            _conn_b: conn_b,
            qp_a,
            _qp_b: qp_b,
            _cqs: (cq_a, cq_b),
            _pds: (pd_a, pd_b),
            a,
            b,
        }
    }

    /// A DREQ ends a connection only if it is the peer's: its two
    /// communication IDs, the peer's GID and our QPN, as the kernel's
    /// `cm_dreq_handler` checks. A DREQ that names our ID with another
    /// sender's ID or GID (a stale connection's, a stranger's) is answered
    /// as one for no connection, one for another QP is dropped, and the
    /// connection stays established through each; the peer's own then
    /// closes it, which shows the forgeries were right in all else.
    #[test]
    fn a_dreq_that_is_not_the_peers_leaves_the_connection_alone() {
        let p = connected("127.0.93.1");
        let (a, qp_a) = (&p.a, &p.qp_a);
        let agent = a.connection_manager().unwrap().0;
        let (ours, theirs, peer, local_qpn) = {
            let t = agent.table();
            let (&k, c) = t
                .conns
                .iter()
                .find(|(_, c)| c.state == State::Established)
                .expect("the accepted connection");
            (k, c.remote_comm_id, c.peer_gid, c.local_qpn)
        };
        assert_eq!(local_qpn, qp_a.qpn(), "the REP's QPN is kept");
        let dreq = |from: u32, to: u32, qpn: u32| {
            CmMsg::Dreq(Box::new(w::DreqRepr {
                local_comm_id: from,
                remote_comm_id: to,
                remote_qpn: qpn,
                private: [0; w::private_len::DREQ],
            }))
            .emit(0x77)
        };
        let mut stranger = peer;
        stranger[15] ^= 0x40;
        for (what, sgid, mad) in [
            ("another sender ID", peer, dreq(theirs ^ 1, ours, local_qpn)),
            ("another GID", stranger, dreq(theirs, ours, local_qpn)),
            ("another QPN", peer, dreq(theirs, ours, local_qpn ^ 1)),
        ] {
            agent.on_mad(&sgid, &mad);
            assert_eq!(
                agent.state(ours),
                Some(State::Established),
                "a DREQ with {what} closed the connection"
            );
        }
        agent.on_mad(&peer, &dreq(theirs, ours, local_qpn));
        assert_eq!(agent.state(ours), Some(State::Closed), "the peer's DREQ");
    }

    /// A DREQ whose retries run out without a DREP ends the connection with
    /// DISCONNECTED and status -ETIMEDOUT, as the kernel's rdma_cm reports
    /// `IB_CM_DREQ_ERROR`. The peer's manager is kept from answering by
    /// holding its table's lock; the retries are run out at once.
    #[test]
    fn a_dreq_nobody_answers_ends_in_disconnected_timed_out() {
        let p = connected("127.0.93.2");
        let agent = p.a.connection_manager().unwrap().0;
        let peer = p.b.connection_manager().unwrap().0;
        let ours = {
            let t = agent.table();
            *t.conns
                .iter()
                .find(|(_, c)| c.state == State::Established)
                .expect("the accepted connection")
                .0
        };
        let held = peer.table();
        p.conn_a.cm_id().disconnect().unwrap();
        assert_eq!(agent.state(ours), Some(State::DreqSent));
        {
            let mut t = agent.table();
            let r = t.conns.get_mut(&ours).unwrap().resend.as_mut().unwrap();
            r.left = 0;
            r.at = Instant::now();
        }
        agent.on_timers();
        assert_eq!(agent.state(ours), Some(State::Closed));
        let ev = p
            .conn_a
            .channel()
            .get(Some(Duration::from_secs(5)))
            .expect("an event");
        assert_eq!(
            (ev.kind, ev.status),
            (EventKind::Disconnected, -libc::ETIMEDOUT)
        );
        drop(held);
    }
}
