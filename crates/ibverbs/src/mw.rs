//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`, the
//! `IBV_WR_BIND_MW` and `IBV_WR_LOCAL_INV` work requests) and
//! `ibv_rereg_mr`.
//!
//! The three window verbs are static inline functions in verbs.h that call
//! `context->ops.alloc_mw`/`bind_mw`/`dealloc_mw`; `ibv_rereg_mr` is an
//! export. Their C side is complete here: the structures, the operations
//! table entries, and every argument check rdma-core and rxe make (window
//! type, bind range inside the region, the region's MW_BIND and LOCAL_WRITE,
//! the window's access bits, PDs; rereg's flag combinations, a live PD, the
//! pages of a new translation). What they wait for is below them: the core
//! has windows now (`Endpoint::alloc_mw`/`bind_mw`/`dealloc_mw`,
//! `SendOp::BindMw`/`LocalInv`), but softrdma-verbs does not wrap them yet,
//! and a window is named by its *current* rkey, which a bind changes when it
//! executes — the C side needs a handle that stays put (or a lookup by the
//! 24 upper bits a window keeps). No core call changes a registered region
//! in place keeping its keys (rereg). Each entry point therefore ends in
//! [`core_missing`], EOPNOTSUPP naming what it needs — which is also what
//! makes rdma-core's tests skip rather than fail.

use std::os::raw::{c_int, c_void};

use crate::abi::*;
use crate::ffi::{errno_ret, null_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

crate::symver! {
    "IBVERBS_1.1":
        ibv_rereg_mr;
}

/// The error of an entry point whose C side is done and whose core
/// operation does not exist yet.
fn core_missing(call: &'static str) -> Fail {
    Fail::unsupported(format!(
        "not implemented by softrdma's core yet (needs {call})"
    ))
}

/// The access bits a window may grant (rxe_check_bind_mw: remote access and
/// zero-based addressing only).
const MW_ACCESS: u32 =
    IBV_ACCESS_REMOTE_WRITE | 4 | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;

fn check_type(t: u32) -> Res<()> {
    if t != IBV_MW_TYPE_1 && t != IBV_MW_TYPE_2 {
        return Err(Fail::inval(format!(
            "memory window type {t} does not exist (IBV_MW_TYPE_1 or IBV_MW_TYPE_2)"
        )));
    }
    Ok(())
}

/// `ops.alloc_mw` (`ibv_alloc_mw`).
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    null_ret("ibv_alloc_mw", || {
        Pd::from_c(pd)?;
        check_type(mw_type)?;
        Err(core_missing(
            "Endpoint::alloc_mw(pd, type) -> rkey, with max_mw > 0 in the device attributes",
        ))
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`).
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    errno_ret("ibv_dealloc_mw", || {
        Mw::from_c(mw)?;
        Err(core_missing("Endpoint::dealloc_mw(rkey)"))
    })
}

/// What a bind asks for, checked as rxe_check_bind_mw does. `mw_pd` is the
/// PD the window belongs to.
fn check_bind_info(info: &ibv_mw_bind_info, mw_pd: *mut ibv_pd) -> Res<()> {
    if info.mw_access_flags & !MW_ACCESS != 0 {
        return Err(Fail::inval(format!(
            "mw_access_flags {:#x}: a window grants only REMOTE_READ, REMOTE_WRITE, \
             REMOTE_ATOMIC and ZERO_BASED",
            info.mw_access_flags
        )));
    }
    if info.mr.is_null() {
        if info.length != 0 {
            return Err(Fail::inval("bind_info.mr is NULL but length is not 0"));
        }
        return Ok(()); // unbind
    }
    let m = Mr::from_c(info.mr)?;
    // SAFETY: our own slot, live while `m` is.
    let c = unsafe { &*m.c_ptr() };
    if c.pd != mw_pd {
        return Err(Fail::inval(
            "the region and the window are in different protection domains",
        ));
    }
    if m.access & IBV_ACCESS_MW_BIND == 0 {
        return Err(Fail::inval(
            "the region was not registered with IBV_ACCESS_MW_BIND",
        ));
    }
    if info.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && m.access & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(Fail::inval(
            "a window with REMOTE_WRITE or REMOTE_ATOMIC needs a region with LOCAL_WRITE",
        ));
    }
    let start = c.addr as u64;
    let inside = info.addr >= start
        && info
            .addr
            .checked_add(info.length)
            .is_some_and(|e| e <= start + c.length as u64);
    if info.length != 0 && !inside {
        return Err(Fail::inval(format!(
            "bind range {:#x}+{} is not inside the region {start:#x}+{}",
            info.addr, info.length, c.length
        )));
    }
    Ok(())
}

/// Windows are bound by connected QPs (IBA: not UD).
fn check_bind_qp(q: &Qp) -> Res<()> {
    if q.qp_type == softrdma_verbs::QpType::Ud {
        return Err(Fail::inval("a UD QP cannot bind memory windows"));
    }
    Ok(())
}

/// `ops.bind_mw` (`ibv_bind_mw`: type 1 windows, bound by the QP as a work
/// request with `mw_bind->wr_id`).
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    errno_ret("ibv_bind_mw", || {
        non_null!(mw_bind);
        check_bind_qp(&*Qp::from_c(qp)?)?;
        let w = Mw::from_c(mw)?;
        if w.mw_type != IBV_MW_TYPE_1 {
            return Err(Fail::inval(
                "ibv_bind_mw binds type 1 windows; type 2 is bound with IBV_WR_BIND_MW",
            ));
        }
        // SAFETY: the application's readable ibv_mw_bind; our own slots.
        let (info, mw_pd) = unsafe { ((*mw_bind).bind_info, (*w.c_ptr()).pd) };
        check_bind_info(&info, mw_pd)?;
        Err(core_missing(
            "a bind work request: SendOp::BindMw { mw rkey, new rkey, mr lkey, addr, length, access }",
        ))
    })
}

/// `IBV_WR_BIND_MW` (type 2 windows) in `ibv_post_send`.
pub fn check_bind_wr(q: &Qp, wr: &ibv_send_wr) -> Res<()> {
    check_bind_qp(q)?;
    let b = wr.bind_mw;
    let w = Mw::from_c(b.mw)?;
    if w.mw_type != IBV_MW_TYPE_2 {
        return Err(Fail::inval(
            "IBV_WR_BIND_MW binds type 2 windows; type 1 is bound with ibv_bind_mw",
        ));
    }
    // SAFETY: our own slots.
    let (mw_pd, qp_pd) = unsafe { ((*w.c_ptr()).pd, (*q.c_ptr()).pd) };
    if mw_pd != qp_pd {
        return Err(Fail::inval(
            "a type 2 window is bound by a QP of its own protection domain",
        ));
    }
    check_bind_info(&b.bind_info, mw_pd)?;
    Err(core_missing(
        "SendOp::BindMw { mw rkey, new rkey, mr lkey, addr, length, access }",
    ))
}

/// `IBV_WR_LOCAL_INV` in `ibv_post_send`.
pub fn check_local_inv(_q: &Qp, _rkey: u32) -> Res<()> {
    Err(core_missing(
        "SendOp::LocalInv { rkey } (invalidating a type 2 window)",
    ))
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
        let m = Mr::from_c(mr)?;
        if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 || flags == 0 {
            return Err(Fail::inval(format!(
                "flags {flags:#x}: a combination of CHANGE_TRANSLATION (1), CHANGE_PD (2) \
                 and CHANGE_ACCESS (4)"
            )));
        }
        // SAFETY: our own slot, live while `m` is.
        let old = unsafe { &*m.c_ptr() };
        let (new_addr, new_len) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            if addr.is_null() || length == 0 {
                return Err(Fail::inval(
                    "CHANGE_TRANSLATION needs a non-NULL addr and a non-zero length",
                ));
            }
            (addr as u64, length as u64)
        } else {
            (old.addr as u64, old.length as u64)
        };
        if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            let p = Pd::from_c(pd)?;
            // SAFETY: our own slot, live while `p` is.
            if unsafe { (*p.c_ptr()).context } != old.context {
                return Err(Fail::inval("the new PD belongs to another context"));
            }
        }
        let bits = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            let bits = access as u32 & !IBV_ACCESS_OPTIONAL_RANGE;
            if bits & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
                && bits & IBV_ACCESS_LOCAL_WRITE == 0
            {
                return Err(Fail::inval(
                    "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
                ));
            }
            bits
        } else {
            m.access
        };
        // The pages of the new translation (or the old one under new
        // access), as registration checks them.
        crate::pages::check(new_addr, new_len, crate::pages::needs_write(bits))?;
        Err(core_missing(
            "Endpoint::rereg_mr(lkey, pd, translation, access) keeping the lkey and rkey",
        ))
    });
    if r == 0 {
        0
    } else {
        IBV_REREG_MR_ERR_INPUT
    }
}
