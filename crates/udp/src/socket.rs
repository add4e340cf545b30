//! Creating the socket: every option the data path relies on.
//!
//! IPv4: `IP_MTU_DISCOVER = IP_PMTUDISC_DO` sets DF, and with DF an
//! unconnected socket sends IPv4 ID 0 — the ID the ICRC was computed over
//! (`tests/wire_ids.rs` checks this on a real link); `IP_RECVTOS` and
//! `IP_RECVTTL` report the TOS and TTL of each datagram received. The
//! destination address (the ICRC covers it) is the one the socket is bound
//! to — always a unicast address or a multicast group, whose socket receives
//! nothing addressed elsewhere — so no `IP_PKTINFO`: its control message
//! cost every receive ~70 ns on loopback (2 % of a one-way). IPv6: the same
//! through the `IPV6_*` options, and `UDP_NO_CHECK6_RX`, without which the kernel
//! drops the zero-checksum IPv6 datagrams rxe sends. Buffers: as large as
//! the host lets this process have — `net.core.[rw]mem_max` unprivileged,
//! [`FORCED_BUFFER`] (or the sysctl, if larger) forced with `CAP_NET_ADMIN`
//! — because a datagram that finds the receive buffer full is lost and
//! costs a retransmission timeout.
//!
//! A link-local IPv6 address (rxe's GID 0 is one) only binds with the
//! interface it belongs to as its scope; binding with it also makes the
//! kernel send to link-local peers out of that interface ([`bind_addr`]).

use crate::sys;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;

/// Socket buffer size forced where we may (unless the sysctl allows more):
/// longer bursts survive, but until senders bound their bytes in flight to
/// the receiver's [`crate::Port::rcvbuf`], a bigger buffer only lengthens
/// the queue a retransmission timer waits behind (with 32 MiB, loopback
/// runs left 16 MB standing in a receive queue).
pub(crate) const FORCED_BUFFER: usize = 8 << 20;

/// `net.core.<name>`, if readable.
fn core_sysctl(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

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
    for (force, plain, what, sysctl) in [
        (
            libc::SO_RCVBUFFORCE,
            libc::SO_RCVBUF,
            "SO_RCVBUF",
            "rmem_max",
        ),
        (
            libc::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            "SO_SNDBUF",
            "wmem_max",
        ),
    ] {
        let cap = core_sysctl(sysctl).unwrap_or(FORCED_BUFFER);
        let forced = cap.max(FORCED_BUFFER).min(i32::MAX as usize / 2) as i32;
        if sys::setsockopt_int(fd, libc::SOL_SOCKET, force, forced).is_err() {
            opt(
                libc::SOL_SOCKET,
                plain,
                cap.min(i32::MAX as usize / 2) as i32,
                what,
            )?;
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

/// The address to bind for `local:port`. A link-local IPv6 address needs
/// its interface as the scope id (the kernel refuses it without one, and
/// sends to link-local peers out of the interface the socket is bound to);
/// the device list names only the address, so the interface is the one
/// that holds it.
pub(crate) fn bind_addr(local: IpAddr, port: u16) -> io::Result<SocketAddr> {
    match local {
        IpAddr::V6(a) if is_link_local(a) => {
            let owners = sys::ipv6_addr_owners(a)?
                .into_iter()
                .map(|o| {
                    let enslaved =
                        std::path::Path::new(&format!("/sys/class/net/{}/master", o.name)).exists();
                    (o, enslaved)
                })
                .collect::<Vec<_>>();
            let scope = pick_scope(a, &owners)?;
            Ok(SocketAddr::V6(SocketAddrV6::new(a, port, 0, scope)))
        }
        _ => Ok(SocketAddr::new(local, port)),
    }
}

fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// The scope of a link-local address from the interfaces that hold it
/// (and whether each is enslaved to a bridge or bond, where it carries no
/// IP traffic of its own): the one interface that is not enslaved.
fn pick_scope(a: Ipv6Addr, owners: &[(sys::AddrOwner, bool)]) -> io::Result<u32> {
    let usable: Vec<&sys::AddrOwner> = owners.iter().filter(|o| !o.1).map(|o| &o.0).collect();
    match usable.as_slice() {
        [one] => Ok(one.index),
        [] => Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("link-local address {a} is not on any interface that carries IP traffic"),
        )),
        many => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "link-local address {a} is on several interfaces ({}): cannot tell which one to use",
                many.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str, index: u32) -> sys::AddrOwner {
        sys::AddrOwner {
            name: name.into(),
            index,
        }
    }

    #[test]
    fn link_local_scope_skips_bridge_ports() {
        let a: Ipv6Addr = "fe80::4c62:74ff:fe44:58e1".parse().unwrap();
        // As in the rxe peer's namespace: the bridge has taken the MAC (and
        // so the link-local address) of one of its taps.
        let owners = [(owner("rxebr0", 2), false), (owner("rxetap2", 4), true)];
        assert_eq!(pick_scope(a, &owners).unwrap(), 2);
        assert_eq!(
            pick_scope(a, &owners[1..]).unwrap_err().kind(),
            io::ErrorKind::AddrNotAvailable
        );
        let two = [(owner("a", 2), false), (owner("b", 3), false)];
        let e = pick_scope(a, &two).unwrap_err();
        assert!(e.to_string().contains("(a, b)"), "{e}");
        assert!(pick_scope(a, &[]).is_err());
    }

    #[test]
    fn only_link_local_addresses_get_a_scope() {
        let g: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(bind_addr(g, 4791).unwrap(), SocketAddr::new(g, 4791));
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(bind_addr(v4, 4791).unwrap(), SocketAddr::new(v4, 4791));
        // No interface here holds this one.
        let ll: IpAddr = "fe80::dead:beef:1234:5678".parse().unwrap();
        assert!(bind_addr(ll, 4791).is_err());
    }
}
