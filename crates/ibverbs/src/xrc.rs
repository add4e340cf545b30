//! XRC through the C ABI: the `verbs_context` operations behind verbs.h's
//! inline `ibv_open_xrcd`, `ibv_close_xrcd`, `ibv_create_srq_ex`
//! (`IBV_SRQT_XRC`), `ibv_get_srq_num` and `ibv_open_qp`, and the XRC
//! target QP of `ibv_create_qp_ex` (`IBV_QP_INIT_ATTR_XRCD`). The initiator
//! (`IBV_QPT_XRC_SEND`) is an ordinary `ibv_create_qp(_ex)` of a PD (see
//! `qp`), its sends naming `qp_type.xrc.remote_srqn` (`datapath`) or
//! `ibv_wr_set_xrc_srqn` (`qpex`).
//!
//! An XRC domain opened on a file (`fd` and `O_CREAT`, as rdma-core's tests
//! do) is shared by every `ibv_open_xrcd` of that file (same device and
//! inode) on one device context, as the kernel shares it among processes;
//! other contexts and processes that open the same file get a domain of
//! their own (softrdma's domains live in a context's engine), so
//! `ibv_open_qp` finds the target QPs of its own context.

use std::os::raw::c_int;
use std::sync::Arc;

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{errno_ret, null_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

const XRCD_INIT_ATTR_FD: u32 = 1 << 0;
const XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;

const SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
const SRQ_INIT_ATTR_PD: u32 = 1 << 1;
const SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
const SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
const SRQ_INIT_ATTR_TM: u32 = 1 << 4;
const SRQT_BASIC: u32 = 0;
const SRQT_XRC: u32 = 1;

/// `IBV_QPT_XRC_RECV`.
const QPT_XRC_RECV: u32 = 10;

/// `verbs_context.open_xrcd`.
pub unsafe extern "C" fn vctx_open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut verbs_xrcd {
    null_ret("ibv_open_xrcd", || {
        non_null!(attr);
        let ctx = Context::from_c(context)?;
        // SAFETY: a readable ibv_xrcd_init_attr.
        let a = unsafe { &*attr };
        let need = XRCD_INIT_ATTR_FD | XRCD_INIT_ATTR_OFLAGS;
        if a.comp_mask & !need != 0 {
            return Err(Fail::inval(format!(
                "ibv_xrcd_init_attr.comp_mask {:#x} has unknown bits",
                a.comp_mask
            )));
        }
        if a.comp_mask & need != need {
            return Err(Fail::inval(
                "ibv_xrcd_init_attr.comp_mask needs IBV_XRCD_INIT_ATTR_FD and _OFLAGS",
            ));
        }
        let shared = if a.fd == -1 {
            Arc::new(ctx.sv.open_xrcd())
        } else {
            let key = file_key(a.fd)?;
            let mut map = ctx.xrcds.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(&key).and_then(|w| w.upgrade()) {
                Some(_) if a.oflags & libc::O_EXCL != 0 => {
                    return Err(Fail::inval(
                        "O_EXCL: an XRC domain is already open on this file",
                    ))
                }
                Some(x) => x,
                None if a.oflags & libc::O_CREAT == 0 => {
                    return Err(Fail::inval(
                        "no XRC domain is open on this file and oflags lack O_CREAT",
                    ))
                }
                None => {
                    let x = Arc::new(ctx.sv.open_xrcd());
                    map.insert(key, Arc::downgrade(&x));
                    x
                }
            }
        };
        let c = verbs_xrcd {
            context,
            comp_mask: 0,
            handle: shared.id(),
        };
        ctx.users.hold()?.keep();
        Ok(Xrcd::into_c(Xrcd::new(c, shared)))
    })
}

/// The device and inode of the file `fd` is open on.
fn file_key(fd: c_int) -> Res<(u64, u64)> {
    // SAFETY: a zeroed stat buffer is valid; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat reads only `fd` and writes the buffer we own.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Fail::new(
            e.raw_os_error().unwrap_or(libc::EBADF),
            format!("ibv_xrcd_init_attr.fd {fd}: {e}"),
        ));
    }
    Ok((st.st_dev, st.st_ino))
}

/// `verbs_context.close_xrcd`: EBUSY while an XRC SRQ or target QP
/// created through this handle exists.
pub unsafe extern "C" fn vctx_close_xrcd(xrcd: *mut verbs_xrcd) -> c_int {
    errno_ret("ibv_close_xrcd", || {
        let x = Xrcd::take_unused(
            xrcd,
            "XRC SRQs or target QPs of this XRC domain still exist",
        )?;
        // SAFETY: our own slot, live while `x` is.
        if let Ok(ctx) = Context::from_c(unsafe { (*x.c_ptr()).context }) {
            ctx.users.sub();
        }
        Ok(())
    })
}

/// `verbs_context.create_srq_ex`: an XRC SRQ (`IBV_SRQT_XRC` with PD, XRC
/// domain and CQ), or a basic SRQ of a PD given with more bits than
/// verbs.h's shortcut passes on. Tag matching SRQs are refused.
pub unsafe extern "C" fn vctx_create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    null_ret("ibv_create_srq_ex", || {
        non_null!(attr);
        Context::from_c(context)?;
        // SAFETY: a readable and writable ibv_srq_init_attr_ex.
        let a = unsafe { &mut *attr };
        let known = SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD | SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ;
        if a.comp_mask & SRQ_INIT_ATTR_TM != 0 {
            return Err(Fail::unsupported(
                "tag matching SRQs (IBV_SRQ_INIT_ATTR_TM) need hardware tag matching",
            ));
        }
        if a.comp_mask & !known != 0 {
            return Err(Fail::inval(format!(
                "ibv_srq_init_attr_ex.comp_mask {:#x} has unknown bits",
                a.comp_mask
            )));
        }
        let srq_type = if a.comp_mask & SRQ_INIT_ATTR_TYPE != 0 {
            a.srq_type
        } else {
            SRQT_BASIC
        };
        if a.comp_mask & SRQ_INIT_ATTR_PD == 0 {
            return Err(Fail::inval("an SRQ needs a PD (IBV_SRQ_INIT_ATTR_PD)"));
        }
        match srq_type {
            SRQT_BASIC => {
                // The prefix of ibv_srq_init_attr_ex is ibv_srq_init_attr.
                let mut init = ibv_srq_init_attr {
                    srq_context: a.srq_context,
                    attr: a.attr,
                };
                let srq = crate::resources::create_srq_impl(a.pd, &mut init)?;
                a.attr = init.attr;
                Ok(srq)
            }
            SRQT_XRC => create_xrc_srq(a),
            t => Err(Fail::unsupported(format!(
                "SRQ type {t}: softrdma has basic (0) and XRC (1) SRQs"
            ))),
        }
    })
}

fn create_xrc_srq(a: &mut ibv_srq_init_attr_ex) -> Res<*mut ibv_srq> {
    let need = SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ;
    if a.comp_mask & need != need {
        return Err(Fail::inval(
            "an XRC SRQ needs IBV_SRQ_INIT_ATTR_XRCD and IBV_SRQ_INIT_ATTR_CQ",
        ));
    }
    let p = Pd::from_c(a.pd)?;
    let x = Xrcd::from_c(a.xrcd)?;
    let cq = Cq::from_c(a.cq)?;
    let held = (p.users.hold()?, x.users.hold()?, cq.users.hold()?);
    let max_sge = a.attr.max_sge.max(1);
    let srq = p.sv.create_xrc_srq(&x.sv, &cq.sv, a.attr.max_wr, max_sge)?;
    a.attr.max_sge = max_sge;
    let mut c = ibv_srq::zeroed();
    // SAFETY: live PD.
    c.context = unsafe { (*p.c_ptr()).context };
    c.srq_context = a.srq_context;
    c.pd = a.pd;
    held.0.keep();
    held.1.keep();
    held.2.keep();
    let mut s = Srq::new(c, srq, a.attr);
    s.xrc = Some((a.xrcd as usize, a.cq as usize));
    Ok(Srq::into_c(s))
}

/// What destroying an XRC SRQ gives back: its domain's and CQ's counts.
pub(crate) fn release_xrc_srq(xrc: Option<(usize, usize)>) {
    if let Some((x, cq)) = xrc {
        if let Ok(x) = Xrcd::from_c(x as *mut verbs_xrcd) {
            x.users.sub();
        }
        if let Ok(cq) = Cq::from_c(cq as *mut ibv_cq) {
            cq.users.sub();
        }
    }
}

/// `verbs_context.get_srq_num`.
pub unsafe extern "C" fn vctx_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    errno_ret("ibv_get_srq_num", || {
        non_null!(srq_num);
        let s = Srq::from_c(srq)?;
        // SAFETY: a writable u32.
        unsafe { *srq_num = s.sv.srq_num() };
        Ok(())
    })
}

/// `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_XRCD`: an XRC target QP
/// (`IBV_QPT_XRC_RECV`; no PD, CQs, SRQ or queues).
pub(crate) fn create_tgt_qp(
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> Res<*mut ibv_qp> {
    if a.qp_type != QPT_XRC_RECV {
        return Err(Fail::inval(format!(
            "IBV_QP_INIT_ATTR_XRCD is for IBV_QPT_XRC_RECV (10) QPs, not type {}",
            a.qp_type
        )));
    }
    let ctx = Context::from_c(context)?;
    let x = Xrcd::from_c(a.xrcd)?;
    let held = x.users.hold()?;
    let qp = x.sv.create_tgt_qp()?;
    a.cap = ibv_qp_cap::default();
    let qpn = qp.qpn();
    let ptr = tgt_handle(context, qp, a.qp_context, a.xrcd, held);
    ctx.qps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(qpn, ptr as usize);
    Ok(ptr)
}

/// `verbs_context.open_qp`: another handle on an XRC target QP of a domain
/// by its number (`IBV_QP_OPEN_ATTR_NUM | _XRCD | _TYPE`, type
/// `IBV_QPT_XRC_RECV`), as the kernel's `ib_open_qp`. The QP is destroyed
/// with its last handle. Handles opened on the same file on this context
/// share the domain, so any of them finds the QP.
pub unsafe extern "C" fn vctx_open_qp(
    context: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    null_ret("ibv_open_qp", || {
        non_null!(attr);
        let ctx = Context::from_c(context)?;
        // SAFETY: a readable ibv_qp_open_attr.
        let a = unsafe { &*attr };
        let need = QP_OPEN_ATTR_NUM | QP_OPEN_ATTR_XRCD | QP_OPEN_ATTR_TYPE;
        if a.comp_mask & need != need {
            return Err(Fail::inval(
                "ibv_qp_open_attr.comp_mask needs IBV_QP_OPEN_ATTR_NUM, _XRCD and _TYPE",
            ));
        }
        if a.comp_mask & !(need | QP_OPEN_ATTR_CONTEXT) != 0 {
            return Err(Fail::inval(format!(
                "ibv_qp_open_attr.comp_mask {:#x} has unknown bits",
                a.comp_mask
            )));
        }
        if a.qp_type != QPT_XRC_RECV {
            return Err(Fail::inval(format!(
                "ibv_open_qp opens XRC_RECV (10) QPs, not type {}",
                a.qp_type
            )));
        }
        let x = Xrcd::from_c(a.xrcd)?;
        let held = x.users.hold()?;
        let qp = x.sv.open_tgt_qp(a.qp_num)?;
        let qp_context = if a.comp_mask & QP_OPEN_ATTR_CONTEXT != 0 {
            a.qp_context
        } else {
            std::ptr::null_mut()
        };
        let ptr = tgt_handle(context, qp, qp_context, a.xrcd, held);
        drop(ctx);
        Ok(ptr)
    })
}

const QP_OPEN_ATTR_NUM: u32 = 1 << 0;
const QP_OPEN_ATTR_XRCD: u32 = 1 << 1;
const QP_OPEN_ATTR_CONTEXT: u32 = 1 << 2;
const QP_OPEN_ATTR_TYPE: u32 = 1 << 3;

/// The C handle of a target QP (created or opened) through `xrcd`, which
/// `held` counts it a user of.
fn tgt_handle(
    context: *mut ibv_context,
    qp: sv::Qp,
    qp_context: *mut std::ffi::c_void,
    xrcd: *mut verbs_xrcd,
    held: Hold<'_>,
) -> *mut ibv_qp {
    let mut c = ibv_qp_ex::zeroed();
    let b = &mut c.qp_base;
    b.context = context;
    b.qp_context = qp_context;
    b.handle = qp.qpn();
    b.qp_num = qp.qpn();
    b.state = qp.query().map_or(0, |(st, _, _)| st.to_ibv());
    b.qp_type = QPT_XRC_RECV;
    held.keep();
    let mut q = Qp::new(c, qp, sv::QpType::XrcRecv, false);
    q.xrcd = xrcd as usize;
    Qp::into_c(q)
}
