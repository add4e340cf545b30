//! Completion queues: bounded rings of completions plus the notification
//! arming of `ibv_req_notify_cq`.

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

#[derive(Debug)]
pub(crate) struct Cq {
    pub ring: VecDeque<Completion>,
    pub depth: usize,
    pub armed: Armed,
    pub overflowed: bool,
    pub users: u32,
}

impl Cq {
    pub fn new(depth: usize) -> Cq {
        Cq {
            ring: VecDeque::with_capacity(depth),
            depth,
            armed: Armed::No,
            overflowed: false,
            users: 0,
        }
    }

    /// Queue a completion. Returns (accepted, notify): `notify` is true when
    /// the CQ was armed for this kind of completion (the arm is consumed).
    pub fn push(&mut self, c: Completion, solicited: bool) -> (bool, bool) {
        if self.ring.len() >= self.depth {
            self.overflowed = true;
            return (false, false);
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
        (true, fire)
    }
}
