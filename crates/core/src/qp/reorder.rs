//! Selective repeat's receive side: request packets that arrive ahead of
//! the expected PSN are held until the gap before them is filled, then
//! executed in PSN order by the same responder code as any in-sequence
//! packet.
//!
//! IRN places an out-of-order WRITE straight into memory (it adds a RETH
//! to every packet) and tracks arrivals in a bitmap. softrdma holds the
//! packet instead, in a buffer of an endpoint-wide pool: every IBA rule
//! that depends on order — a SEND's place in its receive WQE, the MSN,
//! an RNR NAK, a READ or atomic's position among WRITEs, what a duplicate
//! is — stays in one in-order executor and on the wire format rxe speaks.
//! The cost is one copy per out-of-order packet, none for a packet in
//! order.
//!
//! Bounds: a QP holds at most [`WINDOW`] PSNs past the expected one (the
//! requester's window, so every packet it may have in flight fits), in a
//! per-QP table allocated the first time the QP sees a packet out of
//! order; the pool holds at most `EndpointConfig::reorder_slots` packets
//! for all QPs, its buffers allocated as the high-water mark grows and
//! reused after. A packet that finds the pool full is dropped, as before
//! selective repeat: the requester resends it when the responder NAKs the
//! gap it leaves.

use softrdma_wire::Psn;

use crate::qp::MAX_UNACKED_PSNS;

/// PSNs past the expected one a QP may hold.
pub const WINDOW: u32 = MAX_UNACKED_PSNS;

/// Held packets, for every QP of an endpoint.
#[derive(Debug, Default)]
pub(crate) struct ReorderPool {
    bufs: Vec<Vec<u8>>,
    free: Vec<u32>,
    cap: usize,
}

impl ReorderPool {
    pub fn new(cap: usize) -> ReorderPool {
        ReorderPool {
            bufs: Vec::new(),
            free: Vec::new(),
            cap,
        }
    }

    /// Copy `bytes` into a free buffer; `None` if all `cap` are in use.
    fn hold(&mut self, bytes: &[u8]) -> Option<u32> {
        if bytes.len() > MAX_HELD_LEN {
            return None; // longer than any request a 4096-byte MTU allows
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.bufs.len() < self.cap => {
                // The pool grows to its high-water mark once; buffers are
                // reused after, so a steady stream of reordering allocates
                // nothing.
                self.bufs.push(Vec::with_capacity(MAX_HELD_LEN));
                (self.bufs.len() - 1) as u32
            }
            None => return None,
        };
        let b = &mut self.bufs[slot as usize];
        b.clear();
        b.extend_from_slice(bytes);
        Some(slot)
    }

    /// Take a held packet's buffer out (to hand it to the responder while
    /// the pool is borrowed too); give it back with [`ReorderPool::put_back`].
    pub fn take(&mut self, slot: u32) -> Vec<u8> {
        std::mem::take(&mut self.bufs[slot as usize])
    }

    pub fn put_back(&mut self, slot: u32, buf: Vec<u8>) {
        self.bufs[slot as usize] = buf;
        self.free.push(slot);
    }

    fn release(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Buffers in use.
    pub fn in_use(&self) -> usize {
        self.bufs.len() - self.free.len()
    }
}

const EMPTY: u32 = u32::MAX;

/// The longest packet held: a 4096-byte payload and every header a request
/// can carry, rounded up.
const MAX_HELD_LEN: usize = 4096 + 128;

/// One QP's held packets: slot of the pool for PSN `p` at `p % WINDOW`,
/// with the PSN it holds. The PSN is kept because the expected PSN can
/// move past a held packet without taking it — a READ's request advances
/// it by the READ's response packets at once, and a requester has no
/// business sending a request inside that range — and such a stale entry
/// must never be taken for the packet `WINDOW` PSNs later that shares its
/// index (it would execute an old request and move the expected PSN back).
#[derive(Debug)]
pub(crate) struct Staging {
    slots: Box<[(u32, Psn)]>,
    /// Packets held.
    pub count: u32,
}

/// What [`Staging::hold`] did with a packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Newly held.
    Kept,
    /// That PSN is held already: a duplicate.
    Already,
    /// Outside the window, or the pool is full: dropped.
    Dropped,
}

impl Staging {
    pub fn new() -> Staging {
        Staging {
            slots: vec![(EMPTY, Psn::new(0)); WINDOW as usize].into_boxed_slice(),
            count: 0,
        }
    }

    fn idx(psn: Psn) -> usize {
        // WINDOW divides 2^24, so PSN wrap-around keeps the mapping.
        const _: () = assert!((1u32 << 24).is_multiple_of(WINDOW));
        (psn.value() % WINDOW) as usize
    }

    /// Empty index `i`, giving its buffer back to the pool.
    fn free(&mut self, pool: &mut ReorderPool, i: usize) {
        let (s, _) = std::mem::replace(&mut self.slots[i], (EMPTY, Psn::new(0)));
        if s != EMPTY {
            pool.release(s);
            self.count -= 1;
        }
    }

    /// Hold packet `bytes` with PSN `psn`, `epsn` being the next expected.
    pub fn hold(&mut self, pool: &mut ReorderPool, epsn: Psn, psn: Psn, bytes: &[u8]) -> Hold {
        let d = psn.diff(epsn);
        if d <= 0 || d >= WINDOW as i32 {
            return Hold::Dropped;
        }
        let i = Self::idx(psn);
        match self.slots[i] {
            (EMPTY, _) => {}
            (_, held) if held == psn => return Hold::Already,
            // Left behind by a jump of the expected PSN (see `Staging`).
            _ => self.free(pool, i),
        }
        match pool.hold(bytes) {
            Some(s) => {
                self.slots[i] = (s, psn);
                self.count += 1;
                Hold::Kept
            }
            None => Hold::Dropped,
        }
    }

    /// The pool slot holding `psn`, removed from the table. A stale entry
    /// at its index (another PSN) is given back to the pool.
    pub fn take(&mut self, pool: &mut ReorderPool, psn: Psn) -> Option<u32> {
        let i = Self::idx(psn);
        match self.slots[i] {
            (EMPTY, _) => None,
            (s, held) if held == psn => {
                self.slots[i] = (EMPTY, Psn::new(0));
                self.count -= 1;
                Some(s)
            }
            _ => {
                self.free(pool, i);
                None
            }
        }
    }

    /// The expected PSN moved from `from` past `n` PSNs at once (a READ's
    /// request takes the PSNs of its response packets): give back whatever
    /// is held for them. Nothing a requester sends belongs there.
    pub fn skip(&mut self, pool: &mut ReorderPool, from: Psn, n: u32) {
        if self.count == 0 {
            return;
        }
        for k in 0..n.min(WINDOW) {
            let psn = from.add(k);
            let i = Self::idx(psn);
            if self.slots[i].0 != EMPTY && self.slots[i].1 == psn {
                self.free(pool, i);
            }
        }
    }

    /// Give every held packet back to the pool.
    pub fn clear(&mut self, pool: &mut ReorderPool) {
        if self.count == 0 {
            return;
        }
        for i in 0..self.slots.len() {
            self.free(pool, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_inside_the_window_and_reuses_buffers() {
        let mut pool = ReorderPool::new(2);
        let mut st = Staging::new();
        let e = Psn::new(0xff_fffe); // the window wraps the 24-bit space
        assert_eq!(st.hold(&mut pool, e, e, b"x"), Hold::Dropped);
        assert_eq!(st.hold(&mut pool, e, e.add(WINDOW), b"x"), Hold::Dropped);
        assert_eq!(st.hold(&mut pool, e, e.add(1), b"a"), Hold::Kept);
        assert_eq!(st.hold(&mut pool, e, e.add(1), b"a"), Hold::Already);
        assert_eq!(st.hold(&mut pool, e, e.add(3), b"b"), Hold::Kept);
        // The pool is full.
        assert_eq!(st.hold(&mut pool, e, e.add(4), b"c"), Hold::Dropped);
        assert_eq!(st.count, 2);
        let s = st.take(&mut pool, e.add(1)).unwrap();
        assert_eq!(pool.take(s), b"a");
        pool.put_back(s, b"a".to_vec());
        assert_eq!(st.take(&mut pool, e.add(2)), None);
        st.clear(&mut pool);
        assert_eq!((st.count, pool.in_use()), (0, 0));
        assert_eq!(pool.bufs.len(), 2, "buffers are kept for reuse");
    }
}
