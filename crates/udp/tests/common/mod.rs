//! Helpers for the loopback tests: RoCE packets built with wire's
//! `PacketRepr`, ports on loopback addresses, and bounded receive loops.
#![allow(dead_code)]

use softrdma_udp::{Port, PortConfig, RxMeta, Steering};
use softrdma_wire::bth::BthRepr;
use softrdma_wire::icrc::{self, HiddenCheck};
use softrdma_wire::packet::{ExtRepr, PacketRepr};
use softrdma_wire::{Opcode, Psn};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// A packet as the core would hand it over: head bytes, payload, pad.
pub struct Pkt {
    pub head: Vec<u8>,
    pub payload: Vec<u8>,
    pub pad: u8,
}

impl Pkt {
    /// The UDP payload we expect to receive, without the ICRC.
    pub fn body(&self) -> Vec<u8> {
        let mut b = self.head.clone();
        b.extend_from_slice(&self.payload);
        b.resize(b.len() + self.pad as usize, 0);
        b
    }
}

/// An RC packet of `opcode` (one without extension headers) to `dest_qp`.
pub fn pkt(opcode: Opcode, dest_qp: u32, psn: u32, payload_len: usize) -> Pkt {
    let r = PacketRepr {
        bth: BthRepr {
            opcode,
            dest_qp,
            psn: Psn::new(psn),
            ..BthRepr::default()
        },
        ext: ExtRepr::default(),
        payload_len,
    };
    let mut buf = vec![0u8; r.wire_len()];
    r.emit_headers(&mut buf);
    let payload = (0..payload_len)
        .map(|i| (i as u32 ^ psn).wrapping_mul(31) as u8)
        .collect();
    Pkt {
        head: buf[..r.header_len()].to_vec(),
        payload,
        pad: r.pad_len() as u8,
    }
}

/// A SEND ONLY of `n` bytes.
pub fn send_only(dest_qp: u32, psn: u32, n: usize) -> Pkt {
    pkt(Opcode::RC_SEND_ONLY, dest_qp, psn, n)
}

pub fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A port on `127.0.0.<last>`, exclusive, port 4791.
pub fn port_v4(last: u8) -> Port {
    Port::open(PortConfig {
        shared: false,
        ..PortConfig::new(v4(last))
    })
    .unwrap()
}

/// Whether `p` got eBPF steering (it falls back where bpf(2) is refused).
pub fn steered(p: &Port) -> bool {
    matches!(p.steering(), Steering::Shared { .. })
}

/// Receive until `n` datagrams arrived or 5 s passed.
pub fn recv_n(p: &mut Port, n: usize) -> Vec<(RxMeta, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n && Instant::now() < deadline {
        let k = p.recv(|m, b| got.push((*m, b.to_vec()))).unwrap();
        if k == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Receive whatever arrives within `d`.
pub fn recv_for(p: &mut Port, d: Duration) -> Vec<(RxMeta, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if p.recv(|m, b| got.push((*m, b.to_vec()))).unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// The ICRC check a receiver that assumes ID 0/DF makes (IPv4).
pub fn exact_v4(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, datagram: &[u8]) -> bool {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else {
        panic!("IPv4 only")
    };
    icrc::verify_ipv4_hidden((s.octets(), sport), (d.octets(), dport), datagram, false)
        == HiddenCheck::Exact
}

/// The dest QPN of a received datagram.
pub fn qpn(datagram: &[u8]) -> u32 {
    u32::from_be_bytes([0, datagram[5], datagram[6], datagram[7]])
}
