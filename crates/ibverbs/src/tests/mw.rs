//! Memory windows and `ibv_rereg_mr` carrying traffic between two RC QPs
//! through the C ABI, the way rdma-core's test_mr drives them: window
//! rkeys as rxe's provider keeps them in `ibv_mw.rkey`, binds and
//! invalidations completing in send-queue order, and a region that changes
//! access, memory and PD under the keys the peer already holds.

use std::ptr::null_mut;

use super::*;
use crate::mw::ibv_rereg_mr;

const SIGNALED: u32 = 2;
const WC_SUCCESS: u32 = 0;
const WC_REM_ACCESS_ERR: u32 = 10;
const WC_BIND_MW: u32 = 5;
const WC_LOCAL_INV: u32 = 6;

/// `ibv_inc_rkey`.
fn inc(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Post one signaled RDMA WRITE of `data` (copied into `a.buf` first) to
/// `remote` under `rkey`; returns its completion status.
unsafe fn write(a: &mut Side, data: &[u8], remote: u64, rkey: u32) -> u32 {
    a.buf[..data.len()].copy_from_slice(data);
    let mut sge = ibv_sge {
        addr: a.buf.as_ptr() as u64,
        length: data.len() as u32,
        // SAFETY: a's live region.
        lkey: unsafe { (*a.mr).lkey },
    };
    let mut wr = ibv_send_wr::zeroed();
    wr.wr_id = 1;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = SIGNALED;
    wr.wr.rdma = ibv_rdma_wr {
        remote_addr: remote,
        rkey,
    };
    let mut bad = null_mut();
    // SAFETY: as verbs.h's inline ibv_post_send calls it.
    unsafe {
        assert_eq!(
            ((*(*a.qp).context).ops.post_send.unwrap())(a.qp, &mut wr, &mut bad),
            0
        );
        poll_one(a.cq).status
    }
}

/// Post a work request with no SGEs on `q` and return its completion.
unsafe fn local_op(s: &Side, wr: &mut ibv_send_wr) -> ibv_wc {
    let mut bad = null_mut();
    // SAFETY: as verbs.h's inline ibv_post_send calls it.
    unsafe {
        assert_eq!(
            ((*(*s.qp).context).ops.post_send.unwrap())(s.qp, wr, &mut bad),
            0,
            "post: errno {}",
            errno()
        );
        poll_one(s.cq)
    }
}

#[test]
fn windows_and_rereg_carry_traffic_through_the_c_abi() {
    // SAFETY: as a C program would call them; every buffer outlives the
    // registrations that name it.
    unsafe {
        let ctx = open_first();
        let ops = &(*ctx).ops;
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let mut a = side(ctx, 2);
        let mut b = side(ctx, 2);
        to_rts(&a, gid, (*b.qp).qp_num, 2);
        to_rts(&b, gid, (*a.qp).qp_num, 2);
        let base = b.buf.as_ptr() as u64;
        let keys = ((*b.mr).lkey, (*b.mr).rkey);

        // Windows need MW_BIND on the region: added by rereg, keys kept.
        let all = 1 | 2 | 4 | 8;
        let r = ibv_rereg_mr(
            b.mr,
            IBV_REREG_MR_CHANGE_ACCESS,
            null_mut(),
            null_mut(),
            0,
            all | IBV_ACCESS_MW_BIND as i32,
        );
        assert_eq!(r, 0, "errno {}", errno());
        assert_eq!(((*b.mr).lkey, (*b.mr).rkey), keys);

        // Type 1, bound by ibv_bind_mw: ibv_mw.rkey moves on at once.
        let mw1 = (ops.alloc_mw.unwrap())(b.pd, IBV_MW_TYPE_1);
        assert!(!mw1.is_null());
        let rkey0 = (*mw1).rkey;
        let mut bind = ibv_mw_bind {
            wr_id: 7,
            send_flags: SIGNALED,
            bind_info: ibv_mw_bind_info {
                mr: b.mr,
                addr: base + 256,
                length: 64,
                mw_access_flags: IBV_ACCESS_REMOTE_WRITE,
            },
        };
        assert_eq!((ops.bind_mw.unwrap())(b.qp, mw1, &mut bind), 0);
        assert_eq!((*mw1).rkey, inc(rkey0));
        let wc = poll_one(b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (7, WC_SUCCESS, WC_BIND_MW)
        );
        assert_eq!(write(&mut a, b"MWv1", base + 256, (*mw1).rkey), WC_SUCCESS);
        assert_eq!(&b.buf[256..260], b"MWv1");

        // Type 2, bound by IBV_WR_BIND_MW with the application's new key;
        // ibv_mw.rkey is the application's to update.
        let mw2 = (ops.alloc_mw.unwrap())(b.pd, IBV_MW_TYPE_2);
        assert!(!mw2.is_null());
        let first = (*mw2).rkey;
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = 8;
        wr.opcode = IBV_WR_BIND_MW;
        wr.send_flags = SIGNALED;
        wr.bind_mw = ibv_send_wr_bind_mw {
            mw: mw2,
            rkey: inc(first),
            bind_info: ibv_mw_bind_info {
                mr: b.mr,
                addr: base + 512,
                length: 64,
                mw_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
            },
        };
        let wc = local_op(&b, &mut wr);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (8, WC_SUCCESS, WC_BIND_MW)
        );
        assert_eq!(
            (*mw2).rkey,
            first,
            "the provider leaves a type-2 rkey alone"
        );
        (*mw2).rkey = inc(first);
        assert_eq!(write(&mut a, b"MWv2", base + 512, (*mw2).rkey), WC_SUCCESS);
        assert_eq!(&b.buf[512..516], b"MWv2");

        // LOCAL_INV frees it again.
        let mut inv = ibv_send_wr::zeroed();
        inv.wr_id = 9;
        inv.opcode = IBV_WR_LOCAL_INV;
        inv.send_flags = SIGNALED;
        inv.imm_data = (*mw2).rkey;
        let wc = local_op(&b, &mut inv);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (9, WC_SUCCESS, WC_LOCAL_INV)
        );

        // A bound region cannot move; deallocating windows frees it, by
        // handle although their rkeys are not the allocation's any more.
        let buf2 = vec![0u8; 8192];
        let r = ibv_rereg_mr(
            b.mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            null_mut(),
            buf2.as_ptr() as *mut _,
            buf2.len(),
            0,
        );
        assert_eq!((r, errno()), (IBV_REREG_MR_ERR_INPUT, libc::EBUSY));
        assert_eq!((ops.dealloc_mw.unwrap())(mw1), 0);
        assert_eq!((ops.dealloc_mw.unwrap())(mw2), 0);

        // A new translation under the same keys: the peer's next WRITE
        // lands in the new buffer, the old one is left alone.
        let r = ibv_rereg_mr(
            b.mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            null_mut(),
            buf2.as_ptr() as *mut _,
            buf2.len(),
            0,
        );
        assert_eq!(r, 0, "errno {}", errno());
        assert_eq!(((*b.mr).lkey, (*b.mr).rkey), keys);
        assert_eq!(
            ((*b.mr).addr as u64, (*b.mr).length),
            (buf2.as_ptr() as u64, 8192)
        );
        let new_base = buf2.as_ptr() as u64;
        assert_eq!(write(&mut a, b"moved", new_base + 100, keys.1), WC_SUCCESS);
        assert_eq!(&buf2[100..105], b"moved");
        assert_eq!(&b.buf[100..105], &[0; 5]);

        // Another PD, and back: the PDs' users follow the region.
        let pd2 = ibv_alloc_pd(ctx);
        assert_eq!(
            ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, pd2, null_mut(), 0, 0),
            0
        );
        assert_eq!((*b.mr).pd, pd2);
        assert_eq!(ibv_dealloc_pd(pd2), libc::EBUSY, "pd2 has the region");
        assert_eq!(
            ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, null_mut(), 0, 0),
            0
        );
        assert_eq!(ibv_dealloc_pd(pd2), 0);
        // Back at its old memory for the teardown.
        let r = ibv_rereg_mr(
            b.mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            null_mut(),
            b.buf.as_mut_ptr().cast(),
            b.buf.len(),
            0,
        );
        assert_eq!(r, 0);

        // The type-1 window's first rkey never granted anything, and is
        // gone with the window: remote access error (a's QP ends here).
        assert_eq!(write(&mut a, b"late", base + 256, rkey0), WC_REM_ACCESS_ERR);
        assert_eq!(&b.buf[256..260], b"MWv1");

        teardown(a);
        teardown(b);
        drop(buf2);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
