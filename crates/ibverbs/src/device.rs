//! Devices and contexts: discovery, open/close, and the queries tools print
//! (`ibv_devices`, `ibv_devinfo -v`) and applications use to pick a GID and
//! an MTU.
//!
//! Devices are softrdma's (`SOFTRDMA_DEVICES`, `/etc/softrdma/devices`, or
//! the host's addresses). Each has one RoCE v2 port: link layer Ethernet,
//! always ACTIVE, rxe's GID table over the device's interface (1024 slots;
//! the device's address, IPv4-mapped for IPv4, among them: see
//! `softrdma_verbs::gid`), one P_Key (0xffff). The active MTU is 4096 unless `SOFTRDMA_MTU` says otherwise
//! (bytes: 256, 512, 1024, 2048 or 4096). The vendor id is not one perftest
//! knows, so it uses the classic `ibv_post_send` path without inline data.
//! `SOFTRDMA_IBV_STATS=1` prints the transport, port and shared-memory
//! counters (packets lost to a peer's full ring among them) when a context
//! is closed.

use std::os::fd::AsRawFd;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

use softrdma_verbs as sv;

use crate::abi::*;
use crate::ffi::{self, errno_ret, minus_one, null_ret, Fail, Res};
use crate::handles::{Context, Device, Shared};
use crate::non_null;

crate::symver! {
    "IBVERBS_1.1":
        ibv_close_device, ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list,
        ibv_get_device_name, ibv_open_device, ibv_query_device, ibv_query_gid,
        ibv_query_pkey, ibv_query_port;
    "IBVERBS_1.5":
        ibv_get_pkey_index;
    "IBVERBS_1.9":
        ibv_get_device_index;
    "IBVERBS_1.11":
        _ibv_query_gid_ex, _ibv_query_gid_table;
    "IBVERBS_PRIVATE_34":
        ibv_query_gid_type;
}

/// Every device ever listed in this process, by position (the device index).
static DEVICES: Mutex<Vec<&'static Device>> = Mutex::new(Vec::new());

/// The device a pointer from `ibv_get_device_list` names (by address).
pub fn listed(p: *mut ibv_device) -> Option<&'static Device> {
    let reg = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    reg.iter().copied().find(|d| d.c_ptr() == p)
}

/// The configured devices, as long-lived `Device`s (an existing one is
/// reused, so pointers from an earlier list stay valid).
fn current_devices() -> Res<Vec<&'static Device>> {
    let infos = sv::devices().map_err(|e| {
        ffi::warn(&format!("cannot list devices: {e}"));
        Fail::from(e)
    })?;
    let mut reg = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(infos.len());
    for info in infos {
        let d = match reg.iter().find(|d| d.info == info) {
            Some(d) => *d,
            None => {
                let d: &'static Device = Box::leak(Box::new(Device::new(info, reg.len() as i32)));
                reg.push(d);
                d
            }
        };
        out.push(d);
    }
    Ok(out)
}

/// The port's active MTU: `SOFTRDMA_MTU` in bytes, else 4096.
fn port_mtu() -> Res<sv::Mtu> {
    match std::env::var("SOFTRDMA_MTU") {
        Err(_) => Ok(sv::Mtu::B4096),
        Ok(s) => s
            .trim()
            .parse::<u32>()
            .ok()
            .and_then(sv::Mtu::from_bytes)
            .ok_or_else(|| {
                let msg = format!("SOFTRDMA_MTU={s} is not one of 256, 512, 1024, 2048, 4096");
                ffi::warn(&msg);
                Fail::inval(msg)
            }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    null_ret("ibv_get_device_list", || get_device_list_impl(num_devices))
}

/// The body of `ibv_get_device_list`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn get_device_list_impl(num_devices: *mut c_int) -> Res<*mut *mut ibv_device> {
    let devs = current_devices()?;
    // SAFETY: calloc of n+1 pointers; freed by ibv_free_device_list.
    let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<usize>()) }
        .cast::<*mut ibv_device>();
    if list.is_null() {
        return Err(Fail::new(libc::ENOMEM, "out of memory"));
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: i < len of the allocation; the last slot stays NULL.
        unsafe { *list.add(i) = d.c_ptr() };
    }
    if !num_devices.is_null() {
        // SAFETY: the caller passes a writable int or NULL.
        unsafe { *num_devices = devs.len() as c_int };
    }
    Ok(list)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi::void_ret("ibv_free_device_list", || {
        // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
        unsafe { libc::free(list.cast()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    null_ret("ibv_get_device_name", || {
        let d = Device::from_c(device)?;
        // SAFETY: the device lives for the process.
        Ok(unsafe { (*d.c_ptr()).name.as_mut_ptr() })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    ffi::value_ret("ibv_get_device_guid", 0, || {
        let d = Device::from_c(device)?;
        Ok(sv::device_attr(&d.info).node_guid.to_be())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    minus_one("ibv_get_device_index", || Ok(Device::from_c(device)?.index))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    null_ret("ibv_open_device", || open_device_impl(device))
}

/// The body of `ibv_open_device`, for this library's own callers (rdmacm):
/// an exported function is not called across modules (its definition must
/// stay in the codegen unit of its `.symver`, see exports.rs).
pub(crate) fn open_device_impl(device: *mut ibv_device) -> Res<*mut ibv_context> {
    let dev = Device::from_c(device)?;
    let mtu = port_mtu()?;
    let opts = sv::OpenOptions {
        port_mtu: Some(mtu),
        ..Default::default()
    };
    let ctx = sv::Context::open(&dev.info, &opts).map_err(|e| {
        ffi::warn(&format!(
            "cannot open device {} ({}): {e}",
            dev.info.name, dev.info.addr
        ));
        Fail::from(e)
    })?;
    let cmd_fd = crate::import::new_cmd_fd()?;
    let vc = context_ops(dev, ctx.async_fd(), cmd_fd.as_raw_fd());
    let sv = Arc::new(ctx);
    let shared = Arc::new(Shared::default());
    crate::import::enroll(&cmd_fd, &sv, &shared, dev, mtu)?;
    Ok(Context::into_c(Context::new(
        dev, sv, shared, mtu, cmd_fd, vc,
    )))
}

/// A context's `struct verbs_context`: this library's operations, and the
/// descriptors it shows (shared with the contexts imported from it).
pub(crate) fn context_ops(dev: &'static Device, async_fd: c_int, cmd_fd: c_int) -> verbs_context {
    let mut vc = verbs_context::zeroed();
    vc.query_port = Some(vctx_query_port);
    vc.query_device_ex = Some(vctx_query_device_ex);
    vc.create_cq_ex = Some(crate::resources::vctx_create_cq_ex);
    vc.advise_mr = Some(crate::resources::vctx_advise_mr);
    vc.alloc_parent_domain = Some(crate::resources::vctx_alloc_parent_domain);
    vc.alloc_td = Some(crate::resources::vctx_alloc_td);
    vc.dealloc_td = Some(crate::resources::vctx_dealloc_td);
    vc.create_qp_ex = Some(crate::qp::vctx_create_qp_ex);
    vc.open_xrcd = Some(crate::xrc::vctx_open_xrcd);
    vc.close_xrcd = Some(crate::xrc::vctx_close_xrcd);
    vc.create_srq_ex = Some(crate::xrc::vctx_create_srq_ex);
    vc.get_srq_num = Some(crate::xrc::vctx_get_srq_num);
    vc.open_qp = Some(crate::xrc::vctx_open_qp);
    vc.sz = std::mem::size_of::<verbs_context>();
    let c = &mut vc.context;
    c.device = dev.c_ptr();
    c.ops.poll_cq = Some(crate::datapath::poll_cq);
    c.ops.req_notify_cq = Some(crate::datapath::req_notify_cq);
    c.ops.post_send = Some(crate::datapath::post_send);
    c.ops.post_recv = Some(crate::datapath::post_recv);
    c.ops.post_srq_recv = Some(crate::datapath::post_srq_recv);
    c.ops.alloc_mw = Some(crate::mw::alloc_mw);
    c.ops.bind_mw = Some(crate::mw::bind_mw);
    c.ops.dealloc_mw = Some(crate::mw::dealloc_mw);
    c.cmd_fd = cmd_fd;
    c.async_fd = async_fd;
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void;
    vc
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    errno_ret("ibv_close_device", || {
        let ctx = match Context::take_unused(context, "resources are still allocated") {
            // rdma-core closes regardless and leaves the resources dangling.
            // Keeping the context (and its engine) alive instead means a
            // later destroy of those resources still finds what it needs.
            // perftest's send_bw client does this; rdma-core says nothing.
            Err(e) if e.errno == libc::EBUSY => {
                ffi::note("ibv_close_device with resources still allocated: the context is kept");
                return Ok(());
            }
            r => r?,
        };
        if std::env::var_os("SOFTRDMA_IBV_STATS").is_some_and(|v| v != "0") {
            let (t, p) = ctx.sv.stats();
            eprintln!("softrdma: {} transport: {t:?}", ctx.dev.info.name);
            eprintln!("softrdma: {} port: {p:?}", ctx.dev.info.name);
            eprintln!(
                "softrdma: {} shm: {:?}",
                ctx.dev.info.name,
                ctx.sv.shm_stats()
            );
        }
        drop(ctx);
        Ok(())
    })
}

fn fill_device_attr(info: &sv::DeviceInfo, out: &mut ibv_device_attr) {
    let a = sv::device_attr(info);
    let sat = |v: u32| v.min(i32::MAX as u32) as c_int;
    *out = ibv_device_attr::zeroed();
    ffi::put_cstr(&mut out.fw_ver, &a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = 0xffff_f000;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    out.max_qp = sat(a.max_qp);
    out.max_qp_wr = sat(a.max_qp_wr);
    // SYS_IMAGE_GUID | RC_RNR_NAK_GEN | CURR_QP_STATE_MOD | MEM_WINDOW |
    // XRC | MEM_WINDOW_TYPE_2B (type 2 windows bound to a QP, as rxe's)
    out.device_cap_flags = (1 << 11) | (1 << 12) | (1 << 7) | (1 << 17) | (1 << 20) | (1 << 24);
    out.max_sge = sat(a.max_sge);
    out.max_sge_rd = sat(a.max_sge);
    out.max_cq = sat(a.max_cq);
    out.max_cqe = sat(a.max_cqe);
    out.max_mr = sat(a.max_mr);
    out.max_mw = sat(a.max_mw);
    out.max_pd = sat(a.max_pd);
    out.max_qp_rd_atom = sat(a.max_qp_rd_atom);
    out.max_res_rd_atom = sat(a.max_qp_rd_atom.saturating_mul(a.max_qp));
    out.max_qp_init_rd_atom = sat(a.max_qp_init_rd_atom);
    out.atomic_cap = if a.atomic_cap_hca { IBV_ATOMIC_HCA } else { 0 };
    out.max_ah = sat(a.max_qp.saturating_mul(64));
    out.max_srq = sat(a.max_srq);
    out.max_srq_wr = sat(a.max_srq_wr);
    out.max_srq_sge = sat(a.max_srq_sge);
    out.max_mcast_grp = sat(a.max_mcast_grp);
    out.max_mcast_qp_attach = sat(a.max_mcast_qp_attach);
    out.max_total_mcast_qp_attach = sat(a.max_total_mcast_qp_attach);
    out.max_pkeys = 1;
    out.local_ca_ack_delay = 15;
    out.phys_port_cnt = a.phys_port_cnt;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    errno_ret("ibv_query_device", || {
        non_null!(device_attr);
        let ctx = Context::from_c(context)?;
        // SAFETY: the caller passes a writable ibv_device_attr.
        fill_device_attr(&ctx.dev.info, unsafe { &mut *device_attr });
        Ok(())
    })
}

/// `verbs_context.query_device_ex`: the legacy attributes, no extended
/// capabilities.
/// On-demand paging, as `ibv_query_device_ex` reports it: every region is
/// "on demand" here — softrdma pins nothing and reaches registered memory
/// through the process's own page tables, faulting pages in as the
/// application would — so `IBV_ACCESS_ON_DEMAND` changes nothing and every
/// operation of RC, UC and UD works on such a region (`IBV_ODP_SUPPORT_*`:
/// SEND, RECV, WRITE, READ, ATOMIC, SRQ_RECV as each transport has them).
/// Implicit ODP too (`IBV_ODP_SUPPORT_IMPLICIT`, a region of the whole
/// address space): every access to such a region is a checked copy by the
/// kernel (`process_vm_readv`/`writev`), so an address the process has not
/// mapped gives the access error an RNIC gives, not a fault.
const ODP_CAPS: ibv_odp_caps = ibv_odp_caps {
    general_caps: 1 | 2, // IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT
    rc_odp_caps: 0x3f,
    uc_odp_caps: 0x27,
    ud_odp_caps: 0x23,
};

unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    errno_ret("ibv_query_device_ex", || {
        non_null!(attr);
        // SAFETY: a readable input struct or NULL.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return Err(Fail::inval("ibv_query_device_ex_input.comp_mask is not 0"));
        }
        if attr_size < std::mem::size_of::<ibv_device_attr>() {
            return Err(Fail::inval(
                "attr_size is smaller than struct ibv_device_attr",
            ));
        }
        let ctx = Context::from_c(context)?;
        // SAFETY: the caller owns `attr_size` writable bytes at `attr`.
        unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size) };
        let mut legacy = ibv_device_attr::zeroed();
        fill_device_attr(&ctx.dev.info, &mut legacy);
        // SAFETY: orig_attr is the first member, within attr_size.
        unsafe { (*attr).orig_attr = legacy };
        let odp_end = std::mem::offset_of!(ibv_device_attr_ex, odp_caps)
            + std::mem::size_of::<ibv_odp_caps>();
        if attr_size >= odp_end {
            // SAFETY: within attr_size.
            unsafe { (*attr).odp_caps = ODP_CAPS };
        }
        let xrc_end = std::mem::offset_of!(ibv_device_attr_ex, xrc_odp_caps) + 4;
        if attr_size >= xrc_end {
            // XRC is RC's operations through an XRC SRQ: what RC has on
            // demand, XRC has (SEND, RECV, WRITE, READ, ATOMIC, SRQ_RECV).
            // SAFETY: within attr_size.
            unsafe { (*attr).xrc_odp_caps = ODP_CAPS.rc_odp_caps };
        }
        let ex_end = std::mem::offset_of!(ibv_device_attr_ex, phys_port_cnt_ex) + 4;
        if attr_size >= ex_end {
            // SAFETY: within attr_size.
            unsafe { (*attr).phys_port_cnt_ex = 1 };
        }
        Ok(())
    })
}

fn port_attr(ctx: &Context) -> ibv_port_attr {
    let p = ctx.sv.query_port();
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: p.max_mtu.to_ibv(),
        active_mtu: ctx.port_mtu.to_ibv(),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        lid: p.lid,
        max_vl_num: 1,
        active_width: 1,  // 1X
        active_speed: 32, // 25 Gb/s (EDR lane)
        phys_state: 5,    // LinkUp
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..Default::default()
    }
}

fn check_port(port: u32) -> Res<()> {
    if port != 1 {
        return Err(Fail::inval(format!(
            "port {port} does not exist: a softrdma device has one port, number 1"
        )));
    }
    Ok(())
}

/// `verbs_context.query_port`: what `ibv_query_port()` (a static inline in
/// verbs.h) calls, with the size of the caller's struct.
unsafe extern "C" fn vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    errno_ret("ibv_query_port", || {
        non_null!(port_attr_out);
        let ctx = Context::from_c(context)?;
        check_port(port_num.into())?;
        let a = port_attr(&ctx);
        let n = len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller owns `len` writable bytes; we write at most that.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&a as *const ibv_port_attr).cast::<u8>(),
                port_attr_out.cast::<u8>(),
                n,
            )
        };
        Ok(())
    })
}

/// The exported (compat) entry point: the caller's struct may be the
/// 48-byte `_compat_ibv_port_attr`, so nothing past byte 48 is written.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded with the compat length.
    unsafe { vctx_query_port(context, port_num, port_attr_out, COMPAT_PORT_ATTR_LEN) }
}

/// The GID at `index` (the table is rxe's, see `softrdma_verbs::gid`): an
/// empty slot is ENODATA, past the end EINVAL, as the kernel answers.
fn gid_of(ctx: &Context, port: u32, index: u32) -> Res<[u8; 16]> {
    check_port(port)?;
    Ok(ctx.sv.gid_table().get(index)?)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    minus_one("ibv_query_gid", || {
        non_null!(gid);
        let ctx = Context::from_c(context)?;
        let index = u32::try_from(index).map_err(|_| Fail::inval("negative GID index"))?;
        // An empty slot reads as the zero GID, as rdma-core's ibv_query_gid
        // keeps it ("Preserve API behavior for empty GID").
        let g = match gid_of(&ctx, port_num.into(), index) {
            Err(f) if f.errno == libc::ENODATA => [0; 16],
            r => r?,
        };
        // SAFETY: the caller passes a writable union ibv_gid.
        unsafe { (*gid).raw = g };
        Ok(0)
    })
}

fn gid_entry(ctx: &Context, port: u32, index: u32) -> Res<ibv_gid_entry> {
    Ok(ibv_gid_entry {
        gid: ibv_gid {
            raw: gid_of(ctx, port, index)?,
        },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ctx.sv.gid_table().ifindex,
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // An empty slot is an answer, not a misuse: a scan of the table
    // (perftest's, ibv_devinfo's) meets 1023 of them, so it is returned
    // without SOFTRDMA_IBV_LOG's line.
    let mut empty = false;
    let r = errno_ret("ibv_query_gid_ex", || {
        non_null!(entry);
        if flags != 0 {
            return Err(Fail::inval("flags must be 0"));
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(Fail::inval(
                "entry_size is smaller than struct ibv_gid_entry",
            ));
        }
        let ctx = Context::from_c(context)?;
        match gid_entry(&ctx, port_num, gid_index) {
            Err(f) if f.errno == libc::ENODATA => empty = true,
            // SAFETY: the caller passes a writable entry of entry_size bytes.
            r => unsafe { *entry = r? },
        }
        Ok(())
    });
    if empty {
        ffi::set_errno(libc::ENODATA);
        return libc::ENODATA;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let mut n = 0isize;
    let r = errno_ret("ibv_query_gid_table", || {
        non_null!(entries);
        if flags != 0 {
            return Err(Fail::inval("flags must be 0"));
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(Fail::inval(
                "entry_size is smaller than struct ibv_gid_entry",
            ));
        }
        let ctx = Context::from_c(context)?;
        let t = ctx.sv.gid_table();
        let count = t.entries().count();
        if max_entries < count {
            return Err(Fail::inval(format!(
                "max_entries ({max_entries}) is smaller than the number of GIDs ({count})"
            )));
        }
        for (k, (i, _)) in t.entries().enumerate() {
            // SAFETY: the caller passes max_entries (>= count > k) writable
            // entries of entry_size bytes each.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(k * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(gid_entry(&ctx, 1, i)?)
            };
        }
        n = count as isize;
        Ok(())
    });
    if r != 0 {
        -(r as isize)
    } else {
        n
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    minus_one("ibv_query_gid_type", || {
        non_null!(gid_type);
        let ctx = Context::from_c(context)?;
        // rdma-core answers an empty slot with IB/RoCE v1 and success
        // ("Preserve API behavior for empty GID").
        let t = match gid_of(&ctx, port_num.into(), index) {
            Err(f) if f.errno == libc::ENODATA => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
            r => r.map(|_| IBV_GID_TYPE_SYSFS_ROCE_V2)?,
        };
        // SAFETY: the caller passes a writable enum.
        unsafe { *gid_type = t };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    minus_one("ibv_query_pkey", || {
        non_null!(pkey);
        Context::from_c(context)?;
        check_port(port_num.into())?;
        if index != 0 {
            return Err(Fail::inval(
                "P_Key index out of range: the table has one entry",
            ));
        }
        // SAFETY: the caller passes a writable __be16.
        unsafe { *pkey = 0xffff };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    minus_one("ibv_get_pkey_index", || {
        Context::from_c(context)?;
        check_port(port_num.into())?;
        // 0xffff reads the same in either byte order.
        if pkey != 0xffff {
            return Err(Fail::new(
                libc::ENOENT,
                "only the default P_Key 0xffff exists",
            ));
        }
        Ok(0)
    })
}
