//! A RoCEv2 peer that writes its own packets.
//!
//! [`Forger`] owns a UDP socket on a loopback address and sends whatever
//! packet it is given, with the ICRC computed over exactly the IPv4 and UDP
//! headers the kernel will put in front of it (source and destination
//! address and port, ID 0, DF: what an unconnected Linux UDP socket sends),
//! so a well-formed packet from it is indistinguishable from rxe's. Every
//! part can be broken on purpose: [`Forger::send_raw`] sends any bytes at
//! all, and the builders below produce headers the caller then edits.
//!
//! Responses are read back with [`Forger::recv`] and parsed (their ICRC
//! checked too) into [`Response`], so a test can see precisely which bytes
//! a READ response disclosed.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use softrdma_wire::bth::DEFAULT_PKEY;
use softrdma_wire::ext::{AethRepr, AtomicEthRepr, RethRepr, Syndrome};
use softrdma_wire::icrc;
use softrdma_wire::opcode::{len, Flags};
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::{BthRepr, Opcode, Packet, PacketRepr, Psn};

/// The largest datagram the forger sends or receives.
pub const MAX_DATAGRAM: usize = softrdma_wire::frame::MAX_UDP_PAYLOAD_V4;

/// A hand-driven RoCEv2 endpoint on one UDP socket.
pub struct Forger {
    sock: UdpSocket,
    local: SocketAddrV4,
    buf: Vec<u8>,
}

/// Fill the ICRC of RoCEv2 UDP payload `d` (its last four bytes) as it will
/// be carried from `src` to `dst`.
pub fn fill_icrc(src: SocketAddrV4, dst: SocketAddrV4, d: &mut [u8]) {
    let ulen = (d.len() + 8) as u16;
    let ip = icrc::ipv4_header(src.ip().octets(), dst.ip().octets(), 0, true, ulen);
    let udp = icrc::udp_header(src.port(), dst.port(), ulen);
    icrc::fill(&ip, &udp, d);
}

/// Whether `d`, received from `src` at `dst`, carries a correct ICRC as
/// softrdma sends it: DF set and IPv4 ID 0, or, for the segments of one
/// GSO train, the ID the kernel numbers segment k with (k < 64; see
/// `softrdma_udp`'s receive policy, which accepts the same from a peer).
pub fn icrc_ok(src: SocketAddrV4, dst: SocketAddrV4, d: &[u8]) -> bool {
    if d.len() < len::BTH + len::ICRC {
        return false;
    }
    let ulen = (d.len() + 8) as u16;
    let udp = icrc::udp_header(src.port(), dst.port(), ulen);
    let body = &d[..d.len() - len::ICRC];
    let want = icrc::carried(d);
    (0..64u16).any(|id| {
        let ip = icrc::ipv4_header(src.ip().octets(), dst.ip().octets(), id, true, ulen);
        want == Some(icrc::compute(&ip, &udp, body))
    })
}

impl Forger {
    /// Bind `local` (an address of the loopback interface; port 4791 to
    /// receive what a RoCEv2 peer sends back, any other port to send only).
    pub fn bind(local: SocketAddrV4) -> io::Result<Forger> {
        let sock = UdpSocket::bind(local)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => {
                return Err(io::Error::other(format!("bound {a}, an IPv6 address")))
            }
        };
        Ok(Forger {
            sock,
            local,
            buf: vec![0u8; MAX_DATAGRAM],
        })
    }

    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// The bytes of `repr` with `payload`, ICRC filled for `dst`.
    pub fn build(&self, dst: SocketAddrV4, repr: &PacketRepr, payload: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; repr.wire_len()];
        repr.emit_with_payload(&mut d, payload);
        fill_icrc(self.local, dst, &mut d);
        d
    }

    /// Send a well-formed packet.
    pub fn send(&self, dst: SocketAddrV4, repr: &PacketRepr, payload: &[u8]) -> io::Result<()> {
        let d = self.build(dst, repr, payload);
        self.send_raw(dst, &d)
    }

    /// Send any bytes as one datagram.
    pub fn send_raw(&self, dst: SocketAddrV4, d: &[u8]) -> io::Result<()> {
        let n = self.sock.send_to(d, dst)?;
        if n != d.len() {
            return Err(io::Error::other(format!("sent {n} of {} bytes", d.len())));
        }
        Ok(())
    }

    /// The next datagram, waiting at most `t`.
    pub fn recv_raw(&mut self, t: Duration) -> io::Result<Option<(SocketAddrV4, Vec<u8>)>> {
        self.sock
            .set_read_timeout(Some(t.max(Duration::from_micros(1))))?;
        match self.sock.recv_from(&mut self.buf) {
            Ok((n, SocketAddr::V4(src))) => Ok(Some((src, self.buf[..n].to_vec()))),
            Ok((_, SocketAddr::V6(a))) => Err(io::Error::other(format!("datagram from {a}"))),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The next RoCEv2 packet, parsed, waiting at most `t`. A datagram that
    /// does not parse or whose ICRC is wrong is an error: the target must
    /// only ever send well-formed packets, whatever it was sent.
    pub fn recv(&mut self, t: Duration) -> io::Result<Option<Response>> {
        let Some((src, d)) = self.recv_raw(t)? else {
            return Ok(None);
        };
        if !icrc_ok(src, self.local, &d) {
            return Err(io::Error::other(format!(
                "a {}-byte datagram from {src} with a wrong ICRC",
                d.len()
            )));
        }
        let p = Packet::new_checked(&d[..])
            .map_err(|e| io::Error::other(format!("datagram from {src}: {e}")))?;
        let r = PacketRepr::parse(&p)
            .map_err(|e| io::Error::other(format!("datagram from {src}: {e}")))?;
        Ok(Some(Response {
            from: src,
            opcode: r.bth.opcode,
            dest_qp: r.bth.dest_qp,
            psn: r.bth.psn.value(),
            syndrome: r.ext.aeth.map(|a| a.kind()),
            orig: r.ext.atomic_ack_eth.map(|a| a.orig),
            payload: p.payload().to_vec(),
        }))
    }

    /// Every packet that arrives within `t` of the last one (at most `max`).
    pub fn drain(&mut self, t: Duration, max: usize) -> io::Result<Vec<Response>> {
        let mut v = Vec::new();
        let end = Instant::now() + Duration::from_secs(30);
        while v.len() < max && Instant::now() < end {
            match self.recv(t)? {
                Some(r) => v.push(r),
                None => break,
            }
        }
        Ok(v)
    }
}

/// A packet the target sent back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub from: SocketAddrV4,
    pub opcode: Opcode,
    pub dest_qp: u32,
    pub psn: u32,
    pub syndrome: Option<Syndrome>,
    /// An atomic acknowledgement's original value.
    pub orig: Option<u64>,
    pub payload: Vec<u8>,
}

impl Response {
    pub fn is_read_response(&self) -> bool {
        self.opcode
            .info()
            .is_some_and(|i| i.has(Flags::READ_RESPONSE))
    }
}

/// A BTH for a request of `op` to `dest_qp` at `psn`, asking for an ACK.
pub fn bth(op: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode: op,
        pkey: DEFAULT_PKEY,
        dest_qp,
        ack_req: true,
        psn: Psn::new(psn),
        ..Default::default()
    }
}

/// `RDMA WRITE Only` of `n` payload bytes to `va` under `rkey` (the RETH's
/// DMA length is `n`; edit it to lie).
pub fn write_only(dest_qp: u32, psn: u32, va: u64, rkey: u32, n: usize) -> PacketRepr {
    with_reth(
        Opcode::RC_RDMA_WRITE_ONLY,
        dest_qp,
        psn,
        va,
        rkey,
        n as u32,
        n,
    )
}

/// `RDMA READ Request` for `dma_len` bytes at `va` under `rkey`.
pub fn read_request(dest_qp: u32, psn: u32, va: u64, rkey: u32, dma_len: u32) -> PacketRepr {
    with_reth(
        Opcode::RC_RDMA_READ_REQUEST,
        dest_qp,
        psn,
        va,
        rkey,
        dma_len,
        0,
    )
}

/// A request carrying a RETH.
pub fn with_reth(
    op: Opcode,
    dest_qp: u32,
    psn: u32,
    va: u64,
    rkey: u32,
    dma_len: u32,
    payload_len: usize,
) -> PacketRepr {
    PacketRepr {
        bth: bth(op, dest_qp, psn),
        ext: ExtRepr {
            reth: Some(RethRepr { va, rkey, dma_len }),
            ..Default::default()
        },
        payload_len,
    }
}

/// A packet of `op` with no extension headers (SEND and WRITE middles and
/// lasts, SEND Only).
pub fn plain(op: Opcode, dest_qp: u32, psn: u32, payload_len: usize) -> PacketRepr {
    PacketRepr {
        bth: bth(op, dest_qp, psn),
        ext: ExtRepr::default(),
        payload_len,
    }
}

/// `Fetch Add` of `add` to the 8 bytes at `va`.
pub fn fetch_add(dest_qp: u32, psn: u32, va: u64, rkey: u32, add: u64) -> PacketRepr {
    atomic(Opcode::RC_FETCH_ADD, dest_qp, psn, va, rkey, add, 0)
}

/// An atomic request.
pub fn atomic(
    op: Opcode,
    dest_qp: u32,
    psn: u32,
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
) -> PacketRepr {
    PacketRepr {
        bth: bth(op, dest_qp, psn),
        ext: ExtRepr {
            atomic_eth: Some(AtomicEthRepr {
                va,
                rkey,
                swap_add,
                compare,
            }),
            ..Default::default()
        },
        payload_len: 0,
    }
}

/// An `Acknowledge` (a response: forged towards a requester).
pub fn ack(dest_qp: u32, psn: u32, s: Syndrome, msn: u32) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            ack_req: false,
            ..bth(Opcode::RC_ACKNOWLEDGE, dest_qp, psn)
        },
        ext: ExtRepr {
            aeth: Some(AethRepr::new(s, msn)),
            ..Default::default()
        },
        payload_len: 0,
    }
}

/// `RDMA READ Response Only` of `n` bytes (a response: forged towards a
/// requester).
pub fn read_response_only(dest_qp: u32, psn: u32, msn: u32, n: usize) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            ack_req: false,
            ..bth(Opcode::RC_RDMA_READ_RESPONSE_ONLY, dest_qp, psn)
        },
        ext: ExtRepr {
            aeth: Some(AethRepr::new(Syndrome::ACK_UNLIMITED, msn)),
            ..Default::default()
        },
        payload_len: n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two forgers on loopback: a packet built by one parses and passes the
    /// ICRC check at the other, and one flipped bit anywhere fails it.
    #[test]
    fn forged_packets_carry_a_correct_icrc() {
        let _fds = crate::FD_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let mut a = Forger::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = Forger::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let r = write_only(0x1234, 77, 0x1000, 0xdead_beef, 5);
        b.send(a.local(), &r, b"hello").unwrap();
        let got = a.recv(Duration::from_secs(5)).unwrap().expect("a packet");
        assert_eq!(got.opcode, Opcode::RC_RDMA_WRITE_ONLY);
        assert_eq!((got.dest_qp, got.psn), (0x1234, 77));
        assert_eq!(got.payload, b"hello");
        let d = b.build(a.local(), &r, b"hello");
        for bit in 0..d.len() * 8 {
            let mut bad = d.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // Bits the ICRC masks: BTH byte 4 (FECN/BECN/reserved).
            if bit / 8 == 4 {
                continue;
            }
            assert!(!icrc_ok(b.local(), a.local(), &bad), "bit {bit}");
        }
    }
}
