//! Reregistration (`ibv_rereg_mr`): a region changes its protection domain,
//! its access rights or its translation (the memory behind it) in place and
//! keeps its lkey and rkey — as rxe keeps them (`rxe_rereg_user_mr`, which
//! changes PD and access) and as mlx5 keeps its mkey when it rewrites a
//! translation through UMR. A peer that holds the rkey reaches the new
//! region with it; nothing else has to be exchanged again.
//!
//! A reregistration is a new registration under the old keys: the slot's
//! generation moves on, so every reference taken before it — a posted
//! receive's buffer, a send queue's SGEs, a peer's WRITE or READ stream in
//! progress, a READ's result buffer — no longer translates, and that work
//! fails exactly as it would had the region been deregistered (remote
//! access NAK, `LOC_PROT_ERR`, a receive's remote operational error; see
//! DESIGN's table). Work posted afterwards is validated against the new
//! region. That is what rdma-core's `test_mr_rereg_addr` and
//! `test_mr_rereg_pd` expect of a receive posted before the change (the
//! sender sees `REM_OP_ERR`), and it keeps the deregistration guarantee:
//! once `reregister` returns, the old translation's memory is never touched
//! again.
//!
//! A region with bound memory windows is not reregistered (`Busy`): the
//! windows' translations go through the region, and IBA lists bound windows
//! among the reasons a reregistration fails.

use super::{Mr, MrTable, Obj, PdId};
use crate::qp::attr::AccessFlags;

/// The memory a region translates to after `CHANGE_TRANSLATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// The address remote peers and SGEs use for the first byte.
    pub iova: u64,
    /// Where the first byte is in the owner's address space.
    pub host_addr: u64,
    pub len: u64,
}

/// What a reregistration changes (`ibv_rereg_mr`'s `CHANGE_PD`,
/// `CHANGE_TRANSLATION`, `CHANGE_ACCESS`); `None` keeps that part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rereg {
    pub pd: Option<PdId>,
    pub translation: Option<Translation>,
    pub access: Option<AccessFlags>,
}

impl MrTable {
    /// Change the region whose lkey is `lkey` in place, keeping its keys;
    /// returns it as it now is. All or nothing: on error the region is as
    /// it was. From the moment this returns no reference taken before it
    /// translates (see the module docs).
    pub fn reregister(&mut self, lkey: u32, r: &Rereg) -> Result<Mr, crate::Error> {
        let (idx, mr) = self.lookup(lkey).filter(|(_, m)| m.lkey == lkey).ok_or(
            crate::Error::InvalidArgument("no memory region has this lkey"),
        )?;
        if *r == Rereg::default() {
            return Err(crate::Error::InvalidArgument(
                "reregistration changes nothing (give a PD, a translation or access flags)",
            ));
        }
        if mr.windows > 0 {
            return Err(crate::Error::Busy(
                "memory region (memory windows are bound to it)",
            ));
        }
        let mut next = mr;
        if let Some(a) = r.access {
            a.validate_for_mr().map_err(crate::Error::InvalidAccess)?;
            next.access = a;
        }
        if let Some(pd) = r.pd {
            next.pd = pd;
        }
        if let Some(t) = r.translation {
            if t.iova.checked_add(t.len).is_none() || t.host_addr.checked_add(t.len).is_none() {
                return Err(crate::Error::InvalidArgument(
                    "memory region wraps the address space",
                ));
            }
            next.iova = t.iova;
            next.host_addr = t.host_addr;
            next.len = t.len;
            // A translation names memory the registrant promises to keep:
            // an implicit region given one is an ordinary region from now.
            next.checked = false;
        }
        let idx = self.renew(idx);
        self.slots[idx as usize].obj = Some(Obj::Mr(next));
        Ok(next)
    }

    /// Give the region in slot `idx` a new generation, so that no earlier
    /// reference to it translates; returns the slot it is in now. A slot
    /// whose generation would wrap is retired (as `release_slot` retires
    /// it) and the region moves to another slot under the same keys.
    fn renew(&mut self, idx: u32) -> u32 {
        let s = &mut self.slots[idx as usize];
        if s.gen < u32::MAX - 1 {
            s.gen += 1;
            return idx;
        }
        let obj = s.obj.take();
        let n = self.alloc_slot();
        let ns = &mut self.slots[n as usize];
        ns.gen += 1;
        ns.obj = obj;
        if let Some(Obj::Mr(m)) = obj {
            self.by_key.insert(m.lkey, n);
            self.by_key.insert(m.rkey, n);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::super::KeySource;
    use super::*;

    const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

    #[test]
    fn keys_stay_and_old_references_die() {
        let mut t = MrTable::new(KeySource::seeded(3));
        let (l, r) = t
            .register(PdId(1), 0x1000, 0x1000, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let old = t
            .resolve_local(PdId(1), l, 0x1008, 8, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let change = Rereg {
            access: Some(RW),
            translation: Some(Translation {
                iova: 0x7000,
                host_addr: 0x9000,
                len: 128,
            }),
            ..Rereg::default()
        };
        let m = t.reregister(l, &change).unwrap();
        assert_eq!(
            (m.lkey, m.rkey, m.iova, m.host_addr, m.len),
            (l, r, 0x7000, 0x9000, 128)
        );
        assert_eq!(t.host(old.mem, old.off, 8), None, "posted before: dead");
        let (new, off) = t
            .resolve_remote(0, PdId(1), r, 0x7010, 8, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!(t.host(new, off, 8), Some(0x9010));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_refused_reregistration_changes_nothing() {
        let mut t = MrTable::new(KeySource::seeded(4));
        let (l, _) = t.register(PdId(1), 0x1000, 0x1000, 64, RW).unwrap();
        let before = *t.get_by_lkey(l).unwrap();
        let bad = Rereg {
            pd: Some(PdId(2)),
            access: Some(AccessFlags::REMOTE_WRITE), // without LOCAL_WRITE
            ..Rereg::default()
        };
        assert!(matches!(
            t.reregister(l, &bad),
            Err(crate::Error::InvalidAccess(_))
        ));
        let wraps = Rereg {
            translation: Some(Translation {
                iova: u64::MAX - 4,
                host_addr: 0,
                len: 8,
            }),
            ..Rereg::default()
        };
        assert!(t.reregister(l, &wraps).is_err());
        assert!(t.reregister(l, &Rereg::default()).is_err());
        assert!(t.reregister(l ^ 1, &wraps).is_err());
        assert_eq!(*t.get_by_lkey(l).unwrap(), before);
    }

    #[test]
    fn a_slot_at_the_end_of_its_generations_hands_the_region_on() {
        let mut t = MrTable::new(KeySource::seeded(5));
        let (l, r) = t.register(PdId(1), 0x1000, 0x1000, 64, RW).unwrap();
        let idx = t.by_key[&l];
        t.slots[idx as usize].gen = u32::MAX - 1;
        let old = t.mem_ref(idx);
        let change = Rereg {
            pd: Some(PdId(2)),
            ..Rereg::default()
        };
        t.reregister(l, &change).unwrap();
        let n = t.by_key[&l];
        assert_ne!(n, idx, "moved to another slot");
        assert_eq!(t.by_key[&r], n);
        assert!(!t.free.contains(&idx), "the worn-out slot is retired");
        assert_eq!(t.host(old, 0, 8), None);
        assert_eq!(t.get_by_lkey(l).unwrap().pd, PdId(2));
        t.deregister(l).unwrap();
        assert!(t.is_empty());
    }
}
