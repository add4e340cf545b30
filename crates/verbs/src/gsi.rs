//! QP1, the General Services Interface: where communication management
//! MADs arrive and leave.
//!
//! An RNIC's QP1 is a UD QP the kernel's MAD layer owns; here it belongs to
//! the device's engine, as a QP0/QP1 belongs to an HCA's firmware agent.
//! Datagrams for QP1 reach this process because the port's steering sends
//! it the REQs of the services it listens on and the replies carrying its
//! communication IDs (see `softrdma_udp`'s `cbpf`). The engine takes them
//! out of the receive path before the core (the core has no QP1) and queues
//! them for the connection manager (`crate::cm`) in a bounded inbox whose
//! eventfd is readable while it holds MADs. Without a connection manager
//! in this process, a REQ or SIDR_REQ that was steered here (nobody listens
//! on its service) is rejected at once, as the kernel's CM rejects a REQ
//! for a service nobody listens on.

use crate::sys::EventFd;
use softrdma_wire::{Opcode, Packet};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The well-known Q_Key of QP1 (IBA 13.5.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// A MAD is 256 bytes.
pub const MAD_LEN: usize = 256;
/// MADs queued for the connection manager before more are dropped (as a
/// full receive queue of QP1 drops them; the CM's senders retransmit).
const INBOX_DEPTH: usize = 256;

/// One MAD received on QP1.
#[derive(Clone)]
pub struct Mad {
    /// The sender's GID (its address).
    pub sgid: [u8; 16],
    /// The sender's QP (1 for a CM agent).
    pub src_qp: u32,
    pub bytes: [u8; MAD_LEN],
}

impl std::fmt::Debug for Mad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mad")
            .field("sgid", &std::net::Ipv6Addr::from(self.sgid))
            .field("src_qp", &self.src_qp)
            .field("class", &self.bytes[1])
            .field(
                "attr",
                &u16::from_be_bytes([self.bytes[16], self.bytes[17]]),
            )
            .finish()
    }
}

/// Whether a received datagram (BTH onwards) is addressed to QP1.
pub(crate) fn for_qp1(datagram: &[u8]) -> bool {
    datagram.get(5..8) == Some(&[0, 0, 1])
}

/// Read a QP1 datagram: a UD SEND ONLY with the GSI Q_Key and a whole MAD.
/// Anything else is not a MAD (`None`: dropped and counted).
pub(crate) fn parse(datagram: &[u8], sgid: [u8; 16]) -> Option<Mad> {
    let p = Packet::new_checked(datagram).ok()?;
    let bth = p.bth();
    if bth.opcode() != Opcode::UD_SEND_ONLY {
        return None;
    }
    let deth = p.deth()?;
    if deth.qkey != GSI_QKEY {
        return None;
    }
    let bytes: [u8; MAD_LEN] = p.payload().get(..MAD_LEN)?.try_into().ok()?;
    Some(Mad {
        sgid,
        src_qp: deth.src_qp,
        bytes,
    })
}

/// The slot a CM MAD is steered by: the top byte of the receiver's ID it
/// carries (every message but a REQ or SIDR_REQ: the RemoteCommID, or a
/// SIDR_REP's RequestID), which softrdma's CM gives the slot of the
/// process that handed the ID out. `None` for requests, other classes and
/// IDs with no slot (top byte 0: not one of ours).
pub(crate) fn cm_slot(mad: &[u8; MAD_LEN]) -> Option<u8> {
    use softrdma_wire::cm::{self as w, CmMsg};
    let (_, msg) = w::parse(mad).ok()?;
    let id = match &msg {
        CmMsg::Rep(m) => m.remote_comm_id,
        CmMsg::Rtu(m) => m.remote_comm_id,
        CmMsg::Rej(m) => m.remote_comm_id,
        CmMsg::Mra(m) => m.remote_comm_id,
        CmMsg::Dreq(m) => m.remote_comm_id,
        CmMsg::Drep(m) => m.remote_comm_id,
        CmMsg::SidrRep(m) => m.request_id,
        CmMsg::Req(_) | CmMsg::SidrReq(_) | CmMsg::Other(_) => return None,
    };
    Some((id >> 24) as u8).filter(|&s| s != 0)
}

/// The service a connection request (REQ or SIDR_REQ) asks for; `None`
/// for every other MAD.
pub(crate) fn request_service(mad: &[u8; MAD_LEN]) -> Option<u64> {
    use softrdma_wire::cm::{self as w, CmMsg};
    match w::parse(mad).ok()?.1 {
        CmMsg::Req(r) => Some(r.service_id),
        CmMsg::SidrReq(r) => Some(r.service_id),
        _ => None,
    }
}

/// The BTH and DETH of a MAD sent from QP1 to QP1 (UD SEND ONLY, default
/// P_Key, AckReq set, GSI Q_Key), with packet sequence number `psn` (a
/// counter from 0, as the kernel's QP1).
pub(crate) fn headers(psn: u32) -> [u8; 20] {
    let repr = softrdma_wire::PacketRepr {
        bth: softrdma_wire::BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            dest_qp: 1,
            // As rxe's QP1 sends them (crates/wire/tests/golden/cm).
            ack_req: true,
            psn: softrdma_wire::Psn::new(psn),
            ..Default::default()
        },
        ext: softrdma_wire::packet::ExtRepr {
            deth: Some(softrdma_wire::ext::DethRepr {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            ..Default::default()
        },
        payload_len: MAD_LEN,
    };
    let mut buf = [0u8; 20 + MAD_LEN + 4];
    repr.emit_headers(&mut buf);
    let mut h = [0u8; 20];
    h.copy_from_slice(&buf[..20]);
    h
}

/// MADs waiting for the connection manager.
pub(crate) struct Inbox {
    q: Mutex<VecDeque<Mad>>,
    /// Readable while `q` holds MADs.
    bell: EventFd,
    /// A connection manager takes MADs (otherwise REQs are rejected).
    open: AtomicBool,
    /// MADs dropped: the inbox was full, or a QP1 datagram was no MAD.
    pub drops: AtomicU64,
}

impl Inbox {
    pub fn new() -> std::io::Result<Inbox> {
        Ok(Inbox {
            q: Mutex::new(VecDeque::new()),
            bell: EventFd::new(true)?,
            open: AtomicBool::new(false),
            drops: AtomicU64::new(0),
        })
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Claim the inbox for a connection manager; false if one has it.
    pub fn open(&self) -> bool {
        !self.open.swap(true, Ordering::AcqRel)
    }

    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
        self.q.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let _ = self.bell.drain();
    }

    pub fn push(&self, m: Mad) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= INBOX_DEPTH {
            self.drops.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(m);
        if q.len() == 1 {
            self.bell.signal();
        }
    }

    /// The next MAD, if any; the bell is cleared when the inbox empties.
    pub fn pop(&self) -> Option<Mad> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let m = q.pop_front();
        if q.is_empty() {
            let _ = self.bell.drain();
        }
        m
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.bell.as_raw_fd()
    }
}
