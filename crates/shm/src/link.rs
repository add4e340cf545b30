//! Finding and joining the process that owns a QP: an abstract Unix socket
//! per context, a handshake that swaps segment descriptors, and a service
//! thread that accepts peers and notices their death.
//!
//! The socket's name is `softrdma-shm/<uid>/<address>/<slot>` in the
//! abstract namespace (so nothing is left in the file system, whatever
//! way a process ends). Abstract names have no permissions, so both ends
//! check the other's credentials (`SO_PEERCRED`): only processes of the
//! same user share memory; anyone else is refused and the connection
//! stays on UDP.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::seg::{MAGIC, VERSION};

/// Who a context is: the address and port slot its QPNs belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub addr: IpAddr,
    pub slot: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub slot: u32,
    pub addr: [u8; 16],
    /// The in-flight word the receiver is to use in the sender's segment.
    pub active: u32,
    pub _pad: u32,
}

impl Hello {
    pub fn new(me: Key, active: u32) -> Hello {
        Hello {
            magic: MAGIC,
            version: VERSION,
            slot: me.slot as u32,
            addr: gid_of(me.addr),
            active,
            _pad: 0,
        }
    }

    pub fn key(&self) -> Key {
        key_of(self.addr, self.slot as u8)
    }
}

/// The GID (IPv4-mapped or IPv6) of an address.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn key_of(gid: [u8; 16], slot: u8) -> Key {
    let a = std::net::Ipv6Addr::from(gid);
    let addr = match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    };
    Key { addr, slot }
}

fn sockaddr(k: Key) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = format!("softrdma-shm/{uid}/{}/{}", k.addr, k.slot);
    let b = name.as_bytes();
    // sun_path[0] = 0: the abstract namespace.
    for (d, s) in sa.sun_path[1..].iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + 1 + b.len().min(sa.sun_path.len() - 1))
        as libc::socklen_t;
    (sa, len)
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain system call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn listen(me: Key) -> io::Result<OwnedFd> {
    let s = socket()?;
    let (sa, len) = sockaddr(me);
    // SAFETY: sa is a valid sockaddr_un of length len.
    if unsafe { libc::bind(s.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain system call.
    if unsafe { libc::listen(s.as_raw_fd(), 64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

pub fn connect(to: Key) -> io::Result<OwnedFd> {
    let s = socket()?;
    let (sa, len) = sockaddr(to);
    // SAFETY: as in `listen`.
    if unsafe { libc::connect(s.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    check_peer(s.as_raw_fd())?;
    Ok(s)
}

pub fn accept(l: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; we want no address back.
    let fd = unsafe {
        libc::accept4(
            l,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let s = unsafe { OwnedFd::from_raw_fd(fd) };
    check_peer(s.as_raw_fd())?;
    Ok(s)
}

/// Refuse a peer of another user.
fn check_peer(fd: RawFd) -> io::Result<()> {
    let c = peer_cred(fd)?;
    // SAFETY: getuid cannot fail.
    if c.uid != unsafe { libc::getuid() } {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the peer process belongs to another user",
        ));
    }
    Ok(())
}

/// The process at the other end of the connection `fd`, as the kernel
/// recorded it when the connection was made.
pub fn peer_pid(fd: RawFd) -> Option<libc::pid_t> {
    peer_cred(fd).ok().map(|c| c.pid)
}

fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data.
    let mut c: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: c and len describe a writable ucred.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(c)
}

/// Send `h` and the descriptors `fds` (the segment, the bell).
pub fn send_hello(s: RawFd, h: &Hello, fds: [RawFd; 2]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: (h as *const Hello) as *mut libc::c_void,
        iov_len: size_of::<Hello>(),
    };
    #[repr(C)]
    struct Cmsg {
        hdr: libc::cmsghdr,
        fds: [RawFd; 2],
    }
    // SAFETY: plain data.
    let mut c: Cmsg = unsafe { zeroed() };
    // SAFETY: CMSG_LEN is a pure computation.
    c.hdr.cmsg_len = unsafe { libc::CMSG_LEN(2 * size_of::<RawFd>() as u32) } as usize;
    c.hdr.cmsg_level = libc::SOL_SOCKET;
    c.hdr.cmsg_type = libc::SCM_RIGHTS;
    c.fds = fds;
    // SAFETY: plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = (&mut c as *mut Cmsg).cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    m.msg_controllen = unsafe { libc::CMSG_SPACE(2 * size_of::<RawFd>() as u32) } as usize;
    // SAFETY: m describes valid buffers for the duration of the call.
    if unsafe { libc::sendmsg(s, &m, libc::MSG_NOSIGNAL) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receive a hello and its two descriptors, waiting at most `timeout`.
pub fn recv_hello(s: RawFd, timeout: Duration) -> io::Result<(Hello, OwnedFd, OwnedFd)> {
    let mut p = libc::pollfd {
        fd: s,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    if r <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer process did not answer the shared-memory handshake",
        ));
    }
    // SAFETY: plain data.
    let mut h: Hello = unsafe { zeroed() };
    let mut iov = libc::iovec {
        iov_base: (&mut h as *mut Hello).cast(),
        iov_len: size_of::<Hello>(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: m describes valid buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(s, &mut m, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed shared-memory handshake",
        )
    };
    // SAFETY: m's control buffer was filled by the kernel; CMSG_FIRSTHDR
    // walks it within msg_controllen.
    let cm = unsafe { libc::CMSG_FIRSTHDR(&m) };
    if cm.is_null() {
        return Err(bad());
    }
    // SAFETY: cm points to a cmsghdr inside cbuf.
    let (level, ty) = unsafe { ((*cm).cmsg_level, (*cm).cmsg_type) };
    if level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS {
        return Err(bad());
    }
    // SAFETY: cm is a header the kernel wrote inside cbuf.
    let clen = unsafe { (*cm).cmsg_len } as usize;
    // Every descriptor the message carried is ours now: own them all, so
    // none leaks whatever the message's shape.
    // SAFETY: pure computation.
    let hdr = unsafe { libc::CMSG_LEN(0) } as usize;
    let nfds = clen.saturating_sub(hdr) / size_of::<RawFd>();
    let mut owned: Vec<OwnedFd> = (0..nfds)
        .map(|i| {
            // SAFETY: the kernel wrote `nfds` descriptors after the header,
            // inside cbuf; each is a fresh descriptor of this process.
            unsafe {
                OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cm).cast::<RawFd>().add(i),
                ))
            }
        })
        .collect();
    if owned.len() != 2 {
        return Err(bad());
    }
    let b = owned.pop().expect("two");
    let a = owned.pop().expect("two");
    if n as usize != size_of::<Hello>() || h.magic != MAGIC || h.version != VERSION {
        return Err(bad());
    }
    Ok((h, a, b))
}
