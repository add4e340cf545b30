//! The system calls of the UDP data path, and the only place besides
//! [`crate::steer`], [`crate::cbpf`] and [`crate::listing`] where this crate
//! uses `unsafe`.
//!
//! Everything here is a thin, typed wrapper: socket options as integers,
//! socket addresses as a `sockaddr_in`/`sockaddr_in6` union, `sendmmsg` and
//! `recvmmsg` over caller-built `mmsghdr` arrays, and control messages
//! (`UDP_SEGMENT` out; `IP_TOS`, `IP_TTL`, their IPv6 counterparts,
//! `SO_RXQ_OVFL` and `UDP_GRO` in). The arrays themselves are owned and laid out
//! by [`crate::tx`] and [`crate::rx`]; the invariants that make the calls sound
//! are stated at each `unsafe` block.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// `UDP_SEGMENT` (linux/udp.h): the GSO segment size, as a socket option or
/// a per-message control message.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): deliver coalesced datagrams with their segment
/// size in a control message.
pub(crate) const UDP_GRO: libc::c_int = 104;
/// `UDP_NO_CHECK6_RX` (linux/udp.h): accept IPv6 UDP with checksum 0, which
/// rxe sends.
pub(crate) const UDP_NO_CHECK6_RX: libc::c_int = 102;
/// `SO_RXQ_OVFL` (asm-generic/socket.h): report the socket's drop count
/// with each datagram.
pub(crate) const SO_RXQ_OVFL: libc::c_int = 40;

/// Set an integer socket option.
pub(crate) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its exact size is passed; the
    // kernel only reads it. An invalid fd or option is reported as an error.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Read an integer socket option.
pub(crate) fn getsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes for the duration of the
    // call and `len` holds the size of `value`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A socket address in the layout the kernel reads and writes.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    pub(crate) fn zeroed() -> RawAddr {
        RawAddr {
            v6: libc::sockaddr_in6 {
                sin6_family: 0,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
                sin6_scope_id: 0,
            },
        }
    }

    pub(crate) fn from_socket_addr(a: SocketAddr) -> (RawAddr, libc::socklen_t) {
        match a {
            SocketAddr::V4(a) => (
                RawAddr {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: a.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_ne_bytes(a.ip().octets()),
                        },
                        sin_zero: [0; 8],
                    },
                },
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(a) => (
                RawAddr {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: a.port().to_be(),
                        sin6_flowinfo: a.flowinfo(),
                        sin6_addr: libc::in6_addr {
                            s6_addr: a.ip().octets(),
                        },
                        sin6_scope_id: a.scope_id(),
                    },
                },
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }

    /// The address the kernel wrote, if it is IPv4 or IPv6.
    pub(crate) fn socket_addr(&self) -> Option<SocketAddr> {
        // SAFETY: both variants start with the address family and every bit
        // pattern is a valid value of either plain-data struct, so reading
        // the family through `v6` and then the variant it names is defined.
        unsafe {
            match self.v6.sin6_family as libc::c_int {
                libc::AF_INET => {
                    let a = self.v4;
                    Some(SocketAddr::V4(SocketAddrV4::new(
                        Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                        u16::from_be(a.sin_port),
                    )))
                }
                libc::AF_INET6 => {
                    let a = self.v6;
                    Some(SocketAddr::V6(SocketAddrV6::new(
                        Ipv6Addr::from(a.sin6_addr.s6_addr),
                        u16::from_be(a.sin6_port),
                        a.sin6_flowinfo,
                        a.sin6_scope_id,
                    )))
                }
                _ => None,
            }
        }
    }

    pub(crate) fn as_ptr(&self) -> *const libc::c_void {
        (self as *const RawAddr).cast()
    }
}

/// An empty `mmsghdr`, to be filled before each call.
pub(crate) fn empty_mmsghdr() -> libc::mmsghdr {
    libc::mmsghdr {
        msg_hdr: libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            msg_iov: std::ptr::null_mut(),
            msg_iovlen: 0,
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        },
        msg_len: 0,
    }
}

/// An empty `iovec`.
pub(crate) fn empty_iovec() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

/// An `iovec` over bytes the kernel will only read (a send).
pub(crate) fn iovec_for(b: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }
}

/// Send the messages `msgs` describes with one `sendmmsg`; returns how many
/// went out (the first error is returned only when none did).
///
/// # Safety
///
/// Every `msg_name`, `msg_iov` (with its `msg_iovlen` entries, and the bytes
/// each of those points to) and `msg_control` in `msgs` must be valid for
/// reads for the duration of the call.
pub(crate) unsafe fn sendmmsg(fd: RawFd, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    if let [m] = msgs {
        // One message (a ping-pong's datagram, or one GSO train): a
        // `sendmsg`, which copies no `mmsghdr` array in and no length
        // back out.
        // SAFETY: the header is valid; the pointers inside are the
        // caller's obligation (see above).
        let n = unsafe { libc::sendmsg(fd, &m.msg_hdr, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        m.msg_len = n as libc::c_uint;
        return Ok(1);
    }
    // SAFETY: the array itself is valid for `msgs.len()` entries, which the
    // kernel writes `msg_len` into; the pointers inside are the caller's
    // obligation (see above).
    let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as libc::c_uint, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receive up to `msgs.len()` datagrams without blocking.
///
/// # Safety
///
/// Every `msg_name` (for `msg_namelen` bytes), `msg_iov` (with the buffers
/// its entries point to) and `msg_control` (for `msg_controllen` bytes) in
/// `msgs` must be valid for writes for the duration of the call.
pub(crate) unsafe fn recvmmsg(fd: RawFd, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    // SAFETY: the array is valid for `msgs.len()` entries; the buffers the
    // entries point to are the caller's obligation. No timeout is passed.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            msgs.len() as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receive one datagram without blocking into `m` (as the first entry of a
/// [`recvmmsg`] would: its `msg_len` set to the datagram's length); returns
/// 1.
///
/// # Safety
///
/// As for [`recvmmsg`], for the one header.
pub(crate) unsafe fn recvmsg(fd: RawFd, m: &mut libc::mmsghdr) -> io::Result<usize> {
    // SAFETY: the header is valid; the buffers it points to are the
    // caller's obligation.
    let n = unsafe { libc::recvmsg(fd, &mut m.msg_hdr, libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        m.msg_len = n as libc::c_uint;
        Ok(1)
    }
}

/// Wait up to `timeout_ms` for the socket to become writable.
pub(crate) fn poll_writable(fd: RawFd, timeout_ms: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid `pollfd` that lives across the call. The result is
    // ignored: the caller retries the send either way.
    unsafe {
        libc::poll(&mut p, 1, timeout_ms);
    }
}

/// A control-message buffer, aligned as `cmsghdr` requires.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct CmsgBuf<const N: usize>(pub(crate) [u8; N]);

impl<const N: usize> CmsgBuf<N> {
    pub(crate) fn new() -> Self {
        CmsgBuf([0; N])
    }
}

/// Room for the one `UDP_SEGMENT` message a GSO send carries.
pub(crate) type TxCmsg = CmsgBuf<32>;
/// Room for what a receive can carry: packet info, TOS/traffic class,
/// TTL/hop limit and the GRO segment size.
pub(crate) type RxCmsg = CmsgBuf<256>;

/// Write a `UDP_SEGMENT` control message into `buf`; returns the length to
/// put in `msg_controllen`.
pub(crate) fn write_gso_cmsg(buf: &mut TxCmsg, segment_size: u16) -> usize {
    // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(mem::size_of::<u16>() as u32) as usize,
            libc::CMSG_LEN(mem::size_of::<u16>() as u32) as usize,
        )
    };
    assert!(space <= buf.0.len());
    buf.0.fill(0);
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: libc::SOL_UDP,
        cmsg_type: UDP_SEGMENT,
    };
    let base = buf.0.as_mut_ptr();
    // SAFETY: `buf` is 8-byte aligned and at least CMSG_SPACE(2) bytes long
    // (asserted), so both the header at its start and the data at
    // CMSG_DATA's offset (the aligned header size) are in bounds.
    unsafe {
        std::ptr::write(base.cast::<libc::cmsghdr>(), hdr);
        let data = base.add(mem::size_of::<libc::cmsghdr>());
        std::ptr::write_unaligned(data.cast::<u16>(), segment_size);
    }
    space
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RxCmsgs {
    /// IPv4 TOS or IPv6 traffic class.
    pub(crate) tclass: Option<u8>,
    /// IPv4 TTL or IPv6 hop limit.
    pub(crate) hop_limit: Option<u8>,
    /// `UDP_GRO`: the size of the coalesced segments (the last may be shorter).
    pub(crate) gro_segment: Option<u16>,
    /// `SO_RXQ_OVFL`: datagrams the kernel dropped on this socket so far
    /// (present once there was a drop).
    pub(crate) drops: Option<u32>,
}

/// Walk the control messages of a received `msghdr`.
///
/// # Safety
///
/// `hdr` must be a header the kernel has just filled by a successful receive,
/// with `msg_control` pointing to at least `msg_controllen` readable bytes.
pub(crate) unsafe fn parse_rx_cmsgs(hdr: &libc::msghdr) -> RxCmsgs {
    let mut out = RxCmsgs::default();
    // SAFETY: the caller guarantees the control buffer is valid and was
    // filled by the kernel; CMSG_FIRSTHDR/NXTHDR stay within
    // `msg_controllen`; payloads are read unaligned after checking that each
    // message's length covers them.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let m = &*c;
            let data = libc::CMSG_DATA(c);
            let data_len = (m.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            let int = |d: *const u8| -> Option<libc::c_int> {
                (data_len >= 4).then(|| std::ptr::read_unaligned(d.cast::<libc::c_int>()))
            };
            match (m.cmsg_level, m.cmsg_type) {
                // IP_TOS arrives as one byte, IP_TTL as an int.
                (libc::IPPROTO_IP, libc::IP_TOS) if data_len >= 1 => out.tclass = Some(*data),
                (libc::IPPROTO_IP, libc::IP_TTL) => out.hop_limit = int(data).map(|v| v as u8),
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => out.tclass = int(data).map(|v| v as u8),
                (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                    out.hop_limit = int(data).map(|v| v as u8)
                }
                (libc::SOL_SOCKET, SO_RXQ_OVFL) if data_len >= 4 => {
                    out.drops = Some(std::ptr::read_unaligned(data.cast::<u32>()))
                }
                (libc::SOL_UDP, UDP_GRO) => {
                    out.gro_segment = int(data)
                        .and_then(|v| u16::try_from(v).ok())
                        .filter(|&v| v > 0)
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_addr_round_trips() {
        for a in ["127.0.0.1:4791", "[::1]:4791", "[fe80::1%2]:7"] {
            let a: SocketAddr = a.parse().unwrap();
            let (r, _) = RawAddr::from_socket_addr(a);
            assert_eq!(r.socket_addr(), Some(a));
        }
        assert_eq!(RawAddr::zeroed().socket_addr(), None);
    }

    #[test]
    fn gso_cmsg_layout() {
        let mut b = TxCmsg::new();
        let n = write_gso_cmsg(&mut b, 0x1234);
        assert_eq!(n, 24);
        assert_eq!(&b.0[8..16], &[17, 0, 0, 0, 103, 0, 0, 0]);
        assert_eq!(&b.0[16..18], &0x1234u16.to_ne_bytes());
    }
}

/// One interface that holds a given IPv6 address: its name and index (the
/// address's scope id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddrOwner {
    pub(crate) name: String,
    pub(crate) index: u32,
}

/// Every interface that has `addr` configured (getifaddrs). A link-local
/// address can be on several: a bridge takes the MAC, and so the EUI-64
/// link-local address, of one of its ports.
pub(crate) fn ipv6_addr_owners(addr: Ipv6Addr) -> io::Result<Vec<AddrOwner>> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`, freed below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr; the family field
        // is common to every sockaddr type.
        if unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int != libc::AF_INET6 {
            continue;
        }
        // SAFETY: family AF_INET6 means ifa_addr points to a sockaddr_in6.
        let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
        if Ipv6Addr::from(sin6.sin6_addr.s6_addr) != addr {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        out.push(AddrOwner {
            name: name.to_string_lossy().into_owned(),
            index: sin6.sin6_scope_id,
        });
    }
    // SAFETY: frees the list getifaddrs allocated, exactly once; no
    // reference into it outlives this point.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}
