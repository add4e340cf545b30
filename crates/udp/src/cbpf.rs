//! The two classic-BPF programs of port sharing, and attaching them.
//!
//! Classic BPF needs no privilege: any user may attach a socket filter
//! (`SO_ATTACH_FILTER`) to a socket of theirs and a reuseport program
//! (`SO_ATTACH_REUSEPORT_CBPF`) to a group they are a member of.
//!
//! * The **group program** runs once per datagram for the whole
//!   `SO_REUSEPORT` group and returns an index into the group's socket
//!   array (`run_bpf_filter` in net/core/sock_reuseport.c; an index past the
//!   end makes the kernel fall back to its flow hash). Its data start at the
//!   UDP payload. It maps the top byte of the BTH destination QP (the QPN
//!   slot) to the index of the socket owning that slot, by a chain of
//!   comparisons built from the current member table; and a steering probe
//!   carrying the group's secret to the index written in the probe.
//!   Datagrams for QP1 (the GSI: communication management MADs) belong to
//!   no slot; they are steered by what the MAD says (see [`gsi`]).
//! * The **probe filter** sits on every member socket and drops steering
//!   probes carrying the secret (everything else passes). The kernel counts
//!   the drop on the socket that was picked (`sk_drops`, which `sock_diag`
//!   lists as `SK_MEMINFO_DROPS`), which is how a prober learns which
//!   socket sits at which index without the cooperation of its owner. Its
//!   data start at the UDP header.

use std::io;
use std::os::fd::RawFd;

/// `SO_ATTACH_FILTER` and `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h).
const SO_ATTACH_FILTER: libc::c_int = 26;
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// UDP payload length of a steering probe (its format is wire's, so that
/// `softrdma decode` knows a probe it sees in a loopback capture).
pub(crate) const PROBE_LEN: usize = softrdma_wire::dissect::STEERING_PROBE_LEN;
/// First byte of a probe: a BTH opcode in the manufacturer-specific range,
/// which no RoCE peer sends to us with the secret behind it.
pub(crate) const PROBE_OPCODE: u8 = softrdma_wire::dissect::STEERING_PROBE_OPCODE;
/// The kernel's limit on the length of a classic BPF program
/// (`BPF_MAXINSNS`, linux/bpf_common.h): a longer one is refused with a
/// bare `EINVAL`.
pub(crate) const BPF_MAXINSNS: usize = 4096;
/// Instructions of the group program besides its two tables (see
/// [`group_program`]): the probe and QP1 checks, the tables' ends.
const GROUP_FIXED_INSNS: usize = 35;
/// Most listeners one address can have: two instructions each, with room
/// kept for two per slot of all 255 members, so that no join is ever
/// refused for the listeners already there (1775).
pub(crate) const MAX_LISTENERS: usize = (BPF_MAXINSNS - GROUP_FIXED_INSNS - 2 * 255) / 2;

/// The group program's answer for "no socket": past any array, so the
/// kernel falls back to its hash and the member it picks drops the datagram
/// as not its slot.
const NO_SOCKET: u32 = u32::MAX;

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[repr(C)]
struct Fprog {
    len: libc::c_ushort,
    filter: *const Insn,
}

// Opcodes (linux/filter.h): class | size | mode.
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_LEN: u16 = 0x80;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// The probe: opcode, three zero bytes, the secret, the target index.
pub(crate) fn probe(secret: [u8; 8], index: u16) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[0] = PROBE_OPCODE;
    p[4..12].copy_from_slice(&secret);
    p[12..14].copy_from_slice(&index.to_be_bytes());
    debug_assert!(softrdma_wire::dissect::is_steering_probe(&p));
    p
}

fn secret_words(secret: [u8; 8]) -> (u32, u32) {
    (
        u32::from_be_bytes([secret[0], secret[1], secret[2], secret[3]]),
        u32::from_be_bytes([secret[4], secret[5], secret[6], secret[7]]),
    )
}

/// How QP1 datagrams are steered (offsets from the UDP payload: BTH 0..12,
/// DETH 12..20, the MAD from 20, its attribute ID at 36, the CM message
/// from 44).
///
/// * A CM REQ or SIDR_REQ (a new connection or a UD service lookup) goes to
///   the member listening on its service ID: the low 32 bits at 56 (port
///   space and port, `0x0106_PPPP` for `RDMA_PS_TCP`), looked up in the
///   listener table. Nobody listening: hashed to some member, which rejects
///   it (the IB CM's "invalid service ID").
/// * A SIDR_REP carries the requester's request ID at 44; every other CM
///   message carries the receiver's communication ID at 48 (RemoteCommID).
///   softrdma puts the QPN slot of the process in the top byte of every ID
///   it hands out, so those go by the slot chain like any QP's datagram.
/// * Anything else for QP1 (not a CM MAD, too short for one): hashed.
pub(crate) mod gsi {
    /// Shortest UDP payload the program reads a CM MAD from.
    pub(crate) const MIN_LEN: u32 = 60;
    pub(crate) const MGMT_CLASS_AT: u32 = 21;
    pub(crate) const MGMT_CLASS_CM: u32 = 0x07;
    pub(crate) const ATTR_AT: u32 = 36;
    pub(crate) const ATTR_REQ: u32 = 0x0010;
    pub(crate) const ATTR_SIDR_REQ: u32 = 0x0017;
    pub(crate) const ATTR_SIDR_REP: u32 = 0x0018;
    pub(crate) const REQUEST_ID_AT: u32 = 44;
    pub(crate) const REMOTE_COMM_ID_AT: u32 = 48;
    pub(crate) const SERVICE_LOW_AT: u32 = 56;
}

/// The group program for `table`, (slot, index of its socket) pairs, and
/// `listeners`, (low 32 bits of a CM service ID, index of the socket of
/// the member listening on it). Fails, naming the limit, if it would be
/// longer than the kernel takes.
pub(crate) fn group_program(
    secret: [u8; 8],
    table: &[(u8, u16)],
    listeners: &[(u32, u16)],
) -> io::Result<Vec<Insn>> {
    let len = GROUP_FIXED_INSNS + 2 * listeners.len() + 2 * table.len();
    if len > BPF_MAXINSNS {
        return Err(io::Error::new(
            io::ErrorKind::QuotaExceeded,
            format!(
                "the steering program for {} listened services and {} members would be \
                 {len} instructions, and a classic BPF program may have at most \
                 {BPF_MAXINSNS} (BPF_MAXINSNS)",
                listeners.len(),
                table.len()
            ),
        ));
    }
    let (hi, lo) = secret_words(secret);
    // Offsets from the UDP payload; a load past the end would make the
    // program return 0 (index 0, a real socket), so the length is checked
    // before any load.
    let mut p = vec![
        op(LD_W_LEN, 0, 0, 0),                // 0: A = payload length
        op(JGE_K, 1, 0, 12),                  // 1: a BTH's worth? -> 3
        op(RET_K, 0, 0, NO_SOCKET),           // 2: runt
        op(JEQ_K, 0, 8, PROBE_LEN as u32),    // 3: probe length? else -> 12
        op(LD_B_ABS, 0, 0, 0),                // 4
        op(JEQ_K, 0, 6, PROBE_OPCODE as u32), // 5: else -> 12
        op(LD_W_ABS, 0, 0, 4),                // 6
        op(JEQ_K, 0, 4, hi),                  // 7: else -> 12
        op(LD_W_ABS, 0, 0, 8),                // 8
        op(JEQ_K, 0, 2, lo),                  // 9: else -> 12
        op(LD_H_ABS, 0, 0, 12),               // 10: A = probe's index
        op(RET_A, 0, 0, 0),                   // 11
        op(LD_B_ABS, 0, 0, 5),                // 12: A = top byte of dest QPN
    ];
    // Slot 0: QP1? Then by the MAD (see `gsi`); the GSI part jumps to the
    // slot chain with a slot byte in A.
    let l = 2 * listeners.len() as u32;
    let gsi_len = 18 + l + 1;
    p.push(op(JEQ_K, 1, 0, 0)); // 13: slot 0 -> 15
    p.push(op(JA, 0, 0, gsi_len)); // 14: -> chain
    let at = p.len();
    p.extend([
        op(LD_H_ABS, 0, 0, 6),                      // 15: low 16 bits of dest QPN
        op(JEQ_K, 1, 0, 1),                         // 16: QP1? -> 18
        op(RET_K, 0, 0, NO_SOCKET),                 // 17
        op(LD_W_LEN, 0, 0, 0),                      // 18
        op(JGE_K, 1, 0, gsi::MIN_LEN),              // 19: -> 21
        op(RET_K, 0, 0, NO_SOCKET),                 // 20
        op(LD_B_ABS, 0, 0, gsi::MGMT_CLASS_AT),     // 21
        op(JEQ_K, 1, 0, gsi::MGMT_CLASS_CM),        // 22: -> 24
        op(RET_K, 0, 0, NO_SOCKET),                 // 23
        op(LD_H_ABS, 0, 0, gsi::ATTR_AT),           // 24
        op(JEQ_K, 6, 0, gsi::ATTR_REQ),             // 25: -> 32
        op(JEQ_K, 5, 0, gsi::ATTR_SIDR_REQ),        // 26: -> 32
        op(JEQ_K, 0, 2, gsi::ATTR_SIDR_REP),        // 27: else -> 30
        op(LD_B_ABS, 0, 0, gsi::REQUEST_ID_AT),     // 28
        op(JA, 0, 0, 4 + l),                        // 29: -> chain
        op(LD_B_ABS, 0, 0, gsi::REMOTE_COMM_ID_AT), // 30
        op(JA, 0, 0, 2 + l),                        // 31: -> chain
        op(LD_W_ABS, 0, 0, gsi::SERVICE_LOW_AT),    // 32
    ]);
    for &(service, index) in listeners {
        p.push(op(JEQ_K, 0, 1, service));
        p.push(op(RET_K, 0, 0, index as u32));
    }
    p.push(op(RET_K, 0, 0, NO_SOCKET));
    debug_assert_eq!(p.len() - at, gsi_len as usize);
    // The slot chain.
    for &(slot, index) in table {
        p.push(op(JEQ_K, 0, 1, slot as u32));
        p.push(op(RET_K, 0, 0, index as u32));
    }
    p.push(op(RET_K, 0, 0, NO_SOCKET));
    debug_assert_eq!(p.len(), len);
    Ok(p)
}

/// The probe filter: drop probes with `secret`, pass everything else.
pub(crate) fn probe_filter(secret: [u8; 8]) -> Vec<Insn> {
    let (hi, lo) = secret_words(secret);
    // Offsets from the UDP header.
    vec![
        op(LD_W_LEN, 0, 0, 0),                 // 0
        op(JEQ_K, 0, 6, 8 + PROBE_LEN as u32), // 1: else -> 8 (pass)
        op(LD_B_ABS, 0, 0, 8),                 // 2
        op(JEQ_K, 0, 4, PROBE_OPCODE as u32),  // 3
        op(LD_W_ABS, 0, 0, 12),                // 4
        op(JEQ_K, 0, 2, hi),                   // 5
        op(LD_W_ABS, 0, 0, 16),                // 6
        op(JEQ_K, 1, 0, lo),                   // 7: -> 9 (drop)
        op(RET_K, 0, 0, u32::MAX),             // 8: pass whole
        op(RET_K, 0, 0, 0),                    // 9: drop
    ]
}

/// A filter that drops everything (send-only sockets).
pub(crate) fn drop_all() -> Vec<Insn> {
    vec![op(RET_K, 0, 0, 0)]
}

fn attach(fd: RawFd, name: libc::c_int, prog: &[Insn], what: &str) -> io::Result<()> {
    if prog.len() > BPF_MAXINSNS {
        return Err(io::Error::new(
            io::ErrorKind::QuotaExceeded,
            format!(
                "{what}: a program of {} instructions, and a classic BPF program may have \
                 at most {BPF_MAXINSNS} (BPF_MAXINSNS)",
                prog.len()
            ),
        ));
    }
    let fprog = Fprog {
        len: libc::c_ushort::try_from(prog.len()).expect("at most BPF_MAXINSNS"),
        filter: prog.as_ptr(),
    };
    // SAFETY: `fprog` and the instructions it points to live across the
    // call and `len` is their count; the kernel copies them.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&fprog as *const Fprog).cast(),
            std::mem::size_of::<Fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// Attach `prog` as the socket filter of `fd`.
pub(crate) fn attach_filter(fd: RawFd, prog: &[Insn]) -> io::Result<()> {
    attach(fd, SO_ATTACH_FILTER, prog, "SO_ATTACH_FILTER")
}

/// Make `prog` the program of the reuseport group `fd` is bound in.
pub(crate) fn attach_group(fd: RawFd, prog: &[Insn]) -> io::Result<()> {
    attach(
        fd,
        SO_ATTACH_REUSEPORT_CBPF,
        prog,
        "attaching the steering program (SO_ATTACH_REUSEPORT_CBPF)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions used here, over
    /// `data`; returns the program's result.
    fn run(p: &[Insn], data: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = p[pc];
            pc += 1;
            let load = |off: usize, n: usize| -> Option<u32> {
                data.get(off..off + n)
                    .map(|b| b.iter().fold(0u32, |acc, &x| acc << 8 | x as u32))
            };
            match i.code {
                LD_W_LEN => a = data.len() as u32,
                LD_W_ABS | LD_H_ABS | LD_B_ABS => {
                    let n = match i.code {
                        LD_W_ABS => 4,
                        LD_H_ABS => 2,
                        _ => 1,
                    };
                    match load(i.k as usize, n) {
                        Some(v) => a = v,
                        None => return 0, // as the kernel does
                    }
                }
                JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                JA => pc += i.k as usize,
                JGE_K => pc += if a >= i.k { i.jt } else { i.jf } as usize,
                RET_K => return i.k,
                RET_A => return a,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn bth(slot: u8) -> Vec<u8> {
        let mut d = vec![0u8; 40];
        d[0] = 0x04; // RC SEND ONLY
        d[5] = slot;
        d
    }

    #[test]
    fn group_program_steers_slots_and_probes() {
        let secret = *b"\x01\x02\x03\x04\xa5\xb6\xc7\xd8";
        let p = group_program(secret, &[(3, 0), (7, 2), (200, 1)], &[]).unwrap();
        assert_eq!(run(&p, &bth(3)), 0);
        assert_eq!(run(&p, &bth(7)), 2);
        assert_eq!(run(&p, &bth(200)), 1);
        assert_eq!(run(&p, &bth(4)), NO_SOCKET);
        assert_eq!(run(&p, &bth(7)[..11]), NO_SOCKET, "runt");
        assert_eq!(run(&p, &probe(secret, 5)), 5);
        // A probe with the wrong secret is steered like any datagram (slot
        // byte 5 of it is 0, unowned).
        assert_eq!(run(&p, &probe(*b"12345678", 1)), NO_SOCKET);
        // 255 slots still fit the kernel's 4096-instruction limit.
        let all: Vec<(u8, u16)> = (1..=255u8).map(|s| (s, s as u16 - 1)).collect();
        let p = group_program(secret, &all, &[]).unwrap();
        assert!(p.len() < 4096);
        assert_eq!(run(&p, &bth(255)), 254);
    }

    /// `MAX_LISTENERS` listeners fit with all 255 members; one more is
    /// refused by an error naming the limit and the counts, not handed to
    /// the kernel (whose answer is a bare `EINVAL`) or truncated.
    #[test]
    fn the_most_listeners_fit_with_all_members_and_one_more_is_refused() {
        let secret = *b"\x01\x02\x03\x04\xa5\xb6\xc7\xd8";
        let all: Vec<(u8, u16)> = (1..=255u8).map(|s| (s, s as u16 - 1)).collect();
        let listeners: Vec<(u32, u16)> = (0..MAX_LISTENERS as u32)
            .map(|i| (0x0106_0000 + i, (i % 255) as u16))
            .collect();
        let p = group_program(secret, &all, &listeners).unwrap();
        assert!(p.len() <= BPF_MAXINSNS, "{}", p.len());
        assert_eq!(run(&p, &mad(0x0010, 0, 0x0106_0000 + 1000)), 1000 % 255);
        let mut more = listeners.clone();
        more.push((0x0107_0000, 0));
        let e = group_program(secret, &all, &more).unwrap_err().to_string();
        assert!(
            e.contains("1776 listened services and 255 members")
                && e.contains("4097 instructions")
                && e.contains("4096 (BPF_MAXINSNS)"),
            "{e}"
        );
        // Attaching a too long program is refused here, not truncated to
        // its low 16 bits.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let long = vec![op(RET_K, 0, 0, 0); 65536 + 1];
        let e = attach_filter(std::os::fd::AsRawFd::as_raw_fd(&s), &long)
            .unwrap_err()
            .to_string();
        assert!(e.contains("65537 instructions"), "{e}");
    }

    /// A CM MAD for QP1: `attr` at 36, `id` (the request or remote
    /// communication ID) at 44 or 48, `service` at 52.
    fn mad(attr: u16, id: u32, service: u64) -> Vec<u8> {
        let mut d = vec![0u8; 12 + 8 + 256 + 4];
        d[0] = 0x64; // UD SEND ONLY
        d[7] = 1; // dest QP 1
        d[20] = 1; // base version
        d[21] = 0x07; // CM
        d[22] = 2;
        d[23] = 0x03; // Send
        d[36..38].copy_from_slice(&attr.to_be_bytes());
        if attr == 0x0018 {
            d[44..48].copy_from_slice(&id.to_be_bytes());
        } else {
            d[48..52].copy_from_slice(&id.to_be_bytes());
        }
        if attr == 0x0010 || attr == 0x0017 {
            d[44..48].copy_from_slice(&0x0101_0101u32.to_be_bytes()); // the sender's
            d[48..52].fill(0);
            d[52..60].copy_from_slice(&service.to_be_bytes());
        }
        d
    }

    #[test]
    fn gsi_datagrams_go_by_listener_and_by_communication_id() {
        let secret = *b"\x01\x02\x03\x04\xa5\xb6\xc7\xd8";
        let table = [(3, 0), (7, 2), (200, 1)];
        let listeners = [(0x0106_4e20, 2), (0x0111_0007, 1)];
        let p = group_program(secret, &table, &listeners).unwrap();
        // REQ / SIDR_REQ by service (port space and port).
        assert_eq!(run(&p, &mad(0x0010, 0, 0x0000_0000_0106_4e20)), 2);
        assert_eq!(run(&p, &mad(0x0017, 0, 0x0000_0000_0111_0007)), 1);
        assert_eq!(run(&p, &mad(0x0010, 0, 0x0000_0000_0106_4e21)), NO_SOCKET);
        // The port space counts: port 7 of RDMA_PS_TCP is not listened on.
        assert_eq!(run(&p, &mad(0x0010, 0, 0x0000_0000_0106_0007)), NO_SOCKET);
        // Replies by the slot in the top byte of the receiver's ID.
        for attr in [0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016] {
            assert_eq!(run(&p, &mad(attr, 0xc800_1234, 0)), 1, "attr {attr:#x}");
            assert_eq!(run(&p, &mad(attr, 0x0700_0001, 0)), 2, "attr {attr:#x}");
            assert_eq!(run(&p, &mad(attr, 0x0500_0001, 0)), NO_SOCKET);
        }
        assert_eq!(run(&p, &mad(0x0018, 0x03ab_cdef, 0)), 0);
        // Not a CM MAD, not QP1, or too short: no socket.
        let mut sa = mad(0x0013, 0x0300_0000, 0);
        sa[21] = 0x03;
        assert_eq!(run(&p, &sa), NO_SOCKET);
        let mut qp2 = mad(0x0013, 0x0300_0000, 0);
        qp2[7] = 2;
        assert_eq!(run(&p, &qp2), NO_SOCKET);
        assert_eq!(run(&p, &mad(0x0013, 0x0300_0000, 0)[..59]), NO_SOCKET);
        // Ordinary slots and probes are unchanged.
        assert_eq!(run(&p, &bth(7)), 2);
        assert_eq!(run(&p, &probe(secret, 5)), 5);
    }

    #[test]
    fn probe_filter_drops_only_probes_with_the_secret() {
        let secret = *b"abcdefgh";
        let f = probe_filter(secret);
        let udp = |payload: &[u8]| {
            let mut d = vec![0u8; 8];
            d.extend_from_slice(payload);
            d
        };
        assert_eq!(run(&f, &udp(&probe(secret, 0))), 0);
        assert_eq!(run(&f, &udp(&probe(*b"abcdefgX", 0))), u32::MAX);
        assert_eq!(run(&f, &udp(&bth(1))), u32::MAX);
        let mut longer = probe(secret, 0).to_vec();
        longer.push(0);
        assert_eq!(run(&f, &udp(&longer)), u32::MAX);
    }
}
