//! Queue pairs: create, modify, query, destroy, and the translation between
//! `struct ibv_qp_attr` and softrdma's `QpAttr`.
//!
//! Mask bits, states, MTU codes and access flags are libibverbs' own numbers
//! in softrdma's core, so the translation is field by field; the core checks
//! the transition and every value and says what was wrong (logged with
//! `SOFTRDMA_IBV_LOG=1`).

use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{errno_ret, null_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

crate::symver! {
    "IBVERBS_1.1":
        ibv_attach_mcast, ibv_create_qp, ibv_destroy_qp, ibv_detach_mcast, ibv_modify_qp,
        ibv_query_qp;
    "IBVERBS_1.6":
        ibv_qp_to_qp_ex;
    "IBVERBS_1.14":
        ibv_query_qp_data_in_order;
}

fn qp_type(t: u32) -> Res<sv::QpType> {
    sv::QpType::from_ibv(t).ok_or_else(|| {
        Fail::unsupported(format!(
            "QP type {t} is not supported: softrdma implements RC (2), UC (3), UD (4), \
             XRC_SEND (9) and XRC_RECV (10)"
        ))
    })
}

fn cap_to_c(c: &sv::QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    null_ret("ibv_create_qp", || create_qp_impl(pd, init))
}

/// The body of `ibv_create_qp`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn create_qp_impl(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> Res<*mut ibv_qp> {
    non_null!(init);
    // SAFETY: a readable and writable ibv_qp_init_attr.
    let init = unsafe { &mut *init };
    let c = Create {
        qp_context: init.qp_context,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        qp_type: init.qp_type,
        sq_sig_all: init.sq_sig_all,
    };
    create_qp(pd, &c, &mut init.cap, false)
}

/// What `ibv_create_qp` and `ibv_create_qp_ex` share.
struct Create {
    qp_context: *mut std::ffi::c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_type: u32,
    sq_sig_all: c_int,
}

/// Create a QP on `pd`, writing the granted capabilities to `cap`;
/// `extended` turns on its `ibv_wr_*` interface.
fn create_qp(
    pd: *mut ibv_pd,
    init: &Create,
    cap_io: &mut ibv_qp_cap,
    extended: bool,
) -> Res<*mut ibv_qp> {
    let p = Pd::from_c(pd)?;
    let t = qp_type(init.qp_type)?;
    if t == sv::QpType::XrcRecv {
        return Err(Fail::inval(
            "an XRC_RECV QP belongs to an XRC domain: ibv_create_qp_ex with IBV_QP_INIT_ATTR_XRCD",
        ));
    }
    let send_cq = Cq::from_c(init.send_cq)?;
    // An XRC initiator has no receive queue; its recv_cq may be NULL.
    let xrc_send = t == sv::QpType::XrcSend;
    let recv_cq = if xrc_send && init.recv_cq.is_null() {
        None
    } else {
        Some(Cq::from_c(init.recv_cq)?)
    };
    let srq = if init.srq.is_null() {
        None
    } else if xrc_send {
        return Err(Fail::inval("an XRC_SEND QP takes no SRQ"));
    } else {
        Some(Srq::from_c(init.srq)?)
    };
    // Counted as users before the QP is made: a destroy of any of them
    // from now on fails with EBUSY, or has already refused these.
    let held = (
        p.users.hold()?,
        send_cq.users.hold()?,
        recv_cq.as_ref().map(|r| r.users.hold()).transpose()?,
        srq.as_ref().map(|s| s.users.hold()).transpose()?,
    );
    let no_rq = srq.is_some() || xrc_send;
    let cap = sv::QpCap {
        max_send_wr: cap_io.max_send_wr.max(1),
        max_recv_wr: if no_rq { 0 } else { cap_io.max_recv_wr },
        max_send_sge: cap_io.max_send_sge.max(1),
        max_recv_sge: if no_rq { 0 } else { cap_io.max_recv_sge.max(1) },
        max_inline_data: cap_io.max_inline_data,
    };
    let qp = p.sv.create_qp(&sv::QpInitAttr {
        qp_type: t,
        send_cq: &send_cq.sv,
        recv_cq: &recv_cq.as_ref().unwrap_or(&send_cq).sv,
        srq: srq.as_ref().map(|s| &s.sv),
        cap,
        sq_sig_all: init.sq_sig_all != 0,
    })?;
    let (_, _, actual) = qp.query()?;
    *cap_io = cap_to_c(&actual);
    // SAFETY: live PD.
    let context = unsafe { (*p.c_ptr()).context };
    // SAFETY: a live context (its PD is live).
    let ctx = Context::from_c(context)?;
    let mut c = ibv_qp_ex::zeroed();
    let b = &mut c.qp_base;
    b.context = context;
    b.qp_context = init.qp_context;
    b.pd = pd;
    b.send_cq = init.send_cq;
    b.recv_cq = init.recv_cq;
    b.srq = init.srq;
    b.handle = qp.qpn();
    b.qp_num = qp.qpn();
    b.state = sv::QpState::Reset.to_ibv();
    b.qp_type = init.qp_type;
    if extended {
        crate::qpex::fill_qp_ex_ops(&mut c);
    }
    let qpn = qp.qpn();
    held.0.keep();
    held.1.keep();
    if let Some(h) = held.2 {
        h.keep();
    }
    if let Some(h) = held.3 {
        h.keep();
    }
    let mut q = Qp::new(c, qp, t, init.sq_sig_all != 0);
    q.extended = extended;
    q.max_inline_data = actual.max_inline_data;
    q.max_send_wr = actual.max_send_wr;
    let ptr = Qp::into_c(q);
    ctx.qps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(qpn, ptr as usize);
    Ok(ptr)
}

const QP_INIT_ATTR_PD: u32 = 1 << 0;
const QP_INIT_ATTR_XRCD: u32 = 1 << 1;
const QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `verbs_context.create_qp_ex` (verbs.h's inline `ibv_create_qp_ex` when
/// more than the PD is given): `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` turns on
/// the `ibv_wr_*` interface (`ibv_qp_to_qp_ex`); creation flags must be 0
/// (none of them is meaningful without raw packet QPs); XRC, TSO and RSS
/// are refused with EOPNOTSUPP.
pub unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    null_ret("ibv_create_qp_ex", || {
        non_null!(attr);
        Context::from_c(context)?;
        // SAFETY: a readable and writable ibv_qp_init_attr_ex.
        let a = unsafe { &mut *attr };
        let known = QP_INIT_ATTR_PD | QP_INIT_ATTR_CREATE_FLAGS | QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & QP_INIT_ATTR_XRCD != 0 {
            if a.comp_mask & !(known | QP_INIT_ATTR_XRCD) != 0 {
                return Err(Fail::unsupported(format!(
                    "comp_mask {:#x}: an XRC target QP takes IBV_QP_INIT_ATTR_XRCD (and \
                     create flags 0)",
                    a.comp_mask
                )));
            }
            if a.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
                return Err(Fail::unsupported(format!(
                    "create_flags {:#x}: none is supported",
                    a.create_flags
                )));
            }
            return crate::xrc::create_tgt_qp(context, a);
        }
        if a.comp_mask & !known != 0 {
            return Err(Fail::unsupported(format!(
                "comp_mask {:#x}: TSO headers, indirection tables and RX hashing are for raw \
                 packet QPs, which this device does not have",
                a.comp_mask & !known
            )));
        }
        if a.comp_mask & QP_INIT_ATTR_PD == 0 {
            return Err(Fail::inval(
                "comp_mask lacks IBV_QP_INIT_ATTR_PD: a QP needs a PD",
            ));
        }
        if a.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(Fail::unsupported(format!(
                "create_flags {:#x}: none is supported (they concern raw packet QPs and multicast)",
                a.create_flags
            )));
        }
        let extended = a.comp_mask & QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if extended {
            let extra = a.send_ops_flags & !crate::qpex::SEND_OPS_SUPPORTED;
            if extra != 0 {
                return Err(Fail::unsupported(format!(
                    "send_ops_flags {extra:#x}: TSO is for raw packet QPs, which this device does not have"
                )));
            }
        }
        // The device's context is the PD's (checked by create_qp).
        let c = Create {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let pd = a.pd;
        create_qp(pd, &c, &mut a.cap, extended)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    errno_ret("ibv_destroy_qp", || destroy_qp_impl(qp))
}

/// The body of `ibv_destroy_qp`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn destroy_qp_impl(qp: *mut ibv_qp) -> Res<()> {
    let q = Qp::take(qp)?;
    // SAFETY: the C struct of a QP we just took back.
    let c = unsafe { &*q.c_ptr() };
    // A QP's context, PD, CQs and SRQ cannot be destroyed before it
    // (each counts its users); each is looked up, not trusted.
    if let Ok(ctx) = Context::from_c(c.context) {
        let mut qps = ctx.qps.lock().unwrap_or_else(|e| e.into_inner());
        // Another handle of an XRC target QP (ibv_open_qp) is not the one
        // async events name.
        if qps.get(&c.qp_num) == Some(&(qp as usize)) {
            qps.remove(&c.qp_num);
        }
    }
    if let Ok(p) = Pd::from_c(c.pd) {
        p.users.sub();
    }
    for cq in [c.send_cq, c.recv_cq] {
        if let Ok(cq) = Cq::from_c(cq) {
            cq.users.sub();
        }
    }
    if !c.srq.is_null() {
        if let Ok(s) = Srq::from_c(c.srq) {
            s.users.sub();
        }
    }
    if q.xrcd != 0 {
        if let Ok(x) = Xrcd::from_c(q.xrcd as *mut verbs_xrcd) {
            x.users.sub();
        }
    }
    // Dropping the softrdma QP flushes and destroys it.
    drop(q);
    Ok(())
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`'s checks: a live QP and a
/// readable GID. The LID is IB's (a RoCE group has none; rxe ignores it).
fn mcast_args(qp: *mut ibv_qp, gid: *const ibv_gid) -> Res<(std::sync::Arc<Qp>, [u8; 16])> {
    let q = Qp::from_c(qp)?;
    non_null!(gid);
    // SAFETY: a readable union ibv_gid (checked non-NULL).
    let raw = unsafe { (*gid).raw };
    Ok((q, raw))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    errno_ret("ibv_attach_mcast", || {
        let (q, gid) = mcast_args(qp, gid)?;
        Ok(q.sv.attach_mcast(gid)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    errno_ret("ibv_detach_mcast", || {
        let (q, gid) = mcast_args(qp, gid)?;
        Ok(q.sv.detach_mcast(gid)?)
    })
}

fn state(v: u32, what: &str) -> Res<sv::QpState> {
    sv::QpState::from_ibv(v).ok_or_else(|| Fail::inval(format!("{what} {v} is not a QP state")))
}

/// `struct ibv_qp_attr` → `QpAttr`, reading only the fields `mask` names.
fn attr_from_c(a: &ibv_qp_attr, mask: sv::AttrMask, qp_type: sv::QpType) -> Res<sv::QpAttr> {
    use sv::AttrMask as M;
    let mut out = sv::QpAttr::default();
    if mask.contains(M::STATE) {
        out.qp_state = state(a.qp_state, "qp_state")?;
    }
    if mask.contains(M::CUR_STATE) {
        out.cur_qp_state = state(a.cur_qp_state, "cur_qp_state")?;
    }
    out.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    out.qp_access_flags = sv::AccessFlags::from_bits_retain(a.qp_access_flags);
    out.pkey_index = a.pkey_index;
    out.port_num = a.port_num;
    out.qkey = a.qkey;
    if mask.contains(M::AV) {
        let ah = &a.ah_attr;
        if ah.is_global == 0 && qp_type != sv::QpType::Ud {
            crate::ffi::warn(
                "the QP's address vector has no GRH (ah_attr.is_global = 0), so it has no \
                 destination on RoCE: give the peer's GID (ibv_*_pingpong: -g 0)",
            );
            return Err(Fail::inval(
                "ah_attr.is_global is 0: RoCE needs the destination GID",
            ));
        }
        out.av = sv::AddressVector {
            dgid: ah.grh.dgid.raw,
            sgid_index: ah.grh.sgid_index,
            hop_limit: ah.grh.hop_limit,
            traffic_class: ah.grh.traffic_class,
            // The kernel's uverbs and its providers take the low 20 bits
            // (the IPv6 flow label field) and check nothing; UCX 1.13 passes
            // 0xffffffff ("auto"). The core, which says what is wrong to a
            // Rust caller, refuses out-of-range labels, so mask here as the
            // kernel would.
            flow_label: ah.grh.flow_label & 0xf_ffff,
            sl: ah.sl,
        };
    }
    if mask.contains(M::PATH_MTU) {
        out.path_mtu = sv::Mtu::from_ibv(a.path_mtu)
            .ok_or_else(|| Fail::inval(format!("path_mtu {} is not an ibv_mtu", a.path_mtu)))?;
    }
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    out.rq_psn = a.rq_psn;
    out.max_rd_atomic = a.max_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.sq_psn = a.sq_psn;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.dest_qp_num = a.dest_qp_num;
    Ok(out)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    errno_ret("ibv_modify_qp", || {
        non_null!(attr);
        let q = Qp::from_c(qp)?;
        let mask = sv::AttrMask::from_bits_retain(attr_mask as u32);
        // SAFETY: a readable ibv_qp_attr.
        let a = attr_from_c(unsafe { &*attr }, mask, q.qp_type)?;
        q.sv.modify(&a, mask)?;
        if mask.contains(sv::AttrMask::STATE) {
            set_c_state(&q, a.qp_state);
        }
        Ok(())
    })
}

/// Record `st` in the QP's C struct, whose `state` the application reads
/// (rdma-core's providers keep it current at every modify and query).
/// Two calls on one QP may do this at once (`ibv_query_qp` from two
/// threads), so it is an atomic store, never a `&mut` to the struct.
pub(crate) fn set_c_state(q: &Qp, st: sv::QpState) {
    // SAFETY: `state` is a u32 of our QP's C struct, live while `q` is and
    // aligned for a u32 (so for an AtomicU32, which has a u32's size and
    // alignment); every write of ours to it goes through this atomic, and
    // the application only reads it.
    let state = unsafe { AtomicU32::from_ptr(ptr::addr_of_mut!((*q.c_ptr()).state)) };
    state.store(st.to_ibv(), Ordering::Relaxed);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    errno_ret("ibv_query_qp", || {
        non_null!(attr, init_attr);
        let q = Qp::from_c(qp)?;
        let (st, a, cap) = q.sv.query()?;
        set_c_state(&q, st);
        let c = q.c_ptr();
        let mut out = ibv_qp_attr {
            qp_state: st.to_ibv(),
            cur_qp_state: st.to_ibv(),
            path_mtu: a.path_mtu.to_ibv(),
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags.bits(),
            cap: cap_to_c(&cap),
            pkey_index: a.pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify as u8,
            sq_draining: a.sq_draining as u8,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: if a.port_num == 0 { 1 } else { a.port_num },
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            ..Default::default()
        };
        if q.qp_type != sv::QpType::Ud {
            let av = &a.av;
            out.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: av.dgid },
                    flow_label: av.flow_label,
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                },
                sl: av.sl,
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
        }
        // SAFETY: writable out-structs, checked non-NULL; `c` is our QP's
        // C struct, live while `q` is, read field by field through the
        // pointer (no reference: the application may write `qp_context`,
        // and another call `state`, meanwhile).
        unsafe {
            *attr = out;
            let i = &mut *init_attr;
            i.qp_context = ptr::addr_of!((*c).qp_context).read();
            i.send_cq = ptr::addr_of!((*c).send_cq).read();
            i.recv_cq = ptr::addr_of!((*c).recv_cq).read();
            i.srq = ptr::addr_of!((*c).srq).read();
            i.cap = cap_to_c(&cap);
            i.qp_type = ptr::addr_of!((*c).qp_type).read();
            i.sq_sig_all = q.sq_sig_all as c_int;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // As rdma-core: the extended interface of a QP created with
    // IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, NULL for any other.
    null_ret("ibv_qp_to_qp_ex", || {
        let q = Qp::from_c(qp)?;
        if q.extended {
            Ok(q.ex_ptr())
        } else {
            Err(Fail::inval(
                "the QP was not created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS",
            ))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> c_int {
    // 0: no in-order data placement guarantee is promised (nor for a
    // pointer that is no QP: the function has no error value).
    crate::ffi::value_ret("ibv_query_qp_data_in_order", 0, || {
        Qp::from_c(qp)?;
        Ok(0)
    })
}
