//! The packet rings: what the core sends to a peer context on this host —
//! SENDs, WRITEs with immediate, every response, anything an offload did
//! not carry out — as the same RoCE packets it would put in a UDP datagram,
//! in a single-producer single-consumer ring in the *receiver's* segment
//! (one per sending peer), with a doorbell for a receiver that sleeps.
//!
//! Record: `len: u32`, `kind: u32`, then `len` bytes (BTH onward, the
//! ICRC's four bytes zero: the ring is this user's memory, not a wire),
//! padded to 8 bytes. A record that would cross the end is preceded by a
//! wrap marker. The producer publishes `head` with release ordering after
//! the bytes; the consumer reads records below `head` and publishes `tail`
//! after it is done with them, so a record's bytes are never rewritten
//! while the consumer looks at them.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub const RING_BYTES: u64 = 8 << 20;
const REC: u32 = 1;
const WRAP: u32 = 2;

/// A ring's control words, each on its own cache line.
#[repr(C)]
pub struct RingHdr {
    pub head: AtomicU64,
    _p0: [u64; 7],
    pub tail: AtomicU64,
    _p1: [u64; 7],
}

pub struct Ring<'a> {
    pub hdr: &'a RingHdr,
    pub data: *mut u8,
}

fn rec_len(n: usize) -> u64 {
    (8 + n as u64 + 7) & !7
}

impl Ring<'_> {
    /// Append one packet made of `parts`; false if the ring has no room
    /// (the packet is then lost, as a full socket buffer loses a datagram:
    /// RC retransmits it).
    ///
    /// # Safety
    /// Only one producer may push at a time; `data` must be the ring's
    /// `RING_BYTES` bytes.
    pub unsafe fn push(&self, parts: &[&[u8]], zeros: usize) -> bool {
        let n: usize = parts.iter().map(|p| p.len()).sum::<usize>() + zeros;
        let need = rec_len(n);
        let head = self.hdr.head.load(Ordering::Relaxed);
        let tail = self.hdr.tail.load(Ordering::Acquire);
        let at = head % RING_BYTES;
        let to_end = RING_BYTES - at;
        let skip = if to_end < need { to_end } else { 0 };
        if head + skip + need - tail > RING_BYTES {
            return false;
        }
        let mut pos = head;
        if skip > 0 {
            // SAFETY: `at` is 8-aligned and below RING_BYTES, so the 8-byte
            // marker fits (every record is a multiple of 8 bytes).
            unsafe { self.put_hdr(at, 0, WRAP) };
            pos += skip;
        }
        let at = pos % RING_BYTES;
        // SAFETY: `[at, at + need)` lies inside the ring (no wrap, see
        // above) and is free (below tail + RING_BYTES): the consumer does
        // not read it until `head` moves past it.
        unsafe {
            self.put_hdr(at, n as u32, REC);
            let mut d = self.data.add(at as usize + 8);
            for p in parts {
                std::ptr::copy_nonoverlapping(p.as_ptr(), d, p.len());
                d = d.add(p.len());
            }
            std::ptr::write_bytes(d, 0, zeros);
        }
        self.hdr.head.store(pos + need, Ordering::Release);
        true
    }

    /// # Safety
    /// `at + 8 <= RING_BYTES`, 8-aligned.
    unsafe fn put_hdr(&self, at: u64, len: u32, kind: u32) {
        // SAFETY: caller.
        unsafe {
            let p = self.data.add(at as usize);
            std::ptr::write(p.cast::<u32>(), len);
            std::ptr::write(p.add(4).cast::<u32>(), kind);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hdr.head.load(Ordering::Acquire) == self.hdr.tail.load(Ordering::Relaxed)
    }

    /// Hand every record below `head` (at most `budget`) to `f`, then free
    /// them. Returns how many there were.
    ///
    /// # Safety
    /// Only one consumer at a time; `data` as for `push`.
    pub unsafe fn drain(&self, budget: usize, mut f: impl FnMut(&[u8])) -> usize {
        let head = self.hdr.head.load(Ordering::Acquire);
        let mut tail = self.hdr.tail.load(Ordering::Relaxed);
        let mut k = 0;
        while tail != head && k < budget {
            let at = tail % RING_BYTES;
            // SAFETY: records below `head` were written completely before
            // the producer's release store of `head` that we acquired; the
            // producer does not touch them until `tail` passes them.
            let (len, kind) = unsafe {
                let p = self.data.add(at as usize);
                (
                    std::ptr::read(p.cast::<u32>()),
                    std::ptr::read(p.add(4).cast::<u32>()),
                )
            };
            if kind == WRAP {
                tail += RING_BYTES - at;
                continue;
            }
            let need = rec_len(len as usize);
            if kind != REC || at + need > RING_BYTES || tail + need > head {
                // Not a record we wrote: give up on what is there.
                tail = head;
                break;
            }
            // SAFETY: as above; `[at + 8, at + 8 + len)` is inside the ring.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.data.add(at as usize + 8), len as usize) };
            f(bytes);
            tail += need;
            k += 1;
        }
        self.hdr.tail.store(tail, Ordering::Release);
        k
    }
}

/// The receiver's doorbell: `armed` while its engine thread sleeps with
/// nobody else serving the rings; a producer that finds it armed disarms
/// it and writes the eventfd.
pub fn ring_bell(armed: &AtomicU32, bell: std::os::fd::RawFd) {
    fence(Ordering::SeqCst);
    if armed.load(Ordering::Relaxed) != 0 && armed.swap(0, Ordering::SeqCst) != 0 {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to the peer's eventfd.
        unsafe { libc::write(bell, (&one as *const u64).cast(), 8) };
    }
}
