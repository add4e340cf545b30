//! Memory regions, protection domains, and the memory the core reads and
//! writes on behalf of remote peers.
//!
//! The core decides *whether* an access is allowed (key, protection domain,
//! bounds, access flags) from the tables here; the bytes themselves are
//! reached through the [`Memory`] trait, implemented by whoever owns the
//! address space: the verbs layer over real process memory (where the one
//! `unsafe` pointer access lives), the tests over plain vectors. The core
//! stays free of `unsafe` and of any notion of what an address is.

use crate::qp::attr::AccessFlags;

/// Byte access to registered memory at addresses the core has validated.
pub trait Memory {
    /// Copy `out.len()` bytes from `addr`.
    fn read(&self, addr: u64, out: &mut [u8]);
    /// Copy `data` to `addr`.
    fn write(&mut self, addr: u64, data: &[u8]);
    /// 64-bit compare-and-swap at an 8-byte aligned `addr`, atomically with
    /// respect to other atomics; returns the previous value.
    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64;
    /// 64-bit fetch-and-add at an 8-byte aligned `addr`; returns the previous value.
    fn fetch_add(&mut self, addr: u64, add: u64) -> u64;
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    pub pd: PdId,
    /// The address remote peers (and SGEs) use for the first byte.
    pub iova: u64,
    /// Where the first byte is in the owner's address space.
    pub host_addr: u64,
    pub len: u64,
    pub access: AccessFlags,
    pub lkey: u32,
    pub rkey: u32,
    /// A Send with Invalidate or local invalidate revoked the rkey.
    pub rkey_valid: bool,
}

impl Mr {
    /// Translate `[iova, iova + len)` to a host address if it lies inside.
    pub fn translate(&self, iova: u64, len: u64) -> Option<u64> {
        let off = iova.checked_sub(self.iova)?;
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| self.host_addr + off)
    }
}

/// Why a remote access was refused; each maps to a NAK and a completion
/// status on the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccessError {
    /// No region has this rkey (or it was invalidated).
    BadRkey,
    /// The region belongs to another protection domain than the QP.
    WrongPd,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the access (remote read/write/atomic).
    AccessDenied,
}

/// Why a local SGE was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalAccessError {
    BadLkey,
    WrongPd,
    OutOfBounds,
    AccessDenied,
}

/// The memory regions of one device context, keyed by index; keys carry the
/// index in their low bits and a per-registration tag above it, so a stale
/// key never matches a reused slot.
#[derive(Debug, Default)]
pub struct MrTable {
    slots: Vec<Option<Mr>>,
    free: Vec<u32>,
    rng: u64,
}

/// Bits of a key that index the table.
const INDEX_BITS: u32 = 12;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Regions per context.
pub const MAX_MR: usize = 1 << INDEX_BITS;

impl MrTable {
    /// A table whose keys are drawn from a generator seeded with `seed`
    /// (the core takes no randomness from the environment).
    pub fn new(seed: u64) -> MrTable {
        MrTable {
            slots: Vec::new(),
            free: Vec::new(),
            rng: seed | 1,
        }
    }

    fn next_tag(&mut self) -> u32 {
        // xorshift64*: unpredictable enough for keys that are not a security
        // boundary, and deterministic for a given seed.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as u32
    }

    /// Register a region; returns its (lkey, rkey).
    pub fn register(
        &mut self,
        pd: PdId,
        iova: u64,
        host_addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(u32, u32), crate::Error> {
        access
            .validate_for_mr()
            .map_err(crate::Error::InvalidAccess)?;
        if iova.checked_add(len).is_none() || host_addr.checked_add(len).is_none() {
            return Err(crate::Error::InvalidArgument(
                "memory region wraps the address space",
            ));
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < MAX_MR => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
            None => return Err(crate::Error::OutOfResources("memory regions")),
        };
        let tag_l = self.next_tag();
        let tag_r = self.next_tag();
        let lkey = (tag_l << INDEX_BITS) | idx;
        let rkey = (tag_r << INDEX_BITS) | idx;
        self.slots[idx as usize] = Some(Mr {
            pd,
            iova,
            host_addr,
            len,
            access,
            lkey,
            rkey,
            rkey_valid: true,
        });
        Ok((lkey, rkey))
    }

    /// Remove the region whose lkey is `lkey`.
    pub fn deregister(&mut self, lkey: u32) -> Result<Mr, crate::Error> {
        let idx = (lkey & INDEX_MASK) as usize;
        match self.slots.get(idx).copied().flatten() {
            Some(mr) if mr.lkey == lkey => {
                self.slots[idx] = None;
                self.free.push(idx as u32);
                Ok(mr)
            }
            _ => Err(crate::Error::InvalidArgument(
                "no memory region has this lkey",
            )),
        }
    }

    fn by_key(&self, key: u32) -> Option<&Mr> {
        self.slots.get((key & INDEX_MASK) as usize)?.as_ref()
    }

    /// Look up a region by lkey.
    pub fn get_by_lkey(&self, lkey: u32) -> Option<&Mr> {
        self.by_key(lkey).filter(|m| m.lkey == lkey)
    }

    /// Validate a remote access and translate it.
    ///
    /// A zero-length access touches no memory, and IBA (C9-88) says its
    /// R_Key and VA are not validated — a zero-byte RDMA WRITE (with
    /// immediate, typically) or READ need not carry either, and rxe and mlx5
    /// accept one with rkey 0. It translates to address 0, which no caller
    /// may dereference (there are no bytes to move).
    pub fn check_remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<u64, RemoteAccessError> {
        if len == 0 {
            return Ok(0);
        }
        let mr = self
            .by_key(rkey)
            .filter(|m| m.rkey == rkey && m.rkey_valid)
            .ok_or(RemoteAccessError::BadRkey)?;
        if mr.pd != pd {
            return Err(RemoteAccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(RemoteAccessError::AccessDenied);
        }
        mr.translate(va, len).ok_or(RemoteAccessError::OutOfBounds)
    }

    /// Validate a local SGE and translate it.
    pub fn check_local(
        &self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<u64, LocalAccessError> {
        let mr = self.get_by_lkey(lkey).ok_or(LocalAccessError::BadLkey)?;
        if mr.pd != pd {
            return Err(LocalAccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(LocalAccessError::AccessDenied);
        }
        if len == 0 {
            return Ok(mr.host_addr);
        }
        mr.translate(addr, len).ok_or(LocalAccessError::OutOfBounds)
    }

    /// Revoke a region's rkey (Send with Invalidate). Returns false if no
    /// region in `pd` has it.
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: u32) -> bool {
        let idx = (rkey & INDEX_MASK) as usize;
        match self.slots.get_mut(idx).and_then(|s| s.as_mut()) {
            Some(mr) if mr.rkey == rkey && mr.pd == pd && mr.rkey_valid => {
                mr.rkey_valid = false;
                true
            }
            _ => false,
        }
    }
}

/// A [`Memory`] over one vector: address `base + i` is byte `i`. Used by
/// tests and the simulator.
#[derive(Debug, Clone)]
pub struct VecMemory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl VecMemory {
    pub fn new(base: u64, len: usize) -> VecMemory {
        VecMemory {
            base,
            bytes: vec![0; len],
        }
    }

    fn at(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let off = (addr - self.base) as usize;
        off..off + len
    }

    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        &self.bytes[self.at(addr, len)]
    }

    pub fn slice_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let r = self.at(addr, len);
        &mut self.bytes[r]
    }
}

impl Memory for VecMemory {
    fn read(&self, addr: u64, out: &mut [u8]) {
        out.copy_from_slice(self.slice(addr, out.len()));
    }
    fn write(&mut self, addr: u64, data: &[u8]) {
        self.slice_mut(addr, data.len()).copy_from_slice(data);
    }
    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> u64 {
        let s = self.slice_mut(addr, 8);
        let old = u64::from_ne_bytes(s.try_into().unwrap());
        if old == compare {
            s.copy_from_slice(&swap.to_ne_bytes());
        }
        old
    }
    fn fetch_add(&mut self, addr: u64, add: u64) -> u64 {
        let s = self.slice_mut(addr, 8);
        let old = u64::from_ne_bytes(s.try_into().unwrap());
        s.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
        old
    }
}
