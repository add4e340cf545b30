//! The C ABI called the way a C program calls it, inside one process: bad
//! arguments are refused in each function's own error convention (never a
//! crash), unimplemented entry points say so, and an RC and a UD exchange
//! between two QPs go through the operations table.

use std::os::raw::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Once;

use crate::abi::*;
use crate::datapath;
use crate::device::*;
use crate::misc::*;
use crate::qp::*;
use crate::resources::*;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub(crate) fn one_device() {
    static INIT: Once = Once::new();
    // SAFETY (set_var): every test sets the same value before any read.
    INIT.call_once(|| std::env::set_var("SOFTRDMA_DEVICES", "srdma0=127.0.0.1"));
}

#[test]
fn null_and_foreign_pointers_are_refused_not_dereferenced() {
    // SAFETY: the point of the test: every call gets NULL or a pointer to
    // memory that is not one of our objects, and must refuse it.
    unsafe {
        assert_eq!(ibv_close_device(null_mut()), libc::EINVAL);
        assert!(ibv_open_device(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibv_alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv_dealloc_pd(null_mut()), libc::EINVAL);
        assert!(ibv_reg_mr(null_mut(), null_mut(), 0, 0).is_null());
        assert_eq!(ibv_dereg_mr(null_mut()), libc::EINVAL);
        assert!(ibv_create_cq(null_mut(), 1, null_mut(), null_mut(), 0).is_null());
        assert_eq!(ibv_destroy_cq(null_mut()), libc::EINVAL);
        assert!(ibv_create_qp(null_mut(), null_mut()).is_null());
        assert_eq!(ibv_modify_qp(null_mut(), null_mut(), 0), libc::EINVAL);
        assert_eq!(ibv_destroy_qp(null_mut()), libc::EINVAL);
        assert_eq!(ibv_query_gid(null_mut(), 1, 0, null_mut()), -1);
        assert_eq!(ibv_get_cq_event(null_mut(), null_mut(), null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        ibv_ack_cq_events(null_mut(), 1);
        assert!(ibv_get_device_name(null_mut()).is_null());
        assert_eq!(ibv_get_device_guid(null_mut()), 0);
        assert_eq!(datapath::poll_cq(null_mut(), 1, null_mut()), -libc::EINVAL);
        let mut bad: *mut ibv_send_wr = null_mut();
        assert_eq!(
            datapath::post_send(null_mut(), null_mut(), &mut bad),
            libc::EINVAL
        );

        // Memory that is not one of our objects: not in the registry, so
        // refused without being read.
        let mut junk = [0u64; 64];
        let p = junk.as_mut_ptr().cast::<c_void>();
        assert_eq!(ibv_dealloc_pd(p.cast()), libc::EINVAL);
        assert_eq!(ibv_destroy_qp(p.cast()), libc::EINVAL);
        assert_eq!(datapath::poll_cq(p.cast(), 1, null_mut()), -libc::EINVAL);
        assert!(ibv_alloc_pd(junk.as_mut_ptr().add(40).cast()).is_null());
    }
}

#[test]
fn unimplemented_entry_points_fail_cleanly() {
    assert_eq!(ibv_cmd_create_qp(), libc::EOPNOTSUPP);
    assert!(ibv_import_dm().is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);
    assert!(verbs_open_device().is_null());
    verbs_register_driver_34(null());
    verbs_set_ops();
    assert_eq!(__ioctl_final_num_attrs(7, null_mut()), 7);
    assert_eq!(ibv_fork_init(), 0);
    assert_eq!(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
    assert_eq!(ibv_read_sysfs_file(null(), null(), null_mut(), 0), -1);
}

#[test]
fn strings_and_rates() {
    let s = |p: *const std::os::raw::c_char| {
        // SAFETY: the functions return static NUL-terminated strings.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(s(ibv_wc_status_str(0)), "success");
    assert_eq!(s(ibv_wc_status_str(5)), "Work Request Flushed Error");
    assert_eq!(s(ibv_wc_status_str(999)), "unknown");
    assert_eq!(s(ibv_port_state_str(4)), "PORT_ACTIVE");
    assert_eq!(s(ibv_node_type_str(1)), "InfiniBand channel adapter");
    assert_eq!(
        s(ibv_event_type_str(3)),
        "local access violation work queue error"
    );
    assert_eq!(ibv_rate_to_mult(3), 4); // 10 Gb/s
    assert_eq!(mult_to_ibv_rate(4), 3);
    assert_eq!(ibv_rate_to_mbps(16), 103_125); // 100 Gb/s
    assert_eq!(mbps_to_ibv_rate(103_125), 16);
    assert_eq!(ibv_rate_to_mult(99), -1);
}

/// Everything one side of a test exchange owns.
struct Side {
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    buf: Vec<u8>,
    mr: *mut ibv_mr,
}

/// A QP's creation attributes as a C program fills them: `depth` work
/// requests of one SGE each way, no SRQ, no inline data.
pub(crate) fn qp_init_attr(
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    qp_type: u32,
    depth: u32,
    sq_sig_all: c_int,
) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq,
        recv_cq,
        srq: null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type,
        sq_sig_all,
    }
}

unsafe fn open_first() -> *mut ibv_context {
    one_device();
    let mut n = 0;
    // SAFETY: as a C program would call them.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        assert!(n >= 1 && !list.is_null());
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null(), "open: errno {}", errno());
        ctx
    }
}

unsafe fn side(ctx: *mut ibv_context, qp_type: u32) -> Side {
    // SAFETY: as a C program would call them.
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        let mut buf = vec![0u8; 8192];
        let access = 1 | 2 | 4 | 8 | (1 << 20); // + RELAXED_ORDERING
        let mr = ibv_reg_mr_iova2(
            pd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            buf.as_ptr() as u64,
            access,
        );
        assert!(!mr.is_null(), "reg_mr: errno {}", errno());
        let cq = ibv_create_cq(ctx, 64, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        let mut init = qp_init_attr(cq, cq, qp_type, 16, 1);
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null(), "create_qp: errno {}", errno());
        assert!(init.cap.max_send_wr >= 16);
        Side {
            pd,
            cq,
            qp,
            buf,
            mr,
        }
    }
}

unsafe fn to_rts(s: &Side, gid: ibv_gid, peer_qpn: u32, qp_type: u32) {
    // SAFETY: as a C program would call them.
    unsafe {
        let mut a = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            qp_access_flags: 1 | 2 | 4 | 8,
            qkey: 0x1111_1111,
            ..Default::default()
        };
        let init_mask = if qp_type == 4 { 0x71 } else { 0x39 };
        assert_eq!(ibv_modify_qp(s.qp, &mut a, init_mask), 0);
        assert_eq!((*s.qp).state, 1);
        let mut a = ibv_qp_attr {
            qp_state: 2,
            path_mtu: 3,
            dest_qp_num: peer_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.hop_limit = 1;
        // UCX 1.13's "auto": the kernel keeps the low 20 bits and checks
        // nothing, so must we.
        a.ah_attr.grh.flow_label = 0xffff_ffff;
        a.ah_attr.port_num = 1;
        let rtr_mask = if qp_type == 4 { 1 } else { 0x129181 };
        assert_eq!(ibv_modify_qp(s.qp, &mut a, rtr_mask), 0);
        let mut a = ibv_qp_attr {
            qp_state: 3,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts_mask = if qp_type == 4 { 0x10001 } else { 0x12e01 };
        assert_eq!(ibv_modify_qp(s.qp, &mut a, rts_mask), 0);
        assert_eq!((*s.qp).state, 3);
    }
}

unsafe fn poll_one(cq: *mut ibv_cq) -> ibv_wc {
    let mut wc = ibv_wc::default();
    let t0 = std::time::Instant::now();
    loop {
        // SAFETY: through the operations table, as verbs.h's inline does.
        let n = unsafe { ((*(*cq).context).ops.poll_cq.unwrap())(cq, 1, &mut wc) };
        assert!(n >= 0);
        if n == 1 {
            return wc;
        }
        assert!(t0.elapsed().as_secs() < 10, "no completion");
    }
}

unsafe fn teardown(s: Side) {
    // SAFETY: as a C program would call them, in the required order.
    unsafe {
        assert_eq!(ibv_destroy_cq(s.cq), libc::EBUSY, "a CQ in use is busy");
        assert_eq!(ibv_destroy_qp(s.qp), 0);
        assert_eq!(ibv_dealloc_pd(s.pd), libc::EBUSY, "a PD with an MR is busy");
        assert_eq!(ibv_dereg_mr(s.mr), 0);
        assert_eq!(ibv_destroy_cq(s.cq), 0);
        assert_eq!(ibv_dealloc_pd(s.pd), 0);
        assert_eq!(ibv_dealloc_pd(s.pd), libc::EINVAL, "a freed PD is refused");
    }
    drop(s.buf);
}

#[test]
fn rc_send_with_immediate_and_rdma_write_through_the_ops_table() {
    // SAFETY: as a C program would call them; buffers outlive their MRs.
    unsafe {
        let ctx = open_first();
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let mut a = side(ctx, 2);
        let mut b = side(ctx, 2);
        to_rts(&a, gid, (*b.qp).qp_num, 2);
        to_rts(&b, gid, (*a.qp).qp_num, 2);

        // b posts a receive; a sends 5 bytes with immediate data.
        let mut rsge = ibv_sge {
            addr: b.buf.as_mut_ptr() as u64,
            length: 4096,
            lkey: (*b.mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 7,
            next: null_mut(),
            sg_list: &mut rsge,
            num_sge: 1,
        };
        let mut bad_r = null_mut();
        assert_eq!(
            ((*ctx).ops.post_recv.unwrap())(b.qp, &mut rwr, &mut bad_r),
            0
        );
        a.buf[..5].copy_from_slice(b"hello");
        let mut ssge = ibv_sge {
            addr: a.buf.as_ptr() as u64,
            length: 5,
            lkey: (*a.mr).lkey,
        };
        let mut swr = ibv_send_wr::zeroed();
        swr.wr_id = 9;
        swr.sg_list = &mut ssge;
        swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND_WITH_IMM;
        swr.send_flags = 2;
        swr.imm_data = 0x1234_5678u32.to_be();
        let mut bad = null_mut();
        assert_eq!(((*ctx).ops.post_send.unwrap())(a.qp, &mut swr, &mut bad), 0);
        let wc = poll_one(a.cq);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (9, 0, 0));
        let wc = poll_one(b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (7, 0, 128, 5)
        );
        assert_eq!(wc.wc_flags & 2, 2, "WITH_IMM");
        assert_eq!(u32::from_be(wc.imm_data), 0x1234_5678);
        assert_eq!(wc.qp_num, (*b.qp).qp_num);
        assert_eq!(&b.buf[..5], b"hello");

        // An RDMA WRITE into b's buffer at offset 100.
        a.buf[..4].copy_from_slice(b"RDMA");
        swr.opcode = IBV_WR_RDMA_WRITE;
        swr.wr_id = 10;
        (*swr.sg_list).length = 4;
        swr.wr.rdma = ibv_rdma_wr {
            remote_addr: b.buf.as_ptr() as u64 + 100,
            rkey: (*b.mr).rkey,
        };
        assert_eq!(((*ctx).ops.post_send.unwrap())(a.qp, &mut swr, &mut bad), 0);
        let wc = poll_one(a.cq);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (10, 0, 1));
        assert_eq!(&b.buf[100..104], b"RDMA");

        // A chain that loops back on itself ends once it is longer than
        // the send queue: ENOMEM, naming the request it stopped at (it
        // used to post forever where WRITEs complete at post).
        let mut looped = ibv_send_wr::zeroed();
        looped.wr_id = 11;
        looped.sg_list = swr.sg_list;
        looped.num_sge = 1;
        looped.opcode = IBV_WR_RDMA_WRITE;
        looped.wr.rdma = swr.wr.rdma;
        looped.next = &mut looped;
        bad = null_mut();
        assert_eq!(
            ((*ctx).ops.post_send.unwrap())(a.qp, &mut looped, &mut bad),
            libc::ENOMEM
        );
        assert_eq!(bad, &mut looped as *mut _);
        // Once the posted ones completed, the QP takes more.
        let mut sig = ibv_send_wr::zeroed();
        sig.wr_id = 12;
        sig.sg_list = swr.sg_list;
        sig.num_sge = 1;
        sig.opcode = IBV_WR_RDMA_WRITE;
        sig.send_flags = 2;
        sig.wr.rdma = swr.wr.rdma;
        // (A bound on the wait, as poll_one's, not on how many polls: a
        // loaded machine takes longer to acknowledge them.)
        let t0 = std::time::Instant::now();
        while ((*ctx).ops.post_send.unwrap())(a.qp, &mut sig, &mut bad) != 0 {
            assert!(
                t0.elapsed().as_secs() < 10,
                "the QP took no post after the looped chain"
            );
            let mut wc = ibv_wc::default();
            ((*ctx).ops.poll_cq.unwrap())(a.cq, 1, &mut wc);
            std::thread::yield_now();
        }
        loop {
            let wc = poll_one(a.cq);
            if wc.wr_id == 12 {
                assert_eq!(wc.status, 0);
                break;
            }
        }

        // A bad opcode is refused and named in *bad_wr.
        swr.opcode = 8; // BIND_MW
        bad = null_mut();
        assert_eq!(
            ((*ctx).ops.post_send.unwrap())(a.qp, &mut swr, &mut bad),
            libc::EINVAL
        );
        assert_eq!(bad, &mut swr as *mut _);

        let mut qa = ibv_qp_attr::default();
        let mut qi: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(a.qp, &mut qa, 0, &mut qi), 0);
        assert_eq!((qa.qp_state, qa.dest_qp_num), (3, (*b.qp).qp_num));
        assert_eq!(qa.ah_attr.grh.dgid, gid);
        assert_eq!(qi.send_cq, a.cq);

        teardown(a);
        teardown(b);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn ud_receive_starts_with_the_40_byte_grh() {
    // SAFETY: as a C program would call them; buffers outlive their MRs.
    unsafe {
        let ctx = open_first();
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let mut a = side(ctx, 4);
        let mut b = side(ctx, 4);
        to_rts(&a, gid, 0, 4);
        to_rts(&b, gid, 0, 4);
        let mut ah_attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah_attr.grh.dgid = gid;
        let ah = ibv_create_ah(a.pd, &mut ah_attr);
        assert!(!ah.is_null());

        let mut rsge = ibv_sge {
            addr: b.buf.as_mut_ptr() as u64,
            length: 40 + 64,
            lkey: (*b.mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 1,
            next: null_mut(),
            sg_list: &mut rsge,
            num_sge: 1,
        };
        let mut bad_r = null_mut();
        assert_eq!(
            ((*ctx).ops.post_recv.unwrap())(b.qp, &mut rwr, &mut bad_r),
            0
        );
        a.buf[..3].copy_from_slice(b"UD!");
        let mut ssge = ibv_sge {
            addr: a.buf.as_ptr() as u64,
            length: 3,
            lkey: (*a.mr).lkey,
        };
        let mut swr = ibv_send_wr::zeroed();
        swr.wr_id = 2;
        swr.sg_list = &mut ssge;
        swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND;
        swr.send_flags = 2;
        swr.wr.ud = ibv_ud_wr {
            ah,
            remote_qpn: (*b.qp).qp_num,
            remote_qkey: 0x1111_1111,
        };
        let mut bad = null_mut();
        assert_eq!(((*ctx).ops.post_send.unwrap())(a.qp, &mut swr, &mut bad), 0);
        assert_eq!(poll_one(a.cq).status, 0);
        let wc = poll_one(b.cq);
        assert_eq!((wc.status, wc.byte_len), (0, 40 + 3));
        assert_eq!(wc.wc_flags & 1, 1, "GRH");
        assert_eq!(wc.src_qp, (*a.qp).qp_num);
        assert_eq!(&b.buf[40..43], b"UD!");

        // The sender's address, recovered from the GRH, answers back.
        let mut back = ibv_ah_attr::default();
        let grh = b.buf.as_mut_ptr().cast::<[u8; 40]>();
        assert_eq!(
            ibv_init_ah_from_wc(ctx, 1, &mut wc.clone(), grh, &mut back),
            0
        );
        assert_eq!(back.grh.dgid, gid);

        assert_eq!(ibv_destroy_ah(ah), 0);
        teardown(a);
        teardown(b);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn closing_a_context_with_live_resources_keeps_it_for_them() {
    // SAFETY: as a C program would call them (one that closes too early).
    unsafe {
        let ctx = open_first();
        let pd = ibv_alloc_pd(ctx);
        let ch = ibv_create_comp_channel(ctx);
        let cq = ibv_create_cq(ctx, 4, null_mut(), ch, 0);
        assert!(!pd.is_null() && !ch.is_null() && !cq.is_null());
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EBUSY);
        assert_eq!(ibv_close_device(ctx), 0);
        // The resources are still usable and can be destroyed afterwards.
        let mut wc = ibv_wc::default();
        assert_eq!(((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// `ibv_unimport_pd` takes only a PD `ibv_import_pd` made: an allocated
/// one is refused and stays usable (it was freed, its slot reused by the
/// next PD, and its MRs' deregistration then counted against that one).
/// Found in review.
#[test]
fn unimport_refuses_a_pd_it_did_not_import() {
    // SAFETY: as a C program would call them (one that confuses the two).
    unsafe {
        let ctx = open_first();
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        crate::import::ibv_unimport_pd(pd);
        let mut buf = vec![0u8; 4096];
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 4096, 1);
        assert!(!mr.is_null(), "the PD is still live");
        assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

mod cq;
mod handles;
mod mr;
mod mw;
mod xrc;

#[test]
fn the_gid_table_answers_as_rxes_does_for_empty_and_bad_indices() {
    // SAFETY: as a C program would call them; every out-pointer is a live
    // local of the right type and size.
    unsafe {
        let ctx = open_first();
        let mut p = ibv_port_attr::default();
        assert_eq!(ibv_query_port(ctx, 1, &mut p), 0);
        assert_eq!(p.gid_tbl_len, 1024, "rxe's table size");
        let sz = std::mem::size_of::<ibv_gid_entry>();
        let mut e: ibv_gid_entry = std::mem::zeroed();
        // Index 0: 127.0.0.1, RoCE v2, on lo.
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut e, 0, sz), 0);
        assert_eq!(e.gid.raw, softrdma_verbs::ip_to_gid([127, 0, 0, 1].into()));
        assert_eq!(
            (e.gid_index, e.port_num, e.gid_type),
            (0, 1, IBV_GID_TYPE_ROCE_V2)
        );
        assert_eq!(e.ndev_ifindex, libc::if_nametoindex(c"lo".as_ptr()));
        // An empty slot: ENODATA from the _ex query; the legacy query
        // reads the zero GID and succeeds, as rdma-core's does.
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 1, &mut e, 0, sz), libc::ENODATA);
        let mut g = ibv_gid { raw: [0xaa; 16] };
        assert_eq!(ibv_query_gid(ctx, 1, 1, &mut g), 0);
        assert_eq!(g.raw, [0; 16]);
        let mut t = 9u32;
        assert_eq!(ibv_query_gid_type(ctx, 1, 1, &mut t), 0);
        assert_eq!(t, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
        assert_eq!(ibv_query_gid_type(ctx, 1, 0, &mut t), 0);
        assert_eq!(t, IBV_GID_TYPE_SYSFS_ROCE_V2);
        // Past the table: EINVAL everywhere.
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 1024, &mut e, 0, sz), libc::EINVAL);
        assert_eq!(ibv_query_gid(ctx, 1, 1024, &mut g), -1);
        assert_eq!(errno(), libc::EINVAL);
        // The table: its populated entries only; too small a buffer EINVAL.
        let mut all = vec![std::mem::zeroed::<ibv_gid_entry>(); 1024];
        assert_eq!(_ibv_query_gid_table(ctx, all.as_mut_ptr(), 1024, 0, sz), 1);
        assert_eq!(
            all[0].gid.raw,
            softrdma_verbs::ip_to_gid([127, 0, 0, 1].into())
        );
        assert_eq!(
            _ibv_query_gid_table(ctx, all.as_mut_ptr(), 0, 0, sz),
            -(libc::EINVAL as isize)
        );

        // An empty slot as a QP's or an address handle's source: ENODATA,
        // as the kernel's rdma_fill_sgid_attr answers.
        let s = side(ctx, 2);
        let mut a = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            qp_access_flags: 1 | 2 | 4 | 8,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(s.qp, &mut a, 0x39), 0);
        let mut a = ibv_qp_attr {
            qp_state: 2,
            path_mtu: 3,
            dest_qp_num: (*s.qp).qp_num,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = softrdma_verbs::ip_to_gid([127, 0, 0, 1].into());
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.port_num = 1;
        assert_eq!(ibv_modify_qp(s.qp, &mut a, 0x129181), libc::ENODATA);
        assert_eq!((*s.qp).state, 1, "nothing changed");
        a.ah_attr.grh.sgid_index = 0;
        assert_eq!(ibv_modify_qp(s.qp, &mut a, 0x129181), 0);
        let mut ah = a.ah_attr;
        ah.grh.sgid_index = 7;
        assert!(ibv_create_ah(s.pd, &mut ah).is_null());
        assert_eq!(errno(), libc::ENODATA);
        ah.grh.sgid_index = 0;
        let h = ibv_create_ah(s.pd, &mut ah);
        assert!(!h.is_null());
        assert_eq!(ibv_destroy_ah(h), 0);
        teardown(s);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
