//! Memory regions, protection domains, and the memory the core reads and
//! writes on behalf of remote peers.
//!
//! The core decides *whether* an access is allowed (key, protection domain,
//! bounds, access flags) from the table here; the bytes themselves are
//! reached through the [`Memory`] trait, implemented by whoever owns the
//! address space: the verbs layer over real process memory (where the one
//! `unsafe` pointer access lives), the tests over plain vectors. The core
//! stays free of `unsafe` and of any notion of what an address is.
//!
//! # Translation per access
//!
//! As an RNIC translates every DMA through its memory translation table,
//! nothing the core keeps across calls holds a host address. Work that
//! spans packets — a WRITE's later segments, a queued READ response stream,
//! the receive buffers a multi-packet SEND fills, a send queue's SGEs, a
//! READ's or atomic's result buffer — holds a [`MemRef`] (table slot plus
//! the slot's generation) and an offset, and translates through the table
//! at the moment of each access with [`MrTable::host`]. Deregistration
//! empties the slot, so every later translation of that reference fails and
//! the work fails the way IBA says (remote access NAK, local protection
//! error); the generation makes a reused slot a different region. Hence the
//! guarantee the verbs layer builds on: once [`MrTable::deregister`]
//! returns, the core never again hands the region's addresses to
//! [`Memory`], nor into a [`crate::Transmit`] built after it.

mod guarded;
mod keys;
mod rereg;
mod window;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub use guarded::GuardedMemory;
use keys::IssuedKeys;
pub use keys::KeySource;
pub use rereg::{Rereg, Translation};
pub use window::{Mw, MwBind, MwBindError, MwId, MwType, MAX_MW};

use crate::qp::attr::AccessFlags;

/// An access to memory that is not there: not mapped, or not with the
/// access it needs. Only an access to a [checked](Mr::checked) region can
/// end this way; every other region's memory is the registrant's promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault;

/// Byte access to registered memory at addresses the core has validated.
///
/// The infallible calls are for regions whose memory the registrant
/// promised to keep (every region but an implicit one). The `_checked`
/// calls are for [checked](Mr::checked) regions, where a peer or an SGE may
/// name any address at all: they must fail with [`Fault`], never fault the
/// process, when the memory is not there.
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
    /// Store `bytes` at an 8-byte aligned `addr` as one 64-bit word, atomic
    /// with respect to the other atomics and to aligned 64-bit loads (RDMA
    /// ATOMIC WRITE).
    fn store_u64(&mut self, addr: u64, bytes: [u8; 8]);
    /// [`Memory::read`] of memory that may not be mapped readable: all of
    /// `out` is copied, or [`Fault`].
    fn read_checked(&self, addr: u64, out: &mut [u8]) -> Result<(), Fault>;
    /// [`Memory::write`] of memory that may not be mapped writable: all of
    /// `data` lands, or [`Fault`] (some bytes may have landed, as a DMA
    /// that faults midway leaves them).
    fn write_checked(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault>;
    /// [`Memory::compare_swap`] on a word that may not be mapped readable
    /// and writable.
    fn compare_swap_checked(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, Fault>;
    /// [`Memory::fetch_add`] on a word that may not be mapped.
    fn fetch_add_checked(&mut self, addr: u64, add: u64) -> Result<u64, Fault>;
    /// [`Memory::store_u64`] on a word that may not be mapped writable.
    fn store_u64_checked(&mut self, addr: u64, bytes: [u8; 8]) -> Result<(), Fault>;
}

/// Where a translated range is in the owner's address space, and whether
/// it must be reached through [`Memory`]'s checked calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub addr: u64,
    /// The range is in a [checked](Mr::checked) region.
    pub checked: bool,
}

impl Host {
    /// Copy `out.len()` bytes from here.
    pub fn read(self, mem: &impl Memory, out: &mut [u8]) -> Result<(), Fault> {
        if self.checked {
            mem.read_checked(self.addr, out)
        } else {
            mem.read(self.addr, out);
            Ok(())
        }
    }

    /// Copy `data` here.
    pub fn write(self, mem: &mut impl Memory, data: &[u8]) -> Result<(), Fault> {
        if self.checked {
            mem.write_checked(self.addr, data)
        } else {
            mem.write(self.addr, data);
            Ok(())
        }
    }

    /// 64-bit compare-and-swap here; returns the previous value.
    pub fn compare_swap(
        self,
        mem: &mut impl Memory,
        compare: u64,
        swap: u64,
    ) -> Result<u64, Fault> {
        if self.checked {
            mem.compare_swap_checked(self.addr, compare, swap)
        } else {
            Ok(mem.compare_swap(self.addr, compare, swap))
        }
    }

    /// 64-bit fetch-and-add here; returns the previous value.
    pub fn fetch_add(self, mem: &mut impl Memory, add: u64) -> Result<u64, Fault> {
        if self.checked {
            mem.fetch_add_checked(self.addr, add)
        } else {
            Ok(mem.fetch_add(self.addr, add))
        }
    }

    /// Store one 64-bit word here (ATOMIC WRITE).
    pub fn store_u64(self, mem: &mut impl Memory, bytes: [u8; 8]) -> Result<(), Fault> {
        if self.checked {
            mem.store_u64_checked(self.addr, bytes)
        } else {
            mem.store_u64(self.addr, bytes);
            Ok(())
        }
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// One registration, as work that outlives a call holds it: its table slot
/// and the slot's generation when it was registered. It never dangles: once
/// the registration is gone, [`MrTable::host`] refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemRef {
    slot: u32,
    /// 0 is no registration's (generations start at 1).
    gen: u32,
}

/// `len` bytes at byte offset `off` of a registration: a scatter/gather
/// entry as a work queue keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub mem: MemRef,
    pub off: u64,
    pub len: u32,
}

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
    /// Memory windows bound to it; it cannot be deregistered while any is.
    pub windows: u32,
    /// An implicit on-demand region (`ibv_reg_mr(pd, NULL, SIZE_MAX,
    /// IBV_ACCESS_ON_DEMAND)`): the whole address space, mapped or not.
    /// Nothing promises its memory is there, so every byte of it moves
    /// through [`Memory`]'s checked calls (copied, never handed to an IO
    /// layer as a [`crate::transmit::Seg`]), and a missing page ends the
    /// access the way IBA ends one outside a region.
    pub checked: bool,
}

impl Mr {
    /// Translate `[iova, iova + len)` to a host address if it lies inside.
    pub fn translate(&self, iova: u64, len: u64) -> Option<u64> {
        let off = self.offset_of(iova, len)?;
        Some(self.host_addr + off)
    }

    /// The byte offset of `[iova, iova + len)` in the region, if inside.
    fn offset_of(&self, iova: u64, len: u64) -> Option<u64> {
        let off = iova.checked_sub(self.iova)?;
        let end = off.checked_add(len)?;
        (end <= self.len).then_some(off)
    }
}

/// Why a remote access was refused; each maps to a NAK and a completion
/// status on the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccessError {
    /// No region has this rkey.
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

/// Bytes of one table slot (a region's or a window's).
#[cfg(test)]
const SLOT_BYTES: usize = 72;

/// Regions per context. A slot costs nothing until used; a live region
/// costs its slot (72 bytes, kept for reuse after it is deregistered), two
/// key-map entries (16 bytes plus hash table slack: 18–40) and 4–8 bytes of
/// issued-key record that outlive it (see `keys`): about 95–120 bytes.
pub const MAX_MR: usize = 1 << 20;

/// How many draws a key may take before the source is declared broken
/// (a healthy 32-bit source collides with probability < 2^-11 per draw even
/// with 2^21 keys issued; 64 collisions in a row mean it repeats itself).
const MAX_DRAWS: usize = 64;

/// Hashes a key by one multiplication. Keys are uniformly random and only
/// the table inserts them, so a peer choosing which keys to look up cannot
/// lengthen any probe sequence: a keyed hash would buy nothing.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, k: u32) {
        self.0 = (k as u64 | (k as u64) << 32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type KeyMap = HashMap<u32, u32, BuildHasherDefault<KeyHasher>>;

#[derive(Debug)]
struct Slot {
    /// Bumped each time the slot takes a new registration, and each time a
    /// window in it is bound or invalidated: a reference taken before no
    /// longer translates.
    gen: u32,
    obj: Option<Obj>,
}

#[derive(Debug, Clone, Copy)]
enum Obj {
    Mr(Mr),
    Mw(Mw),
}

impl Slot {
    fn mr(&self) -> Option<&Mr> {
        match &self.obj {
            Some(Obj::Mr(m)) => Some(m),
            _ => None,
        }
    }
}

/// The memory regions of one device context.
#[derive(Debug, Default)]
pub struct MrTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Every live region's lkey and rkey, to its slot.
    by_key: KeyMap,
    /// Every live window's [`MwId`] (its rkeys' upper 24 bits), to its slot.
    mws: KeyMap,
    issued: IssuedKeys,
    /// The upper 24 bits of every memory window's rkeys, ever (a window's
    /// rkeys differ only in the 8 bits its consumer picks).
    mw_prefixes: std::collections::HashSet<u32, BuildHasherDefault<KeyHasher>>,
    source: KeySource,
    live: usize,
    live_mws: usize,
}

impl MrTable {
    /// A table whose keys come from `source`.
    pub fn new(source: KeySource) -> MrTable {
        MrTable {
            source,
            ..Default::default()
        }
    }

    /// A key never issued before (and not 0, which verbs callers use for
    /// "no key"); recorded as issued.
    fn draw_key(&mut self) -> Result<u32, crate::Error> {
        for _ in 0..MAX_DRAWS {
            let k = self.source.draw();
            if k != 0 && !self.mw_prefixes.contains(&(k >> 8)) && self.issued.insert(k) {
                return Ok(k);
            }
        }
        Err(crate::Error::OutOfResources(
            "memory keys (the key source keeps repeating itself)",
        ))
    }

    /// Keys issued over the table's lifetime.
    pub fn keys_issued(&self) -> u64 {
        self.issued.len()
    }

    fn alloc_slot(&mut self) -> u32 {
        match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { gen: 0, obj: None });
                (self.slots.len() - 1) as u32
            }
        }
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
        self.insert(pd, iova, host_addr, len, access, false)
    }

    /// Register an implicit on-demand region: every address of the owner's
    /// address space, at iova = host address, [checked](Mr::checked) on
    /// each access. Returns its (lkey, rkey).
    pub fn register_implicit(
        &mut self,
        pd: PdId,
        access: AccessFlags,
    ) -> Result<(u32, u32), crate::Error> {
        self.insert(pd, 0, 0, u64::MAX, access, true)
    }

    fn insert(
        &mut self,
        pd: PdId,
        iova: u64,
        host_addr: u64,
        len: u64,
        access: AccessFlags,
        checked: bool,
    ) -> Result<(u32, u32), crate::Error> {
        access
            .validate_for_mr()
            .map_err(crate::Error::InvalidAccess)?;
        if iova.checked_add(len).is_none() || host_addr.checked_add(len).is_none() {
            return Err(crate::Error::InvalidArgument(
                "memory region wraps the address space",
            ));
        }
        if self.live >= MAX_MR {
            return Err(crate::Error::OutOfResources("memory regions"));
        }
        let lkey = self.draw_key()?;
        let rkey = self.draw_key()?;
        let idx = self.alloc_slot();
        let s = &mut self.slots[idx as usize];
        s.gen += 1;
        s.obj = Some(Obj::Mr(Mr {
            pd,
            iova,
            host_addr,
            len,
            access,
            lkey,
            rkey,
            windows: 0,
            checked,
        }));
        self.by_key.insert(lkey, idx);
        self.by_key.insert(rkey, idx);
        self.live += 1;
        Ok((lkey, rkey))
    }

    /// Remove the region whose lkey is `lkey`. From the moment this returns
    /// no reference to it translates: the core will not touch its memory.
    pub fn deregister(&mut self, lkey: u32) -> Result<Mr, crate::Error> {
        let (idx, mr) = self.lookup(lkey).filter(|(_, m)| m.lkey == lkey).ok_or(
            crate::Error::InvalidArgument("no memory region has this lkey"),
        )?;
        if mr.windows > 0 {
            // rxe refuses too: a bound window would outlive its memory.
            return Err(crate::Error::Busy(
                "memory region (memory windows are bound to it)",
            ));
        }
        self.by_key.remove(&mr.lkey);
        self.by_key.remove(&mr.rkey);
        self.release_slot(idx);
        self.live -= 1;
        Ok(mr)
    }

    fn release_slot(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        s.obj = None;
        // A slot whose generation would wrap is retired rather than let a
        // reference from 2^32 registrations ago match again.
        if s.gen < u32::MAX - 1 {
            self.free.push(idx);
        }
    }

    #[inline]
    fn lookup(&self, key: u32) -> Option<(u32, Mr)> {
        let idx = *self.by_key.get(&key)?;
        let mr = *self.slots[idx as usize].mr()?;
        Some((idx, mr))
    }

    fn mem_ref(&self, idx: u32) -> MemRef {
        MemRef {
            slot: idx,
            gen: self.slots[idx as usize].gen,
        }
    }

    /// Live regions.
    pub fn iter(&self) -> impl Iterator<Item = &Mr> {
        self.slots.iter().filter_map(|s| s.mr())
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Look up a region by lkey.
    pub fn get_by_lkey(&self, lkey: u32) -> Option<&Mr> {
        let idx = *self.by_key.get(&lkey)?;
        self.slots[idx as usize].mr().filter(|m| m.lkey == lkey)
    }

    /// The host address of `[off, off + len)` of the registration `r`, if
    /// it is still registered — the one translation every access of queued
    /// work goes through. A zero-length range translates to 0, which no
    /// caller dereferences (there are no bytes to move).
    #[inline]
    pub fn host(&self, r: MemRef, off: u64, len: u64) -> Option<u64> {
        self.locate(r, off, len).map(|h| h.addr)
    }

    /// [`MrTable::host`], with whether the region is [checked](Mr::checked):
    /// what every access of the core goes through.
    #[inline]
    /// The region `r` refers to, if it is a live region (not a window).
    pub fn by_ref(&self, r: MemRef) -> Option<&Mr> {
        let s = self.slots.get(r.slot as usize)?;
        if s.gen != r.gen {
            return None;
        }
        match s.obj.as_ref()? {
            Obj::Mr(mr) => Some(mr),
            Obj::Mw(_) => None,
        }
    }

    pub fn locate(&self, r: MemRef, off: u64, len: u64) -> Option<Host> {
        if len == 0 {
            return Some(Host {
                addr: 0,
                checked: false,
            });
        }
        let s = self.slots.get(r.slot as usize)?;
        if s.gen != r.gen {
            return None;
        }
        let end = off.checked_add(len)?;
        match s.obj.as_ref()? {
            Obj::Mr(mr) => (end <= mr.len).then(|| Host {
                addr: mr.host_addr + off,
                checked: mr.checked,
            }),
            Obj::Mw(mw) => {
                let b = mw.binding.as_ref()?;
                if end > b.len {
                    return None;
                }
                // Through the window to its region, which must still be
                // the one it was bound to.
                self.locate(b.mr, b.mr_off + off, len)
            }
        }
    }

    /// Validate a remote access; returns the registration and the offset of
    /// `va` in it, for [`MrTable::host`].
    ///
    /// A zero-length access touches no memory, and IBA (C9-88) says its
    /// R_Key and VA are not validated — a zero-byte RDMA WRITE (with
    /// immediate, typically) or READ need not carry either, and rxe and mlx5
    /// accept one with rkey 0. It resolves to no registration.
    ///
    /// `qpn` is the QP the request arrived on: a type-2 window admits only
    /// the QP it was bound through.
    pub fn resolve_remote(
        &self,
        qpn: u32,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(MemRef, u64), RemoteAccessError> {
        if len == 0 {
            return Ok((MemRef::default(), 0));
        }
        // Regions' keys and windows' 24-bit prefixes never overlap (see
        // `draw_key`), so at most one of the two lookups can hit.
        let Some(&idx) = self.by_key.get(&rkey) else {
            let (idx, w) = self.window(rkey).ok_or(RemoteAccessError::BadRkey)?;
            let off = w.resolve(qpn, pd, va, len, need)?;
            return Ok((self.mem_ref(idx), off));
        };
        let mr = match self.slots[idx as usize].obj {
            Some(Obj::Mr(m)) if m.rkey == rkey => m,
            _ => return Err(RemoteAccessError::BadRkey),
        };
        if mr.pd != pd {
            return Err(RemoteAccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(RemoteAccessError::AccessDenied);
        }
        let off = mr
            .offset_of(va, len)
            .ok_or(RemoteAccessError::OutOfBounds)?;
        Ok((self.mem_ref(idx), off))
    }

    /// Validate a local SGE; returns it as a [`Span`] of its region.
    #[inline]
    pub fn resolve_local(
        &self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u32,
        need: AccessFlags,
    ) -> Result<Span, LocalAccessError> {
        let (idx, mr) = self
            .lookup(lkey)
            .filter(|(_, m)| m.lkey == lkey)
            .ok_or(LocalAccessError::BadLkey)?;
        if mr.pd != pd {
            return Err(LocalAccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(LocalAccessError::AccessDenied);
        }
        let off = if len == 0 {
            0
        } else {
            mr.offset_of(addr, len as u64)
                .ok_or(LocalAccessError::OutOfBounds)?
        };
        Ok(Span {
            mem: self.mem_ref(idx),
            off,
            len,
        })
    }

    /// Validate a local SGE and translate it to a host address now.
    pub fn check_local(
        &self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Host, LocalAccessError> {
        let len32 = u32::try_from(len).map_err(|_| LocalAccessError::OutOfBounds)?;
        let s = self.resolve_local(pd, lkey, addr, len32, need)?;
        let mr = self.slots[s.mem.slot as usize].mr().expect("just resolved");
        Ok(Host {
            addr: mr.host_addr + s.off,
            checked: mr.checked,
        })
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
    fn store_u64(&mut self, addr: u64, bytes: [u8; 8]) {
        self.slice_mut(addr, 8).copy_from_slice(&bytes);
    }
    // Outside the vector is "not mapped".
    fn read_checked(&self, addr: u64, out: &mut [u8]) -> Result<(), Fault> {
        let r = self.checked_range(addr, out.len())?;
        out.copy_from_slice(&self.bytes[r]);
        Ok(())
    }
    fn write_checked(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let r = self.checked_range(addr, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
    fn compare_swap_checked(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, Fault> {
        self.checked_range(addr, 8)?;
        Ok(self.compare_swap(addr, compare, swap))
    }
    fn fetch_add_checked(&mut self, addr: u64, add: u64) -> Result<u64, Fault> {
        self.checked_range(addr, 8)?;
        Ok(self.fetch_add(addr, add))
    }
    fn store_u64_checked(&mut self, addr: u64, bytes: [u8; 8]) -> Result<(), Fault> {
        self.checked_range(addr, 8)?;
        self.store_u64(addr, bytes);
        Ok(())
    }
}

impl VecMemory {
    /// The bytes of `[addr, addr + len)`, if all are in the vector.
    fn checked_range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, Fault> {
        let off = addr.checked_sub(self.base).ok_or(Fault)?;
        let end = off.checked_add(len as u64).ok_or(Fault)?;
        if end > self.bytes.len() as u64 {
            return Err(Fault);
        }
        Ok(off as usize..end as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_as_small_as_the_docs_say() {
        assert_eq!(std::mem::size_of::<Slot>(), SLOT_BYTES);
    }

    #[test]
    fn a_reused_slot_is_a_different_registration() {
        let mut t = MrTable::new(KeySource::seeded(1));
        let rw = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
        let (l, r) = t.register(PdId(1), 0x1000, 0x1000, 64, rw).unwrap();
        let (old, off) = t
            .resolve_remote(0, PdId(1), r, 0x1010, 8, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!((t.host(old, off, 8), off), (Some(0x1010), 0x10));
        t.deregister(l).unwrap();
        assert_eq!(t.host(old, off, 8), None);
        let (_, r2) = t.register(PdId(1), 0x1000, 0x9000, 64, rw).unwrap();
        let (new, _) = t
            .resolve_remote(0, PdId(1), r2, 0x1010, 8, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!(new.slot, old.slot, "the slot is reused");
        assert_eq!(t.host(old, off, 8), None, "the old reference stays dead");
        assert_eq!(t.host(new, off, 8), Some(0x9010));
        assert_eq!(t.host(new, 60, 8), None, "bounds are checked per access");
    }
}
