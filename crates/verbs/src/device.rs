//! Devices: which soft RNICs exist and which local address each one uses.
//!
//! A device is a name (`srdma0`, like `mlx5_0` or `rxe0`) bound to one local
//! IP address, which it sends from; that address (IPv4-mapped for IPv4, as
//! rxe's RoCEv2 GIDs are) is its entry in its port's GID table, which is
//! laid out as rxe's over the same interface (see `crate::gid`).
//!
//! The list comes from, in order:
//! 1. `SOFTRDMA_DEVICES`, e.g. `srdma0=127.0.0.1,srdma1=::1,srdma2=10.0.0.5`;
//! 2. the file `/etc/softrdma/devices`, one `name address` per line;
//! 3. the default: `srdma0` on 127.0.0.1, then `srdma1`, `srdma2`, … on each
//!    other IPv4 and global IPv6 address of the host's interfaces.
//!
//! With no device named, tools pick the device by the address in use, as
//! rdma_cm's address resolution does: a client by the route to its peer, a
//! server by the local address its peer's out-of-band connection reached.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

/// A soft RNIC: a name and the local address it sends and receives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's name (`srdma0`), what `ibv_get_device_name` returns.
    pub name: String,
    /// The local IP address it sends and receives on: its own GID.
    pub addr: IpAddr,
}

impl DeviceInfo {
    /// Its own GID: the address, IPv4-mapped for IPv4 (index 0 of the
    /// table on `lo`, 1 for an IPv4 address on an Ethernet interface).
    pub fn gid(&self) -> [u8; 16] {
        ip_to_gid(self.addr)
    }
}

/// The GID of an IP address, as a RoCEv2 GID is formed: an IPv6 address as it is,
/// an IPv4 address IPv4-mapped (`::ffff:a.b.c.d`).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The IP address of a GID, the inverse of [`ip_to_gid`]: an IPv4-mapped GID gives
/// its IPv4 address, any other its IPv6 address.
pub fn gid_to_ip(g: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(g);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn parse_list(s: &str) -> io::Result<Vec<DeviceInfo>> {
    let mut v = Vec::new();
    for item in s
        .split([',', '\n'])
        .map(str::trim)
        .filter(|x| !x.is_empty() && !x.starts_with('#'))
    {
        let (name, addr) = item
            .split_once(['=', ' ', '\t'])
            .ok_or_else(|| bad(format!("device entry '{item}' is not NAME=ADDRESS")))?;
        let addr: IpAddr = addr.trim().parse().map_err(|_| {
            bad(format!(
                "device {name}: '{}' is not an IP address",
                addr.trim()
            ))
        })?;
        v.push(DeviceInfo {
            name: name.trim().to_string(),
            addr,
        });
    }
    Ok(v)
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Every configured device.
pub fn devices() -> io::Result<Vec<DeviceInfo>> {
    if let Ok(s) = std::env::var("SOFTRDMA_DEVICES") {
        return parse_list(&s);
    }
    if let Ok(s) = std::fs::read_to_string("/etc/softrdma/devices") {
        return parse_list(&s);
    }
    let mut v = vec![DeviceInfo {
        name: "srdma0".into(),
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
    }];
    for ip in interface_addrs() {
        if !v.iter().any(|d| d.addr == ip) {
            let name = format!("srdma{}", v.len());
            v.push(DeviceInfo { name, addr: ip });
        }
    }
    Ok(v)
}

/// The device with this name.
pub fn by_name(name: &str) -> io::Result<DeviceInfo> {
    let all = devices()?;
    all.iter().find(|d| d.name == name).cloned().ok_or_else(|| {
        let names: Vec<_> = all
            .iter()
            .map(|d| format!("{} ({})", d.name, d.addr))
            .collect();
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no device '{name}'; devices: {}", names.join(", ")),
        )
    })
}

/// The device using local address `ip` (an unnamed one if none is configured).
pub fn by_addr(ip: IpAddr) -> io::Result<DeviceInfo> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    Ok(devices()?
        .into_iter()
        .find(|d| d.addr == ip)
        .unwrap_or(DeviceInfo {
            name: format!("srdma-{ip}"),
            addr: ip,
        }))
}

/// The local address the kernel would use to reach `peer` (no packet is
/// sent: a UDP socket is connected and asked for its name).
pub fn route_source(peer: IpAddr) -> io::Result<IpAddr> {
    route_source_to(SocketAddr::new(peer, 4791))
}

/// [`route_source`] for a socket address, whose IPv6 scope (the interface
/// of a link-local peer, `fe80::…%eth0`) the route needs: without it the
/// kernel cannot pick an interface and refuses the connect.
pub fn route_source_to(peer: SocketAddr) -> io::Result<IpAddr> {
    let bind: SocketAddr = match peer {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    };
    let s = UdpSocket::bind(bind)?;
    let mut to = peer;
    to.set_port(4791);
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
}

fn interface_addrs() -> Vec<IpAddr> {
    interfaces()
        .into_iter()
        .map(|(_, ip)| ip)
        .filter(|ip| match ip {
            IpAddr::V4(v) => !v.is_loopback(),
            IpAddr::V6(v) => !v.is_loopback() && (v.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect()
}

/// The network interface that holds local address `ip` (`lo` for
/// 127.0.0.1), as rxe's device is bound to one: what its GID's `ndevs`
/// entry and `device/net/` in sysfs name. `None` if no interface has it.
pub fn interface_of(ip: IpAddr) -> Option<String> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    interfaces()
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(name, _)| name)
}

/// The MTU of the network interface that holds local address `ip`
/// (`SIOCGIFMTU`); `None` if no interface has it.
pub fn interface_mtu(ip: IpAddr) -> Option<u32> {
    let name = interface_of(ip)?;
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: an all-zero ifreq is valid (a name and a union of integers).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name of `req` and writes
    // its `ifru_mtu`; `req` outlives the call.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    // SAFETY: `fd` is ours, closed once.
    unsafe { libc::close(fd) };
    if r != 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU filled in the union's MTU member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).ok()
}

/// The largest IB MTU whose RoCEv2 packets fit an Ethernet MTU of
/// `netdev_mtu` bytes, as the kernel derives a RoCE path MTU
/// (`iboe_get_mtu`: the MTU less GRH, UDP, BTH, XRC and AtomicETH headers
/// and the ICRC, 96 bytes): 1500 gives 1024, 9000 gives 4096.
pub fn roce_mtu(netdev_mtu: u32) -> Option<crate::Mtu> {
    let room = netdev_mtu.checked_sub(40 + 8 + 12 + 4 + 28 + 4)?;
    crate::Mtu::ALL
        .into_iter()
        .rev()
        .find(|m| m.bytes() <= room)
}

/// Every address of every interface, with the interface's name, in
/// `getifaddrs` order.
fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    walk_ifaddrs(|name, a| {
        if let IfAddr::Ip(ip) = a {
            out.push((name.to_string(), ip));
        }
    });
    out
}

/// A network interface as a GID table needs it.
#[derive(Debug, Clone)]
pub(crate) struct Interface {
    pub name: String,
    pub index: u32,
    /// Its MAC, if it is an Ethernet interface (`ARPHRD_ETHER`).
    pub mac: Option<[u8; 6]>,
    /// Its addresses in the kernel's order (IPv4 and IPv6 each as listed).
    pub addrs: Vec<IpAddr>,
}

/// The interface that holds local address `ip`, with its MAC and addresses.
pub(crate) fn interface_with(ip: IpAddr) -> Option<Interface> {
    let name = interface_of(ip)?;
    let mut i = Interface {
        index: 0,
        mac: None,
        addrs: Vec::new(),
        name,
    };
    walk_ifaddrs(|n, a| {
        if n != i.name {
            return;
        }
        match a {
            IfAddr::Ip(ip) => i.addrs.push(ip),
            IfAddr::Ether(mac) => i.mac = Some(mac),
        }
    });
    let c = std::ffi::CString::new(i.name.clone()).ok()?;
    // SAFETY: a NUL-terminated name that outlives the call.
    i.index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    Some(i)
}

/// What one `getifaddrs` node says.
enum IfAddr {
    Ip(IpAddr),
    /// The link-layer address of an Ethernet interface.
    Ether([u8; 6]),
}

/// Calls `f` with each node's interface name and address, in `getifaddrs`
/// order (nodes of other families are skipped).
fn walk_ifaddrs(mut f: impl FnMut(&str, IfAddr)) {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its type.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            let a = if fam == libc::AF_INET {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                Some(IfAddr::Ip(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                )))))
            } else if fam == libc::AF_INET6 {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                Some(IfAddr::Ip(IpAddr::V6(std::net::Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                ))))
            } else if fam == libc::AF_PACKET {
                // SAFETY: family AF_PACKET means a sockaddr_ll (glibc's
                // getifaddrs gives one per interface, from its link info).
                let sll = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_ll) };
                (sll.sll_hatype == libc::ARPHRD_ETHER && sll.sll_halen == 6).then(|| {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&sll.sll_addr[..6]);
                    IfAddr::Ether(m)
                })
            } else {
                None
            };
            if let Some(a) = a {
                f(&ifa_name(ifa), a);
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated, exactly once.
    unsafe { libc::freeifaddrs(ifap) };
}

/// An `ifaddrs` node's interface name.
fn ifa_name(ifa: &libc::ifaddrs) -> String {
    if ifa.ifa_name.is_null() {
        return String::new();
    }
    // SAFETY: a non-null ifa_name of a getifaddrs node is a NUL-terminated
    // string that lives as long as the list, which outlives this borrow.
    unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
        .to_string_lossy()
        .into_owned()
}

/// The device that reaches `peer`: the one on the local address the kernel
/// routes to it from (`route_source`, then `by_addr`).
pub fn for_peer(peer: IpAddr) -> io::Result<DeviceInfo> {
    by_addr(route_source(peer)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_names_errors() {
        let v = parse_list("srdma0=127.0.0.1, srdma1=::1\n# comment\n").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].addr, "::1".parse::<IpAddr>().unwrap());
        let e = parse_list("srdma0=notanip").unwrap_err();
        assert!(
            e.to_string().contains("'notanip' is not an IP address"),
            "{e}"
        );
        assert!(parse_list("justaname").is_err());
        // rxe's active MTUs: 1500 -> 1024, 9000 -> 4096 (the rxe peer's
        // Ethernet MTUs), loopback's 65536 -> 4096.
        assert_eq!(roce_mtu(1500), Some(crate::Mtu::B1024));
        assert_eq!(roce_mtu(2144), Some(crate::Mtu::B2048));
        assert_eq!(roce_mtu(2143), Some(crate::Mtu::B1024));
        assert_eq!(roce_mtu(9000), Some(crate::Mtu::B4096));
        assert_eq!(roce_mtu(65536), Some(crate::Mtu::B4096));
        assert_eq!(roce_mtu(300), None);
        assert_eq!(interface_mtu("127.0.0.1".parse().unwrap()), Some(65536));
        assert_eq!(
            gid_to_ip(ip_to_gid("10.1.2.3".parse().unwrap())),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }
}
