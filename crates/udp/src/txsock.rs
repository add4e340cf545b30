//! Per-QP UDP source ports from a bounded pool of send sockets.
//!
//! RNICs and rxe choose a QP's UDP source port from its QPN — rxe takes
//! `0xc000 + hash_32(qpn, 14)` (`rxe_qp_init_req`) — so that ECMP and RSS
//! spread QPs over paths and queues while each QP stays one flow (in
//! order). A UDP socket sends from the port it is bound to, and a socket
//! per QP does not scale to thousands of QPs, so softrdma binds a pool of at
//! most `2^bits` send sockets, created as QPs need them: QP `q` sends from
//! bucket `hash_32(q, bits)`, whose port is rxe's for that bucket with the
//! low `14 - bits` bits cleared (`0xc000 | bucket << (14 - bits)`). The
//! entropy left is `bits` bits: `2^bits` distinct flows between two
//! addresses (64 with the default 6, enough for common ECMP fan-outs, at a
//! cost of at most 64 file descriptors).
//!
//! Every send socket is bound with `SO_REUSEPORT`, so the processes of one
//! user share the ports; if another user (or another program) holds a
//! bucket's port, the next ports inside the bucket are tried, and a bucket
//! with none free sends from the receive socket (4791). The send sockets
//! receive nothing: a filter drops whatever arrives on them.

use crate::cbpf;
use crate::socket::{bind_addr, new_socket};
use socket2::Socket;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};

/// The bucket of QP `qpn` among `2^bits`: the kernel's `hash_32`.
pub(crate) fn bucket(qpn: u32, bits: u32) -> usize {
    if bits == 0 {
        return 0;
    }
    (qpn.wrapping_mul(0x61c8_8647) >> (32 - bits)) as usize
}

/// rxe's source port for `qpn`.
pub fn rxe_source_port(qpn: u32) -> u16 {
    0xc000 + bucket(qpn, 14) as u16
}

/// The pool index meaning "the receive socket".
pub(crate) const MAIN: u16 = u16::MAX;

pub(crate) struct SendPool {
    local: IpAddr,
    traffic_class: u8,
    bits: u32,
    /// Per bucket: not tried yet, or (socket, port), or `None` inside
    /// (no port free: use the receive socket).
    socks: Vec<Option<Option<(Socket, u16)>>>,
    main_port: u16,
    pub(crate) bound: usize,
    pub(crate) bind_failures: u64,
}

impl SendPool {
    /// `bits` 0..=14; `None` = no pool (everything from the receive socket).
    pub(crate) fn new(
        local: IpAddr,
        traffic_class: u8,
        bits: Option<u32>,
        main_port: u16,
    ) -> SendPool {
        let n = bits.map_or(0, |b| 1usize << b);
        SendPool {
            local,
            traffic_class,
            bits: bits.unwrap_or(0),
            socks: (0..n).map(|_| None).collect(),
            main_port,
            bound: 0,
            bind_failures: 0,
        }
    }

    /// The socket (pool index) and source port QP `src_qpn` sends from.
    pub(crate) fn for_qp(&mut self, src_qpn: u32) -> (u16, u16) {
        if self.socks.is_empty() {
            return (MAIN, self.main_port);
        }
        let b = bucket(src_qpn, self.bits);
        if self.socks[b].is_none() {
            let s = self.open(b);
            if s.is_some() {
                self.bound += 1;
            } else {
                self.bind_failures += 1;
            }
            self.socks[b] = Some(s);
        }
        match &self.socks[b] {
            Some(Some((_, port))) => (b as u16, *port),
            _ => (MAIN, self.main_port),
        }
    }

    fn open(&self, b: usize) -> Option<(Socket, u16)> {
        let width = 1u32 << (14 - self.bits);
        let base = 0xc000u32 | (b as u32) << (14 - self.bits);
        for off in 0..width {
            let port = (base + off) as u16;
            let Ok(sock) = new_socket(self.local, self.traffic_class) else {
                return None;
            };
            let fd = sock.as_raw_fd();
            if crate::sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).is_err()
                || cbpf::attach_filter(fd, &cbpf::drop_all()).is_err()
            {
                return None;
            }
            let Ok(addr) = bind_addr(self.local, port) else {
                return None;
            };
            if sock.bind(&addr.into()).is_ok() {
                return Some((sock, port));
            }
        }
        None
    }

    /// The descriptor of pool index `i` (`MAIN`: `main`).
    pub(crate) fn fd(&self, i: u16, main: RawFd) -> RawFd {
        match self.socks.get(i as usize) {
            Some(Some(Some((s, _)))) => s.as_raw_fd(),
            _ => main,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_are_rxes_with_low_bits_cleared() {
        // hash_32 as the kernel computes it (include/linux/hash.h).
        assert_eq!(rxe_source_port(0), 0xc000);
        assert_eq!(rxe_source_port(1), 0xc000 + (0x61c8_8647u32 >> 18) as u16);
        for q in [0x11u32, 0x10100, 0x2_0105, 0xff_ffff] {
            let six = bucket(q, 6) as u16;
            assert_eq!(0xc000 | six << 8, rxe_source_port(q) & 0xff00);
        }
        assert_eq!(bucket(12345, 0), 0);
    }
}
