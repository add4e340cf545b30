//! UD multicast groups: which QPs are attached to which multicast GID
//! (`ibv_attach_mcast` / `ibv_detach_mcast`), and the limits the device
//! advertises for them.
//!
//! A multicast datagram (BTH destination QP 0xFFFFFF, IBA 10.5.2; on RoCEv2
//! addressed to the group's IP multicast address, whose GID is the MGID) is
//! delivered to every QP of this endpoint attached to its destination GID,
//! each checking its own Q_Key as for a unicast datagram
//! ([`Endpoint::handle_packet`](crate::Endpoint::handle_packet)). The table
//! is bounded, and an attach allocates; delivery does not.

/// The destination QP number of every multicast packet (IBA 10.5.2).
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// Groups one endpoint may have (`max_mcast_grp`).
pub const MAX_MCAST_GRP: usize = 256;
/// QPs one group may have attached (`max_mcast_qp_attach`, as rxe's 56).
pub const MAX_MCAST_QP_ATTACH: usize = 56;
/// Attachments over all groups (`max_total_mcast_qp_attach`).
pub const MAX_TOTAL_MCAST_QP_ATTACH: usize = MAX_MCAST_GRP * MAX_MCAST_QP_ATTACH;

/// Whether `gid` is a multicast GID on RoCEv2: an IPv6 multicast address
/// (`ff00::/8`), or an IPv4-mapped one in `224.0.0.0/4`.
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    let v4_mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    if v4_mapped {
        (224..=239).contains(&gid[12])
    } else {
        gid[0] == 0xff
    }
}

#[derive(Debug)]
struct Group {
    mgid: [u8; 16],
    qpns: Vec<u32>,
}

/// The attachments of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    groups: Vec<Group>,
    total: usize,
}

/// Why an attach was refused.
pub(crate) enum AttachError {
    Groups,
    PerGroup,
    Total,
}

impl McastTable {
    /// Attach `qpn` to `mgid` (a no-op if it is attached already, as on
    /// rxe). Returns whether the group is new to this endpoint.
    pub fn attach(&mut self, mgid: [u8; 16], qpn: u32) -> Result<bool, AttachError> {
        if let Some(g) = self.groups.iter_mut().find(|g| g.mgid == mgid) {
            if g.qpns.contains(&qpn) {
                return Ok(false);
            }
            if g.qpns.len() >= MAX_MCAST_QP_ATTACH {
                return Err(AttachError::PerGroup);
            }
            if self.total >= MAX_TOTAL_MCAST_QP_ATTACH {
                return Err(AttachError::Total);
            }
            g.qpns.push(qpn);
            self.total += 1;
            return Ok(false);
        }
        if self.groups.len() >= MAX_MCAST_GRP {
            return Err(AttachError::Groups);
        }
        if self.total >= MAX_TOTAL_MCAST_QP_ATTACH {
            return Err(AttachError::Total);
        }
        self.groups.push(Group {
            mgid,
            qpns: vec![qpn],
        });
        self.total += 1;
        Ok(true)
    }

    /// Detach `qpn` from `mgid`; false if it was not attached. A group
    /// left with no QP is forgotten.
    pub fn detach(&mut self, mgid: [u8; 16], qpn: u32) -> bool {
        let Some(gi) = self.groups.iter().position(|g| g.mgid == mgid) else {
            return false;
        };
        let g = &mut self.groups[gi];
        let Some(i) = g.qpns.iter().position(|&q| q == qpn) else {
            return false;
        };
        g.qpns.swap_remove(i);
        self.total -= 1;
        if g.qpns.is_empty() {
            self.groups.swap_remove(gi);
        }
        true
    }

    /// Detach `qpn` from every group (it is being destroyed).
    pub fn detach_all(&mut self, qpn: u32) {
        for g in &mut self.groups {
            if let Some(i) = g.qpns.iter().position(|&q| q == qpn) {
                g.qpns.swap_remove(i);
                self.total -= 1;
            }
        }
        self.groups.retain(|g| !g.qpns.is_empty());
    }

    /// The group of `mgid`, by index, and how many QPs it has.
    pub fn find(&self, mgid: &[u8; 16]) -> Option<(usize, usize)> {
        let i = self.groups.iter().position(|g| &g.mgid == mgid)?;
        Some((i, self.groups[i].qpns.len()))
    }

    /// The `k`th QP of group `g` (indices from [`McastTable::find`]).
    pub fn member(&self, g: usize, k: usize) -> u32 {
        self.groups[g].qpns[k]
    }

    /// Every group with at least one QP attached.
    pub fn groups(&self) -> impl Iterator<Item = &[u8; 16]> {
        self.groups.iter().map(|g| &g.mgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_gids_are_ipv6_ff_and_mapped_class_d() {
        let mapped = |a: [u8; 4]| {
            let mut g = [0u8; 16];
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&a);
            g
        };
        assert!(is_multicast_gid(&mapped([230, 0, 0, 1])));
        assert!(is_multicast_gid(&mapped([224, 0, 0, 0])));
        assert!(is_multicast_gid(&mapped([239, 255, 255, 255])));
        assert!(!is_multicast_gid(&mapped([127, 0, 0, 1])));
        assert!(!is_multicast_gid(&mapped([240, 0, 0, 1])));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        assert!(is_multicast_gid(&v6));
        v6[0] = 0xfe;
        assert!(!is_multicast_gid(&v6));
    }

    #[test]
    fn attach_is_idempotent_bounded_and_detach_forgets_empty_groups() {
        let mut t = McastTable::default();
        let g = [0xff; 16];
        assert!(matches!(t.attach(g, 5), Ok(true)));
        assert!(matches!(t.attach(g, 5), Ok(false)));
        assert!(matches!(t.attach(g, 6), Ok(false)));
        assert_eq!(t.find(&g), Some((0, 2)));
        for q in 7..(5 + MAX_MCAST_QP_ATTACH as u32) {
            assert!(t.attach(g, q).is_ok());
        }
        assert!(matches!(t.attach(g, 1000), Err(AttachError::PerGroup)));
        assert!(t.detach(g, 5));
        assert!(!t.detach(g, 5));
        t.detach_all(6);
        for q in 7..(5 + MAX_MCAST_QP_ATTACH as u32) {
            assert!(t.detach(g, q));
        }
        assert_eq!(t.find(&g), None);
        assert_eq!(t.groups().count(), 0);
        assert_eq!(t.total, 0);
        for i in 0..MAX_MCAST_GRP {
            let mut m = [0xff; 16];
            m[14] = (i >> 8) as u8;
            m[15] = i as u8;
            assert!(matches!(t.attach(m, 1), Ok(true)));
        }
        assert!(matches!(
            t.attach([0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], 1),
            Err(AttachError::Groups)
        ));
    }
}
