//! The UDP sockets bound to one address and port, as the kernel lists them
//! to any user of the network namespace (`sock_diag(7)`, the interface of
//! `ss`): inode, owner and the kernel's drop counter of each.
//!
//! A UDP socket is listed exactly while it is hashed, and a reuseport
//! member is hashed exactly while it is in its group (`udp_lib_get_port`
//! adds it to both under the slot lock, `udp_lib_unhash` removes it from
//! both), so the sockets listed for `addr:4791` are the group's members.
//!
//! **Why not `/proc/net/udp`.** That file is a `seq_file`: each `read(2)`
//! returns one page of rows, and the next read re-walks the hash table to
//! the row count it had reached. A socket anywhere in the namespace that
//! closes between two reads shifts the walk by one, and a row is never
//! printed: a member missing from the list, or a group that looks empty.
//! Seen in CI, where other tests open and close sockets all the time.
//!
//! **Why this listing is whole.** A dump asks for one local port, and the
//! kernel keeps every socket of one port in one slot of its port hash; the
//! dump walks a slot under the slot's lock. A bytecode filter keeps only
//! the sockets bound to `addr`, so the group's rows fit in one netlink
//! message batch: one walk under one lock, a snapshot. Should a group ever
//! outgrow a batch (the dump then resumes the slot by count, as the file
//! does), the read is repeated, with the kernel's batch size now grown to
//! the receive buffer's (32 KiB: about 200 members), and fails if the rows
//! still span batches.

use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, Read};
use std::net::SocketAddr;

/// One listed socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) inode: u64,
    pub(crate) uid: u32,
    pub(crate) drops: u64,
}

// linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h.
const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
const INET_DIAG_SKMEMINFO: u16 = 7;
const INET_DIAG_BC_S_COND: u8 = 7;
const SK_MEMINFO_DROPS: usize = 8;
/// `struct nlmsghdr`, `struct inet_diag_req_v2`, `struct inet_diag_msg`.
const NLMSG_HDR: usize = 16;
const REQ_V2: usize = 56;
const DIAG_MSG: usize = 72;
/// Receive buffer: the kernel sizes later dump batches to the largest
/// receive seen, up to 32 KiB.
const RECV_BUF: usize = 64 * 1024;
/// Reads of a listing that spanned batches before giving up.
const TRIES: usize = 3;

/// The dump request for sockets bound to exactly `addr` (any remote),
/// with their memory counters (for the drop count).
fn request(addr: SocketAddr, seq: u32) -> Vec<u8> {
    let (family, ip): (u8, Vec<u8>) = match addr {
        SocketAddr::V4(a) => (libc::AF_INET as u8, a.ip().octets().to_vec()),
        SocketAddr::V6(a) => (libc::AF_INET6 as u8, a.ip().octets().to_vec()),
    };
    // Bytecode: one source condition (struct inet_diag_bc_op, then struct
    // inet_diag_hostcond and the address). On a match `yes` steps to the
    // end of the program (accept); otherwise `no` steps past it (reject).
    let cond_len = 4 + 8 + ip.len();
    let mut bc = Vec::with_capacity(cond_len);
    bc.push(INET_DIAG_BC_S_COND);
    bc.push(cond_len as u8);
    bc.extend_from_slice(&(cond_len as u16 + 4).to_ne_bytes());
    bc.push(family);
    bc.push(ip.len() as u8 * 8);
    bc.extend_from_slice(&[0, 0]);
    bc.extend_from_slice(&i32::from(addr.port()).to_ne_bytes());
    bc.extend_from_slice(&ip);
    let attr_len = 4 + bc.len();
    let total = NLMSG_HDR + REQ_V2 + attr_len;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, ext, pad, states, then the id:
    // sport (network order), dport, src, dst, ifindex, cookie (none).
    m.extend_from_slice(&[
        family,
        libc::IPPROTO_UDP as u8,
        1 << (INET_DIAG_SKMEMINFO - 1),
        0,
    ]);
    m.extend_from_slice(&u32::MAX.to_ne_bytes());
    m.extend_from_slice(&addr.port().to_be_bytes());
    m.extend_from_slice(&[0; 2 + 16 + 16 + 4]);
    m.extend_from_slice(&[0xff; 8]);
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
    m.extend_from_slice(&bc);
    debug_assert_eq!(m.len(), total);
    m
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"))
}

/// Parse one batch of replies to the request `seq`, appending its rows.
/// Returns how many rows it held and whether the dump ended with it.
fn parse(batch: &[u8], seq: u32, out: &mut Vec<Row>) -> io::Result<(usize, bool)> {
    let mut at = 0;
    let mut rows = 0;
    while at + NLMSG_HDR <= batch.len() {
        let len = u32_at(batch, at).ok_or_else(|| bad("short header"))? as usize;
        let ty = u16_at(batch, at + 4).ok_or_else(|| bad("short header"))?;
        let mseq = u32_at(batch, at + 8).ok_or_else(|| bad("short header"))?;
        if len < NLMSG_HDR || at + len > batch.len() {
            return Err(bad("message length out of bounds"));
        }
        let body = &batch[at + NLMSG_HDR..at + len];
        at += (len + 3) & !3;
        if mseq != seq {
            continue; // A reply to an earlier, abandoned request.
        }
        match ty {
            NLMSG_DONE => return Ok((rows, true)),
            NLMSG_ERROR => {
                let e = u32_at(body, 0).ok_or_else(|| bad("short error"))? as i32;
                return Err(io::Error::from_raw_os_error(-e));
            }
            SOCK_DIAG_BY_FAMILY => {
                if body.len() < DIAG_MSG {
                    return Err(bad("short inet_diag_msg"));
                }
                let uid = u32_at(body, 64).expect("checked length");
                let inode = u64::from(u32_at(body, 68).expect("checked length"));
                let mut drops = None;
                let mut a = DIAG_MSG;
                while a + 4 <= body.len() {
                    let alen = usize::from(u16_at(body, a).expect("checked"));
                    let aty = u16_at(body, a + 2).expect("checked") & 0x3fff;
                    if alen < 4 || a + alen > body.len() {
                        return Err(bad("attribute length out of bounds"));
                    }
                    if aty == INET_DIAG_SKMEMINFO {
                        drops = u32_at(body, a + 4 + 4 * SK_MEMINFO_DROPS).map(u64::from);
                    }
                    a += (alen + 3) & !3;
                }
                let drops = drops.ok_or_else(|| bad("no drop counter (kernel before 4.6?)"))?;
                out.push(Row { inode, uid, drops });
                rows += 1;
            }
            _ => {}
        }
    }
    Ok((rows, false))
}

/// Lists the sockets of one address, reusing its socket and buffers.
pub(crate) struct Table {
    addr: SocketAddr,
    sock: Option<Socket>,
    seq: u32,
    buf: Vec<u8>,
    pub(crate) rows: Vec<Row>,
}

impl Table {
    pub(crate) fn new(addr: SocketAddr) -> Table {
        Table {
            addr,
            sock: None,
            seq: 0,
            buf: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Read the current rows.
    pub(crate) fn read(&mut self) -> io::Result<&[Row]> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("listing UDP sockets: {e}"));
        for _ in 0..TRIES {
            if self.read_once().map_err(ctx)? {
                return Ok(&self.rows);
            }
        }
        Err(ctx(io::Error::other(format!(
            "the sockets of {} span several dump batches {TRIES} times running",
            self.addr
        ))))
    }

    /// One dump; false if its rows came in more than one batch (not one
    /// walk under the slot lock).
    fn read_once(&mut self) -> io::Result<bool> {
        if self.sock.is_none() {
            let s = Socket::new(
                Domain::from(libc::AF_NETLINK),
                Type::DGRAM,
                Some(Protocol::from(NETLINK_SOCK_DIAG)),
            )?;
            self.sock = Some(s);
            self.buf.resize(RECV_BUF, 0);
        }
        let sock = self.sock.as_ref().expect("opened above");
        self.seq = self.seq.wrapping_add(1);
        self.rows.clear();
        let req = request(self.addr, self.seq);
        if sock.send(&req)? != req.len() {
            return Err(io::Error::other("short netlink send"));
        }
        let mut batches_with_rows = 0;
        loop {
            let n = (&*sock).read(&mut self.buf)?;
            let (rows, done) = parse(&self.buf[..n], self.seq, &mut self.rows)?;
            if rows > 0 {
                batches_with_rows += 1;
            }
            if done {
                return Ok(batches_with_rows <= 1);
            }
        }
    }
}

/// The inode of the socket `fd`.
pub(crate) fn inode_of(fd: std::os::fd::RawFd) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is valid for writes of one `stat`; an invalid fd is
    // reported as an error.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero bytes are a valid `stat` (plain integers), and
    // fstat succeeded, filling it.
    Ok(unsafe { st.assume_init() }.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_bound_socket_is_listed_with_its_inode_and_owner() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        // Same port, another address: not listed.
        let other =
            std::net::UdpSocket::bind(SocketAddr::new("127.0.0.2".parse().unwrap(), addr.port()));
        let ino = inode_of(s.as_raw_fd()).unwrap();
        let mut t = Table::new(addr);
        let rows = t.read().unwrap().to_vec();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].inode, ino);
        // SAFETY: getuid has no preconditions.
        assert_eq!(rows[0].uid, unsafe { libc::getuid() });
        assert_eq!(rows[0].drops, 0);
        drop((s, other));
        assert!(t.read().unwrap().is_empty());
    }

    #[test]
    fn ipv6_sockets_are_listed_by_their_own_family() {
        let s = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let addr = s.local_addr().unwrap();
        let ino = inode_of(s.as_raw_fd()).unwrap();
        let mut t = Table::new(addr);
        assert_eq!(
            t.read()
                .unwrap()
                .iter()
                .map(|r| r.inode)
                .collect::<Vec<_>>(),
            [ino]
        );
    }

    #[test]
    fn a_drop_is_counted() {
        // A receive buffer of the minimum fills with a few datagrams; the
        // rest are drops, counted on the socket.
        let s = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        s.set_recv_buffer_size(1).unwrap();
        s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let addr = s.local_addr().unwrap().as_socket().unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..64 {
            tx.send_to(&[0; 1024], addr).unwrap();
        }
        let mut t = Table::new(addr);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while t.read().unwrap()[0].drops == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(t.read().unwrap()[0].drops > 0);
    }

    #[test]
    fn junk_replies_are_errors_not_panics() {
        let mut out = Vec::new();
        // A header whose length runs past the batch.
        let mut b = 100u32.to_ne_bytes().to_vec();
        b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b.extend_from_slice(&[0; 10]);
        assert!(parse(&b, 0, &mut out).is_err());
        // A diag message too short for its fixed part.
        let mut b = 20u32.to_ne_bytes().to_vec();
        b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b.extend_from_slice(&[0; 14]);
        assert!(parse(&b, 0, &mut out).is_err());
        // A reply to another request is skipped.
        let mut b = 20u32.to_ne_bytes().to_vec();
        b.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        b.extend_from_slice(&[0; 2]);
        b.extend_from_slice(&7u32.to_ne_bytes());
        b.extend_from_slice(&[0; 8]);
        assert_eq!(parse(&b, 8, &mut out).unwrap(), (0, false));
        assert_eq!(parse(&b, 7, &mut out).unwrap(), (0, true));
        assert!(out.is_empty());
    }
}
