//! Work queue rings with preallocated slots: a queue of depth N holds N
//! entries, each with room for `max_sge` validated scatter/gather entries
//! (and, for send queues, `max_inline` bytes), so posting never allocates.
//!
//! An entry holds its SGEs as [`Span`]s — a region reference and an offset,
//! never a host address — and [`gather`] / [`scatter`] translate them
//! through the region table at the moment of each access, so a region
//! deregistered while work that names it is queued or half done is never
//! touched (see `crate::mr`).

use crate::mr::{Memory, MrTable, Span};
use crate::transmit::Seg;
use crate::wr::{SendFlags, SendOp, UdDest};
use softrdma_wire::Psn;

/// A posted receive (its SGEs sit in the queue's SGE slots).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub nsge: u8,
    /// Sum of SGE lengths.
    pub length: u64,
}

/// A receive queue (a QP's own, or a shared one).
#[derive(Debug)]
pub(crate) struct RecvQueue {
    pub depth: u32,
    pub max_sge: u32,
    wqes: Vec<RecvWqe>,
    sges: Vec<Span>,
    head: u64,
    tail: u64,
}

impl RecvQueue {
    pub fn new(depth: u32, max_sge: u32) -> RecvQueue {
        RecvQueue {
            depth,
            max_sge,
            wqes: vec![RecvWqe::default(); depth as usize],
            sges: vec![Span::default(); (depth * max_sge) as usize],
            head: 0,
            tail: 0,
        }
    }

    pub fn len(&self) -> u32 {
        (self.head - self.tail) as u32
    }

    pub fn is_full(&self) -> bool {
        self.len() >= self.depth
    }

    /// Add a receive; the caller has checked `is_full` and the SGE count.
    pub fn push(&mut self, wr_id: u64, sges: &[Span]) {
        let slot = (self.head % self.depth as u64) as usize;
        let base = slot * self.max_sge as usize;
        self.sges[base..base + sges.len()].copy_from_slice(sges);
        self.wqes[slot] = RecvWqe {
            wr_id,
            nsge: sges.len() as u8,
            length: sges.iter().map(|s| s.len as u64).sum(),
        };
        self.head += 1;
    }

    /// Take the oldest receive, copying its SGEs into `out`.
    pub fn pop(&mut self, out: &mut [Span; crate::MAX_SGE]) -> Option<RecvWqe> {
        if self.head == self.tail {
            return None;
        }
        let slot = (self.tail % self.depth as u64) as usize;
        let w = self.wqes[slot];
        let base = slot * self.max_sge as usize;
        out[..w.nsge as usize].copy_from_slice(&self.sges[base..base + w.nsge as usize]);
        self.tail += 1;
        Some(w)
    }
}

/// Progress of a send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SendState {
    /// Posted, no packet sent yet.
    #[default]
    Posted,
    /// Packets sent (PSNs assigned), not yet acknowledged.
    Sent,
    /// Finished by the requester itself: a local operation (bind,
    /// invalidate) carried out, or a WQE given up because a region one of
    /// its SGEs names was deregistered before all of its payload was sent
    /// (nothing more of it goes out). It completes with this status once it
    /// is the oldest — what comes before it completes first, in order — and
    /// an error status then moves the QP to ERR.
    Done(crate::wc::WcStatus),
}

/// A posted send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    pub ud: Option<UdDest>,
    /// XRC_SEND only: the target's XRC SRQ, sent in every packet's XRCETH.
    pub xrc_srqn: u32,
    pub nsge: u8,
    /// Bytes of inline data (then `nsge` is 0).
    pub inline_len: u16,
    pub length: u32,
    pub state: SendState,
    /// First PSN; valid once `state` is `Sent`.
    pub first_psn: Psn,
    /// PSNs the message occupies (a READ reserves one per response packet).
    pub npkts: u32,
    /// The completion this WQE produces is requested.
    pub signaled: bool,
}

impl SendWqe {
    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
}

/// A send queue: slots for WQEs, their SGEs and their inline bytes, with
/// three positions: `tail` (oldest not completed) <= `send` (next for the
/// requester) <= `head` (next free).
#[derive(Debug)]
pub(crate) struct SendQueue {
    pub depth: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    wqes: Vec<Option<SendWqe>>,
    sges: Vec<Span>,
    inline: Vec<u8>,
    pub head: u64,
    pub send: u64,
    pub tail: u64,
}

impl SendQueue {
    pub fn new(depth: u32, max_sge: u32, max_inline: u32) -> SendQueue {
        // Every slot holds at least the 8 bytes of an ATOMIC WRITE, which
        // travel in the WQE whatever the QP's max_inline_data (as rxe's
        // provider copies them into its WQE): 8 bytes per slot at most.
        let max_inline = max_inline.max(8);
        SendQueue {
            depth,
            max_sge,
            max_inline,
            wqes: vec![None; depth as usize],
            sges: vec![Span::default(); (depth * max_sge) as usize],
            inline: vec![0; (depth * max_inline) as usize],
            head: 0,
            send: 0,
            tail: 0,
        }
    }

    pub fn is_full(&self) -> bool {
        self.head - self.tail >= self.depth as u64
    }

    fn slot(&self, idx: u64) -> usize {
        (idx % self.depth as u64) as usize
    }

    pub fn push(&mut self, wqe: SendWqe, sges: &[Span], inline: &[u8]) {
        let slot = self.slot(self.head);
        let b = slot * self.max_sge as usize;
        self.sges[b..b + sges.len()].copy_from_slice(sges);
        let ib = slot * self.max_inline as usize;
        self.inline[ib..ib + inline.len()].copy_from_slice(inline);
        self.wqes[slot] = Some(wqe);
        self.head += 1;
    }

    pub fn get(&self, idx: u64) -> Option<&SendWqe> {
        if idx < self.tail || idx >= self.head {
            return None;
        }
        self.wqes[self.slot(idx)].as_ref()
    }

    pub fn get_mut(&mut self, idx: u64) -> Option<&mut SendWqe> {
        if idx < self.tail || idx >= self.head {
            return None;
        }
        let s = self.slot(idx);
        self.wqes[s].as_mut()
    }

    pub fn sges(&self, idx: u64) -> &[Span] {
        let slot = self.slot(idx);
        let n = self.wqes[slot].map_or(0, |w| w.nsge as usize);
        let b = slot * self.max_sge as usize;
        &self.sges[b..b + n]
    }

    pub fn inline(&self, idx: u64) -> &[u8] {
        let slot = self.slot(idx);
        let n = self.wqes[slot].map_or(0, |w| w.inline_len as usize);
        let b = slot * self.max_inline as usize;
        &self.inline[b..b + n]
    }

    /// Retire the WQE at `tail`.
    pub fn pop_tail(&mut self) -> Option<SendWqe> {
        if self.tail == self.head {
            return None;
        }
        let s = self.slot(self.tail);
        let w = self.wqes[s].take();
        self.tail += 1;
        if self.send < self.tail {
            self.send = self.tail;
        }
        w
    }
}

/// A region an SGE names was deregistered: the access did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unmapped;

/// Gather `len` bytes at byte offset `off` of a scatter/gather list into
/// payload segments, translating each piece now. The host addresses in
/// `out` are good until the caller next changes the region table. Returns
/// whether any piece is in a [checked](crate::mr::Mr::checked) region, whose
/// bytes the caller must copy through [`copy_checked`] instead of handing
/// the segments on.
pub(crate) fn gather(
    mrs: &MrTable,
    sges: &[Span],
    mut off: u64,
    mut len: u64,
    out: &mut crate::transmit::Segs,
) -> Result<bool, Unmapped> {
    out.clear();
    let mut checked = false;
    for s in sges {
        if len == 0 {
            break;
        }
        let sl = s.len as u64;
        if off >= sl {
            off -= sl;
            continue;
        }
        let take = (sl - off).min(len);
        let h = mrs.locate(s.mem, s.off + off, take).ok_or(Unmapped)?;
        checked |= h.checked;
        out.push(Seg {
            addr: h.addr,
            len: take as u32,
        });
        len -= take;
        off = 0;
    }
    Ok(checked)
}

/// Copy the bytes of `segs` into `out` (exactly their length) through
/// [`Memory`]'s checked reads, and empty `segs`: for a packet with payload
/// from an implicit region, which goes out of the caller's buffer. A piece
/// of an ordinary region in the same packet is copied the same way
/// (payload order is the segments' order).
pub(crate) fn copy_checked(
    segs: &mut crate::transmit::Segs,
    mem: &impl Memory,
    out: &mut [u8],
) -> Result<(), Unmapped> {
    let mut at = 0;
    for g in segs.as_slice() {
        let n = g.len as usize;
        mem.read_checked(g.addr, &mut out[at..at + n])
            .map_err(|_| Unmapped)?;
        at += n;
    }
    segs.clear();
    Ok(())
}

/// Scatter `data` into a scatter/gather list starting at byte offset `off`,
/// translating each piece just before writing it. The caller has checked
/// that the list is long enough; nothing beyond it is written. On
/// `Unmapped` the pieces before the missing region were written.
pub(crate) fn scatter(
    mrs: &MrTable,
    sges: &[Span],
    mut off: u64,
    mut data: &[u8],
    mem: &mut impl Memory,
) -> Result<(), Unmapped> {
    for s in sges {
        if data.is_empty() {
            break;
        }
        let sl = s.len as u64;
        if off >= sl {
            off -= sl;
            continue;
        }
        let take = ((sl - off) as usize).min(data.len());
        let h = mrs
            .locate(s.mem, s.off + off, take as u64)
            .ok_or(Unmapped)?;
        h.write(mem, &data[..take]).map_err(|_| Unmapped)?;
        data = &data[take..];
        off = 0;
    }
    Ok(())
}
