//! librdmacm's API (`rdma_cma.h`) over softrdma's connection manager
//! (`softrdma_verbs::cm`). The functions are exported as `softrdma_rdma_*`;
//! softrdma's `librdmacm.so.1` (crates/rdmacm) exports rdma-core's names
//! and forwards to these, so the IDs' `verbs`, `pd`, `qp` and CQs are this
//! library's objects.
//!
//! What librdmacm does in the caller's thread, this does too: at
//! `rdma_create_qp` the QP is moved to INIT, at `rdma_accept` to RTR and
//! RTS before the REP goes out, and a CONNECT_RESPONSE taken by
//! `rdma_get_cm_event` for an ID with a QP moves it to RTR and RTS, sends
//! the RTU and is reported as ESTABLISHED. An ID created without a channel
//! is synchronous: each call waits for its own event. `rdma_destroy_id`
//! waits until the ID's events are acknowledged, as librdmacm's does.
//!
//! Layouts (`rdma_cm_id` 416 bytes, `rdma_cm_event` 80, `rdma_addrinfo`
//! 96, `ibv_sa_path_rec` 64) are checked against the installed
//! `rdma/rdma_cma.h` by `tests::rdmacm_layout_matches_rdma_cma_h`.
//! Multicast (`rdma_join_multicast*`, `rdma_leave_multicast`) is RoCE's:
//! no SA query, the group's IP address is the MGID, MULTICAST_JOIN comes
//! at once and attaching the ID's QP is done as librdmacm does it, when
//! that event is handed out.
//! Not implemented: AF_IB addresses, ECE (accepted and reported as none).

#![allow(non_camel_case_types)]

use crate::abi::*;
use crate::ffi::{self, minus_one, null_ret, value_ret, void_ret, Fail, Res};
use crate::handles::{Context, Qp};
use softrdma_verbs as sv;
use softrdma_verbs::cm::{self, CmEvent, CmId, ConnParam, EventChannel, EventKind, PortSpace};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Condvar, LazyLock, Mutex};

// ---- the C structures (rdma_cma.h, x86_64) ----

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub pkey: u16,
    _pad: [u8; 6],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: [u8; 128],
    pub dst: [u8; 128],
    pub ibaddr: rdma_ib_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    _pad: [u8; 2],
    pub reversible: c_int,
    pub numb_path: u8,
    _pad2: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
pub union rdma_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_event_param,
}

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const RAI_FAMILY: c_int = 8;
const RDMA_OPTION_ID: c_int = 0;
const RDMA_OPTION_ID_TOS: c_int = 0;
const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
const RDMA_OPTION_ID_AFONLY: c_int = 2;
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
const RDMA_OPTION_IB: c_int = 1;
const RDMA_OPTION_IB_PATH: c_int = 1;
const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UD: c_int = 4;

// ---- the objects behind the pointers ----

/// A channel: the C struct first, so the application's pointer is ours.
#[repr(C)]
struct Channel {
    c: rdma_event_channel,
    ch: EventChannel,
}

/// An ID: the C struct first.
#[repr(C)]
struct Id {
    c: rdma_cm_id,
    id: CmId,
    path: ibv_sa_path_rec,
    /// An ID without a channel of the caller's: it waits for its events.
    sync: bool,
    /// The channel this library made for it (synchronous IDs).
    own_channel: *mut Channel,
    /// CQs and completion channels `rdma_create_qp` made (destroyed with
    /// the QP).
    made_cqs: bool,
    /// A passive `rdma_create_ep`'s QP attributes, for its requests' IDs.
    ep_qp: Option<(*mut ibv_pd, ibv_qp_init_attr)>,
    /// Multicast groups joined (`rdma_join_multicast*`), in join order.
    /// Locked: the join's event is handed out by whichever thread takes
    /// the channel's events.
    mc: Mutex<Vec<Mc>>,
}

/// One `rdma_join_multicast*` of an ID.
struct Mc {
    addr: SocketAddr,
    /// The caller's context pointer, the event's `param.ud.private_data`
    /// (librdmacm's).
    context: usize,
    send_only: bool,
    mgid: [u8; 16],
    /// Its MULTICAST_JOIN was handed out (and the ID's QP attached).
    reported: bool,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 4;
const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// An event: the C struct first, then its private data.
#[repr(C)]
struct Event {
    c: rdma_cm_event,
    private: [u8; 256],
    /// The ID the event counts against until acknowledged.
    counted: *mut Id,
}

/// Events handed out and not acknowledged, by ID (rdma_destroy_id waits).
static UNACKED: LazyLock<(Mutex<HashMap<usize, u32>>, Condvar)> =
    LazyLock::new(|| (Mutex::new(HashMap::new()), Condvar::new()));

/// Live channels and IDs, by address (a stale pointer is refused).
static LIVE: LazyLock<Mutex<Live>> = LazyLock::new(Default::default);

#[derive(Default)]
struct Live {
    channels: HashMap<usize, ()>,
    ids: HashMap<usize, ()>,
    /// Events handed out and not yet acknowledged: `rdma_ack_cm_event`
    /// frees only these (an event acknowledged twice, or a pointer that
    /// was never an event, is refused instead of freed).
    events: std::collections::HashSet<usize>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn channel(p: *mut rdma_event_channel) -> Res<&'static Channel> {
    if p.is_null() || !lock(&LIVE).channels.contains_key(&(p as usize)) {
        return Err(Fail::inval("not a live rdma_event_channel"));
    }
    // SAFETY: registered channels are live boxes until destroyed.
    Ok(unsafe { &*(p as *const Channel) })
}

/// A handle of the channel behind the application's pointer, for a call
/// that waits on it: its own reference, taken under the registry's lock,
/// so that the wait outlives an `rdma_destroy_event_channel` made
/// meanwhile by another thread (see `softrdma_rdma_get_cm_event`).
fn channel_handle(p: *mut rdma_event_channel) -> Res<EventChannel> {
    let live = lock(&LIVE);
    if p.is_null() || !live.channels.contains_key(&(p as usize)) {
        return Err(Fail::inval("not a live rdma_event_channel"));
    }
    // SAFETY: registered, and it stays so while we hold the lock
    // (`free_channel` unregisters under it before dropping the box).
    Ok(unsafe { &*(p as *const Channel) }.ch.clone())
}

fn check_id(p: *mut rdma_cm_id) -> Res<()> {
    if p.is_null() || !lock(&LIVE).ids.contains_key(&(p as usize)) {
        return Err(Fail::inval(format!("{p:?} is not a live rdma_cm_id")));
    }
    Ok(())
}

/// The ID behind the application's pointer, for a call that changes it.
fn id_of(p: *mut rdma_cm_id) -> Res<&'static mut Id> {
    check_id(p)?;
    // SAFETY: registered IDs are live boxes until rdma_destroy_id. The
    // calls that change an ID are the application's, one at a time per ID
    // (librdmacm's rule: an ID is not used from two threads at once, and
    // not changed while another thread takes its events); each such call
    // takes this reference once and drops it before it waits for events.
    Ok(unsafe { &mut *(p as *mut Id) })
}

// ---- devices: every softrdma device, opened once (librdmacm's too) ----

struct Dev {
    ctx: *mut ibv_context,
    cm: cm::Cm,
    /// A PD for IDs whose caller gives none (librdmacm's per-device PD).
    pd: *mut ibv_pd,
}
// SAFETY: the pointers name this library's objects, usable from any thread.
unsafe impl Send for Dev {}

static DEVS: Mutex<Option<Vec<Dev>>> = Mutex::new(None);

fn with_devs<T>(f: impl FnOnce(&[Dev]) -> Res<T>) -> Res<T> {
    let mut g = lock(&DEVS);
    if g.is_none() {
        let mut n: c_int = 0;
        let list = crate::device::get_device_list_impl(&mut n)?;
        let mut v = Vec::new();
        for i in 0..n as usize {
            // SAFETY: the list holds n device pointers.
            let d = unsafe { *list.add(i) };
            let Ok(ctx) = crate::device::open_device_impl(d) else {
                continue;
            };
            let c = Context::from_c(ctx)?;
            let cm = match c.sv.connection_manager() {
                Ok(cm) => cm,
                Err(e) => {
                    ffi::warn(&format!(
                        "no connection manager on {}: {e}",
                        c.dev.info.name
                    ));
                    continue;
                }
            };
            v.push(Dev {
                ctx,
                cm,
                pd: std::ptr::null_mut(),
            });
        }
        // SAFETY: the list get_device_list_impl allocated (calloc).
        unsafe { libc::free(list.cast()) };
        *g = Some(v);
    }
    f(g.as_deref().expect("set above"))
}

fn cms() -> Res<Vec<cm::Cm>> {
    with_devs(|d| Ok(d.iter().map(|d| d.cm.clone()).collect()))
}

fn ctx_of(cm: &cm::Cm) -> Res<*mut ibv_context> {
    with_devs(|d| {
        d.iter()
            .find(|x| x.cm.gid() == cm.gid())
            .map(|x| x.ctx)
            .ok_or_else(|| Fail::new(libc::ENODEV, "device not open"))
    })
}

fn default_pd(ctx: *mut ibv_context) -> Res<*mut ibv_pd> {
    let mut g = lock(&DEVS);
    let devs = g
        .as_mut()
        .ok_or_else(|| Fail::new(libc::ENODEV, "no devices"))?;
    let d = devs
        .iter_mut()
        .find(|d| d.ctx == ctx)
        .ok_or_else(|| Fail::inval("the ID's device is not one librdmacm opened"))?;
    if d.pd.is_null() {
        d.pd = crate::resources::alloc_pd_impl(ctx)?;
    }
    Ok(d.pd)
}

// ---- addresses ----

fn sockaddr_in(p: *const libc::sockaddr) -> Res<Option<SocketAddr>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a sockaddr of the family it says (the caller's contract).
    unsafe {
        match (*p).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(p as *const libc::sockaddr_in);
                Ok(Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                ))))
            }
            libc::AF_INET6 => {
                let s = &*(p as *const libc::sockaddr_in6);
                Ok(Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                ))))
            }
            f => Err(Fail::new(
                libc::EAFNOSUPPORT,
                format!("address family {f}: softrdma's rdma_cm takes AF_INET and AF_INET6"),
            )),
        }
    }
}

/// `a` as a `sockaddr_in`/`sockaddr_in6` in a 128-byte storage.
fn storage(a: SocketAddr) -> ([u8; 128], u32) {
    let mut out = [0u8; 128];
    let len = match a {
        SocketAddr::V4(v4) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let n = std::mem::size_of::<libc::sockaddr_in>();
            // SAFETY: plain-old-data bytes of a local value, n ≤ 128.
            out[..n].copy_from_slice(unsafe {
                std::slice::from_raw_parts((&s as *const libc::sockaddr_in).cast::<u8>(), n)
            });
            n
        }
        SocketAddr::V6(v6) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            let n = std::mem::size_of::<libc::sockaddr_in6>();
            // SAFETY: as above.
            out[..n].copy_from_slice(unsafe {
                std::slice::from_raw_parts((&s as *const libc::sockaddr_in6).cast::<u8>(), n)
            });
            n
        }
    };
    (out, len as u32)
}

/// Copy what the Rust ID knows into the C struct the application reads.
fn sync_c(i: &mut Id) -> Res<()> {
    let id = &i.id;
    if let Some(d) = id.device() {
        i.c.verbs = ctx_of(&d)?;
        // As librdmacm's ucma_get_device: once an ID has a device it has
        // the device's shared PD (pyverbs' `PD(cmid)` wraps it to create
        // QPs of its own on the ID's device).
        if i.c.pd.is_null() {
            i.c.pd = default_pd(i.c.verbs)?;
        }
        i.c.route.addr.ibaddr.sgid = d.gid();
    }
    if let Some(s) = id.src_addr() {
        i.c.route.addr.src = storage(s).0;
    }
    if let Some(d) = id.dst_addr() {
        i.c.route.addr.dst = storage(d).0;
        i.c.route.addr.ibaddr.dgid = sv::ip_to_gid(d.ip());
    }
    i.c.route.addr.ibaddr.pkey = 0xffff;
    i.c.qp_type = id.qp_type().to_ibv();
    Ok(())
}

fn new_id(ch: *mut Channel, cmid: CmId, context: *mut c_void, sync: bool) -> *mut Id {
    let mut c: rdma_cm_id = {
        // SAFETY: all-zero is a valid rdma_cm_id (pointers NULL, integers 0).
        unsafe { std::mem::zeroed() }
    };
    c.channel = ch.cast();
    c.context = context;
    c.ps = cmid.port_space().to_c();
    c.port_num = 1;
    c.qp_type = cmid.qp_type().to_ibv();
    let b = Box::new(Id {
        c,
        id: cmid,
        path: ibv_sa_path_rec::default(),
        sync,
        own_channel: if sync { ch } else { std::ptr::null_mut() },
        made_cqs: false,
        ep_qp: None,
        mc: Mutex::new(Vec::new()),
    });
    let p = Box::into_raw(b);
    // SAFETY: just allocated.
    unsafe {
        (*p).id.set_user(p as usize);
    }
    lock(&LIVE).ids.insert(p as usize, ());
    softrdma_verbs::cm::log(&format!("id {p:?} created"));
    p
}

fn make_channel() -> Res<*mut Channel> {
    let ch = EventChannel::new()?;
    let b = Box::new(Channel {
        c: rdma_event_channel { fd: ch.fd() },
        ch,
    });
    let p = Box::into_raw(b);
    lock(&LIVE).channels.insert(p as usize, ());
    Ok(p)
}

fn free_channel(p: *mut Channel) {
    if lock(&LIVE).channels.remove(&(p as usize)).is_some() {
        // SAFETY: a box of ours, now unregistered.
        drop(unsafe { Box::from_raw(p) });
    }
}

fn pick_ps(ps: c_int) -> Res<PortSpace> {
    PortSpace::from_c(ps).ok_or_else(|| Fail::inval(format!("port space {ps:#x}")))
}

// ---- exported ----

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_event_channel() -> *mut rdma_event_channel {
    null_ret("rdma_create_event_channel", || Ok(make_channel()?.cast()))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    void_ret("rdma_destroy_event_channel", || {
        channel(ch)?;
        free_channel(ch.cast());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    minus_one("rdma_create_id", || {
        crate::non_null!(out);
        let ps = pick_ps(ps)?;
        let (chp, sync) = if ch.is_null() {
            (make_channel()?, true)
        } else {
            channel(ch)?;
            (ch.cast::<Channel>(), false)
        };
        // SAFETY: a live channel.
        let cmid = CmId::new(unsafe { &(*chp).ch }, ps);
        let p = new_id(chp, cmid, context, sync);
        // SAFETY: writable out pointer.
        unsafe { *out = p.cast() };
        Ok(0)
    })
}

/// A synchronous ID waits for the event of the call it just made and
/// keeps it in `id->event`; an event with a bad status fails the call.
/// (Takes the pointer: the wait delivers events, which looks the ID up.)
fn complete(p: *mut rdma_cm_id, want: &[EventKind]) -> Res<()> {
    let (sync, last, ch) = {
        let i = id_of(p)?;
        let last = std::mem::replace(&mut i.c.event, std::ptr::null_mut());
        (i.sync, last, i.c.channel)
    };
    if !sync {
        return Ok(());
    }
    if !last.is_null() {
        // SAFETY: the event we stored last; acknowledging frees it.
        unsafe { softrdma_rdma_ack_cm_event(last) };
    }
    {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: our own channel; a blocking wait.
        if unsafe { softrdma_rdma_get_cm_event(ch, &mut ev) } != 0 {
            return Err(Fail::new(libc::EIO, "waiting for the CM event failed"));
        }
        // SAFETY: the event just returned.
        let e = unsafe { &*ev };
        let kind = EventKind::from_c(e.event);
        id_of(p)?.c.event = ev;
        if kind.is_some_and(|k| want.contains(&k)) && e.status == 0 {
            return Ok(());
        }
        let why = format!(
            "{} (status {})",
            kind.map_or("unknown event", |k| k.name()),
            e.status
        );
        // librdmacm's `ucma_complete`: REJECTED is ECONNREFUSED, another
        // event's status is the errno (negated if negative: UNREACHABLE's
        // -ETIMEDOUT). An event of the wrong kind with no status, which
        // librdmacm would let pass, is EIO here.
        Err(Fail::new(
            match (kind, e.status) {
                (Some(EventKind::Rejected), _) => libc::ECONNREFUSED,
                (_, s) if s < 0 => s.saturating_neg(),
                (_, s) if s > 0 => s,
                _ => libc::EIO,
            },
            why,
        ))
    }
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    minus_one("rdma_destroy_id", || {
        let i = id_of(p)?;
        if !i.c.event.is_null() {
            // SAFETY: the synchronous ID's last event.
            unsafe { softrdma_rdma_ack_cm_event(i.c.event) };
            i.c.event = std::ptr::null_mut();
        }
        i.id.destroy();
        i.id.set_user(0);
        // librdmacm: wait until every event of the ID is acknowledged.
        let (m, cv) = &*UNACKED;
        let mut g = lock(m);
        while g.get(&(p as usize)).is_some_and(|&n| n > 0) {
            softrdma_verbs::cm::log(&format!(
                "id {p:?}: waiting for {} unacknowledged events",
                g[&(p as usize)]
            ));
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.remove(&(p as usize));
        // Under `UNACKED`'s lock, with the check above: an event being
        // made for the ID counts it under this lock (`Pending::take`),
        // so it either was seen above or finds the ID gone.
        lock(&LIVE).ids.remove(&(p as usize));
        drop(g);
        softrdma_verbs::cm::log(&format!("id {p:?} destroyed"));
        let own = i.own_channel;
        // SAFETY: our box, unregistered; nothing refers to it any more.
        drop(unsafe { Box::from_raw(p as *mut Id) });
        if !own.is_null() {
            free_channel(own);
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_bind_addr(
    p: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    minus_one("rdma_bind_addr", || {
        let i = id_of(p)?;
        let a = sockaddr_in(addr)?.ok_or_else(|| Fail::inval("addr is NULL"))?;
        i.id.bind(a, &cms()?).map_err(Fail::from)?;
        sync_c(i)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    minus_one("rdma_resolve_addr", || {
        let i = id_of(p)?;
        let d = sockaddr_in(dst)?.ok_or_else(|| Fail::inval("dst_addr is NULL"))?;
        let s = sockaddr_in(src)?;
        i.id.resolve_addr(s, d, &cms()?).map_err(Fail::from)?;
        sync_c(i)?;
        complete(p, &[EventKind::AddrResolved])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_resolve_route(
    p: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    minus_one("rdma_resolve_route", || {
        let i = id_of(p)?;
        i.id.resolve_route().map_err(Fail::from)?;
        let ib = i.c.route.addr.ibaddr;
        let mtu =
            i.id.device()
                .and_then(|d| ctx_of(&d).ok())
                .and_then(|c| Context::from_c(c).ok())
                .map_or(sv::Mtu::B1024, |c| c.port_mtu);
        i.path = ibv_sa_path_rec {
            dgid: ib.dgid,
            sgid: ib.sgid,
            hop_limit: 64,
            reversible: 1,
            numb_path: 1,
            pkey: 0xffffu16.to_be(),
            mtu_selector: 2,
            mtu: mtu as u8,
            rate_selector: 2,
            packet_life_time_selector: 2,
            ..Default::default()
        };
        i.c.route.path_rec = &mut i.path;
        i.c.route.num_paths = 1;
        complete(p, &[EventKind::RouteResolved])?;
        Ok(0)
    })
}

/// Move the C QP `qp` with the attributes the ID gives for `state`.
fn move_qp(i: &Id, qp: *mut ibv_qp, state: sv::QpState) -> Res<()> {
    let q = Qp::from_c(qp)?;
    let (attr, mask) = i.id.init_qp_attr(state).map_err(Fail::from)?;
    q.sv.modify(&attr, mask)?;
    crate::qp::set_c_state(&q, state);
    Ok(())
}

fn create_qp(i: &mut Id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Res<()> {
    if i.c.verbs.is_null() {
        return Err(Fail::inval(
            "the ID has no device yet (bind or resolve it first)",
        ));
    }
    if !i.c.qp.is_null() {
        return Err(Fail::new(libc::EEXIST, "the ID already has a QP"));
    }
    let pd = if pd.is_null() {
        default_pd(i.c.verbs)?
    } else {
        pd
    };
    let t = sv::QpType::from_ibv(attr.qp_type)
        .ok_or_else(|| Fail::unsupported("QP type: RC, UC or UD"))?;
    i.id.set_qp_type(t).map_err(Fail::from)?;
    let mut made = false;
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        // librdmacm makes CQs (each with a completion channel) for a QP
        // created without them; rdma_verbs.h's helpers use them.
        let me: *mut c_void = (i as *mut Id).cast();
        if attr.send_cq.is_null() {
            let ch = crate::resources::create_comp_channel_impl(i.c.verbs)?;
            let cq = crate::resources::create_cq_impl(
                i.c.verbs,
                attr.cap.max_send_wr.max(1) as c_int,
                me,
                ch,
                0,
            )?;
            i.c.send_cq_channel = ch;
            i.c.send_cq = cq;
            attr.send_cq = cq;
        }
        if attr.recv_cq.is_null() {
            let ch = crate::resources::create_comp_channel_impl(i.c.verbs)?;
            let cq = crate::resources::create_cq_impl(
                i.c.verbs,
                attr.cap.max_recv_wr.max(1) as c_int,
                me,
                ch,
                0,
            )?;
            i.c.recv_cq_channel = ch;
            i.c.recv_cq = cq;
            attr.recv_cq = cq;
        }
        made = true;
    } else {
        i.c.send_cq = attr.send_cq;
        i.c.recv_cq = attr.recv_cq;
    }
    let qp = crate::qp::create_qp_impl(pd, attr)?;
    let init = || -> Res<()> {
        move_qp(i, qp, sv::QpState::Init)?;
        if t == sv::QpType::Ud {
            // librdmacm takes a UD QP to RTS at once.
            move_qp(i, qp, sv::QpState::Rtr)?;
            move_qp(i, qp, sv::QpState::Rts)?;
        }
        Ok(())
    };
    if let Err(e) = init() {
        let _ = crate::qp::destroy_qp_impl(qp);
        return Err(e);
    }
    i.c.qp = qp;
    i.c.pd = pd;
    i.c.qp_type = attr.qp_type;
    i.made_cqs = made;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    minus_one("rdma_create_qp", || {
        crate::non_null!(attr);
        let i = id_of(p)?;
        // SAFETY: a readable and writable init attr.
        create_qp(i, pd, unsafe { &mut *attr })?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_qp_ex(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    minus_one("rdma_create_qp_ex", || {
        crate::non_null!(attr);
        let i = id_of(p)?;
        // SAFETY: a readable and writable init attr.
        let a = unsafe { &mut *attr };
        const PD: u32 = 1;
        if a.comp_mask & !PD != 0 && a.comp_mask & !(PD | (1 << 6)) != 0 {
            return Err(Fail::unsupported(
                "rdma_create_qp_ex: only the PD (and send ops flags) are supported",
            ));
        }
        let pd = if a.comp_mask & PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        let mut b = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        create_qp(i, pd, &mut b)?;
        a.cap = b.cap;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_destroy_qp(p: *mut rdma_cm_id) {
    void_ret("rdma_destroy_qp", || {
        let i = id_of(p)?;
        if !i.c.qp.is_null() {
            crate::qp::destroy_qp_impl(i.c.qp)?;
            i.c.qp = std::ptr::null_mut();
        }
        if i.made_cqs {
            // The CQs and channels rdma_create_qp made.
            crate::resources::destroy_cq_impl(i.c.send_cq)?;
            crate::resources::destroy_cq_impl(i.c.recv_cq)?;
            crate::resources::destroy_comp_channel_impl(i.c.send_cq_channel)?;
            crate::resources::destroy_comp_channel_impl(i.c.recv_cq_channel)?;
            i.c.send_cq_channel = std::ptr::null_mut();
            i.c.recv_cq_channel = std::ptr::null_mut();
            i.made_cqs = false;
        }
        i.c.send_cq = std::ptr::null_mut();
        i.c.recv_cq = std::ptr::null_mut();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_srq(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    minus_one("rdma_create_srq", || {
        let i = id_of(p)?;
        if i.c.verbs.is_null() {
            return Err(Fail::inval("the ID has no device yet"));
        }
        let pd = if pd.is_null() {
            default_pd(i.c.verbs)?
        } else {
            pd
        };
        let srq = crate::resources::create_srq_impl(pd, attr)?;
        i.c.srq = srq;
        i.c.pd = pd;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_srq_ex(
    _p: *mut rdma_cm_id,
    _attr: *mut c_void,
) -> c_int {
    minus_one("rdma_create_srq_ex", || {
        Err(Fail::new(
            libc::ENOSYS,
            "rdma_create_srq_ex is not implemented (rdma_create_srq is)",
        ))
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_destroy_srq(p: *mut rdma_cm_id) {
    void_ret("rdma_destroy_srq", || {
        let i = id_of(p)?;
        if !i.c.srq.is_null() {
            crate::resources::destroy_srq_impl(i.c.srq)?;
            i.c.srq = std::ptr::null_mut();
        }
        Ok(())
    })
}

fn conn_param_of(p: *const rdma_conn_param, max: usize) -> Res<ConnParam> {
    if p.is_null() {
        // librdmacm's defaults without parameters.
        return Ok(ConnParam {
            responder_resources: 0xff,
            initiator_depth: 0xff,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        });
    }
    // SAFETY: a readable rdma_conn_param (the caller's contract).
    let c = unsafe { &*p };
    let n = c.private_data_len as usize;
    if n > max {
        return Err(Fail::inval(format!(
            "private_data_len {n} is more than the {max} bytes this message carries"
        )));
    }
    let data = if n == 0 || c.private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller gives private_data_len readable bytes.
        unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), n) }.to_vec()
    };
    Ok(ConnParam {
        private_data: data,
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control != 0,
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: c.srq != 0,
        qp_num: c.qp_num,
    })
}

fn qp_num(i: &Id, param: &ConnParam) -> u32 {
    if i.c.qp.is_null() {
        param.qp_num
    } else {
        // SAFETY: the ID's live QP.
        unsafe { (*i.c.qp).qp_num }
    }
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_connect(
    p: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    minus_one("rdma_connect", || {
        let i = id_of(p)?;
        let ud = i.id.qp_type() == sv::QpType::Ud;
        let max = if ud {
            cm::MAX_UD_CONNECT_PRIVATE
        } else {
            cm::MAX_CONNECT_PRIVATE
        };
        let mut c = conn_param_of(param, max)?;
        if !i.c.qp.is_null() {
            // SAFETY: the ID's live QP.
            c.srq = unsafe { !(*i.c.qp).srq.is_null() };
        }
        let qpn = qp_num(i, &c);
        i.id.connect(&c, qpn).map_err(Fail::from)?;
        // Without a QP on the ID the connection stops at CONNECT_RESPONSE:
        // the application moves its QP and calls rdma_establish.
        complete(p, &[EventKind::Established, EventKind::ConnectResponse])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_listen(p: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    minus_one("rdma_listen", || {
        let i = id_of(p)?;
        i.id.listen(&cms()?).map_err(Fail::from)?;
        sync_c(i)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_request(
    listen: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    minus_one("rdma_get_request", || {
        crate::non_null!(out);
        let l = id_of(listen)?;
        if !l.sync {
            return Err(Fail::inval(
                "rdma_get_request is for IDs created without an event channel",
            ));
        }
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: the listener's own channel.
            if unsafe { softrdma_rdma_get_cm_event(l.c.channel, &mut ev) } != 0 {
                return Err(Fail::new(libc::EIO, "waiting for a request failed"));
            }
            // SAFETY: the event just returned.
            let e = unsafe { &*ev };
            if e.event != EventKind::ConnectRequest as c_int {
                // SAFETY: as above.
                unsafe { softrdma_rdma_ack_cm_event(ev) };
                continue;
            }
            let child = id_of(e.id)?;
            let _ = &child;
            // The request's ID waits for its own events from now on.
            let ch = make_channel()?;
            // SAFETY: a live channel of ours.
            child.id.migrate(unsafe { &(*ch).ch });
            child.c.channel = ch.cast();
            child.sync = true;
            child.own_channel = ch;
            child.c.event = ev;
            // SAFETY: writable out pointer.
            unsafe { *out = e.id };
            return Ok(0);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_accept(
    p: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    minus_one("rdma_accept", || {
        let i = id_of(p)?;
        let ud = i.id.qp_type() == sv::QpType::Ud;
        let max = if ud {
            cm::MAX_UD_ACCEPT_PRIVATE
        } else {
            cm::MAX_ACCEPT_PRIVATE
        };
        let mut c = conn_param_of(param, max)?;
        if !ud && !i.c.qp.is_null() {
            // SAFETY: the ID's live QP.
            c.srq = unsafe { !(*i.c.qp).srq.is_null() };
            let qp = i.c.qp;
            // The numbers the REP will carry first, then the QP moved with
            // them, then the REP.
            i.id.offer(&c);
            let go = || -> Res<()> {
                move_qp(i, qp, sv::QpState::Rtr)?;
                move_qp(i, qp, sv::QpState::Rts)
            };
            if let Err(e) = go() {
                let _ = i.id.reject(&[]);
                return Err(e);
            }
        }
        let qpn = qp_num(i, &c);
        i.id.accept(&c, qpn).map_err(Fail::from)?;
        complete(p, &[EventKind::Established])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_reject(
    p: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    minus_one("rdma_reject", || {
        let i = id_of(p)?;
        let d = if data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller gives `len` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) }.to_vec()
        };
        i.id.reject(&d).map_err(Fail::from)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_reject_ece(
    p: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: the same contract as rdma_reject.
    unsafe { softrdma_rdma_reject(p, data, len) }
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_notify(p: *mut rdma_cm_id, _event: c_int) -> c_int {
    minus_one("rdma_notify", || {
        id_of(p)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    minus_one("rdma_disconnect", || {
        let i = id_of(p)?;
        if !i.c.qp.is_null() && i.id.qp_type() != sv::QpType::Ud {
            // librdmacm moves the QP to the error state first (its
            // outstanding work completes flushed).
            let q = Qp::from_c(i.c.qp)?;
            let attr = sv::QpAttr {
                qp_state: sv::QpState::Err,
                ..Default::default()
            };
            q.sv.modify(&attr, sv::AttrMask::STATE)?;
            crate::qp::set_c_state(&q, sv::QpState::Err);
        }
        i.id.disconnect().map_err(Fail::from)?;
        complete(p, &[EventKind::Disconnected])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_establish(p: *mut rdma_cm_id) -> c_int {
    minus_one("rdma_establish", || {
        let i = id_of(p)?;
        i.id.establish().map_err(Fail::from)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_init_qp_attr(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    minus_one("rdma_init_qp_attr", || {
        crate::non_null!(attr, mask);
        let i = id_of(p)?;
        // SAFETY: readable and writable (the caller sets qp_state).
        let out = unsafe { &mut *attr };
        let st = sv::QpState::from_ibv(out.qp_state)
            .ok_or_else(|| Fail::inval("qp_state is not a QP state"))?;
        let (a, m) = i.id.init_qp_attr(st).map_err(Fail::from)?;
        out.qp_state = a.qp_state.to_ibv();
        out.qp_access_flags = a.qp_access_flags.bits();
        out.pkey_index = a.pkey_index;
        out.port_num = a.port_num;
        out.qkey = a.qkey;
        out.path_mtu = a.path_mtu.to_ibv();
        out.dest_qp_num = a.dest_qp_num;
        out.rq_psn = a.rq_psn;
        out.sq_psn = a.sq_psn;
        out.max_dest_rd_atomic = a.max_dest_rd_atomic;
        out.max_rd_atomic = a.max_rd_atomic;
        out.min_rnr_timer = a.min_rnr_timer;
        out.timeout = a.timeout;
        out.retry_cnt = a.retry_cnt;
        out.rnr_retry = a.rnr_retry;
        if m.contains(sv::AttrMask::AV) {
            out.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: a.av.dgid },
                    flow_label: a.av.flow_label,
                    sgid_index: a.av.sgid_index,
                    hop_limit: a.av.hop_limit,
                    traffic_class: a.av.traffic_class,
                },
                sl: a.av.sl,
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
        }
        // SAFETY: writable.
        unsafe { *mask = m.bits() as c_int };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    minus_one("rdma_get_cm_event", || {
        crate::non_null!(out);
        // Our own reference to the channel, not the application's box: a
        // program may destroy the channel while one of its threads waits
        // here. rping does — its CM thread sits in rdma_get_cm_event when
        // main calls rdma_destroy_id, rdma_destroy_event_channel and
        // free; librdmacm's thread then stays blocked in read(2) until the
        // process exits, and so does this wait (no event comes for a
        // destroyed channel's IDs). Waiting on the freed box instead
        // crashed rping's client at exit, 2 runs in 40 on loopback (exit
        // 139, after all its pings).
        let c = channel_handle(ch)?;
        // SAFETY: F_GETFL on the channel's descriptor.
        let nonblock = unsafe { libc::fcntl(c.fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        loop {
            let ev = if nonblock {
                c.try_get()
                    .ok_or_else(|| Fail::new(libc::EAGAIN, "no event waiting"))?
            } else {
                c.get(None).expect("waits for ever")
            };
            if let Some(e) = deliver(ev)? {
                // SAFETY: writable out pointer.
                unsafe { *out = e };
                return Ok(0);
            }
        }
    })
}

/// One event pending on an ID: counted in `UNACKED`, so `rdma_destroy_id`
/// waits for it before it frees the ID. Dropped, the count goes again (the
/// event was not handed out); an event handed out keeps it (`keep`) until
/// `rdma_ack_cm_event`.
struct Pending(usize);

impl Pending {
    /// Count an event on the ID `cm` names, if it is still a live ID: the
    /// look-up and the count are one step under `UNACKED`'s lock, under
    /// which `rdma_destroy_id` (having cleared `cm`'s user first) checks
    /// the count and unregisters the ID. So either the destroy sees this
    /// count and waits, or this finds the ID gone (None) — never is the
    /// ID freed while the event is being made for it.
    fn take(cm: &CmId) -> Option<Pending> {
        let mut g = lock(&UNACKED.0);
        let p = cm.user();
        if p == 0 || !lock(&LIVE).ids.contains_key(&p) {
            return None;
        }
        *g.entry(p).or_insert(0) += 1;
        Some(Pending(p))
    }

    /// The ID, alive while this count is held (see `take`).
    fn id(&self) -> &Id {
        // SAFETY: `take` found the box registered and counted it under
        // `UNACKED`'s lock; `rdma_destroy_id` frees it only after the
        // count is back to 0, which is not before `self` is dropped or
        // the event it counts is acknowledged. Only read through: the
        // fields read (qp, channel, context, ps) are not changed meanwhile,
        // by librdmacm's rule (see `id_of`).
        unsafe { &*(self.0 as *const Id) }
    }

    /// The event is handed out: its acknowledgement releases the count.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let (m, cv) = &*UNACKED;
        let mut g = lock(m);
        if let Some(n) = g.get_mut(&self.0) {
            *n = n.saturating_sub(1);
        }
        cv.notify_all();
    }
}

/// Turn an event into the C event the application takes (None: it is not
/// for the application — its ID is gone).
fn deliver(ev: CmEvent) -> Res<Option<*mut rdma_cm_event>> {
    let mut kind = ev.kind;
    let mut status = ev.status;
    let (pending, listen_ptr) = match ev.kind {
        EventKind::ConnectRequest => {
            let Some(l) = ev.listen_id.as_ref() else {
                return Ok(None);
            };
            // Counted while its fields are read: not freed meanwhile.
            let Some(listener) = Pending::take(l) else {
                // The listener is gone: turn the request down.
                let _ = ev.id.reject(&[]);
                return Ok(None);
            };
            let lp = listener.0;
            let li = listener.id();
            let child = new_id(li.c.channel.cast(), ev.id.clone(), li.c.context, false);
            // SAFETY: just made.
            let ci = unsafe { &mut *child };
            ci.c.ps = li.c.ps;
            sync_c(ci)?;
            if let Some((pd, mut attr)) = li.ep_qp {
                if create_qp(ci, pd, &mut attr).is_err() {
                    let _ = ev.id.reject(&[]);
                    return Ok(None);
                }
            }
            let Some(pending) = Pending::take(&ev.id) else {
                return Ok(None);
            };
            (pending, lp)
        }
        _ => {
            let Some(pending) = Pending::take(&ev.id) else {
                return Ok(None);
            };
            (pending, 0)
        }
    };
    let id_ptr = pending.0;
    let i = pending.id();
    if kind == EventKind::ConnectResponse && !i.c.qp.is_null() {
        // librdmacm completes the connection for an ID with a QP: RTR, RTS,
        // RTU, and reports it established.
        let qp = i.c.qp;
        let r = move_qp(i, qp, sv::QpState::Rtr)
            .and_then(|_| move_qp(i, qp, sv::QpState::Rts))
            .and_then(|_| i.id.establish().map_err(Fail::from));
        match r {
            Ok(()) => kind = EventKind::Established,
            Err(e) => {
                let _ = i.id.reject(&[]);
                kind = EventKind::ConnectError;
                status = -e.errno;
            }
        }
    }
    // MULTICAST_JOIN (librdmacm's `ucma_process_join`): the event carries
    // the join's context; the ID's QP is attached now unless send-only.
    let mut mc_context = None;
    if kind == EventKind::MulticastJoin {
        let mgid = ev.ud.as_ref().map(|u| u.dgid);
        let mut l = lock(&i.mc);
        let Some(m) = l.iter_mut().find(|m| !m.reported && Some(m.mgid) == mgid) else {
            // Left before its event was taken.
            return Ok(None);
        };
        m.reported = true;
        mc_context = Some(m.context);
        if !m.send_only && !i.c.qp.is_null() {
            let r = Qp::from_c(i.c.qp).and_then(|q| Ok(q.sv.attach_mcast(m.mgid)?));
            if let Err(e) = r {
                kind = EventKind::MulticastError;
                status = -e.errno;
            }
        }
    }
    let mut b = Box::new(Event {
        // SAFETY: all-zero is a valid event (NULL pointers, zeros).
        c: unsafe { std::mem::zeroed() },
        private: [0; 256],
        counted: id_ptr as *mut Id,
    });
    b.c.id = id_ptr as *mut rdma_cm_id;
    b.c.listen_id = listen_ptr as *mut rdma_cm_id;
    b.c.event = kind as c_int;
    b.c.status = status;
    let data = match &ev.ud {
        Some(u) => &u.private_data,
        None => &ev.conn.private_data,
    };
    let n = data.len().min(255);
    b.private[..n].copy_from_slice(&data[..n]);
    let pdata = if n > 0 {
        b.private.as_ptr().cast::<c_void>()
    } else {
        std::ptr::null()
    };
    match (&ev.ud, i.id.qp_type() == sv::QpType::Ud) {
        (Some(u), _) => {
            b.c.param.ud = rdma_ud_param {
                private_data: pdata,
                private_data_len: n as u8,
                ah_attr: ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: ibv_gid { raw: u.dgid },
                        flow_label: 0,
                        sgid_index: i.id.device().map_or(0, |d| d.gid_index()),
                        hop_limit: u.hop_limit,
                        traffic_class: u.traffic_class,
                    },
                    is_global: 1,
                    port_num: 1,
                    ..Default::default()
                },
                qp_num: u.qp_num,
                qkey: u.qkey,
            };
        }
        _ => {
            let c = &ev.conn;
            b.c.param.conn = rdma_conn_param {
                private_data: pdata,
                private_data_len: n as u8,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: c.flow_control as u8,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                srq: c.srq as u8,
                qp_num: c.qp_num,
            };
        }
    }
    let p = Box::into_raw(b);
    // SAFETY: just made; its private data moved with the box, so point
    // the parameters at where it is now.
    unsafe {
        if n > 0 {
            let at = (*p).private.as_ptr().cast::<c_void>();
            if ev.ud.is_some() {
                (*p).c.param.ud.private_data = at;
            } else {
                (*p).c.param.conn.private_data = at;
            }
        }
    }
    if let Some(c) = mc_context {
        // SAFETY: as above.
        unsafe {
            (*p).c.param.ud.private_data = c as *const c_void;
            (*p).c.param.ud.private_data_len = 0;
        }
    }
    lock(&LIVE).events.insert(p as usize);
    // Counted since `Pending::take`; acknowledging the event releases it.
    pending.keep();
    softrdma_verbs::cm::log(&format!(
        "event {} for id {:#x} handed out",
        kind.name(),
        id_ptr
    ));
    Ok(Some(p.cast()))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    minus_one("rdma_ack_cm_event", || {
        crate::non_null!(ev);
        if !lock(&LIVE).events.remove(&(ev as usize)) {
            return Err(Fail::inval(
                "not an event rdma_get_cm_event handed out, or acknowledged already",
            ));
        }
        // SAFETY: an event this library boxed and handed out (in `events`
        // until now, when this call took it out: no other call frees it).
        let b = unsafe { Box::from_raw(ev.cast::<Event>()) };
        let (m, cv) = &*UNACKED;
        let mut g = lock(m);
        if let Some(n) = g.get_mut(&(b.counted as usize)) {
            *n = n.saturating_sub(1);
        }
        cv.notify_all();
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_src_port(p: *mut rdma_cm_id) -> u16 {
    value_ret("rdma_get_src_port", 0, || {
        Ok(id_of(p)?.id.src_addr().map_or(0, |a| a.port().to_be()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    value_ret("rdma_get_dst_port", 0, || {
        Ok(id_of(p)?.id.dst_addr().map_or(0, |a| a.port().to_be()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_devices(n: *mut c_int) -> *mut *mut ibv_context {
    null_ret("rdma_get_devices", || {
        let ctxs = with_devs(|d| Ok(d.iter().map(|d| d.ctx).collect::<Vec<_>>()))?;
        // SAFETY: calloc of n+1 pointers; freed by rdma_free_devices.
        let list = unsafe { libc::calloc(ctxs.len() + 1, std::mem::size_of::<usize>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            return Err(Fail::new(libc::ENOMEM, "out of memory"));
        }
        for (k, c) in ctxs.iter().enumerate() {
            // SAFETY: k < len.
            unsafe { *list.add(k) = *c };
        }
        if !n.is_null() {
            // SAFETY: writable.
            unsafe { *n = ctxs.len() as c_int };
        }
        Ok(list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the array rdma_get_devices allocated (or NULL).
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_event_str(event: c_int) -> *const c_char {
    static NAMES: LazyLock<Vec<std::ffi::CString>> = LazyLock::new(|| {
        (0..16)
            .map(|k| {
                std::ffi::CString::new(EventKind::from_c(k).map_or("UNKNOWN EVENT", |e| e.name()))
                    .expect("no NUL")
            })
            .collect()
    });
    value_ret("rdma_event_str", crate::cstr!("UNKNOWN EVENT"), || {
        Ok(
            match usize::try_from(event).ok().and_then(|k| NAMES.get(k)) {
                Some(s) => s.as_ptr(),
                None => crate::cstr!("UNKNOWN EVENT"),
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    minus_one("rdma_set_option", || {
        let i = id_of(p)?;
        crate::non_null!(val);
        let byte = || -> Res<u8> {
            if len < 1 {
                return Err(Fail::inval("option value too short"));
            }
            // SAFETY: at least one readable byte.
            Ok(unsafe { *val.cast::<u8>() })
        };
        let int = || -> Res<c_int> {
            if len < std::mem::size_of::<c_int>() {
                return Err(Fail::inval("option value too short for an int"));
            }
            // SAFETY: a readable int.
            Ok(unsafe { val.cast::<c_int>().read_unaligned() })
        };
        match (level, name) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => i.id.set_tos(byte()?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => i.id.set_reuseaddr(int()? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => i.id.set_afonly(int()? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                i.id.set_ack_timeout(byte()?).map_err(Fail::from)?
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                // A path record the caller resolved itself: RoCE needs none.
                ffi::note("rdma_set_option(RDMA_OPTION_IB_PATH): accepted, not needed on RoCE");
            }
            _ => {
                return Err(Fail::new(
                    libc::ENOSYS,
                    format!("rdma_set_option level {level} option {name}"),
                ))
            }
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_migrate_id(
    p: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    minus_one("rdma_migrate_id", || {
        let i = id_of(p)?;
        if i.sync && ch.is_null() {
            return Err(Fail::inval("the ID is synchronous already"));
        }
        let (chp, sync) = if ch.is_null() {
            (make_channel()?, true)
        } else {
            channel(ch)?;
            (ch.cast::<Channel>(), false)
        };
        if i.sync && !i.c.event.is_null() {
            // A synchronous ID's last event goes with its channel.
            // SAFETY: the event we stored.
            unsafe { softrdma_rdma_ack_cm_event(i.c.event) };
            i.c.event = std::ptr::null_mut();
        }
        // SAFETY: a live channel.
        i.id.migrate(unsafe { &(*chp).ch });
        let old = i.own_channel;
        i.c.channel = chp.cast();
        i.sync = sync;
        i.own_channel = if sync { chp } else { std::ptr::null_mut() };
        if !old.is_null() && old != chp {
            free_channel(old);
        }
        Ok(0)
    })
}

fn c_str(p: *const c_char) -> Res<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string (the caller's contract).
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    Ok(Some(
        s.to_str()
            .map_err(|_| Fail::inval("not UTF-8"))?
            .to_string(),
    ))
}

fn resolve_host(node: &str, numeric: bool, family: c_int) -> Res<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Ok(ip);
    }
    // A scoped IPv6 address (`fe80::1%eth0`): the address (the scope is
    // the interface, which the device's address already names).
    if let Some((a, _scope)) = node.split_once('%') {
        if let Ok(ip) = a.parse::<Ipv6Addr>() {
            return Ok(ip.into());
        }
    }
    if numeric {
        return Err(Fail::inval(format!("{node} is not a numeric address")));
    }
    use std::net::ToSocketAddrs;
    let addrs = (node, 0)
        .to_socket_addrs()
        .map_err(|e| Fail::new(libc::ENODEV, format!("{node}: {e}")))?;
    addrs
        .map(|a| a.ip())
        .find(|ip| match family {
            libc::AF_INET => ip.is_ipv4(),
            libc::AF_INET6 => ip.is_ipv6(),
            _ => true,
        })
        .ok_or_else(|| Fail::new(libc::ENODEV, format!("{node} has no address")))
}

fn alloc_sockaddr(a: SocketAddr) -> (*mut libc::sockaddr, u32) {
    let (bytes, len) = storage(a);
    // SAFETY: malloc of `len` bytes, filled below; freed by
    // rdma_freeaddrinfo.
    let p = unsafe { libc::malloc(len as usize) }.cast::<u8>();
    if !p.is_null() {
        // SAFETY: `len` bytes of each.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, len as usize) };
    }
    (p.cast(), len)
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    minus_one("rdma_getaddrinfo", || {
        crate::non_null!(res);
        let node = c_str(node)?;
        let service = c_str(service)?;
        // SAFETY: NULL or a readable rdma_addrinfo.
        let h = unsafe { hints.as_ref() };
        if node.is_none() && service.is_none() {
            // Only addresses in the hints (libfabric's rxm): the answer is
            // made of them, as librdmacm's.
            let Some(h) = h.filter(|h| !h.ai_src_addr.is_null() || !h.ai_dst_addr.is_null()) else {
                return Err(Fail::inval(
                    "rdma_getaddrinfo: no node, no service and no address in the hints",
                ));
            };
            let src = sockaddr_in(h.ai_src_addr)?;
            let dst = sockaddr_in(h.ai_dst_addr)?;
            // SAFETY: as below.
            let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
                .cast::<rdma_addrinfo>();
            if ai.is_null() {
                return Err(Fail::new(libc::ENOMEM, "out of memory"));
            }
            // SAFETY: just allocated and zeroed.
            let a = unsafe { &mut *ai };
            a.ai_flags = h.ai_flags;
            a.ai_family = match src.or(dst) {
                Some(SocketAddr::V6(_)) => libc::AF_INET6,
                _ => libc::AF_INET,
            };
            a.ai_qp_type = if h.ai_qp_type == 0 {
                IBV_QPT_RC
            } else {
                h.ai_qp_type
            };
            a.ai_port_space = match h.ai_port_space {
                0 if a.ai_qp_type == IBV_QPT_UD => PortSpace::Udp.to_c(),
                0 => PortSpace::Tcp.to_c(),
                ps => ps,
            };
            if let Some(s) = src {
                (a.ai_src_addr, a.ai_src_len) = alloc_sockaddr(s);
            }
            if let Some(d) = dst {
                (a.ai_dst_addr, a.ai_dst_len) = alloc_sockaddr(d);
            }
            // SAFETY: writable.
            unsafe { *res = ai };
            return Ok(0);
        }
        let flags = h.map_or(0, |h| h.ai_flags);
        let family = h.map_or(0, |h| {
            if flags & RAI_FAMILY != 0 || h.ai_family != 0 {
                h.ai_family
            } else {
                0
            }
        });
        let port: u16 = match &service {
            None => 0,
            Some(s) => s
                .parse()
                .map_err(|_| Fail::inval(format!("service {s} is not a port number")))?,
        };
        let passive = flags & RAI_PASSIVE != 0;
        let ip = match &node {
            Some(n) => resolve_host(n, flags & RAI_NUMERICHOST != 0, family)?,
            None if family == libc::AF_INET6 => Ipv6Addr::UNSPECIFIED.into(),
            None => Ipv4Addr::UNSPECIFIED.into(),
        };
        let qp_type = h.map_or(0, |h| h.ai_qp_type);
        let qp_type = if qp_type == 0 { IBV_QPT_RC } else { qp_type };
        let ps = match h.map_or(0, |h| h.ai_port_space) {
            0 if qp_type == IBV_QPT_UD => PortSpace::Udp.to_c(),
            0 => PortSpace::Tcp.to_c(),
            ps => ps,
        };
        // SAFETY: an all-zero rdma_addrinfo (NULL pointers); malloc'd so
        // rdma_freeaddrinfo can free it.
        let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if ai.is_null() {
            return Err(Fail::new(libc::ENOMEM, "out of memory"));
        }
        // SAFETY: just allocated and zeroed.
        let a = unsafe { &mut *ai };
        a.ai_flags = flags;
        a.ai_family = if ip.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        a.ai_qp_type = qp_type;
        a.ai_port_space = ps;
        if passive {
            let (p, l) = alloc_sockaddr(SocketAddr::new(ip, port));
            a.ai_src_addr = p;
            a.ai_src_len = l;
        } else {
            let dst = SocketAddr::new(ip, port);
            let (p, l) = alloc_sockaddr(dst);
            a.ai_dst_addr = p;
            a.ai_dst_len = l;
            if let Some(src) = h.and_then(|h| sockaddr_in(h.ai_src_addr).ok().flatten()) {
                let (p, l) = alloc_sockaddr(src);
                a.ai_src_addr = p;
                a.ai_src_len = l;
            } else if let Ok(src) = sv::route_source(ip) {
                let (p, l) = alloc_sockaddr(SocketAddr::new(src, 0));
                a.ai_src_addr = p;
                a.ai_src_len = l;
            }
        }
        // SAFETY: writable.
        unsafe { *res = ai };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    void_ret("rdma_freeaddrinfo", || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list rdma_getaddrinfo made with malloc.
            unsafe {
                let next = (*p).ai_next;
                libc::free((*p).ai_src_addr.cast());
                libc::free((*p).ai_dst_addr.cast());
                libc::free((*p).ai_src_canonname.cast());
                libc::free((*p).ai_dst_canonname.cast());
                libc::free((*p).ai_route);
                libc::free((*p).ai_connect);
                libc::free(p.cast());
                p = next;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    minus_one("rdma_create_ep", || {
        crate::non_null!(out, res);
        // SAFETY: a readable rdma_addrinfo.
        let r = unsafe { &*res };
        let mut idp: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: our own functions, as an application calls them.
        unsafe {
            if softrdma_rdma_create_id(
                std::ptr::null_mut(),
                &mut idp,
                std::ptr::null_mut(),
                r.ai_port_space,
            ) != 0
            {
                return Err(Fail::new(
                    *libc::__errno_location(),
                    "rdma_create_id failed",
                ));
            }
        }
        let fail = |idp: *mut rdma_cm_id| {
            // SAFETY: the ID just made.
            let e = unsafe { *libc::__errno_location() };
            unsafe { softrdma_rdma_destroy_id(idp) };
            Fail::new(e, "rdma_create_ep failed")
        };
        // SAFETY: as above.
        unsafe {
            if r.ai_flags & RAI_PASSIVE != 0 {
                if softrdma_rdma_bind_addr(idp, r.ai_src_addr) != 0 {
                    return Err(fail(idp));
                }
            } else if softrdma_rdma_resolve_addr(idp, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
                || softrdma_rdma_resolve_route(idp, 2000) != 0
            {
                return Err(fail(idp));
            }
        }
        let i = id_of(idp)?;
        if !qp_init_attr.is_null() {
            // SAFETY: a readable and writable init attr.
            let attr = unsafe { &mut *qp_init_attr };
            if r.ai_flags & RAI_PASSIVE != 0 {
                // Each request's ID gets a QP like this one.
                i.ep_qp = Some((pd, *attr));
                if let Ok(t) = sv::QpType::from_ibv(attr.qp_type).ok_or(()) {
                    let _ = i.id.set_qp_type(t);
                }
            } else if let Err(e) = create_qp(i, pd, attr) {
                // SAFETY: as above.
                unsafe { softrdma_rdma_destroy_id(idp) };
                return Err(e);
            }
        }
        // SAFETY: writable out pointer.
        unsafe { *out = idp };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_destroy_ep(p: *mut rdma_cm_id) {
    // SAFETY: our own functions on the caller's ID.
    unsafe {
        softrdma_rdma_destroy_qp(p);
        softrdma_rdma_destroy_srq(p);
        softrdma_rdma_destroy_id(p);
    }
}

/// Join `addr`'s group (librdmacm's `rdma_join_multicast2`): record it,
/// have the connection manager report MULTICAST_JOIN (RoCE: at once, no
/// SA query), and for a synchronous ID wait for that event. The ID's QP
/// is attached when the event is handed out (`deliver`), as librdmacm
/// does, unless the join is send-only.
fn join(p: *mut rdma_cm_id, addr: *const libc::sockaddr, flags: u32, context: usize) -> Res<()> {
    let i = id_of(p)?;
    let addr = sockaddr_in(addr)?.ok_or_else(|| Fail::inval("addr is NULL"))?;
    let mgid = i.id.join_multicast(addr.ip()).map_err(Fail::from)?;
    lock(&i.mc).push(Mc {
        addr,
        context,
        send_only: flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
        mgid,
        reported: false,
    });
    complete(p, &[EventKind::MulticastJoin])
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_join_multicast(
    p: *mut rdma_cm_id,
    addr: *mut c_void,
    context: *mut c_void,
) -> c_int {
    minus_one("rdma_join_multicast", || {
        join(
            p,
            addr.cast(),
            RDMA_MC_JOIN_FLAG_FULLMEMBER,
            context as usize,
        )?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_join_multicast_ex(
    p: *mut rdma_cm_id,
    attr: *mut c_void,
    context: *mut c_void,
) -> c_int {
    minus_one("rdma_join_multicast_ex", || {
        let attr = attr.cast::<rdma_cm_join_mc_attr_ex>();
        crate::non_null!(attr);
        // SAFETY: a readable rdma_cm_join_mc_attr_ex (checked non-NULL).
        let a = unsafe { &*attr };
        // librdmacm's checks, in its order.
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(Fail::unsupported(format!(
                "comp_mask {:#x} has bits beyond RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS",
                a.comp_mask
            )));
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
            return Err(Fail::inval("comp_mask lacks RDMA_CM_JOIN_MC_ATTR_ADDRESS"));
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(Fail::inval(
                "join_flags must be given (RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) and be \
                 RDMA_MC_JOIN_FLAG_FULLMEMBER or RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER",
            ));
        }
        join(p, a.addr, a.join_flags, context as usize)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_leave_multicast(
    p: *mut rdma_cm_id,
    addr: *mut c_void,
) -> c_int {
    minus_one("rdma_leave_multicast", || {
        let i = id_of(p)?;
        let addr = sockaddr_in(addr.cast())?.ok_or_else(|| Fail::inval("addr is NULL"))?;
        let mc = {
            let mut l = lock(&i.mc);
            let at = l.iter().position(|m| m.addr == addr).ok_or_else(|| {
                Fail::new(
                    libc::EADDRNOTAVAIL,
                    format!("the ID has not joined multicast group {addr}"),
                )
            })?;
            l.remove(at)
        };
        // As librdmacm: the QP leaves the group first (errors ignored).
        if mc.reported && !mc.send_only && !i.c.qp.is_null() {
            if let Ok(q) = Qp::from_c(i.c.qp) {
                let _ = q.sv.detach_mcast(mc.mgid);
            }
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_get_remote_ece(
    p: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    minus_one("rdma_get_remote_ece", || {
        crate::non_null!(ece);
        id_of(p)?;
        // No enhanced connection establishment: the peer offered none.
        // SAFETY: writable.
        unsafe {
            *ece = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            }
        };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_rdma_set_local_ece(
    p: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    minus_one("rdma_set_local_ece", || {
        crate::non_null!(ece);
        id_of(p)?;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// rping's teardown: its CM thread waits in rdma_get_cm_event while
    /// main destroys the channel and frees it; the wait must not touch the
    /// freed channel when it wakes (it waited on the application's box,
    /// and rping's client crashed at exit now and then), and must go on
    /// waiting, as librdmacm's read(2) does.
    #[test]
    fn a_waiter_outlives_the_channel_it_waits_on() {
        // SAFETY: the exported calls, with pointers they handed out.
        let ch = unsafe { softrdma_rdma_create_event_channel() };
        assert!(!ch.is_null());
        // Another handle, so the descriptor stays open to ring it below as
        // an event would.
        let bell = channel(ch).unwrap().ch.clone();
        let fd = bell.fd();
        let chp = ch as usize;
        let waiter = std::thread::spawn(move || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live channel when the call starts.
            unsafe { softrdma_rdma_get_cm_event(chp as *mut rdma_event_channel, &mut ev) }
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // SAFETY: destroyed once, as rping does, while the thread waits.
        unsafe { softrdma_rdma_destroy_event_channel(ch) };
        // The freed box is reused by allocations like it.
        let reuse: Vec<Box<[u64; 2]>> = (0..64).map(|i| Box::new([i; 2])).collect();
        let one = 1u64.to_ne_bytes();
        // SAFETY: an eventfd of ours, kept open by `bell`.
        assert_eq!(unsafe { libc::write(fd, one.as_ptr().cast(), 8) }, 8);
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Quiet again (nothing was queued), so the waiter sleeps.
        let mut buf = [0u8; 8];
        // SAFETY: as above.
        unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "the wait ended on a destroyed channel"
        );
        drop(reuse);
        // The channel itself is gone for new calls.
        let mut ev = std::ptr::null_mut();
        // SAFETY: a stale pointer, which the call must refuse.
        assert_eq!(unsafe { softrdma_rdma_get_cm_event(ch, &mut ev) }, -1);
    }

    /// An event being made for an ID while another thread destroys the ID:
    /// either the destroy waits until the event is acknowledged (so it
    /// names a live ID while the application holds it), or the event is
    /// dropped — never does `rdma_destroy_id` return with an event of the
    /// ID handed out, which meant the event was made from the ID after it
    /// was freed (the look-up and the pending count were two steps).
    #[test]
    fn a_destroy_racing_an_event_of_its_id_waits_for_it_or_drops_it() {
        use std::ptr::null_mut;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        crate::tests::one_device();
        // SAFETY: the exported calls, with pointers they handed out (or
        // the stale ID pointer, compared only).
        unsafe {
            let ch = softrdma_rdma_create_event_channel();
            assert!(!ch.is_null());
            let fd = (*ch).fd;
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK), 0);
            let mut dst: libc::sockaddr_in = std::mem::zeroed();
            dst.sin_family = libc::AF_INET as libc::sa_family_t;
            dst.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
            let mut handed = 0;
            for round in 0..1500 {
                let mut id: *mut rdma_cm_id = std::ptr::null_mut();
                let ps = PortSpace::Tcp.to_c() as c_int;
                assert_eq!(softrdma_rdma_create_id(ch, &mut id, null_mut(), ps), 0);
                let r = softrdma_rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 1000);
                assert_eq!(r, 0, "resolve_addr");
                let go = Arc::new(Barrier::new(2));
                let destroyed = Arc::new(AtomicBool::new(false));
                let destroyer = {
                    let (go, destroyed) = (go.clone(), destroyed.clone());
                    let id = id as usize;
                    std::thread::spawn(move || {
                        go.wait();
                        for _ in 0..(round % 128) * 2 {
                            std::hint::spin_loop();
                        }
                        let r = softrdma_rdma_destroy_id(id as *mut rdma_cm_id);
                        destroyed.store(true, Ordering::SeqCst);
                        r
                    })
                };
                go.wait();
                loop {
                    let mut ev: *mut rdma_cm_event = null_mut();
                    if softrdma_rdma_get_cm_event(ch, &mut ev) == 0 {
                        let late = destroyed.load(Ordering::SeqCst);
                        assert_eq!((*ev).id, id, "round {round}: an event of another ID");
                        assert!(
                            !late,
                            "round {round}: rdma_destroy_id returned while an event of the \
                             ID was handed out"
                        );
                        handed += 1;
                        assert_eq!(softrdma_rdma_ack_cm_event(ev), 0);
                    } else if destroyed.load(Ordering::SeqCst) {
                        // Nothing more can come for the ID.
                        break;
                    }
                }
                assert_eq!(destroyer.join().expect("the destroyer"), 0);
            }
            println!("{handed} events handed out before their ID's destroy returned");
            softrdma_rdma_destroy_event_channel(ch);
        }
    }

    /// `rdma_ack_cm_event` frees only events it handed out, once: a
    /// second acknowledgement, or a pointer that never was an event, is
    /// refused (EINVAL) instead of freed (a double free aborted the
    /// process; found in review).
    #[test]
    fn only_live_events_are_acknowledged() {
        let mut not_an_event = [0u64; 64];
        // SAFETY: the exported call, given a pointer it must refuse without
        // touching what it points to.
        let r = unsafe { softrdma_rdma_ack_cm_event(not_an_event.as_mut_ptr().cast()) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(not_an_event, [0u64; 64]);
        // An event handed out is acknowledged once.
        let ev = Box::into_raw(Box::new(std::mem::MaybeUninit::<Event>::zeroed()));
        lock(&LIVE).events.insert(ev as usize);
        // SAFETY: registered as handed out just above; zeroed is a valid
        // Event (plain C data and a null `counted`), freed once below.
        assert_eq!(unsafe { softrdma_rdma_ack_cm_event(ev.cast()) }, 0);
        // SAFETY: the same pointer again, which the call must refuse.
        assert_eq!(unsafe { softrdma_rdma_ack_cm_event(ev.cast()) }, -1);
    }

    /// The layout of the structures above, compared with what the C
    /// compiler computes from the installed `<rdma/rdma_cma.h>`.
    #[test]
    fn rdmacm_layout_matches_rdma_cma_h() {
        let header = std::path::Path::new("/usr/include/rdma/rdma_cma.h");
        assert!(
            header.exists(),
            "{} is missing: install librdmacm-dev (apt-get install -y librdmacm-dev)",
            header.display()
        );
        let rust: Vec<(&str, usize)> = vec![
            ("sizeof(struct rdma_cm_id)", size_of::<rdma_cm_id>()),
            (
                "offsetof(struct rdma_cm_id, verbs)",
                offset_of!(rdma_cm_id, verbs),
            ),
            (
                "offsetof(struct rdma_cm_id, channel)",
                offset_of!(rdma_cm_id, channel),
            ),
            (
                "offsetof(struct rdma_cm_id, context)",
                offset_of!(rdma_cm_id, context),
            ),
            (
                "offsetof(struct rdma_cm_id, qp)",
                offset_of!(rdma_cm_id, qp),
            ),
            (
                "offsetof(struct rdma_cm_id, route)",
                offset_of!(rdma_cm_id, route),
            ),
            (
                "offsetof(struct rdma_cm_id, route.addr.dst_storage)",
                offset_of!(rdma_cm_id, route) + offset_of!(rdma_addr, dst),
            ),
            (
                "offsetof(struct rdma_cm_id, route.addr.addr.ibaddr.dgid)",
                offset_of!(rdma_cm_id, route)
                    + offset_of!(rdma_addr, ibaddr)
                    + offset_of!(rdma_ib_addr, dgid),
            ),
            (
                "offsetof(struct rdma_cm_id, route.addr.addr.ibaddr.pkey)",
                offset_of!(rdma_cm_id, route)
                    + offset_of!(rdma_addr, ibaddr)
                    + offset_of!(rdma_ib_addr, pkey),
            ),
            (
                "offsetof(struct rdma_cm_id, route.path_rec)",
                offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, path_rec),
            ),
            (
                "offsetof(struct rdma_cm_id, route.num_paths)",
                offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, num_paths),
            ),
            (
                "offsetof(struct rdma_cm_id, ps)",
                offset_of!(rdma_cm_id, ps),
            ),
            (
                "offsetof(struct rdma_cm_id, port_num)",
                offset_of!(rdma_cm_id, port_num),
            ),
            (
                "offsetof(struct rdma_cm_id, event)",
                offset_of!(rdma_cm_id, event),
            ),
            (
                "offsetof(struct rdma_cm_id, send_cq_channel)",
                offset_of!(rdma_cm_id, send_cq_channel),
            ),
            (
                "offsetof(struct rdma_cm_id, send_cq)",
                offset_of!(rdma_cm_id, send_cq),
            ),
            (
                "offsetof(struct rdma_cm_id, recv_cq_channel)",
                offset_of!(rdma_cm_id, recv_cq_channel),
            ),
            (
                "offsetof(struct rdma_cm_id, recv_cq)",
                offset_of!(rdma_cm_id, recv_cq),
            ),
            (
                "offsetof(struct rdma_cm_id, srq)",
                offset_of!(rdma_cm_id, srq),
            ),
            (
                "offsetof(struct rdma_cm_id, pd)",
                offset_of!(rdma_cm_id, pd),
            ),
            (
                "offsetof(struct rdma_cm_id, qp_type)",
                offset_of!(rdma_cm_id, qp_type),
            ),
            (
                "sizeof(struct ibv_sa_path_rec)",
                size_of::<ibv_sa_path_rec>(),
            ),
            (
                "offsetof(struct ibv_sa_path_rec, flow_label)",
                offset_of!(ibv_sa_path_rec, flow_label),
            ),
            (
                "offsetof(struct ibv_sa_path_rec, reversible)",
                offset_of!(ibv_sa_path_rec, reversible),
            ),
            (
                "offsetof(struct ibv_sa_path_rec, pkey)",
                offset_of!(ibv_sa_path_rec, pkey),
            ),
            (
                "offsetof(struct ibv_sa_path_rec, mtu)",
                offset_of!(ibv_sa_path_rec, mtu),
            ),
            (
                "offsetof(struct ibv_sa_path_rec, preference)",
                offset_of!(ibv_sa_path_rec, preference),
            ),
            ("sizeof(struct rdma_cm_event)", size_of::<rdma_cm_event>()),
            (
                "offsetof(struct rdma_cm_event, listen_id)",
                offset_of!(rdma_cm_event, listen_id),
            ),
            (
                "offsetof(struct rdma_cm_event, event)",
                offset_of!(rdma_cm_event, event),
            ),
            (
                "offsetof(struct rdma_cm_event, status)",
                offset_of!(rdma_cm_event, status),
            ),
            (
                "offsetof(struct rdma_cm_event, param)",
                offset_of!(rdma_cm_event, param),
            ),
            (
                "sizeof(struct rdma_conn_param)",
                size_of::<rdma_conn_param>(),
            ),
            (
                "offsetof(struct rdma_conn_param, private_data_len)",
                offset_of!(rdma_conn_param, private_data_len),
            ),
            (
                "offsetof(struct rdma_conn_param, rnr_retry_count)",
                offset_of!(rdma_conn_param, rnr_retry_count),
            ),
            (
                "offsetof(struct rdma_conn_param, qp_num)",
                offset_of!(rdma_conn_param, qp_num),
            ),
            ("sizeof(struct rdma_ud_param)", size_of::<rdma_ud_param>()),
            (
                "offsetof(struct rdma_ud_param, ah_attr)",
                offset_of!(rdma_ud_param, ah_attr),
            ),
            (
                "offsetof(struct rdma_ud_param, qp_num)",
                offset_of!(rdma_ud_param, qp_num),
            ),
            (
                "offsetof(struct rdma_ud_param, qkey)",
                offset_of!(rdma_ud_param, qkey),
            ),
            ("sizeof(struct rdma_addrinfo)", size_of::<rdma_addrinfo>()),
            (
                "offsetof(struct rdma_addrinfo, ai_src_len)",
                offset_of!(rdma_addrinfo, ai_src_len),
            ),
            (
                "offsetof(struct rdma_addrinfo, ai_src_addr)",
                offset_of!(rdma_addrinfo, ai_src_addr),
            ),
            (
                "offsetof(struct rdma_addrinfo, ai_route_len)",
                offset_of!(rdma_addrinfo, ai_route_len),
            ),
            (
                "offsetof(struct rdma_addrinfo, ai_connect)",
                offset_of!(rdma_addrinfo, ai_connect),
            ),
            (
                "offsetof(struct rdma_addrinfo, ai_next)",
                offset_of!(rdma_addrinfo, ai_next),
            ),
            (
                "sizeof(struct rdma_event_channel)",
                size_of::<rdma_event_channel>(),
            ),
            ("sizeof(struct ibv_ece)", size_of::<ibv_ece>()),
            ("RDMA_UDP_QKEY", cm::UDP_QKEY as usize),
            (
                "sizeof(struct rdma_cm_join_mc_attr_ex)",
                size_of::<rdma_cm_join_mc_attr_ex>(),
            ),
            (
                "offsetof(struct rdma_cm_join_mc_attr_ex, join_flags)",
                offset_of!(rdma_cm_join_mc_attr_ex, join_flags),
            ),
            (
                "offsetof(struct rdma_cm_join_mc_attr_ex, addr)",
                offset_of!(rdma_cm_join_mc_attr_ex, addr),
            ),
            (
                "RDMA_CM_JOIN_MC_ATTR_ADDRESS",
                RDMA_CM_JOIN_MC_ATTR_ADDRESS as usize,
            ),
            (
                "RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS",
                RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS as usize,
            ),
            (
                "RDMA_CM_JOIN_MC_ATTR_RESERVED",
                RDMA_CM_JOIN_MC_ATTR_RESERVED as usize,
            ),
            (
                "RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER",
                RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER as usize,
            ),
            (
                "RDMA_MC_JOIN_FLAG_RESERVED",
                RDMA_MC_JOIN_FLAG_RESERVED as usize,
            ),
            ("RDMA_PS_TCP", PortSpace::Tcp.to_c() as usize),
            ("RDMA_PS_UDP", PortSpace::Udp.to_c() as usize),
            ("RDMA_PS_IB", PortSpace::Ib.to_c() as usize),
            (
                "RDMA_CM_EVENT_TIMEWAIT_EXIT",
                EventKind::TimewaitExit as usize,
            ),
            (
                "RDMA_OPTION_ID_ACK_TIMEOUT",
                RDMA_OPTION_ID_ACK_TIMEOUT as usize,
            ),
            ("RAI_FAMILY", RAI_FAMILY as usize),
        ];
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
        );
        for (expr, _) in &rust {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        c.push_str("  return 0;\n}\n");
        let tmp = tempfile::Builder::new()
            .prefix("softrdma-rdmacm-layout-")
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
            "layout differs from rdma_cma.h:\n{}",
            wrong.join("\n")
        );
    }
}
