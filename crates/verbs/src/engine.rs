//! The soft-NIC engine: drives the transport core over the UDP port the way
//! an RNIC's pipelines are driven — by doorbells and by packet arrival, with
//! no timing guesses.
//!
//! Four kinds of thread make progress, all through one [`Engine::pass`]
//! under the state lock:
//!
//! * **The posting thread** (doorbell). `post_send`, `post_recv` and
//!   `modify_qp` queue their work and then transmit what the QP's window
//!   lets out, at once, in the caller's thread — no hand-off to another
//!   thread, no wake-up on the send path. Only if a pass hits its packet
//!   budget is the rest handed to the engine thread through its doorbell.
//! * **The polling thread.** `poll_cq` on an empty CQ runs one pass
//!   (non-blocking receive, expired timers, transmit): an application that
//!   spins on its CQ gets its completions with no kernel wake-up.
//! * **The engine thread**, one per context, which serves everything nobody
//!   else is there for — inbound WRITE, READ and atomics while the target
//!   application blocks in a TCP read or spins on its own memory,
//!   retransmission timers, the rest of a long message. It never spins: it
//!   sleeps in `epoll_wait` on the socket (edge-triggered; a pass of its own
//!   drains the socket before it sleeps again), the doorbell eventfd and
//!   a timerfd armed to the core's next deadline; the kernel wakes it when a
//!   packet arrives, exactly as an interrupt would. An idle device uses no
//!   CPU.
//! * **The idle poller** (opt-in, `SOFTRDMA_IDLE_POLL=1`), one per context
//!   at `SCHED_IDLE`: after the engine thread was woken for packets, it
//!   polls the socket for a while on a core no other thread wants, so that
//!   a passive responder's next request costs no cross-core wake-up (see
//!   [`Engine::idle_poll`], and why it is off by default).
//!
//! Why not a spinning engine thread: on a 2-core host two processes' spinning
//! application threads already own both cores; a third spinner only takes
//! turns with them in scheduler slices of milliseconds (the first design's
//! `ib_write_lat` was 592 µs). A thread the kernel wakes on packet arrival
//! preempts a spinner at once. See docs/DESIGN.md, "The engine", for the
//! options measured.
//!
//! With a peer context on this host (`softrdma_shm`), the same pass also
//! drains the packet rings that peer writes into, the transmit path puts
//! that peer's packets into its ring instead of the socket, and a post of
//! a one-sided operation may be carried out at once (`State::post_send`).
//! The rings' bell is one more descriptor in the engine's epoll set, armed
//! only while the engine sleeps with nobody else serving them.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use softrdma_core::{Endpoint, Event, Nanos, RxMeta, Transmit, HEAD_ROOM};
use softrdma_shm::Withdrawal;
use softrdma_udp::Port;

use crate::lane::{self, CqLane, Lane};
use crate::memory::{segment, HostMemory};
use crate::sys::{Epoll, EventFd, TimerFd};

/// Packets one pass transmits before it receives again: bounds how long a
/// post or a poll holds the lock (a 4 KiB-MTU pass is at most ~1 MiB of
/// payload), and so how long inbound packets wait behind a long send.
const TX_BUDGET: usize = 256;

/// Most packets taken from the core per scheduling decision
/// (`Endpoint::poll_transmit_burst`): a GSO train's worth of 4 KiB packets
/// and one more (a train holds 15 of 4 112 bytes).
const TX_BURST: usize = 16;

/// Packets one pass takes from each ring of a peer on this host: the
/// same bound as the transmit budget, so a pass stays short either way.
const RING_BUDGET: usize = 256;
/// Receive batches the engine thread takes in one wake-up before it lets
/// the state go (and rings itself to come back): bounds how long an
/// application's post waits for the lock under a flood.
const RX_ROUNDS: usize = 16;
/// While the socket is handed to a polling application thread, the
/// watchdog looks this often whether it still calls: the safety net for a
/// poller that stops without saying so (see `Engine::mask` for the ways it
/// says so). It is the engine's one time constant; it bounds the wait of a
/// packet that arrives after such a poller left, and costs one engine
/// wake-up per period while an application polls (about 2 µs of CPU per
/// ms). It is periodic, so polling costs no timer system call per message
/// (each is a VM exit on a virtual machine: 15 µs measured here).
const WATCHDOG: u64 = 1_000_000;

/// How long the idle poller goes on polling the socket after the last
/// packet the engine thread had to be woken for (see `Engine::idle_poll`).
/// The rule is the competitive one for spinning before blocking: poll no
/// longer than a wake-up costs, so a gap shorter than this is served at
/// polling speed and a longer one costs at most twice what sleeping at once
/// would have. A wake-up of the engine thread from another core costs 25
/// to 40 µs on the 2-core VM this was measured on (perf read_lat with
/// server and client pinned to different cores: 33 µs; to the same core,
/// where the waking packet's softirq runs where the thread sleeps: 10.6
/// µs; qperf's blocking UDP ping-pong: 34 µs one way). The poller runs at
/// `SCHED_IDLE`, so this is spent only on a core nothing else wants.
const LINGER: u64 = 50_000;

/// Wake-ups of the engine thread in a row, each serving packets, with no
/// application call into the device between them, that make a process a
/// passive target ([`IdlePoll::Passive`]). Counted, not timed: a ping-pong
/// whose application calls once a round trip (`ib_write_lat` posts each
/// reply) wakes the engine thread at most twice a round trip — for the
/// peer's message and, when it lands separately, the ACK behind it, both
/// before the application (whose core the engine thread took) can call —
/// so it never makes three quiet wake-ups in a row (measured: strictly
/// alternating quiet and active wake-ups over `ib_write_lat -s 8 -n 2000`).
/// A READ's target, whose application makes no call at all, is passive
/// from its third request on.
const PASSIVE_WAKES: u32 = 3;

/// When the idle poller (`Engine::idle_poll`) is rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdlePoll {
    /// The default (`SOFTRDMA_IDLE_POLL` unset or `0`): never; no poller
    /// thread. Not yet the default for passive processes: a passive target
    /// polled as packets land answers a selective-repeat resend before the
    /// probe right behind it arrives, and the probe costs a NAK of its own
    /// (crates/cli/tests/sr_wire.rs: 1.29× the fault-free packets against
    /// 1.27×, a hair under issue 13's 1.3×) — a protocol cost of any fast
    /// receiver, to be mended in the protocol first (DESIGN.md, "The idle
    /// poller").
    Never,
    /// `SOFTRDMA_IDLE_POLL=passive`: after [`PASSIVE_WAKES`] wake-ups in a row that served
    /// packets with no application call into the device between them — a
    /// passive target (a READ's or atomic's, or a `*_bw` server's) whose
    /// threads sleep or spin on memory. A round ends at the application's
    /// next call. An application that calls in between (`ib_write_lat`'s,
    /// which posts each reply) has a thread that wants a core; on a host
    /// whose cores its threads fill, ringing the poller made the engine
    /// thread's own wake-ups wait longer for a core (DESIGN.md, "The idle
    /// poller").
    Passive,
    /// `SOFTRDMA_IDLE_POLL=1`: after every wake-up that served packets.
    Always,
}

impl IdlePoll {
    fn from_env() -> IdlePoll {
        match std::env::var("SOFTRDMA_IDLE_POLL").as_deref() {
            Ok("passive") => IdlePoll::Passive,
            Ok("1") => IdlePoll::Always,
            _ => IdlePoll::Never,
        }
    }
}

/// How the engine thread watches the socket when it does.
const SOCK_EVENTS: u32 = (libc::EPOLLIN | libc::EPOLLET) as u32;

/// An asynchronous event for `ibv_get_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP (its number) went to the error state
    /// for a reason no completion reports.
    QpFatal(u32),
    /// `IBV_EVENT_QP_REQ_ERR`: the QP's responder detected an invalid
    /// request (a NAK-invalid-request condition).
    QpReqErr(u32),
    /// `IBV_EVENT_QP_ACCESS_ERR`: the QP's responder detected a remote
    /// access violation.
    QpAccessErr(u32),
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: an SRQ-attached QP in the error
    /// state will take no more receives from the SRQ.
    QpLastWqeReached(u32),
    /// `IBV_EVENT_CQ_ERR`: the CQ (its number) overflowed.
    CqErr(u32),
    /// `IBV_EVENT_SQ_DRAINED`: a QP moved to SQD with
    /// `en_sqd_async_notify` has no request in flight any more.
    SqDrained(u32),
}

/// A thread sleeping on the socket (see [`Engine::sleep_on_socket`]); the
/// engine thread serves the socket again when the last one wakes for good.
pub struct SocketSleep<'a>(&'a Engine);

impl Drop for SocketSleep<'_> {
    fn drop(&mut self) {
        if self.0.sleepers.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Re-adding a readable socket wakes the engine thread at once.
            self.0.set_sock_events();
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    /// The transmit budget ran out with packets still sendable.
    more_tx: bool,
    /// Datagrams were received (the socket may hold more).
    rx: bool,
    /// Some came through the shared-memory rings.
    ring: bool,
}

/// What a pass may leave for the application's next call (see
/// [`State::pass`] and `Engine::service`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Defer {
    /// Send everything.
    No,
    /// An application's pass: lone ACKs wait for its next call.
    App,
    /// The engine thread's first drain round for an application at work:
    /// the same for what came over UDP. Not for what came through the
    /// shared-memory rings: held there, `perf send_lat -e` over shared
    /// memory went from 14 to 26 µs typical (four alternating runs each),
    /// and the rings' ping-pongs do not need it (a WRITE to a peer on this
    /// host takes the lane, without the engine). It was first left out for
    /// `ib_send_lat -e`'s failures (12 runs in 15): that cause is found and
    /// mended — the ring QPs' ACKs now leave ahead of a reply (`set_direct`)
    /// — and the failures stay away with this round deferring over rings
    /// (28 runs in 28).
    Drain,
    /// A later drain round: what the first deferred stays deferred if this
    /// one received nothing and nothing else became ready.
    Hold,
}

/// State behind the lock.
pub(crate) struct State {
    pub ep: Endpoint,
    pub port: Port,
    pub mem: HostMemory,
    /// Completion channel doorbells by CQ.
    pub channels: HashMap<u32, Arc<crate::ChannelInner>>,
    pub async_events: std::collections::VecDeque<AsyncEvent>,
    /// Regions dropped while memory windows were bound to them (their
    /// deregistration is refused, as `ibv_dereg_mr`'s EBUSY): deregistered,
    /// and their buffers freed, when the last window goes.
    pub orphans: Vec<(u32, Box<dyn Send>)>,
    /// Heads and descriptors of one burst of packets from the core.
    head: Vec<u8>,
    txs: Box<[Transmit; TX_BURST]>,
    origin: Instant,
    /// The deadline the engine's timerfd is armed to (core time), so a pass
    /// re-arms it only when the core's next deadline moved.
    armed: Option<Nanos>,
    /// A pass left its responses for the application's next call.
    tx_deferred: bool,
    /// The core's count of request packets received when a poll last
    /// decided whether to hand the socket back (`Cq::poll_device`).
    pub requests_seen: u64,
    /// Packets the IO layer refused (a destination of the wrong address
    /// family, say): dropped and counted; the device keeps serving.
    pub tx_refused: u64,
    /// The shared-memory transport's side of this context (None: UDP only).
    pub shm: Option<Arc<softrdma_shm::Host>>,
    /// Packets a peer on this host refused (it is gone, or broke the ring's
    /// protocol): lost, and counted. A full ring loses nothing (`stalled`).
    pub ring_drops: u64,
    /// The packets a full ring of a peer on this host could not take yet
    /// (the rest of a burst behind one it refused), each with the zero
    /// bytes that follow it (pad and ICRC). While they wait nothing else is
    /// built: they go first, when the peer has freed space and rung our
    /// bell (see `softrdma_shm`'s ring, "Back-pressure"). At most one
    /// burst.
    stalled: std::collections::VecDeque<(Arc<softrdma_shm::Peer>, usize, Vec<u8>)>,
    /// Buffers of stalled packets that went, for the next stall.
    stall_bufs: Vec<Vec<u8>>,
    /// Times a full ring held our transmission back.
    pub ring_stalls: u64,
    /// This device's GID (what packets from rings are addressed to).
    pub dgid: [u8; 16],
    /// By QPN's low 16 bits: the peer context a QP's one-sided operations
    /// go to directly, and its QP there.
    pub direct: Vec<Option<Direct>>,
    /// By CQ: how many of the QPs completing into it may carry traffic over
    /// UDP (all but those connected through shared memory). Polling a CQ
    /// whose count is 0 serves the rings only, and leaves the socket to
    /// the engine thread: a receive system call per poll would cost more
    /// than a ring's whole round trip.
    pub udp_qps: Vec<u32>,
    /// How many QPs in all are counted in `udp_qps`.
    pub udp_total: u32,
    /// QP1: MADs for the connection manager (see `crate::gsi`).
    pub gsi: Arc<crate::gsi::Inbox>,
    /// Replies the engine owes to MADs nobody in this process takes (a
    /// REQ for a service nobody listens on): sent after the receive.
    gsi_out: Vec<([u8; 16], [u8; crate::gsi::MAD_LEN])>,
    /// CM MADs received for another slot, to check against the group.
    gsi_foreign: Vec<crate::gsi::Mad>,
    /// Connection requests for services nobody in this process listens
    /// on (no connection manager here), for [`State::unlistened_request`].
    gsi_requests: Vec<crate::gsi::Mad>,
    /// The last requests passed on to (or dropped for) another process's
    /// listener, by sender and transaction ID (see `unlistened_request`).
    gsi_passed: std::collections::VecDeque<([u8; 16], u64)>,
    /// The PSN of QP1's next MAD.
    gsi_psn: u32,
    /// Lock-free lanes open now (see `crate::lane`), and the core's QP
    /// state epoch when they were checked: any QP state change since
    /// closes them before the lock is let go.
    lanes_open: Vec<Arc<Lane>>,
    lane_epoch: u64,
    /// By QPN's low 16 bits: each QP's lane (its handle holds it too).
    lanes: Vec<Option<Arc<Lane>>>,
    /// Operations carried out by lanes since closed (`Stats::offloaded`).
    pub lane_carried: u64,
    /// By CQ: the queue its lane posts complete into (see `CqLane`).
    cq_lanes: Vec<Option<Arc<CqLane>>>,
    /// Those some lane has completed into: settled at the start of every
    /// stretch under the lock, reopened at its end.
    cq_lanes_live: Vec<Arc<CqLane>>,
    /// Completions on their way from a CQ lane to the core (kept, so that
    /// settling allocates nothing after the first time).
    settle_buf: Vec<softrdma_core::wc::Completion>,
    /// An application thread polled the device (`Engine::mask`) when this
    /// stretch under the lock began: its CQ lanes' holds are bookkeeping,
    /// at the stretch's end too, even if the stretch handed the rings back
    /// (see `settle_cq_lanes`).
    stretch_polled: bool,
    /// A CQ a poll in this stretch took all it asked for from: what its
    /// core CQ holds at the stretch's end goes back to its lane queue
    /// (`State::requeue_cq`).
    pub(crate) requeue: Option<softrdma_core::cq::CqId>,
    /// Receive lanes (see `lane::RecvQ`).
    pub(crate) recv: RecvLanes,
}

/// Whether QP `qpn` is in a state a receive lane serves (RTR or RTS).
fn receives(ep: &Endpoint, qpn: u32) -> bool {
    use softrdma_core::qp::state::QpState;
    ep.qp(qpn)
        .is_ok_and(|q| matches!(q.state, QpState::Rtr | QpState::Rts))
}

/// The access flags that let a peer reach a region by its key.
const REMOTE: softrdma_core::qp::attr::AccessFlags =
    softrdma_core::qp::attr::AccessFlags::REMOTE_WRITE
        .union(softrdma_core::qp::attr::AccessFlags::REMOTE_READ)
        .union(softrdma_core::qp::attr::AccessFlags::REMOTE_ATOMIC);

/// The receive lanes open now: by QPN's low 16 bits, the queue of the CQ
/// their receives complete into.
#[derive(Default)]
pub(crate) struct RecvLanes {
    by_qp: Vec<Option<Arc<CqLane>>>,
    /// The QPs with one open, for closing them all.
    open: Vec<u32>,
    /// QPs whose receives could not all be taken into a lane since the
    /// last state change (not tried again until then: a try moves the
    /// whole receive queue).
    refused: std::collections::HashSet<u32>,
    done: Vec<softrdma_core::wc::Completion>,
    back: Vec<lane::Kept>,
}

impl RecvLanes {
    fn is_open(&self, qpn: u32) -> bool {
        matches!(self.by_qp.get((qpn & 0xffff) as usize), Some(Some(_)))
    }

    /// Close QP `qpn`'s receive lane, if it has one: its filled receives
    /// complete into the core's CQ, in order, and the rest go back to the
    /// core's receive queue, in order, before anything else the core does
    /// with them.
    fn close(&mut self, ep: &mut Endpoint, qpn: u32) {
        let Some(cq) = self
            .by_qp
            .get_mut((qpn & 0xffff) as usize)
            .and_then(|c| c.take())
        else {
            return;
        };
        self.open.retain(|&q| q != qpn);
        let (mut done, mut back) = (
            std::mem::take(&mut self.done),
            std::mem::take(&mut self.back),
        );
        cq.recv_close(qpn, &mut done, &mut back);
        for c in done.drain(..) {
            ep.complete_external(cq.id, c);
        }
        for k in back.drain(..) {
            // Room there is: these came out of it, and the lane kept the
            // queue's depth. A QP destroyed meanwhile takes none.
            let _ = ep.requeue_recv(qpn, k.wr_id, &k.core);
        }
        (self.done, self.back) = (done, back);
    }

    /// Before the core handles a packet that may take a receive of a QP
    /// whose receive lane is open (an RC SEND's first or only packet, or
    /// a WRITE with immediate's last or only one; the BTH's opcode and
    /// DestQP say): hold the lane, complete what its sender filled so far
    /// into the core's CQ, and give the core's receive queue the lane's
    /// next receive — so the core executes the packet as it would with
    /// the receive queue its own. Returns the QP, for
    /// [`RecvLanes::after_packet`]. `from`: the ring it came by.
    fn before_packet(&mut self, ep: &mut Endpoint, bytes: &[u8], from: Option<u32>) -> Option<u32> {
        if self.open.is_empty() || bytes.len() < 12 {
            return None;
        }
        // RC SEND_FIRST, SEND_ONLY, SEND_ONLY_WITH_IMMEDIATE,
        // RDMA_WRITE_LAST_WITH_IMMEDIATE, RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        // SEND_ONLY_WITH_INVALIDATE.
        if !matches!(bytes[0], 0x00 | 0x04 | 0x05 | 0x09 | 0x0b | 0x17) {
            return None;
        }
        let qpn = u32::from_be_bytes([0, bytes[5], bytes[6], bytes[7]]);
        let cq = self.by_qp.get((qpn & 0xffff) as usize)?.clone()?;
        let mut done = std::mem::take(&mut self.done);
        let given = cq.recv_give(qpn, from, &mut done);
        for c in done.drain(..) {
            ep.complete_external(cq.id, c);
        }
        self.done = done;
        if let Some(k) = given {
            // The lane kept the core's queue empty: this is its only one.
            let _ = ep.requeue_recv(qpn, k.wr_id, &k.core);
        }
        Some(qpn)
    }

    /// After the core handled the packet [`RecvLanes::before_packet`]
    /// prepared for: a receive it did not take goes back to the lane.
    fn after_packet(&mut self, ep: &mut Endpoint, qpn: u32) {
        let Some(Some(cq)) = self.by_qp.get((qpn & 0xffff) as usize) else {
            return;
        };
        let mut unused = None;
        ep.pop_recv(qpn, |wr_id, sg| {
            let mut k = lane::Kept::new(wr_id);
            k.core = sg.iter().copied().collect();
            unused = Some(k);
        });
        // A packet that moved the QP out of RTR/RTS (an error) leaves the
        // lane held: nothing more is filled before it closes.
        cq.recv_ungive(qpn, unused, receives(ep, qpn));
    }
}

/// A QP connected to a QP of a context on this host that shares memory.
#[derive(Clone)]
pub(crate) struct Direct {
    pub peer: Arc<softrdma_shm::Peer>,
    pub qps: softrdma_shm::Qps,
}

/// Moved pages of a region (see `softrdma_shm::share`): moved back when
/// dropped, which must happen after the region's entry was withdrawn and
/// before its buffer is freed.
pub(crate) struct ShareGuard {
    host: Arc<softrdma_shm::Host>,
    pub s: softrdma_shm::Share,
}

impl Drop for ShareGuard {
    fn drop(&mut self) {
        self.host.unshare(self.s);
    }
}

/// The context that owns QPN `qpn` at `gid`: the address, and the slot in
/// the QPN's upper bits (see DESIGN, "Sharing port 4791").
pub(crate) fn peer_key(gid: &[u8; 16], qpn: u32) -> softrdma_shm::Key {
    softrdma_shm::Key {
        addr: crate::gid_to_ip(*gid),
        slot: (qpn >> 16) as u8,
    }
}

/// The joined peer context a UD packet (`head` from its BTH on) goes to,
/// if any: found by the destination's address and QPN slot.
fn ud_peer(
    shm: Option<&softrdma_shm::Host>,
    dgid: &[u8; 16],
    head: &[u8],
) -> Option<Arc<softrdma_shm::Peer>> {
    let bth = softrdma_wire::Bth::new_checked(head).ok()?;
    if bth.opcode().info()?.transport != softrdma_wire::opcode::Transport::Ud {
        return None;
    }
    shm?.joined(peer_key(dgid, bth.dest_qp()))
}

/// Push a packet into a peer's ring; if it is full, ask to be woken when it
/// has room and try once more (space freed before the request is not
/// announced). `Full` then means: keep the packet and wait for the bell.
///
/// # Safety
/// As for [`softrdma_shm::Peer::push`]: one producer at a time.
unsafe fn push_or_wait(
    peer: &softrdma_shm::Peer,
    parts: &[&[u8]],
    zeros: usize,
) -> softrdma_shm::Push {
    // SAFETY: forwarded from the caller.
    let r = unsafe { peer.push(parts, zeros) };
    if r != softrdma_shm::Push::Full {
        return r;
    }
    peer.want_space();
    // SAFETY: as above.
    unsafe { peer.push(parts, zeros) }
}

struct PeerOffload<'a>(&'a Direct);

impl softrdma_core::Offload for PeerOffload<'_> {
    fn one_sided(
        &mut self,
        op: &softrdma_core::wr::SendOp,
        local: softrdma_core::OffloadLocal<'_>,
    ) -> bool {
        use softrdma_core::wr::SendOp;
        let imm = match *op {
            SendOp::Send => None,
            SendOp::SendWithImm { imm } => Some(imm),
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                let len = local.bytes();
                // SAFETY: `local` (its length `len`) as for the one-sided
                // operations below: host spans the core translated during
                // this call under the engine's lock, or the core's inline
                // copy alive for the call.
                return unsafe {
                    self.0.peer.write_imm(
                        &self.0.qps,
                        &local,
                        len,
                        (remote_addr, rkey),
                        imm,
                        None,
                        None,
                    )
                }
                .is_some();
            }
            // SAFETY: the core translated `local`'s host spans through the
            // region table during this call, which runs under the engine's
            // lock; a region's buffer is freed only after `dereg_mr`
            // returns under that lock, so they are valid for the access.
            _ => return unsafe { self.0.peer.one_sided(self.0.qps, op, local) },
        };
        let inline;
        let spans = match local {
            softrdma_core::OffloadLocal::Host(h) => h,
            softrdma_core::OffloadLocal::Inline(b) => {
                inline = [(b.as_ptr() as u64, b.len() as u32)];
                &inline[..b.len().min(1)]
            }
        };
        // SAFETY: as above (the spans were translated under the engine's
        // lock, or are the core's inline copy, alive for this call).
        unsafe { self.0.peer.send_recv(&self.0.qps, spans, imm, None) }.is_some()
    }

    /// SENDs and WRITEs with immediate only: a refused one's cause passes
    /// (the receiver catches up with its receives) — for a WRITE with
    /// immediate, if its region is one the offload writes. A one-sided
    /// operation the offload refuses (a region not in moved pages, zero
    /// bytes, an ATOMIC WRITE in pieces) is refused again however long it
    /// waits, and holding those would only take a stream of them one round
    /// trip at a time.
    fn would_carry(&mut self, op: &softrdma_core::wr::SendOp, len: u64) -> bool {
        use softrdma_core::wr::SendOp;
        match *op {
            SendOp::Send | SendOp::SendWithImm { .. } => self.0.peer.receives_lane(&self.0.qps),
            SendOp::WriteWithImm {
                remote_addr, rkey, ..
            } => self
                .0
                .peer
                .would_write_imm(&self.0.qps, (remote_addr, rkey), len),
            _ => false,
        }
    }
}

/// A MAD for this port: to the connection manager, or — with none in this
/// process — a request kept for [`State::unlistened_request`], anything
/// else answered as nobody's (`crate::cm::unclaimed`).
fn take_mad(
    gsi: &crate::gsi::Inbox,
    out: &mut Vec<([u8; 16], [u8; crate::gsi::MAD_LEN])>,
    requests: &mut Vec<crate::gsi::Mad>,
    mad: crate::gsi::Mad,
) {
    if gsi.is_open() {
        gsi.push(mad);
    } else if crate::gsi::request_service(&mad.bytes).is_some() {
        if requests.len() < 16 {
            requests.push(mad);
        }
    } else if let Some(reply) = crate::cm::unclaimed(&mad.bytes) {
        if out.len() < 64 {
            out.push((mad.sgid, reply));
        }
    }
}

impl State {
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// One pass: receive what is waiting, run expired timers, transmit
    /// (within the budget), deliver events.
    fn pass(&mut self, async_fd: &EventFd, rx: bool, defer: bool) -> Pass {
        self.pass_with(async_fd, rx, if defer { Defer::App } else { Defer::No })
    }

    /// [`State::pass`], with the engine thread's drain's kinds of
    /// deferral ([`Defer`]).
    fn pass_with(&mut self, async_fd: &EventFd, rx: bool, defer: Defer) -> Pass {
        let now = self.now();
        let mut p = Pass::default();
        if rx {
            let State {
                ep,
                port,
                mem,
                gsi,
                gsi_out,
                gsi_foreign,
                gsi_requests,
                recv,
                ..
            } = self;
            let slot = port.slot();
            match port.recv(|m, bytes| {
                if crate::gsi::for_qp1(bytes) {
                    match crate::gsi::parse(bytes, m.sgid) {
                        None => {
                            gsi.drops.fetch_add(1, Ordering::Relaxed);
                        }
                        // For another slot: decided below, with the port.
                        Some(mad) if crate::gsi::cm_slot(&mad.bytes).is_some_and(|s| s != slot) => {
                            if gsi_foreign.len() < 16 {
                                gsi_foreign.push(mad);
                            }
                        }
                        Some(mad) => take_mad(gsi, gsi_out, gsi_requests, mad),
                    }
                    return;
                }
                let meta = RxMeta {
                    sgid: m.sgid,
                    dgid: m.dgid,
                    traffic_class: m.traffic_class,
                    hop_limit: m.hop_limit,
                };
                let held = recv.before_packet(ep, bytes, None);
                ep.handle_packet(now, &meta, bytes, mem);
                if let Some(q) = held {
                    recv.after_packet(ep, q);
                }
            }) {
                // Anything taken off the socket counts, a bad datagram
                // too: the engine thread drains an edge-triggered socket
                // while passes receive, and must not stop at a bad one
                // with good ones queued behind it.
                // (`taken` counts entries: at least one for every good
                // datagram delivered.)
                Ok(_) => p.rx = port.taken() > 0,
                Err(e) => eprintln!("softrdma: receive failed: {e}"),
            }
            // Multicast groups' sockets (none unless a QP is attached):
            // every member process gets its own copy of each datagram.
            match port.recv_groups(|m, bytes| {
                let meta = RxMeta {
                    sgid: m.sgid,
                    dgid: m.dgid,
                    traffic_class: m.traffic_class,
                    hop_limit: m.hop_limit,
                };
                ep.handle_packet(now, &meta, bytes, mem);
            }) {
                Ok(n) => p.rx |= n > 0,
                Err(e) => eprintln!("softrdma: multicast receive failed: {e}"),
            }
            // A CM MAD for another slot. Every message but a request is
            // steered by the receiver's ID, whose top byte is the slot of
            // the process that handed it out (crates/udp's cbpf). Another
            // live process's slot: the steering was stale or wrong (a
            // member changed, or a measurement erred) — not ours to
            // answer (a DREP for a DREQ meant for another process ends the
            // peer's connection while that process never hears of it), so
            // it is dropped, the sender resends after its timeout, and the
            // group is re-steered. A slot nobody holds any more (its
            // process ended): taken here, to be answered as the kernel's
            // CM answers for an ID it forgot.
            while let Some(mad) = self.gsi_foreign.pop() {
                let s = crate::gsi::cm_slot(&mad.bytes).expect("foreign");
                if self.port.misdelivered_cm(s) {
                    crate::cm::log(&format!(
                        "a CM message for slot {s} came to slot {}: dropped, steering repaired",
                        self.port.slot()
                    ));
                } else {
                    take_mad(&self.gsi, &mut self.gsi_out, &mut self.gsi_requests, mad);
                }
            }
            while let Some(mad) = self.gsi_requests.pop() {
                self.unlistened_request(mad.sgid, &mad.bytes);
            }
            while let Some((gid, mad)) = self.gsi_out.pop() {
                let _ = self.send_mad(gid, &mad);
            }
        }
        if let State {
            shm: Some(h),
            ep,
            mem,
            dgid,
            recv,
            ..
        } = self
        {
            // SAFETY: one consumer: this pass holds the engine lock.
            let n = unsafe {
                h.drain(RING_BUDGET, |from, sgid, bytes| {
                    let meta = RxMeta {
                        sgid: *sgid,
                        dgid: *dgid,
                        traffic_class: 0,
                        hop_limit: 64,
                    };
                    let held = recv.before_packet(ep, bytes, Some(from));
                    ep.handle_packet(now, &meta, bytes, mem);
                    if let Some(q) = held {
                        recv.after_packet(ep, q);
                    }
                })
            };
            p.rx |= n > 0;
            p.ring = n > 0;
        }
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep.handle_timeout(now);
        }
        if self.ep.holds_for_offload() {
            // Requests held behind ones these packets may have completed.
            self.offload_held();
        }
        let may_defer = match defer {
            Defer::App => true,
            Defer::Drain => !p.ring,
            Defer::No | Defer::Hold => false,
        };
        if may_defer && p.rx && !self.tx_deferred && self.ep.only_acks_ready() {
            // What these packets call for, if it is ACKs alone, waits for
            // the application's next call, which sends it together with
            // what the application posts in reply: one system call, not
            // two, on the critical path of a ping-pong, and the reply first
            // (see the core's scheduler). READ and atomic responses, NAKs
            // and requests are never held back (`only_acks_ready`). One pass at most: the next one sends
            // it whatever it receives, so a stream whose every poll finds
            // packets still gets its ACKs every other pass. The caller
            // keeps the watchdog on while something is deferred (see
            // `Engine::defer_bounded`).
            self.tx_deferred = true;
        } else if defer == Defer::Hold && !p.rx && self.tx_deferred && self.ep.only_acks_ready() {
            // Still only the ACKs deferred before: they keep waiting.
        } else {
            p.more_tx = self.transmit(now).1;
        }
        self.deliver_events(async_fd);
        p
    }

    /// A connection request (REQ or SIDR_REQ) from `sgid` for a service no
    /// ID of this process listens on. If another live process of this
    /// address listens on it (or is registering the listener right now:
    /// `Port::listener_of` waits for that), the request reached us only
    /// because the steering had not taken the service yet, or is stale:
    /// it is not ours to refuse. A request from this very address is
    /// passed on — sent again to the address, where the steering now
    /// takes it to the listener, exactly as it came (same sender, same
    /// content). One from elsewhere cannot be (we cannot send as its
    /// sender) and is dropped; its sender sends it again after its CM
    /// response timeout. A request seen again after being passed on or
    /// dropped means the steering is wrong: dropped, and the group
    /// re-steered. Nobody listens: answered as the kernel's CM does ("invalid
    /// service ID", SIDR "service ID not supported").
    pub(crate) fn unlistened_request(&mut self, sgid: [u8; 16], mad: &[u8; crate::gsi::MAD_LEN]) {
        let Some(service) = crate::gsi::request_service(mad) else {
            return;
        };
        match self.port.listener_of(service as u32) {
            Some(slot) if slot != self.port.slot() => {
                let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
                let key = (sgid, tid);
                if self.gsi_passed.contains(&key) {
                    self.port.misdelivered_cm(slot);
                    crate::cm::log(&format!(
                        "a request for {service:#x} (listened on by slot {slot}) came back: dropped, steering repaired"
                    ));
                    return;
                }
                if self.gsi_passed.len() == 8 {
                    self.gsi_passed.pop_front();
                }
                self.gsi_passed.push_back(key);
                if sgid == self.port.local_gid() {
                    crate::cm::log(&format!(
                        "a request for {service:#x} came to slot {}: passed on to slot {slot}",
                        self.port.slot()
                    ));
                    let _ = self.send_mad(sgid, mad);
                } else {
                    crate::cm::log(&format!(
                        "a request for {service:#x} came to slot {}: dropped, slot {slot} listens",
                        self.port.slot()
                    ));
                }
            }
            _ => {
                if let Some(reply) = crate::cm::unclaimed(mad) {
                    let _ = self.send_mad(sgid, &reply);
                }
            }
        }
    }

    /// Send one MAD from QP1 to QP1 at `dgid`, now.
    pub fn send_mad(&mut self, dgid: [u8; 16], mad: &[u8; crate::gsi::MAD_LEN]) -> io::Result<()> {
        let h = crate::gsi::headers(self.gsi_psn);
        self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
        self.port.send(dgid, 1, &h, &[mad], 0)
    }

    /// Send what the core has, up to the budget. Returns (sent, budget
    /// exhausted with more to send).
    /// Drain the requests QPs hold for their offload
    /// (`Endpoint::offload_held`); whether any went to the requester.
    fn offload_held(&mut self) -> bool {
        let State { ep, direct, .. } = self;
        ep.offload_held(|qpn| match direct.get((qpn & 0xffff) as usize) {
            Some(Some(d)) if d.qps.local == qpn => Some(PeerOffload(d)),
            _ => None,
        })
    }

    fn transmit(&mut self, now: Nanos) -> (usize, bool) {
        self.tx_deferred = false;
        let mut sent = 0;
        // Packets a full ring held back go first, in order.
        while let Some((peer, zeros, buf)) = self.stalled.front() {
            // SAFETY: one producer: this pass holds the engine lock; the
            // stalled bytes are our own buffer.
            match unsafe { push_or_wait(peer, &[buf], *zeros) } {
                softrdma_shm::Push::Full => return (sent, false),
                softrdma_shm::Push::Refused => self.ring_drops += 1,
                softrdma_shm::Push::Done => sent += 1,
            }
            let (_, _, buf) = self.stalled.pop_front().expect("front seen");
            self.stall_bufs.push(buf);
        }
        loop {
            while sent < TX_BUDGET {
                let room = TX_BURST.min(TX_BUDGET - sent);
                let n = self.ep.poll_transmit_burst(
                    now,
                    &mut self.head,
                    &mut self.txs[..room],
                    &self.mem,
                );
                if n == 0 {
                    break;
                }
                for k in 0..n {
                    self.transmit_one(k);
                }
                sent += n;
                if !self.stalled.is_empty() {
                    // Nothing more is built while a ring is full: what
                    // waits goes first, when the peer has freed space and
                    // rung our bell.
                    break;
                }
            }
            // A bind or invalidate the requester carried out just now
            // completes here, not with a packet: requests held behind it
            // for the offload are drained now (nothing else would come
            // for them), and one the offload refuses goes on the wire in
            // another round.
            if sent < TX_BUDGET
                && self.stalled.is_empty()
                && self.ep.holds_for_offload()
                && self.offload_held()
            {
                continue;
            }
            break;
        }
        if sent > 0 {
            if let Err(e) = self.port.flush() {
                eprintln!("softrdma: send failed: {e}");
            }
        }
        (sent, sent >= TX_BUDGET && self.stalled.is_empty())
    }

    /// Hand packet `k` of a burst (`self.txs[k]`, its head at
    /// `k * HEAD_ROOM` in `self.head`) to its ring or its socket.
    fn transmit_one(&mut self, k: usize) {
        let t = &self.txs[k];
        let head = &self.head[k * HEAD_ROOM..k * HEAD_ROOM + t.head_len];
        let mut slices: [&[u8]; softrdma_core::MAX_SGE] = [&[]; softrdma_core::MAX_SGE];
        let segs = t.segs.as_slice();
        for (s, g) in slices.iter_mut().zip(segs) {
            // SAFETY: the core translated each segment through the region
            // table in this pass's `poll_transmit_burst`, so it lies in a
            // registered region; a region's buffer is freed only after
            // `dereg_mr` returns, which needs this lock, and the core never
            // hands out an address of a deregistered region.
            *s = unsafe { segment(g.addr, g.len) };
        }
        // A connection to a context on this host, or a UD datagram to one:
        // into its ring.
        let direct = self
            .direct
            .get((t.src_qpn & 0xffff) as usize)
            .and_then(Option::as_ref)
            .filter(|d| d.qps.local == t.src_qpn && d.peer.alive())
            .map(|d| &d.peer);
        let ud = match direct {
            None => ud_peer(self.shm.as_deref(), &t.dgid, head),
            Some(_) => None,
        };
        if let Some(peer) = direct.or(ud.as_ref()) {
            let mut parts: [&[u8]; softrdma_core::MAX_SGE + 1] = [&[]; softrdma_core::MAX_SGE + 1];
            parts[0] = head;
            parts[1..=segs.len()].copy_from_slice(&slices[..segs.len()]);
            let parts = &parts[..=segs.len()];
            let zeros = t.pad as usize + 4;
            // SAFETY: one producer: this pass holds the engine lock. The
            // slices are valid as above; the pad and the ICRC's place are
            // zeros.
            let r = if self.stalled.is_empty() {
                unsafe { push_or_wait(peer, parts, zeros) }
            } else {
                // Behind a packet a ring held back: in order, after it.
                softrdma_shm::Push::Full
            };
            match r {
                softrdma_shm::Push::Done => {}
                softrdma_shm::Push::Refused => self.ring_drops += 1,
                softrdma_shm::Push::Full => {
                    // Kept: the core has counted it sent (its timers run).
                    // At most one burst waits (nothing more is built while
                    // one does), so the buffers are bounded by TX_BURST.
                    let mut buf = self.stall_bufs.pop().unwrap_or_default();
                    buf.clear();
                    for p in parts {
                        buf.extend_from_slice(p);
                    }
                    if self.stalled.is_empty() {
                        // One stall, however much of the burst waits.
                        self.ring_stalls += 1;
                    }
                    self.stalled.push_back((peer.clone(), zeros, buf));
                }
            }
            return;
        }
        if t.head_len > softrdma_udp::MAX_HEAD {
            // Payload the core copied into the head (an implicit region's,
            // checked): longer than a queued head may be. Sent now, the
            // part past MAX_HEAD as its payload.
            let (head, rest) = head.split_at(softrdma_udp::MAX_HEAD);
            if self
                .port
                .send(t.dgid, t.src_qpn, head, &[rest], t.pad)
                .is_err()
            {
                self.tx_refused += 1;
            }
            return;
        }
        // SAFETY: the slices stay valid until `flush` in `transmit` returns:
        // it runs before this pass lets the lock go, and no region can be
        // deregistered (nor its buffer freed) without the lock.
        let r = unsafe {
            self.port
                .push(t.dgid, t.src_qpn, head, &slices[..segs.len()], t.pad)
        };
        if r.is_err() {
            // One unusable destination must not stop the device: the packet
            // is lost like any other (RC retransmits, UD is unreliable) and
            // counted.
            self.tx_refused += 1;
        }
    }

    /// Count QP `qpn` (created, or no longer connected through shared
    /// memory: +1) or stop counting it (-1) as a UDP user of its CQs.
    pub fn count_udp(&mut self, qpn: u32, delta: i32) {
        let Ok(q) = self.ep.qp(qpn) else {
            return;
        };
        if q.qp_type == softrdma_core::qp::state::QpType::XrcRecv {
            // No CQs of its own: its receive completions go to the CQs of
            // the XRC SRQs, counted as users by `count_udp_cq`.
            return;
        }
        self.udp_total = self.udp_total.saturating_add_signed(delta);
        for cq in [q.send_cq.0, q.recv_cq.0] {
            self.count_udp_cq(cq, delta);
        }
    }

    /// One more (or fewer) user of CQ `cq` whose completions come from UDP:
    /// a QP's, or an XRC SRQ's (an XRC target's requests always arrive
    /// over UDP).
    pub fn count_udp_cq(&mut self, cq: u32, delta: i32) {
        let i = cq as usize;
        if self.udp_qps.len() <= i {
            self.udp_qps.resize(i + 1, 0);
        }
        self.udp_qps[i] = self.udp_qps[i].saturating_add_signed(delta);
        let udp = self.cq_uses_udp(cq);
        if let Some(Some(l)) = self.cq_lanes.get(i) {
            l.set_udp(udp);
        }
    }

    /// Post a send on an XRC initiator QP, naming the target's XRC SRQ
    /// (always over UDP: XRC is not offered to the shared-memory transport).
    pub fn post_send_xrc(
        &mut self,
        qpn: u32,
        wr: &softrdma_core::wr::SendWr<'_>,
        remote_srqn: u32,
    ) -> Result<(), softrdma_core::Error> {
        let mem = self.mem;
        self.ep.post_send_xrc(qpn, wr, remote_srqn, &mem)
    }

    /// Connect QP `qpn` through shared memory (`Some`) or not, keeping the
    /// CQs' counts.
    pub fn set_direct(&mut self, qpn: u32, d: Option<Direct>) {
        let i = (qpn & 0xffff) as usize;
        if self.direct.len() <= i {
            self.direct.resize(i + 1, None);
        }
        let was = self.direct[i].take().is_some();
        let is = d.is_some();
        self.direct[i] = d;
        // Through a ring its reply and the ACK behind it may be taken in
        // two drains, and the reply's completion reach the peer's
        // application before that of the send it answers (see
        // `Defer::Drain`): its ACKs leave first.
        let _ = self.ep.set_qp_acks_first(qpn, is);
        // Rings neither lose nor reorder: going back N there (see
        // `Endpoint::set_qp_selective_repeat`).
        let _ = self.ep.set_qp_selective_repeat(qpn, !is);
        match (was, is) {
            (false, true) => self.count_udp(qpn, -1),
            (true, false) => self.count_udp(qpn, 1),
            _ => {}
        }
    }

    /// Whether any QP may carry traffic over UDP (else a pass for an
    /// application that drives progress serves the rings only).
    pub fn any_udp(&self) -> bool {
        self.shm.is_none() || self.udp_total > 0
    }

    /// Whether polling CQ `cq` must read the UDP socket.
    pub fn cq_uses_udp(&self, cq: u32) -> bool {
        self.shm.is_none() || self.udp_qps.get(cq as usize).is_none_or(|&n| n > 0)
    }

    /// Post a send, carrying a one-sided operation out at once if the QP
    /// reaches its peer through shared memory. Returns whether it was
    /// carried out at once (then nothing was queued).
    pub fn post_send(
        &mut self,
        qpn: u32,
        wr: &softrdma_core::wr::SendWr<'_>,
    ) -> Result<bool, softrdma_core::Error> {
        let mem = self.mem;
        if matches!(
            wr.op,
            softrdma_core::wr::SendOp::Send | softrdma_core::wr::SendOp::SendWithImm { .. }
        ) {
            // A SEND carried out here fills the peer's next receive: no
            // lane post of another thread may fill it at the same time.
            // Closing waits for one in progress.
            self.close_lane_of(qpn);
        }
        let done = match self.direct.get((qpn & 0xffff) as usize) {
            Some(Some(d)) if d.qps.local == qpn => {
                let State { ep, direct, .. } = self;
                let Some(Some(d)) = direct.get((qpn & 0xffff) as usize) else {
                    unreachable!("matched above")
                };
                ep.post_send_offload(qpn, wr, &mem, &mut PeerOffload(d))?
            }
            _ => {
                self.ep.post_send(qpn, wr, &mem)?;
                false
            }
        };
        // Work in the send queue: a lane post would overtake it. Carried
        // out at once: the lane may serve the next ones.
        if done {
            self.open_lane(qpn, wr);
        } else {
            self.close_lane_of(qpn);
        }
        Ok(done)
    }

    /// Publish the responder state of QPs that changed to peers that
    /// reach them through shared memory.
    pub fn publish_qps(&mut self) {
        let Some(h) = self.shm.as_ref() else {
            return;
        };
        self.ep.take_state_changes(|qpn, qp| {
            h.publish_qp(
                qpn,
                qp.map(|q| softrdma_shm::PublishedQp {
                    ready: softrdma_shm::responder_ready(q.state),
                    pd: q.pd,
                    access: q.attr.qp_access_flags,
                    dest_qpn: q.attr.dest_qp_num,
                    dest_gid: q.attr.av.dgid,
                    rd_atomic: q.attr.max_dest_rd_atomic,
                }),
            )
        });
    }

    /// Move a region just registered (or reregistered) where peers reach
    /// it, and publish it; None if there is no shared-memory transport, it
    /// grants no remote access, or its memory cannot be moved.
    pub fn share_region(&mut self, lkey: u32) -> Option<ShareGuard> {
        let host = self.shm.clone()?;
        // Moving pages copies them and then maps the copy in their place: a
        // lane writing a READ or atomic result into an overlapping region
        // of ours in between would be lost. Lanes reopen under the lock.
        self.close_lanes();
        let mr = *self.ep.mrs().get_by_lkey(lkey)?;
        // An implicit region is the whole address space, mostly not there:
        // nothing to move, and peers reach it through packets, checked.
        // A region a peer cannot reach by key but receives can land in
        // (`LOCAL_WRITE`): moved too, for the receive lanes (`lane::RecvQ`),
        // with no entry in the region table.
        let local = softrdma_core::qp::attr::AccessFlags::LOCAL_WRITE;
        if !mr.access.intersects(REMOTE.union(local)) || mr.checked {
            return None;
        }
        let s = host.share(mr.host_addr, mr.len)?;
        let g = ShareGuard { host, s };
        if !mr.access.intersects(REMOTE) {
            return Some(g);
        }
        self.republish(lkey, &g).then_some(g)
    }

    /// Publish region `lkey` (as the core has it now) in its moved pages.
    pub fn republish(&mut self, lkey: u32, g: &ShareGuard) -> bool {
        let Some(mr) = self.ep.mrs().get_by_lkey(lkey) else {
            return false;
        };
        if !mr.access.intersects(REMOTE) {
            return true; // moved for receives only: no key to publish
        }
        g.host
            .publish_mr(mr.rkey, mr.pd, mr.access, mr.iova, mr.host_addr, &g.s)
    }

    /// Withdraw region `rkey` from peers, waiting until none is inside it;
    /// and from this context's lanes, which hold local translations (a
    /// region is withdrawn before it is deregistered, reregistered or lent
    /// out): none is inside it when this returns. `how` is what the
    /// caller does next ([`Withdrawal::Final`]: drops the region's share,
    /// so a peer stopped inside it is not waited for; see
    /// `softrdma_shm::Host::withdraw_mr`).
    pub fn withdraw(&mut self, rkey: u32, how: Withdrawal) {
        self.close_lanes();
        if let Some(h) = self.shm.as_ref() {
            h.withdraw_mr(rkey, how);
        }
    }

    /// Give QP `qpn` its lane (at creation); `None` takes it away (at
    /// destruction, closed first).
    pub fn set_lane(&mut self, qpn: u32, lane: Option<Arc<Lane>>) {
        let i = (qpn & 0xffff) as usize;
        if self.lanes.len() <= i {
            self.lanes.resize(i + 1, None);
        }
        if let Some(old) = self.lanes[i].take() {
            self.close_lane(&old);
        }
        self.close_recv(qpn);
        self.lanes[i] = lane;
    }

    /// Give CQ `cq` its lane queue (at creation); `None` at destruction
    /// (closed first, what it held handed to the core).
    pub fn set_cq_lane(&mut self, cq: softrdma_core::cq::CqId, lane: Option<Arc<CqLane>>) {
        let i = cq.0 as usize;
        if self.cq_lanes.len() <= i {
            self.cq_lanes.resize(i + 1, None);
        }
        self.close_recvs(Some(cq));
        if let Some(l) = &lane {
            l.set_udp(self.cq_uses_udp(cq.0));
        }
        if let Some(old) = self.cq_lanes[i].take() {
            self.settle_one(&old, true);
            self.cq_lanes_live.retain(|l| !Arc::ptr_eq(l, &old));
        }
        self.cq_lanes[i] = lane;
    }

    /// Close one CQ lane and hand what it holds to the core's CQ, in order.
    fn settle_one(&mut self, l: &CqLane, share: bool) {
        let mut buf = std::mem::take(&mut self.settle_buf);
        l.close_into(&mut buf, share);
        for c in buf.drain(..) {
            self.ep.complete_external(l.id, c);
        }
        self.settle_buf = buf;
    }

    /// At the start of every stretch of work under the lock: close the CQ
    /// lanes and hand their completions to the core's CQs, so that what
    /// the core completes from here on comes after them (see `CqLane`).
    /// `polled`: an application thread polls the device (`Engine::mask`),
    /// so the queues' holds here are bookkeeping and leave no queue shared
    /// for good (`CqLane::bookkeeping_hold`).
    pub fn settle_cq_lanes(&mut self, polled: bool) {
        self.stretch_polled = polled;
        if self.cq_lanes_live.is_empty() {
            return;
        }
        let live = std::mem::take(&mut self.cq_lanes_live);
        for l in &live {
            if l.is_open() {
                self.settle_one(l, !polled);
            }
        }
        self.cq_lanes_live = live;
    }

    /// At the end of a stretch in which a poll of CQ `cq` the engine's way
    /// took all it was asked for (`State::requeue`), just before the lanes
    /// reopen — nothing completes into the core's CQ after it in this
    /// stretch, so its completions are older than anything a lane post
    /// completes next: what the core's CQ still holds goes back to the
    /// CQ's lane queue (`CqLane::requeue`), if the CQ has a live one and is
    /// neither armed nor in error, and the queue reopens with the core's
    /// CQ empty, so the next polls take from it without the lock. Without
    /// this, once the core's CQ held more than one poll takes (the first
    /// posts of a stream go the engine's way; a thread that signals every
    /// post keeps a send queue's worth outstanding), the queue reopened
    /// behind older completions every time, no poll could take from it
    /// without the lock, and every completion went lane → core → poll under
    /// the lock for as long as the stream ran (`perf write_bw -s 8 -Q 1`
    /// over shared memory: every poll the engine's way).
    fn requeue_cq(&mut self, cq: softrdma_core::cq::CqId) {
        let Some(Some(l)) = self.cq_lanes.get(cq.0 as usize) else {
            return;
        };
        if l.is_open()
            || !self.cq_lanes_live.iter().any(|x| Arc::ptr_eq(x, l))
            || self.ep.cq_room(cq).is_none_or(|(_, empty)| empty)
        {
            return;
        }
        let share = !self.stretch_polled;
        let ep = &mut self.ep;
        l.requeue(share, |buf| ep.poll_cq(cq, buf).unwrap_or(0));
    }

    /// At the end of a stretch under the lock: reopen each CQ lane whose
    /// core CQ is neither armed nor in error, with the room it has left
    /// and whether it is empty (only then may a poll take from the lane
    /// without the lock). As bookkeeping if the stretch began so
    /// (`stretch_polled`).
    fn reopen_cq_lanes(&mut self) {
        for l in &self.cq_lanes_live {
            if !l.is_open() {
                if let Some((room, empty)) = self.ep.cq_room(l.id) {
                    l.open(room, empty, !self.stretch_polled);
                }
            }
        }
    }

    fn lane_of(&self, qpn: u32) -> Option<Arc<Lane>> {
        self.lanes.get((qpn & 0xffff) as usize)?.clone()
    }

    /// Close every open lane (see `crate::lane`): when this returns no
    /// post is in one, and none will be until the engine opens it again.
    pub fn close_lanes(&mut self) {
        self.close_send_lanes();
        self.close_recvs(None);
    }

    /// Close every open lane of a send queue (not the receive lanes).
    pub fn close_send_lanes(&mut self) {
        let lanes = std::mem::take(&mut self.lanes_open);
        for l in &lanes {
            l.set_pos(None);
        }
        self.lane_carried += Lane::close_all(&lanes);
    }

    /// Close the receive lanes of CQ `cq`'s QPs (all with `None`).
    pub fn close_recvs(&mut self, cq: Option<softrdma_core::cq::CqId>) {
        self.close_recvs_if(|_, _, l| cq.is_none_or(|c| l.id == c));
    }

    /// Close the open receive lanes for which `f` (the core, the QP, its
    /// CQ's queue) says so.
    fn close_recvs_if(&mut self, f: impl Fn(&Endpoint, u32, &CqLane) -> bool) {
        let mut i = 0;
        while i < self.recv.open.len() {
            let q = self.recv.open[i];
            let close = self.recv.by_qp[(q & 0xffff) as usize]
                .as_ref()
                .is_some_and(|l| f(&self.ep, q, l));
            if close {
                self.recv.close(&mut self.ep, q);
            } else {
                i += 1;
            }
        }
    }

    /// Close QP `qpn`'s receive lane, if it has one.
    pub fn close_recv(&mut self, qpn: u32) {
        self.recv.close(&mut self.ep, qpn);
    }

    /// `ibv_post_recv` on QP `qpn`: into its open receive lane, or the
    /// core's queue — then the lane opens if it can take the queue whole.
    pub fn post_recv(
        &mut self,
        qpn: u32,
        wr: &softrdma_core::wr::RecvWr<'_>,
        check: softrdma_core::RecvCheck,
    ) -> Result<(), softrdma_core::Error> {
        use softrdma_core::mr::Span;
        if let Some(Some(cq)) = self.recv.by_qp.get((qpn & 0xffff) as usize) {
            let cq = cq.clone();
            let mut spans = [Span::default(); softrdma_core::MAX_SGE];
            let n = self.ep.check_recv(qpn, wr, check, &mut spans)?;
            if let Some((k, learn)) = self.kept(wr.wr_id, &spans[..n]) {
                let room = self.ep.cq_room(cq.id).map_or(0, |r| r.0);
                return cq.recv_post(qpn, k, room, &learn).map_err(|_| {
                    softrdma_core::Error::QueueFull {
                        queue: "receive queue",
                        depth: self.ep.qp(qpn).map_or(0, |q| q.cap.max_recv_wr),
                    }
                });
            }
            // Not all in shared memory: the core keeps the receives.
            self.recv.close(&mut self.ep, qpn);
        }
        self.ep.post_recv_with(qpn, wr, check)?;
        // Opening moves the core's whole receive queue: at a post, only a
        // short one (an application that arms its CQ for every message
        // closes the lane each time; with hundreds of receives posted it
        // stays closed rather than moving them all twice per message).
        if self
            .ep
            .qp(qpn)
            .is_ok_and(|q| q.recv_queued() <= softrdma_shm::RECV_SLOTS as u32)
        {
            self.open_recv(qpn);
        }
        Ok(())
    }

    /// The region `sp` lies in, as a receive lane remembers it (see
    /// `lane::RecvRegion`): a live, not on-demand region with a part in
    /// moved pages around `sp`'s first byte.
    fn recv_region(&self, sp: &softrdma_core::mr::Span) -> Option<lane::RecvRegion> {
        let h = self.shm.as_ref()?;
        let at = self.ep.mrs().locate(sp.mem, sp.off, sp.len as u64)?;
        let mr = self.ep.mrs().by_ref(sp.mem).filter(|m| !m.checked)?;
        let (lo, hi, off) = h.arena_extent(at.addr)?;
        // The region's part in these moved pages.
        let (sh_lo, sh_hi) = (lo.max(mr.host_addr), hi.min(mr.host_addr + mr.len));
        Some(lane::RecvRegion {
            lkey: mr.lkey,
            mem: sp.mem,
            iova: mr.iova,
            len: mr.len,
            host: mr.host_addr,
            sh_lo,
            sh_hi,
            sh_off: off + (sh_lo - lo),
        })
    }

    /// A receive as a lane keeps it, if all its bytes lie in memory peers
    /// reach (moved pages) and it has at most `RECV_SGES` SGEs; with the
    /// regions its bytes lie in, for the lane to remember.
    fn kept(
        &self,
        wr_id: u64,
        spans: &[softrdma_core::mr::Span],
    ) -> Option<(
        lane::Kept,
        arrayvec::ArrayVec<lane::RecvRegion, { softrdma_shm::RECV_SGES }>,
    )> {
        if spans.len() > softrdma_shm::RECV_SGES {
            return None;
        }
        let mut k = lane::Kept::new(wr_id);
        let mut regions = arrayvec::ArrayVec::new();
        for sp in spans {
            if sp.len == 0 {
                // Moves nothing; kept as the core checked it.
                k.core.push(*sp);
                k.arena.push((0, 0));
                continue;
            }
            let g = self.recv_region(sp)?;
            if !k.push(&g, sp.off, sp.len) {
                return None;
            }
            regions.push(g);
        }
        Some((k, regions))
    }

    /// Open QP `qpn`'s receive lane if it can take the core's receive
    /// queue whole (after a receive went into it, and when the QP reaches
    /// RTR or RTS): an RC QP in RTR or RTS reaching its peer through
    /// shared memory, its receive CQ neither armed nor in error, no receive
    /// of its in use, every one in shared memory (see `lane::RecvQ`). A QP
    /// whose receives could not all be taken is not tried again until a
    /// QP's state changes.
    pub fn open_recv(&mut self, qpn: u32) {
        use softrdma_core::mr::Span;
        use softrdma_core::qp::state::QpType;
        // Lanes act on the states they were opened in: a change since
        // closes them first (as `Guard::drop` would, after this opening).
        self.check_lane_epoch();
        let Some(host) = self.shm.clone() else {
            return;
        };
        if self.recv.refused.contains(&qpn) || self.recv.is_open(qpn) {
            return;
        }
        let Some(Some(d)) = self.direct.get((qpn & 0xffff) as usize) else {
            return;
        };
        if d.qps.local != qpn || !d.peer.alive() {
            return;
        }
        let src = d.qps.remote;
        let Ok(q) = self.ep.qp(qpn) else {
            return;
        };
        if q.qp_type != QpType::Rc || q.srq.is_some() {
            return;
        }
        let (cqid, depth, dgid) = (q.recv_cq, q.cap.max_recv_wr as usize, q.attr.av.dgid);
        let max_sge = q.cap.max_recv_sge as usize;
        let Some(Some(cq)) = self.cq_lanes.get(cqid.0 as usize) else {
            return;
        };
        let cq = cq.clone();
        let Some((room, _)) = self.ep.cq_room(cqid) else {
            return;
        };
        let mut taken: Vec<(u64, arrayvec::ArrayVec<Span, { softrdma_core::MAX_SGE }>)> =
            Vec::new();
        if !self
            .ep
            .take_recvs(qpn, |id, sg| taken.push((id, sg.iter().copied().collect())))
        {
            return;
        }
        let mut kept = Vec::with_capacity(taken.len());
        for (id, sg) in &taken {
            match self.kept(*id, sg) {
                Some((k, _)) => kept.push(k),
                None => break,
            }
        }
        if kept.len() < taken.len() {
            for (id, sg) in &taken {
                let _ = self.ep.requeue_recv(qpn, *id, sg);
            }
            self.recv.refused.insert(qpn);
            return;
        }
        let sender = host.index_of(&d.peer);
        cq.recv_open(
            &host,
            qpn,
            ((src, dgid), sender),
            (depth, max_sge),
            kept,
            room,
        );
        if !self.cq_lanes_live.iter().any(|l| Arc::ptr_eq(l, &cq)) {
            self.cq_lanes_live.push(cq.clone());
        }
        let i = (qpn & 0xffff) as usize;
        if self.recv.by_qp.len() <= i {
            self.recv.by_qp.resize(i + 1, None);
        }
        self.recv.by_qp[i] = Some(cq);
        self.recv.open.push(qpn);
    }

    /// Close every lane if any QP's state changed since they were checked
    /// (they act on "it is in RTS").
    fn check_lane_epoch(&mut self) {
        let now = self.ep.state_epoch();
        if now != self.lane_epoch {
            self.close_send_lanes();
            // A receive lane depends on its own QP's state alone (RTR or
            // RTS): the others stay open.
            self.close_recvs_if(|ep, q, _| !receives(ep, q));
            self.recv.refused.clear();
            self.lane_epoch = now;
        }
    }

    /// Close one QP's lane (its send queue holds work, or the QP changes).
    pub fn close_lane(&mut self, lane: &Arc<Lane>) {
        let Some(at) = lane.pos() else {
            return;
        };
        self.lanes_open.swap_remove(at);
        if let Some(moved) = self.lanes_open.get(at) {
            moved.set_pos(Some(at));
        }
        lane.set_pos(None);
        self.lane_carried += lane.close();
    }

    /// Close QP `qpn`'s lane, if it has one open.
    pub fn close_lane_of(&mut self, qpn: u32) {
        if let Some(l) = self.lane_of(qpn) {
            self.close_lane(&l);
        }
    }

    /// Operations carried out by lanes, open ones included.
    pub fn lanes_carried(&self) -> u64 {
        self.lane_carried + self.lanes_open.iter().map(|l| l.carried()).sum::<u64>()
    }

    /// After a post the core carried out at once (`post_send` returned
    /// true): open QP `qpn`'s lane if what it promises holds now — RC, in
    /// RTS, not signalling every request, an empty send queue, a peer
    /// through shared memory — remembering the regions `wr` named.
    fn open_lane(&mut self, qpn: u32, wr: &softrdma_core::wr::SendWr<'_>) {
        use softrdma_core::qp::state::{QpState, QpType};
        self.check_lane_epoch();
        let Some(lane) = self.lane_of(qpn) else {
            return;
        };
        // An inline post's SGEs need name no region (no key is checked):
        // those that do are remembered, anything else leaves the lane shut.
        let Some(Some(d)) = self.direct.get((qpn & 0xffff) as usize) else {
            return;
        };
        if d.qps.local != qpn {
            return;
        }
        let Ok(q) = self.ep.qp(qpn) else {
            return;
        };
        if q.qp_type != QpType::Rc
            || q.state != QpState::Rts
            || q.sq_sig_all
            || !q.send_queue_empty()
        {
            return;
        }
        let mut regions = arrayvec::ArrayVec::<_, { softrdma_core::MAX_SGE }>::new();
        for s in wr.sgl {
            match self.ep.mrs().get_by_lkey(s.lkey) {
                Some(m) if m.pd == q.pd && !m.checked => regions.push(lane::Region {
                    lkey: m.lkey,
                    iova: m.iova,
                    len: m.len,
                    host: m.host_addr,
                    local_write: m
                        .access
                        .contains(softrdma_core::qp::attr::AccessFlags::LOCAL_WRITE),
                }),
                _ => return,
            }
        }
        if regions.is_empty() {
            return;
        }
        let Some(Some(cq)) = self.cq_lanes.get(q.send_cq.0 as usize) else {
            return;
        };
        let cq = cq.clone();
        if !self.cq_lanes_live.iter().any(|l| Arc::ptr_eq(l, &cq)) {
            self.cq_lanes_live.push(cq.clone());
        }
        lane.open(lane::Opening {
            cq,
            peer: d.peer.clone(),
            qps: d.qps,
            max_sge: q.cap.max_send_sge as usize,
            max_inline: q.cap.max_inline_data as u64,
            reads: q.attr.max_rd_atomic > 0,
            regions: &regions,
        });
        if lane.pos().is_none() {
            lane.set_pos(Some(self.lanes_open.len()));
            self.lanes_open.push(lane);
        }
    }

    fn deliver_events(&mut self, async_fd: &EventFd) {
        self.publish_qps();
        while let Some(e) = self.ep.poll_event() {
            match e {
                Event::CompNotify(cq) => {
                    if let Some(ch) = self.channels.get(&cq.0) {
                        ch.push(cq.0);
                    }
                }
                Event::CqErr(cq) => self.raise(AsyncEvent::CqErr(cq.0), async_fd),
                Event::QpReqErr(q) => self.raise(AsyncEvent::QpReqErr(q), async_fd),
                Event::QpAccessErr(q) => self.raise(AsyncEvent::QpAccessErr(q), async_fd),
                Event::QpFatal(q) => self.raise(AsyncEvent::QpFatal(q), async_fd),
                Event::QpLastWqeReached(q) => self.raise(AsyncEvent::QpLastWqeReached(q), async_fd),
                Event::SqDrained(q) => self.raise(AsyncEvent::SqDrained(q), async_fd),
            }
        }
    }

    fn raise(&mut self, e: AsyncEvent, fd: &EventFd) {
        if self.async_events.len() < 1024 {
            self.async_events.push_back(e);
            fd.signal();
        }
    }

    /// Deregister orphaned regions whose windows are gone (after a window
    /// is deallocated).
    pub fn retry_orphans(&mut self) {
        if !self.orphans.is_empty() {
            // Their buffers may be freed below.
            self.close_lanes();
        }
        let ep = &mut self.ep;
        self.orphans.retain(|(lkey, _)| ep.dereg_mr(*lkey).is_err());
    }
}

pub(crate) struct Engine {
    state: Mutex<State>,
    /// The shared-memory side (as `State::shm`), reachable without the lock.
    pub shm: Option<Arc<softrdma_shm::Host>>,
    pub transport: crate::Transport,
    /// Work is waiting for whoever owns the state next: the engine thread
    /// was woken (packet, doorbell, deadline) while another thread held the
    /// lock. The owner serves it before it lets go — the socket-ownership
    /// backlog of the kernel's TCP (`release_sock`), so the engine thread
    /// never blocks on the lock and never hands the lock over through a
    /// futex wake-up.
    pending: AtomicBool,
    /// Rung when a pass left sendable work behind (its budget ran out) and
    /// on shutdown.
    doorbell: EventFd,
    /// Re-armed to the core's next deadline after every pass that moved it.
    timer: TimerFd,
    /// The engine thread drained an expiry of `timer`: whoever serves next
    /// forgets `State::armed` (see `service`).
    timer_fired: AtomicBool,
    /// One-shot, armed while the socket is masked (see `mask`).
    watchdog: TimerFd,
    watchdog_fired: AtomicBool,
    /// An application thread is polling, so the socket is out of the
    /// engine thread's epoll set: packets go to the poller without waking
    /// the engine (see `mask`). Changed only by the state's owner.
    masked: AtomicBool,
    /// While `masked`: the poller serves only the rings of peers on this
    /// host, and the socket stayed with the engine thread.
    sock_kept: AtomicBool,
    /// Calls application threads made into the device (polls, posts):
    /// whether the process is active (the idle poller's rule). Read by the
    /// engine thread without the lock.
    app_calls: AtomicU64,
    /// The application passes that served what an application thread
    /// holds (the socket unless `sock_kept`, and the rings), and the count
    /// when the watchdog last looked: the watchdog's evidence that the
    /// poller is alive. Not every call: posts and shared-memory-only polls
    /// read no socket, and an application that went on making them after
    /// its last poll of a UDP CQ kept the socket from everyone. Read by
    /// the engine thread without the lock, so that checking on a poller
    /// never takes the state from it.
    app_served: AtomicU64,
    seen_served: AtomicU64,
    /// The periodic watchdog is running.
    watchdog_on: AtomicBool,
    /// See `promise_progress`.
    progress_promised: AtomicBool,
    epoll: Epoll,
    sock_fd: std::os::fd::RawFd,
    pub async_fd: EventFd,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The idle poller: rung to start it, polling until `linger_until`
    /// (ns since `origin`) while `lingering`.
    idle_bell: EventFd,
    lingering: AtomicBool,
    linger_until: AtomicU64,
    origin: Instant,
    /// When the idle poller runs (`SOFTRDMA_IDLE_POLL` at start, see
    /// [`IdlePoll`]).
    idle_poll: IdlePoll,
    /// `app_calls` before the engine thread last served packets: unchanged
    /// at the next wake-up means the application made no call since.
    calls_at_wake: AtomicU64,
    /// Wake-ups in a row that served packets with no application call
    /// between them (see [`PASSIVE_WAKES`]).
    quiet_wakes: AtomicU32,
    /// `app_calls` when the poller was last rung.
    ring_calls: AtomicU64,
    poller: Mutex<Option<JoinHandle<()>>>,
    /// The idle poller serves the socket, so it is out of the engine
    /// thread's epoll set (as while an application polls); `beats` counts
    /// its polls so the watchdog can tell a starved poller.
    poller_masked: AtomicBool,
    /// Threads blocked in `CompChannel::get_event` watching the socket
    /// themselves (`Engine::sleep_on_socket`); while any is, the engine
    /// thread is not woken for packets.
    sleepers: AtomicU32,
    /// When the poller was last rung: if it starts later than [`LINGER`]
    /// after, no core was free for it, and it sits the round out.
    rang_at: AtomicU64,
    beats: AtomicU64,
    seen_beats: AtomicU64,
    /// A poll went through a CQ's lane since the watchdog's last tick
    /// (`Engine::note_lane_poll`; the tick clears it).
    lane_polled: AtomicBool,
    /// Watchdog ticks taken, for the crate's tests.
    #[cfg(test)]
    ticks: AtomicU64,
    /// Stretches of work under the state's lock, by any thread (tests).
    #[cfg(test)]
    stretches: AtomicU64,
    /// Serialises changes of the socket's epoll registration, which
    /// follows `masked && !sock_kept || poller_masked || sleepers`, and
    /// holds whether the socket is in the engine's epoll set now, so an
    /// unchanged registration costs no system call.
    sock_events: Mutex<bool>,
    /// `State::tx_deferred` as of the last unlock: a lane post (which takes
    /// no lock) leaves deferred ACKs for the engine's way to carry.
    acks_deferred: AtomicBool,
}

/// The state, owned by one thread; letting go serves the backlog.
pub(crate) struct Guard<'a> {
    g: Option<MutexGuard<'a, State>>,
    eng: &'a Engine,
}

impl std::ops::Deref for Guard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.g.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.g.as_mut().expect("held until drop")
    }
}

impl<'a> Guard<'a> {
    /// The state, just taken: CQ lanes settle before anything else (see
    /// `State::settle_cq_lanes`).
    fn new(mut g: MutexGuard<'a, State>, eng: &'a Engine) -> Guard<'a> {
        #[cfg(test)]
        eng.stretches.fetch_add(1, Ordering::SeqCst);
        g.settle_cq_lanes(eng.masked.load(Ordering::Relaxed));
        Guard { g: Some(g), eng }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut g = self.g.take().expect("held until drop");
        // Serve what the engine thread left while this thread owned the
        // state. The flag is set before the engine's failed try_lock and
        // read after this unlock (both SeqCst), so either this loop sees it
        // or the engine's try_lock succeeds: no wake-up is lost.
        loop {
            // A plain load first: the usual case is no backlog, and the
            // load after the unlock below is what closes the race.
            if self.eng.pending.load(Ordering::Relaxed)
                && self.eng.pending.swap(false, Ordering::SeqCst)
            {
                self.eng.service(&mut g);
                continue;
            }
            // A QP's state changed under this lock (an error the
            // transport ran into, say): the lanes, which act on "it is in
            // RTS", close before anyone can see the change.
            g.check_lane_epoch();
            if let Some(cq) = g.requeue.take() {
                g.requeue_cq(cq);
            }
            g.reopen_cq_lanes();
            self.eng
                .acks_deferred
                .store(g.tx_deferred, Ordering::Relaxed);
            drop(g);
            if !self.eng.pending.load(Ordering::SeqCst) {
                return;
            }
            match self.eng.state.try_lock() {
                Ok(again) => g = again,
                Err(std::sync::TryLockError::Poisoned(p)) => g = p.into_inner(),
                // Its owner will see the flag when it lets go.
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
            #[cfg(test)]
            self.eng.stretches.fetch_add(1, Ordering::SeqCst);
            g.settle_cq_lanes(self.eng.masked.load(Ordering::Relaxed));
        }
    }
}

impl Engine {
    pub fn start(
        ep: Endpoint,
        port: Port,
        shm: Option<softrdma_shm::Host>,
        transport: crate::Transport,
        dgid: [u8; 16],
    ) -> io::Result<Arc<Engine>> {
        let shm = shm.map(Arc::new);
        let sock_fd = port.as_raw_fd();
        let origin = Instant::now();
        let e = Arc::new(Engine {
            state: Mutex::new(State {
                ep,
                port,
                mem: HostMemory,
                channels: HashMap::new(),
                async_events: Default::default(),
                orphans: Vec::new(),
                head: vec![0; TX_BURST * HEAD_ROOM],
                txs: Box::new([Transmit::default(); TX_BURST]),
                origin,
                armed: None,
                tx_deferred: false,
                requests_seen: 0,
                tx_refused: 0,
                shm: shm.clone(),
                ring_drops: 0,
                stalled: Default::default(),
                stall_bufs: Vec::new(),
                ring_stalls: 0,
                dgid,
                direct: Vec::new(),
                udp_qps: Vec::new(),
                udp_total: 0,
                gsi: Arc::new(crate::gsi::Inbox::new()?),
                gsi_out: Vec::new(),
                gsi_foreign: Vec::new(),
                gsi_requests: Vec::new(),
                gsi_passed: std::collections::VecDeque::new(),
                gsi_psn: 0,
                lanes_open: Vec::new(),
                lane_epoch: 0,
                lanes: Vec::new(),
                cq_lanes: Vec::new(),
                cq_lanes_live: Vec::new(),
                recv: RecvLanes::default(),
                settle_buf: Vec::new(),
                stretch_polled: false,
                requeue: None,
                lane_carried: 0,
            }),
            shm,
            transport,
            pending: AtomicBool::new(false),
            doorbell: EventFd::new(true)?,
            timer: TimerFd::new()?,
            timer_fired: AtomicBool::new(false),
            watchdog: TimerFd::new()?,
            watchdog_fired: AtomicBool::new(false),
            masked: AtomicBool::new(false),
            sock_kept: AtomicBool::new(false),
            app_calls: AtomicU64::new(0),
            app_served: AtomicU64::new(0),
            seen_served: AtomicU64::new(0),
            watchdog_on: AtomicBool::new(false),
            progress_promised: AtomicBool::new(false),
            epoll: Epoll::new()?,
            sock_fd,
            // Blocking, as rdma-core's async descriptor starts out: the
            // mode is the application's to set (`ibv_get_async_event`
            // follows it), and `Context::get_async_event` never reads it
            // when it is empty.
            async_fd: EventFd::new(false)?,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            idle_bell: EventFd::new(false)?,
            lingering: AtomicBool::new(false),
            linger_until: AtomicU64::new(0),
            origin,
            idle_poll: IdlePoll::from_env(),
            calls_at_wake: AtomicU64::new(0),
            quiet_wakes: AtomicU32::new(0),
            ring_calls: AtomicU64::new(0),
            poller: Mutex::new(None),
            poller_masked: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            rang_at: AtomicU64::new(0),
            beats: AtomicU64::new(0),
            seen_beats: AtomicU64::new(0),
            lane_polled: AtomicBool::new(false),
            #[cfg(test)]
            ticks: AtomicU64::new(0),
            #[cfg(test)]
            stretches: AtomicU64::new(0),
            sock_events: Mutex::new(true),
            acks_deferred: AtomicBool::new(false),
        });
        let epoll = &e.epoll;
        // Edge-triggered: the engine is woken once per arrival, not again
        // and again while another thread owns the state and the datagram
        // waits for it (that owner serves it, see `Guard`). A pass in the
        // engine drains the socket, so no datagram is left without an edge.
        epoll.add_with(sock_fd, SOCK_EVENTS)?;
        epoll.add(e.doorbell.as_raw_fd())?;
        epoll.add(e.timer.as_raw_fd())?;
        epoll.add(e.watchdog.as_raw_fd())?;
        if let Some(h) = &e.shm {
            epoll.add(h.bell_fd())?;
        }
        let me = e.clone();
        let h = std::thread::Builder::new()
            .name("softrdma-engine".into())
            .spawn(move || me.run())?;
        *e.thread.lock().unwrap() = Some(h);
        if e.idle_poll != IdlePoll::Never {
            let me = e.clone();
            let h = std::thread::Builder::new()
                .name("softrdma-idle".into())
                .spawn(move || me.idle_poll())?;
            *e.poller.lock().unwrap() = Some(h);
        }
        Ok(e)
    }

    /// Have the engine thread woken for a multicast group's socket (as for
    /// the port's own: edge-triggered, every pass drains it). Closing the
    /// socket (`Port::leave_group`) takes it out again.
    pub fn watch_group(&self, fd: std::os::fd::RawFd) -> io::Result<()> {
        self.epoll.add_with(fd, SOCK_EVENTS)
    }

    /// Own the state for a command.
    pub fn lock(&self) -> Guard<'_> {
        crate::buffer::assert_not_in_view();
        Guard::new(self.state.lock().unwrap_or_else(|p| p.into_inner()), self)
    }

    /// Own the state if nobody does; for polls, which never wait: whoever
    /// owns it is making the progress they would make.
    pub fn try_lock(&self) -> Option<Guard<'_>> {
        crate::buffer::assert_not_in_poll();
        let g = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(Guard::new(g, self))
    }

    /// After a command queued work (the doorbell): transmit it now, in the
    /// caller's thread.
    /// After posting receives: they create nothing to send (an RNR-NAKed
    /// peer retries on its own timer), so unlike [`Engine::kick`] this
    /// sends nothing — ACKs a waiter deferred stay for the post the
    /// application makes in reply (perftest's `send_lat` posts its next
    /// receive before its reply) — and only delivers events.
    pub fn posted_recv(&self, st: &mut State) {
        self.count_call(st);
        st.deliver_events(&self.async_fd);
        if st.tx_deferred && !self.watchdog_on.load(Ordering::SeqCst) {
            // Nothing bounds the wait: send now.
            self.flush_deferred(st);
        }
    }

    /// Count an application call into the device (the watchdog's evidence
    /// that a poller is alive). Every call counts under the state lock, so
    /// a plain load and store do (a locked increment would, after a large
    /// shared-memory copy, wait for the copy's stores to drain); the
    /// watchdog only compares values.
    fn count_call(&self, _st: &mut State) {
        let n = self.app_calls.load(Ordering::Relaxed);
        self.app_calls.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// Watchdog ticks the engine thread has taken, whether an application
    /// thread holds the rings (`mask`), and whether the watchdog runs, for
    /// the crate's tests.
    #[cfg(test)]
    pub(crate) fn watchdog_state(&self) -> (u64, bool, bool) {
        (
            self.ticks.load(Ordering::SeqCst),
            self.masked.load(Ordering::SeqCst),
            self.watchdog_on.load(Ordering::SeqCst),
        )
    }

    /// Stretches of work under the state's lock so far, by any thread.
    #[cfg(test)]
    pub(crate) fn stretches(&self) -> u64 {
        self.stretches.load(Ordering::SeqCst)
    }

    /// `app_served` and whether an application thread holds the socket,
    /// for the crate's tests.
    #[cfg(test)]
    pub(crate) fn served(&self) -> (u64, bool) {
        (
            self.app_served.load(Ordering::Relaxed),
            self.masked.load(Ordering::Relaxed) && !self.sock_kept.load(Ordering::Relaxed),
        )
    }

    /// Count an application pass that served all an application thread
    /// holds (see `app_served`); under the state lock, as `count_call`.
    fn count_served(&self, _st: &mut State) {
        let n = self.app_served.load(Ordering::Relaxed);
        self.app_served.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// After `State::post_send`: a request carried out at once (shared
    /// memory) queued nothing, so unless a pass deferred ACKs for this call
    /// to carry, only its completion's event is delivered.
    pub fn posted_send(&self, st: &mut State, done: bool) {
        if done && !st.tx_deferred {
            self.count_call(st);
            st.deliver_events(&self.async_fd);
        } else {
            self.kick(st);
        }
    }

    /// Nothing waits for an application's pass: no ACK deferred for its
    /// next call, no packet in the rings (a CQ with a QP on UDP is never
    /// quiet: see `CqLane::poll_quiet`). A poll that found its CQ empty
    /// without the lock may then say so without the lock: the engine
    /// thread serves what comes next (the rings' bell, the socket) unless
    /// this application took them over, and then its next poll sees the
    /// packet in the rings and serves it.
    #[inline]
    pub fn quiet(&self) -> bool {
        !self.acks_deferred() && self.shm.as_ref().is_some_and(|h| !h.rings_pending())
    }

    /// Whether the last holder of the state left ACKs for the
    /// application's next call to carry (then a post takes the engine's
    /// way, which sends them).
    #[inline]
    pub fn acks_deferred(&self) -> bool {
        self.acks_deferred.load(Ordering::Relaxed)
    }

    pub fn kick(&self, st: &mut State) {
        self.count_call(st);
        let now = st.now();
        let (sent, more) = st.transmit(now);
        if sent == 0
            && self.masked.load(Ordering::Relaxed)
            && !self.sock_kept.load(Ordering::Relaxed)
        {
            // Nothing could go: the QP waits for the wire (its window, its
            // READ credits), and the socket is this application's, which
            // nobody else reads — no engine thread woken to flag what came
            // (`pending`). What came is taken now, and what it lets go
            // goes in the same pass.
            let p = st.pass(&self.async_fd, true, true);
            self.after_pass(st, p.more_tx);
            self.defer_bounded(st);
            return;
        }
        st.deliver_events(&self.async_fd);
        self.after_pass(st, more);
    }

    /// A full pass in the application's thread (from `poll_cq` on an empty
    /// CQ, or `Context::progress`).
    pub fn app_pass(&self, st: &mut State) {
        self.app_pass_with(st, true, true)
    }

    /// The device's UDP socket, for a waiter that sleeps on it too
    /// (`CompChannel::get_event`).
    pub fn sock_fd(&self) -> std::os::fd::RawFd {
        self.sock_fd
    }

    /// A thread is about to block in `poll` on the socket (and its
    /// channel) until something arrives: the kernel wakes it for the next
    /// packet, so the engine thread need not be woken too — two threads
    /// woken per packet on two cores cost a preemption or a lock hand-over
    /// each. Until the returned guard drops, packets wake only sleepers.
    pub fn sleep_on_socket(&self) -> SocketSleep<'_> {
        if self.sleepers.fetch_add(1, Ordering::SeqCst) == 0 {
            self.set_sock_events();
        }
        SocketSleep(self)
    }

    /// A thread that slept on the socket was woken by a packet: serve it
    /// (the engine thread, woken too, may have got there first; then this
    /// finds nothing). Leaves the socket with the engine thread.
    pub fn serve_socket(&self) {
        let mut st = self.lock();
        self.count_call(&mut st);
        self.count_served(&mut st);
        // The waiter returns to its application with what came, which
        // answers with its next post: what the packets call for (the ACK)
        // leaves with that post, in one system call and, at the peer, one
        // wake-up. Bounded: the watchdog's next tick sends it if no call
        // comes (a tick flushes whatever is deferred).
        let p = st.pass(&self.async_fd, true, true);
        self.after_pass(&mut st, p.more_tx);
        self.defer_bounded(&st);
    }

    /// What a pass deferred waits for the application's next call into the
    /// device, which sends it with whatever the application posts; if no
    /// call comes, the watchdog's next tick sends it (a tick's pass defers
    /// nothing). So the ACK of a message whose receiver stops calling
    /// after taking it (computes, or blocks elsewhere) is at most one
    /// watchdog period late: within the sender's retransmission timeout
    /// (67 ms at rxe's default) by far, and the price of sending the ACK
    /// of every ping-pong with its reply.
    fn defer_bounded(&self, st: &State) {
        if st.tx_deferred {
            self.start_watchdog();
        }
    }

    /// [`Engine::app_pass`]; `take_socket` false for the poll that follows
    /// arming a CQ (verbs' "arm, then poll again"): its caller is about to
    /// sleep on the channel, so the pass serves what is there but leaves
    /// the socket with the engine thread — masking it would leave the
    /// sleeper's packets to the watchdog (a millisecond each).
    /// `take_socket`: the caller will poll again (see `mask`); `udp`: it
    /// waits for traffic that may come over UDP (else only rings are
    /// served, and the socket stays with the engine thread).
    pub fn app_pass_with(&self, st: &mut State, take_socket: bool, udp: bool) {
        self.count_call(st);
        if take_socket {
            self.mask(st, udp);
        }
        if udp || self.sock_kept.load(Ordering::Relaxed) {
            // This pass reads the socket, or the socket is not ours.
            self.count_served(st);
        }
        let p = st.pass(&self.async_fd, udp, true);
        self.after_pass(st, p.more_tx);
        self.defer_bounded(st);
    }

    /// An application thread polls: take the socket out of the engine
    /// thread's wake-ups, as NAPI suspends a device's interrupts while a
    /// thread busy-polls it. The poller serves every packet anyway; a second
    /// thread woken for each one costs, on a 2-core host where both cores
    /// already spin, a preemption per packet (measured with `perf
    /// write_lat`: 4.8 µs with the socket handed over, 12 to 26 µs with the
    /// engine woken for each packet).
    ///
    /// The socket comes back to the engine thread when the application says
    /// it stops polling: it takes completions (unless it promised to drive
    /// progress itself while it waits, see [`Engine::promise_progress`]),
    /// arms a CQ to sleep on its channel, or makes no call for a whole
    /// watchdog period.
    fn mask(&self, _st: &mut State, socket: bool) {
        if !self.masked.load(Ordering::Relaxed) {
            self.sock_kept.store(!socket, Ordering::SeqCst);
            self.masked.store(true, Ordering::SeqCst);
            if let Some(h) = &self.shm {
                h.disarm();
            }
            self.set_sock_events();
            self.start_watchdog();
        } else if socket && self.sock_kept.load(Ordering::Relaxed) {
            // A poll that waits for UDP traffic too: the socket as well.
            self.sock_kept.store(false, Ordering::SeqCst);
            self.set_sock_events();
        }
    }

    /// The application drives progress itself while it waits on memory
    /// (`Context::progress`), so taking a completion does not mean it
    /// leaves — UCX's contract with `ucp_worker_progress` — and the socket
    /// stays with it. (What its polls' packets call for is deferred as for
    /// every application pass, see [`Engine::defer_bounded`].)
    pub fn promise_progress(&self) {
        self.progress_promised.store(true, Ordering::Relaxed);
    }

    /// The application took completions: unless it promised to drive
    /// progress while it waits, it may now spin on memory or block without
    /// calling again (perftest's `ib_write_lat` does), so the engine thread
    /// takes the socket back at once.
    /// An application thread holds the socket (`mask`) and has not
    /// promised to keep polling: whoever takes completions must hand it
    /// back (`took_completions`), under the lock.
    #[inline]
    pub fn holds_socket_unpromised(&self) -> bool {
        self.masked.load(Ordering::Relaxed) && !self.progress_promised.load(Ordering::Relaxed)
    }

    /// The application took completions mid-stream (see `Cq::poll_device`)
    /// and polls on: the socket is its thread's, as after an empty poll.
    /// Such a poll runs no pass when its CQ had completions already, so it
    /// counts as serving too — else the watchdog, seeing no serving pass
    /// for a period, handed the socket back in the middle of a stream, and
    /// the engine thread was woken for every ACK only to find the state
    /// taken by the poster (`perf write_bw -s 65536`: ~24 000 wake-ups of
    /// the sender's engine thread for 40 000 messages).
    pub fn keeps_polling(&self, st: &mut State) {
        self.mask(st, true);
        self.count_served(st);
    }

    pub fn took_completions(&self, st: &mut State) {
        if !self.progress_promised.load(Ordering::Relaxed) {
            self.unmask(st);
        }
    }

    /// The engine thread serves the socket again. Re-adding a readable
    /// socket wakes it at once, so nothing that arrived while masked waits.
    /// The periodic watchdog is left running; its next tick stops it.
    pub fn unmask(&self, st: &mut State) {
        if self.masked.load(Ordering::Relaxed) {
            self.masked.store(false, Ordering::SeqCst);
            self.set_sock_events();
            // The rings are the engine thread's again; what came meanwhile
            // is served now.
            if self.shm.as_ref().is_some_and(|h| h.arm()) {
                self.doorbell.signal();
            }
        }
        if st.tx_deferred && !self.watchdog_on.load(Ordering::SeqCst) {
            // Deferred with nothing to bound the wait: the engine thread
            // sends it. With the watchdog on, what was deferred waits for
            // the application's next call (its reply carries it) or the
            // next tick, as `Engine::serve_socket` promised; ringing here
            // would wake the engine thread on another core for every
            // event-mode message only to send the ACK ahead of the reply.
            self.doorbell.signal();
        }
    }

    /// A watchdog tick: whether the poller the socket was handed to still
    /// serves it (`app_served`). Costs no lock, so checking on a poller
    /// never takes the state from it.
    fn poller_alive(&self) -> bool {
        let served = self.app_served.load(Ordering::Relaxed);
        served != self.seen_served.swap(served, Ordering::Relaxed)
    }

    /// A watchdog tick's second look at a poller that made no serving pass
    /// for a period but polled CQ lanes (`lane_polled`): it is alive if
    /// nothing it took from the engine thread waits for it — it left the
    /// socket with the engine thread (it polls only shared-memory CQs,
    /// `Engine::mask`), no ring holds a packet and no ACK waits for its
    /// next call (`Engine::quiet`). A thread that spins on memory and
    /// polls only the completions its own lane posts put in its CQ (`perf
    /// write_lat` over shared memory, `ib_write_lat`) makes no serving
    /// pass at all: ticks took the state from it to hand back rings that
    /// held nothing, and closed its CQ's lane meanwhile (see
    /// `CqLane::bookkeeping_hold`). Costs no lock.
    fn lane_poller_owes_nothing(&self) -> bool {
        self.sock_kept.load(Ordering::SeqCst) && self.quiet()
    }

    /// A poll took completions from a CQ's lane, or found it empty, without
    /// the engine's lock: evidence for the watchdog that the thread the
    /// rings were handed to still polls (see `lane_poller_owes_nothing`).
    /// A load first, so pollers only read the flag's line between ticks.
    #[inline]
    pub(crate) fn note_lane_poll(&self) {
        if !self.lane_polled.load(Ordering::Relaxed) {
            self.lane_polled.store(true, Ordering::Relaxed);
        }
    }

    /// What the engine thread was woken for, run by whoever owns the state.
    fn service(&self, st: &mut State) {
        let tick = self.watchdog_fired.swap(false, Ordering::SeqCst);
        if tick && !self.stop_watchdog() && !self.poller_alive() {
            // No serving pass for a whole period: nobody polls.
            self.unmask(st);
        }
        // The timer fired (the engine thread drained it): nothing is armed
        // now, so the pass re-arms for the current deadline. One that has
        // not fired is still armed, for a deadline no later than the core
        // needs (`after_pass` only ever moves it earlier): forgetting it on
        // every wake-up cost a `timerfd_settime` per engine wake-up, paid
        // by the next post under the lock — a VM exit (`ib_write_lat -s 8
        // -n 5000`: 1 130 per side before, 180–310 after).
        if self.timer_fired.swap(false, Ordering::SeqCst) {
            st.armed = None;
        }
        // Woken from `epoll_wait`: the socket's first receive is a batch
        // (`Port::rx_woken`).
        st.port.rx_woken();
        // The application's calls before these packets are served: one it
        // makes in answer to them (a spinning `ib_write_lat` posts its
        // reply the moment the WRITE lands, maybe before this thread gets
        // past the drain) counts as activity at the next wake-up.
        let calls = self.app_calls.load(Ordering::Relaxed);
        // The application called since the last wake-up that served
        // packets: it is at work (perftest's `ib_write_lat` posts its reply
        // the moment the WRITE lands), so what these packets call for, if
        // it is ACKs alone, waits for its next call, as an application
        // pass's would. Without this a WRITE that came while the socket
        // was the engine's (just handed back with a completion) had its
        // ACK sent alone, the peer took that completion alone and handed
        // its socket back too, and each side's next WRITE then came to an
        // engine thread to wake: a ping-pong, once in that state, stayed
        // there (`ib_write_lat` 5 → 24 µs, every datagram its own
        // system call). A passive process (no call since) defers nothing,
        // and neither does a watchdog tick, which sends what was deferred:
        // so nothing waits longer than one watchdog period.
        let called = calls != self.calls_at_wake.load(Ordering::Relaxed);
        let drained = self.drain(st, called && !tick);
        // The rings' bell re-armed by whoever served them (the engine
        // thread, or the owner serving its backlog while the engine thread
        // went back to sleep, `run`): a packet pushed after the last drain
        // and before this rings it; one pushed before is served here.
        if let Some(h) = &self.shm {
            while !self.masked.load(Ordering::SeqCst) && h.arm() {
                self.drain(st, false);
            }
        }
        self.defer_bounded(st);
        // No application call over the last few wake-ups that served
        // packets: the process is a passive target (its threads sleep, or
        // spin on memory without calling), with no thread of its own
        // competing for a core — the case the poller is for.
        let passive = drained && {
            self.calls_at_wake.store(calls, Ordering::Relaxed);
            let quiet = if called {
                0
            } else {
                self.quiet_wakes.load(Ordering::Relaxed).saturating_add(1)
            };
            self.quiet_wakes.store(quiet, Ordering::Relaxed);
            quiet >= PASSIVE_WAKES
        };
        let ring = match self.idle_poll {
            IdlePoll::Never => false,
            IdlePoll::Passive => passive,
            IdlePoll::Always => drained,
        };
        if ring && !self.masked.load(Ordering::Relaxed) {
            // Packets the engine thread had to be woken for: nobody polls.
            // Have the next ones polled on an idle core, if there is one.
            self.ring_calls.store(calls, Ordering::Release);
            self.linger_until
                .store(self.since_origin() + LINGER, Ordering::Release);
            if !self.lingering.swap(true, Ordering::AcqRel) {
                self.rang_at.store(self.since_origin(), Ordering::Release);
                self.idle_bell.signal();
            }
        }
    }

    /// Register the socket with the engine thread's epoll as the flags
    /// say: out while an application thread or the idle poller serves it.
    /// Re-adding a readable socket wakes the engine thread at once, so
    /// nothing that arrived meanwhile waits.
    fn set_sock_events(&self) {
        let mut g = self.sock_events.lock().unwrap_or_else(|p| p.into_inner());
        let out = (self.masked.load(Ordering::SeqCst) && !self.sock_kept.load(Ordering::SeqCst))
            || self.poller_masked.load(Ordering::SeqCst)
            || self.sleepers.load(Ordering::SeqCst) > 0;
        if *g != out {
            // Unchanged: a socket that never left the set (a poller of
            // shared-memory CQs keeps it with the engine) gave the engine
            // an edge for every arrival, so no re-add is needed to wake it
            // for anything; one that stays out stays out. Either way, no
            // system call.
            return;
        }
        *g = !out;
        let _ = self
            .epoll
            .modify(self.sock_fd, if out { 0 } else { SOCK_EVENTS });
    }

    /// A tick after the socket and rings were handed back (no application
    /// thread or idle poller holds them): stop ticking. Whether it was so.
    /// Without the state lock: the timer is disarmed before `watchdog_on`
    /// clears, and a poller that took them meanwhile (its mark stored
    /// before it looks at `watchdog_on`, SeqCst both sides) either found
    /// the watchdog off and armed it after the disarm, or found it on and
    /// is seen here, which starts it again.
    fn stop_watchdog(&self) -> bool {
        if self.masked.load(Ordering::SeqCst) || self.poller_masked.load(Ordering::SeqCst) {
            return false;
        }
        self.watchdog.set_relative(0);
        self.watchdog_on.store(false, Ordering::SeqCst);
        if self.masked.load(Ordering::SeqCst) || self.poller_masked.load(Ordering::SeqCst) {
            self.start_watchdog();
        }
        true
    }

    fn start_watchdog(&self) {
        if !self.watchdog_on.swap(true, Ordering::SeqCst) {
            self.seen_served
                .store(self.app_served.load(Ordering::Relaxed), Ordering::Relaxed);
            self.seen_beats
                .store(self.beats.load(Ordering::Relaxed), Ordering::Relaxed);
            self.watchdog.set_periodic(WATCHDOG);
        }
    }

    /// A watchdog tick while the idle poller has the socket: if it has not
    /// polled for a whole period it is starved (an application took its
    /// core), and the socket goes back to the engine thread.
    fn check_poller(&self) {
        let beats = self.beats.load(Ordering::Relaxed);
        if beats == self.seen_beats.swap(beats, Ordering::Relaxed)
            && self.poller_masked.swap(false, Ordering::SeqCst)
        {
            self.set_sock_events();
        }
    }

    fn since_origin(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// The idle poller: after the engine thread was woken for packets, poll
    /// the socket for [`LINGER`] past the last one, on a core nothing else
    /// wants.
    ///
    /// Why: on a virtual machine, waking a thread on another core costs an
    /// inter-processor interrupt through the hypervisor, 25–40 µs measured
    /// here, and a passive responder (the target of a READ, an atomic or a
    /// WRITE whose application sleeps or spins on memory) pays it for every
    /// request. A thread that is already running on an idle core sees the
    /// packet in the time of one `poll` instead — what an RNIC's own
    /// processor does, on a core the host has spare.
    ///
    /// It runs at `SCHED_IDLE`: it gets a core only when no other thread
    /// wants it, so it never takes a core from a spinning application (the
    /// first engine's 200 µs spin did, 592 µs per `ib_write_lat` message on
    /// 2 cores). A starved poller costs nothing: the engine thread stays in
    /// `epoll` on the socket as before and serves the packet with a wake-up.
    /// It does not run while an application thread polls (the socket is
    /// masked then). Priority inversion: a `SCHED_IDLE` thread preempted
    /// while it owns the state would hold it up to the scheduler's idle
    /// share; the poller owns it only for one pass, and only a thread that
    /// wakes onto its core and then spins could preempt it there (the
    /// engine thread woken by the same packet blocks again at once, leaving
    /// its work in the backlog the poller serves on release).
    fn idle_poll(&self) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler reads the sched_param we pass; pid 0 is
        // this thread. Any user may lower its own thread to SCHED_IDLE.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            // Without SCHED_IDLE a poller would compete with the
            // application for cores: none, then.
            return;
        }
        loop {
            if self.idle_bell.drain().is_err() {
                continue; // EINTR
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.since_origin() > self.rang_at.load(Ordering::Acquire) + LINGER {
                // Rung, but started only after the round was over: every
                // core was busy (both of `ib_write_lat`'s applications spin,
                // say). Taking the socket now would leave it with a thread
                // that may not run again for milliseconds.
                self.lingering.store(false, Ordering::SeqCst);
                continue;
            }
            loop {
                // Take the socket from the engine thread's wake-ups only
                // once this thread runs: it is running now, on a core nobody
                // else wanted.
                // The application's calls as of the ring: one made since
                // ends the round.
                let calls = self.ring_calls.load(Ordering::Acquire);
                self.poller_masked.store(true, Ordering::SeqCst);
                self.set_sock_events();
                self.start_watchdog();
                while !self.stop.load(Ordering::Acquire)
                    && self.poller_masked.load(Ordering::Relaxed)
                    && !self.masked.load(Ordering::Relaxed)
                    && self.since_origin() < self.linger_until.load(Ordering::Acquire)
                    // A process that calls into the device has a thread
                    // of its own that wants a core: the poller is for a
                    // passive one (see `IdlePoll::Passive`).
                    && (self.idle_poll == IdlePoll::Always
                        || self.app_calls.load(Ordering::Relaxed) == calls)
                {
                    let mut pfd = libc::pollfd {
                        fd: self.sock_fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    self.beats.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: one valid pollfd; timeout 0 never blocks.
                    if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let Some(mut g) = self.try_lock() else {
                        continue; // its owner serves the socket
                    };
                    let p = g.pass(&self.async_fd, true, false);
                    self.after_pass(&mut g, p.more_tx);
                    if p.rx {
                        self.linger_until
                            .store(self.since_origin() + LINGER, Ordering::Release);
                    }
                }
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                // Still masked unless the watchdog found this thread
                // starved and gave the socket back.
                let starved = !self.poller_masked.swap(false, Ordering::SeqCst);
                if !starved {
                    self.set_sock_events();
                }
                self.lingering.store(false, Ordering::SeqCst);
                // The engine may have extended the deadline after the check
                // above and seen `lingering` still set: look once more. Not
                // after starving, nor once the application called: the next
                // packet the engine thread serves starts a new round (if
                // the process is passive again by then).
                let called = self.idle_poll != IdlePoll::Always
                    && self.app_calls.load(Ordering::Relaxed) != calls;
                let again = !starved
                    && !called
                    && !self.masked.load(Ordering::Relaxed)
                    && self.since_origin() < self.linger_until.load(Ordering::Acquire);
                if !again || self.lingering.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
        }
    }

    /// Keep the engine thread's wake-ups right after a pass in any thread:
    /// the timer armed to the core's next deadline, the doorbell rung if
    /// sendable work was left behind.
    fn after_pass(&self, st: &mut State, more_tx: bool) {
        // Re-arm only for an earlier deadline. A later one (the usual case:
        // each ACK pushes the retransmission deadline out) leaves the timer
        // early, and its wake-up re-arms it: one spare wake-up per
        // retransmission timeout instead of a system call per packet.
        if let Some(t) = st.ep.poll_timeout() {
            if st.armed.is_none_or(|a| t < a) {
                self.timer.set_relative(t.saturating_sub(st.now()).max(1));
                st.armed = Some(t);
            }
        }
        if more_tx {
            self.doorbell.signal();
        }
    }

    fn run(&self) {
        let mut handed_over = false;
        while !self.stop.load(Ordering::Acquire) {
            // Sleep until a packet, a doorbell or a deadline — unless a
            // ring of a peer on this host holds packets already (peers ring
            // the bell only once asked to, `Host::arm`).
            // After handing a backlog to the state's owner (below), what
            // the rings hold is the owner's to serve (it checks `pending`
            // after it lets go), so the engine arms the bell and sleeps.
            let ring_waiting = match &self.shm {
                Some(h) if !self.masked.load(Ordering::SeqCst) => {
                    if handed_over {
                        h.arm_only();
                        false
                    } else {
                        h.arm()
                    }
                }
                _ => false,
            };
            handed_over = false;
            // With a ring waiting, only look (the timers and the doorbell
            // are still taken, so steady ring traffic cannot starve the
            // watchdog). Only what epoll reports ready is read: each
            // eventfd or timerfd read is a system call, and one that
            // finds nothing is an `EAGAIN` (three per wake-up before).
            let ready = match self.epoll.wait(if ring_waiting { 0 } else { -1 }) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("softrdma: engine stopped: epoll_wait: {e}");
                    return;
                }
            };
            let belled = !ring_waiting
                && self
                    .shm
                    .as_ref()
                    .is_some_and(|h| ready.has(h.bell_fd()) && h.clear_bell());
            let rang = (ready.has(self.doorbell.as_raw_fd())
                && self.doorbell.drain().unwrap_or(0) > 0)
                || ring_waiting
                || belled;
            let timed = ready.has(self.timer.as_raw_fd()) && self.timer.drain() > 0;
            if timed {
                self.timer_fired.store(true, Ordering::SeqCst);
            }
            if ready.has(self.watchdog.as_raw_fd()) && self.watchdog.drain() > 0 {
                #[cfg(test)]
                self.ticks.fetch_add(1, Ordering::SeqCst);
                self.check_poller();
                let app = self.masked.load(Ordering::SeqCst);
                let idle = self.poller_masked.load(Ordering::SeqCst);
                // Nothing but the watchdog was reported: an edge-triggered
                // socket reported with it (the port's, while a poller of
                // shared-memory CQs leaves it here; a multicast group's) is
                // reported once, so skipping the pass would leave its
                // datagrams to the next arrival — a resend, or never.
                let alone = ready.len() == 1;
                let lane_polled = self.lane_polled.swap(false, Ordering::Relaxed);
                if alone && !rang && !timed {
                    if !app && !idle {
                        if !self.acks_deferred() && self.stop_watchdog() {
                            // Handed back since the last tick, and no ACK
                            // for the tick to send: stopped, with no lock (a
                            // stretch under it would close the CQ lanes of a
                            // thread that may be polling them again, see
                            // `State::settle_cq_lanes`).
                            continue;
                        }
                    } else if !app
                        || self.poller_alive()
                        || (lane_polled && self.lane_poller_owes_nothing())
                    {
                        // Only the watchdog, and whoever has the socket
                        // still polls it.
                        continue;
                    }
                }
                self.watchdog_fired.store(true, Ordering::SeqCst);
            }
            self.pending.store(true, Ordering::SeqCst);
            let g = match self.state.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                // An application thread owns the state: it serves the
                // backlog before it lets go (`Guard::drop`).
                Err(std::sync::TryLockError::WouldBlock) => {
                    handed_over = true;
                    continue;
                }
            };
            let mut g = Guard::new(g, self);
            self.pending.store(false, Ordering::SeqCst);
            self.service(&mut g);
        }
    }

    /// The engine thread's pass: with an edge-triggered socket it must
    /// leave nothing queued behind, so it receives until the socket is
    /// empty, or rings its own doorbell to come back for the rest.
    /// Returns whether anything was received.
    /// `defer`: the first pass may leave lone ACKs for the application's
    /// next call (see `service`); the rest keep them deferred unless they
    /// receive more or something else becomes ready.
    fn drain(&self, st: &mut State, defer: bool) -> bool {
        let mut any = false;
        for _ in 0..RX_ROUNDS {
            let d = match (defer, any) {
                (false, _) => Defer::No,
                (true, false) => Defer::Drain,
                (true, true) => Defer::Hold,
            };
            let p = st.pass_with(&self.async_fd, true, d);
            self.after_pass(st, p.more_tx);
            if !p.rx {
                return any;
            }
            any = true;
        }
        self.doorbell.signal();
        any
    }

    /// Send what a pass deferred (ACKs waiting for the application's next
    /// post) now: before a QP goes away or the device closes, as an
    /// application that exits right after its last completion makes no
    /// further call to carry them.
    pub fn flush_deferred(&self, st: &mut State) {
        if st.tx_deferred {
            let now = st.now();
            let (_, more) = st.transmit(now);
            self.after_pass(st, more);
        }
    }

    pub fn shutdown(&self) {
        {
            let mut st = self.lock();
            self.flush_deferred(&mut st);
        }
        self.stop.store(true, Ordering::Release);
        self.doorbell.signal();
        if let Some(h) = self.thread.lock().unwrap().take() {
            let _ = h.join();
        }
        self.idle_bell.signal();
        if let Some(h) = self.poller.lock().unwrap().take() {
            let _ = h.join();
        }
    }
}
