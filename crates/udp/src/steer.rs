//! Sharing one address and UDP port 4791 between processes, the way
//! processes share an RNIC.
//!
//! RoCEv2 has one well-known port, so every softrdma process on a host that
//! uses the same IP address must receive on the same `addr:4791`. The kernel
//! lets several sockets bind it with `SO_REUSEPORT` (all owned by one user)
//! and then picks one socket per datagram; an eBPF program of type
//! `SK_REUSEPORT`, attached to the group with `SO_ATTACH_REUSEPORT_EBPF`,
//! makes the pick by the destination QP instead of a hash:
//!
//! * **QPN slots.** The top 8 bits of the 24-bit QPN name a slot. A process
//!   owns one slot `s` in `1..=255` and creates its QPs in
//!   `s << 16 ..= s << 16 | 0xffff`. Slot 0 (which holds QP1, the GSI) is
//!   never claimed here; datagrams for it are dropped.
//! * **The map.** A `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY` with 256 entries,
//!   indexed by slot, whose values are sockets. A process claims a slot by
//!   `BPF_MAP_UPDATE_ELEM` of its socket with `BPF_NOEXIST`: the first free
//!   index wins, atomically. When a socket closes (also when its process
//!   dies) the kernel clears its entry, so slots free themselves.
//! * **The program** (20 instructions, assembled below): load byte 13 of the
//!   datagram — `sk_reuseport_md` data and `bpf_skb_load_bytes` offsets start
//!   at the UDP header, so that is UDP header (8) + BTH byte 5, the top byte
//!   of the destination QPN — as the key; `bpf_sk_select_reuseport(map,
//!   key)`; `SK_PASS` if a socket was selected, `SK_DROP` otherwise (no
//!   socket for the slot, or a datagram too short to carry a BTH).
//! * **Finding the map.** The map outlives no socket: the program holds it
//!   and the reuseport group holds the program. Its id is kept in
//!   `<state dir>/<addr>-<port>.map` (default state dir `/run/softrdma`). A
//!   joining process opens it with `BPF_MAP_GET_FD_BY_ID`, checks type,
//!   sizes and name (ids are reused), and creates a new map if the id is
//!   stale. The whole open-or-create, bind, claim and attach sequence runs
//!   under `flock` on `<addr>-<port>.lock`, so two processes starting at once
//!   cannot create two maps.
//! * **Every process attaches.** Each joining process loads its own copy of
//!   the program (over the shared map) and attaches it, replacing the
//!   group's program with an identical one. That way the group always has
//!   the program, even if the process that created the map is gone or a new
//!   group formed while the old map was still open.
//!
//! Without `CAP_BPF`/`CAP_SYS_ADMIN` (`EPERM`) or without the syscall, a
//! port falls back to owning the address alone, and says so clearly if
//! another process already does.

use socket2::Socket;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// Default directory of the lock and map-id files.
pub const DEFAULT_STATE_DIR: &str = "/run/softrdma";

/// Slots a process may claim.
pub const SLOTS: std::ops::RangeInclusive<u8> = 1..=255;

/// Name given to the map, checked when an id from the state file is opened.
const MAP_NAME: &[u8] = b"softrdma_steer";
const PROG_NAME: &[u8] = b"softrdma_qpn";

// bpf(2) commands, types and flags (linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_NOEXIST: u64 = 1;
const BPF_FUNC_SKB_LOAD_BYTES: i32 = 26;
const BPF_FUNC_SK_SELECT_REUSEPORT: i32 = 82;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const SK_DROP: i32 = 0;
const SK_PASS: i32 = 1;

/// Size of `union bpf_attr` in the 6.x uapi; a larger zeroed buffer is fine.
const ATTR_LEN: usize = 144;
const MAP_INFO_LEN: usize = 88;

/// How a port receives its share of `addr:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// eBPF steering by QPN slot over a map shared with other processes.
    Shared { map_id: u32 },
    /// This port owns the address and port alone. `why` says why sharing was
    /// not set up when it was asked for.
    Exclusive { why: Option<String> },
}

/// A joined reuseport group.
pub(crate) struct Joined {
    pub(crate) slot: u8,
    pub(crate) map_id: u32,
    /// Kept open so the map lives as long as this port, whatever happens to
    /// the program.
    _map: OwnedFd,
}

/// Why joining failed.
pub(crate) enum JoinError {
    /// eBPF or the state directory is not usable here; the caller may fall
    /// back to exclusive mode.
    Unavailable(io::Error),
    Failed(io::Error),
}

/// A zeroed `bpf_attr` with typed field writers.
#[repr(C, align(8))]
struct Attr([u8; ATTR_LEN]);

impl Attr {
    fn new() -> Attr {
        Attr([0; ATTR_LEN])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, off: usize, name: &[u8]) -> &mut Self {
        self.0[off..off + name.len()].copy_from_slice(name);
        self
    }
}

/// Issue one bpf(2) command.
fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialized buffer of the size passed, and
    // every pointer stored in it (instructions, license, log, key, value,
    // info) is set by the callers below to memory that outlives this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            ATTR_LEN as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn bpf_fd(cmd: libc::c_long, attr: &mut Attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)? as RawFd;
    // SAFETY: these commands return a new file descriptor that nothing else
    // owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn create_map() -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY)
        .u32(4, 4) // key: u32 slot
        .u32(8, 8) // value: socket fd in, socket cookie out
        .u32(12, 256)
        .name(28, MAP_NAME);
    bpf_fd(BPF_MAP_CREATE, &mut a)
}

/// Type, key size, value size, max entries and name of a map, and its id.
fn map_info(fd: &OwnedFd) -> io::Result<(u32, u32, u32, u32, [u8; 16], u32)> {
    #[repr(C, align(8))]
    struct Info([u8; MAP_INFO_LEN]);
    let mut info = Info([0; MAP_INFO_LEN]);
    let mut a = Attr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u32(4, MAP_INFO_LEN as u32)
        .u64(8, info.0.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let b = &info.0;
    let u = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let mut name = [0u8; 16];
    name.copy_from_slice(&b[24..40]);
    Ok((u(0), u(8), u(12), u(16), name, u(4)))
}

/// Open the map with this id if it still is one of ours.
fn open_map(id: u32) -> Option<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, id);
    let fd = bpf_fd(BPF_MAP_GET_FD_BY_ID, &mut a).ok()?;
    let (ty, k, v, max, name, _) = map_info(&fd).ok()?;
    let name_ok = name.starts_with(MAP_NAME) && name[MAP_NAME.len()] == 0;
    (ty == BPF_MAP_TYPE_REUSEPORT_SOCKARRAY && k == 4 && v == 8 && max == 256 && name_ok)
        .then_some(fd)
}

/// One eBPF instruction.
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes used (class | op | source).
const MOV64_REG: u8 = 0x07 | 0xb0 | 0x08;
const MOV64_IMM: u8 = 0x07 | 0xb0;
const ADD64_IMM: u8 = 0x07;
const ST_MEM_W: u8 = 0x02 | 0x60;
const CALL: u8 = 0x05 | 0x80;
const JNE_IMM: u8 = 0x05 | 0x50;
const EXIT: u8 = 0x05 | 0x90;
const LD_IMM64: u8 = 0x18;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const FP: u8 = 10;

/// The steering program over `map_fd`.
fn program(map_fd: RawFd) -> [Insn; 20] {
    // Offset of the QPN's top byte from the UDP header.
    const SLOT_BYTE: i32 = 8 + 5;
    [
        insn(MOV64_REG, R6, R1, 0, 0),                     // 0: r6 = ctx
        insn(ST_MEM_W, FP, 0, -4, 0),                      // 1: *(u32 *)(fp - 4) = 0
        insn(MOV64_IMM, R2, 0, 0, SLOT_BYTE),              // 2: r2 = offset
        insn(MOV64_REG, R3, FP, 0, 0),                     // 3: r3 = fp
        insn(ADD64_IMM, R3, 0, 0, -4),                     // 4: r3 = fp - 4
        insn(MOV64_IMM, R4, 0, 0, 1),                      // 5: r4 = 1 byte
        insn(CALL, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES),      // 6: load_bytes(ctx, 13, fp - 4, 1)
        insn(JNE_IMM, R0, 0, 10, 0),                       // 7: short datagram -> drop
        insn(MOV64_REG, R1, R6, 0, 0),                     // 8: r1 = ctx
        insn(LD_IMM64, R2, BPF_PSEUDO_MAP_FD, 0, map_fd),  // 9: r2 = map
        insn(0, 0, 0, 0, 0),                               // 10: (second half)
        insn(MOV64_REG, R3, FP, 0, 0),                     // 11: r3 = fp
        insn(ADD64_IMM, R3, 0, 0, -4),                     // 12: r3 = &key (u32 slot)
        insn(MOV64_IMM, R4, 0, 0, 0),                      // 13: flags = 0
        insn(CALL, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT), // 14: select(ctx, map, &key, 0)
        insn(JNE_IMM, R0, 0, 2, 0),                        // 15: no socket -> drop
        insn(MOV64_IMM, R0, 0, 0, SK_PASS),                // 16
        insn(EXIT, 0, 0, 0, 0),                            // 17
        insn(MOV64_IMM, R0, 0, 0, SK_DROP),                // 18: drop:
        insn(EXIT, 0, 0, 0, 0),                            // 19
    ]
}

fn load_program(map_fd: RawFd) -> io::Result<OwnedFd> {
    let prog = program(map_fd);
    // Two hand-written instructions per helper; no GPL-only helper is used.
    let license = b"Dual MIT/GPL\0";
    let load = |log: Option<&mut Vec<u8>>| {
        let mut a = Attr::new();
        a.u32(0, BPF_PROG_TYPE_SK_REUSEPORT)
            .u32(4, prog.len() as u32)
            .u64(8, prog.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .name(48, PROG_NAME);
        if let Some(log) = log {
            a.u32(24, 1)
                .u32(28, log.len() as u32)
                .u64(32, log.as_mut_ptr() as u64);
        }
        bpf_fd(BPF_PROG_LOAD, &mut a)
    };
    load(None).map_err(|e| {
        if unavailable(&e) {
            return e;
        }
        // Load again with the verifier's log, to say why.
        let mut log = vec![0u8; 1 << 16];
        let _ = load(Some(&mut log));
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        io::Error::new(
            e.kind(),
            format!(
                "loading the SK_REUSEPORT program: {e}; verifier log: {}",
                text.trim()
            ),
        )
    })
}

/// Claim the first free slot for `sock` in the map.
fn claim_slot(map: &OwnedFd, sock: RawFd) -> io::Result<u8> {
    for slot in SLOTS {
        let key = slot as u32;
        let value = sock as u64;
        let mut a = Attr::new();
        a.u32(0, map.as_raw_fd() as u32)
            .u64(8, &key as *const u32 as u64)
            .u64(16, &value as *const u64 as u64)
            .u64(24, BPF_NOEXIST);
        match bpf(BPF_MAP_UPDATE_ELEM, &mut a) {
            Ok(_) => return Ok(slot),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("claiming QPN slot {slot}: {e}"),
                ))
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "all 255 QPN slots of this address are taken by other processes",
    ))
}

/// Errors that mean "no eBPF (or no state directory) for us here".
fn unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EACCES | libc::ENOSYS | libc::EROFS | libc::EOPNOTSUPP)
    )
}

/// Paths of the lock and state files for `addr`.
fn state_paths(dir: &Path, addr: SocketAddr) -> (PathBuf, PathBuf) {
    let stem = format!("{}-{}", addr.ip(), addr.port());
    (
        dir.join(format!("{stem}.lock")),
        dir.join(format!("{stem}.map")),
    )
}

/// Hold an exclusive `flock` until dropped.
struct Locked {
    _file: File,
}

fn lock(path: &Path) -> io::Result<Locked> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    loop {
        // SAFETY: plain syscall on a file descriptor `f` owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Locked { _file: f });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn read_map_id(path: &Path) -> Option<u32> {
    let mut s = String::new();
    File::open(path).ok()?.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

fn write_map_id(path: &Path, id: u32) -> io::Result<()> {
    let tmp = path.with_extension("map.tmp");
    let mut f = File::create(&tmp)?;
    writeln!(f, "{id}")?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// Bind `sock` (configured, not yet bound) to `addr` as a member of the
/// steered reuseport group, claiming a slot.
pub(crate) fn join(sock: &Socket, addr: SocketAddr, state_dir: &Path) -> Result<Joined, JoinError> {
    let soft = |e: io::Error, what: &str| {
        let unavail = unavailable(&e);
        let e = io::Error::new(e.kind(), format!("{what}: {e}"));
        if unavail {
            JoinError::Unavailable(e)
        } else {
            JoinError::Failed(e)
        }
    };
    fs::create_dir_all(state_dir)
        .map_err(|e| soft(e, &format!("creating {}", state_dir.display())))?;
    let (lock_path, map_path) = state_paths(state_dir, addr);
    let _guard =
        lock(&lock_path).map_err(|e| soft(e, &format!("locking {}", lock_path.display())))?;

    let map = match read_map_id(&map_path).and_then(open_map) {
        Some(m) => m,
        None => {
            let m = create_map().map_err(|e| soft(e, "creating the REUSEPORT_SOCKARRAY map"))?;
            let (.., id) = map_info(&m).map_err(|e| soft(e, "reading the new map's id"))?;
            write_map_id(&map_path, id)
                .map_err(|e| soft(e, &format!("writing {}", map_path.display())))?;
            m
        }
    };
    let (.., map_id) = map_info(&map).map_err(|e| soft(e, "reading the map's id"))?;
    // Load before binding: if the verifier refuses, nothing is bound yet and
    // the caller can still fall back.
    let prog = load_program(map.as_raw_fd()).map_err(|e| soft(e, "eBPF steering"))?;

    let fd = sock.as_raw_fd();
    crate::sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        .map_err(|e| JoinError::Failed(io::Error::new(e.kind(), format!("SO_REUSEPORT: {e}"))))?;
    sock.bind(&addr.into()).map_err(|e| {
        JoinError::Failed(if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                e.kind(),
                format!(
                    "{addr} is taken by a process that does not share it \
                     (not softrdma, another user, or a softrdma port opened with shared = false): {e}"
                ),
            )
        } else {
            io::Error::new(e.kind(), format!("binding {addr}: {e}"))
        })
    })?;
    let slot = claim_slot(&map, fd).map_err(JoinError::Failed)?;
    crate::sys::setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        crate::sys::SO_ATTACH_REUSEPORT_EBPF,
        prog.as_raw_fd(),
    )
    .map_err(|e| {
        JoinError::Failed(io::Error::new(
            e.kind(),
            format!("attaching the steering program (SO_ATTACH_REUSEPORT_EBPF): {e}"),
        ))
    })?;
    Ok(Joined {
        slot,
        map_id,
        _map: map,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_jumps_land_on_the_drop_path() {
        let p = program(3);
        for (i, ins) in p.iter().enumerate() {
            if ins.code == JNE_IMM {
                let target = i as i32 + 1 + ins.off as i32;
                assert_eq!(target, 18, "jump at {i}");
            }
        }
        assert_eq!(p[9].regs, R2 | (BPF_PSEUDO_MAP_FD << 4));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }
}
