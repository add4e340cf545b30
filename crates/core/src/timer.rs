//! Every timer of an endpoint in one structure: a binary min-heap of
//! `(deadline, slot, generation)` with lazy deletion.
//!
//! Why a heap and not a timing wheel: deadlines here span from nanoseconds
//! (a pacer at 100 Gbit/s spaces 4 KiB packets 330 ns apart) to hours (IBA's
//! `timeout` 31 is 2^31 × 4.096 µs), and tests assert them to the
//! nanosecond. A wheel covers that range only with several levels and
//! cascading, or with coarse slots; a heap is exact at any resolution, costs
//! O(log n) to arm and to expire, and O(1) to peek — which is what
//! `poll_timeout` does. n is at most one live entry per QP plus stale ones.
//!
//! Lazy deletion: the scheduler keeps, per slot, the generation and deadline
//! of the slot's one live entry. Re-arming earlier pushes a new entry under
//! a new generation; the old one stays in the heap, stale, and is dropped
//! when it reaches the top. Moving a deadline later (every ACK pushes the
//! retransmission deadline out) pushes nothing: the early entry is fixed up
//! when it reaches the top (see `Sched::settle_timers`). So an ACK costs no
//! heap operation, and the top is always exact.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::Nanos;

/// One armed timer: `(deadline, slot, generation)`, ordered by deadline,
/// then slot (so equal deadlines fire in slot order, deterministically).
pub(crate) type Entry = (Nanos, u32, u32);

#[derive(Debug, Default)]
pub(crate) struct TimerHeap {
    heap: BinaryHeap<Reverse<Entry>>,
}

impl TimerHeap {
    pub fn push(&mut self, deadline: Nanos, slot: u32, gen: u32) {
        self.heap.push(Reverse((deadline, slot, gen)));
    }

    pub fn peek(&self) -> Option<Entry> {
        self.heap.peek().map(|Reverse(e)| *e)
    }

    pub fn pop(&mut self) -> Option<Entry> {
        self.heap.pop().map(|Reverse(e)| e)
    }

    pub fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        self.heap.iter().map(|Reverse(e)| *e)
    }

    /// Drop stale entries once they outnumber the live ones (`live` tells
    /// which are), so the heap stays within twice the number of armed
    /// timers. O(n), paid for by the n pushes that made it necessary.
    pub fn compact(&mut self, live_count: usize, live: impl Fn(&Entry) -> bool) {
        if self.heap.len() <= 2 * live_count + 64 {
            return;
        }
        let mut v = std::mem::take(&mut self.heap).into_vec();
        v.retain(|Reverse(e)| live(e));
        self.heap = BinaryHeap::from(v);
    }
}
