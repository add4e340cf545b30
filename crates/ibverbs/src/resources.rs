//! Protection domains, memory regions, completion channels and queues,
//! shared receive queues, address handles, and the event calls
//! (`ibv_get_cq_event`, `ibv_get_async_event`).
//!
//! Memory belongs to the application, as in verbs: a region is registered
//! with softrdma's raw tier (`Pd::reg_mr_raw`), and the application promises
//! to keep the memory mapped until it deregisters the region and its work
//! has completed — the contract of `ibv_reg_mr`.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{errno_ret, minus_one, null_ret, void_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

crate::symver! {
    "IBVERBS_1.0":
        ibv_create_comp_channel, ibv_destroy_comp_channel;
    "IBVERBS_1.1":
        ibv_ack_async_event, ibv_ack_cq_events, ibv_alloc_pd, ibv_create_ah,
        ibv_create_ah_from_wc, ibv_create_cq, ibv_create_srq, ibv_dealloc_pd, ibv_dereg_mr,
        ibv_destroy_ah, ibv_destroy_cq, ibv_destroy_srq, ibv_get_async_event,
        ibv_get_cq_event, ibv_init_ah_from_wc, ibv_modify_srq, ibv_query_srq, ibv_reg_mr,
        ibv_resize_cq;
    "IBVERBS_1.7":
        ibv_reg_mr_iova;
    "IBVERBS_1.8":
        ibv_reg_mr_iova2;
}

// ---- protection domains ----

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    null_ret("ibv_alloc_pd", || alloc_pd_impl(context))
}

/// The body of `ibv_alloc_pd`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn alloc_pd_impl(context: *mut ibv_context) -> Res<*mut ibv_pd> {
    let ctx = Context::from_c(context)?;
    let held = ctx.users.hold()?;
    let pd = ctx.sv.alloc_pd();
    let handle = pd.id().0;
    let c = ibv_pd { context, handle };
    held.keep();
    let p = Pd::into_c(Pd::new(c, pd));
    // For ibv_import_pd in this context's family.
    ctx.shared
        .pds
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(handle, p as usize);
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    errno_ret("ibv_dealloc_pd", || {
        let p = Pd::take_unused(pd, "the PD still has memory regions, QPs, SRQs or AHs")?;
        // SAFETY: our own slot, live while `p` is.
        if let Ok(ctx) = Context::from_c(unsafe { (*p.c_ptr()).context }) {
            ctx.users.sub();
        }
        if let Some((parent, td)) = &p.parent {
            parent.users.sub();
            if let Some(td) = td {
                td.users.sub();
            }
        }
        drop(p);
        Ok(())
    })
}

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `_PD_CONTEXT`.
const PARENT_DOMAIN_ATTRS: u32 = 0b11;

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain`): a PD
/// that stands for `attr->pd` — everything created on it belongs to that
/// PD — with an optional thread domain and `pd_context`. The custom
/// allocators are accepted and never called: they are for the buffers a
/// provider shares with its hardware (queue rings, doorbell records), and
/// softrdma keeps no such buffer in the application's memory.
pub unsafe extern "C" fn vctx_alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    null_ret("ibv_alloc_parent_domain", || {
        non_null!(attr);
        let ctx = Context::from_c(context)?;
        // SAFETY: a readable ibv_parent_domain_init_attr.
        let a = unsafe { &*attr };
        if a.comp_mask & !PARENT_DOMAIN_ATTRS != 0 {
            return Err(Fail::inval(format!(
                "comp_mask {:#x}: only ALLOCATORS and PD_CONTEXT are defined",
                a.comp_mask
            )));
        }
        let parent = Pd::from_c(a.pd)?;
        if parent.parent.is_some() {
            return Err(Fail::inval(
                "a parent domain's pd must be a PD, not another parent domain",
            ));
        }
        // SAFETY: the live parent's slot.
        if unsafe { (*parent.c_ptr()).context } != context {
            return Err(Fail::inval("the PD belongs to another context"));
        }
        let td = if a.td.is_null() {
            None
        } else {
            let td = Td::from_c(a.td)?;
            // SAFETY: the live thread domain's slot.
            if unsafe { (*td.c_ptr()).context } != context {
                return Err(Fail::inval("the thread domain belongs to another context"));
            }
            Some(td)
        };
        let c = ibv_pd {
            context,
            handle: parent.sv.id().0,
        };
        let mut pd = Pd::new(c, parent.sv.clone());
        {
            let held = (
                parent.users.hold()?,
                td.as_ref().map(|t| t.users.hold()).transpose()?,
                ctx.users.hold()?,
            );
            held.0.keep();
            if let Some(h) = held.1 {
                h.keep();
            }
            held.2.keep();
        }
        pd.parent = Some((parent, td));
        Ok(Pd::into_c(pd))
    })
}

/// `verbs_context.alloc_td` (`ibv_alloc_td`).
pub unsafe extern "C" fn vctx_alloc_td(
    context: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    null_ret("ibv_alloc_td", || {
        non_null!(attr);
        let ctx = Context::from_c(context)?;
        // SAFETY: a readable ibv_td_init_attr.
        if unsafe { (*attr).comp_mask } != 0 {
            return Err(Fail::inval("ibv_td_init_attr.comp_mask must be 0"));
        }
        ctx.users.hold()?.keep();
        Ok(Td::into_c(Td::new(ibv_td { context })))
    })
}

/// `verbs_context.dealloc_td` (`ibv_dealloc_td`): EBUSY while a parent
/// domain uses it.
pub unsafe extern "C" fn vctx_dealloc_td(td: *mut ibv_td) -> c_int {
    errno_ret("ibv_dealloc_td", || {
        let t = Td::take_unused(td, "a parent domain still uses the thread domain")?;
        // SAFETY: our own slot, live while `t` is.
        if let Ok(ctx) = Context::from_c(unsafe { (*t.c_ptr()).context }) {
            ctx.users.sub();
        }
        Ok(())
    })
}

// ---- memory regions ----

fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> Res<*mut ibv_mr> {
    let p = Pd::from_c(pd)?;
    let held = p.users.hold()?;
    // Implicit on-demand paging: the whole address space, as the kernel's
    // ib_uverbs takes (start 0, length U64_MAX, ON_DEMAND; mlx5 also wants
    // iova 0). Every access is checked as it happens (see the verbs crate's
    // `Pd::reg_mr_implicit`).
    if addr.is_null() && length == usize::MAX && access as u32 & IBV_ACCESS_ON_DEMAND != 0 {
        if iova != 0 {
            return Err(Fail::inval("an implicit on-demand region's iova must be 0"));
        }
        return reg_mr_implicit(&p, held, pd, access as u32);
    }
    if addr.is_null() && length != 0 {
        return Err(Fail::inval(
            "addr is NULL (an implicit on-demand region is NULL, SIZE_MAX and IBV_ACCESS_ON_DEMAND)",
        ));
    }
    // Optional access bits (relaxed ordering, …) are hints a provider may
    // ignore; softrdma has nothing to relax. ON_DEMAND is how every region
    // works here (nothing is pinned, see `ODP_CAPS` in device.rs), and
    // HUGETLB only says the pages are huge ones.
    let bits =
        access as u32 & !IBV_ACCESS_OPTIONAL_RANGE & !(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB);
    let access = sv::AccessFlags::from_bits_retain(bits);
    // SAFETY: verbs' contract for ibv_reg_mr: the memory stays valid until
    // ibv_dereg_mr and the completion of every work request using it (and
    // the check below drops the region before anything can use it).
    let mr = unsafe { p.sv.reg_mr_raw(addr as u64, length, iova, access)? };
    // What get_user_pages would refuse (EFAULT). After the core's checks,
    // so bad flags are EINVAL first, as the kernel checks them first.
    crate::pages::check(addr as u64, length as u64, crate::pages::needs_write(bits))?;
    Ok(publish_mr(&p, held, pd, addr, length, mr, bits))
}

/// `ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | …)`.
fn reg_mr_implicit(p: &Pd, held: Hold<'_>, pd: *mut ibv_pd, access: u32) -> Res<*mut ibv_mr> {
    let bits = access & !IBV_ACCESS_OPTIONAL_RANGE & !(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB);
    // SAFETY: an application registering the whole address space for
    // remote access hands its memory to its peers, which is what this verb
    // means (C code holds no Rust references into it); what softrdma owes
    // it is that no access faults, which the region's checked accesses
    // ensure, except a peer's atomic on a word the application unmaps at
    // that very moment (see `reg_mr_implicit`: an RNIC's MMU notifiers
    // would fence that off; a check without pinning cannot).
    let mr = unsafe {
        p.sv.reg_mr_implicit(sv::AccessFlags::from_bits_retain(bits))?
    };
    Ok(publish_mr(
        p,
        held,
        pd,
        std::ptr::null_mut(),
        usize::MAX,
        mr,
        bits,
    ))
}

/// The `ibv_mr` of a region just registered, counted by `held` as its
/// PD's user.
fn publish_mr(
    p: &Pd,
    held: Hold<'_>,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    mr: sv::Mr,
    bits: u32,
) -> *mut ibv_mr {
    // SAFETY: p.c_ptr() is a live ibv_pd.
    let context = unsafe { (*p.c_ptr()).context };
    let c = ibv_mr {
        context,
        pd,
        addr,
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    held.keep();
    let handle = c.handle;
    let m = Mr::into_c(Mr::new(c, mr, bits));
    // For ibv_import_mr in this context's family.
    if let Ok(ctx) = Context::from_c(context) {
        ctx.shared
            .mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, m as usize);
    }
    m
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    null_ret("ibv_reg_mr", || {
        reg_mr(pd, addr, length, addr as u64, access)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    null_ret("ibv_reg_mr_iova", || reg_mr(pd, addr, length, iova, access))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    null_ret("ibv_reg_mr_iova2", || {
        reg_mr(pd, addr, length, iova, access as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_ret("ibv_dereg_mr", || {
        if ImportedMr::from_c(mr).is_ok() {
            return Err(Fail::inval(
                "an imported memory region (ibv_import_mr): ibv_unimport_mr releases it, \
                 and ibv_dereg_mr of the original deregisters the region",
            ));
        }
        let m = Mr::take(mr)?;
        // SAFETY: our own slot, live while `m` is.
        if let Ok(p) = Pd::from_c(unsafe { (*m.c_ptr()).pd }) {
            p.users.sub();
        }
        drop(m);
        Ok(())
    })
}

// ---- completion channels and queues ----

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    null_ret("ibv_create_comp_channel", || {
        create_comp_channel_impl(context)
    })
}

/// The body of `ibv_create_comp_channel`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn create_comp_channel_impl(context: *mut ibv_context) -> Res<*mut ibv_comp_channel> {
    let ctx = Context::from_c(context)?;
    let held = ctx.users.hold()?;
    let ch = ctx.sv.create_comp_channel()?;
    // rdma-core's channel descriptor starts out blocking; applications
    // that want EAGAIN set O_NONBLOCK themselves, and ibv_get_cq_event
    // follows whichever mode the descriptor is in.
    set_blocking(ch.fd())?;
    let c = ibv_comp_channel {
        context,
        fd: ch.fd(),
        refcnt: 0,
    };
    held.keep();
    Ok(CompChannel::into_c(CompChannel::new(c, ch)))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    errno_ret("ibv_destroy_comp_channel", || {
        destroy_comp_channel_impl(channel)
    })
}

/// The body of `ibv_destroy_comp_channel`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn destroy_comp_channel_impl(channel: *mut ibv_comp_channel) -> Res<()> {
    let ch = CompChannel::take_unused(channel, "CQs still use this completion channel")?;
    // SAFETY: our own slot, live while `ch` is.
    if let Ok(ctx) = Context::from_c(unsafe { (*ch.c_ptr()).context }) {
        ctx.users.sub();
    }
    drop(ch);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    null_ret("ibv_create_cq", || {
        create_cq_impl(context, cqe, cq_context, channel, comp_vector)
    })
}

/// The body of `ibv_create_cq`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn create_cq_impl(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Res<*mut ibv_cq> {
    let depth = u32::try_from(cqe)
        .ok()
        .filter(|&d| d > 0)
        .ok_or_else(|| Fail::inval(format!("cqe {cqe} must be at least 1")))?;
    let vector = u32::try_from(comp_vector).unwrap_or(u32::MAX);
    create_cq(context, depth, cq_context, channel, vector)
}

/// What `ibv_create_cq` and `ibv_create_cq_ex` share: the CQ, its slot
/// (a `struct ibv_cq_ex` either way, its polling functions filled in),
/// and its place in the context's tables.
fn create_cq(
    context: *mut ibv_context,
    depth: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
) -> Res<*mut ibv_cq> {
    let ctx = Context::from_c(context)?;
    if depth == 0 {
        return Err(Fail::inval("cqe must be at least 1"));
    }
    if comp_vector != 0 {
        return Err(Fail::inval(format!(
            "comp_vector {comp_vector} must be 0 (num_comp_vectors is 1)"
        )));
    }
    let ch = if channel.is_null() {
        None
    } else {
        Some(CompChannel::from_c(channel)?)
    };
    let max = ctx.sv.query_device().max_cqe;
    if depth > max {
        return Err(Fail::inval(format!(
            "cqe {depth} is more than max_cqe {max}"
        )));
    }
    let held = (
        ch.as_ref().map(|c| c.users.hold()).transpose()?,
        ctx.users.hold()?,
    );
    let cq = ctx.sv.create_cq(depth, ch.as_ref().map(|c| &c.sv))?;
    let id = cq.id().0;
    let mut c = ibv_cq_ex::zeroed();
    let b = &mut c.cq;
    b.context = context;
    b.channel = channel;
    b.cq_context = cq_context;
    b.handle = id;
    b.cqe = depth as c_int;
    crate::datapath::fill_cq_ex_ops(&mut c);
    if let Some(ch) = &ch {
        channel_refcnt(ch).fetch_add(1, Ordering::Relaxed);
    }
    if let Some(h) = held.0 {
        h.keep();
    }
    held.1.keep();
    let p = Cq::into_c(Cq::new(c, cq));
    ctx.cqs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, p as usize);
    Ok(p)
}

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetch advice for
/// on-demand regions. Every page of a registered region is the process's
/// own and is faulted in by the access itself, so there is nothing to
/// fetch ahead; the call checks what rdma-core's kernel checks — the
/// advice, the flags, and that each SGE lies in a region of this PD — and
/// returns.
pub unsafe extern "C" fn vctx_advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    errno_ret("ibv_advise_mr", || {
        let p = Pd::from_c(pd)?;
        // IBV_ADVISE_MR_ADVICE_PREFETCH, _PREFETCH_WRITE, _PREFETCH_NO_FAULT.
        if advice > 2 {
            return Err(Fail::unsupported(format!(
                "advice {advice} is not a prefetch advice"
            )));
        }
        // IBV_ADVISE_MR_FLAG_FLUSH (wait for the prefetch): trivially kept.
        if flags & !1 != 0 {
            return Err(Fail::inval(format!(
                "flags {flags:#x}: only IBV_ADVISE_MR_FLAG_FLUSH is defined"
            )));
        }
        if num_sge == 0 {
            return Err(Fail::inval("num_sge is 0"));
        }
        non_null!(sg_list);
        for i in 0..num_sge as usize {
            // SAFETY: the caller passes num_sge readable SGEs.
            let s = unsafe { *sg_list.add(i) };
            p.sv.check_local(&sv::Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })?;
        }
        Ok(())
    })
}

/// `IBV_WC_STANDARD_FLAGS`: what a completion of this device carries
/// (byte count, immediate data, QP numbers; SLID, SL and DLID path bits
/// read 0 on RoCE).
const CQ_EX_WC_FLAGS: u64 = 0x7f;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`, `_PD`.
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
const CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a promise this device needs no
/// use of.
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;

/// `verbs_context.create_cq_ex` (verbs.h's inline `ibv_create_cq_ex`).
/// Completion timestamps, VLANs, flow tags and tag matching are refused
/// with EOPNOTSUPP (the device has no clock to stamp with and none of the
/// others), as is `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: an overrun is IBA's
/// CQ error here, never ignored.
pub unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    null_ret("ibv_create_cq_ex", || {
        non_null!(attr);
        // SAFETY: the caller passes a readable ibv_cq_init_attr_ex.
        let a = unsafe { &*attr };
        if a.wc_flags & !CQ_EX_WC_FLAGS != 0 {
            return Err(Fail::unsupported(format!(
                "wc_flags {:#x}: this device supports IBV_WC_STANDARD_FLAGS only \
                 (no completion timestamps, VLANs, flow tags or tag matching)",
                a.wc_flags & !CQ_EX_WC_FLAGS
            )));
        }
        if a.comp_mask & !(CQ_INIT_ATTR_MASK_FLAGS | CQ_INIT_ATTR_MASK_PD) != 0 {
            return Err(Fail::inval(format!(
                "comp_mask {:#x}: only IBV_CQ_INIT_ATTR_MASK_FLAGS and _PD are defined",
                a.comp_mask
            )));
        }
        if a.comp_mask & CQ_INIT_ATTR_MASK_PD != 0 {
            // A CQ on a parent domain: its allocators are for provider
            // buffers (see `vctx_alloc_parent_domain`); it must be one.
            let pd = Pd::from_c(a.parent_domain)?;
            if pd.parent.is_none() {
                return Err(Fail::inval(
                    "parent_domain is a PD, not a parent domain (ibv_alloc_parent_domain)",
                ));
            }
        }
        if a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
            && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0
        {
            return Err(Fail::unsupported(format!(
                "flags {:#x}: only IBV_CREATE_CQ_ATTR_SINGLE_THREADED is supported \
                 (an overrun is a CQ error here, never ignored)",
                a.flags
            )));
        }
        let p = create_cq(context, a.cqe, a.cq_context, a.channel, a.comp_vector)?;
        Ok(p.cast::<ibv_cq_ex>())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    errno_ret("ibv_destroy_cq", || destroy_cq_impl(cq))
}

/// The body of `ibv_destroy_cq`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn destroy_cq_impl(cq: *mut ibv_cq) -> Res<()> {
    // Unregistered first: of two racing destroys, one gets here.
    let q = Cq::take_unused(cq, "QPs still use this CQ")?;
    // SAFETY: our own slot, live while `q` is.
    let (context, channel) = unsafe { ((*q.c_ptr()).context, (*q.c_ptr()).channel) };
    let ctx = Context::from_c(context)?;
    ctx.cqs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&q.sv.id().0);
    ctx.users.sub();
    if !channel.is_null() {
        // A channel with CQs cannot be destroyed, so it is live.
        if let Ok(ch) = CompChannel::from_c(channel) {
            ch.users.sub();
            channel_refcnt(&ch).fetch_sub(1, Ordering::Relaxed);
        }
    }
    drop(q);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    errno_ret("ibv_resize_cq", || {
        let q = Cq::from_c(cq)?;
        let depth = u32::try_from(cqe)
            .ok()
            .filter(|&d| d > 0)
            .ok_or_else(|| Fail::inval(format!("cqe {cqe} must be at least 1")))?;
        q.sv.resize(depth)?;
        // libibverbs' providers write the granted size back (rxe:
        // ibv_cmd_resize_cq sets cq->cqe from the kernel's answer); the
        // application reads it there. Written under the CQ's mutex, as
        // rdma-core's event counters are.
        // SAFETY: a live CQ's C struct.
        unsafe {
            libc::pthread_mutex_lock(&mut (*q.c_ptr()).mutex);
            (*q.c_ptr()).cqe = depth as c_int;
            libc::pthread_mutex_unlock(&mut (*q.c_ptr()).mutex);
        }
        Ok(())
    })
}

fn set_blocking(fd: c_int) -> Res<()> {
    // SAFETY: fcntl on a descriptor the channel owns.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Whether `fd` is in non-blocking mode (then event calls return EAGAIN
/// instead of waiting, as rdma-core's do).
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor we own.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    minus_one("ibv_get_cq_event", || {
        non_null!(cq, cq_context);
        let ch = CompChannel::from_c(channel)?;
        // SAFETY: our own slot, live while `ch` is.
        let ctx = Context::from_c(unsafe { (*ch.c_ptr()).context })?;
        let timeout = nonblocking(ch.sv.fd()).then_some(std::time::Duration::ZERO);
        loop {
            let Some(id) = ch.sv.get_event(timeout)? else {
                return Err(Fail::new(libc::EAGAIN, "no completion event pending"));
            };
            // An event for a CQ destroyed meanwhile is dropped.
            let Some(&p) = ctx.cqs.lock().unwrap_or_else(|e| e.into_inner()).get(&id.0) else {
                continue;
            };
            let p = p as *mut ibv_cq;
            // SAFETY: out-pointers checked above; `p` is live.
            unsafe {
                *cq = p;
                *cq_context = (*p).cq_context;
            }
            return Ok(0);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    void_ret("ibv_ack_cq_events", || {
        let q = Cq::from_c(cq)?;
        // SAFETY: a live CQ; rdma-core updates this counter under the CQ's
        // mutex, which only this library uses.
        unsafe {
            libc::pthread_mutex_lock(&mut (*q.c_ptr()).mutex);
            (*q.c_ptr()).comp_events_completed =
                (*q.c_ptr()).comp_events_completed.wrapping_add(nevents);
            libc::pthread_cond_signal(&mut (*q.c_ptr()).cond);
            libc::pthread_mutex_unlock(&mut (*q.c_ptr()).mutex);
        }
        Ok(())
    })
}

// ---- shared receive queues ----

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    null_ret("ibv_create_srq", || create_srq_impl(pd, init))
}

/// The body of `ibv_create_srq`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn create_srq_impl(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> Res<*mut ibv_srq> {
    non_null!(init);
    let p = Pd::from_c(pd)?;
    let held = p.users.hold()?;
    // SAFETY: a readable/writable ibv_srq_init_attr.
    let init = unsafe { &mut *init };
    let max_sge = init.attr.max_sge.max(1);
    let srq = p.sv.create_srq(init.attr.max_wr, max_sge)?;
    init.attr.max_sge = max_sge;
    let mut c = ibv_srq::zeroed();
    // SAFETY: live PD.
    c.context = unsafe { (*p.c_ptr()).context };
    c.srq_context = init.srq_context;
    c.pd = pd;
    held.keep();
    Ok(Srq::into_c(Srq::new(c, srq, init.attr)))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    errno_ret("ibv_modify_srq", || {
        non_null!(attr);
        let s = Srq::from_c(srq)?;
        if mask & IBV_SRQ_MAX_WR != 0 {
            return Err(Fail::unsupported("softrdma SRQs cannot be resized"));
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            // SAFETY: readable attr.
            if unsafe { (*attr).srq_limit } != 0 {
                return Err(Fail::unsupported(
                    "softrdma SRQs have no limit event (srq_limit must be 0)",
                ));
            }
            s.attr.lock().unwrap_or_else(|e| e.into_inner()).srq_limit = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    errno_ret("ibv_query_srq", || {
        non_null!(attr);
        let s = Srq::from_c(srq)?;
        // SAFETY: writable attr.
        unsafe { *attr = *s.attr.lock().unwrap_or_else(|e| e.into_inner()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    errno_ret("ibv_destroy_srq", || destroy_srq_impl(srq))
}

/// The body of `ibv_destroy_srq`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn destroy_srq_impl(srq: *mut ibv_srq) -> Res<()> {
    let s = Srq::take_unused(srq, "QPs are still attached to this SRQ")?;
    // SAFETY: our own slot, live while `s` is.
    if let Ok(p) = Pd::from_c(unsafe { (*s.c_ptr()).pd }) {
        p.users.sub();
    }
    crate::xrc::release_xrc_srq(s.xrc);
    drop(s);
    Ok(())
}

// ---- address handles ----

fn ah_from_attr(attr: &ibv_ah_attr) -> Res<sv::Ah> {
    if attr.is_global == 0 {
        crate::ffi::warn(
            "an address handle without a GRH (is_global = 0) has no destination on RoCE: \
             give the peer's GID (ibv_*_pingpong: -g 0)",
        );
        return Err(Fail::inval(
            "is_global is 0: RoCE needs the destination GID",
        ));
    }
    if attr.port_num > 1 {
        return Err(Fail::inval("port_num must be 1"));
    }
    let mut ah = sv::Ah::new(attr.grh.dgid.raw);
    ah.traffic_class = attr.grh.traffic_class;
    if attr.grh.hop_limit != 0 {
        ah.hop_limit = attr.grh.hop_limit;
    }
    Ok(ah)
}

fn create_ah(pd: *mut ibv_pd, attr: &ibv_ah_attr) -> Res<*mut ibv_ah> {
    let p = Pd::from_c(pd)?;
    let ah = ah_from_attr(attr)?;
    // The source GID, as the kernel checks it (`rdma_fill_sgid_attr`).
    p.sv.gid_table().source(attr.grh.sgid_index.into())?;
    let c = ibv_ah {
        // SAFETY: live PD.
        context: unsafe { (*p.c_ptr()).context },
        pd,
        handle: 0,
    };
    p.users.hold()?.keep();
    Ok(Ah::into_c(Ah::new(c, ah)))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    null_ret("ibv_create_ah", || {
        non_null!(attr);
        // SAFETY: a readable ibv_ah_attr.
        create_ah(pd, unsafe { &*attr })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    errno_ret("ibv_destroy_ah", || {
        let a = Ah::take(ah)?;
        // SAFETY: our own slot, live while `a` is.
        if let Ok(p) = Pd::from_c(unsafe { (*a.c_ptr()).pd }) {
            p.users.sub();
        }
        drop(a);
        Ok(())
    })
}

/// The sender's GID from the 40 bytes a UD receive buffer starts with: on
/// RoCE v2 over IPv4 that is 20 unused bytes and the IPv4 header, otherwise
/// an IPv6 header.
fn source_gid(grh: &[u8; 40]) -> [u8; 16] {
    if grh[20] >> 4 == 4 {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&grh[32..36]);
        g
    } else {
        grh[8..24].try_into().expect("16 bytes")
    }
}

fn init_ah_from_wc(wc: &ibv_wc, grh: *const [u8; 40], out: &mut ibv_ah_attr) -> Res<()> {
    if wc.wc_flags & 1 == 0 || grh.is_null() {
        return Err(Fail::inval(
            "the completion has no GRH: RoCE needs one to reply",
        ));
    }
    // SAFETY: the caller passes the 40-byte GRH of the receive buffer.
    let g = unsafe { &*grh };
    *out = ibv_ah_attr::default();
    out.grh.dgid.raw = source_gid(g);
    out.grh.hop_limit = 64;
    out.is_global = 1;
    out.port_num = 1;
    out.sl = wc.sl;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut [u8; 40],
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    minus_one("ibv_init_ah_from_wc", || {
        non_null!(wc, ah_attr);
        Context::from_c(context)?;
        if port_num != 1 {
            return Err(Fail::inval("port_num must be 1"));
        }
        // SAFETY: readable wc, writable ah_attr.
        init_ah_from_wc(unsafe { &*wc }, grh, unsafe { &mut *ah_attr })?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut [u8; 40],
    port_num: u8,
) -> *mut ibv_ah {
    null_ret("ibv_create_ah_from_wc", || {
        non_null!(wc);
        if port_num != 1 {
            return Err(Fail::inval("port_num must be 1"));
        }
        let mut attr = ibv_ah_attr::default();
        // SAFETY: readable wc.
        init_ah_from_wc(unsafe { &*wc }, grh, &mut attr)?;
        create_ah(pd, &attr)
    })
}

// ---- asynchronous events ----

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    minus_one("ibv_get_async_event", || {
        non_null!(event);
        let ctx = Context::from_c(context)?;
        let fd = ctx.sv.async_fd();
        loop {
            if let Some(e) = ctx.sv.get_async_event() {
                let (element, event_type) = match e {
                    sv::AsyncEvent::CqErr(id) => {
                        let cqs = ctx.cqs.lock().unwrap_or_else(|p| p.into_inner());
                        (cqs.get(&id).copied(), IBV_EVENT_CQ_ERR)
                    }
                    sv::AsyncEvent::QpFatal(q)
                    | sv::AsyncEvent::QpReqErr(q)
                    | sv::AsyncEvent::QpAccessErr(q)
                    | sv::AsyncEvent::QpLastWqeReached(q)
                    | sv::AsyncEvent::SqDrained(q) => {
                        let t = match e {
                            sv::AsyncEvent::QpFatal(_) => IBV_EVENT_QP_FATAL,
                            sv::AsyncEvent::QpReqErr(_) => IBV_EVENT_QP_REQ_ERR,
                            sv::AsyncEvent::QpAccessErr(_) => IBV_EVENT_QP_ACCESS_ERR,
                            sv::AsyncEvent::SqDrained(_) => IBV_EVENT_SQ_DRAINED,
                            _ => IBV_EVENT_QP_LAST_WQE_REACHED,
                        };
                        let qps = ctx.qps.lock().unwrap_or_else(|p| p.into_inner());
                        (qps.get(&q).copied(), t)
                    }
                };
                // An event for an object destroyed meanwhile is dropped.
                let Some(element) = element else { continue };
                // SAFETY: checked writable.
                unsafe {
                    *event = ibv_async_event {
                        element: element as *mut c_void,
                        event_type,
                    }
                };
                return Ok(0);
            }
            // The descriptor starts out blocking, as rdma-core's does; an
            // application that set O_NONBLOCK on it (UCX does) gets EAGAIN
            // instead of a wait, as from rdma-core's read of the kernel's
            // event file. UCX calls this from its async thread, which it
            // joins at teardown, and takes EAGAIN as "nothing there": a
            // wait here with nothing queued (an event dropped for a QP
            // destroyed meanwhile, or a wake-up with none pending) hung
            // ucx_perftest's exit in that join.
            if nonblocking(fd) {
                return Err(Fail::new(libc::EAGAIN, "no async event pending"));
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    void_ret("ibv_ack_async_event", || {
        non_null!(event);
        Ok(())
    })
}

/// The channel's `refcnt`, the number of CQs on it, which the application
/// may read (rdma-core keeps it). CQs on one channel are created and
/// destroyed from any thread at once, so every change is one atomic
/// read-modify-write (rdma-core makes them under the context's mutex).
fn channel_refcnt(ch: &CompChannel) -> &AtomicI32 {
    // SAFETY: `refcnt` is a c_int (i32) of the channel's C struct, live
    // while `ch` is (the returned reference borrows it) and aligned for an
    // i32, so for an AtomicI32 (same size and alignment); every write of
    // ours goes through such an atomic, and the application only reads it.
    unsafe { AtomicI32::from_ptr(std::ptr::addr_of_mut!((*ch.c_ptr()).refcnt)) }
}
