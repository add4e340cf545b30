//! A [`Memory`] that panics on any access the core was not granted: the
//! oracle of the memory-safety tests and of the stateful fuzz target.
//!
//! It keeps the host ranges of the regions that are live — registered and
//! not yet deregistered — and panics, naming the offending access, on any
//! read, write or atomic that does not lie inside one of them, and on any
//! atomic at a host address that is not 8-byte aligned (the verbs layer
//! builds an `&AtomicU64` there, undefined behaviour if misaligned). In a
//! test the panic fails the test; under libFuzzer it is a crash.
//!
//! Who says what is live is the caller's choice, and the two choices test
//! different things:
//!
//! * [`GuardedMemory::sync`] copies the endpoint's own region table, before
//!   each call into the endpoint: it catches any access to memory the table
//!   does not cover (a stale host address kept across a deregistration, a
//!   bounds slip), which is what the core tests want for free on every
//!   call.
//! * [`GuardedMemory::grant`] / [`GuardedMemory::revoke`] keep the caller's
//!   own record of what it registered and what deregistrations returned:
//!   an oracle independent of the table, so a table that forgot to drop a
//!   region is caught too. The fuzz target uses this.
//!
//! It lives in the core crate rather than in test support so that the core
//! tests and the fuzz crate (which cannot import test modules) share one
//! definition. Like [`VecMemory`], which it wraps, it is for tests,
//! fuzzing and the simulator, not for the real stack.

use std::ops::{Deref, DerefMut};

use super::{Memory, MrTable, VecMemory};

/// A [`VecMemory`] that panics on accesses outside the live regions.
#[derive(Debug, Clone)]
pub struct GuardedMemory {
    inner: VecMemory,
    /// Host ranges (start, len) of the live regions.
    live: Vec<(u64, u64)>,
    /// Accesses checked so far (writes and atomics; reads take `&self`).
    pub accesses: u64,
}

impl GuardedMemory {
    /// `len` zero bytes at host addresses `base..base + len`, with no
    /// region live yet.
    pub fn new(base: u64, len: usize) -> GuardedMemory {
        GuardedMemory {
            inner: VecMemory::new(base, len),
            live: Vec::new(),
            accesses: 0,
        }
    }

    /// Take the live regions from a region table.
    pub fn sync(&mut self, mrs: &MrTable) {
        self.live.clear();
        // An implicit region spans everything but is reached only through
        // checked calls: counting it live would let every unchecked access
        // through.
        self.live.extend(
            mrs.iter()
                .filter(|m| !m.checked)
                .map(|m| (m.host_addr, m.len)),
        );
    }

    /// Declare `[host, host + len)` live (a registration succeeded).
    pub fn grant(&mut self, host: u64, len: u64) {
        self.live.push((host, len));
    }

    /// Withdraw one earlier [`GuardedMemory::grant`] of exactly this range
    /// (a deregistration returned); other grants of the same bytes stay.
    pub fn revoke(&mut self, host: u64, len: u64) {
        if let Some(i) = self.live.iter().position(|&r| r == (host, len)) {
            self.live.swap_remove(i);
        }
    }

    /// The live host ranges, (start, len).
    pub fn live(&self) -> &[(u64, u64)] {
        &self.live
    }

    fn check(&self, what: &str, addr: u64, len: usize) {
        if len == 0 {
            return;
        }
        let inside = addr.checked_add(len as u64).is_some_and(|end| {
            self.live
                .iter()
                .any(|&(a, l)| addr >= a && end <= a.saturating_add(l))
        });
        assert!(
            inside,
            "{what} of {len} bytes at {addr:#x} is outside every live memory region \
             (live: {:x?})",
            self.live
        );
    }

    fn check_aligned(&self, addr: u64) {
        assert!(
            addr.is_multiple_of(8),
            "atomic at {addr:#x}: host address not 8-byte aligned"
        );
    }

    fn check_atomic(&self, what: &str, addr: u64) {
        self.check(what, addr, 8);
        assert!(
            addr.is_multiple_of(8),
            "{what} at {addr:#x}: host address not 8-byte aligned"
        );
    }
}

impl Deref for GuardedMemory {
    type Target = VecMemory;
    fn deref(&self) -> &VecMemory {
        &self.inner
    }
}

impl DerefMut for GuardedMemory {
    fn deref_mut(&mut self) -> &mut VecMemory {
        &mut self.inner
    }
}

impl Memory for GuardedMemory {
    // A zero-length access moves no bytes, wherever it points (the core
    // translates an empty range to address 0): nothing to check, nothing
    // to copy.
    fn read(&self, addr: u64, out: &mut [u8]) {
        if out.is_empty() {
            return;
        }
        self.check("read", addr, out.len());
        self.inner.read(addr, out);
    }
    fn write(&mut self, addr: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.check("write", addr, data.len());
        self.accesses += 1;
        self.inner.write(addr, data);
    }
    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64 {
        self.check_atomic("compare-and-swap", addr);
        self.accesses += 1;
        self.inner.compare_swap(addr, compare, swap)
    }
    fn fetch_add(&mut self, addr: u64, add: u64) -> u64 {
        self.check_atomic("fetch-and-add", addr);
        self.accesses += 1;
        self.inner.fetch_add(addr, add)
    }
    fn store_u64(&mut self, addr: u64, bytes: [u8; 8]) {
        self.check_atomic("atomic write", addr);
        self.accesses += 1;
        self.inner.store_u64(addr, bytes)
    }
    // A checked access is to an implicit region, which any address may be
    // in: liveness says nothing, the memory itself answers (a fault for
    // bytes outside the vector).
    fn read_checked(&self, addr: u64, out: &mut [u8]) -> Result<(), super::Fault> {
        self.inner.read_checked(addr, out)
    }
    fn write_checked(&mut self, addr: u64, data: &[u8]) -> Result<(), super::Fault> {
        self.accesses += 1;
        self.inner.write_checked(addr, data)
    }
    fn compare_swap_checked(
        &mut self,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, super::Fault> {
        self.check_aligned(addr);
        self.accesses += 1;
        self.inner.compare_swap_checked(addr, compare, swap)
    }
    fn fetch_add_checked(&mut self, addr: u64, add: u64) -> Result<u64, super::Fault> {
        self.check_aligned(addr);
        self.accesses += 1;
        self.inner.fetch_add_checked(addr, add)
    }
    fn store_u64_checked(&mut self, addr: u64, bytes: [u8; 8]) -> Result<(), super::Fault> {
        self.check_aligned(addr);
        self.accesses += 1;
        self.inner.store_u64_checked(addr, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "write of 4 bytes at 0x103e is outside every live memory region")]
    fn an_access_past_a_region_panics() {
        let mut m = GuardedMemory::new(0x1000, 256);
        m.grant(0x1000, 64);
        m.write(0x1000, &[1; 64]);
        m.write(0x103e, &[1; 4]);
    }

    #[test]
    #[should_panic(expected = "read of 1 bytes at 0x1000 is outside every live memory region")]
    fn a_revoked_region_is_not_live() {
        let mut m = GuardedMemory::new(0x1000, 256);
        m.grant(0x1000, 64);
        m.grant(0x1000, 64);
        m.revoke(0x1000, 64);
        m.read(0x1000, &mut [0; 1]); // the second grant still covers it
        m.revoke(0x1000, 64);
        m.read(0x1000, &mut [0; 1]);
    }

    #[test]
    #[should_panic(expected = "fetch-and-add at 0x1004: host address not 8-byte aligned")]
    fn a_misaligned_atomic_panics() {
        let mut m = GuardedMemory::new(0x1000, 256);
        m.grant(0x1000, 64);
        m.fetch_add(0x1000, 1);
        m.fetch_add(0x1004, 1);
    }
}
