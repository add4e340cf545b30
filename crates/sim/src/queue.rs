//! The event queue: a calendar (bucket ring) over the near future with a
//! binary heap for the far future, popping in exact `(time, sequence)` order.
//!
//! Almost every event of a packet simulation is scheduled less than a few
//! microseconds ahead (a frame's serialisation plus a link's propagation),
//! so one binary heap over all of them pays `log n` cache misses per event
//! for ordering work the time axis already does. Here an event goes into
//! the ring bucket of its time (`t >> WIDTH_BITS`) if that falls within the
//! ring's horizon, else into the far heap. The bucket being drained is sorted
//! once (a few hundred events at most in a busy fabric) and popped from its end; when it empties, the ring advances to the
//! next non-empty bucket, first moving in far events that the new horizon
//! covers. Pop order is exactly that of one heap ordered by (time, sequence),
//! so the queue changes no result, only the cost.
//!
//! The two constants trade memory and scanning against sorting: a bucket of
//! 2^16 ps (65.5 ns, about one 1 KB frame at 100 Gb/s) holds a handful of
//! events in a busy fabric, and 4096 buckets (268 µs) cover every link
//! event and most timers; an idle stretch costs one scan of empty buckets
//! per horizon. Measured on the 1024-host fat tree permutation
//! (docs/SIMULATOR.md), this queue against one `BinaryHeap` for all events.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Ps;

const WIDTH_BITS: u32 = 16;
const BUCKETS: usize = 4096;

/// An event with its time and tie-breaking sequence number.
pub struct Entry<E> {
    pub t: Ps,
    pub seq: u64,
    pub ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, o: &Self) -> bool {
        self.t == o.t && self.seq == o.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we pop the earliest.
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

/// Events in (time, sequence) order.
pub struct Queue<E> {
    /// Bucket number (t >> WIDTH_BITS) that `current` holds.
    cur: u64,
    /// The bucket being drained, sorted latest first (so popping is
    /// `Vec::pop`); an event pushed into it is inserted in order.
    current: Vec<Entry<E>>,
    ring: Vec<Vec<Entry<E>>>,
    in_ring: usize,
    far: BinaryHeap<Entry<E>>,
    seq: u64,
    len: usize,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue::new()
    }
}

impl<E> Queue<E> {
    pub fn new() -> Queue<E> {
        Queue {
            cur: 0,
            current: Vec::new(),
            ring: (0..BUCKETS).map(|_| Vec::new()).collect(),
            in_ring: 0,
            far: BinaryHeap::new(),
            seq: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Schedule `ev` at `t`; events at the same time pop in push order.
    /// `t` must not be before the last popped event's bucket.
    pub fn push(&mut self, t: Ps, ev: E) {
        self.seq += 1;
        self.len += 1;
        let e = Entry {
            t,
            seq: self.seq,
            ev,
        };
        let b = t >> WIDTH_BITS;
        if b <= self.cur {
            debug_assert!(b == self.cur, "an event in the past");
            // Rare (a bucket is shorter than a frame's serialisation): keep
            // `current` sorted, latest first.
            let at = self
                .current
                .partition_point(|x| (x.t, x.seq) > (e.t, e.seq));
            self.current.insert(at, e);
        } else if b < self.cur + BUCKETS as u64 {
            self.ring[(b as usize) % BUCKETS].push(e);
            self.in_ring += 1;
        } else {
            self.far.push(e);
        }
    }

    /// The earliest event.
    pub fn pop(&mut self) -> Option<Entry<E>> {
        loop {
            if let Some(e) = self.current.pop() {
                self.len -= 1;
                return Some(e);
            }
            if self.in_ring == 0 {
                // Jump straight to the far heap's first bucket.
                let t = self.far.peek()?.t;
                self.cur = (t >> WIDTH_BITS) - 1;
            }
            self.advance();
        }
    }

    /// Move to the next bucket: load it into `current`, and bring far
    /// events the horizon now covers into the ring.
    fn advance(&mut self) {
        self.cur += 1;
        let idx = (self.cur as usize) % BUCKETS;
        let bucket = &mut self.ring[idx];
        self.in_ring -= bucket.len();
        debug_assert!(self.current.is_empty());
        // The bucket's buffer becomes `current`; the slot starts empty
        // rather than keeping the drained buffer, so memory follows the
        // events pending, not the busiest moment each slot ever saw (with
        // reuse, 4096 slots kept 40 MB on the 1024-host permutation).
        self.current = std::mem::take(bucket);
        let horizon = self.cur + BUCKETS as u64;
        while let Some(e) = self.far.peek() {
            let b = e.t >> WIDTH_BITS;
            if b >= horizon {
                break;
            }
            let e = self.far.pop().expect("peeked");
            if b == self.cur {
                self.current.push(e); // sorted below
            } else {
                self.ring[(b as usize) % BUCKETS].push(e);
                self.in_ring += 1;
            }
        }
        // Latest first; (t, seq) pairs are unique, so the order is total.
        self.current
            .sort_unstable_by_key(|e| std::cmp::Reverse((e.t, e.seq)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha8Rng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn pops_in_time_then_push_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut q = Queue::new();
        let mut reference = BinaryHeap::new();
        let mut now = 0;
        let mut seq = 0;
        for round in 0..20_000u64 {
            for _ in 0..rng.random_range(0..4) {
                // Near, same-time, far and very far events.
                let dt = match rng.random_range(0..4) {
                    0 => 0,
                    1 => rng.random_range(0..100_000),
                    2 => rng.random_range(0..1 << 30),
                    _ => rng.random_range(0..1 << 40),
                };
                seq += 1;
                q.push(now + dt, round);
                reference.push(Entry {
                    t: now + dt,
                    seq,
                    ev: round,
                });
            }
            if rng.random_bool(0.5) {
                let a = q.pop().map(|e| (e.t, e.seq));
                let b = reference.pop().map(|e| (e.t, e.seq));
                assert_eq!(a, b);
                if let Some((t, _)) = a {
                    now = t;
                }
            }
        }
        while let Some(b) = reference.pop() {
            let a = q.pop().expect("same length");
            assert_eq!((a.t, a.seq), (b.t, b.seq));
        }
        assert!(q.pop().is_none() && q.is_empty());
    }
}
