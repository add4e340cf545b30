//! The small exports: enum-to-string and rate conversions, fork support,
//! sysfs helpers, and the entry points provider libraries and librdmacm
//! import but softrdma does not implement.
//!
//! perftest links libmlx5, libefa and librdmacm, whose constructors and
//! imports (all bound at load time) reach into libibverbs' private
//! `IBVERBS_PRIVATE_34` interface. Those must exist; none is reached at run
//! time on a softrdma device, since no provider ever gets a device.
//! Unimplemented functions fail with `EOPNOTSUPP` in the convention of
//! their return type (a positive errno, or NULL with errno set); `void`
//! ones do nothing.

use std::os::raw::{c_char, c_int, c_void};

use crate::cstr;
use crate::ffi::{minus_one, Fail};

crate::symver! {
    "IBVERBS_1.0":
        ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern,
        ibv_get_sysfs_path, ibv_rate_to_mult, ibv_read_sysfs_file, mult_to_ibv_rate;
    "IBVERBS_1.1":
        ibv_copy_ah_attr_from_kern, ibv_dofork_range,
        ibv_dontfork_range, ibv_event_type_str, ibv_fork_init, ibv_node_type_str,
        ibv_port_state_str, ibv_rate_to_mbps, ibv_resolve_eth_l2_from_gid,
        ibv_wc_status_str, mbps_to_ibv_rate;
    "IBVERBS_1.10":
        ibv_query_ece, ibv_set_ece;
    "IBVERBS_1.12":
        ibv_reg_dmabuf_mr;
    "IBVERBS_1.13":
        ibv_import_dm, ibv_is_fork_initialized, ibv_unimport_dm;
    "IBVERBS_PRIVATE_34":
        __ioctl_final_num_attrs, __verbs_log, _verbs_init_and_alloc_context, execute_ioctl,
        ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
        ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah,
        ibv_cmd_create_counters, ibv_cmd_create_cq, ibv_cmd_create_cq_ex,
        ibv_cmd_create_flow, ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp,
        ibv_cmd_create_qp_ex, ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table,
        ibv_cmd_create_srq, ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw,
        ibv_cmd_dealloc_pd, ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters,
        ibv_cmd_destroy_cq, ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action,
        ibv_cmd_destroy_qp, ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq,
        ibv_cmd_destroy_wq, ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context,
        ibv_cmd_modify_cq, ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp,
        ibv_cmd_modify_qp_ex, ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp,
        ibv_cmd_open_xrcd, ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send,
        ibv_cmd_post_srq_recv, ibv_cmd_query_context, ibv_cmd_query_device_any,
        ibv_cmd_query_mr, ibv_cmd_query_port, ibv_cmd_query_qp, ibv_cmd_query_srq,
        ibv_cmd_read_counters, ibv_cmd_reg_dm_mr, ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr,
        ibv_cmd_req_notify_cq, ibv_cmd_rereg_mr, ibv_cmd_resize_cq,
        ibv_read_ibdev_sysfs_file, verbs_allow_disassociate_destroy, verbs_init_cq,
        verbs_open_device, verbs_register_driver_34, verbs_set_ops, verbs_uninit_context;
}

// ---- strings ----

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    use softrdma_verbs::WcStatus as S;
    const ALL: [S; 22] = [
        S::Success,
        S::LocLenErr,
        S::LocQpOpErr,
        S::LocEecOpErr,
        S::LocProtErr,
        S::WrFlushErr,
        S::MwBindErr,
        S::BadRespErr,
        S::LocAccessErr,
        S::RemInvReqErr,
        S::RemAccessErr,
        S::RemOpErr,
        S::RetryExcErr,
        S::RnrRetryExcErr,
        S::LocRddViolErr,
        S::RemInvRdReqErr,
        S::RemAbortErr,
        S::InvEecnErr,
        S::InvEecStateErr,
        S::FatalErr,
        S::RespTimeoutErr,
        S::GeneralErr,
    ];
    /// NUL-terminated copies of the core's texts.
    static TEXTS: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        let mut v: Vec<std::ffi::CString> = ALL
            .iter()
            .map(|s| std::ffi::CString::new(s.as_str()).expect("no NUL in status text"))
            .collect();
        v.push(c"tag matching error".into());
        v.push(c"tag matching rendezvous incomplete".into());
        v
    });
    match texts.get(status as usize) {
        Some(t) => t.as_ptr(),
        None => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
    match event {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    match node_type {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: u32) -> *const c_char {
    match state {
        0 => cstr!("PORT_NOP"),
        1 => cstr!("PORT_DOWN"),
        2 => cstr!("PORT_INIT"),
        3 => cstr!("PORT_ARMED"),
        4 => cstr!("PORT_ACTIVE"),
        5 => cstr!("PORT_ACTIVE_DEFER"),
        _ => cstr!("invalid state"),
    }
}

// ---- rates ----

/// `enum ibv_rate` value, and its signalling rate in Mb/s.
const RATES: [(c_int, c_int); 23] = [
    (2, 2_500),
    (5, 5_000),
    (3, 10_000),
    (6, 20_000),
    (4, 30_000),
    (7, 40_000),
    (8, 60_000),
    (9, 80_000),
    (10, 120_000),
    (11, 14_062),
    (12, 56_250),
    (13, 112_500),
    (14, 168_750),
    (15, 25_781),
    (16, 103_125),
    (17, 206_250),
    (18, 309_375),
    (19, 28_125),
    (20, 53_125),
    (21, 425_000),
    (22, 637_500),
    (23, 850_000),
    (24, 1_275_000),
];

/// The first nine rates are the classic multiples of 2.5 Gb/s.
const MULT_RATES: usize = 9;

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES[..MULT_RATES]
        .iter()
        .find(|r| r.0 == rate)
        .map_or(-1, |r| r.1 / 2_500)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES[..MULT_RATES]
        .iter()
        .find(|r| r.1 / 2_500 == mult)
        .map_or(0, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mbps).map_or(0, |r| r.0)
}

// ---- fork support: softrdma pins nothing, so fork needs no care ----

#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    crate::abi::IBV_FORK_UNNEEDED
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

// ---- sysfs: softrdma devices have none ----

#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    cstr!("/sys")
}

#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    minus_one("ibv_read_sysfs_file", || {
        Err(Fail::new(
            libc::ENOENT,
            "softrdma devices have no sysfs files",
        ))
    })
}

/// Variadic in C; the arguments after the format are never read.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *mut c_void,
    _fmt: *const c_char,
) -> c_int {
    minus_one("ibv_read_ibdev_sysfs_file", || {
        Err(Fail::new(
            libc::ENOENT,
            "softrdma devices have no sysfs files",
        ))
    })
}

// ---- provider-facing private interface ----

/// Called by every provider library's constructor to register itself.
/// softrdma needs no providers, so registration does nothing.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `bool verbs_allow_disassociate_destroy` (a data symbol).
#[no_mangle]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// Returns the attribute count it was given (no command buffers to link).
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: u32, _link: *mut c_void) -> u32 {
    num_attrs
}

/// Unimplemented entry points, grouped by how their C signature reports
/// failure. Each is defined without parameters: the C calling convention
/// leaves the caller's arguments unread and unharmed.
macro_rules! unimplemented_exports {
    (errno: $($e:ident),* ; null: $($n:ident),* ; void: $($v:ident),* $(;)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $e() -> c_int {
                crate::ffi::errno_ret(stringify!($e), || {
                    Err(Fail::unsupported(concat!(stringify!($e), " is not implemented by softrdma")))
                })
            }
        )*
        $(
            #[no_mangle]
            pub extern "C" fn $n() -> *mut c_void {
                crate::ffi::null_ret(stringify!($n), || {
                    Err(Fail::unsupported(concat!(stringify!($n), " is not implemented by softrdma")))
                })
            }
        )*
        $(
            #[no_mangle]
            pub extern "C" fn $v() {}
        )*
    };
}

unimplemented_exports! {
    errno:
        ibv_resolve_eth_l2_from_gid, ibv_query_ece,
        ibv_set_ece, execute_ioctl, verbs_init_cq,
        ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
        ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
        ibv_cmd_create_cq, ibv_cmd_create_cq_ex, ibv_cmd_create_flow,
        ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp, ibv_cmd_create_qp_ex,
        ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table, ibv_cmd_create_srq,
        ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd,
        ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq,
        ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
        ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
        ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
        ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex,
        ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd,
        ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send, ibv_cmd_post_srq_recv,
        ibv_cmd_query_context, ibv_cmd_query_device_any, ibv_cmd_query_mr,
        ibv_cmd_query_port, ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters,
        ibv_cmd_reg_dm_mr, ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_req_notify_cq,
        ibv_cmd_rereg_mr, ibv_cmd_resize_cq;
    null:
        ibv_import_dm, ibv_reg_dmabuf_mr,
        _verbs_init_and_alloc_context, verbs_open_device;
    void:
        ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern,
        ibv_copy_ah_attr_from_kern, ibv_unimport_dm,
        __verbs_log, verbs_set_ops, verbs_uninit_context;
}
