//! A [`Memory`] that fails the test on any access the core was not granted.
//!
//! It knows which regions are live — registered and not yet deregistered —
//! from the endpoint's own region table, refreshed by its [`super::Host`]
//! at every call into the endpoint, and panics (failing the test, with the
//! offending access in the message) on any read, write or atomic that does
//! not lie inside one live region, and on any atomic at an address that is
//! not 8-byte aligned (the verbs layer builds an `&AtomicU64` there).
//! Every test that runs through `Host` checks this for free; the memory
//! safety tests (tests/memory_safety.rs) arrange memory so that the region
//! under test is the only one covering its bytes.

use std::ops::{Deref, DerefMut};

use softrdma_core::mr::{Memory, MrTable, VecMemory};

#[derive(Debug, Clone)]
pub struct GuardedMemory {
    inner: VecMemory,
    /// Host ranges (start, len) of the live regions.
    live: Vec<(u64, u64)>,
    /// Accesses checked so far (reads, writes, atomics).
    pub accesses: u64,
}

impl GuardedMemory {
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
        self.live.extend(mrs.iter().map(|m| (m.host_addr, m.len)));
    }

    fn check(&self, what: &str, addr: u64, len: usize) {
        if len == 0 {
            return;
        }
        let end = addr.checked_add(len as u64).expect("access wraps");
        let inside = self.live.iter().any(|&(a, l)| addr >= a && end <= a + l);
        assert!(
            inside,
            "{what} of {len} bytes at {addr:#x} is outside every live memory region \
             (live: {:x?})",
            self.live
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
    fn read(&self, addr: u64, out: &mut [u8]) {
        self.check("read", addr, out.len());
        self.inner.read(addr, out);
    }
    fn write(&mut self, addr: u64, data: &[u8]) {
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
}
