//! The data path: the operations in `ibv_context.ops` that verbs.h's static
//! inline `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` jump to.
//!
//! Work request chains are walked one request at a time and each is posted
//! whole or not at all; on the first failure `*bad_wr` names it and the
//! requests after it are not posted, as verbs specifies. Receive SGEs are
//! checked when a message needs them, not at post (`RecvCheck::Deferred`):
//! a userspace provider only writes the WQE, and the RNIC (rxe's
//! responder) finds a bad key when it places data, as a local protection
//! error on the receive and a remote operational error for the sender. Scatter/gather
//! lists are copied onto the stack (no allocation per request).

use std::os::raw::c_int;

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{errno_ret, Fail, Res};
use crate::handles::*;
use crate::non_null;

const MAX_SGE: usize = softrdma_core::MAX_SGE;

/// A request's SGE list, copied: filled, not zeroed first (zeroing the
/// 512 bytes of a `[Sge; MAX_SGE]` was 9 % of a READ's post and poll
/// through this library, measured with `perf record`).
type Sges = arrayvec::ArrayVec<sv::Sge, MAX_SGE>;

/// One application SGE as the verbs crate takes it.
fn sge_from(s: ibv_sge) -> sv::Sge {
    sv::Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// Copy an application's SGE list into `out`.
///
/// # Safety
/// `sg_list` points at `num_sge` readable entries (or `num_sge` is 0).
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int, out: &mut Sges) -> Res<&[sv::Sge]> {
    let n = usize::try_from(num_sge).map_err(|_| Fail::inval("num_sge is negative"))?;
    if n > MAX_SGE {
        return Err(Fail::inval(format!(
            "num_sge {n} exceeds the device's max_sge {MAX_SGE}"
        )));
    }
    if n > 0 && sg_list.is_null() {
        return Err(Fail::inval("sg_list is NULL"));
    }
    out.clear();
    for i in 0..n {
        // SAFETY: the caller's contract; i < n.
        let s = unsafe { *sg_list.add(i) };
        // n ≤ MAX_SGE, the capacity: cannot fail.
        out.push(sge_from(s));
    }
    Ok(out)
}

/// Refuse an opcode [`send_op`] does not know.
fn check_send_opcode(op: u32) -> Res<()> {
    match op {
        IBV_WR_RDMA_WRITE
        | IBV_WR_RDMA_WRITE_WITH_IMM
        | IBV_WR_SEND
        | IBV_WR_SEND_WITH_IMM
        | IBV_WR_RDMA_READ
        | IBV_WR_ATOMIC_CMP_AND_SWP
        | IBV_WR_ATOMIC_FETCH_AND_ADD
        | IBV_WR_SEND_WITH_INV
        | IBV_WR_ATOMIC_WRITE => Ok(()),
        op => Err(Fail::inval(format!(
            "ibv_wr_opcode {op} is not supported (TSO, flush)"
        ))),
    }
}

/// `struct ibv_send_wr` → the operation and its operands, for an opcode
/// [`check_send_opcode`] accepted. Infallible, so the operation is built
/// where it goes: returned inside a `Result` it was built on the stack
/// and moved at another width, a store-forwarding stall per post
/// (`perf annotate` of `ibv_post_send`).
fn send_op(wr: &ibv_send_wr) -> sv::SendOp {
    // SAFETY (all union reads): the opcode says which member the
    // application filled; every member is plain data.
    let rdma = unsafe { wr.wr.rdma };
    let atomic = unsafe { wr.wr.atomic };
    match wr.opcode {
        IBV_WR_RDMA_WRITE => sv::SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => sv::SendOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(wr.imm_data),
        },
        IBV_WR_SEND => sv::SendOp::Send,
        IBV_WR_SEND_WITH_IMM => sv::SendOp::SendWithImm {
            imm: u32::from_be(wr.imm_data),
        },
        IBV_WR_RDMA_READ => sv::SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => sv::SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => sv::SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        IBV_WR_SEND_WITH_INV => sv::SendOp::SendWithInv { rkey: wr.imm_data },
        // The 8 bytes come from the SGE list (or inline data), as rxe takes them.
        IBV_WR_ATOMIC_WRITE => sv::SendOp::AtomicWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        // Refused by `check_send_opcode` before; a SEND rather than a
        // panic if a caller forgot.
        _ => sv::SendOp::Send,
    }
}

pub(crate) fn post_one_send(q: &Qp, wr: &ibv_send_wr) -> Res<()> {
    // Memory window operations carry no scatter/gather list (see `mw`).
    match wr.opcode {
        IBV_WR_BIND_MW => return crate::mw::post_bind_wr(q, wr),
        IBV_WR_LOCAL_INV => return crate::mw::post_local_inv(q, wr),
        _ => {}
    }
    let mut buf = Sges::new();
    // SAFETY: verbs' contract for ibv_post_send: sg_list holds num_sge
    // entries.
    let sgl = unsafe { sges(wr.sg_list, wr.num_sge, &mut buf)? };
    let ud = if q.qp_type == sv::QpType::Ud {
        // SAFETY: a UD QP's requests carry wr.ud.
        let ud = unsafe { wr.wr.ud };
        let ah = Ah::lend(ud.ah)?;
        Some(ah.sv.ud(ud.remote_qpn, ud.remote_qkey))
    } else {
        None
    };
    check_send_opcode(wr.opcode)?;
    let swr = sv::SendWr {
        wr_id: wr.wr_id,
        op: send_op(wr),
        sgl,
        flags: sv::SendFlags(wr.send_flags & IBV_SEND_FLAGS_KNOWN),
        ud,
    };
    if q.qp_type == sv::QpType::XrcSend {
        // SAFETY: as for post_send_unchecked below; an XRC initiator's
        // requests also name the target's SRQ (`qp_type.xrc.remote_srqn`).
        unsafe { q.sv.post_send_xrc_unchecked(&swr, wr.remote_srqn)? };
        return Ok(());
    }
    // SAFETY: verbs' contract: inline SGEs point at readable memory (copied
    // now); the others lie in registered regions the application keeps
    // mapped until the request completes.
    unsafe { q.sv.post_send_unchecked(&swr)? };
    Ok(())
}

/// `ibv_post_send`'s fast path: one WRITE (inline too), READ or atomic of
/// one SGE, signaled or not, or one SEND (with or without immediate;
/// inline and solicited too) of one SGE, that the QP's lane carries out
/// (`Qp::lane_post`). Anything
/// else — or a lane that declines — is `None`, for the general path, which
/// checks, reports and posts it as always.
///
/// # Safety
/// `wr` is null or the application's readable request.
unsafe fn post_send_fast(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> Option<c_int> {
    if wr.is_null() {
        return None;
    }
    // SAFETY: the caller's.
    let w = unsafe { &*wr };
    // A SEND may be inline or solicited too (the lane copies its bytes at
    // post from the region its SGE names, or declines).
    let send = matches!(w.opcode, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM);
    let flags = match w.opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => {
            sv::SendFlags::SIGNALED.0 | sv::SendFlags::INLINE.0 | sv::SendFlags::SOLICITED.0
        }
        IBV_WR_RDMA_WRITE => sv::SendFlags::SIGNALED.0 | sv::SendFlags::INLINE.0,
        _ => sv::SendFlags::SIGNALED.0,
    };
    if !w.next.is_null()
        || w.num_sge != 1
        || w.sg_list.is_null()
        || w.send_flags & !flags != 0
        || !(send
            || matches!(
                w.opcode,
                IBV_WR_RDMA_WRITE
                    | IBV_WR_RDMA_READ
                    | IBV_WR_ATOMIC_CMP_AND_SWP
                    | IBV_WR_ATOMIC_FETCH_AND_ADD
            ))
    {
        return None;
    }
    let q = Qp::lend(qp).ok()?;
    if w.opcode == IBV_WR_RDMA_WRITE {
        // As early as the QP is known: see `Qp::prefetch_write`.
        // SAFETY: a WRITE's request carries `wr.rdma`.
        let rdma = unsafe { w.wr.rdma };
        q.sv.prefetch_write(rdma.remote_addr, rdma.rkey);
    }
    // SAFETY: verbs' contract: sg_list holds num_sge (1) entries.
    let sgl = [sge_from(unsafe { *w.sg_list })];
    let swr = sv::SendWr {
        wr_id: w.wr_id,
        op: send_op(w),
        sgl: &sgl,
        flags: sv::SendFlags(w.send_flags),
        ud: None,
    };
    q.sv.lane_post(&swr).then_some(0)
}

pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: forwarded. A panic there ends in the general path's guard.
    if let Ok(Some(r)) = std::panic::catch_unwind(|| unsafe { post_send_fast(qp, wr) }) {
        return r;
    }
    let mut cur = wr;
    let r = errno_ret("ibv_post_send", || {
        let q = Qp::lend(qp)?;
        let mut n = 0u32;
        while !cur.is_null() {
            if q.max_send_wr > 0 && n >= q.max_send_wr {
                return Err(Fail::new(
                    libc::ENOMEM,
                    format!(
                        "the chain is longer than the send queue (max_send_wr {}): \
                         does its last request's next point back into it?",
                        q.max_send_wr
                    ),
                ));
            }
            n += 1;
            // SAFETY: the application's chain of readable requests.
            let w = unsafe { &*cur };
            post_one_send(&q, w)?;
            cur = w.next;
        }
        Ok(())
    });
    if r != 0 && !bad_wr.is_null() {
        // SAFETY: a writable out-pointer.
        unsafe { *bad_wr = cur };
    }
    r
}

/// Walk a receive chain, posting each request with `post`; on failure
/// `*bad_wr` names the request that failed (verbs' contract).
///
/// # Safety
/// `wr` is the application's chain of readable requests, each `sg_list`
/// holding `num_sge` entries; `bad_wr` is null or writable.
unsafe fn post_recv_chain(
    name: &'static str,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(&sv::RecvWr<'_>) -> Result<(), crate::ffi::Fail>,
) -> c_int {
    let mut cur = wr;
    let r = errno_ret(name, || {
        let mut buf = Sges::new();
        while !cur.is_null() {
            // SAFETY: the application's chain of readable requests.
            let w = unsafe { &*cur };
            // SAFETY: verbs' contract: sg_list holds num_sge entries.
            let sgl = unsafe { sges(w.sg_list, w.num_sge, &mut buf)? };
            post(&sv::RecvWr {
                wr_id: w.wr_id,
                sgl,
            })?;
            cur = w.next;
        }
        Ok(())
    });
    if r != 0 && !bad_wr.is_null() {
        // SAFETY: a writable out-pointer.
        unsafe { *bad_wr = cur };
    }
    r
}

pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the chain and out-pointer come from the application under
    // verbs' contract; the QP is looked up on each post.
    unsafe {
        post_recv_chain("ibv_post_recv", wr, bad_wr, |r| {
            Ok(Qp::lend(qp)?.sv.post_recv_deferred(r)?)
        })
    }
}

pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as for post_recv; the SRQ is looked up on each post.
    unsafe {
        post_recv_chain("ibv_post_srq_recv", wr, bad_wr, |r| {
            Ok(Srq::lend(srq)?.sv.post_recv_deferred(r)?)
        })
    }
}

fn wc_from(c: &sv::Completion) -> ibv_wc {
    let with_imm = c.wc_flags & sv::wc_flags::WITH_IMM != 0;
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as u32,
        opcode: c.opcode as u32,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        // Immediate data goes back to network order; an invalidated rkey
        // stays a plain number.
        imm_data: if with_imm {
            c.imm_or_inv.to_be()
        } else {
            c.imm_or_inv
        },
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: c.wc_flags,
        pkey_index: 0,
        slid: 0,
        sl: c.sl,
        dlid_path_bits: 0,
    }
}

/// Completions moved per call through the engine's way (a stack buffer).
const POLL_BATCH: usize = 32;

/// `ibv_poll_cq`'s fast path: completions the CQ's lanes hold, converted
/// where they lie; `None` when they hold none (or the arguments need the
/// general path's checks), for the general path.
///
/// # Safety
/// `wc` is null or valid for writing `num_entries` entries.
unsafe fn poll_cq_fast(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> Option<c_int> {
    if num_entries <= 0 || wc.is_null() {
        return None;
    }
    let q = Cq::lend(cq).ok()?;
    let mut i = 0usize;
    let n = q.sv.poll_lanes(num_entries as usize, &mut |c| {
        // SAFETY: the caller's: the lanes hand at most `num_entries`.
        unsafe { *wc.add(i) = wc_from(c) };
        i += 1;
    });
    (n > 0).then_some(n as c_int)
}

pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: forwarded. A panic there ends in the general path's guard.
    if let Ok(Some(n)) = std::panic::catch_unwind(|| unsafe { poll_cq_fast(cq, num_entries, wc) }) {
        return n;
    }
    let mut done = 0usize;
    let r = errno_ret("ibv_poll_cq", || {
        let q = Cq::lend(cq)?;
        let want =
            usize::try_from(num_entries).map_err(|_| Fail::inval("num_entries is negative"))?;
        if want > 0 {
            non_null!(wc);
        }
        // A latency loop polls for one completion at a time: its buffer is
        // one entry, not the 1.5 KB of a batch to initialise per call.
        if want == 1 {
            // SAFETY: forwarded (num_entries writable ibv_wc).
            done = unsafe { poll_into::<1>(&q.sv, wc, want)? };
        } else {
            // SAFETY: as above.
            done = unsafe { poll_into::<POLL_BATCH>(&q.sv, wc, want)? };
        }
        Ok(())
    });
    if r != 0 {
        -r
    } else {
        done as c_int
    }
}

/// Move up to `want` completions into `wc`, each converted where the
/// device holds it (`Cq::poll_with`); `N` is the stack buffer the engine's
/// way moves completions through.
///
/// # Safety
/// `wc` is valid for writing `want` entries.
unsafe fn poll_into<const N: usize>(cq: &sv::Cq, wc: *mut ibv_wc, want: usize) -> Res<usize> {
    let mut buf = [sv::Completion::default(); N];
    let mut done = 0usize;
    while done < want {
        let chunk = (want - done).min(N);
        let mut i = done;
        let n = cq.poll_with(&mut buf[..chunk], &mut |c| {
            // SAFETY: the caller's: the device hands at most `chunk`, so
            // `i < done + chunk <= want`.
            unsafe { *wc.add(i) = wc_from(c) };
            i += 1;
        })?;
        done += n;
        if n < chunk {
            break;
        }
    }
    Ok(done)
}

pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    errno_ret("ibv_req_notify_cq", || {
        let q = Cq::lend(cq)?;
        q.sv.req_notify(solicited_only != 0)?;
        Ok(())
    })
}

// ---- the extended CQ (`struct ibv_cq_ex`) ----
//
// verbs.h's inline `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and
// `ibv_wc_read_*` call these through the CQ's own function pointers. A poll
// makes one completion current: its status and work request id go into
// the structure (the application reads them there), the rest is read
// through the `read_*` functions until the next poll. verbs requires the
// poll calls of one CQ to be serialised by the application; the current
// completion is behind a lock anyway, so a race costs a wrong answer to
// that application, never memory.

/// Make the next completion current: 0, ENOENT when the CQ is empty, or
/// an errno.
fn poll_ex(name: &'static str, cq: *mut ibv_cq_ex) -> c_int {
    let mut empty = false;
    let r = errno_ret(name, || {
        let q = Cq::lend_ex(cq)?;
        let mut got = [sv::Completion::default(); 1];
        let n = q.sv.poll(&mut got)?;
        let mut cur = q.current.lock().unwrap_or_else(|e| e.into_inner());
        if n == 0 {
            *cur = None;
            empty = true;
            return Ok(());
        }
        let c = got[0];
        // SAFETY: the CQ's own live slot; the application reads these two
        // fields after this returns, as verbs.h defines.
        unsafe {
            (*q.ex_ptr()).status = c.status as u32;
            (*q.ex_ptr()).wr_id = c.wr_id;
        }
        *cur = Some(c);
        Ok(())
    });
    if r == 0 && empty {
        libc::ENOENT
    } else {
        r
    }
}

pub unsafe extern "C" fn cq_ex_start_poll(
    cq: *mut ibv_cq_ex,
    attr: *mut ibv_poll_cq_attr,
) -> c_int {
    let r = errno_ret("ibv_start_poll", || {
        non_null!(attr);
        // SAFETY: the caller passes a readable ibv_poll_cq_attr.
        match unsafe { (*attr).comp_mask } {
            0 => Ok(()),
            m => Err(Fail::inval(format!(
                "ibv_poll_cq_attr.comp_mask {m:#x}: no attributes are defined"
            ))),
        }
    });
    if r != 0 {
        return r;
    }
    poll_ex("ibv_start_poll", cq)
}

pub unsafe extern "C" fn cq_ex_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    poll_ex("ibv_next_poll", cq)
}

pub unsafe extern "C" fn cq_ex_end_poll(cq: *mut ibv_cq_ex) {
    crate::ffi::void_ret("ibv_end_poll", || {
        let q = Cq::lend_ex(cq)?;
        *q.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    })
}

/// A field of the current completion, as `ibv_wc` has it (0 outside a
/// poll, or for a pointer that is not a live CQ).
fn current_wc(cq: *mut ibv_cq_ex) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: 0,
        status: 0,
        opcode: 0,
        vendor_err: 0,
        byte_len: 0,
        imm_data: 0,
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    };
    crate::ffi::void_ret("ibv_wc_read_*", || {
        let q = Cq::lend_ex(cq)?;
        match *q.current.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(c) => wc = wc_from(&c),
            None => {
                return Err(Fail::inval(
                    "no current completion (call ibv_start_poll first)",
                ))
            }
        }
        Ok(())
    });
    wc
}

pub unsafe extern "C" fn cq_ex_read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).opcode
}
pub unsafe extern "C" fn cq_ex_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).vendor_err
}
pub unsafe extern "C" fn cq_ex_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).byte_len
}
/// Immediate data in network order, or the invalidated rkey.
pub unsafe extern "C" fn cq_ex_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).imm_data
}
pub unsafe extern "C" fn cq_ex_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).qp_num
}
pub unsafe extern "C" fn cq_ex_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).src_qp
}
pub unsafe extern "C" fn cq_ex_read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).wc_flags
}
pub unsafe extern "C" fn cq_ex_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    current_wc(cq).slid as u32
}
pub unsafe extern "C" fn cq_ex_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    current_wc(cq).sl
}
pub unsafe extern "C" fn cq_ex_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    current_wc(cq).dlid_path_bits
}

/// Point a CQ's extended-poll functions at this module.
pub fn fill_cq_ex_ops(c: &mut ibv_cq_ex) {
    c.start_poll = Some(cq_ex_start_poll);
    c.next_poll = Some(cq_ex_next_poll);
    c.end_poll = Some(cq_ex_end_poll);
    c.read_opcode = Some(cq_ex_read_opcode);
    c.read_vendor_err = Some(cq_ex_read_vendor_err);
    c.read_byte_len = Some(cq_ex_read_byte_len);
    c.read_imm_data = Some(cq_ex_read_imm_data);
    c.read_qp_num = Some(cq_ex_read_qp_num);
    c.read_src_qp = Some(cq_ex_read_src_qp);
    c.read_wc_flags = Some(cq_ex_read_wc_flags);
    c.read_slid = Some(cq_ex_read_slid);
    c.read_sl = Some(cq_ex_read_sl);
    c.read_dlid_path_bits = Some(cq_ex_read_dlid_path_bits);
}
