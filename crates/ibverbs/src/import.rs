//! Importing a context and its objects (`ibv_import_device`,
//! `ibv_import_pd`, `ibv_import_mr` and the unimports).
//!
//! rdma-core imports by the kernel's uverbs file: a context's `cmd_fd`,
//! dup'd or passed over a unix socket, names the kernel's objects, and a
//! PD or MR is found in it by its `handle`. softrdma has no kernel file, so
//! each context's `cmd_fd` is a memfd of its own (`softrdma-context`,
//! holding the opening process's pid as text): its inode names the
//! context's *family* — the context and every context imported from it,
//! which share one softrdma context (engine, QPs, regions) and one table of
//! PDs and MRs by handle ([`Shared`]). `ibv_import_device(fd)` finds the
//! family by the fd's inode; the new context takes the fd as its own
//! `cmd_fd` and closes it when closed, as rdma-core does.
//!
//! Within one process that is the kernel's behaviour. A softrdma context
//! lives in its process's memory, so a `cmd_fd` passed to another process
//! names nothing there: importing it fails with `EOPNOTSUPP` (what rdma-core
//! returns for a device that cannot import), saying whose context it is.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::c_int;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{null_ret, void_ret, Fail, Res};
use crate::handles::*;

crate::symver! {
    "IBVERBS_1.10":
        ibv_import_device, ibv_import_mr, ibv_import_pd, ibv_unimport_mr, ibv_unimport_pd;
}

/// The memfd name `cmd_fd`s carry (shown as `/memfd:softrdma-context` in
/// `/proc/PID/fd`).
const NAME: &str = "softrdma-context";

/// A family of contexts, by its `cmd_fd`'s (device, inode).
struct Family {
    sv: Weak<sv::Context>,
    shared: Weak<Shared>,
    dev: &'static Device,
    port_mtu: sv::Mtu,
    /// The process that opened it: a child made by fork(2) inherits this
    /// table, but not the engine threads behind it.
    pid: u32,
}

static FAMILIES: LazyLock<Mutex<HashMap<(u64, u64), Family>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn identity(fd: c_int) -> Res<(u64, u64)> {
    // SAFETY: all-zero is a valid `struct stat` (integers only).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`, a local of its type; a bad `fd`
    // is an error return, not undefined behaviour.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Fail::new(
            e.raw_os_error().unwrap_or(libc::EBADF),
            format!("cmd_fd {fd}: {e}"),
        ));
    }
    Ok((st.st_dev, st.st_ino))
}

/// A new context's `cmd_fd`: a memfd naming its family, holding this
/// process's pid (so an import elsewhere can say whose it is).
pub(crate) fn new_cmd_fd() -> Res<OwnedFd> {
    // SAFETY: memfd_create with a constant NUL-terminated name.
    let raw = unsafe { libc::memfd_create(crate::cstr!("softrdma-context"), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let pid = format!("{}\n", std::process::id());
    // SAFETY: writes from a live local buffer of that length.
    let n = unsafe { libc::write(fd.as_raw_fd(), pid.as_ptr().cast(), pid.len()) };
    if n != pid.len() as isize {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

/// Record a newly opened context's family under its `cmd_fd`.
pub(crate) fn enroll(
    cmd_fd: &OwnedFd,
    sv: &Arc<sv::Context>,
    shared: &Arc<Shared>,
    dev: &'static Device,
    port_mtu: sv::Mtu,
) -> Res<()> {
    let id = identity(cmd_fd.as_raw_fd())?;
    let mut f = FAMILIES.lock().unwrap_or_else(|e| e.into_inner());
    // Families whose last context is gone (their inodes may be reused).
    f.retain(|_, v| v.sv.strong_count() > 0);
    f.insert(
        id,
        Family {
            sv: Arc::downgrade(sv),
            shared: Arc::downgrade(shared),
            dev,
            port_mtu,
            pid: std::process::id(),
        },
    );
    Ok(())
}

/// Why `fd` names no family here: another process's context, or not a
/// context at all.
fn not_found(fd: c_int) -> Fail {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
    if link
        .to_string_lossy()
        .starts_with(&format!("/memfd:{NAME}"))
    {
        let mut pid = String::new();
        let mut buf = [0u8; 16];
        // SAFETY: pread into a local buffer of its length; the fd is the
        // caller's, only read (at an offset, so its position is unchanged).
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 {
            pid = String::from_utf8_lossy(&buf[..n as usize])
                .trim()
                .to_string();
        }
        return Fail::unsupported(format!(
            "cmd_fd {fd} is the context of process {pid}: a softrdma context lives in its \
             process's memory, so it can be imported only in the process that opened it"
        ));
    }
    Fail::inval(format!(
        "cmd_fd {fd} is not the cmd_fd of a softrdma context (ibv_context.cmd_fd, dup'd)"
    ))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    null_ret("ibv_import_device", || {
        let id = identity(cmd_fd)?;
        let fam = {
            let f = FAMILIES.lock().unwrap_or_else(|e| e.into_inner());
            f.get(&id)
                .filter(|v| v.pid == std::process::id())
                .and_then(|v| Some((v.sv.upgrade()?, v.shared.upgrade()?, v.dev, v.port_mtu)))
        };
        let Some((sv, shared, dev, port_mtu)) = fam else {
            return Err(not_found(cmd_fd));
        };
        let vc = crate::device::context_ops(dev, sv.async_fd(), cmd_fd);
        // SAFETY: the caller hands its descriptor to the new context, which
        // closes it when it is closed (rdma-core's contract); on every
        // failure above it stays the caller's.
        let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
        Ok(Context::into_c(Context::new(
            dev, sv, shared, port_mtu, fd, vc,
        )))
    })
}

/// The context behind a PD's `context` field.
fn context_of_pd(p: &Pd) -> Res<Arc<Context>> {
    // SAFETY: our own live slot.
    Context::from_c(unsafe { (*p.c_ptr()).context })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    null_ret("ibv_import_pd", || {
        let ctx = Context::from_c(context)?;
        let missing = || {
            Fail::inval(format!(
                "no protection domain with handle {pd_handle} in this context's family"
            ))
        };
        let at = ctx
            .shared
            .pds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pd_handle)
            .copied();
        let orig = Pd::from_c(at.ok_or_else(missing)? as *mut ibv_pd).map_err(|_| missing())?;
        // SAFETY: the live original's slot.
        let same = unsafe { (*orig.c_ptr()).handle } == pd_handle
            && orig.parent.is_none()
            && context_of_pd(&orig).is_ok_and(|c| Arc::ptr_eq(&c.shared, &ctx.shared));
        if !same {
            return Err(missing());
        }
        let c = ibv_pd {
            context,
            handle: pd_handle,
        };
        ctx.users.hold()?.keep();
        let mut p = Pd::new(c, orig.sv.clone());
        p.imported = true;
        Ok(Pd::into_c(p))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    void_ret("ibv_unimport_pd", || {
        let live = Pd::from_c(pd)?;
        if !live.imported {
            return Err(Fail::inval(
                "not a PD ibv_import_pd made (deallocate it with ibv_dealloc_pd)",
            ));
        }
        drop(live);
        let p = Pd::take_unused(
            pd,
            "the imported PD still has memory regions, QPs, SRQs or AHs",
        )?;
        if let Ok(ctx) = context_of_pd(&p) {
            ctx.users.sub();
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    null_ret("ibv_import_mr", || {
        let p = Pd::from_c(pd)?;
        let ctx = context_of_pd(&p)?;
        let missing = || {
            Fail::inval(format!(
                "no memory region with handle {mr_handle} in this context's family"
            ))
        };
        let at = ctx
            .shared
            .mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&mr_handle)
            .copied();
        let orig = Mr::from_c(at.ok_or_else(missing)? as *mut ibv_mr).map_err(|_| missing())?;
        // SAFETY: the live original's slot.
        let o = unsafe { &*orig.c_ptr() };
        let o_ctx = Context::from_c(o.context).map_err(|_| missing())?;
        if o.handle != mr_handle || !Arc::ptr_eq(&o_ctx.shared, &ctx.shared) {
            return Err(missing());
        }
        let o_pd = Pd::from_c(o.pd).map_err(|_| missing())?;
        if o_pd.sv.id() != p.sv.id() {
            return Err(Fail::inval(format!(
                "memory region {mr_handle} is of protection domain {}, not {}",
                o_pd.sv.id().0,
                p.sv.id().0
            )));
        }
        // As rdma-core's import: the keys and length from the object, no
        // address (the kernel does not report one).
        let c = ibv_mr {
            context: ctx.c_ptr(),
            pd,
            addr: std::ptr::null_mut(),
            length: o.length,
            handle: mr_handle,
            lkey: o.lkey,
            rkey: o.rkey,
        };
        p.users.hold()?.keep();
        Ok(ImportedMr::into_c(ImportedMr::new(c)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    void_ret("ibv_unimport_mr", || {
        let m = ImportedMr::take(mr)?;
        // SAFETY: our own slot, live while `m` is.
        if let Ok(p) = Pd::from_c(unsafe { (*m.c_ptr()).pd }) {
            p.users.sub();
        }
        Ok(())
    })
}
