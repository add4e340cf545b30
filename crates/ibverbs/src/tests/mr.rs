//! `ibv_reg_mr` refuses memory that is not there, or not writable when the
//! access flags write, with EFAULT as a kernel provider's get_user_pages.

use std::os::raw::c_int;
use std::ptr::null_mut;

use super::*;

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
