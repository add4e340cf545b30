//! What the application's pointers point at.
//!
//! Every object this library hands out is a heap block whose first field is
//! the C structure the application sees (`struct ibv_qp`, …) and whose rest
//! is ours: a magic number, the softrdma verbs handle that owns the
//! resource, and bookkeeping. The C pointer and the block share an address,
//! so turning an application's pointer back into the object is a cast
//! guarded by the magic number (a pointer we did not hand out, or one
//! already destroyed, is refused with EINVAL rather than trusted).
//!
//! Ownership is explicit: `create`/`alloc`/`reg`/`open` functions move a
//! `Box` into C with [`into_c`]; the matching `destroy`/`dealloc`/`dereg`/
//! `close` takes it back with [`take`], clears the magic and drops it, which
//! releases the softrdma resource. Application-visible fields the library
//! changes later (`qp->state`, `cq->comp_events_completed`) live in an
//! `UnsafeCell`, because C reads them while we hold references.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{Fail, Res};

/// Implements the pointer conversions for one handle type whose C
/// structure is the field `c`, at offset `$off` of the block.
macro_rules! handle {
    ($t:ident, $c:ty, $magic:literal) => {
        impl $t {
            pub const MAGIC: u64 = u64::from_be_bytes(*$magic);

            /// The object behind an application's pointer.
            ///
            /// # Safety
            /// `p` is NULL or points at least at a readable `$c`; pointers
            /// this library handed out and has not yet freed are the only
            /// ones that pass the check.
            pub unsafe fn from_c<'a>(p: *mut $c) -> Res<&'a $t> {
                if p.is_null() {
                    return Err(Fail::inval(concat!(
                        "struct ",
                        stringify!($c),
                        " pointer is NULL"
                    )));
                }
                // SAFETY: the caller passes a pointer to a `$c`; if it is one
                // of ours, the block begins `Self::C_OFFSET` bytes earlier.
                let h = unsafe { p.cast::<u8>().sub(Self::C_OFFSET).cast::<$t>() };
                // SAFETY: as above; the magic tells ours from others.
                if unsafe { std::ptr::addr_of!((*h).magic).read() } != Self::MAGIC {
                    return Err(Fail::inval(concat!(
                        "struct ",
                        stringify!($c),
                        " was not created by softrdma's libibverbs (or is already destroyed)"
                    )));
                }
                // SAFETY: checked to be a live block of ours.
                Ok(unsafe { &*h })
            }

            /// The application's pointer to this object.
            pub fn c_ptr(&self) -> *mut $c {
                self.c.get()
            }

            /// Move a new object into the application's hands.
            #[allow(dead_code)] // devices are never handed over or freed
            pub fn into_c(b: Box<$t>) -> *mut $c {
                let p = Box::into_raw(b);
                // SAFETY: `p` is a live, uniquely owned block.
                unsafe { (*p).c_ptr() }
            }

            /// Take an object back from the application to free it.
            ///
            /// # Safety
            /// `p` passed `from_c` and the application gives up the pointer.
            #[allow(dead_code)] // devices are never handed over or freed
            pub unsafe fn take(p: *mut $c) -> Res<Box<$t>> {
                // SAFETY: the caller's contract.
                let h = unsafe { Self::from_c(p)? } as *const $t as *mut $t;
                // SAFETY: `h` was made by `into_c` (Box::into_raw) and is
                // released exactly once: the magic is cleared first.
                unsafe {
                    (*h).magic = 0;
                    Ok(Box::from_raw(h))
                }
            }
        }
    };
}

/// A device from `ibv_get_device_list`. Devices live for the whole process
/// (rdma-core keeps its device list too); the list array is what is freed.
#[repr(C)]
pub struct Device {
    pub c: UnsafeCell<ibv_device>,
    /// Zeroed room in the shape of the tail of rdma-core's private
    /// `struct verbs_device` (ops, refcount, list entry, sysfs, flags), for
    /// code that looks past `struct ibv_device`.
    _verbs_device_tail: [usize; 6],
    magic: u64,
    pub info: sv::DeviceInfo,
    pub index: i32,
}
handle!(Device, ibv_device, b"sRDMAdev");

// SAFETY: a device is written only while it is built; afterwards neither the
// library nor (by verbs' contract) the application modifies it.
unsafe impl Sync for Device {}

impl Device {
    const C_OFFSET: usize = 0;

    pub fn new(info: sv::DeviceInfo, index: i32) -> Device {
        let mut c = ibv_device::zeroed();
        c.node_type = IBV_NODE_CA;
        c.transport_type = IBV_TRANSPORT_IB;
        crate::ffi::put_cstr(&mut c.name, &info.name);
        crate::ffi::put_cstr(&mut c.dev_name, &format!("uverbs{index}"));
        crate::ffi::put_cstr(
            &mut c.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        crate::ffi::put_cstr(
            &mut c.ibdev_path,
            &format!("/sys/class/infiniband/{}", info.name),
        );
        Device {
            c: UnsafeCell::new(c),
            _verbs_device_tail: [0; 6],
            magic: Self::MAGIC,
            info,
            index,
        }
    }
}

/// An open device: the verbs context (with the operations table the
/// static-inline verbs dispatch through) and the softrdma context whose
/// engine thread drives this process's traffic.
#[repr(C)]
pub struct Context {
    /// `struct verbs_context`; the application's `ibv_context*` points at
    /// its last field.
    pub vc: UnsafeCell<verbs_context>,
    magic: u64,
    pub sv: sv::Context,
    pub dev: &'static Device,
    pub port_mtu: sv::Mtu,
    /// CQ id → `*mut Cq`, to turn completion and async events back into
    /// the application's pointers.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `*mut Qp`, for async events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// PDs, CQs and completion channels of this context (everything else
    /// hangs off a PD).
    pub users: Users,
    /// `cmd_fd`: informational only, but a valid descriptor.
    pub _cmd_fd: OwnedFd,
}

impl Context {
    const C_OFFSET: usize = std::mem::offset_of!(verbs_context, context);
    pub const MAGIC: u64 = u64::from_be_bytes(*b"sRDMActx");

    /// # Safety
    /// As for the other handles' `from_c`.
    pub unsafe fn from_c<'a>(p: *mut ibv_context) -> Res<&'a Context> {
        if p.is_null() {
            return Err(Fail::inval("struct ibv_context pointer is NULL"));
        }
        // SAFETY: a context of ours sits at the end of a verbs_context, the
        // first field of a `Context`.
        let h = unsafe { p.cast::<u8>().sub(Self::C_OFFSET).cast::<Context>() };
        // SAFETY: as above.
        if unsafe { std::ptr::addr_of!((*h).magic).read() } != Self::MAGIC {
            return Err(Fail::inval(
                "struct ibv_context was not opened by softrdma's libibverbs (or is closed)",
            ));
        }
        // SAFETY: checked.
        Ok(unsafe { &*h })
    }

    pub fn c_ptr(&self) -> *mut ibv_context {
        // SAFETY: projecting to a field of our own cell.
        unsafe { std::ptr::addr_of_mut!((*self.vc.get()).context) }
    }

    pub fn into_c(b: Box<Context>) -> *mut ibv_context {
        let p = Box::into_raw(b);
        // SAFETY: live, uniquely owned.
        unsafe { (*p).c_ptr() }
    }

    /// # Safety
    /// As for the other handles' `take`.
    pub unsafe fn take(p: *mut ibv_context) -> Res<Box<Context>> {
        // SAFETY: the caller's contract.
        let h = unsafe { Self::from_c(p)? } as *const Context as *mut Context;
        // SAFETY: made by `into_c`, released once.
        unsafe {
            (*h).magic = 0;
            Ok(Box::from_raw(h))
        }
    }

    pub fn new_boxed(
        dev: &'static Device,
        sv: sv::Context,
        port_mtu: sv::Mtu,
        cmd_fd: OwnedFd,
        vc: verbs_context,
    ) -> Box<Context> {
        Box::new(Context {
            vc: UnsafeCell::new(vc),
            magic: Self::MAGIC,
            sv,
            dev,
            port_mtu,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            users: Users::default(),
            _cmd_fd: cmd_fd,
        })
    }
}

/// Counts the objects that depend on a resource, so destroying one still
/// in use fails with EBUSY as it does on a kernel provider.
#[derive(Default)]
pub struct Users(AtomicU32);

impl Users {
    pub fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn sub(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    pub fn busy(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

#[repr(C)]
pub struct Pd {
    pub c: UnsafeCell<ibv_pd>,
    magic: u64,
    pub sv: sv::Pd,
    /// MRs, QPs, SRQs and AHs of this PD.
    pub users: Users,
}
handle!(Pd, ibv_pd, b"sRDMApd_");

impl Pd {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_pd, sv: sv::Pd) -> Box<Pd> {
        Box::new(Pd {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
            users: Users::default(),
        })
    }
}

#[repr(C)]
pub struct Mr {
    pub c: UnsafeCell<ibv_mr>,
    magic: u64,
    pub sv: sv::Mr,
}
handle!(Mr, ibv_mr, b"sRDMAmr_");

impl Mr {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_mr, sv: sv::Mr) -> Box<Mr> {
        Box::new(Mr {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
        })
    }
}

#[repr(C)]
pub struct CompChannel {
    pub c: UnsafeCell<ibv_comp_channel>,
    magic: u64,
    pub sv: sv::CompChannel,
    /// CQs using this channel: destroying it before them is EBUSY.
    pub users: Users,
}
handle!(CompChannel, ibv_comp_channel, b"sRDMAch_");

impl CompChannel {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_comp_channel, sv: sv::CompChannel) -> Box<CompChannel> {
        Box::new(CompChannel {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
            users: Users::default(),
        })
    }
}

#[repr(C)]
pub struct Cq {
    pub c: UnsafeCell<ibv_cq>,
    magic: u64,
    pub sv: sv::Cq,
    /// QPs using this CQ.
    pub users: Users,
}
handle!(Cq, ibv_cq, b"sRDMAcq_");

impl Cq {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_cq, sv: sv::Cq) -> Box<Cq> {
        Box::new(Cq {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
            users: Users::default(),
        })
    }
}

#[repr(C)]
pub struct Srq {
    pub c: UnsafeCell<ibv_srq>,
    magic: u64,
    pub sv: sv::Srq,
    pub attr: Mutex<ibv_srq_attr>,
    /// QPs attached to this SRQ.
    pub users: Users,
}
handle!(Srq, ibv_srq, b"sRDMAsrq");

impl Srq {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_srq, sv: sv::Srq, attr: ibv_srq_attr) -> Box<Srq> {
        Box::new(Srq {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
            attr: Mutex::new(attr),
            users: Users::default(),
        })
    }
}

#[repr(C)]
pub struct Qp {
    pub c: UnsafeCell<ibv_qp>,
    magic: u64,
    pub sv: sv::Qp,
    pub qp_type: sv::QpType,
    pub sq_sig_all: bool,
}
handle!(Qp, ibv_qp, b"sRDMAqp_");

impl Qp {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_qp, sv: sv::Qp, qp_type: sv::QpType, sq_sig_all: bool) -> Box<Qp> {
        Box::new(Qp {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
            qp_type,
            sq_sig_all,
        })
    }
}

#[repr(C)]
pub struct Ah {
    pub c: UnsafeCell<ibv_ah>,
    magic: u64,
    pub sv: sv::Ah,
}
handle!(Ah, ibv_ah, b"sRDMAah_");

impl Ah {
    const C_OFFSET: usize = 0;
    pub fn new(c: ibv_ah, sv: sv::Ah) -> Box<Ah> {
        Box::new(Ah {
            c: UnsafeCell::new(c),
            magic: Self::MAGIC,
            sv,
        })
    }
}
