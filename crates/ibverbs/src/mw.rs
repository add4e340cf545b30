//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`, the
//! `IBV_WR_BIND_MW` and `IBV_WR_LOCAL_INV` work requests) and
//! `ibv_rereg_mr`.
//!
//! The three window verbs are static inline functions in verbs.h that call
//! `context->ops.alloc_mw`/`bind_mw`/`dealloc_mw`; `ibv_rereg_mr` is an
//! export. Each checks its arguments as rdma-core and rxe do (window type,
//! bind range inside the region, the region's MW_BIND and LOCAL_WRITE, the
//! window's access bits, PDs; rereg's flag combinations, a live PD, the
//! pages of a new translation) and then calls softrdma-verbs.
//!
//! **Window keys as rxe's provider keeps them.** A window is named below by
//! its stable handle (`softrdma_verbs::Mw`), so deallocation never depends
//! on the rkey. `ibv_mw.rkey` is the application's record of the current
//! rkey, and binds name the window by it (the core refuses a bind whose
//! rkey the window no longer has: `MW_BIND_ERR`, as rxe): `ibv_bind_mw`
//! (type 1) moves it on by `ibv_inc_rkey` when it posts the bind, as rxe's
//! `rxe_bind_mw` does; for type 2, `IBV_WR_BIND_MW` carries the new rkey
//! in `wr.bind_mw.rkey` and the application updates `ibv_mw.rkey` itself.
//!
//! **Rereg** keeps the lkey and rkey (as rxe, and mlx5 when it rewrites a
//! translation in place); work posted before it fails as if the region had
//! been deregistered (see the core's `mr::rereg`).

use std::os::raw::{c_int, c_void};

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{errno_ret, null_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

crate::symver! {
    "IBVERBS_1.1":
        ibv_rereg_mr;
}

/// The access bits a window may grant (rxe_check_bind_mw: remote access and
/// zero-based addressing). `LOCAL_WRITE` is accepted and grants nothing:
/// rxe and mlx5 take it, and rdma-core's own tests pass it.
const MW_ACCESS: u32 = IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_ZERO_BASED
    | IBV_ACCESS_LOCAL_WRITE;

fn mw_type(t: u32) -> Res<sv::MwType> {
    match t {
        IBV_MW_TYPE_1 => Ok(sv::MwType::Type1),
        IBV_MW_TYPE_2 => Ok(sv::MwType::Type2),
        _ => Err(Fail::inval(format!(
            "memory window type {t} does not exist (IBV_MW_TYPE_1 or IBV_MW_TYPE_2)"
        ))),
    }
}

/// `ops.alloc_mw` (`ibv_alloc_mw`).
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type_: u32) -> *mut ibv_mw {
    null_ret("ibv_alloc_mw", || {
        let p = Pd::from_c(pd)?;
        let held = p.users.hold()?;
        let w = p.sv.alloc_mw(mw_type(mw_type_)?)?;
        let c = ibv_mw {
            // SAFETY: our own slot, live while `p` is.
            context: unsafe { (*p.c_ptr()).context },
            pd,
            rkey: w.rkey(),
            handle: w.rkey() >> 8,
            type_: mw_type_,
        };
        held.keep();
        Ok(Mw::into_c(Mw::new(c, w, mw_type_)))
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`), bound or not.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    errno_ret("ibv_dealloc_mw", || {
        let w = Mw::take(mw)?;
        // SAFETY: our own slot, live while `w` is.
        if let Ok(p) = Pd::from_c(unsafe { (*w.c_ptr()).pd }) {
            p.users.sub();
        }
        drop(w);
        Ok(())
    })
}

/// Check what a bind asks for, as rxe_check_bind_mw does, and post it on
/// `q` for window `w` (named by `mw_rkey`, given `new_rkey`); returns the
/// rkey the window will have.
fn post_bind(
    q: &Qp,
    w: &Mw,
    info: &ibv_mw_bind_info,
    mw_rkey: u32,
    new_rkey: u32,
    wr_id: u64,
    send_flags: u32,
) -> Res<u32> {
    if q.qp_type == sv::QpType::Ud {
        return Err(Fail::inval("a UD QP cannot bind memory windows"));
    }
    if info.mw_access_flags & !MW_ACCESS != 0 {
        return Err(Fail::inval(format!(
            "mw_access_flags {:#x}: a window grants only REMOTE_READ, REMOTE_WRITE, \
             REMOTE_ATOMIC and ZERO_BASED",
            info.mw_access_flags
        )));
    }
    let flags = sv::SendFlags(send_flags & IBV_SEND_FLAGS_KNOWN);
    let access = sv::AccessFlags::from_bits_retain(info.mw_access_flags);
    // SAFETY: our own slot, live while `w` is.
    let mw_pd = unsafe { (*w.c_ptr()).pd };
    let wr = |mr, offset, len| sv::MwBindWr {
        wr_id,
        flags,
        mw_rkey,
        new_rkey,
        mr,
        offset,
        len,
        access,
    };
    if info.mr.is_null() {
        if info.length != 0 || info.addr != 0 {
            return Err(Fail::inval(
                "bind_info.mr is NULL but addr or length is not 0",
            ));
        }
        return Ok(q.sv.post_bind_mw(&w.sv, &wr(None, 0, 0))?);
    }
    let m = Mr::from_c(info.mr)?;
    // Held across the post, so a concurrent ibv_rereg_mr cannot change the
    // region between these checks and the bind's validation.
    let st = m.lock();
    // SAFETY: our own slot, live while `m` is.
    if unsafe { (*m.c_ptr()).pd } != mw_pd {
        return Err(Fail::inval(
            "the region and the window are in different protection domains",
        ));
    }
    if st.access & IBV_ACCESS_MW_BIND == 0 {
        return Err(Fail::inval(
            "the region was not registered with IBV_ACCESS_MW_BIND",
        ));
    }
    if info.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && st.access & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(Fail::inval(
            "a window with REMOTE_WRITE or REMOTE_ATOMIC needs a region with LOCAL_WRITE",
        ));
    }
    let (start, len) = (st.sv.iova(), st.sv.len() as u64);
    let offset = info.addr.wrapping_sub(start);
    let inside = info.addr >= start && offset.checked_add(info.length).is_some_and(|e| e <= len);
    if info.length != 0 && !inside {
        return Err(Fail::inval(format!(
            "bind range {:#x}+{} is not inside the region {start:#x}+{len}",
            info.addr, info.length
        )));
    }
    let offset = if info.length == 0 { 0 } else { offset };
    Ok(q.sv.post_bind_mw(&w.sv, &wr(Some(&st.sv), offset, info.length))?)
}

/// `ops.bind_mw` (`ibv_bind_mw`: type 1 windows, bound by the QP as a work
/// request with `mw_bind->wr_id`). `mw->rkey` moves on when the bind is
/// posted, as rxe's provider moves it.
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    errno_ret("ibv_bind_mw", || {
        non_null!(mw_bind);
        let q = Qp::from_c(qp)?;
        let w = Mw::from_c(mw)?;
        if w.mw_type != IBV_MW_TYPE_1 {
            return Err(Fail::inval(
                "ibv_bind_mw binds type 1 windows; type 2 is bound with IBV_WR_BIND_MW",
            ));
        }
        // SAFETY: the application's readable ibv_mw_bind; our own slot.
        let (b, rkey) = unsafe { (&*mw_bind, (*w.c_ptr()).rkey) };
        if b.bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
            return Err(Fail::inval(
                "a type 1 window cannot be zero-based (IBA o10-36.2.2)",
            ));
        }
        let new = post_bind(
            &q,
            &w,
            &b.bind_info,
            rkey,
            sv::inc_rkey(rkey),
            b.wr_id,
            b.send_flags,
        )?;
        // SAFETY: our own slot; the field providers update (rxe_bind_mw).
        unsafe { (*w.c_ptr()).rkey = new };
        Ok(())
    })
}

/// `IBV_WR_BIND_MW` (type 2 windows) in `ibv_post_send`.
pub fn post_bind_wr(q: &Qp, wr: &ibv_send_wr) -> Res<()> {
    let b = wr.bind_mw;
    let w = Mw::from_c(b.mw)?;
    if w.mw_type != IBV_MW_TYPE_2 {
        return Err(Fail::inval(
            "IBV_WR_BIND_MW binds type 2 windows; type 1 is bound with ibv_bind_mw",
        ));
    }
    // SAFETY: our own slots.
    let (mw_pd, qp_pd, rkey) = unsafe { ((*w.c_ptr()).pd, (*q.c_ptr()).pd, (*w.c_ptr()).rkey) };
    // By the domains they stand for: a parent domain is its PD.
    let same = mw_pd == qp_pd
        || matches!((Pd::from_c(mw_pd), Pd::from_c(qp_pd)), (Ok(a), Ok(b)) if a.sv.id() == b.sv.id());
    if !same {
        return Err(Fail::inval(
            "a type 2 window is bound by a QP of its own protection domain",
        ));
    }
    post_bind(q, &w, &b.bind_info, rkey, b.rkey, wr.wr_id, wr.send_flags)?;
    Ok(())
}

/// `IBV_WR_LOCAL_INV` in `ibv_post_send`: invalidate a type-2 window's
/// rkey (`wr.invalidate_rkey`, which shares `imm_data`'s place). Any
/// scatter/gather list is ignored, as rxe ignores it.
pub fn post_local_inv(q: &Qp, wr: &ibv_send_wr) -> Res<()> {
    let swr = sv::SendWr {
        wr_id: wr.wr_id,
        op: sv::SendOp::LocalInv { rkey: wr.imm_data },
        sgl: &[],
        flags: sv::SendFlags(wr.send_flags & IBV_SEND_FLAGS_KNOWN),
        ud: None,
    };
    Ok(q.sv.post_send(&swr)?)
}

/// `ibv_rereg_mr`: 0, or `IBV_REREG_MR_ERR_INPUT` with errno set (the region
/// is unchanged).
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let r = errno_ret("ibv_rereg_mr", || {
        rereg(mr, flags, pd, addr, length, access)
    });
    if r == 0 {
        0
    } else {
        IBV_REREG_MR_ERR_INPUT
    }
}

fn rereg(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Res<()> {
    let m = Mr::from_c(mr)?;
    if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 || flags == 0 {
        return Err(Fail::inval(format!(
            "flags {flags:#x}: a combination of CHANGE_TRANSLATION (1), CHANGE_PD (2) \
             and CHANGE_ACCESS (4)"
        )));
    }
    if access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0 {
        return Err(Fail::inval(
            "access flags given without IBV_REREG_MR_CHANGE_ACCESS",
        ));
    }
    let mut st = m.lock();
    let c = m.c_ptr();
    // SAFETY: our own slot, live while `m` is; its fields change only
    // under `st`, which this call holds.
    let (old_addr, old_len, old_pd, context) =
        unsafe { ((*c).addr, (*c).length, (*c).pd, (*c).context) };
    let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let (new_addr, new_len) = if translate {
        if addr.is_null() || length == 0 {
            return Err(Fail::inval(
                "CHANGE_TRANSLATION needs a non-NULL addr and a non-zero length",
            ));
        }
        (addr, length)
    } else {
        (old_addr, old_len)
    };
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        let p = Pd::from_c(pd)?;
        // SAFETY: our own slot, live while `p` is.
        if unsafe { (*p.c_ptr()).context } != context {
            return Err(Fail::inval("the new PD belongs to another context"));
        }
        Some(p)
    } else {
        None
    };
    let bits = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        let bits = access as u32 & !IBV_ACCESS_OPTIONAL_RANGE;
        if bits & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
            && bits & IBV_ACCESS_LOCAL_WRITE == 0
        {
            return Err(Fail::inval(
                "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        Some(bits)
    } else {
        None
    };
    let eff = bits.unwrap_or(st.access);
    // The pages of the new translation (or the old one under new access),
    // as registration checks them.
    crate::pages::check(
        new_addr as u64,
        new_len as u64,
        crate::pages::needs_write(eff),
    )?;
    // The new PD counts the region before it moves there (a dealloc_pd
    // from now on is EBUSY, or has already refused this).
    let held = new_pd.as_ref().map(|p| p.users.hold()).transpose()?;
    let sv_pd = new_pd.as_ref().map(|p| &p.sv);
    let sv_access = bits.map(sv::AccessFlags::from_bits_retain);
    if translate {
        // SAFETY: verbs' contract for ibv_rereg_mr, as for ibv_reg_mr: the
        // new memory stays valid until the region is deregistered or
        // reregistered again and its work has completed. The old memory is
        // never touched once this returns (the core's rereg guarantee).
        unsafe {
            st.sv
                .rereg_raw(new_addr as u64, new_len, new_addr as u64, sv_pd, sv_access)?
        };
    } else {
        st.sv.rereg(sv_pd, sv_access)?;
    }
    st.access = eff;
    // What libibverbs updates after a successful rereg (the keys stay).
    // SAFETY: as above: our slot, under `st`.
    unsafe {
        (*c).addr = new_addr;
        (*c).length = new_len;
    }
    if let Some(held) = held {
        held.keep();
        if let Ok(old) = Pd::from_c(old_pd) {
            old.users.sub();
        }
        // SAFETY: as above.
        unsafe { (*c).pd = pd };
    }
    Ok(())
}
