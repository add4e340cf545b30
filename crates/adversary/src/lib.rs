//! Hostile-peer and long-run tests of softrdma, as real processes over UDP
//! on loopback.
//!
//! * [`forge`]: a RoCEv2 peer that builds its own packets with
//!   `softrdma-wire` (BTH, RETH, AtomicETH, AETH and the ICRC exactly as rxe
//!   computes it) and sends them from its own UDP socket, the way rxe or an
//!   RNIC would; it can also break any of them on purpose. The adversarial
//!   test (`tests/adversary.rs`) drives it against a target that runs the
//!   real stack.
//! * [`procstat`]: RSS and open descriptors of this process, sampled from
//!   `/proc/self`, with the "flat after warm-up" bound the soak enforces.
//! * the soak program (`src/bin/soak.rs`, run by `scripts/soak`): mixed
//!   traffic over several RC QPs between two processes under injected loss,
//!   reordering, duplication and corruption, with registrations,
//!   deregistrations and QP resets interleaved, every byte checked.
//!
//! This is a test crate, not a tool: it is not part of the `softrdma` CLI
//! because nothing here is for users, and a packet forger does not belong
//! next to the benchmarks.

pub mod forge;
pub mod procstat;

/// Held by this crate's unit tests that open descriptors or count them:
/// the test harness runs them on parallel threads of one process, whose
/// descriptor count `procstat`'s test reads.
#[cfg(test)]
pub(crate) static FD_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// xorshift64*: a seeded generator both processes can run to agree on a
/// plan without sending it (not for anything secret).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (n > 0; the bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}
