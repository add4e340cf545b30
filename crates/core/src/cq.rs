//! Completion queues: bounded rings of completions, the notification arming
//! of `ibv_req_notify_cq`, resizing, and the error state an overflow puts a
//! CQ in.
//!
//! Overflow follows IBA (the "CQ Error" affiliated asynchronous error): a
//! completion that finds the ring full is lost, the CQ enters the error
//! state and takes no completion after it, `IBV_EVENT_CQ_ERR` is raised once,
//! and every work queue that then tries to complete into the CQ — the one
//! that overflowed it first — enters the Error state with
//! `IBV_EVENT_QP_FATAL` ("local work queue catastrophic error"). rxe does
//! the same on the receive side (`rxe_cq_post` returns -EBUSY and raises
//! `IB_EVENT_CQ_ERR`; the responder's class G error moves the QP to ERR).
//! Completions queued before the overflow can still be polled; after them,
//! polling reports the error, since the CQ will never produce another.

use std::collections::VecDeque;

use crate::wc::Completion;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Armed {
    No,
    Any,
    Solicited,
}

/// What became of a completion offered to a CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued; `notify`: the CQ was armed for it (the arm is consumed).
    Queued { notify: bool },
    /// Lost: the CQ is in the error state. `overflow`: this completion is
    /// the one that found it full and put it there.
    Lost { overflow: bool },
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub ring: VecDeque<Completion>,
    pub depth: usize,
    pub armed: Armed,
    /// The CQ overflowed and is in the error state (for good).
    pub error: bool,
    pub users: u32,
}

impl Cq {
    pub fn new(depth: usize) -> Cq {
        Cq {
            // Room up front for what a CQ usually holds; a deeper one grows
            // (amortised, and it keeps what it grew to) toward its depth.
            ring: VecDeque::with_capacity(depth.min(4096)),
            depth,
            armed: Armed::No,
            error: false,
            users: 0,
        }
    }

    pub fn push(&mut self, c: Completion, solicited: bool) -> Pushed {
        if self.error {
            return Pushed::Lost { overflow: false };
        }
        if self.ring.len() >= self.depth {
            self.error = true;
            return Pushed::Lost { overflow: true };
        }
        self.ring.push_back(c);
        let fire = match self.armed {
            Armed::No => false,
            Armed::Any => true,
            Armed::Solicited => solicited || c.status != crate::wc::WcStatus::Success,
        };
        if fire {
            self.armed = Armed::No;
        }
        Pushed::Queued { notify: fire }
    }

    /// Drop the completions of QP `qpn` still queued (a QP moved to RESET).
    pub fn purge_qp(&mut self, qpn: u32) {
        self.ring.retain(|c| c.qp_num != qpn);
    }

    /// Change the depth, keeping every queued completion (the caller has
    /// checked that they fit). The ring's memory follows the depth, so a
    /// CQ never holds more than it may queue.
    pub fn resize(&mut self, depth: usize) {
        debug_assert!(depth >= self.ring.len());
        if depth > self.ring.capacity() {
            self.ring.reserve_exact(depth - self.ring.len());
        } else {
            self.ring.shrink_to(depth);
        }
        self.depth = depth;
    }
}
