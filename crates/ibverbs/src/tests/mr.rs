//! `ibv_reg_mr` refuses memory that is not there, or not writable when the
//! access flags write, with EFAULT as a kernel provider's get_user_pages.

use std::os::raw::c_int;
use std::ptr::null_mut;

use super::*;
use crate::mw::ibv_rereg_mr;

const PAGE: usize = 4096;

unsafe fn map(pages: usize, prot: c_int) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            pages * PAGE,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

#[test]
fn reg_mr_checks_that_pages_exist_and_allow_the_access() {
    const LOCAL_WRITE: c_int = 1;
    const REMOTE_WRITE: c_int = 2;
    const REMOTE_READ: c_int = 4;
    const REMOTE_ATOMIC: c_int = 8;
    // SAFETY: as a C program would call them, on mappings this test owns.
    unsafe {
        let ctx = open_first();
        let pd = ibv_alloc_pd(ctx);
        let reg = |p: *mut u8, len: usize, access: c_int| {
            let mr = ibv_reg_mr(pd, p.cast(), len, access);
            if mr.is_null() {
                Err(errno())
            } else {
                assert_eq!(ibv_dereg_mr(mr), 0);
                Ok(())
            }
        };

        // Three pages with a hole in the middle.
        let rw = map(3, libc::PROT_READ | libc::PROT_WRITE);
        assert_eq!(libc::munmap(rw.add(PAGE).cast(), PAGE), 0);
        assert_eq!(reg(rw, PAGE, LOCAL_WRITE | REMOTE_WRITE), Ok(()));
        assert_eq!(reg(rw.add(2 * PAGE), PAGE, LOCAL_WRITE), Ok(()));
        assert_eq!(reg(rw, 3 * PAGE, 0), Err(libc::EFAULT));
        assert_eq!(reg(rw.add(PAGE - 1), 2, LOCAL_WRITE), Err(libc::EFAULT));
        assert_eq!(reg(rw.add(PAGE), 1, REMOTE_READ), Err(libc::EFAULT));

        // Read-only pages: readable access only.
        let ro = map(2, libc::PROT_READ);
        assert_eq!(reg(ro, 2 * PAGE, 0), Ok(()));
        assert_eq!(reg(ro, 2 * PAGE, REMOTE_READ), Ok(()));
        assert_eq!(reg(ro, PAGE, LOCAL_WRITE), Err(libc::EFAULT));
        assert_eq!(reg(ro, PAGE, LOCAL_WRITE | REMOTE_WRITE), Err(libc::EFAULT));
        assert_eq!(
            reg(ro, PAGE, LOCAL_WRITE | REMOTE_ATOMIC),
            Err(libc::EFAULT)
        );
        // Bad flags are reported as such first, as the kernel checks them
        // before pinning.
        assert_eq!(reg(ro, PAGE, REMOTE_WRITE), Err(libc::EINVAL));

        // No access at all.
        let none = map(1, libc::PROT_NONE);
        assert_eq!(reg(none, PAGE, 0), Err(libc::EFAULT));

        // The same range made writable is accepted.
        assert_eq!(
            libc::mprotect(ro.cast(), 2 * PAGE, libc::PROT_READ | libc::PROT_WRITE),
            0
        );
        assert_eq!(
            reg(ro, 2 * PAGE, LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC),
            Ok(())
        );

        assert_eq!(libc::munmap(rw.cast(), PAGE), 0);
        assert_eq!(libc::munmap(rw.add(2 * PAGE).cast(), PAGE), 0);
        assert_eq!(libc::munmap(ro.cast(), 2 * PAGE), 0);
        assert_eq!(libc::munmap(none.cast(), PAGE), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn memory_window_and_rereg_entry_points_check_their_arguments() {
    // SAFETY: as a C program would call them (through the operations table
    // for the inline window verbs).
    unsafe {
        let ctx = open_first();
        let s = side(ctx, 2);
        let ops = &(*ctx).ops;

        // Window type first: 3 does not exist (EINVAL); 1 and 2 exist.
        assert!((ops.alloc_mw.unwrap())(s.pd, 3).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mw = (ops.alloc_mw.unwrap())(s.pd, IBV_MW_TYPE_1);
        assert!(!mw.is_null());
        assert_eq!(((*mw).pd, (*mw).type_), (s.pd, IBV_MW_TYPE_1));
        assert!((ops.alloc_mw.unwrap())(s.cq.cast(), IBV_MW_TYPE_2).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!((ops.dealloc_mw.unwrap())(s.mr.cast()), libc::EINVAL);
        let mut bind: ibv_mw_bind = std::mem::zeroed();
        assert_eq!(
            (ops.bind_mw.unwrap())(s.qp, null_mut(), &mut bind),
            libc::EINVAL
        );
        // A type-1 window cannot be zero-based; LOCAL_WRITE alone is fine
        // but the region lacks MW_BIND.
        bind.bind_info.mr = s.mr;
        bind.bind_info.addr = (*s.mr).addr as u64;
        bind.bind_info.length = 8;
        bind.bind_info.mw_access_flags = IBV_ACCESS_ZERO_BASED;
        assert_eq!((ops.bind_mw.unwrap())(s.qp, mw, &mut bind), libc::EINVAL);
        bind.bind_info.mw_access_flags = IBV_ACCESS_LOCAL_WRITE;
        assert_eq!((ops.bind_mw.unwrap())(s.qp, mw, &mut bind), libc::EINVAL);
        assert_eq!((ops.dealloc_mw.unwrap())(mw), 0);
        assert_eq!((ops.dealloc_mw.unwrap())(mw), libc::EINVAL, "already gone");

        // Work requests: a BIND_MW names no live window; LOCAL_INV on a QP
        // in RESET is refused for the state.
        let mut wr = ibv_send_wr::zeroed();
        let mut bad = null_mut();
        wr.opcode = IBV_WR_BIND_MW;
        assert_eq!(
            (ops.post_send.unwrap())(s.qp, &mut wr, &mut bad),
            libc::EINVAL
        );
        wr.opcode = IBV_WR_LOCAL_INV;
        wr.imm_data = (*s.mr).rkey;
        assert_eq!(
            (ops.post_send.unwrap())(s.qp, &mut wr, &mut bad),
            libc::EINVAL
        );

        // ibv_rereg_mr: flags, translation, PD and access are checked, and
        // every failure leaves the region as it was.
        let rereg = |flags, pd, addr: *mut u8, len, access| {
            let r = ibv_rereg_mr(s.mr, flags, pd, addr.cast(), len, access);
            (r, if r == 0 { 0 } else { errno() })
        };
        let ok_addr = (*s.mr).addr.cast::<u8>();
        assert_eq!(rereg(0, null_mut(), null_mut(), 0, 0), (-1, libc::EINVAL));
        assert_eq!(rereg(8, null_mut(), null_mut(), 0, 0), (-1, libc::EINVAL));
        assert_eq!(
            rereg(
                IBV_REREG_MR_CHANGE_TRANSLATION,
                null_mut(),
                null_mut(),
                64,
                0
            ),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            rereg(IBV_REREG_MR_CHANGE_PD, s.cq.cast(), null_mut(), 0, 0),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            rereg(IBV_REREG_MR_CHANGE_ACCESS, null_mut(), null_mut(), 0, 2),
            (-1, libc::EINVAL),
            "REMOTE_WRITE without LOCAL_WRITE"
        );
        let ro = map(1, libc::PROT_READ);
        assert_eq!(
            rereg(IBV_REREG_MR_CHANGE_TRANSLATION, null_mut(), ro, PAGE, 0),
            (-1, libc::EFAULT),
            "the region is LOCAL_WRITE: its new pages must be writable"
        );
        assert_eq!(
            rereg(IBV_REREG_MR_CHANGE_PD, s.pd, null_mut(), 0, 1),
            (-1, libc::EINVAL),
            "access without CHANGE_ACCESS"
        );
        let keys = ((*s.mr).lkey, (*s.mr).rkey);
        assert_eq!((*s.mr).addr.cast::<u8>(), ok_addr);
        assert_eq!(
            rereg(IBV_REREG_MR_CHANGE_ACCESS, null_mut(), null_mut(), 0, 1 | 2),
            (0, 0)
        );
        assert_eq!(((*s.mr).lkey, (*s.mr).rkey), keys, "rereg keeps the keys");
        assert_eq!((*s.mr).addr.cast::<u8>(), ok_addr);
        assert_eq!(
            ibv_rereg_mr(
                s.pd.cast(),
                IBV_REREG_MR_CHANGE_ACCESS,
                null_mut(),
                null_mut(),
                0,
                1
            ),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(libc::munmap(ro.cast(), PAGE), 0);

        teardown(s);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}
