//! Creating the socket: every option the data path relies on.
//!
//! IPv4: `IP_MTU_DISCOVER = IP_PMTUDISC_DO` sets DF, and with DF an
//! unconnected socket sends IPv4 ID 0 — the ID the ICRC was computed over
//! (`tests/wire_ids.rs` checks this on a real link); `IP_PKTINFO`,
//! `IP_RECVTOS`, `IP_RECVTTL` report the destination address (the ICRC
//! covers it), TOS and TTL of each datagram received. IPv6: the same through
//! the `IPV6_*` options, and `UDP_NO_CHECK6_RX`, without which the kernel
//! drops the zero-checksum IPv6 datagrams rxe sends. Buffers: 8 MiB each way,
//! forced past `net.core.[rw]mem_max` where we may (root).

use crate::sys;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// Socket buffer size asked for (forced as root, capped by
/// `net.core.[rw]mem_max` otherwise).
const SOCKET_BUFFER: usize = 8 << 20;

/// A configured, unbound socket.
pub(crate) fn new_socket(local: IpAddr, traffic_class: u8) -> io::Result<Socket> {
    let v4 = local.is_ipv4();
    let sock = Socket::new(
        if v4 { Domain::IPV4 } else { Domain::IPV6 },
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    sock.set_nonblocking(true)?;
    let fd = sock.as_raw_fd();
    let opt = |level, name, value, what: &str| {
        sys::setsockopt_int(fd, level, name, value)
            .map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))
    };
    for (force, plain, what) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, "SO_RCVBUF"),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, "SO_SNDBUF"),
    ] {
        if sys::setsockopt_int(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER as i32).is_err() {
            opt(libc::SOL_SOCKET, plain, SOCKET_BUFFER as i32, what)?;
        }
    }
    if v4 {
        // DF set: the kernel then sends ID 0 from an unconnected socket,
        // which the ICRC covers.
        opt(
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IP_MTU_DISCOVER",
        )?;
        opt(libc::IPPROTO_IP, libc::IP_PKTINFO, 1, "IP_PKTINFO")?;
        opt(libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS")?;
        opt(libc::IPPROTO_IP, libc::IP_RECVTTL, 1, "IP_RECVTTL")?;
        if traffic_class != 0 {
            opt(
                libc::IPPROTO_IP,
                libc::IP_TOS,
                traffic_class as i32,
                "IP_TOS",
            )?;
        }
    } else {
        sock.set_only_v6(true)?;
        opt(
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
            "IPV6_MTU_DISCOVER",
        )?;
        opt(
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            1,
            "IPV6_RECVPKTINFO",
        )?;
        opt(
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVTCLASS,
            1,
            "IPV6_RECVTCLASS",
        )?;
        opt(
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVHOPLIMIT,
            1,
            "IPV6_RECVHOPLIMIT",
        )?;
        // rxe sends IPv6 UDP with checksum 0.
        opt(libc::SOL_UDP, sys::UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX")?;
        if traffic_class != 0 {
            opt(
                libc::IPPROTO_IPV6,
                libc::IPV6_TCLASS,
                traffic_class as i32,
                "IPV6_TCLASS",
            )?;
        }
    }
    Ok(sock)
}
