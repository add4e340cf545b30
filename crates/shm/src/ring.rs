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
//!
//! **Back-pressure.** A ring is a link whose receiver can say "wait", so a
//! full one loses nothing: the producer keeps the packet it could not push
//! ([`Push::Full`]), sends nothing more until it goes, and raises `want`
//! ([`Ring::want_space`]); the consumer, having freed space, takes `want`
//! down and rings the producer's bell ([`Ring::drain`]'s result). Both
//! sides are sequentially consistent (the producer's `want` before its
//! second look at `tail`, the consumer's `tail` before its look at
//! `want`), so either the producer sees the space or the consumer sees the
//! request: no wake-up is lost. (Before, a full ring lost the packet as a
//! full socket buffer loses a datagram: a large READ's response stream,
//! which nothing paces, lost thousands, each recovered by a resend.)

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub const RING_BYTES: u64 = 8 << 20;
const REC: u32 = 1;
const WRAP: u32 = 2;

/// A ring's control words: the producer's line, and the consumer's (its
/// tail, and the producer's request to be woken when it moves).
#[repr(C)]
pub struct RingHdr {
    pub head: AtomicU64,
    _p0: [u64; 7],
    pub tail: AtomicU64,
    /// Set by a producer that found the ring full (see the module docs).
    pub want: AtomicU32,
    _pw: u32,
    _p1: [u64; 6],
}

/// What [`Ring::push`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// In the ring.
    Done,
    /// No room now: keep the packet and try again when the consumer has
    /// freed space (after [`Ring::want_space`]).
    Full,
    /// Never: larger than half the ring, or the consumer's process wrote
    /// a tail that does not fit ours (waiting for it would be waiting for
    /// a process that breaks the protocol). The packet is lost.
    Refused,
}

pub struct Ring<'a> {
    pub hdr: &'a RingHdr,
    pub data: *mut u8,
}

fn rec_len(n: usize) -> u64 {
    (8 + n as u64 + 7) & !7
}

impl Ring<'_> {
    /// Append one packet made of `parts` (see [`Push`]). `head` is the
    /// producer's own copy of its index (the shared one is only published,
    /// never read back: the consumer's process can write it).
    ///
    /// # Safety
    /// Only one producer may push at a time; `data` must be the ring's
    /// `RING_BYTES` bytes.
    pub unsafe fn push(&self, head: &mut u64, parts: &[&[u8]], zeros: usize) -> Push {
        let n: usize = parts.iter().map(|p| p.len()).sum::<usize>() + zeros;
        let need = rec_len(n);
        let tail = self.hdr.tail.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > RING_BYTES || need > RING_BYTES / 2 {
            return Push::Refused;
        }
        let at = *head % RING_BYTES;
        let to_end = RING_BYTES - at;
        let skip = if to_end < need { to_end } else { 0 };
        if used + skip + need > RING_BYTES {
            return Push::Full;
        }
        let mut pos = *head;
        if skip > 0 {
            // SAFETY: `at` is 8-aligned (our head moves by multiples of 8)
            // and below RING_BYTES, a multiple of 8, so the 8-byte marker
            // fits before the end.
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
        *head = pos + need;
        self.hdr.head.store(*head, Ordering::Release);
        Push::Done
    }

    /// The producer found the ring full: ask the consumer to ring its bell
    /// once it frees space. The caller then tries [`Ring::push`] once more
    /// before it waits (space freed before this store is not announced).
    pub fn want_space(&self) {
        self.hdr.want.store(1, Ordering::SeqCst);
        // The request before the second look at `tail` (StoreLoad), as the
        // consumer orders its `tail` before its look at `want`.
        fence(Ordering::SeqCst);
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

    /// Whether the ring holds nothing below the shared head, seen from
    /// `tail` (the consumer's copy) or the shared tail (the producer's
    /// view, `None`).
    pub fn is_empty_from(&self, tail: Option<u64>) -> bool {
        let t = tail.unwrap_or_else(|| self.hdr.tail.load(Ordering::Acquire));
        self.hdr.head.load(Ordering::Acquire) == t
    }

    /// Hand every record below `head` (at most `budget`) to `f`, each
    /// copied into `scratch` first (the producer's process can write the
    /// ring while we parse), then free them. `tail` is the consumer's own
    /// copy of its index; a head that does not fit it (behind it, more
    /// than a ring ahead, not 8-aligned) or a record that is not one we
    /// write stops the drain and leaves the ring alone. Returns how many
    /// records there were, and whether the producer waits for the space
    /// this freed (it asked with [`Ring::want_space`]): the caller rings
    /// its bell.
    ///
    /// # Safety
    /// Only one consumer at a time; `data` as for `push`.
    pub unsafe fn drain(
        &self,
        tail: &mut u64,
        budget: usize,
        scratch: &mut Vec<u8>,
        mut f: impl FnMut(&[u8]),
    ) -> (usize, bool) {
        let head = self.hdr.head.load(Ordering::Acquire);
        let avail = head.wrapping_sub(*tail);
        if avail > RING_BYTES || !head.is_multiple_of(8) {
            return (0, false);
        }
        let mut k = 0;
        while *tail != head && k < budget {
            let at = *tail % RING_BYTES;
            // SAFETY: `at` is 8-aligned (our tail moves by multiples of
            // 8) and `at + 8 <= RING_BYTES`; records below `head` were
            // written before the producer's release store of `head`.
            let (len, kind) = unsafe {
                let p = self.data.add(at as usize);
                (
                    std::ptr::read_volatile(p.cast::<u32>()),
                    std::ptr::read_volatile(p.add(4).cast::<u32>()),
                )
            };
            let need = if kind == WRAP {
                RING_BYTES - at
            } else {
                rec_len(len as usize)
            };
            if (kind != REC && kind != WRAP)
                || (kind == REC && at + need > RING_BYTES)
                || head.wrapping_sub(*tail) < need
            {
                // Not a record we write: stop here.
                break;
            }
            k += 1;
            if kind == REC {
                scratch.clear();
                // SAFETY: `[at + 8, at + 8 + len)` is inside the ring
                // (checked above); copied out as raw bytes.
                unsafe {
                    scratch.extend_from_slice(std::slice::from_raw_parts(
                        self.data.add(at as usize + 8),
                        len as usize,
                    ))
                };
                f(scratch);
            }
            *tail += need;
        }
        self.hdr.tail.store(*tail, Ordering::Release);
        // The freed space before the look at `want` (StoreLoad; see
        // `want_space`).
        fence(Ordering::SeqCst);
        let wake = self.hdr.want.load(Ordering::Relaxed) != 0
            && self.hdr.want.swap(0, Ordering::SeqCst) != 0;
        (k, wake)
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem {
        hdr: RingHdr,
        data: Vec<u8>,
    }

    fn mem() -> Mem {
        Mem {
            hdr: RingHdr {
                head: AtomicU64::new(0),
                _p0: [0; 7],
                tail: AtomicU64::new(0),
                want: AtomicU32::new(0),
                _pw: 0,
                _p1: [0; 6],
            },
            data: vec![0; RING_BYTES as usize],
        }
    }

    fn ring(m: &mut Mem) -> Ring<'_> {
        Ring {
            hdr: &m.hdr,
            data: m.data.as_mut_ptr(),
        }
    }

    fn drain_all(r: &Ring<'_>, tail: &mut u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        // SAFETY: one consumer; the ring is RING_BYTES of `data`.
        unsafe { r.drain(tail, usize::MAX, &mut scratch, |b| out.push(b.to_vec())) };
        out
    }

    #[test]
    fn records_arrive_whole_and_in_order_across_the_wrap() {
        let mut m = mem();
        let r = ring(&mut m);
        let (mut head, mut tail) = (0u64, 0u64);
        // Walk the ring round twice with odd-sized packets.
        let mut want = Vec::new();
        for i in 0..20000u32 {
            let p: Vec<u8> = (0..(i % 4093 + 1)).map(|k| (k ^ i) as u8).collect();
            // SAFETY: one producer; the ring is RING_BYTES of `data`.
            assert_eq!(
                unsafe { r.push(&mut head, &[&p[..3.min(p.len())], &p[3.min(p.len())..]], 4) },
                Push::Done
            );
            let mut w = p.clone();
            w.extend_from_slice(&[0; 4]);
            want.push(w);
            if i % 100 == 99 {
                assert_eq!(drain_all(&r, &mut tail), std::mem::take(&mut want));
            }
        }
        assert_eq!(drain_all(&r, &mut tail), want);
        assert!(head > 2 * RING_BYTES, "the test went round the ring");
        assert_eq!(head, tail);
    }

    #[test]
    fn a_full_ring_says_full_and_wakes_the_producer_that_waits_for_space() {
        let mut m = mem();
        let r = ring(&mut m);
        let (mut head, mut tail) = (0u64, 0u64);
        let p = vec![7u8; 4000];
        let mut n = 0;
        // SAFETY (every push and drain below): one producer, one consumer.
        while unsafe { r.push(&mut head, &[&p], 0) } == Push::Done {
            n += 1;
        }
        assert!(n > 2000, "{n}");
        assert_eq!(
            unsafe { r.push(&mut head, &[&p], 0) },
            Push::Full,
            "still full"
        );
        // Nobody asked: a drain wakes nobody.
        let mut scratch = Vec::new();
        let (k, wake) = unsafe { r.drain(&mut tail, 1, &mut scratch, |_| {}) };
        assert_eq!((k, wake), (1, false));
        assert_eq!(
            unsafe { r.push(&mut head, &[&p], 0) },
            Push::Done,
            "the freed record's room"
        );
        assert_eq!(unsafe { r.push(&mut head, &[&p], 0) }, Push::Full);
        r.want_space();
        let (k, wake) = unsafe { r.drain(&mut tail, 1, &mut scratch, |_| {}) };
        assert_eq!((k, wake), (1, true), "the producer asked: woken");
        let (_, wake) = unsafe { r.drain(&mut tail, 1, &mut scratch, |_| {}) };
        assert!(!wake, "once per request");
        assert_eq!(
            drain_all(&r, &mut tail).len(),
            n - 2,
            "nothing queued was lost"
        );
    }

    #[test]
    fn indices_and_records_the_other_process_corrupted_are_refused() {
        let mut m = mem();
        let r = ring(&mut m);
        let (mut head, mut tail) = (0u64, 0u64);
        // SAFETY: one producer.
        assert_eq!(unsafe { r.push(&mut head, &[b"good"], 0) }, Push::Done);
        // A head far ahead of our tail, or misaligned: nothing is read.
        r.hdr.head.store(tail + 3 * RING_BYTES, Ordering::Release);
        assert!(drain_all(&r, &mut tail).is_empty());
        r.hdr.head.store(head + 3, Ordering::Release);
        assert!(drain_all(&r, &mut tail).is_empty());
        assert_eq!(tail, 0);
        // The good record, then one of an unknown kind: the drain stops at it.
        r.hdr.head.store(head, Ordering::Release);
        // SAFETY: one producer.
        assert_eq!(unsafe { r.push(&mut head, &[b"next"], 0) }, Push::Done);
        let at = rec_len(4) as usize;
        m.data[at + 4] = 9;
        let r = ring(&mut m);
        assert_eq!(drain_all(&r, &mut tail), vec![b"good".to_vec()]);
        assert_eq!(tail, rec_len(4), "stopped before the bad record");
        // A record claiming more bytes than were published is not read.
        m.data[at + 4] = REC as u8;
        m.data[at..at + 4].copy_from_slice(&(1u32 << 20).to_ne_bytes());
        let r = ring(&mut m);
        assert!(drain_all(&r, &mut tail).is_empty());
        // A tail the consumer's process moved past our head: refused (not
        // "full": nobody would ever free that space).
        r.hdr.tail.store(head + 64, Ordering::Release);
        // SAFETY: one producer.
        assert_eq!(unsafe { r.push(&mut head, &[b"x"], 0) }, Push::Refused);
    }
}
