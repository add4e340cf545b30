//! The C structures of `<infiniband/verbs.h>` (rdma-core 44, x86_64) that
//! cross the library boundary, field for field.
//!
//! Applications read and write these directly — `qp->qp_num`, `wc.byte_len`,
//! `ctx->ops.post_send` — so the layout is the ABI. Only what this library
//! reads or fills has a named field; the rest is padding of the right size.
//! `tests::layout_matches_verbs_h` compiles a C program against the installed
//! header and checks every offset and size named here.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub type pthread_mutex_t = libc::pthread_mutex_t;
pub type pthread_cond_t = libc::pthread_cond_t;

/// C structures for which all-zero bytes are a valid value (integers, raw
/// pointers, `Option` of function pointers, glibc's pthread types, whose
/// static initializers are all zeros).
///
/// # Safety
/// Only implement for such types.
pub unsafe trait Zeroed: Sized {
    fn zeroed() -> Self {
        // SAFETY: the trait's contract.
        unsafe { std::mem::zeroed() }
    }
}

macro_rules! zeroed {
    ($($t:ty),*) => { $( unsafe impl Zeroed for $t {} )* };
}
zeroed!(
    ibv_device,
    verbs_context,
    ibv_device_attr,
    ibv_pd,
    ibv_mr,
    ibv_comp_channel,
    ibv_cq,
    ibv_cq_ex,
    ibv_srq,
    ibv_qp,
    ibv_qp_ex,
    ibv_td,
    ibv_ah,
    ibv_mw,
    ibv_send_wr,
    ibv_recv_wr,
    verbs_xrcd
);

// ---- enums and flags (libibverbs' numbers) ----

pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;

pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;
pub const IBV_PORT_IP_BASED_GIDS: u32 = 1 << 26;

pub const IBV_ATOMIC_HCA: u32 = 1;

pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs` (private API): RoCE v2.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// `enum ibv_gid_type_sysfs`: IB or RoCE v1 (what an empty slot reads as).
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;

pub const IBV_FORK_UNNEEDED: c_int = 2;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a provider may ignore
/// (`IBV_ACCESS_RELAXED_ORDERING` is the first).
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

pub const IBV_SRQ_MAX_WR: c_int = 1 << 0;
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const IBV_WR_LOCAL_INV: u32 = 7;
pub const IBV_WR_BIND_MW: u32 = 8;
pub const IBV_WR_SEND_WITH_INV: u32 = 9;
pub const IBV_WR_ATOMIC_WRITE: u32 = 15;

pub const IBV_MW_TYPE_1: u32 = 1;
pub const IBV_MW_TYPE_2: u32 = 2;

pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 2;
pub const IBV_ACCESS_REMOTE_READ: u32 = 4;
pub const IBV_ACCESS_REMOTE_ATOMIC: u32 = 8;
pub const IBV_ACCESS_MW_BIND: u32 = 16;
pub const IBV_ACCESS_ZERO_BASED: u32 = 32;
pub const IBV_ACCESS_ON_DEMAND: u32 = 64;
pub const IBV_ACCESS_HUGETLB: u32 = 128;

/// `enum ibv_rereg_mr_flags`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
pub const IBV_REREG_MR_CHANGE_PD: c_int = 2;
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
pub const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = 7;
/// `enum ibv_rereg_mr_err_code`: the input was refused, the region is as
/// it was.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;

/// FENCE | SIGNALED | SOLICITED | INLINE: the send flags the transport
/// implements. `IBV_SEND_IP_CSUM` (TSO/raw Ethernet) is ignored.
pub const IBV_SEND_FLAGS_KNOWN: u32 = 0xf;

pub const IBV_EVENT_CQ_ERR: u32 = 0;
pub const IBV_EVENT_QP_FATAL: u32 = 1;
pub const IBV_EVENT_QP_REQ_ERR: u32 = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
pub const IBV_EVENT_SQ_DRAINED: u32 = 5;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

// ---- device and context ----

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub struct ibv_device {
    /// `struct _ibv_device_ops`: obsolete, never called.
    pub _ops: [usize; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops` (32 slots). The `_compat_*` slots serve only
/// binaries built before 2018 and stay NULL, as in rdma-core.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device` … `_compat_dereg_mr`.
    pub _compat0: [usize; 7],
    /// verbs.h's inline `ibv_alloc_mw` fails with EOPNOTSUPP while NULL.
    pub alloc_mw: Option<AllocMwFn>,
    /// verbs.h's inline `ibv_bind_mw` (type 1 windows).
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: usize,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// `_compat_cq_event` … `_compat_destroy_srq`.
    pub _compat1: [usize; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp` … `_compat_destroy_qp`.
    pub _compat2: [usize; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah` … `_compat_async_event`.
    pub _compat3: [usize; 5],
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// `UINTPTR_MAX` marks the context as the tail of a [`verbs_context`].
    pub abi_compat: *mut c_void,
}

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

/// `struct verbs_context` (648 bytes): the extended operations, placed in
/// front of the `ibv_context` so `verbs_get_ctx()` finds them at a fixed
/// negative offset. It "grows up": newer operations come first, and `sz`
/// says how far back the table reaches.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    /// `alloc_null_mr` … `modify_qp_rate_limit` (12 slots).
    pub _ops1: [usize; 12],
    pub alloc_parent_domain: Option<AllocParentDomainFn>,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    pub alloc_td:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
    /// `modify_cq` … `query_rt_values` (8 slots).
    pub _ops1b: [usize; 8],
    /// verbs.h's inline `ibv_create_cq_ex` fails with EOPNOTSUPP while NULL.
    pub create_cq_ex: Option<CreateCqExFn>,
    pub _priv: usize,
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow` … `ABI_placeholder1` (4 slots).
    pub _ops2: [usize; 4],
    /// verbs.h's inline `ibv_open_qp`.
    pub open_qp: Option<OpenQpFn>,
    /// verbs.h's inline `ibv_create_qp_ex` (unless only the PD is given).
    pub create_qp_ex: Option<CreateQpExFn>,
    /// verbs.h's inline `ibv_get_srq_num`.
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    /// verbs.h's inline `ibv_create_srq_ex` (unless a basic SRQ of a PD).
    pub create_srq_ex: Option<CreateSrqExFn>,
    /// verbs.h's inline `ibv_open_xrcd`.
    pub open_xrcd: Option<OpenXrcdFn>,
    /// verbs.h's inline `ibv_close_xrcd`.
    pub close_xrcd: Option<unsafe extern "C" fn(*mut verbs_xrcd) -> c_int>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_device_attr_ex` (400 bytes); the legacy part, ODP and the
/// port count are filled, every other extended capability reads as absent.
#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    /// `completion_timestamp_mask` … `pci_atomic_caps`.
    pub _caps: [u64; 16],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` (52 bytes). The exported `ibv_query_port` fills
/// only the first 48 (`struct _compat_ibv_port_attr`, without
/// `port_cap_flags2`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `ibv_port_attr` the exported (compat) `ibv_query_port` writes.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `union ibv_gid`: 16 bytes, 8-byte aligned (its other member is a pair
/// of `__be64`), which the structures embedding it inherit.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// The union `element`: a `cq`, `qp`, `srq` or `wq` pointer, or a port
    /// number.
    pub element: *mut c_void,
    pub event_type: u32,
}

// ---- resources ----

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_cq_ex` (288 bytes): the fields of `struct ibv_cq` (verbs.h
/// spells them out again; `ibv_cq_ex_to_cq` is a cast, so they are that
/// struct), then the state of the current completion and the polling
/// functions that verbs.h's inline `ibv_start_poll`, `ibv_wc_read_*` …
/// call through.
#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub comp_mask: u32,
    /// The current completion's status and work request id, which the
    /// application reads directly.
    pub status: u32,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<CqExReadU32>,
    pub read_vendor_err: Option<CqExReadU32>,
    pub read_byte_len: Option<CqExReadU32>,
    pub read_imm_data: Option<CqExReadU32>,
    pub read_qp_num: Option<CqExReadU32>,
    pub read_src_qp: Option<CqExReadU32>,
    pub read_wc_flags: Option<CqExReadU32>,
    pub read_slid: Option<CqExReadU32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `read_completion_ts` … `read_completion_wallclock_ns`: for
    /// `wc_flags` this library refuses, so never called.
    pub _read_unsupported: [usize; 5],
}

pub type CqExReadU32 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u32;

/// `struct ibv_poll_cq_attr` (4 bytes).
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

pub type AllocParentDomainFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;

/// `struct ibv_td` (a thread domain).
#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
pub struct ibv_td_init_attr {
    pub comp_mask: u32,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64)>,
    pub pd_context: *mut c_void,
}

pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int;

pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_ex` (352 bytes): `struct ibv_qp`, then the work request
/// being built and the `ibv_wr_*` functions verbs.h's inlines call.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    /// The id and `IBV_SEND_*` flags the next `ibv_wr_<opcode>` takes.
    pub wr_id: u64,
    pub wr_flags: u32,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes): `struct ibv_qp_init_attr`'s
/// fields, then the extensions `comp_mask` says are set.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut verbs_xrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type OpenQpFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp;
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
pub type OpenXrcdFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut verbs_xrcd;

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct verbs_xrcd` (rdma-core's driver.h): the `struct ibv_xrcd` (its
/// context) applications hold, then the provider's part.
#[repr(C)]
pub struct verbs_xrcd {
    pub context: *mut ibv_context,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut verbs_xrcd,
    pub cq: *mut ibv_cq,
    /// `struct ibv_tm_cap`: `max_num_tags`, `max_ops`.
    pub tm_cap: [u32; 2],
}

/// `struct ibv_qp_open_attr`.
#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut verbs_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: u32,
}

/// `struct ibv_mw_bind_info`: what a window is bound to.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`, type 1 windows).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `struct ibv_send_wr` (`IBV_WR_BIND_MW`, type 2
/// windows).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

// ---- work requests and completions ----

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_atomic_wr {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ud_wr {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`; the opcode (and QP type) says
/// which member is meant.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_rdma_wr,
    pub atomic: ibv_atomic_wr,
    pub ud: ibv_ud_wr,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` (network byte order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// The `bind_mw` / `tso` union; only `bind_mw` is read.
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network byte order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;
    use std::mem::{offset_of, size_of};

    /// Every (C type, field, Rust offset) this library relies on, and every
    /// struct size.
    fn rust_layout() -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = Vec::new();
        macro_rules! sizes {
            ($($t:ident),* $(,)?) => { $( v.push((format!("sizeof(struct {})", stringify!($t)), size_of::<$t>())); )* };
        }
        macro_rules! offsets {
            ($t:ident: $($f:ident),* $(,)?) => { $( v.push((format!("offsetof(struct {}, {})", stringify!($t), stringify!($f)), offset_of!($t, $f))); )* };
        }
        sizes!(
            ibv_device,
            ibv_context_ops,
            ibv_context,
            verbs_context,
            ibv_device_attr,
            ibv_device_attr_ex,
            ibv_odp_caps,
            ibv_td,
            ibv_td_init_attr,
            ibv_parent_domain_init_attr,
            ibv_port_attr,
            ibv_gid_entry,
            ibv_async_event,
            ibv_pd,
            ibv_mr,
            ibv_comp_channel,
            ibv_cq,
            ibv_cq_ex,
            ibv_poll_cq_attr,
            ibv_cq_init_attr_ex,
            ibv_srq,
            ibv_srq_attr,
            ibv_srq_init_attr,
            ibv_srq_init_attr_ex,
            ibv_xrcd_init_attr,
            ibv_qp_open_attr,
            ibv_qp,
            ibv_qp_ex,
            ibv_data_buf,
            ibv_rx_hash_conf,
            ibv_qp_init_attr_ex,
            ibv_qp_cap,
            ibv_qp_init_attr,
            ibv_global_route,
            ibv_ah_attr,
            ibv_qp_attr,
            ibv_ah,
            ibv_mw,
            ibv_mw_bind_info,
            ibv_mw_bind,
            ibv_sge,
            ibv_send_wr,
            ibv_recv_wr,
            ibv_wc,
        );
        offsets!(ibv_device: node_type, transport_type, name, dev_name, dev_path, ibdev_path);
        offsets!(ibv_context_ops: alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv);
        offsets!(ibv_context: device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat);
        offsets!(ibv_parent_domain_init_attr: pd, td, comp_mask, alloc, free, pd_context);
        offsets!(verbs_context: query_port, advise_mr, alloc_parent_domain, dealloc_td, alloc_td, create_cq_ex, query_device_ex, open_qp, create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, sz, context);
        offsets!(ibv_xrcd_init_attr: comp_mask, fd, oflags);
        // verbs_xrcd is driver.h's (not installed): its head is verbs.h's
        // struct ibv_xrcd, the part applications read.
        v.push((
            "offsetof(struct ibv_xrcd, context)".into(),
            offset_of!(verbs_xrcd, context),
        ));
        offsets!(ibv_srq_init_attr_ex: srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap);
        offsets!(ibv_qp_open_attr: comp_mask, qp_num, xrcd, qp_context, qp_type);
        offsets!(ibv_qp_ex: qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp,
            wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write,
            wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
            wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write);
        offsets!(ibv_qp_init_attr_ex: qp_context, send_cq, recv_cq, srq, cap, qp_type,
            sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl,
            rx_hash_conf, source_qpn, send_ops_flags);
        offsets!(ibv_cq_ex: comp_mask, status, wr_id,
            start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len,
            read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
            read_dlid_path_bits);
        offsets!(ibv_cq_init_attr_ex: cqe, cq_context, channel, comp_vector, wc_flags,
            comp_mask, flags, parent_domain);
        offsets!(ibv_device_attr: fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap,
            vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge,
            max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom,
            max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee,
            max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp,
            max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr,
            max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt);
        offsets!(ibv_device_attr_ex: orig_attr, comp_mask, odp_caps, xrc_odp_caps, phys_port_cnt_ex);
        offsets!(ibv_port_attr: state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags,
            max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc,
            max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed,
            phys_state, link_layer, flags, port_cap_flags2);
        offsets!(ibv_gid_entry: gid, gid_index, port_num, gid_type, ndev_ifindex);
        offsets!(ibv_async_event: element, event_type);
        offsets!(ibv_pd: context, handle);
        offsets!(ibv_mr: context, pd, addr, length, handle, lkey, rkey);
        offsets!(ibv_comp_channel: context, fd, refcnt);
        offsets!(ibv_cq: context, channel, cq_context, handle, cqe, mutex, cond,
            comp_events_completed, async_events_completed);
        offsets!(ibv_srq: context, srq_context, pd, handle, mutex, cond, events_completed);
        offsets!(ibv_srq_attr: max_wr, max_sge, srq_limit);
        offsets!(ibv_srq_init_attr: srq_context, attr);
        offsets!(ibv_qp: context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state,
            qp_type, mutex, cond, events_completed);
        offsets!(ibv_qp_cap: max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
        offsets!(ibv_qp_init_attr: qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all);
        offsets!(ibv_global_route: dgid, flow_label, sgid_index, hop_limit, traffic_class);
        offsets!(ibv_ah_attr: grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
        offsets!(ibv_qp_attr: qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
            sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit);
        offsets!(ibv_ah: context, pd, handle);
        offsets!(ibv_mw: context, pd, rkey, handle);
        offsets!(ibv_mw_bind_info: mr, addr, length, mw_access_flags);
        offsets!(ibv_mw_bind: wr_id, send_flags, bind_info);
        v.push((
            "offsetof(struct ibv_mw, type)".into(),
            offset_of!(ibv_mw, type_),
        ));
        offsets!(ibv_sge: addr, length, lkey);
        offsets!(ibv_send_wr: wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr);
        offsets!(ibv_recv_wr: wr_id, next, sg_list, num_sge);
        offsets!(ibv_wc: wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
            wc_flags, pkey_index, slid, sl, dlid_path_bits);
        v.push(("sizeof(union ibv_gid)".into(), size_of::<ibv_gid>()));
        v.push((
            "_Alignof(union ibv_gid)".into(),
            std::mem::align_of::<ibv_gid>(),
        ));
        // Union members and fields whose C name differs from ours.
        let wr = offset_of!(ibv_send_wr, wr);
        v.push((
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)".into(),
            wr,
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)".into(),
            wr + offset_of!(ibv_rdma_wr, rkey),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.atomic.compare_add)".into(),
            wr + offset_of!(ibv_atomic_wr, compare_add),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.atomic.swap)".into(),
            wr + offset_of!(ibv_atomic_wr, swap),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.atomic.rkey)".into(),
            wr + offset_of!(ibv_atomic_wr, rkey),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.ud.ah)".into(),
            wr + offset_of!(ibv_ud_wr, ah),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.ud.remote_qpn)".into(),
            wr + offset_of!(ibv_ud_wr, remote_qpn),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, wr.ud.remote_qkey)".into(),
            wr + offset_of!(ibv_ud_wr, remote_qkey),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, qp_type.xrc.remote_srqn)".into(),
            offset_of!(ibv_send_wr, remote_srqn),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, invalidate_rkey)".into(),
            offset_of!(ibv_send_wr, imm_data),
        ));
        let bind = offset_of!(ibv_send_wr, bind_mw);
        v.push(("offsetof(struct ibv_send_wr, bind_mw)".into(), bind));
        v.push((
            "offsetof(struct ibv_send_wr, bind_mw.mw)".into(),
            bind + offset_of!(ibv_send_wr_bind_mw, mw),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, bind_mw.rkey)".into(),
            bind + offset_of!(ibv_send_wr_bind_mw, rkey),
        ));
        v.push((
            "offsetof(struct ibv_send_wr, bind_mw.bind_info)".into(),
            bind + offset_of!(ibv_send_wr_bind_mw, bind_info),
        ));
        v.push((
            "sizeof(((struct ibv_send_wr *)0)->bind_mw)".into(),
            size_of::<ibv_send_wr_bind_mw>(),
        ));
        v.push((
            "offsetof(struct ibv_wc, invalidated_rkey)".into(),
            offset_of!(ibv_wc, imm_data),
        ));
        // verbs.h spells out ibv_cq's fields in ibv_cq_ex: each where the
        // embedded ibv_cq has it.
        for (f, o) in [
            ("context", offset_of!(ibv_cq, context)),
            ("cq_context", offset_of!(ibv_cq, cq_context)),
            ("cqe", offset_of!(ibv_cq, cqe)),
            ("mutex", offset_of!(ibv_cq, mutex)),
            (
                "async_events_completed",
                offset_of!(ibv_cq, async_events_completed),
            ),
        ] {
            v.push((
                format!("offsetof(struct ibv_cq_ex, {f})"),
                offset_of!(ibv_cq_ex, cq) + o,
            ));
        }
        v.push((
            "offsetof(struct ibv_cq_ex, read_completion_ts)".into(),
            offset_of!(ibv_cq_ex, _read_unsupported),
        ));
        v.push((
            "offsetof(struct verbs_context, alloc_null_mr)".into(),
            offset_of!(verbs_context, _ops1),
        ));
        v.push((
            "offsetof(struct verbs_context, modify_cq)".into(),
            offset_of!(verbs_context, _ops1b),
        ));
        v.push((
            "offsetof(struct verbs_context, ibv_destroy_flow)".into(),
            offset_of!(verbs_context, _ops2),
        ));
        v.push((
            "offsetof(struct verbs_context, _ABI_placeholder3)".into(),
            offset_of!(verbs_context, _abi_placeholder3),
        ));
        v.push((
            "offsetof(struct ibv_device_attr_ex, completion_timestamp_mask)".into(),
            offset_of!(ibv_device_attr_ex, _caps),
        ));
        v.push((
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.rc_odp_caps)".into(),
            offset_of!(ibv_device_attr_ex, odp_caps) + offset_of!(ibv_odp_caps, rc_odp_caps),
        ));
        v.push((
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.ud_odp_caps)".into(),
            offset_of!(ibv_device_attr_ex, odp_caps) + offset_of!(ibv_odp_caps, ud_odp_caps),
        ));
        v.push((
            "offsetof(struct ibv_context_ops, _compat_create_cq)".into(),
            offset_of!(ibv_context_ops, _compat_create_cq),
        ));
        v
    }

    /// The layout of every structure above, compared with what the C
    /// compiler computes from the installed `<infiniband/verbs.h>`.
    #[test]
    fn layout_matches_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        assert!(
            header.exists(),
            "{} is missing: install libibverbs-dev (apt-get install -y libibverbs-dev)",
            header.display()
        );
        let rust = rust_layout();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &rust {
            writeln!(c, "  printf(\"%zu\\n\", (size_t){expr});").unwrap();
        }
        c.push_str("  return 0;\n}\n");
        let tmp = tempfile::Builder::new()
            .prefix("softrdma-ibverbs-layout-")
            .tempdir()
            .expect("a scratch directory");
        let dir = tmp.path();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c).unwrap();
        let st = std::process::Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("a C compiler (cc) is needed for the layout check");
        assert!(st.success(), "compiling {} failed", src.display());
        let out = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let c_values: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(c_values.len(), rust.len());
        let wrong: Vec<String> = rust
            .iter()
            .zip(&c_values)
            .filter(|((_, r), c)| r != *c)
            .map(|((e, r), c)| format!("{e}: C {c}, Rust {r}"))
            .collect();
        assert!(
            wrong.is_empty(),
            "layout differs from verbs.h:\n{}",
            wrong.join("\n")
        );
    }
}
