//! XRC through the operations table: domains opened on a file are shared
//! on one context with the kernel's O_CREAT/O_EXCL rules, a domain in use
//! cannot be closed, XRC SRQs have numbers, `ibv_open_qp` opens a second
//! handle on a target QP, and misuse is refused with the
//! errno a kernel provider returns.

use std::os::fd::AsRawFd;
use std::os::raw::c_void;
use std::ptr::null_mut;

use super::{errno, open_first, qp_init_attr};
use crate::abi::*;
use crate::device::*;
use crate::qp::*;
use crate::resources::*;

unsafe fn vctx(ctx: *mut ibv_context) -> &'static verbs_context {
    // SAFETY: our context is the tail of a verbs_context.
    unsafe {
        &*ctx
            .cast::<u8>()
            .sub(std::mem::offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    }
}

#[test]
fn domains_srqs_and_target_qps_through_the_ops_table() {
    // SAFETY: as a C program would call them.
    unsafe {
        let ctx = open_first();
        let vc = vctx(ctx);
        let open = vc.open_xrcd.expect("open_xrcd");
        let close = vc.close_xrcd.expect("close_xrcd");
        let f = tempfile::Builder::new()
            .prefix("softrdma-xrcd-")
            .tempfile()
            .expect("a scratch file")
            .into_file();
        let fd = f.as_raw_fd();
        let mut attr = ibv_xrcd_init_attr {
            comp_mask: 3,
            fd,
            oflags: 0,
        };
        // No domain on the file yet and no O_CREAT.
        assert!(open(ctx, &mut attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        attr.oflags = libc::O_CREAT;
        let x1 = open(ctx, &mut attr);
        assert!(!x1.is_null(), "errno {}", errno());
        // The same file shares the domain; O_EXCL refuses it.
        let x2 = open(ctx, &mut attr);
        assert!(!x2.is_null());
        assert_ne!(x1, x2);
        assert_eq!((*x1).handle, (*x2).handle);
        attr.oflags = libc::O_CREAT | libc::O_EXCL;
        assert!(open(ctx, &mut attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // Both FD and OFLAGS are needed; fd -1 is a private domain.
        attr.comp_mask = 1;
        assert!(open(ctx, &mut attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut private = ibv_xrcd_init_attr {
            comp_mask: 3,
            fd: -1,
            oflags: 0,
        };
        let x3 = open(ctx, &mut private);
        assert!(!x3.is_null());
        assert_ne!((*x3).handle, (*x1).handle);
        // A bad descriptor.
        let mut bad = ibv_xrcd_init_attr {
            comp_mask: 3,
            fd: 1 << 20,
            oflags: libc::O_CREAT,
        };
        assert!(open(ctx, &mut bad).is_null());
        assert_eq!(errno(), libc::EBADF);

        // An XRC SRQ of x1.
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        let create_srq = vc.create_srq_ex.expect("create_srq_ex");
        let mut sa = ibv_srq_init_attr_ex {
            srq_context: null_mut(),
            attr: ibv_srq_attr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            comp_mask: 1 | 2 | 4 | 8,
            srq_type: 1,
            pd,
            xrcd: x1,
            cq,
            tm_cap: [0; 2],
        };
        let srq = create_srq(ctx, &mut sa);
        assert!(!srq.is_null(), "errno {}", errno());
        let mut n = u32::MAX;
        assert_eq!((vc.get_srq_num.unwrap())(srq, &mut n), 0);
        assert!(n < 1 << 24);
        // Without its CQ, an XRC SRQ is refused; tag matching is not offered.
        sa.comp_mask = 1 | 2 | 4;
        assert!(create_srq(ctx, &mut sa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        sa.comp_mask = 1 | 2 | 4 | 8 | 16;
        assert!(create_srq(ctx, &mut sa).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);

        // A target QP of x1.
        let mut qa: ibv_qp_init_attr_ex = std::mem::zeroed();
        qa.qp_type = 10;
        qa.comp_mask = 1 << 1;
        qa.xrcd = x1;
        let create_qp = vc.create_qp_ex.unwrap();
        let tgt = create_qp(ctx, &mut qa);
        assert!(!tgt.is_null(), "errno {}", errno());
        assert_eq!((*tgt).qp_type, 10);
        assert!((*tgt).pd.is_null() && (*tgt).send_cq.is_null());
        // An XRC_RECV QP without an XRC domain, an XRC_SEND with an SRQ.
        let mut init = qp_init_attr(cq, null_mut(), 10, 4, 0);
        assert!(ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL);
        init.qp_type = 9;
        init.srq = srq;
        assert!(ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // The initiator: no receive queue, NULL recv_cq allowed.
        init.srq = null_mut();
        let ini = ibv_create_qp(pd, &mut init);
        assert!(!ini.is_null(), "errno {}", errno());
        assert_eq!((init.cap.max_recv_wr, init.cap.max_recv_sge), (0, 0));
        // ibv_open_qp: another handle on the target QP, through the other
        // handle of the same file's domain; not through the private domain,
        // not for a number the domain has no target QP of, not without
        // NUM, XRCD and TYPE.
        let open_qp = vc.open_qp.unwrap();
        let mut oa = ibv_qp_open_attr {
            comp_mask: 0xf,
            qp_num: (*tgt).qp_num,
            xrcd: x2,
            qp_context: 0x5eed as *mut c_void,
            qp_type: 10,
        };
        let opened = open_qp(ctx, &mut oa);
        assert!(!opened.is_null(), "errno {}", errno());
        assert_ne!(opened, tgt);
        assert_eq!((*opened).qp_num, (*tgt).qp_num);
        assert_eq!((*opened).qp_context, 0x5eed as *mut c_void);
        oa.xrcd = x3;
        assert!(open_qp(ctx, &mut oa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        oa.xrcd = x2;
        oa.qp_num = (*ini).qp_num;
        assert!(open_qp(ctx, &mut oa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        oa.qp_num = (*tgt).qp_num;
        oa.comp_mask = 1 | 2;
        assert!(open_qp(ctx, &mut oa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // Either handle modifies the one QP; it lives while one is left.
        let mut qa = ibv_qp_attr {
            qp_state: 1,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: 2,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(opened, &mut qa, 1 | 16 | 32 | 8), 0);
        let mut got = ibv_qp_attr::default();
        let mut gi: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(tgt, &mut got, 1, &mut gi), 0);
        assert_eq!(got.qp_state, 1);
        assert_eq!(gi.qp_type, 10);

        // In use: the handles with an SRQ or a target QP cannot close; the
        // private one can.
        assert_eq!(close(x1), libc::EBUSY);
        assert_eq!(close(x2), libc::EBUSY);
        assert_eq!(close(x3), 0);
        assert_eq!(ibv_destroy_cq(cq), libc::EBUSY); // the SRQ's
        assert_eq!(ibv_destroy_qp(tgt), 0);
        assert_eq!(ibv_query_qp(opened, &mut got, 1, &mut gi), 0);
        assert_eq!(ibv_destroy_qp(opened), 0);
        assert_eq!(close(x2), 0);
        assert_eq!(close(x1), libc::EBUSY);
        assert_eq!(ibv_destroy_srq(srq), 0);
        assert_eq!(close(x1), 0);
        assert_eq!(close(x1), libc::EINVAL);
        assert_eq!(ibv_destroy_qp(ini), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
        drop(f);
    }
}

#[test]
fn the_device_advertises_xrc() {
    // SAFETY: as a C program would call them.
    unsafe {
        let ctx = open_first();
        let mut a = ibv_device_attr::zeroed();
        assert_eq!(ibv_query_device(ctx, &mut a), 0);
        assert_ne!(a.device_cap_flags & (1 << 20), 0, "IBV_DEVICE_XRC");
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
