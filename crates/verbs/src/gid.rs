//! The port's GID table, laid out as the Linux RDMA core lays it out for an
//! rxe device over the same network interface.
//!
//! For rxe over an Ethernet netdev the kernel (`roce_gid_mgmt.c`, `cache.c`)
//! reserves index 0 for the default GID, the IPv6 link-local address formed
//! from the interface's MAC (EUI-64), and then gives each address of the
//! interface the lowest free index: its IPv4 addresses first (IPv4-mapped,
//! `::ffff:a.b.c.d`), then its IPv6 addresses (the link-local one, when it is
//! the MAC-derived address already at index 0, is not added twice). rxe is
//! RoCE v2 only, so there is one entry per address, of type RoCE v2, and its
//! table has 1024 slots (`RXE_PORT_GID_TBL_LEN`); the rest are empty.
//!
//! A softrdma device is bound to one address of that interface, which it
//! sends from and receives at; its table is the interface's, so GID indices
//! mean what they mean on rxe (`ib_write_bw -x 1` is the IPv4 address on
//! both), and the device's own entry is the one index a QP or address handle
//! may name as its source ([`GidTable::source`]). A device on an interface
//! without a MAC (`lo`, to which rxe cannot bind at all, or an address no
//! interface holds) has its address alone, at index 0.
//!
//! The table is read once, when a context opens: addresses added or removed
//! later do not change an open context's table (the kernel's changes in
//! place, keeping holes where entries went).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::device::ip_to_gid;

/// `gid_tbl_len` of the port: rxe's table size.
pub const GID_TBL_LEN: u32 = 1024;

/// A port's GID table: the populated entries from index 0 up, the rest of
/// the [`GID_TBL_LEN`] slots empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidTable {
    entries: Vec<[u8; 16]>,
    own: usize,
    /// The network interface the entries belong to (`device/net/<if>` and
    /// each GID's `ndevs` entry in sysfs), if one holds the address.
    pub netdev: Option<String>,
    /// Its interface index (`ibv_gid_entry.ndev_ifindex`), 0 if none.
    pub ifindex: u32,
}

/// Why a GID index cannot be read or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidError {
    /// Past the table's end (`EINVAL`, as the kernel's `rdma_get_gid_attr`).
    OutOfRange {
        /// The index asked for.
        index: u32,
    },
    /// A slot with no GID (`ENODATA`, as the kernel's `rdma_get_gid_attr`,
    /// which `ibv_modify_qp` and `ibv_create_ah` also return for it).
    Empty {
        /// The index asked for.
        index: u32,
    },
    /// Another address of the device's interface: the device sends from
    /// its own address only (`EINVAL`).
    NotServed {
        /// The index asked for.
        index: u32,
        /// Its GID.
        gid: [u8; 16],
        /// The device's own index and GID.
        own: (u32, [u8; 16]),
    },
}

impl GidError {
    /// The errno the kernel and rdma-core return for it.
    pub fn errno(&self) -> i32 {
        match self {
            GidError::Empty { .. } => libc::ENODATA,
            _ => libc::EINVAL,
        }
    }
}

fn show(g: &[u8; 16]) -> String {
    crate::device::gid_to_ip(*g).to_string()
}

impl fmt::Display for GidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidError::OutOfRange { index } => write!(
                f,
                "GID index {index} is out of range: the GID table has {GID_TBL_LEN} entries"
            ),
            GidError::Empty { index } => write!(f, "GID index {index} is empty"),
            GidError::NotServed { index, gid, own } => write!(
                f,
                "GID index {index} ({}) is another address of the device's interface; the \
                 device sends from {} (GID index {}): a device configured on {} serves that one",
                show(gid),
                show(&own.1),
                own.0,
                show(gid),
            ),
        }
    }
}

impl std::error::Error for GidError {}

/// The default GID of an Ethernet interface: `fe80::` and the EUI-64
/// interface identifier of its MAC (the universal/local bit flipped,
/// `ff:fe` in the middle), as the kernel's `make_default_gid` forms it.
pub fn default_gid(mac: [u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 0x02;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = mac[3];
    g[14] = mac[4];
    g[15] = mac[5];
    g
}

impl GidTable {
    /// The table of a device bound to `addr`, from the interface that holds
    /// it now.
    pub fn for_addr(addr: IpAddr) -> GidTable {
        match crate::device::interface_with(addr) {
            Some(i) => {
                let mut t = GidTable::from_interface(addr, i.mac, &i.addrs);
                t.netdev = Some(i.name);
                t.ifindex = i.index;
                t
            }
            None => GidTable::from_interface(addr, None, &[]),
        }
    }

    /// The table of a device bound to `addr` on an interface with MAC `mac`
    /// (None: not Ethernet) and addresses `addrs` in the kernel's order.
    pub fn from_interface(addr: IpAddr, mac: Option<[u8; 6]>, addrs: &[IpAddr]) -> GidTable {
        let own = ip_to_gid(addr);
        let mut entries = Vec::new();
        if let Some(mac) = mac {
            entries.push(default_gid(mac));
            let v4 = addrs.iter().filter(|a| a.is_ipv4());
            let v6 = addrs.iter().filter(|a| a.is_ipv6());
            for a in v4.chain(v6) {
                let g = ip_to_gid(*a);
                if !entries.contains(&g) {
                    entries.push(g);
                }
            }
        }
        // Not Ethernet, or the address is not among the interface's (it
        // went away): the device's address alone.
        let own_at = match entries.iter().position(|g| *g == own) {
            Some(i) => i,
            None => {
                entries = vec![own];
                0
            }
        };
        GidTable {
            entries,
            own: own_at,
            netdev: None,
            ifindex: 0,
        }
    }

    /// `gid_tbl_len`.
    pub fn len(&self) -> u32 {
        GID_TBL_LEN
    }

    /// Never: the table has [`GID_TBL_LEN`] slots.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The GID at `index`.
    pub fn get(&self, index: u32) -> Result<[u8; 16], GidError> {
        if index >= GID_TBL_LEN {
            return Err(GidError::OutOfRange { index });
        }
        self.entries
            .get(index as usize)
            .copied()
            .ok_or(GidError::Empty { index })
    }

    /// The populated entries, by index.
    pub fn entries(&self) -> impl Iterator<Item = (u32, [u8; 16])> + '_ {
        self.entries.iter().enumerate().map(|(i, g)| (i as u32, *g))
    }

    /// The index of the device's own address.
    pub fn own_index(&self) -> u8 {
        self.own as u8
    }

    /// Whether `index` can be a QP's or address handle's `sgid_index`: the
    /// device's own entry; an empty or other entry says why not.
    pub fn source(&self, index: u32) -> Result<(), GidError> {
        let gid = self.get(index)?;
        if index as usize == self.own {
            return Ok(());
        }
        Err(GidError::NotServed {
            index,
            gid,
            own: (self.own as u32, self.entries[self.own]),
        })
    }
}

/// A GID written as rdma-core and sysfs write one: eight groups of four hex
/// digits (`fe80:0000:…`).
pub fn gid_words(g: &[u8; 16]) -> String {
    let w: Vec<String> = g
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect();
    w.join(":")
}

/// A GID as an IPv6 address (what `ibv_devinfo` prints after its type).
pub fn gid_addr(g: &[u8; 16]) -> Ipv6Addr {
    Ipv6Addr::from(*g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn laid_out_as_rxe_over_the_same_interface() {
        // The rxe peer's VM: eth0 52:54:00:91:47:11, 10.91.47.11 and its
        // EUI-64 link-local address: GID 0 = fe80::5054:ff:fe91:4711,
        // GID 1 = ::ffff:10.91.47.11.
        let mac = [0x52, 0x54, 0x00, 0x91, 0x47, 0x11];
        let addrs = [ip("10.91.47.11"), ip("fe80::5054:ff:fe91:4711")];
        let t = GidTable::from_interface(ip("10.91.47.11"), Some(mac), &addrs);
        let e: Vec<_> = t.entries().collect();
        assert_eq!(
            e,
            vec![
                (0, ip_to_gid(ip("fe80::5054:ff:fe91:4711"))),
                (1, ip_to_gid(ip("10.91.47.11"))),
            ]
        );
        assert_eq!(t.own_index(), 1);
        assert_eq!(t.source(1), Ok(()));
        let e = t.source(0).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(
            e.to_string()
                .contains("sends from 10.91.47.11 (GID index 1)"),
            "{e}"
        );
        assert_eq!(t.get(2), Err(GidError::Empty { index: 2 }));
        assert_eq!(t.source(2).unwrap_err().errno(), libc::ENODATA);
        assert_eq!(t.get(1024), Err(GidError::OutOfRange { index: 1024 }));
        assert_eq!(t.get(1024).unwrap_err().errno(), libc::EINVAL);
        // The link-local device on the same interface: index 0.
        let t = GidTable::from_interface(ip("fe80::5054:ff:fe91:4711"), Some(mac), &addrs);
        assert_eq!(t.own_index(), 0);
        // IPv4 before IPv6 whatever the listing's order; a link-local
        // address that is not the MAC's (stable-privacy) gets its own entry.
        let addrs = [
            ip("fe80::1234"),
            ip("2001:db8::5"),
            ip("10.0.0.1"),
            ip("10.0.0.2"),
        ];
        let t = GidTable::from_interface(ip("2001:db8::5"), Some(mac), &addrs);
        let e: Vec<_> = t.entries().map(|(_, g)| crate::gid_to_ip(g)).collect();
        assert_eq!(
            e,
            vec![
                ip("fe80::5054:ff:fe91:4711"),
                ip("10.0.0.1"),
                ip("10.0.0.2"),
                ip("fe80::1234"),
                ip("2001:db8::5"),
            ]
        );
        assert_eq!(t.own_index(), 4);
    }

    #[test]
    fn loopback_has_its_address_alone() {
        let t = GidTable::for_addr(ip("127.0.0.1"));
        assert_eq!(
            t.entries().collect::<Vec<_>>(),
            vec![(0, ip_to_gid(ip("127.0.0.1")))]
        );
        assert_eq!(t.netdev.as_deref(), Some("lo"));
        assert!(t.ifindex > 0);
        assert_eq!(t.len(), 1024);
        assert_eq!(t.get(1), Err(GidError::Empty { index: 1 }));
        assert_eq!(
            gid_words(&t.get(0).unwrap()),
            "0000:0000:0000:0000:0000:ffff:7f00:0001"
        );
    }
}
