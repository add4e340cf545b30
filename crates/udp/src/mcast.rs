//! A port's multicast groups: one receive socket per group joined.
//!
//! Linux hands a multicast datagram to *every* socket bound to its
//! destination address and port (or to the wildcard address), each its
//! own copy: reuseport steering does not apply to multicast (measured,
//! see docs/DESIGN.md, "Multicast"), and sockets bound to a unicast
//! address — the port's shared receive socket — never see it. So each
//! process sharing a device address opens its own socket per group, bound
//! to `group:4791` with `SO_REUSEADDR`/`SO_REUSEPORT` (so the others can
//! too) and joined on the interface of the device's address
//! (`IP_ADD_MEMBERSHIP` with that address; `IPV6_JOIN_GROUP` with its
//! interface index), with `IP_MULTICAST_ALL` off so that it hears only its
//! own group. Every member process gets every datagram of its groups; the
//! transport core then delivers it to each QP attached.
//!
//! Sending needs nothing special: a send socket bound to the device's
//! address routes a multicast destination out of the interface that owns
//! that address (the kernel picks the output device from the bound
//! source), `lo` included — `lo` has no `MULTICAST` flag and no multicast
//! route, and a datagram to a group joined on it is still delivered
//! (measured) — and `IP_MULTICAST_LOOP`, on by default, gives members on
//! this host their copy on other interfaces.

use crate::socket::new_socket;
use crate::sys;
use socket2::Socket;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;

/// `IPV6_MULTICAST_ALL` (linux/in6.h; not in the libc crate).
const IPV6_MULTICAST_ALL: libc::c_int = 29;

/// One joined group.
pub(crate) struct Group {
    pub(crate) addr: IpAddr,
    pub(crate) sock: Socket,
    /// Its last receive found nothing (see `rx::Receiver::recv`).
    pub(crate) idle: bool,
    /// Its slot in `crate::forkguard` (a forked child must not keep the
    /// membership either).
    fork_slot: Option<usize>,
}

impl Drop for Group {
    fn drop(&mut self) {
        // Before the socket (a field) is closed.
        crate::forkguard::unregister(self.fork_slot.take());
    }
}

/// The IP address of a multicast GID, in the family of `local`.
pub(crate) fn group_addr(local: IpAddr, gid: [u8; 16]) -> io::Result<IpAddr> {
    let ip = Ipv6Addr::from(gid);
    let addr: IpAddr = match ip.to_ipv4_mapped() {
        Some(v4) => v4.into(),
        None => ip.into(),
    };
    if !addr.is_multicast() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("GID {ip} is not a multicast address"),
        ));
    }
    if addr.is_ipv4() != local.is_ipv4() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "multicast group {addr} is {} but this port ({local}) is not",
                if addr.is_ipv4() { "IPv4" } else { "IPv6" }
            ),
        ));
    }
    Ok(addr)
}

/// Open the receive socket of `group` on the interface of `local`.
pub(crate) fn open(local: IpAddr, group: IpAddr, port: u16) -> io::Result<Group> {
    let ctx = |what: &str, e: io::Error| {
        io::Error::new(e.kind(), format!("multicast group {group}: {what}: {e}"))
    };
    let sock = new_socket(local, 0)?;
    let fd = sock.as_raw_fd();
    for (name, what) in [
        (libc::SO_REUSEADDR, "SO_REUSEADDR"),
        (libc::SO_REUSEPORT, "SO_REUSEPORT"),
    ] {
        sys::setsockopt_int(fd, libc::SOL_SOCKET, name, 1).map_err(|e| ctx(what, e))?;
    }
    match (local, group) {
        (IpAddr::V4(l), IpAddr::V4(g)) => {
            sock.bind(&SocketAddr::new(group, port).into())
                .map_err(|e| ctx("bind", e))?;
            sock.join_multicast_v4(&g, &l)
                .map_err(|e| ctx(&format!("IP_ADD_MEMBERSHIP on {l}"), e))?;
            sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0)
                .map_err(|e| ctx("IP_MULTICAST_ALL", e))?;
        }
        (IpAddr::V6(l), IpAddr::V6(g)) => {
            let owner = sys::ipv6_addr_owners(l)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        format!("no interface has {l}, to join multicast group {g} on"),
                    )
                })?;
            // (A global address's scope id is 0: the index is the name's.)
            let name = std::ffi::CString::new(owner.name).map_err(io::Error::other)?;
            // SAFETY: a NUL-terminated name that outlives the call.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if index == 0 {
                return Err(ctx("if_nametoindex", io::Error::last_os_error()));
            }
            // Link- and interface-local groups are scoped to that interface.
            let scope = if matches!(g.segments()[0] & 0x000f, 1 | 2) {
                index
            } else {
                0
            };
            sock.bind(&SocketAddr::V6(SocketAddrV6::new(g, port, 0, scope)).into())
                .map_err(|e| ctx("bind", e))?;
            sock.join_multicast_v6(&g, index)
                .map_err(|e| ctx(&format!("IPV6_JOIN_GROUP on interface {index}"), e))?;
            sys::setsockopt_int(fd, libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0)
                .map_err(|e| ctx("IPV6_MULTICAST_ALL", e))?;
        }
        _ => unreachable!("group_addr checked the family"),
    }
    let fork_slot = crate::forkguard::register(fd);
    Ok(Group {
        idle: true,
        addr: group,
        sock,
        fork_slot,
    })
}
