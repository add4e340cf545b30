//! Memory windows (IBA 10.6.7, as rxe implements them in `rxe_mw.c`): a
//! window grants remote access to part of a region under its own rkey,
//! bounded to the window, and can be revoked without touching the region.
//!
//! * **Type 1** windows are bound through `ibv_bind_mw` (which posts a bind
//!   work request) and stay bound until rebound or deallocated; they are not
//!   invalidatable and not zero-based (o10-36.2.2).
//! * **Type 2** windows are bound by a `BIND_MW` send work request to the
//!   QP that posted it — only that QP's requests may use the rkey — and are
//!   freed again by `LOCAL_INV` or a peer's `SEND_WITH_INV`.
//!
//! A window lives in a region-table slot of its own. Its rkeys share their
//! upper 24 bits, drawn from the key source at allocation and never used
//! for any other key; the low 8 bits are the consumer's (`ibv_inc_rkey`).
//! Those 24 bits are the window's [`MwId`], the handle that names it for
//! deallocation and queries whatever binds do to its rkey (rxe finds a
//! window the same way, by the rkey's index bits). Binds and
//! invalidations name it by its full current rkey, which must match, as
//! rxe requires (`mw->rkey != mw_rkey` is `-EINVAL`, a `MW_BIND_ERR`).
//! Every bind and invalidation bumps the slot's generation, so an access in
//! flight through the old binding translates no more. Translation goes
//! through the window to its region's own slot, so it also fails once the
//! region is gone (which `deregister` refuses while windows are bound).

use super::{MemRef, MrTable, Obj, PdId, RemoteAccessError, Slot};
use crate::qp::attr::AccessFlags;

/// Windows per context.
pub const MAX_MW: usize = 1 << 16;

/// A memory window's handle: the upper 24 bits every rkey of the window
/// has. Stable for the window's life; never another window's, since no key
/// ever issued shares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwId(u32);

impl MwId {
    /// The window an rkey would belong to (if any window has it).
    pub fn of_rkey(rkey: u32) -> MwId {
        MwId(rkey >> 8)
    }

    /// Whether `rkey` is one of this window's rkeys (any consumer key).
    pub fn owns(self, rkey: u32) -> bool {
        rkey >> 8 == self.0
    }
}

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    Type1 = 1,
    Type2 = 2,
}

/// A memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mw {
    pub pd: PdId,
    pub kind: MwType,
    /// The current rkey.
    pub rkey: u32,
    pub(super) binding: Option<Binding>,
}

/// What a bound window grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Binding {
    /// The region, and where in it the window starts.
    pub mr: MemRef,
    pub mr_lkey: u32,
    pub mr_off: u64,
    /// The window's first byte as remote peers address it (0 when zero-based).
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
    /// Type 2: the QP it was bound through.
    pub qpn: Option<u32>,
}

/// `struct ibv_mw_bind_info` plus the window and its new rkey: what a bind
/// work request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current rkey: it names the window (its upper 24 bits)
    /// and must be the rkey the window has when the bind executes.
    pub mw_rkey: u32,
    /// Its rkey after the bind: only the low 8 bits are taken (the upper 24
    /// are the window's).
    pub new_rkey: u32,
    /// The region to bind to (ignored when `len` is 0: a type-1 unbind).
    pub mr_lkey: u32,
    /// The window's first byte in the region's iova space.
    pub addr: u64,
    pub len: u64,
    /// `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`, `ZERO_BASED`;
    /// `LOCAL_WRITE` is accepted and grants nothing (rxe and mlx5 take it,
    /// and rdma-core's tests pass it).
    pub access: AccessFlags,
}

/// Why a bind was refused (it completes with `IBV_WC_MW_BIND_ERR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwBindError {
    NoSuchWindow,
    /// The bind names the window by an rkey it no longer has (rxe:
    /// `mw->rkey != mw_rkey`).
    StaleRkey,
    NoSuchRegion,
    /// A type-1 window cannot be zero-based (o10-36.2.2).
    ZeroBasedType1,
    /// A type-2 window must be free, i.e. invalidated, to bind (o10-37.2.30).
    NotFree,
    /// A type-2 window binds only to a QP of its own PD (C10-72), and the
    /// region must be in the window's PD.
    WrongPd,
    /// A type-2 window must be bound to a region with a length (o10-37.2.40).
    ZeroLength,
    /// The region was not registered with `MW_BIND` (C10-73).
    NoBindAccess,
    /// Remote write or atomic through a region without `LOCAL_WRITE` (C10-74).
    NoLocalWrite,
    /// The window does not fit in the region (C10-75).
    OutOfBounds,
    /// Access bits a window cannot have.
    BadAccess,
}

impl Mw {
    /// Resolve a remote access through the window: the offset of `va` in it.
    pub(super) fn resolve(
        &self,
        qpn: u32,
        pd: PdId,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<u64, RemoteAccessError> {
        // rxe_lookup_mw: bound, same PD, for type 2 the binding QP.
        let b = self.binding.as_ref().ok_or(RemoteAccessError::BadRkey)?;
        if self.pd != pd || b.qpn.is_some_and(|q| q != qpn) {
            return Err(RemoteAccessError::WrongPd);
        }
        if !b.access.contains(need) {
            return Err(RemoteAccessError::AccessDenied);
        }
        let off = if b.access.contains(AccessFlags::ZERO_BASED) {
            va
        } else {
            va.checked_sub(b.addr)
                .ok_or(RemoteAccessError::OutOfBounds)?
        };
        let end = off.checked_add(len).ok_or(RemoteAccessError::OutOfBounds)?;
        if end > b.len {
            return Err(RemoteAccessError::OutOfBounds);
        }
        Ok(off)
    }
}

impl MrTable {
    /// The window whose current rkey is exactly `rkey`.
    pub(super) fn window(&self, rkey: u32) -> Option<(u32, Mw)> {
        let (idx, w) = self.window_by_id(MwId::of_rkey(rkey))?;
        (w.rkey == rkey).then_some((idx, w))
    }

    fn window_by_id(&self, id: MwId) -> Option<(u32, Mw)> {
        let idx = *self.mws.get(&id.0)?;
        match self.slots[idx as usize].obj {
            Some(Obj::Mw(w)) => Some((idx, w)),
            _ => None,
        }
    }

    /// The window `id` names (`ibv_mw`'s state: PD, type, current rkey).
    pub fn get_mw(&self, id: MwId) -> Option<&Mw> {
        let idx = *self.mws.get(&id.0)?;
        match &self.slots[idx as usize].obj {
            Some(Obj::Mw(w)) => Some(w),
            _ => None,
        }
    }

    /// Allocate a window (`ibv_alloc_mw`); returns its handle and first
    /// rkey. A new type-1 window is valid but grants nothing until bound; a
    /// type-2 one is free.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> Result<(MwId, u32), crate::Error> {
        if self.live_mws >= MAX_MW {
            return Err(crate::Error::OutOfResources("memory windows"));
        }
        let rkey = self.draw_window_key()?;
        let idx = self.alloc_slot();
        let s = &mut self.slots[idx as usize];
        s.gen += 1;
        s.obj = Some(Obj::Mw(Mw {
            pd,
            kind,
            rkey,
            binding: None,
        }));
        let id = MwId::of_rkey(rkey);
        self.mws.insert(id.0, idx);
        self.live_mws += 1;
        Ok((id, rkey))
    }

    /// An rkey whose upper 24 bits no key ever had; they are then the
    /// window's for good.
    fn draw_window_key(&mut self) -> Result<u32, crate::Error> {
        for _ in 0..super::MAX_DRAWS {
            let k = self.source.draw();
            let prefix = k >> 8;
            if prefix != 0
                && !self.issued.any_with_prefix(prefix)
                && self.mw_prefixes.insert(prefix)
            {
                return Ok(k);
            }
        }
        Err(crate::Error::OutOfResources(
            "memory keys (the key source keeps repeating itself)",
        ))
    }

    /// Deallocate a window (`ibv_dealloc_mw`), bound or not.
    pub fn dealloc_mw(&mut self, id: MwId) -> Result<(), crate::Error> {
        let (idx, w) = self.window_by_id(id).ok_or(crate::Error::InvalidArgument(
            "no memory window has this handle",
        ))?;
        self.unbind(&w);
        self.mws.remove(&id.0);
        self.release_slot(idx);
        self.live_mws -= 1;
        Ok(())
    }

    /// Drop a binding's hold on its region.
    fn unbind(&mut self, w: &Mw) {
        let Some(b) = w.binding else { return };
        if let Some(Slot {
            obj: Some(Obj::Mr(mr)),
            ..
        }) = self.slots.get_mut(b.mr.slot as usize)
        {
            if mr.lkey == b.mr_lkey {
                mr.windows -= 1;
            }
        }
    }

    /// Store a window back with a new generation: references through what
    /// it was no longer translate.
    fn replace_window(&mut self, idx: u32, w: Mw) -> Result<(), ()> {
        let s = &mut self.slots[idx as usize];
        s.gen = s.gen.checked_add(1).filter(|&g| g < u32::MAX).ok_or(())?;
        s.obj = Some(Obj::Mw(w));
        Ok(())
    }

    /// Execute a bind (rxe's `rxe_check_bind_mw` and `rxe_do_bind_mw`) for
    /// a bind work request posted on QP `qpn` of PD `qp_pd`. Returns the
    /// window's new rkey.
    pub fn bind_mw(&mut self, qpn: u32, qp_pd: PdId, b: &MwBind) -> Result<u32, MwBindError> {
        use MwBindError::*;
        let (idx, w) = self
            .window_by_id(MwId::of_rkey(b.mw_rkey))
            .ok_or(NoSuchWindow)?;
        if w.rkey != b.mw_rkey {
            return Err(StaleRkey);
        }
        let supported = AccessFlags::REMOTE_READ
            .union(AccessFlags::REMOTE_WRITE)
            .union(AccessFlags::REMOTE_ATOMIC)
            .union(AccessFlags::ZERO_BASED)
            .union(AccessFlags::LOCAL_WRITE);
        if !b.access.difference(supported).is_empty() {
            return Err(BadAccess);
        }
        let grants = b.access.difference(AccessFlags::LOCAL_WRITE);
        let zero_based = b.access.contains(AccessFlags::ZERO_BASED);
        match w.kind {
            MwType::Type1 if zero_based => return Err(ZeroBasedType1),
            MwType::Type2 if w.binding.is_some() => return Err(NotFree),
            MwType::Type2 if qp_pd != w.pd => return Err(WrongPd),
            MwType::Type2 if b.len == 0 => return Err(ZeroLength),
            _ => {}
        }
        let binding = if b.len == 0 {
            None // a type-1 window unbound
        } else {
            let (midx, mr) = self
                .lookup(b.mr_lkey)
                .filter(|(_, m)| m.lkey == b.mr_lkey)
                .ok_or(NoSuchRegion)?;
            if mr.pd != w.pd {
                return Err(WrongPd);
            }
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(NoBindAccess);
            }
            let writes = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_ATOMIC);
            if grants.intersects(writes) && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(NoLocalWrite);
            }
            let mr_off = mr.offset_of(b.addr, b.len).ok_or(OutOfBounds)?;
            Some(Binding {
                mr: self.mem_ref(midx),
                mr_lkey: mr.lkey,
                mr_off,
                addr: if zero_based { 0 } else { b.addr },
                len: b.len,
                access: grants,
                qpn: (w.kind == MwType::Type2).then_some(qpn),
            })
        };
        let rkey = (w.rkey & !0xff) | (b.new_rkey & 0xff);
        let next = Mw { rkey, binding, ..w };
        self.replace_window(idx, next).map_err(|()| NoSuchWindow)?;
        self.unbind(&w);
        if let Some(b) = binding {
            if let Some(Slot {
                obj: Some(Obj::Mr(mr)),
                ..
            }) = self.slots.get_mut(b.mr.slot as usize)
            {
                mr.windows += 1;
            }
        }
        Ok(rkey)
    }

    /// Invalidate a type-2 window's rkey — a `LOCAL_INV` posted in `pd`, or
    /// a `SEND_WITH_INV` arriving on a QP of `pd` (rxe's
    /// `rxe_invalidate_mw`). Ordinary regions are not invalidatable (only
    /// fast-registered ones are, which this device does not have; rxe's
    /// `rxe_invalidate_mr` refuses a user MR), nor are type-1 windows
    /// (o10-37.2.26). Returns false when `rkey` names nothing it may
    /// invalidate.
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: u32) -> bool {
        let Some((idx, w)) = self.window(rkey) else {
            return false;
        };
        if w.kind != MwType::Type2 || w.binding.is_none() || w.pd != pd {
            return false;
        }
        if self.replace_window(idx, Mw { binding: None, ..w }).is_err() {
            return false;
        }
        self.unbind(&w);
        true
    }
}
