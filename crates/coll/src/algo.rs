//! The collectives, each a schedule of chunk sends and receives on the
//! protocol of [`crate::comm`].
//!
//! | collective | algorithm |
//! | --- | --- |
//! | AllReduce | ring (reduce-scatter then all-gather, chunk-pipelined, NCCL's schedule) or recursive doubling (with the non-power-of-two fold), chosen by a cost model ([`Comm::all_reduce_algo`]) |
//! | AllGather, ReduceScatter | ring |
//! | Broadcast, Reduce | pipelined chain from / to the root |
//! | AlltoAll | pairwise exchange, n − 1 steps |
//! | SendRecv | one exchange |
//!
//! Every schedule alternates a send with a receive per chunk, so with at
//! least two FIFO slots per peer no rank can wait for a credit that only a
//! rank waiting on it could return. Memory a send reads is rewritten only
//! once the send has completed (the engine reads a send's source when it
//! transmits and again if it retransmits): sends that must not wait go
//! from scratch copies whose reuse waits for their completion; the ring's
//! all-gather waits for the reduce-scatter's sends before overwriting what
//! they read (done long before: one poll); and every collective waits for
//! the sends of the caller's memory before it returns.

use crate::comm::{Buffer, Comm, Src};
use crate::reduce::{self, DataType, ReduceOp};
use crate::{Error, Result};

/// A place in a [`Buffer`]: the buffer and a byte offset into it.
#[derive(Clone, Copy)]
pub struct View<'a> {
    buf: &'a Buffer,
    off: usize,
}

impl Buffer {
    /// The place `offset` bytes into this buffer.
    pub fn at(&self, offset: usize) -> View<'_> {
        View {
            buf: self,
            off: offset,
        }
    }
}

impl<'a> From<&'a Buffer> for View<'a> {
    fn from(b: &'a Buffer) -> View<'a> {
        b.at(0)
    }
}

impl View<'_> {
    fn check(&self, bytes: usize, what: &str) -> Result<Src> {
        match self.off.checked_add(bytes) {
            Some(e) if e <= self.buf.len() => Ok(Src::of(self.buf, self.off)),
            _ => Err(Error::Invalid(format!(
                "the {what} buffer needs bytes {}..{} of a buffer of {}",
                self.off,
                self.off as u128 + bytes as u128,
                self.buf.len()
            ))),
        }
    }
}

/// Which AllReduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// Reduce-scatter then all-gather around a ring: each rank sends
    /// 2(n−1)/n of the data in 2(n−1) steps; bandwidth-optimal.
    Ring,
    /// Exchange-and-reduce with partners at distance 1, 2, 4, …: ⌈log₂ n⌉
    /// steps (two more when n is not a power of two) of the whole buffer;
    /// latency-optimal.
    RecursiveDoubling,
}

impl Algo {
    /// Its name in `SOFTRDMA_COLL_ALGO` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "rd",
        }
    }
}

/// Per-transport figures of the AllReduce cost model: per-step latency α
/// (ns), bytes per ns each way on the wire β (both directions at once),
/// and bytes per ns one core reduces (γ, f32 sum of two inputs into a
/// third) and copies (μ). Measured on the 2-core development host
/// (`docs/PERFORMANCE.md`, "Collectives": the 8-byte AllReduce, the
/// bandwidth of large ones, and the reduction kernels' own benchmark).
/// A step's wire time and its reduction overlap (chunks pipeline), so a
/// step costs the larger of the two.
struct Model {
    alpha_ns: f64,
    beta: f64,
    gamma: f64,
    mu: f64,
}

const MODEL_SHM: Model = Model {
    alpha_ns: 1_000.0,
    beta: 20.0,
    gamma: 6.0,
    mu: 20.0,
};
const MODEL_UDP: Model = Model {
    alpha_ns: 10_000.0,
    beta: 1.6,
    gamma: 6.0,
    mu: 20.0,
};

/// `count` elements of `es` bytes, times `blocks`, or an error if that
/// does not fit in memory.
fn nbytes(count: usize, es: usize, blocks: usize) -> Result<usize> {
    count
        .checked_mul(es)
        .and_then(|b| b.checked_mul(blocks))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::Invalid(format!("{count} elements of {es} bytes × {blocks}")))
}

/// The send place (`slen` bytes at `s`) and the receive place (`dlen` at
/// `d`) are disjoint, or `s` is exactly at `exact` (the in-place
/// arrangement): any other overlap is refused (the copies and reductions
/// need their inputs whole).
fn disjoint_or_at(s: Src, slen: usize, d: Src, dlen: usize, exact: u64) -> Result<()> {
    let overlap =
        slen > 0 && dlen > 0 && s.addr < d.addr + dlen as u64 && d.addr < s.addr + slen as u64;
    if overlap && s.addr != exact {
        return Err(Error::Invalid(
            "the send and receive places overlap without being the in-place arrangement".into(),
        ));
    }
    Ok(())
}

/// The chunks of `bytes` bytes, `(offset, length)`, `chunk` bytes each but
/// the last: at least one (of length 0 for no bytes), so that every rank
/// sends and receives the same sequence whatever the count.
fn chunks(bytes: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..bytes.max(1))
        .step_by(chunk)
        .map(move |o| (o, chunk.min(bytes - o)))
}

fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if !std::ptr::eq(dst, src) && n > 0 {
        // SAFETY: callers pass ranges they bounds-checked against live
        // registered buffers (or a FIFO slot of `n` ≤ chunk bytes); the two
        // are distinct places (checked) of distinct chunks, so they do not
        // overlap; raw copies form no reference to peer-written memory.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }
}

impl Comm {
    /// The AllReduce algorithm for `bytes` on this communicator: the one
    /// forced (`SOFTRDMA_COLL_ALGO=ring|rd`, [`Comm::set_all_reduce_algo`]),
    /// else the cheaper by the α-β-γ cost model of the transport in use.
    pub fn all_reduce_algo(&self, bytes: usize) -> Algo {
        if let Some(a) = self.algo {
            return a;
        }
        let n = self.size();
        if n <= 1 {
            return Algo::Ring;
        }
        // What every rank agreed on at start-up, so all choose alike.
        let m = if self.all_shm() {
            &MODEL_SHM
        } else {
            &MODEL_UDP
        };
        let s = bytes as f64;
        let nf = n as f64;
        // Ring: 2(n−1) steps of s/n bytes; each rank reduces (n−1)/n of
        // the data and copies as much.
        let ring = 2.0 * (nf - 1.0) * m.alpha_ns
            + f64::max(
                2.0 * (nf - 1.0) / nf * s / m.beta,
                (nf - 1.0) / nf * s * (1.0 / m.gamma + 1.0 / m.mu),
            );
        // Recursive doubling: log2(p2) steps of the whole buffer, each
        // reduced and copied to scratch; two more when n is not a power of
        // two.
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let steps = p2.trailing_zeros() as f64;
        let mut rd = steps * (m.alpha_ns + f64::max(s / m.beta, s * (1.0 / m.gamma + 1.0 / m.mu)));
        if p2 != n {
            rd += 2.0 * (m.alpha_ns + s / m.beta) + s / m.gamma;
        }
        if rd < ring {
            Algo::RecursiveDoubling
        } else {
            Algo::Ring
        }
    }

    fn ring_peers(&self) -> (usize, usize) {
        let n = self.size();
        let r = self.rank();
        ((r + n - 1) % n, (r + 1) % n)
    }

    /// Send `bytes` at `src` to `p` in chunks, one receive from `from`
    /// consumed by `on_recv(offset, slot, len)` after each (for exchanges
    /// where both directions have the same length).
    fn exchange(
        &mut self,
        to: usize,
        src: Src,
        from: usize,
        bytes: usize,
        mut on_recv: impl FnMut(&mut Comm, usize, *const u8, usize) -> Result<()>,
    ) -> Result<()> {
        let chunk = self.chunk();
        for (off, len) in chunks(bytes, chunk) {
            self.send_chunk(to, src.add(off), len)?;
            let slot = self.recv_exact(from, len)?;
            on_recv(self, off, slot, len)?;
            self.release(from)?;
        }
        Ok(())
    }

    /// The next chunk from `from` (in its slot), which must be `len` bytes.
    fn recv_exact(&mut self, from: usize, len: usize) -> Result<*const u8> {
        match self.recv_exact_any(from, len)? {
            (slot, false) => Ok(slot),
            (_, true) => Err(Error::Protocol(format!(
                "rank {from} wrote a chunk straight into this rank's buffer where it was due in a slot (do the ranks call the same collective?)"
            ))),
        }
    }

    /// [`Comm::recv_exact`], also for a chunk written straight to its place
    /// (the second value).
    fn recv_exact_any(&mut self, from: usize, len: usize) -> Result<(*const u8, bool)> {
        let (slot, got, placed) = self.recv_chunk_any(from)?;
        if got != len {
            return Err(Error::Protocol(format!(
                "rank {from} sent a chunk of {got} bytes where {len} were due (do the ranks call the same collective with the same count?)"
            )));
        }
        Ok((slot, placed))
    }

    /// `ncclAllReduce`: every rank's `recv` becomes the element-wise `op`
    /// of all ranks' `send` (`count` elements of `dt`). In place when both
    /// name the same place.
    pub fn all_reduce(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.begin();
        let bytes = nbytes(count, dt.size(), 1)?;
        let s = send.check(bytes, "send")?;
        let d = recv.check(bytes, "receive")?;
        disjoint_or_at(s, bytes, d, bytes, d.addr)?;
        let n = self.size();
        if n == 1 {
            copy(d.ptr(), s.ptr(), bytes);
            // SAFETY: `d` spans `count` elements of a live buffer (checked).
            unsafe { reduce::finish(dt, op, d.ptr(), count, 1) };
            return Ok(());
        }
        match self.all_reduce_algo(bytes) {
            Algo::Ring => self.ring_all_reduce(s, d, count, dt, op)?,
            Algo::RecursiveDoubling => self.rd_all_reduce(s, d, count, dt, op)?,
        }
        self.end()
    }

    fn ring_all_reduce(
        &mut self,
        s: Src,
        d: Src,
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let (left, right) = self.ring_peers();
        let es = dt.size();
        let ce = self.chunk() / es;
        // Over shared memory the all-gather half writes each final chunk
        // straight into the right neighbour's receive buffer (a copy out of
        // the slot saved per chunk); the neighbours swap where first.
        let bytes = count * es;
        let theirs = if self.all_shm() {
            Some(self.swap_places(left, d, bytes, right)?)
        } else {
            None
        };
        if let Some(t) = theirs {
            if t.len != bytes as u64 {
                return Err(Error::Protocol(format!(
                    "rank {right} reduces {} bytes, this rank {bytes} (do the ranks call the same collective with the same count?)",
                    t.len
                )));
            }
        }
        let place = |o: usize, len: usize| {
            theirs.map(|t| softrdma_verbs::RemoteRegion {
                addr: t.addr + o as u64,
                rkey: t.rkey,
                len: len as u64,
            })
        };
        let mut base = 0;
        while base < count {
            let cs = ce.min((count - base).div_ceil(n));
            // Chunk k of this round: elements [lo, hi).
            let range = |k: usize| {
                let lo = (base + k * cs).min(count);
                let hi = (base + (k + 1) * cs).min(count);
                (lo * es, (hi - lo) * es)
            };
            let reduce_in = |c: &mut Comm, k: usize, fin: bool| -> Result<()> {
                let (o, len) = range(k);
                let slot = c.recv_exact(left, len)?;
                // SAFETY: `d` and `s` span `count` elements (checked at
                // entry), chunk k lies inside; the slot holds `len` bytes
                // the peer wrote; dst may equal `s` exactly (in place).
                unsafe {
                    reduce::reduce3(dt, op, d.ptr().add(o), slot, s.ptr().add(o), len / es);
                    if fin {
                        reduce::finish(dt, op, d.ptr().add(o), len / es, n);
                    }
                }
                c.release(left)
            };
            let copy_in = |c: &mut Comm, k: usize| -> Result<()> {
                let (o, len) = range(k);
                let (slot, placed) = c.recv_exact_any(left, len)?;
                if !placed {
                    copy(d.ptr().wrapping_add(o), slot, len);
                }
                c.release(left)
            };
            // Reduce-scatter.
            let (o, len) = range(r);
            let mut rs_sent = self.send_chunk(right, s.add(o), len)?;
            for step in 1..n - 1 {
                let k = (r + n - step) % n;
                reduce_in(self, k, false)?;
                let (o, len) = range(k);
                rs_sent = self.send_chunk(right, d.add(o), len)?;
            }
            let k = (r + 1) % n;
            reduce_in(self, k, true)?;
            // All-gather. It overwrites chunks the reduce-scatter sent from
            // (the receive buffer, or the send buffer in place): the right
            // neighbour has them, but the engine may still read them to
            // retransmit, so those sends are waited for first (long done
            // by now: one poll).
            self.wait_sent(right, rs_sent)?;
            let (o, len) = range(k);
            self.send_chunk_to(right, d.add(o), len, place(o, len))?;
            for t in 1..n - 1 {
                let k = (r + 1 + n - t) % n;
                copy_in(self, k)?;
                let (o, len) = range(k);
                self.send_chunk_to(right, d.add(o), len, place(o, len))?;
            }
            copy_in(self, (r + 2) % n)?;
            base += n * cs;
        }
        Ok(())
    }

    fn rd_all_reduce(
        &mut self,
        s: Src,
        d: Src,
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let es = dt.size();
        let bytes = count * es;
        let chunk = self.chunk();
        // Out of place, the first reduction reads the send buffer and writes
        // the receive buffer, and the first exchange sends straight from the
        // send buffer (which nothing overwrites): no copy of the data before
        // it. In place, or from the second exchange on, our operand is the
        // receive buffer.
        let mut in_d = s.addr == d.addr;
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p2;
        // Fold the ranks beyond the largest power of two into their
        // neighbours: even r < 2·rem hands its data to r + 1 and waits.
        let newrank = if r < 2 * rem {
            if r % 2 == 0 {
                None
            } else {
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        // Our operand: the send buffer until a reduction has written the
        // receive buffer (out of place), then the receive buffer.
        let ours = |in_d: bool| if in_d { d } else { s };
        let reduce_slot =
            |c: &mut Comm, in_d: bool, from: usize, off: usize, len: usize| -> Result<()> {
                let slot = c.recv_exact(from, len)?;
                let mine = ours(in_d).ptr().wrapping_add(off);
                // The lower rank's operand first on both partners, so they
                // compute bit for bit the same (a float min of ±0 or a NaN's
                // payload depends on the order).
                let (a, b) = if r < from {
                    (mine.cast_const(), slot)
                } else {
                    (slot, mine.cast_const())
                };
                // SAFETY: `s` and `d` span `bytes` (checked at entry), [off,
                // off+len) inside; the output is exactly `mine` (in `d`) or
                // disjoint from it (`mine` in `s`, disjoint from `d` out of
                // place, checked at entry); the slot holds `len`
                // peer-written bytes.
                unsafe { reduce::reduce3(dt, op, d.ptr().wrapping_add(off), a, b, len / es) };
                c.release(from)
            };
        let chunks = |b: usize| chunks(b, chunk);
        let mut folded = 0;
        if r < 2 * rem {
            if r % 2 == 0 {
                for (o, len) in chunks(bytes) {
                    folded = self.send_chunk(r + 1, s.add(o), len)?;
                }
            } else {
                for (o, len) in chunks(bytes) {
                    reduce_slot(self, in_d, r - 1, o, len)?;
                }
                in_d = true;
            }
        }
        if let Some(nr) = newrank {
            let real = |x: usize| if x < rem { 2 * x + 1 } else { x + rem };
            let mut mask = 1;
            while mask < p2 {
                let partner = real(nr ^ mask);
                for (o, len) in chunks(bytes) {
                    if in_d || o + len >= bytes {
                        // Our chunk goes from a scratch copy, so the
                        // reduction can overwrite it at once (the wire may
                        // not have read it yet) — and the last one from
                        // the send buffer too, so the call does not end
                        // waiting for its acknowledgment (the ones before
                        // it are in by the time the partner's last chunk
                        // is: the partner acknowledged each of ours before
                        // it sent its next).
                        let tmp = self.next_scratch()?;
                        copy(tmp.ptr(), ours(in_d).ptr().wrapping_add(o), len);
                        self.send_scratch(partner, tmp, len)?;
                    } else {
                        self.send_chunk(partner, s.add(o), len)?;
                    }
                    reduce_slot(self, in_d, partner, o, len)?;
                }
                in_d = true;
                mask <<= 1;
            }
            // SAFETY: `d` spans `count` elements (checked at entry).
            unsafe { reduce::finish(dt, op, d.ptr(), count, n) };
        }
        if r < 2 * rem {
            if r % 2 == 1 {
                for (o, len) in chunks(bytes) {
                    self.send_chunk(r - 1, d.add(o), len)?;
                }
            } else {
                // The result overwrites what the fold sent from (a
                // retransmission may still read it): its sends first.
                self.wait_sent(r + 1, folded)?;
                for (o, len) in chunks(bytes) {
                    let slot = self.recv_exact(r + 1, len)?;
                    copy(d.ptr().wrapping_add(o), slot, len);
                    self.release(r + 1)?;
                }
            }
        }
        Ok(())
    }

    /// `ncclAllGather`: `recv` (`size × count` elements) becomes every
    /// rank's `send` (`count` elements), rank r's at element r·count. In
    /// place when `send` is that part of `recv`.
    pub fn all_gather(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
    ) -> Result<()> {
        self.begin();
        let (n, r) = (self.size(), self.rank());
        let bytes = nbytes(count, dt.size(), 1)?;
        let s = send.check(bytes, "send")?;
        let d = recv.check(nbytes(count, dt.size(), n)?, "receive")?;
        disjoint_or_at(s, bytes, d, bytes * n, d.addr + (r * bytes) as u64)?;
        copy(d.ptr().wrapping_add(r * bytes), s.ptr(), bytes);
        if n == 1 {
            return Ok(());
        }
        let (left, right) = self.ring_peers();
        let chunk = self.chunk();
        for (off, len) in chunks(bytes, chunk) {
            self.send_chunk(right, d.add(r * bytes + off), len)?;
            for t in 1..n {
                let k = (r + n - t) % n;
                let slot = self.recv_exact(left, len)?;
                copy(d.ptr().wrapping_add(k * bytes + off), slot, len);
                self.release(left)?;
                if t < n - 1 {
                    self.send_chunk(right, d.add(k * bytes + off), len)?;
                }
            }
        }
        self.end()
    }

    /// `ncclReduceScatter`: rank r's `recv` (`count` elements) becomes the
    /// `op` of every rank's block r of `send` (`size × count` elements). In
    /// place when `recv` is block r of `send`.
    pub fn reduce_scatter(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.begin();
        let (n, r) = (self.size(), self.rank());
        let es = dt.size();
        let bytes = nbytes(count, es, 1)?;
        let s = send.check(nbytes(count, es, n)?, "send")?;
        let d = recv.check(bytes, "receive")?;
        disjoint_or_at(
            s,
            bytes * n,
            d,
            bytes,
            d.addr.wrapping_sub((r * bytes) as u64),
        )?;
        if n == 1 {
            copy(d.ptr(), s.ptr(), bytes);
            // SAFETY: `d` spans `count` elements (checked).
            unsafe { reduce::finish(dt, op, d.ptr(), count, 1) };
            return Ok(());
        }
        let (left, right) = self.ring_peers();
        let chunk = self.chunk();
        for (off, len) in chunks(bytes, chunk) {
            let k0 = (r + n - 1) % n;
            self.send_chunk(right, s.add(k0 * bytes + off), len)?;
            for step in 1..n {
                let k = (r + 2 * n - step - 1) % n;
                let slot = self.recv_exact(left, len)?;
                let mine = s.ptr().wrapping_add(k * bytes + off);
                if step < n - 1 {
                    let tmp = self.next_scratch()?;
                    // SAFETY: `mine` is inside `send` (checked), the slot
                    // and the scratch slot hold `len` ≤ chunk bytes.
                    unsafe { reduce::reduce3(dt, op, tmp.ptr(), slot, mine, len / es) };
                    self.release(left)?;
                    self.send_scratch(right, tmp, len)?;
                } else {
                    let out = d.ptr().wrapping_add(off);
                    // SAFETY: `out` is inside `recv` (checked); it may be
                    // exactly `mine` (in place).
                    unsafe {
                        reduce::reduce3(dt, op, out, slot, mine, len / es);
                        reduce::finish(dt, op, out, len / es, n);
                    }
                    self.release(left)?;
                }
            }
        }
        self.end()
    }

    /// `ncclBroadcast`: every rank's `recv` becomes `root`'s `send`
    /// (`count` elements; only the root's `send` is read).
    pub fn broadcast(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
        root: usize,
    ) -> Result<()> {
        self.begin();
        let (n, r) = (self.size(), self.rank());
        self.check_root(root)?;
        let bytes = nbytes(count, dt.size(), 1)?;
        let d = recv.check(bytes, "receive")?;
        let pos = (r + n - root) % n;
        let next = (pos + 1 < n).then_some((r + 1) % n);
        let prev = (r + n - 1) % n;
        let chunk = self.chunk();
        if pos == 0 {
            let s = send.check(bytes, "send")?;
            disjoint_or_at(s, bytes, d, bytes, d.addr)?;
            copy(d.ptr(), s.ptr(), bytes);
        }
        if n == 1 {
            return Ok(());
        }
        for (off, len) in chunks(bytes, chunk) {
            if pos > 0 {
                let slot = self.recv_exact(prev, len)?;
                copy(d.ptr().wrapping_add(off), slot, len);
                self.release(prev)?;
            }
            if let Some(nx) = next {
                self.send_chunk(nx, d.add(off), len)?;
            }
        }
        self.end()
    }

    /// `ncclReduce`: `root`'s `recv` becomes the `op` of every rank's
    /// `send` (`count` elements); the others' `recv` is not touched.
    pub fn reduce(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.begin();
        let (n, r) = (self.size(), self.rank());
        self.check_root(root)?;
        let es = dt.size();
        let bytes = nbytes(count, es, 1)?;
        let s = send.check(bytes, "send")?;
        // The chain runs root+1 → root+2 → … → root.
        let pos = (r + n - root - 1) % n;
        let prev = (r + n - 1) % n;
        let next = (r + 1) % n;
        let d = if r == root {
            let d = recv.check(bytes, "receive")?;
            disjoint_or_at(s, bytes, d, bytes, d.addr)?;
            Some(d)
        } else {
            None
        };
        if n == 1 {
            let d = d.expect("the root");
            copy(d.ptr(), s.ptr(), bytes);
            // SAFETY: `d` spans `count` elements (checked).
            unsafe { reduce::finish(dt, op, d.ptr(), count, 1) };
            return Ok(());
        }
        let chunk = self.chunk();
        for (off, len) in chunks(bytes, chunk) {
            let mine = s.ptr().wrapping_add(off);
            if pos == 0 {
                self.send_chunk(next, s.add(off), len)?;
            } else {
                let slot = self.recv_exact(prev, len)?;
                if let Some(d) = d {
                    let out = d.ptr().wrapping_add(off);
                    // SAFETY: `out` inside `recv`, `mine` inside `send`
                    // (both checked; `out` may be exactly `mine`); the
                    // slot holds `len` bytes.
                    unsafe {
                        reduce::reduce3(dt, op, out, slot, mine, len / es);
                        reduce::finish(dt, op, out, len / es, n);
                    }
                    self.release(prev)?;
                } else {
                    let tmp = self.next_scratch()?;
                    // SAFETY: as above; the scratch slot holds a chunk.
                    unsafe { reduce::reduce3(dt, op, tmp.ptr(), slot, mine, len / es) };
                    self.release(prev)?;
                    self.send_scratch(next, tmp, len)?;
                }
            }
        }
        self.end()
    }

    /// `ncclAlltoAll` (NCCL 2.28): block j of `send` (`count` elements per
    /// block, `size` blocks) goes to rank j, whose block r of `recv` it
    /// becomes. In place (the same place) works too, through a copy.
    pub fn all_to_all(
        &mut self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dt: DataType,
    ) -> Result<()> {
        self.begin();
        let (n, r) = (self.size(), self.rank());
        let bytes = nbytes(count, dt.size(), 1)?;
        let s = send.check(nbytes(count, dt.size(), n)?, "send")?;
        let d = recv.check(bytes * n, "receive")?;
        let s = self.stage_if_overlapping(s, d, bytes * n)?.unwrap_or(s);
        copy(
            d.ptr().wrapping_add(r * bytes),
            s.ptr().wrapping_add(r * bytes),
            bytes,
        );
        for step in 1..n {
            let to = (r + step) % n;
            let from = (r + n - step) % n;
            self.exchange(to, s.add(to * bytes), from, bytes, |_, off, slot, len| {
                copy(d.ptr().wrapping_add(from * bytes + off), slot, len);
                Ok(())
            })?;
        }
        self.end()
    }

    /// Send `count` elements at `send` to rank `to` and receive as many
    /// into `recv` from rank `from` (nccl-tests' `sendrecv_perf` pairs each
    /// rank with its ring neighbours).
    pub fn send_recv(
        &mut self,
        send: View<'_>,
        to: usize,
        recv: View<'_>,
        from: usize,
        count: usize,
        dt: DataType,
    ) -> Result<()> {
        self.begin();
        let bytes = nbytes(count, dt.size(), 1)?;
        let s = send.check(bytes, "send")?;
        let d = recv.check(bytes, "receive")?;
        self.check_root(to)?;
        self.check_root(from)?;
        let r = self.rank();
        if to == r || from == r {
            if to != from {
                return Err(Error::Invalid(format!(
                    "rank {r} sends to {to} and receives from {from}: to itself both or neither"
                )));
            }
            // To itself: the places may overlap (a memmove).
            // SAFETY: both lie inside live buffers (checked above).
            unsafe { std::ptr::copy(s.ptr(), d.ptr(), bytes) };
            return Ok(());
        }
        let s = self.stage_if_overlapping(s, d, bytes)?.unwrap_or(s);
        self.exchange(to, s, from, bytes, |_, off, slot, len| {
            copy(d.ptr().wrapping_add(off), slot, len);
            Ok(())
        })?;
        self.end()
    }

    /// A copy of the `bytes` at `s` if they overlap the `bytes` at `d`
    /// (in place): a block may be overwritten before it is sent. The copy
    /// is in the communicator's staging buffer, registered once and grown
    /// when a call needs more; no send still reads it (every call ends
    /// waiting for the sends of memory not its scratch, [`Comm::end`]).
    fn stage_if_overlapping(&mut self, s: Src, d: Src, bytes: usize) -> Result<Option<Src>> {
        let b = bytes as u64;
        if bytes == 0 || s.addr >= d.addr + b || d.addr >= s.addr + b {
            return Ok(None);
        }
        if self.stage.as_ref().is_none_or(|st| st.len() < bytes) {
            // The old one first: both at once would hold twice the memory.
            self.stage = None;
            self.stage = Some(self.alloc(bytes)?);
        }
        let st = self.stage.as_ref().expect("just made");
        copy(st.as_ptr(), s.ptr(), bytes);
        Ok(Some(Src::of(st, 0)))
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::Invalid(format!(
                "rank {root} of a communicator of {}",
                self.size()
            )));
        }
        Ok(())
    }
}
