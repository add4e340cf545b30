//! softrdma as a drop-in `librdmacm.so.1`.
//!
//! The connection manager itself lives in softrdma's `libibverbs.so.1`,
//! next to the devices, PDs and QPs its calls take and return: an
//! `rdma_cm_id`'s `verbs`, `pd` and `qp` are that library's objects, and
//! `rdma_create_qp` makes a QP there. This library is the other soname
//! applications link against: every `rdma_*` function of rdma-core 44's
//! export list, with its symbol version, forwarding to the
//! `softrdma_rdma_*` function of the same signature that softrdma's
//! libibverbs.so.1 exports. With another libibverbs.so.1 loaded (the
//! real one, say) the forwarders find nothing and every call fails with
//! `ENOSYS`, saying why once on standard error.
//!
//! The rsocket API (`rsocket` … `riowrite`) is not implemented: each call
//! fails with `ENOSYS` (−1, or `MAP_FAILED`-like −1 for `riomap`).

#![allow(clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Find `name` (NUL-terminated) in the process, loading libibverbs.so.1
/// if it is not there yet.
fn lookup(name: &'static [u8]) -> *mut c_void {
    // SAFETY: `name` is a NUL-terminated literal; dlsym and dlopen take C
    // strings and return NULL on failure.
    unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr().cast());
        if !p.is_null() {
            return p;
        }
        let h = libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        );
        if h.is_null() {
            return std::ptr::null_mut();
        }
        libc::dlsym(h, name.as_ptr().cast())
    }
}

fn missing(name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "softrdma: librdmacm.so.1 needs softrdma's libibverbs.so.1, which is not the one loaded \
             ({name} not found); put both on LD_LIBRARY_PATH"
        );
    }
    set_errno(libc::ENOSYS);
}

/// Forwarders: `name(args) -> ret, on failure`; the implementation is
/// `softrdma_<name>` with the same signature.
macro_rules! forward {
    ($($ver:literal fn $name:ident($($a:ident: $t:ty),*) $(-> $ret:ty)?, $fail:expr;)+) => {
        $(
            // `()` is the failure value of the functions returning nothing.
            #[allow(clippy::unused_unit)]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) $(-> $ret)? {
                type F = unsafe extern "C" fn($($t),*) $(-> $ret)?;
                static IMPL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
                let p = *IMPL.get_or_init(|| {
                    lookup(concat!("softrdma_", stringify!($name), "\0").as_bytes()) as usize
                });
                if p == 0 {
                    missing(concat!("softrdma_", stringify!($name)));
                    return $fail;
                }
                // SAFETY: softrdma's libibverbs.so.1 defines the symbol
                // with exactly this signature (crates/ibverbs/src/rdmacm).
                let f: F = unsafe { std::mem::transmute::<usize, F>(p) };
                // SAFETY: the caller's contract is the one rdma_cma.h
                // documents for this function, which the implementation
                // has too.
                unsafe { f($($a),*) }
            }
        )+
        #[cfg(not(test))]
        std::arch::global_asm!(concat!(
            $(".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver, "\n",)+
        ));
    };
}

type P = *mut c_void;
const NULL: P = std::ptr::null_mut();

forward! {
    "RDMACM_1.0" fn rdma_create_event_channel() -> P, NULL;
    "RDMACM_1.0" fn rdma_destroy_event_channel(ch: P), ();
    "RDMACM_1.0" fn rdma_create_id(ch: P, id: *mut P, ctx: P, ps: c_int) -> c_int, -1;
    "RDMACM_1.0" fn rdma_destroy_id(id: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_create_ep(id: *mut P, res: P, pd: P, attr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_destroy_ep(id: P), ();
    "RDMACM_1.0" fn rdma_bind_addr(id: P, addr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_resolve_addr(id: P, src: P, dst: P, timeout_ms: c_int) -> c_int, -1;
    "RDMACM_1.0" fn rdma_resolve_route(id: P, timeout_ms: c_int) -> c_int, -1;
    "RDMACM_1.0" fn rdma_create_qp(id: P, pd: P, attr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_create_qp_ex(id: P, attr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_destroy_qp(id: P), ();
    "RDMACM_1.0" fn rdma_create_srq(id: P, pd: P, attr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_create_srq_ex(id: P, attr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_destroy_srq(id: P), ();
    "RDMACM_1.0" fn rdma_connect(id: P, param: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_listen(id: P, backlog: c_int) -> c_int, -1;
    "RDMACM_1.0" fn rdma_get_request(listen: P, id: *mut P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_accept(id: P, param: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_reject(id: P, data: *const c_void, len: u8) -> c_int, -1;
    "RDMACM_1.0" fn rdma_notify(id: P, event: c_int) -> c_int, -1;
    "RDMACM_1.0" fn rdma_disconnect(id: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_join_multicast(id: P, addr: P, ctx: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_leave_multicast(id: P, addr: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_get_cm_event(ch: P, ev: *mut P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_ack_cm_event(ev: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_get_src_port(id: P) -> u16, 0;
    "RDMACM_1.0" fn rdma_get_dst_port(id: P) -> u16, 0;
    "RDMACM_1.0" fn rdma_get_devices(n: *mut c_int) -> *mut P, std::ptr::null_mut();
    "RDMACM_1.0" fn rdma_free_devices(list: *mut P), ();
    "RDMACM_1.0" fn rdma_event_str(event: c_int) -> *const c_char, c"UNKNOWN EVENT".as_ptr();
    "RDMACM_1.0" fn rdma_set_option(id: P, level: c_int, name: c_int, val: P, len: usize) -> c_int, -1;
    "RDMACM_1.0" fn rdma_migrate_id(id: P, ch: P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: P, res: *mut P) -> c_int, -1;
    "RDMACM_1.0" fn rdma_freeaddrinfo(res: P), ();
    "RDMACM_1.1" fn rdma_join_multicast_ex(id: P, attr: P, ctx: P) -> c_int, -1;
    "RDMACM_1.2" fn rdma_establish(id: P) -> c_int, -1;
    "RDMACM_1.2" fn rdma_init_qp_attr(id: P, attr: P, mask: *mut c_int) -> c_int, -1;
    "RDMACM_1.3" fn rdma_get_remote_ece(id: P, ece: P) -> c_int, -1;
    "RDMACM_1.3" fn rdma_reject_ece(id: P, data: *const c_void, len: u8) -> c_int, -1;
    "RDMACM_1.3" fn rdma_set_local_ece(id: P, ece: P) -> c_int, -1;
}

/// The rsocket API: not implemented; every call fails with `ENOSYS`.
macro_rules! unsupported {
    ($(fn $name:ident($($a:ident: $t:ty),*) -> $ret:ty;)+) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($(_: $t),*) -> $ret {
                set_errno(libc::ENOSYS);
                -1
            }
        )+
        #[cfg(not(test))]
        std::arch::global_asm!(concat!(
            $(".symver ", stringify!($name), ", ", stringify!($name), "@@RDMACM_1.0\n",)+
        ));
    };
}

unsupported! {
    fn rsocket(domain: c_int, kind: c_int, proto: c_int) -> c_int;
    fn rbind(s: c_int, addr: P, len: u32) -> c_int;
    fn rlisten(s: c_int, backlog: c_int) -> c_int;
    fn raccept(s: c_int, addr: P, len: P) -> c_int;
    fn rconnect(s: c_int, addr: P, len: u32) -> c_int;
    fn rshutdown(s: c_int, how: c_int) -> c_int;
    fn rclose(s: c_int) -> c_int;
    fn rrecv(s: c_int, buf: P, len: usize, flags: c_int) -> isize;
    fn rrecvfrom(s: c_int, buf: P, len: usize, flags: c_int, addr: P, alen: P) -> isize;
    fn rrecvmsg(s: c_int, msg: P, flags: c_int) -> isize;
    fn rsend(s: c_int, buf: P, len: usize, flags: c_int) -> isize;
    fn rsendto(s: c_int, buf: P, len: usize, flags: c_int, addr: P, alen: u32) -> isize;
    fn rsendmsg(s: c_int, msg: P, flags: c_int) -> isize;
    fn rread(s: c_int, buf: P, len: usize) -> isize;
    fn rreadv(s: c_int, iov: P, n: c_int) -> isize;
    fn rwrite(s: c_int, buf: P, len: usize) -> isize;
    fn rwritev(s: c_int, iov: P, n: c_int) -> isize;
    fn rpoll(fds: P, n: u64, timeout: c_int) -> c_int;
    fn rselect(n: c_int, r: P, w: P, e: P, t: P) -> c_int;
    fn rgetpeername(s: c_int, addr: P, len: P) -> c_int;
    fn rgetsockname(s: c_int, addr: P, len: P) -> c_int;
    fn rsetsockopt(s: c_int, level: c_int, name: c_int, val: P, len: u32) -> c_int;
    fn rgetsockopt(s: c_int, level: c_int, name: c_int, val: P, len: P) -> c_int;
    // Variadic in C (`int rfcntl(int, int, ...)`): on x86-64 the fixed
    // arguments are passed the same way, and the rest are not read.
    fn rfcntl(s: c_int, cmd: c_int) -> c_int;
    fn riomap(s: c_int, buf: P, len: usize, prot: c_int, flags: c_int, offset: i64) -> i64;
    fn riounmap(s: c_int, buf: P, len: usize) -> c_int;
    // size_t in C: -1 is SIZE_MAX, in the same register.
    fn riowrite(s: c_int, buf: P, count: usize, offset: i64, flags: c_int) -> isize;
}
