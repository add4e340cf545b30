//! The extended QP: `ibv_create_qp_ex` with send-ops flags, and the
//! `ibv_wr_*` post interface (`struct ibv_qp_ex`'s functions, which verbs.h's
//! inlines call).
//!
//! `ibv_wr_start` opens a batch; each `ibv_wr_<opcode>` begins a work
//! request with the `wr_id` and `wr_flags` the application left in the
//! structure; `ibv_wr_set_*` fill in the request begun last; and
//! `ibv_wr_complete` posts the batch through the same path as
//! `ibv_post_send`, in order. These functions return nothing, so a mistake
//! while building (a setter with no request begun, an operation the device
//! does not have, a NULL pointer) is remembered and `ibv_wr_complete`
//! returns its errno without posting anything, as rdma-core's providers
//! do. A request that the post path itself refuses (a full send queue, a
//! bad state) fails `ibv_wr_complete` with that errno; the requests before
//! it in the batch have been posted then (verbs gives `ibv_wr_complete` no
//! `bad_wr` to say which, and rxe's provider, which checks only the queue
//! space while building, has the same gap for everything else).
//!
//! The batch is kept per QP and reused: after the first batches, building
//! and posting allocate nothing. Inline data is copied when it is set, as
//! a provider copies it into the WQE, so the application may reuse its
//! buffer at once.

use std::os::raw::{c_int, c_void};

use crate::abi::*;
use crate::ffi::{errno_ret, void_ret, Fail, Res};
use crate::handles::*;

/// `IBV_SEND_INLINE`.
const SEND_INLINE: u32 = 1 << 3;

/// One request of a batch, as `ibv_send_wr` would carry it; its SGEs and
/// inline bytes live in the batch's arrays.
#[derive(Clone, Copy, Default)]
struct Pending {
    wr_id: u64,
    opcode: u32,
    flags: u32,
    /// Immediate data (network order) or the rkey to invalidate.
    imm: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    /// UD: the address handle (as a number: it is looked up at post), QPN
    /// and Q_Key.
    ud: Option<(usize, u32, u32)>,
    /// Bind: the window, the new rkey, and the bind info's MR (a number,
    /// looked up at post), address, length and access.
    bind: Option<(usize, u32, usize, u64, u64, u32)>,
    /// XRC: the remote SRQ number (`ibv_wr_set_xrc_srqn`).
    xrc_srqn: u32,
    /// `sges[start..start + n]`.
    sge: (usize, usize),
    /// `inline[start..start + n]`, when inline data was set.
    inline: Option<(usize, usize)>,
}

/// The work requests built since `ibv_wr_start`.
#[derive(Default)]
pub struct Batch {
    open: bool,
    /// The first mistake made while building: `ibv_wr_complete` returns it.
    err: Option<Fail>,
    wrs: Vec<Pending>,
    sges: Vec<ibv_sge>,
    inline: Vec<u8>,
}

impl Batch {
    fn clear(&mut self) {
        self.err = None;
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
    }

    fn fail(&mut self, f: Fail) {
        crate::ffi::note(&format!("ibv_wr_*: {}", f.why));
        if self.err.is_none() {
            self.err = Some(f);
        }
    }

    /// Forget the SGEs the request begun last set before, if they are the
    /// batch's last (a setter called again replaces them): calling a
    /// setter over and over does not grow the batch.
    fn drop_last_sges(&mut self) {
        if let Some(p) = self.wrs.last() {
            if p.sge.1 > 0 && p.sge.0 + p.sge.1 == self.sges.len() {
                self.sges.truncate(p.sge.0);
            }
        }
    }

    /// The request begun last, for a setter.
    fn last(&mut self, what: &str) -> Option<&mut Pending> {
        if !self.open {
            self.fail(Fail::inval(format!(
                "{what} outside ibv_wr_start/ibv_wr_complete"
            )));
            return None;
        }
        if self.wrs.is_empty() {
            self.fail(Fail::inval(format!("{what} before any ibv_wr_<opcode>")));
            return None;
        }
        self.wrs.last_mut()
    }
}

/// Run `f` on the QP's batch; failures to find the QP are only logged
/// (these functions return nothing).
fn with_batch(name: &'static str, qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Batch)) {
    void_ret(name, || {
        let q = Qp::lend_ex(qp)?;
        let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
        f(&q, &mut b);
        Ok(())
    })
}

/// Begin a request of `opcode` with the id and flags the application set.
fn begin(name: &'static str, qp: *mut ibv_qp_ex, opcode: u32, fill: impl FnOnce(&mut Pending)) {
    with_batch(name, qp, |q, b| {
        if !b.open {
            b.fail(Fail::inval(format!(
                "{name} outside ibv_wr_start/ibv_wr_complete"
            )));
            return;
        }
        // SAFETY: the QP's own live slot; the application wrote these two
        // fields before this call, as verbs.h's interface has it.
        let (wr_id, flags) = unsafe { ((*q.ex_ptr()).wr_id, (*q.ex_ptr()).wr_flags) };
        let mut p = Pending {
            wr_id,
            opcode,
            flags,
            sge: (b.sges.len(), 0),
            ..Default::default()
        };
        // A provider's send queue holds no more than max_send_wr requests;
        // a batch is bounded the same way (mlx5 fails the build with
        // ENOMEM too), so an application that never completes one cannot
        // grow it without end.
        if b.wrs.len() >= q.max_send_wr as usize {
            b.fail(Fail::new(
                libc::ENOMEM,
                format!(
                    "{name}: the batch holds max_send_wr ({}) requests already",
                    q.max_send_wr
                ),
            ));
            return;
        }
        fill(&mut p);
        b.wrs.push(p);
    })
}

/// An operation this device does not have: remembered for `ibv_wr_complete`.
fn unsupported(name: &'static str, qp: *mut ibv_qp_ex, why: &'static str) {
    with_batch(name, qp, |_, b| b.fail(Fail::unsupported(why)))
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_batch("ibv_wr_start", qp, |_, b| {
        b.clear();
        b.open = true;
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_batch("ibv_wr_abort", qp, |_, b| {
        b.clear();
        b.open = false;
    })
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    errno_ret("ibv_wr_complete", || {
        let q = Qp::lend_ex(qp)?;
        let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
        if !b.open {
            return Err(Fail::inval("ibv_wr_complete without ibv_wr_start"));
        }
        b.open = false;
        if let Some(f) = b.err.take() {
            b.clear();
            return Err(f);
        }
        let r = post_batch(&q, &b);
        b.clear();
        r
    })
}

/// Post a batch's requests in order.
fn post_batch(q: &Qp, b: &Batch) -> Res<()> {
    for p in &b.wrs {
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = p.wr_id;
        wr.opcode = p.opcode;
        wr.send_flags = p.flags;
        wr.imm_data = p.imm;
        wr.remote_srqn = p.xrc_srqn;
        let mut inline_sge;
        if let Some((start, n)) = p.inline {
            inline_sge = ibv_sge {
                addr: b.inline[start..start + n].as_ptr() as u64,
                length: n as u32,
                lkey: 0,
            };
            wr.sg_list = &mut inline_sge;
            wr.num_sge = if n == 0 { 0 } else { 1 };
            wr.send_flags |= SEND_INLINE;
        } else {
            let (start, n) = p.sge;
            // The post path only reads the list.
            wr.sg_list = b.sges[start..start + n].as_ptr().cast_mut();
            wr.num_sge = n as c_int;
        }
        match p.opcode {
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
                wr.wr.atomic = ibv_atomic_wr {
                    remote_addr: p.remote_addr,
                    compare_add: p.compare_add,
                    swap: p.swap,
                    rkey: p.rkey,
                }
            }
            _ => {
                if let Some((ah, qpn, qkey)) = p.ud {
                    wr.wr.ud = ibv_ud_wr {
                        ah: ah as *mut ibv_ah,
                        remote_qpn: qpn,
                        remote_qkey: qkey,
                    };
                } else {
                    wr.wr.rdma = ibv_rdma_wr {
                        remote_addr: p.remote_addr,
                        rkey: p.rkey,
                    };
                }
            }
        }
        if let Some((mw, rkey, mr, addr, length, access)) = p.bind {
            wr.bind_mw = ibv_send_wr_bind_mw {
                mw: mw as *mut ibv_mw,
                rkey,
                bind_info: ibv_mw_bind_info {
                    mr: mr as *mut ibv_mr,
                    addr,
                    length,
                    mw_access_flags: access,
                },
            };
        }
        if q.qp_type == softrdma_verbs::QpType::Ud && p.ud.is_none() {
            return Err(Fail::inval(
                "a UD QP's request needs ibv_wr_set_ud_addr before ibv_wr_complete",
            ));
        }
        crate::datapath::post_one_send(q, &wr)?;
    }
    Ok(())
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    begin("ibv_wr_send", qp, IBV_WR_SEND, |_| {})
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    begin("ibv_wr_send_imm", qp, IBV_WR_SEND_WITH_IMM, |p| p.imm = imm)
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin("ibv_wr_send_inv", qp, IBV_WR_SEND_WITH_INV, |p| {
        p.imm = rkey
    })
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin("ibv_wr_rdma_write", qp, IBV_WR_RDMA_WRITE, |p| {
        p.rkey = rkey;
        p.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    begin(
        "ibv_wr_rdma_write_imm",
        qp,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.imm = imm;
        },
    )
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin("ibv_wr_rdma_read", qp, IBV_WR_RDMA_READ, |p| {
        p.rkey = rkey;
        p.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        "ibv_wr_atomic_cmp_swp",
        qp,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.compare_add = compare;
            p.swap = swap;
        },
    )
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin(
        "ibv_wr_atomic_fetch_add",
        qp,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.compare_add = add;
        },
    )
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin("ibv_wr_local_inv", qp, IBV_WR_LOCAL_INV, |p| p.imm = rkey)
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if info.is_null() {
        with_batch("ibv_wr_bind_mw", qp, |_, b| {
            b.fail(Fail::inval("ibv_wr_bind_mw: bind_info is NULL"))
        });
        return;
    }
    // SAFETY: a readable ibv_mw_bind_info (checked non-NULL), copied now.
    let i = unsafe { &*info };
    let (mr, addr, length, access) = (i.mr as usize, i.addr, i.length, i.mw_access_flags);
    begin("ibv_wr_bind_mw", qp, IBV_WR_BIND_MW, |p| {
        p.bind = Some((mw as usize, rkey, mr, addr, length, access));
    })
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    unsupported(
        "ibv_wr_send_tso",
        qp,
        "TSO is for raw packet QPs, which this device does not have",
    )
}

/// `ibv_wr_atomic_write`: the 8 bytes at `value` are copied now, as inline
/// data of the request.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    value: *const c_void,
) {
    if value.is_null() {
        with_batch("ibv_wr_atomic_write", qp, |_, b| {
            b.fail(Fail::inval("ibv_wr_atomic_write: atomic_wr is NULL"))
        });
        return;
    }
    // SAFETY: verbs.h's contract: `value` points at the 8 bytes to write.
    let word: [u8; 8] = unsafe { std::ptr::read_unaligned(value.cast::<[u8; 8]>()) };
    begin("ibv_wr_atomic_write", qp, IBV_WR_ATOMIC_WRITE, |p| {
        p.rkey = rkey;
        p.remote_addr = remote_addr;
    });
    with_batch("ibv_wr_atomic_write", qp, |_, b| {
        let start = b.inline.len();
        if let Some(p) = b.wrs.last_mut().filter(|p| p.opcode == IBV_WR_ATOMIC_WRITE) {
            p.inline = Some((start, 8));
            b.inline.extend_from_slice(&word);
        }
    })
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, srqn: u32) {
    with_batch("ibv_wr_set_xrc_srqn", qp, |_, b| {
        if let Some(p) = b.last("ibv_wr_set_xrc_srqn") {
            p.xrc_srqn = srqn;
        }
    })
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    with_batch("ibv_wr_set_ud_addr", qp, |_, b| {
        if let Some(p) = b.last("ibv_wr_set_ud_addr") {
            p.ud = Some((ah as usize, qpn, qkey));
        }
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_batch("ibv_wr_set_sge", qp, |_, b| {
        b.drop_last_sges();
        let start = b.sges.len();
        if let Some(p) = b.last("ibv_wr_set_sge") {
            p.sge = (start, 1);
            p.inline = None;
            b.sges.push(ibv_sge { addr, length, lkey });
        }
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    with_batch("ibv_wr_set_sge_list", qp, |_, b| {
        b.drop_last_sges();
        let start = b.sges.len();
        if b.last("ibv_wr_set_sge_list").is_none() {
            return;
        }
        if n > 0 && list.is_null() {
            b.fail(Fail::inval("ibv_wr_set_sge_list: sg_list is NULL"));
            return;
        }
        if n > softrdma_core::MAX_SGE {
            b.fail(Fail::inval(format!(
                "ibv_wr_set_sge_list: {n} SGEs exceed the device's max_sge {}",
                softrdma_core::MAX_SGE
            )));
            return;
        }
        for i in 0..n {
            // SAFETY: the caller passes n readable entries (checked
            // non-NULL above); each is copied now.
            b.sges.push(unsafe { *list.add(i) });
        }
        if let Some(p) = b.wrs.last_mut() {
            p.sge = (start, n);
            p.inline = None;
        }
    })
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ibv_data_buf { addr, length };
    // SAFETY: one entry, on this stack.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    with_batch("ibv_wr_set_inline_data", qp, |q, b| {
        if b.last("ibv_wr_set_inline_data").is_none() {
            return;
        }
        if n > 0 && list.is_null() {
            b.fail(Fail::inval("ibv_wr_set_inline_data_list: buf_list is NULL"));
            return;
        }
        let max = q.max_inline_data as usize;
        let start = b.inline.len();
        let mut total = 0usize;
        for i in 0..n {
            // SAFETY: the caller passes n readable entries.
            let d = unsafe { *list.add(i) };
            total = total.saturating_add(d.length);
            if total > max {
                b.inline.truncate(start);
                b.fail(Fail::inval(format!(
                    "ibv_wr_set_inline_data: {total}+ bytes exceed the QP's max_inline_data {max}"
                )));
                return;
            }
            if d.length > 0 {
                if d.addr.is_null() {
                    b.inline.truncate(start);
                    b.fail(Fail::inval("ibv_wr_set_inline_data: addr is NULL"));
                    return;
                }
                // SAFETY: the caller's buffer of d.length readable bytes,
                // copied now (the application may reuse it on return).
                let s = unsafe { std::slice::from_raw_parts(d.addr as *const u8, d.length) };
                b.inline.extend_from_slice(s);
            }
        }
        if let Some(p) = b.wrs.last_mut() {
            p.inline = Some((start, total));
            p.sge = (b.sges.len(), 0);
        }
    })
}

/// Point a QP's `ibv_wr_*` functions at this module.
pub fn fill_qp_ex_ops(c: &mut ibv_qp_ex) {
    c.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    c.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    c.wr_bind_mw = Some(wr_bind_mw);
    c.wr_local_inv = Some(wr_local_inv);
    c.wr_rdma_read = Some(wr_rdma_read);
    c.wr_rdma_write = Some(wr_rdma_write);
    c.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    c.wr_send = Some(wr_send);
    c.wr_send_imm = Some(wr_send_imm);
    c.wr_send_inv = Some(wr_send_inv);
    c.wr_send_tso = Some(wr_send_tso);
    c.wr_set_ud_addr = Some(wr_set_ud_addr);
    c.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    c.wr_set_inline_data = Some(wr_set_inline_data);
    c.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    c.wr_set_sge = Some(wr_set_sge);
    c.wr_set_sge_list = Some(wr_set_sge_list);
    c.wr_start = Some(wr_start);
    c.wr_complete = Some(wr_complete);
    c.wr_abort = Some(wr_abort);
    c.wr_atomic_write = Some(wr_atomic_write);
}

/// `IBV_QP_EX_WITH_*` this device executes: RDMA WRITE (and with
/// immediate), SEND (with immediate, with invalidate), RDMA READ, both
/// atomics, local invalidate, memory window bind and ATOMIC WRITE. Not TSO
/// (raw packet QPs).
pub const SEND_OPS_SUPPORTED: u64 = 0x3ff | 1 << 12;
