//! The ICRC check of received datagrams.
//!
//! IPv6 hides nothing from a UDP socket: the full check. IPv4 hides the ID
//! and DF; [`softrdma_wire::icrc::verify_ipv4_hidden`] checks with ID 0/DF
//! and otherwise solves for the ID and DF (about 3 µs). Our own GSO trains
//! make that second case common — segment `k` carries ID `k` — so it has a
//! fast path here: the CRC is affine, so the ICRC difference between ID `k`
//! and ID 0 depends only on `k` and the datagram length, not on its content.
//! A small per-length table of those differences for `k < 64` turns "which
//! segment of a train is this?" into one CRC and a table scan. Anything else
//! goes to wire's solver, which finds the same answer the slow way (the
//! solution is unique).

use crate::icrc::{self, Addrs};
use crate::policy::GSO_MAX_SEGMENTS;
use softrdma_wire::icrc::{carried, verify_ipv4_hidden, HiddenCheck};
use softrdma_wire::opcode::len;
use std::net::{SocketAddrV4, SocketAddrV6};

/// Lengths whose tables are kept.
const CACHED_LENGTHS: usize = 8;
const N: usize = GSO_MAX_SEGMENTS as usize;

pub(crate) struct Checker {
    /// (datagram length, ICRC(ID k) ^ ICRC(ID 0) for k in 0..64).
    tables: Vec<(usize, [u32; N])>,
    next: usize,
    zeros: Vec<u8>,
}

impl Checker {
    pub(crate) fn new() -> Checker {
        Checker {
            tables: Vec::with_capacity(CACHED_LENGTHS),
            next: 0,
            zeros: Vec::new(),
        }
    }

    fn table(&mut self, n: usize) -> &[u32; N] {
        if let Some(i) = self.tables.iter().position(|t| t.0 == n) {
            return &self.tables[i].1;
        }
        if self.zeros.len() < n {
            self.zeros.resize(n, 0);
        }
        // The difference made by ID bit b, over an all-zero datagram of this
        // length (any content gives the same difference).
        let body = &self.zeros[..n - len::ICRC];
        let (head, rest) = body.split_at(len::BTH);
        let z = Addrs::V4 {
            src: [0; 4],
            dst: [0; 4],
        };
        let crc = |ident| icrc::compute(z, (0, 0), ident, head, [rest], 0);
        let base = crc(0);
        const ID_BITS: usize = N.trailing_zeros() as usize;
        let mut bits = [0u32; ID_BITS];
        for (b, v) in bits.iter_mut().enumerate() {
            *v = crc(1 << b) ^ base;
        }
        let mut t = [0u32; N];
        for (k, d) in t.iter_mut().enumerate() {
            *d = (0..ID_BITS)
                .filter(|b| k & (1 << b) != 0)
                .fold(0, |acc, b| acc ^ bits[b]);
        }
        if self.tables.len() < CACHED_LENGTHS {
            self.tables.push((n, t));
            &self.tables.last().expect("pushed").1
        } else {
            let i = self.next;
            self.next = (self.next + 1) % CACHED_LENGTHS;
            self.tables[i] = (n, t);
            &self.tables[i].1
        }
    }

    /// Check an IPv4 datagram (at least a BTH and an ICRC long).
    pub(crate) fn ipv4(&mut self, src: SocketAddrV4, dst: SocketAddrV4, d: &[u8]) -> HiddenCheck {
        let n = d.len();
        let Some(want) = carried(d) else {
            return HiddenCheck::Corrupt;
        };
        let addrs = Addrs::V4 {
            src: src.ip().octets(),
            dst: dst.ip().octets(),
        };
        let (head, rest) = d[..n - len::ICRC].split_at(len::BTH);
        let got = icrc::compute(addrs, (src.port(), dst.port()), 0, head, [rest], 0);
        if got == want {
            return HiddenCheck::Exact;
        }
        let diff = got ^ want;
        if let Some(k) = self.table(n).iter().position(|&t| t == diff) {
            return HiddenCheck::Recovered {
                ident: k as u16,
                df: true,
            };
        }
        verify_ipv4_hidden(
            (src.ip().octets(), src.port()),
            (dst.ip().octets(), dst.port()),
            d,
            true,
        )
    }

    /// Check an IPv6 datagram: true if the ICRC matches.
    pub(crate) fn ipv6(&self, src: SocketAddrV6, dst: SocketAddrV6, d: &[u8]) -> bool {
        let n = d.len();
        let addrs = Addrs::V6 {
            src: src.ip().octets(),
            dst: dst.ip().octets(),
        };
        let (head, rest) = d[..n - len::ICRC].split_at(len::BTH);
        carried(d)
            == Some(icrc::compute(
                addrs,
                (src.port(), dst.port()),
                0,
                head,
                [rest],
                0,
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::icrc::{ipv4_header, udp_header};

    fn datagram(n: usize, ident: u16, df: bool) -> Vec<u8> {
        let mut d: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
        let ulen = (n + 8) as u16;
        let c = softrdma_wire::icrc::compute(
            &ipv4_header([10, 0, 0, 1], [10, 0, 0, 2], ident, df, ulen),
            &udp_header(4791, 4791, ulen),
            &d[..n - 4],
        );
        d[n - 4..].copy_from_slice(&c.to_le_bytes());
        d
    }

    #[test]
    fn fast_path_agrees_with_the_solver() {
        let s: SocketAddrV4 = "10.0.0.1:4791".parse().unwrap();
        let t: SocketAddrV4 = "10.0.0.2:4791".parse().unwrap();
        let mut c = Checker::new();
        for n in [16usize, 100, 1052, 4124] {
            for (ident, df) in [
                (0, true),
                (1, true),
                (7, true),
                (63, true),
                (64, true),
                (5, false),
                (40000, true),
            ] {
                let d = datagram(n, ident, df);
                let want =
                    verify_ipv4_hidden(([10, 0, 0, 1], 4791), ([10, 0, 0, 2], 4791), &d, true);
                assert_eq!(c.ipv4(s, t, &d), want, "n {n} ident {ident} df {df}");
                let mut bad = d.clone();
                bad[n / 2] ^= 4;
                let want =
                    verify_ipv4_hidden(([10, 0, 0, 1], 4791), ([10, 0, 0, 2], 4791), &bad, true);
                assert_eq!(c.ipv4(s, t, &bad), want);
            }
        }
        // Many lengths: the cache stays bounded.
        for n in 16..40 {
            c.ipv4(s, t, &datagram(n, 3, true));
        }
        assert!(c.tables.len() <= CACHED_LENGTHS);
    }
}
