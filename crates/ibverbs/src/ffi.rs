//! The one shape every exported function has.
//!
//! An exported function checks its pointers, runs its body inside a panic
//! boundary and turns the body's `Result` into the error convention *that*
//! libibverbs function has — they differ, and callers test for exactly one:
//!
//! * [`errno_ret`]: 0, or a positive errno (`ibv_modify_qp`, `ibv_post_send`,
//!   `ibv_destroy_*`, `ibv_query_device`, …);
//! * [`minus_one`]: a value ≥ 0, or -1 with `errno` set (`ibv_query_gid`,
//!   `ibv_get_cq_event`, `ibv_poll_cq` returns a negative value);
//! * [`null_ret`]: a pointer, or NULL with `errno` set (`ibv_alloc_pd`,
//!   `ibv_create_qp`, …);
//! * [`void_ret`]: nothing to report;
//! * [`value_ret`]: a value, or a fixed one on failure
//!   (`ibv_get_device_guid`'s 0, `rdma_get_src_port`'s 0, …).
//!
//! errno is set in every failing case, so callers that print `perror` see the
//! cause. A panic never crosses into C: it becomes `EIO`. With
//! `SOFTRDMA_IBV_LOG=1` every failure is logged to stderr with its reason,
//! since an errno alone rarely says what was wrong.

use std::borrow::Cow;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// A failed call: the errno the caller sees and why, for the log.
#[derive(Debug)]
pub struct Fail {
    pub errno: c_int,
    pub why: Cow<'static, str>,
}

pub type Res<T> = Result<T, Fail>;

impl Fail {
    pub fn new(errno: c_int, why: impl Into<Cow<'static, str>>) -> Fail {
        Fail {
            errno,
            why: why.into(),
        }
    }
    pub fn inval(why: impl Into<Cow<'static, str>>) -> Fail {
        Fail::new(libc::EINVAL, why)
    }
    pub fn unsupported(why: impl Into<Cow<'static, str>>) -> Fail {
        Fail::new(libc::EOPNOTSUPP, why)
    }
}

impl From<softrdma_verbs::CoreError> for Fail {
    fn from(e: softrdma_verbs::CoreError) -> Fail {
        use softrdma_verbs::CoreError as E;
        let errno = match e {
            E::QueueFull { .. } | E::OutOfResources(_) => libc::ENOMEM,
            E::Busy(_) => libc::EBUSY,
            // What a provider's poll_cq reports for a CQ in error (mlx5:
            // an error CQE it cannot parse); resize_cq of it likewise.
            E::CqOverflowed(_) => libc::EIO,
            _ => libc::EINVAL,
        };
        Fail::new(errno, e.to_string())
    }
}

impl From<softrdma_verbs::Error> for Fail {
    fn from(e: softrdma_verbs::Error) -> Fail {
        match e {
            softrdma_verbs::Error::Verbs(v) => v.into(),
            softrdma_verbs::Error::Io(io) => io.into(),
            // The C ABI polls and waits itself; these come only from the
            // Rust conveniences.
            e @ softrdma_verbs::Error::Completion(_) => Fail::new(libc::EIO, e.to_string()),
            e @ softrdma_verbs::Error::Timeout(_) => Fail::new(libc::ETIMEDOUT, e.to_string()),
            e @ softrdma_verbs::Error::Rejected(_) => Fail::new(libc::ECONNREFUSED, e.to_string()),
            softrdma_verbs::Error::Gid(g) => g.into(),
        }
    }
}

impl From<softrdma_verbs::GidError> for Fail {
    fn from(e: softrdma_verbs::GidError) -> Fail {
        Fail::new(e.errno(), e.to_string())
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Fail {
        use std::io::ErrorKind as K;
        let errno = e.raw_os_error().unwrap_or(match e.kind() {
            K::AddrInUse => libc::EADDRINUSE,
            K::AddrNotAvailable => libc::EADDRNOTAVAIL,
            K::NotConnected => libc::ENOTCONN,
            K::NotFound => libc::ENODEV,
            K::InvalidInput => libc::EINVAL,
            K::PermissionDenied => libc::EACCES,
            K::TimedOut => libc::ETIMEDOUT,
            _ => libc::EIO,
        });
        Fail::new(errno, e.to_string())
    }
}

/// A NULL check: `Err(EINVAL)` naming the argument.
#[macro_export]
macro_rules! non_null {
    ($($p:ident),+) => {
        $( if $p.is_null() {
            return Err($crate::ffi::Fail::inval(concat!(stringify!($p), " is NULL")));
        } )+
    };
}

fn log_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_IBV_LOG").is_some_and(|v| v != "0"))
}

/// Print a diagnostic only when `SOFTRDMA_IBV_LOG` is on: for behaviour
/// that is legal, which rdma-core accepts silently, but worth knowing.
pub fn note(msg: &str) {
    if log_enabled() {
        eprintln!("softrdma: {msg}");
    }
}

/// Print a message the user needs even without logging on (rare: a
/// misconfiguration that would otherwise surface only as an errno).
pub fn warn(msg: &str) {
    eprintln!("softrdma: {msg}");
}

pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn run<T>(name: &'static str, f: impl FnOnce() -> Res<T>) -> Res<T> {
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Fail::new(libc::EIO, format!("internal error: {msg}")))
        }
    };
    if let Err(f) = &r {
        if log_enabled() {
            eprintln!(
                "softrdma: {name}: {} ({}): {}",
                errno_name(f.errno),
                f.errno,
                f.why
            );
        }
        set_errno(f.errno);
    }
    r
}

/// 0 on success, a positive errno on failure.
pub fn errno_ret(name: &'static str, f: impl FnOnce() -> Res<()>) -> c_int {
    match run(name, f) {
        Ok(()) => 0,
        Err(e) => e.errno,
    }
}

/// A non-negative value, or -1 with errno set.
pub fn minus_one(name: &'static str, f: impl FnOnce() -> Res<c_int>) -> c_int {
    run(name, f).unwrap_or(-1)
}

/// A pointer, or NULL with errno set.
pub fn null_ret<T>(name: &'static str, f: impl FnOnce() -> Res<*mut T>) -> *mut T {
    run(name, f).unwrap_or(std::ptr::null_mut())
}

/// No result to report; failures are only logged.
pub fn void_ret(name: &'static str, f: impl FnOnce() -> Res<()>) {
    let _ = run(name, f);
}

/// A value, or `failed` (with errno set) on failure: for the functions
/// whose C signature has no error convention but a value that means none.
pub fn value_ret<T>(name: &'static str, failed: T, f: impl FnOnce() -> Res<T>) -> T {
    run(name, f).unwrap_or(failed)
}

fn errno_name(e: c_int) -> &'static str {
    match e {
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::EAGAIN => "EAGAIN",
        libc::ENOENT => "ENOENT",
        libc::ENODEV => "ENODEV",
        libc::EIO => "EIO",
        _ => "errno",
    }
}

/// Copy `s` into a fixed C char array, NUL-terminated and truncated to fit.
pub fn put_cstr(dst: &mut [std::os::raw::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::os::raw::c_char;
    }
    for d in dst[n..].iter_mut() {
        *d = 0;
    }
}

/// A NUL-terminated string with static lifetime, for the `*_str` functions.
#[macro_export]
macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const std::os::raw::c_char
    };
}
